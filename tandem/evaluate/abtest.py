"""Offline A/B test: incumbent A and candidate B answer the same prompts, a judge compares each pair,
and :func:`tandem.evaluate.stats.decide` says whether to promote B.

A and B sample with different seeds (independent answers even when A and B are the same model), one
answer per prompt; ``temperature=0`` compares greedy answers.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tandem.data.chat import render_prompts
from tandem.evaluate.heldout import ProgressFn
from tandem.evaluate.judges import Judge, build_judge, check_judge_spec
from tandem.evaluate.runner import engine_choice, target_engine
from tandem.evaluate.stats import decide
from tandem.evaluate.targets import EvalData, eval_data, resolve_target
from tandem.rollout.base import RolloutEngine, SamplingParams

SEED_OFFSET_B = 7919  # B's sampling seed = seed + this, so identical models still answer independently


@dataclass(frozen=True)
class ABSettings:
    """Generation and decision settings of an A/B test."""

    temperature: float = 1.0
    max_new_tokens: int | None = None
    seed: int = 0
    alpha: float = 0.05
    min_win_rate: float = 0.5
    batch_size: int = 64
    resamples: int = 2000


def answers(
    engine: RolloutEngine,
    data: EvalData,
    params: SamplingParams,
    batch_size: int,
    on_chunk: ProgressFn | None,
) -> list[str]:
    """One completion per prompt row, in row order."""
    out: list[str] = []
    rows = data.rows
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        extras = [{k: v for k, v in r.items() if k != "prompt"} for r in chunk]
        texts = render_prompts(
            getattr(engine, "tokenizer", None), [r["prompt"] for r in chunk], where="A/B prompts"
        )
        out.extend(engine.generate(texts, params, extras=extras).completions)
        if on_chunk is not None:
            on_chunk(start + len(chunk), len(rows))
    return out


def compare_models(
    engine_a: RolloutEngine,
    engine_b: RolloutEngine,
    data: EvalData,
    judge: Judge,
    settings: ABSettings,
    *,
    on_progress: ProgressFn | None = None,
) -> dict[str, Any]:
    """Generate with both engines on ``data.rows``, judge every pair and decide. JSON-ready result."""
    n = len(data.rows)

    def params(offset: int) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=data.max_new_tokens
            if settings.max_new_tokens is None
            else settings.max_new_tokens,
            temperature=settings.temperature,
            stop=list(data.stop),
            seed=settings.seed + offset,
        )

    def progress(offset: int) -> ProgressFn | None:
        return None if on_progress is None else (lambda done, _t: on_progress(offset + done, 2 * n))

    ans_a = answers(engine_a, data, params(0), settings.batch_size, progress(0))
    ans_b = answers(engine_b, data, params(SEED_OFFSET_B), settings.batch_size, progress(n))
    prompts = [r["prompt"] for r in data.rows]
    columns = {k: [r.get(k) for r in data.rows] for k in data.rows[0] if k != "prompt"} if data.rows else {}
    outcomes = judge.compare(prompts, ans_a, ans_b, columns)
    decision = decide(
        outcomes,
        alpha=settings.alpha,
        min_win_rate=settings.min_win_rate,
        resamples=settings.resamples,
        seed=settings.seed,
    )
    pairs = [
        {"prompt": p, "a": a, "b": b, "outcome": o}
        for p, a, b, o in zip(prompts, ans_a, ans_b, outcomes, strict=True)
    ]
    return {"judge": judge.name, "num_prompts": n, "decision": decision.to_json(), "pairs": pairs}


def run_abtest(
    path_a: str | Path,
    path_b: str | Path,
    judge_spec: str,
    settings: ABSettings,
    *,
    task: str | None = None,
    task_options: dict[str, Any] | None = None,
    eval_file: str | None = None,
    reward: str | None = None,
    size: int | None = None,
    engine: str | None = None,
    engine_options: Mapping[str, Any] | None = None,
    on_progress: ProgressFn | None = None,
    exclude_prompts: Collection[str] = (),
) -> dict[str, Any]:
    """Load A and B (run, checkpoint or model folders), build the prompts and judge, compare them.

    The prompts come from the options, else from A's run config, else B's (a task's draw without
    ``exclude_prompts``). Each model is sampled by
    ``engine`` if given, else by its own run's engine (:func:`tandem.evaluate.runner.engine_choice`).
    """
    check_judge_spec(judge_spec)
    ta, tb = resolve_target(path_a), resolve_target(path_b)
    data = eval_data(
        ta.config or tb.config,
        task=task,
        task_options=task_options,
        eval_file=eval_file,
        reward=reward,
        size=size,
        seed=settings.seed,
        require_rewards=judge_spec == "verifier",
        exclude=exclude_prompts,
        token_ids=judge_spec != "verifier",  # the verifier's comparisons pass text, no token ids
    )
    judge = build_judge(judge_spec, data.rewards)
    engines = [target_engine(t, data.max_prompt_len, engine=engine, options=engine_options) for t in (ta, tb)]
    try:
        result = compare_models(engines[0], engines[1], data, judge, settings, on_progress=on_progress)
    finally:
        for sampler in engines:
            sampler.close()
    names = [engine_choice(t, engine, engine_options)[0] for t in (ta, tb)]
    return {"a": str(ta.model_dir), "b": str(tb.model_dir), "data": data.source, "engines": names, **result}
