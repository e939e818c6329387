"""User-facing errors.

Every expected bad input (config, data file, model folder, reward function) raises a ``TandemError``
whose message is one line: what is wrong, where (``file:line``, config key or JSON field), and how to
fix it. The CLI prints the message without a traceback and exits non-zero.
"""

from __future__ import annotations


def first_line(err: BaseException) -> str:
    """The first line of ``str(err)``, or the exception's type name when it has no message."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


class TandemError(Exception):
    """An expected, user-caused error; ``str(err)`` is the one line shown to the user."""

    exit_code: int = 2

    def __init__(self, message: str, *, where: str | None = None, hint: str | None = None) -> None:
        self.message, self.where, self.hint = (
            message,
            where,
            hint,
        )  # the parts, for a caller that re-frames it
        parts = [f"{where}: {message}" if where else message]
        if hint:
            parts.append(f"({hint})")
        super().__init__(" ".join(parts))


class ConfigError(TandemError):
    """A config file, key or value is invalid."""


class DataError(TandemError):
    """A data file or row is malformed, empty or too long."""


class ModelError(TandemError):
    """A model folder is missing, incomplete or uses unsafe (pickle) weights."""


class RewardError(TandemError):
    """A reward function raised, returned the wrong length, or returned a non-finite value."""


class MissingDependencyError(TandemError):
    """An optional dependency is not installed; the message names the extra to install."""

    def __init__(self, package: str, extra: str) -> None:
        super().__init__(
            f"optional dependency '{package}' is not installed",
            hint=f"pip install 'tandem-rl[{extra}]'",
        )
