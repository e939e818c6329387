"""``ast.parse`` for expressions, one call at a time.

CPython 3.11 before 3.11.8 keeps the AST converter's recursion depth in process-wide state, so two threads
parsing at once can fail with ``SystemError: AST constructor recursion depth mismatch`` (CPython issue
106905). Environment steps and reward functions parse model output in worker threads, so every parse in
Tandem goes through this lock.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse_expression(text: str) -> ast.Expression:
    """``ast.parse(text, mode="eval")`` under a process-wide lock (raises what ``ast.parse`` raises)."""
    with _LOCK:
        return ast.parse(text, mode="eval")
