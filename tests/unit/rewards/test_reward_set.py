"""RewardSet: weighted sums, None handling, output validation, on_error modes; format and shaping helpers."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.algos.dapo import overlong_penalty
from tandem.errors import ConfigError, RewardError
from tandem.rewards import (
    RewardFunction,
    RewardSet,
    TrainerState,
    format_regex,
    get_task,
    overlong_shaping,
)

PROMPTS = ["a", "b", "c"]
COMPLETIONS = ["x", "yy", "zzz"]


def const(values):
    def reward(prompts, completions, **columns):
        return list(values)

    return reward


def length_reward(prompts, completions, **columns):
    return [float(len(c)) for c in completions]


def picky(prompts, completions, **columns):
    """Raises on any batch that contains 'yy'."""
    if "yy" in completions:
        raise ValueError("cannot score 'yy'")
    return [1.0] * len(completions)


def test_weighted_sum_and_columns_are_passed():
    seen = {}

    def spy(prompts, completions, **columns):
        seen.update(columns)
        return [0.5] * len(completions)

    rs = RewardSet([RewardFunction("len", length_reward, 2.0), RewardFunction("spy", spy, -1.0)])
    out = rs(PROMPTS, COMPLETIONS, {"answer": ["1", "2", "3"]})
    assert out.scores.dtype == torch.float32 and out.scores.shape == (3,)
    assert out.scores.tolist() == [1.5, 3.5, 5.5]
    assert seen == {"answer": ["1", "2", "3"], "trainer_state": None}  # None: outside a training run
    assert out.per_function["len"].tolist() == [1.0, 2.0, 3.0]
    assert out.metrics["reward/len/mean"] == 2.0 and out.metrics["reward/spy/mean"] == 0.5
    assert out.metrics["reward/errors"] == 0.0 and out.metrics["reward/none_count"] == 0.0


def test_none_is_not_applicable():
    rs = RewardSet(
        [RewardFunction("a", const([None, 1.0, None])), RewardFunction("b", const([None, None, 2.0]), 3.0)]
    )
    out = rs(PROMPTS, COMPLETIONS)
    assert out.scores.tolist() == [0.0, 1.0, 6.0]
    assert math.isnan(out.per_function["a"][0]) and out.per_function["a"][1] == 1.0
    assert out.metrics["reward/none_count"] == 1.0
    assert out.metrics["reward/none_frac"] == pytest.approx(1 / 3)
    assert out.metrics["reward/a/mean"] == 1.0 and out.metrics["reward/a/none_frac"] == pytest.approx(2 / 3)


def test_all_none_omits_function_mean():
    out = RewardSet([RewardFunction("a", const([None] * 3))])(PROMPTS, COMPLETIONS)
    assert out.scores.tolist() == [0.0] * 3 and "reward/a/mean" not in out.metrics
    assert out.metrics["reward/none_count"] == 3.0


def test_accepts_tuples_arrays_tensors_and_numpy_scalars():
    fns = [
        RewardFunction("t", const((1, 2, 3))),
        RewardFunction("np", lambda p, c, **k: np.array([1.0, 2.0, 3.0], dtype=np.float32)),
        RewardFunction("torch", lambda p, c, **k: torch.tensor([1.0, 2.0, 3.0])),
        RewardFunction("scalars", const([np.float32(1), torch.tensor(2.0), True])),
    ]
    assert RewardSet(fns)(PROMPTS, COMPLETIONS).scores.tolist() == [4.0, 8.0, 10.0]


def test_raising_function_names_reward_exception_and_origin():
    rs = RewardSet([RewardFunction("picky", picky)])
    with pytest.raises(RewardError) as info:
        rs(PROMPTS, COMPLETIONS)
    assert str(info.value) == (f"reward 'picky' raised ValueError: cannot score 'yy' ({__name__}:picky)")


def test_exception_without_message():
    def boom(prompts, completions, **columns):
        raise KeyError

    with pytest.raises(RewardError, match=r"^reward 'boom' raised KeyError \(.*:.*boom\)$"):
        RewardSet([RewardFunction("boom", boom)])(PROMPTS, COMPLETIONS)


def test_skip_mode_isolates_failing_samples_and_counts_them(caplog):
    rs = RewardSet([RewardFunction("picky", picky), RewardFunction("len", length_reward)], on_error="skip")
    with caplog.at_level(logging.WARNING, logger="tandem.rewards.functions"):
        out = rs(PROMPTS, COMPLETIONS)
    assert out.per_function["picky"].tolist() == [1.0, 0.0, 1.0]
    assert out.scores.tolist() == [2.0, 2.0, 4.0]
    assert out.metrics["reward/errors"] == 1.0 and out.metrics["reward/picky/errors"] == 1.0
    assert any("on 1 of 3 samples (first: index 1)" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("on_error", ["raise", "skip"])
@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([1.0, 2.0], "reward 'bad' returned 2 values for 3 completions; expected length 3"),
        ([1.0, 2.0, 3.0, 4.0], "returned 4 values for 3 completions"),
        ([1.0, float("nan"), 0.0], "reward 'bad' returned nan at index 1"),
        ([1.0, 0.0, float("inf")], "returned inf at index 2"),
        ([1.0, "1", 0.0], "returned str '1' at index 1, expected a float or None"),
        (
            [1.0, 1e301, 0.0],
            "returned 1e+301 at index 1, beyond the float32 range of scores",
        ),  # inf as float32
        ([1.0, 0.0, 10**400], "returned 1000000000000000000000000000000000000000 at index 2"),  # past float
        (1.0, "returned float, expected a list of 3 floats"),
        ("abc", "returned str, expected a list"),
        ({"a": 1}, "returned dict, expected a list"),
    ],
)
def test_bad_outputs_always_raise(values, message, on_error):
    rs = RewardSet(
        [RewardFunction("bad", const(values) if isinstance(values, list) else lambda p, c, **k: values)],
        on_error=on_error,
    )
    with pytest.raises(RewardError, match=re.escape(message)):
        rs(PROMPTS, COMPLETIONS)


def test_reserved_column_name_and_mismatched_batch():
    rs = RewardSet([RewardFunction("len", length_reward)])
    with pytest.raises(RewardError, match="column 'completions' clashes"):
        rs(PROMPTS, COMPLETIONS, {"completions": [1, 2, 3]})
    with pytest.raises(ValueError, match="column 'answer' has 2 values for 3"):
        rs(PROMPTS, COMPLETIONS, {"answer": [1, 2]})
    with pytest.raises(ValueError, match="2 prompts for 3 completions"):
        rs(PROMPTS[:2], COMPLETIONS)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: RewardSet([RewardFunction("a", length_reward)] * 2), "duplicate reward name(s): a"),
        (lambda: RewardSet([RewardFunction("a", length_reward)], on_error="ignore"), "on_error must be"),
        (lambda: RewardFunction("a", 3), "not a callable"),
        (lambda: RewardFunction("a/b", length_reward), "contain no '/'"),
        (lambda: RewardFunction("a", length_reward, float("nan")), "weight must be finite"),
        (lambda: RewardFunction("a", length_reward, "1"), "weight must be a number"),
    ],
)
def test_construction_errors(build, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        build()


def test_an_empty_set_scores_zero():
    # A run whose rewards all come from its environment's episodes has no reward functions.
    result = RewardSet([])(PROMPTS, COMPLETIONS)
    assert result.scores.tolist() == [0.0] * len(COMPLETIONS) and result.per_function == {}


def test_from_spec_and_task_reward_in_a_set():
    rf = RewardFunction.from_spec("tandem.rewards.tasks.countdown:is_solution", weight=0.5)
    assert rf.name == "is_solution" and rf.weight == 0.5
    task = get_task("arith")
    rows = task.make_rows("train", 4, 0)
    rs = RewardSet(
        [RewardFunction(task.name, task.reward), RewardFunction("fmt", format_regex(r"-?\d+"), 0.1)]
    )
    completions = [rows[0]["answer"], "nope", rows[2]["answer"] + "\n", "12"]
    out = rs([r["prompt"] for r in rows], completions, {"answer": [r["answer"] for r in rows]})
    expected_fmt = [0.1, 0.0, 0.1, 0.1]
    expected_task = [1.0, 0.0, 1.0, float(rows[3]["answer"] == "12")]
    assert out.scores.tolist() == pytest.approx(
        [a + b for a, b in zip(expected_task, expected_fmt, strict=True)]
    )


@settings(max_examples=40, deadline=None)
@given(
    data=st.lists(
        st.tuples(st.one_of(st.none(), st.floats(-10, 10)), st.one_of(st.none(), st.floats(-10, 10))),
        min_size=1,
        max_size=8,
    ),
    w1=st.floats(-3, 3),
    w2=st.floats(-3, 3),
)
def test_scores_equal_loop_reference(data, w1, w2):
    a, b = [x for x, _ in data], [y for _, y in data]
    rs = RewardSet([RewardFunction("a", const(a), w1), RewardFunction("b", const(b), w2)])
    out = rs([""] * len(data), [""] * len(data))
    ref = [(w1 * x if x is not None else 0.0) + (w2 * y if y is not None else 0.0) for x, y in data]
    assert out.scores.tolist() == pytest.approx(ref, abs=1e-5)
    assert out.metrics["reward/none_count"] == sum(x is None and y is None for x, y in data)


def test_format_regex():
    fmt = format_regex(r"\d+")
    assert fmt([""] * 4, ["12", " 12\n", "12a", ""]) == [1.0, 1.0, 0.0, 0.0]
    assert format_regex(r"\d+", strip=False)([""], [" 12"]) == [0.0]
    assert repr(fmt) == "format_regex('\\\\d+')"
    with pytest.raises(ConfigError, match=r"invalid pattern '\(' "):
        format_regex("(")


def test_overlong_shaping_delegates_to_dapo():
    lengths = torch.tensor([1, 10, 12, 14, 16, 30])
    got = overlong_shaping(lengths, max_len=16, buffer=4, factor=0.5)
    assert torch.equal(got, overlong_penalty(lengths, 16, 4, 0.5))
    assert got.tolist() == [0.0, 0.0, 0.0, -0.25, -0.5, -0.5]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_len": 0, "buffer": 0}, "max_len must be > 0"),
        ({"max_len": 8, "buffer": 9}, "buffer must be in 0..max_len"),
        ({"max_len": 8, "buffer": 2, "factor": -1.0}, "factor must be >= 0"),
    ],
)
def test_overlong_shaping_bad_settings(kwargs, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        overlong_shaping(torch.tensor([1]), **kwargs)


# -- how a function takes its arguments (TRL calls by keyword) -------------------------------------------


def test_trl_style_function_without_prompts_gets_completions_by_name():
    seen = {}

    def accuracy(completions, solution, **kwargs):  # TRL's documented shape
        seen.update(kwargs)
        return [float(c == s) for c, s in zip(completions, solution, strict=True)]

    rs = RewardSet([RewardFunction("acc", accuracy)])
    out = rs(PROMPTS, ["x", "no", "zzz"], {"solution": ["x", "yy", "zzz"], "other": [1, 2, 3]})
    assert out.scores.tolist() == [1.0, 0.0, 1.0]
    # prompts (and trainer_state) arrive among the keywords, as in TRL
    assert seen == {"prompts": PROMPTS, "other": [1, 2, 3], "trainer_state": None}


def test_function_without_kwargs_gets_only_the_columns_it_names():
    def exact(prompts, completions, answer):
        return [float(c == a) for c, a in zip(completions, answer, strict=True)]

    rs = RewardSet([RewardFunction("exact", exact)])
    out = rs(PROMPTS, COMPLETIONS, {"answer": ["x", "y", "zzz"], "difficulty": [1, 2, 3]})
    assert out.scores.tolist() == [1.0, 0.0, 1.0]


def test_function_naming_only_completions_gets_no_prompts():
    def nonempty(completions):
        return [float(bool(c)) for c in completions]

    assert RewardSet([RewardFunction("n", nonempty)])(PROMPTS, ["a", "", "b"]).scores.tolist() == [1, 0, 1]


def test_function_with_other_parameter_names_takes_them_by_position():
    class Scorer:
        def __call__(self, ps, cs, *, bonus=None):
            return [len(c) + (b or 0.0) for c, b in zip(cs, bonus or [None] * len(cs), strict=True)]

    out = RewardSet([RewardFunction("len", Scorer())])(PROMPTS, COMPLETIONS, {"bonus": [1.0] * 3})
    assert out.scores.tolist() == [2.0, 3.0, 4.0]
    out = RewardSet([RewardFunction("len", lambda p, c: [0.5] * len(c))])(
        PROMPTS, COMPLETIONS, {"x": [1] * 3}
    )
    assert out.scores.tolist() == [0.5] * 3


def test_keyword_binding_also_holds_when_retrying_sample_by_sample():
    def flaky(completions, answer, **kwargs):
        if len(completions) > 1:
            raise ValueError("batch too large")
        return [float(completions[0] == answer[0])]

    rs = RewardSet([RewardFunction("f", flaky)], on_error="skip")
    out = rs(PROMPTS, COMPLETIONS, {"answer": ["x", "no", "zzz"]})
    assert out.scores.tolist() == [1.0, 0.0, 1.0] and out.metrics["reward/errors"] == 0.0


def test_check_columns_refuses_a_function_needing_an_absent_column():
    def needs(completions, solution, *, level, hint=None, **kwargs):
        return [0.0] * len(completions)

    rs = RewardSet([RewardFunction("acc", needs, source="rewards.py:needs")])
    rs.check_columns(["solution", "level"])  # present: nothing to say
    with pytest.raises(ConfigError) as err:
        rs.check_columns(["answer", "level"], source="train.jsonl")
    msg = str(err.value)
    assert "reward 'acc' (rewards.py:needs) needs argument 'solution'" in msg
    assert "train.jsonl" in msg and "(its columns: answer, level)" in msg and "\n" not in msg
    with pytest.raises(ConfigError, match="needs arguments 'solution', 'level'.*none besides 'prompt'"):
        rs.check_columns([])


def test_check_columns_accepts_the_documented_signatures():
    fns = [length_reward, const([1.0] * 3), lambda p, c: [0.0] * len(c), get_task("arith").reward]
    RewardSet([RewardFunction(f"f{i}", fn) for i, fn in enumerate(fns)]).check_columns([])


def test_errors_name_the_configured_source():
    def boom(prompts, completions, **columns):
        raise ValueError("bad")

    with pytest.raises(RewardError, match=r"\(my/rewards\.py:boom\)$"):
        RewardSet([RewardFunction("b", boom, source="my/rewards.py:boom")])(PROMPTS, COMPLETIONS)


def test_completion_ids_reach_the_functions_that_take_them():
    seen = {}

    def by_tokens(completions, completion_ids, **kwargs):
        return [float(len(ids)) for ids in completion_ids]

    def spy(prompts, completions, **kwargs):
        seen.update(kwargs)
        return [0.0] * len(completions)

    def plain(prompts, completions):
        return [1.0] * len(completions)

    rs = RewardSet([RewardFunction("t", by_tokens), RewardFunction("s", spy), RewardFunction("p", plain)])
    ids = [[5], [6, 7], [8, 9, 10]]
    out = rs(PROMPTS, COMPLETIONS, {"answer": [1, 2, 3]}, completion_ids=ids)
    assert out.per_function["t"].tolist() == [1.0, 2.0, 3.0] and out.scores.tolist() == [2.0, 3.0, 4.0]
    assert seen == {"answer": [1, 2, 3], "completion_ids": ids, "trainer_state": None}  # as in TRL
    with pytest.raises(ValueError, match="2 completion_ids for 3 completions"):
        rs(PROMPTS, COMPLETIONS, completion_ids=ids[:2])
    with pytest.raises(RewardError, match="'completion_ids' clashes"):
        rs(PROMPTS, COMPLETIONS, {"completion_ids": ids})


def test_completion_ids_are_sliced_when_retrying_sample_by_sample():
    def flaky(completions, completion_ids, **kwargs):
        if len(completions) > 1:
            raise ValueError("batch too large")
        return [float(completion_ids[0][0])]

    out = RewardSet([RewardFunction("f", flaky)], on_error="skip")(
        PROMPTS, COMPLETIONS, completion_ids=[[4], [5], [6]]
    )
    assert out.scores.tolist() == [4.0, 5.0, 6.0]


def test_check_columns_counts_completion_ids_only_where_they_are_passed():
    def by_tokens(completions, completion_ids):
        return [0.0] * len(completions)

    rs = RewardSet([RewardFunction("t", by_tokens)])
    rs.check_columns([])
    with pytest.raises(ConfigError, match="needs argument 'completion_ids'"):
        rs.check_columns([], token_ids=False)


def test_trainer_state_reaches_the_functions_that_name_it():
    def warmup(completions, trainer_state, **kwargs):  # a schedule, as TRL users write one
        return [0.0 if trainer_state.global_step < 10 else 1.0] * len(completions)

    def plain(prompts, completions):  # does not take it: not passed
        return [1.0] * len(completions)

    rs = RewardSet([RewardFunction("w", warmup), RewardFunction("p", plain)])
    rs.check_columns([])  # always passed: nothing to refuse
    early, late = TrainerState(3, 100, 0.1), TrainerState(12, 100, 0.4)
    assert rs(PROMPTS, COMPLETIONS, trainer_state=early).scores.tolist() == [1.0, 1.0, 1.0]
    assert rs(PROMPTS, COMPLETIONS, trainer_state=late).scores.tolist() == [2.0, 2.0, 2.0]
    with pytest.raises(RewardError, match="'trainer_state' clashes"):
        rs(PROMPTS, COMPLETIONS, {"trainer_state": [1, 2, 3]})


def test_async_functions_run_concurrently_and_are_checked():
    """Two judges that each wait for the other to have started: run one after the other, the first would
    wait forever (here: 10 s, then fail)."""
    started: dict[str, asyncio.Event] = {}

    def judge(name, other, values):
        async def score(prompts, completions, **kwargs):
            started.setdefault(name, asyncio.Event()).set()
            await asyncio.wait_for(started.setdefault(other, asyncio.Event()).wait(), 10)
            return values(completions)

        return score

    rs = RewardSet(
        [
            RewardFunction("a", judge("a", "b", lambda cs: [float(len(c)) for c in cs])),
            RewardFunction("b", judge("b", "a", lambda cs: [None, 1.0, None])),
            RewardFunction("l", length_reward),
        ]
    )
    out = rs(PROMPTS, COMPLETIONS)
    assert out.scores.tolist() == [2.0, 5.0, 6.0]
    assert out.per_function["b"].isnan().tolist() == [True, False, True]

    async def wrong_length(completions, **kwargs):
        return [1.0]

    with pytest.raises(RewardError, match="'bad' returned 1 values for 3 completions"):
        RewardSet([RewardFunction("bad", wrong_length)])(PROMPTS, COMPLETIONS)


def test_async_functions_that_raise():
    async def picky_async(completions, **kwargs):
        if "yy" in completions:
            raise ValueError("cannot score 'yy'")
        return [1.0] * len(completions)

    with pytest.raises(RewardError, match=r"reward 'p' raised ValueError: cannot score 'yy'"):
        RewardSet([RewardFunction("p", picky_async)])(PROMPTS, COMPLETIONS)
    out = RewardSet([RewardFunction("p", picky_async)], on_error="skip")(PROMPTS, COMPLETIONS)
    assert out.scores.tolist() == [1.0, 0.0, 1.0] and out.metrics["reward/errors"] == 1.0


def test_async_functions_inside_a_running_event_loop():
    """A notebook or an async server already runs a loop in this thread: scoring still works."""

    async def judge(completions, **kwargs):
        await asyncio.sleep(0)
        return [1.0] * len(completions)

    async def main():
        return RewardSet([RewardFunction("j", judge)])(PROMPTS, COMPLETIONS)

    assert asyncio.run(main()).scores.tolist() == [1.0, 1.0, 1.0]


def _hanging(release: threading.Event):
    """A judge that hangs until ``release`` is set (at most 30 s), then scores 1: a score of 1 means the
    timeout did not cut it off."""

    def judge(completions, **kwargs):
        release.wait(30)
        return [1.0] * len(completions)

    async def ajudge(completions, **kwargs):
        for _ in range(3000):
            if release.is_set():
                break
            await asyncio.sleep(0.01)
        return [1.0] * len(completions)

    return judge, ajudge


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_function_past_its_timeout_counts_as_raising(kind):
    release = threading.Event()
    judge = dict(zip(("sync", "async"), _hanging(release), strict=True))[kind]
    try:
        functions = [
            RewardFunction("judge", judge, source="judge.py:judge"),
            RewardFunction("len", length_reward),
        ]
        with pytest.raises(
            RewardError,
            match=r"reward 'judge' timed out: no result after 0.2 s \(reward.timeout_s\) \(judge.py:judge\)$",
        ):
            RewardSet(functions, timeout_s=0.2)(PROMPTS, COMPLETIONS)
        out = RewardSet(functions, on_error="skip", timeout_s=0.2)(PROMPTS, COMPLETIONS)
        assert out.per_function["judge"].tolist() == [0.0, 0.0, 0.0]  # not the 1.0 it would give later
        assert out.metrics["reward/judge/errors"] == 3.0 and out.scores.tolist() == [1.0, 2.0, 3.0]
    finally:
        release.set()


def test_a_timeout_leaves_fast_functions_and_their_errors_as_they_are():
    rs = RewardSet(
        [RewardFunction("len", length_reward), RewardFunction("p", picky)], on_error="skip", timeout_s=5
    )
    out = rs(PROMPTS, COMPLETIONS)  # picky raises on the batch: retried per sample, as without a timeout
    assert out.scores.tolist() == [2.0, 2.0, 4.0] and out.metrics["reward/p/errors"] == 1.0

    threads = set()

    def per_sample_only(completions, **kwargs):
        if len(completions) > 1:
            raise ValueError("one at a time")
        threads.add(threading.get_ident())
        return [1.0]

    skip = RewardSet([RewardFunction("one", per_sample_only)], on_error="skip", timeout_s=5)
    assert skip(PROMPTS, COMPLETIONS).scores.tolist() == [1.0, 1.0, 1.0]
    assert len(threads) == 1 and threading.get_ident() not in threads  # in turn, on a background thread

    async def own_timeout(completions, **kwargs):
        raise TimeoutError("the judge's API said so")

    with pytest.raises(RewardError, match="raised TimeoutError: the judge's API said so"):
        RewardSet([RewardFunction("j", own_timeout)], timeout_s=5)(PROMPTS, COMPLETIONS)
    with pytest.raises(ConfigError, match="reward.timeout_s"):
        RewardSet([], timeout_s=0)


def test_a_trainer_state_record_round_trips_and_anything_else_reads_as_none():
    state = TrainerState(7, 300, 0.21875)
    assert TrainerState.from_json(json.loads(json.dumps(state.to_json()))) == state
    for record in (None, {}, [], {"global_step": 1}, {"global_step": "x", "max_steps": 3, "epoch": 0}):
        assert TrainerState.from_json(record) is None
