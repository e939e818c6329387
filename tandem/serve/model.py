"""What the server serves: a model folder (or a run's latest checkpoint) loaded for generation.

``MODEL_OR_RUN`` may be a Hugging Face folder, a folder written by ``tandem export --format int8`` (loaded
as dynamic INT8), or a training run folder (``checkpoints/step-N/model`` of the newest complete checkpoint
is served). Weights load from safetensors only; pickle weights are refused by
:func:`tandem.models.load_causal_lm`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import AutoConfig, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from tandem.errors import ModelError, first_line
from tandem.models import load_model, load_tokenizer, model_format
from tandem.serve.decode import RowRequest, RowResult, TokenCallback, decode_rows
from tandem.serve.protocol import ApiError

_STEP = re.compile(r"^step-(\d+)$")
EXPORT_MANIFEST = "tandem_export.json"


def resolve_model_dir(path: str | Path) -> Path:
    """The model folder to serve for ``path``: itself if it holds ``config.json``, else the ``model/``
    folder of the newest complete checkpoint of a run folder."""
    folder = Path(path)
    if (folder / "config.json").is_file() or (folder / EXPORT_MANIFEST).is_file():
        return folder
    ckpts = folder / "checkpoints"
    if ckpts.is_dir():
        steps = sorted(
            (int(m.group(1)), p)
            for p in ckpts.iterdir()
            if (m := _STEP.match(p.name)) and (p / "COMPLETE").is_file() and (p / "model").is_dir()
        )
        if steps:
            return steps[-1][1] / "model"
        raise ModelError("run folder has no complete checkpoint", where=str(ckpts))
    raise ModelError(
        "not a model folder (no config.json) nor a run folder (no checkpoints/)",
        where=str(folder),
        hint="pass an HF model folder, an export folder or a runs/<name> folder",
    )


# Texts on which a tokenizer's Rust backend must encode exactly as its Python ``__call__`` before the
# server uses the backend directly (plus the tokenizer's own special tokens).
_PROBES = ("", " ", "12+34=", "Hello, world!\n", "  two  spaces\tand a tab", "caf\u00e9 \u2713 \u4e2d\u6587")


def fast_encoder(tokenizer: PreTrainedTokenizerBase) -> Callable[[str], list[int]] | None:
    """``text -> token ids`` through the tokenizer's Rust backend (``tokenizers.Tokenizer.encode``), or
    None when that would not give exactly ``tokenizer(text)["input_ids"]``.

    The Python ``__call__`` of a fast tokenizer costs 60-90 us per prompt; the backend alone about 10 us,
    which is 5% of a served request at the quickstart's size. The backend is used only for a tokenizer
    that does not override ``__call__`` and that agrees with ``__call__`` on :data:`_PROBES` and its
    special tokens; a call made while the backend has truncation or padding set (another caller
    configured it) goes through ``__call__``, which resets both."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None or not callable(getattr(backend, "encode", None)):
        return None
    if type(tokenizer).__call__ is not PreTrainedTokenizerBase.__call__:
        return None

    def slow(text: str) -> list[int]:
        return list(tokenizer(text)["input_ids"])

    def encode(text: str) -> list[int]:
        if backend.truncation is not None or backend.padding is not None:
            return slow(text)
        return backend.encode(text).ids

    try:
        probes = [*_PROBES, *getattr(tokenizer, "all_special_tokens", [])]
        agrees = all(encode(text) == slow(text) for text in probes for _ in range(2))
    except Exception:  # noqa: BLE001 - any backend quirk means: keep the Python path
        return None
    return encode if agrees else None


def _version(folder: Path) -> str:
    """A short content version of the served weights: changes whenever a weight file changes."""
    digest = hashlib.sha256(str(folder.resolve()).encode())
    for file in sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.onnx")):
        stat = file.stat()
        digest.update(f"{file.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:12]


def _format(folder: Path) -> str:
    """``hf`` for a model folder, else the export format its manifest names (``int8``, ``onnx``)."""
    return model_format(folder)


def _load_weights(folder: Path) -> tuple[PreTrainedModel, str]:
    """The model of ``folder`` and its format (``hf``, ``int8`` or ``onnx``). HF folders and INT8
    exports load through :func:`tandem.models.load_model`, as every other command loads them."""
    manifest = folder / EXPORT_MANIFEST
    fmt = _format(folder)
    if fmt in ("hf", "int8"):
        return load_model(folder), fmt
    if fmt == "onnx":
        from tandem.export.graph import OnnxModel

        return OnnxModel(folder), "onnx"
    raise ModelError(
        f"tandem serve cannot load the '{fmt}' export format",
        where=str(manifest),
        hint="serve the hf, int8 or onnx export",
    )


def _config_only(folder: Path, engine: str) -> PretrainedConfig:
    """The config of an HF folder whose weights an engine loads itself; ModelError for an export (only the
    in-process engine runs int8/ONNX modules) or an unreadable config."""
    fmt = _format(folder)
    if fmt != "hf":
        raise ModelError(
            f"the '{fmt}' export can only be served by the in-process engine, not '{engine}'",
            where=str(folder),
            hint="serve it with --engine hf, or serve the hf export",
        )
    try:
        return AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as err:
        raise ModelError(f"cannot read the model config: {first_line(err)}", where=str(folder)) from None


@dataclass
class ServedModel:
    """A model folder's tokenizer and config plus what the API needs to know about them, and the loaded
    module when generation runs in this process (``model`` None: the engine loads ``folder`` itself)."""

    name: str
    folder: Path
    model: PreTrainedModel | None
    tokenizer: PreTrainedTokenizerBase
    version: str
    format: str
    context_length: int
    config: PretrainedConfig | None = None
    _encoder: Callable[[str], list[int]] | None = field(default=None, repr=False, compare=False)
    _config_vocab: int | None = field(default=None, repr=False, compare=False)

    @classmethod
    def load(cls, path: str | Path, name: str | None = None, *, engine: str | None = None) -> ServedModel:
        """Load ``path`` (model, export or run folder) for serving. ``engine`` None: with its weights, for
        an in-process engine; else only the tokenizer and config, for ``engine``, which loads the weights
        itself from :attr:`folder`."""
        folder = resolve_model_dir(path)
        if engine is None:
            model, fmt = _load_weights(folder)
            model.eval()
            config = getattr(model, "config", None)
        else:
            model, fmt, config = None, "hf", _config_only(folder, engine)
        tokenizer = load_tokenizer(folder)
        ctx = int(getattr(config, "max_position_embeddings", 0) or 2048)
        served = name or Path(path).resolve().name
        loaded = cls(served, folder, model, tokenizer, _version(folder), fmt, ctx, config)
        loaded.check_chat_template()
        return loaded

    @property
    def vocab_size(self) -> int:
        """Token ids a request may name: those both the tokenizer and the model's embedding know."""
        size = len(self.tokenizer)
        if self._config_vocab is None:  # read once: a transformers config attribute costs ~3 us a read
            self._config_vocab = int(getattr(self.config, "vocab_size", 0) or 0)
        return min(size, self._config_vocab or size)

    @property
    def label(self) -> str:
        """A name for this model that does not reveal where it lives on disk: the folder name, or
        ``RUN/step-N`` for a run's checkpoint."""
        if self.folder.name == "model" and _STEP.match(self.folder.parent.name):
            return f"{self.folder.parent.parent.parent.name}/{self.folder.parent.name}"
        return self.folder.resolve().name

    def encode(self, text: str) -> list[int]:
        """Prompt token ids (with the tokenizer's special tokens, as in training): exactly
        ``tokenizer(text)["input_ids"]``, through the Rust backend when :func:`fast_encoder` allows."""
        if self._encoder is None:
            tok = self.tokenizer
            self._encoder = fast_encoder(tok) or (lambda text: list(tok(text)["input_ids"]))
        return self._encoder(text)

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        """The prompt text of a conversation: the tokenizer's chat template when it has one (given the
        ``tools`` declarations when not None), else ``role: content`` lines followed by ``assistant:``.

        The template runs in transformers' Jinja sandbox. A template error (the template's own
        ``raise_exception``, e.g. "roles must alternate", or an operation the sandbox blocks) is the
        answer for this conversation: 400 with the template's message, not a 500."""
        if getattr(self.tokenizer, "chat_template", None):
            from jinja2 import TemplateError

            try:
                extra = {"tools": tools} if tools is not None else {}
                return self.tokenizer.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=True, **extra
                )
            except TemplateError as err:
                raise ApiError(
                    400, f"the chat template rejected this conversation: {err}", param="messages"
                ) from err
        lines = [f"{m['role']}: {m['content']}" for m in messages]
        return "\n".join([*lines, "assistant:"])

    def check_chat_template(self) -> None:
        """ModelError at load when the chat template does something the sandbox blocks for a plain
        one-message conversation (reading object internals, ...): such a template would fail every chat
        request, and a template that probes the sandbox is not one to serve."""
        if not getattr(self.tokenizer, "chat_template", None):
            return
        from jinja2.exceptions import SecurityError

        try:
            self.tokenizer.apply_chat_template(
                [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
            )
        except SecurityError as err:
            raise ModelError(
                f"the chat template performs an operation the sandbox blocks: {first_line(err)}",
                where=str(self.folder / "tokenizer_config.json"),
                hint="fix or remove chat_template",
            ) from None
        except Exception:  # noqa: BLE001 - a template may refuse this probe (e.g. requires a system turn)
            return

    def run(self, rows: list[RowRequest], on_token: TokenCallback) -> list[RowResult]:
        """Generate ``rows`` as one batch with the in-process module (on a generation thread)."""
        if self.model is None:
            raise ModelError("this model's weights are held by its engine, not loaded here")
        return decode_rows(self.model, self.tokenizer, rows, on_token)

    def token_text(self, token: int) -> str:
        """Text of one generated token (empty for special tokens)."""
        return self.tokenizer.decode([token], skip_special_tokens=True)
