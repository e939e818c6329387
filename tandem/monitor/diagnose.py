"""Why a run did (not) learn: its metric rows turned into a few findings, each with what to try.

Pure: :func:`diagnose` reads the rows of ``metrics.jsonl`` (step 0 holds the evaluation before training)
and returns :class:`Finding` objects; ``tandem train`` / ``tandem demo`` print them and ``tandem report``
shows them. The rules are the causes measured on issue 17's outside-style warm starts (docs/learning.md):

* the **verdict** compares held-out accuracy at its best with the start, against the noise of one
  evaluation (two binomial standard errors on the prompts it counted, ``eval/num_prompts``, else the
  run's ``data.eval_size``; at least 2 points):
  ``learned``, or ``flat``; after learning, ``degraded`` when the last evaluation is that far below the best;
* for a ``flat`` run, the causes: ``no_signal`` (most groups had all-equal rewards, so a group-relative
  advantage is zero — split into all-fail, too hard, and all-pass, too easy), ``train_only`` (the train
  reward rose, the held-out metric did not: the prompts are memorised or the reward is not what is
  evaluated), ``entropy_collapse`` (entropy fell below a quarter of its start) and ``no_update`` (signal
  was there, the train reward did not move: the step is too small);
* for a run that learned and did not degrade, ``plateau``: the evaluations of the second half of the run
  added less than noise to the best of the first half. With many all-fail groups at the end the policy's
  sampling reach is the limit (plain GRPO on ``countdown-mid``: greedy accuracy caught up with what the
  policy samples); with the train reward still rising, the training prompts are being fitted without
  transfer (the recipe on ``countdown-mid``, where more distinct prompts did not help either: the model is
  the limit); otherwise the later steps were not needed;
* in any run, ``truncated``: a large share of responses hit ``rollout.max_new_tokens``.

Windows are the first and last fifth of the training steps. Thresholds are deliberately coarse: a
finding says where to look, the curves (``tandem report``) say how much.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

ACCURACY = "eval/accuracy"
NO_SIGNAL_FRAC = 0.5  # mean share of all-equal groups above which a flat run is short of gradient
TRUNCATED_FRAC = 0.2  # mean share of responses cut at max_new_tokens
ENTROPY_DROP = 0.25  # last-window entropy below this share of the first window's
PLATEAU_MIN_EVALS = 5  # evaluations (with the one before training) needed to call a plateau
REACH_FRAC = 0.25  # last-window share of all-fail groups from which a plateau is the policy's reach
TRAIN_RISE = 0.05  # train-reward rise over a plateau's second half that reads as fitting the train prompts
MIN_NOISE = 0.02  # the smallest held-out change counted as real


@dataclass(frozen=True)
class Finding:
    """One diagnosis: a short code, what the metrics show, and what to try (may be empty)."""

    code: str
    message: str
    hint: str = ""


def diagnose(rows: Sequence[dict[str, Any]], eval_size: int | None = None) -> list[Finding]:
    """Findings for a run's metric rows (any order; rows without ``step`` are ignored)."""
    rows = sorted((r for r in rows if isinstance(r.get("step"), int)), key=lambda r: r["step"])
    train = [r for r in rows if r["step"] >= 1]
    if not train:
        return []
    first, last = _windows(train)
    out: list[Finding] = []
    verdict = _verdict(rows, eval_size)
    out.extend(verdict)
    if verdict and verdict[0].code == "flat":
        out.extend(_causes(train, first, last))
    if [f.code for f in verdict] == ["learned"]:
        out.extend(_plateau(rows, train, last, eval_size))
    clip = _mean(train, "response/clip_ratio")
    if clip is not None and clip >= TRUNCATED_FRAC:
        out.append(
            Finding(
                "truncated",
                f"{clip:.0%} of responses hit rollout.max_new_tokens (mean over the run)",
                "raise rollout.max_new_tokens, or penalise length (reward.overlong)",
            )
        )
    return out


def noise(accuracy: float, n: int | None) -> float:
    """Two binomial standard errors of an accuracy measured on ``n`` prompts (at least ``MIN_NOISE``)."""
    if not n:
        return 0.05
    p = min(max(accuracy, 0.05), 0.95)
    return max(MIN_NOISE, 2 * math.sqrt(p * (1 - p) / n))


def _verdict(rows: Sequence[dict[str, Any]], eval_size: int | None) -> list[Finding]:
    evals = _evals(rows)
    if len(evals) < 2:
        return []
    (s0, a0), (sl, al) = evals[0], evals[-1]
    sb, ab = max(evals, key=lambda e: (e[1], -e[0]))  # the earliest of equal bests
    eval_size = _evaluated(rows, eval_size)
    thr = noise(a0, eval_size)
    where = f"{eval_size} prompts" if eval_size else "an unknown number of prompts"
    if ab - a0 < thr:
        return [
            Finding(
                "flat",
                f"held-out accuracy did not move beyond noise: {a0:.1%} at step {s0}, best {ab:.1%} "
                f"(step {sb}), last {al:.1%}; ±{thr:.1%} is noise on {where}",
            )
        ]
    out = [Finding("learned", f"held-out accuracy {a0:.1%} -> best {ab:.1%} at step {sb}, last {al:.1%}")]
    if ab - al >= thr and sl > sb:
        out.append(
            Finding(
                "degraded",
                f"held-out accuracy fell {100 * (ab - al):.1f} points after its best (step {sb})",
                "keep the best model (checkpoint.best_metric=eval/accuracy); a lower trainer.lr or a KL "
                "term (algorithm.beta) may hold it",
            )
        )
    return out


def _plateau(
    rows: Sequence[dict[str, Any]],
    train: Sequence[dict[str, Any]],
    last: Sequence[dict[str, Any]],
    eval_size: int | None,
) -> list[Finding]:
    """``plateau`` when the second half's evaluations add less than noise to the first half's best."""
    evals = _evals(rows)
    if len(evals) < PLATEAU_MIN_EVALS:
        return []
    half = evals[-1][0] / 2
    early = [e for e in evals if e[0] <= half]
    late = [e for e in evals if e[0] > half]
    if len(early) < 2 or len(late) < 2:
        return []
    sb, ab = max(early, key=lambda e: (e[1], -e[0]))
    gain = max(a for _, a in late) - ab
    thr = noise(ab, _evaluated(rows, eval_size))
    if gain >= thr:
        return []
    message = (
        f"held-out accuracy stopped rising at {ab:.1%} (step {sb}): the evaluations after step "
        f"{int(half)} added {100 * gain:+.1f} points, within the ±{thr:.1%} noise"
    )
    fail = _mean(last, "groups/all_equal_low_frac")
    mid = [r for r in train if r["step"] <= half][-len(last) :]  # the window ending at the half
    r_mid, r_last = _mean(mid, "reward/mean"), _mean(last, "reward/mean")
    if fail is not None and fail >= REACH_FRAC:
        hint = (
            f"{fail:.0%} of the last steps' groups had no success among their samples: the limit is what "
            "the policy can sample, not the step count; give those prompts more samples "
            "(algorithm.adaptive_group.enabled=true), the prompt file's answers "
            "(rollout.reference_answers.column), supervised data on them, or a larger model"
        )
    elif r_mid is not None and r_last is not None and r_last - r_mid >= TRAIN_RISE:
        seen = _mean(last[-1:], "prompts/seen_before_mean")
        times = f", each drawn {seen:.1f} times before" if seen else ""
        hint = (
            f"the train reward kept rising meanwhile ({r_mid:.3f} -> {r_last:.3f}): what is still learned "
            f"is the training prompts themselves{times}; more distinct prompts (a larger "
            "data.train_file) show whether it transfers; if held-out accuracy stays, the model or its "
            "supervised start is the limit and more RL steps will not move it"
        )
    else:
        hint = (
            "the later steps bought little: fewer trainer.total_steps would do "
            "(checkpoint.best_metric=eval/accuracy keeps the best model), or harder prompts"
        )
    return [Finding("plateau", message, hint)]


def _causes(
    train: Sequence[dict[str, Any]], first: Sequence[dict[str, Any]], last: Sequence[dict[str, Any]]
) -> list[Finding]:
    out = []
    equal = _mean(train, "groups/all_equal_frac")
    if equal is not None and equal >= NO_SIGNAL_FRAC:
        low = _mean(train, "groups/all_equal_low_frac") or 0.0
        high = _mean(train, "groups/all_equal_high_frac") or 0.0
        hard = low >= high
        out.append(
            Finding(
                "no_signal",
                f"{equal:.0%} of groups had all-equal rewards, so no gradient ({low:.0%} all-fail, "
                f"{high:.0%} all-pass)",
                "the prompts are too hard for this model: algorithm.adaptive_group.enabled=true, "
                "data.curriculum.kind=frontier, a larger rollout.n, rollout.reference_answers.column=<the "
                "prompt file's answer column> (if it holds answers), or more SFT first"
                if hard
                else "the prompts are too easy for this model: harder prompts, or data.curriculum.kind=frontier",
            )
        )
    r0, r1 = _mean(first, "reward/mean"), _mean(last, "reward/mean")
    spread = _mean(train, "reward/std") or 0.0
    rose = r0 is not None and r1 is not None and r1 - r0 >= max(0.05, 0.5 * spread)
    if rose:
        seen = _mean(last[-1:], "prompts/seen_before_mean")
        times = (
            f"; the last step's prompts had been drawn {seen:.1f} times before, on average" if seen else ""
        )
        out.append(
            Finding(
                "train_only",
                f"the train reward rose {r0:.3f} -> {r1:.3f} while held-out accuracy did not{times}",
                "the model fits the training prompts or the reward is not what is evaluated: read "
                "samples.jsonl, use more distinct prompts, add a diverge alert (monitor.alerts)",
            )
        )
    h0, h1 = _mean(first, "actor/entropy"), _mean(last, "actor/entropy")
    if h0 is not None and h1 is not None and h0 > 0 and h1 < ENTROPY_DROP * h0:
        out.append(
            Finding(
                "entropy_collapse",
                f"policy entropy fell {h0:.3f} -> {h1:.3f}: the samples stopped exploring",
                "a lower trainer.lr, an adaptive entropy bonus (algorithm.entropy_target), or clip-higher "
                "(algorithm.loss_options.clip_high)",
            )
        )
    if (
        not rose
        and (equal is None or equal < NO_SIGNAL_FRAC)
        and not any(f.code == "entropy_collapse" for f in out)
    ):
        moved = "" if r0 is None or r1 is None else f" (train reward {r0:.3f} -> {r1:.3f})"
        out.append(
            Finding(
                "no_update",
                f"groups carried signal but the policy barely changed{moved}",
                "a higher trainer.lr or more steps (tandem tune CONFIG --budget 600 sweeps the rate)",
            )
        )
    return out


def _evals(rows: Sequence[dict[str, Any]]) -> list[tuple[int, float]]:
    """``(step, held-out accuracy)`` of every evaluation, in step order (step 0: before training)."""
    return [(r["step"], float(r[ACCURACY])) for r in rows if _num(r.get(ACCURACY))]


def _evaluated(rows: Sequence[dict[str, Any]], eval_size: int | None) -> int | None:
    """The prompts an evaluation counted (``eval/num_prompts``), over the configured ``eval_size``."""
    counted = [r["eval/num_prompts"] for r in rows if _num(r.get("eval/num_prompts"))]
    return int(counted[0]) if counted else eval_size


def _windows(train: Sequence[dict[str, Any]]) -> tuple[Sequence[dict[str, Any]], Sequence[dict[str, Any]]]:
    k = max(1, len(train) // 5)
    return train[:k], train[-k:]


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _mean(rows: Sequence[dict[str, Any]], key: str) -> float | None:
    vals = [float(r[key]) for r in rows if _num(r.get(key))]
    return sum(vals) / len(vals) if vals else None
