"""Data-parallel learner processes: rank 0 is the run's own learner; ranks 1..M-1 are spawned here.

Each extra rank loads the policy (and the reference model when β > 0) from ``model.path``, builds the same
optimiser and schedule — and with a PPO critic the same critic (a separate value model with its own
optimiser, or a shared-backbone head in a param group of the policy optimiser) — then receives rank 0's
weights, optimiser state and learner state (critic warm-up count), so a resumed run starts in sync
too. Per step it receives the batch from rank 0 and runs the shared
:class:`~tandem.orchestration.learner.LearnerStep` (sharded log-probs and old values, gradient
all-reduce, identical policy and critic optimiser steps); the math lives in ``tandem.train.update``,
``tandem.train.critic`` and ``tandem.train.distributed``.

Where the ranks run is a :class:`RankLauncher`'s job: :class:`ProcessLauncher` (default) spawns local
processes; with the Ray runtime's learner actor, ranks are Ray actors in the learner's placement group
(:mod:`tandem.orchestration.decoupled.ray_ranks`). Rendezvous: a TCP store on a free port of the
launcher's ``host`` (127.0.0.1 for local processes), hosted by rank 0; rank 0 waits for every rank to check
in while watching that none died. Shutdown: a ``stop`` message, then join; after a broken step (an
exception or Ctrl-C inside a collective) the ranks are terminated instead. Ranks ignore SIGINT (rank 0
handles Ctrl-C) and exit on their own when rank 0 disappears (local processes watch their parent; Ray
actors die with their owner).
"""

from __future__ import annotations

import copy
import logging
import multiprocessing as mp
import os
import signal
import threading
import time
import traceback
from dataclasses import dataclass, replace
from multiprocessing.context import BaseContext
from typing import Any, Protocol

import torch
import torch.distributed as dist

from tandem.algos import POLICY_LOSSES
from tandem.config.schema import TandemConfig
from tandem.errors import TandemError
from tandem.models.lora import AdapterDisabled
from tandem.monitor import PhaseTimer
from tandem.orchestration.build import build_critic, build_policy, build_reference, build_teacher
from tandem.orchestration.learner import LearnerStep
from tandem.orchestration.parts import optimizer_steps
from tandem.orchestration.remote import local_models
from tandem.train.averaging import WeightAverage
from tandem.train.critic import build_critic_optimizer
from tandem.train.distributed import (
    REPLICA,
    DataParallel,
    StepInputs,
    host_store,
    init_group,
    join_store,
    resolve_backend,
)
from tandem.train.fsdp import FullyShardedDataParallel, shard_module, shard_optimizer_state
from tandem.train.optim import build_optimizer, build_scheduler
from tandem.utils.modules import import_plugins

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 300.0  # ranks load torch, transformers and the models before checking in


class LearnerRankError(TandemError):
    """A data-parallel learner rank failed to start or died."""


@dataclass
class RankSpec:
    """What an extra learner rank needs (picklable)."""

    cfg: TandemConfig
    rank: int
    port: int
    backend: str
    host: str = "127.0.0.1"  # where rank 0's store listens
    errors: Any = None  # multiprocessing queue of one-line error strings; None: errors are raised
    watch_parent: bool = True  # exit when the parent process is gone (local processes)


class RankProcess(Protocol):
    """A started rank, as :class:`multiprocessing.Process` describes one."""

    @property
    def pid(self) -> int | None: ...

    @property
    def exitcode(self) -> int | None: ...

    def is_alive(self) -> bool: ...

    def join(self, timeout: float | None = None) -> None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


class RankLauncher(Protocol):
    """Starts ranks 1..M-1 and reports their errors."""

    host: str  # an address of rank 0 every rank can reach

    def launch(self, specs: list[RankSpec]) -> list[RankProcess]: ...

    def last_error(self) -> str | None:
        """The newest one-line error a rank reported, if any."""
        ...

    def close(self) -> None:
        """Release what :meth:`launch` created (after the ranks were stopped)."""
        ...


class ProcessLauncher:
    """Ranks as local processes (``spawn``); they report errors through a queue."""

    host = "127.0.0.1"

    def __init__(self, ctx: BaseContext | None = None) -> None:
        self.ctx = ctx or mp.get_context("spawn")
        self.errors = self.ctx.Queue()

    def launch(self, specs: list[RankSpec]) -> list[RankProcess]:
        procs = []
        for spec in specs:
            spec = replace(spec, errors=self.errors, watch_parent=True)
            proc = self.ctx.Process(
                target=rank_main, args=(spec,), name=f"tandem-learner-rank{spec.rank}", daemon=True
            )
            proc.start()
            procs.append(proc)
        return procs

    def last_error(self) -> str | None:
        msg = None
        while True:
            try:
                msg = self.errors.get_nowait()
            except Exception:  # queue.Empty
                return msg

    def close(self) -> None:
        self.errors.cancel_join_thread()


def whole_groups(cfg: TandemConfig) -> bool:
    """Split mini-batches between ranks by whole groups when the loss needs them (registry metadata)."""
    return POLICY_LOSSES.get(cfg.algorithm.policy_loss).needs_whole_groups


class DataParallelLearner:
    """Rank 0's handle on the group: :meth:`start` spawns and connects the ranks, :meth:`close` stops them."""

    def __init__(self, learn: LearnerStep, procs: list[RankProcess], launcher: RankLauncher) -> None:
        self.learn, self.procs, self.launcher = learn, procs, launcher

    @classmethod
    def start(
        cls, cfg: TandemConfig, learn: LearnerStep, launcher: RankLauncher | None = None
    ) -> DataParallelLearner:
        """Start ranks 1..M-1 (local processes unless ``launcher`` says otherwise), join the process group as
        rank 0, share rank 0's state; sets ``learn.dp``."""
        world = cfg.architecture.learner.world_size
        device = next(learn.policy.parameters()).device
        backend = resolve_backend(cfg.architecture.learner.dist_backend, device)
        launcher = launcher or ProcessLauncher()
        store = host_store(world, STARTUP_TIMEOUT_S, launcher.host)
        store_at = (launcher.host, store.port)
        handle = cls(learn, [], launcher)
        try:
            specs = [RankSpec(cfg, rank, store.port, backend, host=launcher.host) for rank in range(1, world)]
            handle.procs = launcher.launch(specs)
            handle._await_ranks(store, world)
            init_group(store, 0, world, backend)
            dp = DataParallel(0, world, whole_groups=whole_groups(cfg), device=device)
            extra, critic_extra = learn.replica_state()
            if learn.average is not None and shards_average(cfg):
                extra["average"] = dict(zip(learn.average.names, learn.average.average, strict=True))
            dp.broadcast_replica(learn.policy, extra)
            if cfg.trainer.strategy == "fsdp2":  # colocated: a sharded copy; decoupled: sharded in place
                dp = sharded_rank(cfg, dp, learn.policy, extra)
                release_plain_optimizer(learn.optimizer)
                if "average" in extra:  # learn.average is parts.average: the run evaluates the shards'
                    learn.average.reshard(dp.module)
                    dp.average = learn.average
            if learn.critic is not None:  # after the policy, in the order the ranks receive (_serve)
                dp.broadcast_replica(learn.critic, critic_extra)
                if isinstance(dp, FullyShardedDataParallel):  # sharded in place; a new optimiser steps it
                    plain = learn.critic_optimizer
                    learn.critic_optimizer = shard_critic(cfg, dp, learn.critic, critic_extra)
                    release_plain_optimizer(plain)
            learn.dp = dp
            learn.share_reference()  # a resumed run's moved reference (kl.ref_sync_steps), after the critic
            shard_reference(cfg, dp, learn.ref_model)  # fsdp2: a fixed reference, sharded as the ranks do
        except BaseException:
            handle.close()
            raise
        log.info("data-parallel learner: %d ranks, backend %s, store %s:%d", world, backend, *store_at)
        return handle

    def _await_ranks(self, store: Any, world: int) -> None:
        """Wait until every rank checked in; a rank that dies first fails the start with its error."""
        keys = [f"ready/{r}" for r in range(1, world)]
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not store.check(keys):
            dead = [p for p in self.procs if not p.is_alive()]
            if dead or time.monotonic() > deadline:
                why = self._last_error() or (f"exit code {dead[0].exitcode}" if dead else "timed out")
                raise LearnerRankError(
                    f"a data-parallel learner rank did not start: {why}",
                    where="architecture.learner.world_size",
                )
            time.sleep(0.05)

    def _last_error(self) -> str | None:
        return self.launcher.last_error()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]

    def close(self, timeout: float = 10.0) -> None:
        """Stop the ranks (never raises): ``stop`` when idle, terminate after a broken step; then leave
        the process group and join every rank."""
        dp = self.learn.dp
        try:
            if dp is not None and not dp.in_step and all(p.is_alive() for p in self.procs):
                dp.send_stop()
            else:
                for p in self.procs:
                    p.terminate()
            for p in self.procs:
                p.join(timeout=timeout)
                if p.is_alive():
                    p.terminate()
                    p.join(timeout=2.0)
                if p.is_alive():
                    p.kill()
                    p.join(timeout=2.0)
        except Exception:  # a failed stop message must not hide the run's own error
            log.exception("stopping the data-parallel learner ranks")
            for p in self.procs:
                if p.is_alive():
                    p.kill()
                    p.join(timeout=2.0)
        finally:
            if (err := self._last_error()) is not None:
                log.error("%s", err)
            self.learn.dp = None
            if dist.is_initialized():
                dist.destroy_process_group()
            self.launcher.close()


def keeps_plain_policy(cfg: TandemConfig) -> bool:
    """Whether an FSDP2 learner's rank 0 keeps a plain copy of the policy: colocated, where rank 0
    generates with it (the rollout engine's weights); not decoupled, where rank 0 only publishes,
    evaluates and checkpoints (each gathers from the shards when it runs)."""
    return cfg.architecture.mode != "decoupled"


def shards_average(cfg: TandemConfig) -> bool:
    """Whether every rank keeps its shards of the weight average (``trainer.ema_decay``): FSDP2 without a
    plain copy on rank 0 (:func:`keeps_plain_policy`). With one, rank 0 averages that copy alone."""
    return cfg.trainer.ema_decay > 0 and cfg.trainer.strategy == "fsdp2" and not keeps_plain_policy(cfg)


def replicates_frozen(cfg: TandemConfig) -> bool:
    """Whether an FSDP2 learner keeps a LoRA policy's frozen base whole on every rank and shards only the
    adapters: colocated (rank 0 keeps a plain copy, :func:`keeps_plain_policy`) with fp32 compute. Rank 0's
    sharded module then shares the base tensors of its plain copy, so it holds the base once (about one
    process's memory) instead of the base plus its shards (about 1 + 1/M); the other ranks hold the base
    too (instead of 1/M), which leaves the largest rank's memory lower. Decoupled, every rank shards the
    base (no rank holds it whole); with ``trainer.fsdp.param_dtype: bfloat16`` the base is sharded too
    (FSDP2 casts only the parameters it manages)."""
    return keeps_plain_policy(cfg) and cfg.model.lora.enabled and cfg.trainer.fsdp.param_dtype == "float32"


def sharded_rank(
    cfg: TandemConfig, dp: DataParallel, policy: torch.nn.Module, extra: dict[str, Any]
) -> FullyShardedDataParallel:
    """``trainer.strategy: fsdp2``: shard the policy over the group (in place; colocated rank 0: a copy
    of it, :func:`keeps_plain_policy`, which shares the frozen base with it, :func:`replicates_frozen`),
    build its optimiser and schedule and load rank 0's state into them (``extra``, already on every
    rank)."""
    keeps_full, replicate = keeps_plain_policy(cfg), replicates_frozen(cfg)
    # the copy's frozen parameters are the plain policy's own (deepcopy's memo maps them to themselves)
    shared = {id(p): p for p in policy.parameters() if replicate and not p.requires_grad}
    module = copy.deepcopy(policy, memo=shared) if dp.rank == 0 and keeps_full else policy
    f = cfg.trainer.fsdp
    shard_module(
        module,
        cpu_offload=f.cpu_offload,
        param_dtype=f.param_dtype,
        reduce_dtype=f.reduce_dtype,
        replicate_frozen=replicate,
    )
    optimizer = build_optimizer(module, cfg.trainer)
    # The schedule first: building it sets each group's lr to the schedule's start, which the loaded
    # state must overwrite (a resumed run in warm-up would otherwise take its next step at lr 0).
    scheduler = build_scheduler(optimizer, cfg.trainer, optimizer_steps(cfg))
    shard_optimizer_state(extra["optimizer"], optimizer)
    if "scheduler" in extra:
        scheduler.load_state_dict(extra["scheduler"])
    return FullyShardedDataParallel(
        dp.rank,
        dp.world_size,
        whole_groups=dp.whole_groups,
        module=module,
        optimizer=optimizer,
        scheduler=scheduler,
        full=policy if dp.rank == 0 and keeps_full else None,
        keeps_full=keeps_full,
        device=dp.device,
    )


def shard_critic(
    cfg: TandemConfig, dp: FullyShardedDataParallel, critic: torch.nn.Module, extra: dict[str, Any]
) -> torch.optim.Optimizer:
    """``trainer.strategy: fsdp2`` with a PPO value model (``critic``, rank 0's replica already on every
    rank): shard it in place on every rank — rank 0 included, since only the learner phases read it and
    checkpoints write its shards — then build its optimiser over the shards and load rank 0's state
    (``extra``) into it; both become ``dp.critic`` / ``dp.critic_optimizer``. Returns that optimiser."""
    assert cfg.critic is not None
    f = cfg.trainer.fsdp
    dp.critic = critic
    shard_module(
        critic,
        cpu_offload=f.cpu_offload,
        param_dtype=f.param_dtype,
        reduce_dtype=f.reduce_dtype,
        forward_methods=("values",),
    )
    dp.critic_optimizer = build_critic_optimizer(critic, cfg.critic, cfg.trainer)
    shard_optimizer_state(extra["optimizer"], dp.critic_optimizer)
    return dp.critic_optimizer


def shard_reference(cfg: TandemConfig, dp: DataParallel, ref: torch.nn.Module | None) -> None:
    """``trainer.strategy: fsdp2`` with a KL reference of its own (β > 0, not a LoRA policy's base): shard it
    in place on every rank, as the policy (rank 0's replica already on every rank), so each rank holds
    ``1 / world_size`` of it instead of a whole copy; its passes then run on the shards
    (:attr:`FullyShardedDataParallel.reference`). One that moves (``algorithm.kl.ref_sync_steps``) moves
    its shards towards the policy's (sharded alike), is gathered into the checkpoint's one file and
    restored by every rank from it. Nothing to do otherwise."""
    if not isinstance(dp, FullyShardedDataParallel) or ref is None or isinstance(ref, AdapterDisabled):
        return
    f = cfg.trainer.fsdp
    shard_module(ref, cpu_offload=f.cpu_offload, param_dtype=f.param_dtype, reduce_dtype=f.reduce_dtype)
    # FSDP2 keeps the root's parameters gathered after a forward until the backward, which a frozen model
    # never runs: reshard after every forward instead, so only one unit is ever whole
    ref.set_reshard_after_forward(True)
    dp.reference = ref


def release_plain_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """Rank 0 of an FSDP2 learner: its plain optimiser never steps (the sharded one does; the run
    checkpoint's schedule is copied from it). Drop its state (what a resume loaded) and its references to
    the plain parameters, which would otherwise keep a policy sharded in place alive unsharded."""
    optimizer.state.clear()
    for group in optimizer.param_groups:
        group["params"] = []


def rank_main(spec: RankSpec) -> None:
    """Entry point of ranks 1..M-1: one torch thread by default; Ctrl-C is left to rank 0. Errors go to
    ``spec.errors`` as one line (then exit), or are raised when there is no queue (a Ray actor's call)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(spec.cfg.architecture.learner.threads)
    if spec.watch_parent:
        threading.Thread(target=_exit_with_parent, name="parent-watch", daemon=True).start()
    try:
        _serve(spec)
    except TandemError as err:
        if spec.errors is None:
            raise LearnerRankError(f"learner rank {spec.rank}: {err}") from None
        spec.errors.put(f"learner rank {spec.rank}: {err}")
        raise SystemExit(3) from None
    except Exception:
        parent = mp.parent_process()
        if spec.watch_parent and parent is not None and not parent.is_alive():
            os._exit(1)  # rank 0 died first: its broken connection is not this rank's error
        if spec.errors is not None:
            spec.errors.put(f"learner rank {spec.rank} crashed:\n{traceback.format_exc()}")
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _exit_with_parent() -> None:
    """Exit at once when rank 0 is gone (e.g. SIGKILL): a rank blocked in a collective would wait long."""
    parent = mp.parent_process()
    while parent is None or parent.is_alive():
        time.sleep(1.0)
    os._exit(1)


def _serve(spec: RankSpec) -> None:
    import_plugins(spec.cfg.run.plugins)  # the estimator or loss the config names may be a plug-in's
    cfg = local_models(spec.cfg)  # URLs: this machine's copies (a rank actor may be on another node)
    world = cfg.architecture.learner.world_size
    # with model.lora, its adapter (as rank 0's)
    policy, tokenizer = build_policy(cfg.model, seed=cfg.run.seed)
    ref = build_reference(cfg.model, cfg.algorithm.beta, policy=policy)
    teacher = build_teacher(cfg, tokenizer)  # on-policy distillation: every rank scores its share
    optimizer = build_optimizer(policy, cfg.trainer)
    # As build_parts: the critic (a shared head joins the policy optimiser) before the scheduler.
    critic, critic_optimizer = build_critic(cfg, seed=cfg.run.seed, policy=policy, optimizer=optimizer)
    scheduler = build_scheduler(optimizer, cfg.trainer, optimizer_steps(cfg))
    store = join_store(spec.port, world, STARTUP_TIMEOUT_S, spec.host)
    store.set(f"ready/{spec.rank}", "1")
    init_group(store, spec.rank, world, spec.backend)
    dp = DataParallel(
        spec.rank, world, whole_groups=whole_groups(cfg), device=next(policy.parameters()).device
    )
    extra = dp.broadcast_replica(policy)
    average = None
    if "average" in extra:  # rank 0's whole weight average, over this rank's plain policy until sharded
        average = WeightAverage.of(policy, cfg.trainer.ema_decay)
        average.average = [extra["average"][name] for name in average.names]
    if cfg.trainer.strategy == "fsdp2":  # this rank's policy becomes its shard (no plain copy kept)
        dp = sharded_rank(cfg, dp, policy, extra)
        assert isinstance(dp, FullyShardedDataParallel)
        policy, optimizer, scheduler = dp.module, dp.optimizer, dp.scheduler
        if average is not None:
            average.reshard(dp.module)
            dp.average = average
    else:
        optimizer.load_state_dict(extra["optimizer"])
        if "scheduler" in extra:
            scheduler.load_state_dict(extra["scheduler"])
    if critic is not None:
        critic_extra = dp.broadcast_replica(critic)
        if isinstance(dp, FullyShardedDataParallel):
            critic_optimizer = shard_critic(cfg, dp, critic, critic_extra)
        elif critic_optimizer is not None:
            critic_optimizer.load_state_dict(critic_extra["optimizer"])
    learn = LearnerStep.from_config(
        cfg,
        policy=policy,
        ref_model=ref,
        optimizer=optimizer,
        scheduler=scheduler,
        timer=PhaseTimer(),
        generator=torch.Generator(),
        critic=critic,
        critic_optimizer=critic_optimizer,
        teacher=teacher,
        average=average,
    )
    learn.load_state_dict(extra["learner"])  # critic warm-up steps taken (a resumed run)
    learn.dp = dp
    learn.share_reference()  # rank 0's, which a resume may have moved (as in DataParallelLearner.start)
    shard_reference(cfg, dp, ref)  # in the order of DataParallelLearner.start
    while (inputs := dp.receive()) is not None:
        if inputs == REPLICA:  # an alert rolled rank 0 back: take its restored state
            learn.take_replica()
            continue
        assert isinstance(inputs, StepInputs)
        learn.generator.set_state(inputs.generator_state)
        if learn.kl_ctl is not None and inputs.beta is not None:
            learn.kl_ctl.value = inputs.beta
        if learn.entropy_ctl is not None and inputs.entropy_coef is not None:
            learn.entropy_ctl.value = inputs.entropy_coef
        learn(inputs.batch, inputs.scores)
