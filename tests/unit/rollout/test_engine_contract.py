"""The rollout-engine contract: every engine in ``ENGINES`` goes through the same checks, built the way the
trainer and the workers build it (by name, from an ``EngineSpec``). An engine whose package is missing is
skipped with the reason (``pytest -rs`` prints it). A new engine is one module plus one registry line; the
last tests prove the table is the only place a name is looked up.
"""

from __future__ import annotations

import pytest
import torch

from tandem.config import build_config
from tandem.errors import ConfigError, TandemError
from tandem.models import init_tiny_model, load_causal_lm, load_tokenizer, response_logprobs
from tandem.orchestration.build import build_rollout_engine
from tandem.rollout import ENGINES, EngineSpec, RolloutEngine, SamplingParams, build_engine
from tandem.rollout import registry as registry_mod
from tandem.rollout.base import ScoresCompletions
from tandem.rollout.registry import EngineUnavailableError
from tandem.types import RolloutBatch

PROMPTS = ["12+7=", "hello world", "a"]


@pytest.fixture(scope="module")
def ab_model(tmp_path_factory):
    """A tiny model over the alphabet 'ab ' (random text hits stop strings often) and its tokenizer."""
    path = init_tiny_model(
        tmp_path_factory.mktemp("ab") / "m", hidden_size=32, num_layers=2, num_heads=1, chars="ab "
    )
    return path


def _build(name: str, path, **spec) -> RolloutEngine:
    try:
        return build_engine(name, EngineSpec(path=str(path), **spec))
    except EngineUnavailableError as err:
        pytest.skip(f"engine '{name}' not tested: {err}")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny model with head size 32 (hidden 32, one head): the smallest vLLM's CPU attention supports."""
    return init_tiny_model(
        tmp_path_factory.mktemp("contract") / "m", hidden_size=32, num_layers=2, num_heads=1, seed=0
    )


@pytest.fixture(scope="module", params=sorted(ENGINES))
def engine(request, model_dir):
    """One engine per name for the module's tests that only generate (starting vLLM and shutting it down
    costs seconds each): they leave its weights and version alone, so each sees what a fresh engine would.
    A test that changes the engine takes ``fresh_engine``; teardown checks that none changed the version."""
    eng = _build(request.param, model_dir)
    version = eng.version
    yield eng
    assert eng.version == version, "a test that updates the engine must take the `fresh_engine` fixture"
    eng.close()


@pytest.fixture(params=sorted(ENGINES))
def fresh_engine(request, model_dir):
    """An engine of its own, for the tests that update its weights or close it."""
    eng = _build(request.param, model_dir)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def reference(model_dir):
    """The same weights as a plain torch model, to recompute log-probs."""
    return load_causal_lm(model_dir)


def _recomputed(model, batch: RolloutBatch, temperature: float) -> torch.Tensor:
    with torch.no_grad():
        lp, _ = response_logprobs(
            model,
            batch.prompt_ids,
            batch.prompt_mask,
            batch.response_ids,
            batch.response_mask,
            temperature=temperature,
        )
    return lp


def test_is_a_rollout_engine(engine):
    assert isinstance(engine, RolloutEngine)


def test_shapes_masks_and_finish_reasons(engine):
    batch = engine.generate(PROMPTS, SamplingParams(max_new_tokens=6, n=2, seed=0))
    B, R = batch.response_ids.shape
    assert B == 6 and 1 <= R <= 6 and batch.prompt_ids.shape[0] == B
    assert batch.prompt_mask.dtype == batch.response_mask.dtype == torch.bool
    assert batch.behavior_logprobs.shape == (B, R) and batch.behavior_logprobs.dtype == torch.float32
    lengths = batch.response_mask.sum(1)
    assert torch.equal(batch.response_mask, torch.arange(R) < lengths.unsqueeze(1))  # a prefix per row
    assert (batch.behavior_logprobs[~batch.response_mask] == 0).all()
    assert (batch.behavior_logprobs[batch.response_mask] <= 0).all()
    assert batch.prompt_mask.any(1).all() and batch.prompt_mask[:, -1].all()  # left padded
    for length, reason in zip(lengths.tolist(), batch.finish_reasons, strict=True):
        assert reason in ("stop", "length") and (reason == "stop" or length == 6)
    assert len(batch.completions) == len(batch.prompts) == len(batch.sample_ids) == B


def test_group_ids_extras_and_versions(engine):
    extras = [{"answer": str(i)} for i in range(len(PROMPTS))]
    batch = engine.generate(PROMPTS, SamplingParams(max_new_tokens=3, n=3), group_offset=7, extras=extras)
    assert batch.group_ids.tolist() == [7, 7, 7, 8, 8, 8, 9, 9, 9]
    assert batch.prompts == [p for p in PROMPTS for _ in range(3)]
    assert [e["answer"] for e in batch.extras] == [str(i) for i in range(3) for _ in range(3)]
    assert batch.policy_version.tolist() == [engine.version] * 9
    assert len(set(batch.sample_ids)) == 9


@pytest.mark.parametrize("temperature", [0.7, 0.0])
@pytest.mark.parametrize("top_k", [0, 20])
def test_behaviour_logprobs_match_a_recomputed_forward(engine, reference, temperature, top_k):
    """Log-probs under ``log_softmax(logits / T)`` (raw logits when greedy). An engine that reports the
    top-k-truncated distribution it sampled from (``truncated_logprobs``, vLLM) reports log-probs at least
    as high as the untruncated ones, equal without truncation."""
    params = SamplingParams(max_new_tokens=8, temperature=temperature, n=2, seed=3, top_k=top_k)
    batch = engine.generate(PROMPTS, params)
    recomputed = _recomputed(reference, batch, temperature or 1.0)  # greedy: raw logits
    if top_k and temperature and getattr(engine, "truncated_logprobs", False):
        mask = batch.response_mask
        assert (batch.behavior_logprobs[mask] >= recomputed[mask] - 1e-4).all()
    else:
        torch.testing.assert_close(batch.behavior_logprobs, recomputed, atol=1e-4, rtol=0)


def test_an_engine_that_scores_completions_scores_its_own_samples_as_it_sampled_them(engine):
    """The optional :class:`ScoresCompletions`: teacher-forced log-probs of given tokens equal the
    behaviour log-probs of the same tokens when sampled, 0 on padding — at every temperature, or, for an
    engine that serves one (``scores_only_at_temperature``), there, and a ConfigError elsewhere."""
    if not isinstance(engine, ScoresCompletions):
        pytest.skip(f"{type(engine).__name__} does not score given completions (optional)")
    only = getattr(engine, "scores_only_at_temperature", None)
    for temperature in (1.0, 0.7):
        batch = engine.generate(
            PROMPTS, SamplingParams(max_new_tokens=8, temperature=temperature, n=2, seed=5)
        )
        args = (batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask)
        if only is not None and temperature != only:
            with pytest.raises(ConfigError, match=r"rollout\.temperature"):
                engine.score(*args, temperature=temperature)
            continue
        lp = engine.score(*args, temperature=temperature)
        torch.testing.assert_close(lp, batch.behavior_logprobs, atol=1e-4, rtol=0)
        assert lp.dtype == torch.float32 and (lp[~batch.response_mask] == 0).all()


def test_greedy_is_deterministic_and_seeds_reproduce(engine):
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    a, b = engine.generate(PROMPTS, greedy), engine.generate(PROMPTS, greedy)
    assert torch.equal(a.response_ids, b.response_ids) and a.completions == b.completions
    seeded = SamplingParams(max_new_tokens=8, n=2, seed=11)
    c, d = engine.generate(PROMPTS, seeded), engine.generate(PROMPTS, seeded)
    assert torch.equal(c.response_ids, d.response_ids)


@pytest.mark.parametrize("engine_name", sorted(ENGINES))
def test_stop_strings_end_rows_and_are_cut(engine_name, ab_model):
    engine = _build(engine_name, ab_model)
    tok = load_tokenizer(ab_model)
    stop = ["ab", " b"]
    batch = engine.generate(["a", "ba "], SamplingParams(max_new_tokens=24, n=8, seed=1, stop=stop))
    by_stop = 0
    for i in range(batch.batch_size):
        ids = batch.response_ids[i, : batch.response_lengths[i]].tolist()
        full = tok.decode(ids, skip_special_tokens=True)
        assert not any(s in batch.completions[i] for s in stop)
        if batch.finish_reasons[i] == "stop" and ids[-1] != tok.eos_token_id:
            assert any(full.endswith(s) for s in stop) and not any(s in full[:-1] for s in stop)
            by_stop += 1
    assert by_stop >= 4
    engine.close()


def test_per_prompt_sampling_params(engine, reference):
    """Each prompt keeps its own n, limit, temperature, seed and stop strings in one call."""
    each = [
        SamplingParams(max_new_tokens=3, temperature=0.0),
        SamplingParams(max_new_tokens=9, temperature=0.8, n=3, seed=5, stop=["1"]),
    ]
    batch = engine.generate(PROMPTS[:2], each, group_offset=2)
    assert batch.group_ids.tolist() == [2, 3, 3, 3]
    lengths = batch.response_lengths.tolist()
    assert lengths[0] <= 3 and all(n <= 9 for n in lengths[1:])
    assert batch.finish_reasons[0] == "stop" or lengths[0] == 3
    assert not any("1" in c for c in batch.completions[1:])
    for rows, temperature in (([0], 1.0), ([1, 2, 3], 0.8)):
        sub = batch.select(torch.tensor(rows))
        torch.testing.assert_close(
            sub.behavior_logprobs, _recomputed(reference, sub, temperature), atol=1e-4, rtol=0
        )
    again = engine.generate(PROMPTS[:2], each, group_offset=2)
    assert again.completions == batch.completions  # greedy and seeded prompts reproduce
    alone = engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=3, temperature=0.0))
    assert alone.completions[0] == batch.completions[0]
    with pytest.raises(TandemError, match="sampling params for 3 prompts"):
        engine.generate(PROMPTS, each)


def test_update_weights_changes_outputs_and_version(fresh_engine, tmp_path):
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    before = fresh_engine.generate(PROMPTS, greedy)
    fresh_engine.update_weights(None, 3)
    assert fresh_engine.version == 3 and fresh_engine.generate(["a"], greedy).policy_version.tolist() == [3]
    other = init_tiny_model(tmp_path / "other", hidden_size=32, num_layers=2, num_heads=1, seed=123)
    fresh_engine.update_weights(load_causal_lm(other).state_dict(), 4)
    after = fresh_engine.generate(PROMPTS, greedy)
    assert fresh_engine.version == 4 and after.policy_version.tolist() == [4] * 3
    assert not torch.equal(after.behavior_logprobs, before.behavior_logprobs)  # other weights sampled


def test_in_flight_updates_between_chunks_keep_the_start_version(fresh_engine, tmp_path):
    other = load_causal_lm(
        init_tiny_model(tmp_path / "other", hidden_size=32, num_layers=2, num_heads=1, seed=9)
    ).state_dict()
    fresh_engine.update_weights(None, 1)
    calls = []

    def on_chunk() -> None:
        calls.append(fresh_engine.version)
        if fresh_engine.version == 1:
            fresh_engine.update_weights(other, 2)

    params = SamplingParams(max_new_tokens=12, temperature=2.0, n=2, seed=0)  # hot: rows rarely end early
    batch = fresh_engine.generate(PROMPTS, params, on_chunk=on_chunk, chunk_tokens=2)
    assert calls and calls[0] == 1 and fresh_engine.version == 2
    assert batch.policy_version.tolist() == [1] * batch.batch_size


def test_close_is_idempotent_and_refuses_generation(fresh_engine):
    fresh_engine.close()
    fresh_engine.close()
    with pytest.raises(TandemError):
        fresh_engine.generate(["a"], SamplingParams(max_new_tokens=2))


# -- the table -------------------------------------------------------------------------------------------------


def test_unknown_engine_is_one_line_listing_the_valid_ones(tiny_model_dir, tmp_path):
    cfg = build_config(
        {"model": {"path": str(tiny_model_dir)}, "data": {"task": "arith"}, "rollout": {"backend": "nope"}}
    )
    with pytest.raises(ConfigError) as exc:
        build_rollout_engine(cfg)
    message = str(exc.value)
    assert message.startswith("rollout.backend: unknown rollout engine 'nope'; valid: ")
    assert "hf" in message and "\n" not in message


def test_engine_options_are_validated_by_the_engine(tiny_model_dir):
    cfg = build_config(
        {
            "model": {"path": str(tiny_model_dir)},
            "data": {"task": "arith"},
            "rollout": {"engine_options": {"fast_decod": True}},
        }
    )
    with pytest.raises(ConfigError, match=r"rollout\.engine_options\.fast_decod"):
        build_rollout_engine(cfg)


class CountingEngine:
    """A plug-in engine defined in this test (one class + one table line): the HF engine, counted."""

    calls = 0

    def __init__(self, inner: RolloutEngine) -> None:
        self.inner = inner

    @classmethod
    def from_spec(cls, spec: EngineSpec) -> CountingEngine:
        return cls(build_engine("hf", spec))

    @property
    def version(self) -> int:
        return self.inner.version

    def generate(self, prompts, params, **kwargs):
        CountingEngine.calls += 1
        return self.inner.generate(prompts, params, **kwargs)

    def update_weights(self, state_dict, version):
        self.inner.update_weights(state_dict, version)

    def close(self):
        self.inner.close()


def test_a_registered_engine_is_used_by_a_training_run(tiny_model_dir, tmp_path, monkeypatch):
    from tandem.orchestration.runner import train

    monkeypatch.setitem(registry_mod.ENGINES, "counting", f"{__name__}:CountingEngine")
    CountingEngine.calls = 0
    cfg = build_config(
        {
            "run": {"output_dir": str(tmp_path / "run")},
            "model": {"path": str(tiny_model_dir)},
            "data": {"task": "arith", "prompts_per_step": 2, "eval_size": 2, "train_size": 8},
            "rollout": {"backend": "counting", "n": 2, "max_new_tokens": 2},
            "trainer": {"total_steps": 2},
            "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
        }
    )
    result = train(cfg, progress=False)
    assert result.steps == 2
    assert CountingEngine.calls == 2 + 2  # two steps, evaluation before and after
