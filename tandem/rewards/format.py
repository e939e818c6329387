"""Format rewards: score a completion's shape rather than its correctness."""

from __future__ import annotations

import re
from typing import Any

from tandem.errors import ConfigError
from tandem.rewards.text import completion_text


class RegexFormatReward:
    """TRL-style reward: 1.0 where the completion fully matches ``pattern``, else 0.0.

    A class rather than a closure so it pickles (decoupled workers) and names its pattern in errors.
    """

    def __init__(self, pattern: str, *, strip: bool = True, flags: int = 0) -> None:
        try:
            self.regex = re.compile(pattern, flags)
        except re.error as err:
            raise ConfigError(f"format_regex: invalid pattern {pattern!r} ({err})") from None
        self.strip = strip

    def __call__(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float | None]:
        texts = [completion_text(c) for c in completions]  # conversational completions too
        return [float(self.regex.fullmatch(t.strip() if self.strip else t) is not None) for t in texts]

    def __repr__(self) -> str:
        return f"format_regex({self.regex.pattern!r})"


def format_regex(pattern: str, *, strip: bool = True, flags: int = 0) -> RegexFormatReward:
    """A reward giving 1.0 when the completion (whitespace stripped unless ``strip=False``) fully matches
    ``pattern``. An invalid pattern raises ConfigError."""
    return RegexFormatReward(pattern, strip=strip, flags=flags)
