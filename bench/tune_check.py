"""Does ``tandem tune`` pay for itself? The tuned config against the recipe it starts from, on new prompts.

Per warm start of ``bench/warm_starts.py`` (built first if missing):

1. ``test.jsonl``: 300 new prompts of the warm start's task, none in its train, held-out, SFT or large-pool
   files — the judge. The held-out file (``eval.jsonl``) is what ``tandem tune`` ranks on and what
   ``checkpoint.best_metric`` selects the kept model by, so accuracy on it is biased upwards for both.
2. ``tandem tune`` on the outside-model recipe (``warm_starts.train_config``, 300 steps) with its default
   space (or ``--space``) and ``--budget`` (training steps over all trials, the confirmation run of the
   recipe included), timed.
3. ``tandem train`` of the recipe and of the tuned ``best.yaml`` for each ``--seeds`` seed, interleaved
   (the best held-out evaluation's model is kept in ``<run>/best``).
4. ``tandem eval`` of each kept model on ``test.jsonl``: greedy accuracy.

    .venv/bin/python bench/tune_check.py --warm /tmp/warm3 --out /tmp/tune_check --starts add2-mid \\
        [--budget 1350] [--seeds 0 1] [--space trainer.lr=2e-4,6e-4,2e-3] [--no-confirm]

Prints one table row per warm start, configuration and seed; results go to ``OUT/results.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

import warm_starts  # bench/ is on sys.path when this runs as a script

TEST_ROWS = 300


def test_file(w: Any, folder: Path) -> Path:
    """``test.jsonl``: ``TEST_ROWS`` prompts of ``w``'s task that no other file of the warm start holds."""
    path = folder / "test.jsonl"
    if path.is_file():
        return path
    names = ("train.jsonl", "eval.jsonl", "sft.jsonl", "train_large.jsonl")
    seen = warm_starts.read_prompts(*(folder / name for name in names))
    rows = warm_starts.draw_new(
        w, random.Random(w.seed + 2), seen, TEST_ROWS
    )  # seed + 1 draws the large pool
    if len(rows) < TEST_ROWS:
        raise SystemExit(f"{w.name}: only {len(rows)} new prompts for the test file")
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _timed(cmd: list[str], log: Path) -> float:
    t0 = time.perf_counter()
    warm_starts.run_logged(cmd, log)
    return time.perf_counter() - t0


def score(w: Any, model: Path, test: Path, out: Path, log: Path) -> float:
    """Greedy accuracy of ``model`` on ``test`` (``tandem eval``; kept in ``out`` and read from there)."""
    if not out.is_file():
        warm_starts.run_eval(w, model, test, TEST_ROWS, out, log)
    return warm_starts.metric_of(json.loads(out.read_text()), "eval/accuracy")


def train_and_test(w: Any, config: Path, run_dir: Path, seed: int, test: Path, log: Path) -> dict[str, Any]:
    """Train ``config`` (seed ``seed``), then score its kept best model on ``test``."""
    cmd = [str(warm_starts.TANDEM), "train", str(config), f"run.output_dir={run_dir}", "run.overwrite=true"]
    wall = _timed([*cmd, f"run.seed={seed}"], log)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    test_acc = score(w, run_dir / "best", test, run_dir / "test.json", log)
    return {"heldout_best": max(evals), "test": test_acc, "wall": wall}


def confirmation(log: Path) -> str:
    """tune's confirmation verdict from its ``tune.jsonl`` in a few words ("" when none ran)."""
    rows = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
    for r in rows:
        if "confirm" in r:
            v = r["confirm"]
            head = "promoted" if v["promote"] else "config kept"
            return f"; {head}: {' '.join(r['overrides'])} {v['wins']} better / {v['losses']} worse, p={v['p_value']:.2g}"
    return ""


def check(args: argparse.Namespace, name: str, done: list[dict[str, Any]]) -> float:
    """Tune, train and test one warm start; returns the untrained warm start's test accuracy."""
    import yaml

    w = warm_starts.WARM_STARTS[name]
    folder = args.warm / name
    warm_starts.build(w, args.warm, rebuild=False)
    warm_starts.large_pool(w, folder)  # so the test file avoids it too
    test = test_file(w, folder)
    root = args.out / name
    root.mkdir(parents=True, exist_ok=True)
    log = root / "log.txt"
    recipe = root / "recipe.yaml"
    cfg = warm_starts.train_config(w, folder)
    cfg["trainer"]["total_steps"] = args.steps
    recipe.write_text(yaml.safe_dump(cfg, sort_keys=False))
    tuned = root / "tune" / "best.yaml"
    if not tuned.is_file():
        cmd = [
            str(warm_starts.TANDEM),
            "tune",
            str(recipe),
            "--budget",
            str(args.budget),
            "--out",
            str(root / "tune"),
            *(f"--space={item}" for item in args.space),
            *(["--no-confirm"] if args.no_confirm else []),
        ]
        tune_wall = _timed(cmd, log)
        (root / "tune" / "wall.json").write_text(json.dumps({"wall": tune_wall}))
    tune_wall = json.loads((root / "tune" / "wall.json").read_text())["wall"]
    winner = yaml.safe_load(tuned.read_text())
    picked = (
        f"lr {winner['trainer']['lr']:g}, adaptive group {winner['algorithm']['adaptive_group']['enabled']}"
        + confirmation(root / "tune" / "tune.jsonl")
    )
    start_acc = score(w, folder / "model", test, root / "start_test.json", log)  # where the test set sits
    have = {(r["start"], r["config"], r["seed"]) for r in done}
    for i, seed in enumerate(args.seeds):
        pair = [("recipe", recipe), ("tuned", tuned)]
        for label, config in pair if i % 2 == 0 else pair[::-1]:  # interleaved, order reversed per seed
            if (name, label, seed) in have:
                continue
            res = train_and_test(w, config, root / f"{label}-s{seed}", seed, test, log)
            res.update(start=name, config=label, seed=seed, picked=picked, tune_wall=tune_wall)
            done.append(res)
            with (args.out / "results.jsonl").open("a") as fh:
                fh.write(json.dumps(res) + "\n")
            print(
                f"{name} {label} seed {seed}: held-out best {res['heldout_best']:.1%}, test {res['test']:.1%}, {res['wall']:.0f} s",
                flush=True,
            )

    return start_acc


def table(done: list[dict[str, Any]], start_acc: dict[str, float]) -> None:
    print(
        "| warm start | config | seed | held-out best (selection set) | test greedy accuracy | train wall | tune wall |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, acc in start_acc.items():
        print(f"| {name} | warm start, untrained | - | - | {acc:.1%} | - | - |")
    for r in done:
        label = r["config"] if r["config"] == "recipe" else f"tuned ({r['picked']})"
        tune = f"{r['tune_wall']:.0f} s" if r["config"] == "tuned" else "-"
        print(
            f"| {r['start']} | {label} | {r['seed']} | {r['heldout_best']:.1%} | {r['test']:.1%} | {r['wall']:.0f} s | {tune} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warm", type=Path, default=Path("/tmp/warm"), help="Folder of the warm starts.")
    ap.add_argument("--out", type=Path, default=Path("/tmp/tune_check"), help="Runs and results.")
    ap.add_argument("--starts", nargs="*", default=["add2-mid"], choices=list(warm_starts.WARM_STARTS))
    ap.add_argument(
        "--steps", type=int, default=300, help="trainer.total_steps of the recipe (and tune's top rung)."
    )
    ap.add_argument(
        "--budget",
        type=int,
        default=1350,
        help="tandem tune --budget (6 candidates: 37+75+150+300 steps, +300 for the confirmation run).",
    )
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1])
    ap.add_argument(
        "--space", nargs="*", default=[], help="tandem tune --space items (default: tune's default space)."
    )
    ap.add_argument(
        "--no-confirm", action="store_true", help="tandem tune --no-confirm (the sweep's winner, unchecked)."
    )
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.jsonl"
    done = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []
    start_acc = {name: check(args, name, done) for name in args.starts}
    table([r for r in done if r["start"] in args.starts], start_acc)


if __name__ == "__main__":
    main()
