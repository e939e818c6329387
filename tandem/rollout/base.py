"""The rollout engine interface: sampling parameters and the ``RolloutEngine`` protocol.

Every backend (Hugging Face, vLLM) turns prompts into a :class:`~tandem.types.RolloutBatch` carrying the
per-token log-probs of the sampled tokens, and accepts versioned weight updates. The orchestration layer
depends only on this protocol, so colocated and decoupled runs swap backends freely.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from tandem.errors import ConfigError
from tandem.types import RolloutBatch


@dataclass
class SamplingParams:
    """How to sample responses.

    ``temperature == 0`` means greedy decoding (argmax; log-probs then come from the raw logits).
    ``top_k == 0`` and ``top_p == 1.0`` disable those filters. Behaviour log-probs are always taken under
    ``log_softmax(logits / temperature)`` *before* top-k/top-p truncation, which is what the trainer
    recomputes. ``stop`` strings end a response (the string is cut from the completion text, its tokens stay
    in ``response_ids``). ``seed`` makes sampling reproducible independently of the global RNG; ``None``
    uses the global torch RNG.
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    n: int = 1
    stop: list[str] = field(default_factory=list)
    seed: int | None = None

    def __post_init__(self) -> None:
        checks = [
            (self.max_new_tokens >= 1, "max_new_tokens", f"must be >= 1, got {self.max_new_tokens}"),
            (self.temperature >= 0, "temperature", f"must be >= 0, got {self.temperature}"),
            (0 < self.top_p <= 1, "top_p", f"must be in (0, 1], got {self.top_p}"),
            (self.top_k >= 0, "top_k", f"must be >= 0 (0 disables), got {self.top_k}"),
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


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates responses and tracks which weight version it samples with.

    ``generate`` returns one row per sample: each prompt's ``n`` samples are consecutive rows sharing one
    group id; prompt ``i`` gets group id ``group_offset + i``. ``extras[i]`` (dataset columns for rewards)
    is repeated for each of prompt ``i``'s samples. ``policy_version`` of every row is the engine's
    ``version`` at the time of the call.
    """

    @property
    def version(self) -> int:
        """Weight version the engine currently samples with."""
        ...

    def generate(
        self,
        prompts: list[str],
        params: SamplingParams,
        *,
        group_offset: int = 0,
        extras: list[dict] | None = None,
    ) -> RolloutBatch:
        """Sample ``params.n`` responses per prompt; see the class docstring for row layout."""
        ...

    def update_weights(self, state_dict: dict[str, torch.Tensor] | None, version: int) -> None:
        """Load new weights (``None``: the engine shares the trained model; only record ``version``)."""
        ...
