"""Checkpoints of an offline ``tandem dpo`` run, so that an interrupted run continues exactly.

They live beside the output, in ``<out_dir>.checkpoints/step-<step:08d>/`` (the format of
:mod:`tandem.train.checkpoint`: written atomically, a ``COMPLETE`` marker last, the newest
:data:`KEEP_LAST` kept), not inside ``out_dir``: that stays an ordinary Hugging Face model folder, written
atomically once at the end, after which the checkpoints folder is removed. A checkpoint holds the policy
(full weights, or the LoRA adapter only), the AdamW and LambdaLR states, the global RNGs, the resolved
config (``config.json``) and, in ``state.json``'s ``extra_state``, the data order
(:meth:`~tandem.train.dpo.DPOProgress.data_state`: the step, the shuffling generator, the epoch's remaining
pair indices, the metrics so far) plus a fingerprint of the training pairs.

A resume refuses, in one line, a config whose keys that change the data or the maths differ from the
checkpointed one; only :data:`FREE_KEYS` may change (the length of the run, the checkpoint interval and
the evaluation after it: the warm-up-then-constant LR schedule does not depend on the run's length, and
each epoch's order is drawn when the epoch starts, so a run lengthened on resume is the longer run).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from tandem.config import config_changes
from tandem.data.outputs import MODEL_MARKER
from tandem.data.preference import PreferencePair
from tandem.errors import ConfigError, DataError, ModelError
from tandem.train.checkpoint import (
    checkpoint_step,
    latest_checkpoint,
    load_checkpoint,
    read_checkpoint_state,
    save_checkpoint,
)
from tandem.train.dpo import DPOProgress, pairs_fingerprint
from tandem.utils.io import discard_dir

KEEP_LAST = 2
CREATED_BY = "tandem dpo"  # the final model folder's created_by (tandem_model.json)
# Config keys a resume may change: none of them changes the data or the maths of the steps.
FREE_KEYS = frozenset(
    {"max_steps", "epochs", "save_every", "out_dir", "eval_task", "eval_size", "engine", "engine_options"}
)


def checkpoints_root(out_dir: str) -> Path:
    """``<out_dir>.checkpoints``: the run's checkpoint folder, beside the model folder."""
    return Path(str(out_dir).rstrip("/") + ".checkpoints")


def pairs_key(pairs: Sequence[PreferencePair]) -> str:
    """Fingerprint of the training pairs' content (a resume refuses pairs that changed)."""
    return pairs_fingerprint(pairs, "tandem-dpo-train-pairs")


def checkpoint_saver(
    root: Path, policy: torch.nn.Module, tokenizer: Any, config: Mapping[str, Any], key: str
) -> Callable[[DPOProgress], None]:
    """``on_checkpoint`` for :func:`~tandem.train.dpo.train_dpo`: a checkpoint of ``progress.step`` in
    ``root`` (``config``: the resolved config as JSON data; ``key``: :func:`pairs_key`)."""

    def save(progress: DPOProgress) -> None:
        save_checkpoint(
            root,
            progress.step,
            model=policy,  # a PEFT model saves its adapter only
            tokenizer=tokenizer,
            optimizer=progress.optimizer,
            scheduler=progress.scheduler,
            extra_state={"dpo": progress.data_state(), "pairs": key},
            config=dict(config),
            keep_last=KEEP_LAST,
        )

    return save


def checkpoint_restorer(folder: Path, policy: torch.nn.Module) -> Callable[[DPOProgress], None]:
    """``restore`` for :func:`~tandem.train.dpo.train_dpo`: weights, optimiser, scheduler, RNGs and data
    order from checkpoint ``folder``."""

    def restore(progress: DPOProgress) -> None:
        state = load_checkpoint(
            folder, model=policy, optimizer=progress.optimizer, scheduler=progress.scheduler
        )
        progress.load_data_state(state["extra_state"]["dpo"])

    return restore


def check_fresh_start(root: Path) -> None:
    """A run started without ``--resume`` must not bury an interrupted run's checkpoints."""
    latest = latest_checkpoint(root)
    if latest is not None:
        raise ConfigError(
            f"{root} holds checkpoints of an interrupted run (step {checkpoint_step(latest.name)})",
            where="out_dir",
            hint="continue it with --resume, or remove that folder to start over",
        )


def find_resume(root: Path, config: Mapping[str, Any], out_dir: str) -> tuple[Path, dict[str, Any]]:
    """The latest complete checkpoint in ``root`` and its ``state.json``, checked against ``config``
    (the resolved config as JSON data): one-line refusals when there is none (the run finished, or none
    was saved) or a key outside :data:`FREE_KEYS` changed."""
    latest = latest_checkpoint(root)
    if latest is None:
        if _finished(out_dir):
            raise ConfigError(
                f"the run already finished: {out_dir} holds its final model and {root} holds no checkpoint",
                where="out_dir",
                hint="nothing to resume; run without --resume to train again",
            )
        raise ModelError(
            "no complete checkpoint to resume from",
            where=str(root),
            hint="a run keeps checkpoints only with save_every > 0; run without --resume to start over",
        )
    saved_file = latest / "config.json"
    try:
        saved = json.loads(saved_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ModelError(f"cannot read the checkpointed config: {err}", where=str(saved_file)) from err
    for key, was, now in config_changes(saved, config):
        if key.split(".")[0] not in FREE_KEYS:
            raise ConfigError(
                f"{key} is {json.dumps(now)} but the checkpointed run has {json.dumps(was)} ({saved_file}); "
                f"a resume keeps every key but {', '.join(sorted(FREE_KEYS))}",
                where=key,
                hint=f"set {key} back, or remove {root} and start over without --resume",
            )
    return latest, read_checkpoint_state(latest)


def check_resume_state(folder: Path, state: Mapping[str, Any], key: str, total: int) -> int:
    """The checkpoint's step, after checking that its training pairs are these (``key``) and that the run
    (``total`` steps) has not fewer steps than it already did."""
    extra = state["extra_state"]
    if not isinstance(extra.get("dpo"), dict) or "pairs" not in extra:
        raise ModelError("not a tandem dpo checkpoint (no data order in state.json)", where=str(folder))
    if extra["pairs"] != key:
        raise DataError(
            f"the training pairs differ from those of the checkpointed run ({folder}): the data changed",
            where="data.train_file",
            hint="resume with the same data, or start over without --resume",
        )
    step = int(state["step"])
    if step > total:
        raise ConfigError(
            f"the checkpoint is at step {step}, past this run's {total} steps",
            where="max_steps",
            hint="raise max_steps (or epochs) to at least the checkpoint's step",
        )
    return step


def remove_checkpoints(root: Path) -> None:
    """Delete ``root`` once the final model is saved: renamed to a hidden name first, so an interrupted
    deletion never leaves a folder that still looks like it holds complete checkpoints."""
    if root.exists():
        discard_dir(root, "deleting")


def _finished(out_dir: str) -> bool:
    """``out_dir`` holds a model saved by ``tandem dpo``."""
    marker = Path(out_dir) / MODEL_MARKER
    try:
        return json.loads(marker.read_text(encoding="utf-8")).get("created_by") == CREATED_BY
    except (OSError, ValueError, AttributeError):
        return False
