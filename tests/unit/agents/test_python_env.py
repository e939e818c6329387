"""The python tool and the built-in ``python`` (countdown with code) environment."""

from __future__ import annotations

import asyncio

import pytest

from tandem.agents.env import ENVIRONMENTS
from tandem.agents.python_env import PythonCountdown, countdown_value, is_countdown_solution, python_tool
from tandem.agents.sandbox import SandboxLimits
from tandem.agents.tool_calls import parse_tool_calls, run_tool_calls

ROW = {"prompt": "nums 3 7 12 target 33:", "nums": [3, 7, 12], "target": 33}


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("3*7+12", True),
        ("12+7*3", True),
        ("(12+7*3)", True),
        ("3*7+12+0", False),  # a number not given
        ("3*7*1+12", False),
        ("33", False),
        ("3*7+12.0", False),
        ("3**2", False),
        ("12/(7-7)+3", False),
        ("print(33)", False),
        ("", False),
    ],
)
def test_countdown_solution_rule(text, ok):
    assert is_countdown_solution(text, [3, 7, 12], 33) is ok


def test_countdown_value_is_exact():
    assert countdown_value("1/3+1/3+1/3") == (1, [1, 3, 1, 3, 1, 3])


def test_python_tool_reports_output_errors_and_kills():
    tool = python_tool(SandboxLimits(cpu_s=1, wall_s=1.5))
    code = ["print(3*7+12)", "1/0", "import time\ntime.sleep(30)", "import socket\nsocket.socket()"]
    text = "".join(f"CALL python({c})" for c in code)
    parsed = parse_tool_calls(text, [tool], "plain")
    assert not parsed.error
    results = asyncio.run(run_tool_calls(parsed, [tool]))
    assert (results[0].content, results[0].error) == ("33", False)
    assert results[1].error and results[1].content == "ZeroDivisionError: division by zero"
    assert (
        results[2].error
        and results[2].kill_reason == "wall_time"
        and results[2].content == "killed: wall_time limit"
    )
    assert results[3].error and "network access is not allowed" in results[3].content


def test_episode_with_a_tool_call_then_an_answer():
    env = PythonCountdown(wall_s=10)
    assert env.reset(ROW) == ROW["prompt"]
    obs, reward, done, info = asyncio.run(env.step("CALL python(print(3*7+12))"))
    assert (obs, reward, done) == ("RESULT 33\n", 0.0, False)
    assert info == {"tool_calls": 1, "tool_errors": 0, "sandbox_kills": 0}
    assert asyncio.run(env.step("3*7+12\n")) == ("", 1.0, True, {})


def test_wrong_answer_bad_call_and_killed_code():
    env = PythonCountdown(cpu_s=1, wall_s=1.5)
    env.reset(ROW)
    assert asyncio.run(env.step("3+7+12"))[1:3] == (0.0, True)
    obs, _, done, info = asyncio.run(env.step("CALL pyhton(1)"))
    assert not done and obs.startswith("ERROR unknown tool 'pyhton'") and info["tool_errors"] == 1
    obs, _, done, info = asyncio.run(env.step("CALL python(while True: pass)"))
    assert not done and info == {"tool_calls": 1, "tool_errors": 1, "sandbox_kills": 1}
    assert "killed" in obs


def test_rows_without_countdown_columns_are_refused():
    with pytest.raises(KeyError, match="data.task: countdown"):
        PythonCountdown().reset({"prompt": "x"})


def test_registered_as_a_builtin_environment():
    from tandem.config.env import EnvConfig
    from tandem.rollout.environments import env_factory

    assert ENVIRONMENTS["python"] == "tandem.agents.python_env:PythonCountdown"
    env = env_factory(EnvConfig(name="python", options={"cpu_s": 1, "fmt": "hermes"}))()
    assert isinstance(env, PythonCountdown) and env.fmt == "hermes"
