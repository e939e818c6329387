"""Tandem: align language models with RL and preference optimisation."""
__version__ = "0.1.0"
