"""`tandem data` on hostile or broken preference files: every bad row listed as file:line: reason
(capped), exit 2; rows nested 100k deep or holding a lone surrogate are invalid rows, never a traceback,
in validate, --skip-invalid, split and dedup."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tandem.cli.main import app

runner = CliRunner()
GOOD = [{"prompt": f"p{i}", "chosen": f"good answer {i}", "rejected": f"bad {i}"} for i in range(3)]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def write(path, lines):
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def test_validate_names_all_four_bad_rows_and_exits_2(tmp_path):
    bad = write(
        tmp_path / "prefs.jsonl",
        [
            GOOD[0],
            {"prompt": "p", "chosen": "same", "rejected": "same"},
            "not json",
            GOOD[1],
            {"prompt": "p", "rejected": "r"},
            {"prompt": "p", "chosen": "c", "rejected": "r", "margin": "big"},
            GOOD[2],
        ],
    )
    result = invoke("data", "validate", bad)
    assert result.exit_code == 2
    for line, reason in [
        (2, "'chosen' and 'rejected' are identical"),
        (3, "invalid JSON"),
        (5, "missing field 'chosen'"),
        (6, "'margin' must be a finite number"),
    ]:
        assert f"{bad}:{line}: {reason}" in result.output
    assert f"{bad}: 4 invalid rows, 3 valid pairs" in result.output and "Traceback" not in result.output
    ok = write(tmp_path / "ok.jsonl", GOOD)
    result = invoke("data", "validate", ok)
    assert result.exit_code == 0 and "3 valid pairs, 0 invalid rows" in result.output


def test_validate_caps_the_listing_at_50_and_counts_the_rest(tmp_path):
    bad = write(tmp_path / "many.jsonl", [GOOD[0]] + ["{"] * 60)
    result = invoke("data", "validate", bad)
    listed = [x for x in result.output.splitlines() if x.startswith(f"{bad}:") and "invalid JSON" in x]
    assert result.exit_code == 2 and len(listed) == 50
    assert listed[0].startswith(f"{bad}:2:") and listed[-1].startswith(f"{bad}:51:")
    assert "… and 10 more invalid rows" in result.output


def test_deep_and_surrogate_rows_are_invalid_rows_in_every_data_command(tmp_path):
    deep = '{"prompt": "p", "chosen": "a", "rejected": "b", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    lone = '{"prompt": "p", "chosen": "\\ud800", "rejected": "b"}'
    path = write(tmp_path / "hostile.jsonl", [*GOOD, deep, lone])
    result = invoke("data", "validate", path)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"{path}:4: nested deeper than 64 levels" in result.output
    assert f"{path}:5: field 'chosen' holds a lone surrogate" in result.output
    result = invoke("data", "validate", path, "--skip-invalid")
    assert result.exit_code == 0 and "3 valid pairs, 2 invalid rows" in result.output
    assert len((tmp_path / "hostile.invalid.jsonl").read_text(encoding="utf-8").splitlines()) == 2
    result = invoke("data", "split", path, "--out-dir", tmp_path / "split", "--skip-invalid")
    assert result.exit_code == 0, result.output
    result = invoke("data", "dedup", path, "--out", tmp_path / "dd.jsonl", "--skip-invalid")
    assert result.exit_code == 0 and "kept 3 of 3 pairs" in result.output
    result = invoke("data", "split", path, "--out-dir", tmp_path / "split2")
    assert result.exit_code == 2 and f"{path}:4: nested deeper than 64 levels" in result.output
