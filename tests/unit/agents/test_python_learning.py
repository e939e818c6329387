"""The countdown task's ``tool_demos`` option (search transcripts for a weak python-agent warm start) and
the shipped ``configs/agent_python.yaml``. Mechanisms only: whether GRPO then raises the tool-call rate
is ``bench/agents_learning.py --config configs/agent_python.yaml``'s question."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tandem.agents.python_env import PythonCountdown
from tandem.config import load_config
from tandem.errors import ConfigError
from tandem.rewards import get_task
from tandem.rewards.tasks.countdown import is_solution, search_program, search_result

REPO = Path(__file__).resolve().parents[3]


def test_tool_demos_sets_the_share_of_search_transcripts():
    rows = get_task("countdown", tool_demos=0.3).make_rows("train", 400, seed=0)
    calls = [r for r in rows if r["completion"].startswith("CALL python(")]
    direct = [r for r in rows if not r["completion"].startswith("CALL")]
    assert len(calls) + len(direct) == len(rows) and 0.2 < len(calls) / len(rows) < 0.4
    assert all(r["completion"] == r["answer"] for r in direct)  # the generating expression
    for r in calls:
        call, result, answer = r["completion"].split("\n")
        assert call == f"CALL python({search_program(r['nums'], r['target'])})"
        assert result == f"RESULT {answer}" and is_solution(answer, r["nums"], r["target"])
    assert not any(
        "CALL" in r["completion"] for r in get_task("countdown", tool_demos=0).make_rows("train", 50, 0)
    )


def test_default_rows_are_the_rows_from_before_the_option():
    assert get_task("countdown")._options_key() == repr([("max_number", 20), ("num_numbers", 3)])
    assert "completion" not in get_task("countdown").make_rows("train", 1, seed=0)[0]
    for bad in (-0.1, 1.5, "half", True):
        with pytest.raises(ConfigError, match="tool_demos must be a number in 0..1"):
            get_task("countdown", tool_demos=bad)
    with pytest.raises(ConfigError, match="tool_demos needs num_numbers 3"):
        get_task("countdown", num_numbers=4, tool_demos=0.5)
    assert search_result([1, 2, 3], 10**6) is None


def test_search_transcripts_replay_against_the_python_environment():
    """The sandbox runs each transcript's program and answers with its ``RESULT`` line exactly; copying
    that expression out is rewarded."""
    rows = get_task("countdown", tool_demos=1.0).make_rows("test", 6, seed=1)
    searched = [r for r in rows if "CALL" in r["completion"]]  # ~2% of targets the search misses
    assert len(searched) >= 3
    for row in searched[:3]:
        call, result, answer = row["completion"].split("\n")
        env = PythonCountdown()
        assert env.reset(row) == row["prompt"]
        obs, reward, done, info = asyncio.run(env.step(call))
        assert obs == result + "\n" and (reward, done) == (0.0, False) and info["tool_calls"] == 1
        assert asyncio.run(env.step(answer))[1:3] == (1.0, True)


def test_shipped_python_agent_config_fits_its_model():
    cfg = load_config(REPO / "configs/agent_python.yaml")
    ws = cfg.model.warm_start_sft
    assert ws is not None and ws.task == "countdown" and 0 < ws.task_options["tool_demos"] < 1
    assert "tool_demos" not in cfg.data.task_options and cfg.env is not None and cfg.env.name == "python"
    model = REPO / cfg.model.path
    assert (model / "model.safetensors").is_file()
    positions = json.loads((model / "config.json").read_text())["max_position_embeddings"]
    assert positions == ws.model_options["max_position_embeddings"]
    # the longest search call fits in one turn, and the answer turn still fits after it
    longest = max(
        (
            r
            for r in get_task("countdown", tool_demos=1.0).make_rows("train", 300, 0)
            if "CALL" in r["completion"]
        ),
        key=lambda r: len(r["completion"]),
    )
    call, result, _ = longest["completion"].split("\n")
    assert len(call) + 1 <= cfg.rollout.max_new_tokens
    assert len(longest["prompt"]) + len(call) + len(result) + 2 + cfg.rollout.max_new_tokens <= positions


def test_shipped_python_agent_config_runs_a_training_step(tmp_path):
    """One GRPO step and the before/after held-out episodes of the shipped config, shrunk: episodes run
    against the ``python`` environment and report its counters."""
    from tandem.orchestration.runner import train

    cfg = load_config(
        REPO / "configs/agent_python.yaml",
        [
            f"run.output_dir={tmp_path / 'run'}",
            "trainer.total_steps=1",
            "trainer.warmup_steps=0",
            "data.prompts_per_step=2",
            "data.eval_size=2",
            "rollout.n=2",
            "rollout.max_new_tokens=48",  # cuts a search call short: a malformed call, still a step
            "monitor.eval_every=0",
            "monitor.sample_every=0",
            "monitor.tensorboard=false",
            "checkpoint.every=0",
        ],
    )
    result = train(cfg, progress=False)
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in rows if "agent/tool_calls_mean" in r)
    assert step["agent/sandbox_kills"] == 0 and step["timing/env"] >= 0
    assert 1 <= step["agent/turns_mean"] <= cfg.env.max_turns
