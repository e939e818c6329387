"""The built-in ``calculator`` environment: arithmetic with a ``calc`` tool, reward 1 for the right answer.

Rows come from the ``calculator`` task (``"1234*5678="``, column ``answer``). The model may call
``calc`` (format ``plain`` by default, ``CALL calc(1234*5678)``, whose result comes back as
``RESULT 7006652``); a turn without a call is its answer, and the episode ends with reward 1.0 when the
answer's first line is the product, else 0.0. The tool evaluates integer arithmetic only (``+ - * //
% ( )``, unary minus) through Python's ``ast``, never ``eval``.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tandem.agents.env import Prompt, ToolEnv, first_line
from tandem.agents.tool_calls import ToolSpec
from tandem.utils.pyast import parse_expression

_OPS: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
MAX_ABS = 10**30  # results beyond this are refused (no huge powers of huge numbers)


def calc(expression: str) -> str:
    """The value of an integer arithmetic ``expression``; ValueError (the model's error observation)
    for anything else."""
    try:
        tree = parse_expression(expression.strip())
    except SyntaxError:
        raise ValueError(f"cannot parse {expression!r}") from None
    return str(_eval(tree.body))


def _eval(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.FloorDiv | ast.Mod) and right == 0:
            raise ValueError("division by zero")
        value = _OPS[type(node.op)](left, right)
        if abs(value) > MAX_ABS:
            raise ValueError("result too large")
        return value
    raise ValueError("only integers and + - * // % ( ) are allowed")


CALC_TOOL = ToolSpec(
    name="calc",
    description="evaluate integer arithmetic",
    parameters={
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "e.g. 1234*5678"}},
        "required": ["expression"],
    },
    fn=calc,
)


@dataclass
class Calculator(ToolEnv):
    """One episode of the calculator task; options: ``fmt`` (``plain`` or ``hermes``)."""

    fmt: str = "plain"

    def __post_init__(self) -> None:
        self.tools = (CALC_TOOL,)
        super().__post_init__()

    def reset(self, row: Mapping[str, Any]) -> Prompt:
        if "answer" not in row:
            raise KeyError(
                "the calculator environment needs rows with an 'answer' column (data.task: calculator)"
            )
        return super().reset(row)

    def answer(self, action: str) -> float:
        return float(first_line(action) == str(self.row["answer"]).strip())
