"""``calculator``: multiplication meant to be solved with a calculator tool, e.g. ``"1234*5678="``.

Rows carry the ``answer`` (what the verifier and the ``calculator`` environment check) and a
``completion``: the reference tool-use transcript in the plain call format (``CALL calc(1234*5678)``,
the tool's ``RESULT 7006652`` line, then the answer), which ``tandem sft`` trains on for a warm start. A
4-digit product is beyond what a tiny model computes by itself; copying the operands into a call and the
result back out is not.

Option ``tool_demos`` (default 1.0) is the share of rows whose ``completion`` uses the tool; the others
answer at once with the product (what a model that does not know the tool would try). SFT on a small
share gives a deliberately weak warm start that rarely calls the tool, so RL has a tool-call rate to
raise (``configs/agent_calculator.yaml``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, ClassVar

from tandem.errors import ConfigError
from tandem.rewards.tasks.base import GeneratedTask, check_int, exact_match


@dataclass(frozen=True)
class CalculatorTask(GeneratedTask):
    """Operands uniform in ``[10**(digits-1), 10**digits - 1]``; the verifier compares the completion's
    first line with ``answer``."""

    name: ClassVar[str] = "calculator"
    digits: int = 4
    tool_demos: float = 1.0

    def __post_init__(self) -> None:
        check_int(self.name, "digits", self.digits, 1, 9)
        share = self.tool_demos
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0.0 <= share <= 1.0:
            raise ConfigError(f"task '{self.name}': tool_demos must be a number in 0..1, got {share!r}")

    def _options_key(self) -> str:
        """The default ``tool_demos`` is left out, so rows with it are the rows from before the option."""
        key = [("digits", self.digits)]
        if self.tool_demos != 1.0:
            key.append(("tool_demos", float(self.tool_demos)))
        return repr(key)

    def sample_row(self, rng: random.Random) -> dict[str, Any]:
        """One ``a*b=`` prompt, its product and the reference transcript."""
        lo, hi = 10 ** (self.digits - 1), 10**self.digits - 1
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        value = str(a * b)
        transcript = f"CALL calc({a}*{b})\nRESULT {value}\n{value}"
        if self.tool_demos < 1.0 and rng.random() >= self.tool_demos:
            transcript = value  # a direct answer, no tool call
        return {"prompt": f"{a}*{b}=", "answer": value, "completion": transcript}

    def reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float | None]:
        """1.0 where the completion's first line equals ``answer``, else 0.0."""
        return exact_match(self.name, completions, columns)
