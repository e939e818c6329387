"""LoRA (PEFT) on the policy: off changes nothing; on, only adapters train, the reference is the exact base,
engines and exports get merged weights, checkpoints hold the adapter and restore it exactly."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("peft")

from tandem.config.model import ModelConfig  # noqa: E402
from tandem.config.schema import TrainerConfig  # noqa: E402
from tandem.errors import ModelError  # noqa: E402
from tandem.models import load_causal_lm, load_tokenizer, response_logprobs  # noqa: E402
from tandem.models.lora import (  # noqa: E402
    AdapterDisabled,
    adapter_state_dict,
    apply_lora,
    engine_state_dict,
    is_lora,
    merged_model,
    publishable_entries,
    publishable_state_dict,
)
from tandem.orchestration.build import build_policy, build_reference  # noqa: E402
from tandem.rollout import EngineSpec, SamplingParams, build_engine  # noqa: E402
from tandem.train.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from tandem.train.optim import build_optimizer  # noqa: E402

LORA = {"r": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": "all-linear"}
PROMPTS = ["12+7=", "3+45=", "hello", "ab"]
GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0)


def _lora_policy(path, seed: int = 0, **lora):
    torch.manual_seed(seed)
    policy, _ = build_policy(ModelConfig(path=str(path), lora={**LORA, **lora}))
    return policy


def _trained(policy, seed: int = 1, scale: float = 0.3):
    """The adapter as after some updates: B no longer zero, so the policy differs from its base."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    return policy


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, 30, (4, 5), generator=g)
    response = torch.randint(3, 30, (4, 3), generator=g)
    pmask, rmask = torch.ones_like(prompt, dtype=torch.bool), torch.ones_like(response, dtype=torch.bool)
    pmask[0, :2] = False  # left padding
    rmask[1, 2:] = False  # right padding
    return prompt, pmask, response, rmask


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_lora_off_is_the_plain_model_and_its_own_state_dict(tiny_model_dir):
    policy, _ = build_policy(ModelConfig(path=str(tiny_model_dir)))
    assert not is_lora(policy) and not ModelConfig(path="x").lora.enabled
    state, own = publishable_state_dict(policy), policy.state_dict()
    assert state.keys() == own.keys() and all(state[k].data_ptr() == own[k].data_ptr() for k in own)
    assert all(p.requires_grad for p in policy.parameters())
    ref = build_reference(ModelConfig(path=str(tiny_model_dir)), 0.1, policy=policy)
    assert ref is not policy and not isinstance(ref, AdapterDisabled)  # a loaded copy, as before


def test_only_adapter_parameters_are_trainable_get_gradients_and_reach_the_optimizer(tiny_model_dir):
    policy = _trained(_lora_policy(tiny_model_dir))
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    opt = build_optimizer(policy, TrainerConfig())
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    assert in_opt == {id(p) for n, p in policy.named_parameters() if n in trainable}
    policy.train()
    lp, _ = response_logprobs(policy, *_batch())
    lp.sum().backward()
    for name, p in policy.named_parameters():
        if name in trainable:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
        else:
            assert p.grad is None, name


def test_a_fresh_adapter_computes_the_base_model(tiny_model_dir):
    base, policy = load_causal_lm(tiny_model_dir), _lora_policy(tiny_model_dir)
    ids = _batch()[0]
    torch.testing.assert_close(_logits(policy, ids), _logits(base, ids), rtol=0, atol=0)


def test_reference_is_the_base_with_the_adapter_disabled_exactly(tiny_model_dir):
    base = load_causal_lm(tiny_model_dir)
    policy = _trained(_lora_policy(tiny_model_dir))
    policy.train()
    ref = build_reference(ModelConfig(path=str(tiny_model_dir), lora=LORA), 0.1, policy=policy)
    assert isinstance(ref, AdapterDisabled) and list(ref.parameters()) == []  # no second copy
    ref.eval()
    ref.requires_grad_(False)
    assert policy.training and any(p.requires_grad for p in policy.parameters())  # untouched
    batch = _batch()
    with torch.no_grad():
        want, _ = response_logprobs(base, *batch)
        got, _ = response_logprobs(ref, *batch)
        shared, _ = response_logprobs(ref, *(t.repeat_interleave(2, 0) for t in batch), share_prefix=True)
        pol, _ = response_logprobs(policy, *batch)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(shared[::2], want, rtol=0, atol=1e-5)  # the KV-cache path runs too
    assert (pol - want).abs().max() > 1e-3  # and the policy itself is not the base
    assert policy.training  # the reference pass restored the policy's mode


def test_publishable_state_dict_is_the_merged_model_under_base_names(tiny_model_dir):
    base = load_causal_lm(tiny_model_dir)
    policy = _trained(_lora_policy(tiny_model_dir))
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    state = publishable_state_dict(policy)
    assert state.keys() == base.state_dict().keys()
    base.load_state_dict(state, strict=True)
    ids = _batch()[0]
    torch.testing.assert_close(_logits(base, ids), _logits(policy, ids), rtol=0, atol=1e-5)
    after = policy.state_dict()  # the training module is not merged or changed
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    torch.testing.assert_close(_logits(merged_model(policy), ids), _logits(policy, ids), rtol=0, atol=1e-5)


def test_streamed_publishable_entries_are_the_publishable_state_dict(tiny_model_dir):
    """What a sharded learner publishes from its entries gathered one at a time: the same names and,
    bitwise, the same tensors as the whole merged state dict; an entry stream cut short is an error."""
    policy = _trained(_lora_policy(tiny_model_dir))
    entries = list(policy.state_dict().items())
    streamed = dict(publishable_entries(policy, iter(entries)))
    whole = publishable_state_dict(policy)
    assert streamed.keys() == whole.keys() and all(torch.equal(streamed[k], whole[k]) for k in whole)
    plain = load_causal_lm(tiny_model_dir)  # without LoRA: the entries themselves
    own = list(plain.state_dict().items())
    assert [(k, v.data_ptr()) for k, v in publishable_entries(plain, iter(own))] == [
        (k, v.data_ptr()) for k, v in own
    ]
    cut = [(k, v) for k, v in entries if not k.endswith("q_proj.lora_B.default.weight")]
    with pytest.raises(ModelError, match="lack parts of the adapted layer"):
        list(publishable_entries(policy, iter(cut)))


def test_hf_engine_generates_with_a_lora_policy_as_with_its_merged_weights(tiny_model_dir):
    policy = _trained(_lora_policy(tiny_model_dir), scale=0.5)
    tok = load_tokenizer(tiny_model_dir)
    shared = build_engine("hf", EngineSpec(model=policy, tokenizer=tok))
    copy = build_engine("hf", EngineSpec(path=str(tiny_model_dir)))  # a worker's own plain model
    assert engine_state_dict(shared, policy) is not None
    shared.update_weights(engine_state_dict(shared, policy), 1)  # its own module: nothing copied
    copy.update_weights(engine_state_dict(copy, policy), 1)  # merged weights under the base names
    a, b = shared.generate(PROMPTS, GREEDY), copy.generate(PROMPTS, GREEDY)
    assert torch.equal(a.response_ids, b.response_ids)
    torch.testing.assert_close(a.behavior_logprobs, b.behavior_logprobs, rtol=0, atol=1e-4)
    fresh = build_engine("hf", EngineSpec(path=str(tiny_model_dir))).generate(PROMPTS, GREEDY)
    assert not torch.equal(a.behavior_logprobs, fresh.behavior_logprobs)  # the adapter matters


def test_checkpoint_holds_the_adapter_and_restores_it_exactly(tiny_model_dir, tmp_path):
    policy = _trained(_lora_policy(tiny_model_dir))
    opt = build_optimizer(policy, TrainerConfig())
    folder = save_checkpoint(
        tmp_path / "ckpt", 1, model=policy, tokenizer=None, optimizer=opt, extra_state={}, config={}
    )
    model_dir = folder / "model"
    assert (model_dir / "adapter_config.json").is_file() and not (model_dir / "config.json").exists()
    other = _lora_policy(tiny_model_dir, seed=5)  # another init: the load must overwrite every tensor
    load_checkpoint(folder, model=other, optimizer=build_optimizer(other, TrainerConfig()))
    want, got = adapter_state_dict(policy), adapter_state_dict(other)
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    ids = _batch()[0]
    torch.testing.assert_close(_logits(other, ids), _logits(policy, ids), rtol=0, atol=0)
    # The folder alone is a model: its base with the adapter merged (eval, serve and export load it so).
    merged = load_causal_lm(model_dir)
    assert not is_lora(merged)
    torch.testing.assert_close(_logits(merged, ids), _logits(policy, ids), rtol=0, atol=1e-5)
    with pytest.raises(ModelError, match="adapter weights do not match") as err:
        load_checkpoint(folder, model=_lora_policy(tiny_model_dir, r=2))
    assert "\n" not in str(err.value)


def test_unknown_target_modules_is_a_one_line_error(tiny_model_dir):
    with pytest.raises(ModelError, match="model.lora.target_modules") as err:
        apply_lora(load_causal_lm(tiny_model_dir), r=2, alpha=4, dropout=0.0, target_modules=["nope"])
    assert "\n" not in str(err.value)
