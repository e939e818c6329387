"""Models (layer L2): load and save Hugging Face causal LMs offline, build tiny models, score responses."""

from tandem.models.bpe import build_bpe_tokenizer
from tandem.models.forward import positions_from_mask, response_logprobs
from tandem.models.loading import (
    load_causal_lm,
    load_model,
    load_tokenizer,
    model_format,
    save_pretrained_atomic,
)
from tandem.models.tiny import init_model, init_tiny_model, small_model_config, tiny_llama_config
from tandem.models.tokenizer import build_char_tokenizer
from tandem.models.value import ValueModel, build_value_model

__all__ = [
    "ValueModel",
    "build_value_model",
    "build_bpe_tokenizer",
    "build_char_tokenizer",
    "init_model",
    "init_tiny_model",
    "load_causal_lm",
    "load_model",
    "load_tokenizer",
    "model_format",
    "positions_from_mask",
    "response_logprobs",
    "save_pretrained_atomic",
    "small_model_config",
    "tiny_llama_config",
]
