"""``rollout.greedy_in_group``: each prompt's greedy completion joins its group of samples, so the
group-relative advantage rewards or penalises the answer greedy evaluation reads. Real tiny runs: the
greedy row is the engine's greedy answer, the learner scores it like the samples, the config rejects
what cannot work."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rollout_batches import constant_batch

from tandem.algos import greedy_baseline
from tandem.channels.base import TrajectoryMessage
from tandem.channels.serialize import decode_message, encode_message
from tandem.config import build_config
from tandem.errors import ConfigError
from tandem.monitor import read_metrics
from tandem.orchestration.colocated import ColocatedTrainer
from tandem.orchestration.parts import build_parts
from tandem.orchestration.runner import train
from tandem.rollout.base import SamplingParams
from tandem.train.experience import make_experience
from tandem.types import concat_rollouts

DIGITS = f"{Path(__file__).parents[2] / 'e2e' / 'digits_reward.py'}:digit_share"


def _cfg(model_dir, out, steps=3, **rollout):
    return build_config(
        {
            "run": {"output_dir": str(out), "seed": 3},
            "model": {"path": str(model_dir)},
            "data": {"task": "arith", "prompts_per_step": 3, "eval_size": 0, "train_size": 32},
            "rollout": {"n": 3, "max_new_tokens": 4, "greedy_in_group": True, **rollout},
            "algorithm": {"name": "grpo"},
            "reward": {"task_reward": False, "functions": [{"path": DIGITS}]},
            "trainer": {"total_steps": steps, "lr": 3e-3},
            "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
        }
    )


def test_each_group_ends_with_the_engines_greedy_answer(tiny_model_dir, tmp_path):
    torch.set_num_threads(1)
    cfg = _cfg(tiny_model_dir, tmp_path)
    assert cfg.rollout.group_size == 4 and cfg.samples_per_step == 12
    trainer = ColocatedTrainer(build_parts(cfg))
    batch, scores, metrics = trainer.collect()
    assert batch.batch_size == 12
    gids = batch.group_ids.tolist()
    assert gids == sorted(gids) and all(gids.count(g) == 4 for g in set(gids))
    last = list(range(3, 12, 4))  # each group's last row
    prompts = [batch.prompts[i] for i in last]
    greedy = trainer.parts.engine.generate(prompts, SamplingParams(max_new_tokens=4, temperature=0.0))
    assert [batch.completions[i] for i in last] == greedy.completions
    assert torch.equal(batch.behavior_logprobs[last], greedy.behavior_logprobs)
    assert metrics["greedy/reward_mean"] == pytest.approx(float(scores[last].mean()))
    # above / below: the greedy answer against the mean of its group's three samples
    sampled_mean = torch.stack([scores[i - 3 : i].mean() for i in last])
    above = float((scores[last] > sampled_mean + 1e-6).float().mean())
    below = float((scores[last] < sampled_mean - 1e-6).float().mean())
    assert (metrics["greedy/above_group_frac"], metrics["greedy/below_group_frac"]) == pytest.approx(
        (above, below)
    )


def test_a_run_scores_the_greedy_rows_like_the_samples(tiny_model_dir, tmp_path):
    torch.set_num_threads(1)
    result = train(_cfg(tiny_model_dir, tmp_path / "run"), progress=False)
    rows = [r for r in read_metrics(result.run_dir) if r["step"] >= 1]
    assert len(rows) == 3 and all("greedy/reward_mean" in r for r in rows)
    # the greedy rows' engine log-probs (raw logits) are what the learner computes at temperature 1: a
    # learner scoring them any other way (or misaligned rows) would differ by far more than 1e-3
    assert max(r["rollout/logprob_diff_max"] for r in rows) < 1e-3


def test_one_sample_and_the_greedy_answer_make_a_group(tiny_model_dir, tmp_path):
    cfg = _cfg(tiny_model_dir, tmp_path, n=1)  # GRPO on pairs: a ReMax-like greedy baseline
    assert cfg.rollout.group_size == 2 and cfg.samples_per_step == 6
    with pytest.raises(ConfigError, match=r"rollout\.n.*greedy_in_group"):
        _cfg(tiny_model_dir, tmp_path, n=1, greedy_in_group=False)


def test_config_errors_name_the_key(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"rollout\.greedy_in_group.*rollout\.temperature=1 \(got 0\.7\)"):
        _cfg(tiny_model_dir, tmp_path, temperature=0.7)
    with pytest.raises(ConfigError, match=r"rollout\.greedy_in_group.*adaptive_temperature"):
        _cfg(tiny_model_dir, tmp_path, adaptive_temperature={"target_entropy": 0.5})
    data = _cfg(tiny_model_dir, tmp_path).model_dump(mode="json")
    data["algorithm"] = {"name": "agro"}
    data["trainer"]["micro_batch_size"] = 3  # a group is 4 rows with the greedy one
    with pytest.raises(ConfigError, match=r"trainer\.micro_batch_size.*group size \(4"):
        build_config(data)


def test_greedy_baseline_is_each_groups_greedy_score():
    scores = torch.tensor([1.0, 0.0, 0.5, 0.25, 1.0, 0.75])
    gids = torch.tensor([7, 7, 7, 3, 3, 3])
    greedy = torch.tensor([False, True, False, False, False, True])
    assert greedy_baseline(scores, gids, greedy).tolist() == [0.0, 0.0, 0.0, 0.75, 0.75, 0.75]
    with pytest.raises(ValueError, match="group 3 holds 0 greedy rows"):
        greedy_baseline(scores, gids, torch.tensor([False, True, False, False, False, False]))
    with pytest.raises(ValueError, match="group 7 holds 2 greedy rows"):
        greedy_baseline(scores, gids, torch.tensor([True, True, False, False, False, True]))


def test_the_greedy_flag_survives_select_concat_and_the_wire():
    b = constant_batch([0, 0], greedy=torch.tensor([False, True]))
    joined = concat_rollouts([b, constant_batch([1])], pad_token_id=0)  # no flags: no greedy rows
    assert joined.greedy.tolist() == [False, True, False]
    assert joined.select([1, 2]).greedy.tolist() == [True, False]
    msg = TrajectoryMessage(joined, torch.zeros(3), ticket=0, worker_id=0, meta={})
    assert decode_message(encode_message(msg)).batch.greedy.tolist() == [False, True, False]
    assert concat_rollouts([constant_batch([0]), constant_batch([1])], pad_token_id=0).greedy is None


def test_remax_trains_against_the_greedy_answer(tiny_model_dir, tmp_path):
    """``remax`` in a real run: every sample's advantage is its reward minus its group's greedy reward, and
    the greedy rows themselves get none."""
    torch.set_num_threads(1)
    data = _cfg(tiny_model_dir, tmp_path).model_dump(mode="json")
    data["algorithm"] = {"name": "grpo", "advantage": "remax"}
    trainer = ColocatedTrainer(build_parts(build_config(data)))
    batch, scores, _ = trainer.collect()
    exp, _ = make_experience(batch, scores, trainer.learn.exp_settings)
    base = torch.stack(
        [scores[batch.group_ids == g][batch.greedy[batch.group_ids == g]][0] for g in batch.group_ids]
    )
    want = (scores - base).unsqueeze(1) * batch.response_mask  # [B, R], the sequence advantage on every token
    assert torch.allclose(exp.advantages, want)
    assert float(exp.advantages[batch.greedy].abs().sum()) == 0.0
    assert float((scores - base).abs().sum()) > 0, (
        "all samples scored like the greedy answer: no signal tested"
    )
    train(build_config({**data, "trainer": {**data["trainer"], "total_steps": 2}}), progress=False)
