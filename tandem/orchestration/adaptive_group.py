"""Adaptive group size (``algorithm.adaptive_group``): more samples for prompts whose group carried no signal.

A group whose rewards are all equal has a zero group-relative advantage: the update learns nothing from
it. With a weak policy most such groups are all-fail (no sample solved the prompt), and 8 samples are
too few to find the rare success the policy can make. :func:`grow_groups` keeps sampling *the same
prompt into the same group* — unlike DAPO's dynamic sampling, which drops the group and draws other
prompts — until a reward differs (the group is *rescued*) or the group holds ``max_n`` samples. The
enlarged, ragged groups then go to the advantage estimator, whose group statistics are per group id.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tandem.algos import group_outcomes
from tandem.types import RolloutBatch, concat_rollouts

# Asked for ``[(group id, samples), ...]`` and the growth round (1, 2, ...): that many new samples of
# each group's prompt, carrying that group id, and their scores ``[b]``.
MoreSamples = Callable[[list[tuple[int, int]], int], tuple[RolloutBatch, torch.Tensor]]


def eligible_groups(
    mean: torch.Tensor, all_equal: torch.Tensor, which: str, eps: float = 1e-6
) -> torch.Tensor:
    """Which all-equal groups to extend: ``all_fail`` (shared score <= 0: for a 0/1 verifier none solved),
    ``all_pass`` (shared score > 0) or ``all_equal`` (both) — the split of
    :func:`tandem.algos.degeneracy_metrics`. mean, all_equal ``[G]`` -> ``[G]`` bool."""
    high = mean > eps
    if which == "all_fail":
        return all_equal & ~high
    if which == "all_pass":
        return all_equal & high
    if which == "all_equal":
        return all_equal
    raise ValueError(f"algorithm.adaptive_group.which: unknown value {which!r}")


def join_groups(
    batches: list[RolloutBatch], scores: list[torch.Tensor], pad_token_id: int
) -> tuple[RolloutBatch, torch.Tensor]:
    """Batches whose rows share group ids, and their scores ``[b_i]``, as one batch with every group's rows
    together (stable order by group id: a group's first batch's rows first)."""
    out = concat_rollouts(batches, pad_token_id)
    out_scores = torch.cat(scores)
    order = torch.sort(out.group_ids, stable=True).indices
    return out.select(order), out_scores[order]


def grow_groups(
    first: tuple[RolloutBatch, torch.Tensor],
    more: MoreSamples,
    *,
    max_n: int,
    per_round: int,
    which: str,
    pad_token_id: int,
) -> tuple[RolloutBatch, torch.Tensor, dict[str, float]]:
    """Extend the eligible all-equal groups of ``first`` (see :func:`eligible_groups`) round by round:
    each group still all-equal gets ``min(per_round, max_n - size)`` more samples from ``more``, until its
    rewards differ or it holds ``max_n``. Returns the batch with every group's rows together (stable
    order by group id), its scores, and the metrics

    * ``adaptive/extra_samples``: samples drawn beyond the first round;
    * ``adaptive/extended_frac``: share of the step's groups that were eligible;
    * ``adaptive/rescued_frac``: share of the eligible groups whose rewards differ at the end (0 if none);
    * ``adaptive/all_equal_frac``: share of all groups still all-equal after growing (compare
      ``groups/all_equal_frac``, measured on the first round);
    * ``adaptive/rounds``: growth rounds run; ``adaptive/group_size_max``: the largest group.
    """
    batch, scores = first
    if batch.batch_size == 0:
        return batch, scores, {}
    ids, inverse, mean, equal = group_outcomes(scores, batch.group_ids)  # ids stay the same: no new groups
    extended = eligible_groups(mean, equal, which)  # [G]
    active = extended
    batches, all_scores = [batch], [scores]
    round_ = 0
    while True:
        sizes = torch.bincount(inverse, minlength=ids.numel())  # [G]
        active = active & equal & (sizes < max_n)  # groups still to grow
        if not bool(active.any()):
            break
        round_ += 1
        asks = [
            (int(ids[g]), min(per_round, max_n - int(sizes[g]))) for g in active.nonzero().squeeze(1).tolist()
        ]
        new, new_scores = more(asks, round_)
        batches.append(new)
        all_scores.append(new_scores)
        grown = torch.cat([b.group_ids for b in batches])
        _, inverse, _, equal = group_outcomes(torch.cat(all_scores), grown)
    out, out_scores = join_groups(batches, all_scores, pad_token_id)
    n_ext = int(extended.sum())
    rescued = int((extended & ~equal).sum())
    metrics = {
        "adaptive/extra_samples": float(out.batch_size - batch.batch_size),
        "adaptive/extended_frac": n_ext / ids.numel(),
        "adaptive/rescued_frac": rescued / n_ext if n_ext else 0.0,
        "adaptive/all_equal_frac": float(equal.float().mean()),
        "adaptive/rounds": float(round_),
        "adaptive/group_size_max": float(sizes.max()),
    }
    return out, out_scores, metrics
