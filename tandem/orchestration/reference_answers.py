"""Reference answers in all-fail groups (``rollout.reference_answers``): off-policy guidance from the
prompt file.

A group whose samples all scored the same carries no group-relative signal; with a weak policy most
such groups are all-fail, and adaptive group size (``algorithm.adaptive_group``) only helps where the
policy can still find the answer. Many prompt files hold the answer itself (an ``answer`` column, as the
reward function reads). :func:`add_references` gives each group that stayed all-equal one more row: the
reference completion built from that column, tokenised as a sampled completion would be (ending with EOS,
or with a stop string the template holds), scored by the run's own reward and by the engine's current weights (its
behaviour log-probs, so the learner treats it as a sample of the policy that made the batch). It joins
its group only when it scores above the group's shared score; in ``mode=group`` its positive
group-relative advantage then pulls the policy towards it and the failed samples' advantage turns negative
(LUFFY's mixed-policy GRPO, off-policy traces in the group, restricted to the groups the policy cannot
solve by itself); in ``mode=imitate`` it carries its group's shared score, so the group's advantages stay
0, and the learner adds ``coef ×`` the mean NLL of the reference tokens (supervised learning on the
prompts the policy fails, as ReLIFT interleaves it with RL) without pushing the failed samples down.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.utils.rnn import pad_sequence

from tandem.algos import group_outcomes
from tandem.config.rollout import RolloutConfig
from tandem.config.schema import TandemConfig
from tandem.data import PromptDataset
from tandem.errors import ConfigError, DataError
from tandem.monitor import PhaseTimer
from tandem.orchestration.adaptive_group import join_groups
from tandem.rollout.base import ScoresCompletions
from tandem.types import RolloutBatch

KEY = "rollout.reference_answers.column"


@dataclass(frozen=True)
class ReferenceText:
    """What a reference row holds: ``tokens_text`` is tokenised (up to and including the first stop
    string), ``completion`` is what the reward sees (the stop string cut, as for a sampled completion) and
    ``add_eos`` says whether EOS ends the tokens (no stop string ends it)."""

    tokens_text: str
    completion: str
    add_eos: bool


def reference_text(template: str, value: Any, stop: list[str]) -> ReferenceText:
    """The reference completion of a row whose column holds ``value``: ``template.format(value)``, cut
    after its first stop string if it holds one (the sampler would stop there), else ended by EOS — as a
    supervised completion ends, and as a model fine-tuned on such completions ends its answers."""
    text = template.format(value)
    hits = [(text.find(s), s) for s in stop if s and s in text]
    if hits:
        at, s = min(hits)
        return ReferenceText(text[: at + len(s)], text[:at], add_eos=False)
    return ReferenceText(text, text, add_eos=True)


def check_reference_column(dataset: PromptDataset, column: str) -> None:
    """Every training row needs a non-null ``column``: DataError naming the first row without one."""
    for row, where in zip(dataset.rows, dataset.locations, strict=True):
        if row.get(column) is None:
            found = ", ".join(sorted(map(str, row))) or "none"
            raise DataError(
                f"{KEY}={column!r}: this row has no '{column}' value (columns here: {found})", where=where
            )


def check_reference_engine(engine: object, rollout: RolloutConfig | None = None) -> ScoresCompletions:
    """The engine, if it can score given completions (their behaviour log-probs) at the run's sampling
    temperature (``rollout``; an engine may serve only one, ``scores_only_at_temperature``); ConfigError
    naming the key otherwise."""
    if not isinstance(engine, ScoresCompletions):
        raise ConfigError(
            f"{KEY} needs an engine that scores given completions; {type(engine).__name__} does not",
            where="rollout.backend",
            hint="use rollout.backend=hf, or turn rollout.reference_answers off",
        )
    only = getattr(engine, "scores_only_at_temperature", None)
    if rollout is not None and only is not None:
        adaptive = rollout.adaptive_temperature.target_entropy is not None
        if rollout.temperature != only or adaptive:
            raise ConfigError(
                f"{KEY} with rollout.backend={rollout.backend} needs rollout.temperature={only:g} and no "
                f"adaptive temperature: the engine scores given completions only there",
                where="rollout.temperature",
                hint="set rollout.temperature, or use rollout.backend=hf",
            )
    return engine


@dataclass(frozen=True)
class ReferenceSettings:
    column: str
    template: str
    stop: list[str]
    max_new_tokens: int
    pad_token_id: int
    imitate: bool = False  # mode=imitate: the row carries its group's shared score (zero advantages)


def reference_settings(
    cfg: TandemConfig, engine: object, dataset: PromptDataset, pad_token_id: int
) -> ReferenceSettings | None:
    """``rollout.reference_answers`` (None when off), after checking the engine and every training row:
    the run's pre-flight (:func:`~tandem.orchestration.parts.build_parts`, before anything is written) and
    every rollout step's constructor call it."""
    ref, r = cfg.rollout.reference_answers, cfg.rollout
    if ref.column is None:
        return None
    check_reference_engine(engine, r)
    check_reference_column(dataset, ref.column)
    return ReferenceSettings(
        ref.column, ref.template, list(r.stop), r.max_new_tokens, pad_token_id, imitate=ref.mode == "imitate"
    )


def reference_coef(cfg: TandemConfig) -> float:
    """The weight of the learner's NLL term on reference rows: ``coef`` with ``mode=imitate``, else 0."""
    ref = cfg.rollout.reference_answers
    return ref.coef if ref.column is not None and ref.mode == "imitate" else 0.0


def reference_rows(
    batch: RolloutBatch,
    firsts: list[int],  # a row of each group that gets a reference
    engine: ScoresCompletions,
    s: ReferenceSettings,
    temperature: float,
    timer: PhaseTimer | None = None,
) -> tuple[RolloutBatch, int]:
    """One reference row per group of ``batch`` row ``firsts[k]`` (its prompt tokens, extras and group id),
    with behaviour log-probs from ``engine`` at ``temperature``; plus how many were left out because their
    tokens exceed ``max_new_tokens``."""
    tok = engine.tokenizer
    eos = tok.eos_token_id
    keep, token_rows, texts = [], [], []
    for i in firsts:
        ref = reference_text(s.template, batch.extras[i][s.column], s.stop)
        ids = list(tok(ref.tokens_text, add_special_tokens=False)["input_ids"])
        if ref.add_eos and eos is not None:
            ids.append(int(eos))
        if not ids or len(ids) > s.max_new_tokens:
            continue
        keep.append(i)
        token_rows.append(ids)
        texts.append(ref.completion)
    too_long = len(firsts) - len(keep)
    if not keep:
        return batch.select([]), too_long
    idx = torch.tensor(keep, dtype=torch.long)
    rows = [torch.tensor(ids, dtype=torch.long) for ids in token_rows]
    response = pad_sequence(rows, batch_first=True, padding_value=s.pad_token_id)  # [b, R] right padded
    lengths = torch.tensor([len(ids) for ids in token_rows])  # [b]
    mask = torch.arange(response.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)  # [b, R]
    prompt_ids, prompt_mask = batch.prompt_ids[idx], batch.prompt_mask[idx]  # [b, P]
    with timer.phase("generate") if timer is not None else contextlib.nullcontext():
        logprobs = engine.score(prompt_ids, prompt_mask, response, mask, temperature=temperature)  # [b, R]
    b, tag = len(keep), uuid.uuid4().hex[:8]
    out = RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response,
        response_mask=mask,
        behavior_logprobs=logprobs * mask,
        group_ids=batch.group_ids[idx],
        policy_version=torch.full((b,), int(engine.version), dtype=torch.long),
        prompts=[batch.prompts[i] for i in keep],
        completions=texts,
        finish_reasons=["stop"] * b,
        sample_ids=[f"ref-{tag}-{k}" for k in range(b)],
        extras=[batch.extras[i] for i in keep],
        sample_temperature=None if batch.sample_temperature is None else batch.sample_temperature[idx],
        reference=torch.ones(b, dtype=torch.bool),
    )
    return out, too_long


def add_references(
    scored: tuple[RolloutBatch, torch.Tensor],
    engine: ScoresCompletions,
    s: ReferenceSettings,
    score: Callable[[RolloutBatch], torch.Tensor],
    temperature: float,
    *,
    timer: PhaseTimer | None = None,
) -> tuple[RolloutBatch, torch.Tensor, dict[str, float]]:
    """Add a reference row to every all-equal group of ``scored`` whose reference ``score`` is higher than
    the group's shared score (each group's rows stay together, the reference last; with ``s.imitate`` it
    carries that shared score instead of its own, so every advantage of its group stays 0); the scoring forward
    is timed as ``generate`` on ``timer``, the reward by ``score`` itself.

    Metrics: ``reference/added_frac`` (share of groups that got one), ``reference/not_better_frac``
    (share of the references scored that scored no higher than their group: a wrong column, template or
    reward if it is large) and ``reference/too_long`` (references over ``rollout.max_new_tokens``, left out)."""
    batch, scores = scored
    ids, inverse, means, equal = group_outcomes(scores, batch.group_ids)
    metrics = {"reference/added_frac": 0.0, "reference/not_better_frac": 0.0, "reference/too_long": 0.0}
    if not bool(equal.any()):
        return batch, scores, metrics
    first = torch.full((ids.numel(),), batch.batch_size, dtype=torch.long)
    first = first.scatter_reduce(0, inverse, torch.arange(batch.batch_size), reduce="amin")  # [G]
    rows, too_long = reference_rows(batch, first[equal].tolist(), engine, s, temperature, timer)
    metrics["reference/too_long"] = float(too_long)
    if rows.batch_size == 0:
        return batch, scores, metrics
    ref_scores = score(rows)  # [b]
    shared = means[torch.searchsorted(ids, rows.group_ids)]  # [b] each group's (equal) score
    better = ref_scores > shared + 1e-6
    metrics["reference/added_frac"] = float(better.sum()) / ids.numel()
    metrics["reference/not_better_frac"] = float((~better).sum()) / rows.batch_size
    if not bool(better.any()):
        return batch, scores, metrics
    keep = better.nonzero().squeeze(1)
    if s.imitate:  # the group's advantages stay 0: the learner's NLL term trains the reference instead
        ref_scores = shared
    # the sampled rows' flags come out False (concat_rollouts fills a batch without flags)
    out, out_scores = join_groups([batch, rows.select(keep)], [scores, ref_scores[keep]], s.pad_token_id)
    return out, out_scores, metrics
