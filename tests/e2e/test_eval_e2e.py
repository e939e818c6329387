"""End to end through the CLI: ``tandem eval`` agrees with the held-out eval a run logged for the same
checkpoint; ``tandem abtest`` exit codes and decision JSON; one-line errors for bad input."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tandem.cli.main import app
from tandem.config import build_config
from tandem.monitor import read_metrics
from tandem.orchestration.runner import train

TASK = {"min_len": 2, "max_len": 3}  # the options tests/e2e/conftest.py trains warm_model on


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, warm_model):
    out = tmp_path_factory.mktemp("evalrun") / "run"
    cfg = build_config(
        {
            "run": {"output_dir": str(out), "seed": 1},
            "model": {"path": str(warm_model)},
            "data": {"task": "reverse", "task_options": TASK, "prompts_per_step": 4, "eval_size": 40},
            "rollout": {"n": 4, "max_new_tokens": 5},
            "trainer": {"total_steps": 3, "lr": 1e-3},  # a few gentle steps: warm_model's accuracy stays
            "monitor": {"eval_every": 1, "sample_every": 1, "tensorboard": False, "progress": False},
            "checkpoint": {"every": 1, "keep_last": 5},
        }
    )
    train(cfg, progress=False)
    return out


def _logged_eval(run_dir, step):
    row = next(r for r in read_metrics(run_dir) if r["step"] == step)
    return {k: v for k, v in row.items() if k in ("eval/accuracy", "eval/reward_mean", "eval/length_mean")}


@pytest.mark.parametrize("which", ["run", "step-2"])
def test_eval_agrees_with_training_heldout_eval(run_dir, tmp_path, which):
    target, step = (run_dir, 3) if which == "run" else (run_dir / "checkpoints" / "step-00000002", 2)
    out = tmp_path / "eval.json"
    res = CliRunner().invoke(app, ["eval", str(target), "--samples", "4", "--json", str(out)])
    assert res.exit_code == 0, res.output
    metrics = json.loads(out.read_text())["metrics"]
    logged = _logged_eval(run_dir, step)
    assert logged and logged["eval/accuracy"] > 0  # a non-trivial comparison
    for key, value in logged.items():
        assert metrics[key] == pytest.approx(value, abs=1e-7), key
    assert metrics["eval/num_prompts"] == 40
    assert json.loads(out.read_text())["settings"]["seed"] == 1  # the run's seed, as the prompts' draw
    assert {"sampled/pass@1", "sampled/pass@4", "eval/length_p90"} <= set(metrics)
    assert "eval/accuracy" in res.output  # the table


def test_eval_with_reference_reports_kl(run_dir, warm_model, tmp_path):
    out = tmp_path / "eval.json"
    res = CliRunner().invoke(
        app, ["eval", str(run_dir), "--ref", str(warm_model), "--samples", "2", "--json", str(out)]
    )
    assert res.exit_code == 0, res.output
    m = json.loads(out.read_text())["metrics"]
    assert m["kl/token_k3_mean"] > 0  # 3 RL steps moved the policy away from its start
    res = CliRunner().invoke(
        app,
        [
            "eval",
            str(warm_model),
            "--ref",
            str(warm_model),
            "--task",
            "reverse",
            "--size",
            "8",
            "--json",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["metrics"]["kl/seq_mean"] == 0.0


def test_abtest_exit_codes_and_decision_json(run_dir, warm_model, tiny_model_dir, tmp_path):
    out = tmp_path / "decision.json"
    args = ["--task", "reverse", "--task-option", "min_len=2", "--task-option", "max_len=3", "--size", "160"]
    args += ["--temperature", "0", "--max-new-tokens", "5", "--json", str(out)]
    promote = CliRunner().invoke(app, ["abtest", str(tiny_model_dir), str(warm_model), *args])
    assert promote.exit_code == 0, promote.output
    assert "PROMOTE B" in promote.output
    d = json.loads(out.read_text())["decision"]
    assert d["promote"] and d["p_value"] < 0.05
    keep = CliRunner().invoke(app, ["abtest", str(warm_model), str(tiny_model_dir), *args])
    assert keep.exit_code == 1 and "KEEP A" in keep.output
    assert json.loads(out.read_text())["decision"]["promote"] is False


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["eval", "/no/such/run"], "/no/such/run: no such run, checkpoint or model folder"),
        (["abtest", "MODEL", "MODEL", "--judge", "oracle"], "--judge: unknown judge 'oracle'"),
        (["eval", "MODEL"], "--task: nothing to evaluate on"),
        (
            ["eval", "MODEL", "--task", "reverse", "--task-option", "oops"],
            "--task-option: expected KEY=VALUE",
        ),
        (["abtest", "MODEL", "MODEL", "--task", "reverse", "--alpha", "2"], "--alpha must be in (0, 1)"),
        (["report", "/no/such/run"], "/no/such/run: not a run folder (no metrics.jsonl)"),
        # checked before any model loads: a report path that is a folder, generation options out of range
        (["eval", "MODEL", "--task", "reverse", "--json", "MODEL"], "--json: MODEL is a folder"),
        (["abtest", "MODEL", "MODEL", "--task", "reverse", "--json", "MODEL"], "--json: MODEL is a folder"),
        (["export", "MODEL", "--format", "hf", "--json", "MODEL"], "--json: MODEL is a folder"),
        (
            ["eval", "MODEL", "--task", "reverse", "--max-new-tokens", "0"],
            "--max-new-tokens: 0: must be >= 1",
        ),
        (["abtest", "MODEL", "MODEL", "--max-new-tokens", "0"], "--max-new-tokens: 0: must be >= 1"),
        (["eval", "MODEL", "--task", "reverse", "--samples", "-1"], "--samples: -1: must be >= 0"),
        (["eval", "MODEL", "--task", "reverse", "--size", "0"], "--size: 0: must be >= 1 prompt"),
        (["eval", "MODEL", "--task", "reverse", "--temperature", "nan"], "--temperature: nan: must be >= 0"),
    ],
)
def test_bad_input_is_one_line_exit_2(tiny_model_dir, argv, message):
    argv = [str(tiny_model_dir) if a == "MODEL" else a for a in argv]
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert message.replace("MODEL", str(tiny_model_dir)) in " ".join(lines) and "Traceback" not in res.output


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--task", "nosuch"], "unknown task 'nosuch'"),
        (["--task", "reverse", "--task-option", "nokey=1"], "nokey"),
        (["--task", "reverse", "--eval-size", "0"], "--eval-size: 0 prompts"),
        (["--format", "hf", "--task", "reverse"], "--task: --task and --task-option choose the INT8"),
    ],
)
def test_export_checks_its_accuracy_options_before_writing(tiny_model_dir, tmp_path, options, message):
    out = tmp_path / "export"
    fmt = [] if "--format" in options else ["--format", "int8"]
    res = CliRunner().invoke(app, ["export", str(tiny_model_dir), *fmt, "--out", str(out), *options])
    assert res.exit_code == 2 and message in " ".join(res.output.split()), res.output
    assert not out.exists()
