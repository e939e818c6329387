"""Decoupled with η = 0 and one worker reproduces the colocated run (same seed): rewards and weights.

Exactness argument: ticket k draws the colocated step-k prompts, sampling seed and group ids; the worker's
model copy receives the learner's fp32 weights bit for bit through shared memory before each batch; both
sides run with one torch thread, so every forward pass (sampling, log-probs, update) does the same float
operations in the same order. Hence equality is asserted exactly, not within a tolerance.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from run_checks import step_rows

from tandem.config import build_config
from tandem.models import load_causal_lm
from tandem.orchestration.decoupled.runtime import RunHooks, train_decoupled
from tandem.orchestration.runner import train
from tandem.train.checkpoint import latest_checkpoint

# A dense reward (share of digits) gives every group some spread, so the updates are non-trivial.
DIGITS = f"{Path(__file__).parents[1] / 'e2e' / 'digits_reward.py'}:digit_share"


def _cfg(model_dir, out, mode, **arch):
    return build_config(
        {
            "run": {"output_dir": str(out), "seed": 5},
            "model": {"path": str(model_dir)},
            "data": {"task": "arith", "prompts_per_step": 2, "eval_size": 4, "train_size": 32},
            "rollout": {"n": 4, "max_new_tokens": 4},
            "algorithm": {"name": "grpo"},
            "reward": {"task_reward": False, "functions": [{"path": DIGITS}]},
            "trainer": {"total_steps": 3, "lr": 3e-3},
            "architecture": {"mode": mode, **arch},
            "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
        }
    )


def _weights(run_dir):
    return load_causal_lm(latest_checkpoint(run_dir / "checkpoints") / "model").state_dict()


def test_eta0_one_worker_equals_colocated(tiny_model_dir, tmp_path):
    torch.set_num_threads(1)
    colo = train(_cfg(tiny_model_dir, tmp_path / "colo", "colocated"), progress=False)
    dec = train_decoupled(
        _cfg(tiny_model_dir, tmp_path / "dec", "decoupled", staleness=0, num_workers=1), progress=False
    )
    assert dec.steps == colo.steps == 3
    a, b = step_rows(colo.run_dir), step_rows(dec.run_dir)
    for ra, rb in zip(a, b, strict=True):
        assert ra["reward/mean"] == rb["reward/mean"]
        assert ra["actor/pg_loss"] == rb["actor/pg_loss"]
        assert ra["response/length_mean"] == rb["response/length_mean"]
        assert rb["staleness/step_lag"] == 0.0
    wa, wb = _weights(colo.run_dir), _weights(dec.run_dir)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    # the weights did move, so the equality is not vacuous
    w0 = load_causal_lm(tiny_model_dir).state_dict()
    assert any(not torch.equal(w0[k], wb[k]) for k in w0)
    assert colo.eval_after == dec.eval_after


def _ppo_cfg(model_dir, out, mode, steps=3, **extra):
    cfg = _cfg(model_dir, out, mode, **({"staleness": 0, "num_workers": 1} if mode == "decoupled" else {}))
    data = cfg.model_dump(mode="json")
    data["algorithm"] = {"name": "ppo", "beta": 0.05, "kl": {"where": "reward", "controller": "adaptive"}}
    data["critic"] = {"lr": 1e-3}
    data["trainer"]["total_steps"] = steps
    for key, value in extra.items():
        data[key].update(value)
    return build_config(data)


def _critic(run_dir):
    import safetensors.torch

    return safetensors.torch.load_file(
        str(latest_checkpoint(run_dir / "checkpoints") / "critic" / "model.safetensors")
    )


def test_eta0_ppo_with_critic_and_adaptive_kl_equals_colocated(tiny_model_dir, tmp_path):
    """PPO (GAE critic, KL in the reward with the adaptive controller) runs decoupled: at η = 0 with one
    worker its losses, β trajectory, policy and critic equal the colocated run's exactly; a resumed
    decoupled run restores critic, optimisers and β and ends where the uninterrupted one does."""
    torch.set_num_threads(1)
    colo = train(_ppo_cfg(tiny_model_dir, tmp_path / "colo", "colocated"), progress=False)
    dec = train_decoupled(_ppo_cfg(tiny_model_dir, tmp_path / "dec", "decoupled"), progress=False)
    a, b = step_rows(colo.run_dir), step_rows(dec.run_dir)
    for ra, rb in zip(a, b, strict=True):
        for key in ("reward/mean", "actor/pg_loss", "critic/vf_loss", "actor/kl_coef"):
            assert ra[key] == rb[key], key
    assert len({r["actor/kl_coef"] for r in b}) > 1, "the adaptive controller never moved β"
    for wa, wb in (
        (_weights(colo.run_dir), _weights(dec.run_dir)),
        (_critic(colo.run_dir), _critic(dec.run_dir)),
    ):
        for k in wa:
            assert torch.equal(wa[k], wb[k]), k

    class CrashError(Exception):
        pass

    def crash(run, step):
        if step == 2:  # after step 2's checkpoint
            raise CrashError

    res_cfg = _ppo_cfg(tiny_model_dir, tmp_path / "res", "decoupled", checkpoint={"every": 1})
    with pytest.raises(CrashError):
        train_decoupled(res_cfg, progress=False, hooks=RunHooks(on_step=crash))
    resumed = train_decoupled(
        _ppo_cfg(tiny_model_dir, tmp_path / "res", "decoupled", checkpoint={"every": 1}),
        resume=True,
        progress=False,
    )
    assert step_rows(resumed.run_dir)[-1]["actor/kl_coef"] == b[-1]["actor/kl_coef"]
    for wa, wb in (
        (_weights(dec.run_dir), _weights(resumed.run_dir)),
        (_critic(dec.run_dir), _critic(resumed.run_dir)),
    ):
        for k in wa:
            assert torch.equal(wa[k], wb[k]), k


EVEN = f"{Path(__file__).parents[1] / 'e2e' / 'digits_reward.py'}:even_length"


def _grow_cfg(model_dir, out, mode):
    """Adaptive group size on a 0/1 reward that leaves a group of 2 all-equal at least half the time (4
    prompts x 3 steps: some group grows on any CPU or library build)."""
    cfg = _cfg(model_dir, out, mode, **({"staleness": 0, "num_workers": 1} if mode == "decoupled" else {}))
    data = cfg.model_dump(mode="json")
    data["rollout"]["n"] = 2
    data["data"]["prompts_per_step"] = 4
    data["algorithm"] = {
        "name": "grpo",
        "adaptive_group": {"enabled": True, "max_n": 6, "which": "all_equal"},
    }
    data["reward"]["functions"] = [{"path": EVEN}]
    return build_config(data)


def test_eta0_adaptive_group_size_equals_colocated(tiny_model_dir, tmp_path):
    """A decoupled worker grows its ticket's all-equal groups as the colocated step does: at η = 0 with one
    worker the ragged batches, the losses and the weights are the colocated run's exactly, and the ledger
    counts the samples actually shipped."""
    torch.set_num_threads(1)
    colo = train(_grow_cfg(tiny_model_dir, tmp_path / "colo", "colocated"), progress=False)
    dec = train_decoupled(_grow_cfg(tiny_model_dir, tmp_path / "dec", "decoupled"), progress=False)
    a, b = step_rows(colo.run_dir), step_rows(dec.run_dir)
    assert len(a) == len(b) == 3
    for ra, rb in zip(a, b, strict=True):
        for key in ("reward/mean", "actor/pg_loss", "adaptive/extra_samples", "adaptive/rescued_frac"):
            assert ra[key] == rb[key], key
    extra = sum(r["adaptive/extra_samples"] for r in b)
    assert extra > 0, "no group grew: the test would not exercise ragged batches"
    assert b[-1]["decoupled/trained_samples"] == 3 * 4 * 2 + extra  # 3 steps x 4 prompts x n=2, plus growth
    wa, wb = _weights(colo.run_dir), _weights(dec.run_dir)
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


def test_eta0_greedy_in_group_equals_colocated(tiny_model_dir, tmp_path):
    """A decoupled worker adds each prompt's greedy answer to its group as the colocated step does: at η = 0
    with one worker the groups of n + 1, the losses and the weights are the colocated run's exactly."""
    torch.set_num_threads(1)

    def cfg(out, mode, **arch):
        data = _cfg(tiny_model_dir, out, mode, **arch).model_dump(mode="json")
        data["rollout"]["greedy_in_group"] = True
        return build_config(data)

    colo = train(cfg(tmp_path / "colo", "colocated"), progress=False)
    dec = train_decoupled(cfg(tmp_path / "dec", "decoupled", staleness=0, num_workers=1), progress=False)
    a, b = step_rows(colo.run_dir), step_rows(dec.run_dir)
    assert len(a) == len(b) == 3
    for ra, rb in zip(a, b, strict=True):
        for key in ("reward/mean", "actor/pg_loss", "greedy/reward_mean", "greedy/below_group_frac"):
            assert ra[key] == rb[key], key
    assert b[-1]["decoupled/trained_samples"] == 3 * 2 * 5  # 3 steps x 2 prompts x (n=4 + the greedy one)
    wa, wb = _weights(colo.run_dir), _weights(dec.run_dir)
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


def test_eta0_reference_answers_equal_colocated(tiny_model_dir, tmp_path):
    """A decoupled worker adds the prompt file's answers to all-fail groups as the colocated step does
    (``rollout.reference_answers``, imitate mode: the learner's NLL term too): at η = 0 with one worker the
    metrics and the weights are the colocated run's exactly."""
    torch.set_num_threads(1)

    def cfg(out, mode, **arch):
        data = _cfg(tiny_model_dir, out, mode, **arch).model_dump(mode="json")
        data["rollout"]["reference_answers"] = {"column": "answer", "mode": "imitate"}
        data["reward"] = {"task_reward": True, "functions": []}  # correctness: an untrained model fails
        return build_config(data)

    colo = train(cfg(tmp_path / "colo", "colocated"), progress=False)
    dec = train_decoupled(cfg(tmp_path / "dec", "decoupled", staleness=0, num_workers=1), progress=False)
    a, b = step_rows(colo.run_dir), step_rows(dec.run_dir)
    assert len(a) == len(b) == 3 and all(r["reference/added_frac"] > 0 for r in a)
    for ra, rb in zip(a, b, strict=True):
        for key in ("reward/mean", "actor/pg_loss", "reference/added_frac", "actor/reference_nll"):
            assert ra[key] == rb[key], key
    wa, wb = _weights(colo.run_dir), _weights(dec.run_dir)
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


def test_eta0_adaptive_temperature_equals_colocated(tiny_model_dir, tmp_path):
    """``rollout.adaptive_temperature`` decoupled: the learner steps the controller on each batch it trains
    and publishes the value with the weights, so at η = 0 with one worker every ticket is sampled at the
    colocated step's temperature; metrics and weights are the colocated run's exactly. A resumed decoupled
    run continues from the checkpoint's temperature."""
    torch.set_num_threads(1)

    def cfg(out, mode, steps=4, **arch):
        data = _cfg(tiny_model_dir, out, mode, **arch).model_dump(mode="json")
        # a target no policy reaches: one step hotter per update (1.0, 1.1, 1.2, 1.3)
        data["rollout"]["adaptive_temperature"] = {"target_entropy": 100.0, "step": 0.1}
        data["trainer"]["total_steps"] = steps
        data["checkpoint"] = {"every": 2}
        return build_config(data)

    colo = train(cfg(tmp_path / "colo", "colocated"), progress=False)
    dec = train_decoupled(cfg(tmp_path / "dec", "decoupled", staleness=0, num_workers=1), progress=False)
    a, b = step_rows(colo.run_dir), step_rows(dec.run_dir)
    assert [r["rollout/temperature"] for r in b] == pytest.approx([1.0, 1.1, 1.2, 1.3])
    for ra, rb in zip(a, b, strict=True):
        for key in ("rollout/temperature", "rollout/sampled_entropy", "reward/mean", "actor/pg_loss"):
            assert ra[key] == rb[key], key
        assert rb["rollout/logprob_diff_max"] < 1e-3  # the learner scored at the sampling temperature
    wa, wb = _weights(colo.run_dir), _weights(dec.run_dir)
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    arch = {"staleness": 0, "num_workers": 1}
    train_decoupled(cfg(tmp_path / "half", "decoupled", steps=2, **arch), progress=False)
    resumed = train_decoupled(cfg(tmp_path / "half", "decoupled", **arch), resume=True, progress=False)
    assert [r["rollout/temperature"] for r in step_rows(resumed.run_dir)] == pytest.approx(
        [1.0, 1.1, 1.2, 1.3]
    )


def test_eta0_weight_average_equals_colocated(tiny_model_dir, tmp_path, monkeypatch):
    """``trainer.ema_decay`` decoupled: the learner evaluates and saves the average while the worker
    samples the live weights; at η = 0 with one worker every step, evaluated and saved weight is the
    colocated run's (a worker sampling the average would change the rewards from step 2)."""
    import safetensors.torch

    from tandem.orchestration import colocated
    from tandem.orchestration.decoupled import runtime
    from tandem.train.checkpoint import LIVE_WEIGHTS

    torch.set_num_threads(1)
    evaluated: dict[str, list[dict[str, torch.Tensor]]] = {"colo": [], "dec": []}

    def spy(label, real):
        def evaluate(parts, step=None):  # the weights each held-out evaluation generates with
            evaluated[label].append({k: v.clone() for k, v in parts.engine.model.state_dict().items()})
            return real(parts, step)

        return evaluate

    def cfg(out, mode, **arch):
        data = _cfg(tiny_model_dir, out, mode, **arch).model_dump(mode="json")
        data["trainer"]["ema_decay"] = 0.5
        data["monitor"]["eval_every"] = 1
        return build_config(data)

    monkeypatch.setattr(colocated, "evaluate_heldout", spy("colo", colocated.evaluate_heldout))
    monkeypatch.setattr(runtime, "evaluate_heldout", spy("dec", runtime.evaluate_heldout))
    colo = train(cfg(tmp_path / "colo", "colocated"), progress=False)
    dec = train_decoupled(cfg(tmp_path / "dec", "decoupled", staleness=0, num_workers=1), progress=False)
    a, b = step_rows(colo.run_dir), step_rows(dec.run_dir)
    assert len(a) == len(b) == 3
    for ra, rb in zip(a, b, strict=True):
        for key in ("reward/mean", "actor/pg_loss", "actor/ema_decay"):
            assert ra[key] == rb[key], key
    wa, wb = _weights(colo.run_dir), _weights(dec.run_dir)
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    assert len(evaluated["colo"]) == len(evaluated["dec"]) == 4  # before step 1 and after each step
    for ea, eb in zip(evaluated["colo"], evaluated["dec"], strict=True):
        for k in ea:
            assert torch.equal(ea[k], eb[k]), k
    for k in wa:  # the last evaluation saw the saved model/: the average
        assert torch.equal(evaluated["dec"][-1][k], wb[k]), k
    live_a, live_b = (
        safetensors.torch.load_file(str(latest_checkpoint(r.run_dir / "checkpoints") / LIVE_WEIGHTS))
        for r in (colo, dec)
    )
    for k in live_a:
        assert torch.equal(live_a[k], live_b[k]), k
    assert any(not torch.equal(live_a[k], wa[k]) for k in live_a), "the average should lag the live weights"


def _frontier_cfg(model_dir, out, mode, **extra):
    """A frontier curriculum on 8 prompts, 4 a step, half of each batch replaying the frontier."""
    data = _grow_cfg(model_dir, out, mode).model_dump(mode="json")
    data["algorithm"] = {"name": "grpo"}
    data["data"].update(train_size=8, curriculum={"kind": "frontier", "replay": 0.5})
    data["trainer"]["total_steps"] = 5
    for key, value in extra.items():
        data[key].update(value)
    return build_config(data)


def test_eta0_frontier_curriculum_equals_colocated(tiny_model_dir, tmp_path):
    """``data.curriculum.kind=frontier`` decoupled: the worker reports each ticket's draws and groups, the
    learner replays them and publishes its statistics with the weights, and the worker picks from those:
    at η = 0 with one worker the colocated run's, so it picks the same prompts and the metrics and weights
    are the colocated run's exactly."""
    torch.set_num_threads(1)
    colo = train(_frontier_cfg(tiny_model_dir, tmp_path / "colo", "colocated"), progress=False)
    dec = train_decoupled(_frontier_cfg(tiny_model_dir, tmp_path / "dec", "decoupled"), progress=False)
    a, b = step_rows(colo.run_dir), step_rows(dec.run_dir)
    assert len(a) == len(b) == 5
    keys = ("reward/mean", "actor/pg_loss", "prompts/seen_before_mean", "prompts/frontier_size")
    for ra, rb in zip(a, b, strict=True):
        for key in keys:
            assert ra[key] == rb[key], key
    # 8 prompts, 4 a step: without a curriculum steps 0-1 draw each prompt once; replaying the frontier
    # draws one again within them
    assert any(r["prompts/first_time_frac"] < 1 for r in a[:2]), "the curriculum never acted"
    wa, wb = _weights(colo.run_dir), _weights(dec.run_dir)
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


def test_eta0_frontier_curriculum_resumes_exactly(tiny_model_dir, tmp_path):
    """The learner checkpoints the prompt statistics: a decoupled run resumed after a crash (a fresh worker,
    with nothing of its own) picks the prompts the uninterrupted run picks and ends with its weights."""
    torch.set_num_threads(1)

    class CrashError(Exception):
        pass

    def crash(run, step):
        if step == 3:  # after step 3's checkpoint
            raise CrashError

    ck = {"checkpoint": {"every": 1, "keep_last": 9}}
    whole = train_decoupled(
        _frontier_cfg(tiny_model_dir, tmp_path / "whole", "decoupled", **ck), progress=False
    )
    cfg = _frontier_cfg(tiny_model_dir, tmp_path / "res", "decoupled", **ck)
    with pytest.raises(CrashError):
        train_decoupled(cfg, progress=False, hooks=RunHooks(on_step=crash))
    resumed = train_decoupled(cfg, resume=True, progress=False)
    a, b = step_rows(whole.run_dir), step_rows(resumed.run_dir)
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5]
    for ra, rb in zip(a, b, strict=True):
        for key in ("reward/mean", "prompts/seen_before_mean", "prompts/first_time_frac"):
            assert ra[key] == rb[key], (ra["step"], key)
    assert b[3]["prompts/seen_before_mean"] > 0  # the fresh worker knew the earlier steps' draws
    wa, wb = _weights(whole.run_dir), _weights(resumed.run_dir)
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
