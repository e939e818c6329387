"""``tandem distill``: offline knowledge distillation of a teacher into a (smaller) student."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from tandem.cli.app import app, out, parse_options, user_errors


@app.command()
@user_errors
def distill(
    teacher: Annotated[
        Path, typer.Argument(help="Teacher model folder (a run's checkpoint model, or an INT8 export).")
    ],
    student: Annotated[
        str,
        typer.Option(
            help="Student: a model folder with the teacher's tokenizer, or a new model's size as "
            "KEY=VALUE,... (hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size) shrunk "
            "from the teacher's config, e.g. hidden_size=64.",
        ),
    ],
    out_dir: Annotated[
        Path,
        typer.Option(
            "--out",
            help="Where to save the student: a new or empty folder, or an earlier Tandem model folder "
            "(replaced atomically); never the teacher or the starting student.",
        ),
    ],
    data: Annotated[Path | None, typer.Option(help="JSONL/Parquet with prompt+completion or text.")] = None,
    task: Annotated[
        str | None, typer.Option(help="Built-in task whose prompts (and answers) to use.")
    ] = None,
    task_option: Annotated[
        list[str] | None, typer.Option(help="Task option KEY=VALUE (repeatable), e.g. --task-option ops=+.")
    ] = None,
    train_size: Annotated[int, typer.Option(help="Rows generated from --task.")] = 4096,
    generate: Annotated[
        bool,
        typer.Option(
            help="Replace the completions by the teacher's own greedy answers (sequence-level distillation)."
        ),
    ] = False,
    max_new_tokens: Annotated[int, typer.Option(help="Longest teacher answer with --generate.")] = 32,
    top_k: Annotated[int, typer.Option(help="Teacher logits kept per token (the targets' size).")] = 20,
    temperature: Annotated[
        float, typer.Option(help="Softening temperature τ (the KL is scaled by τ²).")
    ] = 1.0,
    sft_weight: Annotated[
        float, typer.Option(help="Share of plain cross-entropy on the completions in the loss (0 to 1).")
    ] = 0.0,
    targets: Annotated[
        Path | None,
        typer.Option(
            help="Teacher targets file (.safetensors): read if it exists and was made by this teacher from the "
            "same data and --top-k, else computed and written there."
        ),
    ] = None,
    steps: Annotated[int, typer.Option(help="Optimiser steps.")] = 300,
    lr: Annotated[float, typer.Option(help="Learning rate.")] = 3e-3,
    weight_decay: Annotated[float, typer.Option(help="AdamW weight decay.")] = 0.0,
    batch_size: Annotated[int, typer.Option(help="Pairs per step.")] = 64,
    seed: Annotated[int, typer.Option(help="Seed.")] = 0,
) -> None:
    """Distil TEACHER into a student: forward KL to the teacher's top-k token distributions (temperature τ)
    on a dataset's completions or on the teacher's own answers, optionally mixed with SFT.

    Example: tandem distill runs/quickstart/checkpoints/step-00000450/model --student hidden_size=64
    --task arith --task-option digits=2 --task-option ops=+ --generate --out models/arith-student
    """
    from tandem.cli.progress import count_progress, step_progress
    from tandem.cli.sft_data import sft_pairs
    from tandem.config import parse_override
    from tandem.data.outputs import check_output_dir
    from tandem.errors import ConfigError
    from tandem.models import load_causal_lm, load_model, load_tokenizer, save_pretrained_atomic
    from tandem.models.vocab import check_same_vocab
    from tandem.train.distill import (
        DistillSettings,
        load_targets,
        run_distill,
        save_targets,
        stored_fingerprint,
        targets_fingerprint,
        teacher_completions,
        teacher_targets,
    )

    student_dir = Path(student) if "=" not in student else None
    check_output_dir(out_dir, "model", sources=(teacher, student_dir), where="--out")  # before any work
    _check_ranges(temperature, sft_weight, top_k, steps, batch_size)
    if targets is not None and targets.suffix != ".safetensors":
        raise ConfigError(f"{targets} must end in .safetensors", where="--targets")
    options = {".".join(key): value for key, value in map(parse_override, task_option or [])}
    pairs = sft_pairs(
        data=data, task=task, train_size=train_size, seed=seed, task_options=options, conversational=False
    )
    teacher_model, tok = load_model(teacher), load_tokenizer(teacher)  # an INT8 export may teach
    if student_dir is not None:
        check_same_vocab(load_tokenizer(student_dir), tok, where="--student")
        student_model = load_causal_lm(student_dir)
    else:
        student_model = _new_student(teacher, parse_options(student.split(","), "--student"), seed)
    if generate:
        out.print(f"teacher answers {len(pairs)} prompts")
        prompts = [p for p, _ in pairs]
        pairs = teacher_completions(teacher_model, tok, prompts, max_new_tokens=max_new_tokens, seed=seed)
    # the targets file is a cache: reused only when made by this teacher (same files) from these pairs
    fingerprint = targets_fingerprint(teacher.resolve(), pairs, top_k) if targets is not None else None
    stored = None
    if targets is not None and targets.exists():
        if stored_fingerprint(targets) == fingerprint:
            stored = load_targets(targets, len(pairs))
        else:
            out.print(
                f"{escape(str(targets))} was made by another teacher or from other data: recomputing it"
            )
    if stored is None:
        with count_progress("teacher top-k logits") as on_progress:
            stored = teacher_targets(
                teacher_model, tok, pairs, top_k=top_k, on_batch=lambda done: on_progress(done, len(pairs))
            )
        if targets is not None:
            save_targets(stored, targets, fingerprint)
    del teacher_model
    settings = DistillSettings(
        steps=steps,
        lr=lr,
        batch_size=batch_size,
        weight_decay=weight_decay,
        temperature=temperature,
        sft_weight=sft_weight,
        seed=seed,
    )
    with step_progress("distill", steps, key="distill/kl") as on_step:
        metrics = run_distill(student_model, tok, pairs, stored, settings, on_step=on_step)
    save_pretrained_atomic(student_model, tok, out_dir, created_by="tandem distill", source=teacher)
    params = sum(p.numel() for p in student_model.parameters())
    out.print(
        f"distilled: kl {metrics['distill/kl']:.4f}, ce {metrics['distill/ce']:.4f}; student "
        f"({params / 1e6:.2f}M params) saved to [bold]{escape(str(out_dir))}[/]"
    )


def _check_ranges(temperature: float, sft_weight: float, top_k: int, steps: int, batch_size: int) -> None:
    from tandem.errors import ConfigError

    for flag, ok, what in (
        ("--temperature", temperature > 0, f"must be > 0, got {temperature}"),
        ("--sft-weight", 0 <= sft_weight <= 1, f"must be within [0, 1], got {sft_weight}"),
        ("--top-k", top_k >= 1, f"must be >= 1, got {top_k}"),
        ("--steps", steps >= 1, f"must be >= 1, got {steps}"),
        ("--batch-size", batch_size >= 1, f"must be >= 1, got {batch_size}"),
    ):
        if not ok:
            raise ConfigError(what, where=flag)


def _new_student(teacher: Path, size: dict, seed: int):
    """A new model of the teacher's architecture with the sizes in ``size`` (random init, seeded). The
    config is read from the teacher's folder: a loaded INT8 teacher's own has its embeddings untied."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from tandem.train.distill import student_config

    cfg = student_config(AutoConfig.from_pretrained(str(teacher), local_files_only=True), size)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg)
