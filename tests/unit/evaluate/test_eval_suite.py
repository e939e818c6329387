"""The eval suite: pass@k, greedy metrics equal to the training loop's held-out eval, KL to a reference."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch

from tandem.evaluate import evaluate_prompts
from tandem.evaluate.suite import EvalSettings, evaluate_suite, kl_to_reference, pass_at_k
from tandem.models import init_tiny_model, load_causal_lm, load_tokenizer
from tandem.rewards import RewardFunction, RewardSet, get_task
from tandem.rollout.base import SamplingParams
from tandem.rollout.hf import HFEngine


@pytest.mark.parametrize("n,c,k", [(8, 0, 1), (8, 3, 1), (8, 3, 4), (5, 2, 5), (6, 6, 2), (7, 1, 3)])
def test_pass_at_k_equals_enumeration(n, c, k):
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    expected = sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(expected)
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("suite")
    a = init_tiny_model(root / "a", hidden_size=32, num_layers=2, num_heads=2, seed=0)
    b = init_tiny_model(root / "b", hidden_size=32, num_layers=2, num_heads=2, seed=1)
    task = get_task("reverse", min_len=2, max_len=3)
    rows = task.make_rows("test", 12, 0)
    rewards = RewardSet([RewardFunction(name="reverse", fn=task.reward, weight=1.0)])
    return a, b, rows, rewards


def test_greedy_metrics_equal_heldout_eval(setup):
    a, _, rows, rewards = setup
    model = load_causal_lm(a)
    engine = HFEngine(model, load_tokenizer(a))
    ref = evaluate_prompts(engine, rows, rewards, SamplingParams(max_new_tokens=5, temperature=0.0))
    progress = []
    got = evaluate_suite(
        engine,
        rows,
        rewards,
        EvalSettings(max_new_tokens=5, samples=4, pass_k=(1, 2, 4, 8)),
        on_progress=lambda d, t: progress.append((d, t)),
    )
    for key, value in ref.items():
        assert got[key] == value
    assert ref["eval/num_prompts"] == 12  # the count the diagnosis' noise is computed on
    assert "sampled/pass@4" in got and "sampled/pass@8" not in got  # k > samples is left out
    assert got["sampled/pass@1"] == pytest.approx(got["sampled/accuracy"])
    assert got["sampled/pass@1"] <= got["sampled/pass@2"] <= got["sampled/pass@4"]
    assert progress[-1] == (24, 24)  # greedy + sampled passes over 12 prompts
    assert got["eval/length_p50"] <= got["eval/length_p90"] <= got["eval/length_max"] <= 5


def _first_token_dists(p_model, q_model, tok, prompts):
    """Exact next-token log-distributions of both models after each prompt: ``[N, V]`` each."""
    enc = tok(prompts, return_tensors="pt", padding=True)
    pos = (enc["attention_mask"].cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        lp = torch.log_softmax(p_model(**enc, position_ids=pos).logits[:, -1].float(), -1)  # [N, V]
        lq = torch.log_softmax(q_model(**enc, position_ids=pos).logits[:, -1].float(), -1)  # [N, V]
    return enc, lp, lq


def test_kl_monte_carlo_matches_exact_on_one_token(setup):
    a, b, rows, _ = setup
    pa, pb, tok = load_causal_lm(a), load_causal_lm(b), load_tokenizer(a)
    prompts = [r["prompt"] for r in rows[:4]]
    enc, lp, lq = _first_token_dists(pa, pb, tok, prompts)
    exact = float((lp.exp() * (lp - lq)).sum(-1).mean())  # KL(p‖q) averaged over prompts
    # One-token responses sampled from p exactly: [N * m, 1], prompts repeated m times.
    m = 1024
    gen = torch.Generator().manual_seed(0)
    resp = torch.multinomial(lp.exp(), m, replacement=True, generator=gen).reshape(-1, 1)  # [N*m, 1]
    batch = SimpleNamespace(
        prompt_ids=enc["input_ids"].repeat_interleave(m, 0),
        prompt_mask=enc["attention_mask"].bool().repeat_interleave(m, 0),
        response_ids=resp,
        response_mask=torch.ones_like(resp, dtype=torch.bool),
    )
    mc = kl_to_reference(pa, pb, [batch], temperature=1.0)
    assert exact > 0.005
    # Both estimators are unbiased for one-token responses; k3 has far lower variance.
    assert mc["kl/seq_mean"] == pytest.approx(exact, rel=0.3)
    assert mc["kl/token_k3_mean"] == pytest.approx(exact, rel=0.1)
    assert kl_to_reference(pa, pa, [batch], temperature=1.0) == {"kl/seq_mean": 0.0, "kl/token_k3_mean": 0.0}
