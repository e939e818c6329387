"""Seeding and exact save/restore of the global random number generators.

Resuming a run must continue the same random stream as an uninterrupted run, so a checkpoint stores
the state of every global generator that training touches: Python ``random``, numpy's legacy global
generator and torch (CPU, plus every visible CUDA device). :func:`rng_state` returns only tensors,
lists, ints, floats, strings and ``None`` so that ``torch.load(weights_only=True)`` can read it back.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import numpy as np
import torch

logger = logging.getLogger(__name__)

_MAX_SEED = 2**32 - 1  # numpy's limit; torch and random accept more


def seed_everything(seed: int) -> None:
    """Seed Python ``random``, numpy's global generator and torch (CPU and all CUDA devices).

    Raises ``ValueError`` for a seed outside ``[0, 2**32 - 1]`` (numpy's range) rather than silently
    folding it, so two different configured seeds never map to the same stream.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _MAX_SEED:
        raise ValueError(f"seed must be an integer in [0, {_MAX_SEED}], got {seed!r}")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device (lazily if CUDA is not initialised yet)


def rng_state() -> dict[str, Any]:
    """Snapshot of every global generator, safe for ``torch.save`` / ``torch.load(weights_only=True)``."""
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": {"version": version, "internal": list(internal), "gauss": gauss},
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore generators from :func:`rng_state` output; missing entries are left as they are.

    CUDA states are restored for as many devices as both the snapshot and this machine have; a
    mismatch in device count is logged, because the random stream then differs from the saved run.
    """
    if "python" in state:
        py = state["python"]
        random.setstate((int(py["version"]), tuple(int(x) for x in py["internal"]), py["gauss"]))
    if "numpy" in state:
        np_state = state["numpy"]
        key = np.asarray(np_state["key"].numpy() if torch.is_tensor(np_state["key"]) else np_state["key"])
        np.random.set_state(
            {
                "bit_generator": np_state["bit_generator"],
                "state": {"key": key.astype(np.uint32), "pos": int(np_state["pos"])},
                "has_gauss": int(np_state["has_gauss"]),
                "gauss": float(np_state["gauss"]),
            }
        )
    if "torch" in state:
        torch.set_rng_state(state["torch"].cpu())
    _set_cuda_state(state.get("cuda"))


def _set_cuda_state(cuda_states: list[torch.Tensor] | None) -> None:
    """Restore per-device CUDA generator states, tolerating a different number of devices."""
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    saved = len(cuda_states) if cuda_states is not None else 0
    if saved != available and (saved or available):
        logger.warning(
            "RNG state was saved with %d CUDA device(s) but %d are visible; restoring %d",
            saved,
            available,
            min(saved, available),
        )
    for device, device_state in enumerate((cuda_states or [])[:available]):
        torch.cuda.set_rng_state(device_state.cpu(), device)
