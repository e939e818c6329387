"""``init_model``: the char/Llama default is ``init_tiny_model`` bit for bit; Qwen2 and Llama folders with a
BPE tokenizer load offline through transformers' Auto classes and Tandem's loaders, encode like the
tokenizer they were built with, run a forward and stop on both EOS and ``<|im_end|>``; sizes reach
~100M parameters; the CLI builds them and refuses bad options in one line."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from tandem.cli.main import app
from tandem.errors import ConfigError, ModelError
from tandem.models import init_model, init_tiny_model, load_causal_lm, load_tokenizer
from tandem.models.bpe import build_bpe_tokenizer, task_corpus
from tandem.models.tiny import small_model_config

SMALL = {"hidden_size": 64, "num_layers": 2, "num_heads": 2}  # head size 32, as vLLM's CPU kernels need
MESSAGES = [{"role": "user", "content": "12+7="}]


@pytest.fixture(scope="module")
def bpe_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("bpe")
    return {arch: init_model(root / arch, arch=arch, tokenizer="bpe", **SMALL) for arch in ("qwen2", "llama")}


def test_char_llama_default_is_init_tiny_model_bit_for_bit(tmp_path):
    a = init_tiny_model(tmp_path / "a", **SMALL, seed=3)
    b = init_model(tmp_path / "b", **SMALL, seed=3)
    for name in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_bpe_folder_loads_with_auto_classes_and_tandem_loaders(bpe_folders, arch):
    path = bpe_folders[arch]
    assert AutoConfig.from_pretrained(path, local_files_only=True).model_type == arch
    auto_model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    auto_tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model, tok = load_causal_lm(path), load_tokenizer(path)
    assert type(model) is type(auto_model) and tok.padding_side == "left" and tok.pad_token == "<|pad|>"
    built = build_bpe_tokenizer(style={"qwen2": "qwen2", "llama": "llama3"}[arch])
    for line in list(task_corpus(rows_per_task=16)) + ["Héllo 日本 <|im_end|> 1234567"]:
        assert tok(line).input_ids == built(line).input_ids == auto_tok(line).input_ids
    batch = tok.apply_chat_template(
        MESSAGES, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        logits = model(**batch).logits  # [1, T, V]
    assert logits.shape == (1, batch["input_ids"].shape[1], len(tok)) and torch.isfinite(logits).all()


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_generation_stops_on_eos_and_im_end(bpe_folders, arch):
    model = load_causal_lm(bpe_folders[arch])
    tok = load_tokenizer(bpe_folders[arch])
    assert model.generation_config.eos_token_id == [tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")]
    assert model.config.vocab_size == len(tok) and model.config.tie_word_embeddings


def test_qwen2_has_qkv_biases_and_grouped_query_attention(tmp_path):
    path = init_model(tmp_path / "q", arch="qwen2", tokenizer="bpe", vocab_size=300, num_kv_heads=2, **SMALL)
    model = load_causal_lm(path)
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.bias is not None and attn.k_proj.out_features == 2 * 32
    assert model.config.vocab_size == 300


@pytest.mark.parametrize(
    ("arch", "sizes", "lo", "hi"),
    [
        ("qwen2", {"hidden_size": 128, "num_layers": 4, "num_heads": 4}, 0.9e6, 1.3e6),
        ("llama", {"hidden_size": 768, "num_layers": 12, "num_heads": 12}, 90e6, 130e6),
        (
            "qwen2",
            {"hidden_size": 640, "num_layers": 16, "num_heads": 10, "intermediate_size": 2048},
            80e6,
            110e6,
        ),
    ],
)
def test_sizes_from_one_to_a_hundred_million_parameters(arch, sizes, lo, hi):
    config = small_model_config(arch, 512, **sizes)
    with torch.device("meta"):  # count without allocating
        model = AutoModelForCausalLM.from_config(config)
    assert lo <= sum(p.numel() for p in model.parameters()) <= hi


def test_bad_options_are_model_errors(tmp_path):
    with pytest.raises(ModelError, match="unknown architecture 'gpt2'"):
        init_model(tmp_path / "x", arch="gpt2", tokenizer="bpe")
    with pytest.raises(ModelError, match="unknown tokenizer 'wordpiece'"):
        init_model(tmp_path / "x", tokenizer="wordpiece")
    with pytest.raises(ModelError, match="a qwen2 model needs --tokenizer bpe"):
        init_model(tmp_path / "x", arch="qwen2", tokenizer="char")
    with pytest.raises(ConfigError, match="not a multiple of num_kv_heads 3"):
        init_model(tmp_path / "x", tokenizer="bpe", num_kv_heads=3)
    assert not (tmp_path / "x").exists()


def test_cli_builds_a_qwen2_bpe_model_and_refuses_a_bad_arch(tmp_path):
    args = ["--hidden-size", "64", "--num-layers", "1", "--num-heads", "2", "--intermediate-size", "96"]
    result = CliRunner().invoke(
        app, ["init-model", str(tmp_path / "m"), "--arch", "qwen2", "--tokenizer", "bpe", *args]
    )
    assert result.exit_code == 0, result.output
    config = AutoConfig.from_pretrained(tmp_path / "m", local_files_only=True)
    assert (config.model_type, config.intermediate_size, config.vocab_size) == ("qwen2", 96, 512)
    bad = CliRunner().invoke(app, ["init-model", str(tmp_path / "n"), "--arch", "gpt2", *args])
    assert (
        bad.exit_code != 0 and "unknown architecture 'gpt2'" in bad.output and "Traceback" not in bad.output
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hidden-size", "0"], "--hidden-size: must be at least 1, got 0"),
        (["--num-heads", "0"], "--num-heads: must be at least 1, got 0"),
        (["--hidden-size", "120", "--num-heads", "8"], "--hidden-size: head size 120 / 8 = 15 is odd"),
        (["--hidden-size", "64", "--num-heads", "64"], "--hidden-size: head size 64 / 64 = 1 is odd"),
        (["--hidden-size", "60", "--num-heads", "8"], "--hidden-size: hidden size 60 is not divisible"),
        (["--num-layers", "-1"], "--num-layers: must be at least 1, got -1"),
        (["--num-layers", "0"], "--num-layers: must be at least 1, got 0"),
        (["--max-position-embeddings", "0"], "--max-position-embeddings: must be at least 1, got 0"),
        (["--num-kv-heads", "0"], "--num-kv-heads: must be at least 1, got 0"),
        (["--num-kv-heads", "3"], "--num-kv-heads: num_heads 4 is not a multiple of num_kv_heads 3"),
        (["--intermediate-size", "0"], "--intermediate-size: must be at least 1, got 0"),
        (["--tokenizer", "bpe", "--num-layers", "0"], "--num-layers: must be at least 1, got 0"),
        (["--vocab-size", "600"], "--vocab-size: applies to --tokenizer bpe only"),
    ],
)
def test_cli_refuses_bad_sizes_in_one_line_and_writes_nothing(tmp_path, args, message):
    """Zero/negative sizes, an odd head size (rotary needs it even) or a char --vocab-size used to crash
    with a traceback, be silently replaced by a default, or build a model that fails only in tandem eval."""
    result = CliRunner().invoke(app, ["init-model", str(tmp_path / "m"), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output, result.output
    assert not (tmp_path / "m").exists()


def test_config_builders_refuse_sizes_the_cli_would(tmp_path):
    with pytest.raises(ConfigError, match="--intermediate-size: must be at least 1"):
        small_model_config("llama", 100, intermediate_size=0)
    with pytest.raises(ConfigError, match="--num-kv-heads: must be at least 1"):
        small_model_config("qwen2", 100, num_kv_heads=0)
    with pytest.raises(ConfigError, match="head size 8 / 8 = 1 is odd"):
        init_tiny_model(tmp_path / "t", hidden_size=8, num_heads=8)
    assert not (tmp_path / "t").exists()


def test_cli_says_when_the_bpe_vocabulary_is_capped(tmp_path):
    """The built-in corpus runs out of merges (~4.7k entries): a larger --vocab-size is capped, and said so."""
    args = ["--tokenizer", "bpe", "--hidden-size", "32", "--num-layers", "1", "--num-heads", "1"]
    result = CliRunner().invoke(app, ["init-model", str(tmp_path / "m"), *args, "--vocab-size", "100000000"])
    assert result.exit_code == 0, result.output
    vocab = AutoConfig.from_pretrained(tmp_path / "m", local_files_only=True).vocab_size
    assert vocab < 100_000_000
    assert f"note: --vocab-size 100000000 capped at {vocab}" in " ".join(result.output.split())
