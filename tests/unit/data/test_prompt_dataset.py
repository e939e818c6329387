"""Prompt datasets: JSONL and Parquet loading, conversational prompts, and located errors."""

from __future__ import annotations

import json
import re
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tandem.data import PromptDataset, check_prompt_lengths, load_prompt_dataset, rows_from_task
from tandem.errors import DataError, MissingDependencyError
from tandem.rewards.tasks import get_task

CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]


def write_lines(tmp_path, lines: list[str], name: str = "data.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_jsonl_keeps_extras_chat_prompts_and_locations(tmp_path):
    path = write_lines(
        tmp_path,
        [
            json.dumps({"prompt": "1+1=", "answer": "2"}),
            "",
            "   ",
            json.dumps({"prompt": CHAT, "answer": "4", "source": "x"}),
        ],
    )
    ds = load_prompt_dataset(path)
    assert len(ds) == 2 and ds.prompts == ["1+1=", CHAT]
    assert ds.columns == ["prompt", "answer", "source"]
    assert ds.column("source") == [None, "x"]
    assert ds.locations == [f"{path}:1", f"{path}:4"]
    assert ds[1]["prompt"] is not None and list(ds)[0]["answer"] == "2"


def test_json_suffix_is_read_as_lines(tmp_path):
    ds = load_prompt_dataset(write_lines(tmp_path, ['{"prompt": "a"}'], name="d.json"))
    assert ds.prompts == ["a"]


@pytest.mark.parametrize(
    ("lines", "line", "message"),
    [
        (
            ['{"prompt": "a"}', '{"prompt": "b",}'],
            2,
            "invalid JSON (Expecting property name enclosed in double quotes at column 16)",
        ),
        (['{"prompt": "a"}', "[1, 2]"], 2, "expected a JSON object, got an array"),
        (['"just text"'], 1, "expected a JSON object, got a string"),
        (['{"prompt": "a"}', "", '{"question": "b"}'], 3, "missing 'prompt' column (columns here: question)"),
        (['{"prompt": ""}'], 1, "empty 'prompt'"),
        (['{"prompt": "  "}'], 1, "empty 'prompt'"),
        (['{"prompt": 3}'], 1, "'prompt' must be a string or a list of {role, content} messages, got int"),
        (['{"prompt": null}'], 1, "got null"),
        (['{"prompt": []}'], 1, "empty 'prompt' (no messages)"),
        (['{"prompt": [{"role": "user"}]}'], 1, "'prompt'[0] must be an object with 'role' and 'content'"),
        (['{"prompt": ["hi"]}'], 1, "'prompt'[0] must be an object"),
        (
            ['{"prompt": [{"role": "user", "content": 1}]}'],
            1,
            "'prompt'[0].content must be a string, got int",
        ),
        (['{"prompt": [{"role": "", "content": "x"}]}'], 1, "'prompt'[0].role is empty"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path, lines, line, message):
    path = write_lines(tmp_path, lines)
    with pytest.raises(DataError) as info:
        load_prompt_dataset(path)
    text = str(info.value)
    assert text.startswith(f"{path}:{line}: ") and message in text and "\n" not in text


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ('{"prompt": "a", "x": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested deeper than 64 levels"),
        ('{"prompt": "a", "x": ' + "[" * 70 + "]" * 70 + "}", "nested deeper than 64 levels"),
        ('{"prompt": "1+1=\\ud800"}', "field 'prompt' holds a lone surrogate"),
    ],
    ids=["100k-deep", "70-deep", "lone-surrogate"],
)
def test_prompt_row_nested_too_deep_or_with_a_lone_surrogate_names_file_and_line(tmp_path, bad, message):
    path = write_lines(tmp_path, ['{"prompt": "ok"}', bad])
    with pytest.raises(DataError) as info:
        load_prompt_dataset(path)
    assert str(info.value).startswith(f"{path}:2: {message}")


def test_json_array_file_gets_a_hint(tmp_path):
    path = write_lines(tmp_path, ['[{"prompt": "a"},', ' {"prompt": "b"}]'], name="d.json")
    with pytest.raises(DataError, match=re.escape(f"{path}:1: invalid JSON") + r".*one JSON object per line"):
        load_prompt_dataset(path)


def test_non_utf8_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n{"prompt": "\xff"}\n')
    with pytest.raises(DataError, match=re.escape(f"{path}:2: not UTF-8")):
        load_prompt_dataset(path)


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_file(tmp_path, content):
    path = tmp_path / "d.jsonl"
    path.write_text(content)
    with pytest.raises(DataError, match=re.escape(f"{path}: no rows")):
        load_prompt_dataset(path)


def test_missing_file_directory_and_suffix(tmp_path):
    with pytest.raises(DataError, match=re.escape(f"{tmp_path / 'nope.jsonl'}: file not found")):
        load_prompt_dataset(tmp_path / "nope.jsonl")
    with pytest.raises(DataError, match="not a file"):
        load_prompt_dataset(tmp_path)
    (tmp_path / "d.csv").write_text("prompt\na\n")
    with pytest.raises(DataError, match=r"unsupported file type '\.csv'.*\.jsonl, \.json, \.parquet"):
        load_prompt_dataset(tmp_path / "d.csv")


def test_parquet_round_trip_with_chat_prompts(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"prompt": [CHAT, CHAT[1:]], "answer": ["4", "4"]}), path)
    ds = load_prompt_dataset(path)
    assert ds.prompts == [CHAT, CHAT[1:]] and ds.columns == ["prompt", "answer"]
    assert ds.locations == [f"{path}:row 1", f"{path}:row 2"]


def test_parquet_errors(tmp_path):
    no_prompt = tmp_path / "a.parquet"
    pq.write_table(pa.table({"question": ["x"]}), no_prompt)
    with pytest.raises(DataError, match=re.escape(f"{no_prompt}: no 'prompt' column (columns: question)")):
        load_prompt_dataset(no_prompt)
    bad_row = tmp_path / "b.parquet"
    pq.write_table(pa.table({"prompt": ["ok", ""]}), bad_row)
    with pytest.raises(DataError, match=re.escape(f"{bad_row}:row 2: empty 'prompt'")):
        load_prompt_dataset(bad_row)
    empty = tmp_path / "c.parquet"
    pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), empty)
    with pytest.raises(DataError, match=re.escape(f"{empty}: no rows")):
        load_prompt_dataset(empty)
    garbage = tmp_path / "d.parquet"
    garbage.write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=re.escape(f"{garbage}: cannot read Parquet")):
        load_prompt_dataset(garbage)


def test_parquet_without_pyarrow_names_the_extra(tmp_path, monkeypatch):
    path = tmp_path / "d.parquet"
    path.write_bytes(b"")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(MissingDependencyError, match=re.escape("tandem-rl[data]")):
        load_prompt_dataset(path)


def test_rows_from_task_and_from_rows_validation():
    ds = rows_from_task(get_task("reverse"), "test", 5, seed=1)
    assert isinstance(ds, PromptDataset) and len(ds) == 5 and ds.columns == ["prompt", "answer"]
    assert ds.source == "task:reverse/test" and ds.locations[4] == "task:reverse/test:row 5"
    with pytest.raises(DataError, match=re.escape("task:reverse/train: no rows")):
        rows_from_task(get_task("reverse"), "train", 0, seed=1)
    with pytest.raises(DataError, match=re.escape("mine:row 2: expected a row object, got str")):
        PromptDataset.from_rows([{"prompt": "a"}, "b"], source="mine")


def test_check_prompt_lengths_names_the_row_and_key(tmp_path):
    path = write_lines(tmp_path, ['{"prompt": "a"}', '{"prompt": "bbbbbb"}'])
    ds = load_prompt_dataset(path)
    check_prompt_lengths(ds, [1, 6], limit=6, key="rollout.max_prompt_len")
    with pytest.raises(DataError) as info:
        check_prompt_lengths(ds, [1, 6], limit=5, key="rollout.max_prompt_len")
    assert str(info.value) == (
        f"{path}:2: prompt is 6 tokens, longer than the limit of 5 (shorten it or raise rollout.max_prompt_len)"
    )
