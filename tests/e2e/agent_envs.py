"""A user-written environment for the agent e2e tests, loaded by path (env.path: agent_envs.py:Counter)."""

from __future__ import annotations

import asyncio


class Counter:
    """Ask for the prompt's first digit, then say 'again' once: two turns, reward for a digit answer."""

    def __init__(self, bonus: float = 1.0) -> None:
        self.bonus, self.turn = bonus, 0

    def reset(self, row):
        if "answer" not in row:  # a task the environment was not written for (tandem eval --task guess)
            raise KeyError("Counter needs rows with an 'answer' column")
        self.row = row
        return row["prompt"]

    async def step(self, action):
        await asyncio.sleep(0.001)  # an async environment
        self.turn += 1
        reward = self.bonus * sum(ch.isdigit() for ch in action) / max(1, len(action))
        if self.turn == 1:
            return "again:", reward, False, {"tool_calls": 1, "tool_errors": int(not action)}
        return "", reward, True, {}
