"""A rollout worker process: owns an engine and a reward set; generates, scores and publishes batches.

Loop: take a ticket (blocks under the staleness bound) -> load the newest published weights
(``sync`` time) -> generate the ticket's prompts with the ticket's seed (``generate``) -> score
(``reward``) -> put a :class:`~tandem.channels.base.TrajectoryMessage` on the channel. Ticket ``k`` always
maps to the same prompts (the ``k``-th batch of the seeded sampler), sampling seed and group ids as step
``k`` of the colocated trainer, so η = 0 with one worker reproduces a colocated run.

The loop (:func:`run_worker`) is shared by the two runtimes: :func:`worker_main` is the entry point of a
worker process of the embedded runtime, and the Ray runtime's actor
(:mod:`tandem.orchestration.decoupled.ray_supervisor`) calls it too. Each passes its own ``alive`` check.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from tandem.channels.base import TrajectoryChannel, TrajectoryMessage
from tandem.channels.weights import SharedMemoryWeights
from tandem.config.schema import TandemConfig
from tandem.data import PromptSampler
from tandem.errors import TandemError
from tandem.models import load_tokenizer
from tandem.monitor import PhaseTimer
from tandem.orchestration.build import (
    build_data,
    build_rewards,
    build_rollout_engine,
    enforce_prompt_lengths,
)
from tandem.orchestration.colocated import sampling_params, step_seed
from tandem.orchestration.decoupled.coordination import Coordination
from tandem.orchestration.remote import local_models
from tandem.orchestration.scoring import OverlongShaping, collect_dynamic, score_rollout
from tandem.rollout.base import RolloutEngine

if TYPE_CHECKING:
    from tandem.channels.ray_weights import RayObjectStoreWeights
    from tandem.orchestration.decoupled.ray_coordination import RayCoordination

log = logging.getLogger(__name__)

EXIT_USER_ERROR = 3  # a TandemError (bad reward function, data): restarting would not help


@dataclass
class WorkerSpec:
    """What a worker needs (picklable: a process argument or a Ray actor argument)."""

    slot: int
    cfg: TandemConfig  # model folders may be URLs: the worker uses this machine's copies
    channel: TrajectoryChannel
    weights: SharedMemoryWeights | RayObjectStoreWeights
    coord: Coordination | RayCoordination
    errors: Any = None  # multiprocessing queue of one-line error strings (embedded runtime only)


class TicketPrompts:
    """Rows of batch ``k``: the ``k``-th draw of a fresh seeded :class:`PromptSampler` (fast-forwarded)."""

    def __init__(self, dataset: Any, batch_size: int, seed: int) -> None:
        self._args = (dataset, batch_size, seed)
        self._sampler = PromptSampler(*self._args)
        self._next = 0

    def rows(self, ticket: int) -> list[dict[str, Any]]:
        if ticket < self._next:  # e.g. a re-assigned older ticket: restart the stream
            self._sampler, self._next = PromptSampler(*self._args), 0
        while self._next < ticket:
            self._sampler.next_indices()
            self._next += 1
        self._next += 1
        return self._sampler.next_batch()

    def refill_rows(self, ticket: int, round_: int) -> list[dict[str, Any]]:
        """Rows of dynamic-sampling round ``round_ ≥ 1`` of ``ticket``: a draw seeded by (ticket, round), so
        any worker — or a replacement of a dead one — refills a ticket with the same prompts."""
        dataset, batch_size, seed = self._args
        return PromptSampler(dataset, batch_size, step_seed(seed, ticket, round_)).next_batch()


REFILL_GROUPS = 1 << 40  # group ids of dynamic-sampling refill rounds start here (never clash with round 0)


def group_offset(cfg: TandemConfig, ticket: int, round_: int) -> int:
    """First group id of round ``round_`` of ``ticket``: round 0 is step ``ticket``'s ids in the colocated
    trainer; refill rounds get their own range."""
    per = cfg.data.prompts_per_step
    if round_ == 0:
        return ticket * per
    return REFILL_GROUPS + (ticket * cfg.algorithm.max_resample_rounds + round_ - 1) * per


class InFlightSync:
    """``on_chunk`` callback of an in-flight generation: loads weights published since the last check.

    Counts the updates and the seconds spent loading them (reported as ``worker/inflight_*``)."""

    def __init__(self, engine: RolloutEngine, weights: Any) -> None:
        self.engine, self.weights = engine, weights
        self.updates, self.seconds = 0, 0.0

    def __call__(self) -> None:
        t0 = time.perf_counter()
        fetched = self.weights.fetch(self.engine.version)
        if fetched is not None:
            self.engine.update_weights(*fetched)
            self.updates += 1
        self.seconds += time.perf_counter() - t0


def worker_main(spec: WorkerSpec) -> None:
    """Process entry point: one torch thread (by default), Ctrl-C left to the parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the learner process handles Ctrl-C and stops us
    torch.set_num_threads(spec.cfg.architecture.worker.threads)
    try:
        run_worker(spec, alive=_parent_alive)
    except TandemError as err:
        spec.errors.put(f"rollout worker {spec.slot}: {err}")
        raise SystemExit(EXIT_USER_ERROR) from None
    except Exception:
        spec.errors.put(f"rollout worker {spec.slot} crashed:\n{traceback.format_exc()}")
        raise
    finally:
        spec.channel.close()
        spec.weights.close()


def _parent_alive() -> bool:
    """False once the learner process is gone (e.g. SIGKILL), so orphaned workers exit on their own."""
    parent = mp.parent_process()
    return parent is None or parent.is_alive()


def run_worker(spec: WorkerSpec, alive: Callable[[], bool]) -> None:
    """The worker loop, until the run stops, the slot is retired or ``alive()`` turns false."""
    cfg, coord = local_models(spec.cfg), spec.coord  # URLs: this machine's copies (a no-op for paths)
    tokenizer = load_tokenizer(cfg.model.path)
    engine = build_rollout_engine(cfg, tokenizer=tokenizer, version=-1)  # its own copy of the weights
    data = enforce_prompt_lengths(build_data(cfg.data, seed=cfg.run.seed), tokenizer, cfg.data)
    rewards = build_rewards(cfg.reward, data.task)
    ov = cfg.reward.overlong
    overlong = (
        OverlongShaping(ov.max_len or cfg.rollout.max_new_tokens, ov.buffer, ov.factor)
        if ov.enabled
        else None
    )
    prompts = TicketPrompts(data.train, cfg.data.prompts_per_step, cfg.run.seed)
    inflight = cfg.architecture.weight_sync == "in_flight"
    timer = PhaseTimer()
    while True:
        t0 = time.perf_counter()
        ticket = coord.acquire(spec.slot, alive=alive)
        idle = time.perf_counter() - t0  # blocked by the staleness bound before this batch
        if ticket is None:
            return
        timer.reset()
        with timer.phase("sync"):
            fetched = spec.weights.fetch(engine.version)
            if fetched is not None:
                engine.update_weights(*fetched)
        in_flight = InFlightSync(engine, spec.weights) if inflight else None

        def generate(round_: int, ticket: int = ticket, in_flight: InFlightSync | None = in_flight):
            """Generate and score round ``round_`` of this ticket (round 0: the ticket's own prompts)."""
            rows = prompts.rows(ticket) if round_ == 0 else prompts.refill_rows(ticket, round_)
            extras = [{k: v for k, v in row.items() if k != "prompt"} for row in rows]
            with timer.phase("generate"):
                batch = engine.generate(
                    [row["prompt"] for row in rows],
                    sampling_params(cfg, ticket, round_),
                    group_offset=group_offset(cfg, ticket, round_),
                    extras=extras,
                    on_chunk=in_flight,
                    chunk_tokens=cfg.architecture.weight_sync_chunk,
                )
            with timer.phase("reward"):
                scores, metrics = score_rollout(batch, rewards, overlong)
            return batch, scores, metrics

        batch, scores, reward_metrics = generate(0)
        reward_metrics["reward/mean"] = float(scores.mean())  # of everything sampled, as colocated logs it
        reward_metrics["reward/std"] = float(scores.std()) if scores.numel() > 1 else 0.0
        if cfg.algorithm.dynamic_sampling:
            batch, scores, dapo = collect_dynamic(
                (batch, scores),
                lambda round_: generate(round_)[:2],
                want=cfg.samples_per_step,
                max_rounds=cfg.algorithm.max_resample_rounds,
                pad_token_id=tokenizer.pad_token_id,
            )
            reward_metrics.update(dapo)
        meta = {**reward_metrics, **{f"worker/{k}": v for k, v in timer.metrics().items()}}
        meta["worker/idle_ratio"] = idle / max(1e-9, time.perf_counter() - t0)
        if in_flight is not None:
            meta["worker/inflight_updates"] = float(in_flight.updates)
            meta["worker/inflight_sync_s"] = in_flight.seconds
        spec.channel.put(
            TrajectoryMessage(batch=batch, scores=scores, ticket=ticket, worker_id=spec.slot, meta=meta)
        )
        coord.done(spec.slot)
