"""DPO: batched log-probs equal the per-row loop, the reference is used once and cached (never
loaded again), the first step's loss is log 2 (policy == reference), and training separates pairs."""

from __future__ import annotations

import math
import os

import pytest
import torch

from tandem.data.preference import PreferencePair
from tandem.models import load_causal_lm, load_tokenizer
from tandem.train import dpo


def toy_pairs(n: int, offset: int = 0) -> list[PreferencePair]:
    return [PreferencePair(f"q{i + offset}:", "yes", "no way", where=f"row {i}") for i in range(n)]


@pytest.fixture()
def model_tok(tiny_model_dir):
    torch.manual_seed(0)
    return load_causal_lm(tiny_model_dir), load_tokenizer(tiny_model_dir)


def test_batched_sequence_logps_equal_row_by_row(model_tok):
    model, tok = model_tok
    pairs = [PreferencePair("a", "bcd", "e", "w"), PreferencePair("longer prompt", "x", "yz yz", "w")]
    with torch.no_grad():
        c, r = dpo.sequence_logps(model, tok, pairs)
        for i, p in enumerate(pairs):
            ci, ri = dpo.sequence_logps(model, tok, [p])
            assert c[i] == pytest.approx(float(ci[0]), abs=1e-4) and r[i] == pytest.approx(
                float(ri[0]), abs=1e-4
            )


def test_shared_prefix_gives_the_same_logps_and_gradients(model_tok, monkeypatch):
    """Chosen and rejected share their prompt's forward (one prompt pass per pair): same log-probs and
    gradients as two full rows, and the shared path really runs."""
    from tandem.models import forward

    model, tok = model_tok
    pairs = [PreferencePair("a", "bcd", "e", "w"), PreferencePair("longer prompt", "x", "yz yz", "w")]
    pairs += toy_pairs(3)
    grads, sums = {}, {}
    calls = []
    real = forward._shared_prefix_logprobs
    monkeypatch.setattr(forward, "_shared_prefix_logprobs", lambda *a, **k: calls.append(1) or real(*a, **k))
    for shared in (False, True):
        model.zero_grad()
        summed, _ = dpo._summed_logps(model, tok, pairs, shared)  # [2B]
        (summed * torch.linspace(0.5, 1.5, len(summed))).sum().backward()
        sums[shared] = summed.detach()
        grads[shared] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    assert calls == [1]  # only the shared run took the one-prompt-pass path
    torch.testing.assert_close(sums[True], sums[False], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads[True], grads[False], rtol=1e-4, atol=1e-6)


def test_reference_is_cached_and_not_reloaded(model_tok, tmp_path):
    model, tok = model_tok
    pairs = toy_pairs(5)
    loads = []

    def load_ref():
        loads.append(1)
        return model

    cache = tmp_path / "ref.safetensors"
    first = dpo.cached_reference_logps(cache, load_ref, tok, pairs, "ref-id")
    again = dpo.cached_reference_logps(cache, lambda: pytest.fail("reference reloaded"), tok, pairs, "ref-id")
    assert loads == [1] and first.shape == (5, 2) and torch.equal(first, again)
    dpo.cached_reference_logps(cache, load_ref, tok, toy_pairs(4), "ref-id")  # different data: recompute
    dpo.cached_reference_logps(cache, load_ref, tok, toy_pairs(4), "other-ref")  # different reference
    assert loads == [1, 1, 1]


def test_training_separates_pairs_without_a_reference_model(model_tok):
    model, tok = model_tok
    train, val = toy_pairs(32), toy_pairs(16, offset=100)
    ref_train = dpo.reference_logps(model, tok, train)
    ref_val = dpo.reference_logps(model, tok, val)
    settings = dpo.DPOSettings(beta=0.5, lr=5e-3, batch_size=8, epochs=3, warmup_steps=1)
    history = dpo.train_dpo(model, tok, train, ref_train, settings)
    assert len(history) == dpo.total_steps(32, settings) == 12
    assert history[0]["loss"] == pytest.approx(math.log(2), abs=1e-4)  # policy == reference at step 1
    assert history[0]["rewards/margins"] == pytest.approx(0.0, abs=1e-5)
    assert set(history[0]) >= {"rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"}
    held_out = dpo.implicit_reward_metrics(model, tok, val, ref_val, settings.beta)
    assert held_out["rewards/accuracies"] == 1.0 and held_out["rewards/margins"] > 0


def test_shape_mismatch_is_an_error(model_tok):
    model, tok = model_tok
    with pytest.raises(Exception, match=r"expected \(3, 2\)"):
        dpo.train_dpo(model, tok, toy_pairs(3), torch.zeros(2, 2), dpo.DPOSettings())
    assert dpo.total_steps(10, dpo.DPOSettings(batch_size=4, epochs=2, max_steps=5)) == 5


def test_online_dpo_moves_the_policy_towards_the_judge(model_tok):
    """Rounds of sample -> judge (prefers more digits) -> DPO raise the share of digits sampled."""
    from tandem.rollout import HFEngine, SamplingParams
    from tandem.train.labeling import RuleJudge

    model, tok = model_tok
    rows = [{"prompt": f"p{i}:"} for i in range(32)]
    judge = RuleJudge(lambda prompt, completion, row: sum(c.isdigit() for c in completion))

    def digit_share() -> float:
        batch = HFEngine(model, tok, add_special_tokens=False).generate(
            [r["prompt"] for r in rows], SamplingParams(max_new_tokens=8, temperature=1.0, n=4, seed=123)
        )
        text = "".join(batch.completions)
        return sum(c.isdigit() for c in text) / max(1, len(text))

    before = digit_share()
    settings = dpo.DPOSettings(beta=0.1, lr=5e-3, batch_size=8, epochs=2, warmup_steps=1)
    history = dpo.online_dpo(
        model, tok, rows, judge, settings, dpo.OnlineDPOSettings(rounds=3, max_new_tokens=8)
    )
    assert [h["round"] for h in history] == [1.0, 2.0, 3.0]
    assert all(h["label/kept"] + h["label/tie"] + h["label/disagree"] == 32 for h in history)
    assert history[0]["label/kept"] > 0 and "rewards/accuracies" in history[0]
    after = digit_share()
    assert after > before + 0.05, (before, after)


@pytest.mark.parametrize("normalize", [False, True])
def test_length_normalize_passes_each_completions_token_count_to_the_loss(model_tok, monkeypatch, normalize):
    """`length_normalize` (TRL's ipo / sigmoid_norm convention) hands the loss each completion's token
    count; the default keeps summed log-ratios (no lengths)."""
    model, tok = model_tok
    seen = []
    real = dpo.dpo_loss
    monkeypatch.setattr(dpo, "dpo_loss", lambda *a, **k: seen.append(k.get("lengths")) or real(*a, **k))
    settings = dpo.DPOSettings(loss_type="ipo", length_normalize=normalize, batch_size=4, max_steps=1)
    dpo.train_dpo(model, tok, toy_pairs(4), torch.zeros(4, 2), settings)
    assert len(seen) == 1
    if not normalize:
        assert seen[0] is None
        return
    chosen, rejected = seen[0]
    assert chosen.shape == rejected.shape == (4,)
    assert bool((chosen < rejected).all())  # "yes" is shorter than "no way" in every pair


def test_unknown_dpo_loss_type_names_the_valid_ones(tmp_path):
    from tandem.config.rlhf import DPOConfig

    with pytest.raises(ValueError, match="valid: .*ipo"):
        DPOConfig(model="m", out_dir=str(tmp_path / "o"), data={"train_file": "x.jsonl"}, loss_type="nope")


def test_reference_retrained_in_place_is_scored_again(model_tok, tmp_path):
    """The cache key covers the reference folder's weights, not only its path: a model folder rewritten
    in place (same path, new weights) must not reuse the old weights' log-probs."""
    model, tok = model_tok
    pairs = toy_pairs(3)
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    weights = ref_dir / "model.safetensors"
    weights.write_bytes(b"old weights")
    loads = []

    def load_ref():
        loads.append(1)
        return model

    cache = tmp_path / "out.ref_logps.safetensors"
    dpo.cached_reference_logps(cache, load_ref, tok, pairs, str(ref_dir))
    dpo.cached_reference_logps(cache, load_ref, tok, pairs, str(ref_dir))  # unchanged folder: reused
    assert loads == [1]
    weights.write_bytes(b"new weights!")  # retrained in place
    dpo.cached_reference_logps(cache, load_ref, tok, pairs, str(ref_dir))
    assert loads == [1, 1]
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # same size, rewritten
    dpo.cached_reference_logps(cache, load_ref, tok, pairs, str(ref_dir))
    assert loads == [1, 1, 1]
