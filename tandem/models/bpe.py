"""Byte-level BPE tokenizers with a ChatML chat template, trained locally on the built-in tasks' text.

Real checkpoints (Qwen, Llama 3) tokenize with byte-level BPE and format conversations with a chat
template; a character tokenizer exercises neither multi-token numbers, nor special tokens inside text,
nor templates. This module trains such a tokenizer offline in about a second with the ``tokenizers``
library: a regex split followed by a ``ByteLevel`` pre-tokenizer (bytes mapped to printable characters,
so *any* UTF-8 text encodes and decodes exactly, with no ``<unk>``), a BPE model whose merges come from
the prompts and reference answers of every built-in task (generated deterministically from a seed), and
a ``ByteLevel`` decoder.

Two split styles, one per architecture, because that is what the real families do and what
``AutoTokenizer`` does on load:

- ``llama3`` (Llama 3's regex): digits group in runs of up to three, so ``504`` can be one token.
  A Llama folder loads ``tokenizer.json`` verbatim (generic ``TokenizersBackend``).
- ``qwen2`` (Qwen2's regex and NFC normaliser): every digit is its own token. transformers 5 always
  loads a ``qwen2`` folder with ``Qwen2Tokenizer``, which rebuilds this exact pipeline from the vocabulary
  and merges; building the same pipeline here keeps the tokenizer that trains the model and the one
  that loads it identical (a ``llama3``-style vocabulary would be re-split digit by digit on load).

Special tokens (ids 0–4, in this order): ``<|pad|>``, ``<|endoftext|>`` (BOS and EOS, as in GPT-2 and
Qwen), ``<|im_start|>``, ``<|im_end|>`` (ChatML message delimiters), ``<|unk|>`` (unused by the byte-level
model; present because some tools expect one). The chat template is ChatML — the format Qwen2 instruct
models use::

    <|im_start|>user\\n12+7=<|im_end|>\\n<|im_start|>assistant\\n

A model built with it stops a chat answer at ``<|im_end|>`` and a plain completion at ``<|endoftext|>``:
:func:`tandem.models.tiny.init_model` lists both in ``generation_config.eos_token_id``, which both rollout
engines read. Like the character tokenizer, encoding adds no BOS/EOS and pads on the left.
"""

from __future__ import annotations

from collections.abc import Iterator

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from tandem.errors import ModelError
from tandem.rewards.tasks import get_task

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|endoftext|>"  # also the BOS token
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
UNK_TOKEN = "<|unk|>"
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, IM_START, IM_END, UNK_TOKEN)  # ids 0..4

# ChatML: every message as <|im_start|>ROLE\nCONTENT<|im_end|>\n; the generation prompt opens an
# assistant turn. No BOS, matching plain-text encoding (the tokenizer adds none either).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Pre-tokenizer split regexes of Llama 3 and Qwen2 (they differ only in how digits group).
_WORDS = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"""
_REST = r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
SPLIT_STYLES = {"llama3": _WORDS + r"\p{N}{1,3}" + _REST, "qwen2": _WORDS + r"\p{N}" + _REST}

DEFAULT_VOCAB_SIZE = 512
MIN_VOCAB_SIZE = len(SPECIAL_TOKENS) + 256  # the byte alphabet must fit
# Extra task options beyond each task's defaults, so the merges see 1- to 3-digit numbers and all operators.
# The tasks whose text trains the merges, frozen: a task added later must not change every BPE tokenizer.
CORPUS_TASKS = ("arith", "countdown", "reverse", "safety")
_EXTRA_TASKS: tuple[tuple[str, dict[str, object]], ...] = (
    ("arith", {"ops": "+-*", "digits": 1}),
    ("arith", {"ops": "+-*", "digits": 3}),
)


def task_corpus(rows_per_task: int = 512, seed: int = 0) -> Iterator[str]:
    """Lines of training text: ``prompt + answer`` of ``rows_per_task`` rows of each split of every
    registered built-in task (default options, plus arithmetic with 1 and 3 digits and all operators),
    each once plain and once with the chat roles (``user``/``assistant``) around it, the text between
    the template's special tokens (the trainer does not split special tokens out of its input, so they
    are left out rather than learnt as pieces like ``<|``).

    Deterministic: the same arguments yield the same lines in the same order.
    """
    specs = [(name, {}) for name in CORPUS_TASKS] + list(_EXTRA_TASKS)
    for name, options in specs:
        task = get_task(name, **options)
        for split in ("train", "test"):
            for row in task.make_rows(split, rows_per_task, seed):
                prompt, answer = str(row["prompt"]), str(row["answer"])
                yield f"{prompt}{answer}\n"
                yield f"user\n{prompt}\nassistant\n{answer}\n"


def build_bpe_tokenizer(
    vocab_size: int = DEFAULT_VOCAB_SIZE, *, style: str = "llama3", seed: int = 0, rows_per_task: int = 512
) -> PreTrainedTokenizerFast:
    """A byte-level BPE fast tokenizer of ``vocab_size`` entries (fewer if the corpus runs out of
    merges) trained on :func:`task_corpus`, split in ``style`` (``llama3`` or ``qwen2``), with the special
    tokens and ChatML template of the module docstring. ``tok.decode(tok(text).input_ids) == text`` for
    any NFC-normalised string (any string at all for ``llama3``).
    """
    if style not in SPLIT_STYLES:
        raise ModelError(f"unknown BPE split style '{style}'", hint=f"use one of {sorted(SPLIT_STYLES)}")
    if vocab_size < MIN_VOCAB_SIZE:
        raise ModelError(
            f"vocab_size {vocab_size} is too small for a byte-level BPE tokenizer",
            where="--vocab-size",
            hint=f"use at least {MIN_VOCAB_SIZE} (256 bytes + {len(SPECIAL_TOKENS)} special tokens)",
        )
    backend = Tokenizer(models.BPE(unk_token=None))
    if style == "qwen2":
        backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_STYLES[style]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(task_corpus(rows_per_task, seed), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        additional_special_tokens=[IM_START, IM_END],
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
