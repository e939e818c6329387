"""Loading and saving HF folders: Auto classes load the tiny model offline; bad folders give ModelError."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from tandem.errors import ConfigError, ModelError
from tandem.models import build_char_tokenizer, load_causal_lm, load_tokenizer, save_pretrained_atomic


def test_auto_classes_load_tiny_model_offline(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir, local_files_only=True)
    assert model.config.model_type == "llama"
    assert model.config.vocab_size == len(tok)
    text = "12 + 7 = 19\n ok "
    assert tok.decode(tok(text).input_ids, skip_special_tokens=True) == text
    assert tok.padding_side == "left" and tok.pad_token_id == 0
    assert (tiny_model_dir / "model.safetensors").is_file()


def test_load_causal_lm_dtype_and_tokenizer(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir, dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16
    tok = load_tokenizer(tiny_model_dir)
    assert tok.padding_side == "left" and tok.pad_token_id == 0


def test_missing_folder_names_path(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ModelError, match="does not exist") as err:
        load_causal_lm(missing)
    assert str(missing) in str(err.value)
    with pytest.raises(ModelError, match="does not exist"):
        load_tokenizer(missing)


def test_missing_config_json(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelError, match="config.json") as err:
        load_causal_lm(tmp_path)
    assert str(tmp_path) in str(err.value)


def test_pickle_only_folder_refused(tmp_path, tiny_model_dir):
    (tmp_path / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    torch.save({"w": torch.zeros(1)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ModelError, match="convert to safetensors") as err:
        load_causal_lm(tmp_path)
    assert "pytorch_model.bin" in str(err.value) and str(tmp_path) in str(err.value)
    assert "\n" not in str(err.value)


def test_unknown_dtype(tiny_model_dir):
    with pytest.raises(ModelError, match="unknown dtype"):
        load_causal_lm(tiny_model_dir, dtype="float8")


def test_pad_token_falls_back_to_eos(tmp_path):
    backend = build_char_tokenizer("ab").backend_tokenizer
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", unk_token="<unk>")
    tok.save_pretrained(tmp_path)
    loaded = load_tokenizer(tmp_path)
    assert loaded.pad_token_id == loaded.eos_token_id == 2
    assert loaded.padding_side == "left"


def test_save_atomic_replaces_an_earlier_model_folder(tmp_path, tiny_model_dir):
    model = load_causal_lm(tiny_model_dir)
    tok = load_tokenizer(tiny_model_dir)
    out = tmp_path / "ckpt"
    save_pretrained_atomic(model, tok, out)  # a Tandem model folder (tandem_model.json)
    (out / "stale.txt").write_text("old")
    with torch.no_grad():
        model.model.norm.weight.fill_(0.5)
    save_pretrained_atomic(model, tok, out)
    assert not (out / "stale.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temp or old siblings left
    reloaded = load_causal_lm(out)
    assert torch.equal(reloaded.model.norm.weight, torch.full_like(reloaded.model.norm.weight, 0.5))
    assert json.loads((out / "tokenizer_config.json").read_text())["padding_side"] == "left"


def test_failed_save_leaves_old_folder_intact(tmp_path, tiny_model_dir, monkeypatch):
    model = load_causal_lm(tiny_model_dir)
    tok = load_tokenizer(tiny_model_dir)
    out = tmp_path / "ckpt"
    save_pretrained_atomic(model, tok, out)
    before = sorted(p.name for p in out.iterdir())

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(tok, "save_pretrained", boom)
    with pytest.raises(OSError, match="disk full"):
        save_pretrained_atomic(model, tok, out)
    assert sorted(p.name for p in out.iterdir()) == before
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_save_pretrained_atomic_refuses_an_unrelated_folder(tmp_path, tiny_model_dir):
    model, tok = load_causal_lm(tiny_model_dir), load_tokenizer(tiny_model_dir)
    precious = tmp_path / "photos"
    precious.mkdir()
    (precious / "cat.jpg").write_bytes(b"\xff\xd8")
    with pytest.raises(ConfigError, match="is not empty and not a Tandem model folder"):
        save_pretrained_atomic(model, tok, precious)
    assert [p.name for p in tmp_path.iterdir()] == ["photos"]  # no temp sibling left
    assert [p.name for p in precious.iterdir()] == ["cat.jpg"]


def test_save_pretrained_atomic_refuses_its_source_and_marks_its_output(tmp_path, tiny_model_dir):
    model, tok = load_causal_lm(tiny_model_dir), load_tokenizer(tiny_model_dir)
    with pytest.raises(ConfigError, match=r"is \(or holds\) the source folder"):
        save_pretrained_atomic(model, tok, tiny_model_dir, source=tiny_model_dir)
    out = save_pretrained_atomic(model, tok, tmp_path / "sft", created_by="tandem sft", source=tiny_model_dir)
    marker = json.loads((out / "tandem_model.json").read_text())
    assert marker == {"kind": "model", "created_by": "tandem sft", "source": str(tiny_model_dir)}
