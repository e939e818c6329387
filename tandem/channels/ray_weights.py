"""Weight channel for the Ray runtime: versioned weights as numpy arrays in the Ray object store.

``publish`` puts one ``{name: ndarray}`` dict into the object store (``ray.put``) and hands the reference,
with its version, to a tiny registry actor; ``fetch`` asks the registry for the reference only when its
version is newer than the caller's, then ``ray.get`` maps the arrays zero-copy from the node's shared
object store and copies them once into private tensors. The naive equivalent, ``ray.put(state_dict)``,
pickles every torch tensor and is several times slower on both sides (``bench/ray_weights.py`` measures
it). Dtypes numpy lacks (bfloat16, float8) travel as same-width integer views and are viewed back.

The registry keeps a reference to the newest version only, so older versions are freed by Ray's
reference counting once no worker still reads them. ``publish_stream`` (a sharded learner, which gathers one
tensor at a time) puts the arrays in chunks of at most :data:`CHUNK_BYTES` plus one tensor, several refs
per version, which ``fetch`` reads back in order. Same interface as
:class:`~tandem.channels.weights.SharedMemoryWeights`; pass the object to worker actors as an argument.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from tandem.channels.ray import driver_node_strategy, import_ray

# numpy has no such dtype: ship the bits as an integer of the same width
_VIEW_AS = {
    torch.bfloat16: torch.int16,
    torch.float8_e4m3fn: torch.int8,
    torch.float8_e5m2: torch.int8,
}
# publish_stream puts the gathered tensors into the object store in chunks of about this size
CHUNK_BYTES = 256 * 2**20


class WeightRegistry:
    """Actor body: the newest ``(version, refs)``: one ref per chunk of the weights (in a list, so Ray passes
    the refs, not their values)."""

    def __init__(self) -> None:
        self.version, self.refs, self.dtypes = -1, [], {}

    def set(self, version: int, refs: list[Any], dtypes: dict[str, str]) -> None:
        self.version, self.refs, self.dtypes = version, refs, dtypes

    def newer_than(self, known: int) -> tuple[int, list[Any], dict[str, str]] | None:
        return (self.version, self.refs, self.dtypes) if self.version > known else None

    def get_version(self) -> int:
        return self.version


def to_numpy(state: dict[str, torch.Tensor]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """CPU numpy views of ``state`` plus the torch dtype of each tensor stored as an integer view."""
    arrays, dtypes = {}, {}
    for name, t in state.items():
        t = t.detach().cpu().contiguous()
        if t.dtype in _VIEW_AS:
            dtypes[name] = str(t.dtype).removeprefix("torch.")
            t = t.view(_VIEW_AS[t.dtype])
        arrays[name] = t.numpy()
    return arrays, dtypes


def from_numpy(arrays: dict[str, np.ndarray], dtypes: dict[str, str]) -> dict[str, torch.Tensor]:
    """Private tensors from (read-only, object-store backed) arrays: one copy each."""
    state = {}
    for name, a in arrays.items():
        t = torch.from_numpy(np.array(a, copy=True))
        state[name] = t.view(getattr(torch, dtypes[name])) if name in dtypes else t
    return state


class RayObjectStoreWeights:
    """Versioned weights in the Ray object store; create in the driver (learner), pass to worker actors."""

    def __init__(self) -> None:
        ray = import_ray()
        self._registry = (
            ray.remote(WeightRegistry)
            .options(num_cpus=0, scheduling_strategy=driver_node_strategy())
            .remote()
        )
        self._owner = True

    def __getstate__(self) -> dict[str, Any]:
        return {"registry": self._registry}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._registry, self._owner = state["registry"], False

    @property
    def version(self) -> int:
        """The newest published version (-1 before the first publish)."""
        return int(import_ray().get(self._registry.get_version.remote()))

    def publish(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Snapshot ``state`` into the object store (``ray.put`` copies) and make it the newest version."""
        ray = import_ray()
        arrays, dtypes = to_numpy(state)
        ray.get(self._registry.set.remote(version, [ray.put(arrays)], dtypes))

    def publish_stream(self, items: Iterable[tuple[str, torch.Tensor]], version: int) -> int:
        """As :meth:`publish`, from ``(name, tensor)`` pairs (a sharded learner gathers each just before):
        they go into the object store in chunks of about :data:`CHUNK_BYTES`, so at most one chunk of
        tensors is held here at a time. Returns the bytes put."""
        ray = import_ray()
        refs, dtypes, chunk, size, total = [], {}, {}, 0, 0
        for name, t in items:
            arrays, kinds = to_numpy({name: t})
            chunk.update(arrays)
            dtypes.update(kinds)
            size += arrays[name].nbytes
            if size >= CHUNK_BYTES:
                refs.append(ray.put(chunk))
                total, chunk, size = total + size, {}, 0
        if chunk or not refs:
            refs.append(ray.put(chunk))
        ray.get(self._registry.set.remote(version, refs, dtypes))
        return total + size

    def fetch(self, known_version: int) -> tuple[dict[str, torch.Tensor], int] | None:
        """A private copy of the newest weights and their version, or None when not newer than known."""
        ray = import_ray()
        newer = ray.get(self._registry.newer_than.remote(known_version))
        if newer is None:
            return None
        version, refs, dtypes = newer
        arrays: dict[str, np.ndarray] = {}
        for chunk in ray.get(refs):  # one dict (publish) or several chunks (publish_stream), in order
            arrays.update(chunk)
        return from_numpy(arrays, dtypes), int(version)

    def close(self) -> None:
        """Nothing to release in a reader: the handle goes with the object."""

    def unlink(self) -> None:
        """Free the registry and with it the last published version (the creating process, at shutdown)."""
        if self._owner and self._registry is not None:
            import_ray().kill(self._registry)
            self._registry = None
