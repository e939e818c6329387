"""Issue 17's side by side: Tandem's default GRPO recipe vs TRL ``GRPOTrainer`` (3-point lr sweep) on the
outside-style warm starts of ``bench/warm_starts.py``, with the issue's targets checked.

Per warm start and seed, four runs, one at a time, interleaved (the order reverses every block):

- **Tandem**, its default recipe exactly as ``bench/warm_starts.py --train`` runs it
  (:func:`warm_starts.train_config`: ``grpo``, 16 prompts × 8 samples, all-fail groups grown up to 32
  samples, lr 4e-4, cosine after 5 warm-up steps; the rollout stops at ``"\\n"`` or ``max_new_tokens``);
- **TRL** ``GRPOTrainer`` at each ``--lrs`` learning rate, with the same work per step as Tandem's recipe
  (:func:`grpo_vs_trl.grpo_config`: 16 prompts × 8 generations, the warm start's ``max_new_tokens``,
  temperature 1, group-std advantages, PPO clip 0.2, ``loss_type="grpo"``, β = 0, one optimiser step per
  batch, clip 1.0) and the same schedule (cosine, 5 warm-up steps), fp32 without gradient checkpointing
  (its fastest comparable setting on CPU, see docs/benchmarks.md); it stops at EOS or ``max_new_tokens``.

Both train on the same 512-row prompt file with the same reward function (``warm_starts.reward``), from
the same model folder, with one torch thread, each in a fresh interpreter. Every ``--every`` steps (and at
step 0) the run pauses its clock and measures held-out greedy accuracy on the same 300 prompts with the
same code (Tandem's ``evaluate_heldout``: greedy, the recipe's ``max_new_tokens`` and stop; the TRL run's
model is wrapped in Tandem's rollout engine for it). Wall and CPU time are training time only (model
loading and evaluations excluded, for both). The table and the targets are computed by
``bench/learning_table.py``.

    .venv/bin/python bench/learning.py --warm /tmp/warm --out /tmp/learning \\
        [--starts add2 sub2 countdown add3] [--steps 300] [--every 20] [--lrs 2e-4 6e-4 2e-3] [--seeds 0]
    .venv/bin/python bench/learning.py --out /tmp/learning --table-only   # the table of results.jsonl
    .venv/bin/python bench/learning.py --out /tmp/learning --plot fig.png # its curves, per step and second

``--variant LABEL=key=value[,key=value...]`` (repeatable) also runs Tandem's recipe with those dotted
overrides (e.g. ``--variant frontier=data.curriculum.kind=frontier``), interleaved with the others; each
variant gets its own table row (``warm start (LABEL)``) against the same TRL sweep. A variant with
``architecture.mode=decoupled`` runs through ``tandem train``'s driver (learner and rollout worker in two
processes; its CPU columns read "-"). ``--bf16`` runs both systems under
bf16 autocast (Tandem ``model.autocast_bf16=true``, TRL ``bf16=True`` with eager attention). ``--no-tandem`` runs
only the TRL sweep (e.g. in another ``--out`` beside the Tandem runs; concatenate the ``results.jsonl``
files and use ``--table-only`` to compare them).

Each result records when its run finished; the table is followed by a note for any row whose Tandem and
TRL runs finished more than an hour apart (the same deterministic run took 1.3-1.4x the wall a few hours
later on one machine, so such a ratio may measure the machine's drift, not the systems).

Missing warm starts are built first under ``--warm`` (``warm_starts.build``, ≈ 20 min each on a loaded
2-core machine). Every finished run is appended to ``OUT/results.jsonl``; a rerun skips runs already
there (same warm start, system, lr, seed, steps and evaluation interval).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any


def _sibling(name: str) -> types.ModuleType:
    """A module beside this file, loaded by path (no ``sys.path`` change in the importing process)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent / f"{name}.py")
        assert spec is not None and spec.loader is not None
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


warm_starts = _sibling("warm_starts")  # WARM_STARTS, train_config, reward, build
table = _sibling("learning_table")  # Eval, Run, compare, format_table
DEFAULT_LRS = (2e-4, 6e-4, 2e-3)
DEFAULT = table.DEFAULT  # the label of Tandem's default recipe among the --variant runs
TRL_WARMUP = 5  # = the Tandem recipe's trainer.warmup_steps


def tandem_config(w: Any, folder: Path, steps: int, seed: int, overrides: tuple[str, ...] = ()) -> Any:
    """Tandem's default recipe on warm start ``w`` (``warm_starts.train_config``), with a variant's dotted
    ``overrides``, without the run's own evaluations, samples, checkpoints or progress bar (this bench
    evaluates, outside the clock)."""
    from tandem.config import TandemConfig
    from tandem.config.loader import apply_overrides

    cfg = apply_overrides(warm_starts.train_config(w, folder), list(overrides))
    cfg["run"]["seed"] = seed
    cfg["trainer"]["total_steps"] = steps
    cfg["monitor"] = {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False}
    cfg["checkpoint"] = {"save_final": False}
    return TandemConfig.model_validate(cfg)


class Clock:
    """Training wall and CPU time with evaluations left out: ``lap()`` adds the time since the last mark,
    ``mark()`` restarts the count (after an evaluation)."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0
        self.mark()

    def mark(self) -> None:
        self._w, self._c = time.perf_counter(), time.process_time()

    def lap(self) -> None:
        self.wall += time.perf_counter() - self._w
        self.cpu += time.process_time() - self._c


def _evaluate(parts: Any, step: int, clock: Clock, evals: list[dict[str, float]]) -> None:
    from tandem.orchestration.parts import evaluate_heldout, evaluated_weights

    with evaluated_weights(parts):  # Tandem with trainer.ema_decay: its weight average, as `tandem train`
        acc = evaluate_heldout(parts)["eval/accuracy"]
    evals.append({"step": step, "acc": acc, "wall": clock.wall, "cpu": clock.cpu})
    print(f"@@EVAL step {step} acc {acc:.3f} wall {clock.wall:.1f} load {os.getloadavg()}", flush=True)


# Per-step metrics of a Tandem run averaged over its steps into the result (``diagnostics``), when logged.
DIAGNOSTICS = (
    "groups/all_equal_frac",
    "groups/all_equal_low_frac",
    "actor/entropy",
    "adaptive/extra_samples",
    "adaptive/extended_frac",
    "adaptive/rescued_frac",
    "adaptive/all_equal_frac",
    "rollout/temperature",
    "rollout/sampled_entropy",
    "greedy/reward_mean",
    "greedy/below_group_frac",
    "reference/added_frac",
    "reference/not_better_frac",
)


def _diagnostic_means(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Each of :data:`DIAGNOSTICS` averaged over the per-step metric ``rows`` that log it."""
    means = {}
    for key in DIAGNOSTICS:
        values = [float(r[key]) for r in rows if key in r]
        if values:
            means[key] = sum(values) / len(values)
    return means


def run_tandem(cfg: Any, every: int) -> dict[str, Any]:
    from tandem.orchestration.colocated import ColocatedTrainer
    from tandem.orchestration.parts import build_parts

    parts = build_parts(cfg)
    trainer = ColocatedTrainer(parts)
    clock, evals, step_metrics = Clock(), [], []
    _evaluate(parts, 0, clock, evals)
    clock.mark()
    steps = cfg.trainer.total_steps
    for step in range(1, steps + 1):
        step_metrics.append(trainer.train_step())
        clock.lap()
        if step % every == 0 or step == steps:
            _evaluate(parts, step, clock, evals)
        clock.mark()
    rewards = [m["reward/mean"] for m in step_metrics]
    return {"evals": evals, "rewards": rewards, "diagnostics": _diagnostic_means(step_metrics)}


def run_tandem_decoupled(cfg: Any, every: int) -> dict[str, Any]:
    """A run with ``architecture.mode=decoupled``: the learner and its rollout worker are two
    processes, so the run goes through ``tandem.train`` with its own evaluations every ``every`` steps.
    Training wall = the sum of the learner's ``timing/step`` (evaluations left out, as in
    :func:`run_tandem`; the worker may run ahead by at most η batches during one); ``start_s`` is the
    first step's wait for the worker to start, also left out (reported beside). No CPU clock covers
    both processes: ``cpu`` is NaN."""
    import tempfile

    from tandem.orchestration.runner import train
    from tandem.report.data import load_run

    with tempfile.TemporaryDirectory() as tmp:
        cfg = cfg.model_copy(
            update={
                "run": cfg.run.model_copy(update={"output_dir": tmp, "overwrite": True}),
                "monitor": cfg.monitor.model_copy(update={"eval_every": every}),
            }
        )
        train(cfg, progress=False)
        rows = load_run(tmp).rows  # one row per step: its training and evaluation metrics merged
    steps = [r for r in rows if "timing/step" in r]
    start_s = float(steps[0]["timing/step"]) - float(steps[0].get("timing/update", 0.0))
    evals, wall = [], 0.0
    for r in rows:
        if "timing/step" in r:
            wall += float(r["timing/step"]) - (start_s if r is steps[0] else 0.0)
        if "eval/accuracy" in r:
            evals.append({"step": r["step"], "acc": float(r["eval/accuracy"]), "wall": wall, "cpu": math.nan})
    rewards = [float(r["reward/mean"]) for r in steps]
    return {"evals": evals, "rewards": rewards, "diagnostics": _diagnostic_means(steps), "start_s": start_s}


def run_trl(
    w: Any, folder: Path, steps: int, seed: int, every: int, lr: float, bf16: bool = False
) -> dict[str, Any]:
    import tempfile

    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from tandem.orchestration.build import build_rollout_engine
    from tandem.orchestration.parts import build_parts

    grpo_vs_trl = _sibling("grpo_vs_trl")
    cfg = tandem_config(w, folder, steps, seed)
    parts = build_parts(cfg)  # the held-out rows, the eval reward and the tokenizer, as Tandem's run
    rows = [json.loads(x) for x in (folder / "train.jsonl").read_text().splitlines() if x.strip()]
    rewards: list[float] = []

    def reward(prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        values = warm_starts.reward(prompts, completions, **columns)
        rewards.append(sum(values) / len(values))
        return values

    clock, evals = Clock(), []

    class EvalEvery(TrainerCallback):
        """Held-out greedy accuracy at step 0 and every ``every`` steps, outside the clock."""

        def _eval(self, model: Any, step: int) -> None:
            was_training = model.training
            engine = build_rollout_engine(cfg, model=model, tokenizer=parts.tokenizer)
            _evaluate(dataclasses.replace(parts, engine=engine, average=None), step, clock, evals)
            model.train(was_training)

        def on_train_begin(self, args, state, control, model=None, **kw):  # noqa: ANN001
            self._eval(model, 0)
            clock.mark()

        def on_step_end(self, args, state, control, model=None, **kw):  # noqa: ANN001
            clock.lap()
            if state.global_step % every == 0 or state.global_step == steps:
                self._eval(model, state.global_step)
            clock.mark()

    with tempfile.TemporaryDirectory() as out:
        args = grpo_vs_trl.grpo_config(
            out,
            prompts_per_step=cfg.data.prompts_per_step,
            samples=cfg.rollout.n,
            new_tokens=cfg.rollout.max_new_tokens,
            lr=lr,
            steps=steps,
            seed=seed,
            lr_schedule="cosine",
            warmup_steps=TRL_WARMUP,
            bf16=bf16,
            attn="eager" if bf16 else None,  # PyTorch's CPU bf16 flash-attention backward is slow
        )
        trainer = GRPOTrainer(
            model=str(folder / "model"),
            reward_funcs=[reward],
            args=args,
            train_dataset=Dataset.from_list(rows),
            callbacks=[EvalEvery()],
        )
        trainer.train()
    return {"evals": evals, "rewards": rewards}


# -- driver ------------------------------------------------------------------------------------------------
def child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    w, folder = warm_starts.WARM_STARTS[args.start], args.warm / args.start
    if args.child == "tandem":
        bf16 = ("model.autocast_bf16=true",) if args.bf16 else ()
        cfg = tandem_config(w, folder, args.steps, args.seed, tuple(args.override) + bf16)
        if cfg.architecture.mode == "decoupled":
            out = run_tandem_decoupled(cfg, args.every)
        else:
            out = run_tandem(cfg, args.every)
    else:
        out = run_trl(w, folder, args.steps, args.seed, args.every, args.lr, bf16=args.bf16)
    print("@@RESULT " + json.dumps(out), flush=True)


def _key(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["start"], r["system"], r.get("variant", DEFAULT), r["lr"], r["seed"], r["steps"], r["every"])


def parse_variants(specs: list[str]) -> dict[str, tuple[str, ...]]:
    """``LABEL=key=value[,key=value...]`` -> {label: overrides}; the default recipe first."""
    variants: dict[str, tuple[str, ...]] = {DEFAULT: ()}
    for spec in specs:
        label, _, rest = spec.partition("=")
        if not label or not rest or label == DEFAULT:
            raise SystemExit(f"--variant {spec!r}: expected LABEL=key=value[,key=value...]")
        variants[label] = tuple(o for o in rest.split(",") if o)
    return variants


def spawn(
    args: argparse.Namespace,
    start: str,
    system: str,
    lr: float,
    seed: int,
    variant: str,
    overrides: tuple[str, ...],
) -> dict[str, Any]:
    """One run in a fresh interpreter (one torch thread); its log goes to ``OUT/logs``."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", system, "--start", start]
    cmd += ["--lr", str(lr), "--seed", str(seed), "--steps", str(args.steps), "--every", str(args.every)]
    cmd += ["--warm", str(args.warm), "--out", str(args.out)]
    cmd += [f"--override={o}" for o in overrides] + (["--bf16"] if args.bf16 else [])
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    tag = system if variant == DEFAULT else f"{system}-{variant}"
    log = args.out / "logs" / f"{start}-{tag}-lr{lr:g}-s{seed}.log"
    load_before, t0 = os.getloadavg(), time.perf_counter()
    with log.open("w") as fh:  # the child's @@EVAL lines appear in the log as it runs
        proc = subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, check=False)
    for line in log.read_text().splitlines():
        if line.startswith("@@RESULT "):
            res = json.loads(line[len("@@RESULT ") :])
            res.update(start=start, system=system, lr=lr, seed=seed, steps=args.steps, every=args.every)
            res.update(variant=variant, overrides=list(overrides), bf16=args.bf16)
            res.update(load_before=load_before, load_after=os.getloadavg())
            res["process_s"] = time.perf_counter() - t0
            res["finished"] = time.time()  # report() warns when compared runs finished far apart
            return res
    raise SystemExit(f"{system} run on {start} failed (exit {proc.returncode}); see {log}")


def report(results: list[dict[str, Any]], max_steps: int) -> None:
    rows, notes = [], []
    for start in dict.fromkeys(r["start"] for r in results):
        for seed in dict.fromkeys(r["seed"] for r in results if r["start"] == start):
            mine = [r for r in results if r["start"] == start and r["seed"] == seed]
            trl = [r for r in mine if r["system"] == "trl"]
            tandem = [r for r in mine if r["system"] == "tandem"]
            for variant in dict.fromkeys(r.get("variant", DEFAULT) for r in tandem):
                last = [r for r in tandem if r.get("variant", DEFAULT) == variant][-1]
                label = start if variant == DEFAULT else f"{start} ({variant})"
                if trl:
                    rows.append(
                        table.compare(
                            label,
                            table.run_from_result(last),
                            [table.run_from_result(r) for r in trl],
                            max_steps,
                        )
                    )
                    times = {f"{label} seed {seed} Tandem": last.get("finished")}
                    times |= {f"TRL lr {r['lr']:g}": r.get("finished") for r in trl}
                    note = table.far_apart(times)
                    if note:
                        notes.append(note)
    loads = [x for r in results for x in (r["load_before"][0], r["load_after"][0])]
    if loads:
        print(f"load average (1 min) at the start/end of the runs: {min(loads):.1f}–{max(loads):.1f}")
    print(table.format_table(rows))
    for note in notes:
        print(f"note: {note}")


def parent(args: argparse.Namespace) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "logs").mkdir(exist_ok=True)
    path = args.out / "results.jsonl"
    done = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []
    if args.table_only or args.plot:
        if args.table_only:
            report(done, args.max_steps)
        if args.plot:
            _sibling("learning_plot").plot(done, args.plot, args.max_steps)
            print(f"figure: {args.plot}")
        return
    for name in args.starts:
        warm_starts.build(warm_starts.WARM_STARTS[name], args.warm, rebuild=False)
    if any(bool(r.get("bf16", False)) != args.bf16 for r in done):
        raise SystemExit(f"{path} holds runs {'without' if args.bf16 else 'with'} --bf16: use another --out")
    have = {_key(r) for r in done}
    variants = parse_variants(args.variant)
    block = 0
    for seed in args.seeds:
        for start in args.starts:
            plan = [] if args.no_tandem else [("tandem", 0.0, v) for v in variants]
            plan += [("trl", lr, DEFAULT) for lr in args.lrs]
            for system, lr, variant in plan if block % 2 == 0 else plan[::-1]:
                key = (start, system, variant, lr, seed, args.steps, args.every)
                if key in have:
                    continue
                res = spawn(args, start, system, lr, seed, variant, variants[variant])
                done.append(res)
                with path.open("a") as fh:
                    fh.write(json.dumps(res) + "\n")
                best = max(res["evals"], key=lambda e: e["acc"])
                print(
                    f"{start} seed {seed} {system} {variant} lr {lr:g}: {res['evals'][0]['acc']:.1%} -> best "
                    f"{best['acc']:.1%} at step {best['step']} ({best['wall']:.0f} s training wall; "
                    f"{res['evals'][-1]['wall']:.0f} s for {args.steps} steps); "
                    f"load {res['load_before'][0]:.1f} -> {res['load_after'][0]:.1f}",
                    flush=True,
                )
            block += 1
    current = [r for r in done if r["steps"] == args.steps and r["every"] == args.every]
    report([r for r in current if r["start"] in args.starts and r["seed"] in args.seeds], args.max_steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warm", type=Path, default=Path("/tmp/warm"), help="Folder of the warm starts.")
    ap.add_argument("--out", type=Path, default=Path("/tmp/learning"), help="Results and logs.")
    ap.add_argument(
        "--starts", nargs="*", default=list(warm_starts.WARM_STARTS), choices=list(warm_starts.WARM_STARTS)
    )
    ap.add_argument("--steps", type=int, default=300, help="Training steps of every run.")
    ap.add_argument("--every", type=int, default=20, help="Evaluate held-out accuracy every N steps.")
    ap.add_argument("--lrs", type=float, nargs="*", default=list(DEFAULT_LRS), help="TRL's learning rates.")
    ap.add_argument("--seeds", type=int, nargs="*", default=[0])
    ap.add_argument("--max-steps", type=int, default=300, help="Step limit of the accuracy target.")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help="LABEL=key=value[,key=value...]: also run Tandem with these overrides (one table row each).",
    )
    ap.add_argument("--no-tandem", action="store_true", help="Run only TRL (e.g. its sweep in another OUT).")
    ap.add_argument(
        "--bf16",
        action="store_true",
        help="Both systems under bf16 autocast (Tandem model.autocast_bf16=true; TRL bf16=True, eager "
        "attention); an OUT holds runs of one kind only.",
    )
    ap.add_argument("--table-only", action="store_true", help="Print the table of OUT/results.jsonl.")
    ap.add_argument(
        "--plot", type=Path, help="Only draw OUT/results.jsonl to this PNG (bench/learning_plot.py)."
    )
    ap.add_argument("--override", action="append", default=[], help=argparse.SUPPRESS)
    ap.add_argument("--child", choices=("tandem", "trl"), help=argparse.SUPPRESS)
    ap.add_argument("--start", help=argparse.SUPPRESS)
    ap.add_argument("--lr", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.steps < 1 or args.every < 1:
        raise SystemExit("--steps and --every must be at least 1")
    if args.child:
        child(args)
    else:
        parent(args)


if __name__ == "__main__":
    main()
