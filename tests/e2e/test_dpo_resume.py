"""``tandem dpo`` checkpoints and ``--resume``: a run interrupted (Ctrl-C) mid-epoch and resumed gives the
same per-step metrics and bit-for-bit the same final weights as an uninterrupted one (full weights and
LoRA, whose dropout draws from the restored torch RNG); the reference log-prob cache is reused, not
recomputed; a resume refuses, in one line, a missing checkpoint, a changed key of the maths and a finished
run; the checkpoints folder is gone once the final model is saved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors.torch
import yaml
from typer.testing import CliRunner

from tandem.cli.main import app
from tandem.train import dpo as dpolib

runner = CliRunner()
# ~18 training pairs at batch 4: 5 steps an epoch, 2 epochs = 10 steps; the interrupted run stops during
# step 7 (checkpoints at 2, 4, 6; the last 2 kept), so the resume starts mid-epoch 2 and re-does step 7.
STEPS, KILL_AT = 10, 7


@pytest.fixture(scope="module")
def prefs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dpo_resume_prefs")
    made = runner.invoke(app, ["data", "make-safety", "--out-dir", str(root), "--train-size", "24"])
    assert made.exit_code == 0, made.output
    return root


def _config(path: Path, model: Path, prefs: Path, out: Path, **extra) -> Path:
    data = {
        "model": str(model),
        "out_dir": str(out),
        "data": {"train_file": str(prefs / "train.jsonl"), "val_fraction": 0.25},
        "batch_size": 4,
        "epochs": 2,
        "lr": 0.01,
        "warmup_steps": 3,
        "save_every": 2,
    } | extra
    path.write_text(yaml.safe_dump(data))
    return path


def _run(monkeypatch, *args: str, kill_at: int | None = None) -> tuple[object, dict[int, dict]]:
    """``tandem dpo *args`` recording each step's metrics; ``kill_at``: Ctrl-C as step ``kill_at`` ends
    (after its metrics, before its checkpoint)."""
    steps: dict[int, dict] = {}
    original = dpolib.train_dpo

    def recording(*a, on_step=None, **kw):
        def record(step, metrics, *rest):
            steps[step] = dict(metrics)
            if step == kill_at:
                raise KeyboardInterrupt
            if on_step is not None:
                on_step(step, metrics, *rest)

        return original(*a, on_step=record, **kw)

    monkeypatch.setattr(dpolib, "train_dpo", recording)
    try:
        result = runner.invoke(app, ["dpo", *map(str, args)])
    finally:
        monkeypatch.setattr(dpolib, "train_dpo", original)
    return result, steps


def _weights(folder: Path) -> dict:
    return safetensors.torch.load_file(str(folder / "model.safetensors"))


def _ckpts(out: Path) -> Path:
    return Path(str(out) + ".checkpoints")


@pytest.mark.parametrize("lora", [None, {"r": 4, "dropout": 0.1}], ids=["full", "lora"])
def test_interrupted_and_resumed_run_equals_the_uninterrupted_one(
    prefs, tiny_model_dir, tmp_path, monkeypatch, lora
):
    extra = {"lora": lora} if lora else {}
    straight_out, broken_out = tmp_path / "straight", tmp_path / "broken"
    straight = _config(tmp_path / "a.yaml", tiny_model_dir, prefs, straight_out, **extra)
    broken = _config(tmp_path / "b.yaml", tiny_model_dir, prefs, broken_out, **extra)

    result, expected = _run(monkeypatch, straight)
    assert result.exit_code == 0, result.output
    assert sorted(expected) == list(range(1, STEPS + 1))
    assert not _ckpts(straight_out).exists()  # removed once the final model was saved

    result, first = _run(monkeypatch, broken, kill_at=KILL_AT)
    assert result.exit_code == 130, result.output
    assert f"keeps step 6; continue with: tandem dpo {broken} --resume" in result.output
    assert sorted(p.name for p in _ckpts(broken_out).iterdir()) == ["step-00000004", "step-00000006"]
    assert not broken_out.exists()
    if lora:  # the checkpoint holds the adapter only
        assert (_ckpts(broken_out) / "step-00000006" / "model" / "adapter_config.json").is_file()
    cache = Path(str(broken_out) + ".ref_logps.safetensors")
    stamp = cache.stat().st_mtime_ns

    def no_reference(*a, **kw):
        raise AssertionError("the reference log-probs were recomputed on resume")

    monkeypatch.setattr(dpolib, "reference_logps", no_reference)
    result, second = _run(monkeypatch, broken, "--resume")
    assert result.exit_code == 0, result.output
    assert "(step 6 of 10)" in result.output
    assert sorted(second) == list(range(7, STEPS + 1)) and cache.stat().st_mtime_ns == stamp
    resumed = {k: v for k, v in first.items() if k < KILL_AT} | second
    assert resumed == expected  # every step's loss, grad norm, rewards: exactly equal
    a, b = _weights(straight_out), _weights(broken_out)
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
    assert not _ckpts(broken_out).exists()
    marker = json.loads((broken_out / "tandem_model.json").read_text())
    assert marker["created_by"] == "tandem dpo" and (broken_out / "config.json").is_file()


def test_max_steps_may_grow_on_resume(prefs, tiny_model_dir, tmp_path, monkeypatch):
    """A run of max_steps=4 interrupted in its last step, resumed with max_steps=10, equals the 10-step
    run: the warm-up-then-constant schedule and each epoch's order do not depend on the run's length."""
    straight = _config(tmp_path / "a.yaml", tiny_model_dir, prefs, tmp_path / "a", max_steps=STEPS)
    result, expected = _run(monkeypatch, straight)
    assert result.exit_code == 0, result.output
    short_out = tmp_path / "b"
    short = _config(tmp_path / "b.yaml", tiny_model_dir, prefs, short_out, max_steps=4)
    result, first = _run(monkeypatch, short, kill_at=4)  # killed after its last step's metrics
    assert result.exit_code == 130 and sorted(first) == [1, 2, 3, 4]
    assert "keeps step 2" in result.output  # step 4's checkpoint comes after its metrics: never written
    result, second = _run(monkeypatch, short, "--resume", "max_steps=10")
    assert result.exit_code == 0, result.output
    assert {k: v for k, v in first.items() if k <= 2} | second == expected
    a, b = _weights(tmp_path / "a"), _weights(short_out)
    assert all(a[k].equal(b[k]) for k in a)


def test_resume_refusals(prefs, tiny_model_dir, tmp_path, monkeypatch):
    out = tmp_path / "run"
    (tmp_path / "data").mkdir()
    train = tmp_path / "data" / "train.jsonl"
    train.write_text((prefs / "train.jsonl").read_text())
    cfg = _config(tmp_path / "c.yaml", tiny_model_dir, tmp_path / "data", out)
    result, _ = _run(monkeypatch, cfg, "--resume")  # nothing was ever run
    assert result.exit_code != 0 and "no complete checkpoint to resume from" in result.output
    assert str(_ckpts(out)) in result.output and "Traceback" not in result.output

    result, _ = _run(monkeypatch, cfg, kill_at=5)
    assert result.exit_code == 130 and (_ckpts(out) / "step-00000004").is_dir()
    result, _ = _run(monkeypatch, cfg, "beta=0.2", "--resume")
    assert result.exit_code != 0 and "beta is 0.2 but the checkpointed run has 0.1" in result.output
    result, _ = _run(monkeypatch, cfg, "max_steps=3", "--resume")  # may change, but not below step 4
    assert result.exit_code != 0 and "the checkpoint is at step 4, past this run's 3 steps" in result.output
    result, _ = _run(monkeypatch, cfg, "data.val_fraction=0.5", "--resume")
    assert result.exit_code != 0 and "data.val_fraction" in result.output
    kept = train.read_text()
    train.write_text("\n".join(kept.splitlines()[1:]) + "\n")  # same file, other pairs

    def no_reference(*a, **kw):
        raise AssertionError("the reference pass ran before the refusal")

    with monkeypatch.context() as patched:
        patched.setattr(dpolib, "reference_logps", no_reference)
        result, _ = _run(monkeypatch, cfg, "--resume")
    assert result.exit_code != 0 and "the training pairs differ" in result.output, result.output
    train.write_text(kept)
    result, _ = _run(monkeypatch, cfg)  # a fresh start would bury the checkpoints
    assert result.exit_code != 0 and "holds checkpoints of an interrupted run (step 4)" in result.output
    assert "--resume" in result.output

    result, _ = _run(monkeypatch, cfg, "--resume", "save_every=0")  # save_every may change
    assert result.exit_code == 0, result.output
    assert not _ckpts(out).exists() and (out / "config.json").is_file()
    result, _ = _run(monkeypatch, cfg, "--resume")
    assert result.exit_code != 0 and "the run already finished" in result.output
    assert len([line for line in result.output.splitlines() if line.strip()]) == 1


def test_interrupt_before_the_first_checkpoint_says_start_over(prefs, tiny_model_dir, tmp_path, monkeypatch):
    cfg = _config(tmp_path / "c.yaml", tiny_model_dir, prefs, tmp_path / "run", save_every=5)
    result, _ = _run(monkeypatch, cfg, kill_at=2)
    assert result.exit_code == 130
    assert f"nothing to resume; start over with: tandem dpo {cfg}" in result.output


def test_interrupt_after_the_last_step_keeps_the_trained_model(prefs, tiny_model_dir, tmp_path, monkeypatch):
    """The last step is checkpointed too (10 is not a multiple of save_every=3): a Ctrl-C in the evaluation
    after it prints the resume command, and the resume trains nothing and saves the model."""
    out = tmp_path / "out"
    cfg = _config(tmp_path / "c.yaml", tiny_model_dir, prefs, out, save_every=3)
    original, calls = dpolib.implicit_reward_metrics, []

    def interrupted(*a, **kw):
        calls.append(1)
        if len(calls) == 2:  # the held-out evaluation after training
            raise KeyboardInterrupt
        return original(*a, **kw)

    monkeypatch.setattr(dpolib, "implicit_reward_metrics", interrupted)
    result, _ = _run(monkeypatch, cfg)
    assert result.exit_code == 130 and f"keeps step {STEPS}; continue with" in result.output, result.output
    monkeypatch.setattr(dpolib, "implicit_reward_metrics", original)
    result, steps = _run(monkeypatch, cfg, "--resume")
    assert result.exit_code == 0 and steps == {}, result.output
    assert (out / "model.safetensors").is_file() and not _ckpts(out).exists()
