"""The colocated architecture: one process generates with the very weights it trains (policy lag 0).

One training step, in named and timed phases::

    generate -> reward -> (dynamic-sampling filter) -> logprob -> advantage -> update -> sync

This module holds only what is colocated about it: the batch source (:class:`LocalRollouts`, a
:class:`~tandem.orchestration.rollout_step.RolloutStep` over this process's engine), the weight publisher
(:class:`EngineWeights`) and the entry point; the step is :class:`~tandem.orchestration.trainer.Trainer`
and the loop :func:`~tandem.orchestration.loop.run_loop`, both shared with the decoupled architecture.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import torch

from tandem.config.schema import TandemConfig
from tandem.models.lora import engine_state_dict
from tandem.monitor import PhaseTimer
from tandem.orchestration.dp_learner import DataParallelLearner
from tandem.orchestration.loop import KEY_METRICS, LoopSetup, run_loop
from tandem.orchestration.parts import (
    RunParts,
    build_parts,
    evaluate_heldout,
    evaluated_weights,
    learner_step,
    load_run_checkpoint,
)
from tandem.orchestration.remote import local_models
from tandem.orchestration.rollout_step import (
    RolloutStep,
    ScoredBatch,
    SequentialPrompts,
    rollout_metrics,
)
from tandem.orchestration.runfolder import RunResult, check_run_dir, finish_run, prepare_run_dir
from tandem.orchestration.trainer import Trainer
from tandem.rollout.base import RolloutEngine
from tandem.train.checkpoint import checkpoint_step, latest_checkpoint
from tandem.types import RolloutBatch

log = logging.getLogger(__name__)


class LocalRollouts:
    """Batch source of a colocated run: generate and score here, with the run's seeded prompt sampler."""

    state_key: ClassVar[str] = "trainer"

    def __init__(self, rollout: RolloutStep, prompts: SequentialPrompts) -> None:
        self.rollout, self.prompts = rollout, prompts

    def next_batch(self, step: int, version: int) -> ScoredBatch:
        scored = self.rollout(step)
        generated_s = self.rollout.timer.metrics().get("timing/generate", 0.0)
        scored.metrics.update(rollout_metrics(scored.batch, generated_s))
        return scored

    def settle(self, scored: ScoredBatch, version: int) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {**self.prompts.state_dict(), "rollout": self.rollout.state_dict()}

    def restore(self, state: dict[str, Any], version: int, *, rollback: bool) -> None:
        self.prompts.load_state_dict(state)  # a rollback replays the same prompts
        self.rollout.load_state_dict(state.get("rollout", {}))  # and the same temperature

    def checkpointed(self) -> None:
        pass

    def summary(self) -> dict[str, Any]:
        return {}


class EngineWeights:
    """Weight publisher of a colocated run: the engine gets the policy's state dict (an engine sharing the
    trained module copies nothing; one with its own copy, vLLM, reports the bytes it loaded in
    ``last_sync``) and the new version."""

    def __init__(self, engine: RolloutEngine) -> None:
        self.engine = engine

    def publish(self, policy: torch.nn.Module, version: int) -> float:
        self.engine.update_weights(engine_state_dict(self.engine, policy), version)
        return float(getattr(self.engine, "last_sync", {}).get("bytes", 0.0))


class ColocatedTrainer(Trainer):
    """The shared :class:`~tandem.orchestration.trainer.Trainer` with the colocated strategies, on
    injected parts."""

    def __init__(self, parts: RunParts) -> None:
        cfg = parts.cfg
        timer = PhaseTimer()
        prompts = SequentialPrompts(parts.data.train, cfg.data.prompts_per_step, cfg.run.seed)
        rollout = RolloutStep(
            cfg,
            parts.engine,
            parts.rewards,
            prompts,
            timer=timer,
            pad_token_id=parts.tokenizer.pad_token_id,
        )
        generator = torch.Generator().manual_seed(cfg.run.seed)
        super().__init__(
            learner_step(cfg, parts, timer=timer, generator=generator),
            LocalRollouts(rollout, prompts),
            EngineWeights(parts.engine),
            evaluate=self._evaluate_heldout,
            group_size=cfg.rollout.group_size,
        )
        self.parts, self.rollout = parts, rollout

    def _evaluate_heldout(self) -> dict[str, float]:
        """Held-out accuracy of the weights the run evaluates (``trainer.ema_decay``: the average). An
        engine with its own copy of the weights (vLLM) loads the average first and the live weights
        after, which the next rollouts sample; one sharing the policy module copies nothing."""
        with evaluated_weights(self.parts) as averaged:
            if averaged:
                self.publish()
            metrics = evaluate_heldout(self.parts, self.step)
        if averaged:
            self.publish()
        return metrics

    def collect(self) -> tuple[RolloutBatch, torch.Tensor, dict[str, float]]:
        """Generate and score this step's batch, without learning from it."""
        scored = self.rollout(self.step)
        return scored.batch, scored.scores, scored.metrics


def train_colocated(cfg: TandemConfig, *, resume: bool = False, progress: bool | None = None) -> RunResult:
    """Train with the colocated architecture. Model folders given as URLs are used from this machine's
    copies; the run's config keeps the URLs.

    ``trainer.world_size`` > 1: this process is rank 0 and does everything a one-process run does
    (generation with its engine, rewards, evaluation, logging, the run folder and checkpoints); ranks
    1..M-1 are started on this machine (:class:`~tandem.orchestration.dp_learner.DataParallelLearner`)
    and join every step's learner phases — log-prob passes split by rows, the update by mini-batch rows
    (whole groups when the loss needs them), losses normalised by the mini-batch's global token and
    sequence counts, so the update equals this run on one process up to fp32 summation order. They start
    after a resume's checkpoint is loaded and receive rank 0's weights, optimiser and learner state."""
    check_run_dir(cfg, resume=resume)
    parts = build_parts(local_models(cfg))  # fails on a bad model or reward before anything is written
    prepared = prepare_run_dir(cfg, resume=resume)  # only now: a failed pre-flight leaves no folder behind
    run_dir = prepared.path
    result = RunResult(run_dir=run_dir, steps=0)
    latest = latest_checkpoint(run_dir / "checkpoints") if resume else None
    first = checkpoint_step(latest.name) if latest is not None else 0
    trainer: ColocatedTrainer | None = None
    ranks = None
    resumed = None
    try:
        trainer = ColocatedTrainer(parts)
        if latest is not None:
            extra = load_run_checkpoint(latest, parts)["extra_state"]
            trainer.restore(extra)
            result.eval_before = extra.get("eval_before", {})
            resumed = (latest, extra)
            log.info("resumed from %s at step %d", latest, trainer.step)
        else:
            trainer.publish()
        ranks = DataParallelLearner.start(cfg, trainer.learn) if cfg.trainer.world_size > 1 else None
        run_loop(LoopSetup(cfg, parts, trainer, result, KEY_METRICS, progress=progress, resumed=resumed))
    except BaseException:
        if trainer is None or trainer.step <= first:  # nothing trained: the folder goes back as it was
            prepared.undo()
        raise
    finally:
        if ranks is not None:
            ranks.close()  # never raises
        parts.engine.close()  # a vLLM engine frees its memory now, not at some later garbage collection
    result.steps = trainer.step
    return finish_run(result, run_dir / "checkpoints", **trainer.summary())
