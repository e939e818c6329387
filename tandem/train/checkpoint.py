"""Training checkpoints: written atomically, found by step, restored exactly.

Layout of ``<ckpt_root>/step-<step:08d>/``::

    model/          Hugging Face folder (save_pretrained, safetensors) plus the tokenizer; for a LoRA policy
                    the adapter only (PEFT's adapter_model.safetensors + adapter_config.json naming the base);
                    with trainer.ema_decay, the weight average (the model the run evaluates)
    live.safetensors  with trainer.ema_decay only: the live trainable weights by parameter name (the
                    optimiser's; a resume puts them back over model/'s average)
    optimizer.pt    optimizer.state_dict()            (torch.save of tensors/numbers only)
    sharded/        instead of optimizer.pt when the optimiser state is sharded over ranks (FSDP2): a
                    torch.distributed.checkpoint folder of the policy and optimiser state, each rank's
                    shards written by that rank; read back on any world size (one process reads it whole)
    scheduler.pt    lr scheduler state_dict, if any
    rng.pt          tandem.utils.seed.rng_state()
    state.json      {"step", "extra_state" (data position, metric history, …), "versions", "format"}
    config.json     the resolved run config
    COMPLETE        written last; a folder without it is never loaded

The folder is built under a hidden temp name and renamed into place after every file is fsynced
(:func:`tandem.utils.io.atomic_dir`), so a crash leaves either the previous checkpoints or the new
complete one; the hidden folders such a crash leaves are removed by the next save
(:func:`clean_leftovers`). ``.pt`` files are read with ``torch.load(weights_only=True)``: no pickled code runs.
A file damaged later (truncated by a full disk, garbled by a bad copy) is a one-line :class:`ModelError`
naming it, whose hint names the previous complete checkpoint; a resume never falls back to it by itself
(that would drop the steps in between without the user deciding).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import shutil
import sys
import time
import zipfile
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from tandem.errors import ModelError, first_line
from tandem.models.lora import is_lora, load_adapter_weights
from tandem.train.reference_sync import REFERENCE_WEIGHTS  # algorithm.kl.ref_sync_steps: the moved reference
from tandem.utils.io import atomic_dir, discard_dir
from tandem.utils.jsonable import to_jsonable
from tandem.utils.seed import rng_state, set_rng_state

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
COMPLETE_MARKER = "COMPLETE"
CRITIC_WEIGHTS = "critic/model.safetensors"
CRITIC_OPTIMIZER = "critic/optimizer.pt"
LIVE_WEIGHTS = "live.safetensors"  # trainer.ema_decay: the live weights beside model/'s average
SHARDED_STATE = "sharded"  # a DCP folder of the policy and optimiser state (FSDP2 learners)
_STEP_DIR = re.compile(r"^step-(\d+)$")
# Hidden folders a save or prune leaves when its process dies mid-way (see atomic_dir, prune_checkpoints).
_LEFTOVER = re.compile(r"^\.(step-\d+)\.(tmp|old|deleting)-(\d+)$")


def checkpoint_step(name: str) -> int | None:
    """The step of a checkpoint folder name (``step-00000042`` -> 42), or None for any other name."""
    match = _STEP_DIR.match(name)
    return int(match.group(1)) if match else None


def checkpoint_dir(ckpt_root: str | Path, step: int) -> Path:
    """Path of the checkpoint folder for ``step`` (``step-00000042``)."""
    return Path(ckpt_root) / f"step-{step:08d}"


def save_checkpoint(
    ckpt_root: str | Path,
    step: int,
    *,
    model: Any,
    tokenizer: Any | None,
    optimizer: torch.optim.Optimizer,
    scheduler: Any | None = None,
    extra_state: Mapping[str, Any],
    config: Mapping[str, Any] | Any,
    keep_last: int | None = 3,
    critic: Any | None = None,
    critic_optimizer: torch.optim.Optimizer | None = None,
    sharded: Callable[[Path], None] | None = None,
    live_weights: Mapping[str, torch.Tensor] | None = None,
    reference_weights: Mapping[str, torch.Tensor] | None = None,
) -> Path:
    """Write a complete checkpoint for ``step`` atomically and prune old ones; return its folder.

    ``model`` needs ``save_pretrained`` (a Hugging Face model); ``tokenizer`` may be ``None``.
    ``extra_state`` and ``config`` (a mapping or a pydantic model) must be JSON-serialisable after
    numpy/torch scalars are converted.
    ``keep_last`` complete checkpoints are kept (``None`` keeps all). Saving the same step again
    replaces that checkpoint. A ``critic`` (with ``save(path)``, e.g. a ValueModel) and its optimiser are
    written to ``critic/`` beside the policy. ``sharded``: writes the optimiser state (and the policy, and
    the critic with its optimiser, which are then not read) into the folder it is given, ``sharded/``, in
    place of ``optimizer.pt`` and ``critic/`` (an FSDP2 learner's ranks each write their shards;
    ``optimizer`` is then not read). ``live_weights``: when ``model`` holds a
    weight average, the live weights it stands in for (``live.safetensors``; :func:`load_live_state`).
    ``reference_weights``: a KL reference that moves with the policy (``reference.safetensors``;
    :func:`load_reference_state`).
    """
    if step < 0:
        raise ValueError(f"step must be ≥ 0, got {step}")
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"keep_last must be ≥ 1 or None, got {keep_last}")
    final = checkpoint_dir(ckpt_root, step)
    clean_leftovers(ckpt_root)
    started = time.perf_counter()
    with atomic_dir(final) as tmp:
        _save_model(tmp / "model", model, tokenizer)
        if live_weights is not None:
            safetensors.torch.save_file(dict(live_weights), str(tmp / LIVE_WEIGHTS))
        if reference_weights is not None:
            safetensors.torch.save_file(dict(reference_weights), str(tmp / REFERENCE_WEIGHTS))
        if sharded is None:
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        else:
            sharded(tmp / SHARDED_STATE)
        if scheduler is not None:
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        torch.save(rng_state(), tmp / "rng.pt")
        if critic is not None and sharded is None:  # sharded: the critic's shards are in sharded/
            (tmp / "critic").mkdir()
            critic.save(tmp / CRITIC_WEIGHTS)
            if critic_optimizer is not None:
                torch.save(critic_optimizer.state_dict(), tmp / CRITIC_OPTIMIZER)
        _write_json(tmp / "state.json", _state(step, extra_state))
        _write_json(tmp / "config.json", _plain_config(config))
        (tmp / COMPLETE_MARKER).write_text(f"step {step}\n", encoding="utf-8")
    logger.info("saved checkpoint %s in %.2fs", final, time.perf_counter() - started)
    if keep_last is not None:
        prune_checkpoints(ckpt_root, keep_last)
    return final


def list_checkpoints(ckpt_root: str | Path) -> list[Path]:
    """Complete checkpoint folders under ``ckpt_root``, oldest step first (temp and partial ones ignored)."""
    root = Path(ckpt_root)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        step = checkpoint_step(child.name)
        if step is not None and child.is_dir() and (child / COMPLETE_MARKER).is_file():
            found.append((step, child))
    return [path for _, path in sorted(found)]


def latest_checkpoint(ckpt_root: str | Path) -> Path | None:
    """The complete checkpoint with the highest step, or ``None`` if there is none."""
    checkpoints = list_checkpoints(ckpt_root)
    return checkpoints[-1] if checkpoints else None


def latest_step(ckpt_root: str | Path) -> int | None:
    """The step of :func:`latest_checkpoint`, or ``None`` if there is none."""
    latest = latest_checkpoint(ckpt_root)
    return checkpoint_step(latest.name) if latest is not None else None


def prune_checkpoints(ckpt_root: str | Path, keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` complete checkpoints; return the deleted paths.

    Each folder is first renamed to a hidden name, so an interrupted deletion never leaves a
    half-deleted folder that still looks like a checkpoint.
    """
    doomed = list_checkpoints(ckpt_root)[:-keep_last]
    for path in doomed:
        discard_dir(path, "deleting")  # the .deleting-PID name clean_leftovers knows
    return doomed


def clean_leftovers(ckpt_root: str | Path) -> list[Path]:
    """Remove the hidden ``.step-N.tmp-PID`` / ``.old-PID`` / ``.deleting-PID`` folders of saves and
    prunes whose process is no longer alive (a crash or ``kill -9`` mid-save); return what was removed.

    A folder of a live process (this one included) is left alone: it may be a save in progress. An
    ``.old-PID`` folder is the previous complete checkpoint of a step whose replacement was cut short;
    if ``step-N`` itself is missing it is renamed back instead of deleted. Checkpoints of one run are
    written by one process on one machine, so "alive" is checked on this machine.
    """
    root = Path(ckpt_root)
    if not root.is_dir():
        return []
    removed = []
    for child in sorted(root.iterdir()):
        match = _LEFTOVER.match(child.name)
        if match is None or not child.is_dir() or _pid_alive(int(match.group(3))):
            continue
        final = root / match.group(1)
        if match.group(2) == "old" and not final.exists() and (child / COMPLETE_MARKER).is_file():
            os.replace(child, final)
            logger.info("restored %s from %s", final, child.name)
            continue
        shutil.rmtree(child, ignore_errors=True)
        logger.info("removed %s left by a dead process", child)
        removed.append(child)
    return removed


def _pid_alive(pid: int) -> bool:
    """Whether a process with ``pid`` exists on this machine (ours counts as alive)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    except OSError:
        return True  # unknown: keep the folder
    return True


def load_checkpoint(
    path: str | Path,
    *,
    model: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    restore_rng: bool = True,
    critic: Any | None = None,
    critic_optimizer: torch.optim.Optimizer | None = None,
) -> dict[str, Any]:
    """Restore ``model`` weights (strict), optimizer, scheduler and RNG from ``path``; return state.json.
    ``model`` None: neither weights nor optimiser (an FSDP2 learner's ranks read those from the shards).

    Raises :class:`ModelError` if the folder is not a complete checkpoint, a file is missing or damaged
    (one line naming the file; the hint names the previous complete checkpoint to resume from instead), or
    the weights do not match the model's parameter names and shapes. ``state.json`` is read first: the
    cheapest file fails before the weights are touched.
    """
    folder = Path(path)
    if not (folder / COMPLETE_MARKER).is_file():
        raise ModelError(
            "not a complete checkpoint (no COMPLETE marker)",
            where=str(folder),
            hint="use latest_checkpoint() to find the newest complete one",
        )
    state = read_checkpoint_state(folder)
    if model is None:
        optimizer = critic = critic_optimizer = None
    else:
        load_model_weights(folder / "model", model)
    shards = folder / SHARDED_STATE
    # an FSDP2 run's critic and its optimiser are in its DCP shards, not in critic/
    critic_in_shards = critic is not None and shards.is_dir() and not (folder / CRITIC_WEIGHTS).exists()
    if critic_in_shards and (optimizer is None or critic_optimizer is None):
        raise ModelError(
            "the critic is in the sharded state: load it with both optimisers", where=str(shards)
        )
    if optimizer is not None and not (folder / "optimizer.pt").exists() and shards.is_dir():
        from tandem.train.fsdp import load_sharded  # torch.distributed, only for sharded checkpoints

        pair = (critic, critic_optimizer) if critic_in_shards else None
        load_sharded(shards, model, optimizer, whole=True, critic=pair)
    elif optimizer is not None:
        optimizer.load_state_dict(_load_pt(folder / "optimizer.pt"))
    if scheduler is not None:
        scheduler.load_state_dict(_load_pt(folder / "scheduler.pt"))
    if critic is not None and not critic_in_shards:
        try:
            critic.load(folder / CRITIC_WEIGHTS)
        except safetensors.SafetensorError as err:  # a mismatch is a ModelError of its own
            raise _damaged(folder / CRITIC_WEIGHTS, err) from err
    if critic_optimizer is not None and not critic_in_shards:
        critic_optimizer.load_state_dict(_load_pt(folder / CRITIC_OPTIMIZER))
    if restore_rng:
        set_rng_state(_load_pt(folder / "rng.pt"))
    return state


def read_checkpoint_state(folder: str | Path) -> dict[str, Any]:
    """A checkpoint's ``state.json`` (``step``, ``extra_state``, …); a missing or damaged one is a
    one-line :class:`ModelError` naming it."""
    file = Path(folder) / "state.json"
    if not file.is_file():
        raise ModelError("checkpoint file is missing", where=str(file), hint=_earlier_checkpoint_hint(file))
    try:
        state = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:  # JSONDecodeError is a ValueError
        raise _damaged(file, err) from err
    if not isinstance(state, dict) or not isinstance(state.get("extra_state"), dict):
        raise _damaged(file, ValueError("no extra_state object"))
    return state


def load_live_state(path: str | Path) -> dict[str, torch.Tensor] | None:
    """A checkpoint's live weights (``live.safetensors``, written with a weight average as ``model/``), or
    None when it has none."""
    return _optional_weights(Path(path) / LIVE_WEIGHTS, "the live weights")


def load_reference_state(path: str | Path) -> dict[str, torch.Tensor] | None:
    """A checkpoint's moved KL reference (``reference.safetensors``), or None when it has none."""
    return _optional_weights(Path(path) / REFERENCE_WEIGHTS, "the reference weights")


def _optional_weights(file: Path, what: str) -> dict[str, torch.Tensor] | None:
    if not file.is_file():
        return None
    try:
        return safetensors.torch.load_file(str(file), device="cpu")
    except Exception as err:  # a truncated or foreign file: say which
        raise ModelError(
            f"cannot read {what}: {first_line(err)}", where=str(file), hint=_earlier_checkpoint_hint(file)
        ) from err


def load_model_weights(model_dir: str | Path, model: torch.nn.Module) -> None:
    """Copy the safetensors weights in ``model_dir`` into ``model`` in place, strictly.

    Hugging Face drops tied duplicates (e.g. ``lm_head.weight`` tied to the embeddings) when saving;
    a key missing from the files is accepted only if it shares its tensor with a key that is present.
    """
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ModelError("no .safetensors weights found", where=str(model_dir))
    loaded: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            loaded.update(safetensors.torch.load_file(str(file), device="cpu"))
        except (safetensors.SafetensorError, OSError) as err:  # truncated, empty or not safetensors
            raise _damaged(file, err) from err
    if is_lora(model):  # a LoRA checkpoint holds the adapter; the base weights are model.path's
        load_adapter_weights(model, loaded, where=str(model_dir))
        return
    own = model.state_dict(keep_vars=True)
    by_storage = {_storage_key(tensor): key for key, tensor in own.items() if key in loaded}
    for key, tensor in own.items():
        partner = by_storage.get(_storage_key(tensor))
        if key not in loaded and partner is not None:
            loaded[key] = loaded[partner]
    problem = _mismatch(own, loaded)
    if problem:
        raise ModelError(f"weights do not match the model: {problem}", where=str(model_dir))
    model.load_state_dict(loaded, strict=True)


def _mismatch(own: Mapping[str, torch.Tensor], loaded: Mapping[str, torch.Tensor]) -> str:
    """One-line description of missing, unexpected or wrongly shaped keys ('' if they match)."""
    missing = sorted(set(own) - set(loaded))
    unexpected = sorted(set(loaded) - set(own))
    shapes = sorted(k for k in set(own) & set(loaded) if own[k].shape != loaded[k].shape)
    parts = []
    for label, keys in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", shapes)):
        if keys:
            more = f" (+{len(keys) - 3} more)" if len(keys) > 3 else ""
            parts.append(f"{label}: {', '.join(keys[:3])}{more}")
    return "; ".join(parts)


def save_model_folder(
    folder: str | Path, model: Any, tokenizer: Any | None, extra_files: Mapping[str, Any] | None = None
) -> Path:
    """Write ``model`` (and ``tokenizer``) as a Hugging Face folder at ``folder`` atomically, replacing
    what is there, with ``extra_files`` (name -> JSON-serialisable object) beside them; return it."""
    final = Path(folder)
    with atomic_dir(final) as tmp:
        _save_model(tmp, model, tokenizer)
        for name, obj in (extra_files or {}).items():
            _write_json(tmp / name, obj)
    return final


def _save_model(model_dir: Path, model: Any, tokenizer: Any | None) -> None:
    """save_pretrained the model (and tokenizer) and check that the weights are safetensors."""
    model.save_pretrained(str(model_dir))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(model_dir))
    if not any(model_dir.glob("*.safetensors")):
        raise ModelError(
            "save_pretrained wrote no .safetensors file",
            where=str(model_dir),
            hint="use a Hugging Face model with safetensors serialisation",
        )


def _state(step: int, extra_state: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "format": FORMAT_VERSION,
        "step": step,
        "time": time.time(),
        "extra_state": dict(extra_state),
        "versions": _versions(),
    }


def _plain_config(config: Any) -> Any:
    """A pydantic config (anything with ``model_dump``) as plain JSON data; mappings unchanged."""
    return config.model_dump(mode="json") if hasattr(config, "model_dump") else config


def _versions() -> dict[str, str]:
    versions = {"python": sys.version.split()[0]}
    for package in ("tandem-rl", "torch", "transformers", "safetensors"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def _write_json(path: Path, obj: Any) -> None:
    text = json.dumps(to_jsonable(obj), indent=2, allow_nan=False, ensure_ascii=False)
    path.write_text(text + "\n", encoding="utf-8")


def _load_pt(path: Path) -> Any:
    """``torch.load`` with ``weights_only=True`` (no arbitrary code); a clear error if missing, damaged
    (not the zip archive ``torch.save`` writes: truncated or overwritten) or unsafe (pickled objects)."""
    if not path.is_file():
        raise ModelError("checkpoint file is missing", where=str(path))
    if not zipfile.is_zipfile(path):  # torch.save's format; a truncated archive has lost its directory
        raise _damaged(path, ValueError("not a complete torch.save archive"))
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:  # the archive is whole, but it holds more than tensors and numbers
        why = str(err).partition("WeightsUnpickler error:")[2].split("Check the documentation")[0]
        summary = " ".join(why.split()) or first_line(err)
        raise ModelError(f"cannot load safely (weights_only): {summary}", where=str(path)) from err
    except Exception as err:  # a damaged member of the archive
        raise _damaged(path, err) from err


def _damaged(file: Path, err: BaseException) -> ModelError:
    """A checkpoint file that cannot be read (truncated, garbled) as a one-line error naming it."""
    return ModelError(
        f"damaged or truncated file: {first_line(err)}", where=str(file), hint=_earlier_checkpoint_hint(file)
    )


def _earlier_checkpoint_hint(file: Path) -> str | None:
    """For a file inside checkpoint folder ``step-N``: which complete checkpoint before it a resume could
    use once ``step-N`` is moved away (never done automatically: that would silently drop steps). None
    for a file outside a checkpoint folder."""
    steps = [(d, checkpoint_step(d.name)) for d in list(file.parents)[:3]]  # model/x, critic/x, x
    folder, step = next(((d, n) for d, n in steps if n is not None), (None, None))
    if folder is None or step is None:
        return None
    earlier = [p for p in list_checkpoints(folder.parent) if (checkpoint_step(p.name) or 0) < step]
    if not earlier:
        return f"checkpoint {folder.name} is damaged and there is no earlier complete one to resume from"
    return f"checkpoint {folder.name} is damaged: remove or rename {folder} to resume from {earlier[-1].name}"


def _storage_key(tensor: torch.Tensor) -> tuple[Any, int, int, tuple[int, ...]]:
    """Identity of a tensor's memory, so tied parameters map to the same key."""
    return (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
