"""A rollout worker process: owns an engine and a reward set; generates, scores and publishes batches.

Loop: take a ticket (blocks under the staleness bound) -> load the newest published weights and the
sampling controls published with them (``sync`` time; :mod:`.controls`) -> generate the ticket's prompts with the ticket's seed (``generate``) -> score
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
from multiprocessing.queues import Queue

import torch

from tandem.channels.base import TrajectoryChannel, TrajectoryMessage, WeightChannel
from tandem.config.schema import TandemConfig
from tandem.errors import TandemError
from tandem.models import load_tokenizer
from tandem.monitor import PhaseTimer
from tandem.orchestration.build import (
    build_data,
    build_rewards,
    build_rollout_engine,
    enforce_prompt_lengths,
)
from tandem.orchestration.decoupled.controls import PROMPT_STATS, TEMPERATURE, scalar_control, split_controls
from tandem.orchestration.decoupled.seams import Admission
from tandem.orchestration.remote import local_models
from tandem.orchestration.rollout_step import RolloutStep, TicketPrompts
from tandem.rollout.base import RolloutEngine
from tandem.utils.modules import import_plugins

log = logging.getLogger(__name__)

EXIT_USER_ERROR = 3  # a TandemError (bad reward function, data): restarting would not help


@dataclass
class WorkerSpec:
    """What a worker needs (picklable: a process argument or a Ray actor argument)."""

    slot: int
    cfg: TandemConfig  # model folders may be URLs: the worker uses this machine's copies
    channel: TrajectoryChannel
    weights: WeightChannel
    coord: Admission
    errors: Queue[str] | None = None  # one-line error strings (embedded runtime only)


def load_newest(engine: RolloutEngine, weights: WeightChannel) -> dict[str, torch.Tensor] | None:
    """Load weights published since the engine's version; returns the sampling controls published with
    them (:mod:`.controls`; ``{}`` when none), or None when nothing newer was published."""
    fetched = weights.fetch(engine.version)
    if fetched is None:
        return None
    state, version = fetched
    state, controls = split_controls(state)
    engine.update_weights(state, version)
    return controls


class InFlightSync:
    """``on_chunk`` callback of an in-flight generation: loads weights published since the last check.

    Counts the updates and the seconds spent loading them (reported as ``worker/inflight_*``); keeps the
    newest sampling controls, which apply from the next batch on (this one's temperature is fixed)."""

    def __init__(self, engine: RolloutEngine, weights: WeightChannel) -> None:
        self.engine, self.weights = engine, weights
        self.updates, self.seconds = 0, 0.0
        self.controls: dict[str, torch.Tensor] = {}

    def __call__(self) -> None:
        t0 = time.perf_counter()
        controls = load_newest(self.engine, self.weights)
        if controls is not None:
            self.controls = controls
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
    import_plugins(spec.cfg.run.plugins)  # what the learner's config names (a custom engine, curriculum)
    cfg, coord = local_models(spec.cfg), spec.coord  # URLs: this machine's copies (a no-op for paths)
    tokenizer = load_tokenizer(cfg.model.path)
    engine = build_rollout_engine(cfg, tokenizer=tokenizer, version=-1)  # its own copy of the weights
    data = enforce_prompt_lengths(build_data(cfg.data, seed=cfg.run.seed), tokenizer, cfg.data)
    rewards = build_rewards(cfg.reward, data.task)
    prompts = TicketPrompts(
        data.train, cfg.data.prompts_per_step, cfg.run.seed, cfg.algorithm.max_resample_rounds
    )
    inflight = cfg.architecture.weight_sync == "in_flight"
    timer = PhaseTimer()
    rollout = RolloutStep(
        cfg,
        engine,
        rewards,
        prompts,
        timer=timer,
        pad_token_id=tokenizer.pad_token_id,
        steer_temperature=False,
    )
    curated = cfg.data.curriculum.kind != "uniform"  # report each ticket's draws and groups to the learner

    def follow(controls: dict[str, torch.Tensor] | None) -> None:
        """Sample and pick prompts as the learner published with the weights (None: nothing newer)."""
        if controls is not None:
            rollout.follow_temperature(scalar_control(controls, TEMPERATURE))
            prompts.follow_stats(controls.get(PROMPT_STATS))

    try:
        while True:
            t0 = time.perf_counter()
            ticket = coord.acquire(spec.slot, alive=alive)
            idle = time.perf_counter() - t0  # blocked by the staleness bound before this batch
            if ticket is None:
                return
            timer.reset()
            with timer.phase("weight_sync"):
                follow(load_newest(engine, spec.weights))
            in_flight = InFlightSync(engine, spec.weights) if inflight else None
            scored = rollout(ticket, on_chunk=in_flight)
            report = prompts.take_report()
            if in_flight is not None:
                follow(in_flight.controls)  # for the next batch
            phases = {**timer.metrics(), **timer.cpu_metrics()}
            meta = {**scored.metrics, **{f"worker/{k}": v for k, v in phases.items()}}
            meta["worker/idle_ratio"] = idle / max(1e-9, time.perf_counter() - t0)
            if in_flight is not None:
                meta["worker/inflight_updates"] = float(in_flight.updates)
                meta["worker/inflight_sync_s"] = in_flight.seconds
            spec.channel.put(
                TrajectoryMessage(
                    batch=scored.batch,
                    scores=scored.scores,
                    ticket=ticket,
                    worker_id=spec.slot,
                    meta=meta,
                    curriculum=report if curated else None,
                )
            )
            coord.done(spec.slot)
    finally:
        engine.close()
