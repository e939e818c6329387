"""``tandem train``, ``tandem demo``, ``tandem init-model`` and ``tandem sft``: RL training and the models
it starts from."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from tandem.cli.app import Overrides, app, err, out, user_errors


@app.command()
@user_errors
def train(
    config: Annotated[Path, typer.Argument(help="YAML config, e.g. configs/grpo.yaml.")],
    overrides: Overrides = None,
    resume: Annotated[bool, typer.Option(help="Continue the run from its latest checkpoint.")] = False,
    progress: Annotated[
        bool | None,
        typer.Option(help="Show the progress bar (default: monitor.progress).", show_default=False),
    ] = None,
) -> None:
    """Train a policy with RL (GRPO, DAPO, RLOO, ...).

    reward.functions in a config are imported and run as Python code: use only code you trust.

    Example: tandem train configs/dapo.yaml algorithm.clip_high=0.28 trainer.lr=5e-6
    """
    from tandem.cli.report import print_run_result
    from tandem.config import load_config

    cfg = load_config(config, overrides or [])  # a config error is reported before torch loads (seconds)
    from tandem.orchestration.runner import train as run_train

    _check_other_models(cfg)  # before a warm start's minutes
    _ensure_warm_start(cfg)
    terminated: list[int] = []
    with _sigterm_as_interrupt(terminated):
        try:
            result = run_train(cfg, resume=resume, progress=progress)
        except KeyboardInterrupt:
            err.print("[yellow]terminated[/]" if terminated else "[yellow]interrupted[/]")
            _say_how_to_resume(cfg, config, overrides or [])
            raise typer.Exit(143 if terminated else 130) from None
    print_run_result(out, result, cfg.data.eval_size)


@contextlib.contextmanager
def _sigterm_as_interrupt(terminated: list[int]) -> Iterator[None]:
    """SIGTERM (a scheduler's preemption, ``kill``) stops the run as Ctrl-C does — its workers shut down,
    a run stopped before its first step leaves no folder, the resume command is printed — instead of
    killing the process where it stands; ``terminated`` records that it came."""

    def stop(signum: int, frame: object) -> None:
        terminated.append(signum)
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread (the CLI called from a library's thread): leave it be
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _say_how_to_resume(cfg, config: Path, overrides: list[str]) -> None:
    """After Ctrl-C: the command that continues the run from its latest checkpoint, or, for a run that holds
    none yet, the one that starts it over (a run stopped before its first step leaves no folder)."""
    import shlex

    from tandem.orchestration.runfolder import run_dir_of
    from tandem.train.checkpoint import checkpoint_step, latest_checkpoint

    run_dir = run_dir_of(cfg)
    if not run_dir.is_dir():
        return
    latest = latest_checkpoint(run_dir / "checkpoints")
    if latest is None:
        over = [o for o in overrides if not o.startswith("run.overwrite=")] + ["run.overwrite=true"]
        again = shlex.join(["tandem", "train", str(config), *over])
        err.print(
            f"{escape(str(run_dir))} holds no checkpoint yet (checkpoint.every={cfg.checkpoint.every}; 0 saves "
            f"only at the end): nothing to resume; start over with: {escape(again)}",
            highlight=False,
            soft_wrap=True,
        )
        return
    again = shlex.join(["tandem", "train", str(config), *overrides, "--resume"])
    err.print(
        f"{escape(str(run_dir))} keeps step {checkpoint_step(latest.name)}; continue with: {escape(again)}",
        highlight=False,
        soft_wrap=True,
    )


@app.command("init-model")
@user_errors
def init_model(
    out_dir: Annotated[Path, typer.Argument(help="Folder to create (an ordinary HF model folder).")],
    hidden_size: Annotated[int, typer.Option(help="Hidden size.")] = 128,
    num_layers: Annotated[int, typer.Option(help="Transformer layers.")] = 4,
    num_heads: Annotated[
        int, typer.Option(help="Attention heads (keep hidden/heads >= 32 for vLLM on CPU).")
    ] = 4,
    num_kv_heads: Annotated[
        int | None, typer.Option(help="Key/value heads (grouped-query attention); default: --num-heads.")
    ] = None,
    intermediate_size: Annotated[
        int | None, typer.Option(help="MLP width; default: 4 x --hidden-size.", show_default=False)
    ] = None,
    arch: Annotated[str, typer.Option(help="Architecture: llama or qwen2.")] = "llama",
    tokenizer: Annotated[
        str,
        typer.Option(help="char (one token per character) or bpe (byte-level BPE with a ChatML template)."),
    ] = "char",
    vocab_size: Annotated[
        int | None,
        typer.Option(
            help="BPE vocabulary size (--tokenizer bpe only; default 512). Capped at what the built-in "
            "tasks' text yields (~4.7k entries); the output says when it is.",
            show_default=False,
        ),
    ] = None,
    max_position_embeddings: Annotated[int, typer.Option(help="Longest sequence (positions).")] = 256,
    seed: Annotated[int, typer.Option(help="Initialisation seed.")] = 0,
) -> None:
    """Build a small model: a Llama with a character tokenizer (default), or a Llama/Qwen2 with a
    byte-level BPE tokenizer trained on the built-in tasks' text and a ChatML chat template.

    OUT may be new, empty or an earlier Tandem model folder (replaced atomically); any other folder is
    refused. Examples: tandem init-model models/tiny --hidden-size 128 --num-layers 4;
    tandem init-model models/qwen --arch qwen2 --tokenizer bpe --hidden-size 512 --num-layers 8 --num-heads 8
    """
    from tandem.data.outputs import check_output_dir
    from tandem.errors import ConfigError
    from tandem.models import init_model as build_model
    from tandem.models.bpe import DEFAULT_VOCAB_SIZE

    if vocab_size is not None and tokenizer != "bpe":  # a char vocabulary is fixed: never ignore it silently
        raise ConfigError(
            "applies to --tokenizer bpe only (a char tokenizer's vocabulary is fixed)", where="--vocab-size"
        )
    wanted_vocab = DEFAULT_VOCAB_SIZE if vocab_size is None else vocab_size
    check_output_dir(out_dir, "model", where="OUT")
    path = build_model(
        out_dir,
        arch=arch,
        tokenizer=tokenizer,
        vocab_size=wanted_vocab,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        seed=seed,
    )
    out.print(f"{escape(arch)}/{escape(tokenizer)} model written to [bold]{escape(str(path))}[/]")
    if tokenizer == "bpe":  # BPE training stops when the corpus runs out of merges: say so, not silently
        got = _vocab_size(path)
        if got < wanted_vocab:
            out.print(
                f"note: --vocab-size {wanted_vocab} capped at {got}: the built-in tasks' text has no more "
                "BPE merges",
                highlight=False,
                soft_wrap=True,
            )


def _vocab_size(model_dir: Path) -> int:
    """The vocabulary size recorded in a model folder's ``config.json`` (what init-model really built)."""
    import json

    return int(json.loads((model_dir / "config.json").read_text(encoding="utf-8"))["vocab_size"])


@app.command()
@user_errors
def sft(
    model: Annotated[Path, typer.Argument(help="Starting HF model folder.")],
    out_dir: Annotated[
        Path,
        typer.Option(
            "--out",
            help="Where to save the fine-tuned model: a new or empty folder, or an earlier Tandem model "
            "folder (replaced atomically); never the starting model.",
        ),
    ],
    data: Annotated[Path | None, typer.Option(help="JSONL/Parquet with prompt+completion or text.")] = None,
    task: Annotated[str | None, typer.Option(help="Built-in task whose reference answers to learn.")] = None,
    task_option: Annotated[
        list[str] | None, typer.Option(help="Task option KEY=VALUE (repeatable), e.g. --task-option ops=+.")
    ] = None,
    train_size: Annotated[int, typer.Option(help="Rows generated from --task.")] = 4096,
    steps: Annotated[int, typer.Option(help="Optimiser steps.")] = 300,
    lr: Annotated[float, typer.Option(help="Learning rate.")] = 3e-3,
    weight_decay: Annotated[float, typer.Option(help="AdamW weight decay.")] = 0.0,
    batch_size: Annotated[int, typer.Option(help="Rows per step.")] = 64,
    seed: Annotated[int, typer.Option(help="Seed.")] = 0,
) -> None:
    """Supervised fine-tuning on completions only (warm start for RL).

    Example: tandem sft models/tiny --task arith --steps 300 --out models/arith-sft
    """
    from tandem.cli.progress import step_progress
    from tandem.cli.sft_data import sft_pairs
    from tandem.config import parse_override
    from tandem.data.outputs import check_output_dir
    from tandem.models import load_causal_lm, load_tokenizer, save_pretrained_atomic
    from tandem.train.sft import SFTSettings, check_loop_settings, run_sft

    settings = SFTSettings(steps=steps, lr=lr, batch_size=batch_size, weight_decay=weight_decay, seed=seed)
    check_loop_settings(settings)  # a bad option fails in one line before anything is read or written
    check_output_dir(out_dir, "model", sources=(model, data), where="--out")  # before any training
    options = {".".join(key): value for key, value in map(parse_override, task_option or [])}
    pairs = sft_pairs(data=data, task=task, train_size=train_size, seed=seed, task_options=options)
    policy, tok = load_causal_lm(model), load_tokenizer(model)
    with step_progress("sft", steps, key="sft/loss") as on_step:
        metrics = run_sft(policy, tok, pairs, settings, on_step=on_step)
    save_pretrained_atomic(policy, tok, out_dir, created_by="tandem sft", source=model)
    out.print(f"SFT done: loss {metrics['sft/loss']:.4f}; model saved to [bold]{escape(str(out_dir))}[/]")


@app.command()
@user_errors
def demo(
    overrides: Overrides = None,
) -> None:
    """The quickstart: GRPO on arithmetic from a warm start, with before/after held-out accuracy."""
    from tandem.cli.report import print_run_result
    from tandem.config import load_config
    from tandem.orchestration.runfolder import run_environment
    from tandem.orchestration.runner import train as run_train

    config = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"
    if not config.exists():
        config = Path("configs/quickstart.yaml")
    cfg = load_config(config, ["run.overwrite=true", *(overrides or [])])
    shipped = config.resolve().parents[1] / cfg.model.path  # the warm start beside the config's repository
    if not Path(cfg.model.path).is_absolute() and not Path(cfg.model.path).exists() and shipped.exists():
        # run from another folder: use the shipped warm start rather than rebuild it (minutes) here
        cfg = load_config(config, ["run.overwrite=true", f"model.path={shipped}", *(overrides or [])])
    out.print(
        f"[bold]Tandem quickstart[/]: {cfg.algorithm.name} on '{cfg.data.task}', {cfg.trainer.total_steps} steps"
    )
    _ensure_warm_start(cfg)
    result = run_train(cfg)
    print_run_result(out, result, cfg.data.eval_size)
    env = run_environment()
    out.print(
        f"[dim]numerics: torch {env['torch']}, {env['cpu_capability']} CPU kernels, {env['torch_threads']} "
        "thread(s); the figures repeat bit for bit only with the same versions, kernels and threads "
        "(docs/benchmarks.md)[/]"
    )


def _check_other_models(cfg) -> None:
    """The model folders a run reads besides its policy (reward model, critic, reference) exist, in one
    line naming the key; the policy's own folder may still be built (``model.warm_start_sft``)."""
    from tandem.models.loading import check_model_key

    check_model_key(cfg.reward.model.path if cfg.reward.model else None, "reward.model.path")
    check_model_key(cfg.critic.path if cfg.critic else None, "critic.path")
    check_model_key(cfg.model.ref_path, "model.ref_path")


def _ensure_warm_start(cfg) -> None:
    """Build the cached warm-start model (model.warm_start_sft) with a visible progress bar."""
    if cfg.model.warm_start_sft is None or Path(cfg.model.path).exists():
        return
    from tandem.cli.progress import step_progress
    from tandem.train.sft import build_warm_start

    opts = cfg.model.warm_start_sft.model_dump()
    out.print(
        f"building warm-start model [bold]{escape(cfg.model.path)}[/] (tandem sft, cached for later runs)"
    )
    with step_progress("warm-start sft", opts["steps"], key="sft/loss") as on_step:
        build_warm_start(cfg.model.path, seed=cfg.run.seed, on_step=on_step, **opts)
