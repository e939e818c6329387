"""Batched decoding where every row carries its own sampling parameters.

:class:`~tandem.rollout.hf.HFEngine` samples a whole batch with one ``SamplingParams``. A server batches
unrelated requests, so here each row has its own temperature, top-k, top-p, seed, token limit and stop
strings. The model forward (prefill + one cached single-token step per iteration) is shared by all rows;
only the cheap sampling step is split: rows are grouped by their sampling settings (temperature, top-k,
top-p, min-p, repetition penalty) and each group is sampled with :func:`tandem.rollout.sampling.sample_next`; a row with a seed gets its own generator so
its output does not depend on which other requests shared the batch. Before sampling, a row's logits get
its ``logit_bias`` and its presence/frequency penalties (over the tokens it generated so far); every
sampled token carries its log-prob under the distribution it was drawn from
(:func:`tandem.rollout.sampling.behaviour_logprobs` of the shaped logits: the numbers training records
when there is no bias or penalty) and, when asked, the row's likeliest alternatives.

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
from tandem.rollout.sampling import behaviour_logprobs, sample_next, seen_tokens
from tandem.rollout.stepper import DecodeStepper, HFStepper
from tandem.rollout.stops import StopStrings


@dataclass
class RowRequest:
    """One sequence to generate: prompt token ids and its own sampling parameters.

    ``top_logprobs``: how many likeliest alternatives to report per token (the sampled token's log-prob
    is always kept); ``prompt_logprobs``: also score the prompt tokens (``echo`` with ``logprobs``);
    ``logit_bias``: token id -> value added to its logit; penalties as in the OpenAI API.
    ``prompt_text``: the prompt as text (None for a token-id prompt), for engines that take text."""

    prompt_ids: list[int]
    params: SamplingParams
    cancelled: Callable[[], bool] = field(default=lambda: False)
    top_logprobs: int = 0
    prompt_logprobs: bool = False
    logit_bias: dict[int, float] = field(default_factory=dict)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    prompt_text: str | None = None


@dataclass
class TokenLogprob:
    """A token, its log-prob, and the likeliest tokens at its position ``(id, log-prob)``, best first."""

    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class RowResult:
    """Generated token ids of one row and why it ended (``"stop"`` or ``"length"``), with one
    :class:`TokenLogprob` per generated token and, when asked, per prompt token (the first is None)."""

    token_ids: list[int]
    finish_reason: str
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] | None = None


@dataclass
class PromptScores:
    """A row's prompt log-probs (:func:`prompt_logprobs`), streamed before its first token."""

    entries: list[TokenLogprob | None]


StreamEvent = TokenLogprob | PromptScores
TokenCallback = Callable[[int, StreamEvent], None]  # (row index, prompt scores or the new token)


def make_stepper(
    model: PreTrainedModel, batch_size: int, max_len: int, fast_decode: bool | None = None
) -> DecodeStepper:
    """The model's own stepper if it has one (ONNX exports), the fast Llama stepper where it is exact
    for ``model`` (unless ``fast_decode`` is False: the hf engine's option), else the generic HF one."""
    own = getattr(model, "make_stepper", None)
    if own is not None:
        return own(batch_size, max_len)
    if fast_decode is not False and supports_fast_decode(model, max_len):
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
        self.groups: dict[tuple[float, int, float, float, float], list[int]] = {}
        self.seeded: dict[int, torch.Generator] = {}
        self.rows = rows
        self.params = [r.params for r in rows]
        for i, row in enumerate(rows):
            p = row.params
            if p.seed is not None and not p.greedy:
                self.seeded[i] = torch.Generator(device=device).manual_seed(p.seed)
            else:
                key = (p.temperature, p.top_k, p.top_p, p.min_p, p.repetition_penalty)
                self.groups.setdefault(key, []).append(i)
        self.biased = any(r.logit_bias for r in rows)
        self.penalised = any(r.presence_penalty or r.frequency_penalty for r in rows)
        self.presence = torch.tensor([[r.presence_penalty] for r in rows], device=device)  # [B, 1]
        self.frequency = torch.tensor([[r.frequency_penalty] for r in rows], device=device)  # [B, 1]
        self.bias: torch.Tensor | None = None  # [B, V], built at the first step (V known then)
        self.counts: torch.Tensor | None = None  # [B, V] float, how often each row generated each token
        self.repeats = any(r.params.penalised for r in rows)  # a repetition penalty: track seen tokens
        self.seen: torch.Tensor | None = None  # [B, V] bool, prompt and generated tokens, at the first step

    def shape(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits with each row's ``logit_bias`` added and its penalties subtracted: ``[B, V]`` float32.
        Without bias or penalty this is ``logits.float()``, exactly what the rollout engine samples."""
        out = logits.float()
        if self.biased:
            if self.bias is None:
                self.bias = torch.zeros_like(out)
                for i, row in enumerate(self.rows):
                    for token, value in row.logit_bias.items():
                        self.bias[i, token] = value
            out = out + self.bias
        if self.penalised:
            if self.counts is None:
                self.counts = torch.zeros_like(out)
            out = out - self.presence * (self.counts > 0) - self.frequency * self.counts
        return out

    def record(self, tokens: torch.Tensor, active: torch.Tensor) -> None:
        """Count the tokens just sampled by ``active`` rows (for the penalties). ``[B]`` long, ``[B]`` bool."""
        rows = active.nonzero().flatten()
        if self.counts is not None:
            self.counts[rows, tokens[rows]] += 1
        if self.seen is not None:
            self.seen[rows, tokens[rows]] = True

    def _seen(self, logits: torch.Tensor) -> torch.Tensor | None:
        """The tokens each row has seen, for the repetition penalty (None without one)."""
        if self.repeats and self.seen is None:
            ids, mask = _pad_left(self.rows, 0)  # padding is masked out
            self.seen = seen_tokens(ids.to(logits.device), mask.to(logits.device), logits.shape[-1])
        return self.seen

    def __call__(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Next token of every row and its log-prob: ``[B, V]`` -> ``([B] long, [B] float32)``."""
        order: list[int] = []
        parts: list[tuple[torch.Tensor, torch.Tensor]] = []
        seen = self._seen(logits)
        for rows in self.groups.values():
            order += rows
            parts.append(
                sample_next(logits[rows], self.params[rows[0]], None, None if seen is None else seen[rows])
            )
        for row, generator in self.seeded.items():
            order.append(row)
            row_seen = None if seen is None else seen[row : row + 1]
            parts.append(sample_next(logits[row : row + 1], self.params[row], generator, row_seen))
        index = torch.tensor(order, device=logits.device)
        tokens = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
        logprobs = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        tokens[index] = torch.cat([new for new, _ in parts])  # one scatter instead of one per row
        logprobs[index] = torch.cat([lp for _, lp in parts])
        return tokens, logprobs

    def events(
        self, logits: torch.Tensor, tokens: torch.Tensor, logprobs: torch.Tensor, live: list[int]
    ) -> list[TokenLogprob]:
        """One :class:`TokenLogprob` per row in ``live``, with the row's ``top_logprobs`` alternatives
        from the (shaped) ``logits`` ``[B, V]``."""
        ids, lps = tokens.tolist(), logprobs.tolist()
        out = []
        for row in live:
            k = self.rows[row].top_logprobs
            top = []
            if k:
                full = behaviour_logprobs(logits[row : row + 1], self.params[row])[0]  # [V]
                top = _top(full, k)
            out.append(TokenLogprob(ids[row], lps[row], top))
        return out


def _top(logprobs: torch.Tensor, k: int) -> list[tuple[int, float]]:
    """The ``k`` likeliest ``(token id, log-prob)`` of a ``[V]`` log-prob vector, best first."""
    values, index = torch.topk(logprobs, min(k, logprobs.shape[-1]))
    return list(zip(index.tolist(), values.tolist(), strict=True))


def sequence_logits(model: PreTrainedModel, ids: torch.Tensor) -> torch.Tensor:
    """Logits at every position of unpadded ``ids`` ``[B, L]`` -> ``[B, L, V]``; a model may bring its
    own ``sequence_logits`` (ONNX exports)."""
    own = getattr(model, "sequence_logits", None)
    if own is not None:
        return own(ids)
    mask = torch.ones_like(ids)
    return model(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask)).logits


def prompt_logprobs(model: PreTrainedModel, row: RowRequest) -> list[TokenLogprob | None]:
    """Log-prob of each prompt token given the ones before it, under the row's sampling distribution
    (``logit_bias`` added, then temperature; penalties apply to generated tokens only). The first token
    has no context: None."""
    device = torch.device(model.device)
    ids = torch.tensor([row.prompt_ids], dtype=torch.long, device=device)  # [1, P]
    logits = sequence_logits(model, ids)[0, :-1].float()  # [P-1, V], position t predicts token t+1
    for token, value in row.logit_bias.items():
        logits[:, token] += value
    full = behaviour_logprobs(logits, row.params)  # [P-1, V]
    chosen = full.gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1).tolist()  # [P-1]
    out: list[TokenLogprob | None] = [None]
    for t, token in enumerate(row.prompt_ids[1:]):
        top = _top(full[t], row.top_logprobs) if row.top_logprobs else []
        out.append(TokenLogprob(token, chosen[t], top))
    return out


def decode_rows(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rows: list[RowRequest],
    on_token: TokenCallback | None = None,
    fast_decode: bool | None = None,
) -> list[RowResult]:
    """Generate every row of ``rows`` in one batch; ``on_token(row, event)`` is called with the row's
    :class:`PromptScores` first (rows that asked for them), then one :class:`TokenLogprob` per new token.
    ``fast_decode`` False forces the generic stepper (:func:`make_stepper`).

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
    events: list[list[TokenLogprob]] = [[] for _ in rows]
    with torch.inference_mode():
        scored = [prompt_logprobs(model, r) if r.prompt_logprobs else None for r in rows]
        for row, entries in enumerate(scored):
            if entries is not None and on_token is not None:
                on_token(row, PromptScores(entries))
        stepper = make_stepper(model, B, P + T, fast_decode)
        logits = stepper.prefill(
            prompt_ids.to(device), attn[:, :P], positions_from_mask(prompt_mask).to(device)
        )  # [B, V]
        for t in range(T):
            finished |= torch.tensor([r.cancelled() for r in rows], device=device)
            shaped = sampler.shape(logits)  # [B, V] with logit_bias and penalties
            new, new_lp = sampler(shaped)  # [B], [B]
            new = new.masked_fill(finished, pad)
            tokens[:, t] = new
            active = ~finished
            lengths += active.long()
            hit = active & torch.isin(new, eos)
            for stop, members in stops:
                hit |= stop.check(tokens[:, : t + 1], new, active & ~hit & members)
            live = active.nonzero().flatten().tolist()
            for row, event in zip(live, sampler.events(shaped, new, new_lp, live), strict=True):
                events[row].append(event)
                if on_token is not None:
                    on_token(row, event)
            sampler.record(new, active)
            stopped |= hit
            finished |= hit | (lengths >= limits)
            if bool(finished.all()):
                break
            attn[:, P + t] = 1
            logits = stepper.step(tokens[:, t : t + 1], attn[:, : P + t + 1], next_pos + t)
    results = _results(tokenizer, rows, tokens.cpu(), lengths.cpu(), stopped.cpu(), stops)
    for result, row_events, row_scored in zip(results, events, scored, strict=True):
        result.logprobs, result.prompt_logprobs = row_events, row_scored
    return results


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
