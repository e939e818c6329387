"""Reward model: padding-invariant scoring, Bradley–Terry training reaches held-out accuracy, atomic
save/load with normalisation stats, and use as an RL reward (normalised, weighted, batched)."""

from __future__ import annotations

import math

import pytest
import torch

from tandem.config.schema import RewardConfig
from tandem.data.preference import PreferencePair
from tandem.errors import ConfigError, ModelError, RewardError
from tandem.rewards.model import RewardModelReward, RunningMoments
from tandem.train import rm


def toy_pairs(n: int, offset: int = 0) -> list[PreferencePair]:
    """Separable preferences: 'yes' beats 'no' whatever the prompt."""
    return [PreferencePair(f"q{i + offset}?", "yes", "no", where=f"row {i}") for i in range(n)]


@pytest.fixture(scope="module")
def trained_rm(tiny_model_dir, tmp_path_factory):
    torch.manual_seed(0)
    model, tok = rm.load_reward_model(tiny_model_dir, init_head=True)
    history = rm.train_reward_model(
        model, tok, toy_pairs(32), toy_pairs(8, offset=100), rm.RMSettings(epochs=3, lr=5e-3, batch_size=8)
    )
    out = tmp_path_factory.mktemp("rm") / "rm"
    rm.save_reward_model(model, tok, out, rm.reward_stats(model, tok, toy_pairs(8)))
    return model, tok, history, out


def test_causal_lm_folder_is_not_a_reward_model_without_init_head(tiny_model_dir):
    with pytest.raises(ModelError, match="not a reward model .*train one with `tandem rm`"):
        rm.load_reward_model(tiny_model_dir)


def test_score_is_the_same_alone_and_in_a_padded_batch(tiny_model_dir):
    model, tok = rm.load_reward_model(tiny_model_dir, init_head=True)
    alone = rm.score_texts(model, tok, ["a"], ["b"])
    batch = rm.score_texts(model, tok, ["a", "a much longer prompt"], ["b", "and a longer completion"])
    assert batch[0] == pytest.approx(alone[0], abs=1e-5) and batch[1] != pytest.approx(alone[0])


def test_training_reaches_held_out_accuracy_and_reports_per_epoch(trained_rm):
    _, _, history, _ = trained_rm
    assert [h["epoch"] for h in history] == [1.0, 2.0, 3.0]
    assert history[-1]["rm/val_accuracy"] == 1.0 and history[-1]["rm/loss"] < history[0]["rm/loss"]


def test_saved_folder_round_trips_scores_and_stats(trained_rm):
    model, tok, _, out = trained_rm
    loaded, tok2 = rm.load_reward_model(out)
    assert rm.score_texts(loaded, tok2, ["q1?"], ["yes"]) == pytest.approx(
        rm.score_texts(model, tok, ["q1?"], ["yes"]), abs=1e-5
    )
    stats = rm.read_reward_stats(out)
    assert stats["count"] == 16 and stats["std"] > 0


@pytest.mark.parametrize("timeout_s", [None, 60.0], ids=["inline", "on-a-thread"])
def test_reward_model_as_rl_reward_with_fixed_normalisation(trained_rm, timeout_s):
    """With reward.timeout_s the reward model scores on a background thread: the same scores."""
    from tandem.orchestration.build import build_rewards

    _, _, _, out = trained_rm
    cfg = RewardConfig(
        task_reward=False,
        model={"path": str(out), "weight": 0.5, "normalize": "fixed", "batch_size": 3},
        timeout_s=timeout_s,
    )
    rewards = build_rewards(cfg, task=None)
    assert rewards.timeout_s == timeout_s
    result = rewards(["q1?"] * 4, ["yes", "no", "yes", "no"], {})
    stats = rm.read_reward_stats(out)
    model, tok = rm.load_reward_model(out)
    raw = rm.score_texts(model, tok, ["q1?"] * 4, ["yes", "no", "yes", "no"])
    expected = [0.5 * (r - stats["mean"]) / stats["std"] for r in raw]
    assert result.scores.tolist() == pytest.approx(expected, abs=1e-4)
    assert result.scores[0] > result.scores[1]


def test_running_normalisation_matches_full_recompute():
    values = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
    reward = RewardModelReward(lambda p, c: [float(x) for x in c], normalize="running", batch_size=3)
    first = reward(["p"] * 5, values[:5])
    second = reward(["p"] * 3, values[5:])
    seen = torch.tensor(values)
    mean, std = float(seen.mean()), float(seen.std(unbiased=False))
    assert second == pytest.approx([(v - mean) / std for v in values[5:]])
    m5 = torch.tensor(values[:5])
    assert first == pytest.approx(
        [(v - float(m5.mean())) / float(m5.std(unbiased=False)) for v in values[:5]]
    )
    assert RunningMoments().std == 1.0


def test_reward_model_errors_and_clip():
    with pytest.raises(ConfigError, match="reward.model.normalize"):
        RewardModelReward(lambda p, c: [], normalize="zscore")  # type: ignore[arg-type]
    with pytest.raises(RewardError, match="returned 1 scores for 2"):
        RewardModelReward(lambda p, c: [0.0], normalize="none")(["a", "b"], ["x", "y"])
    with pytest.raises(RewardError, match="non-finite"):
        RewardModelReward(lambda p, c: [math.nan] * len(c), normalize="none")(["a"], ["x"])
    clipped = RewardModelReward(lambda p, c: [10.0, -10.0], normalize="fixed", mean=0, std=2, clip=1.5)
    assert clipped(["a", "b"], ["x", "y"]) == [1.5, -1.5]


def test_shipped_command_configs_load_and_bad_keys_name_file_and_line(tmp_path):
    from pathlib import Path

    from tandem.config.rlhf import DPOConfig, LabelConfig, RMConfig, load_command_config

    configs = Path(__file__).resolve().parents[3] / "configs"
    assert load_command_config(RMConfig, configs / "rm.yaml").epochs >= 1
    assert load_command_config(DPOConfig, configs / "dpo.yaml", ["beta=0.2"]).beta == 0.2
    assert load_command_config(LabelConfig, configs / "rlaif_dpo.yaml").judge == "rule"
    bad = tmp_path / "rm.yaml"
    bad.write_text("model: m\nout_dir: o\ndata:\n  train_file: t\n  tain_file: x\n")
    with pytest.raises(
        ConfigError, match=rf"^{bad}:5: data.tain_file: unknown key \(did you mean .train_file.\?\)$"
    ):
        load_command_config(RMConfig, bad)
    with pytest.raises(
        ConfigError, match=r"^override 'bta=0.2': bta: unknown key \(did you mean 'beta'\?\)$"
    ):
        load_command_config(DPOConfig, configs / "dpo.yaml", ["bta=0.2"])


def test_save_reward_model_refuses_an_unrelated_folder_and_its_source(trained_rm, tmp_path, tiny_model_dir):
    model, tok, _, earlier = trained_rm
    precious = tmp_path / "thesis"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    with pytest.raises(ConfigError, match="not a Tandem reward-model folder"):
        rm.save_reward_model(model, tok, precious, {"mean": 0.0, "std": 1.0})
    with pytest.raises(ConfigError, match=r"is \(or holds\) the source folder"):
        rm.save_reward_model(model, tok, tiny_model_dir.parent, {}, source=tiny_model_dir)
    assert [p.name for p in precious.iterdir()] == ["thesis.tex"]
    rm.save_reward_model(model, tok, earlier, rm.read_reward_stats(earlier))  # an earlier one: replaced
