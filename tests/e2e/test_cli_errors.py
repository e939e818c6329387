"""`tandem train` on bad input (issue 3, item 10): one line on stderr, exit code 2, no traceback, and no run
folder that looks complete (no ``summary.json``, no complete checkpoint). Where the config allows a skip
(long prompts, raising rewards), the run succeeds and the skip is counted and logged.

Most cases run in process through typer's CliRunner; a few run the real console script in a subprocess to
prove the exit code and the stderr a user sees.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from console import TANDEM
from typer.testing import CliRunner

from tandem.cli.main import app
from tandem.train.checkpoint import latest_checkpoint

HERE = Path(__file__).parent
BAD = HERE / "bad_rewards.py"
DIGITS = HERE / "digits_reward.py"
PROMPTS = ["1+1=", "2+3=", "4-1=", "9-5="]


def _config(tmp_path: Path, model_dir: Path, **sections: dict) -> Path:
    """A tiny one-step run (arith task) written to ``tmp_path/cfg.yaml``; ``sections`` update it."""
    data = {
        "run": {"output_dir": str(tmp_path / "run"), "seed": 0},
        "model": {"path": str(model_dir)},
        "data": {"task": "arith", "prompts_per_step": 2, "train_size": 8, "eval_size": 2},
        "rollout": {"n": 2, "max_new_tokens": 2},
        "trainer": {"total_steps": 1, "lr": 1e-3},
        "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
    }
    for key, value in sections.items():
        data.setdefault(key, {}).update(value)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _jsonl(path: Path, prompts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return path


def _file_data(tmp_path: Path, train: Path, reward: Path = DIGITS, fn: str = "digit_share", **extra) -> dict:
    """Sections for a run on a prompt file scored by ``reward:fn`` (no task); held-out eval only when
    ``eval_file`` is given (``eval_size: 0`` turns an eval file off too)."""
    off = {} if "eval_file" in extra else {"eval_size": 0}
    return {
        "data": {"task": None, "train_file": str(train), **off, **extra},
        "reward": {"task_reward": False, "functions": [{"path": f"{reward}:{fn}"}]},
    }


def _train(config: Path, *overrides: str):
    return CliRunner().invoke(app, ["train", str(config), *overrides, "--no-progress"])


def _assert_clean_failure(result, run_dir: Path, *fragments: str) -> str:
    """Exit 2 by a TandemError, exactly one non-empty stderr line holding ``fragments``, no complete run."""
    assert isinstance(result.exception, SystemExit), f"unexpected {result.exception!r}\n{result.output}"
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("error: "), line
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in line, (fragment, line)
    _assert_not_complete(run_dir)
    return line


def _assert_not_complete(run_dir: Path) -> None:
    assert not (run_dir / "summary.json").exists()
    assert latest_checkpoint(run_dir / "checkpoints") is None
    assert not list(run_dir.rglob("COMPLETE"))


# -- model -----------------------------------------------------------------------------------------------


def test_missing_model_folder(tmp_path, tiny_model_dir):
    missing = tmp_path / "no-such-model"
    cfg = _config(tmp_path, tiny_model_dir, model={"path": str(missing)})
    _assert_clean_failure(_train(cfg), tmp_path / "run", str(missing), "does not exist", "model.path")


def test_pickle_only_model_folder_is_refused(tmp_path, tiny_model_dir):
    folder = tmp_path / "pickled"
    folder.mkdir()
    for item in tiny_model_dir.iterdir():
        if item.suffix != ".safetensors":
            shutil.copy(item, folder / item.name)
    torch.save({"w": torch.zeros(2)}, folder / "pytorch_model.bin")
    cfg = _config(tmp_path, folder)
    _assert_clean_failure(_train(cfg), tmp_path / "run", str(folder), "pytorch_model.bin", "safetensors")


# -- data ------------------------------------------------------------------------------------------------


def test_malformed_jsonl_line_names_file_and_line(tmp_path, tiny_model_dir):
    train = tmp_path / "train.jsonl"
    train.write_text('{"prompt": "1+1="}\n\n{"prompt": "2+2=" \n{"prompt": "3+3="}\n')
    cfg = _config(tmp_path, tiny_model_dir, **_file_data(tmp_path, train))
    _assert_clean_failure(_train(cfg), tmp_path / "run", f"{train}:3:", "invalid JSON")


@pytest.mark.parametrize("content", ["", "\n  \n\n"], ids=["zero-bytes", "blank-lines"])
def test_empty_dataset(tmp_path, tiny_model_dir, content):
    train = tmp_path / "train.jsonl"
    train.write_text(content)
    cfg = _config(tmp_path, tiny_model_dir, **_file_data(tmp_path, train))
    _assert_clean_failure(_train(cfg), tmp_path / "run", str(train), "no rows")


def test_prompt_longer_than_limit_names_file_line_and_key(tmp_path, tiny_model_dir):
    train = _jsonl(tmp_path / "train.jsonl", [*PROMPTS[:2], "12345+67890=", *PROMPTS[2:]])
    cfg = _config(tmp_path, tiny_model_dir, **_file_data(tmp_path, train, max_prompt_len=8))
    line = _assert_clean_failure(_train(cfg), tmp_path / "run", f"{train}:3:", "data.max_prompt_len")
    assert "12 tokens" in line and "limit of 8" in line


def test_long_eval_prompt_is_checked_before_training(tmp_path, tiny_model_dir):
    train = _jsonl(tmp_path / "train.jsonl", PROMPTS)
    ev = _jsonl(tmp_path / "eval.jsonl", ["1+1=", "3+3=", "this prompt is too long="])
    sections = _file_data(tmp_path, train, eval_file=str(ev), max_prompt_len=8)
    cfg = _config(tmp_path, tiny_model_dir, **sections)
    _assert_clean_failure(_train(cfg), tmp_path / "run", f"{ev}:3:", "data.max_prompt_len")


def test_long_task_prompt_names_the_task_row(tmp_path, tiny_model_dir):
    cfg = _config(tmp_path, tiny_model_dir)
    result = _train(cfg, "data.max_prompt_len=3")
    _assert_clean_failure(result, tmp_path / "run", "task:arith/train:row 1", "data.max_prompt_len")


def test_long_prompts_are_skipped_counted_and_logged(tmp_path, tiny_model_dir, caplog):
    long_prompts = ["12345+67890=", "98765-43210="]
    train = _jsonl(tmp_path / "train.jsonl", [*PROMPTS[:2], *long_prompts, *PROMPTS[2:]])
    sections = _file_data(tmp_path, train, max_prompt_len=8, skip_long_prompts=True)
    cfg = _config(tmp_path, tiny_model_dir, **sections, monitor={"sample_every": 1, "num_samples": 4})
    with caplog.at_level(logging.WARNING, logger="tandem"):
        result = _train(cfg)
    assert result.exit_code == 0, result.output
    run_dir = tmp_path / "run"
    assert (run_dir / "summary.json").exists()
    assert latest_checkpoint(run_dir / "checkpoints") is not None
    assert any(
        "skipped 2 of 6 train prompts" in r.getMessage() and f"{train}:3" in r.getMessage()
        for r in caplog.records
    ), caplog.text
    samples = (run_dir / "samples.jsonl").read_text()
    assert samples and not any(p in samples for p in long_prompts)


def test_all_prompts_too_long_with_skip_is_an_error(tmp_path, tiny_model_dir):
    cfg = _config(tmp_path, tiny_model_dir)
    result = _train(cfg, "data.max_prompt_len=2", "data.skip_long_prompts=true")
    _assert_clean_failure(
        result, tmp_path / "run", "task:arith/train", "all 8 train prompts", "data.max_prompt_len"
    )


def test_unknown_task_lists_the_valid_ones(tmp_path, tiny_model_dir):
    cfg = _config(tmp_path, tiny_model_dir, data={"task": "sudoku"})
    _assert_clean_failure(_train(cfg), tmp_path / "run", "'sudoku'", "arith", "countdown", "reverse")


# -- rewards ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fn", "fragments"),
    [
        ("raises", ["raised ValueError", "reward exploded"]),
        ("wrong_length", ["returned 5 values for 4 completions"]),
        ("returns_nan", ["returned nan at index 0"]),
    ],
)
def test_bad_reward_function_is_named(tmp_path, tiny_model_dir, fn, fragments):
    train = _jsonl(tmp_path / "train.jsonl", PROMPTS)
    cfg = _config(tmp_path, tiny_model_dir, **_file_data(tmp_path, train, BAD, fn))
    _assert_clean_failure(_train(cfg), tmp_path / "run", f"reward '{fn}'", *fragments)


def test_raising_reward_with_on_error_skip_counts_and_continues(tmp_path, tiny_model_dir, caplog):
    train = _jsonl(tmp_path / "train.jsonl", ["BOOM 1+1=", "BOOM 2+2="])
    sections = _file_data(tmp_path, train, BAD, "raises_on_marked")
    sections["reward"]["on_error"] = "skip"
    cfg = _config(tmp_path, tiny_model_dir, **sections)
    with caplog.at_level(logging.WARNING, logger="tandem"):
        result = _train(cfg)
    assert result.exit_code == 0, result.output
    run_dir = tmp_path / "run"
    assert (run_dir / "summary.json").exists()
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    step1 = next(r for r in rows if r["step"] == 1)
    assert step1["reward/errors"] == 4.0  # 2 prompts x rollout.n=2, every sample raised
    assert "reward 'raises_on_marked' raised ValueError" in caplog.text


# -- config ----------------------------------------------------------------------------------------------


def test_unknown_config_key_names_file_and_line(tmp_path, tiny_model_dir):
    cfg = _config(tmp_path, tiny_model_dir)
    text = cfg.read_text().replace("  eval_size: 2\n", "  eval_size: 2\n  shuffle_buffer: 7\n")
    cfg.write_text(text)
    lineno = text.splitlines().index("  shuffle_buffer: 7") + 1
    _assert_clean_failure(
        _train(cfg), tmp_path / "run", f"{cfg}:{lineno}:", "data.shuffle_buffer", "unknown key"
    )
    assert not (tmp_path / "run").exists()  # config errors stop before the run folder is made


def test_unknown_override_key_is_named(tmp_path, tiny_model_dir):
    cfg = _config(tmp_path, tiny_model_dir)
    _assert_clean_failure(
        _train(cfg, "trainer.learning_rate=1e-3"), tmp_path / "run", "trainer.learning_rate"
    )


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("trainer.lr", "is not KEY=VALUE"),
        ("=1e-3", "empty key part"),
        ("trainer..lr=1e-3", "empty key part"),
        ("[/x]=1", "[/x]"),  # user text that looks like rich markup is printed verbatim
        ("trainer.lr.peak=1", "trainer.lr"),
    ],
)
def test_bad_override_syntax(tmp_path, tiny_model_dir, override, fragment):
    cfg = _config(tmp_path, tiny_model_dir)
    _assert_clean_failure(_train(cfg, override), tmp_path / "run", fragment)


def test_invalid_yaml_names_file_and_line(tmp_path, tiny_model_dir):
    cfg = _config(tmp_path, tiny_model_dir)
    lines = cfg.read_text().splitlines()
    at = lines.index("trainer:") + 1
    lines[at] = "  total_steps: [1"
    cfg.write_text("\n".join(lines) + "\n")
    line = _assert_clean_failure(_train(cfg), tmp_path / "run", "invalid YAML", f"{cfg}:")
    reported = int(line.split(f"{cfg}:")[1].split(":")[0])
    assert at + 1 <= reported <= at + 2, line  # the flow sequence opens on line at+1; YAML notices by at+2


def test_missing_config_file(tmp_path):
    result = _train(tmp_path / "nope.yaml")
    _assert_clean_failure(result, tmp_path / "run", "nope.yaml", "not found")


# -- the real console script -----------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["invalid-yaml", "malformed-jsonl", "reward-nan"])
def test_console_script_exit_code_and_single_stderr_line(tmp_path, tiny_model_dir, case):
    train = _jsonl(tmp_path / "train.jsonl", PROMPTS)
    if case == "malformed-jsonl":
        train.write_text('{"prompt": "1+1="}\n{"prompt": \n')
    fn = "returns_nan" if case == "reward-nan" else "digit_share"
    cfg = _config(
        tmp_path, tiny_model_dir, **_file_data(tmp_path, train, BAD if fn == "returns_nan" else DIGITS, fn)
    )
    if case == "invalid-yaml":
        cfg.write_text(cfg.read_text().replace("rollout:\n", "rollout: [\n", 1))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
    proc = subprocess.run(
        [*TANDEM, "train", str(cfg), "--no-progress"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    expected = {
        "invalid-yaml": f"{cfg}:",
        "malformed-jsonl": f"{train}:2:",
        "reward-nan": "reward 'returns_nan' returned nan",
    }[case]
    assert expected in lines[0]
    _assert_not_complete(tmp_path / "run")
