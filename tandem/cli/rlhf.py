"""``tandem rm``, ``tandem dpo`` and ``tandem label``: reward model, offline DPO, RLAIF labelling."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tandem.cli.app import app, user_errors
from tandem.cli.engines import EngineName, EngineOptions, check_engine, engine_options

out = Console()
ConfigPath = Annotated[
    Path,
    typer.Argument(
        help="The command's YAML config (configs/rm.yaml, configs/dpo.yaml, configs/rlaif_dpo.yaml)."
    ),
]
# rm / dpo / label configs are flat: their keys sit at the top (lr, epochs, beta, data.train_file)
CommandOverrides = Annotated[
    list[str] | None,
    typer.Argument(help="Overrides of the config's keys, e.g. lr=5e-4 epochs=2 data.val_file=null."),
]


def _pairs(data_cfg: Any, tokenizer: Any, seed: int) -> tuple[list, list]:
    """Train and held-out pairs per the config's ``data`` section (split by prompt when no val_file)."""
    from tandem.data.preference import load_preferences
    from tandem.data.preference_ops import split_by_prompt
    from tandem.data.storage import local_input

    def length(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    def load(url: str) -> list:
        with local_input(url) as local:
            data = load_preferences(
                local,
                skip_invalid=data_cfg.skip_invalid,
                max_length=data_cfg.max_length,
                length_fn=length,
                skip_switch="data.skip_invalid=true",
            )
        if data.invalid:
            out.print(f"[yellow]{len(data.invalid)} invalid rows skipped[/] ({escape(url)})")
        return data.pairs

    train = load(data_cfg.train_file)
    if data_cfg.val_file:
        return train, load(data_cfg.val_file)
    return split_by_prompt(train, val_fraction=data_cfg.val_fraction, seed=seed)


def _check_out(out_dir: str, kind: str, *sources: str | None) -> None:
    """Refuse ``out_dir`` before any training when replacing it would lose data: an unrelated folder, or
    (a folder holding) a model the command reads (:func:`tandem.data.outputs.check_output_dir`)."""
    from tandem.data.outputs import check_output_dir

    check_output_dir(out_dir, kind, sources=sources, where="out_dir")


def _check_models(cfg: Any, *keys: str) -> None:
    """Each model folder the config names under ``keys`` exists and is one, checked before any work."""
    from tandem.models.loading import check_model_key

    for key in keys:
        check_model_key(getattr(cfg, key), key)


def _save_to(out_dir: str, kind: str, save: Any) -> None:
    """Run ``save(local_dir)`` (atomic and checked locally); publish to ``out_dir`` when it is a URL."""
    from tandem.data.outputs import output_folder

    with output_folder(out_dir, kind) as local:
        save(local)


@user_errors
def rm(config: ConfigPath, overrides: CommandOverrides = None) -> None:
    """Train a Bradley–Terry reward model; prints held-out pairwise accuracy per epoch.

    Example: tandem rm configs/rm.yaml epochs=3 out_dir=runs/rm
    """
    import math

    from tandem.cli.progress import step_progress
    from tandem.config.rlhf import RMConfig, load_command_config
    from tandem.data.storage import local_input
    from tandem.models.encoder import is_encoder
    from tandem.train import rm as rmlib

    cfg = load_command_config(RMConfig, config, overrides)
    _check_models(cfg, "model")
    _check_out(cfg.out_dir, "reward", cfg.model)
    with local_input(cfg.model) as model_dir:
        model, tok = rmlib.load_reward_model(model_dir, init_head=True)
    train, val = _pairs(cfg.data, tok, cfg.seed)
    kind = "encoder" if is_encoder(model) else "causal LM"
    out.print(f"reward model ({kind}): {len(train)} train / {len(val)} held-out pairs")
    if cfg.lora.enabled:
        from tandem.models.lora import apply_lora

        lo = cfg.lora
        model = apply_lora(
            model, r=lo.r, alpha=lo.alpha, dropout=lo.dropout, target_modules=lo.target_modules,
            task_type="SEQ_CLS",
        )  # fmt: skip
    settings = rmlib.RMSettings(
        epochs=cfg.epochs, lr=cfg.lr, batch_size=cfg.batch_size, use_margin=cfg.use_margin,
        center_coef=cfg.center_coef, seed=cfg.seed,
    )  # fmt: skip
    steps = cfg.epochs * math.ceil(len(train) / cfg.batch_size)
    with step_progress("rm", steps, key="rm/loss") as on_step:
        history = rmlib.train_reward_model(model, tok, train, val, settings, on_step=on_step)
    if cfg.lora.enabled:
        model = model.merge_and_unload()  # trained: fold the adapters in, save a plain reward model
    table = Table(title="reward model")
    for col in ("epoch", "loss", "train acc", "held-out acc"):
        table.add_column(col, justify="right")
    for row in history:
        table.add_row(
            f"{row['epoch']:.0f}", f"{row['rm/loss']:.4f}",
            f"{100 * row['rm/train_accuracy']:.1f}%", f"{100 * row['rm/val_accuracy']:.1f}%",
        )  # fmt: skip
    out.print(table)
    stats = rmlib.reward_stats(model, tok, train) | {"history": history, "config": cfg.model_dump()}
    _save_to(cfg.out_dir, "reward", lambda d: rmlib.save_reward_model(model, tok, d, stats, source=cfg.model))
    out.print(f"reward model saved to [bold]{escape(cfg.out_dir)}[/] (use as reward.model.path)")


@user_errors
def dpo(
    config: ConfigPath,
    overrides: CommandOverrides = None,
    resume: Annotated[
        bool,
        typer.Option(
            help="Continue an interrupted offline run from its latest checkpoint (<out_dir>.checkpoints, "
            "written every save_every steps)."
        ),
    ] = False,
) -> None:
    """Offline DPO with reference log-probs computed once and cached (no reference model in memory).

    Example: tandem dpo configs/dpo.yaml beta=0.1 out_dir=runs/dpo save_every=50
    """
    from tandem.config.rlhf import DPOConfig, load_command_config
    from tandem.data.storage import local_input
    from tandem.models import load_causal_lm, load_tokenizer, save_pretrained_atomic
    from tandem.models.lora import merged_model
    from tandem.train import dpo as dpolib
    from tandem.train import dpo_checkpoint as dpockpt

    cfg = load_command_config(DPOConfig, config, overrides)
    _check_models(cfg, "model", "ref_model")
    if cfg.online_rounds or cfg.eval_task:
        check_engine(cfg.engine, "engine")
    _check_out(cfg.out_dir, "model", cfg.model, cfg.ref_model)
    resume_from = _dpo_resume_point(cfg, resume)  # refusals before any data or model is loaded
    settings = dpolib.DPOSettings(
        beta=cfg.beta, loss_type=cfg.loss_type, label_smoothing=cfg.label_smoothing,
        length_normalize=cfg.length_normalize, lr=cfg.lr,
        batch_size=cfg.batch_size, epochs=cfg.epochs, max_steps=cfg.max_steps,
        warmup_steps=cfg.warmup_steps, sft_coef=cfg.sft_coef, seed=cfg.seed, shared_prefix=cfg.shared_prefix,
    )  # fmt: skip
    with local_input(cfg.model) as model_dir:
        tok = load_tokenizer(model_dir)
        train, val = _pairs(cfg.data, tok, cfg.seed)
        out.print(f"DPO: {len(train)} train / {len(val)} held-out pairs")
        if resume_from is not None:  # the same pairs, and no more steps done than the run has
            folder, state = resume_from
            total = dpolib.total_steps(len(train), settings)
            step = dpockpt.check_resume_state(folder, state, dpockpt.pairs_key(train), total)
            out.print(
                f"resuming from [bold]{escape(str(folder))}[/] (step {step} of {total})", soft_wrap=True
            )
        if not cfg.online_rounds:  # online rounds use each round's policy as reference
            ref_train, ref_val = _reference(cfg, str(model_dir), tok, train, val)  # a resume: the cache
        policy = load_causal_lm(model_dir)
    if cfg.lora.enabled:
        from tandem.models.lora import apply_lora
        from tandem.utils.seed import seed_everything

        lo = cfg.lora
        seed_everything(cfg.seed)  # the adapters' random init: the same in every run of this config
        policy = apply_lora(
            policy, r=lo.r, alpha=lo.alpha, dropout=lo.dropout, target_modules=lo.target_modules
        )
    before = _verifier_score(cfg, policy, tok) if cfg.eval_task else None
    saved_as = {"created_by": dpockpt.CREATED_BY, "source": cfg.model}
    if cfg.online_rounds:
        _online(cfg, policy, tok, train, settings)
        after = _verifier_score(cfg, policy, tok) if cfg.eval_task else None
        if before is not None and after is not None:
            out.print(f"verifier accuracy {100 * before:.1f}% -> {100 * after:.1f}%")
        _save_to(
            cfg.out_dir, "model", lambda d: save_pretrained_atomic(merged_model(policy), tok, d, **saved_as)
        )
        out.print(f"policy saved to [bold]{escape(cfg.out_dir)}[/]")
        return
    start = dpolib.implicit_reward_metrics(policy, tok, val, ref_val, cfg.beta)
    again = ["tandem", "dpo", str(config), *(overrides or [])]
    try:  # Ctrl-C in training, or in the evaluation and save after its last checkpoint: how to go on
        _train_offline(cfg, policy, tok, train, ref_train, settings, resume_from)
        end = dpolib.implicit_reward_metrics(policy, tok, val, ref_val, cfg.beta)
        after = _verifier_score(cfg, policy, tok) if cfg.eval_task else None
        _print_dpo(start, end, before, after)
        _save_to(
            cfg.out_dir, "model", lambda d: save_pretrained_atomic(merged_model(policy), tok, d, **saved_as)
        )
    except KeyboardInterrupt:
        if cfg.save_every:
            _say_how_to_resume_dpo(dpockpt.checkpoints_root(cfg.out_dir), again, cfg.save_every)
        raise
    if cfg.save_every or resume_from is not None:  # the final model is safe: its checkpoints are not needed
        dpockpt.remove_checkpoints(dpockpt.checkpoints_root(cfg.out_dir))
    out.print(f"policy saved to [bold]{escape(cfg.out_dir)}[/]")


def _dpo_resume_point(cfg: Any, resume: bool) -> tuple[Path, dict] | None:
    """``--resume``: the checkpoint to continue from and its state (refusals in one line when there is
    none, the run finished, or a key that changes the run differs); without it, a refusal when an
    interrupted run's checkpoints would be buried by a fresh start. Checkpoints are offline-only and local."""
    from tandem.data.storage import is_remote
    from tandem.errors import ConfigError
    from tandem.train import dpo_checkpoint as dpockpt

    if cfg.online_rounds and (resume or cfg.save_every):
        raise ConfigError(
            "online DPO keeps no checkpoints: --resume and save_every are for offline DPO (online_rounds=0)",
            where="online_rounds" if resume else "save_every",
        )
    if is_remote(cfg.out_dir) and (resume or cfg.save_every):
        raise ConfigError(
            "DPO checkpoints are written beside out_dir and need a local one",
            where="save_every" if cfg.save_every else "out_dir",
            hint="use a local out_dir, or save_every=0 without --resume",
        )
    if cfg.online_rounds or is_remote(cfg.out_dir):
        return None
    root = dpockpt.checkpoints_root(cfg.out_dir)
    if not resume:
        dpockpt.check_fresh_start(root)
        return None
    return dpockpt.find_resume(root, cfg.model_dump(mode="json"), cfg.out_dir)


def _train_offline(
    cfg: Any,
    policy: Any,
    tok: Any,
    train: list,
    ref_train: Any,
    settings: Any,
    resume_from: tuple[Path, dict] | None,
) -> None:
    """``train_dpo`` with a progress bar, checkpoints every ``save_every`` steps (and at the last) and, with
    ``--resume``, the state of ``resume_from`` (already checked)."""
    from tandem.cli.progress import step_progress
    from tandem.train import dpo as dpolib
    from tandem.train import dpo_checkpoint as dpockpt

    total = dpolib.total_steps(len(train), settings)
    root = dpockpt.checkpoints_root(cfg.out_dir)
    restore = None if resume_from is None else dpockpt.checkpoint_restorer(resume_from[0], policy)
    saver = None
    if cfg.save_every:
        config = cfg.model_dump(mode="json")
        saver = dpockpt.checkpoint_saver(root, policy, tok, config, dpockpt.pairs_key(train))
    with step_progress("dpo", total, key="loss") as on_step:
        dpolib.train_dpo(
            policy, tok, train, ref_train, settings, on_step=on_step,
            save_every=cfg.save_every, on_checkpoint=saver, restore=restore,
        )  # fmt: skip


def _say_how_to_resume_dpo(root: Path, again: list[str], save_every: int) -> None:
    """After Ctrl-C: the command that continues from the latest checkpoint, or, before the first one, the
    command that starts over."""
    import shlex

    from tandem.cli.app import err
    from tandem.train.checkpoint import latest_step

    step = latest_step(root)
    if step is None:
        err.print(
            f"no checkpoint yet (save_every={save_every}): nothing to resume; start over with: "
            f"{escape(shlex.join(again))}",
            highlight=False,
            soft_wrap=True,
        )
        return
    err.print(
        f"{escape(str(root))} keeps step {step}; continue with: {escape(shlex.join([*again, '--resume']))}",
        highlight=False,
        soft_wrap=True,
    )


def _reference(cfg: Any, model_dir: str, tok: Any, train: list, val: list) -> tuple[Any, Any]:
    """Reference log-probs of train and held-out pairs, from the on-disk cache beside ``out_dir`` when it
    matches (data + reference fingerprint), else computed with a reference loaded just for that."""
    from tandem.data.storage import is_remote
    from tandem.models import load_causal_lm
    from tandem.train import dpo as dpolib

    ref_dir = cfg.ref_model or model_dir
    cache = None if is_remote(cfg.out_dir) else Path(cfg.out_dir + ".ref_logps.safetensors")
    val_cache = None if cache is None else cache.with_name(cache.name.replace(".ref_logps", ".ref_logps_val"))
    with _count_bar("reference log-probs", len(train) + len(val)) as on_progress:
        ref_train = dpolib.cached_reference_logps(
            cache, lambda: load_causal_lm(ref_dir), tok, train, ref_dir, on_progress=on_progress
        )
        ref_val = dpolib.cached_reference_logps(
            val_cache, lambda: load_causal_lm(ref_dir), tok, val, ref_dir,
            on_progress=lambda done, m: on_progress(len(train) + done, m),
        )  # fmt: skip
    return ref_train, ref_val


@contextlib.contextmanager
def _count_bar(label: str, total: int) -> Iterator[Callable[..., None]]:
    """A progress bar with ETA over ``total`` items; yields ``update(done, *_)``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("eta"), TimeRemainingColumn())
    with Progress(*columns, console=out) as bar:
        task = bar.add_task(label, total=total)
        yield lambda done, *_: bar.update(task, completed=done)


def _online(cfg: Any, policy: Any, tok: Any, train: list, settings: Any) -> None:
    """Iterative DPO on the distinct prompts of the training pairs (their extra columns reach the judge)."""
    from types import SimpleNamespace

    from tandem.errors import ConfigError
    from tandem.train import dpo as dpolib

    if not cfg.online_judge:
        raise ConfigError(
            "online DPO needs online_judge (task:NAME or module:function)", where="online_judge"
        )
    judge = _judge(SimpleNamespace(judge="rule", rule=cfg.online_judge))
    seen: dict[str, dict] = {}
    for p in train:
        if isinstance(p.prompt, str):
            seen.setdefault(p.prompt, {"prompt": p.prompt, **p.extra})
    online = dpolib.OnlineDPOSettings(
        rounds=cfg.online_rounds,
        max_new_tokens=cfg.online_max_new_tokens,
        engine=cfg.engine,
        engine_options=cfg.engine_options,
        model_path=_local_model(cfg.model),
    )
    table = Table(title="online DPO")
    for col in ("round", "kept", "ties", "disagree", "rewards/accuracies"):
        table.add_column(col, justify="right")
    with step_rounds(cfg.online_rounds) as on_round:
        history = dpolib.online_dpo(
            policy, tok, list(seen.values()), judge, settings, online, on_round=on_round
        )
    for h in history:
        table.add_row(
            f"{h['round']:.0f}", f"{h['label/kept']:.0f}", f"{h['label/tie']:.0f}",
            f"{h['label/disagree']:.0f}", f"{h.get('rewards/accuracies', float('nan')):.3f}",
        )  # fmt: skip
    out.print(table)


def step_rounds(total: int) -> Any:
    """A progress bar over online rounds."""
    from tandem.cli.progress import step_progress

    return step_progress("online dpo", total, key="rewards/accuracies")


def _local_model(model: str) -> str | None:
    """The policy's folder for an engine that loads its own copy (None for a remote URL: its local copy
    is gone by the time the engine is built)."""
    from tandem.data.storage import is_remote

    return None if is_remote(model) else str(model).removeprefix("file://")


def _verifier_score(cfg: Any, policy: Any, tok: Any) -> float:
    """Greedy held-out verifier accuracy of ``policy`` (as it is now) on ``cfg.eval_task``, sampled by
    ``cfg.engine``: an engine with its own copy of the starting folder receives the current weights."""
    from tandem.evaluate.heldout import evaluate_prompts
    from tandem.models.lora import engine_state_dict
    from tandem.rewards import RewardFunction, RewardSet, get_task
    from tandem.rollout import EngineSpec, SamplingParams, build_engine

    task = get_task(cfg.eval_task)
    rows = task.make_rows("test", cfg.eval_size, cfg.seed)
    rewards = RewardSet([RewardFunction(name=task.name, fn=task.reward)], on_error="raise")
    spec = EngineSpec(
        model=policy,
        tokenizer=tok,
        path=_local_model(cfg.model),
        add_special_tokens=False,
        options=cfg.engine_options,
    )
    engine = build_engine(cfg.engine, spec)
    try:
        engine.update_weights(engine_state_dict(engine, policy), 1)  # the shared module: no copy
        greedy = SamplingParams(max_new_tokens=32, temperature=0.0)
        return evaluate_prompts(engine, rows, rewards, greedy)["eval/accuracy"]
    finally:
        engine.close()


def _print_dpo(start: dict, end: dict, before: float | None, after: float | None) -> None:
    if not end and (before is None or after is None):  # no held-out pairs and no verifier: nothing to show
        out.print("no held-out pairs (data.val_fraction=0 and no data.val_file): no held-out table")
        return
    table = Table(title="DPO held-out")
    for col in ("metric", "start", "end"):
        table.add_column(col, justify="right")
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"):
        if key in end:
            table.add_row(key, f"{start[key]:.4f}", f"{end[key]:.4f}")
    if before is not None and after is not None:
        table.add_row("verifier accuracy", f"{100 * before:.1f}%", f"{100 * after:.1f}%")
    out.print(table)


def _judge(cfg: Any) -> Any:
    """The judge named by a LabelConfig."""
    import os

    from tandem.errors import ConfigError
    from tandem.train import labeling

    if cfg.judge == "rule":
        if not cfg.rule:
            raise ConfigError("the rule judge needs 'rule' (task:NAME or module:function)", where="rule")
        if cfg.rule.startswith("task:"):
            from tandem.rewards import get_task

            return labeling.RuleJudge(labeling.task_rule(get_task(cfg.rule.removeprefix("task:"))))
        from tandem.rewards import load_callable

        return labeling.RuleJudge(load_callable(cfg.rule))
    if cfg.judge == "hf":
        from tandem.models import load_model, load_tokenizer

        if not cfg.model:
            raise ConfigError("the hf judge needs 'model' (a local HF folder)", where="model")
        return labeling.HFJudge(load_model(cfg.model), load_tokenizer(cfg.model))  # or an INT8 export
    if not cfg.base_url or not cfg.model:
        raise ConfigError("the http judge needs 'base_url' and 'model'", where="base_url")
    return labeling.HTTPJudge(
        cfg.base_url, cfg.model, api_key=os.environ.get(cfg.api_key_env), timeout_s=cfg.timeout_s,
        max_retries=cfg.max_retries, backoff_s=cfg.backoff_s,
    )  # fmt: skip


def _with_policy_samples(cfg: Any, rows: list) -> list:
    """Rows without responses get two samples from ``cfg.policy`` (seeded)."""
    need = [i for i, (_, r) in enumerate(rows) if "response_a" not in r and "completions" not in r]
    if not need or not cfg.policy:
        return rows
    from tandem.rollout import EngineSpec, SamplingParams, build_engine

    spec = EngineSpec(path=str(cfg.policy), add_special_tokens=False, options=cfg.engine_options)
    engine = build_engine(cfg.engine, spec)
    params = SamplingParams(
        max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, n=2, seed=cfg.seed
    )
    try:
        batch = engine.generate([rows[i][1]["prompt"] for i in need], params)
    finally:
        engine.close()
    for k, i in enumerate(need):
        rows[i] = (rows[i][0], {**rows[i][1], "completions": batch.completions[2 * k : 2 * k + 2]})
    return rows


def _check_label_output(out_file: str, input_file: str) -> None:
    """``out_file`` is rewritten whole from the progress log at the end: it must not be the input, a
    folder, or a file this command did not write (an earlier label output has its ``.progress.jsonl``
    beside it, which a rerun resumes from)."""
    from tandem.data.outputs import check_output_file
    from tandem.data.storage import is_remote
    from tandem.errors import ConfigError

    check_output_file(out_file, sources=(input_file,), where="out_file")
    out = Path(out_file)
    if (
        not is_remote(out_file)
        and out.is_file()
        and not out.with_name(out.name + ".progress.jsonl").is_file()
    ):
        raise ConfigError(
            f"{out} exists and is not an earlier tandem label output (no {out.name}.progress.jsonl beside it)",
            where="out_file",
            hint="choose another out_file, or remove the file",
        )


@user_errors
def label(
    config: ConfigPath,
    overrides: CommandOverrides = None,
    engine: EngineName = None,
    engine_option: EngineOptions = None,
) -> None:
    """RLAIF: judge response pairs in both orders, keep agreeing verdicts; resumable. Rows without
    responses get two samples from 'policy', drawn by --engine (the config's 'engine', default hf).

    Example: tandem label configs/rlaif_dpo.yaml judge=rule rule=task:safety noise=0.2
    """
    from tandem.config.rlhf import LabelConfig, load_command_config
    from tandem.data.preference import InvalidRow, iter_raw_rows
    from tandem.data.storage import local_input
    from tandem.errors import DataError
    from tandem.train.labeling import label_rows

    cfg = load_command_config(LabelConfig, config, overrides)
    if engine is not None:
        cfg.engine = engine
    if engine_option:
        cfg.engine_options = {**cfg.engine_options, **engine_options(engine_option)}
    if cfg.policy:
        check_engine(cfg.engine, "--engine" if engine is not None else "engine")
    _check_models(cfg, "policy", *(("model",) if cfg.judge == "hf" else ()))
    _check_label_output(cfg.out_file, cfg.input_file)
    with local_input(cfg.input_file) as local:
        rows = list(iter_raw_rows(local))
    bad = [r for _, r in rows if isinstance(r, InvalidRow)]
    if bad:
        raise DataError(bad[0].reason, where=bad[0].where)
    rows = _with_policy_samples(cfg, rows)
    judge = _judge(cfg)
    with _count_bar("label", len(rows)) as on_row:
        stats = label_rows(
            rows,
            judge,
            cfg.out_file,
            both_orders=cfg.both_orders,
            noise=cfg.noise,
            seed=cfg.seed,
            on_row=on_row,
        )
    table = Table(title="labelling")
    table.add_column("count")
    table.add_column("value", justify="right")
    for name in ("rows", "resumed", "kept", "disagreements", "ties", "parse_failures", "timeouts"):
        table.add_row(name, str(getattr(stats, name)))
    if stats.empty:  # the policy sampled an empty answer: skipped, not blamed on the input
        table.add_row("empty answers (skipped)", str(stats.empty))
    if stats.kept + stats.disagreements:  # nothing judged in both orders (ties, failures): no rate
        table.add_row("agreement rate", f"{100 * stats.agreement_rate:.1f}%")
    if stats.gold_rows:
        table.add_row("label accuracy, single verdict", f"{100 * stats.accuracy_single:.1f}%")
        table.add_row("label accuracy, swap-consistent", f"{100 * stats.accuracy_kept:.1f}%")
    out.print(table)
    out.print(f"{stats.kept} pairs -> [bold]{escape(cfg.out_file)}[/]")


app.command("rm")(rm)
app.command("dpo")(dpo)
app.command("label")(label)
