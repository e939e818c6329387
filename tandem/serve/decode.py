"""Batched decoding where every row carries its own sampling parameters.

:class:`~tandem.rollout.hf.HFEngine` samples a whole batch with one ``SamplingParams``. A server batches
unrelated requests, so here each row has its own temperature, top-k, top-p, seed, token limit and stop
strings. The model forward (prefill + one cached single-token step per iteration) is shared by all rows;
only the cheap sampling step is split: rows are grouped by ``(temperature, top_k, top_p)`` and each group
is sampled with :func:`tandem.rollout.sampling.sample_next`; a row with a seed gets its own generator so
its output does not depend on which other requests shared the batch.

Naive equivalent: ``for row in rows: HFEngine.generate([row.prompt], row.params)`` — same tokens for greedy
and seeded rows, ``len(rows)`` times the forward passes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tandem.models.forward import positions_from_mask
from tandem.rollout.base import SamplingParams
from tandem.rollout.llama_decode import LlamaStepper, supports_fast_decode
from tandem.rollout.sampling import sample_next
from tandem.rollout.stepper import DecodeStepper, HFStepper
from tandem.rollout.stops import StopStrings


@dataclass
class RowRequest:
    """One sequence to generate: prompt token ids and its own sampling parameters."""

    prompt_ids: list[int]
    params: SamplingParams
    cancelled: Callable[[], bool] = field(default=lambda: False)


@dataclass
class RowResult:
    """Generated token ids of one row and why it ended (``"stop"`` or ``"length"``)."""

    token_ids: list[int]
    finish_reason: str
    text: str = ""


TokenCallback = Callable[[int, int], None]  # (row index, new token id)


def make_stepper(model: PreTrainedModel, batch_size: int, max_len: int) -> DecodeStepper:
    """The model's own stepper if it has one (ONNX exports), the fast Llama stepper where it is exact
    for ``model``, else the generic HF one."""
    own = getattr(model, "make_stepper", None)
    if own is not None:
        return own(batch_size, max_len)
    if supports_fast_decode(model, max_len):
        return LlamaStepper(model, batch_size, max_len)
    return HFStepper(model)


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    ids = {tokenizer.eos_token_id, getattr(model.config, "eos_token_id", None)}
    flat: set[int] = set()
    for value in ids:
        if isinstance(value, list):
            flat.update(value)
        elif value is not None:
            flat.add(int(value))
    return sorted(flat)


def _pad_left(rows: list[RowRequest], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompt ids ``[B, P]`` long and mask ``[B, P]`` bool."""
    P = max(len(r.prompt_ids) for r in rows)
    ids = torch.full((len(rows), P), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), P), dtype=torch.bool)
    for i, row in enumerate(rows):
        ids[i, P - len(row.prompt_ids) :] = torch.tensor(row.prompt_ids, dtype=torch.long)
        mask[i, P - len(row.prompt_ids) :] = True
    return ids, mask


class RowSampler:
    """Samples the next token of every active row with that row's own parameters."""

    def __init__(self, rows: list[RowRequest], device: torch.device) -> None:
        self.groups: dict[tuple[float, int, float], list[int]] = {}
        self.seeded: dict[int, torch.Generator] = {}
        self.params = [r.params for r in rows]
        for i, row in enumerate(rows):
            p = row.params
            if p.seed is not None and not p.greedy:
                self.seeded[i] = torch.Generator(device=device).manual_seed(p.seed)
            else:
                self.groups.setdefault((p.temperature, p.top_k, p.top_p), []).append(i)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:  # [B, V] -> [B] long
        tokens = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
        for rows in self.groups.values():
            index = torch.tensor(rows, device=logits.device)
            tokens[index] = sample_next(logits[index], self.params[rows[0]])[0]
        for row, generator in self.seeded.items():
            tokens[row] = sample_next(logits[row : row + 1], self.params[row], generator)[0][0]
        return tokens


def decode_rows(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rows: list[RowRequest],
    on_token: TokenCallback | None = None,
) -> list[RowResult]:
    """Generate every row of ``rows`` in one batch; ``on_token(row, token)`` is called as tokens appear.

    A row ends at EOS, at one of its stop strings, at its own ``max_new_tokens``, or when its
    ``cancelled()`` turns true (a client that disconnected: the row is dropped and gets no more tokens).
    """
    device = torch.device(model.device)
    pad = tokenizer.pad_token_id
    prompt_ids, prompt_mask = _pad_left(rows, pad)  # [B, P] each
    B, P = prompt_ids.shape
    limits = torch.tensor([r.params.max_new_tokens for r in rows], device=device)  # [B]
    T = int(limits.max())
    stops = _stop_groups(tokenizer, rows, device)
    sampler = RowSampler(rows, device)
    eos = torch.tensor(_eos_ids(model, tokenizer), dtype=torch.long, device=device)
    attn = torch.zeros((B, P + T), dtype=torch.long, device=device)  # [B, P+T]
    attn[:, :P] = prompt_mask.long()
    tokens = torch.full((B, T), pad, dtype=torch.long, device=device)  # [B, T]
    lengths = torch.zeros(B, dtype=torch.long, device=device)  # [B]
    finished = torch.zeros(B, dtype=torch.bool, device=device)  # [B]
    stopped = torch.zeros(B, dtype=torch.bool, device=device)  # [B] ended by EOS / stop string
    next_pos = prompt_mask.long().sum(dim=1, keepdim=True).to(device)  # [B, 1]
    with torch.inference_mode():
        stepper = make_stepper(model, B, P + T)
        logits = stepper.prefill(
            prompt_ids.to(device), attn[:, :P], positions_from_mask(prompt_mask).to(device)
        )  # [B, V]
        for t in range(T):
            finished |= torch.tensor([r.cancelled() for r in rows], device=device)
            new = sampler(logits).masked_fill(finished, pad)  # [B]
            tokens[:, t] = new
            active = ~finished
            lengths += active.long()
            hit = active & torch.isin(new, eos)
            for stop, members in stops:
                hit |= stop.check(tokens[:, : t + 1], new, active & ~hit & members)
            if on_token is not None:
                for row in active.nonzero().flatten().tolist():
                    on_token(row, int(new[row]))
            stopped |= hit
            finished |= hit | (lengths >= limits)
            if bool(finished.all()):
                break
            attn[:, P + t] = 1
            logits = stepper.step(tokens[:, t : t + 1], attn[:, : P + t + 1], next_pos + t)
    return _results(tokenizer, rows, tokens.cpu(), lengths.cpu(), stopped.cpu(), stops)


def _stop_groups(
    tokenizer: PreTrainedTokenizerBase, rows: list[RowRequest], device: torch.device
) -> list[tuple[StopStrings, torch.Tensor]]:
    """One StopStrings checker per distinct stop list, with the ``[B]`` bool mask of rows using it."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, row in enumerate(rows):
        if row.params.stop:
            groups.setdefault(tuple(row.params.stop), []).append(i)
    out = []
    for stop, members in groups.items():
        mask = torch.zeros(len(rows), dtype=torch.bool)
        mask[members] = True
        out.append((StopStrings(tokenizer, list(stop)), mask.to(device)))
    return out


def _results(
    tokenizer: PreTrainedTokenizerBase,
    rows: list[RowRequest],
    tokens: torch.Tensor,  # [B, T]
    lengths: torch.Tensor,  # [B]
    stopped: torch.Tensor,  # [B] bool
    stops: list[tuple[StopStrings, torch.Tensor]],
) -> list[RowResult]:
    """Decode each row's tokens and cut its stop strings."""
    results = []
    for i in range(len(rows)):
        ids = tokens[i, : int(lengths[i])].tolist()
        text = tokenizer.decode(ids, skip_special_tokens=True)
        for stop, members in stops:
            if bool(members[i]):
                text = stop.cut(text)[0]
        reason = "stop" if bool(stopped[i]) else "length"
        results.append(RowResult(token_ids=ids, finish_reason=reason, text=text))
    return results
