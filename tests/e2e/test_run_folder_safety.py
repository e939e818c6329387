"""The run folder is written only after the run's pre-flight checks pass, and ``run.overwrite`` replaces
only a Tandem run folder: a failed check leaves nothing that blocks the corrected rerun, and an unrelated
folder is never deleted."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml
from typer.testing import CliRunner

from tandem.cli.main import app


def _config(tmp_path: Path, model: Path, reward_path: str | None = None, **run) -> Path:
    """A one-step run on two arithmetic prompts, optionally scored by a reward function ``path:fn``."""
    data = {
        "run": {"output_dir": str(tmp_path / "run"), **run},
        "model": {"path": str(model)},
        "data": {"task": "arith", "prompts_per_step": 2, "train_size": 8, "eval_size": 0},
        "rollout": {"n": 2, "max_new_tokens": 2},
        "trainer": {"total_steps": 1, "lr": 1e-3},
        "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
        "checkpoint": {"every": 0, "save_final": False},
    }
    if reward_path:
        data["reward"] = {"functions": [{"path": reward_path}]}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _train(config: Path, *overrides: str):
    return CliRunner().invoke(app, ["train", str(config), *overrides, "--no-progress"])


def test_run_that_fails_preflight_on_a_missing_model_writes_nothing_and_the_rerun_works(
    tmp_path, tiny_model_dir
):
    result = _train(_config(tmp_path, tmp_path / "no-such-model"))
    assert result.exit_code == 2 and "does not exist" in result.output
    assert not (tmp_path / "run").exists()
    result = _train(_config(tmp_path, tiny_model_dir))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "run" / "summary.json").is_file()


def test_run_that_fails_preflight_on_a_bad_reward_module_writes_nothing_and_the_rerun_works(
    tmp_path, tiny_model_dir
):
    broken = tmp_path / "broken_reward.py"
    broken.write_text("def score(prompts, completions, **kw):\n    return [0.0] * len(completions\n")
    result = _train(_config(tmp_path, tiny_model_dir, f"{broken}:score"))
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert not (tmp_path / "run").exists()
    broken.write_text("def score(prompts, completions, **kw):\n    return [0.0] * len(completions)\n")
    result = _train(_config(tmp_path, tiny_model_dir, f"{broken}:score"))
    assert result.exit_code == 0, result.output


def test_run_overwrite_refuses_an_unrelated_folder(tmp_path, tiny_model_dir):
    precious = tmp_path / "run"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    result = _train(_config(tmp_path, tiny_model_dir, overwrite=True))
    assert result.exit_code == 2
    assert f"{precious} is not empty and not a Tandem run folder" in result.output
    assert (precious / "thesis.tex").read_text() == "years of work"


def test_run_overwrite_replaces_a_run_folder(tmp_path, tiny_model_dir):
    cfg = _config(tmp_path, tiny_model_dir)
    assert _train(cfg).exit_code == 0
    (tmp_path / "run" / "old-marker").write_text("from the first run")
    result = _train(cfg)
    assert result.exit_code == 2 and "already holds a run" in result.output
    result = _train(cfg, "run.overwrite=true")
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "run" / "old-marker").exists()
    assert (tmp_path / "run" / "summary.json").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".run.")]  # nothing left aside


def test_trainer_lr_inf_is_refused_before_anything_is_written(tmp_path, tiny_model_dir):
    result = _train(_config(tmp_path, tiny_model_dir), "trainer.lr=.inf")
    assert result.exit_code == 2 and "trainer.lr: Input should be a finite number" in result.output
    assert not (tmp_path / "run").exists()


def test_run_overwrite_refuses_a_run_folder_holding_the_model(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("run: {}\n")  # a Tandem run folder ...
    (run / "metrics.jsonl").write_text("")
    model = run / "checkpoints" / "step-5" / "model"  # ... holding the model this run starts from
    shutil.copytree(tiny_model_dir, model)
    result = _train(_config(tmp_path, model, overwrite=True))
    assert result.exit_code == 2 and f"{run} is (or holds) the source folder {model}" in result.output
    assert (model / "config.json").is_file() and (run / "config.yaml").read_text() == "run: {}\n"


def test_run_whose_reward_needs_an_absent_column_fails_preflight_and_writes_nothing(tmp_path, tiny_model_dir):
    rewards = tmp_path / "trl_rewards.py"
    rewards.write_text(
        "def accuracy(completions, solution, **kwargs):\n"
        "    return [float(c.strip() == s) for c, s in zip(completions, solution)]\n"
        "def by_answer(completions, answer, **kwargs):  # TRL's shape: no 'prompts' parameter\n"
        "    return [float(c.strip() == a) for c, a in zip(completions, answer)]\n"
    )
    result = _train(_config(tmp_path, tiny_model_dir, f"{rewards}:accuracy"))
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"reward 'accuracy' ({rewards}:accuracy) needs argument 'solution'" in result.output
    assert not (tmp_path / "run").exists()
    result = _train(_config(tmp_path, tiny_model_dir), f"reward.functions=[{{path: '{rewards}:by_answer'}}]")
    assert result.exit_code == 0, result.output


def test_a_resume_refuses_steps_below_its_checkpoint_and_records_a_changed_config(
    tmp_path, tiny_model_dir, caplog
):
    cfg = _config(tmp_path, tiny_model_dir)
    assert _train(cfg, "trainer.total_steps=2", "checkpoint.save_final=true").exit_code == 0
    run = tmp_path / "run"
    below = _train(cfg, "trainer.total_steps=1", "--resume")
    assert (
        below.exit_code == 2
        and "trainer.total_steps: 1, but the run's latest checkpoint is at step 2" in below.output
    )
    first = (run / "config.yaml").read_text()
    with caplog.at_level("WARNING"):
        more = _train(cfg, "trainer.total_steps=3", "rollout.max_new_tokens=3", "--resume")
    assert more.exit_code == 0, more.output
    assert (run / "config.before-step-2.yaml").read_text() == first  # what steps 1-2 trained with
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "rollout.max_new_tokens: 2 -> 3" in warned and "trainer.total_steps: 2 -> 3" in warned


def _raising_reward(tmp_path: Path) -> str:
    """A reward function that raises when it is first called (the run's first step)."""
    module = tmp_path / "raising_reward.py"
    module.write_text("def score(prompts, completions, **kw):\n    raise RuntimeError('judge is down')\n")
    return f"{module}:score"


def test_a_run_that_fails_in_its_first_step_leaves_no_folder_and_the_rerun_works(tmp_path, tiny_model_dir):
    cfg = _config(tmp_path, tiny_model_dir, _raising_reward(tmp_path))
    failed = _train(cfg)
    assert failed.exit_code != 0 and "judge is down" in failed.output
    assert not (tmp_path / "run").exists()  # nothing trained: no "run" for the rerun to trip over
    assert _train(_config(tmp_path, tiny_model_dir)).exit_code == 0


def test_a_decoupled_run_that_fails_in_its_first_step_leaves_no_folder(tmp_path, tiny_model_dir):
    cfg = _config(tmp_path, tiny_model_dir, _raising_reward(tmp_path))
    failed = _train(cfg, "architecture.mode=decoupled", "architecture.learner_timeout_s=60")
    assert failed.exit_code != 0
    assert not (tmp_path / "run").exists()


def test_a_resume_that_fails_before_a_step_leaves_the_run_as_it_was(tmp_path, tiny_model_dir):
    """A refused resume (here: its first step fails) must not rewrite config.yaml, drop summary.json or
    leave a config record; and a record of a step is never replaced by a later resume's."""
    cfg = _config(tmp_path, tiny_model_dir)
    assert _train(cfg, "trainer.total_steps=2", "checkpoint.save_final=true").exit_code == 0
    run = tmp_path / "run"
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    reward = _raising_reward(tmp_path)
    failed = _train(cfg, "trainer.total_steps=3", f"reward.functions=[{{path: '{reward}'}}]", "--resume")
    assert failed.exit_code != 0 and "judge is down" in failed.output
    after = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert after.keys() == before.keys() and after["config.yaml"] == before["config.yaml"]
    assert after["summary.json"] == before["summary.json"]
    first = before["config.yaml"].decode()
    assert _train(cfg, "trainer.total_steps=3", "rollout.max_new_tokens=3", "--resume").exit_code == 0
    assert (run / "config.before-step-2.yaml").read_text() == first
    assert _train(cfg, "trainer.total_steps=3", "rollout.max_new_tokens=4", "--resume").exit_code == 0
    assert (run / "config.before-step-2.yaml").read_text() == first  # kept, not replaced
    assert "max_new_tokens: 3" in (run / "config.before-step-2.2.yaml").read_text()


def test_a_decoupled_run_whose_channel_cannot_open_leaves_nothing_behind(tmp_path, tiny_model_dir):
    """Redis down: one line, no run folder, and no shared memory left for Python's resource tracker to
    report at exit (the weights' block was created before the channel failed)."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = _config(tmp_path, tiny_model_dir)
    overrides = [
        "architecture.mode=decoupled",
        "architecture.channel.backend=redis",
        f"architecture.channel.options.redis_url=redis://127.0.0.1:{port}/0",
    ]
    code = "import sys; from tandem.cli.main import app; sys.argv = ['tandem'] + sys.argv[1:]; app()"
    done = subprocess.run(
        [sys.executable, "-c", code, "train", str(cfg), *overrides, "--no-progress"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 2 and "cannot reach Redis" in done.stderr, done.stderr[-800:]
    assert "leaked" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-800:]
    assert not (tmp_path / "run").exists()


def test_a_cached_warm_start_built_with_other_options_is_refused(tmp_path):
    """model.warm_start_sft caches the model it builds at model.path; a later config asking other options
    must not train from the cached one silently. Another run.seed reuses it."""
    import json

    warm = tmp_path / "warm"
    cfg = _config(tmp_path, warm)
    recipe = {
        "task": "arith",
        "steps": 2,
        "batch_size": 4,
        "train_size": 8,
        "model_options": {"hidden_size": 32},
    }
    data = yaml.safe_load(cfg.read_text())
    data["model"]["warm_start_sft"] = recipe
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    assert _train(cfg).exit_code == 0
    marker = json.loads((warm / "tandem_model.json").read_text())
    assert marker["recipe"]["steps"] == 2 and marker["recipe"]["seed"] == 0
    assert _train(cfg, "run.seed=3", "run.overwrite=true").exit_code == 0  # the seed is not the recipe
    stale = _train(cfg, "model.warm_start_sft.steps=3", "run.overwrite=true")
    assert stale.exit_code == 2 and "Traceback" not in stale.output
    assert (
        f"model.warm_start_sft: {warm} is a warm start built with other options (steps 2 -> 3)"
        in " ".join(stale.output.split())
    )
