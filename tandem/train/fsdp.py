"""FSDP2 for the learner (``trainer.strategy: fsdp2``): parameters, gradients and optimiser state sharded
over the data-parallel ranks with ``torch.distributed.fsdp.fully_shard``.

It reuses the data-parallel learner's protocol (:class:`~tandem.train.distributed.DataParallel`: rank 0
broadcasts each step's batch, every rank back-propagates its rows of each mini-batch, losses are divided by
the mini-batch's GLOBAL token and sequence counts). What changes is where the gradient sum happens: FSDP2
reduce-scatters each decoder layer's gradients during the backward, with the divide factor set to 1 so the
reduction is a SUM (the losses are already global means), so each rank ends with the summed gradient of its
own shard only. Clipping sees DTensor gradients (the norm is reduced over ranks) and the optimiser steps
each rank's shard of the parameters with its shard of the Adam moments.

Every forward all-gathers parameters (and every backward reduce-scatters gradients), a collective: all
ranks must run the same number of passes. When a rank's share of a mini-batch needs fewer micro-batches
than another's (groups of unequal size, as adaptive group size grows them; token-budget micro-batches), it
runs the difference as passes that add nothing (:meth:`FullyShardedDataParallel.filler_passes`: one row's
forward, its backward times 0); so do the no-grad scoring passes (:meth:`FullyShardedDataParallel.score_share`:
one-row forwards whose output is dropped).

Where rank 0's policy lives depends on who generates with it:

- **Colocated** (rank 0 generates with the Hugging Face engine from the plain module): rank 0 keeps a
  plain, unsharded copy of the policy (``full``): that copy is the rollout engine's weights (as vLLM's own
  copy is in other frameworks), which the engine, evaluation and the run checkpoint's ``model/`` folder
  read as in a single-process run. After each step every rank takes part in gathering the parameters into
  it (one ``full_tensor`` per parameter). A weight average (``trainer.ema_decay``) is rank 0's alone,
  over this copy, moved after the gather.
- **Decoupled** (the rollout workers generate; rank 0 only publishes, evaluates and checkpoints): rank 0
  shards the policy in place like every other rank and keeps no plain copy, so its resident learner state
  is its parameter shards and its AdamW shard. Whatever needs whole tensors gathers them on demand through
  :meth:`FullyShardedDataParallel.stream_weights` (every rank calls ``full_tensor`` per state-dict entry in
  the same order, a collective the other ranks join from :meth:`~FullyShardedDataParallel.receive`):
  publishing copies each gathered tensor into the weight channel and drops it (one tensor transient); the
  held-out evaluation and the run checkpoint's ``model/`` folder build a transient plain copy
  (:func:`unsharded_copy`), dropped when they are done. With a weight average (``trainer.ema_decay``)
  every rank keeps its shards of the average beside its parameter shards
  (:meth:`~tandem.train.averaging.WeightAverage.reshard`); a gather while rank 0's average is applied
  tells the ranks to apply theirs, so the evaluation and ``model/`` get the whole average.

A LoRA policy (``model.lora``) shards as it is: the frozen base weights are sharded with their layer and
only the adapters get gradients and AdamW state — except where rank 0 keeps a plain copy (colocated): there
the base stays whole on every rank (``shard_module(replicate_frozen=True)``) and rank 0's sharded module
uses the plain copy's base tensors, so rank 0 holds the base once. Gathers into rank 0's plain copy skip
the frozen weights (:func:`gather_full`); a decoupled rank 0 publishes the streamed entries merged under the base model's names
(:func:`~tandem.models.lora.publishable_entries`) and builds its transient copies as plain LoRA models; the
reference (the policy with its adapter off) scores on the shards (:meth:`FullyShardedDataParallel.scoring_logprobs`);
DCP folders hold the trained parameters only.

The optimiser state is never gathered: a run checkpoint holds it as a ``torch.distributed.checkpoint`` (DCP)
folder that every rank writes its shards into (:meth:`FullyShardedDataParallel.save_shards`,
:func:`save_sharded`); :func:`load_sharded` reads it back on any world size (one process reads it whole).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    fully_shard,
    register_fsdp_forward_method,
)
from torch.distributed.tensor import DTensor, distribute_tensor

from tandem.models.lora import AdapterDisabled, adapted_like, is_lora
from tandem.train.averaging import WeightAverage
from tandem.train.distributed import REPLICA, DataParallel, StepInputs
from tandem.train.experience import ExperienceSettings, Scorer, scoring_chunks
from tandem.train.reference_sync import REFERENCE_WEIGHTS
from tandem.train.update import filler_row
from tandem.types import RolloutBatch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def shard_module(
    model: torch.nn.Module,
    *,
    cpu_offload: bool = False,
    param_dtype: str = "float32",
    reduce_dtype: str = "float32",
    forward_methods: tuple[str, ...] = (),
    replicate_frozen: bool = False,
) -> torch.nn.Module:
    """Shard ``model`` in place over the default process group: each decoder layer (the Hugging Face
    ``_no_split_modules`` classes of any of its submodules: a value model's backbone's too) is its own FSDP
    unit, the root holds the rest (embeddings, final norm, head). Gradients are SUMMED over ranks (divide
    factor 1, plain SUM collectives). ``cpu_offload`` applies to a GPU model (a CPU model's shards are in CPU
    memory already). ``forward_methods``: methods other than ``forward`` that run the model (a
    :class:`~tandem.models.value.ValueModel`'s ``values``), which must gather the root's parameters too.
    ``replicate_frozen``: parameters without gradients (a LoRA base) stay whole, plain tensors on every
    rank (``fully_shard``'s ``ignored_params``), so another module may share them; only the trainable
    ones are sharded. Returns ``model`` (now an ``FSDPModule``)."""
    mesh = dist.device_mesh.init_device_mesh(_device_type(model), (dist.get_world_size(),))
    kwargs: dict[str, Any] = {"mesh": mesh}
    if param_dtype != "float32" or reduce_dtype != "float32":
        kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=DTYPES[param_dtype], reduce_dtype=DTYPES[reduce_dtype]
        )
    if cpu_offload and _device_type(model) != "cpu":  # a CPU model's shards are in CPU memory already
        kwargs["offload_policy"] = CPUOffloadPolicy()
    if replicate_frozen:
        kwargs["ignored_params"] = {p for p in model.parameters() if not p.requires_grad}
    unit_names = {n for m in model.modules() for n in (getattr(m, "_no_split_modules", None) or [])}
    for module in list(model.modules()):
        if module is not model and type(module).__name__ in unit_names:
            fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)
    for method in forward_methods:
        register_fsdp_forward_method(model, method)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL_SUM)
    return model


def _device_type(model: torch.nn.Module) -> str:
    return next(model.parameters()).device.type


def local_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> int:
    """Bytes this rank holds of ``model``'s parameters and ``optimizer``'s state tensors (local shards of
    DTensors, whole plain tensors)."""

    def size(t: torch.Tensor) -> int:
        local = t.to_local() if isinstance(t, DTensor) else t
        return local.numel() * local.element_size()

    total = sum(size(p) for p in model.parameters())
    if optimizer is not None:
        for state in optimizer.state.values():
            total += sum(size(v) for v in state.values() if isinstance(v, torch.Tensor))
    return total


class FullyShardedDataParallel(DataParallel):
    """A rank of an FSDP2 learner: :class:`DataParallel`'s protocol with sharded training state.

    ``module``/``optimizer``/``scheduler``: the sharded policy and what steps it (every rank). ``full``:
    rank 0's plain policy, kept equal to the sharded one after each step, when ``keeps_full`` (colocated:
    the rollout engine's weights); None elsewhere. ``keeps_full`` must be the same on every rank (it
    decides whether each step ends with a gather)."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        *,
        whole_groups: bool,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None,
        full: torch.nn.Module | None = None,
        keeps_full: bool = True,
        device: torch.device | None = None,
    ) -> None:
        super().__init__(rank, world_size, whole_groups=whole_groups, device=device)
        self.module, self.optimizer, self.scheduler, self.full = module, optimizer, scheduler, full
        self.keeps_full = keeps_full
        self.state_in_shards = True  # a rollback restores the weights and AdamW state from the DCP shards
        # trainer.ema_decay without a plain copy: every rank's shards of the weight average; a gather
        # while rank 0's is applied gathers the average (every rank applies its own)
        self.average: WeightAverage | None = None
        # a PPO value model, sharded in place on every rank (dp_learner.shard_critic), and its optimiser
        self.critic: torch.nn.Module | None = None
        self.critic_optimizer: torch.optim.Optimizer | None = None

    def update_target(
        self,
        policy: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    ) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler | None]:
        """The sharded policy, its optimiser and schedule train in place of the plain ones."""
        return self.module, self.optimizer, self.scheduler

    def filler_passes(self, passes: int) -> int:
        """Every FSDP2 forward all-gathers and every backward reduce-scatters, so all ranks must run as many
        passes per mini-batch: a rank whose share needs fewer micro-batches (groups of unequal size, token
        budgets) runs the difference as passes that add nothing (``update._filler_backward``)."""
        counts = [torch.zeros(1, dtype=torch.long, device=self.device) for _ in range(self.world_size)]
        dist.all_gather(counts, torch.tensor([passes], device=self.device))
        return max(int(c) for c in counts) - passes

    def reduce(self, params: list[torch.nn.Parameter], metrics: dict[str, float]) -> dict[str, float]:
        """Gradients were reduce-scattered (summed) in the backward; only the metrics are reduced here."""
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        return self._reduce_metrics(metrics)

    def scoring_logprobs(
        self,
        scorer: Scorer,
        model: torch.nn.Module,
        r: RolloutBatch,
        s: ExperienceSettings,
    ) -> torch.Tensor:
        """The policy's passes run on the sharded module, and so do a LoRA policy's reference passes (the
        sharded module with its adapter off), a separate reference's (sharded itself) and the critic's old
        values (:meth:`score_share`); a model that is not sharded (a reference kept whole) scores as in plain
        DP."""
        if isinstance(model, AdapterDisabled) and any(model.policy is m for m in (self.full, self.module)):
            model = AdapterDisabled(self.module)
        elif model is self.full:
            model = self.module
        return super().scoring_logprobs(scorer, model, r, s)

    def score_share(
        self,
        scorer: Scorer,
        model: torch.nn.Module,
        r: RolloutBatch,
        rows: torch.Tensor,  # [b] this rank's rows of r
        s: ExperienceSettings,
    ) -> torch.Tensor:
        """On a sharded model every forward is a collective: this rank's rows run as micro-batches (of
        ``s.micro_batch_size`` rows, or of ``s.micro_batch_tokens`` real tokens), one ``scorer`` call and one
        forward each, and a rank with fewer micro-batches than another runs the difference as one-row
        forwards whose output is dropped (:meth:`filler_passes`). ``[b, R]`` float32."""
        target = model.policy if isinstance(model, AdapterDisabled) else model  # a LoRA reference: the policy
        if not any(target is m for m in (self.module, self.critic, self.reference)):
            return super().score_share(scorer, model, r, rows, s)
        chunks = scoring_chunks(r, rows, s)  # positions in rows
        fillers = self.filler_passes(len(chunks))  # agreed before any pass (a collective itself)
        one = dataclasses.replace(s, micro_batch_size=None)  # a chunk is one forward (a token chunk fits)
        local = torch.zeros(len(rows), r.response_ids.shape[1], device=self.device)
        for c in chunks:
            local[c] = scorer(model, r.select(rows[c]), one).to(self.device)
        for _ in range(fillers):
            scorer(model, r.select(filler_row(rows)), one)
        return local

    def end_step(self, *models: torch.nn.Module) -> None:
        """With ``keeps_full``: gather the updated parameters into rank 0's plain policy (every rank joins
        each gather). Without: nothing to do (the weights are gathered when they are read)."""
        if self.keeps_full:
            gather_full(self.module, self.full)
        self.in_step = False

    def stream_weights(self) -> Iterator[tuple[str, torch.Tensor]] | None:
        """Rank 0 without a plain copy: the policy's state-dict entries as whole tensors, gathered one at a
        time when iterated (each a fresh tensor: keep it only as long as needed); the other ranks join each
        gather from :meth:`receive`. Iterate it to the end (a partial pass leaves the ranks waiting). None
        where rank 0 holds the plain policy (``full``)."""
        if self.rank != 0 or self.keeps_full:
            return None
        return self._stream()

    def _stream(self) -> Iterator[tuple[str, torch.Tensor]]:
        self.in_step = True  # inside a collective: stopping now means terminating the ranks
        average = self.average is not None and self.average.is_applied
        dist.broadcast_object_list([{"cmd": "gather", "average": average}], src=0)
        yield from stream_full(self.module)
        self.in_step = False

    def reference_source(self, policy: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        """What the KL reference moves towards: the sharded policy's own shards, since the reference is
        sharded alike (:attr:`reference`, ``dp_learner.shard_reference``): each rank moves its shards, no
        communication. ``policy`` (rank 0's plain one, stale without ``keeps_full``) is not read."""
        if self.reference is None:
            raise RuntimeError("an FSDP2 learner moves a sharded reference only (dp_learner.shard_reference)")
        return iter(self.module.named_parameters())

    def stream_reference(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Rank 0: the sharded reference's state-dict entries gathered one at a time (the run checkpoint's
        ``reference.safetensors``); the other ranks join each gather from :meth:`receive`. Iterate to the
        end."""
        assert self.reference is not None and self.rank == 0
        self.in_step = True  # inside a collective: stopping now means terminating the ranks
        dist.broadcast_object_list([{"cmd": "gather_reference"}], src=0)
        yield from stream_full(self.reference)
        self.in_step = False

    # -- run checkpoints -------------------------------------------------------------------------------
    def before_checkpoint(
        self, optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler | None
    ) -> None:
        """Rank 0: the run checkpoint's schedule is the sharded optimiser's (a few numbers, copied); the
        optimiser state itself goes into the checkpoint as DCP shards (:meth:`save_shards`), never
        gathered, so rank 0's plain ``optimizer`` stays unused."""
        if scheduler is not None and self.scheduler is not None:
            scheduler.load_state_dict(self.scheduler.state_dict())

    def shard_writer(self) -> Callable[[Path], None] | None:
        """What writes this learner's share of a run checkpoint: :meth:`save_shards`."""
        return self.save_shards

    def save_shards(self, folder: Path) -> None:
        """Rank 0: every rank writes its shards of the policy and its AdamW state (and of the critic, and
        of the weight average where the ranks keep one) into the DCP ``folder`` (ranks 1.. join from
        :meth:`receive`). The folder must be reachable by every rank (local ranks,
        or a file system shared by the nodes)."""
        if self.rank == 0:
            dist.broadcast_object_list([{"cmd": "save_shards", "folder": str(folder)}], src=0)
        save_sharded(folder, self.module, self.optimizer, critic=self._critic_pair(), average=self.average)

    def restore_shards(self, folder: Path) -> None:
        """Rank 0, mid-run (an alert's rollback): every rank reads its shards of the policy, its AdamW
        state (and the critic's, and the weight average's where the ranks keep it as shards) back from
        the DCP ``folder`` (ranks 1.. join from :meth:`receive`), and rank 0's plain copy, where it keeps
        one, takes the restored weights."""
        if self.rank == 0:
            dist.broadcast_object_list([{"cmd": "restore_shards", "folder": str(folder)}], src=0)
        load_sharded(folder, self.module, self.optimizer, critic=self._critic_pair(), average=self.average)
        if self.keeps_full:
            gather_full(self.module, self.full)
        self._restore_reference(folder.parent)

    def _restore_reference(self, checkpoint: Path) -> None:
        """Every rank: its shards of the moved KL reference from the checkpoint's ``reference.safetensors``
        (each rank reads the file and keeps its own part: no communication); nothing without a sharded
        reference or without the file."""
        file = checkpoint / REFERENCE_WEIGHTS
        if self.reference is None or not file.is_file():
            return
        saved = safetensors.torch.load_file(str(file), device="cpu")
        with torch.no_grad():
            for name, p in self.reference.named_parameters():  # every one a DTensor (fully_shard)
                whole = saved[name].to(device=p.device, dtype=p.dtype)
                p.copy_(distribute_tensor(whole, p.device_mesh, p.placements, src_data_rank=None))

    def _critic_pair(self) -> tuple[torch.nn.Module, torch.optim.Optimizer] | None:
        if self.critic is None or self.critic_optimizer is None:
            return None
        return self.critic, self.critic_optimizer

    def receive(self) -> StepInputs | str | None:
        while True:
            header = self._receive_header()
            if header["cmd"] == "gather":  # rank 0 reads the whole weights (publish, eval, checkpoint)
                if header["average"] and self.average is None:
                    raise RuntimeError("rank 0 gathers the weight average, which this rank does not keep")
                with self.average.applied() if header["average"] and self.average else nullcontext():
                    for _ in stream_full(self.module):
                        pass
            elif header["cmd"] == "gather_reference":  # rank 0 checkpoints the moved KL reference
                for _ in stream_full(self.reference):
                    pass
            elif header["cmd"] == "save_shards":
                self.save_shards(Path(header["folder"]))
            elif header["cmd"] == "restore_shards":
                self.restore_shards(Path(header["folder"]))
            else:
                return REPLICA if header["cmd"] == REPLICA else self._receive_step(header)


def gather_full(sharded: torch.nn.Module, full: torch.nn.Module | None) -> None:
    """Copy ``sharded``'s trainable parameters and its buffers into ``full`` (on the rank that has it; None
    elsewhere). Collective: every rank calls it. Parameter names are the same (fully_shard keeps them).
    Frozen parameters (a LoRA policy's base) are not gathered: they never change, and ``full`` starts
    equal to ``sharded``."""
    target = None if full is None else full.state_dict()
    frozen = {name for name, p in sharded.named_parameters() if not p.requires_grad}
    with torch.no_grad():
        for name, value in stream_full(sharded, skip=frozen):
            if target is not None:
                target[name].copy_(value)


def stream_full(sharded: torch.nn.Module, skip: Collection[str] = ()) -> Iterator[tuple[str, torch.Tensor]]:
    """``sharded``'s state-dict entries, in order, as whole tensors: each DTensor gathered by
    ``full_tensor`` when its turn comes (collective: every rank iterates to the end, with the same
    ``skip``), plain tensors (buffers) as they are. Entries named in ``skip`` are left out. Naive
    equivalent: a gathered copy of the whole state dict at once."""
    with torch.no_grad():
        for name, t in sharded.state_dict().items():
            if name not in skip:
                yield name, t.full_tensor() if isinstance(t, DTensor) else t


def plain_class(module: torch.nn.Module) -> type[torch.nn.Module]:
    """The model class a sharded module was built from (``fully_shard`` swaps in a subclass)."""
    return next(c for c in type(module).__mro__ if not issubclass(c, FSDPModule))


def unsharded_copy(sharded: torch.nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> torch.nn.Module:
    """A plain model equal to ``sharded`` (a Hugging Face model: built from its ``config``), filled from
    ``weights`` (e.g. :meth:`FullyShardedDataParallel.stream_weights`) one tensor at a time: it holds one
    whole copy of the parameters, plus the tensor being copied. Built on the meta device (no random
    initialisation) then allocated; buffers (rotary tables) are copied from ``sharded``, which holds them
    whole. In eval mode."""
    with torch.device("meta"):
        if is_lora(sharded):  # a LoRA policy: its base class wrapped with the same adapter config
            plain = adapted_like(sharded, plain_class(sharded.get_base_model())(sharded.config))
        else:
            plain = plain_class(sharded)(sharded.config)
    src, src_buffers = sharded.state_dict(), dict(sharded.named_buffers())
    plain.to_empty(device=_local(next(iter(sharded.parameters()))).device)
    tied = plain.get_base_model() if is_lora(plain) else plain
    if hasattr(tied, "tie_weights"):  # tied embeddings share one tensor (to_empty made two)
        tied.tie_weights()
    with torch.no_grad():
        for name, p in plain.named_parameters():  # the sharded module's dtypes (meta init: the default)
            if p.dtype != src[name].dtype:
                p.data = p.data.to(src[name].dtype)
        for name in dict(plain.named_buffers()):  # held whole by every rank
            owner, _, attr = name.rpartition(".")
            plain.get_submodule(owner)._buffers[attr] = _local(src_buffers[name]).detach().clone()
        target = plain.state_dict()
        filled = set()
        for name, value in weights:
            target[name].copy_(value)
            filled.add(name)
    missing = set(target) - filled
    if missing:
        raise RuntimeError(f"the gathered weights lack {len(missing)} entries, e.g. {sorted(missing)[0]}")
    plain.name_or_path = getattr(sharded, "name_or_path", "")
    if getattr(sharded, "generation_config", None) is not None:
        plain.generation_config = sharded.generation_config
    return plain.eval()


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def gather_optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimiser's state dict with every DTensor gathered to a plain tensor (collective; the same
    indices and param groups as a plain optimiser over the unsharded model built the same way)."""
    sd = optimizer.state_dict()
    state = {
        i: {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in s.items()}
        for i, s in sorted(sd["state"].items())
    }
    return {"state": state, "param_groups": sd["param_groups"]}


def shard_optimizer_state(state: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
    """Load a plain optimiser state dict (same param order) into ``optimizer`` over sharded parameters:
    each state tensor shaped like its parameter is sharded like it. Every rank calls it with the same
    ``state``."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    sharded = {}
    for i, s in state["state"].items():
        p = params[int(i)]
        sharded[i] = {
            k: distribute_tensor(v.to(p.device), p.device_mesh, p.placements)
            if isinstance(v, torch.Tensor) and isinstance(p, DTensor) and v.shape == p.shape
            else v
            for k, v in s.items()
        }
    optimizer.load_state_dict({"state": sharded, "param_groups": state["param_groups"]})


# -- sharded checkpoints (DCP) ------------------------------------------------------------------------------
# What a DCP folder holds: the trained parameters and their optimiser state. Frozen parameters (a LoRA
# policy's base) are model.path's and stay out.
TRAINED = StateDictOptions(ignore_frozen_params=True)
# Loading them back: the frozen parameters are absent on purpose (dcp.load has already failed on any
# trained entry the folder lacks).
TRAINED_LOAD = StateDictOptions(ignore_frozen_params=True, strict=False)


def _trained_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """``get_state_dict`` without frozen parameters, a tied one's other names included (``lm_head.weight``
    tied to frozen embeddings, which ``ignore_frozen_params`` alone keeps)."""
    msd, osd = get_state_dict(model, optimizer, options=TRAINED)
    frozen = {n for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
    return {k: v for k, v in msd.items() if k not in frozen}, osd


def save_sharded(
    folder: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    critic: tuple[torch.nn.Module, torch.optim.Optimizer] | None = None,
    average: WeightAverage | None = None,
) -> None:
    """Write ``model`` and ``optimizer`` (and a ``critic`` value model with its optimiser, and a weight
    ``average`` kept as shards beside the parameters) to a DCP folder: each rank writes its own shards
    (collective when a process group is up; a plain model writes everything from one process)."""
    state = dict(zip(("model", "optim"), _trained_state(model, optimizer), strict=True))
    if critic is not None:
        state.update(zip(("critic", "critic_optim"), _trained_state(*critic), strict=True))
    if average is not None:
        state["average"] = dict(zip(average.names, average.average, strict=True))
    dcp.save(state, checkpoint_id=str(folder), no_dist=not dist.is_initialized())


def load_sharded(
    folder: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    whole: bool = False,
    critic: tuple[torch.nn.Module, torch.optim.Optimizer] | None = None,
    average: WeightAverage | None = None,
) -> None:
    """Read a :func:`save_sharded` folder into ``model`` and ``optimizer`` (and ``critic``'s value model and
    optimiser, and the weight ``average``'s shards, which the folder must then hold), resharding to this
    run's world size (a plain model without a process group loads the whole tensors). ``whole``: this
    process alone reads every tensor whole into its plain model, even with a process group up (no
    collective)."""
    pairs = {("model", "optim"): (model, optimizer)}
    if critic is not None:
        pairs[("critic", "critic_optim")] = critic
    state: dict[str, Any] = {}
    for keys, pair in pairs.items():
        state.update(zip(keys, _trained_state(*pair), strict=True))
    if average is not None:  # read in place into the average's own tensors (this rank's shards)
        state["average"] = dict(zip(average.names, average.average, strict=True))
    with warnings.catch_warnings():  # reading whole in one process is what was asked for
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load(state, checkpoint_id=str(folder), no_dist=whole or not dist.is_initialized())
    for (mkey, okey), (module, optim) in pairs.items():
        set_state_dict(
            module, optim, model_state_dict=state[mkey], optim_state_dict=state[okey], options=TRAINED_LOAD
        )
    if average is not None:
        average.average = [state["average"][name] for name in average.names]
