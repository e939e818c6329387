"""Built-in tasks: registry, determinism, split disjointness, prompt formats and rewards."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.algos.registry import DuplicateNameError
from tandem.errors import ConfigError, RewardError
from tandem.rewards.expr import evaluate
from tandem.rewards.tasks import TASKS, GeneratedTask, get_task, split_of
from tandem.rewards.tasks.arith import ArithTask
from tandem.rewards.tasks.countdown import is_solution

FAST = settings(max_examples=30, deadline=None)


def columns_of(rows: list[dict]) -> dict[str, list]:
    return {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"}


def score(task, rows: list[dict], completions: list[str]) -> list[float | None]:
    return task.reward([r["prompt"] for r in rows], completions, **columns_of(rows))


# --- registry -------------------------------------------------------------------------------------------


def test_registry_lists_builtin_tasks():
    assert TASKS.names() == ["arith", "countdown", "reverse", "safety", "calculator", "guess"]
    assert "arith" in TASKS and len(TASKS) == 6


def test_unknown_task_lists_valid_names():
    with pytest.raises(
        ConfigError,
        match=r"^unknown task 'arithmetic'; valid names: arith, countdown, reverse, safety, calculator, guess$",
    ):
        get_task("arithmetic")


def test_unknown_option_lists_valid_options():
    with pytest.raises(ConfigError, match=r"unknown option\(s\) digit for task 'arith'.*ops, digits"):
        get_task("arith", digit=3)


def test_duplicate_registration_raises():
    with pytest.raises(DuplicateNameError, match="task 'arith' is already registered"):
        TASKS.add("arith", ArithTask)
    assert TASKS.get("arith") is ArithTask


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("arith", {"ops": "+/"}, "ops must be a non-empty subset"),
        ("arith", {"ops": ""}, "ops must be a non-empty subset"),
        ("arith", {"digits": 0}, "digits must be an integer in 1..9"),
        ("arith", {"digits": True}, "digits must be an integer"),
        ("countdown", {"num_numbers": 1}, "num_numbers must be an integer in 2..6"),
        ("countdown", {"max_number": "20"}, "max_number must be an integer"),
        ("reverse", {"min_len": 5, "max_len": 3}, "min_len 5 is greater than max_len 3"),
    ],
)
def test_bad_options_raise_config_error(name, options, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        get_task(name, **options)


def test_bad_split_and_negative_n():
    task = get_task("arith")
    with pytest.raises(ConfigError, match="unknown split 'val'"):
        task.make_rows("val", 3, 0)
    with pytest.raises(ConfigError, match=">= 0"):
        task.make_rows("train", -1, 0)


class OnePromptTask(GeneratedTask):
    """A task whose prompt space is a single prompt, so one split is empty."""

    name = "one"

    def sample_row(self, rng):
        return {"prompt": "reverse a:", "answer": "a"}

    def reward(self, prompts, completions, **columns):
        return [0.0] * len(completions)


def test_empty_split_raises_instead_of_looping():
    task = OnePromptTask()
    home = split_of("reverse a:")
    other = "test" if home == "train" else "train"
    assert len(task.make_rows(home, 3, 0)) == 3
    assert task.make_rows(home, 3, 0) == OnePromptTask().make_rows(home, 3, 0)
    with pytest.raises(ConfigError, match=f"task 'one' found only 0 of 2 '{other}' prompts in 4096 draws"):
        task.make_rows(other, 2, 0)


# --- formats --------------------------------------------------------------------------------------------


def test_prompt_formats():
    arith = get_task("arith").make_rows("train", 50, 0)
    assert all(re.fullmatch(r"\d{1,2}[+-]\d{1,2}=", r["prompt"]) for r in arith)
    assert all(re.fullmatch(r"-?\d+", r["answer"]) for r in arith)
    cd = get_task("countdown").make_rows("train", 50, 0)
    assert all(re.fullmatch(r"nums \d+ \d+ \d+ target \d+:", r["prompt"]) for r in cd)
    rev = get_task("reverse").make_rows("train", 50, 0)
    assert all(re.fullmatch(r"reverse [a-z]{3,6}:", r["prompt"]) for r in rev)
    assert all(r["answer"] == r["prompt"][8:-1][::-1] for r in rev)


def test_arith_negative_results_and_multiplication():
    rows = get_task("arith", ops="-", digits=2).make_rows("train", 200, 3)
    assert any(r["answer"].startswith("-") for r in rows)
    for r in get_task("arith", ops="*", digits=3).make_rows("test", 100, 3):
        a, b = r["prompt"][:-1].split("*")
        assert int(r["answer"]) == int(a) * int(b)


# --- determinism and splits -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["arith", "countdown", "reverse"])
def test_same_arguments_same_rows_and_prefix_property(name):
    task = get_task(name)
    rows = task.make_rows("train", 40, 7)
    assert rows == get_task(name).make_rows("train", 40, 7)
    assert task.make_rows("train", 15, 7) == rows[:15]
    assert rows != task.make_rows("train", 40, 8)


def test_rows_are_pinned_across_runs_and_versions():
    # Golden rows: a change here breaks reproducibility of every saved experiment; do it on purpose only.
    assert [r["prompt"] for r in get_task("arith").make_rows("test", 2, 0)] == ["61+62=", "78-94="]
    cd = get_task("countdown").make_rows("test", 1, 0)[0]
    assert cd == {
        "prompt": "nums 17 16 12 target 220:",
        "answer": "16+17*12",
        "nums": [17, 16, 12],
        "target": 220,
    }
    assert get_task("reverse").make_rows("test", 2, 0)[1] == {"prompt": "reverse yln:", "answer": "nly"}


def test_options_change_the_stream():
    assert get_task("arith", digits=3).make_rows("train", 10, 0) != get_task("arith").make_rows(
        "train", 10, 0
    )


@FAST
@given(
    name=st.sampled_from(["arith", "countdown", "reverse"]),
    seed_train=st.integers(0, 2**32),
    seed_test=st.integers(0, 2**32),
)
def test_splits_never_share_a_prompt(name, seed_train, seed_test):
    task = get_task(name)
    train = {r["prompt"] for r in task.make_rows("train", 60, seed_train)}
    test = {r["prompt"] for r in task.make_rows("test", 60, seed_test)}
    assert train and test and not train & test
    assert {split_of(p) for p in train} == {"train"} and {split_of(p) for p in test} == {"test"}


def test_split_rule_is_roughly_balanced():
    prompts = [f"{a}+{b}=" for a in range(40) for b in range(40)]
    frac = sum(split_of(p) == "test" for p in prompts) / len(prompts)
    assert 0.45 < frac < 0.55


# --- rewards --------------------------------------------------------------------------------------------


@FAST
@given(seed=st.integers(0, 2**32), ops=st.sampled_from(["+", "-", "*", "+-*"]), digits=st.integers(1, 4))
def test_arith_reward_accepts_exactly_the_right_answer(seed, ops, digits):
    task = get_task("arith", ops=ops, digits=digits)
    rows = task.make_rows("train", 8, seed)
    right = [f"  {r['answer']} \n junk" for r in rows]
    wrong = [str(int(r["answer"]) + 1) for r in rows]
    padded = ["0" + r["answer"] for r in rows]
    assert score(task, rows, right) == [1.0] * 8
    assert score(task, rows, wrong) == [0.0] * 8
    assert score(task, rows, padded) == [0.0] * 8


def test_reverse_reward():
    task = get_task("reverse")
    rows = [{"prompt": "reverse abc:", "answer": "cba"}] * 4
    assert score(task, rows, ["cba", " cba\n", "abc", "cb a"]) == [1.0, 1.0, 0.0, 0.0]


@FAST
@given(seed=st.integers(0, 2**32), k=st.integers(2, 5), max_number=st.integers(2, 50))
def test_countdown_targets_are_reachable_by_the_reference_expression(seed, k, max_number):
    task = get_task("countdown", num_numbers=k, max_number=max_number)
    rows = task.make_rows("test", 5, seed)
    for r in rows:
        result = evaluate(r["answer"])
        assert result.value == r["target"] and r["target"] >= 1
        assert sorted(result.numbers) == sorted(r["nums"])
        assert all(1 <= x <= max_number for x in r["nums"])
        assert r["prompt"] == f"nums {' '.join(map(str, r['nums']))} target {r['target']}:"
    assert score(task, rows, [r["answer"] for r in rows]) == [1.0] * 5


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("3*7+12", True),
        (" (12 + 7*3) \nmore text", True),
        ("12+3*7", True),
        ("3*7+12+0", False),  # extra number
        ("3*7*1+12", False),  # extra number
        ("7*3+12-12+12", False),  # 12 used three times
        ("21+12", False),  # numbers not used
        ("3*7+12.0", False),  # float literal
        ("3**7", False),  # power is not allowed
        ("12/(7-7)", False),  # division by zero
        ("12/(3-3)+3*7", False),
        ("__import__('os')", False),
        ("", False),
        ("3*7+", False),
    ],
)
def test_countdown_solution_rule(completion, expected):
    assert is_solution(completion, [3, 7, 12], 33) is expected


def test_countdown_division_is_exact_not_float():
    # 7/3*3 is exactly 7 with fractions (a float evaluator may give 6.999...).
    assert is_solution("7/3*3+1", [7, 3, 3, 1], 8)
    assert not is_solution("7/2", [7, 2], 3)


@pytest.mark.parametrize("name", ["arith", "countdown", "reverse"])
def test_reward_without_its_column_raises_reward_error(name):
    task = get_task(name)
    with pytest.raises(RewardError, match=f"task '{name}' reward needs"):
        task.reward(["p"], ["c"])


def test_reward_with_wrong_column_length_raises():
    with pytest.raises(RewardError, match="got 2 'answer' values for 1 completions"):
        get_task("arith").reward(["1+1="], ["2"], answer=["2", "3"])
