"""Preference data: every bad row type with file:line, formats (JSONL, Parquet, save_to_disk folder),
implicit prompts, conversational rows, scores -> pairs, sidecar for --skip-invalid."""

from __future__ import annotations

import json

import pytest

from tandem.data.preference import (
    InvalidRow,
    load_preferences,
    read_preferences,
    split_implicit,
    validate_row,
    write_invalid,
)
from tandem.errors import DataError


def write_jsonl(path, lines):
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return path


GOOD = {"prompt": "2+2?", "chosen": "4", "rejected": "5"}


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"prompt": "p", "rejected": "r"}, "missing field 'chosen'"),
        ({"prompt": "p", "chosen": "c"}, "missing field 'rejected'"),
        ({"prompt": "p", "chosen": "  ", "rejected": "r"}, "empty field 'chosen'"),
        ({"prompt": "", "chosen": "c", "rejected": "r"}, "empty field 'prompt'"),
        ({"prompt": "p", "chosen": "same", "rejected": "same"}, "'chosen' and 'rejected' are identical"),
        (
            {"prompt": "p", "chosen": 3, "rejected": "r"},
            "field 'chosen' must be a string or a list of messages, got int",
        ),
        (
            {
                "prompt": "p",
                "chosen": [{"role": "assistant"}],
                "rejected": [{"role": "assistant", "content": "x"}],
            },
            "message 0 has no string 'content'",
        ),
        ({"prompt": "p", "chosen": ["x"], "rejected": "r"}, "message 0 is not a {role, content} object"),
        (
            {"prompt": "p", "chosen": [{"role": "assistant", "content": "x"}], "rejected": "r"},
            "mix a string and a message list",
        ),
        ({**GOOD, "margin": "big"}, "'margin' must be a finite number"),
        ({**GOOD, "margin": float("nan")}, "'margin' must be a finite number"),
        ({**GOOD, "category": 7}, "'category' must be a string"),
    ],
)
def test_bad_rows_are_reported_with_reason(row, reason):
    out = validate_row(row, "f.jsonl:3")
    assert isinstance(out, InvalidRow) and out.where == "f.jsonl:3"
    assert reason in out.reason


def test_over_length_uses_length_fn():
    row = {"prompt": "abc", "chosen": "defgh", "rejected": "x"}
    assert isinstance(validate_row(row, "w", max_length=10), type(validate_row(GOOD, "w")))
    bad = validate_row(row, "w", max_length=7)
    assert isinstance(bad, InvalidRow) and "prompt + chosen is 8 long, over max_length=7" in bad.reason
    # a token counter (here: 1 per word) changes what counts as too long
    assert not isinstance(
        validate_row(row, "w", max_length=7, length_fn=lambda s: len(s.split())), InvalidRow
    )


def test_jsonl_errors_name_file_and_line_and_sidecar_keeps_everything(tmp_path):
    f = write_jsonl(
        tmp_path / "p.jsonl",
        [GOOD, "{not json", "", "[1, 2]", {"prompt": "q", "chosen": "a", "rejected": "a"}, GOOD],
    )
    with pytest.raises(
        DataError,
        match=rf"^{tmp_path}/p.jsonl:2: invalid JSON .*\(\+2 more invalid rows\) \(fix the row or pass --skip-invalid\)$",
    ):
        load_preferences(f)
    data = load_preferences(f, skip_invalid=True)
    assert len(data.pairs) == 2
    side = [json.loads(x) for x in (tmp_path / "p.invalid.jsonl").read_text().splitlines()]
    assert [s["where"] for s in side] == [f"{f}:2", f"{f}:4", f"{f}:5"]
    assert "identical" in side[2]["reason"] and side[2]["row"]["chosen"] == "a"


def test_all_invalid_is_an_error_even_when_skipping(tmp_path):
    f = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "p"}])
    with pytest.raises(DataError, match="no valid preference pairs"):
        load_preferences(f, skip_invalid=True, sidecar=tmp_path / "side.jsonl")
    assert (tmp_path / "side.jsonl").exists()


def test_implicit_prompt_strings_and_messages():
    p, c, r = split_implicit("Q: hi there A: yes", "Q: hi there A: no")
    assert (p, c, r) == ("Q: hi there A: ", "yes", "no")
    conv_c = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    conv_r = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "go away"}]
    pair = validate_row({"chosen": conv_c, "rejected": conv_r}, "w")
    assert pair.prompt == conv_c[:1] and pair.chosen == conv_c[1:] and pair.rejected == conv_r[1:]


def test_scores_become_pairs_with_margins(tmp_path):
    rows = [
        {"prompt": "p", "completion": "best", "score": 5},
        {"prompt": "p", "completion": "ok", "score": 3},
        {"prompt": "p", "completion": "tie", "score": 3},
        {"prompt": "q", "completion": "only", "score": 1},
        {"prompt": "q", "completion": "bad", "score": "x"},
    ]
    data = read_preferences(write_jsonl(tmp_path / "s.jsonl", rows))
    got = sorted((p.chosen, p.rejected, p.margin) for p in data.pairs)
    assert got == [("best", "ok", 2.0), ("best", "tie", 2.0)]
    assert len(data.invalid) == 1 and "'score' must be a finite number" in data.invalid[0].reason


def test_parquet_and_save_to_disk_folder(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([GOOD, {"prompt": "x", "chosen": "y", "rejected": "y"}])
    pq.write_table(table, tmp_path / "p.parquet")
    data = read_preferences(tmp_path / "p.parquet")
    assert len(data.pairs) == 1 and data.invalid[0].where == f"{tmp_path}/p.parquet:row 1"
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list([GOOD, {**GOOD, "prompt": "3+3?", "chosen": "6"}]).save_to_disk(
        str(tmp_path / "ds")
    )
    assert [p.prompt for p in read_preferences(tmp_path / "ds").pairs] == ["2+2?", "3+3?"]
    datasets.DatasetDict({"train": datasets.Dataset.from_list([GOOD])}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(DataError, match="DatasetDict .*pass one split folder: train"):
        read_preferences(tmp_path / "dd")


def test_unknown_file_type_and_missing_file(tmp_path):
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported preference file type '.csv'"):
        read_preferences(tmp_path / "x.csv")
    with pytest.raises(DataError, match="does not exist"):
        read_preferences(tmp_path / "nope.jsonl")


def test_row_nested_100k_deep_is_an_invalid_row_not_a_crash(tmp_path):
    deep = '{"prompt": "p", "chosen": "a", "rejected": "b", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    shallow_enough = {**GOOD, "x": json.loads("[" * 70 + "]" * 70)}  # loads, but deeper than the limit
    path = write_jsonl(tmp_path / "deep.jsonl", [GOOD, deep, shallow_enough])
    data = read_preferences(path)
    assert [(r.where, r.reason) for r in data.invalid] == [
        (f"{path}:2", "nested deeper than 64 levels"),
        (f"{path}:3", "nested deeper than 64 levels"),
    ]
    loaded = load_preferences(path, skip_invalid=True, sidecar=tmp_path / "side.jsonl")
    assert len(loaded.pairs) == 1
    side = [json.loads(x) for x in (tmp_path / "side.jsonl").read_text().splitlines()]
    assert [s["where"] for s in side] == [f"{path}:2", f"{path}:3"]


def test_lone_surrogate_is_an_invalid_row_and_the_sidecar_still_writes(tmp_path):
    path = write_jsonl(
        tmp_path / "sur.jsonl",
        [
            GOOD,
            '{"prompt": "p", "chosen": "\\ud800", "rejected": "b"}',
            '{"prompt": "q", "chosen": "c", "rejected": "d", "\\udc00": 1}',
        ],
    )
    data = read_preferences(path)
    assert [(r.where, r.reason) for r in data.invalid] == [
        (f"{path}:2", "field 'chosen' holds a lone surrogate (not valid Unicode text)"),
        (f"{path}:3", "a key holds a lone surrogate (not valid Unicode text)"),
    ]
    with pytest.raises(DataError, match=r"sur.jsonl:2: field 'chosen' holds a lone surrogate"):
        load_preferences(path)
    load_preferences(path, skip_invalid=True, sidecar=tmp_path / "side.jsonl")
    side = [json.loads(x) for x in (tmp_path / "side.jsonl").read_text(encoding="utf-8").splitlines()]
    assert json.loads(side[0]["row"])["chosen"] == "\ud800"  # the raw line, kept exactly


def test_sidecar_escapes_text_that_utf8_cannot_encode(tmp_path):
    rows = [InvalidRow("f:1", "bad", {"chosen": "\ud800"}), InvalidRow("f:2", "bad", {"chosen": "é"})]
    write_invalid(rows, tmp_path / "side.jsonl")
    text = (tmp_path / "side.jsonl").read_text(encoding="utf-8")
    assert '"\\ud800"' in text and '"é"' in text  # only the unencodable line is ASCII-escaped
