"""Sampling controls a decoupled learner steers and its rollout workers follow, carried with the weights.

The adaptive sampling temperature (``rollout.adaptive_temperature``) is a controller of the run, stepped
once per trained batch on the batch's sampled-token entropy. Colocated, the rollout step owns it. Decoupled
there are several workers and one learner, so the learner owns it: it sees every batch it trains, in order,
and checkpoints the value with its other state. Each published weight version carries the temperature the
workers sample with next, as one reserved entry of the published state (:data:`TEMPERATURE`; the
``__tandem__.`` prefix is never a parameter name) that a worker takes out before its engine loads the
weights. At η = 0 with one worker, ticket ``k`` is sampled at the temperature the colocated run uses at
step ``k``: the learner steps the controller on batch ``k - 1`` before it publishes version ``k``.

A prompt curriculum (``data.curriculum``) works the same way: each worker reports what its ticket drew and
how each group scored (``TrajectoryMessage.curriculum``), the learner replays the reports of the batches it
trains into one :class:`~tandem.algos.PromptStats` (checkpointed), and every version carries it as a dense
table (:data:`PROMPT_STATS`) that each worker picks its next tickets with. All workers see every worker's
groups, a restarted or replacement worker starts from the learner's table, and at η = 0 with one worker
ticket ``k`` is picked from the statistics the colocated run has at step ``k``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tandem.algos import AdaptiveEntropy, TableStats, sampled_entropy
from tandem.channels.base import TrajectoryMessage
from tandem.types import RolloutBatch

CONTROL_PREFIX = "__tandem__."
TEMPERATURE = CONTROL_PREFIX + "sample_temperature"  # [1] float64
PROMPT_STATS = CONTROL_PREFIX + "prompt_stats"  # [4, prompts] float64 (PromptStats.to_table)


def control_tensors(controls: dict[str, float]) -> dict[str, torch.Tensor]:
    """``{name: value}`` -> one-element float64 tensors under their reserved names (published state)."""
    return {name: torch.tensor([value], dtype=torch.float64) for name, value in controls.items()}


def split_controls(
    state: dict[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A fetched state -> (the weights for the engine, the control tensors published with them)."""
    weights = {k: v for k, v in state.items() if not k.startswith(CONTROL_PREFIX)}
    controls = {k: v for k, v in state.items() if k.startswith(CONTROL_PREFIX)}
    return weights, controls


def scalar_control(controls: dict[str, torch.Tensor] | None, name: str) -> float | None:
    """A one-value control (the temperature) as a float; None when it was not published."""
    value = (controls or {}).get(name)
    return None if value is None else float(value.reshape(-1)[0])


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


class LearnerCurriculum:
    """The decoupled learner's per-prompt statistics: :meth:`observe` each trained batch's worker report,
    :meth:`tensors` the table that goes out with the weights."""

    def __init__(self, num_prompts: int) -> None:
        self.stats = TableStats.empty(num_prompts)

    def observe(self, report: dict[str, list] | None) -> None:
        if report:
            self.stats.apply(report)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {PROMPT_STATS: self.stats.table.clone()}

    def state_dict(self) -> dict[str, Any]:
        return {"prompt_stats": self.stats.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("prompt_stats") is not None:
            self.stats.load_state_dict(state["prompt_stats"])


@dataclass
class LearnerControls:
    """What a decoupled learner steers for its workers: updated on each batch it trains (:meth:`observe`,
    before the update is published), published with every weight version (:meth:`tensors`), checkpointed
    with the run (:meth:`state_dict`, under the batch source's ``rollout`` entry)."""

    temperature: LearnerTemperature | None = None
    curriculum: LearnerCurriculum | None = None

    def observe(self, msg: TrajectoryMessage) -> None:
        if self.temperature is not None:
            self.temperature.observe(msg.batch)
        if self.curriculum is not None:
            self.curriculum.observe(msg.curriculum)

    def observe_dropped(self, msg: TrajectoryMessage) -> None:
        """A batch dropped as too stale: not trained (the temperature stays), but its groups were scored,
        so the curriculum still learns what they say about their prompts."""
        if self.curriculum is not None:
            self.curriculum.observe(msg.curriculum)

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {} if self.temperature is None else control_tensors(self.temperature.controls())
        return out if self.curriculum is None else {**out, **self.curriculum.tensors()}

    def state_dict(self) -> dict[str, Any]:
        parts = [c.state_dict() for c in (self.temperature, self.curriculum) if c is not None]
        return {k: v for part in parts for k, v in part.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for control in (self.temperature, self.curriculum):
            if control is not None:
                control.load_state_dict(state)
