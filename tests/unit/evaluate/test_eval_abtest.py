"""A/B test on real tiny Llama folders whose answers are set by construction: a known quality gap is
detected and promoted with the exact win/tie/loss counts; identical checkpoints are not promoted.

The models are bigram chains (tests/bigram_models.py), not trained ones, so what they answer cannot
depend on where a training run lands on some machine. Every prompt ends in one of the letters ``abcd``
and the right answer is always ``yes``; a model's table says which letters it answers ``yes`` after:
A (incumbent) after ``a`` and ``d``, B (candidate) after ``a``, ``b`` and ``c``. Per letter, B's outcome is
a tie on ``a``, a win on ``b`` and ``c`` and a loss on ``d``. The "coin" model answers ``yes`` or ``no``
with probability ½ each, so two copies of it differ on half the prompts when sampled independently.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from bigram_models import answer_chain, bigram_model

from tandem.errors import ConfigError
from tandem.evaluate.abtest import ABSettings, compare_models, run_abtest
from tandem.evaluate.judges import VerifierJudge
from tandem.evaluate.stats import sign_test
from tandem.evaluate.targets import eval_data
from tandem.models import load_causal_lm, load_tokenizer
from tandem.rollout.hf import HFEngine

LETTERS = "abcd"
WORDS = {**answer_chain("yes"), **answer_chain("no")}
GREEDY = ABSettings(temperature=0.0, max_new_tokens=5)


def exact_answer(prompts, completions, answer, **columns):
    """1.0 where the completion is the row's ``answer``, else 0.0 (the verifier of the eval file)."""
    return [float(c == a) for c, a in zip(completions, answer, strict=True)]


def _says_yes_after(letters: str) -> dict:
    return {**WORDS, **{c: ("y" if c in letters else "n") for c in LETTERS}}


def _eval_file(path: Path, n: int) -> Path:
    rows = [{"prompt": f"question {i} {LETTERS[i % 4]}", "answer": "yes"} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("ab")
    coin = bigram_model(root / "coin", {**WORDS, **{c: {"y": 0.0, "n": 0.0} for c in LETTERS}})
    return {
        "a": bigram_model(root / "a", _says_yes_after("ad")),
        "b": bigram_model(root / "b", _says_yes_after("abc")),
        "coin": coin,
        "coin_copy": shutil.copytree(coin, root / "coin-copy"),
        "file": _eval_file(root / "eval.jsonl", 128),
    }


def _abtest(models, a: str, b: str) -> dict:
    reward = f"{Path(__file__)}:exact_answer"
    return run_abtest(models[a], models[b], "verifier", GREEDY, eval_file=str(models["file"]), reward=reward)


def test_known_gap_is_detected_and_promoted(models):
    result = _abtest(models, "a", "b")
    d = result["decision"]
    assert (d["wins"], d["ties"], d["losses"]) == (64, 32, 32)  # 32 prompts per letter
    assert d["p_value"] == pytest.approx(sign_test(64, 32)) and d["p_value"] < 0.05
    assert d["promote"] and d["win_rate"] == pytest.approx(0.625) and d["ci_low"] > 0.5
    outcome = {"a": 0, "b": 1, "c": 1, "d": -1}
    assert len(result["pairs"]) == 128
    assert all(p["outcome"] == outcome[p["prompt"][-1]] for p in result["pairs"])
    assert {(p["a"], p["b"]) for p in result["pairs"] if p["prompt"].endswith("b")} == {("no", "yes")}
    # Reversed roles: the incumbent is better, so the candidate is kept.
    back = _abtest(models, "b", "a")["decision"]
    assert (back["wins"], back["losses"]) == (32, 64) and not back["promote"]


@pytest.mark.slow
def test_identical_checkpoints_not_promoted_in_95_percent_of_200_repeats(models):
    """Two copies of one stochastic model, sampled with independent seeds: every repeat is a null
    experiment. decide()'s exact false-promotion rate here is 1.5% (two-sided sign test, promotion one
    way), so ≤ 10 of 200 fails with probability 2e-4 for any sampling stream."""
    tok = load_tokenizer(models["coin"])
    engine_a = HFEngine(load_causal_lm(models["coin"]), tok)
    engine_b = HFEngine(load_causal_lm(models["coin_copy"]), tok)
    data = eval_data(None, eval_file=str(models["file"]), reward=f"{Path(__file__)}:exact_answer", size=48)
    judge = VerifierJudge(data.rewards)
    repeats = 200
    decisions = [
        compare_models(
            engine_a,
            engine_b,
            data,
            judge,
            ABSettings(temperature=1.0, max_new_tokens=5, seed=seed, resamples=200),
        )["decision"]
        for seed in range(repeats)
    ]
    wins = sum(d["wins"] for d in decisions)
    losses = sum(d["losses"] for d in decisions)
    # A and B really sample independently (P(differ) = ½ per prompt; one shared seed would give all ties)
    # and neither side is favoured: both within 5 standard deviations of their expectation.
    expected = repeats * 48 / 4
    assert abs(wins - expected) < 5 * expected**0.5 and abs(losses - expected) < 5 * expected**0.5, (
        wins,
        losses,
    )
    promoted = sum(d["promote"] for d in decisions)
    assert promoted <= repeats // 20, promoted  # ≥ 95% of the repeats keep the incumbent


def test_eval_data_names_a_configs_file_path_reward_by_its_function(models, tmp_path):
    """A config's ``reward.functions`` entry given as ``file.py:function`` without a name scores the eval
    file under the function's name (as in training), not the path, which no reward name may hold."""
    from tandem.config import load_config

    cfg = tmp_path / "cfg.yaml"
    reward = {"task_reward": False, "functions": [{"path": f"{Path(__file__)}:exact_answer"}]}
    data = {"task": None, "train_file": str(models["file"]), "eval_file": str(models["file"])}
    cfg.write_text(json.dumps({"model": {"path": str(models["a"])}, "data": data, "reward": reward}))
    got = eval_data(load_config(cfg), size=4)
    assert [f.name for f in got.rewards.functions] == ["exact_answer"] and len(got.rows) == 4


def test_a_task_draw_can_leave_out_the_prompts_a_choice_was_made_on() -> None:
    """tandem tune confirms on such a draw: as many prompts as asked, none of the excluded ones."""
    held_out = eval_data(None, task="arith", size=40, seed=0)
    ranked_on = {r["prompt"] for r in held_out.rows}
    fresh = eval_data(None, task="arith", size=40, seed=1, exclude=ranked_on)
    again = eval_data(None, task="arith", size=40, seed=1, exclude=ranked_on)
    prompts = [r["prompt"] for r in fresh.rows]
    assert len(prompts) == 40 and not ranked_on & set(prompts)
    assert prompts == [r["prompt"] for r in again.rows]  # the same draw each time
    assert "none of 40 excluded prompts" in fresh.source
    plain = [r["prompt"] for r in eval_data(None, task="arith", size=40, seed=1).rows]
    less = eval_data(None, task="arith", size=40, seed=1, exclude=set(plain[:10]))
    assert [r["prompt"] for r in less.rows][:30] == plain[10:]  # excluded ones skipped, the draw goes on


def by_token_count(completions, completion_ids, **columns):
    """A TRL-style function reading the token ids, which abtest's comparisons do not pass."""
    return [float(len(ids) < 3) for ids in completion_ids]


def test_a_verifier_needing_token_ids_is_refused_before_sampling(models):
    with pytest.raises(ConfigError, match="needs argument 'completion_ids'"):
        run_abtest(
            models["a"],
            models["b"],
            "verifier",
            GREEDY,
            eval_file=str(models["file"]),
            reward=f"{Path(__file__)}:by_token_count",
        )
