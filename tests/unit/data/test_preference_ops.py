"""Dedup (exact + near, vs brute force), split by prompt, stats, rebalancing, augmentation hook,
annotator agreement and aggregation."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.data import annotators as ann
from tandem.data import preference_ops as ops
from tandem.data.preference import PreferencePair
from tandem.errors import ConfigError, DataError


def pair(prompt, chosen="good answer here", rejected="bad answer there", category=None):
    return PreferencePair(prompt, chosen, rejected, where="t", category=category)


def test_exact_and_near_duplicates():
    base = pair("what is the capital of france, please tell me")
    near = pair("What is the capital of  France, please tell me")  # case and spacing differ
    typo = pair("what is the capital of france, please tell me", rejected="bad answer therf")  # Jaccard 0.97
    other = pair("completely different question about cooking pasta")
    result = ops.dedup([base, base, near, typo, other])
    assert result.kept == [base, other] and result.exact == [base] and result.near == [near, typo]
    assert ops.dedup([base, typo], near_threshold=0.98).kept == [base, typo]
    assert ops.dedup([base, near], near_threshold=None).kept == [base, near]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.text(alphabet="abc ", min_size=8, max_size=20), min_size=1, max_size=12))
def test_near_dedup_never_keeps_a_pair_above_threshold(prompts):
    """Kept pairs are pairwise below the threshold (LSH candidates are confirmed exactly)."""
    pairs = [pair(p) for p in prompts]
    kept = ops.dedup(pairs, near_threshold=0.8, shingle=3).kept
    sh = [ops._shingles(f"{p.prompt}\x00{p.chosen}\x00{p.rejected}", 3) for p in kept]
    for i in range(len(sh)):
        for j in range(i):
            assert ops._jaccard(sh[i], sh[j]) < 0.8


def test_split_by_prompt_is_disjoint_seeded_and_sized():
    pairs = [pair(f"prompt {i % 50}", chosen=f"c{i}") for i in range(200)]
    train, val = ops.split_by_prompt(pairs, val_fraction=0.2, seed=1)
    assert {p.prompt for p in train}.isdisjoint({p.prompt for p in val})
    assert len({p.prompt for p in val}) == 10 and len(train) + len(val) == 200
    assert ops.split_by_prompt(pairs, val_fraction=0.2, seed=1) == (train, val)
    assert ops.split_by_prompt(pairs, val_fraction=0.2, seed=2)[1] != val
    with pytest.raises(ConfigError):
        ops.split_by_prompt(pairs, val_fraction=1.0)


def test_stats_and_rebalance():
    pairs = [pair(f"p{i}", category="a") for i in range(9)] + [
        pair("q", chosen="much longer chosen answer", category="b")
    ]
    s = ops.preference_stats(pairs)
    assert s["pairs"] == 10 and s["prompts"] == 10 and s["categories"] == {"a": 9, "b": 1}
    assert s["chosen_longer_fraction"] == pytest.approx(0.1)
    balanced = ops.rebalance(pairs, seed=0)
    assert sorted(p.category for p in balanced).count("b") == 9 and len(balanced) == 18
    assert len(ops.rebalance(pairs, seed=0, target=2)) == 4


def test_augmentation_hook(tmp_path):
    hook_file = tmp_path / "hooks.py"
    hook_file.write_text(
        "def upper(row):\n    return [row, {**row, 'prompt': row['prompt'].upper()}]\n"
        "def broken(row):\n    return {**row, 'rejected': row['chosen']}\n"
    )
    out = ops.augment([pair("hello")], ops.load_hook(f"{hook_file}:upper"))
    assert [p.prompt for p in out] == ["hello", "HELLO"]
    with pytest.raises(
        DataError, match="augmentation hook returned an invalid row: 'chosen' and 'rejected' are identical"
    ):
        ops.augment([pair("hello")], ops.load_hook(f"{hook_file}:broken"))
    with pytest.raises(ConfigError, match="not 'module:function'"):
        ops.load_hook("nohook")
    with pytest.raises(ConfigError, match="'missing' is not a callable"):
        ops.load_hook(f"{hook_file}:missing")


def test_cohen_kappa_known_values():
    assert ann.cohen_kappa(["a", "b", "a", "b"], ["a", "b", "a", "b"]) == 1.0
    # 20 items: agreement 0.7, marginals 0.5/0.5 and 0.6/0.4 -> p_e = 0.5, kappa = 0.4
    x = ["a"] * 10 + ["b"] * 10
    y = ["a"] * 8 + ["b"] * 2 + ["a"] * 4 + ["b"] * 6
    assert ann.cohen_kappa(x, y) == pytest.approx((0.7 - 0.5) / 0.5)


def test_fleiss_kappa_matches_wikipedia_example():
    """The worked example on Wikipedia's Fleiss' kappa page: kappa = 0.210."""
    table = [
        [0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0], [2, 2, 8, 1, 1],
        [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2], [6, 5, 2, 1, 0], [0, 2, 2, 3, 7],
    ]  # fmt: skip
    assert ann.fleiss_kappa(table) == pytest.approx(0.210, abs=1e-3)


def test_fleiss_equals_cohen_like_agreement_for_random_labels():
    rng = random.Random(0)
    rows = [{"annotations": [rng.choice("ab") for _ in range(3)]} for _ in range(200)]
    report = ann.agreement(rows)
    assert abs(report.fleiss_kappa) < 0.15 and set(report.pairwise_cohen) == {"0|1", "0|2", "1|2"}


def test_aggregate_majority_and_unanimous():
    rows = [
        {"prompt": "p1", "response_a": "A", "response_b": "B", "annotations": ["a", "a", "b"]},
        {"prompt": "p2", "response_a": "A", "response_b": "B", "annotations": {"x": "b", "y": "b"}},
        {"prompt": "p3", "response_a": "A", "response_b": "B", "annotations": ["a", "b"]},
        {"prompt": "p4", "response_a": "A", "response_b": "B", "annotations": ["tie", "tie", "a"]},
    ]
    kept, dropped = ann.aggregate(rows)
    assert [(r["prompt"], r["chosen"], r["rejected"]) for r in kept] == [("p1", "A", "B"), ("p2", "B", "A")]
    assert dropped == 2
    kept, dropped = ann.aggregate(rows, method="unanimous")
    assert [r["prompt"] for r in kept] == ["p2"] and dropped == 3
    with pytest.raises(DataError, match="row 0: annotation of '0' is 'c'"):
        ann.aggregate([{"annotations": ["c"]}])
