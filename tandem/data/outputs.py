"""Output folders: which folders a Tandem command may replace, and how it publishes them.

Every command that writes a whole folder (``tandem init-model``, ``sft``, ``dpo``, ``rm``, ``export``,
``train``, ``data split``, ``data make-safety``) marks it as its output with a small file of its kind
(:data:`KINDS`), and may later replace only an empty folder or an output of the same kind: an unrelated
folder (photos, a thesis, a downloaded model) is refused with one line naming it, never deleted. A command
also refuses to write onto a folder it reads (its source model, its input file) or one that holds it.
Local folders are then replaced atomically (:func:`tandem.utils.io.atomic_dir`); remote ones
(``s3://...``) through :func:`output_folder`. A command that writes one file (``tandem data dedup --out``,
a sidecar) checks it with :func:`check_output_file`: never its own input, never an existing folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tandem.data import storage
from tandem.errors import ConfigError

MODEL_MARKER = "tandem_model.json"
REWARD_MARKER = "tandem_reward.json"
EXPORT_MARKER = "tandem_export.json"
BEST_RECORD = "best.json"  # in a run's best/ model folder (checkpoint.best_metric): step, metric, value

PathLike = str | os.PathLike[str]


@dataclass(frozen=True)
class OutputKind:
    """A kind of output folder: what to call it and the files that together mark it."""

    label: str
    files: tuple[str, ...]


KINDS: dict[str, OutputKind] = {
    "model": OutputKind("model folder", (MODEL_MARKER,)),  # init-model, sft, dpo, warm starts
    "reward": OutputKind("reward-model folder", (REWARD_MARKER,)),  # rm (normalisation stats)
    "export": OutputKind("export folder", (EXPORT_MARKER,)),  # export, every format
    "run": OutputKind("run folder", ("config.yaml", "metrics.jsonl")),  # train, written first
    # data split, data make-safety: the two files are the output; other files there are left alone
    "split": OutputKind("data split folder", ("train.jsonl", "val.jsonl")),
    "report": OutputKind("report folder", ("report.html",)),  # tandem report
    "tune": OutputKind("tune folder", ("tune.jsonl",)),  # tandem tune: its trial runs, tune.jsonl, best.yaml
}


def _kind(kind: str) -> OutputKind:
    if kind not in KINDS:  # a programming error, not user input
        raise ValueError(f"unknown output kind {kind!r}; one of {sorted(KINDS)}")
    return KINDS[kind]


def is_output(path: PathLike, kind: str) -> bool:
    """Whether the folder (or fsspec URL) ``path`` holds every marker file of ``kind``."""
    files = _kind(kind).files
    if storage.is_remote(path):
        names = set(storage.list_names(str(path)))
        return all(name in names for name in files)
    return all((Path(path) / name).is_file() for name in files)


def _holds(out: PathLike, source: PathLike) -> bool:
    """Whether ``out`` is ``source`` or a folder above it (local paths resolved, URLs compared as text)."""
    if storage.is_remote(out) or storage.is_remote(source):
        a, b = str(out).rstrip("/"), str(source).rstrip("/")
        return a == b or b.startswith(a + "/")
    resolved, src = Path(out).resolve(), Path(source).resolve()
    return resolved == src or resolved in src.parents or _same_file(out, source)


def _same_file(a: PathLike, b: PathLike) -> bool:
    """Whether the local paths ``a`` and ``b`` both exist and are one file (a hard link counts)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False


def _source_label(source: PathLike) -> str:
    """``source file`` or ``source folder``, for the one-line refusal."""
    return "source file" if not storage.is_remote(source) and Path(source).is_file() else "source folder"


def _check_parents(out: PathLike, where: str | None, label: str) -> None:
    """Refuse a local ``out`` below a file (``prefs.jsonl/split``): creating it would fail half-way."""
    if storage.is_remote(out):
        return
    for parent in Path(out).parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(
                    f"{parent} is a file, not a folder", where=where, hint=f"choose another {label}"
                )
            return


def check_output_dir(
    out: PathLike,
    kind: str,
    *,
    sources: Iterable[PathLike | None] = (),
    where: str | None = None,
    hint: str | None = None,
) -> None:
    """Refuse an output folder whose replacement would lose data; writes nothing.

    Refused: ``out`` is, or holds, one of ``sources`` (the folders the command reads); ``out`` is a file;
    ``out`` is a non-empty folder that is not an output of ``kind`` (:func:`is_output`). ``out`` may be a
    local path or an fsspec URL. ``where`` names the option or config key in the one-line error."""
    spec, label = _kind(kind), where or "output"
    for source in sources:
        if source is not None and _holds(out, source):
            raise ConfigError(
                f"{out} is (or holds) the {_source_label(source)} {source}; writing there would replace it",
                where=where,
                hint=f"choose another {label}",
            )
    _check_parents(out, where, label)
    if storage.is_remote(out):
        holds = bool(storage.list_names(str(out)))
    else:
        folder = Path(out)
        if folder.exists() and not folder.is_dir():
            raise ConfigError(f"{out} is a file, not a folder", where=where, hint=f"choose another {label}")
        holds = folder.is_dir() and any(folder.iterdir())
    if holds and not is_output(out, kind):
        raise ConfigError(
            f"{out} is not empty and not a Tandem {spec.label} (no {' and '.join(spec.files)}); "
            "refusing to replace it",
            where=where,
            hint=hint or f"choose another {label}, or remove that folder yourself",
        )


def check_output_file(
    out: PathLike,
    *,
    sources: Iterable[PathLike | None] = (),
    where: str | None = None,
) -> None:
    """Refuse an output file (``tandem data dedup --out``, a sidecar) that would lose data; writes nothing.

    A file is written atomically over whatever file was at ``out``, so the losses to prevent are the ones
    a rename causes: ``out`` is one of ``sources`` (the input, replaced by its own output: the same path,
    a symbolic or a hard link to it), an existing folder, or below a file (the write would fail after the
    work). ``out`` and ``sources`` may be local paths or fsspec URLs (compared as text)."""
    label = where or "output file"
    for source in sources:
        if source is not None and same_path(out, source):
            raise ConfigError(
                f"{out} is the input {source}; writing there would replace it",
                where=where,
                hint=f"choose another {label}",
            )
    if storage.is_remote(out):
        return
    _check_parents(out, where, label)
    if Path(out).is_dir():
        raise ConfigError(f"{out} is a folder, not a file", where=where, hint=f"choose another {label}")


def same_path(a: PathLike, b: PathLike) -> bool:
    """Whether ``a`` and ``b`` name one file: equal URLs, or local paths (``file://`` ones too) equal once
    resolved or linked."""
    if storage.is_remote(a) or storage.is_remote(b):
        return str(a).rstrip("/") == str(b).rstrip("/")
    a, b = str(a).removeprefix("file://"), str(b).removeprefix("file://")
    return Path(a).resolve() == Path(b).resolve() or _same_file(a, b)


def write_model_marker(
    folder: PathLike,
    *,
    created_by: str,
    source: PathLike | None = None,
    recipe: dict[str, Any] | None = None,
) -> None:
    """Write ``tandem_model.json`` into ``folder`` (a model folder being built): what made it, from what,
    and (a cached warm start) the ``recipe`` it was built with."""
    info: dict[str, Any] = {"kind": "model", "created_by": created_by}
    if source is not None:
        info["source"] = str(source)
    if recipe is not None:
        info["recipe"] = recipe
    (Path(folder) / MODEL_MARKER).write_text(json.dumps(info, indent=2) + "\n")


@contextlib.contextmanager
def output_folder(url: PathLike, kind: str) -> Iterator[Path]:
    """A local path to build the output folder ``url`` in.

    For a local path: the path itself (the writer replaces it atomically after its own check). For an
    fsspec URL: a temporary folder, published on success after checking ``url`` again (it may have
    changed while the command ran): an earlier output of ``kind`` there is deleted, its marker first,
    and the new folder uploaded with its marker last, so an interrupted publish never looks complete."""
    if not storage.is_remote(url):
        yield Path(url)
        return
    marker = _kind(kind).files[-1]
    with tempfile.TemporaryDirectory(prefix="tandem-out-") as tmp:
        local = Path(tmp) / Path(str(url).rstrip("/")).name
        yield local
        check_output_dir(url, kind)
        if storage.list_names(str(url)):
            storage.remove(str(url), first=marker)
        storage.upload(local, str(url), last=marker)
