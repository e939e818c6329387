"""``guess``: guess a hidden number, e.g. prompt ``"game 4821: guess 1-100"``, column ``secret``.

Played as a multi-turn game by the ``guess`` environment (``higher``/``lower`` after each wrong guess);
as a single-turn task the verifier asks for the number at the first try. Each row's prompt carries a
game number so train and test prompts stay disjoint (the split is a hash of the prompt).

Option ``search_demos`` (a share in 0..1; unset by default) adds a ``completion`` column for ``tandem sft``:
a whole game transcript (``50\nhigher\n75\nlower\n62``, the feedback lines as the ``guess`` environment
writes them, ending on the secret). That share of transcripts bisects the range; the rest play the naive
strategy of option ``naive_demos``: ``random`` (the default) guesses distinct random numbers, ``linear``
counts up from 1 (``1\nhigher\n2\nhigher\n3``); both ignore the feedback. SFT on a small share gives a warm
start that knows the format but rarely uses the feedback, so RL has a return to raise. ``linear`` makes
the naive games' first guess one number (1), so a greedy warm start plays them rather than bisecting
(with ``random`` the midpoint is the single likeliest first guess for any bisecting share).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, ClassVar

from tandem.errors import ConfigError
from tandem.rewards.tasks.base import GeneratedTask, check_int, first_line, require_column

NAIVE_DEMOS = ("random", "linear")  # what the non-bisecting transcripts do


def transcript(secret: int, high: int, rng: random.Random, *, search: bool, naive: str = "random") -> str:
    """A game played to the secret: bisection of ``[1, high]``, or the ``naive`` strategy (distinct random
    guesses, or ``linear``: 1, 2, 3, ...; the feedback ignored); each wrong guess is followed by the
    ``guess`` environment's ``higher``/``lower`` line."""
    lo, hi, tried, lines = 1, high, set(), []
    while True:
        if search:
            guess = (lo + hi) // 2
        elif naive == "linear":
            guess = len(lines) // 2 + 1
        else:
            guess = rng.randint(1, high)
            while guess in tried:
                guess = rng.randint(1, high)
            tried.add(guess)
        lines.append(str(guess))
        if guess == secret:
            return "\n".join(lines)
        lines.append("higher" if guess < secret else "lower")
        lo, hi = (guess + 1, hi) if guess < secret else (lo, guess - 1)


@dataclass(frozen=True)
class GuessTask(GeneratedTask):
    """Secrets uniform in ``[1, high]``."""

    name: ClassVar[str] = "guess"
    high: int = 100
    search_demos: float | None = None
    naive_demos: str = "random"

    def __post_init__(self) -> None:
        check_int(self.name, "high", self.high, 2, 10**6)
        share = self.search_demos
        if share is not None and (
            isinstance(share, bool) or not isinstance(share, int | float) or not 0.0 <= share <= 1.0
        ):
            raise ConfigError(f"task '{self.name}': search_demos must be a number in 0..1, got {share!r}")
        if self.naive_demos not in NAIVE_DEMOS:
            raise ConfigError(
                f"task '{self.name}': naive_demos must be one of {', '.join(NAIVE_DEMOS)}, got {self.naive_demos!r}"
            )

    def _options_key(self) -> str:
        """Without ``search_demos`` (and ``naive_demos`` at its default) the key (and so every row stream) is the one from before the option."""
        key: list[tuple[str, Any]] = [("high", self.high)]
        if self.search_demos is not None:
            key.append(("search_demos", float(self.search_demos)))
        if self.naive_demos != "random":
            key.append(("naive_demos", self.naive_demos))
        return repr(key)

    def sample_row(self, rng: random.Random) -> dict[str, Any]:
        """One game: a numbered prompt and its secret (and with ``search_demos`` a transcript)."""
        game = rng.randint(0, 10**6)
        row: dict[str, Any] = {
            "prompt": f"game {game}: guess 1-{self.high}\n",
            "secret": rng.randint(1, self.high),
        }
        if self.search_demos is not None:
            search = rng.random() < self.search_demos
            row["completion"] = transcript(
                row["secret"], self.high, rng, search=search, naive=self.naive_demos
            )
        return row

    def reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float | None]:
        """1.0 where the completion's first line is the secret, else 0.0."""
        secrets = require_column(self.name, columns, "secret", len(completions))
        return [float(first_line(c) == str(s)) for c, s in zip(completions, secrets, strict=True)]
