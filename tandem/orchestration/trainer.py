"""One training step, the same in both architectures: obtain a scored batch -> learn -> publish weights.

    source.next_batch -> LearnerStep (logprob -> advantage -> update) -> publisher.publish -> source.settle

The architectures differ only in the two strategy objects a :class:`Trainer` is given:

==============================  ===========================================  ==========================================
                                colocated (:mod:`~.colocated`)               decoupled (:mod:`~.decoupled.learner`)
==============================  ===========================================  ==========================================
:class:`BatchSource`            generate here (:class:`~.rollout_step.      take the oldest fresh batch from the
                                RolloutStep` with this process's engine)     trajectory channel (drop stale ones)
:class:`WeightPublisher`        ``engine.update_weights`` (no copy when the  the weight channel (shared memory or the
                                engine shares the trained module)            Ray object store), read by the workers
==============================  ===========================================  ==========================================

Versions: ``step`` counts updates (what metrics, checkpoints and the schedule see); the weights
``version`` the publisher announces is ``step + version_offset`` and only ever grows — a rollback
restores an older step but publishes the restored weights under a new version, so workers load them and
every sample made before the rollback is older than the restored weights (the decoupled source drops it).
Without a rollback the offset is 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch

from tandem.errors import ConfigError
from tandem.monitor import PhaseTimer
from tandem.orchestration.learner import LearnerStep
from tandem.orchestration.parts import load_run_checkpoint, restart_average
from tandem.orchestration.rollout_step import ScoredBatch, sample_rows
from tandem.train.checkpoint import SHARDED_STATE, load_checkpoint
from tandem.types import RolloutBatch


class BatchSource(Protocol):
    """Where a step's scored batch comes from, and the loop state that goes with it."""

    state_key: ClassVar[str]  # key of this loop's state in a checkpoint's extra state

    def next_batch(self, step: int, version: int) -> ScoredBatch:
        """The batch of update ``step + 1``, made with weights no older than the bound allows relative to
        ``version`` (the weights the learner holds); its metrics are those known before the update."""
        ...

    def settle(self, scored: ScoredBatch, version: int) -> dict[str, float]:
        """After the update was published as ``version``: bookkeeping and its metrics."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def restore(self, state: dict[str, Any], version: int, *, rollback: bool) -> None:
        """Resume from a checkpoint's state (``rollback``: an alert rolled the weights back mid-run; the
        restored weights are published as ``version``)."""
        ...

    def checkpointed(self) -> None:
        """A checkpoint holding every update so far was just written (a durable channel acknowledges)."""
        ...

    def summary(self) -> dict[str, Any]:
        """Extra ``summary.json`` fields."""
        ...


class WeightPublisher(Protocol):
    """Makes the learner's weights the ones rollouts are generated with, under a version number."""

    def publish(self, policy: torch.nn.Module, version: int) -> float:
        """Returns the bytes of weights copied (0 when the rollout side shares the module)."""
        ...


class Trainer:
    """Runs training steps: holds the step count, the learner phases, the two strategies and the alert
    veto (``pre_update``: sees the step's metrics so far before each ``optimizer.step()``; False drops the
    update)."""

    def __init__(
        self,
        learn: LearnerStep,
        source: BatchSource,
        publisher: WeightPublisher,
        *,
        evaluate: Callable[[], dict[str, float]],
        group_size: int,
    ) -> None:
        self.learn, self.source, self.publisher = learn, source, publisher
        self.timer: PhaseTimer = learn.timer
        self.step = 0
        self.version_offset = 0
        self.group_size = group_size
        self.last: tuple[RolloutBatch, torch.Tensor] | None = None
        self.pre_update: Callable[[dict[str, float]], bool] | None = None
        self._evaluate = evaluate

    @property
    def version(self) -> int:
        """The version of the weights the learner holds (see the module docstring)."""
        return self.step + self.version_offset

    def publish(self) -> float:
        """Announce the learner's current weights (at start, after a restore, after each update); returns
        the bytes copied."""
        return float(self.publisher.publish(self.learn.policy, self.version) or 0.0)

    def train_step(self) -> dict[str, float]:
        """One full step; returns its metrics."""
        self.timer.reset()
        t0 = time.perf_counter()
        scored = self.source.next_batch(self.step, self.version)
        metrics = dict(scored.metrics)
        if scored.batch.batch_size > 0:  # dynamic sampling may keep no group: a step without an update
            hook, known = self.pre_update, dict(metrics)
            self.learn.pre_step = None if hook is None else (lambda m: hook({**known, **m}))
            metrics.update(self.learn(scored.batch, scored.scores))
        self.step += 1
        with self.timer.phase("weight_sync"):
            metrics["perf/weight_sync_bytes"] = self.publish()
        metrics.update(self.source.settle(scored, self.version))
        self.last = (scored.batch, scored.scores)
        metrics.update(self.timer.metrics())
        metrics.update(self.timer.cpu_metrics())
        metrics["timing/step"] = time.perf_counter() - t0
        return metrics

    def evaluate(self) -> dict[str, float]:
        """Greedy accuracy on the held-out prompts."""
        with self.timer.phase("eval"):
            return self._evaluate()

    def last_samples(self, n: int) -> list[dict[str, Any]]:
        """A few prompts with completions and rewards from the last step, to read for reward hacking."""
        return [] if self.last is None else sample_rows(*self.last, n, self.group_size)

    def summary(self) -> dict[str, Any]:
        """Extra ``summary.json`` fields of the batch source (decoupled: the ticket accounting)."""
        return self.source.summary()

    # -- state for checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            **self.source.state_dict(),
            "generator": self.learn.generator.get_state().tolist(),
            "learner": self.learn.state_dict(),
            "version_offset": self.version_offset,
        }

    def restore(self, extra_state: dict[str, Any], *, rollback: bool = False) -> None:
        """Continue from a checkpoint's extra state (its model and optimiser state already loaded), then
        publish the weights. ``rollback``: mid-run, so the weights get a new, higher version."""
        key = self.source.state_key
        if key not in extra_state:  # a checkpoint of the other architecture: its loop state is another's
            now, then = ("decoupled", "colocated") if key == "decoupled" else ("colocated", "decoupled")
            raise ConfigError(
                f"{now}, but the run's checkpoint was written by a {then} run",
                where="architecture.mode",
                hint=f"resume with architecture.mode={then}; a run keeps its architecture",
            )
        state = extra_state[key]
        previous = self.version
        self.step = int(state["step"])
        self.learn.generator.set_state(torch.tensor(state["generator"], dtype=torch.uint8))
        self.learn.load_state_dict(state.get("learner", {}))
        self.version_offset = previous + 1 - self.step if rollback else int(state.get("version_offset", 0))
        self.source.restore(state, self.version, rollback=rollback)
        self.publish()

    def load_checkpoint(self, folder: Path, parts: Any) -> dict[str, Any]:
        """Restore checkpoint ``folder`` mid-run (an alert's rollback) into ``parts``; returns its state.
        An FSDP2 learner's ranks read their shards of the weights and AdamW state (each its own; and of the
        weight average, where they keep it as shards), rank 0 the schedule and RNG (and its own weight
        average from ``model/``, where it averages its plain policy alone); otherwise rank 0 reads
        everything (:func:`load_run_checkpoint`)."""
        dp = self.learn.dp
        if dp is None or not dp.state_in_shards:
            return load_run_checkpoint(folder, parts)
        # every rank its shards (of the weight average too, where the ranks keep it as shards)
        dp.restore_shards(folder / SHARDED_STATE)
        state = load_checkpoint(folder, model=None, scheduler=self.learn.live_optimizer()[1])
        if parts.average is not None and not parts.average.sharded:  # rank 0's, over its plain policy
            restart_average(folder, parts)
        # a moved KL reference is sharded on an FSDP2 learner: every rank read its part above
        return state

    def sync_ranks(self) -> None:
        """After a mid-run restore: a DDP learner's other ranks take rank 0's weights, optimiser state,
        schedule and learner state (nothing to do on one process)."""
        self.learn.share_replica()
