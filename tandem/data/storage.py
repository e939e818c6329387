"""Object storage through fsspec: read inputs from and write outputs to any URL (``s3://``, ``gs://``,
``memory://``, local paths).

Training code works on local files; a remote input is first copied to a temporary local folder and a
remote output is written locally (atomically) and then uploaded. Local paths never touch fsspec, so the
common case has no extra dependency. ``s3://`` needs the ``s3fs`` package (extra ``storage``); the
endpoint of an S3-compatible server comes from the usual ``AWS_ENDPOINT_URL`` / ``FSSPEC_S3_*`` variables.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tandem.errors import DataError, MissingDependencyError


def is_remote(url: str | os.PathLike[str]) -> bool:
    """True for ``scheme://`` URLs other than ``file://``."""
    text = str(url)
    return "://" in text and not text.startswith("file://")


def join_url(base: str, name: str) -> str:
    """``base/name`` for a URL or a local path."""
    return f"{base.rstrip('/')}/{name}" if is_remote(base) else str(Path(base) / name)


def _filesystem(url: str) -> tuple[Any, str]:
    try:
        import fsspec
    except ImportError:
        raise MissingDependencyError("fsspec", "storage") from None
    try:
        fs, path = fsspec.core.url_to_fs(url, **_storage_options(url))
    except ImportError as err:
        raise MissingDependencyError(
            str(err).split("'")[1] if "'" in str(err) else "s3fs", "storage"
        ) from None
    return fs, path


def _storage_options(url: str) -> dict[str, Any]:
    """S3 endpoint from ``AWS_ENDPOINT_URL`` (boto's own variable), for S3-compatible servers."""
    if url.startswith("s3://") and os.environ.get("AWS_ENDPOINT_URL"):
        return {"client_kwargs": {"endpoint_url": os.environ["AWS_ENDPOINT_URL"]}}
    return {}


@contextlib.contextmanager
def local_input(url: str | os.PathLike[str]) -> Iterator[Path]:
    """A local path for ``url``: the path itself, or a temporary copy of a remote file or folder
    (deleted on exit)."""
    if not is_remote(url):
        yield Path(str(url).removeprefix("file://"))
        return
    fs, path = _filesystem(str(url))
    try:
        exists, is_dir = fs.exists(path), fs.isdir(path)
    except Exception as err:  # botocore / network errors vary by backend
        raise DataError(f"cannot reach storage ({type(err).__name__}: {err})", where=str(url)) from None
    if not exists:
        raise DataError("object does not exist", where=str(url))
    with tempfile.TemporaryDirectory(prefix="tandem-in-") as tmp:
        local = Path(tmp) / Path(path.rstrip("/")).name
        fs.get(path, str(local), recursive=is_dir)
        yield local


def cache_root() -> Path:
    """Where :func:`cached_input` keeps remote copies: ``$TANDEM_CACHE/remote`` (default
    ``~/.cache/tandem/remote``)."""
    base = os.environ.get("TANDEM_CACHE") or str(Path.home() / ".cache" / "tandem")
    return Path(base) / "remote"


def cached_input(url: str | os.PathLike[str]) -> Path:
    """A local path for ``url``: the path itself, or a copy of the remote file or folder in this machine's
    cache (:func:`cache_root`), shared by every process and reused while the remote content is unchanged.

    The cache key is the URL plus every object's path, size and ETag (or modification time), so a changed
    remote folder is fetched again. A copy is downloaded under a hidden name and renamed into place, so
    processes that fetch at once never see a partial folder (the slower one discards its copy). Unlike
    :func:`local_input` nothing is deleted afterwards: a process killed mid-run leaves no temporary
    folder behind, and the next run reuses the copy."""
    if not is_remote(url):
        return Path(str(url).removeprefix("file://"))
    fs, path = _filesystem(str(url))
    try:
        if not fs.exists(path):
            raise DataError("object does not exist", where=str(url))
        is_dir = fs.isdir(path)
        listing = fs.find(path, detail=True) if is_dir else {path: fs.info(path)}
    except DataError:
        raise
    except Exception as err:  # botocore / network errors vary by backend
        raise DataError(f"cannot reach storage ({type(err).__name__}: {err})", where=str(url)) from None
    signature = sorted(
        (key, info.get("size"), str(info.get("ETag") or info.get("mtime") or info.get("LastModified") or ""))
        for key, info in listing.items()
    )
    digest = hashlib.sha256(json.dumps([str(url), signature], default=str).encode()).hexdigest()[:20]
    name = Path(path.rstrip("/")).name
    final = cache_root() / digest
    if (final / name).exists():
        return final / name
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{digest}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        fs.get(path, str(tmp / name), recursive=is_dir)
        os.rename(tmp, final)
    except OSError:
        if not (final / name).exists():  # not another process winning the rename: a real failure
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final / name


def upload(local: str | os.PathLike[str], url: str, *, last: str | None = None) -> None:
    """Copy a local file or folder to ``url`` (a folder's files go under ``url/``; the file named
    ``last``, e.g. a completion marker, goes after all others). For a local ``url`` nothing happens —
    the caller already wrote there atomically."""
    if not is_remote(url):
        return
    fs, path = _filesystem(url)
    src = Path(local)
    if src.is_dir():
        files = sorted(p for p in src.rglob("*") if p.is_file())
        files.sort(key=lambda p: p.relative_to(src).as_posix() == last)  # stable: ``last`` moves to the end
        for file in files:
            fs.put_file(str(file), f"{path.rstrip('/')}/{file.relative_to(src).as_posix()}")
    else:
        fs.put_file(str(src), path)


def list_names(url: str) -> list[str]:
    """Names of the entries directly under the folder ``url`` (empty when it does not exist)."""
    fs, path = _filesystem(url)
    try:
        entries = fs.ls(path.rstrip("/"), detail=False) if fs.exists(path) else []
    except FileNotFoundError:
        return []
    except Exception as err:  # botocore / network errors vary by backend
        raise DataError(f"cannot reach storage ({type(err).__name__}: {err})", where=url) from None
    return sorted(str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries)


def exists(url: str) -> bool:
    fs, path = _filesystem(url)
    return bool(fs.exists(path))


def download(url: str, local: str | os.PathLike[str]) -> None:
    """Copy the remote folder ``url`` to the local path ``local`` (created)."""
    fs, path = _filesystem(url)
    fs.get(path.rstrip("/") + "/", str(local), recursive=True)


def remove_file(url: str) -> None:
    fs, path = _filesystem(url)
    fs.rm_file(path)


def remove(url: str, *, first: str | None = None) -> None:
    """Delete the remote folder ``url``; the file named ``first`` (e.g. a completion marker) goes first,
    so an interrupted delete never leaves something that still looks complete."""
    fs, path = _filesystem(url)
    if first is not None and fs.exists(f"{path.rstrip('/')}/{first}"):
        fs.rm_file(f"{path.rstrip('/')}/{first}")
    if fs.exists(path):
        fs.rm(path, recursive=True)


@contextlib.contextmanager
def local_output(url: str | os.PathLike[str]) -> Iterator[Path]:
    """A local path to write ``url`` to: the path itself, or a temporary one uploaded on success."""
    if not is_remote(url):
        yield Path(url)
        return
    with tempfile.TemporaryDirectory(prefix="tandem-out-") as tmp:
        local = Path(tmp) / Path(str(url).rstrip("/")).name
        yield local
        upload(local, str(url))


def write_rows_url(rows: Sequence[dict[str, Any]], url: str) -> None:
    """Write rows as JSONL to a local path (atomically) or a URL."""
    from tandem.utils.io import atomic_write_text

    text = "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in rows)
    with local_output(url) as local:
        atomic_write_text(local, text)


def write_pairs_url(pairs: Sequence[Any], url: str) -> None:
    """Write preference pairs (TRL explicit-prompt rows) to a local path or a URL."""
    write_rows_url([p.to_row() for p in pairs], url)
