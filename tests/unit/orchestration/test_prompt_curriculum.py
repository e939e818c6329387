"""The prompt sources (colocated and ticket) with a curriculum: same draws as before when uniform, the same
picks in both architectures, repetition metrics, feedback from scored groups, exact resume; the config keys."""

from __future__ import annotations

import pytest

from tandem.algos import CurriculumOptions, PromptStats
from tandem.config import load_config
from tandem.data import PromptDataset, PromptSampler
from tandem.errors import ConfigError
from tandem.orchestration.rollout_step import SequentialPrompts, TicketPrompts


def dataset(n: int) -> PromptDataset:
    return PromptDataset.from_rows([{"prompt": f"p{i}", "i": i} for i in range(n)], source="mem")


def test_uniform_source_draws_exactly_the_sampler_batches() -> None:
    src = SequentialPrompts(dataset(10), batch_size=4, seed=3)
    ref = PromptSampler(dataset(10), batch_size=4, seed=3)
    for step in range(6):
        assert [r["i"] for r in src.rows(step, 0)] == [r["i"] for r in ref.next_batch()]


def test_repetition_metrics_count_earlier_draws() -> None:
    src = SequentialPrompts(dataset(8), batch_size=4, seed=0)
    src.rows(0, 0)
    assert src.draw_metrics()["prompts/seen_before_mean"] == 0.0
    assert src.draw_metrics()["prompts/first_time_frac"] == 1.0
    src.rows(1, 0)
    src.rows(2, 0)  # the second epoch: every prompt seen once before
    m = src.draw_metrics()
    assert m["prompts/seen_before_mean"] == 1.0 and m["prompts/epoch"] == 1.0


def _scored(src: SequentialPrompts, solved: set[int]) -> list[int]:
    """Draw, then tell the source each group was all-solved (prompt in ``solved``) or mixed."""
    rows = src.rows(0, 0)
    keys = [r["i"] for r in rows]
    src.observe(list(range(len(rows))), [1.0] * len(rows), [k in solved for k in keys])
    return keys


def test_frontier_source_stops_drawing_solved_prompts() -> None:
    opts = CurriculumOptions(skip_after=1, revisit=0.0, replay=0.0, max_draws=4)
    src = SequentialPrompts(dataset(12), batch_size=3, seed=0, curriculum="frontier", options=opts)
    solved: set[int] = set()
    for _ in range(4):  # epoch 0: every prompt once; mark the even ones solved
        solved |= {k for k in _scored(src, set(range(0, 12, 2))) if k % 2 == 0}
    later = [k for _ in range(4) for k in _scored(src, solved)]
    assert not set(later) & solved  # only the unsolved half is drawn again
    assert "prompts/frontier_size" in src.draw_metrics()


def test_frontier_source_resumes_exactly() -> None:
    opts = CurriculumOptions(skip_after=1, revisit=0.2, replay=0.5, max_draws=3)
    a = SequentialPrompts(dataset(20), batch_size=4, seed=1, curriculum="frontier", options=opts)
    for step in range(5):
        a.rows(step, 0)
        a.observe([0, 1, 2, 3], [1.0, 0.0, 0.5, 1.0], [True, True, False, step % 2 == 0])
    b = SequentialPrompts(dataset(20), batch_size=4, seed=1, curriculum="frontier", options=opts)
    b.load_state_dict(a.state_dict())
    for step in range(5, 10):
        assert a.rows(step, 0) == b.rows(step, 0)
        a.observe([0, 1, 2, 3], [1.0, 0.0, 0.5, 1.0], [True, False, False, True])
        b.observe([0, 1, 2, 3], [1.0, 0.0, 0.5, 1.0], [True, False, False, True])


def test_old_checkpoint_state_without_prompt_stats_loads() -> None:
    a = SequentialPrompts(dataset(6), batch_size=2, seed=0)
    a.rows(0, 0)
    state = a.state_dict()
    del state["prompt_stats"]
    b = SequentialPrompts(dataset(6), batch_size=2, seed=0)
    b.load_state_dict(state)
    assert b.rows(1, 0) == a.rows(1, 0)


BASE = "run: {name: t}\nmodel: {path: m}\ndata: {task: arith}\nrollout: {n: 4}\n"


def test_curriculum_config_keys(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(BASE)
    cfg = load_config(path, ["data.curriculum.kind=frontier", "data.curriculum.replay=0.5"])
    assert cfg.data.curriculum.kind == "frontier" and cfg.data.curriculum.replay == 0.5
    assert load_config(path, []).data.curriculum.kind == "uniform"
    with pytest.raises(ConfigError, match=r"data\.curriculum\.kind.*valid: uniform, frontier"):
        load_config(path, ["data.curriculum.kind=hardest"])
    decoupled = load_config(path, ["data.curriculum.kind=frontier", "architecture.mode=decoupled"])
    assert decoupled.data.curriculum.kind == "frontier"  # workers curate too
    with pytest.raises(ConfigError, match=r"data\.curriculum\.revisit"):
        load_config(path, ["data.curriculum.revisit=2"])


def test_ticket_source_draws_the_sequential_batches_without_a_curriculum() -> None:
    """Ticket k is the colocated step-k batch, whichever order tickets come in; refills are seeded."""
    seq = SequentialPrompts(dataset(10), batch_size=4, seed=3)
    batches = [seq.rows(step, 0) for step in range(5)]
    tickets = TicketPrompts(dataset(10), batch_size=4, seed=3, max_rounds=2)
    for step in (0, 1, 3, 2, 4):  # an older ticket re-assigned restarts the stream
        assert tickets.rows(step, 0) == batches[step]
    other = TicketPrompts(dataset(10), batch_size=4, seed=3, max_rounds=2)
    assert other.rows(3, 1) == tickets.rows(3, 1)  # any worker refills ticket 3 with the same prompts
    assert tickets.group_offset(3, 0, 4) == 12 and tickets.group_offset(3, 1, 4) >= 1 << 40


def test_ticket_source_curates_as_the_sequential_source_does() -> None:
    """A worker's ticket source whose statistics come from the learner (its reports replayed, the table
    published back) picks the colocated source's prompts step by step (what makes η = 0 with one worker
    exact with a curriculum), and the curriculum did skip."""
    opts = CurriculumOptions(skip_after=1, revisit=0.1, replay=0.25, max_draws=4)
    seq = SequentialPrompts(dataset(16), batch_size=4, seed=2, curriculum="frontier", options=opts)
    tickets = TicketPrompts(dataset(16), 4, seed=2, max_rounds=1, curriculum="frontier", options=opts)
    learner, uniform = PromptStats(), PromptSampler(dataset(16), batch_size=4, seed=2)
    differs = False
    for step in range(12):
        a, b = seq.rows(step, 0), tickets.rows(step, 0)
        assert a == b, step
        differs |= [r["i"] for r in a] != uniform.next_indices()
        solved = [r["i"] % 3 == 0 for r in a]  # a third of the prompts always solved, the rest mixed
        for src in (seq, tickets):
            src.observe(list(range(4)), [1.0 if s else 0.5 for s in solved], solved)
        assert seq.draw_metrics() == tickets.draw_metrics()
        learner.apply(tickets.take_report())
        tickets.stats = PromptStats()  # forget the worker's own: only the learner's table counts
        tickets.follow_stats(learner.to_table(16))
        assert tickets.stats.records == seq.stats.records
    assert differs, "the curriculum never changed a batch: the test would not exercise it"
    with pytest.raises(ConfigError, match="cover 15 prompts, this worker's training set has 16"):
        tickets.follow_stats(learner.to_table(15))


def test_frontier_fills_from_the_side_stream_when_the_batch_is_solved() -> None:
    """Every prompt of the round's batch known solved: the picks come from the seeded side stream, the
    same for any source at that (seed, step, round)."""
    opts = CurriculumOptions(skip_after=1, revisit=0.0, replay=0.0, max_draws=4)
    src = SequentialPrompts(dataset(40), batch_size=4, seed=0, curriculum="frontier", options=opts)
    batch = PromptSampler(dataset(40), batch_size=4, seed=0)
    first, second = batch.next_indices(), batch.next_indices()
    for key in second:
        src.stats.observe(key, 1.0, True)
    assert [r["i"] for r in src.rows(0, 0)] == first
    picked = [r["i"] for r in src.rows(1, 0)]
    assert not set(picked) & set(second) and len(set(picked)) == 4
