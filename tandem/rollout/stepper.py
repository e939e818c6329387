"""Decode steppers: the model-forward half of the decode loop, behind one small interface.

The loop in :mod:`tandem.rollout.hf` asks a stepper for next-token logits after a prefill and after each
appended token. :class:`HFStepper` calls the Hugging Face model with its own KV cache and works for any
causal LM; :class:`~tandem.rollout.llama_decode.LlamaStepper` is a faster path for Llama-family models.
"""

from __future__ import annotations

import inspect
from typing import Protocol

import torch
from transformers import PreTrainedModel

from tandem.models.forward import accepts_logits_to_keep


class DecodeStepper(Protocol):
    """Next-token logits for a batch whose rows grow by one token per step."""

    def prefill(
        self,
        ids: torch.Tensor,  # [B, P] long, left padded
        attention_mask: torch.Tensor,  # [B, P] long, 1 on real tokens
        position_ids: torch.Tensor,  # [B, P] long
    ) -> torch.Tensor:  # [B, V] logits of the last position
        """Run the prompts and fill the KV cache."""
        ...

    def step(
        self,
        ids: torch.Tensor,  # [B, 1] long, the token just sampled
        attention_mask: torch.Tensor,  # [B, L] long, every position so far including this token
        position_ids: torch.Tensor,  # [B, 1] long
    ) -> torch.Tensor:  # [B, V]
        """Append one token per row and return the logits after it."""
        ...


class HFStepper:
    """Steps any Hugging Face causal LM through its own forward and KV cache (``use_cache=True``).

    The model creates its default cache (a ``DynamicCache``) at prefill; the stepper passes it back on every
    step under the keyword the installed transformers version expects (``cache`` or ``past_key_values``).
    """

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keep_last = accepts_logits_to_keep(model)
        self._cache: object | None = None

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        kwargs = {"input_ids": ids, "attention_mask": mask, "position_ids": pos, "use_cache": True}
        if self._cache is not None:
            kwargs[self._cache_kw] = self._cache
        if self._keep_last:
            kwargs["logits_to_keep"] = 1
        out = self.model(**kwargs)
        cache = getattr(out, "cache", None)
        self._cache = cache if cache is not None else getattr(out, "past_key_values", None)
        return out.logits[:, -1]

    def prefill(
        self, ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """Run the prompts with a fresh cache; logits of the last position ``[B, V]``."""
        self._cache = None
        return self._forward(ids, attention_mask, position_ids)

    def step(
        self, ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """One cached single-token forward; logits ``[B, V]``."""
        return self._forward(ids, attention_mask, position_ids)
