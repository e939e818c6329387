"""Data parallelism for the learner over ``torch.distributed``: rendezvous, batch broadcast, sharded
log-probs and the gradient all-reduce that :func:`~tandem.train.update.policy_update` calls before clipping.

Why the gradients equal one process training on the global batch: every rank holds the whole global batch
and the same shuffling generator, so all ranks walk the same mini-batches in the same order; each rank
back-propagates only its rows of a mini-batch (:meth:`DataParallel.local_rows`), and every micro loss is
divided by the mini-batch's GLOBAL token and sequence counts (see ``update.py``), so the sum over ranks
of their gradients is the full mini-batch gradient (up to fp32 summation order). The critic's update
(:func:`~tandem.train.critic.critic_update`) joins through the same :class:`DataParallel` methods, so a
PPO critic trains data-parallel by the same argument. ``all_reduce(SUM)``
returns the same bytes to every rank, so clipping and the optimiser step — identical float operations
on identical inputs — keep the replicas bitwise identical (:meth:`DataParallel.verify_in_sync` checks).

The whole batch is broadcast (rather than each rank receiving a fixed shard) because a shuffled
mini-batch may draw any row; its bytes (token ids, masks, log-probs) are tiny next to one gradient
all-reduce. The expensive no-grad passes (old and reference log-probs, the critic's old values) are
sharded by rows and gathered, which also makes their results the same bytes on every rank.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tandem.errors import ConfigError, TandemError
from tandem.models.forward import distinct_rows
from tandem.train.experience import ExperienceSettings, Scorer
from tandem.train.update import metric_reduction
from tandem.types import OPTIONAL_ROLLOUT_TENSORS, ROLLOUT_TENSORS, Experience, RolloutBatch

log = logging.getLogger(__name__)

BUCKET_BYTES = 32 * 2**20  # gradients are all-reduced in flat buckets of at most this size
LONG_TIMEOUT = datetime.timedelta(days=7)  # a rank waits this long for the next step (evals can be slow)
REPLICA = "replica"  # DataParallel.receive: rank 0 shares its whole state next (a rollback restored it)


def resolve_backend(name: str, device: torch.device) -> str:
    """``auto`` -> NCCL when the learner's model is on a CUDA device, gloo on CPU. ConfigError when NCCL is
    asked for a model on the CPU (NCCL reduces GPU tensors only)."""
    if name == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if name == "nccl" and device.type != "cuda":
        raise ConfigError(
            f"nccl needs the learner's model on a CUDA device; it is on {device.type}",
            where="architecture.learner.dist_backend",
            hint="use auto or gloo",
        )
    return name


def host_store(world_size: int, timeout_s: float, host: str = "127.0.0.1") -> dist.TCPStore:
    """Rank 0's rendezvous store on a free port (``store.port``) of ``host`` (loopback unless the ranks run
    on other nodes); ranks join with :func:`join_store`."""
    return dist.TCPStore(
        host,
        0,
        world_size,
        is_master=True,
        timeout=datetime.timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )


def join_store(port: int, world_size: int, timeout_s: float, host: str = "127.0.0.1") -> dist.TCPStore:
    """A rank's client of rank 0's store on ``host``:``port``."""
    return dist.TCPStore(
        host, port, world_size, is_master=False, timeout=datetime.timedelta(seconds=timeout_s)
    )


def init_group(store: dist.Store, rank: int, world_size: int, backend: str) -> None:
    """Join the default process group through ``store``. Collectives wait up to :data:`LONG_TIMEOUT`:
    between steps the other ranks idle while rank 0 evaluates or checkpoints."""
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=LONG_TIMEOUT)


@dataclass
class StepInputs:
    """What rank 0 sends the other ranks for one learner step."""

    batch: RolloutBatch
    scores: torch.Tensor  # [B] float32
    beta: float | None  # the KL coefficient this step uses (adaptive controllers move it)
    generator_state: torch.Tensor  # uint8, rank 0's shuffling generator before the step
    entropy_coef: float | None = None  # algorithm.entropy_target: the coefficient this step uses


class DataParallel:
    """This process's place in a data-parallel learner and the collectives the learner phases call.

    ``whole_groups``: split mini-batches between ranks by whole groups (losses whose registry entry says
    ``needs_whole_groups``); otherwise by rows (better balance). ``device``: where collectives run
    (the model's device: CPU for gloo, the rank's GPU for NCCL)."""

    def __init__(
        self, rank: int, world_size: int, *, whole_groups: bool, device: torch.device | None = None
    ) -> None:
        self.rank, self.world_size, self.whole_groups = rank, world_size, whole_groups
        self.device = device or torch.device("cpu")
        self.in_step = False  # True between send/receive of a step and its end (a broken step: no clean stop)
        # False: a rollback restores rank 0, whose whole state replaces the other ranks' (share_replica);
        # True (FSDP2): every rank restores its own shards, then takes rank 0's schedule and learner state
        self.state_in_shards = False
        # FSDP2: the KL reference, sharded in place on every rank (dp_learner.shard_reference); a replica
        # (DDP) holds its own whole copy, so None here
        self.reference: torch.nn.Module | None = None

    # -- rows ---------------------------------------------------------------------------------------------
    def local_rows(self, mb: Experience) -> torch.Tensor:
        """Rows of mini-batch ``mb`` this rank back-propagates: the rank-th of ``world_size`` contiguous,
        near-equal chunks of its groups (in order of first appearance) or of its rows. ``[b]`` long."""
        n = mb.batch_size
        if not self.whole_groups:
            units = n
            owner = _chunk_owner(n, self.world_size)  # [n]
        else:
            uniq, inverse = torch.unique(mb.rollout.group_ids, return_inverse=True)
            units = int(uniq.numel())
            first = torch.full((units,), n, dtype=torch.long).scatter_reduce(
                0, inverse, torch.arange(n), "amin"
            )
            group_owner = torch.empty(units, dtype=torch.long)
            group_owner[first.argsort()] = _chunk_owner(units, self.world_size)
            owner = group_owner[inverse]  # [n]
        if units < self.world_size:
            what = "groups" if self.whole_groups else "samples"
            raise TandemError(
                f"a mini-batch of {units} {what} cannot be split over {self.world_size} learner ranks",
                where="architecture.learner.world_size",
                hint="lower world_size or raise data.prompts_per_step / trainer.mini_batch_size",
            )
        return (owner == self.rank).nonzero().squeeze(1)

    def filler_passes(self, passes: int) -> int:
        """Passes that add nothing, to run after this rank's ``passes`` of a mini-batch: none here (the
        replicas' gradients are summed once, in :meth:`reduce`, whatever each ran before)."""
        return 0

    # -- collectives --------------------------------------------------------------------------------------
    def reduce(self, params: list[torch.nn.Parameter], metrics: dict[str, float]) -> dict[str, float]:
        """Sum gradients and share-weighted metric sums over ranks (in place for the gradients); ``*_max`` /
        ``*_min`` metrics take the extreme over ranks."""
        for p in params:
            if p.grad is None:  # a parameter this rank's rows did not reach still joins the sum
                p.grad = torch.zeros_like(p)
        all_reduce_gradients([p.grad for p in params], self.device)
        return self._reduce_metrics(metrics)

    def _reduce_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """Share-weighted sums add up over ranks; ``*_max`` / ``*_min`` metrics take the extreme
        (:func:`~tandem.train.update.metric_reduction`; a min is the max of negated values)."""
        keys = sorted(metrics)
        key_hash = float(zlib.crc32("\n".join(keys).encode()) % 2**20)  # exact in float64 sums
        sign = {"sum": 0.0, "max": 1.0, "min": -1.0}
        signs = [sign[metric_reduction(k)] for k in keys]
        summed = [metrics[k] if not g else 0.0 for k, g in zip(keys, signs, strict=True)]
        vec = torch.tensor([*summed, key_hash], dtype=torch.float64, device=self.device)
        dist.all_reduce(vec)
        if vec[-1].item() != key_hash * self.world_size:
            raise RuntimeError("data-parallel ranks reported different update metrics (desynchronised)")
        out = dict(zip(keys, vec[:-1].tolist(), strict=True))
        extreme = [(k, g) for k, g in zip(keys, signs, strict=True) if g]
        if extreme:
            ext = torch.tensor([g * metrics[k] for k, g in extreme], dtype=torch.float64, device=self.device)
            dist.all_reduce(ext, op=dist.ReduceOp.MAX)
            out.update({k: g * v for (k, g), v in zip(extreme, ext.tolist(), strict=True)})
        return out

    def agree(self, veto: bool) -> bool:
        """Rank 0's decision (alert action ``skip``) for every rank, so all skip or all step."""
        flag = torch.tensor([int(veto)], device=self.device)
        dist.broadcast(flag, src=0)
        return bool(flag.item())

    def scoring_logprobs(
        self,
        scorer: Scorer,
        model: torch.nn.Module,
        r: RolloutBatch,
        s: ExperienceSettings,
    ) -> torch.Tensor:
        """``scorer`` over the whole batch, each rank scoring a near-equal share of the rows, gathered on all
        ranks. Naive equivalent: ``scorer(model, r, s)`` on one process. ``[B, R]`` float32. Serves the
        log-prob passes and the critic's old values (any per-token ``[b, R]`` no-grad pass).

        With ``s.dedupe`` the batch's distinct rows (:func:`~tandem.models.forward.distinct_rows`, the same on
        every rank: the batch is broadcast) are shared out, and each result is copied back to its copies."""
        found = (
            distinct_rows(r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask) if s.dedupe else None
        )
        rows = found[0] if found is not None else torch.arange(r.batch_size)  # [u] in row order
        parts = rows.tensor_split(self.world_size)
        mine = parts[self.rank]
        width = r.response_ids.shape[1]
        local = self.score_share(scorer, model, r, mine, dataclasses.replace(s, dedupe=False))  # [b, R]
        padded = torch.zeros(len(parts[0]), width, dtype=torch.float32, device=self.device)
        padded[: len(mine)] = local.to(self.device)
        gathered = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(gathered, padded)
        out = torch.cat([g[: len(p)] for g, p in zip(gathered, parts, strict=True)])  # [u, R]
        return (out[found[1]] if found is not None else out).to(local.device)

    def score_share(
        self,
        scorer: Scorer,
        model: torch.nn.Module,
        r: RolloutBatch,
        rows: torch.Tensor,  # [b] this rank's rows of r
        s: ExperienceSettings,
    ) -> torch.Tensor:
        """This rank's share of a scoring pass: ``scorer`` on ``rows`` of ``r``. ``[b, R]`` float32."""
        if not len(rows):
            return torch.zeros(0, r.response_ids.shape[1], device=self.device)
        return scorer(model, r.select(rows), s)

    # -- step inputs ---------------------------------------------------------------------------------------
    def send_step(self, inputs: StepInputs) -> None:
        """Rank 0: broadcast one step's batch, scores, β, entropy coefficient and generator state."""
        tensors = {name: getattr(inputs.batch, name) for name in ROLLOUT_TENSORS}
        tensors.update(
            {
                n: getattr(inputs.batch, n)
                for n in OPTIONAL_ROLLOUT_TENSORS
                if getattr(inputs.batch, n) is not None
            }
        )
        tensors["scores"] = inputs.scores.float()
        header = {
            "cmd": "step",
            "beta": inputs.beta,
            "entropy_coef": inputs.entropy_coef,
            "generator": inputs.generator_state.tolist(),
            "meta": [(k, tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in tensors.items()],
        }
        self.in_step = True
        dist.broadcast_object_list([header], src=0)
        broadcast_packed(tensors, header["meta"], self.device)

    def send_stop(self) -> None:
        """Rank 0: tell the other ranks to leave their loop."""
        dist.broadcast_object_list([{"cmd": "stop"}], src=0)

    def send_replica(self) -> None:
        """Rank 0: tell the other ranks that whole replicas follow (rank 0's state was restored)."""
        dist.broadcast_object_list([{"cmd": REPLICA}], src=0)

    def receive(self) -> StepInputs | str | None:
        """Ranks 1..M-1: the next step's inputs, :data:`REPLICA` when rank 0 shares its whole state next,
        or None when rank 0 stops the group."""
        header = self._receive_header()
        return REPLICA if header["cmd"] == REPLICA else self._receive_step(header)

    def _receive_header(self) -> dict[str, Any]:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def _receive_step(self, header: dict[str, Any]) -> StepInputs | None:
        if header["cmd"] == "stop":
            return None
        self.in_step = True
        t = broadcast_packed(None, header["meta"], self.device)
        batch = RolloutBatch(
            **{name: t[name] for name in ROLLOUT_TENSORS},
            **{name: t.get(name) for name in OPTIONAL_ROLLOUT_TENSORS},
            prompts=[],
            completions=[],
            finish_reasons=[],
        )
        gen = torch.tensor(header["generator"], dtype=torch.uint8)
        return StepInputs(batch, t["scores"], header["beta"], gen, header.get("entropy_coef"))

    # -- strategy seams (FSDP2 overrides them: tandem.train.fsdp) -----------------------------------------
    def update_target(
        self,
        policy: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    ) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler | None]:
        """What the policy update trains: the replica itself here (a sharded copy under FSDP2)."""
        return policy, optimizer, scheduler

    def before_checkpoint(
        self, optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler | None
    ) -> None:
        """Rank 0, before a run checkpoint reads ``optimizer``/``scheduler``: nothing to do for replicas
        (FSDP2 copies its sharded schedule's position into them)."""

    def stream_weights(self) -> Iterator[tuple[str, torch.Tensor]] | None:
        """Rank 0's policy weights gathered one tensor at a time, where rank 0 keeps no whole copy (FSDP2
        in a decoupled learner); None here: rank 0's replica is the whole policy."""
        return None

    def shard_writer(self) -> Callable[[Path], None] | None:
        """What writes the ranks' shares of a run checkpoint into a folder (FSDP2: its DCP shards of the
        policy and optimiser state); None for replicas, whose rank 0 optimiser is the whole state."""
        return None

    # -- replicas -----------------------------------------------------------------------------------------
    def broadcast_replica(
        self, model: torch.nn.Module, extra: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Make every rank's ``model`` equal rank 0's (parameters and buffers, as tensors) and return rank
        0's ``extra`` (optimizer/scheduler state: pickled once, at start)."""
        with torch.no_grad():
            for t in [*model.parameters(), *model.buffers()]:
                buf = t.detach().to(self.device).contiguous()
                dist.broadcast(buf, src=0)
                if self.rank != 0:
                    t.copy_(buf)
        return self.share_object(extra) or {}

    def reference_source(self, policy: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        """Every rank, at the same point: what its copy of the KL reference moves towards
        (``algorithm.kl.ref_sync_steps``), by name: a replica's own policy parameters."""
        return iter(policy.named_parameters())

    def share_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (pickled; small state only). Other ranks pass None."""
        box = [obj if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def restore_shards(self, folder: Path) -> None:
        """Restore every rank's training state from a checkpoint's shards (:attr:`state_in_shards`
        learners only: FSDP2)."""
        raise TypeError("a replicated learner restores rank 0 and hands its state over (share_replica)")

    def end_step(self, *models: torch.nn.Module) -> None:
        """Every rank, after each step: check the replicas (policy, and the critic when there is one) are
        still identical (costs one pass over the weights and one tiny all-gather), then mark the group
        idle (safe to stop cleanly)."""
        self.verify_in_sync(*models)
        self.in_step = False

    def verify_in_sync(self, *models: torch.nn.Module) -> None:
        """Raise if any rank's weights differ from rank 0's (an exact integer fingerprint of the bits of
        each model; one all-gather for all of them)."""
        mine = torch.tensor([fingerprint(m) for m in models], dtype=torch.long, device=self.device)
        gathered = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(gathered, mine)
        if any(not torch.equal(g, mine) for g in gathered):
            raise RuntimeError(f"data-parallel learner replicas diverged: fingerprints {gathered}")


def _chunk_owner(units: int, world_size: int) -> torch.Tensor:
    """Owner rank of each of ``units`` items split into ``world_size`` contiguous near-equal chunks."""
    sizes = [len(c) for c in torch.arange(units).tensor_split(world_size)]
    return torch.repeat_interleave(torch.arange(world_size), torch.tensor(sizes, dtype=torch.long))


def all_reduce_gradients(grads: list[torch.Tensor], device: torch.device) -> None:
    """In-place ``all_reduce(SUM)`` of ``grads``, flattened into buckets of ≤ :data:`BUCKET_BYTES` per
    dtype (one collective per bucket instead of one per tensor). Naive equivalent: ``for g in grads:
    dist.all_reduce(g)``."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for group in by_dtype.values():
        bucket: list[torch.Tensor] = []
        size = 0
        for g in group:
            bucket.append(g)
            size += g.numel() * g.element_size()
            if size >= BUCKET_BYTES:
                _reduce_bucket(bucket, device)
                bucket, size = [], 0
        if bucket:
            _reduce_bucket(bucket, device)


def _reduce_bucket(bucket: list[torch.Tensor], device: torch.device) -> None:
    flat = torch.cat([g.reshape(-1) for g in bucket]).to(device)
    dist.all_reduce(flat)
    offset = 0
    for g in bucket:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def broadcast_packed(
    tensors: dict[str, torch.Tensor] | None,
    meta: list[tuple[str, tuple[int, ...], str]],
    device: torch.device,
) -> dict[str, torch.Tensor]:
    """Broadcast named tensors from rank 0 (``tensors``; None elsewhere) with one collective per dtype:
    each dtype's tensors travel flattened into one buffer (bool as uint8). ``meta``: (name, shape,
    dtype) of each tensor, known to every rank. Returns the tensors on every rank."""
    dtypes = sorted({d for _, _, d in meta})
    out: dict[str, torch.Tensor] = {}
    for dname in dtypes:
        dtype = getattr(torch, dname)
        wire = torch.uint8 if dtype == torch.bool else dtype
        items = [(k, shape) for k, shape, d in meta if d == dname]
        numel = [int(torch.Size(shape).numel()) for _, shape in items]
        if tensors is not None:
            flat = torch.cat([tensors[k].reshape(-1).to(wire) for k, _ in items]).to(device)
        else:
            flat = torch.empty(sum(numel), dtype=wire, device=device)
        dist.broadcast(flat, src=0)
        for (k, shape), part in zip(items, flat.cpu().split(numel), strict=True):
            out[k] = part.to(dtype).view(shape).clone()
    return out


def fingerprint(model: torch.nn.Module) -> int:
    """Integer sum of the raw bits of every parameter and buffer: equal on two replicas iff (barring a
    2^-64 collision) their weights are bitwise equal; exact whatever the summation order."""
    total = torch.zeros((), dtype=torch.long)
    with torch.no_grad():
        for i, t in enumerate([*model.parameters(), *model.buffers()]):
            bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.long}[t.element_size()]
            raw = t.detach().cpu().contiguous().view(bits).long()
            total += (raw * (i + 1)).sum()  # position-weighted so swapped tensors differ
    return int(total)
