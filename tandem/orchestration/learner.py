"""The learner side of a training step, shared by both architectures: logprob -> advantage -> update.

The colocated trainer calls it right after generating; the decoupled learner calls it on batches that
arrive through the trajectory channel. Same code, same phases, same metrics — only the source of the batch
differs. Losses and estimators come from the algorithm library by name (through the settings).

Data-parallel (``dp`` set, ``architecture.learner.world_size > 1``): rank 0 broadcasts each step's batch
to the other ranks (see ``tandem.orchestration.dp_learner``), then every rank runs this same code; the
log-prob and old-value passes are sharded over the ranks, and the policy and critic updates reduce
gradients over them (every rank holds a critic replica).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from tandem.algos import AdaptiveEntropy, AdaptiveKL, FixedKL
from tandem.config.schema import TandemConfig
from tandem.monitor import PhaseTimer
from tandem.orchestration.reference_answers import reference_coef
from tandem.train.averaging import WeightAverage
from tandem.train.critic import CriticSettings, critic_update, shared_value
from tandem.train.distributed import DataParallel, StepInputs
from tandem.train.experience import ExperienceSettings, critic_values, make_experience, scoring_logprobs
from tandem.train.reference_sync import mix_into
from tandem.train.update import SharedValue, UpdateSettings, policy_update
from tandem.types import RolloutBatch, batch_temperature


@dataclass
class LearnerStep:
    """Turns a scored rollout batch into one policy update (timed phases ``logprob`` and ``update``).

    With a critic (estimators whose registry entry needs values), the critic is updated after the policy
    on the same batch; during ``critic.warmup_steps`` only the critic learns. With ``critic.shared_backbone``
    (``shared_value`` set) the critic is a value head on the policy: its loss joins the policy's backward
    and optimiser step, and during warm-up only the head learns (``critic_update`` with the policy
    optimiser, whose policy groups get no gradient). ``kl_ctl`` holds β and, when adaptive, moves it
    after each step from the measured KL to the reference; ``entropy_ctl`` (``algorithm.entropy_target``)
    holds the entropy coefficient and moves it after each step from the measured entropy."""

    policy: torch.nn.Module
    ref_model: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler | None
    update_settings: UpdateSettings
    exp_settings: ExperienceSettings
    timer: PhaseTimer
    generator: torch.Generator
    pre_step: Callable[[dict[str, float]], bool] | None = None  # alert veto before optimizer.step()
    critic: torch.nn.Module | None = None
    critic_optimizer: torch.optim.Optimizer | None = None
    critic_settings: CriticSettings | None = None
    kl_ctl: FixedKL | AdaptiveKL | None = None
    entropy_ctl: AdaptiveEntropy | None = None
    steps_done: int = 0  # learner steps taken (critic warm-up counts these)
    dp: DataParallel | None = None  # this process's rank in a data-parallel learner
    shared_value: SharedValue | None = None  # critic.shared_backbone: the head trains in the policy update
    teacher: torch.nn.Module | None = None  # on-policy distillation: scores the sampled tokens (frozen)
    average: WeightAverage | None = None  # trainer.ema_decay: moved after each policy update
    ref_sync: tuple[int, float] | None = None  # algorithm.kl.ref_sync_steps / ref_sync_alpha

    @classmethod
    def from_config(
        cls,
        cfg: TandemConfig,
        *,
        policy: torch.nn.Module,
        ref_model: torch.nn.Module | None,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None,
        timer: PhaseTimer,
        generator: torch.Generator,
        critic: torch.nn.Module | None = None,
        critic_optimizer: torch.optim.Optimizer | None = None,
        teacher: torch.nn.Module | None = None,
        average: WeightAverage | None = None,
    ) -> LearnerStep:
        update = UpdateSettings.from_config(
            cfg.algorithm,
            cfg.trainer,
            temperature=cfg.rollout.temperature,
            autocast_bf16=cfg.model.autocast_bf16,
            max_new_tokens=cfg.rollout.max_new_tokens,
            share_prefix=cfg.trainer.prefix_sharing,
            reference_coef=reference_coef(cfg),
            # one forward per micro-batch either way, so FSDP2's ranks stay in step
            dedupe=cfg.trainer.dedupe_rows,
        )
        exp = ExperienceSettings.from_config(
            cfg.algorithm,
            temperature=cfg.rollout.temperature,
            autocast_bf16=cfg.model.autocast_bf16,
            micro_batch_size=cfg.trainer.micro_batch_size,
            share_prefix=cfg.trainer.prefix_sharing,
            micro_batch_tokens=cfg.trainer.micro_batch_tokens,
            dedupe=cfg.trainer.dedupe_rows,
        )
        kl = cfg.algorithm.kl
        kl_ctl = (
            AdaptiveKL(cfg.algorithm.beta, kl.target, kl.horizon)
            if kl.controller == "adaptive"
            else FixedKL(cfg.algorithm.beta)
        )
        critic_settings = None
        kl_cfg = cfg.algorithm.kl
        ref_sync = (kl_cfg.ref_sync_steps, kl_cfg.ref_sync_alpha) if kl_cfg.ref_sync_steps else None
        if critic is not None and cfg.critic is not None and cfg.critic.shared_backbone:
            critic_optimizer = optimizer  # the head is a param group of the policy optimiser
        if critic is not None:
            if cfg.critic is None or critic_optimizer is None:
                raise ValueError("a critic needs the critic config section and its optimizer")
            critic_settings = CriticSettings.from_config(
                cfg.critic, cfg.trainer, autocast_bf16=cfg.model.autocast_bf16
            )
        return cls(
            policy,
            ref_model,
            optimizer,
            scheduler,
            update,
            exp,
            timer,
            generator,
            critic=critic,
            critic_optimizer=critic_optimizer,
            critic_settings=critic_settings,
            kl_ctl=kl_ctl,
            shared_value=(
                shared_value(critic, critic_settings)
                if critic is not None and critic_settings is not None and critic_settings.shared_backbone
                else None
            ),
            teacher=teacher,
            average=average,
            ref_sync=ref_sync,
            entropy_ctl=(
                AdaptiveEntropy(a.entropy_coef, a.entropy_target, a.entropy_coef_step, a.entropy_coef_max)
                if (a := cfg.algorithm).entropy_target is not None
                else None
            ),
        )

    def state_dict(self) -> dict[str, Any]:
        """Learner state a checkpoint must keep for an exact resume (β, steps taken). Data-parallel rank 0:
        first brings the schedule up to date (FSDP2 copies its sharded schedule's position; its optimiser
        state is written as shards, :meth:`shard_writer`)."""
        if self.dp is not None and self.dp.rank == 0:
            self.dp.before_checkpoint(self.optimizer, self.scheduler)
        return {
            "kl_coef": None if self.kl_ctl is None else self.kl_ctl.value,
            "entropy_coef": None if self.entropy_ctl is None else self.entropy_ctl.value,
            "steps_done": self.steps_done,
            "average_updates": None if self.average is None else self.average.updates,
        }

    def replica_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Rank 0: what another rank needs beside the weights to be a replica: the policy's optimiser, the
        schedule and the learner state; the critic's own optimiser (a shared head's is the policy's)."""
        extra: dict[str, Any] = {"optimizer": self.optimizer.state_dict(), "learner": self.state_dict()}
        if self.scheduler is not None:
            extra["scheduler"] = self.scheduler.state_dict()
        critic_opt = self.critic_optimizer
        separate = critic_opt is not None and critic_opt is not self.optimizer
        return extra, ({"optimizer": critic_opt.state_dict()} if critic_opt is not None and separate else {})

    def live_optimizer(self) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler | None]:
        """The optimiser and schedule the policy update steps (FSDP2: the sharded ones, not rank 0's
        plain pair)."""
        if self.dp is None:
            return self.optimizer, self.scheduler
        _, optimizer, scheduler = self.dp.update_target(self.policy, self.optimizer, self.scheduler)
        return optimizer, scheduler

    def share_replica(self) -> None:
        """Rank 0 of a learner whose state was restored mid-run (an alert's rollback): every rank takes
        its state (:meth:`take_replica`). DDP: the weights, optimiser state, schedule and learner state, as
        at start. FSDP2 (``dp.state_in_shards``: each rank restored its own shards): the schedule, the
        learning rates and the learner state."""
        if self.dp is None:
            return
        self.dp.send_replica()
        if self.dp.state_in_shards:
            optimizer, scheduler = self.live_optimizer()
            self.dp.share_object(
                {
                    "learner": self.state_dict(),
                    "lrs": [g["lr"] for g in optimizer.param_groups],
                    "scheduler": None if scheduler is None else scheduler.state_dict(),
                }
            )
            self.share_reference()
            return
        extra, critic_extra = self.replica_state()
        self.dp.broadcast_replica(self.policy, extra)
        if self.critic is not None:
            self.dp.broadcast_replica(self.critic, critic_extra)
        self.share_reference()

    def share_reference(self) -> None:
        """Every rank, at the same point: rank 0's KL reference, where it moves (``algorithm.kl.ref_sync_steps``)
        and a resume or a rollback restored a moved one on rank 0 only. Nothing to do otherwise, nor for a
        reference sharded over FSDP2 ranks (each rank restores its own shards from the checkpoint)."""
        if self.dp is None or self.ref_sync is None or self.ref_model is None:
            return
        if self.dp.reference is not self.ref_model:
            self.dp.broadcast_replica(self.ref_model)

    @contextmanager
    def plain_reference(self) -> Iterator[torch.nn.Module | None]:
        """Rank 0: the KL reference as a plain module for the run checkpoint: ``ref_model`` itself, or,
        where it moves and is sharded over FSDP2 ranks, a transient copy gathered from the shards (a
        collective the other ranks join), dropped on exit. A fixed reference is not checkpointed: itself."""
        dp = self.dp
        if self.ref_sync is None or dp is None or dp.reference is None or dp.reference is not self.ref_model:
            yield self.ref_model
            return
        from tandem.train.fsdp import FullyShardedDataParallel, unsharded_copy  # only for sharded learners

        assert isinstance(dp, FullyShardedDataParallel)
        yield unsharded_copy(self.ref_model, dp.stream_reference())

    def take_replica(self) -> None:
        """Ranks 1..M-1: take rank 0's restored state (:meth:`share_replica`)."""
        assert self.dp is not None
        if self.dp.state_in_shards:  # this rank's optimizer and scheduler are its sharded ones
            state = self.dp.share_object(None)
            if self.scheduler is not None and state["scheduler"] is not None:
                self.scheduler.load_state_dict(state["scheduler"])
            for group, lr in zip(self.optimizer.param_groups, state["lrs"], strict=True):
                group["lr"] = lr
            self.load_state_dict(state["learner"])
            self.share_reference()
            return
        extra = self.dp.broadcast_replica(self.policy)
        self.optimizer.load_state_dict(extra["optimizer"])
        if self.scheduler is not None and "scheduler" in extra:
            self.scheduler.load_state_dict(extra["scheduler"])
        if self.critic is not None:
            critic_extra = self.dp.broadcast_replica(self.critic)
            if self.critic_optimizer is not None and "optimizer" in critic_extra:
                self.critic_optimizer.load_state_dict(critic_extra["optimizer"])
        self.load_state_dict(extra["learner"])
        self.share_reference()

    def shard_writer(self) -> Callable[[Path], None] | None:
        """Rank 0 of a learner whose ranks shard the optimiser state (FSDP2): what writes it into a run
        checkpoint (every rank its shards); None when rank 0's optimiser holds the whole state."""
        return None if self.dp is None else self.dp.shard_writer()

    def weights(self) -> Iterable[tuple[str, torch.Tensor]] | None:
        """Rank 0 of a learner that keeps no whole policy (FSDP2, decoupled): its state-dict entries,
        gathered from the shards one tensor at a time as they are iterated (a collective the other ranks
        join; iterate to the end). None when ``policy`` is the whole, plain module."""
        return None if self.dp is None else self.dp.stream_weights()

    @contextmanager
    def plain_policy(self, *, averaged: bool = False) -> Iterator[torch.nn.Module]:
        """The policy as a plain module for what reads it whole (held-out evaluation, the run checkpoint's
        ``model/`` folder): ``policy`` itself, or, where rank 0 keeps no whole policy, a transient copy
        gathered from the shards (:func:`~tandem.train.fsdp.unsharded_copy`), dropped on exit. ``averaged``:
        the copy is gathered from the weight average's shards (``trainer.ema_decay``) while the shards
        themselves keep the live weights (``policy`` itself is yielded as it is)."""
        stream = self.weights()  # a generator: it gathers (and reads whether averaged) when iterated
        if stream is None:
            yield self.policy
            return
        from tandem.train.fsdp import unsharded_copy  # torch.distributed's FSDP: only for sharded learners

        with self.average.applied() if averaged and self.average is not None else nullcontext():
            copy = unsharded_copy(self.policy, stream)
        yield copy

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps_done = int(state.get("steps_done", 0))
        if self.average is not None:  # from a checkpoint without an average: a fresh one, as at step 0
            self.average.updates = int(state.get("average_updates") or 0)
        if self.kl_ctl is not None and state.get("kl_coef") is not None:
            self.kl_ctl.value = float(state["kl_coef"])
        if self.entropy_ctl is not None and state.get("entropy_coef") is not None:
            self.entropy_ctl.value = float(state["entropy_coef"])

    @property
    def in_critic_warmup(self) -> bool:
        """True while only the critic learns (the first ``critic.warmup_steps`` learner steps)."""
        cs = self.critic_settings
        return cs is not None and self.steps_done < cs.warmup_steps

    def __call__(self, batch: RolloutBatch, scores: torch.Tensor) -> dict[str, float]:
        """One update on ``batch`` with sequence rewards ``scores`` ``[B]``; returns ``actor/*`` metrics."""
        s, exp_settings, dp = self.update_settings, self.exp_settings, self.dp
        if (temperature := batch_temperature(batch)) is not None:  # rollout.adaptive_temperature
            s, exp_settings = (
                replace(s, temperature=temperature),
                replace(exp_settings, temperature=temperature),
            )
        entropy_coef = None if self.entropy_ctl is None else self.entropy_ctl.value
        if entropy_coef is not None:  # this step's coefficient (rank 0's, sent to the other ranks)
            s = replace(s, entropy_coef=entropy_coef)
        beta = None if self.kl_ctl is None else self.kl_ctl.value
        if dp is not None and dp.rank == 0:
            dp.send_step(StepInputs(batch, scores, beta, self.generator.get_state(), entropy_coef))
        with self.timer.phase("logprob"):
            exp, metrics = make_experience(
                batch,
                scores,
                exp_settings,
                policy=None if s.on_policy_single_pass else self.policy,
                ref_model=self.ref_model,
                critic=self.critic,
                teacher=self.teacher,
                beta=beta,
                logprobs_fn=None if dp is None else partial(dp.scoring_logprobs, scoring_logprobs),
                values_fn=None if dp is None else partial(dp.scoring_logprobs, critic_values),
            )
        with self.timer.phase("update"):
            if self.in_critic_warmup:
                metrics["actor/critic_warmup"] = 1.0
            else:
                # the replica itself, or under FSDP2 the sharded policy and its optimiser and schedule
                policy, optimizer, scheduler = (
                    (self.policy, self.optimizer, self.scheduler)
                    if dp is None
                    else dp.update_target(self.policy, self.optimizer, self.scheduler)
                )
                metrics.update(
                    policy_update(
                        policy,
                        optimizer,
                        scheduler,
                        exp,
                        s,
                        generator=self.generator,
                        pre_step=self.pre_step,
                        sync=dp,
                        value=self.shared_value,
                    )
                )
            if self.critic is not None and (self.shared_value is None or self.in_critic_warmup):
                assert self.critic_optimizer is not None and self.critic_settings is not None
                metrics.update(
                    critic_update(
                        self.critic,
                        self.critic_optimizer,
                        exp,
                        self.critic_settings,
                        generator=self.generator,
                        sync=dp,
                    )
                )
        if dp is not None:
            dp.end_step(self.policy, *([] if self.critic is None else [self.critic]))
        if self.average is not None and not self.in_critic_warmup:  # after end_step: FSDP2 rank 0's
            metrics["actor/ema_decay"] = self.average.update()  # whole copy holds this step's weights
        self.steps_done += 1
        if (
            self.ref_sync is not None
            and self.ref_model is not None
            and self.steps_done % self.ref_sync[0] == 0
        ):
            # after the step, towards its weights; every learner rank moves its own copy alike
            source = self.policy.named_parameters() if dp is None else dp.reference_source(self.policy)
            mix_into(self.ref_model, source, self.ref_sync[1])
            metrics["actor/ref_synced"] = 1.0
        if self.kl_ctl is not None:
            metrics["actor/kl_coef"] = self.kl_ctl.value  # the β this step used
            if "actor/kl_ref" in metrics:
                self.kl_ctl.update(metrics["actor/kl_ref"], batch.batch_size)
        if self.entropy_ctl is not None:
            metrics["actor/entropy_coef"] = self.entropy_ctl.value  # the coefficient this step used
            if "actor/entropy" in metrics and not self.in_critic_warmup:
                self.entropy_ctl.update(metrics["actor/entropy"])
        tokens = int(batch.prompt_mask.sum() + batch.response_mask.sum())
        metrics["perf/train_tokens_per_s"] = tokens / max(1e-9, self.timer.metrics()["timing/update"])
        metrics["actor/kl"] = metrics.get("actor/kl_ref", metrics.get("actor/approx_kl", 0.0))
        metrics["actor/clipfrac"] = metrics.get("actor/clipfrac", 0.0)
        return metrics
