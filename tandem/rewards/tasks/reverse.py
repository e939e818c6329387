"""``reverse``: reverse a lowercase word, e.g. prompt ``"reverse abc:"`` and answer ``"cba"``."""

from __future__ import annotations

import random
import string
from dataclasses import dataclass
from typing import Any, ClassVar

from tandem.errors import ConfigError
from tandem.rewards.tasks.base import GeneratedTask, check_int, exact_match


@dataclass(frozen=True)
class ReverseTask(GeneratedTask):
    """Words of ``min_len..max_len`` letters drawn uniformly from ``a-z``."""

    name: ClassVar[str] = "reverse"
    min_len: int = 3
    max_len: int = 6

    def __post_init__(self) -> None:
        check_int(self.name, "min_len", self.min_len, 1, 64)
        check_int(self.name, "max_len", self.max_len, 1, 64)
        if self.min_len > self.max_len:
            raise ConfigError(
                f"task 'reverse': min_len {self.min_len} is greater than max_len {self.max_len}"
            )

    def sample_row(self, rng: random.Random) -> dict[str, Any]:
        """One random word and its reversal."""
        word = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(self.min_len, self.max_len)))
        return {"prompt": f"reverse {word}:", "answer": word[::-1]}

    def reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float | None]:
        """1.0 where the completion's first line equals ``answer``, else 0.0."""
        return exact_match(self.name, completions, columns)
