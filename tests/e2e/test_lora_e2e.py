"""LoRA runs end to end: GRPO trains the adapter only (colocated and decoupled), resume is exact, the run's
checkpoint is an adapter folder, and ``tandem export`` writes the merged model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors.torch
import torch

pytest.importorskip("peft")

from run_checks import step_rows  # noqa: E402

from tandem.config import build_config  # noqa: E402
from tandem.config.model import ModelConfig  # noqa: E402
from tandem.export.api import export_model  # noqa: E402
from tandem.models import load_causal_lm  # noqa: E402
from tandem.orchestration.build import build_policy  # noqa: E402
from tandem.orchestration.runner import train  # noqa: E402
from tandem.train.checkpoint import LIVE_WEIGHTS, latest_checkpoint, load_checkpoint  # noqa: E402

LORA = {"r": 8, "alpha": 16.0}
HERE = Path(__file__).parent
# A reward that varies within a group (digit share), so every step has a gradient and the adapter moves.
DIGITS = {"task_reward": False, "functions": [{"path": f"{HERE / 'digits_reward.py'}:digit_share"}]}


def _cfg(tiny_model_dir, out, **sections):
    data = {
        "run": {"output_dir": str(out), "seed": 3},
        "model": {"path": str(tiny_model_dir), "lora": LORA},
        "data": {"task": "arith", "prompts_per_step": 2, "eval_size": 4, "train_size": 64},
        "reward": DIGITS,
        "rollout": {"n": 4, "max_new_tokens": 4},
        "algorithm": {"name": "grpo", "beta": 0.05},  # a KL term: the adapter-disabled reference runs
        "trainer": {"total_steps": 3, "lr": 1e-2},
        "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
    }
    for key, value in sections.items():
        data.setdefault(key, {}).update(value)
    return build_config(data)


def _policy_from(run_dir, tiny_model_dir):
    """The run's last policy, rebuilt as the trainer holds it: base + adapter (PEFT), adapter restored."""
    policy, _ = build_policy(ModelConfig(path=str(tiny_model_dir), lora=LORA))
    load_checkpoint(latest_checkpoint(run_dir / "checkpoints"), model=policy, restore_rng=False)
    return policy.eval()


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_grpo_with_lora_trains_the_adapter_only_and_export_merges(tiny_model_dir, tmp_path):
    base_before = {k: v.clone() for k, v in load_causal_lm(tiny_model_dir).state_dict().items()}
    result = train(_cfg(tiny_model_dir, tmp_path / "run"), progress=False)
    rows = step_rows(result.run_dir)
    assert len(rows) == 3
    for r in rows:  # the engine samples with the policy the trainer scores: sync and reference work
        assert r["rollout/logprob_diff_max"] < 1e-4 and "actor/kl_ref" in r, r
    assert rows[-1]["actor/kl_ref"] > 0  # the adapter moved the policy away from the base reference
    ckpt = latest_checkpoint(result.run_dir / "checkpoints") / "model"
    assert (ckpt / "adapter_model.safetensors").is_file() and not (ckpt / "config.json").exists()
    base_after = load_causal_lm(tiny_model_dir).state_dict()  # the base folder is never written
    assert all(torch.equal(base_after[k], v) for k, v in base_before.items())

    report = export_model(result.run_dir, tmp_path / "export", "hf")
    exported = load_causal_lm(tmp_path / "export")
    assert exported.state_dict().keys() == base_before.keys()
    assert json.loads((tmp_path / "export" / "tandem_export.json").read_text())["format"] == "hf"
    ids = torch.randint(3, 30, (2, 9), generator=torch.Generator().manual_seed(0))
    policy = _policy_from(result.run_dir, tiny_model_dir)
    torch.testing.assert_close(_logits(exported, ids), _logits(policy, ids), rtol=0, atol=1e-5)
    assert (_logits(exported, ids) - _logits(load_causal_lm(tiny_model_dir), ids)).abs().max() > 1e-4
    assert report.size_before < report.size_after  # an adapter in, a whole model out


@pytest.mark.parametrize("ema_decay", [0.0, 0.6], ids=["live", "weight-average"])
def test_lora_resume_is_exact(tiny_model_dir, tmp_path, crash_at_step, ema_decay):
    common = {
        "trainer": {"total_steps": 4, "lr": 1e-2, "ema_decay": ema_decay},
        "checkpoint": {"every": 2, "keep_last": 5},
    }
    full = train(_cfg(tiny_model_dir, tmp_path / "full", **common), progress=False)
    crash_at_step(_cfg(tiny_model_dir, tmp_path / "part", **common), 2)
    resumed = train(_cfg(tiny_model_dir, tmp_path / "part", **common), resume=True, progress=False)
    assert resumed.steps == 4
    a = _policy_from(full.run_dir, tiny_model_dir).state_dict()
    b = _policy_from(resumed.run_dir, tiny_model_dir).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    def losses(run):
        return [(r["step"], r.get("reward/mean"), r.get("actor/pg_loss")) for r in step_rows(run.run_dir)]

    assert losses(resumed) == losses(full)
    live = latest_checkpoint(full.run_dir / "checkpoints") / LIVE_WEIGHTS
    if ema_decay:  # the adapter's average is model/; only the adapter's live weights sit beside it
        names = set(safetensors.torch.load_file(str(live)))
        assert names and all("lora_" in n for n in names), sorted(names)[:3]
    else:
        assert not live.exists()


def test_a_lora_run_resumed_on_another_base_is_refused(tiny_model_dir, tmp_path, crash_at_step):
    """The checkpoint holds the adapter; the base comes from model.path again. Another base trained on
    silently (held-out accuracy 0.60 -> 0); the same model copied elsewhere resumes."""
    import shutil

    from tandem.errors import ConfigError
    from tandem.models import init_tiny_model

    common = {"trainer": {"total_steps": 4, "lr": 1e-2}, "checkpoint": {"every": 2, "keep_last": 5}}
    crash_at_step(_cfg(tiny_model_dir, tmp_path / "part", **common), 2)
    other = init_tiny_model(tmp_path / "other", seed=99)
    with pytest.raises(ConfigError, match="model.path: .*the run's LoRA adapter was trained on"):
        train(_cfg(other, tmp_path / "part", **common), resume=True, progress=False)
    moved = Path(shutil.copytree(tiny_model_dir, tmp_path / "moved"))
    assert train(_cfg(moved, tmp_path / "part", **common), resume=True, progress=False).steps == 4


def test_decoupled_lora_workers_sample_the_merged_weights(tiny_model_dir, tmp_path):
    """Rollout workers hold plain models and receive merged weights; with staleness 0 their behaviour
    log-probs are the learner's (a worker left on the base, or given PEFT names, would fail or drift)."""
    cfg = _cfg(
        tiny_model_dir,
        tmp_path / "dec",
        architecture={"mode": "decoupled", "staleness": 0, "num_workers": 1},
        checkpoint={"save_final": False},
    )
    result = train(cfg, progress=False)
    rows = step_rows(result.run_dir)
    assert len(rows) == 3
    for r in rows:
        assert r["rollout/logprob_diff_max"] < 1e-4 and r["perf/weight_sync_bytes"] > 0, r


def test_dpo_with_lora_trains_adapters_and_saves_the_merged_policy(tiny_model_dir, tmp_path):
    """``tandem dpo ... lora.r=4``: offline and online; the saved folder is a plain model (merged), the
    layers LoRA does not touch (embeddings, norms) are the base's bit for bit, adapted ones moved (offline)."""
    import yaml
    from typer.testing import CliRunner

    from tandem.cli.main import app

    runner = CliRunner()
    prefs = tmp_path / "prefs"
    made = runner.invoke(app, ["data", "make-safety", "--out-dir", str(prefs), "--train-size", "24"])
    assert made.exit_code == 0, made.output
    base = load_causal_lm(tiny_model_dir).state_dict()
    for name, extra in (("offline", {"max_steps": 3}), ("online", {"online_rounds": 1})):
        out = tmp_path / name
        cfg = tmp_path / f"{name}.yaml"
        data = {"model": str(tiny_model_dir), "out_dir": str(out), "batch_size": 8, "lr": 0.05}
        data |= {"data": {"train_file": str(prefs / "train.jsonl"), "val_fraction": 0.25}, **extra}
        data |= {"online_judge": "task:safety", "online_max_new_tokens": 4, "lora": {"r": 4}}
        cfg.write_text(yaml.safe_dump(data))
        result = runner.invoke(app, ["dpo", str(cfg)])
        assert result.exit_code == 0, result.output
        assert (out / "config.json").is_file() and not (out / "adapter_config.json").exists()
        trained = load_causal_lm(out).state_dict()
        assert trained.keys() == base.keys()
        untouched = [k for k in base if "proj" not in k]
        assert untouched and all(torch.equal(trained[k], base[k]) for k in untouched)
        if name == "offline":  # (an online round on a random model may keep no pair to train on)
            assert any(not torch.equal(trained[k], base[k]) for k in base if "proj" in k)


@pytest.mark.parametrize("arch", ["causal", "bert"])
def test_rm_with_lora_trains_adapters_and_head_and_saves_a_plain_reward_model(tiny_model_dir, tmp_path, arch):
    """``tandem rm ... lora.r=4`` on a causal LM and on a BERT encoder: the saved folder is a plain reward
    model (merged), embeddings are the start's bit for bit, adapted layers moved, and it scores pairs."""
    import yaml
    from typer.testing import CliRunner

    from tandem.cli.main import app
    from tandem.models.encoder import build_tiny_encoder
    from tandem.train.rm import load_reward_model, score_texts

    runner = CliRunner()
    prefs = tmp_path / "prefs"
    made = runner.invoke(app, ["data", "make-safety", "--out-dir", str(prefs), "--train-size", "32"])
    assert made.exit_code == 0, made.output
    start = tiny_model_dir
    if arch == "bert":
        texts = [json.loads(x)["prompt"] for x in (prefs / "train.jsonl").read_text().splitlines()]
        start = build_tiny_encoder(tmp_path / "bert", texts, arch="bert")
    out = tmp_path / "rm"
    data = {"model": str(start), "out_dir": str(out), "epochs": 1, "batch_size": 8, "lr": 0.01}
    data |= {"data": {"train_file": str(prefs / "train.jsonl"), "val_fraction": 0.25}, "lora": {"r": 4}}
    (tmp_path / "rm.yaml").write_text(yaml.safe_dump(data))
    result = runner.invoke(app, ["rm", str(tmp_path / "rm.yaml")])
    assert result.exit_code == 0, result.output
    assert (out / "config.json").is_file() and not (out / "adapter_config.json").exists()
    model, tok = load_reward_model(out)
    before, _ = load_reward_model(start, init_head=True)
    a, b = model.state_dict(), before.state_dict()
    assert a.keys() == b.keys()
    emb = [k for k in a if "embed" in k and k.endswith("weight")]
    assert emb and all(torch.equal(a[k], b[k]) for k in emb)
    adapted = [k for k in a if ("proj" in k or "query" in k or "value" in k) and k.endswith("weight")]
    assert adapted and any(not torch.equal(a[k], b[k]) for k in adapted)
    assert len(score_texts(model, tok, ["p1", "p2"], ["a", "b"])) == 2


def test_two_rank_data_parallel_learner_trains_the_same_adapter(tiny_model_dir, tmp_path):
    """``architecture.learner.world_size=2`` with LoRA: every rank builds the LoRA policy and the adapter-
    disabled reference; the learner's replica fingerprint check passes and step 1 matches one rank."""
    dp_cfg = {"mode": "decoupled", "staleness": 0, "num_workers": 1}

    def run(world: int, steps: int):
        cfg = _cfg(
            tiny_model_dir,
            tmp_path / f"dp{world}",
            architecture={**dp_cfg, "learner": {"world_size": world}},
            trainer={"total_steps": steps},
            checkpoint={"save_final": False},
        )
        return step_rows(train(cfg, progress=False).run_dir)

    two, one = run(2, 2), run(1, 1)
    assert len(two) == 2 and all(r["actor/grad_norm"] > 0 for r in two)
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/kl_ref"):
        assert two[0][key] == pytest.approx(one[0][key], rel=1e-5, abs=1e-7), key
