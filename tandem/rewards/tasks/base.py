"""What a built-in task is, and the split rule every built-in task shares.

A task generates prompt rows deterministically from ``(split, n, seed)`` and scores completions with a
reward in TRL's signature. Rows carry ``prompt`` and ``answer`` (one correct completion, usable as an
SFT target) plus any task-specific columns the reward needs.

**Split rule.** A prompt belongs to ``"train"`` when the first 8 bytes of its BLAKE2b digest form an even
number and to ``"test"`` when odd. Generation draws candidate rows from a seeded stream and keeps only
those whose prompt hashes into the requested split, until ``n`` rows are collected. A prompt's split is a
function of its text alone, so train and test never share a prompt, for every seed, ``n`` and option
set. Rows may repeat within a split (the prompt space can be small); ``make_rows(split, n, seed)`` is a
prefix of ``make_rows(split, n + k, seed)``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

from tandem.errors import ConfigError, RewardError
from tandem.rewards.text import completion_text

SPLITS = ("train", "test")

# Attempts per requested row before giving up: the split rule keeps about half of all candidates, so
# running out means the options leave (almost) no prompt for this split.
_ATTEMPTS_PER_ROW = 64
_MIN_ATTEMPTS = 4096


@runtime_checkable
class Task(Protocol):
    """A verifiable task: seeded row generator plus a 1/0 correctness reward."""

    name: str

    def make_rows(self, split: str, n: int, seed: int) -> list[dict[str, Any]]:
        """``n`` rows of ``split`` ("train" or "test"); same arguments -> identical rows."""
        ...

    def reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float | None]:
        """TRL-style reward: 1.0 for a correct completion, 0.0 otherwise."""
        ...


def split_of(prompt: str) -> str:
    """The split ("train" or "test") a prompt belongs to, by the parity of its BLAKE2b hash."""
    digest = hashlib.blake2b(prompt.encode("utf-8"), digest_size=8).digest()
    return SPLITS[int.from_bytes(digest, "big") & 1]


def first_line(completion: Any) -> str:
    """The model's answer: the text before the first newline, whitespace stripped (of the assistant
    message's content for a conversational completion)."""
    return completion_text(completion).split("\n", 1)[0].strip()


def require_column(task: str, columns: dict[str, Any], name: str, size: int) -> Sequence[Any]:
    """Column ``name`` from a reward's keyword arguments, checked to hold one value per completion."""
    values = columns.get(name)
    if values is None:
        raise RewardError(
            f"task '{task}' reward needs a '{name}' column", hint="use rows made by the task's make_rows"
        )
    if len(values) != size:
        raise RewardError(f"task '{task}' reward got {len(values)} '{name}' values for {size} completions")
    return values


def exact_match(task: str, completions: list[str], columns: dict[str, Any]) -> list[float | None]:
    """1.0 where a completion's first line equals the row's ``answer`` (both stripped), else 0.0."""
    answers = require_column(task, columns, "answer", len(completions))
    return [float(first_line(c) == str(a).strip()) for c, a in zip(completions, answers, strict=True)]


class GeneratedTask(ABC):
    """Base for built-in tasks: subclasses draw one candidate row from an RNG; this class applies the
    split rule, the seeding and the row budget."""

    name: ClassVar[str]

    @abstractmethod
    def sample_row(self, rng: random.Random) -> dict[str, Any]:
        """One candidate row (``prompt``, ``answer``, extras) drawn from ``rng``."""

    @abstractmethod
    def reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float | None]:
        """TRL-style reward: 1.0 for a correct completion, 0.0 otherwise."""

    def make_rows(self, split: str, n: int, seed: int) -> list[dict[str, Any]]:
        """``n`` rows whose prompts all hash into ``split`` (see the module docstring)."""
        if split not in SPLITS:
            raise ConfigError(f"unknown split '{split}' for task '{self.name}'", hint="use 'train' or 'test'")
        if n < 0:
            raise ConfigError(f"task '{self.name}': number of rows must be >= 0, got {n}")
        rng = random.Random(_stream_seed(self.name, self._options_key(), split, seed))
        rows: list[dict[str, Any]] = []
        budget = max(_MIN_ATTEMPTS, _ATTEMPTS_PER_ROW * n)
        for _ in range(budget):
            if len(rows) == n:
                return rows
            row = self.sample_row(rng)
            if split_of(row["prompt"]) == split:
                rows.append(row)
        if len(rows) == n:
            return rows
        raise ConfigError(
            f"task '{self.name}' found only {len(rows)} of {n} '{split}' prompts in {budget} draws",
            hint="widen the task options",
        )

    def _options_key(self) -> str:
        """The task's options as stable text (dataclass fields), so different options give different
        streams; a non-dataclass subclass has no options and an empty key."""
        if not dataclasses.is_dataclass(self):
            return ""
        return repr(sorted((f.name, getattr(self, f.name)) for f in dataclasses.fields(self)))


def check_int(task: str, key: str, value: object, lo: int, hi: int) -> int:
    """``value`` as an int in ``[lo, hi]``, or a ConfigError naming the task option."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"task '{task}': {key} must be an integer in {lo}..{hi}, got {value!r}")
    return value


def _stream_seed(name: str, options: str, split: str, seed: int) -> int:
    """A 64-bit RNG seed from everything that defines a row stream (stable across Python runs)."""
    key = f"{name}|{options}|{split}|{int(seed)}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")
