"""Config side of staleness: the unsafe-algorithm warning, rejected combinations, shipped decoupled presets."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tandem.config import build_config, load_config
from tandem.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]


def _data(algorithm: dict, eta: int, mode: str = "decoupled") -> dict:
    return {
        "model": {"path": "models/tiny"},
        "data": {"task": "arith", "prompts_per_step": 2},
        "rollout": {"n": 4},
        "algorithm": algorithm,
        "architecture": {"mode": mode, "staleness": eta},
    }


@pytest.mark.parametrize(
    ("algorithm", "eta", "mode", "warns"),
    [
        ({"name": "grpo"}, 2, "decoupled", True),
        ({"name": "grpo"}, 1, "decoupled", False),  # one step off-policy: PPO's clip copes
        ({"name": "grpo"}, 3, "colocated", False),  # staleness only matters when decoupled
        ({"name": "grpo", "correction": "token_tis"}, 4, "decoupled", False),
        ({"name": "decoupled_ppo"}, 4, "decoupled", False),
        ({"name": "agro"}, 4, "decoupled", False),
        ({"name": "topr"}, 4, "decoupled", False),
        ({"name": "cispo"}, 2, "decoupled", True),
    ],
)
def test_unsafe_algorithm_warning(caplog, algorithm, eta, mode, warns):
    with caplog.at_level(logging.WARNING, logger="tandem.config"):
        build_config(_data(algorithm, eta, mode))
    text = " ".join(r.getMessage() for r in caplog.records)
    assert ("unsafe for η ≥ 2 without correction" in text) is warns
    if warns:
        from tandem.algos import CORRECTIONS, POLICY_LOSSES

        safe = [n for n in POLICY_LOSSES if POLICY_LOSSES[n].off_policy_safe]
        assert set(safe) == {"decoupled_ppo", "agro", "topr"}  # the registry's facts name them
        assert f"algorithm.policy_loss={', '.join(safe)}" in text
        assert f"algorithm.correction={'|'.join(CORRECTIONS.names())}" in text


def test_dynamic_sampling_is_accepted_when_decoupled():
    assert build_config(_data({"name": "dapo"}, 1)).algorithm.dynamic_sampling is True


def test_unknown_channel_backend_names_the_key_and_the_valid_ones():
    """Channel backends live above the config layer: a decoupled run checks the name (and the backend its
    options) before it starts; the config keeps the name as given."""
    from tandem.channels import check_channel

    data = _data({"name": "decoupled_ppo"}, 1)
    data["architecture"]["channel"] = {"backend": "kafka"}
    cfg = build_config(data)
    with pytest.raises(ConfigError) as err:
        check_channel(cfg.architecture.channel.backend, cfg.architecture.channel.options, "embedded")
    assert (
        str(err.value)
        == "architecture.channel.backend: unknown channel backend 'kafka'; valid: queue, ray, redis"
    )


@pytest.mark.parametrize(
    ("channel", "message"),
    [
        (
            {"backend": "redis", "max_age_s": -1},
            "architecture.channel.options.max_age_s: Input should be greater",
        ),
        (
            {"backend": "redis", "options": {"trim_ackd": False}},
            "architecture.channel.options.trim_ackd: unknown option of channel 'redis'; its options: "
            "redis_url, stream, max_len, trim_acked, max_age_s",
        ),
        (
            {"backend": "queue", "redis_url": "redis://x"},
            "architecture.channel.options.redis_url: unknown option of channel 'queue'; its options: none",
        ),
    ],
)
def test_bad_channel_options_name_their_key(channel, message):
    from tandem.channels import check_channel

    data = _data({"name": "decoupled_ppo"}, 1)
    data["architecture"]["channel"] = channel
    ch = build_config(data).architecture.channel
    with pytest.raises(ConfigError) as err:
        check_channel(ch.backend, ch.options, "embedded")
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_flat_channel_keys_are_options_and_win_over_the_same_option():
    data = _data({"name": "decoupled_ppo"}, 1)
    data["architecture"]["channel"] = {
        "backend": "redis",
        "redis_url": "redis://a:1/0",
        "options": {"redis_url": "redis://b:2/0", "stream": "s"},
    }
    ch = build_config(data).architecture.channel
    assert ch.options == {"redis_url": "redis://a:1/0", "stream": "s"}
    assert build_config(build_config(data).model_dump(mode="json")).architecture.channel == ch


@pytest.mark.parametrize("name", ["decoupled_ppo", "decoupled_agro", "decoupled_topr", "decoupled_grpo_tis"])
def test_shipped_decoupled_presets_load_without_warning(caplog, name):
    with caplog.at_level(logging.WARNING, logger="tandem.config"):
        cfg = load_config(REPO / "configs" / f"{name}.yaml")
    assert cfg.architecture.mode == "decoupled" and cfg.architecture.staleness == 2
    assert not caplog.records


@pytest.mark.parametrize(
    ("arch", "key"),
    [
        (
            {"autoscale": {"enabled": True, "min_workers": 3, "max_workers": 2}},
            "architecture.autoscale.min_workers",
        ),
        ({"num_workers": 5, "autoscale": {"enabled": True, "max_workers": 4}}, "architecture.num_workers"),
        ({"weight_sync": "sometimes"}, "architecture.weight_sync"),
    ],
)
def test_bad_elasticity_and_sync_settings_name_their_key(arch, key):
    data = _data({"name": "decoupled_ppo"}, 1)
    data["architecture"].update(arch)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as err:
        build_config(data)
    assert "\n" not in str(err.value)
