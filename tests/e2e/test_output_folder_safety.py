"""Commands that write a model folder (`init-model`, `sft`, `rm`, `dpo`, warm starts, `export` to s3://)
never lose data: an unrelated folder, another kind's output, or the folder they read from (or one
holding it) is refused with one line naming the path, exit 2, before any training and with nothing
written; an earlier output of the same kind is replaced atomically."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tandem.cli.main import app
from tandem.data.outputs import EXPORT_MARKER, MODEL_MARKER, REWARD_MARKER
from tandem.errors import ConfigError

PAIRS = [{"prompt": f"q{i}?", "chosen": "yes", "rejected": "no"} for i in range(8)]


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def _precious(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "thesis.tex").write_text("years of work")
    return folder


def _untouched(folder: Path) -> bool:
    """The folder holds only what _precious put there, and no temp sibling was left beside it."""
    siblings = [p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}.")]
    return [p.name for p in folder.iterdir()] == ["thesis.tex"] and not siblings


def _refused(result, path: Path | str, what: str, *, remote: bool = False) -> bool:
    """Exit 2 with the one-line error naming ``path``. (With an s3 server in this process, its request
    logger may write unrelated "Logging error" tracebacks into the captured output: not checked there.)"""
    clean = remote or "Traceback" not in result.output
    return result.exit_code == 2 and f"{path} {what}" in result.output and clean


def _sft(model, out, *extra):
    return invoke("sft", model, "--task", "arith", "--steps", "1", "--batch-size", "2", "--train-size", "4",
                  "--out", out, *extra)  # fmt: skip


def _rlhf_config(tmp_path: Path, model: Path | str, out: Path | str, **extra) -> Path:
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in PAIRS))
    cfg = tmp_path / "rlhf.yaml"
    body = {"model": str(model), "out_dir": str(out), "data": {"train_file": str(data), "val_fraction": 0.25}}
    cfg.write_text(yaml.safe_dump(body | {"batch_size": 4} | extra))
    return cfg


def test_init_model_out_refuses_an_unrelated_folder(tmp_path):
    precious = _precious(tmp_path / "models")
    result = invoke("init-model", precious, "--hidden-size", "16", "--num-layers", "1", "--num-heads", "1")
    assert _refused(result, precious, "is not empty and not a Tandem model folder"), result.output
    assert "OUT:" in result.output and _untouched(precious)


def test_init_model_out_replaces_an_earlier_model_folder(tmp_path):
    out = tmp_path / "tiny"
    args = ("--hidden-size", "16", "--num-layers", "1", "--num-heads", "1")
    assert invoke("init-model", out, *args).exit_code == 0
    (out / "stale.txt").write_text("from the first one")
    result = invoke("init-model", out, *args, "--seed", "1")
    assert result.exit_code == 0, result.output
    assert not (out / "stale.txt").exists() and (out / "config.json").is_file()
    assert json.loads((out / MODEL_MARKER).read_text())["created_by"] == "tandem init-model"
    assert [p.name for p in tmp_path.iterdir()] == ["tiny"]


def test_sft_out_refuses_an_unrelated_folder(tmp_path, tiny_model_dir):
    precious = _precious(tmp_path / "out")
    result = _sft(tiny_model_dir, precious)
    assert _refused(result, precious, "is not empty and not a Tandem model folder"), result.output
    assert "--out:" in result.output and "SFT done" not in result.output and _untouched(precious)


def test_sft_out_refuses_its_starting_model_and_a_folder_holding_it(tmp_path, tiny_model_dir):
    model = tmp_path / "models" / "tiny"
    shutil.copytree(tiny_model_dir, model)  # a Tandem model folder, but the one sft reads
    (model / "README.md").write_text("model card")
    for out in (model, model.parent):
        result = _sft(model, out)
        assert _refused(result, out, "is (or holds) the source folder"), result.output
    assert (model / "README.md").read_text() == "model card"


def test_sft_out_refuses_an_export_folder(tmp_path, tiny_model_dir):
    export = tmp_path / "exp"
    export.mkdir()
    (export / EXPORT_MARKER).write_text(json.dumps({"format": "onnx"}))
    (export / "model.onnx").write_bytes(b"graph")
    result = _sft(tiny_model_dir, export)
    assert _refused(result, export, f"is not empty and not a Tandem model folder (no {MODEL_MARKER})")
    assert sorted(p.name for p in export.iterdir()) == ["model.onnx", EXPORT_MARKER]


def test_sft_out_replaces_an_earlier_tandem_model_folder(tmp_path, tiny_model_dir):
    out = tmp_path / "sft"
    assert _sft(tiny_model_dir, out).exit_code == 0
    (out / "stale.txt").write_text("from the first run")
    result = _sft(tiny_model_dir, out)
    assert result.exit_code == 0, result.output
    marker = json.loads((out / MODEL_MARKER).read_text())
    assert marker == {"kind": "model", "created_by": "tandem sft", "source": str(tiny_model_dir)}
    assert not (out / "stale.txt").exists() and [p.name for p in tmp_path.iterdir()] == ["sft"]


def test_rm_out_dir_refuses_an_unrelated_folder(tmp_path, tiny_model_dir):
    precious = _precious(tmp_path / "out")
    result = invoke("rm", _rlhf_config(tmp_path, tiny_model_dir, precious))
    assert _refused(result, precious, "is not empty and not a Tandem reward-model folder"), result.output
    assert "out_dir:" in result.output and "train /" not in result.output and _untouched(precious)


def test_rm_out_dir_refuses_its_starting_model(tmp_path, tiny_model_dir):
    result = invoke("rm", _rlhf_config(tmp_path, tiny_model_dir, tiny_model_dir))
    assert _refused(result, tiny_model_dir, "is (or holds) the source folder"), result.output
    assert not (tiny_model_dir / REWARD_MARKER).exists()


def test_rm_out_dir_replaces_an_earlier_reward_model_but_not_a_policy(tmp_path, tiny_model_dir):
    out = tmp_path / "rm"
    cfg = _rlhf_config(tmp_path, tiny_model_dir, out, epochs=1)
    assert invoke("rm", cfg).exit_code == 0
    (out / "stale.txt").write_text("from the first run")
    result = invoke("rm", cfg)
    assert result.exit_code == 0, result.output
    assert not (out / "stale.txt").exists() and (out / REWARD_MARKER).is_file()
    policy = tmp_path / "policy"
    shutil.copytree(tiny_model_dir, policy)
    result = invoke("rm", _rlhf_config(tmp_path, tiny_model_dir, policy))
    assert _refused(result, policy, "is not empty and not a Tandem reward-model folder"), result.output


def test_dpo_out_dir_refuses_an_unrelated_folder(tmp_path, tiny_model_dir):
    precious = _precious(tmp_path / "out")
    result = invoke("dpo", _rlhf_config(tmp_path, tiny_model_dir, precious, max_steps=1))
    assert _refused(result, precious, "is not empty and not a Tandem model folder"), result.output
    assert _untouched(precious) and not list(tmp_path.glob("out.ref_logps*"))


def test_dpo_out_dir_refuses_its_reference_model(tmp_path, tiny_model_dir):
    ref = tmp_path / "ref"
    shutil.copytree(tiny_model_dir, ref)
    cfg = _rlhf_config(tmp_path, tiny_model_dir, ref, max_steps=1, ref_model=str(ref))
    result = invoke("dpo", cfg)
    assert _refused(result, ref, "is (or holds) the source folder"), result.output


def test_dpo_out_dir_replaces_an_earlier_policy(tmp_path, tiny_model_dir):
    out = tmp_path / "dpo"
    cfg = _rlhf_config(tmp_path, tiny_model_dir, out, max_steps=1)
    assert invoke("dpo", cfg).exit_code == 0
    (out / "stale.txt").write_text("from the first run")
    result = invoke("dpo", cfg)
    assert result.exit_code == 0, result.output
    assert json.loads((out / MODEL_MARKER).read_text())["created_by"] == "tandem dpo"
    assert not (out / "stale.txt").exists()


def test_warm_start_refuses_an_unrelated_folder_at_its_base_path(tmp_path):
    from tandem.train.sft import build_warm_start

    precious = _precious(tmp_path / "ws.base")  # where the warm start builds (then deletes) its base model
    with pytest.raises(ConfigError, match="ws.base is not empty and not a Tandem model folder"):
        build_warm_start(tmp_path / "ws", task="arith", steps=1, batch_size=2, train_size=4)
    assert _untouched(precious) and not (tmp_path / "ws").exists()


def test_export_out_s3_refuses_an_unrelated_remote_folder(s3, tiny_model_dir):
    s3.pipe("prefs/outputs-e2e/photos/cat.jpg", b"\xff\xd8")
    url = "s3://prefs/outputs-e2e/photos"
    result = invoke("export", tiny_model_dir, "--format", "hf", "--out", url)
    assert _refused(result, url, "is not empty and not a Tandem export folder", remote=True), result.output
    assert s3.find("prefs/outputs-e2e/photos") == ["prefs/outputs-e2e/photos/cat.jpg"]


def test_export_out_s3_replaces_an_earlier_remote_export(s3, tiny_model_dir):
    url = "s3://prefs/outputs-e2e/exp"
    assert invoke("export", tiny_model_dir, "--format", "hf", "--out", url).exit_code == 0
    s3.pipe("prefs/outputs-e2e/exp/stale.onnx", b"from an earlier export")
    result = invoke("export", tiny_model_dir, "--format", "hf", "--out", url)
    assert result.exit_code == 0, result.output
    names = {p.rsplit("/", 1)[-1] for p in s3.find("prefs/outputs-e2e/exp")}
    assert "stale.onnx" not in names and {EXPORT_MARKER, "config.json", "model.safetensors"} <= names


def test_rm_out_dir_s3_refuses_an_unrelated_remote_folder(s3, tmp_path, tiny_model_dir):
    s3.pipe("prefs/outputs-e2e/notes/a.txt", b"keep")
    url = "s3://prefs/outputs-e2e/notes"
    result = invoke("rm", _rlhf_config(tmp_path, tiny_model_dir, url))
    assert _refused(result, url, "is not empty and not a Tandem reward-model folder", remote=True), (
        result.output
    )
    assert s3.find("prefs/outputs-e2e/notes") == ["prefs/outputs-e2e/notes/a.txt"]
