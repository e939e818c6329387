"""Core batch types passed between stages.

A rollout engine produces a :class:`RolloutBatch`; the learner enriches it into an :class:`Experience`.
Shapes: ``B`` samples, ``P`` prompt tokens (left padded), ``R`` response tokens (right padded).
The full sequence fed to the model for scoring is ``cat([prompt_ids, response_ids], dim=1)`` — ``[B, P+R]``.
Logits for response token ``t`` come from position ``P - 1 + t``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch

ROLLOUT_TENSORS = (
    "prompt_ids",
    "prompt_mask",
    "response_ids",
    "response_mask",
    "behavior_logprobs",
    "group_ids",
    "policy_version",
)  # the tensor fields of RolloutBatch, in declaration order (serialisers iterate over them)
# tensor fields that may be None (serialisers send them if set)
OPTIONAL_ROLLOUT_TENSORS = ("turn_rewards", "sample_temperature", "greedy", "reference")


@dataclass
class RolloutBatch:
    """What a rollout engine returns: sampled responses plus everything needed to train on them."""

    prompt_ids: torch.Tensor  # [B, P] long, left padded with pad_token_id
    prompt_mask: torch.Tensor  # [B, P] bool, True on real prompt tokens
    response_ids: torch.Tensor  # [B, R] long, right padded with pad_token_id
    # response_mask: True on sampled tokens (incl. EOS if emitted); False on padding and on a multi-turn
    # episode's environment tokens, which sit before the last sampled token: attended, not trained
    # (tandem.models.packing.attended)
    response_mask: torch.Tensor  # [B, R] bool
    behavior_logprobs: torch.Tensor  # [B, R] float32, log-prob of each sampled token under the engine
    group_ids: torch.Tensor  # [B] long, samples of one prompt share an id
    policy_version: torch.Tensor  # [B] long, weight version that generated each sample
    prompts: list[str]  # [B] prompt text (repeated n times per prompt)
    completions: list[str]  # [B] decoded response text (stop string / EOS stripped)
    finish_reasons: list[str]  # [B] "stop" (EOS or stop string) or "length"
    sample_ids: list[str] = field(default_factory=list)  # [B] globally unique ids
    extras: list[dict] = field(default_factory=list)  # [B] extra dataset columns per sample (for rewards)
    # turn_rewards: the environment rewards of a multi-turn episode, each on the last sampled token of the
    # turn whose step earned it (env.turn_rewards=per_turn); 0 elsewhere. They are part of the sequence
    # score already: token-level estimators put them here and the rest of the score on the last token.
    # None: the whole score is earned at the end (single-turn batches; env.turn_rewards=sum)
    turn_rewards: torch.Tensor | None = None  # [B, R] float32
    # sample_temperature: the temperature each row was sampled at, when it is not rollout.temperature
    # (rollout.adaptive_temperature); the learner scores the batch at it. None: rollout.temperature
    sample_temperature: torch.Tensor | None = None  # [B] float32
    # greedy: True on the rows decoded greedily and added to their group (rollout.greedy_in_group; ReMax's
    # baseline). None: no greedy rows
    greedy: torch.Tensor | None = None  # [B] bool
    # reference: True on the rows holding the prompt file's reference completion, added to groups no
    # sample solved (rollout.reference_answers). None: no reference rows
    reference: torch.Tensor | None = None  # [B] bool

    @property
    def batch_size(self) -> int:
        return int(self.response_ids.shape[0])

    @property
    def response_lengths(self) -> torch.Tensor:  # [B] long
        return self.response_mask.sum(dim=1)

    def columns(self) -> dict[str, list]:
        """Extra dataset columns as keyword lists, one entry per sample (TRL's ``**columns``)."""
        keys = sorted({k for e in self.extras for k in e})
        return {k: [e.get(k) for e in self.extras] for k in keys}

    @property
    def truncated(self) -> torch.Tensor:  # [B] bool
        """Samples cut off before they finished (finish reason ``"length"``)."""
        return torch.tensor([f == "length" for f in self.finish_reasons], dtype=torch.bool)

    def completion_ids(self) -> list[list[int]]:
        """Each sample's generated token ids (its ``response_mask``ed tokens), TRL's ``completion_ids``.
        Two ``tolist`` calls, not one per row: this runs on every step's scoring."""
        masks = self.response_mask.tolist()
        return [
            [t for t, keep in zip(row, m, strict=True) if keep]
            for row, m in zip(self.response_ids.tolist(), masks, strict=True)
        ]

    def select(self, index: torch.Tensor | list[int]) -> RolloutBatch:
        """Rows ``index`` of every field (tensors and lists alike)."""
        return _select(self, index)


@dataclass
class Experience:
    """A rollout batch enriched by the learner: rewards, log-probs, advantages. All ``[B, R]`` tensors are
    zero where ``response_mask`` is False."""

    rollout: RolloutBatch
    scores: torch.Tensor  # [B] float32, sequence reward (after shaping)
    old_logprobs: torch.Tensor | None  # [B, R] float32, trainer log-probs before the update (proximal);
    # None = on-policy single pass: the update uses its own first forward (ratio 1)
    advantages: torch.Tensor  # [B, R] float32
    returns: torch.Tensor  # [B, R] float32
    ref_logprobs: torch.Tensor | None = None  # [B, R] float32, reference policy, if β > 0
    values: torch.Tensor | None = None  # [B, R] float32, critic values, if a critic is used
    token_rewards: torch.Tensor | None = None  # [B, R] float32, e.g. KL-in-reward penalty

    @property
    def batch_size(self) -> int:
        return self.rollout.batch_size

    def select(self, index: torch.Tensor | list[int]) -> Experience:
        """Rows ``index`` of every field, for mini- and micro-batching."""
        idx = torch.as_tensor(index, dtype=torch.long)
        kwargs = {"rollout": self.rollout.select(idx)}
        for f in fields(self):
            if f.name == "rollout":
                continue
            v = getattr(self, f.name)
            kwargs[f.name] = None if v is None else v[idx]
        return Experience(**kwargs)


def _select(batch: RolloutBatch, index: torch.Tensor | list[int]) -> RolloutBatch:
    idx = torch.as_tensor(index, dtype=torch.long)
    ilist = idx.tolist()
    kwargs = {}
    for f in fields(batch):
        v = getattr(batch, f.name)
        if isinstance(v, torch.Tensor):
            kwargs[f.name] = v[idx]
        elif isinstance(v, list):
            kwargs[f.name] = [v[i] for i in ilist] if v else []
        else:  # an optional tensor that is None
            kwargs[f.name] = v
    return replace(batch, **kwargs)


def concat_rollouts(batches: list[RolloutBatch], pad_token_id: int) -> RolloutBatch:
    """Concatenate rollout batches, re-padding prompts on the left and responses on the right."""
    if len(batches) == 1:
        return batches[0]
    P = max(b.prompt_ids.shape[1] for b in batches)
    R = max(b.response_ids.shape[1] for b in batches)

    def lpad(t: torch.Tensor, width: int, value) -> torch.Tensor:
        return torch.nn.functional.pad(t, (width - t.shape[1], 0), value=value)

    def rpad(t: torch.Tensor, width: int, value) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value)

    return RolloutBatch(
        prompt_ids=torch.cat([lpad(b.prompt_ids, P, pad_token_id) for b in batches]),
        prompt_mask=torch.cat([lpad(b.prompt_mask, P, False) for b in batches]),
        response_ids=torch.cat([rpad(b.response_ids, R, pad_token_id) for b in batches]),
        response_mask=torch.cat([rpad(b.response_mask, R, False) for b in batches]),
        behavior_logprobs=torch.cat([rpad(b.behavior_logprobs, R, 0.0) for b in batches]),
        group_ids=torch.cat([b.group_ids for b in batches]),
        policy_version=torch.cat([b.policy_version for b in batches]),
        prompts=[p for b in batches for p in b.prompts],
        completions=[c for b in batches for c in b.completions],
        finish_reasons=[r for b in batches for r in b.finish_reasons],
        sample_ids=[s for b in batches for s in b.sample_ids],
        extras=[e for b in batches for e in b.extras],
        turn_rewards=_concat_turn_rewards(batches, R),
        sample_temperature=_concat_temperatures(batches),
        greedy=_concat_flags(batches, "greedy"),
        reference=_concat_flags(batches, "reference"),
    )


def _concat_flags(batches: list[RolloutBatch], name: str) -> torch.Tensor | None:
    """The batches' row flags ``name`` (``greedy``, ``reference``) end to end (a batch without them has no
    such rows); None when no batch has them."""
    flags = [getattr(b, name) for b in batches]
    if all(f is None for f in flags):
        return None
    return torch.cat(
        [
            torch.zeros(b.batch_size, dtype=torch.bool) if f is None else f
            for b, f in zip(batches, flags, strict=True)
        ]
    )


def _concat_temperatures(batches: list[RolloutBatch]) -> torch.Tensor | None:
    """The batches' ``sample_temperature`` end to end; None when no batch has them (a batch without them
    next to one with them is a bug: its temperature is unknown here)."""
    if all(b.sample_temperature is None for b in batches):
        return None
    if any(b.sample_temperature is None for b in batches):
        raise ValueError("cannot concatenate rollouts with and without sample_temperature")
    return torch.cat([b.sample_temperature for b in batches])  # type: ignore[misc]


def batch_temperature(batch: RolloutBatch) -> float | None:
    """The one temperature every row of ``batch`` was sampled at (``sample_temperature``), or None when
    the batch does not say (sampled at ``rollout.temperature``). A learner scores a batch at one
    temperature, so rows sampled at different ones are a ValueError."""
    t = batch.sample_temperature
    if t is None or t.numel() == 0:
        return None
    first = float(t[0])
    if not bool((t == t[0]).all()):
        raise ValueError(f"a batch's rows were sampled at different temperatures ({sorted(set(t.tolist()))})")
    return first


def _concat_turn_rewards(batches: list[RolloutBatch], width: int) -> torch.Tensor | None:
    """The batches' ``turn_rewards`` side by side ``[B, width]``: zeros for a batch without them (its whole
    score is earned at the end); None when no batch has them."""
    if all(b.turn_rewards is None for b in batches):
        return None
    parts = [
        torch.zeros(b.batch_size, width)
        if b.turn_rewards is None
        else torch.nn.functional.pad(b.turn_rewards.float(), (0, width - b.turn_rewards.shape[1]))
        for b in batches
    ]
    return torch.cat(parts)
