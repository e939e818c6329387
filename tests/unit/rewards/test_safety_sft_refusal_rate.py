"""The safety task's ``sft_refusal_rate``: a helpful-leaning SFT target column that never changes the
prompts, the answers or the verifier."""

from __future__ import annotations

import pytest

from tandem.errors import ConfigError
from tandem.rewards import get_task
from tandem.rewards.tasks.safety import COMPLIANCE, REFUSAL, SafetyTask, make_preference_rows
from tandem.train.sft import sft_pair


def test_default_rows_have_no_completion_column():
    rows = SafetyTask().make_rows("train", 50, 0)
    assert all(set(r) == {"prompt", "answer", "unsafe"} for r in rows)


@pytest.mark.parametrize("split", ["train", "test"])
def test_prompts_and_answers_do_not_depend_on_the_rate(split):
    base = SafetyTask().make_rows(split, 300, 1)
    shaped = get_task("safety", sft_refusal_rate=0.25).make_rows(split, 300, 1)
    assert [(r["prompt"], r["answer"], r["unsafe"]) for r in shaped] == [
        (r["prompt"], r["answer"], r["unsafe"]) for r in base
    ]


def test_unsafe_targets_are_refusal_at_the_rate_and_compliance_otherwise():
    rows = SafetyTask(sft_refusal_rate=0.25).make_rows("train", 2000, 0)
    unsafe = [r for r in rows if r["unsafe"]]
    assert {r["completion"] for r in unsafe} == {REFUSAL, COMPLIANCE}
    share = sum(r["completion"] == REFUSAL for r in unsafe) / len(unsafe)
    assert 0.2 < share < 0.3, share
    assert all(r["completion"] == r["answer"] for r in rows if not r["unsafe"])
    assert all(
        r["completion"] == COMPLIANCE
        for r in SafetyTask(sft_refusal_rate=0.0).make_rows("train", 200, 0)
        if r["unsafe"]
    )


def test_sft_trains_on_the_completion_but_the_verifier_still_scores_the_answer():
    task = SafetyTask(sft_refusal_rate=0.0)
    row = next(r for r in task.make_rows("train", 50, 0) if r["unsafe"])
    assert sft_pair(row, "row") == (row["prompt"], COMPLIANCE)
    scores = task.reward([row["prompt"]] * 2, [COMPLIANCE, REFUSAL], answer=[row["answer"]] * 2)
    assert scores == [0.0, 1.0]


def test_preference_pairs_reject_the_same_compliance_text():
    pairs = make_preference_rows(SafetyTask(), "train", 100, 0)
    assert {p["rejected"] for p in pairs if p["unsafe"]} == {COMPLIANCE}


@pytest.mark.parametrize("bad", [-0.1, 1.5, "0.5", True])
def test_bad_rate_is_a_config_error_naming_the_option(bad):
    with pytest.raises(ConfigError, match=r"sft_refusal_rate must be in \[0, 1\]"):
        get_task("safety", sft_refusal_rate=bad)
