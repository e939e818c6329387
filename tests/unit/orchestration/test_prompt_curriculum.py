"""The colocated prompt source with a curriculum: same draws as before when uniform, repetition metrics,
feedback from scored groups, exact resume; the config keys."""

from __future__ import annotations

import pytest

from tandem.algos import CurriculumOptions
from tandem.config import load_config
from tandem.data import PromptDataset, PromptSampler
from tandem.errors import ConfigError
from tandem.orchestration.rollout_step import SequentialPrompts


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
    with pytest.raises(ConfigError, match=r"data\.curriculum\.kind.*colocated"):
        load_config(path, ["data.curriculum.kind=frontier", "architecture.mode=decoupled"])
    with pytest.raises(ConfigError, match=r"data\.curriculum\.revisit"):
        load_config(path, ["data.curriculum.revisit=2"])
