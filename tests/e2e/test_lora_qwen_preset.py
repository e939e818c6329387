"""``configs/lora_qwen.yaml`` from a fresh clone: the preset validates as shipped, and with its sizes
shrunk, ``tandem train`` builds its Qwen2/BPE warm start (``model.warm_start_sft`` with ``model_options``
``{arch: qwen2, tokenizer: bpe}``) and trains LoRA adapters on it for 2 steps. Mechanism only: nothing
depends on what the run learns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from run_checks import step_rows
from typer.testing import CliRunner

from tandem.cli.main import app
from tandem.config import load_config
from tandem.models import load_tokenizer

pytest.importorskip("peft")
PRESET = Path(__file__).resolve().parents[2] / "configs" / "lora_qwen.yaml"


def test_the_preset_validates_as_shipped():
    cfg = load_config(PRESET)
    assert cfg.model.lora.enabled and cfg.model.warm_start_sft is not None
    assert cfg.model.warm_start_sft.model_options == {"arch": "qwen2", "tokenizer": "bpe"}


def test_the_preset_builds_its_qwen2_bpe_model_and_trains_lora_for_two_steps(tmp_path):
    model, run = tmp_path / "qwen2-sft", tmp_path / "run"
    small = {"hidden_size": 64, "num_layers": 2, "num_heads": 2}  # head size 32, as the preset's
    overrides = [f"model.path={model}", f"run.output_dir={run}", "trainer.total_steps=2"]
    overrides += [f"model.warm_start_sft.model_options.{k}={v}" for k, v in small.items()]
    overrides += [
        f"model.warm_start_sft.{k}={v}" for k, v in {"steps": 2, "batch_size": 8, "train_size": 16}.items()
    ]
    overrides += ["data.prompts_per_step=2", "rollout.n=2", "data.eval_size=4", "monitor.eval_every=0"]
    overrides += ["monitor.sample_every=0", "monitor.progress=false", "monitor.tensorboard=false"]
    result = CliRunner().invoke(app, ["train", str(PRESET), *overrides])
    assert result.exit_code == 0, result.output

    built = json.loads((model / "config.json").read_text())
    assert built["model_type"] == "qwen2" and built["hidden_size"] == 64
    assert load_tokenizer(model).chat_template  # the ChatML template came with the BPE tokenizer
    assert not (tmp_path / "qwen2-sft.base").exists()  # the untrained base was cleaned up
    assert [r["step"] for r in step_rows(run)] == [1, 2]
    ckpt = run / "checkpoints" / "step-00000002" / "model"  # the adapter, not a copy of the model
    assert (ckpt / "adapter_model.safetensors").is_file() and not (ckpt / "config.json").exists()
