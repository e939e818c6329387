"""The ``python`` tool (model-written code run in the sandbox) and the built-in ``python`` environment:
countdown solved with the help of code.

Rows come from the ``countdown`` task (``"nums 3 7 12 target 33:"``, columns ``nums`` and ``target``).
The model may call ``python`` (format ``plain`` by default: ``CALL python(print(3*7+12))``; its output
comes back as ``RESULT 33``) as often as ``env.max_turns`` allows, e.g. to try candidates or to search
all expressions with ``itertools``; a turn without a call is its answer. The episode ends with reward 1.0
when the answer's first line is an expression of ``+ - * /`` and parentheses that uses every given number
exactly once and equals the target (exact fractions), else 0.0.

Each call runs in a fresh sandbox (:mod:`tandem.agents.sandbox`) under the environment's limits; a call
that the sandbox kills comes back as an error observation and counts in ``sandbox_kills``.
"""

from __future__ import annotations

import ast
import signal
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from tandem.agents.env import Prompt, ToolEnv, first_line
from tandem.agents.sandbox import SandboxLimits, SandboxResult, run_python_async
from tandem.agents.tool_calls import ToolOutput, ToolSpec
from tandem.utils.pyast import parse_expression

_CODE_SCHEMA = {
    "type": "object",
    "properties": {"code": {"type": "string", "description": "Python source; print what you want to see"}},
    "required": ["code"],
}


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def sandbox_output(result: SandboxResult) -> ToolOutput:
    """What the model reads after a run: its stdout, then (on failure) the last line of stderr, or why
    the sandbox killed it."""
    text = result.stdout.rstrip("\n")
    if result.kill_reason == "killed":  # a signal the code sent itself (os.abort), not a limit
        name = _signal_name(-result.exit_code)
        text = f"{text}\nkilled by signal {name}".lstrip("\n")
    elif result.kill_reason is not None:
        text = f"{text}\nkilled: {result.kill_reason} limit".lstrip("\n")
    elif result.exit_code != 0:
        lines = result.stderr.strip().splitlines()
        text = f"{text}\n{lines[-1] if lines else f'exit status {result.exit_code}'}".lstrip("\n")
    return ToolOutput(text, error=not result.ok, kill_reason=result.kill_reason)


def python_tool(limits: SandboxLimits | None = None, *, name: str = "python") -> ToolSpec:
    """A tool that runs its ``code`` argument in the sandbox under ``limits`` and returns the output."""
    limits = limits or SandboxLimits()

    async def run(code: str) -> ToolOutput:
        return sandbox_output(await run_python_async(code, limits))

    return ToolSpec(
        name,
        "Run Python code in a sandbox (standard library only) and see what it prints.",
        _CODE_SCHEMA,
        run,
    )


def countdown_value(text: str) -> tuple[Fraction, list[int]] | None:
    """``(value, numbers used)`` of an arithmetic expression of integers, ``+ - * /`` and parentheses,
    in exact fractions; None for anything else (or a division by zero)."""
    try:
        tree = parse_expression(text.strip())
    except (SyntaxError, ValueError):
        return None
    used: list[int] = []

    def value(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value >= 0:
            used.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.BinOp):
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Sub):
                return left - right
            if isinstance(node.op, ast.Mult):
                return left * right
            if isinstance(node.op, ast.Div) and right != 0:
                return left / right
        raise ValueError("not a countdown expression")

    try:
        return value(tree.body), used
    except ValueError:
        return None


def is_countdown_solution(text: str, nums: list[int], target: int) -> bool:
    """True when ``text`` uses ``nums`` exactly once each (as a multiset) and equals ``target``."""
    found = countdown_value(text)
    return found is not None and found[0] == target and Counter(found[1]) == Counter(int(n) for n in nums)


@dataclass
class PythonCountdown(ToolEnv):
    """One countdown episode with a ``python`` tool; options: ``fmt``, and the sandbox limits ``cpu_s``,
    ``wall_s``, ``memory_mb``, ``max_output_bytes`` of every call."""

    fmt: str = "plain"
    cpu_s: float = 2.0
    wall_s: float = 5.0
    memory_mb: int = 256
    max_output_bytes: int = 4096

    def __post_init__(self) -> None:
        limits = SandboxLimits(
            cpu_s=self.cpu_s,
            wall_s=self.wall_s,
            memory_mb=self.memory_mb,
            max_output_bytes=self.max_output_bytes,
        )
        self.tools = (python_tool(limits),)
        self.tool_timeout_s = self.wall_s + 5.0  # the sandbox enforces wall_s; this is a backstop
        super().__post_init__()

    def reset(self, row: Mapping[str, Any]) -> Prompt:
        if "nums" not in row or "target" not in row:
            raise KeyError(
                "the python environment needs rows with 'nums' and 'target' columns (data.task: countdown)"
            )
        return super().reset(row)

    def answer(self, action: str) -> float:
        return float(
            is_countdown_solution(first_line(action), list(self.row["nums"]), int(self.row["target"]))
        )
