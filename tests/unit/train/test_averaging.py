"""The policy's weight average (``trainer.ema_decay``): the decay schedule, exact values, the swap."""

from __future__ import annotations

import pytest
import torch

from tandem.train.averaging import WeightAverage, average_decay, load_live_weights


def _module(dtype=torch.float32):
    m = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1, bias=False)).to(dtype)
    m[0].bias.requires_grad_(False)  # frozen: not averaged
    return m


def _set_all(module, value):
    with torch.no_grad():
        for p in module.parameters():
            p.fill_(value)


def test_decay_starts_as_the_plain_mean_then_caps():
    assert average_decay(0.95, 1) == pytest.approx(1 / 2)
    assert average_decay(0.95, 2) == pytest.approx(2 / 3)
    assert average_decay(0.95, 18) == pytest.approx(18 / 19)  # 0.947 < 0.95
    assert average_decay(0.95, 19) == 0.95  # 19/20 = 0.95
    assert average_decay(0.95, 1000) == 0.95


def test_early_updates_give_the_mean_of_every_iterate_so_far():
    m = _module()
    _set_all(m, 0.0)
    avg = WeightAverage.of(m, decay=0.99)
    for step in range(1, 6):  # live weights 1, 2, ..., 5 after each update
        _set_all(m, float(step))
        avg.update()
    for a in avg.average:  # mean of 0, 1, ..., 5
        torch.testing.assert_close(a, torch.full_like(a, 2.5))


def test_late_updates_are_an_exponential_average():
    m = _module()
    _set_all(m, 0.0)
    avg = WeightAverage.of(m, decay=0.5)  # n/(n+1) >= 0.5 from n = 1: always the cap
    _set_all(m, 1.0)
    avg.update()  # 0 -> 0.5
    avg.update()  # 0.5 -> 0.75
    _set_all(m, 3.0)
    avg.update()  # 0.75 -> 1.875
    for a in avg.average:
        torch.testing.assert_close(a, torch.full_like(a, 1.875))
    assert avg.updates == 3


def test_only_trainable_parameters_are_averaged():
    m = _module()
    avg = WeightAverage.of(m, 0.9)
    assert "0.bias" not in avg.names
    assert avg.names == ["0.weight", "1.weight"]
    with pytest.raises(ValueError, match="nothing to average"):
        WeightAverage.of(torch.nn.Linear(2, 2).requires_grad_(False), 0.9)


def test_applied_swaps_the_average_in_and_the_live_weights_back_bit_for_bit():
    torch.manual_seed(0)
    m = _module()
    avg = WeightAverage.of(m, 0.9)
    live = {k: v.clone() for k, v in m.state_dict().items()}
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p))
    avg.update()
    moved = {k: v.clone() for k, v in m.state_dict().items()}
    assert any(not torch.equal(moved[k], live[k]) for k in live)
    with avg.applied():
        for name, a in zip(avg.names, avg.average, strict=True):
            assert torch.equal(m.state_dict()[name], a)
        assert torch.equal(m.state_dict()["0.bias"], moved["0.bias"])  # frozen: untouched
        with avg.applied():  # nested: still the average
            assert torch.equal(m.state_dict()["1.weight"], avg.average[1])
        assert torch.equal(m.state_dict()["1.weight"], avg.average[1])
        # the live weights, also while the average is in place (a checkpoint's live.safetensors)
        for name, t in avg.live_weights().items():
            assert torch.equal(t, moved[name])
        with pytest.raises(RuntimeError, match="inside applied"):
            avg.update()
    for k, v in m.state_dict().items():
        assert torch.equal(v, moved[k])


def test_parameters_narrower_than_float32_are_averaged_in_float32():
    m = _module(torch.bfloat16)
    _set_all(m, 0.0)
    avg = WeightAverage.of(m, 0.999)
    assert all(a.dtype == torch.float32 for a in avg.average)
    third = torch.tensor(1 / 3, dtype=torch.bfloat16).float()  # what a bf16 parameter holds
    for _ in range(3):
        _set_all(m, 1 / 3)
        avg.update()
    # the mean of 0, third, third, third in float32 (0.25049); in bf16 it would round to 0.25
    torch.testing.assert_close(avg.average[0], torch.full_like(avg.average[0], 0.75 * third.item()))
    with avg.applied():
        assert m[0].weight.dtype == torch.bfloat16


def test_restart_takes_the_current_weights_as_the_average():
    m = _module()
    avg = WeightAverage.of(m, 0.9)
    _set_all(m, 7.0)
    avg.restart()
    assert all(torch.equal(a, torch.full_like(a, 7.0)) for a in avg.average)


def test_load_live_weights_by_name_and_refuses_a_mismatch():
    m = _module()
    live = {"0.weight": torch.ones(2, 3), "1.weight": torch.full((1, 2), 2.0)}
    load_live_weights(m, live)
    assert torch.equal(m[0].weight, live["0.weight"])
    assert torch.equal(m[1].weight, live["1.weight"])
    with pytest.raises(ValueError, match="'2.weight' is not a parameter"):
        load_live_weights(m, {"2.weight": torch.ones(1)})
    with pytest.raises(ValueError, match=r"'0.weight' has shape \(3, 2\)"):
        load_live_weights(m, {"0.weight": torch.ones(3, 2)})
    assert torch.equal(m[0].weight, live["0.weight"])  # a refused load changes nothing


def test_decay_outside_the_open_interval_is_refused():
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError, match="decay"):
            WeightAverage.of(_module(), bad)
