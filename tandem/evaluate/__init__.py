"""Evaluation: held-out accuracy and reward of a policy through a rollout engine."""

from tandem.evaluate.heldout import evaluate_prompts

__all__ = ["evaluate_prompts"]
