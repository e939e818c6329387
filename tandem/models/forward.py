"""Per-token log-probs (and entropy) of responses under a causal LM, for training and for checks.

The sequence fed to the model is ``cat([prompt_ids, response_ids], 1)``: prompts left padded, responses
right padded (see :mod:`tandem.types`). Position ids are ``cumsum(mask) - 1`` clamped at 0, so a prompt's
first real token is at position 0 whatever its padding — the same positions the rollout engine used,
which keeps recomputed log-probs equal to the engine's behaviour log-probs.
"""

from __future__ import annotations

import contextlib
import inspect

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import PreTrainedModel

from tandem.algos import entropy_from_logits, selective_log_softmax
from tandem.errors import ModelError
from tandem.models.packing import attended, pack_rows, row_lengths, token_budget_chunks


def positions_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids ``cumsum(mask) - 1`` clamped at 0: left padding does not shift real positions.
    mask ``[B, T]`` bool/int -> ``[B, T]`` long."""
    return (mask.long().cumsum(dim=1) - 1).clamp(min=0)


def accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether ``model.forward`` can restrict the LM head to the last positions (``logits_to_keep``)."""
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model`` is sharded with FSDP2, where every forward is a collective: all ranks must run
    as many of them (the shared-prefix path then runs its two passes even with nothing to share)."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.fsdp import FSDPModule  # lazily: only a sharded learner has one

    return isinstance(model, FSDPModule)


def cpu_bf16_attention_context(
    model: torch.nn.Module, device: torch.device
) -> contextlib.AbstractContextManager:
    """Pin SDPA to its math kernel for a bf16 forward on the CPU that will be differentiated.

    Why: PyTorch's CPU flash-attention kernel is fast in fp32 and for bf16 inference, but its bf16
    *backward* is ~4x slower than the math kernel (measured: 36 ms vs 9.5 ms fwd+bwd for
    ``[64, 4, 38, 32]``), enough to erase the bf16 matmul speed-up. Same maths, another kernel; a no-op
    (``nullcontext``) on other devices, in fp32, and without grad.
    """
    if device.type != "cpu" or not torch.is_grad_enabled():
        return contextlib.nullcontext()
    autocast_bf16 = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    if autocast_bf16 or getattr(model, "dtype", None) == torch.bfloat16:
        return sdpa_kernel([SDPBackend.MATH])
    return contextlib.nullcontext()


def response_logprobs(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,  # [B, P] long, left padded
    prompt_mask: torch.Tensor,  # [B, P] bool
    response_ids: torch.Tensor,  # [B, R] long, right padded
    response_mask: torch.Tensor,  # [B, R] bool
    *,
    temperature: float = 1.0,
    micro_batch_size: int | None = None,
    with_entropy: bool = False,
    share_prefix: bool = False,
    packed: bool = False,
    micro_batch_tokens: int | None = None,
    dedupe: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of every response token under ``softmax(logits / temperature)``: ``[B, R]`` float32, zero
    where ``response_mask`` is False; plus the entropy of that distribution per token if ``with_entropy``.

    Logits for response token ``t`` come from position ``P - 1 + t``. Only the last ``R + 1`` positions go
    through the LM head (``logits_to_keep``) when the model supports it — naive equivalent: full
    ``model(ids).logits[:, P - 1 : P + R - 1]``. Gradients flow (the trainer uses this for the loss); wrap
    the call in ``torch.no_grad()`` for scoring. ``micro_batch_size`` bounds peak memory by running rows
    in chunks; results equal the full-batch call.

    ``share_prefix`` (rows of a group sharing one prompt, e.g. GRPO's samples): each run of consecutive
    rows with the same prompt (ids and padding) runs that prompt once and shares its KV cache among the
    run's responses (:func:`_shared_prefix_logprobs`) — the same maths, with the prompt's forward and
    backward done once per run instead of once per row. Runs may have any lengths (adaptive or ragged
    groups, a group's greedy answer, a micro-batch that splits a group); a chunk with no two consecutive
    rows sharing a prompt, or a model without ``logits_to_keep``, takes the plain path.

    ``packed``: rows run packed without padding (:func:`_packed_logprobs`), same values to float error.
    ``micro_batch_tokens`` (implies ``packed``, replaces ``micro_batch_size``): chunks of rows whose real
    tokens fit the budget (:func:`tandem.models.packing.token_budget_chunks`).

    ``dedupe``: rows identical in all four tensors (a group's samples that gave the same answer — common
    for short answers and a confident policy) run through the model once (:func:`distinct_rows`); their
    results are copied back to every copy. Same values; the gradient of the copies is summed into the one
    forward (autograd of the gather), which equals back-propagating each copy (float summation order only).
    """
    if temperature <= 0:
        raise ModelError(f"temperature must be > 0 to score tokens, got {temperature}", where="temperature")
    found = distinct_rows(prompt_ids, prompt_mask, response_ids, response_mask) if dedupe else None
    if found is not None:
        keep, back = found  # [u], [B]
        lp, ent = response_logprobs(
            model, prompt_ids[keep], prompt_mask[keep], response_ids[keep], response_mask[keep],
            temperature=temperature, micro_batch_size=micro_batch_size, with_entropy=with_entropy,
            share_prefix=share_prefix, packed=packed, micro_batch_tokens=micro_batch_tokens,
        )  # fmt: skip
        return lp[back], (ent[back] if ent is not None else None)
    if micro_batch_tokens is not None:
        return _token_budget_logprobs(
            model, prompt_ids, prompt_mask, response_ids, response_mask, temperature, with_entropy,
            micro_batch_tokens,
        )  # fmt: skip
    B = prompt_ids.shape[0]
    step = micro_batch_size or B
    logprobs, entropies = [], []
    can_share = share_prefix and not packed and accepts_logits_to_keep(model)
    for start in range(0, B, max(step, 1)):
        rows = slice(start, start + step)
        chunk = (prompt_ids[rows], prompt_mask[rows], response_ids[rows], response_mask[rows])
        runs = prompt_runs(chunk[0], chunk[1]) if can_share else None
        if can_share and runs is None and is_sharded(model):  # FSDP2: every call runs the same passes
            runs = torch.arange(chunk[0].shape[0], device=chunk[0].device)
        if runs is not None:
            lp, ent = _shared_prefix_logprobs(model, *chunk, temperature, with_entropy, runs=runs)
        elif packed:
            lp, ent = _packed_logprobs(model, *chunk, temperature, with_entropy)
        else:
            lp, ent = _chunk_logprobs(model, *chunk, temperature, with_entropy)
        logprobs.append(lp)
        entropies.append(ent)
    out_lp = torch.cat(logprobs) if logprobs else torch.zeros(response_ids.shape, dtype=torch.float32)
    out_ent = torch.cat(entropies) if with_entropy and entropies else None
    return out_lp, out_ent


def unique_rows(key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct rows of ``key`` ``[B, K]``: ``first`` ``[u]`` (each distinct row's first occurrence, in
    row order) and ``back`` ``[B]`` (each row's position in ``first``: ``key == key[first][back]``)."""
    uniq, inverse = torch.unique(key, dim=0, return_inverse=True)  # sorted distinct rows, [B] into them
    B, u = key.shape[0], uniq.shape[0]
    rows = torch.arange(B, device=key.device)
    first = torch.full((u,), B, dtype=torch.long, device=key.device).scatter_reduce(
        0, inverse, rows, reduce="amin"
    )  # [u] first row of each distinct row
    order = torch.argsort(first)  # distinct rows by first occurrence
    position = torch.empty_like(order)
    position[order] = torch.arange(u, device=key.device)
    return first[order], position[inverse]


def distinct_rows(
    prompt_ids: torch.Tensor,  # [B, P]
    prompt_mask: torch.Tensor,  # [B, P]
    response_ids: torch.Tensor,  # [B, R]
    response_mask: torch.Tensor,  # [B, R]
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The distinct rows of a batch (:func:`unique_rows` of all four tensors): ``keep`` ``[u]`` in row
    order, so runs of one prompt stay consecutive for ``share_prefix``, and ``back`` ``[B]``
    (``rows == rows[keep][back]``); None when every row is distinct."""
    if prompt_ids.shape[0] < 2:
        return None
    key = torch.cat([prompt_ids, prompt_mask.long(), response_ids, response_mask.long()], dim=1)  # [B, K]
    keep, back = unique_rows(key)
    return None if keep.numel() == key.shape[0] else (keep, back)


def _chunk_logprobs(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,  # [b, P]
    prompt_mask: torch.Tensor,  # [b, P]
    response_ids: torch.Tensor,  # [b, R]
    response_mask: torch.Tensor,  # [b, R]
    temperature: float,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    R = response_ids.shape[1]
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)  # [b, P+R]
    attention_mask = torch.cat([prompt_mask, attended(response_mask)], dim=1).long()  # [b, P+R]
    position_ids = positions_from_mask(attention_mask)  # [b, P+R]
    kwargs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
    with cpu_bf16_attention_context(model, input_ids.device):
        if accepts_logits_to_keep(model):
            logits = model(**kwargs, use_cache=False, logits_to_keep=R + 1).logits[:, :-1]  # [b, R, V]
        else:
            logits = model(**kwargs, use_cache=False).logits[:, -R - 1 : -1]  # [b, R, V]
    logits = logits.float() / temperature
    mask = response_mask.to(torch.float32)  # [b, R]
    logprobs = selective_log_softmax(logits, response_ids) * mask  # [b, R]
    entropy = entropy_from_logits(logits) * mask if with_entropy else None  # [b, R]
    return logprobs, entropy


def prompt_runs(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor | None:
    """Index of each row's run of consecutive rows with the same prompt (ids and padding): ``[b, P]`` ->
    ``[b]`` long (``0, 0, 0, 1, 2, 2, …``), or None when no two consecutive rows share a prompt (nothing
    to share)."""
    if prompt_ids.shape[0] < 2:
        return None
    same = (prompt_ids[1:] == prompt_ids[:-1]).all(1) & (prompt_mask[1:] == prompt_mask[:-1]).all(1)  # [b-1]
    if not bool(same.any()):
        return None
    starts = torch.cat([same.new_ones(1), ~same])  # [b] True on a run's first row
    return starts.long().cumsum(0) - 1


def _shared_prefix_logprobs(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,  # [b, P], runs of identical prompts (``runs``)
    prompt_mask: torch.Tensor,  # [b, P]
    response_ids: torch.Tensor,  # [b, R]
    response_mask: torch.Tensor,  # [b, R]
    temperature: float,
    with_entropy: bool,
    *,
    runs: torch.Tensor,  # [b] long, the run of each row (:func:`prompt_runs`)
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`_chunk_logprobs` for rows in runs sharing a prompt, with one prompt forward per run.

    1. The ``g`` distinct prompts (one per run) go through the model once (KV cache kept, with its
       autograd graph); the last prompt position's logits score response token 0.
    2. The cache is gathered to the rows (``runs`` as the batch index: its backward sums a run's
       gradients into its one prompt pass) and the responses run on top of it with the full
       ``[prompt_mask, response_mask]`` attention mask and the positions the plain path uses.
    Equal to the plain path up to floating-point summation order (tested to 1e-5)."""
    from transformers import DynamicCache

    R = response_ids.shape[1]
    first_rows = torch.cat([runs.new_ones(1, dtype=torch.bool), runs[1:] != runs[:-1]])  # [b]
    p_ids, p_mask = prompt_ids[first_rows], prompt_mask[first_rows]  # [g, P]
    full_mask = torch.cat([prompt_mask, attended(response_mask)], dim=1).long()  # [b, P+R]
    positions = positions_from_mask(full_mask)[:, prompt_ids.shape[1] :]  # [b, R]
    try:
        cache = DynamicCache(config=model.config)
    except TypeError:  # transformers < 4.56
        cache = DynamicCache()
    # transformers >= 5.x names the argument ``cache`` (``past_key_values`` is deprecated)
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with cpu_bf16_attention_context(model, prompt_ids.device):
        first = model(
            input_ids=p_ids,
            attention_mask=p_mask.long(),
            position_ids=positions_from_mask(p_mask),
            use_cache=True,
            logits_to_keep=1,
            **{key: cache},
        ).logits  # [g, 1, V]
        cache.batch_select_indices(runs)  # [g, …] -> [b, …]
        rest = model(
            input_ids=response_ids,
            attention_mask=full_mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=R,
            **{key: cache},
        ).logits[:, :-1]  # [b, R-1, V]
    logits = torch.cat([first[runs], rest], dim=1).float() / temperature  # [b, R, V]
    mask = response_mask.to(torch.float32)  # [b, R]
    logprobs = selective_log_softmax(logits, response_ids) * mask  # [b, R]
    entropy = entropy_from_logits(logits) * mask if with_entropy else None  # [b, R]
    return logprobs, entropy


def _packed_logprobs(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,  # [b, P]
    prompt_mask: torch.Tensor,  # [b, P]
    response_ids: torch.Tensor,  # [b, R]
    response_mask: torch.Tensor,  # [b, R]
    temperature: float,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`_chunk_logprobs` on packed rows (:func:`tandem.models.packing.pack_rows`): no 2D attention
    mask, position ids restarting per sequence, so the model keeps attention within each sequence. The LM
    head runs only on the columns that predict a response token (``logits_to_keep`` as an index tensor)."""
    b, R = response_ids.shape
    layout = pack_rows(prompt_ids, prompt_mask, response_ids, response_mask)
    kwargs = {"input_ids": layout.input_ids, "position_ids": layout.position_ids, "attention_mask": None}
    with cpu_bf16_attention_context(model, prompt_ids.device):
        if accepts_logits_to_keep(model):
            logits = model(**kwargs, use_cache=False, logits_to_keep=layout.keep).logits  # [nb, K, V]
            picked = logits[layout.src_bin, layout.src_col]  # [N, V]
        else:
            logits = model(**kwargs, use_cache=False).logits  # [nb, C, V]
            picked = logits[layout.src_bin, layout.keep[layout.src_col]]  # [N, V]
    picked = picked.float() / temperature
    index = (layout.dst_row, layout.dst_t)
    zeros = torch.zeros(b, R, dtype=torch.float32, device=response_ids.device)
    logprobs = zeros.index_put(index, selective_log_softmax(picked, layout.tokens))  # [b, R]
    entropy = zeros.index_put(index, entropy_from_logits(picked)) if with_entropy else None  # [b, R]
    return logprobs, entropy


def _token_budget_logprobs(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,  # [B, P]
    prompt_mask: torch.Tensor,  # [B, P]
    response_ids: torch.Tensor,  # [B, R]
    response_mask: torch.Tensor,  # [B, R]
    temperature: float,
    with_entropy: bool,
    budget: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`_packed_logprobs` over chunks of rows whose real tokens fit ``budget``, put back in row
    order. ``[B, R]`` log-probs (and entropy)."""
    out_lp = torch.zeros(response_ids.shape, dtype=torch.float32, device=response_ids.device)
    out_ent = torch.zeros_like(out_lp) if with_entropy else None
    for rows in token_budget_chunks(row_lengths(prompt_mask, response_mask).cpu(), budget):
        rows = rows.to(prompt_ids.device)
        lp, ent = _packed_logprobs(
            model, prompt_ids[rows], prompt_mask[rows], response_ids[rows], response_mask[rows],
            temperature, with_entropy,
        )  # fmt: skip
        out_lp = out_lp.index_copy(0, rows, lp)
        if out_ent is not None and ent is not None:
            out_ent = out_ent.index_copy(0, rows, ent)
    return out_lp, out_ent
