"""The options that make weak warm starts by construction (the calculator task's ``tool_demos``, the guess
task's ``search_demos`` and ``naive_demos``) and the shipped agent configs that start from such warm starts.
Mechanisms only: whether RL then raises the tool-call rate or the guess return is
``bench/agents_learning.py``'s question."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.agents.guess import GuessNumber
from tandem.config import load_config
from tandem.errors import ConfigError
from tandem.rewards import get_task

REPO = Path(__file__).resolve().parents[3]


def test_tool_demos_sets_the_share_of_transcripts_that_call_the_tool():
    rows = get_task("calculator", tool_demos=0.25).make_rows("train", 400, seed=0)
    calls = [r for r in rows if r["completion"].startswith("CALL calc(")]
    direct = [r for r in rows if not r["completion"].startswith("CALL")]
    assert len(calls) + len(direct) == len(rows) and 0.15 < len(calls) / len(rows) < 0.35
    assert all(r["completion"] == r["answer"] for r in direct)  # the direct answer is the product
    assert all(r["completion"].endswith(f"RESULT {r['answer']}\n{r['answer']}") for r in calls)
    none = get_task("calculator", tool_demos=0).make_rows("train", 50, seed=0)
    assert not any("CALL" in r["completion"] for r in none)


def test_default_tool_demos_keeps_the_rows_from_before_the_option():
    """The default leaves the options key (and so every row stream) as it was: ``digits`` only."""
    assert get_task("calculator")._options_key() == repr([("digits", 4)])
    assert get_task("calculator", tool_demos=1.0).make_rows("test", 5, 0) == get_task("calculator").make_rows(
        "test", 5, 0
    )
    for bad in (-0.1, 1.5, "half", True):
        with pytest.raises(ConfigError, match="tool_demos must be a number in 0..1"):
            get_task("calculator", tool_demos=bad)


def test_shipped_agent_config_starts_from_its_weak_warm_start():
    cfg = load_config(REPO / "configs/agent_calculator.yaml")
    ws = cfg.model.warm_start_sft
    assert ws is not None and 0 < ws.task_options["tool_demos"] < 0.5
    assert "tool_demos" not in cfg.data.task_options  # evaluation and training use the plain task
    model = REPO / cfg.model.path
    assert (model / "config.json").is_file() and (model / "model.safetensors").is_file()
    assert cfg.env is not None and cfg.env.name == "calculator"


def test_guess_transcripts_replay_against_the_guess_environment():
    """Every ``search_demos`` transcript is a game the environment would play: its feedback lines are
    what ``step`` answers and it ends on the secret; bisection games are short, random ones longer."""
    rows = get_task("guess", high=20, search_demos=0.5).make_rows("train", 200, seed=0)
    tries = []
    for row in rows:
        env = GuessNumber()
        env.reset(row)
        lines = row["completion"].split("\n")
        guesses, feedback = lines[0::2], lines[1::2]
        for i, guess in enumerate(guesses):
            obs, reward, done, _ = env.step(guess + "\n")
            assert done == (i == len(guesses) - 1)
            assert obs == ("" if done else feedback[i] + "\n") and (reward > 0) == done
        tries.append(len(guesses))
    assert max(tries) > 5 and sum(t <= 5 for t in tries) > len(rows) * 0.5
    assert get_task("guess")._options_key() == repr([("high", 100)])  # the default rows are unchanged
    assert "completion" not in get_task("guess").make_rows("train", 1, seed=0)[0]
    with pytest.raises(ConfigError, match="search_demos must be a number in 0..1"):
        get_task("guess", search_demos=2)


def test_linear_naive_demos_count_up_and_replay_against_the_guess_environment():
    """``naive_demos: linear`` games count 1, 2, 3, ... to the secret (ignoring the feedback); the
    bisecting share is unchanged, every transcript is a game the environment would play."""
    rows = get_task("guess", high=10, search_demos=0.25, naive_demos="linear").make_rows("train", 200, seed=0)
    linear = 0
    for row in rows:
        guesses = row["completion"].split("\n")[0::2]
        if guesses == [str(i) for i in range(1, row["secret"] + 1)]:
            linear += 1
        else:  # bisection of 1-10: the first try is the midpoint
            assert guesses[0] == "5", row["completion"]
        env = GuessNumber()
        env.reset(row)
        for i, guess in enumerate(guesses):
            assert env.step(guess + "\n")[2] == (i == len(guesses) - 1)
    assert 0.6 < linear / len(rows) < 0.9  # ~75%, plus the bisection games of secret 5 (one try)
    # the default keeps the options key (and so the row streams) from before the option
    assert get_task("guess", high=10, search_demos=0.25)._options_key() == repr(
        [("high", 10), ("search_demos", 0.25)]
    )
    with pytest.raises(ConfigError, match="naive_demos must be one of random, linear"):
        get_task("guess", naive_demos="spiral")


def test_shipped_guess_config_starts_from_its_weak_warm_start():
    cfg = load_config(REPO / "configs/agent_guess.yaml")
    ws = cfg.model.warm_start_sft
    assert ws is not None and 0 < ws.task_options["search_demos"] < 0.5
    assert ws.task_options["naive_demos"] == "linear"
    assert ws.task_options["high"] == cfg.data.task_options["high"]  # the same game as trained and held out
    assert "search_demos" not in cfg.data.task_options
    model = REPO / cfg.model.path
    assert (model / "config.json").is_file() and (model / "model.safetensors").is_file()
    assert cfg.env is not None and cfg.env.name == "guess"
