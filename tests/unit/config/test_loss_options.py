"""``algorithm.loss_options``: validated by the model built from the chosen loss's own options dataclass,
with the old top-level keys (clip_low, clip_high, dual_clip) kept as shorthands. A loss with a new
hyper-parameter, defined and registered in this test, is configured and trained on with no other edit."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest
import torch

from tandem.algos import POLICY_LOSSES, ClipOptions, PolicyLossInputs, policy_loss
from tandem.config import build_config, load_config
from tandem.config.docs import config_reference
from tandem.errors import ConfigError
from tandem.train.update import UpdateSettings


def _data(**algorithm) -> dict:
    return {
        "model": {"path": "unused"},
        "data": {"task": "arith", "prompts_per_step": 2},
        "rollout": {"n": 4},
        "algorithm": algorithm,
    }


def _error(data: dict) -> str:
    with pytest.raises(ConfigError) as err:
        build_config(data)
    return str(err.value).removeprefix("<config>: ")


def test_presets_fill_the_loss_options_with_the_loss_defaults():
    assert build_config(_data(name="grpo")).algorithm.loss_options == {
        "clip_low": 0.2,
        "clip_high": 0.2,
        "dual_clip": None,
    }
    assert build_config(_data(name="gspo")).algorithm.loss_options["clip_low"] == 3e-4
    assert build_config(_data(name="cispo")).algorithm.loss_options == {"clip_low": 0.2, "clip_high": 4.0}
    assert build_config(_data(name="topr")).algorithm.loss_options == {}


def test_a_preset_keeps_its_clip_for_another_clipped_loss_and_drops_it_for_one_without():
    a = build_config(_data(name="gspo", policy_loss="ppo_clip")).algorithm
    assert a.loss_options["clip_high"] == 4e-4  # as before: the preset fills what the user left unset
    assert build_config(_data(name="gspo", policy_loss="topr")).algorithm.loss_options == {}


def test_loss_options_refine_the_preset_and_shorthands_win():
    a = build_config(_data(name="dapo", loss_options={"dual_clip": 3.0})).algorithm
    assert a.loss_options == {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": 3.0}
    a = build_config(_data(name="dapo", clip_high=0.3, loss_options={"clip_high": 0.25})).algorithm
    assert a.loss_options["clip_high"] == 0.3


def test_the_resolved_config_round_trips():
    cfg = build_config(_data(name="dapo", clip_low=0.1))
    again = build_config(cfg.model_dump(mode="json"))
    assert again == cfg and again.algorithm.loss_options["clip_low"] == 0.1


@pytest.mark.parametrize(
    ("algorithm", "expected"),
    [
        (
            {"loss_options": {"clip_hi": 0.3}},
            "algorithm.loss_options.clip_hi: policy loss 'ppo_clip' has no option 'clip_hi'; "
            "its options: clip_low, clip_high, dual_clip",
        ),
        (
            {"name": "topr", "loss_options": {"clip_high": 0.3}},
            "algorithm.loss_options.clip_high: policy loss 'topr' has no option 'clip_high'; its options: none",
        ),
        (
            {"loss_options": {"dual_clip": 0.5}},
            "algorithm.loss_options.dual_clip: Input should be greater than 1",
        ),
        ({"clip_high": -1}, "algorithm.clip_high: Input should be greater than or equal to 0"),
        (
            {"loss_options": {"clip_low": "wide"}},
            "algorithm.loss_options.clip_low: Input should be a valid number, unable to parse string as a number",
        ),
        ({"loss_options": [0.2]}, "algorithm.loss_options: must be a mapping of option names to values"),
    ],
)
def test_bad_loss_options_are_one_line_errors_naming_the_key(algorithm, expected):
    assert _error(_data(**algorithm)) == expected


def test_bad_loss_option_in_a_file_names_its_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "model: {path: unused}\ndata: {task: arith}\nalgorithm:\n  name: grpo\n  loss_options:\n"
        "    clip_high: 0.3\n    clip_typo: 1\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}:7: algorithm.loss_options.clip_typo: policy loss 'ppo_clip'")


def test_a_shorthand_the_loss_lacks_is_ignored_with_a_warning(caplog):
    """Configs written before per-loss options hold clip_low/clip_high/dual_clip for every loss."""
    old = {"name": "topr", "clip_low": 0.2, "clip_high": 0.2, "dual_clip": None}
    with caplog.at_level(logging.WARNING, "tandem.config"):
        assert build_config(_data(**old)).algorithm.loss_options == {}
    assert "algorithm.clip_high has no effect: policy loss 'topr' has no option clip_high" in caplog.text
    assert "dual_clip" not in caplog.text  # null: nothing was asked for


@dataclass(frozen=True)
class _ScaledOptions:
    scale: float = field(default=1.0, metadata={"gt": 0, "description": "Multiplier of the advantage."})


def _scaled(x: PolicyLossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    o: _ScaledOptions = x.options
    loss = -o.scale * x.advantages * torch.exp(x.logprobs - x.logprobs.detach())
    return loss, {}


@pytest.fixture
def scaled_loss():
    spec = POLICY_LOSSES["topr"].__class__(_scaled, options=_ScaledOptions)
    POLICY_LOSSES.add("test_scaled", spec)
    yield "test_scaled"
    POLICY_LOSSES.unregister("test_scaled")


def test_a_loss_with_a_new_hyper_parameter_needs_no_other_edit(scaled_loss):
    cfg = build_config(_data(name="grpo", policy_loss=scaled_loss, loss_options={"scale": 2.5}))
    assert cfg.algorithm.loss_options == {"scale": 2.5}
    bad = _data(name="grpo", policy_loss=scaled_loss, loss_options={"scale": 0})
    assert _error(bad) == "algorithm.loss_options.scale: Input should be greater than 0"
    settings = UpdateSettings.from_config(
        cfg.algorithm, cfg.trainer, temperature=1.0, autocast_bf16=False, max_new_tokens=4
    )
    assert settings.loss_options == _ScaledOptions(scale=2.5)
    lp = torch.zeros(1, 2, requires_grad=True)
    kw = dict(logprobs=lp, old_logprobs=torch.zeros(1, 2), response_mask=torch.ones(1, 2, dtype=torch.bool))
    loss, _ = policy_loss(scaled_loss, advantages=torch.ones(1, 2), options=settings.loss_options, **kw)
    assert loss.item() == pytest.approx(-2.5)
    assert (
        "| `test_scaled` | `scale` | `float` | `1.0` | Multiplier of the advantage. |" in config_reference()
    )


def test_update_settings_carry_the_typed_options():
    cfg = build_config(_data(name="dapo", loss_options={"dual_clip": 3.0}))
    settings = UpdateSettings.from_config(
        cfg.algorithm, cfg.trainer, temperature=1.0, autocast_bf16=False, max_new_tokens=4
    )
    assert settings.loss_options == ClipOptions(clip_low=0.2, clip_high=0.28, dual_clip=3.0)
