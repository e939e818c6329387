"""``build_data``: ``data.eval_size`` draws a task's held-out prompts; an eval file is taken whole, and
``eval_size: 0`` turns evaluation off for both."""

from __future__ import annotations

import json

from tandem.config.data import DataConfig
from tandem.orchestration.build import build_data


def test_eval_size_counts_task_prompts_and_zero_turns_eval_off(tmp_path) -> None:
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(7)]
    for name in ("train", "eval"):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    files = {"train_file": str(tmp_path / "train.jsonl"), "eval_file": str(tmp_path / "eval.jsonl")}
    assert len(build_data(DataConfig(**files, eval_size=3), seed=0).eval) == 7  # a file: every row
    assert build_data(DataConfig(**files, eval_size=0), seed=0).eval is None
    task = {"task": "arith", "task_options": {"digits": 2}, "train_size": 8}
    assert len(build_data(DataConfig(**task, eval_size=5), seed=0).eval) == 5
    assert build_data(DataConfig(**task, eval_size=0), seed=0).eval is None
