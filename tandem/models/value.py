"""A value model (critic) for PPO: a causal-LM backbone with a scalar head, one value per response token.

The critic is separate from the policy and may be much smaller: it is built from any causal-LM folder
(``critic.path``), whose language-model head is dropped and replaced by ``nn.Linear(hidden, 1)``.
"""

from __future__ import annotations

import os
from pathlib import Path

import safetensors.torch
import torch
from torch import nn

from tandem.errors import ModelError
from tandem.models.forward import cpu_bf16_attention_context, positions_from_mask
from tandem.models.loading import load_causal_lm


class ValueModel(nn.Module):
    """``backbone`` (the decoder of a causal LM, returning ``last_hidden_state``) + a scalar ``head``."""

    def __init__(self, backbone: nn.Module, hidden_size: int, *, seed: int = 0) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(hidden_size, 1)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():  # small deterministic init: values start near zero
            self.head.weight.copy_(torch.randn(self.head.weight.shape, generator=gen) / (hidden_size + 1))
            self.head.bias.zero_()
        self.head.to(next(backbone.parameters()).dtype)

    def values(
        self,
        prompt_ids: torch.Tensor,  # [B, P] long, left padded
        prompt_mask: torch.Tensor,  # [B, P] bool
        response_ids: torch.Tensor,  # [B, R] long, right padded
        response_mask: torch.Tensor,  # [B, R] bool
    ) -> torch.Tensor:
        """Value of every response token ``[B, R]`` float32, zero where ``response_mask`` is False.

        Token ``t`` is valued from the hidden state at position ``P - 1 + t`` — the position that predicts
        it, the same alignment as :func:`tandem.models.forward.response_logprobs` — so ``V_t`` is the
        value of the state *before* emitting token ``t``. Position ids ignore left padding."""
        R = response_ids.shape[1]
        input_ids = torch.cat([prompt_ids, response_ids], dim=1)  # [B, P+R]
        attention_mask = torch.cat([prompt_mask, response_mask], dim=1).long()  # [B, P+R]
        with cpu_bf16_attention_context(self.backbone, input_ids.device):
            hidden = self.backbone(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=positions_from_mask(attention_mask),
                use_cache=False,
            ).last_hidden_state  # [B, P+R, H]
        h = hidden[:, -R - 1 : -1]  # [B, R, H]
        v = self.head(h.to(self.head.weight.dtype)).squeeze(-1).float()  # [B, R]
        return v * response_mask.to(v.dtype)

    def save(self, path: str | os.PathLike) -> None:
        """Write every weight (backbone and head) to one safetensors file."""
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        safetensors.torch.save_file(state, str(path))

    def load(self, path: str | os.PathLike) -> None:
        """Load weights written by :meth:`save`, strictly (names and shapes must match)."""
        if not Path(path).is_file():
            raise ModelError("critic weights missing", where=str(path), hint="was this a PPO checkpoint?")
        try:
            self.load_state_dict(safetensors.torch.load_file(str(path), device="cpu"), strict=True)
        except RuntimeError as err:
            first = str(err).splitlines()[0]
            raise ModelError(f"critic weights do not match: {first}", where=str(path)) from None


def build_value_model(path: str | os.PathLike, *, dtype: str = "float32", seed: int = 0) -> ValueModel:
    """A :class:`ValueModel` whose backbone is the decoder of the causal LM in folder ``path``."""
    lm = load_causal_lm(path, dtype=dtype)
    backbone = lm.get_decoder() if hasattr(lm, "get_decoder") else lm.base_model
    return ValueModel(backbone, int(lm.config.hidden_size), seed=seed)
