"""Peer implementations for ``bench/algos_oracle.py``: verl 0.9.1's algorithm modules and TRL's DPO loss.

verl's package ``__init__`` imports Ray, tensordict and HF tooling, and its requirements pin an older
``transformers``, so it is not a dependency of Tandem. Install it without dependencies::

    .venv/bin/pip install --no-deps verl==0.9.1
    .venv/bin/pip install "trl==1.16.*"        # or: pip install -e .[bench]

:func:`load_verl` then executes only ``verl/utils/torch_functional.py``, ``verl/utils/groupwise.py``,
``verl/trainer/ppo/core_algos.py`` and ``verl/trainer/ppo/rollout_corr_helper.py`` from the installed
files, with stub modules for the few imports they use only as type hints or for device helpers (the stubs
sit in ``sys.modules`` only while those files load). TRL's DPO loss is inline in
``DPOTrainer._compute_loss``; :func:`trl_dpo_loss` calls that method on a trainer object holding only the
attributes the method reads, with a fake model that returns given per-token log-probs.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

VERL_VERSION = "0.9.1"
TRL_VERSION = "1.16"


class PeerUnavailableError(RuntimeError):
    """The peer implementation cannot be loaded; ``str(err)`` says why and how to install it."""


# ---------------------------------------------------------------------------------------------- verl


@dataclass(frozen=True)
class Verl:
    core: types.ModuleType  # verl.trainer.ppo.core_algos
    corr: types.ModuleType  # verl.trainer.ppo.rollout_corr_helper
    F: types.ModuleType  # verl.utils.torch_functional
    ActorConfig: type


class _ActorConfig:
    """Stands in for verl's ``ActorConfig``: the attributes its policy losses read."""

    def __init__(self, clip_low: float, clip_high: float, clip_ratio_c: float = 3.0) -> None:
        self.clip_ratio = clip_low
        self.clip_ratio_low = clip_low
        self.clip_ratio_high = clip_high
        self.clip_ratio_c = clip_ratio_c
        self.global_batch_info: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)


def _package(name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__path__ = []  # a package, so submodule imports resolve through sys.modules
    mod.__dict__.update(attrs)
    return mod


def _stub_modules() -> dict[str, types.ModuleType]:
    class _Placeholder:  # classes used only in annotations / isinstance checks against other configs
        pass

    stubs = {
        "verl": _package("verl"),
        "verl.utils": _package("verl.utils"),
        "verl.utils.device": _package(
            "verl.utils.device", get_device_name=lambda: "cpu", get_torch_device=lambda: torch.cpu
        ),
        "verl.utils.import_utils": _package(
            "verl.utils.import_utils", deprecated=lambda *a, **k: lambda f: f
        ),
        "verl.protocol": _package("verl.protocol", DataProto=_Placeholder),
        "verl.trainer": _package("verl.trainer"),
        "verl.trainer.ppo": _package("verl.trainer.ppo"),
        "verl.trainer.config": _package("verl.trainer.config", AlgoConfig=_Placeholder),
        "verl.trainer.config.algorithm": _package(
            "verl.trainer.config.algorithm", RolloutCorrectionConfig=_Placeholder
        ),
        "verl.workers": _package("verl.workers"),
        "verl.workers.config": _package("verl.workers.config", ActorConfig=_ActorConfig),
        "verl.workers.config.actor": _package("verl.workers.config.actor", PolicyLossConfig=_Placeholder),
    }
    for name, attr in (("omegaconf", "DictConfig"), ("tensordict", "TensorDict"), ("transformers", None)):
        if importlib.util.find_spec(name) is None:
            stubs[name] = _package(name, **({attr: _Placeholder} if attr else {}))
    if "transformers" in stubs:
        stubs["transformers"].PreTrainedTokenizer = _Placeholder
    return stubs


@contextmanager
def _temporary_modules(mods: dict[str, types.ModuleType]) -> Iterator[None]:
    """Put ``mods`` in ``sys.modules`` for the block; afterwards restore every name in ``mods`` (including
    the ones added to it inside the block) to what it was before."""
    before = dict(sys.modules)
    sys.modules.update(mods)
    try:
        yield
    finally:
        for name in list(mods):
            if name in before:
                sys.modules[name] = before[name]
            else:
                sys.modules.pop(name, None)


def _exec_file(name: str, path: Path, mods: dict[str, types.ModuleType]) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    mods[name] = module
    sys.modules[name] = module
    parent, _, leaf = name.rpartition(".")
    setattr(mods[parent], leaf, module)
    spec.loader.exec_module(module)
    return module


def load_verl() -> Verl:
    """verl 0.9.1's algorithm modules, loaded from the installed files without verl's package imports."""
    spec = importlib.util.find_spec("verl")  # locates the package without executing its __init__
    if spec is None or not spec.submodule_search_locations:
        raise PeerUnavailableError(
            f"verl is not installed: .venv/bin/pip install --no-deps verl=={VERL_VERSION}"
        )
    root = Path(next(iter(spec.submodule_search_locations)))
    version = (root / "version" / "version").read_text().strip() if (root / "version").is_dir() else "?"
    if version != VERL_VERSION:
        raise PeerUnavailableError(
            f"verl {version} is installed; the oracle is written against {VERL_VERSION}"
        )
    mods = _stub_modules()
    with _temporary_modules(mods):
        f = _exec_file("verl.utils.torch_functional", root / "utils" / "torch_functional.py", mods)
        _exec_file("verl.utils.groupwise", root / "utils" / "groupwise.py", mods)
        mods["verl.utils"].as_torch_index = mods["verl.utils.groupwise"].as_torch_index
        mods["verl.utils"].group_mean_std = mods["verl.utils.groupwise"].group_mean_std
        core = _exec_file("verl.trainer.ppo.core_algos", root / "trainer" / "ppo" / "core_algos.py", mods)
        corr = _exec_file(
            "verl.trainer.ppo.rollout_corr_helper", root / "trainer" / "ppo" / "rollout_corr_helper.py", mods
        )
    return Verl(core=core, corr=corr, F=f, ActorConfig=_ActorConfig)


# ----------------------------------------------------------------------------------------------- TRL


def load_trl_dpo() -> Callable[..., torch.Tensor]:
    """TRL's DPO loss as a function of per-token log-probs (see :func:`trl_dpo_loss`)."""
    if importlib.util.find_spec("trl") is None:
        raise PeerUnavailableError(f'TRL is not installed: .venv/bin/pip install "trl=={TRL_VERSION}.*"')
    import trl
    from trl.trainer.dpo_trainer import DPOTrainer

    if not trl.__version__.startswith(TRL_VERSION + "."):
        raise PeerUnavailableError(
            f"TRL {trl.__version__} is installed; the oracle is written against {TRL_VERSION}"
        )

    def call(**kw: Any) -> torch.Tensor:
        return trl_dpo_loss(DPOTrainer, **kw)

    return call


def trl_dpo_loss(
    trainer_cls: type,
    *,
    token_logps: torch.Tensor,  # [2B, L]: chosen rows then rejected rows, 0 outside the completion
    completion_mask: torch.Tensor,  # [2B, L] bool
    ref_chosen: torch.Tensor,  # [B] summed reference log-probs
    ref_rejected: torch.Tensor,  # [B]
    loss_type: str,
    beta: float,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Mean DPO loss from TRL's own ``DPOTrainer._compute_loss`` (its loss code is inline there)."""
    n, length = token_logps.shape
    zeros = torch.zeros(n, length + 1)
    out = types.SimpleNamespace(
        log_probs=token_logps,
        entropy=zeros[:, 1:],
        mean_logits=zeros[:, 1:],
        is_top1=torch.zeros(n, length, dtype=torch.bool),
    )
    model = types.SimpleNamespace(training=True)
    trainer = object.__new__(trainer_cls)
    accel = types.SimpleNamespace(
        device=torch.device("cpu"), gather_for_metrics=lambda x: x, gather=lambda x: x
    )
    trainer.__dict__.update(
        model=model,
        accelerator=accel,
        aux_loss_enabled=False,
        ld_alpha=None,
        precompute_ref_logps=True,
        f_divergence_type="reverse_kl",
        loss_types=[loss_type],
        loss_weights=[1.0],
        beta=beta,
        label_smoothing=label_smoothing,
        use_weighting=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        _total_train_tokens=0,
        _tp_size=1,
    )
    prompt_col = torch.zeros(n, 1, dtype=torch.long)  # one prompt token, outside the completion
    inputs = {
        "input_ids": torch.cat([prompt_col, torch.ones(n, length, dtype=torch.long)], dim=1),
        "attention_mask": torch.ones(n, length + 1, dtype=torch.long),
        "completion_mask": torch.cat([prompt_col, completion_mask.long()], dim=1),
        "ref_chosen_logps": ref_chosen,
        "ref_rejected_logps": ref_rejected,
    }

    def fake_model(**_: Any) -> types.SimpleNamespace:
        return out

    return trainer_cls._compute_loss(trainer, fake_model, inputs, return_outputs=False)
