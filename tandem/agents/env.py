"""The environment API: what an episode's model turns talk to.

An environment is any object with two methods, each plain or ``async``::

    reset(row) -> observation             # the episode's first prompt (text, or chat messages)
    step(action) -> (observation, reward, done, info)

``row`` is a dataset row (``prompt`` plus the extra columns); ``action`` is the text the model wrote this
turn (stop string cut); ``observation`` is the text appended to the conversation after it (tool results,
game feedback), tokenised once and never trained on; ``reward`` is this turn's reward (an episode's
return is the sum of its turns'); ``done`` ends the episode; ``info`` may carry counters the trainer
reports per episode: ``tool_calls``, ``tool_errors``, ``sandbox_kills`` (ints). One instance serves one
episode: the trainer builds a fresh one per episode from the class (or factory) the config names.

A single-turn task is the one-step special case: :class:`SingleTurn` answers the first action with
``done`` and no reward (the reward functions score the answer), which is what the trainer runs when no
``env`` is configured. :class:`ToolEnv` is the base of tool-using environments: it parses the model's
calls (:mod:`tandem.agents.tool_calls`), runs them concurrently and returns their results, and hands a
turn without calls to :meth:`ToolEnv.answer`.

Built-in environments are listed in :data:`ENVIRONMENTS` (name -> ``module:Class``, imported when
chosen); a user's is loaded by path (``env.path: my_envs:Calculator``) like reward functions.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from tandem.agents.tool_calls import (
    ToolSpec,
    get_format,
    observation,
    parse_tool_calls,
    run_tool_calls,
    tool_map,
)

Prompt = str | list[dict[str, Any]]  # a text prompt, or chat messages rendered by the chat template
StepOutput = tuple[str, float, bool, dict[str, Any]]  # observation, reward, done, info

ENVIRONMENTS: dict[str, str] = {
    "single_turn": "tandem.agents.env:SingleTurn",
    "calculator": "tandem.agents.calculator:Calculator",
    "guess": "tandem.agents.guess:GuessNumber",
    "python": "tandem.agents.python_env:PythonCountdown",
}  # built-in environments (env.name): one line each, imported only when chosen

INFO_COUNTERS = ("tool_calls", "tool_errors", "sandbox_kills")  # info keys summed per episode


@runtime_checkable
class Environment(Protocol):
    """What an episode needs from an environment (either method may be ``async``)."""

    def reset(self, row: Mapping[str, Any]) -> Prompt | Awaitable[Prompt]: ...

    def step(self, action: str) -> StepOutput | Awaitable[StepOutput]: ...


class SingleTurn:
    """The one-step environment: the prompt is the row's ``prompt``; the first answer ends the episode
    with reward 0 (the run's reward functions score it). ``inline``: its methods never block, so the
    episode loop calls them directly instead of in worker threads."""

    inline = True

    def reset(self, row: Mapping[str, Any]) -> Prompt:
        return row["prompt"]

    def step(self, action: str) -> StepOutput:
        return "", 0.0, True, {}


@dataclass
class ToolEnv:
    """Base of a tool-using environment: ``tools`` in call format ``fmt`` (``hermes`` or ``plain``).

    A turn with calls (well-formed or not) gets their results as the observation — a malformed call's
    error message is an observation too, counted in ``tool_errors``, never an exception; a turn without
    calls is the final answer, scored by :meth:`answer`. Subclasses set the tools and implement
    :meth:`reset` and :meth:`answer`; ``result_suffix`` is appended to every observation (e.g. a newline
    so the model's next turn starts on a fresh line). ``observation_template`` wraps the results for a
    chat model, e.g. ChatML's ``"\n<|im_start|>user\n{results}<|im_end|>\n<|im_start|>assistant\n"``
    (the model's turn ended with ``<|im_end|>``); the default is the results as they are."""

    tools: Sequence[ToolSpec] = ()
    fmt: str = "hermes"
    tool_timeout_s: float | None = 10.0
    max_result_chars: int | None = 1024
    result_suffix: str = "\n"
    observation_template: str = "{results}"
    row: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        get_format(self.fmt, key="env.options.fmt")
        self._tools = tool_map(self.tools)

    def reset(self, row: Mapping[str, Any]) -> Prompt:
        self.row = row
        return row["prompt"]

    async def step(self, action: str) -> StepOutput:
        parsed = parse_tool_calls(action, self._tools, self.fmt)
        if not parsed.calls:
            reward = self.answer(action)
            return "", float(reward), True, {}
        results = await run_tool_calls(
            parsed, self._tools, timeout_s=self.tool_timeout_s, max_chars=self.max_result_chars
        )
        info = {
            "tool_calls": len(results),
            "tool_errors": sum(r.error for r in results),
            "sandbox_kills": sum(r.kill_reason is not None for r in results),
        }
        text = self.observation_template.format(results=observation(results, self.fmt) + self.result_suffix)
        return text, 0.0, False, info

    def answer(self, action: str) -> float:
        """The reward of a final answer (a turn without tool calls)."""
        raise NotImplementedError


def first_line(text: str) -> str:
    """The first line of ``text``, whitespace stripped (how the built-in environments read answers)."""
    return text.strip().split("\n", 1)[0].strip()
