"""Do two models share a tokenizer? Distillation compares a teacher's and a student's log-probs of the
same token ids, which means the same thing only when both map every token to the same id."""

from __future__ import annotations

from typing import Any

from tandem.errors import ConfigError


def vocab_mismatch(student: Any, teacher: Any) -> str | None:
    """None when the two tokenizers map the same tokens to the same ids (and agree on EOS and padding),
    else a short description of the first difference."""
    sv, tv = student.get_vocab(), teacher.get_vocab()
    if len(sv) != len(tv):
        return f"vocabularies of {len(sv)} and {len(tv)} tokens"
    for token, idx in sorted(sv.items(), key=lambda kv: kv[1]):
        if tv.get(token) != idx:
            return f"token {token!r} is id {idx} for the student, {tv.get(token)} for the teacher"
    for attr in ("eos_token_id", "pad_token_id"):
        a, b = getattr(student, attr, None), getattr(teacher, attr, None)
        if a != b:
            return f"{attr} {a} for the student, {b} for the teacher"
    return None


def check_same_vocab(student: Any, teacher: Any, *, where: str) -> None:
    """ConfigError naming ``where`` (a config key or CLI argument) when the tokenizers differ."""
    why = vocab_mismatch(student, teacher)
    if why is not None:
        raise ConfigError(
            f"the teacher's tokenizer differs from the student's ({why})",
            where=where,
            hint="distillation needs a teacher and a student with the same tokenizer",
        )
