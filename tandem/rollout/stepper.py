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

    def select(self, index: torch.Tensor) -> bool:  # index [S] long, rows of the current cache
        """Keep (and repeat) only the cache rows ``index``, in that order; the next ``step`` gets ``S`` rows.
        False when this stepper's cache cannot (nothing changed)."""
        ...


def prompt_runs(
    ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
) -> torch.Tensor | None:
    """Lengths ``[N]`` of the runs of identical consecutive rows (same ids, mask and positions) of a
    prefill batch ``[B, P]`` — a prompt repeated for its ``n`` samples is one run — or None when no two
    consecutive rows are equal (nothing to share)."""
    key = torch.cat([ids, attention_mask.long(), position_ids.long()], dim=1)  # [B, 3P]
    _, counts = torch.unique_consecutive(key, dim=0, return_counts=True)  # [N]
    return None if counts.numel() == ids.shape[0] else counts


class HFStepper:
    """Steps any Hugging Face causal LM through its own forward and KV cache (``use_cache=True``).

    The model creates its default cache (a ``DynamicCache``) at prefill; the stepper passes it back on every
    step under the keyword the installed transformers version expects (``cache`` or ``past_key_values``).
    """

    # model classes whose cache cannot select rows: they prefill every row (learned at the first try)
    _no_row_select: set[type] = set()

    def __init__(self, model: PreTrainedModel, *, share_prefill: bool = True) -> None:
        self.model = model
        self.share_prefill = share_prefill
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
        """Run the prompts with a fresh cache; logits of the last position ``[B, V]``.

        A run of identical consecutive rows (:func:`prompt_runs`) is computed once and its cache rows and
        logits are copied to the whole run (the cache's ``batch_select_indices``), so a prompt's ``n``
        samples cost one prompt forward. A model whose cache cannot select rows (some hybrid or
        state-space caches) gets the plain prefill over all rows, from its second call on without the
        wasted try; so does ``share_prefill=False``. Naive equivalent: the forward over all ``B`` rows."""
        self._cache = None
        shared = self.share_prefill and type(self.model) not in HFStepper._no_row_select
        counts = prompt_runs(ids, attention_mask, position_ids) if shared else None
        if counts is None:
            return self._forward(ids, attention_mask, position_ids)
        first = torch.cumsum(counts, 0) - counts  # [N] the first row of each run
        logits = self._forward(ids[first], attention_mask[first], position_ids[first])  # [N, V]
        index = torch.repeat_interleave(torch.arange(counts.numel(), device=ids.device), counts)  # [B]
        try:
            self._cache.batch_select_indices(index)  # type: ignore[union-attr]
        except (AttributeError, NotImplementedError):
            HFStepper._no_row_select.add(type(self.model))
            self._cache = None
            return self._forward(ids, attention_mask, position_ids)
        return logits[index]

    def step(
        self, ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """One cached single-token forward; logits ``[B, V]``."""
        return self._forward(ids, attention_mask, position_ids)

    def select(self, index: torch.Tensor) -> bool:
        """The cache's rows ``index`` (its ``batch_select_indices``), for a Hugging Face ``DynamicCache``
        only; other caches say False (some hybrid or state-space caches cannot select rows)."""
        from transformers import DynamicCache

        if type(self.model) in HFStepper._no_row_select or not isinstance(self._cache, DynamicCache):
            return False
        self._cache.batch_select_indices(index)
        return True
