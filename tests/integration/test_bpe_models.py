"""Models built by ``init_model(tokenizer="bpe")`` in the training loop and the engines: a 3-step GRPO run
on a Qwen2/BPE model with the ``hf`` engine, one on conversational (``messages``) prompts that go
through the chat template while rewards see TRL's shapes, and greedy parity of the ``vllm`` engine with ``hf`` on one
(skipped, with the reason, where vLLM cannot be imported). Mechanism only: steps run, metrics are finite,
the engines agree; nothing depends on what the runs learn."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from run_checks import step_rows

from tandem.config import build_config
from tandem.errors import ConfigError
from tandem.models import init_model, load_tokenizer
from tandem.monitor.metrics import read_samples
from tandem.orchestration.runner import train
from tandem.rollout import EngineSpec, SamplingParams, build_engine
from tandem.rollout.registry import EngineUnavailableError, engine_class

SMALL = {"hidden_size": 64, "num_layers": 2, "num_heads": 2}  # head size 32 (vLLM's CPU kernels)
GREEDY = SamplingParams(max_new_tokens=10, temperature=0.0)

try:
    engine_class("vllm")
    NO_VLLM = None
except (EngineUnavailableError, ConfigError) as err:
    NO_VLLM = str(err)


@pytest.fixture(scope="module")
def qwen2_bpe(tmp_path_factory) -> Path:
    return init_model(
        tmp_path_factory.mktemp("bpe") / "qwen2", arch="qwen2", tokenizer="bpe", seed=1, **SMALL
    )


def _chat_prompts(path: Path) -> list[str]:
    """Plain task prompts and the same prompts rendered through the model's chat template."""
    tok = load_tokenizer(path)
    plain = ["12+7=", "nums 3 1 5 target 3:", "reverse abc:"]
    chats = [
        tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in plain
    ]
    return plain + chats


def test_grpo_runs_three_steps_on_a_qwen2_bpe_model(tmp_path, qwen2_bpe):
    torch.set_num_threads(1)
    cfg = build_config(
        {
            "run": {"output_dir": str(tmp_path / "run"), "seed": 3},
            "model": {"path": str(qwen2_bpe)},
            "data": {"task": "arith", "prompts_per_step": 4, "eval_size": 0, "train_size": 32},
            "rollout": {"n": 4, "max_new_tokens": 6, "temperature": 1.0, "backend": "hf"},
            "algorithm": {"name": "grpo"},
            "trainer": {"total_steps": 3, "lr": 1e-3},
            "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
            "checkpoint": {"save_final": False},
        }
    )
    rows = step_rows(train(cfg, progress=False).run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        numbers = {k: v for k, v in row.items() if isinstance(v, float)}
        assert numbers and all(math.isfinite(v) for v in numbers.values()), row
        assert row["rollout/logprob_diff_max"] < 1e-4  # the engine scored with the trainer's weights


RECORDER = """
import json, os

def seen(prompts, completions, **columns):
    with open(os.path.join(os.path.dirname(__file__), "seen.jsonl"), "a") as f:
        for p, c in zip(prompts, completions):
            f.write(json.dumps({"prompt": p, "completion": c}) + "\\n")
    return [float(c[0]["content"].strip() == a) for c, a in zip(completions, columns["answer"])]
"""


def test_grpo_on_messages_prompts_renders_the_template_and_rewards_see_messages(tmp_path, qwen2_bpe):
    torch.set_num_threads(1)
    for split in ("train", "eval"):
        rows = [{"prompt": [{"role": "user", "content": f"{i}+1="}], "answer": str(i + 1)} for i in range(8)]
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "recorder.py").write_text(RECORDER)
    cfg = build_config(
        {
            "run": {"output_dir": str(tmp_path / "run"), "seed": 3},
            "model": {"path": str(qwen2_bpe)},
            "data": {
                "train_file": str(tmp_path / "train.jsonl"),
                "eval_file": str(tmp_path / "eval.jsonl"),
                "eval_size": 4,
                "prompts_per_step": 2,
            },
            "reward": {"functions": [{"path": f"{tmp_path / 'recorder.py'}:seen"}]},
            "rollout": {"n": 2, "max_new_tokens": 4, "temperature": 1.0, "backend": "hf"},
            "algorithm": {"name": "grpo"},
            "trainer": {"total_steps": 2, "lr": 1e-3},
            "monitor": {"eval_every": 2, "sample_every": 1, "tensorboard": False, "progress": False},
            "checkpoint": {"save_final": False},
        }
    )
    run_dir = train(cfg, progress=False).run_dir
    assert [r["step"] for r in step_rows(run_dir)] == [1, 2]
    samples = read_samples(run_dir)
    assert samples and all(
        s["prompt"].startswith("<|im_start|>user\n") and s["prompt"].endswith("<|im_start|>assistant\n")
        for s in samples
    )  # the engine generated from the chat template's text
    seen = [json.loads(line) for line in (tmp_path / "seen.jsonl").read_text().splitlines()]
    assert len(seen) >= 2 * 2 * 2  # both training steps (and the evaluation) scored
    for s in seen:
        assert s["prompt"][0]["role"] == "user" and s["prompt"][0]["content"].endswith("+1=")
        assert [m["role"] for m in s["completion"]] == ["assistant"]
        assert "<|im_end|>" not in s["completion"][0]["content"]


@pytest.mark.skipif(NO_VLLM is not None, reason=f"vLLM not importable: {NO_VLLM}")
def test_vllm_greedy_equals_hf_on_a_qwen2_bpe_model(qwen2_bpe):
    prompts = _chat_prompts(qwen2_bpe)
    vllm = build_engine("vllm", EngineSpec(path=str(qwen2_bpe)))
    try:
        a = vllm.generate(prompts, GREEDY)
        b = build_engine("hf", EngineSpec(path=str(qwen2_bpe))).generate(prompts, GREEDY)
        assert torch.equal(a.prompt_ids, b.prompt_ids) and torch.equal(a.response_ids, b.response_ids)
        assert a.completions == b.completions and a.finish_reasons == b.finish_reasons
        torch.testing.assert_close(a.behavior_logprobs, b.behavior_logprobs, atol=1e-4, rtol=0)
    finally:
        vllm.close()
