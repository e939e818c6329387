"""Sequence packing: rows laid end to end without padding, and micro-batches sized by a token budget.

Why: a padded micro-batch ``[b, P + R]`` costs what its *longest* row costs, times ``b``. With completion
lengths from 4 to 256 most of that is padding. Packing lays each row's real tokens (prompt, then response)
end to end in a few "bins" of the longest row's length, with position ids restarting at 0 for every
sequence; Hugging Face models (Llama, Qwen2, ... in transformers >= 4.5x) read such position ids, when no
2D attention mask is given, as packed sequences and build a block-diagonal causal mask (sdpa / eager /
flex), or run variable-length kernels (flash-attention). Each sequence then sees exactly the tokens and
positions it sees in the padded layout, so log-probs agree to float error (tested to 1e-5).

:func:`token_budget_chunks` groups rows into micro-batches whose real tokens fit a budget (first-fit
decreasing), keeping whole groups together when the loss needs them. Which rows share a micro-batch does
not change the update's gradient: every micro loss is already a share of the mini-batch loss
(``global_tokens`` / ``global_seqs``, see :mod:`tandem.train.update`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem.errors import ModelError


@dataclass(frozen=True)
class PackedLayout:
    """Where every row's tokens sit in the packed bins, and where each response token's logit comes from.

    ``keep`` lists the bin columns whose logits are needed (the union over bins, sorted) so the LM head
    runs on those columns only; ``src_bin`` / ``src_col`` index the ``[nb, K, V]`` logits of the kept
    columns; ``dst_row`` / ``dst_t`` place the result back in the ``[b, R]`` layout."""

    input_ids: torch.Tensor  # [nb, C] long, padding (id 0) after the last sequence of a bin
    position_ids: torch.Tensor  # [nb, C] long, 0.. per sequence; padding at 0 (a sequence of its own)
    keep: torch.Tensor  # [K] long, sorted bin columns whose logits are used
    src_bin: torch.Tensor  # [N] long, bin of the position predicting each scored token
    src_col: torch.Tensor  # [N] long, index into ``keep`` of that position
    dst_row: torch.Tensor  # [N] long, row of the token in the [b, R] layout
    dst_t: torch.Tensor  # [N] long, response column of the token
    tokens: torch.Tensor  # [N] long, the scored (response) token ids

    real_tokens: int  # tokens of the packed sequences (the rest of ``nb * C`` is padding)

    @property
    def padding(self) -> int:
        """Pad tokens in the bins."""
        return int(self.input_ids.numel()) - self.real_tokens


def attended(response_mask: torch.Tensor) -> torch.Tensor:
    """The response tokens a row attends to: every column up to its last ``response_mask`` token.

    ``response_mask`` marks the tokens that are trained (sampled by the policy). A multi-turn episode's
    response also holds environment tokens between turns (observations: attended, not trained), so the
    mask has holes; the real tokens are still a prefix of the row, ending at its last sampled token.
    For a single-turn row (mask = a prefix) this is the mask itself. ``[B, R]`` -> ``[B, R]`` bool.
    Naive equivalent: ``out[b, : max(nonzero(mask[b])) + 1] = True`` per row."""
    m = response_mask.to(torch.bool)
    return m.flip(-1).long().cummax(dim=-1).values.flip(-1).bool()


def row_lengths(prompt_mask: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Real tokens per row (prompt + attended response). masks ``[B, P]``, ``[B, R]`` -> ``[B]`` long."""
    return prompt_mask.long().sum(dim=1) + attended(response_mask).long().sum(dim=1)


def first_fit_decreasing(sizes: list[int], capacity: int) -> list[list[int]]:
    """Indices of ``sizes`` grouped into bins of ``capacity`` (first fit, largest first). An item larger
    than the capacity gets a bin of its own. Bins are returned in creation order, items ascending."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(sizes)), key=lambda j: (-sizes[j], j)):
        for k, free in enumerate(room):
            if sizes[i] <= free:
                bins[k].append(i)
                room[k] -= sizes[i]
                break
        else:
            bins.append([i])
            room.append(capacity - sizes[i])
    return [sorted(b) for b in bins]


def token_budget_chunks(
    lengths: torch.Tensor, budget: int, group_ids: torch.Tensor | None = None
) -> list[torch.Tensor]:
    """Row indices grouped into micro-batches of at most ``budget`` real tokens (first-fit decreasing).

    ``group_ids`` (``[B]``, given when the loss needs whole groups): the rows of a group always share a
    micro-batch. A row (or group) longer than the budget runs alone: a sequence cannot be split.
    lengths ``[B]`` long -> list of ``[b_i]`` long index tensors, together a partition of ``range(B)``."""
    if budget < 1:
        raise ModelError(f"the token budget must be >= 1, got {budget}", where="trainer.micro_batch_tokens")
    B = int(lengths.numel())
    if group_ids is None:
        units = [[i] for i in range(B)]
    else:
        by_group: dict[int, list[int]] = {}
        for i, g in enumerate(group_ids.tolist()):
            by_group.setdefault(int(g), []).append(i)
        units = list(by_group.values())
    sizes = [int(lengths[u].sum()) for u in units]
    chunks = first_fit_decreasing(sizes, budget)
    return [torch.tensor(sorted(i for k in c for i in units[k]), dtype=torch.long) for c in chunks]


def pack_rows(
    prompt_ids: torch.Tensor,  # [b, P] long
    prompt_mask: torch.Tensor,  # [b, P] bool
    response_ids: torch.Tensor,  # [b, R] long
    response_mask: torch.Tensor,  # [b, R] bool
) -> PackedLayout:
    """Pack each row's real tokens (``prompt[mask]`` then ``response[mask]``) into bins as long as the
    longest row (first-fit decreasing). Response token ``j`` of a row is scored by the logits of the
    row's previous real token, as in the padded layout. Rows without response tokens are left out."""
    device = prompt_ids.device
    prompt_ids, prompt_mask = prompt_ids.cpu(), prompt_mask.cpu().bool()
    response_ids, response_mask = response_ids.cpu(), response_mask.cpu().bool()
    span = attended(response_mask)  # [b, R] real response tokens (sampled and environment ones)
    b, R = response_ids.shape
    p_len = prompt_mask.long().sum(dim=1).tolist()
    r_len = span.long().sum(dim=1).tolist()
    rows = [i for i in range(b) if r_len[i] > 0]
    for i in rows:
        if p_len[i] == 0:
            raise ModelError(f"row {i} has a response but an empty prompt: nothing predicts its first token")
    lengths = [p_len[i] + r_len[i] for i in rows]
    C = max(lengths, default=1)
    bins = first_fit_decreasing(lengths, C)
    ids = torch.zeros(max(len(bins), 1), C, dtype=torch.long)
    pos = torch.zeros_like(ids)
    src_bin, src_pos, dst_row, dst_t = [], [], [], []
    t_index = torch.arange(R)
    for k, members in enumerate(bins):
        offset = 0
        for j in members:
            i = rows[j]
            seq = torch.cat([prompt_ids[i][prompt_mask[i]], response_ids[i][span[i]]])
            n, p = seq.numel(), p_len[i]
            ids[k, offset : offset + n] = seq
            pos[k, offset : offset + n] = torch.arange(n)
            scored = t_index[response_mask[i]]  # [r_i] response columns of the row's sampled tokens
            src_bin.append(torch.full((scored.numel(),), k))
            src_pos.append(offset + p - 1 + scored)
            dst_row.append(torch.full((scored.numel(),), i))
            dst_t.append(scored)
            offset += n
    cat = (lambda xs: torch.cat(xs)) if src_bin else (lambda xs: torch.zeros(0, dtype=torch.long))
    src_pos_t = cat(src_pos)
    keep, src_col = torch.unique(src_pos_t, sorted=True, return_inverse=True)
    d_row, d_t = cat(dst_row), cat(dst_t)
    return PackedLayout(
        input_ids=ids.to(device),
        position_ids=pos.to(device),
        keep=keep.to(device),
        src_bin=cat(src_bin).to(device),
        src_col=src_col.to(device),
        dst_row=d_row.to(device),
        dst_t=d_t.to(device),
        tokens=response_ids[d_row, d_t].to(device),
        real_tokens=sum(lengths),
    )
