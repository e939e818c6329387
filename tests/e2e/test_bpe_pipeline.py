"""A Qwen2/BPE model built by ``tandem init-model`` goes through SFT -> GRPO -> export -> serve, and the
served chat endpoint formats messages with the model's ChatML template. Mechanism only: every command
succeeds and hands the next one a loadable folder; nothing depends on what the model learns."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tandem.cli.main import app
from tandem.models import load_tokenizer

pytest.importorskip("fastapi")
ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--hidden-size", "64", "--num-layers", "2", "--num-heads", "2"]


def _ok(*args: object) -> None:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output


def test_qwen2_bpe_model_through_sft_grpo_export_and_serve(tmp_path):
    from fastapi.testclient import TestClient

    from tandem.serve.server import build_state, make_app
    from tandem.serve.state import ServeSettings

    base, sft, run, exported = (tmp_path / n for n in ("base", "sft", "run", "exported"))
    _ok("init-model", base, "--arch", "qwen2", "--tokenizer", "bpe", *SMALL)
    _ok(
        "sft",
        base,
        "--task",
        "arith",
        "--steps",
        "3",
        "--batch-size",
        "8",
        "--train-size",
        "32",
        "--out",
        sft,
    )
    overrides = [
        f"model.path={sft}",
        f"run.output_dir={run}",
        "trainer.total_steps=2",
        "monitor.eval_every=0",
    ]
    overrides += [
        "monitor.progress=false",
        "monitor.tensorboard=false",
        "data.prompts_per_step=2",
        "rollout.n=2",
    ]
    _ok("train", ROOT / "configs" / "quickstart.yaml", *overrides)
    _ok("export", run, "--format", "hf", "--out", exported)
    tok = load_tokenizer(exported)
    messages = [{"role": "user", "content": "12+7="}]
    expected = len(tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=False))
    state = build_state({"main": str(exported)}, ServeSettings(max_tokens_limit=16), name="bpe")
    with TestClient(make_app(state)) as client:
        body = {"model": "bpe", "messages": messages, "max_tokens": 4, "temperature": 0}
        reply = client.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    out = reply.json()
    assert out["usage"]["prompt_tokens"] == expected  # the server rendered the ChatML template
    assert "<|im_end|>" not in out["choices"][0]["message"]["content"]
