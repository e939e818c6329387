"""Judges: verifier, reward model (real tiny sequence classifier), LLM judge in both orders; targets."""

from __future__ import annotations

import shutil

import pytest
import torch

from tandem.errors import ConfigError, ModelError
from tandem.evaluate.judges import (
    LLMJudge,
    RewardModelJudge,
    VerifierJudge,
    build_judge,
    combine_orders,
    sign_outcomes,
)
from tandem.evaluate.targets import resolve_target
from tandem.rewards import RewardFunction, RewardSet, get_task


def test_combine_orders_counts_only_consistent_preferences():
    b_second = torch.tensor([1.0, 1.0, -1.0, -1.0, 0.0])
    a_second = torch.tensor([-1.0, 1.0, 1.0, -1.0, 0.0])
    # agree B | position bias (always "second") | agree A | position bias (always "first") | no preference
    assert combine_orders(b_second, a_second) == [1, 0, -1, 0, 0]


def test_sign_outcomes():
    assert sign_outcomes(torch.tensor([0.0, 1.0, 0.5]), torch.tensor([1.0, 0.0, 0.5])) == [1, -1, 0]


def test_verifier_judge():
    task = get_task("reverse")
    judge = VerifierJudge(RewardSet([RewardFunction(name="reverse", fn=task.reward, weight=1.0)]))
    prompts = ["reverse ab:", "reverse cd:", "reverse ef:"]
    cols = {"answer": ["ba", "dc", "fe"]}
    assert judge.compare(prompts, ["ba", "x", "fe"], ["x", "dc", "fe"], cols) == [-1, 1, 0]


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory, tiny_model_dir):
    """A tiny Llama sequence classifier (one logit) sharing the char tokenizer: a real HF reward model."""
    from transformers import AutoConfig, LlamaForSequenceClassification

    out = tmp_path_factory.mktemp("rm") / "rm"
    shutil.copytree(tiny_model_dir, out)
    cfg = AutoConfig.from_pretrained(out)
    cfg.num_labels = 1
    torch.manual_seed(0)
    LlamaForSequenceClassification(cfg).save_pretrained(out, safe_serialization=True)
    return out


def test_reward_model_judge_scores_are_padding_invariant(reward_model_dir):
    judge = RewardModelJudge(str(reward_model_dir), batch_size=8)
    prompts = ["reverse abc:", "reverse a:", "reverse abcdef:"]
    answers = ["cba", "a", "f"]
    batched = judge.score(prompts, answers)
    alone = torch.cat([judge.score([p], [a]) for p, a in zip(prompts, answers, strict=True)])
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=1e-4)
    assert len(set(batched.tolist())) == 3
    out = judge.compare(prompts, answers, ["zz", "zz", "zz"], {})
    zz = judge.score(prompts, ["zz"] * 3)
    assert out == sign_outcomes(batched, zz)


def test_llm_judge_is_antisymmetric_and_ties_identical_answers(tiny_model_dir):
    judge = LLMJudge(str(tiny_model_dir))
    prompts = ["reverse abc:", "reverse xy:", "reverse qrs:", "reverse mn:"]
    a, b = ["cba", "yx", "q", "nm"], ["abc", "xyz", "srq", "m"]
    ab = judge.compare(prompts, a, b, {})
    assert judge.compare(prompts, b, a, {}) == [-o for o in ab]
    assert judge.compare(prompts, a, a, {}) == [0, 0, 0, 0]


def test_build_judge_specs(tiny_model_dir, tmp_path):
    rs = RewardSet([RewardFunction(name="r", fn=get_task("reverse").reward, weight=1.0)])
    assert isinstance(build_judge("verifier", rs), VerifierJudge)
    assert isinstance(build_judge(f"llm:{tiny_model_dir}", None), LLMJudge)
    with pytest.raises(ConfigError, match="--judge: unknown judge 'magic'"):
        build_judge("magic", rs)
    with pytest.raises(ConfigError, match="verifier judge needs"):
        build_judge("verifier", None)
    with pytest.raises(ModelError, match="no config.json"):
        build_judge(f"reward-model:{tmp_path}", rs)


def test_resolve_target_kinds(tmp_path, tiny_model_dir):
    assert resolve_target(tiny_model_dir).model_dir == tiny_model_dir
    ckpt = tmp_path / "run" / "checkpoints" / "step-00000003"
    shutil.copytree(tiny_model_dir, ckpt / "model")
    partial = tmp_path / "run" / "checkpoints" / "step-00000009"  # no COMPLETE marker: ignored
    shutil.copytree(tiny_model_dir, partial / "model")
    (ckpt / "COMPLETE").write_text("step 3\n")
    assert resolve_target(tmp_path / "run").model_dir == ckpt / "model"
    assert resolve_target(ckpt).model_dir == ckpt / "model"
    best = tmp_path / "run" / "best"  # checkpoint.best_metric's folder: its run's config and prompts
    shutil.copytree(tiny_model_dir, best)
    (best / "best.json").write_text('{"step": 3}\n')
    assert resolve_target(best).model_dir == best and resolve_target(best).run_dir == tmp_path / "run"
    with pytest.raises(ModelError, match="no such run"):
        resolve_target(tmp_path / "missing")
    with pytest.raises(ModelError, match="not a run folder, checkpoint, model folder or export folder"):
        resolve_target(tmp_path)


def test_a_policy_folder_given_as_a_reward_model_is_named_for_what_it_is(tiny_model_dir):
    """A causal LM would load with a random one-output head (or "2 outputs"): refuse it by its kind."""
    from tandem.errors import ModelError

    with pytest.raises(
        ModelError, match=r"is a language model \(\w+ForCausalLM\), not a reward model.*llm:PATH"
    ):
        RewardModelJudge(str(tiny_model_dir))
