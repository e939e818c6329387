"""HFEngine: greedy equals HF generate, behaviour log-probs equal the trainer's recomputation, padding
invariance, stop strings and EOS, grouping, seeding, versioned weights. Every behavioural test runs on
both the fast Llama stepper and the generic HF-forward stepper."""

from __future__ import annotations

import pytest
import torch

from tandem.errors import DataError, ModelError
from tandem.models import init_tiny_model, load_causal_lm, load_tokenizer, response_logprobs
from tandem.rollout import HFEngine, RolloutEngine, SamplingParams

PROMPTS = ["12+7=", "hello world", "a", "The quick brown fox "]


@pytest.fixture(scope="module")
def model_and_tok(tiny_model_dir):
    return load_causal_lm(tiny_model_dir), load_tokenizer(tiny_model_dir)


@pytest.fixture(params=[None, False], ids=["fast", "generic"])
def engine(request, model_and_tok):
    model, tok = model_and_tok
    return HFEngine(model, tok, fast_decode=request.param)


@pytest.fixture(scope="module")
def ab_engine(tmp_path_factory):
    """A model over the alphabet 'ab ' so that random text hits multi-character stop strings often."""
    path = init_tiny_model(
        tmp_path_factory.mktemp("ab") / "m", hidden_size=32, num_layers=2, num_heads=2, chars="ab "
    )
    return HFEngine(load_causal_lm(path), load_tokenizer(path))


def test_is_a_rollout_engine(engine):
    assert isinstance(engine, RolloutEngine)


def test_greedy_equals_hf_generate(engine, model_and_tok):
    model, tok = model_and_tok
    batch = engine.generate(PROMPTS, SamplingParams(max_new_tokens=12, temperature=0.0))
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**enc, do_sample=False, max_new_tokens=12, pad_token_id=tok.pad_token_id)
    expected = tok.batch_decode(out[:, enc.input_ids.shape[1] :], skip_special_tokens=True)
    assert batch.completions == expected
    for row, text in zip(batch.response_ids, expected, strict=True):
        assert tok.decode(row, skip_special_tokens=True) == text


def test_greedy_with_a_repetition_penalty_equals_hf_generate(engine, model_and_tok):
    """The penalty covers the prompt's tokens and the ones generated so far, as in Hugging Face (and
    vLLM); per prompt (one SamplingParams each) too, beside a prompt without it."""
    model, tok = model_and_tok
    params = SamplingParams(max_new_tokens=12, temperature=0.0, repetition_penalty=1.8)
    batch = engine.generate(PROMPTS, params)
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(
            **enc, do_sample=False, max_new_tokens=12, pad_token_id=tok.pad_token_id, repetition_penalty=1.8
        )
    expected = tok.batch_decode(out[:, enc.input_ids.shape[1] :], skip_special_tokens=True)
    assert batch.completions == expected
    plain = engine.generate(PROMPTS, SamplingParams(max_new_tokens=12, temperature=0.0)).completions
    assert plain != expected  # the penalty changed something, so the equality above says something
    mixed = engine.generate(PROMPTS[:2], [params, SamplingParams(max_new_tokens=12, temperature=0.0)])
    assert mixed.completions == [expected[0], plain[1]]


@pytest.mark.parametrize(
    "top", [{}, {"top_k": 20, "top_p": 0.9}, {"min_p": 0.05, "repetition_penalty": 1.3}], ids=str
)
def test_behaviour_logprobs_equal_recomputed(engine, model_and_tok, top):
    model, _ = model_and_tok
    params = SamplingParams(max_new_tokens=16, temperature=0.7, n=2, seed=3, **top)
    batch = engine.generate(PROMPTS, params)
    with torch.no_grad():
        recomputed, _ = response_logprobs(
            model,
            batch.prompt_ids,
            batch.prompt_mask,
            batch.response_ids,
            batch.response_mask,
            temperature=0.7,
        )
    torch.testing.assert_close(batch.behavior_logprobs, recomputed, atol=1e-4, rtol=0)
    assert (batch.behavior_logprobs[~batch.response_mask] == 0).all()
    assert (batch.response_ids[~batch.response_mask] == 0).all()


def test_outputs_are_ordinary_tensors_usable_in_training(engine, model_and_tok):
    model, _ = model_and_tok
    batch = engine.generate(PROMPTS[:2], SamplingParams(max_new_tokens=4, n=2, seed=0))
    tensors = [batch.prompt_ids, batch.response_ids, batch.response_mask, batch.behavior_logprobs]
    assert not any(t.is_inference() for t in tensors)
    model.zero_grad()
    logprobs, _ = response_logprobs(
        model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask
    )
    (logprobs - batch.behavior_logprobs).sum().backward()
    assert model.model.norm.weight.grad is not None
    model.zero_grad()


def test_left_padding_does_not_change_greedy_text(engine):
    params = SamplingParams(max_new_tokens=16, temperature=0.0)
    alone = engine.generate(["a"], params)
    batched = engine.generate(["a", "The quick brown fox jumps over the lazy dog"], params)
    assert batched.prompt_mask[0].sum() == 1 and batched.prompt_ids.shape[1] > 1
    assert alone.completions[0] == batched.completions[0]
    assert torch.equal(alone.response_ids[0], batched.response_ids[0, : alone.response_ids.shape[1]])


def test_eos_ends_rows(engine, model_and_tok):
    _, tok = model_and_tok
    # Near-uniform sampling over 100 tokens: about 1 row in 3 draws EOS within 40 tokens.
    batch = engine.generate(PROMPTS, SamplingParams(max_new_tokens=40, temperature=20.0, n=8, seed=0))
    lengths = batch.response_lengths.tolist()
    stopped = [i for i, reason in enumerate(batch.finish_reasons) if reason == "stop"]
    assert stopped and len(stopped) < batch.batch_size
    for i in range(batch.batch_size):
        ids = batch.response_ids[i, : lengths[i]].tolist()
        assert tok.eos_token_id not in ids[:-1]  # nothing generated after an EOS
        if i in stopped:
            assert ids[-1] == tok.eos_token_id
        else:
            assert lengths[i] == 40
        assert tok.eos_token not in batch.completions[i]


def test_generation_config_eos_ids_also_stop(model_and_tok):
    model, tok = model_and_tok
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    first = HFEngine(model, tok).generate(["a"], greedy).response_ids[0, 0].item()
    old = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [tok.eos_token_id, first]
    try:
        batch = HFEngine(model, tok).generate(["a"], greedy)
    finally:
        model.generation_config.eos_token_id = old
    assert batch.response_lengths.tolist() == [1] and batch.finish_reasons == ["stop"]


@pytest.mark.parametrize("stop", [["b"], ["ab", " b"]])
def test_stop_strings_end_rows_and_are_cut(ab_engine, stop):
    tok = ab_engine.tokenizer
    batch = ab_engine.generate(["a", "ba "], SamplingParams(max_new_tokens=24, n=8, seed=1, stop=stop))
    by_stop_string = 0
    for i in range(batch.batch_size):
        ids = batch.response_ids[i, : batch.response_lengths[i]].tolist()
        full = tok.decode(ids, skip_special_tokens=True)
        assert not any(s in batch.completions[i] for s in stop)
        if batch.finish_reasons[i] == "stop" and ids[-1] != tok.eos_token_id:
            hit = [s for s in stop if full.endswith(s)]
            assert hit, f"row {i} stopped at {full!r} without a stop string"
            assert batch.completions[i] == full[: full.find(hit[0])]
            assert not any(s in full[:-1] for s in stop)  # it stopped at the first occurrence
            by_stop_string += 1
        else:
            assert batch.completions[i] == full
    assert by_stop_string >= 4


def test_groups_extras_versions_and_ids(engine):
    extras = [{"answer": str(i)} for i in range(len(PROMPTS))]
    batch = engine.generate(PROMPTS, SamplingParams(max_new_tokens=4, n=3), group_offset=5, extras=extras)
    assert batch.group_ids.tolist() == [5, 5, 5, 6, 6, 6, 7, 7, 7, 8, 8, 8]
    assert batch.prompts == [p for p in PROMPTS for _ in range(3)]
    assert [e["answer"] for e in batch.extras] == ["0"] * 3 + ["1"] * 3 + ["2"] * 3 + ["3"] * 3
    assert batch.policy_version.tolist() == [engine.version] * 12
    again = engine.generate(PROMPTS, SamplingParams(max_new_tokens=4, n=3))
    assert len(set(batch.sample_ids) | set(again.sample_ids)) == 24
    assert len(batch.finish_reasons) == len(batch.completions) == batch.batch_size == 12


def test_seeded_sampling_is_reproducible(engine):
    params = SamplingParams(max_new_tokens=12, temperature=1.0, n=2, seed=7)
    a, b = engine.generate(PROMPTS, params), engine.generate(PROMPTS, params)
    c = engine.generate(PROMPTS, SamplingParams(max_new_tokens=12, temperature=1.0, n=2, seed=8))
    assert torch.equal(a.response_ids, b.response_ids) and a.completions == b.completions
    assert not torch.equal(a.response_ids, c.response_ids[:, : a.response_ids.shape[1]])


def test_top_k_one_equals_greedy(engine):
    greedy = engine.generate(PROMPTS, SamplingParams(max_new_tokens=10, temperature=0.0))
    top1 = engine.generate(PROMPTS, SamplingParams(max_new_tokens=10, temperature=1.0, top_k=1, seed=0))
    assert torch.equal(greedy.response_ids, top1.response_ids)
    torch.testing.assert_close(greedy.behavior_logprobs, top1.behavior_logprobs)


def test_fast_and_generic_paths_agree(model_and_tok):
    model, tok = model_and_tok
    params = SamplingParams(max_new_tokens=12, temperature=0.9, n=2, seed=11, stop=["e"])
    fast = HFEngine(model, tok, fast_decode=True).generate(PROMPTS, params)
    generic = HFEngine(model, tok, fast_decode=False).generate(PROMPTS, params)
    assert torch.equal(fast.response_ids, generic.response_ids) and fast.completions == generic.completions
    torch.testing.assert_close(fast.behavior_logprobs, generic.behavior_logprobs, atol=1e-5, rtol=0)


def test_prompt_too_long_names_index_and_lengths(model_and_tok):
    model, tok = model_and_tok
    engine = HFEngine(model, tok, max_prompt_len=8)
    with pytest.raises(DataError, match=r"prompt 1 has 11 tokens, more than max_prompt_len=8"):
        engine.generate(["short", "hello world"], SamplingParams(max_new_tokens=2))
    with pytest.raises(DataError, match="prompt 0 is empty"):
        engine.generate([""], SamplingParams(max_new_tokens=2))
    with pytest.raises(DataError, match="extras"):
        engine.generate(["a"], SamplingParams(max_new_tokens=2), extras=[{}, {}])


def test_train_mode_restored(engine):
    engine.model.train()
    engine.generate(["a"], SamplingParams(max_new_tokens=2))
    assert engine.model.training
    engine.model.eval()
    engine.generate(["a"], SamplingParams(max_new_tokens=2))
    assert not engine.model.training


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "generic"])
def test_only_the_generic_path_switches_to_eval_mode(model_and_tok, monkeypatch, fast):
    """The HF forward reads each module's mode (dropout), so the generic path decodes in eval mode; the fast
    Llama stepper reads none, and skips the two walks over every module."""
    model, tok = model_and_tok
    modes: list[bool] = []
    real = type(model).train
    monkeypatch.setattr(type(model), "train", lambda self, mode=True: modes.append(mode) or real(self, mode))
    model.train()
    modes.clear()
    HFEngine(model, tok, fast_decode=fast).generate(["a"], SamplingParams(max_new_tokens=3))
    assert modes == ([] if fast else [False, True]) and model.training


def test_update_weights(tiny_model_dir):
    model, tok = load_causal_lm(tiny_model_dir), load_tokenizer(tiny_model_dir)
    engine = HFEngine(model, tok)
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    before = engine.generate(PROMPTS, greedy)
    engine.update_weights(None, 3)
    assert engine.version == 3 and engine.generate(["a"], greedy).policy_version.tolist() == [3]
    # a seeded perturbation: with the global RNG, about 1 draw in 10 left all four greedy answers unchanged
    gen = torch.Generator().manual_seed(1)
    new_state = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in model.state_dict().items()}
    engine.update_weights(new_state, 4)
    assert engine.version == 4
    assert torch.equal(model.model.norm.weight, new_state["model.norm.weight"])
    assert not torch.equal(engine.generate(PROMPTS, greedy).response_ids, before.response_ids)
    with pytest.raises(ModelError, match="do not match"):
        engine.update_weights({"bogus": torch.zeros(1)}, 5)
    assert engine.version == 4


def test_fast_decode_required_but_unsupported(model_and_tok):
    model, tok = model_and_tok

    class Other(torch.nn.Module):
        config = None

        def forward(self, **kwargs):  # pragma: no cover - never reached
            raise AssertionError

    engine = HFEngine(model, tok, fast_decode=True)
    engine.model = Other()
    engine.model.register_parameter("w", torch.nn.Parameter(torch.zeros(1)))
    with pytest.raises(ModelError, match="fast_decode=True"):
        engine.generate(["a"], SamplingParams(max_new_tokens=2))


def test_in_flight_weight_update_between_chunks(tiny_model_dir, tmp_path):
    """``on_chunk`` runs every ``chunk_tokens`` tokens; weights loaded there sample the following tokens
    (earlier tokens are unchanged), and ``policy_version`` keeps the version the generation started with."""
    other = load_causal_lm(
        init_tiny_model(tmp_path / "other", hidden_size=32, num_layers=2, num_heads=2, seed=123)
    ).state_dict()
    params = SamplingParams(max_new_tokens=12, temperature=1.0, n=2, seed=5)

    def fresh() -> HFEngine:
        return HFEngine(load_causal_lm(tiny_model_dir), load_tokenizer(tiny_model_dir), version=3)

    base = fresh().generate(PROMPTS, params)
    same_engine = fresh()
    calls: list[int] = []
    same = same_engine.generate(
        PROMPTS, params, on_chunk=lambda: calls.append(1), chunk_tokens=4
    )  # a no-op callback changes nothing
    assert torch.equal(same.response_ids, base.response_ids) and len(calls) >= 1

    engine = fresh()

    def swap() -> None:
        if engine.version == 3:
            engine.update_weights(other, 4)

    swapped = engine.generate(PROMPTS, params, on_chunk=swap, chunk_tokens=4)
    assert torch.equal(swapped.response_ids[:, :4], base.response_ids[:, :4])
    assert torch.equal(swapped.behavior_logprobs[:, :4], base.behavior_logprobs[:, :4])
    later = swapped.response_mask[:, 4:] & base.response_mask[:, 4:]
    assert not torch.allclose(swapped.behavior_logprobs[:, 4:][later], base.behavior_logprobs[:, 4:][later])
    assert swapped.policy_version.tolist() == [3] * swapped.batch_size
    assert engine.version == 4
