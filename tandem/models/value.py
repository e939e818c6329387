"""A value model (critic) for PPO: a causal-LM backbone with a scalar head, one value per response token.

Two shapes, one alignment (``V_t`` is read at the position that predicts response token ``t``):

- :class:`ValueModel` — a separate critic, possibly much smaller than the policy: any causal-LM folder
  (``critic.path``) whose language-model head is dropped and replaced by ``nn.Linear(hidden, 1)``.
- :class:`SharedValueHead` — ``critic.shared_backbone``: only the ``nn.Linear(hidden, 1)``, reading the
  *policy's* last hidden state, so one policy forward gives both log-probs and values
  (:meth:`SharedValueHead.capture`). The head holds a reference to the policy but does not register it as
  a submodule: its state dict (and checkpoint file) is the head alone, and the policy folder stays a
  plain Hugging Face causal LM.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import safetensors.torch
import torch
from torch import nn

from tandem.errors import ModelError
from tandem.models.forward import cpu_bf16_attention_context, positions_from_mask
from tandem.models.loading import load_causal_lm
from tandem.models.packing import attended


def _value_head(hidden_size: int, seed: int, dtype: torch.dtype) -> nn.Linear:
    """``nn.Linear(hidden, 1)`` with a small deterministic init, so values start near zero."""
    head = nn.Linear(hidden_size, 1)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=gen) / (hidden_size + 1))
        head.bias.zero_()
    return head.to(dtype)


def _response_hidden(
    backbone: nn.Module,
    prompt_ids: torch.Tensor,  # [B, P] long, left padded
    prompt_mask: torch.Tensor,  # [B, P] bool
    response_ids: torch.Tensor,  # [B, R] long, right padded
    response_mask: torch.Tensor,  # [B, R] bool
) -> torch.Tensor:
    """``backbone``'s last hidden state at positions ``P - 1 .. P + R - 2``. ``[B, R, H]``."""
    R = response_ids.shape[1]
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)  # [B, P+R]
    attention_mask = torch.cat([prompt_mask, attended(response_mask)], dim=1).long()  # [B, P+R]
    with cpu_bf16_attention_context(backbone, input_ids.device):
        hidden = backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions_from_mask(attention_mask),
            use_cache=False,
        ).last_hidden_state  # [B, P+R, H]
    return hidden[:, -R - 1 : -1]


def _apply_head(head: nn.Linear, h: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``head`` on hidden states ``[B, R, H]`` -> values ``[B, R]`` float32, zero where the mask is False."""
    v = head(h.to(head.weight.dtype)).squeeze(-1).float()  # [B, R]
    return v * response_mask.to(v.dtype)


def _save_state(module: nn.Module, path: str | os.PathLike) -> None:
    state = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    safetensors.torch.save_file(state, str(path))


def _load_state(module: nn.Module, path: str | os.PathLike) -> None:
    if not Path(path).is_file():
        raise ModelError("critic weights missing", where=str(path), hint="was this a PPO checkpoint?")
    try:
        module.load_state_dict(safetensors.torch.load_file(str(path), device="cpu"), strict=True)
    except RuntimeError as err:
        first = str(err).splitlines()[0]
        raise ModelError(f"critic weights do not match: {first}", where=str(path)) from None


class ValueModel(nn.Module):
    """``backbone`` (the decoder of a causal LM, returning ``last_hidden_state``) + a scalar ``head``."""

    def __init__(self, backbone: nn.Module, hidden_size: int, *, seed: int = 0) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = _value_head(hidden_size, seed, next(backbone.parameters()).dtype)

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
        h = _response_hidden(self.backbone, prompt_ids, prompt_mask, response_ids, response_mask)  # [B, R, H]
        return _apply_head(self.head, h, response_mask)

    def save(self, path: str | os.PathLike) -> None:
        """Write every weight (backbone and head) to one safetensors file."""
        _save_state(self, path)

    def load(self, path: str | os.PathLike) -> None:
        """Load weights written by :meth:`save`, strictly (names and shapes must match)."""
        _load_state(self, path)


def _decoder(lm: nn.Module) -> nn.Module:
    """The decoder of a causal LM (returns ``last_hidden_state``; no LM head)."""
    return lm.get_decoder() if hasattr(lm, "get_decoder") else lm.base_model


def build_value_model(path: str | os.PathLike, *, dtype: str = "float32", seed: int = 0) -> ValueModel:
    """A :class:`ValueModel` whose backbone is the decoder of the causal LM in folder ``path``."""
    lm = load_causal_lm(path, dtype=dtype)
    return ValueModel(_decoder(lm), int(lm.config.hidden_size), seed=seed)


class ValueCapture:
    """Value-head outputs recorded at each LM-head call of one scoring forward; :meth:`values` aligns them
    the way :func:`tandem.models.forward.response_logprobs` aligns the logits."""

    def __init__(self) -> None:
        self.calls: list[torch.Tensor] = []  # one [b, T] per LM-head call, in call order

    def values(self, response_mask: torch.Tensor, runs: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, R]`` float32 (zero where ``response_mask`` is False) from the recorded calls.

        Two call patterns exist, both from one ``response_logprobs`` call without ``micro_batch_size``:
        the plain path (one call over ``>= R + 1`` positions: keep ``[-R-1:-1]``) and the shared-prefix
        path (``[g, 1]`` for the last prompt position of each run's prompt, gathered to the rows by
        ``runs``, which that path needs: :func:`tandem.models.forward.prompt_runs` of the scored prompts,
        ``[B]`` long; then ``[B, R]`` for the response positions: keep ``[:, :-1]``)."""
        B, R = response_mask.shape
        c = self.calls
        shared = len(c) == 2 and c[0].shape[1] == 1 and c[1].shape == (B, R)
        if len(c) == 1 and c[0].shape[0] == B and c[0].shape[1] >= R + 1:
            v = c[0][:, -R - 1 : -1]
        elif shared and runs is not None and runs.shape == (B,) and int(runs.max()) + 1 == c[0].shape[0]:
            v = torch.cat([c[0][runs], c[1][:, :-1]], dim=1)
        else:
            shapes = [tuple(t.shape) for t in c]
            raise ModelError(
                f"cannot align value-head outputs {shapes} with responses [{B}, {R}]",
                where="critic.shared_backbone",
                hint="capture exactly one response_logprobs call, without micro_batch_size (shared prefix: pass runs)",
            )
        return v.float() * response_mask.to(torch.float32)


class SharedValueHead(nn.Module):
    """``critic.shared_backbone``: a scalar head on the policy's last hidden state (the LM head's input).

    Two ways to get values:

    - :meth:`capture` — during a policy scoring forward (the update), a pre-hook on the LM head applies
      the value head to the very hidden states the logits come from: one forward, gradients of the value
      loss reach the backbone. Works with the plain and the shared-prefix paths of ``response_logprobs``.
    - :meth:`values` — values alone (rollout-time values for GAE, critic warm-up): the policy's decoder
      runs *without gradient* (no LM head), so only the head can learn from them.
    """

    def __init__(self, policy: nn.Module, hidden_size: int, *, seed: int = 0) -> None:
        super().__init__()
        self.head = _value_head(hidden_size, seed, next(policy.parameters()).dtype)
        self._policy = (policy,)  # a tuple, so the policy is not a submodule (not in state_dict/parameters)

    @property
    def policy(self) -> nn.Module:
        return self._policy[0]

    @contextlib.contextmanager
    def capture(self) -> Iterator[ValueCapture]:
        """Record the head's output on every LM-head input while the block runs (see :class:`ValueCapture`)."""
        lm_head = self.policy.get_output_embeddings()
        if lm_head is None:
            raise ModelError("the policy has no output embeddings (LM head)", where="critic.shared_backbone")
        cap = ValueCapture()

        def hook(_module: nn.Module, args: tuple) -> None:
            h = args[0]  # [b, T, H] post-norm last hidden state, already sliced to the kept positions
            cap.calls.append(self.head(h.to(self.head.weight.dtype)).squeeze(-1))  # [b, T]

        handle = lm_head.register_forward_pre_hook(hook)
        try:
            yield cap
        finally:
            handle.remove()

    def values(
        self,
        prompt_ids: torch.Tensor,  # [B, P] long, left padded
        prompt_mask: torch.Tensor,  # [B, P] bool
        response_ids: torch.Tensor,  # [B, R] long, right padded
        response_mask: torch.Tensor,  # [B, R] bool
    ) -> torch.Tensor:
        """Value of every response token ``[B, R]`` float32 (same alignment as :meth:`ValueModel.values`).

        The policy's decoder runs under ``no_grad`` in this module's train/eval mode (restored after), so
        gradients reach the head only."""
        policy = self.policy
        decoder = _decoder(policy)
        was_training = policy.training
        policy.train(self.training)
        try:
            with torch.no_grad():
                h = _response_hidden(
                    decoder, prompt_ids, prompt_mask, response_ids, response_mask
                )  # [B, R, H]
        finally:
            policy.train(was_training)
        return _apply_head(self.head, h, response_mask)

    def save(self, path: str | os.PathLike) -> None:
        """Write the head's weights (not the policy's) to one safetensors file."""
        _save_state(self, path)

    def load(self, path: str | os.PathLike) -> None:
        """Load head weights written by :meth:`save`, strictly."""
        _load_state(self, path)


def build_shared_value_head(policy: nn.Module, *, seed: int = 0) -> SharedValueHead:
    """A :class:`SharedValueHead` on ``policy`` (a Hugging Face causal LM, already loaded)."""
    return SharedValueHead(policy, int(policy.config.hidden_size), seed=seed)
