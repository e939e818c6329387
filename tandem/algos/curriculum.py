"""Prompt curricula: which prompts a step generates from, given what earlier groups of each prompt scored.

A GRPO-style advantage is zero for every sample of a group whose rewards are all equal, so a prompt the
policy always solves (or never solves) costs a full group of generation and teaches nothing. DAPO's
dynamic sampling (:func:`tandem.algos.dapo.filter_groups`) drops such groups *after* generating them; a
curriculum avoids generating them: it remembers, per prompt, whether its recent groups were all-equal
(:class:`PromptStats`, fed by :func:`~tandem.algos.dapo.group_outcomes`) and picks the next batch from
candidates in the data order. The two compose: the curriculum chooses prompts, dynamic sampling (when on)
still drops what turned out degenerate.

Registered curricula (``data.curriculum.kind``):

* ``uniform`` — every candidate, in the data order (the default; the seeded sampler's epochs).
* ``frontier`` — a candidate whose last ``skip_after`` groups were all-equal is skipped (with probability
  ``1 - revisit``, so a skipped prompt is re-checked now and then: the policy may have learnt or forgotten
  it); a share ``replay`` of the batch replays *frontier* prompts (their latest group had unequal rewards:
  sampled pass rate strictly between 0 and 1 for a 0/1 reward) not in this batch. At most
  ``max_draws × batch`` candidates are looked at; skipped ones fill a batch still short after that.

Pure Python over integer prompt keys (a dataset row index) so the state is small and checkpointable.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from tandem.algos.registry import Registry


@dataclass
class PromptRecord:
    """What is known about one prompt: times drawn, consecutive all-equal groups, latest group's mean."""

    seen: int = 0  # times drawn into a batch
    groups: int = 0  # groups generated from it and scored
    streak: int = 0  # consecutive latest groups whose rewards were all equal (0: the latest was informative)
    last_mean: float = 0.0  # mean reward of its latest group


class PromptStats:
    """Per-prompt records keyed by dataset row index; only prompts drawn at least once are stored."""

    def __init__(self) -> None:
        self.records: dict[int, PromptRecord] = {}

    def get(self, key: int) -> PromptRecord:
        return self.records.get(key) or PromptRecord()

    def drawn(self, keys: Sequence[int]) -> list[int]:
        """Count a draw of each key; returns how many times each had been drawn before."""
        before = []
        for k in keys:
            rec = self.records.setdefault(k, PromptRecord())
            before.append(rec.seen)
            rec.seen += 1
        return before

    def observe(self, key: int, mean: float, all_equal: bool) -> None:
        """Record one scored group of prompt ``key``."""
        rec = self.records.setdefault(key, PromptRecord())
        rec.groups += 1
        rec.streak = rec.streak + 1 if all_equal else 0
        rec.last_mean = float(mean)

    def frontier(self) -> list[int]:
        """Prompts whose latest group had unequal rewards, in key order."""
        return sorted(k for k, r in self.records.items() if r.groups > 0 and r.streak == 0)

    def apply(self, report: dict[str, list]) -> None:
        """Replay what another source saw (a decoupled worker's ticket): its draws (``drawn``: keys) and
        its scored groups (``observed``: ``[key, mean, all_equal]``), in order."""
        self.drawn([int(k) for k in report.get("drawn", [])])
        for key, mean, equal in report.get("observed", []):
            self.observe(int(key), float(mean), bool(equal))

    def to_table(self, size: int) -> torch.Tensor:
        """Dense form for prompts ``0 .. size - 1``: ``[4, size]`` float64 rows ``seen``, ``groups``,
        ``streak``, ``last_mean`` (a prompt never drawn: zeros). Exact for counts below 2**53."""
        table = torch.zeros(4, size, dtype=torch.float64)
        items = [(k, r) for k, r in self.records.items() if 0 <= k < size]
        if items:
            keys = torch.tensor([k for k, _ in items], dtype=torch.long)
            rows = [[r.seen, r.groups, r.streak, r.last_mean] for _, r in items]
            table[:, keys] = torch.tensor(rows, dtype=torch.float64).T
        return table

    def state_dict(self) -> dict[str, Any]:
        return {"records": [[k, *asdict(r).values()] for k, r in sorted(self.records.items())]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.records = {
            int(k): PromptRecord(int(s), int(g), int(st), float(m)) for k, s, g, st, m in state["records"]
        }


class TableStats(PromptStats):
    """:class:`PromptStats` held as the dense ``[4, size]`` table of :meth:`PromptStats.to_table` (prompts
    ``0 .. size - 1``): what a decoupled learner keeps and publishes with every weight version, and what a
    worker picks from. A step touches only the keys it draws and scores, and publishing or taking the table
    costs one copy, not a pass over per-prompt records. Same answers as the record form."""

    def __init__(self, table: torch.Tensor) -> None:  # no records dict: the table is the state
        self.table = table  # [4, size] float64: seen, groups, streak, last_mean

    @classmethod
    def empty(cls, size: int) -> TableStats:
        return cls(torch.zeros(4, size, dtype=torch.float64))

    @property
    def records(self) -> dict[int, PromptRecord]:  # type: ignore[override]
        """The record form (every prompt drawn or scored at least once); a pass over the table."""
        t = self.table
        known = torch.nonzero((t[0] != 0) | (t[1] != 0)).flatten()  # [n]
        return {
            k: PromptRecord(int(s), int(g), int(st), float(m))
            for k, (s, g, st, m) in zip(known.tolist(), t[:, known].T.tolist(), strict=True)
        }

    def get(self, key: int) -> PromptRecord:
        if not 0 <= key < self.table.shape[1]:
            return PromptRecord()
        s, g, st, m = self.table[:, key].tolist()
        return PromptRecord(int(s), int(g), int(st), float(m))

    def drawn(self, keys: Sequence[int]) -> list[int]:
        before = []
        for k in keys:  # one at a time: a key drawn twice in a batch counts its first draw
            before.append(int(self.table[0, k]))
            self.table[0, k] += 1
        return before

    def observe(self, key: int, mean: float, all_equal: bool) -> None:
        t = self.table
        t[1, key] += 1
        t[2, key] = t[2, key] + 1 if all_equal else 0
        t[3, key] = float(mean)

    def frontier(self) -> list[int]:
        t = self.table
        return torch.nonzero((t[1] > 0) & (t[2] == 0)).flatten().tolist()

    def to_table(self, size: int) -> torch.Tensor:
        return self.table.clone() if size == self.table.shape[1] else super().to_table(size)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.table.zero_()
        for k, s, g, st, m in state["records"]:
            self.table[:, int(k)] = torch.tensor([s, g, st, m], dtype=torch.float64)


@dataclass(frozen=True)
class CurriculumOptions:
    """Knobs of a curriculum (``data.curriculum``); each curriculum reads the ones it needs."""

    skip_after: int = 1
    revisit: float = 0.1
    replay: float = 0.25
    max_draws: int = 4


# select(want, draw, stats, options, rng) -> keys of the batch. ``draw()`` returns the next candidate key
# in the data order (an endless stream); the function must return exactly ``want`` keys.
Select = Callable[[int, Callable[[], int], PromptStats, CurriculumOptions, random.Random], list[int]]


@dataclass(frozen=True)
class CurriculumSpec:
    select: Select
    description: str


CURRICULA: Registry[CurriculumSpec] = Registry("prompt curriculum")


def uniform(
    want: int, draw: Callable[[], int], stats: PromptStats, opts: CurriculumOptions, rng: random.Random
) -> list[int]:
    """The next ``want`` candidates, whatever their history."""
    return [draw() for _ in range(want)]


def frontier(
    want: int, draw: Callable[[], int], stats: PromptStats, opts: CurriculumOptions, rng: random.Random
) -> list[int]:
    """Replay ``round(replay × want)`` frontier prompts, then take candidates, skipping those whose last
    ``skip_after`` groups were all-equal (unless a ``revisit`` coin says otherwise); fill from skipped ones
    after ``max_draws × want`` candidates. No key appears twice in a batch while others are available."""
    pool = stats.frontier()
    n_replay = min(len(pool), round(opts.replay * want))
    chosen = rng.sample(pool, n_replay) if n_replay else []
    taken, skipped = set(chosen), []
    for _ in range(max(1, opts.max_draws) * want):
        if len(chosen) >= want:
            break
        key = draw()
        if key in taken:
            continue
        if stats.get(key).streak >= opts.skip_after and rng.random() >= opts.revisit:
            skipped.append(key)
            continue
        chosen.append(key)
        taken.add(key)
    for key in skipped:  # a batch still short: the skipped candidates, in draw order
        if len(chosen) >= want:
            break
        if key not in taken:
            chosen.append(key)
            taken.add(key)
    while len(chosen) < want:  # a dataset smaller than the batch: repeats are unavoidable
        chosen.append(draw())
    return chosen


CURRICULA.add("uniform", CurriculumSpec(uniform, "every prompt in the seeded data order (no curriculum)"))
CURRICULA.add(
    "frontier",
    CurriculumSpec(
        frontier,
        "skip prompts whose recent groups were all-equal (pass rate 0 or 1), replay the frontier",
    ),
)
