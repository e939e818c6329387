"""Safe evaluation of small arithmetic expressions (for the countdown reward).

The text is parsed with :mod:`ast` and walked by hand: only non-negative integer literals, the binary
operators ``+ - * /``, unary ``+``/``-`` and parentheses are accepted, written with decimal digits,
those symbols and blanks only. Nothing is ever passed to
``eval``. Values are exact :class:`fractions.Fraction`, so ``7/2*2`` is exactly 7 and no float tolerance is
needed; there is no power operator, so a short expression cannot build a huge number.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from fractions import Fraction

from tandem.utils.pyast import parse_expression

MAX_EXPRESSION_CHARS = 256
_ALLOWED_CHARS = frozenset("0123456789+-*/() \t")

_BINARY = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


class ExpressionError(ValueError):
    """The text is not an allowed arithmetic expression."""


@dataclass(frozen=True)
class Evaluated:
    """An expression's exact value and the integer literals it uses, in order of appearance."""

    value: Fraction
    numbers: tuple[int, ...]


def evaluate(text: str, max_chars: int = MAX_EXPRESSION_CHARS) -> Evaluated:
    """Evaluate ``text`` exactly.

    Raises ExpressionError for text that is too long, does not parse, or uses anything but integer
    literals, ``+ - * /`` and parentheses; ZeroDivisionError for a division by zero.
    """
    if len(text) > max_chars:
        raise ExpressionError(f"expression longer than {max_chars} characters")
    bad = sorted(set(text) - _ALLOWED_CHARS)
    if bad:
        # Also rules out literal spellings such as 0x14, 1_0 or 2.0 that ast would accept.
        raise ExpressionError(f"characters {''.join(bad)!r} are not allowed")
    try:
        tree = parse_expression(text.strip())
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        raise ExpressionError(f"not an expression: {type(err).__name__}") from None
    numbers: list[int] = []
    value = _walk(tree.body, numbers)
    return Evaluated(value, tuple(numbers))


def _walk(node: ast.AST, numbers: list[int]) -> Fraction:
    if isinstance(node, ast.Constant):
        if type(node.value) is not int:
            raise ExpressionError(f"literal {node.value!r} is not an integer")
        numbers.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left = _walk(node.left, numbers)
        right = _walk(node.right, numbers)
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _walk(node.operand, numbers)
        return -inner if isinstance(node.op, ast.USub) else inner
    raise ExpressionError(f"'{type(node).__name__}' is not allowed")
