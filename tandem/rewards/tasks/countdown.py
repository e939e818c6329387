"""``countdown`` (the TinyZero task): reach a target from given numbers with ``+ - * /`` and parentheses.

Prompt ``"nums 3 7 12 target 33:"``; a correct completion is an expression such as ``"3*7+12"`` that
uses **each given number exactly once** (as a multiset) and evaluates exactly to the target. Targets are
built from a random expression over the numbers, so every prompt is solvable; that expression is the row's
``answer``.

Option ``tool_demos`` (a share in 0..1; unset by default, leaving the rows as they were) adds a
``completion`` column for ``tandem sft``: that share of rows is a transcript that solves the prompt with the
``python`` tool of the ``python`` environment (plain format) -- a one-line brute-force search
(:func:`search_program`) that starts with the prompt copied into a string, the ``RESULT`` line it prints, then
that expression as the answer; the others answer at once with ``answer``, which a tiny model rarely gets
right by itself. A short SFT on them gives a weak warm start that writes the search but often miscopies the
prompt, so RL has a success rate to raise (``configs/agent_python.yaml``).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from itertools import permutations
from typing import Any, ClassVar

from tandem.errors import ConfigError
from tandem.rewards.expr import ExpressionError, evaluate
from tandem.rewards.tasks.base import GeneratedTask, check_int, first_line, require_column

# Operator -> precedence; atoms have precedence 3.
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}
_MAX_TRIES = 1000


@dataclass(frozen=True)
class CountdownTask(GeneratedTask):
    """Numbers are uniform in ``[1, max_number]``. Intermediate results of the generating expression are
    integers (divisions are exact) and the target is a positive integer."""

    name: ClassVar[str] = "countdown"
    num_numbers: int = 3
    max_number: int = 20
    tool_demos: float | None = None

    def __post_init__(self) -> None:
        check_int(self.name, "num_numbers", self.num_numbers, 2, 6)
        check_int(self.name, "max_number", self.max_number, 2, 1000)
        share = self.tool_demos
        if share is not None and (
            isinstance(share, bool) or not isinstance(share, int | float) or not 0.0 <= share <= 1.0
        ):
            raise ConfigError(f"task '{self.name}': tool_demos must be a number in 0..1, got {share!r}")
        if share is not None and self.num_numbers != 3:
            raise ConfigError(f"task '{self.name}': tool_demos needs num_numbers 3, got {self.num_numbers}")

    def _options_key(self) -> str:
        """Without ``tool_demos`` the key (and so every row stream) is the one from before the option."""
        key: list[tuple[str, Any]] = [("max_number", self.max_number), ("num_numbers", self.num_numbers)]
        if self.tool_demos is not None:
            key.append(("tool_demos", float(self.tool_demos)))
        return repr(key)

    def sample_row(self, rng: random.Random) -> dict[str, Any]:
        """Draw numbers, then a random expression over them until its value is a positive integer."""
        nums = [rng.randint(1, self.max_number) for _ in range(self.num_numbers)]
        built = None
        for _ in range(_MAX_TRIES):
            built = _random_expression(nums, rng)
            if built is not None:
                break
        # The sum is always a valid target; it is only a fallback after _MAX_TRIES failed draws.
        text, target = built if built is not None else ("+".join(map(str, nums)), sum(nums))
        row: dict[str, Any] = {
            "prompt": countdown_prompt(nums, target),
            "answer": text,
            "nums": list(nums),
            "target": target,
        }
        if self.tool_demos is not None:
            row["completion"] = text  # a direct answer, no tool call
            if rng.random() < self.tool_demos:
                found = search_result(nums, target)
                if found is not None:  # the search misses ~2% of targets: those rows answer directly
                    row["completion"] = (
                        f"CALL python({search_program(nums, target)})\nRESULT {found}\n{found}"
                    )
        return row

    def reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float | None]:
        """1.0 where the first line is an expression using each number once that equals ``target``."""
        nums = require_column(self.name, columns, "nums", len(completions))
        targets = require_column(self.name, columns, "target", len(completions))
        return [float(is_solution(c, n, t)) for c, n, t in zip(completions, nums, targets, strict=True)]


def countdown_prompt(nums: list[int], target: int) -> str:
    """``"nums 3 7 12 target 33:"``."""
    return f"nums {' '.join(map(str, nums))} target {target}:"


def is_solution(completion: str, nums: list[int], target: int) -> bool:
    """TinyZero's rule: the numbers used equal ``nums`` as a multiset and the value equals ``target``.
    Anything unparsable, disallowed or dividing by zero is simply not a solution."""
    try:
        result = evaluate(first_line(completion))
    except (ExpressionError, ZeroDivisionError):
        return False
    return Counter(result.numbers) == Counter(int(x) for x in nums) and result.value == Fraction(target)


def search_program(nums: list[int], target: int) -> str:
    """A one-line Python program (184 characters for ``[1,7,9]`` and 72) that prints the first
    ``(a x b) y c`` over the permutations of three numbers and the operators ``+ - * /`` whose value is
    ``target`` (``StopIteration`` when there is none: about 2% of targets need ``a x (b y c)``).

    It starts with the prompt copied verbatim into a string (``s='nums 1 7 9 target 72:'``) and reads the
    numbers from it; the rest is the same for every prompt. A verbatim copy right after the prompt is the
    easiest thing for a small model to learn to copy (it repeats what followed the same characters
    before), much easier than rewriting the numbers into a list."""
    return (
        f"s='{countdown_prompt(nums, target)}';_,*n,_,t=s[:-1].split();from itertools import*;print(next(e for a,b,c in "
        "permutations(n)for x in'+-*/'for y in'+-*/'if eval(e:=f'({a}{x}{b}){y}{c}')==int(t)))"
    )


def search_result(nums: list[int], target: int) -> str | None:
    """What :func:`search_program` prints (computed here, without running it), or None when it finds
    nothing. Float comparison, as in the program."""
    for a, b, c in permutations(nums):
        for x in "+-*/":
            for y in "+-*/":
                expr = f"({a}{x}{b}){y}{c}"
                if eval(expr) == target:  # noqa: S307 -- digits and + - * / only, built right here
                    return expr
    return None


def _random_expression(nums: list[int], rng: random.Random) -> tuple[str, int] | None:
    """Combine the numbers pairwise at random into one expression with minimal parentheses.

    Returns (text, value), or None when a division is inexact or the value is not a positive integer.
    Each item is (text, value, precedence).
    """
    items: list[tuple[str, int, int]] = [(str(x), x, 3) for x in nums]
    while len(items) > 1:
        i, j = rng.sample(range(len(items)), 2)
        left, right = items[i], items[j]
        items = [it for k, it in enumerate(items) if k not in (i, j)]
        op = rng.choice("+-*/")
        if op == "/" and (right[1] == 0 or left[1] % right[1] != 0):
            return None
        value = {"+": left[1] + right[1], "-": left[1] - right[1], "*": left[1] * right[1]}.get(op)
        if value is None:
            value = left[1] // right[1]
        items.append((_join(left, op, right), value, _PRECEDENCE[op]))
    text, value, _ = items[0]
    return (text, value) if value > 0 else None


def _join(left: tuple[str, int, int], op: str, right: tuple[str, int, int]) -> str:
    """``left op right`` with parentheses only where precedence or non-associativity needs them."""
    prec = _PRECEDENCE[op]
    lt = f"({left[0]})" if left[2] < prec else left[0]
    needs_right = right[2] < prec or (right[2] == prec and op in "-/")
    rt = f"({right[0]})" if needs_right else right[0]
    return f"{lt}{op}{rt}"
