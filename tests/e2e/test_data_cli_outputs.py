"""`tandem data` commands that write (split, make-safety, dedup, aggregate, a --skip-invalid sidecar)
never lose data: an output that is the input (or the folder holding it), an unrelated folder, a folder
where a file goes or a file where a folder goes is refused with one line naming the option, exit 2, with
nothing written; an earlier split is replaced (its train.jsonl and val.jsonl only)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from tandem.cli.main import app

GOOD = [{"prompt": f"p{i}", "chosen": f"good answer {i}", "rejected": f"bad {i}"} for i in range(5)]


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def write(path: Path, lines: list) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def refused(result, line: str) -> bool:
    """Exit 2 and the output is the one error line (no traceback, nothing else printed)."""
    return result.exit_code == 2 and result.output.strip().splitlines() == [f"error: {line}"]


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_split_refuses_to_write_over_its_input(tmp_path):
    ow = tmp_path / "ow"
    ow.mkdir()
    source = write(ow / "train.jsonl", GOOD)
    before = source.read_text()
    result = invoke("data", "split", source, "--out-dir", ow, "--val-fraction", "0.4")
    assert refused(result, f"--out-dir: {ow} is (or holds) the source file {source}; writing there would "
                   "replace it (choose another --out-dir)"), result.output  # fmt: skip
    assert source.read_text() == before and listing(ow) == ["train.jsonl"]
    result = invoke("data", "split", source, "--out-dir", source)
    assert refused(result, f"--out-dir: {source} is (or holds) the source file {source}; writing there "
                   "would replace it (choose another --out-dir)"), result.output  # fmt: skip
    assert source.read_text() == before


def test_sidecar_is_never_the_input(tmp_path):
    bad = write(tmp_path / "bad.jsonl", [*GOOD, "not json"])
    before = bad.read_text()
    for command in ("validate", "stats"):
        result = invoke("data", command, bad, "--skip-invalid", "--sidecar", bad)
        assert refused(result, f"--sidecar: {bad} is the input {bad}; writing there would replace it "
                       "(choose another --sidecar)"), result.output  # fmt: skip
        assert bad.read_text() == before
    (tmp_path / "dir").mkdir()
    result = invoke("data", "validate", bad, "--skip-invalid", "--sidecar", tmp_path / "dir")
    assert refused(
        result, f"--sidecar: {tmp_path / 'dir'} is a folder, not a file (choose another --sidecar)"
    )
    assert listing(tmp_path) == ["bad.jsonl", "dir"]


def test_split_and_make_safety_refuse_an_unrelated_folder_and_a_file(tmp_path):
    good = write(tmp_path / "good.jsonl", GOOD)
    un = tmp_path / "un"
    un.mkdir()
    (un / "z").write_text("mine")
    for args in (("split", good), ("make-safety", "--train-size", "4", "--val-size", "2")):
        result = invoke("data", *args, "--out-dir", un)
        assert refused(result, f"--out-dir: {un} is not empty and not a Tandem data split folder (no "
                       "train.jsonl and val.jsonl); refusing to replace it (choose another --out-dir, or "
                       "remove that folder yourself)"), result.output  # fmt: skip
        assert listing(un) == ["z"]
        other = write(tmp_path / "other.jsonl", ["{}"])
        result = invoke("data", *args, "--out-dir", other)
        assert refused(result, f"--out-dir: {other} is a file, not a folder (choose another --out-dir)")
        result = invoke("data", *args, "--out-dir", other / "split")
        assert refused(result, f"--out-dir: {other} is a file, not a folder (choose another --out-dir)")
        assert other.read_text() == "{}\n"
    assert listing(tmp_path) == ["good.jsonl", "other.jsonl", "un"]


def test_dedup_and_aggregate_refuse_their_input_a_folder_and_a_path_below_a_file(tmp_path):
    good = write(tmp_path / "good.jsonl", GOOD)
    folder = tmp_path / "dir"
    folder.mkdir()
    before = good.read_text()
    for command in ("dedup", "aggregate"):
        for out in (good, tmp_path / "." / "good.jsonl"):
            result = invoke("data", command, good, "--out", out)
            assert refused(result, f"--out: {out} is the input {good}; writing there would replace it "
                           "(choose another --out)"), result.output  # fmt: skip
        result = invoke("data", command, good, "--out", folder)
        assert refused(result, f"--out: {folder} is a folder, not a file (choose another --out)"), (
            result.output
        )
        result = invoke("data", command, good, "--out", good / "x.jsonl")
        assert refused(result, f"--out: {good} is a file, not a folder (choose another --out)"), result.output
    assert good.read_text() == before and listing(tmp_path) == ["dir", "good.jsonl"] and not listing(folder)


def test_sidecar_is_never_one_of_the_outputs(tmp_path):
    bad = write(tmp_path / "bad.jsonl", [*GOOD, "not json"])
    split = tmp_path / "split"
    result = invoke(
        "data", "split", bad, "--out-dir", split, "--skip-invalid", "--sidecar", split / "val.jsonl"
    )
    assert refused(result, f"--sidecar: {split / 'val.jsonl'} is also the output {split / 'val.jsonl'} "
                   "(choose another --sidecar)"), result.output  # fmt: skip
    sidecar = tmp_path / "bad.invalid.jsonl"  # the default one
    result = invoke("data", "dedup", bad, "--out", sidecar, "--skip-invalid")
    assert refused(result, f"--sidecar: {sidecar} is also the output {sidecar} (choose another --sidecar)")
    assert listing(tmp_path) == ["bad.jsonl"]


def test_bad_ranges_are_refused_before_the_sidecar_is_written(tmp_path):
    bad = write(tmp_path / "bad.jsonl", [*GOOD, "not json"])
    result = invoke(
        "data", "split", bad, "--out-dir", tmp_path / "s", "--skip-invalid", "--val-fraction", "nan"
    )
    assert refused(result, "--val-fraction: must be in [0, 1), got nan"), result.output
    result = invoke(
        "data", "dedup", bad, "--out", tmp_path / "d.jsonl", "--skip-invalid", "--near-threshold", "2"
    )
    assert refused(result, "--near-threshold: must be in (0, 1], got 2.0"), result.output
    assert listing(tmp_path) == ["bad.jsonl"]


def test_split_and_make_safety_replace_an_earlier_split_only(tmp_path):
    good = write(tmp_path / "good.jsonl", GOOD)
    split = tmp_path / "split"
    assert invoke("data", "split", good, "--out-dir", split).exit_code == 0
    (split / "README.md").write_text("notes")
    result = invoke("data", "split", good, "--out-dir", split, "--val-fraction", "0.4")
    assert result.exit_code == 0 and "train 3 pairs, val 2 pairs" in result.output, result.output
    assert listing(split) == ["README.md", "train.jsonl", "val.jsonl"]
    result = invoke("data", "make-safety", "--out-dir", split, "--train-size", "4", "--val-size", "2")
    assert result.exit_code == 0, result.output
    assert len((split / "val.jsonl").read_text().splitlines()) == 2 and (split / "README.md").is_file()
