"""A finished run closes its rollout engine: an in-process vLLM engine left to the garbage collector shuts
down from a finalizer that tears down the process-wide parallel groups under whatever engine runs next."""

import pytest

from tandem.config import build_config
from tandem.errors import ModelError
from tandem.orchestration import parts as parts_module
from tandem.rollout import SamplingParams


def test_a_colocated_run_closes_its_engine_when_it_ends(tiny_model_dir, tmp_path, monkeypatch):
    from tandem.orchestration.runner import train

    built = []
    real = parts_module.build_rollout_engine

    def recording(*args, **kwargs):
        built.append(real(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(parts_module, "build_rollout_engine", recording)
    cfg = build_config(
        {
            "run": {"output_dir": str(tmp_path / "run")},
            "model": {"path": str(tiny_model_dir)},
            "data": {"task": "arith", "prompts_per_step": 2, "eval_size": 0, "train_size": 8},
            "rollout": {"n": 2, "max_new_tokens": 2},
            "trainer": {"total_steps": 1, "warmup_steps": 0},
            "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False},
            "checkpoint": {"every": 0},
        }
    )
    train(cfg, progress=False)
    assert len(built) == 1
    with pytest.raises(ModelError, match="closed"):
        built[0].generate(["1+1="], SamplingParams(max_new_tokens=1))
