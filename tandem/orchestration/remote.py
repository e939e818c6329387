"""Run inputs and checkpoints in object storage (any fsspec URL: ``s3://``, ``gs://``, …).

* **Models.** ``model.path``, ``model.ref_path``, ``critic.path`` and ``reward.model.path`` may be URLs:
  :func:`local_models` gives each process that loads models a config with local copies from the machine's
  cache (fetched once per machine, refetched when the remote content changes).
* **Checkpoints** (``checkpoint.remote_dir``, like verl's ``default_hdfs_dir``): every checkpoint is
  written locally first (atomically, as always), then copied to ``<remote_dir>/<run.name>/checkpoints/
  step-<n>/`` with its ``COMPLETE`` marker uploaded last, together with the run's ``metrics.jsonl`` and
  ``config.yaml``; remote checkpoints beyond ``checkpoint.keep_last`` are deleted marker first. On
  ``--resume``, :func:`fetch_newer_checkpoint` downloads the newest complete remote checkpoint when the
  local run folder has none as new — a run restarted on a fresh machine continues where it was.

An object store has no atomic folder rename; the marker-last upload and marker-first delete give the same
guarantee as the local layout: a checkpoint without ``COMPLETE`` is never loaded.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

from tandem.config.schema import TandemConfig
from tandem.data import storage
from tandem.errors import DataError, TandemError, first_line
from tandem.train.checkpoint import COMPLETE_MARKER, checkpoint_step, latest_checkpoint

log = logging.getLogger(__name__)


def local_models(cfg: TandemConfig) -> TandemConfig:
    """``cfg`` with every remote model folder replaced by its copy in this machine's cache
    (:func:`~tandem.data.storage.cached_input`); ``cfg`` itself when nothing is remote. Each process that
    loads models calls it (driver, learner actor, rollout workers, learner ranks), so on a multi-node Ray
    cluster every node fetches its own copy, once."""
    local_cfg = cfg.model_copy(deep=True)
    owners = [(local_cfg.model, "path"), (local_cfg.model, "ref_path")]
    owners += [(local_cfg.critic, "path"), (local_cfg.reward.model, "path")]  # either may be absent
    owners += [(local_cfg.algorithm.opd, "teacher")]
    changed = False
    for owner, key in owners:
        url = getattr(owner, key) if owner is not None else None
        if url and storage.is_remote(url):
            log.info("using this machine's copy of %s", url)
            setattr(owner, key, str(storage.cached_input(url)))
            changed = True
    return local_cfg if changed else cfg


def remote_root(cfg: TandemConfig) -> str | None:
    """``<checkpoint.remote_dir>/<run.name>``, or None without a remote copy."""
    base = cfg.checkpoint.remote_dir
    return None if base is None else storage.join_url(base, cfg.run.name)


def _remote_steps(root: str) -> list[tuple[int, str]]:
    """Complete remote checkpoints under ``root/checkpoints`` as ``(step, url)``, oldest first."""
    ckpts = storage.join_url(root, "checkpoints")
    found = []
    for name in storage.list_names(ckpts):
        step, url = checkpoint_step(name), storage.join_url(ckpts, name)
        if step is not None and storage.exists(storage.join_url(url, COMPLETE_MARKER)):
            found.append((step, url))
    return sorted(found)


@contextlib.contextmanager
def _remote_errors(what: str, root: str) -> Iterator[None]:
    """Storage failures as one line naming ``checkpoint.remote_dir`` (missing packages pass through)."""
    try:
        yield
    except TandemError as err:
        if isinstance(err, DataError):
            raise DataError(f"{what} {root}: {err}", where="checkpoint.remote_dir") from None
        raise
    except Exception as err:  # botocore, gcsfs, OSError: vary by backend
        raise DataError(
            f"{what} {root}: {type(err).__name__}: {first_line(err)}", where="checkpoint.remote_dir"
        ) from None


def check_remote(cfg: TandemConfig) -> None:
    """Fail before training when the remote copy cannot be written: write and delete a probe object."""
    root = remote_root(cfg)
    if root is None:
        return
    probe = storage.join_url(root, ".tandem-write-probe")
    with _remote_errors("cannot write to", root), storage.local_output(probe) as local:
        local.write_text("probe\n", encoding="utf-8")
    with _remote_errors("cannot delete from", root):
        storage.remove_file(probe)


def mirror_checkpoint(cfg: TandemConfig, folder: Path) -> None:
    """Copy the checkpoint ``folder`` (marker last), the run's metrics and config to the remote root, then
    delete remote checkpoints beyond ``checkpoint.keep_last`` (marker first). A failure stops the run
    with one line; the local checkpoint is complete, so ``--resume`` continues from it."""
    root = remote_root(cfg)
    if root is None:
        return
    with _remote_errors(f"copying checkpoint {folder.name} to", root):
        storage.upload(folder, storage.join_url(root, f"checkpoints/{folder.name}"), last=COMPLETE_MARKER)
        run_dir = folder.parent.parent
        for name in ("metrics.jsonl", "config.yaml"):
            if (run_dir / name).is_file():
                storage.upload(run_dir / name, storage.join_url(root, name))
        for _, url in _remote_steps(root)[: -cfg.checkpoint.keep_last]:
            storage.remove(url, first=COMPLETE_MARKER)
    log.info("checkpoint %s copied to %s", folder.name, root)


def fetch_newer_checkpoint(cfg: TandemConfig, ckpt_root: Path) -> Path | None:
    """Download the newest complete remote checkpoint into ``ckpt_root`` when no local one is as new;
    returns the downloaded folder (None when the local one is current or there is no remote copy)."""
    root = remote_root(cfg)
    if root is None:
        return None
    with _remote_errors("cannot list checkpoints in", root):
        steps = _remote_steps(root)
    if not steps:
        return None
    step, url = steps[-1]
    local = latest_checkpoint(ckpt_root)
    if local is not None and (checkpoint_step(local.name) or 0) >= step:
        return None
    name = url.rstrip("/").rsplit("/", 1)[-1]
    ckpt_root.mkdir(parents=True, exist_ok=True)
    tmp = ckpt_root / f".{name}.download"
    shutil.rmtree(tmp, ignore_errors=True)
    with _remote_errors("cannot download a checkpoint from", root):
        storage.download(url, tmp)  # the hidden name is never loaded; renamed once complete
    if not (tmp / COMPLETE_MARKER).is_file():
        shutil.rmtree(tmp, ignore_errors=True)
        return None
    tmp.rename(ckpt_root / name)
    log.info("resuming from the remote checkpoint %s", url)
    return ckpt_root / name
