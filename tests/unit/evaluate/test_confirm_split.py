"""``split_held_out``: a prompt-file config's held-out file in two disjoint halves (by prompt, every column
kept, the same halves for the same seed), or the reason it stays whole."""

from __future__ import annotations

import json
from types import SimpleNamespace

from tandem.evaluate.confirm import MIN_SPLIT, HeldOutSplit, split_held_out


def _cfg(tmp_path, rows):
    path = tmp_path / "eval.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return SimpleNamespace(data=SimpleNamespace(eval_file=str(path)))


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_halves_are_disjoint_by_prompt_and_keep_every_row_and_column(tmp_path):
    rows = [{"prompt": f"{a}+1=", "answer": str(a + 1), "id": a} for a in range(MIN_SPLIT + 11)]
    rows += [{"prompt": "3+1=", "answer": "4", "id": -1}]  # a repeated prompt stays in one half
    split = split_held_out(_cfg(tmp_path, rows), tmp_path, seed=0)
    assert isinstance(split, HeldOutSplit)
    rank, confirm = _rows(split.rank), _rows(split.confirm)
    assert (split.ranked, split.confirming) == (len(rank), len(confirm))
    assert not {r["prompt"] for r in rank} & {r["prompt"] for r in confirm}
    assert sorted(rank + confirm, key=lambda r: r["id"]) == sorted(rows, key=lambda r: r["id"])
    assert abs(len({r["prompt"] for r in rank}) - len({r["prompt"] for r in confirm})) <= 1


def test_same_seed_same_halves_another_seed_others(tmp_path):
    cfg = _cfg(tmp_path, [{"prompt": f"{a}-1="} for a in range(MIN_SPLIT)])
    halves = []
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        (tmp_path / name).mkdir()
        halves.append(split_held_out(cfg, tmp_path / name, seed=seed).rank.read_text())
    assert halves[0] == halves[1] != halves[2]


def test_too_few_distinct_prompts_stay_whole_with_the_reason(tmp_path):
    rows = [{"prompt": f"{a % (MIN_SPLIT - 1)}*2="} for a in range(2 * MIN_SPLIT)]  # repeats do not count
    why = split_held_out(_cfg(tmp_path, rows), tmp_path, seed=0)
    assert why == f"{MIN_SPLIT - 1} distinct held-out prompts, fewer than the {MIN_SPLIT} a split needs"
    assert not (tmp_path / "held_out_rank.jsonl").exists()
