"""Crash-safe file and folder writes.

A reader must only ever see the old complete content or the new complete content, never a torn file:
write to a temporary sibling (same folder, so the rename never crosses file systems), flush and fsync
it, ``os.replace`` it over the target, then fsync the parent folder so the rename itself survives a
power loss. :func:`atomic_dir` does the same for a whole folder (checkpoints, exported models).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tandem.utils.jsonable import to_jsonable


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so renames and new entries inside it are durable (no-op where unsupported)."""
    if os.name == "nt":  # Windows cannot open a directory for fsync; NTFS journals renames itself.
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike[str]) -> None:
    """fsync one regular file's data and metadata."""
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def fsync_tree(path: str | os.PathLike[str]) -> None:
    """fsync every file under ``path`` and then every folder, deepest first, ending with ``path``."""
    root = Path(path)
    folders: list[Path] = []
    for current, _dirs, files in os.walk(root):
        folders.append(Path(current))
        for name in files:
            file = Path(current) / name
            if not file.is_symlink():
                fsync_file(file)
    for folder in reversed(folders):
        fsync_dir(folder)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: temp sibling, flush, fsync, ``os.replace``, fsync folder."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    fsync_dir(target.parent)


def atomic_write_text(path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8") -> None:
    """Write ``text`` to ``path`` atomically (see :func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode(encoding))


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2) -> None:
    """Write ``obj`` as JSON atomically; numpy/torch scalars are converted and NaN/inf become ``null``."""
    text = json.dumps(to_jsonable(obj), indent=indent, allow_nan=False, ensure_ascii=False)
    atomic_write_text(path, text + "\n")


def discard_dir(path: str | os.PathLike[str], tag: str) -> None:
    """Delete the folder ``path``: first renamed to the hidden ``.NAME.TAG-PID`` beside it, so an
    interrupted deletion never leaves a half-deleted folder under the name that gave it meaning."""
    path = Path(path)
    trash = path.with_name(f".{path.name}.{tag}-{os.getpid()}")
    os.replace(path, trash)
    shutil.rmtree(trash)


@contextlib.contextmanager
def atomic_dir(final_path: str | os.PathLike[str]) -> Iterator[Path]:
    """Build a folder in a temporary sibling and publish it at ``final_path`` only if the block succeeds.

    Yields ``<parent>/.<name>.tmp-<pid>``. On normal exit every file in it is fsynced and the folder is
    renamed to ``final_path``; an existing ``final_path`` is first renamed aside and deleted only after
    the new folder is in place, so a crash leaves the old or the new folder (possibly under its
    ``.<name>.old-<pid>`` name), never neither. On an exception the temp folder is deleted and the
    exception re-raised, leaving ``final_path`` untouched.
    """
    final = Path(final_path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
    if tmp.exists():  # leftover of an earlier crash of a process with the same pid
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        yield tmp
        fsync_tree(tmp)
        _publish(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _publish(tmp: Path, final: Path) -> None:
    """Rename ``tmp`` to ``final``, replacing an existing ``final`` without a window where neither exists."""
    parent = final.parent
    if not final.exists():
        os.replace(tmp, final)
        fsync_dir(parent)
        return
    aside = parent / f".{final.name}.old-{os.getpid()}"
    if aside.exists():
        shutil.rmtree(aside)
    os.replace(final, aside)
    try:
        os.replace(tmp, final)
    except BaseException:
        os.replace(aside, final)  # put the old folder back before reporting the failure
        raise
    fsync_dir(parent)
    shutil.rmtree(aside)
