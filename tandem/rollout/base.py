"""The rollout engine interface: sampling parameters, the ``RolloutEngine`` protocol and ``EngineSpec``.

Every backend (Hugging Face, vLLM) turns prompts into a :class:`~tandem.types.RolloutBatch` carrying the
per-token log-probs of the sampled tokens, and accepts versioned weight updates. The orchestration layer,
evaluation, export and the preference commands depend only on this protocol and build engines by name
through :func:`tandem.rollout.registry.build_engine`, so a new backend is one module plus one line in
``ENGINES``; ``tests/unit/rollout/test_engine_contract.py`` runs every registered engine through the same
checks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from tandem.errors import ConfigError
from tandem.types import RolloutBatch


@dataclass
class SamplingParams:
    """How to sample responses.

    ``temperature == 0`` means greedy decoding (argmax; log-probs then come from the raw logits).
    ``top_k == 0``, ``top_p == 1.0`` and ``min_p == 0`` disable those filters; ``repetition_penalty`` (HF's and
    vLLM's: a token already in the prompt or the response has its logit divided by it when positive,
    multiplied when negative) is off at 1. Behaviour log-probs are always taken under
    ``log_softmax(logits / temperature)`` *before* the penalty and the filters, which is what the trainer
    recomputes: they decide which token is drawn, not its recorded probability. ``stop`` strings end a response (the string is cut from the completion text, its tokens stay
    in ``response_ids``). ``seed`` makes sampling reproducible independently of the global RNG; ``None``
    uses the global torch RNG.
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    n: int = 1
    stop: list[str] = field(default_factory=list)
    seed: int | None = None

    def __post_init__(self) -> None:
        checks = [
            (self.max_new_tokens >= 1, "max_new_tokens", f"must be >= 1, got {self.max_new_tokens}"),
            (self.temperature >= 0, "temperature", f"must be >= 0, got {self.temperature}"),
            (0 < self.top_p <= 1, "top_p", f"must be in (0, 1], got {self.top_p}"),
            (self.top_k >= 0, "top_k", f"must be >= 0 (0 disables), got {self.top_k}"),
            (0 <= self.min_p <= 1, "min_p", f"must be in [0, 1] (0 disables), got {self.min_p}"),
            (
                self.repetition_penalty > 0,
                "repetition_penalty",
                f"must be > 0 (1 disables), got {self.repetition_penalty}",
            ),
            (self.n >= 1, "n", f"must be >= 1, got {self.n}"),
            (all(isinstance(s, str) and s for s in self.stop), "stop", "stop strings must be non-empty"),
        ]
        for ok, key, message in checks:
            if not ok:
                raise ConfigError(message, where=f"rollout.{key}")

    @property
    def greedy(self) -> bool:
        """True when decoding is greedy (``temperature == 0``)."""
        return self.temperature == 0

    @property
    def penalised(self) -> bool:
        """True when tokens already seen are penalised (``repetition_penalty != 1``): the decode loop then
        tracks which tokens each row has seen."""
        return self.repetition_penalty != 1


@dataclass(frozen=True)
class EngineSpec:
    """What a caller knows when it asks for an engine (:func:`~tandem.rollout.registry.build_engine`).

    ``model``: an in-process model to sample with (a colocated trainer passes the very module it trains;
    an engine that can share it does, one that cannot loads its own copy from ``path``); ``None``: the
    engine loads ``path`` itself (a rollout worker). ``tokenizer``: ``None`` loads it from ``path``.
    ``options``: the engine's own settings (``rollout.engine_options``), validated by the engine.
    """

    model: torch.nn.Module | None = None
    tokenizer: Any = None
    path: str | None = None
    dtype: str | None = None
    max_prompt_len: int | None = None
    add_special_tokens: bool = True
    version: int = 0
    options: Mapping[str, Any] = field(default_factory=dict)


ChunkCallback = Callable[[], None]


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates responses and tracks which weight version it samples with.

    ``generate`` returns one row per sample: each prompt's ``n`` samples are consecutive rows sharing one
    group id; prompt ``i`` gets group id ``group_offset + i``. ``extras[i]`` (dataset columns for rewards)
    is repeated for each of prompt ``i``'s samples. ``policy_version`` of every row is the engine's
    ``version`` at the start of the call. ``params`` is one :class:`SamplingParams` for the whole batch or
    one per prompt (each prompt then has its own ``n``, limits, temperature, seed and stop strings).
    ``behavior_logprobs`` are the sampled tokens' log-probs under ``log_softmax(logits / temperature)``
    (raw logits when greedy), what the trainer recomputes.
    """

    @property
    def version(self) -> int:
        """Weight version the engine currently samples with."""
        ...

    def generate(
        self,
        prompts: list[str],
        params: SamplingParams | Sequence[SamplingParams],
        *,
        group_offset: int = 0,
        extras: list[dict] | None = None,
        on_chunk: ChunkCallback | None = None,
        chunk_tokens: int = 4,
    ) -> RolloutBatch:
        """Sample responses; see the class docstring for the row layout. ``on_chunk`` (in-flight weight
        updates) is called after every ``chunk_tokens`` decoded tokens while rows still run; it may call
        :meth:`update_weights`, and the tokens after it are sampled with the new weights."""
        ...

    def update_weights(self, state_dict: dict[str, torch.Tensor] | None, version: int) -> None:
        """Load ``state_dict`` and record ``version``. ``None``, or the state dict of the very module the
        engine samples with (a colocated trainer's), loads nothing: only the version changes."""
        ...

    def close(self) -> None:
        """Release the engine's resources (idempotent); ``generate`` afterwards is an error."""
        ...


@runtime_checkable
class ScoresCompletions(Protocol):
    """An engine that can also score completions it did not sample (teacher forced): the behaviour
    log-probs of ``rollout.reference_answers`` rows. Optional; the ``hf`` engine implements it, the
    ``vllm`` engine at temperature 1 only (its class attribute ``scores_only_at_temperature``)."""

    tokenizer: Any

    def score(
        self,
        prompt_ids: torch.Tensor,  # [B, P] long, left padded
        prompt_mask: torch.Tensor,  # [B, P] bool
        response_ids: torch.Tensor,  # [B, R] long, right padded
        response_mask: torch.Tensor,  # [B, R] bool
        *,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        """Log-prob of every response token under ``log_softmax(logits / temperature)`` of the engine's
        current weights: ``[B, R]`` float32, 0 where ``response_mask`` is False."""
        ...
