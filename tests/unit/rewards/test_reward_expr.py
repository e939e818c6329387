"""Safe arithmetic evaluation: exact values, literal tracking, and refusal of everything else."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.rewards.expr import MAX_EXPRESSION_CHARS, ExpressionError, evaluate


@pytest.mark.parametrize(
    ("text", "value", "numbers"),
    [
        ("1+2*3", 7, (1, 2, 3)),
        ("(1+2)*3", 9, (1, 2, 3)),
        ("7/2", Fraction(7, 2), (7, 2)),
        ("-3+10", 7, (3, 10)),
        (" 8 - 2 - 1 ", 5, (8, 2, 1)),
    ],
)
def test_evaluates_exactly(text, value, numbers):
    result = evaluate(text)
    assert result.value == value and result.numbers == numbers


@pytest.mark.parametrize(
    "text",
    [
        "2**3",
        "1.5+1",
        "0x10",
        "1_0",
        "1e3",
        "a+1",
        "abs(1)",
        "1 if 1 else 2",
        "[1]",
        "1,2",
        "1//2",
        "1%2",
        "(1",
    ],
)
def test_rejects_anything_but_plain_arithmetic(text):
    with pytest.raises(ExpressionError):
        evaluate(text)


def test_division_by_zero_and_length_limit():
    with pytest.raises(ZeroDivisionError):
        evaluate("1/(2-2)")
    with pytest.raises(ExpressionError, match="longer than"):
        evaluate("1+" * MAX_EXPRESSION_CHARS + "1")
    # Deep nesting within the length limit evaluates without blowing the stack.
    assert evaluate("(" * 120 + "1" + ")" * 120).value == 1
    assert evaluate("-" * 250 + "1").value == 1


@settings(max_examples=50, deadline=None)
@given(a=st.integers(0, 10**6), b=st.integers(1, 10**6), op=st.sampled_from("+-*/"))
def test_matches_python_arithmetic(a, b, op):
    expected = {"+": a + b, "-": a - b, "*": a * b, "/": Fraction(a, b)}[op]
    assert evaluate(f"{a}{op}{b}").value == expected
