"""The built-in ``guess`` environment: guess a hidden number, told ``higher`` or ``lower`` after each try.

Rows come from the ``guess`` task (column ``secret``). Each turn the model writes a number; a wrong one
gets ``higher``/``lower`` (a non-number gets ``a number please``) and the game goes on until
``env.max_turns``. The right number ends it with reward ``1 - penalty * (turns - 1)`` (floored at
``min_reward``): binary search beats guessing, so using the feedback well is what earns reward.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tandem.agents.env import Prompt, StepOutput, first_line


@dataclass
class GuessNumber:
    """One game; options ``penalty`` (reward lost per extra turn) and ``min_reward``."""

    penalty: float = 0.1
    min_reward: float = 0.1
    inline = True  # never blocks: stepped without a worker thread

    def reset(self, row: Mapping[str, Any]) -> Prompt:
        if "secret" not in row:
            raise KeyError("the guess environment needs rows with a 'secret' column (data.task: guess)")
        self.secret, self.turns = int(row["secret"]), 0
        return row["prompt"]

    def step(self, action: str) -> StepOutput:
        self.turns += 1
        guess = first_line(action)
        if not guess.lstrip("-").isdigit():
            return "a number please\n", 0.0, False, {}
        value = int(guess)
        if value == self.secret:
            return "", max(self.min_reward, 1.0 - self.penalty * (self.turns - 1)), True, {}
        return ("higher\n" if value < self.secret else "lower\n"), 0.0, False, {}
