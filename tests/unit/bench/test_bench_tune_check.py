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


def test_confirmation_reads_tunes_verdict(tmp_path):
    log = tmp_path / "tune.jsonl"
    verdict = {"promote": False, "wins": 21, "losses": 18, "p_value": 0.75, "alpha": 0.05}
    log.write_text(
        json.dumps({"trial": 0, "overrides": ["trainer.lr=1e-4"], "steps": 300, "value": 0.6})
        + "\n"
        + json.dumps({"confirm": verdict, "overrides": ["trainer.lr=1e-4"]})
        + "\n"
    )
    assert tc.confirmation(log) == "; config kept: trainer.lr=1e-4 21 better / 18 worse, p=0.75"
    log.write_text(json.dumps({"trial": 0, "overrides": [], "steps": 300, "value": 0.6}) + "\n")
    assert tc.confirmation(log) == ""  # the winner was the config itself: nothing to confirm
