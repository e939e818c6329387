"""``tandem data``: validate, split, dedup, describe, aggregate and generate preference data."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tandem.cli.app import data_app, user_errors

if TYPE_CHECKING:
    from tandem.data.preference import InvalidRow

out = Console()

InputFile = Annotated[
    str, typer.Argument(help="JSONL, Parquet, datasets.save_to_disk folder, or fsspec URL.")
]
SkipInvalid = Annotated[
    bool,
    typer.Option("--skip-invalid", help="Write invalid rows (with reasons) to a sidecar file and go on."),
]
Sidecar = Annotated[
    str | None, typer.Option(help="Sidecar for invalid rows (default <input>.invalid.jsonl).")
]
MaxLength = Annotated[int | None, typer.Option(help="Max characters of prompt + completion.")]
MAX_LISTED = 50  # invalid rows `validate` lists before it only counts the rest


def _load(path: str, skip_invalid: bool, sidecar: str, max_length: int | None):
    """Validated pairs of ``path`` (local or URL); invalid rows go to ``sidecar`` (see :func:`_sidecar`)."""
    from tandem.data.preference import load_preferences
    from tandem.data.storage import local_input

    with local_input(path) as local:
        data = load_preferences(local, skip_invalid=skip_invalid, sidecar=sidecar, max_length=max_length)
    if data.invalid:
        out.print(f"[yellow]{len(data.invalid)} invalid rows[/] written to {escape(sidecar)}")
    return data


def _sidecar(path: str, sidecar: str | None, skip_invalid: bool, outputs: Sequence[str] = ()) -> str:
    """The sidecar for invalid rows of ``path``, checked before anything is read or written.

    Default: ``<name>.invalid.jsonl`` beside a local input; for a remote input in the current folder (not
    in the temporary download folder). With ``--skip-invalid`` it is written, so it must be neither the
    input (which it would replace) nor one of the command's ``outputs`` (which would overwrite it)."""
    from tandem.data.outputs import check_output_file, same_path
    from tandem.data.preference import default_sidecar
    from tandem.data.storage import is_remote
    from tandem.errors import ConfigError

    if sidecar is None and is_remote(path):
        sidecar = str(Path(path.rstrip("/").rsplit("/", 1)[-1]).with_suffix(".invalid.jsonl"))
    elif sidecar is None:
        sidecar = str(default_sidecar(path.removeprefix("file://")))
    if skip_invalid:
        check_output_file(sidecar, sources=(path,), where="--sidecar")
        for output in outputs:
            if same_path(sidecar, output):
                raise ConfigError(
                    f"{sidecar} is also the output {output}",
                    where="--sidecar",
                    hint="choose another --sidecar",
                )
    return sidecar


@data_app.command("validate")
@user_errors
def validate(
    path: InputFile, skip_invalid: SkipInvalid = False, sidecar: Sidecar = None, max_length: MaxLength = None
) -> None:
    """Check every row; list each bad one as file:line: reason, like a linter (exit 2 if any).

    The first 50 bad rows are listed, then a count of the rest. With --skip-invalid, bad rows go to
    the sidecar file instead and the command succeeds if any valid pair is left.

    Example: tandem data validate data/prefs.jsonl --skip-invalid
    """
    if skip_invalid:
        data = _load(path, skip_invalid, _sidecar(path, sidecar, skip_invalid), max_length)
        out.print(f"{len(data.pairs)} valid pairs, {len(data.invalid)} invalid rows in {escape(path)}")
        return
    from tandem.data.preference import read_preferences
    from tandem.data.storage import local_input
    from tandem.errors import DataError

    with local_input(path) as local:
        data = read_preferences(local, max_length=max_length)
    for line in invalid_listing(data.invalid):
        out.print(escape(line), highlight=False, soft_wrap=True)
    if data.invalid:
        raise DataError(
            f"{len(data.invalid)} invalid rows, {len(data.pairs)} valid pairs",
            where=path,
            hint="fix the rows or pass --skip-invalid",
        )
    if not data.pairs:
        raise DataError("no valid preference pairs", where=path)
    out.print(f"{len(data.pairs)} valid pairs, 0 invalid rows in {escape(path)}")


def invalid_listing(invalid: Sequence[InvalidRow], limit: int = MAX_LISTED) -> list[str]:
    """``file:line: reason`` for the first ``limit`` invalid rows in file order, then a count of the rest."""
    ordered = sorted(invalid, key=lambda row: _line_number(row.where))
    lines = [f"{row.where}: {row.reason}" for row in ordered[:limit]]
    if len(ordered) > limit:
        lines.append(f"… and {len(ordered) - limit} more invalid rows")
    return lines


def _line_number(where: str) -> int:
    """The line (or row) number in ``file:LINE``, ``file:row N`` or ``file:L1+L2`` (0 if none)."""
    match = re.search(r":(?:row )?(\d+)(?:\+\d+)?$", where)
    return int(match.group(1)) if match else 0


@data_app.command("stats")
@user_errors
def stats(path: InputFile, skip_invalid: SkipInvalid = False, sidecar: Sidecar = None) -> None:
    """Counts, lengths, margin and category balance as a table."""
    from tandem.data.preference_ops import preference_stats

    s = preference_stats(_load(path, skip_invalid, _sidecar(path, sidecar, skip_invalid), None).pairs)
    table = Table(title=f"preference data: {path}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("pairs", str(s["pairs"]))
    table.add_row("distinct prompts", str(s["prompts"]))
    for part in ("prompt", "chosen", "rejected"):
        v = s[f"length/{part}"]
        table.add_row(
            f"{part} length (mean / p50 / max chars)", f"{v['mean']:.1f} / {v['p50']:.0f} / {v['max']:.0f}"
        )
    table.add_row("chosen longer than rejected", f"{100 * s['chosen_longer_fraction']:.1f}%")
    if s["margin"]:
        table.add_row("pairs with margin (mean)", f"{s['margin']['count']} ({s['margin']['mean']:.2f})")
    for name, count in s["categories"].items():
        table.add_row(f"category {escape(name)}", f"{count} ({100 * count / max(1, s['pairs']):.1f}%)")
    out.print(table)


@data_app.command("dedup")
@user_errors
def dedup_cmd(
    path: InputFile,
    out_file: Annotated[str, typer.Option("--out", help="Deduplicated JSONL (local path or fsspec URL).")],
    near_threshold: Annotated[
        float, typer.Option(help="Jaccard of character 5-grams counted as near duplicate.")
    ] = 0.9,
    exact_only: Annotated[bool, typer.Option("--exact-only", help="Remove exact duplicates only.")] = False,
    skip_invalid: SkipInvalid = False,
    sidecar: Sidecar = None,
) -> None:
    """Remove exact and near-duplicate pairs (first occurrence kept).

    --out is a file (replaced atomically), never the input itself.
    """
    from tandem.data.outputs import check_output_file
    from tandem.data.preference_ops import dedup
    from tandem.data.storage import write_pairs_url
    from tandem.errors import ConfigError

    if not exact_only and not 0 < near_threshold <= 1:  # also refuses nan
        raise ConfigError(f"must be in (0, 1], got {near_threshold}", where="--near-threshold")
    check_output_file(out_file, sources=(path,), where="--out")  # before reading the input
    data = _load(path, skip_invalid, _sidecar(path, sidecar, skip_invalid, (out_file,)), None)
    result = dedup(data.pairs, near_threshold=None if exact_only else near_threshold)
    write_pairs_url(result.kept, out_file)
    out.print(
        f"kept {len(result.kept)} of {len(data.pairs)} pairs: {len(result.exact)} exact and "
        f"{len(result.near)} near duplicates removed -> {escape(out_file)}"
    )


@data_app.command("split")
@user_errors
def split_cmd(
    path: InputFile,
    out_dir: Annotated[
        str, typer.Option("--out-dir", help="Folder (or fsspec URL) for train.jsonl and val.jsonl.")
    ],
    val_fraction: Annotated[float, typer.Option(help="Share of prompts held out.")] = 0.2,
    seed: Annotated[int, typer.Option(help="Split seed.")] = 0,
    augment: Annotated[
        str | None,
        typer.Option(
            help="Hook 'module:function' or 'file.py:function' applied to the train split only. "
            "It imports and runs that Python code with your permissions: use only code you trust."
        ),
    ] = None,
    rebalance: Annotated[
        bool, typer.Option("--rebalance", help="Resample train categories to equal counts.")
    ] = False,
    skip_invalid: SkipInvalid = False,
    sidecar: Sidecar = None,
) -> None:
    """Seeded split by prompt: no prompt appears in both train and validation.

    --out-dir may be new, empty or an earlier split (a folder with train.jsonl and val.jsonl, which are
    replaced; nothing else there is touched); any other folder, and the folder holding the input, is
    refused. Example: tandem data split prefs.jsonl --out-dir data/split --val-fraction 0.2 --seed 0
    """
    from tandem.data import preference_ops as ops
    from tandem.data.outputs import KINDS, check_output_dir
    from tandem.data.storage import join_url, write_pairs_url
    from tandem.errors import ConfigError

    if not 0 <= val_fraction < 1:  # also refuses nan
        raise ConfigError(f"must be in [0, 1), got {val_fraction}", where="--val-fraction")
    check_output_dir(out_dir, "split", sources=(path,), where="--out-dir")  # before reading the input
    files = [join_url(out_dir, name) for name in KINDS["split"].files]
    hook = ops.load_hook(augment) if augment else None
    data = _load(path, skip_invalid, _sidecar(path, sidecar, skip_invalid, files), None)
    train, val = ops.split_by_prompt(data.pairs, val_fraction=val_fraction, seed=seed)
    if rebalance:
        train = ops.rebalance(train, seed=seed)
    if hook is not None:
        train = ops.augment(train, hook)
    write_pairs_url(train, files[0])
    write_pairs_url(val, files[1])
    out.print(f"train {len(train)} pairs, val {len(val)} pairs -> {escape(out_dir)}")


@data_app.command("aggregate")
@user_errors
def aggregate_cmd(
    path: InputFile,
    out_file: Annotated[str, typer.Option("--out", help="Aggregated preference pairs (JSONL).")],
    method: Annotated[str, typer.Option(help="majority or unanimous.")] = "majority",
) -> None:
    """Several annotators per pair: print agreement (Fleiss' / Cohen's kappa) and aggregate the votes."""
    from tandem.data.annotators import aggregate, agreement
    from tandem.data.outputs import check_output_file
    from tandem.data.preference import iter_raw_rows
    from tandem.data.storage import local_input, write_rows_url
    from tandem.errors import DataError

    if method not in ("majority", "unanimous"):
        raise DataError(f"unknown method '{method}'", where="--method", hint="use majority or unanimous")
    check_output_file(out_file, sources=(path,), where="--out")
    with local_input(path) as local:
        raw = list(iter_raw_rows(local))
    bad = [row for _, row in raw if not isinstance(row, dict)]
    if bad:
        raise DataError(bad[0].reason, where=bad[0].where)
    rows = [row for _, row in raw]
    report = agreement(rows)
    kept, dropped = aggregate(rows, method=method)  # type: ignore[arg-type]
    write_rows_url(kept, out_file)
    fk = "n/a" if report.fleiss_kappa is None else f"{report.fleiss_kappa:.3f}"
    out.print(f"{report.items} items, unanimous {100 * report.raw_agreement:.1f}%, Fleiss' kappa {fk}")
    for name, kappa in report.pairwise_cohen.items():
        out.print(f"  Cohen's kappa {escape(name)}: {kappa:.3f}")
    out.print(f"kept {len(kept)} pairs, dropped {dropped} (no {method} preference) -> {escape(out_file)}")


@data_app.command("make-safety")
@user_errors
def make_safety(
    out_dir: Annotated[Path, typer.Option("--out-dir", help="Folder for train.jsonl and val.jsonl.")],
    train_size: Annotated[int, typer.Option(help="Training pairs.")] = 2000,
    val_size: Annotated[int, typer.Option(help="Held-out pairs (prompts disjoint from train).")] = 300,
    noise: Annotated[float, typer.Option(help="Share of training labels flipped (annotator noise).")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed.")] = 0,
) -> None:
    """Generate the shipped preference set from the `safety` task (held-out labels are never noised).

    --out-dir may be new, empty or an earlier split (train.jsonl and val.jsonl are replaced); any other
    folder is refused.
    """
    from tandem.data.outputs import check_output_dir
    from tandem.data.storage import write_rows_url
    from tandem.rewards.tasks.safety import SafetyTask, make_preference_rows

    check_output_dir(out_dir, "split", where="--out-dir")
    task = SafetyTask()
    train = make_preference_rows(task, "train", train_size, seed, noise=noise)
    val = make_preference_rows(task, "test", val_size, seed, noise=0.0)
    write_rows_url(train, str(out_dir / "train.jsonl"))
    write_rows_url(val, str(out_dir / "val.jsonl"))
    flipped = sum(r["flipped"] for r in train)
    out.print(
        f"safety preferences: train {len(train)} ({flipped} flipped), val {len(val)} -> {escape(str(out_dir))}"
    )
