"""Confirming a sweep's winner before it replaces the config as given: both configs' final models answer
the same prompts greedily, the config's verifier scores each answer, and a paired sign test over prompts
decides (``tandem.evaluate.stats.decide``). Used by ``tandem tune``; pure of training (the runs are given
as folders)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, NamedTuple

from tandem.errors import ConfigError, RewardError

# held-out metrics a per-prompt verdict of the verifier stands for (what the confirmation can judge)
PAIRED_METRICS = ("eval/accuracy", "eval/reward_mean")
# distinct held-out prompts a prompt file needs before tune splits it into ranking and confirming halves
MIN_SPLIT = 200


class HeldOutSplit(NamedTuple):
    """A prompt-file config's held-out file in two disjoint halves: one ranks the sweep, one confirms."""

    rank: Path
    confirm: Path
    ranked: int  # rows in each half
    confirming: int


def confirm_unsupported(cfg: Any, metric: str) -> str | None:
    """Why the winner cannot be confirmed against the config on this run (None when it can): the paired
    test scores single greedy answers with the config's verifier, so it needs that metric and no env."""
    if metric not in PAIRED_METRICS:
        return f"--metric {metric} is not scored per prompt (confirmation judges {', '.join(PAIRED_METRICS)})"
    if cfg.env is not None:
        return "multi-turn environments are not confirmed (one answer per prompt is compared)"
    return None


def check_confirm_file(cfg: Any, path: Path, why_not: str | None) -> None:
    """Read ``--confirm-file`` and score its first row with the config's reward functions now, before
    anything trains (a bad row is a one-line DataError at file:line, a reward that cannot score the file's
    columns a RewardError); ConfigError where no confirmation will use it."""
    from tandem.evaluate.targets import eval_data

    if why_not:
        raise ConfigError(f"unused: {why_not}", where="--confirm-file", hint="leave --confirm-file out")
    if not cfg.reward.functions:
        raise ConfigError(
            "the config has no reward.functions to score its prompts (it is scored by its task)",
            where="--confirm-file",
            hint="leave --confirm-file out: new test prompts of the task are drawn",
        )
    try:  # a reward function needing a column the file lacks is refused here, naming the option
        data = eval_data(cfg, eval_file=str(path), require_rewards=True)
    except ConfigError as err:
        raise ConfigError(str(err), where="--confirm-file") from None
    row = data.rows[0]  # scored once now: a column the reward functions need fails here, not after the sweep
    assert data.rewards is not None  # require_rewards
    try:
        columns = {k: [v] for k, v in row.items() if k != "prompt"}
        data.rewards([row["prompt"]], [""], columns, completion_ids=[[]])
    except RewardError as err:
        raise RewardError(str(err), where=f"--confirm-file {path}:1") from err


def split_held_out(cfg: Any, folder: Path, seed: int) -> HeldOutSplit | str:
    """Split ``data.eval_file`` by distinct prompt (seeded shuffle, rows of one prompt stay together) into
    ``folder/held_out_rank.jsonl`` and ``folder/held_out_confirm.jsonl`` with all their columns, so the
    winner is confirmed on prompts no choice was made on; the reason it is not split (fewer than
    ``MIN_SPLIT`` distinct prompts, columns JSON cannot hold) otherwise. Same file and seed, same halves."""
    from tandem.data.prompts import load_prompt_dataset
    from tandem.utils.io import atomic_write_text

    rows = load_prompt_dataset(cfg.data.eval_file).rows
    groups: dict[str, list[dict[str, Any]]] = {}
    try:
        for row in rows:
            groups.setdefault(json.dumps(row["prompt"], sort_keys=True), []).append(row)
        lines = {key: "".join(json.dumps(r) + "\n" for r in group) for key, group in groups.items()}
    except (TypeError, ValueError) as err:  # e.g. a Parquet column of dates
        return f"its rows do not all convert to JSON ({err})"
    if len(groups) < MIN_SPLIT:
        return f"{len(groups)} distinct held-out prompts, fewer than the {MIN_SPLIT} a split needs"
    keys = sorted(groups)
    random.Random(seed).shuffle(keys)
    half = keys[: len(keys) // 2], keys[len(keys) // 2 :]
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / "held_out_rank.jsonl", folder / "held_out_confirm.jsonl"
    for path, part in zip(paths, half, strict=True):
        atomic_write_text(path, "".join(lines[k] for k in part))
    return HeldOutSplit(*paths, *(sum(len(groups[k]) for k in part) for part in half))


def verdict_line(v: dict[str, Any]) -> str:
    """The confirmation's verdict (``Decision.to_json()``, the winner as B, ``on``: the prompts it was
    judged on) in one line."""
    test = f"sign test p={v['p_value']:.3g} {'<' if v['p_value'] < v['alpha'] else '≥'} {v['alpha']}"
    head = "replaces" if v["promote"] else "does not replace"
    n = v["wins"] + v["ties"] + v["losses"]
    on = v.get("on", "held-out prompts")
    return f"{head} the config as given: better on {v['wins']}, worse on {v['losses']} of {n} {on} ({test})"


def per_prompt_net(judgements: list[tuple[list[int], list[str]]]) -> list[int]:
    """One outcome per prompt from several judgements (outcomes, prompts) of the same prompts in the
    same order: the sign of its summed outcomes, so a prompt won on one seed and lost on another is a
    tie."""
    if any(asked != judgements[0][1] for _, asked in judgements):
        raise ValueError("pairs meant to be judged on the same prompts were asked different ones")
    return [(t > 0) - (t < 0) for t in map(sum, zip(*(got for got, _ in judgements), strict=True))]


def confirm_winner(
    pairs: list[tuple[Path, Path]],
    alpha: float,
    seed: int,
    prompts: Path | None = None,
    prompts_are: str | None = None,
) -> dict[str, Any]:
    """Greedy answers of each pair's final models (the config's run, the winner's; one pair per training
    seed), judged by the config's verifier, and ``tandem.evaluate.stats.decide``'s verdict on the pooled
    outcomes (JSON-ready, with ``on``: the prompts, and ``seeds``).

    The prompts: the file ``prompts`` if given (``prompts_are`` says what they are); else, for a task, a
    new draw of its test split per pair without the held-out prompts the sweep ranked on (so the winner's
    luck on those cannot carry it) nor an earlier pair's, unless the split holds fewer than half as many
    other prompts; else the held-out prompts themselves. Pairs judged on the same prompts give one
    outcome per prompt, the sign of its summed outcomes over the pairs: the sign test counts independent
    prompts, not a prompt per seed."""
    from tandem.evaluate.abtest import ABSettings, run_abtest
    from tandem.evaluate.stats import decide
    from tandem.evaluate.targets import eval_data, resolve_target

    def judged(k: int, settings_seed: int, **data: Any) -> tuple[list[int], list[str]]:
        a, b = pairs[k]
        settings = ABSettings(temperature=0.0, seed=settings_seed, alpha=alpha)
        result = run_abtest(a, b, "verifier", settings, **data)
        return [int(p["outcome"]) for p in result["pairs"]], [p["prompt"] for p in result["pairs"]]

    cfg = resolve_target(pairs[0][0]).config
    used: set[str] | None = None  # prompts a new task draw leaves out; None: judge on fixed prompts
    on = "held-out prompts (the ones the sweep ranked on)"
    if prompts is not None:
        on = prompts_are or f"prompts of {prompts}"
    elif cfg is not None and cfg.data.task is not None:
        held_out = eval_data(cfg).rows
        ranked_on = {row["prompt"] for row in held_out}
        new = len(eval_data(cfg, seed=seed + 1, exclude=ranked_on).rows)
        if 2 * new >= len(held_out):
            used, on = ranked_on, f"new test prompts of task {cfg.data.task} (none held out)"
        else:
            on = (
                f"held-out prompts (a new draw of task {cfg.data.task} finds only {new} prompts outside them)"
            )
    outcomes: list[int] = []
    if used is None:  # the same prompts for every pair: one outcome per prompt
        fixed = {} if prompts is None else {"eval_file": str(prompts)}
        outcomes = per_prompt_net([judged(k, seed, **fixed) for k in range(len(pairs))])
    else:
        for k in range(len(pairs)):
            got, asked = judged(k, seed + 1 + k, exclude_prompts=set(used))
            used |= set(asked)
            outcomes += got
    decision = decide(outcomes, alpha=alpha, seed=seed).to_json()
    per_prompt = " summed per prompt" if used is None else ""
    return {
        **decision,
        "on": on + (f", {len(pairs)} training seeds{per_prompt}" if len(pairs) > 1 else ""),
        "seeds": len(pairs),
    }
