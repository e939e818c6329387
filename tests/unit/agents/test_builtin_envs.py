"""The built-in calculator and guess environments, stepped by hand (no model)."""

from __future__ import annotations

import asyncio

import pytest

from tandem.agents.calculator import Calculator, calc
from tandem.agents.guess import GuessNumber
from tandem.rewards import get_task


def test_calc_evaluates_integer_arithmetic_only():
    assert calc("1234*5678") == "7006652" and calc(" -(3+4)//2 ") == "-4"
    for bad in ("__import__('os')", "2**10", "1/2", "x", "1e3", "7//0", "9" * 20 + "*" + "9" * 20):
        with pytest.raises(ValueError):
            calc(bad)


def test_calculator_episode_rewards_the_right_final_answer():
    row = get_task("calculator").make_rows("train", 1, seed=0)[0]
    a, b = row["prompt"].rstrip("=").split("*")
    env = Calculator()
    assert env.reset(row) == row["prompt"]
    obs, reward, done, info = asyncio.run(env.step(f"CALL calc({a}*{b})"))
    assert obs == f"RESULT {row['answer']}\n" and reward == 0 and not done and info["tool_calls"] == 1
    obs, _, done, info = asyncio.run(env.step("CALL calc(1+"))  # malformed: an error observation
    assert obs.startswith("ERROR") and info["tool_errors"] == 1 and not done
    assert asyncio.run(env.step(row["answer"]))[1:3] == (1.0, True)
    env.reset(row)
    assert asyncio.run(env.step("12"))[1:3] == (0.0, True)
    # The reference transcript (the SFT warm start's completion) is what the environment answers.
    assert row["completion"] == f"CALL calc({a}*{b})\nRESULT {row['answer']}\n{row['answer']}"


def test_calculator_answers_a_runaway_call_with_an_error_observation():
    # '[' * 3000 used to raise RecursionError out of step: "the environment's step raised" ended the run
    env = Calculator(fmt="hermes")
    env.reset(get_task("calculator").make_rows("train", 1, seed=0)[0])
    obs, reward, done, info = asyncio.run(env.step("<tool_call>" + "[" * 3000))
    assert not done and reward == 0.0 and info["tool_errors"] == 1
    assert "tool call is not valid JSON: nested too deeply" in obs


def test_guess_answers_higher_lower_and_rewards_fewer_turns():
    env = GuessNumber()
    env.reset({"prompt": "game 1: guess 1-100\n", "secret": 37})
    assert env.step("50") == ("lower\n", 0.0, False, {})
    assert env.step("20\n") == ("higher\n", 0.0, False, {})
    assert env.step("abc")[0] == "a number please\n"
    obs, reward, done, _ = env.step("37")
    assert done and reward == pytest.approx(0.7)
    env.reset({"prompt": "p", "secret": 5})
    assert env.step("5")[1:3] == (1.0, True)
    rows = get_task("guess").make_rows("test", 3, seed=0)
    assert all(1 <= r["secret"] <= 100 for r in rows)
