"""Per-group outcomes, advantage-degeneracy metrics and the prompt curricula (pure functions)."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tandem.algos import (
    CURRICULA,
    CurriculumOptions,
    PromptStats,
    TableStats,
    degeneracy_metrics,
    filter_groups,
    group_outcomes,
)


@given(st.lists(st.tuples(st.integers(0, 4), st.sampled_from([0.0, 0.5, 1.0])), min_size=1, max_size=24))
def test_group_outcomes_match_a_loop(pairs: list[tuple[int, float]]) -> None:
    gid = torch.tensor([g for g, _ in pairs])
    scores = torch.tensor([s for _, s in pairs])
    ids, inverse, mean, equal = group_outcomes(scores, gid)
    for j, g in enumerate(ids.tolist()):
        s = scores[gid == g]
        assert mean[j].item() == pytest.approx(s.mean().item())
        assert bool(equal[j]) == bool(s.max() - s.min() <= 1e-6)
    assert torch.equal(ids[inverse], gid)
    keep, kept = filter_groups(scores, gid)  # dynamic sampling keeps exactly the unequal groups
    assert torch.equal(keep, ~equal[inverse])
    assert kept == pytest.approx(float((~equal).float().mean()))


def test_degeneracy_metrics_split_all_solved_from_all_failed() -> None:
    scores = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    gid = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])  # solved, failed, mixed, failed
    m = degeneracy_metrics(scores, gid)
    assert m == {
        "groups/all_equal_frac": 0.75,
        "groups/all_equal_high_frac": 0.25,
        "groups/all_equal_low_frac": 0.5,
    }
    assert degeneracy_metrics(scores[:0], gid[:0]) == {}
    # a batch where nothing was solved: every group is all-equal and none counts as solved
    assert degeneracy_metrics(torch.zeros(4), torch.tensor([0, 0, 1, 1]))["groups/all_equal_low_frac"] == 1.0


def test_prompt_stats_streaks_frontier_and_state() -> None:
    stats = PromptStats()
    assert stats.drawn([3, 5, 3]) == [0, 0, 1]
    stats.observe(3, 1.0, True)
    stats.observe(3, 1.0, True)
    stats.observe(5, 0.5, False)
    assert stats.get(3).streak == 2 and stats.get(5).streak == 0 and stats.get(9).streak == 0
    assert stats.frontier() == [5]
    stats.observe(3, 0.25, False)  # an informative group resets the streak
    assert stats.get(3).streak == 0 and stats.frontier() == [3, 5]
    again = PromptStats()
    again.load_state_dict(stats.state_dict())
    assert again.records == stats.records


def _stream(keys: list[int]):
    it = itertools.cycle(keys)
    return lambda: next(it)


def test_uniform_takes_the_data_order() -> None:
    select = CURRICULA.get("uniform").select
    out = select(4, _stream([7, 1, 4, 2, 9]), PromptStats(), CurriculumOptions(), random.Random(0))
    assert out == [7, 1, 4, 2]


def test_frontier_skips_degenerate_prompts_and_replays_the_frontier() -> None:
    stats = PromptStats()
    for k in range(10):
        stats.observe(k, 1.0, True)  # 0..9 all solved last time
    for k in (20, 21):
        stats.observe(k, 0.5, False)  # frontier
    opts = CurriculumOptions(skip_after=1, revisit=0.0, replay=0.5, max_draws=4)
    select = CURRICULA.get("frontier").select
    out = select(4, _stream(list(range(12))), stats, opts, random.Random(0))
    assert sorted(out[:2]) == [20, 21]  # half the batch replays the frontier
    assert out[2:] == [10, 11]  # candidates 0..9 are skipped, unseen ones taken
    assert len(set(out)) == 4


def test_frontier_fills_from_skipped_candidates_when_everything_is_degenerate() -> None:
    stats = PromptStats()
    for k in range(6):
        stats.observe(k, 0.0, True)
    opts = CurriculumOptions(skip_after=1, revisit=0.0, replay=0.25, max_draws=2)
    out = CURRICULA.get("frontier").select(4, _stream(list(range(6))), stats, opts, random.Random(0))
    assert out == [0, 1, 2, 3]  # no frontier, every candidate skipped: the batch is still full


def test_frontier_revisits_skipped_prompts_with_the_revisit_probability() -> None:
    stats = PromptStats()
    for k in range(1000):
        stats.observe(k, 1.0, True)
    opts = CurriculumOptions(skip_after=1, revisit=0.3, replay=0.0, max_draws=1)
    # with max_draws=1 the batch takes what passes the coin, then fills from the skipped ones in order
    out = CURRICULA.get("frontier").select(1000, _stream(list(range(1000))), stats, opts, random.Random(1))
    rng = random.Random(1)
    passed = [k for k in range(1000) if rng.random() < 0.3]
    assert out[: len(passed)] == passed and 200 < len(passed) < 400
    assert sorted(out) == list(range(1000))


def test_skip_after_counts_consecutive_degenerate_groups() -> None:
    stats = PromptStats()
    stats.observe(0, 1.0, True)
    opts = CurriculumOptions(skip_after=2, revisit=0.0, replay=0.0, max_draws=4)
    out = CURRICULA.get("frontier").select(1, _stream([0, 1]), stats, opts, random.Random(0))
    assert out == [0]  # one all-equal group is not enough to skip with skip_after=2
    stats.observe(0, 1.0, True)
    out = CURRICULA.get("frontier").select(1, _stream([0, 1]), stats, opts, random.Random(0))
    assert out == [1]


def test_curricula_are_registered_and_documented() -> None:
    from pathlib import Path

    assert CURRICULA.names() == ["uniform", "frontier"]
    doc = (Path(__file__).resolve().parents[3] / "docs" / "algorithms.md").read_text()
    assert all(f"### `{name}`" in doc for name in CURRICULA.names())


def test_table_stats_answer_as_the_record_form():
    """The dense table a decoupled learner publishes gives the record form's answers under any sequence
    of draws (repeats within a batch included) and scored groups: records, ``get``, ``frontier``, the
    ``drawn`` counts, the frontier curriculum's picks, and the checkpoint state both ways."""
    rng = random.Random(0)
    records, table = PromptStats(), TableStats.empty(12)
    opts = CurriculumOptions(skip_after=1, revisit=0.2, replay=0.5, max_draws=3)
    for step in range(40):
        keys = [rng.randrange(12) for _ in range(4)]
        assert records.drawn(keys) == table.drawn(keys)
        for k in keys:
            mean, equal = rng.choice([(0.0, True), (1.0, True), (0.5, False), (0.25, False)])
            records.observe(k, mean, equal)
            table.observe(k, mean, equal)
        assert table.records == records.records and table.frontier() == records.frontier()
        assert all(table.get(k) == records.get(k) for k in range(-1, 13))
        order = rng.sample(range(12), 12) * 3  # the same candidates for both
        select = CURRICULA.get("frontier").select
        picks = [select(4, iter(order).__next__, s, opts, random.Random(step)) for s in (records, table)]
        assert picks[0] == picks[1]
    assert torch.equal(records.to_table(12), table.to_table(12))
    back = TableStats.empty(12)
    back.load_state_dict(records.state_dict())
    assert back.records == records.records and table.state_dict() == records.state_dict()
