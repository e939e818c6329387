"""Orchestration: the colocated loop (and, later, the decoupled runtime)."""
