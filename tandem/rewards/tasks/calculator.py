"""``calculator``: multiplication meant to be solved with a calculator tool, e.g. ``"1234*5678="``.

Rows carry the ``answer`` (what the verifier and the ``calculator`` environment check) and a
``completion``: the reference tool-use transcript in the plain call format (``CALL calc(1234*5678)``,
the tool's ``RESULT 7006652`` line, then the answer), which ``tandem sft`` trains on for a warm start. A
4-digit product is beyond what a tiny model computes by itself; copying the operands into a call and the
result back out is not.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, ClassVar

from tandem.rewards.tasks.base import GeneratedTask, check_int, exact_match


@dataclass(frozen=True)
class CalculatorTask(GeneratedTask):
    """Operands uniform in ``[10**(digits-1), 10**digits - 1]``; the verifier compares the completion's
    first line with ``answer``."""

    name: ClassVar[str] = "calculator"
    digits: int = 4

    def __post_init__(self) -> None:
        check_int(self.name, "digits", self.digits, 1, 9)

    def sample_row(self, rng: random.Random) -> dict[str, Any]:
        """One ``a*b=`` prompt, its product and the reference transcript."""
        lo, hi = 10 ** (self.digits - 1), 10**self.digits - 1
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        value = str(a * b)
        transcript = f"CALL calc({a}*{b})\nRESULT {value}\n{value}"
        return {"prompt": f"{a}*{b}=", "answer": value, "completion": transcript}

    def reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float | None]:
        """1.0 where the completion's first line equals ``answer``, else 0.0."""
        return exact_match(self.name, completions, columns)
