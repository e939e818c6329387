"""A moving average of the policy's trainable weights (``trainer.ema_decay``): what a run evaluates, keeps as
its best model and writes as a checkpoint's ``model/``, while rollouts keep sampling the live weights.

A policy trained at a useful learning rate keeps moving around the solution it has found; its held-out
accuracy from one evaluation to the next is noisy, and only rises to its level late, when the schedule has
decayed the rate. The average of its recent weights sits nearer the middle of that walk (Polyak averaging):
it evaluates higher mid-run, and at the end, with the rate decayed, matches the live weights.

After the ``n``-th update (``n`` from 1) the average moves toward the live weights by ``1 - d_n`` with

    d_n = min(decay, n / (n + 1))

so it starts as the plain mean of the weights so far (the starting weights included) and becomes an
exponential moving average over ``≈ 1 / (1 - decay)`` updates once that mean would weigh the newest
update less than ``1 - decay`` (from update 19 at decay 0.95). Only parameters that require a gradient
are averaged (a LoRA policy's adapters, not its frozen base), in float32 or their own dtype if wider.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch


def average_decay(decay: float, updates: int) -> float:
    """The decay ``d_n`` of update number ``updates`` (from 1): ``min(decay, n / (n + 1))``."""
    return min(decay, updates / (updates + 1))


class WeightAverage:
    """The moving average of ``params`` (updated in place by the optimiser); ``applied()`` swaps it in."""

    def __init__(self, named: Sequence[tuple[str, torch.Tensor]], decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        if not named:
            raise ValueError("no parameter requires a gradient: nothing to average")
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.decay = decay
        self.updates = 0
        self.average = [self._copy(p) for p in self.params]
        self._saved: list[torch.Tensor] | None = None  # the live weights while applied()
        self.sharded = False  # reshard(): params and average are this rank's DTensor shards

    @classmethod
    def of(cls, module: torch.nn.Module, decay: float) -> WeightAverage:
        """The average of ``module``'s parameters that require a gradient."""
        return cls([(n, p) for n, p in module.named_parameters() if p.requires_grad], decay)

    @staticmethod
    def _copy(p: torch.Tensor) -> torch.Tensor:
        dtype = p.dtype if p.dtype in (torch.float32, torch.float64) else torch.float32
        return p.detach().to(dtype=dtype, copy=True)

    @torch.no_grad()
    def update(self) -> float:
        """Move the average toward the live weights after one optimiser update; returns the decay used."""
        if self._saved is not None:
            raise RuntimeError("update() inside applied(): the parameters hold the average")
        self.updates += 1
        d = average_decay(self.decay, self.updates)
        live = [p.detach().to(a.dtype) for p, a in zip(self.params, self.average, strict=True)]
        torch._foreach_lerp_(self.average, live, 1.0 - d)
        return d

    @property
    def is_applied(self) -> bool:
        """Whether the parameters hold the average now (inside :meth:`applied`)."""
        return self._saved is not None

    @torch.no_grad()
    def reshard(self, module: torch.nn.Module) -> None:
        """Follow the parameters of the same names in ``module``, now sharded by FSDP2 (``fully_shard``
        replaces them with DTensors): the average becomes this rank's shards of it, placed as they are.
        Collective: every rank calls it with the same whole average."""
        from torch.distributed.tensor import distribute_tensor

        own = dict(module.named_parameters())
        params = [own[name] for name in self.names]
        self.average = [
            distribute_tensor(a.to(p.device), p.device_mesh, p.placements)
            for a, p in zip(self.average, params, strict=True)
        ]
        self.params, self.sharded = params, True

    @contextmanager
    def applied(self) -> Iterator[None]:
        """Inside: the parameters hold the average; on exit the live weights are back, bit for bit."""
        if self._saved is not None:  # nested: already in place
            yield
            return
        self._saved = [p.detach().clone() for p in self.params]
        with torch.no_grad():
            for p, a in zip(self.params, self.average, strict=True):
                p.copy_(a)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, saved in zip(self.params, self._saved, strict=True):
                    p.copy_(saved)
            self._saved = None

    def live_weights(self) -> dict[str, torch.Tensor]:
        """The live weights by parameter name, also while :meth:`applied` (a checkpoint holds the average
        as its ``model/`` and these beside it, to resume from); DTensor shards after :meth:`reshard`."""
        live = self.params if self._saved is None else self._saved
        return {n: t.detach().clone().contiguous() for n, t in zip(self.names, live, strict=True)}

    @torch.no_grad()
    def restart(self) -> None:
        """Take the parameters as they are now as the average (after a checkpoint's ``model/`` was loaded
        into them, before its live weights are: :func:`load_live_weights`)."""
        self.average = [self._copy(p) for p in self.params]


def weights_mismatch(
    module: torch.nn.Module,
    weights: Mapping[str, torch.Tensor],
    *,
    what: str = "live weight",
    of: str = "the policy",
) -> str | None:
    """Why ``weights`` cannot go into ``module``'s parameters of the same names (the first that is not a
    parameter of it, or of another shape; ``what`` of module ``of`` in the message), or None."""
    own = dict(module.named_parameters())
    for name, tensor in weights.items():
        if name not in own:
            return f"{what} {name!r} is not a parameter of {of}"
        if own[name].shape != tensor.shape:
            return f"{what} {name!r} has shape {tuple(tensor.shape)}, {of}'s {tuple(own[name].shape)}"
    return None


@torch.no_grad()
def load_live_weights(
    module: torch.nn.Module,
    live: dict[str, torch.Tensor],
    *,
    what: str = "live weight",
    of: str = "the policy",
) -> None:
    """Put a checkpoint's live weights (:meth:`WeightAverage.live_weights`; or other named weights, ``what``
    of module ``of`` in errors) into ``module``'s parameters of the same names; ValueError names the first
    that is missing, extra or of another shape (:func:`weights_mismatch`)."""
    why = weights_mismatch(module, live, what=what, of=of)
    if why:
        raise ValueError(why)
    own = dict(module.named_parameters())
    for name, tensor in live.items():
        own[name].copy_(tensor)
