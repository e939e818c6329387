"""``trainer.ema_decay`` in a colocated run: the held-out evaluation sees the weight average, the rollout
engine gets the live weights back, the learner moves the average after each update."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from tandem.config import build_config
from tandem.errors import ConfigError
from tandem.orchestration import colocated
from tandem.orchestration.build import build_rollout_engine
from tandem.orchestration.colocated import ColocatedTrainer
from tandem.orchestration.parts import build_parts

DIGITS = Path(__file__).parents[2] / "e2e" / "digits_reward.py"


def _cfg(tiny_model_dir, tmp_path, mode="colocated", **trainer):
    return build_config(
        {
            "architecture": {"mode": mode},
            "run": {"output_dir": str(tmp_path), "seed": 5},
            "model": {"path": str(tiny_model_dir)},
            "data": {"task": "arith", "prompts_per_step": 2, "eval_size": 4, "train_size": 32},
            "rollout": {"n": 4, "max_new_tokens": 4},
            "algorithm": {"name": "grpo"},
            "reward": {"task_reward": False, "functions": [{"path": f"{DIGITS}:digit_share"}]},
            "trainer": {"lr": 5e-3, **trainer},
        }
    )


def _trainable(module):
    return {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("own_copy", [False, True], ids=["shared-module", "engine-own-copy"])
def test_evaluation_sees_the_average_and_rollouts_keep_the_live_weights(
    tiny_model_dir, tmp_path, monkeypatch, own_copy
):
    parts = build_parts(_cfg(tiny_model_dir, tmp_path, ema_decay=0.5))
    if own_copy:  # an engine holding its own weights (as vLLM does): the real HF engine over a copy
        parts.engine = build_rollout_engine(
            parts.cfg, model=copy.deepcopy(parts.policy), tokenizer=parts.tokenizer
        )
    trainer = ColocatedTrainer(parts)
    trainer.publish()
    for _ in range(3):
        metrics = trainer.train_step()
    assert metrics["actor/ema_decay"] == 0.5  # n/(n+1) >= 0.5 from the first update
    assert parts.average is not None and parts.average.updates == 3
    live = _trainable(parts.policy)
    average = dict(zip(parts.average.names, parts.average.average, strict=True))
    assert any(not torch.equal(live[n], average[n]) for n in live), "the average should lag the live weights"

    seen: list[dict[str, torch.Tensor]] = []
    real = colocated.evaluate_heldout

    def spy(p, step=None):
        seen.append(_trainable(p.engine.model))  # the weights the evaluation generates with
        return real(p, step)

    monkeypatch.setattr(colocated, "evaluate_heldout", spy)
    result = trainer.evaluate()
    assert "eval/accuracy" in result
    assert len(seen) == 1
    for name, tensor in seen[0].items():
        assert torch.equal(tensor, average[name]), name
    for name, tensor in _trainable(parts.policy).items():  # the live weights are back, bit for bit
        assert torch.equal(tensor, live[name]), name
    for name, tensor in _trainable(parts.engine.model).items():  # and the rollouts sample them
        assert torch.equal(tensor, live[name]), name


def test_without_ema_decay_there_is_no_average(tiny_model_dir, tmp_path):
    parts = build_parts(_cfg(tiny_model_dir, tmp_path))
    assert parts.average is None
    metrics = ColocatedTrainer(parts).train_step()
    assert "actor/ema_decay" not in metrics


def test_ema_decay_is_a_decay_and_works_with_fsdp2_in_both_architectures(tiny_model_dir, tmp_path):
    """FSDP2: colocated, rank 0 averages its whole copy (tests/integration/test_colocated_world_size.py);
    decoupled, every rank its shards (tests/integration/test_fsdp2_learner.py)."""
    fsdp2 = {"ema_decay": 0.9, "strategy": "fsdp2", "world_size": 2}
    for mode in ("colocated", "decoupled"):
        assert _cfg(tiny_model_dir, tmp_path, mode=mode, **fsdp2).trainer.ema_decay == 0.9
    with pytest.raises(ConfigError, match="ema_decay"):
        _cfg(tiny_model_dir, tmp_path, ema_decay=1.0)


def test_a_checkpoint_whose_live_weights_do_not_fit_is_one_clear_error(tiny_model_dir, tmp_path):
    import safetensors.torch

    from tandem.errors import ModelError
    from tandem.orchestration.parts import load_run_checkpoint, save_run_checkpoint
    from tandem.train.checkpoint import LIVE_WEIGHTS

    parts = build_parts(_cfg(tiny_model_dir, tmp_path / "run", ema_decay=0.5))
    folder = save_run_checkpoint(tmp_path / "ckpt", 1, parts, parts.cfg, {})
    live = safetensors.torch.load_file(str(folder / LIVE_WEIGHTS))
    name = next(iter(live))
    safetensors.torch.save_file({**live, name: torch.zeros(3)}, str(folder / LIVE_WEIGHTS))
    with pytest.raises(ModelError, match=rf"{name}.*shape") as err:
        load_run_checkpoint(folder, parts)
    assert LIVE_WEIGHTS in str(err.value) and "\n" not in str(err.value)
    (folder / LIVE_WEIGHTS).write_bytes(b"not safetensors")
    with pytest.raises(ModelError, match="cannot read the live weights"):
        load_run_checkpoint(folder, parts)
