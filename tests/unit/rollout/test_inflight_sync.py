"""The worker's in-flight sync callback: weights published while a generation runs are loaded at the next
chunk boundary; the batch keeps the version it started with."""

from __future__ import annotations

import torch

from tandem.channels.weights import SharedMemoryWeights
from tandem.models import init_tiny_model, load_causal_lm, load_tokenizer
from tandem.orchestration.decoupled.worker import InFlightSync
from tandem.rollout import HFEngine, SamplingParams


def test_weights_published_mid_generation_are_loaded(tiny_model_dir, tmp_path):
    engine = HFEngine(load_causal_lm(tiny_model_dir), load_tokenizer(tiny_model_dir), version=0)
    newer = load_causal_lm(
        init_tiny_model(tmp_path / "newer", hidden_size=32, num_layers=2, num_heads=2, seed=7)
    ).state_dict()
    weights = SharedMemoryWeights(engine.model.state_dict())
    try:
        weights.publish(engine.model.state_dict(), 0)
        sync = InFlightSync(engine, weights)
        weights.publish(newer, 1)  # the learner finished an update while this generation runs
        batch = engine.generate(
            ["12+7=", "3+4="],
            SamplingParams(max_new_tokens=8, temperature=1.0, seed=0),
            on_chunk=sync,
            chunk_tokens=2,
        )
        assert sync.updates == 1 and engine.version == 1
        assert batch.policy_version.tolist() == [0, 0]
        for name, t in engine.model.state_dict().items():
            assert torch.equal(t, newer[name])
    finally:
        weights.unlink()
