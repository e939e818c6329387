"""Character-level tokenizer for tiny models: one token per character, spaces kept.

Tiny models trained from scratch on synthetic tasks (arithmetic, countdown, string reversal) need no
sub-word vocabulary; one token per character keeps the vocabulary ~100 entries and makes every digit its
own token. Built with the ``tokenizers`` library (WordLevel model over single characters, a pre-tokenizer
that isolates every character including whitespace, a ``Fuse`` decoder that joins them back verbatim),
wrapped in ``PreTrainedTokenizerFast`` so it saves and loads as an ordinary Hugging Face tokenizer.

The saved ``tokenizer_config.json`` names the generic fast-tokenizer class on purpose: in transformers 5
``LlamaTokenizer`` rebuilds its own Metaspace/BPE pipeline on load and silently drops spaces from a
character vocabulary, while the generic class loads ``tokenizer.json`` verbatim.

No BOS or EOS is added when encoding: prompts of synthetic tasks are plain text, and the rollout engine
and SFT code append EOS explicitly where a sequence must end. Padding is on the left, as generation needs.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from tandem.errors import ModelError

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)  # ids 0, 1, 2, 3

DEFAULT_CHARS = string.ascii_letters + string.digits + string.punctuation + " \n"


def build_char_tokenizer(chars: str | None = None) -> PreTrainedTokenizerFast:
    """A character-level fast tokenizer over ``chars`` (default: printable ASCII letters, digits,
    punctuation, space and newline).

    Special tokens take ids 0–3 in the order ``<pad>``, ``<s>``, ``</s>``, ``<unk>``; characters follow in
    the order given (duplicates dropped). Characters outside the vocabulary encode as ``<unk>``.
    ``tok.decode(tok(text).input_ids, skip_special_tokens=True) == text`` for any text over ``chars``.
    """
    charset = list(dict.fromkeys(DEFAULT_CHARS if chars is None else chars))
    if not charset:
        raise ModelError("character set is empty", hint="pass chars=None for printable ASCII")
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *charset])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # One pre-token per character, whitespace included ([\s\S] matches newlines too).
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
