"""``guess``: guess a hidden number, e.g. prompt ``"game 4821: guess 1-100"``, column ``secret``.

Played as a multi-turn game by the ``guess`` environment (``higher``/``lower`` after each wrong guess);
as a single-turn task the verifier asks for the number at the first try. Each row's prompt carries a
game number so train and test prompts stay disjoint (the split is a hash of the prompt).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, ClassVar

from tandem.rewards.tasks.base import GeneratedTask, check_int, first_line, require_column


@dataclass(frozen=True)
class GuessTask(GeneratedTask):
    """Secrets uniform in ``[1, high]``."""

    name: ClassVar[str] = "guess"
    high: int = 100

    def __post_init__(self) -> None:
        check_int(self.name, "high", self.high, 2, 10**6)

    def sample_row(self, rng: random.Random) -> dict[str, Any]:
        """One game: a numbered prompt and its secret."""
        game = rng.randint(0, 10**6)
        return {"prompt": f"game {game}: guess 1-{self.high}\n", "secret": rng.randint(1, self.high)}

    def reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float | None]:
        """1.0 where the completion's first line is the secret, else 0.0."""
        secrets = require_column(self.name, columns, "secret", len(completions))
        return [float(first_line(c) == str(s)) for c, s in zip(completions, secrets, strict=True)]
