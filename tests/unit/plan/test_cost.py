"""The per-phase cost model: shapes, the completion-length tail, roofline formulas."""

from __future__ import annotations

import math

import pytest

from tandem.errors import ConfigError
from tandem.plan.cost import (
    Efficiency,
    LengthDist,
    ModelShape,
    Workload,
    colocated_phases,
    decoupled_phases,
    generate_s,
    logprob_s,
    min_train_devices,
    tensor_parallel,
    update_s,
    weight_sync_s,
)
from tandem.plan.devices import DEVICES, get_device

H100 = DEVICES["h100"]
EFF = Efficiency()


def workload(params=7e9, mean=4096, max_len=8192, cv=0.6, samples=512, **kw) -> Workload:
    return Workload(
        model=ModelShape.from_params(params),
        prompt_len=512,
        completion=LengthDist(mean=mean, max_len=max_len, cv=cv),
        samples_per_step=samples,
        **kw,
    )


def test_shape_from_params_is_a_typical_model():
    m = ModelShape.from_params(7e9)
    assert 28 <= m.layers <= 36 and 3840 <= m.d_model <= 4608
    assert 12 * m.layers * m.d_model**2 == pytest.approx(7e9, rel=0.15)
    assert m.weight_bytes == 14e9


def test_length_tail():
    d = LengthDist(mean=1000, max_len=8000, cv=0.8)
    assert d.survival(0) == 1.0 and d.survival(8001) == 0.0
    assert d.survival(500) > d.survival(1000) > d.survival(4000)
    assert d.capped_mean == pytest.approx(1000, rel=0.05)  # the cut at 8× the mean barely binds
    assert d.expected_max(1) < d.expected_max(64) < d.expected_max(4096) <= 8000
    cut = LengthDist(mean=1000, max_len=1200, cv=0.8)
    assert cut.capped_mean < 1000 and cut.expected_max(512) == 1200  # truncated completions
    assert LengthDist(mean=300, max_len=1000, cv=0).expected_max(100) == 300


def test_update_and_logprob_are_flops_over_efficient_peak():
    w = workload()
    tokens = 512 * (512 + w.completion.capped_mean)
    assert update_s(w, H100, 16, EFF) == pytest.approx(6 * 7e9 * tokens / (16 * H100.flops * EFF.train_mfu))
    assert logprob_s(w, H100, 16, EFF) == pytest.approx(
        2 * 7e9 * tokens / (16 * H100.flops * EFF.forward_mfu)
    )
    with_ref = workload(reference=True)
    assert logprob_s(with_ref, H100, 16, EFF) == pytest.approx(2 * logprob_s(w, H100, 16, EFF))


def test_single_sequence_decode_is_memory_bound():
    """One sequence of fixed length: every token reads the weights (and a small KV cache) once."""
    w = workload(mean=1000, max_len=1000, cv=0, samples=1)
    t = generate_s(w, H100, 1, EFF)
    weights_only = 1000 * 14e9 / (H100.mem_bw * EFF.bw)
    assert weights_only < t < 1.1 * weights_only


def test_long_tail_costs_a_static_batch_but_not_a_streaming_one():
    """A static batch decodes until its longest completion; streaming pays only the tokens. The wider the
    length distribution, the more the tail costs (7B, 8 H100, 512 samples of mean 4k, max 8k)."""

    def tail_cost(cv: float) -> float:
        w = workload(cv=cv)
        return generate_s(w, H100, 8, EFF) / generate_s(w, H100, 8, EFF, streaming=True)

    assert 1.0 < tail_cost(0.2) < tail_cost(0.6) < tail_cost(1.2)
    assert tail_cost(1.2) > 1.5


def test_more_engines_generate_faster():
    w = workload()
    assert generate_s(w, H100, 16, EFF) < generate_s(w, H100, 8, EFF) < generate_s(w, H100, 4, EFF)
    assert generate_s(workload(params=70e9), H100, 2, EFF) == math.inf  # fewer devices than one engine


def test_memory_rules():
    assert tensor_parallel(ModelShape.from_params(7e9), H100) == 1
    assert tensor_parallel(ModelShape.from_params(70e9), H100) == 4
    assert min_train_devices(ModelShape.from_params(70e9), H100, EFF) == math.ceil(70e9 * 18 / (0.8 * 80e9))
    with pytest.raises(ConfigError, match="does not fit"):
        tensor_parallel(ModelShape.from_params(2e12), H100)


def test_weight_sync_between_nodes_uses_the_network():
    m = ModelShape.from_params(7e9)
    intra = weight_sync_s(m, H100, cross_node=False, eff=EFF)
    inter = weight_sync_s(m, H100, cross_node=True, eff=EFF)
    assert intra == pytest.approx(EFF.sync_latency_s + 14e9 / (H100.link_bw * EFF.sync_bw))
    assert inter == pytest.approx(EFF.sync_latency_s + 14e9 / (8 * H100.net_bw * EFF.sync_bw))


def test_phase_sets():
    w = workload()
    col = colocated_phases(w, H100, 64, EFF)
    assert col.weight_sync == EFF.switch_s and col.weight_load == 0
    dec = decoupled_phases(w, H100, rollout_devices=48, train_devices=16, workers=2, eff=EFF)
    assert dec.generate == pytest.approx(generate_s(w, H100, 24, EFF))
    assert dec.update == pytest.approx(update_s(w, H100, 16, EFF))
    assert dec.weight_load == EFF.sync_latency_s and dec.transfer > 0


def test_unknown_device_is_one_line():
    with pytest.raises(ConfigError, match="unknown device 'tpu'.*known: cpu-core"):
        get_device("tpu")
    assert get_device("H200").mem_bytes > get_device("h100").mem_bytes
