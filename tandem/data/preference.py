"""Preference datasets: read, normalise and validate pairs in TRL's field names.

Accepted row shapes (TRL conventions, plain strings or conversational ``[{role, content}]`` lists; roles
are :data:`tandem.data.chat.ROLES`; training renders conversations through the chat template, see
:mod:`tandem.train.preference_batch`):

- explicit prompt: ``prompt`` + ``chosen`` + ``rejected``;
- implicit prompt: ``chosen`` + ``rejected`` only — the shared leading messages (conversational) or the
  longest common prefix ending at a whitespace/newline (strings) become the prompt;
- scored completions: ``prompt`` + ``completion`` + ``score`` (human scores 1–N); every two completions of
  one prompt with different scores become a pair whose ``margin`` is the score difference.

Optional columns: ``margin`` (float), ``category`` (str, used by stats and rebalancing), ``annotations``
(see :mod:`tandem.data.annotators`); any other column is kept in ``PreferencePair.extra``.

Every row is validated; a bad row yields ``InvalidRow(where="file:LINE", reason=...)``. Nothing is
dropped silently: callers either raise on the first invalid row or write them all to a sidecar file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tandem.data.chat import message_problem
from tandem.data.jsonl import MAX_DEPTH, row_problem
from tandem.errors import DataError, MissingDependencyError

Text = str | list[dict[str, str]]
LengthFn = Callable[[str], int]

KNOWN_COLUMNS = {"prompt", "chosen", "rejected", "margin", "category", "completion", "score"}


@dataclass(frozen=True)
class PreferencePair:
    """One validated preference: ``chosen`` is preferred over ``rejected`` for ``prompt``."""

    prompt: Text
    chosen: Text
    rejected: Text
    where: str  # "file:LINE" (JSONL), "file:row N" (Parquet / Arrow) — for error messages
    margin: float | None = None
    category: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_row(self) -> dict[str, Any]:
        """The pair as a TRL explicit-prompt row (plus margin/category/extra when set)."""
        row: dict[str, Any] = {"prompt": self.prompt, "chosen": self.chosen, "rejected": self.rejected}
        if self.margin is not None:
            row["margin"] = self.margin
        if self.category is not None:
            row["category"] = self.category
        row.update(self.extra)
        return row


@dataclass(frozen=True)
class InvalidRow:
    """A rejected input row: where it was, why, and its raw content (for the sidecar file)."""

    where: str
    reason: str
    row: Any


@dataclass
class PreferenceData:
    """Valid pairs and invalid rows of one input, in input order."""

    pairs: list[PreferencePair]
    invalid: list[InvalidRow]
    source: str


def render(text: Text) -> str:
    """Plain text of a string or a message list (``role: content`` lines) — for lengths and hashing."""
    if isinstance(text, str):
        return text
    return "\n".join(f"{m['role']}: {m['content']}" for m in text)


# ---------------------------------------------------------------------------------------------- reading


def iter_raw_rows(path: str | Path) -> Iterator[tuple[str, Any | InvalidRow]]:
    """``(where, row)`` for every row of a JSONL/Parquet file or a ``datasets.save_to_disk`` folder.

    A JSONL line that is not valid JSON or not an object is yielded as an :class:`InvalidRow` (so
    ``--skip-invalid`` can record it) instead of aborting the whole read.
    """
    p = Path(path)
    if not p.exists():
        raise DataError("preference file does not exist", where=str(p))
    if p.is_dir():
        yield from (_checked(where, row) for where, row in _iter_arrow_dir(p))
    elif p.suffix == ".parquet":
        from tandem.data.parquet import read_parquet_rows

        _, rows = read_parquet_rows(p)
        for i, row in enumerate(rows):
            yield _checked(f"{p}:row {i}", row)
    elif p.suffix in (".jsonl", ".json"):
        yield from _iter_jsonl(p)
    else:
        raise DataError(
            f"unsupported preference file type '{p.suffix}'",
            where=str(p),
            hint="use .jsonl, .parquet or a folder written by datasets.save_to_disk",
        )


def _checked(where: str, row: Any) -> tuple[str, Any]:
    """``(where, row)``, or ``(where, InvalidRow)`` when :func:`row_problem` finds one."""
    problem = row_problem(row)
    return where, (InvalidRow(where, problem, repr(row)[:1000]) if problem else row)


def _iter_jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield where, InvalidRow(where, "not UTF-8 text", raw.decode("utf-8", "replace"))
                continue
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                yield where, InvalidRow(where, f"invalid JSON ({err.msg} at column {err.colno})", line)
                continue
            except RecursionError:
                yield where, InvalidRow(where, f"nested deeper than {MAX_DEPTH} levels", line.strip())
                continue
            if not isinstance(obj, dict):
                yield where, InvalidRow(where, "expected a JSON object", line.strip())
                continue
            problem = row_problem(obj)
            # The raw line (plain JSON text) is kept for the sidecar: it is valid UTF-8 and shallow to write.
            yield where, (InvalidRow(where, problem, line.strip()) if problem else obj)


def _iter_arrow_dir(folder: Path) -> Iterator[tuple[str, Any]]:
    """Rows of a ``Dataset.save_to_disk`` folder, read from its Arrow stream files with pyarrow
    (``datasets`` itself is not needed). A ``DatasetDict`` folder must be narrowed to one split."""
    if (folder / "dataset_dict.json").is_file():
        splits = json.loads((folder / "dataset_dict.json").read_text()).get("splits", [])
        raise DataError(
            "folder is a DatasetDict", where=str(folder), hint=f"pass one split folder: {', '.join(splits)}"
        )
    state = folder / "state.json"
    if not state.is_file():
        raise DataError("folder has no state.json (not written by datasets.save_to_disk)", where=str(folder))
    try:
        import pyarrow as pa
    except ImportError:
        raise MissingDependencyError("pyarrow", "data") from None
    files = [f["filename"] for f in json.loads(state.read_text()).get("_data_files", [])]
    index = 0
    for name in files:
        with pa.memory_map(str(folder / name)) as source:
            table = pa.ipc.open_stream(source).read_all()
        for row in table.to_pylist():
            yield f"{folder}/{name}:row {index}", row
            index += 1


# -------------------------------------------------------------------------------------------- validation


def _check_text(value: Any, name: str) -> str | None:
    """The reason ``value`` is not a usable field, or None."""
    if value is None:
        return f"missing field '{name}'"
    if isinstance(value, str):
        return f"empty field '{name}'" if not value.strip() else None
    if isinstance(value, list):
        if not value:
            return f"empty field '{name}'"
        return message_problem(value, name)
    return f"field '{name}' must be a string or a list of messages, got {type(value).__name__}"


def split_implicit(chosen: Text, rejected: Text) -> tuple[Text, Text, Text]:
    """``(prompt, chosen_rest, rejected_rest)`` for implicit-prompt rows: shared leading messages, or
    for strings the longest common prefix cut back to the last whitespace (so words are not split)."""
    if isinstance(chosen, list) and isinstance(rejected, list):
        n = 0
        while n < min(len(chosen), len(rejected)) - 1 and chosen[n] == rejected[n]:
            n += 1
        return chosen[:n], chosen[n:], rejected[n:]
    a, b = render(chosen), render(rejected)
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    while n > 0 and not a[n - 1].isspace():
        n -= 1
    return a[:n], a[n:], b[n:]


def validate_row(
    row: dict[str, Any], where: str, *, max_length: int | None = None, length_fn: LengthFn = len
) -> PreferencePair | InvalidRow:
    """One explicit/implicit preference row -> a pair, or the first reason it is invalid.

    Checks: required fields present, non-empty, of the right type (string or message list, both sides
    the same kind), chosen != rejected, optional ``margin`` a finite number, and
    ``length_fn(prompt + completion) <= max_length`` for both completions when ``max_length`` is set.
    """
    for name in ("chosen", "rejected"):
        reason = _check_text(row.get(name), name)
        if reason:
            return InvalidRow(where, reason, row)
    chosen, rejected = row["chosen"], row["rejected"]
    if type(chosen) is not type(rejected):
        return InvalidRow(where, "'chosen' and 'rejected' mix a string and a message list", row)
    if "prompt" in row:
        reason = _check_text(row["prompt"], "prompt")
        if reason:
            return InvalidRow(where, reason, row)
        prompt = row["prompt"]
    else:
        prompt, chosen, rejected = split_implicit(chosen, rejected)
    if render(chosen).strip() == render(rejected).strip():
        return InvalidRow(where, "'chosen' and 'rejected' are identical", row)
    margin = row.get("margin")
    if margin is not None and (
        isinstance(margin, bool) or not isinstance(margin, int | float) or not math.isfinite(margin)
    ):
        return InvalidRow(where, f"'margin' must be a finite number, got {margin!r}", row)
    category = row.get("category")
    if category is not None and not isinstance(category, str):
        return InvalidRow(where, f"'category' must be a string, got {type(category).__name__}", row)
    if max_length is not None:
        for name, comp in (("chosen", chosen), ("rejected", rejected)):
            n = length_fn(render(prompt) + render(comp))
            if n > max_length:
                return InvalidRow(where, f"prompt + {name} is {n} long, over max_length={max_length}", row)
    extra = {k: v for k, v in row.items() if k not in KNOWN_COLUMNS}
    return PreferencePair(
        prompt, chosen, rejected, where, None if margin is None else float(margin), category, extra
    )


def pairs_from_scores(
    rows: Sequence[tuple[str, dict[str, Any]]],
) -> tuple[list[tuple[str, dict[str, Any]]], list[InvalidRow]]:
    """Scored completions (``prompt``, ``completion``, ``score``) -> explicit pair rows.

    Completions of one prompt are ordered by score; each two with different scores make a pair
    (higher = chosen) with ``margin`` = score difference. Ties carry no preference and make no pair.
    """
    groups: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    invalid: list[InvalidRow] = []
    for where, row in rows:
        score = row.get("score")
        for name in ("prompt", "completion"):
            reason = _check_text(row.get(name), name)
            if reason:
                invalid.append(InvalidRow(where, reason, row))
                break
        else:
            if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
                invalid.append(InvalidRow(where, f"'score' must be a finite number, got {score!r}", row))
                continue
            groups.setdefault(json.dumps(row["prompt"], sort_keys=True), []).append((where, row))
    out: list[tuple[str, dict[str, Any]]] = []
    for members in groups.values():
        for i, (wa, a) in enumerate(members):
            for wb, b in members[i + 1 :]:
                if a["score"] == b["score"]:
                    continue
                hi, lo = (a, b) if a["score"] > b["score"] else (b, a)
                pair = {"prompt": a["prompt"], "chosen": hi["completion"], "rejected": lo["completion"]}
                pair["margin"] = float(hi["score"] - lo["score"])
                if "category" in a:
                    pair["category"] = a["category"]
                out.append((f"{wa}+{wb.rsplit(':', 1)[-1]}", pair))
    return out, invalid


def read_preferences(
    path: str | Path, *, max_length: int | None = None, length_fn: LengthFn = len
) -> PreferenceData:
    """All rows of ``path`` validated into pairs and invalid rows (see the module docstring)."""
    pairs: list[PreferencePair] = []
    invalid: list[InvalidRow] = []
    scored: list[tuple[str, dict[str, Any]]] = []
    for where, row in iter_raw_rows(path):
        if isinstance(row, InvalidRow):
            invalid.append(row)
        elif "score" in row and "completion" in row and "chosen" not in row:
            scored.append((where, row))
        else:
            checked = validate_row(row, where, max_length=max_length, length_fn=length_fn)
            (invalid if isinstance(checked, InvalidRow) else pairs).append(checked)  # type: ignore[arg-type]
    if scored:
        made, bad = pairs_from_scores(scored)
        invalid.extend(bad)
        for where, row in made:
            checked = validate_row(row, where, max_length=max_length, length_fn=length_fn)
            (invalid if isinstance(checked, InvalidRow) else pairs).append(checked)  # type: ignore[arg-type]
    return PreferenceData(pairs=pairs, invalid=invalid, source=str(path))


def load_preferences(
    path: str | Path,
    *,
    skip_invalid: bool = False,
    sidecar: str | Path | None = None,
    max_length: int | None = None,
    length_fn: LengthFn = len,
    skip_switch: str = "--skip-invalid",
) -> PreferenceData:
    """Read and validate ``path``. Without ``skip_invalid`` the first invalid row is a DataError
    ``file:LINE: reason`` whose hint names ``skip_switch`` (how the caller's user turns skipping on: a
    flag, or a config key); with it, invalid rows go to ``sidecar`` (default ``<path>.invalid.jsonl``)
    as ``{"where", "reason", "row"}`` lines. An input with no valid pair is always an error."""
    data = read_preferences(path, max_length=max_length, length_fn=length_fn)
    if data.invalid and not skip_invalid:
        first = data.invalid[0]
        more = f" (+{len(data.invalid) - 1} more invalid rows)" if len(data.invalid) > 1 else ""
        raise DataError(first.reason + more, where=first.where, hint=f"fix the row or pass {skip_switch}")
    if data.invalid:
        write_invalid(data.invalid, sidecar or default_sidecar(path))
    if not data.pairs:
        raise DataError("no valid preference pairs", where=str(path))
    return data


def default_sidecar(path: str | Path) -> Path:
    """``data/prefs.jsonl`` -> ``data/prefs.invalid.jsonl`` (a folder gets ``<folder>.invalid.jsonl``)."""
    p = Path(path)
    return p.with_name(f"{p.stem if p.is_file() else p.name}.invalid.jsonl")


def write_invalid(rows: Sequence[InvalidRow], path: str | Path) -> Path:
    """Write rejected rows with their location and reason, atomically."""
    from tandem.utils.io import atomic_write_text

    lines = [_sidecar_line(r) for r in rows]
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return Path(path)


def _sidecar_line(row: InvalidRow) -> str:
    """One sidecar line; ASCII escapes where the raw row holds text UTF-8 cannot encode (lone surrogates)."""
    obj = {"where": row.where, "reason": row.reason, "row": row.row}
    line = json.dumps(obj, ensure_ascii=False, default=str)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        line = json.dumps(obj, ensure_ascii=True, default=str)
    return line


def write_pairs(pairs: Sequence[PreferencePair], path: str | Path) -> Path:
    """Write pairs as TRL explicit-prompt JSONL, atomically."""
    from tandem.utils.io import atomic_write_text

    text = "".join(json.dumps(p.to_row(), ensure_ascii=False, default=str) + "\n" for p in pairs)
    atomic_write_text(path, text)
    return Path(path)
