"""mix_into: the reference moves towards the policy's tensors by name, from a module or a gathered stream."""

from __future__ import annotations

import pytest
import torch

from tandem.train.reference_sync import mix_into


def _pair():
    torch.manual_seed(0)
    ref, pol = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    return ref, pol


def test_soft_update_and_copy():
    ref, pol = _pair()
    start = {n: p.detach().clone() for n, p in ref.named_parameters()}
    mix_into(ref, pol.named_parameters(), 0.25)
    for n, p in ref.named_parameters():
        want = start[n] + 0.25 * (dict(pol.named_parameters())[n].detach() - start[n])
        torch.testing.assert_close(p.detach(), want)
    mix_into(ref, pol.named_parameters(), 1.0)
    for n, p in ref.named_parameters():
        assert torch.equal(p, dict(pol.named_parameters())[n])


def test_a_stream_with_buffers_and_repeated_names_moves_each_parameter_once():
    ref, pol = _pair()
    start = ref.weight.detach().clone()
    stream = [
        ("weight", pol.weight.detach()),
        ("weight", pol.weight.detach()),  # a tied weight's second name
        ("bias", pol.bias.detach()),
        ("rotary.inv_freq", torch.ones(1)),  # a buffer
    ]
    mix_into(ref, iter(stream), 0.5)
    torch.testing.assert_close(ref.weight.detach(), (start + pol.weight.detach()) / 2)


def test_a_parameter_without_a_counterpart_is_an_error():
    ref, pol = _pair()
    with pytest.raises(ValueError, match="no parameter 'bias'"):
        mix_into(ref, iter([("weight", pol.weight.detach())]), 0.5)
    with pytest.raises(ValueError, match="alpha must be in"):
        mix_into(ref, pol.named_parameters(), 0.0)
