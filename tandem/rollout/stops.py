"""Cheap stop-string detection for a batched decode loop.

Decoding every row's text at every step costs ``B`` tokenizer calls per token. Instead, a stop string can
only complete at a step whose new token's text contains the string's last character, so a ``[V]`` bool
table of such "candidate" tokens filters rows with one tensor index; only candidate rows decode a short
tail (the last ``max_len + 1`` tokens: every token decodes to at least one character, plus one token of
left context for tokenizers that strip a leading space at the start of a decode).
"""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

REPLACEMENT_CHAR = "\ufffd"  # a lone byte of a multi-byte character decodes to this


class StopStrings:
    """Detects and cuts stop strings for one tokenizer and one list of stop strings."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stop = list(stop)
        self.tail_tokens = max((len(s) for s in self.stop), default=0) + 1
        self.candidates = self._candidate_table() if self.stop else None  # [V + 1] bool

    def _candidate_table(self) -> torch.Tensor:
        """``[V + 1]`` bool: True for tokens whose text could complete one of the stop strings; ids the
        tokenizer does not know (model vocab padding) map to the last entry, False."""
        size = len(self.tokenizer)
        texts = self.tokenizer.batch_decode([[i] for i in range(size)], skip_special_tokens=False)
        last_chars = {s[-1] for s in self.stop}
        flags = [any(c in text for c in last_chars) or REPLACEMENT_CHAR in text for text in texts]
        return torch.tensor([*flags, False], dtype=torch.bool)  # extra entry: ids past the tokenizer

    def check(
        self,
        tokens: torch.Tensor,  # [B, T] long, tokens generated so far
        new_tokens: torch.Tensor,  # [B] long, the tokens just appended (column T-1)
        active: torch.Tensor,  # [B] bool, rows still generating
    ) -> torch.Tensor:
        """``[B]`` bool: rows whose text now contains a stop string (only among ``active`` rows)."""
        hit = torch.zeros_like(active)
        if self.candidates is None:
            return hit
        maybe = active & self.candidates[new_tokens.clamp(0, self.candidates.numel() - 1)]  # [B]
        rows = maybe.nonzero().flatten().tolist()
        if not rows:
            return hit
        tails = tokens[rows, -self.tail_tokens :].tolist()
        texts = self.tokenizer.batch_decode(tails, skip_special_tokens=True)
        for row, text in zip(rows, texts, strict=True):
            if any(s in text for s in self.stop):
                hit[row] = True
        return hit

    def cut(self, text: str) -> tuple[str, bool]:
        """``text`` up to the first stop string, and whether one was found."""
        cuts = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        if not cuts:
            return text, False
        return text[: min(cuts)], True
