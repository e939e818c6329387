"""Sampling controls a decoupled learner steers and its rollout workers follow, carried with the weights.

The adaptive sampling temperature (``rollout.adaptive_temperature``) is a controller of the run, stepped
once per trained batch on the batch's sampled-token entropy. Colocated, the rollout step owns it. Decoupled
there are several workers and one learner, so the learner owns it: it sees every batch it trains, in order,
and checkpoints the value with its other state. Each published weight version carries the temperature the
workers sample with next, as one reserved entry of the published state (:data:`TEMPERATURE`; the
``__tandem__.`` prefix is never a parameter name) that a worker takes out before its engine loads the
weights. At η = 0 with one worker, ticket ``k`` is sampled at the temperature the colocated run uses at
step ``k``: the learner steps the controller on batch ``k - 1`` before it publishes version ``k``.
"""

from __future__ import annotations

from typing import Any

import torch

from tandem.algos import AdaptiveEntropy, sampled_entropy
from tandem.types import RolloutBatch

CONTROL_PREFIX = "__tandem__."
TEMPERATURE = CONTROL_PREFIX + "sample_temperature"


def control_tensors(controls: dict[str, float]) -> dict[str, torch.Tensor]:
    """``{name: value}`` -> one-element float64 tensors under their reserved names (published state)."""
    return {name: torch.tensor([value], dtype=torch.float64) for name, value in controls.items()}


def split_controls(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """A fetched state -> (the weights for the engine, the controls published with them)."""
    weights = {k: v for k, v in state.items() if not k.startswith(CONTROL_PREFIX)}
    controls = {k: float(v.reshape(-1)[0]) for k, v in state.items() if k.startswith(CONTROL_PREFIX)}
    return weights, controls


class LearnerTemperature:
    """The decoupled learner's sampling-temperature controller: :meth:`observe` each batch accepted for
    training (before the update is published), :meth:`controls` what goes out with the weights."""

    def __init__(self, controller: AdaptiveEntropy) -> None:
        self.controller = controller

    def observe(self, batch: RolloutBatch) -> None:
        """Step the controller on a trained batch's sampled-token entropy (an empty batch leaves it)."""
        if batch.batch_size:
            self.controller.update(sampled_entropy(batch.behavior_logprobs, batch.response_mask))

    def controls(self) -> dict[str, float]:
        return {TEMPERATURE: self.controller.value}

    def state_dict(self) -> dict[str, Any]:
        return {"temperature": self.controller.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("temperature") is not None:
            self.controller.value = float(state["temperature"])
