"""Multi-turn episodes on the vLLM engine: token-id turns equal the HF engine's (greedy)."""

from __future__ import annotations

import pytest
import torch

from tandem.errors import ConfigError
from tandem.models import init_tiny_model
from tandem.rollout import EngineSpec, SamplingParams, build_engine
from tandem.rollout.episodes import EpisodeRunner, EpisodeSettings
from tandem.rollout.registry import EngineUnavailableError, engine_class

try:
    engine_class("vllm")
    NO_VLLM = None
except (EngineUnavailableError, ConfigError) as err:
    NO_VLLM = str(err)
pytestmark = pytest.mark.skipif(NO_VLLM is not None, reason=f"vLLM not importable: {NO_VLLM}")


class Echo:
    def reset(self, row):
        return row["prompt"]

    def step(self, action):
        return "RESULT 42\n", 0.5, False, {"tool_calls": 1}


def test_vllm_episodes_equal_hf_episodes(tmp_path):
    path = init_tiny_model(tmp_path / "m", seed=0, hidden_size=64, num_layers=2, num_heads=2)
    params = SamplingParams(max_new_tokens=6, temperature=0.0, n=1)
    vllm, hf = (
        build_engine("vllm", EngineSpec(path=str(path))),
        build_engine("hf", EngineSpec(path=str(path))),
    )
    try:  # vLLM in lockstep and async episodes (greedy: the batching does not change the samples), HF
        out = [
            EpisodeRunner(e, Echo, EpisodeSettings(max_turns=3, schedule=s)).generate(
                ["12*34=", "hello"], params
            )
            for e, s in ((vllm, "lockstep"), (vllm, "async"), (hf, "lockstep"))
        ]
    finally:
        vllm.close()
    a = out[0]
    for other in out[1:]:
        assert torch.equal(a.response_ids, other.response_ids) and torch.equal(
            a.response_mask, other.response_mask
        )
        torch.testing.assert_close(a.behavior_logprobs, other.behavior_logprobs, atol=1e-4, rtol=0)
    assert (~a.response_mask).sum() > 0  # observation tokens are in the rows, masked out
