"""bench/tune_check.py's judge: a test file of new prompts, disjoint from every file of the warm start."""

from __future__ import annotations

import json

from bench_modules import load

ws = load("warm_starts")  # tune_check imports it by name
tc = load("tune_check")


def test_test_file_holds_only_prompts_no_other_file_has(tmp_path, monkeypatch):
    w = ws.WARM_STARTS["add2-mid"]
    ws.make_files(w, tmp_path)
    monkeypatch.setattr(tc, "TEST_ROWS", 50)
    path = tc.test_file(w, tmp_path)
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    others = {
        json.loads(x)["prompt"]
        for name in ("train.jsonl", "eval.jsonl", "sft.jsonl")
        for x in (tmp_path / name).read_text().splitlines()
    }
    assert len(rows) == 50 and len({r["prompt"] for r in rows}) == 50
    assert not others & {r["prompt"] for r in rows}
    assert all(r["prompt"].startswith("add: ") and r["answer"].lstrip("-").isdigit() for r in rows)
    assert tc.test_file(w, tmp_path).read_text() == path.read_text()  # kept: the same judge on a rerun
