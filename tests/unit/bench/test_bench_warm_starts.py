"""bench/warm_starts.py's chunked SFT build (stopping rule) and bench/learning.py's --variant parsing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_modules import load

ws = load("warm_starts")


def _fake_sft(calls: list[tuple[str, int, int]]):
    def sft(w, folder: Path, start: Path, steps: int, seed: int, out: Path) -> None:
        assert start.is_dir() and start != out
        out.mkdir()
        (out / "from").write_text(start.name)
        calls.append((start.name, steps, seed))

    return sft


def _setup(tmp_path: Path, monkeypatch, accuracies: list[float]):
    calls: list[tuple[str, int, int]] = []
    accs = iter(accuracies)
    monkeypatch.setattr(ws, "_sft", _fake_sft(calls))
    monkeypatch.setattr(ws, "train_greedy", lambda w, model, folder: next(accs))
    (tmp_path / "base").mkdir()
    return calls


def test_chunked_sft_stops_at_the_first_chunk_reaching_the_target(tmp_path, monkeypatch):
    w = ws.WARM_STARTS["add2-mid"]
    calls = _setup(tmp_path, monkeypatch, [0.05, 0.2, 0.3, 0.5])
    info = ws.sft_chunks(w, tmp_path)
    assert info["sft_steps"] == 3 * w.sft_steps
    assert [c["train_greedy"] for c in info["curve"]] == [0.05, 0.2, 0.3]
    # each chunk continues from the previous one's model, with its own data order (seed)
    assert [c[0] for c in calls] == ["base", f"sft{w.sft_steps}", f"sft{2 * w.sft_steps}"]
    assert len({c[2] for c in calls}) == 3
    assert (tmp_path / "model" / "from").read_text() == f"sft{2 * w.sft_steps}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base", "model"]  # intermediate chunks removed


def test_chunked_sft_stops_when_its_budget_is_spent(tmp_path, monkeypatch):
    w = ws.WARM_STARTS["sub2-mid"]
    n = w.max_sft_steps // w.sft_steps
    _setup(tmp_path, monkeypatch, [0.0] * (n + 5))
    info = ws.sft_chunks(w, tmp_path)
    assert info["sft_steps"] == w.max_sft_steps and len(info["curve"]) == n
    assert (tmp_path / "model").is_dir()


def test_presets_and_files_of_a_mid_warm_start(tmp_path):
    mids = [n for n, w in ws.WARM_STARTS.items() if w.strength == "mid"]
    assert len(mids) >= 3 and set(ws.STRENGTHS) == {"weak", "mid"}
    assert all(ws.WARM_STARTS[n].target > 0 and ws.WARM_STARTS[n].max_sft_steps > 0 for n in mids)
    w = ws.WARM_STARTS["sub2-mid"]
    ws.make_files(w, tmp_path)
    read = lambda name: [json.loads(x) for x in (tmp_path / name).read_text().splitlines()]  # noqa: E731
    train, held, sft = read("train.jsonl"), read("eval.jsonl"), read("sft.jsonl")
    assert (len(train), len(held), len(sft)) == (ws.TRAIN_ROWS, ws.EVAL_ROWS, w.sft_rows)
    prompts = [{r["prompt"] for r in rows} for rows in (train, held, sft)]
    assert not (prompts[0] & prompts[1] or prompts[0] & prompts[2] or prompts[1] & prompts[2])
    assert ws.reward(
        [r["prompt"] for r in train[:2]], [train[0]["answer"], "x"], answer=[r["answer"] for r in train[:2]]
    ) == [1.0, 0.0]


def test_learning_variants_parse_and_reject_bad_specs():
    lrn = load("learning")
    v = lrn.parse_variants(["frontier=data.curriculum.kind=frontier,data.curriculum.replay=0"])
    assert v == {"default": (), "frontier": ("data.curriculum.kind=frontier", "data.curriculum.replay=0")}
    for bad in ("frontier", "=a=b", "default=trainer.lr=1"):
        with pytest.raises(SystemExit, match="--variant"):
            lrn.parse_variants([bad])
