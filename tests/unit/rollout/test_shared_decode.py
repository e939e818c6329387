"""``shared_decode``: a decode step runs one forward per distinct unfinished row (same prompt, same tokens so
far) and gives its logits to every such row — the same samples and log-probs as running every row."""

from __future__ import annotations

import copy

import pytest
import torch

from tandem.models import init_tiny_model, load_causal_lm, load_tokenizer
from tandem.rollout import HFEngine, SamplingParams
from tandem.rollout.hf import advance_states
from tandem.rollout.llama_decode import LlamaStepper
from tandem.rollout.stepper import HFStepper


@pytest.fixture(scope="module")
def ab_model(tmp_path_factory):
    """Three characters ('ab '), so a prompt's samples share their first tokens often."""
    path = init_tiny_model(
        tmp_path_factory.mktemp("ab") / "m", hidden_size=32, num_layers=2, num_heads=2, chars="ab "
    )
    return load_causal_lm(path), load_tokenizer(path)


def _rows_per_step(monkeypatch, cls) -> list[int]:
    """Record the batch size of every decode step of stepper class ``cls``."""
    seen: list[int] = []
    real = cls.step

    def step(self, ids, attention_mask, position_ids):
        seen.append(int(ids.shape[0]))
        return real(self, ids, attention_mask, position_ids)

    monkeypatch.setattr(cls, "step", step)
    return seen


PARAMS = {
    "one": SamplingParams(max_new_tokens=10, temperature=1.0, n=8, seed=3, stop=["ba"]),
    "per_prompt": [
        SamplingParams(max_new_tokens=6, temperature=0.7, n=8, seed=1),
        SamplingParams(max_new_tokens=10, temperature=1.2, n=3, seed=2, stop=[" b"], top_k=2),
        SamplingParams(max_new_tokens=4, temperature=0.0, n=2, seed=4),
    ],
}


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "generic"])
@pytest.mark.parametrize("params", sorted(PARAMS))
def test_shared_decode_equals_every_row(ab_model, monkeypatch, fast, params):
    model, tok = ab_model
    prompts = ["a", "ba ", "a"]  # the first and last prompt are the same text in two groups
    cls = LlamaStepper if fast else HFStepper
    seen = _rows_per_step(monkeypatch, cls)
    plain = HFEngine(model, tok, fast_decode=fast, shared_decode=False).generate(prompts, PARAMS[params])
    plain_rows, seen[:] = sum(seen), []
    shared = HFEngine(model, tok, fast_decode=fast, shared_decode=True).generate(prompts, PARAMS[params])
    assert torch.equal(shared.response_ids, plain.response_ids)
    assert shared.completions == plain.completions and shared.finish_reasons == plain.finish_reasons
    torch.testing.assert_close(shared.behavior_logprobs, plain.behavior_logprobs, atol=1e-5, rtol=0)
    assert sum(seen) < plain_rows  # samples that had not diverged (and finished rows) ran once or never


class _Cache:
    """A stepper stand-in that records which cache rows each ``select`` kept."""

    def __init__(self, can: bool = True) -> None:
        self.can, self.selected = can, []

    def select(self, index):
        self.selected.append(index.tolist())
        return self.can


def test_advance_states_merges_rows_with_one_state_and_token():
    stepper = _Cache()
    state = torch.tensor([0, 0, 0, 3, 3, 5])  # two prompts' runs in a 6-row cache, row 5 on its own
    token = torch.tensor([7, 8, 7, 7, 7, 7])
    alive = torch.tensor([True, True, True, True, False, True])
    new_state, reps = advance_states(stepper, state, token, alive, cache_rows=6)
    assert reps.tolist() == [0, 1, 3, 5]  # a row of each new state, in row order
    assert stepper.selected == [[0, 0, 3, 5]]  # each new state's parent row; row 4 (finished) dropped
    assert new_state[alive].tolist() == [0, 1, 0, 2, 3]


def test_advance_states_leaves_an_unchanged_cache_alone():
    stepper = _Cache()
    state = torch.tensor([0, 1, 2])
    out = advance_states(stepper, state, torch.tensor([4, 4, 4]), torch.ones(3, dtype=torch.bool), 3)
    assert out is not None and out[0].tolist() == [0, 1, 2] and stepper.selected == []


def test_a_cache_that_cannot_select_rows_runs_every_row():
    stepper = _Cache(can=False)
    state, token = torch.tensor([0, 0]), torch.tensor([1, 1])
    assert advance_states(stepper, state, token, torch.ones(2, dtype=torch.bool), 2) is None


def test_engine_falls_back_when_the_cache_cannot_select(ab_model, monkeypatch):
    model, tok = ab_model
    monkeypatch.setattr(HFStepper, "select", lambda self, index: False)
    params = SamplingParams(max_new_tokens=8, temperature=1.0, n=6, seed=5)
    plain = HFEngine(model, tok, fast_decode=False, shared_decode=False).generate(["a", "b"], params)
    shared = HFEngine(model, tok, fast_decode=False).generate(["a", "b"], params)
    assert torch.equal(shared.response_ids, plain.response_ids)


def test_shared_decode_on_a_lora_wrapped_policy(ab_model, monkeypatch):
    """A PEFT-wrapped policy (the LoRA recipe's engine model) decodes through Hugging Face's cache: its
    rows are selected there, with the same samples as running every row."""
    pytest.importorskip("peft")
    from tandem.models.lora import apply_lora

    model, tok = ab_model
    torch.manual_seed(0)
    base = copy.deepcopy(model)  # PEFT injects its layers into the model it wraps: keep the fixture's plain
    policy = apply_lora(base, r=2, alpha=4, dropout=0.0, target_modules=["q_proj", "v_proj"])
    with torch.no_grad():  # a trained adapter: B != 0, so the samples depend on it
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5)
    seen = _rows_per_step(monkeypatch, HFStepper)
    params = PARAMS["one"]
    plain = HFEngine(policy, tok, shared_decode=False).generate(["a", "ba "], params)
    plain_rows, seen[:] = sum(seen), []
    shared = HFEngine(policy, tok, shared_decode=True).generate(["a", "ba "], params)
    assert plain_rows > 0  # the generic path ran, not the fast Llama one
    assert torch.equal(shared.response_ids, plain.response_ids)
    torch.testing.assert_close(shared.behavior_logprobs, plain.behavior_logprobs, atol=1e-5, rtol=0)
    assert sum(seen) < plain_rows
