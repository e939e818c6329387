"""``tandem distill`` and the deployment path of docs/distillation.md on tiny models: distil a teacher
into a smaller student, export it as INT8, serve the export, A/B the INT8 student against the teacher;
plus the command's one-line errors, each leaving nothing written."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tandem.cli.main import app
from tandem.models import init_tiny_model, load_causal_lm

TASK = ["--task", "arith", "--task-option", "digits=1", "--task-option", "ops=+"]


def _run(*argv: str):
    return CliRunner().invoke(app, list(argv))


def test_distill_export_serve_abtest(tiny_model_dir, tmp_path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from tandem.serve.server import build_state, make_app
    from tandem.serve.state import ServeSettings

    student, targets, int8 = tmp_path / "student", tmp_path / "targets.safetensors", tmp_path / "int8"
    argv = ["distill", str(tiny_model_dir), "--student", "hidden_size=16,num_heads=2", *TASK]
    argv += [
        "--train-size",
        "48",
        "--generate",
        "--max-new-tokens",
        "3",
        "--steps",
        "3",
        "--batch-size",
        "16",
    ]
    argv += ["--temperature", "2", "--sft-weight", "0.5", "--targets", str(targets), "--out", str(student)]
    result = _run(*argv)
    assert result.exit_code == 0, result.output
    assert "distilled: kl" in result.output
    teacher_params = sum(p.numel() for p in load_causal_lm(tiny_model_dir).parameters())
    assert sum(p.numel() for p in load_causal_lm(student).parameters()) < teacher_params / 2
    assert 0 < targets.stat().st_size < 64_000  # top-k targets stay small
    again = _run(*argv[:-1], str(tmp_path / "student2"))  # the stored targets are read back
    assert again.exit_code == 0, again.output
    assert "teacher top-k logits" not in again.output

    exported = _run("export", str(student), "--format", "int8", "--out", str(int8), *TASK, "--eval-size", "4")
    assert exported.exit_code == 0, exported.output

    state = build_state({"main": str(int8)}, ServeSettings(max_batch_size=4, max_wait_ms=5), name="student")
    with TestClient(make_app(state)) as client:
        reply = client.post("/v1/completions", json={"model": "student", "prompt": "1+2=", "max_tokens": 3})
    assert reply.status_code == 200, reply.text
    assert isinstance(reply.json()["choices"][0]["text"], str)

    decision = tmp_path / "decision.json"
    ab = _run("abtest", str(tiny_model_dir), str(int8), *TASK, "--size", "8", "--max-new-tokens", "3",
              "--json", str(decision))  # fmt: skip
    assert ab.exit_code in (0, 1), ab.output  # 0 promotes the student, 1 keeps the teacher
    assert "promote" in json.loads(decision.read_text())["decision"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--student", "hidden_size=16,depth=2"], "--student: unknown size key 'depth'"),
        (["--student", "hidden_size=15"], "--student: hidden_size 15 is not a multiple of num_heads"),
        (["--student", "hidden_size=16", "--sft-weight", "2"], "--sft-weight: must be within [0, 1]"),
        (["--student", "hidden_size=16", "--temperature", "0"], "--temperature: must be > 0"),
        (["--student", "hidden_size=16", "--targets", "t.bin"], "--targets: t.bin must end in .safetensors"),
    ],
)
def test_bad_options_are_one_line_and_write_nothing(tiny_model_dir, tmp_path, extra, message):
    out = tmp_path / "student"
    result = _run("distill", str(tiny_model_dir), *extra, *TASK, "--steps", "1", "--out", str(out))
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.output
    assert not out.exists()


def test_a_student_with_another_tokenizer_is_refused(tiny_model_dir, tmp_path):
    other = init_tiny_model(
        tmp_path / "other", hidden_size=16, num_layers=1, num_heads=2, chars="0123456789+="
    )
    out = tmp_path / "student"
    result = _run("distill", str(tiny_model_dir), "--student", str(other), *TASK, "--out", str(out))
    assert result.exit_code == 2
    assert "--student: the teacher's tokenizer differs from the student's" in result.output
    assert not out.exists()


def test_the_teacher_folder_is_never_the_output(tiny_model_dir):
    result = _run(
        "distill", str(tiny_model_dir), "--student", "hidden_size=16", *TASK, "--out", str(tiny_model_dir)
    )
    assert result.exit_code == 2 and "--out" in result.output


def test_help_names_the_options():
    result = _run("distill", "--help")
    assert result.exit_code == 0
    for option in ("--student", "--top-k", "--temperature", "--sft-weight", "--generate", "--targets"):
        assert option in result.output
