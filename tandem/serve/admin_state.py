"""The admin state every replica serves from: which model each arm is, the traffic split, and the history
that ``/admin/rollback`` undoes.

The state is a small serialisable value (:class:`AdminConfig`), changed only by the pure operations below
(each returns a new config with ``version + 1``). It lives in a store: :class:`MemoryStore` for a single
process, :class:`FileStore` (a JSON file replaced atomically, read-modify-write under ``flock``) when
``--workers N`` runs several replicas. An admin request on any replica updates the store; every replica
compares the store's version with the one it serves before each request and catches up
(:func:`tandem.serve.admin.sync`), so a split change reaches all replicas at once and a hot-loaded arm
reaches each replica as soon as that replica has loaded it.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tandem.utils.io import atomic_write_text

MAX_HISTORY = 100  # admin changes /admin/rollback can undo


class SplitError(ValueError):
    """An admin change names an unknown arm or carries an invalid weight (answered 400)."""


@dataclass(frozen=True)
class Table:
    """The arms served (arm name -> load id) and their normalised traffic weights."""

    arms: dict[str, str]
    split: dict[str, float]


@dataclass(frozen=True)
class AdminConfig:
    """The versioned admin state: ``paths`` maps every load id ever used to its model folder."""

    version: int
    paths: dict[str, str]
    current: Table
    history: tuple[Table, ...] = field(default=())

    def to_json(self) -> str:
        tables = [self.current, *self.history]
        return json.dumps(
            {
                "version": self.version,
                "paths": self.paths,
                "tables": [{"arms": t.arms, "split": t.split} for t in tables],
            }
        )

    @classmethod
    def from_json(cls, text: str) -> AdminConfig:
        data = json.loads(text)
        tables = [Table(dict(t["arms"]), dict(t["split"])) for t in data["tables"]]
        return cls(int(data["version"]), dict(data["paths"]), tables[0], tuple(tables[1:]))


def check_weight(name: str, value: object) -> float:
    """``value`` as a weight: a finite number >= 0 (JSON allows ``NaN`` and ``1e400``; we do not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SplitError(f"weight of '{name}' must be a number")
    weight = float(value)
    if not math.isfinite(weight) or weight < 0:
        raise SplitError(f"weight of '{name}' must be a finite number >= 0, got {value}")
    return weight


def _normalised(arms: dict[str, str], weights: dict[str, object]) -> dict[str, float]:
    unknown = sorted(set(weights) - set(arms))
    if unknown:
        raise SplitError(f"unknown arm(s) {unknown}; arms: {sorted(arms)}")
    checked = {name: check_weight(name, w) for name, w in weights.items()}
    total = sum(checked.values())
    if not math.isfinite(total) or total <= 0:
        raise SplitError("weights must sum to a finite number greater than 0")
    return {name: checked.get(name, 0.0) / total for name in arms}


def _changed(cfg: AdminConfig, table: Table, paths: dict[str, str] | None = None) -> AdminConfig:
    history = (cfg.current, *cfg.history)[:MAX_HISTORY]
    return AdminConfig(cfg.version + 1, paths if paths is not None else cfg.paths, table, history)


def initial(arms: dict[str, str], split: dict[str, float] | None = None) -> AdminConfig:
    """The state at startup: arm ``name`` is load ``start-name``; the first arm gets all traffic unless
    ``split`` says otherwise. No history (there is nothing to roll back to)."""
    loads = {name: f"start-{name}" for name in arms}
    paths = {f"start-{name}": str(path) for name, path in arms.items()}
    first = next(iter(arms))
    weights = split or {first: 1.0}
    return AdminConfig(0, paths, Table(loads, _normalised(loads, weights)))


def set_split(cfg: AdminConfig, weights: dict[str, object]) -> AdminConfig:
    """A new split over the current arms (normalised; arms not named get 0)."""
    return _changed(cfg, Table(cfg.current.arms, _normalised(cfg.current.arms, weights)))


def promote(cfg: AdminConfig, name: str) -> AdminConfig:
    """All traffic to arm ``name`` (KeyError if there is no such arm)."""
    if name not in cfg.current.arms:
        raise KeyError(name)
    return set_split(cfg, {name: 1.0})


def add_arm(cfg: AdminConfig, name: str, load: str, path: str, weight: float | None) -> AdminConfig:
    """Arm ``name`` now serves load ``load`` (from ``path``); a new arm gets ``weight`` (default 0)."""
    arms = {**cfg.current.arms, name: load}
    old = cfg.current.split
    if weight is None:
        weights: dict[str, object] = {n: old.get(n, 0.0) for n in arms}
        if not any(weights.values()):
            weights[name] = 1.0
    else:
        weights = {**{n: old.get(n, 0.0) for n in arms}, name: weight}
    return _changed(cfg, Table(arms, _normalised(arms, weights)), {**cfg.paths, load: path})


def rollback(cfg: AdminConfig) -> AdminConfig:
    """The state before the last change (IndexError when there is none)."""
    if not cfg.history:
        raise IndexError("nothing to roll back")
    return AdminConfig(cfg.version + 1, cfg.paths, cfg.history[0], cfg.history[1:])


Change = Callable[[AdminConfig], AdminConfig]


class MemoryStore:
    """The admin state of a single-process server."""

    def __init__(self, cfg: AdminConfig) -> None:
        self._cfg = cfg

    def version(self) -> int:
        return self._cfg.version

    def read(self) -> AdminConfig:
        return self._cfg

    def update(self, change: Change) -> AdminConfig:
        """Apply ``change``; an exception leaves the state as it was."""
        self._cfg = change(self._cfg)
        return self._cfg


class FileStore:
    """The admin state shared by the replicas of one server: ``admin.json`` in the server's state
    folder. Writers hold an exclusive ``flock`` on ``admin.lock`` and replace the file atomically, so a
    reader sees the old or the new state, never a torn one; ``version()`` re-reads only when the file
    changed (inode or mtime)."""

    def __init__(self, folder: str | Path) -> None:
        self.path = Path(folder) / "admin.json"
        self.lock = Path(folder) / "admin.lock"
        self._seen: tuple[int, int, int] | None = None
        self._cfg: AdminConfig | None = None

    def create(self, cfg: AdminConfig) -> None:
        """Write the initial state (the parent process does this before starting the replicas)."""
        atomic_write_text(self.path, cfg.to_json())

    def version(self) -> int:
        return self.read().version

    def read(self) -> AdminConfig:
        stat = os.stat(self.path)
        key = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if key != self._seen or self._cfg is None:
            self._cfg = AdminConfig.from_json(self.path.read_text())
            self._seen = key
        return self._cfg

    def update(self, change: Change) -> AdminConfig:
        """Read-modify-write under the lock; an exception from ``change`` writes nothing."""
        with open(self.lock, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                self._seen = None
                new = change(self.read())
                atomic_write_text(self.path, new.to_json())
                self._cfg, self._seen = new, None
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
        return new
