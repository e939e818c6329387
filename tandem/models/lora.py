"""LoRA adapters (PEFT) on the policy: wrap the model, view the base as the reference, hand merged weights
to engines and exports, and save/restore only the adapter.

With ``model.lora.r > 0`` the policy is a PEFT ``PeftModelForCausalLM`` whose base weights are frozen, so
the optimiser sees only the adapters (``build_optimizer`` takes trainable parameters). What else changes:

- the reference policy is the same module run under ``disable_adapter()`` (:class:`AdapterDisabled`):
  no second copy of the base in memory;
- engines that keep their own weights (a rollout worker, vLLM) and exports get plain merged weights
  under the base model's names (:func:`publishable_state_dict`): ``W + B @ A * alpha / r`` per adapted
  layer, computed without touching the training module;
- checkpoints hold the adapter (``adapter_model.safetensors`` + ``adapter_config.json``, PEFT's layout),
  and :func:`load_adapter_merged` turns such a folder back into a plain model for eval, serving and export.

``peft`` is imported only when LoRA is used (the ``lora`` extra).
"""

from __future__ import annotations

import copy
import functools
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from tandem.errors import ModelError

ADAPTER_CONFIG = "adapter_config.json"
_LAYER_SUFFIX = ".base_layer"  # PEFT renames an adapted layer's own parameters under this child


def _peft() -> Any:
    try:
        import peft
    except ImportError:
        raise ModelError(
            "model.lora needs the peft package", where="model.lora", hint="pip install 'tandem-rl[lora]'"
        ) from None
    return peft


def is_lora(model: Any) -> bool:
    """Whether ``model`` is a PEFT-wrapped model. Free when peft was never imported (then it cannot be)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def is_adapter_folder(folder: str | Path) -> bool:
    """A PEFT adapter folder (adapter config, no full model config): what a LoRA checkpoint holds."""
    p = Path(folder)
    return (p / ADAPTER_CONFIG).is_file() and not (p / "config.json").is_file()


@functools.cache
def _policy_class() -> type:
    """``PeftModelForCausalLM`` whose ``forward`` names the base model's keywords.

    Why: PEFT's ``forward`` takes ``**kwargs`` and passes them on, so ``logits_to_keep`` and the KV cache
    work, but callers that inspect the signature (``accepts_logits_to_keep``, the HF decode stepper) would
    take the slower full-logits paths. Same computation; only the signature differs."""
    peft = _peft()

    class LoraCausalLM(peft.PeftModelForCausalLM):
        def forward(
            self,
            input_ids: torch.Tensor | None = None,
            attention_mask: torch.Tensor | None = None,
            position_ids: torch.Tensor | None = None,
            past_key_values: Any = None,
            use_cache: bool | None = None,
            logits_to_keep: int | torch.Tensor = 0,
            **kwargs: Any,
        ) -> Any:
            if position_ids is not None:
                kwargs["position_ids"] = position_ids
            if past_key_values is not None:
                kwargs["past_key_values"] = past_key_values
            if use_cache is not None:
                kwargs["use_cache"] = use_cache
            if not (isinstance(logits_to_keep, int) and logits_to_keep == 0):
                kwargs["logits_to_keep"] = logits_to_keep
            return super().forward(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    return LoraCausalLM


def apply_lora(
    model: torch.nn.Module,
    *,
    r: int,
    alpha: float,
    dropout: float,
    target_modules: list[str] | str,
    task_type: str = "CAUSAL_LM",
) -> torch.nn.Module:
    """Wrap ``model`` with a fresh LoRA adapter (``B = 0``: the wrapped model computes what ``model`` did);
    the base weights are frozen, the adapter's are trainable. ``lora_A`` is drawn from torch's global RNG.

    ``task_type="SEQ_CLS"`` (a reward model): PEFT also trains a full copy of the classifier head
    (``score`` / ``classifier``, its ``modules_to_save``), which a fresh head needs."""
    peft = _peft()
    config = peft.LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=target_modules,
        task_type=task_type,
    )
    name = getattr(model, "name_or_path", None)
    if name and Path(name).exists():
        config.base_model_name_or_path = str(Path(name).resolve())  # checkpoints find their base anywhere
    try:
        wrapped = (
            _policy_class()(model, config) if task_type == "CAUSAL_LM" else peft.get_peft_model(model, config)
        )
    except ValueError as err:  # no module matches target_modules
        first = str(err).strip().splitlines()[0]
        raise ModelError(f"cannot add LoRA adapters: {first}", where="model.lora.target_modules") from None
    if config.base_model_name_or_path:
        wrapped.peft_config["default"].base_model_name_or_path = config.base_model_name_or_path
    return wrapped


def adapted_like(policy: torch.nn.Module, base: torch.nn.Module) -> torch.nn.Module:
    """``base`` wrapped with an adapter configured as ``policy``'s (its own adapter weights, to be filled;
    built under ``torch.device("meta")`` it allocates nothing): a plain twin of a LoRA ``policy`` whose
    state-dict names are ``policy``'s."""
    config = copy.deepcopy(policy.peft_config[policy.active_adapter])
    return _policy_class()(base, config)


class AdapterDisabled(torch.nn.Module):
    """The reference policy of a LoRA run: ``policy`` with its adapter switched off — the frozen base.

    The policy is held as a plain attribute, not a submodule, so ``ref.eval()`` or ``ref.requires_grad_(
    False)`` never reach the trained module, and the reference owns no parameters. Each forward runs the
    policy in eval mode under ``disable_adapter()`` and restores its mode after."""

    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "policy", policy)
        self.config = policy.config

    @property
    def dtype(self) -> torch.dtype:
        return next(self.policy.parameters()).dtype

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: Any = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs: Any,
    ) -> Any:
        policy, was_training = self.policy, self.policy.training
        policy.eval()
        try:
            with policy.disable_adapter():
                return policy(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    position_ids=position_ids,
                    past_key_values=past_key_values,
                    use_cache=use_cache,
                    logits_to_keep=logits_to_keep,
                    **kwargs,
                )
        finally:
            policy.train(was_training)


def _base_name(name: str) -> str:
    """``model.layers.0.self_attn.q_proj.base_layer.weight`` -> ``model.layers.0.self_attn.q_proj.weight``."""
    return name.replace(_LAYER_SUFFIX + ".", ".")


@torch.no_grad()
def publishable_state_dict(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights an engine or export should load: ``policy.state_dict()`` itself without LoRA; with
    LoRA, the merged weights under the base model's names (the keys a plain load of ``model.path`` has).

    For every adapted layer the weight is ``W + get_delta_weight()`` (``B @ A * alpha / r``, transposed
    where PEFT's ``fan_in_fan_out`` says so), a new tensor; the training module is not changed (naive
    equivalent: ``copy.deepcopy(policy).merge_and_unload().state_dict()``, which copies the whole model).
    Other tensors are the policy's own (no copy)."""
    if not is_lora(policy):
        return policy.state_dict()
    from peft.tuners.lora import LoraLayer

    base = policy.get_base_model()
    out: dict[str, torch.Tensor] = {}
    for key, tensor in base.state_dict().items():
        if ".lora_" not in key:
            out[_base_name(key)] = tensor
    for name, module in base.named_modules():
        if not isinstance(module, LoraLayer) or module.merged:
            continue
        weight = module.get_base_layer().weight
        merged = weight.detach().clone()
        for adapter in module.active_adapters:
            if adapter in module.lora_A:
                merged += module.get_delta_weight(adapter).to(weight.dtype)
        out[f"{name}.weight"] = merged
    return out


def publishable_entries(
    policy: torch.nn.Module, entries: Iterable[tuple[str, torch.Tensor]]
) -> Iterator[tuple[str, torch.Tensor]]:
    """:func:`publishable_state_dict`'s entries from ``policy``'s own state-dict entries as they come, one
    whole tensor at a time (e.g. gathered from FSDP2 shards, which ``policy`` holds): without LoRA, ``entries``
    themselves; with LoRA, every entry under the base model's name, an adapted layer's weight merged
    (``W + B @ A * alpha / r``) once its base weight and every active adapter's ``A`` and ``B`` have come
    (at most one layer's tensors are held back). Entries of inactive adapters are dropped."""
    if not is_lora(policy):
        yield from entries
        return
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer

    base = policy.get_base_model()
    root = next(name for name, module in policy.named_modules() if module is base) + "."
    layers: dict[str, Any] = {}  # an adapted layer's name in the base -> the layer
    needed: dict[str, list[str]] = {}  # -> the parts its merged weight needs
    for name, module in base.named_modules():
        if not isinstance(module, LoraLayer) or module.merged:
            continue
        if not isinstance(module, LoraLinear) or any(module.use_dora.get(a) for a in module.active_adapters):
            raise ModelError(
                f"cannot stream merged weights of the {type(module).__name__} adapter at {name}",
                where="model.lora.target_modules",
                hint="stream only plain linear adapters (no DoRA)",
            )
        layers[name] = module
        needed[name] = ["base_layer.weight"] + [
            f"lora_{ab}.{a}.weight" for a in module.active_adapters if a in module.lora_A for ab in "AB"
        ]
    held: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in entries:
        if not key.startswith(root):
            raise ModelError(f"state-dict entry {key!r} is outside the base model", where="model.lora")
        key = key[len(root) :]
        owner, part = _lora_part(key, layers)
        if owner is None:
            yield _base_name(key), tensor
            continue
        if part == "base_layer.bias":  # not merged: under the base name as it comes
            yield f"{owner}.bias", tensor
            continue
        if part not in needed[owner]:
            continue  # an inactive adapter's: not part of the published weights
        module, parts = layers[owner], held.setdefault(owner, {})
        parts[part] = tensor
        if all(n in parts for n in needed[owner]):
            merged = parts["base_layer.weight"].detach().clone()
            for a in module.active_adapters:
                if a in module.lora_A:
                    delta = parts[f"lora_B.{a}.weight"] @ parts[f"lora_A.{a}.weight"]
                    merged += (
                        (delta.T if module.fan_in_fan_out else delta).mul(module.scaling[a]).to(merged.dtype)
                    )
            del held[owner]
            yield f"{owner}.weight", merged
    if held:
        raise ModelError(
            f"the streamed weights lack parts of the adapted layer {next(iter(held))}", where="model.lora"
        )


def _lora_part(key: str, layers: dict[str, Any]) -> tuple[str | None, str]:
    """``key`` (a base-model state-dict name) split into the adapted layer it belongs to and the rest
    (``base_layer.weight``, ``lora_A.default.weight``); ``(None, key)`` outside adapted layers."""
    owner = key
    while "." in owner:
        owner = owner.rpartition(".")[0]
        if owner in layers:
            return owner, key[len(owner) + 1 :]
    return None, key


def engine_state_dict(engine: Any, policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What ``engine.update_weights`` gets: the policy's own state dict when the engine samples with the
    policy module itself (the HF engine: nothing to copy, a LoRA policy generates as it is), else the
    weights under the base model's names, merged when the policy has a LoRA adapter."""
    if getattr(engine, "model", None) is policy:
        return policy.state_dict()
    return publishable_state_dict(policy)


def merged_model(policy: torch.nn.Module) -> torch.nn.Module:
    """A plain model with the merged weights (a new module; ``policy`` unchanged). Without LoRA, ``policy``."""
    if not is_lora(policy):
        return policy
    base = policy.get_base_model()
    with torch.random.fork_rng(devices=[]):  # its random init is overwritten: leave the run's RNG alone
        plain = type(base)(base.config).to(dtype=next(base.parameters()).dtype)
    plain.load_state_dict(publishable_state_dict(policy), strict=True)
    plain.name_or_path = base.name_or_path
    return plain.eval()


def adapter_state_dict(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's tensors under the names PEFT saves them (``adapter_model.safetensors``)."""
    return _peft().get_peft_model_state_dict(policy)


def load_adapter_weights(policy: torch.nn.Module, loaded: dict[str, torch.Tensor], where: str) -> None:
    """Copy saved adapter tensors into ``policy`` strictly: same names and shapes as it saves, or ModelError."""
    own = adapter_state_dict(policy)
    missing, unexpected = sorted(set(own) - set(loaded)), sorted(set(loaded) - set(own))
    shapes = sorted(k for k in set(own) & set(loaded) if own[k].shape != loaded[k].shape)
    problem = "; ".join(
        f"{label}: {', '.join(keys[:3])}"
        for label, keys in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", shapes))
        if keys
    )
    if problem:
        raise ModelError(f"adapter weights do not match the model: {problem}", where=where)
    _peft().set_peft_model_state_dict(policy, loaded)


def load_adapter_merged(folder: str | Path, load_base: Callable[[str], torch.nn.Module]) -> torch.nn.Module:
    """A plain model from a LoRA adapter folder: ``load_base`` loads the base named in its adapter config,
    the adapter is applied, and ``merge_and_unload`` folds it in (the result has no PEFT layers)."""
    peft = _peft()
    folder = Path(folder)
    config = peft.PeftConfig.from_pretrained(str(folder))
    base_path = config.base_model_name_or_path
    if not base_path or not Path(base_path).is_dir():
        raise ModelError(
            f"the adapter's base model folder {base_path!r} does not exist",
            where=str(folder / ADAPTER_CONFIG),
            hint="set base_model_name_or_path to the folder the run trained from (model.path)",
        )
    base = load_base(base_path)
    model = peft.PeftModel.from_pretrained(base, str(folder), is_trainable=False)
    return model.merge_and_unload().eval()
