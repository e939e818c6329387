"""``model.warm_start_sft.model_options`` are ``tandem.models.init_model``'s options: the config knows
their names (so a misspelt one is a one-line config error naming the key and ``file:line``, not a
TypeError after the run started) and that list stays equal to the function's signature."""

from __future__ import annotations

import inspect

import pytest

from tandem.config import load_config
from tandem.config.model import INIT_MODEL_OPTIONS
from tandem.errors import ConfigError
from tandem.models import init_model

CONFIG = """\
run:
  name: t
model:
  path: models/never-built
  warm_start_sft:
    task: arith
    model_options: {arch: qwen2, tokenizer: bpe, hidden: 64}
data:
  task: arith
"""


def test_the_known_options_are_init_models_signature():
    params = set(inspect.signature(init_model).parameters) - {"out_dir", "seed", "created_by"}
    assert set(INIT_MODEL_OPTIONS) == params


def test_an_unknown_model_option_is_one_line_naming_key_and_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "\n" not in message and "hidden" in message
    assert "model.warm_start_sft.model_options" in message and f"{path}:" in message
    cfg = load_config(path, ["model.warm_start_sft.model_options={arch: qwen2, tokenizer: bpe}"])
    assert cfg.model.warm_start_sft.model_options == {"arch": "qwen2", "tokenizer": "bpe"}
