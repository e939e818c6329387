"""``arith``: integer arithmetic with one operator, e.g. prompt ``"23+45="`` and answer ``"68"``."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, ClassVar

from tandem.errors import ConfigError
from tandem.rewards.tasks.base import GeneratedTask, check_int, exact_match

_OPS = "+-*"


@dataclass(frozen=True)
class ArithTask(GeneratedTask):
    """Operands are uniform in ``[0, 10**digits - 1]``; the operator is drawn from ``ops``.

    Results may be negative for ``-`` (answer ``"-22"``). The reward compares the completion's first
    line, whitespace stripped, with the ``answer`` column as text (``"068"`` is wrong).
    """

    name: ClassVar[str] = "arith"
    ops: str = "+-"
    digits: int = 2

    def __post_init__(self) -> None:
        if not self.ops or set(self.ops) - set(_OPS):
            raise ConfigError(f"task 'arith': ops must be a non-empty subset of '{_OPS}', got {self.ops!r}")
        check_int(self.name, "digits", self.digits, 1, 9)

    def sample_row(self, rng: random.Random) -> dict[str, Any]:
        """One ``a<op>b=`` prompt with its exact integer result."""
        hi = 10**self.digits - 1
        a, b = rng.randint(0, hi), rng.randint(0, hi)
        op = rng.choice(sorted(set(self.ops)))
        value = a + b if op == "+" else a - b if op == "-" else a * b
        return {"prompt": f"{a}{op}{b}=", "answer": str(value)}

    def reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float | None]:
        """1.0 where the completion's first line equals ``answer``, else 0.0."""
        return exact_match(self.name, completions, columns)
