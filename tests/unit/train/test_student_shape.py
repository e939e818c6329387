"""``tandem distill --student``'s size spec for a latency-shaped student: fewer layers at the teacher's
width, or a narrower and shallower one, each about a quarter of the teacher's parameters."""

from __future__ import annotations

from transformers import LlamaConfig

from tandem.train.distill import student_config


def _params(cfg) -> int:
    h, i, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    return layers * (4 * h * h + 3 * h * i) + cfg.vocab_size * h


def test_fewer_layers_keep_the_teachers_width_and_mlp():
    teacher = LlamaConfig(
        hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4, vocab_size=100
    )
    shallow = student_config(teacher, {"num_layers": 1})
    assert (shallow.hidden_size, shallow.intermediate_size, shallow.num_hidden_layers) == (128, 512, 1)
    narrow = student_config(teacher, {"hidden_size": 96, "num_layers": 2})
    assert (narrow.hidden_size, narrow.intermediate_size, narrow.num_hidden_layers) == (96, 384, 2)
    assert narrow.head_dim == 24 and narrow.num_key_value_heads == 4
    for student in (shallow, narrow):
        assert 0.2 < _params(student) / _params(teacher) < 0.3
    assert teacher.num_hidden_layers == 4  # the teacher's config is not changed
