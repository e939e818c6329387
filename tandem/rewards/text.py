"""The text of a completion as a reward sees it: a string, or TRL's conversational completion.

For conversational data TRL passes each completion as ``[{"role": "assistant", "content": text}]``; the
built-in rewards (task verifiers, format regexes) score the text, so they accept both shapes.
"""

from __future__ import annotations

from typing import Any


def completion_text(completion: Any) -> str:
    """``completion`` itself when a string, else the contents of its messages joined by newlines."""
    if isinstance(completion, str):
        return completion
    return "\n".join(str(m["content"]) for m in completion)
