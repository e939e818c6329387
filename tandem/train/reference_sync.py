"""Moving the KL reference towards the policy (``algorithm.kl.ref_sync_steps``, ``algorithm.kl.ref_sync_alpha``).

A fixed reference holds a long run near its start: the KL term grows as the policy improves and ends by
fighting the reward. TR-DPO (Gorbatovski et al., 2024) moves the reference every ``N`` steps with a soft
update, ``ref ← α·policy + (1 − α)·ref`` (TRL's ``sync_ref_model``, ``ref_model_sync_steps``,
``ref_model_mixup_alpha``); ProRL (Liu et al., 2025) resets it outright (α = 1) so the KL anchors to a
recent policy rather than the initial one. The moved reference is state a resume must restore: run
checkpoints keep it (``reference.safetensors``, :func:`reference_weights`).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from tandem.train.averaging import weights_mismatch

REFERENCE_WEIGHTS = "reference.safetensors"  # a run checkpoint's moved KL reference


def parameter_mismatch(reference: torch.nn.Module, policy: torch.nn.Module) -> str | None:
    """Why ``reference`` cannot be moved towards ``policy`` (parameters of other names or shapes), or
    None when every parameter has its counterpart."""
    pol = dict(policy.named_parameters())
    extra = sorted(n for n, _ in reference.named_parameters() if n not in pol)
    if extra:
        return f"reference parameter {extra[0]!r} is not a parameter of the policy"
    return weights_mismatch(reference, pol, what="policy parameter", of="the reference")


@torch.no_grad()
def mix_into(reference: torch.nn.Module, policy: Iterable[tuple[str, torch.Tensor]], alpha: float) -> None:
    """``ref ← α·policy + (1 − α)·ref`` for every parameter, in place (``α`` in (0, 1]; 1 copies).

    ``policy``: the policy's tensors by name (its ``named_parameters()``; on an FSDP2 learner its shards,
    with the reference sharded alike: :meth:`~tandem.train.distributed.DataParallel.reference_source`);
    names the reference has no parameter of (buffers, the second name of a tied weight) are passed over.
    Tied parameters are moved once (``named_parameters`` lists a shared tensor once)."""
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    ref = dict(reference.named_parameters())
    moved: set[str] = set()
    for name, tensor in policy:
        p = ref.get(name)
        if p is None or name in moved:
            continue
        source = tensor.detach().to(device=p.device, dtype=p.dtype)
        if alpha == 1:
            p.copy_(source)
        else:
            p.lerp_(source, alpha)
        moved.add(name)
    if len(moved) != len(ref):
        missing = sorted(set(ref) - moved)
        raise ValueError(f"the policy has no parameter {missing[0]!r} to move the reference towards")


def reference_weights(reference: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The reference's parameters by name (each shared tensor once), contiguous CPU copies to save."""
    return {n: p.detach().to("cpu").contiguous().clone() for n, p in reference.named_parameters()}
