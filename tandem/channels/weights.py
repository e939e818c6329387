"""Weight channel on one machine: the learner publishes versioned weights into shared memory.

Layout of the shared block: an 8-byte little-endian version (``-1`` = nothing published yet), then every
tensor's raw bytes at a 64-byte aligned offset, in the order of the spec. A lock shared by all processes
makes publish and fetch atomic with respect to each other (a reader never sees half a version). Copies go
tensor by tensor through ``torch.frombuffer`` views — no pickling, no serialisation; the naive equivalent is
``queue.put(model.state_dict())`` which pickles every tensor.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
from collections.abc import Iterable
from dataclasses import dataclass
from multiprocessing import shared_memory
from multiprocessing.context import BaseContext
from typing import Any

import torch

_HEADER = 64
_ALIGN = 64


@dataclass(frozen=True)
class TensorSlot:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int
    nbytes: int


def _layout(state: dict[str, torch.Tensor]) -> tuple[list[TensorSlot], int]:
    slots, offset = [], _HEADER
    for name, t in state.items():
        nbytes = t.numel() * t.element_size()
        slots.append(TensorSlot(name, tuple(t.shape), t.dtype, offset, nbytes))
        offset += -(-nbytes // _ALIGN) * _ALIGN
    return slots, max(offset, _HEADER + _ALIGN)


class SharedMemoryWeights:
    """Versioned weights in one shared-memory block; create in the learner, pass to workers as an argument.

    ``publish(state, version)`` or ``publish_stream(items, version)`` (learner) and ``fetch(known_version)``
    (workers) are the whole interface;
    ``unlink()`` frees the block (creator only, at shutdown).
    """

    def __init__(self, template: dict[str, torch.Tensor], ctx: BaseContext | None = None) -> None:
        self.slots, size = _layout(template)
        self._shm = shared_memory.SharedMemory(create=True, size=size)
        self._lock = (ctx or mp.get_context("spawn")).Lock()
        self._owner = True
        self._write_version(-1)

    # -- pickling: workers re-attach to the block by name --------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        return {"slots": self.slots, "name": self._shm.name, "lock": self._lock}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.slots = state["slots"]
        self._lock = state["lock"]
        self._shm = shared_memory.SharedMemory(name=state["name"])
        self._owner = False

    # -- protocol -------------------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        """The newest published version (-1 before the first publish)."""
        return int.from_bytes(bytes(self._shm.buf[:8]), "little", signed=True)

    def _write_version(self, version: int) -> None:
        self._shm.buf[:8] = int(version).to_bytes(8, "little", signed=True)

    def _view(self, slot: TensorSlot) -> torch.Tensor:
        count = slot.nbytes // torch.empty((), dtype=slot.dtype).element_size()
        flat = torch.frombuffer(self._shm.buf, dtype=slot.dtype, count=count, offset=slot.offset)
        return flat.view(slot.shape)

    def publish(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Copy ``state`` (same names, shapes and dtypes as the template) in and mark it ``version``."""
        with self._lock:
            for slot in self.slots:
                self._view(slot).copy_(state[slot.name].detach())
            self._write_version(version)

    def publish_stream(self, items: Iterable[tuple[str, torch.Tensor]], version: int) -> int:
        """As :meth:`publish`, from ``(name, tensor)`` pairs copied into their slots as they arrive (a
        sharded learner gathers each tensor just before: only one is whole at a time). Every slot must be
        written; otherwise (or if ``items`` fails midway) the block is marked empty (version -1) and the
        error raised. Returns the bytes copied."""
        by_name = {slot.name: slot for slot in self.slots}
        written: set[str] = set()
        with self._lock:
            try:
                for name, t in items:
                    self._view(by_name[name]).copy_(t.detach())
                    written.add(name)
                if written != by_name.keys():
                    missing = sorted(by_name.keys() - written)
                    raise KeyError(f"published weights lack {len(missing)} tensors, e.g. {missing[0]}")
            except BaseException:
                self._write_version(-1)  # half-written: no worker may load it
                raise
            self._write_version(version)
        return sum(by_name[name].nbytes for name in written)

    def fetch(self, known_version: int) -> tuple[dict[str, torch.Tensor], int] | None:
        """A private copy of the newest weights and their version, or None when not newer than known."""
        if self.version <= known_version:
            return None
        with self._lock:
            version = self.version
            state = {slot.name: self._view(slot).clone() for slot in self.slots}
        return state, version

    def close(self) -> None:
        """Detach this process (views are temporary, so the block can always be closed)."""
        with contextlib.suppress(BufferError):  # a caller still holds a view: leave it open
            self._shm.close()

    def unlink(self) -> None:
        """Free the block (the creating process, at shutdown)."""
        self.close()
        if self._owner:
            with contextlib.suppress(FileNotFoundError):
                self._shm.unlink()
