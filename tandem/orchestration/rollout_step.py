"""One rollout step, the same in both architectures: prompts -> engine -> rewards -> dynamic sampling
(or, colocated, adaptive group size).

:class:`RolloutStep` is what the colocated trainer runs before each update and what every decoupled rollout
worker runs per ticket; only the :class:`PromptSource` differs:

* :class:`SequentialPrompts` (colocated): the run's seeded sampler, drawn in order (its position is
  checkpointed); group ids count up across steps and refill rounds.
* :class:`TicketPrompts` (workers): batch ``k`` is the ``k``-th draw of a fresh seeded sampler (so any worker,
  or the replacement of a dead one, draws the same batch for ticket ``k``); refill rounds draw with a seed
  of their own and get group ids of their own.

A prompt curriculum picks from these batches in both (:class:`CuratedPrompts`). Round 0 of step ``k`` has
the same prompts, sampling seed (:func:`sampling_params`) and group ids in both, so a decoupled run at
η = 0 with one worker reproduces the colocated one, with a curriculum too. The result is a
:class:`ScoredBatch`: the batch, its sequence scores and the reward metrics (``reward/mean`` and
``reward/std`` of everything sampled, before a dynamic-sampling filter).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch

from tandem.algos import (
    CURRICULA,
    AdaptiveEntropy,
    CurriculumOptions,
    PromptStats,
    TableStats,
    degeneracy_metrics,
    group_outcomes,
    sampled_entropy,
)
from tandem.config.schema import TandemConfig
from tandem.data import PromptDataset, PromptSampler
from tandem.data.chat import is_conversational, render_prompts, reward_inputs
from tandem.errors import ConfigError
from tandem.monitor import PhaseTimer
from tandem.orchestration.adaptive_group import MoreSamples, grow_groups, join_groups
from tandem.orchestration.reference_answers import add_references, reference_settings
from tandem.orchestration.scoring import OverlongShaping, collect_dynamic, score_rollout, trainer_state
from tandem.rewards import RewardSet, TrainerState
from tandem.rollout.base import ChunkCallback, RolloutEngine, SamplingParams, ScoresCompletions
from tandem.rollout.environments import episode_runner
from tandem.types import RolloutBatch

REFILL_GROUPS = 1 << 40  # group ids of a worker's dynamic-sampling refill rounds start here
# adaptive group size: growth round r samples with the seed of round GROWTH_ROUNDS + r
GROWTH_ROUNDS = 1 << 10
SIDE_STREAM = 7_919  # a curriculum's side stream of round (step, r) is seeded step_seed(seed, step, r) + this


@dataclass
class ScoredBatch:
    """A step's rollout: the batch, its sequence scores ``[B]`` and the metrics known before the update."""

    batch: RolloutBatch
    scores: torch.Tensor  # [B] float32, after shaping
    metrics: dict[str, float]


def step_seed(seed: int, step: int, round_: int = 0) -> int:
    """Deterministic per-step sampling seed, so a resumed run samples exactly what the original did."""
    return (seed * 1_000_003 + step * 9_973 + round_ * 31) % (2**31 - 1)


def sampling_params(
    cfg: TandemConfig, step: int, round_: int = 0, *, temperature: float | None = None
) -> SamplingParams:
    """Sampling parameters of training step ``step`` (generation round ``round_``), in both architectures;
    ``temperature`` overrides ``rollout.temperature`` (the adaptive temperature's current value)."""
    r = cfg.rollout
    return SamplingParams(
        max_new_tokens=r.max_new_tokens,
        temperature=r.temperature if temperature is None else temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        min_p=r.min_p,
        repetition_penalty=r.repetition_penalty,
        n=r.n,
        stop=list(r.stop),
        seed=step_seed(cfg.run.seed, step, round_),
    )


def temperature_controller(cfg: TandemConfig) -> AdaptiveEntropy | None:
    """The sampling temperature's controller (``rollout.adaptive_temperature``; None when off): starts at
    ``rollout.temperature`` and steers the sampled tokens' entropy to the target."""
    r, at = cfg.rollout, cfg.rollout.adaptive_temperature
    if at.target_entropy is None:
        return None
    return AdaptiveEntropy(r.temperature, at.target_entropy, at.step, at.max_temperature, at.min_temperature)


def overlong_shaping(cfg: TandemConfig) -> OverlongShaping | None:
    """The DAPO overlong penalty configured in ``reward.overlong`` (None when off)."""
    ov = cfg.reward.overlong
    if not ov.enabled:
        return None
    return OverlongShaping(ov.max_len or cfg.rollout.max_new_tokens, ov.buffer, ov.factor)


class PromptSource(Protocol):
    """Which prompts round ``round_`` of step ``step`` generates from, and their first group id; told how
    each row's group scored (``observe``), which a curriculum uses, and what the last draw repeated."""

    def rows(self, step: int, round_: int) -> list[dict[str, Any]]: ...

    def group_offset(self, step: int, round_: int, num_rows: int) -> int: ...

    def observe(self, positions: list[int], means: list[float], all_equal: list[bool]) -> None: ...

    def draw_metrics(self) -> dict[str, float]: ...

    @property
    def dataset(self) -> PromptDataset: ...


def candidate_stream(base: list[int], side: Callable[[], PromptSampler]) -> Callable[[], int]:
    """A round's candidate prompts (dataset row indices), one per call: its batch in the data order
    (``base``), then, for a curriculum that skipped some, an endless side stream (``side()``, built on first
    use). ``uniform`` takes exactly ``base``."""
    rest, sampler = iter(base), None

    def draw() -> int:
        nonlocal sampler
        key = next(rest, None)
        if key is not None:
            return key
        if sampler is None:
            sampler = side()
        return sampler.next_indices(1)[0]

    return draw


class CuratedPrompts:
    """What both prompt sources share: per-prompt statistics (:class:`~tandem.algos.PromptStats`, fed by
    ``observe``) and a prompt curriculum (:data:`tandem.algos.CURRICULA`) that picks a round's prompts from
    its candidates: the round's batch in the data order first, then a side stream seeded by
    ``(seed, step, round)`` (:func:`candidate_stream`). Both the pick and the side stream depend only on
    the statistics and ``(seed, step, round)``, so a decoupled worker that has seen what the colocated
    trainer saw picks what it picks."""

    def __init__(
        self,
        dataset: PromptDataset,
        batch_size: int,
        seed: int,
        curriculum: str = "uniform",
        options: CurriculumOptions | None = None,
    ) -> None:
        self._dataset, self.batch_size, self.seed = dataset, batch_size, seed
        self.sampler = PromptSampler(dataset, batch_size, seed)  # the data order
        self.stats = PromptStats()
        self.set_curriculum(curriculum, options or CurriculumOptions())
        self._last: list[int] = []  # dataset rows of the latest draw, by position
        self._repeat: list[int] = []  # times each of them had been drawn before
        # what was drawn and scored since take_report() (PromptStats.apply); None: not recorded
        self.report: dict[str, list] | None = None

    @property
    def dataset(self) -> PromptDataset:
        """The prompt rows drawn from."""
        return self._dataset

    def set_curriculum(self, kind: str, options: CurriculumOptions) -> None:
        """Choose the curriculum (``data.curriculum``) by its registered name."""
        self.select, self.options, self.curriculum = CURRICULA.get(kind).select, options, kind

    def _pick(self, base: list[int], step: int, round_: int) -> list[dict[str, Any]]:
        """The rows the curriculum picks from ``base`` (the round's batch in the data order) and the side
        stream; counts them as drawn."""
        seed = step_seed(self.seed, step, round_)

        def side() -> PromptSampler:
            return PromptSampler(self._dataset, 1, seed + SIDE_STREAM)

        draw = candidate_stream(base, side)
        keys = self.select(len(base), draw, self.stats, self.options, random.Random(seed))
        self._last, self._repeat = keys, self.stats.drawn(keys)
        if self.report is not None:
            self.report["drawn"].extend(keys)
        return [self._dataset.rows[i] for i in keys]

    def observe(self, positions: list[int], means: list[float], all_equal: list[bool]) -> None:
        """Group outcomes of the latest draw: row position in it, mean score, scores all equal."""
        for pos, mean, equal in zip(positions, means, all_equal, strict=True):
            self.stats.observe(self._last[pos], mean, equal)
            if self.report is not None:
                self.report["observed"].append([self._last[pos], float(mean), bool(equal)])

    def draw_metrics(self) -> dict[str, float]:
        """``prompts/seen_before_mean`` (times the latest draw's prompts had been drawn before),
        ``prompts/first_time_frac``, ``prompts/epoch`` and, with a curriculum, ``prompts/frontier_size``."""
        if not self._repeat:
            return {}
        n = len(self._repeat)
        out = {
            "prompts/seen_before_mean": sum(self._repeat) / n,
            "prompts/first_time_frac": sum(r == 0 for r in self._repeat) / n,
            "prompts/epoch": float(self.sampler.epoch),
        }
        if self.curriculum != "uniform":
            out["prompts/frontier_size"] = float(len(self.stats.frontier()))
        return out


class SequentialPrompts(CuratedPrompts):
    """The colocated source: one seeded sampler drawn in order (refill rounds draw the next batches).

    Its checkpoint state holds the sampler's position and the per-prompt statistics, so a resumed run's
    curriculum and repetition counts continue."""

    next_group = 0  # the first group id of the next draw (set per instance from the first draw on)

    def rows(self, step: int, round_: int) -> list[dict[str, Any]]:
        return self._pick(self.sampler.next_indices(), step, round_)

    def group_offset(self, step: int, round_: int, num_rows: int) -> int:
        first, self.next_group = self.next_group, self.next_group + num_rows
        return first

    def state_dict(self) -> dict[str, Any]:
        return {
            "next_group": self.next_group,
            "sampler": self.sampler.state_dict(),
            "prompt_stats": self.stats.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.next_group = int(state["next_group"])
        self.sampler.load_state_dict(state["sampler"])
        if "prompt_stats" in state:  # checkpoints from before per-prompt statistics lack it
            self.stats.load_state_dict(state["prompt_stats"])


class TicketPrompts(CuratedPrompts):
    """The workers' source: batch ``k`` is the ``k``-th draw of a fresh seeded sampler (fast-forwarded);
    refill round ``r ≥ 1`` of ticket ``k`` is a draw seeded by ``(k, r)``.

    A curriculum picks from these batches with the statistics the learner published with the weights
    (:meth:`follow_stats`: every worker's groups of the batches it trained, in order), plus what this worker
    drew and scored since. At η = 0 with one worker that is what the colocated trainer saw at the same step,
    so it draws the same prompts."""

    def __init__(
        self,
        dataset: PromptDataset,
        batch_size: int,
        seed: int,
        max_rounds: int,
        curriculum: str = "uniform",
        options: CurriculumOptions | None = None,
    ) -> None:
        super().__init__(dataset, batch_size, seed, curriculum, options)
        self._next = 0
        self.max_rounds = max_rounds
        self.report = {"drawn": [], "observed": []}

    def take_report(self) -> dict[str, list]:
        """What this worker drew and scored since the last call, for the learner
        (:meth:`~tandem.algos.PromptStats.apply`)."""
        report, self.report = self.report, {"drawn": [], "observed": []}
        return report

    def rows(self, step: int, round_: int) -> list[dict[str, Any]]:
        if round_ > 0:  # any worker refills a ticket from the same batch
            base = PromptSampler(self._dataset, self.batch_size, step_seed(self.seed, step, round_))
            return self._pick(base.next_indices(), step, round_)
        if step < self._next:  # e.g. a re-assigned older ticket: restart the stream
            self.sampler, self._next = PromptSampler(self._dataset, self.batch_size, self.seed), 0
        while self._next < step:
            self.sampler.next_indices()
            self._next += 1
        self._next += 1
        return self._pick(self.sampler.next_indices(), step, round_)

    def follow_stats(self, table: torch.Tensor | None) -> None:
        """Take the learner's per-prompt statistics (:meth:`~tandem.algos.PromptStats.to_table`, published
        with the weights; None: keep this worker's own)."""
        if table is None:
            return
        if table.shape[-1] != len(self._dataset):
            raise ConfigError(
                f"the learner's prompt statistics cover {table.shape[-1]} prompts, this worker's "
                f"training set has {len(self._dataset)}",
                where="data.train_file",
            )
        self.stats = TableStats(table.clone())

    def group_offset(self, step: int, round_: int, num_rows: int) -> int:
        """Round 0: step ``step``'s ids in the colocated trainer; refill rounds get their own range."""
        if round_ == 0:
            return step * self.batch_size
        return REFILL_GROUPS + (step * self.max_rounds + round_ - 1) * self.batch_size


class RolloutStep:
    """Generates and scores one step's batch with an injected engine, reward set and prompt source.

    With dynamic sampling (``algorithm.dynamic_sampling``) groups whose rewards are all equal are dropped
    and more rounds are generated (up to ``max_resample_rounds``) until the batch is full. With adaptive
    group size (``algorithm.adaptive_group``) such groups instead get more samples of their own prompt
    (:func:`~tandem.orchestration.adaptive_group.grow_groups`), and the batch grows. Phases ``generate``
    and ``reward`` are timed on ``timer``."""

    def __init__(
        self,
        cfg: TandemConfig,
        engine: RolloutEngine,
        rewards: RewardSet,
        prompts: PromptSource,
        *,
        timer: PhaseTimer,
        pad_token_id: int,
        steer_temperature: bool = True,
    ) -> None:
        self.cfg, self.engine, self.rewards, self.prompts = cfg, engine, rewards, prompts
        self.steer_temperature = steer_temperature  # False: a decoupled worker (follow_temperature)
        self.timer, self.pad_token_id = timer, pad_token_id
        self.overlong = overlong_shaping(cfg)
        self.episodes = episode_runner(cfg.env, engine)  # every sample is an episode (single-turn: one step)
        self._drawn: tuple[list[dict[str, Any]], int] = ([], 0)  # the latest draw's rows, first group id
        self._state: TrainerState | None = None  # the reward functions' trainer_state of the step being run
        self.temperature = temperature_controller(cfg)
        self.reference = reference_settings(cfg, engine, prompts.dataset, pad_token_id)
        cur = cfg.data.curriculum
        if isinstance(prompts, CuratedPrompts):
            options = CurriculumOptions(cur.skip_after, cur.revisit, cur.replay, cur.max_draws)
            prompts.set_curriculum(cur.kind, options)

    def generate(
        self, step: int, round_: int, on_chunk: ChunkCallback | None = None, *, observe: bool = True
    ) -> tuple[RolloutBatch, torch.Tensor, dict[str, float]]:
        """Generate and score round ``round_`` of step ``step`` (round 0: the step's own prompts);
        ``observe``: tell the prompt source each group's outcome now (else the caller does)."""
        rows = self.prompts.rows(step, round_)
        offset = self.prompts.group_offset(step, round_, len(rows))
        self._drawn = (rows, offset)
        batch, scores, metrics = self._sample(rows, self._params(step, round_), offset, on_chunk)
        if self.cfg.rollout.greedy_in_group and batch.batch_size:
            batch, scores, greedy = self._add_greedy(rows, (batch, scores), step, round_, offset, on_chunk)
            metrics.update(greedy)
        if observe:
            self._observe(batch, scores, offset)
        return batch, scores, metrics

    def _params(self, step: int, round_: int) -> SamplingParams:
        """Round ``round_`` of step ``step``'s sampling parameters, at the adaptive temperature if any."""
        ctl = self.temperature
        return sampling_params(self.cfg, step, round_, temperature=None if ctl is None else ctl.value)

    def _sample(
        self,
        rows: list[dict[str, Any]],
        params: SamplingParams | list[SamplingParams],
        offset: int,
        on_chunk: ChunkCallback | None,
    ) -> tuple[RolloutBatch, torch.Tensor, dict[str, float]]:
        """Sample ``rows`` (one ``params`` for all, or one per row) as groups ``offset, offset + 1, ...``
        and score them."""
        extras = [{k: v for k, v in row.items() if k != "prompt"} for row in rows]
        prompts = [row["prompt"] for row in rows]
        with self.timer.phase("generate"):
            texts = render_prompts(getattr(self.engine, "tokenizer", None), prompts, where="data.train_file")
            batch = self.episodes.generate(
                texts,
                params,
                group_offset=offset,
                extras=extras,
                on_chunk=on_chunk,
                chunk_tokens=self.cfg.architecture.weight_sync_chunk,
            )
        if self.temperature is not None:  # the learner scores the batch at the temperature it was drawn at
            t = torch.full((batch.batch_size,), self.temperature.value, dtype=torch.float32)
            batch = dataclasses.replace(batch, sample_temperature=t)
        scores, metrics = self._reward(batch, prompts, offset)
        return (batch, *self._add_episodes(scores, metrics))

    def _reward(
        self, batch: RolloutBatch, prompts: list[Any], offset: int
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Scores ``[B]`` and reward metrics of ``batch``, whose group ``offset + i`` is ``prompts[i]``'s."""
        inputs = None
        if any(is_conversational(p) for p in prompts):  # rewards see messages, as in TRL
            per_sample = [prompts[int(g) - offset] for g in batch.group_ids]
            inputs = reward_inputs(per_sample, batch.completions)
        with self.timer.phase("reward"):
            return score_rollout(batch, self.rewards, self.overlong, inputs=inputs, state=self._state)

    def _add_references(self, scored: ScoredBatch) -> ScoredBatch:
        """``rollout.reference_answers``: the prompt file's answer joins each group no sample solved."""
        if self.reference is None or scored.batch.batch_size == 0:
            return scored
        rows, offset = self._drawn
        prompts = [row["prompt"] for row in rows]
        t = self.cfg.rollout.temperature if self.temperature is None else self.temperature.value
        batch, scores, metrics = add_references(
            (scored.batch, scored.scores),
            cast(ScoresCompletions, self.engine),  # checked by reference_settings in __init__
            self.reference,
            lambda ref: self._reward(ref, prompts, offset)[0],
            t if t > 0 else 1.0,
            timer=self.timer,
        )
        return ScoredBatch(batch, scores, {**scored.metrics, **metrics})

    def _add_greedy(
        self,
        rows: list[dict[str, Any]],
        sampled: tuple[RolloutBatch, torch.Tensor],
        step: int,
        round_: int,
        offset: int,
        on_chunk: ChunkCallback | None,
    ) -> tuple[RolloutBatch, torch.Tensor, dict[str, float]]:
        """``rollout.greedy_in_group``: each row's greedy completion joins its group, as the group's last
        row, flagged in ``RolloutBatch.greedy`` (the ``remax`` estimator's baseline). Metrics: ``greedy/reward_mean`` (the greedy answers' reward on this step's training prompts)
        and ``greedy/above_group_frac`` / ``greedy/below_group_frac`` (share of groups whose greedy answer
        scored above / below the mean of the sampled ones: the update pushes it up / down)."""
        params = dataclasses.replace(self._params(step, round_), temperature=0.0, n=1)
        greedy, greedy_scores, _ = self._sample(rows, params, offset, on_chunk)
        batch, scores = sampled
        ids, _, means, _ = group_outcomes(scores, batch.group_ids)  # the sampled groups, ids sorted
        sampled_mean = means[torch.searchsorted(ids, greedy.group_ids)]  # [b] the greedy row's group
        metrics = {
            "greedy/reward_mean": float(greedy_scores.mean()),
            "greedy/above_group_frac": float((greedy_scores > sampled_mean + 1e-6).float().mean()),
            "greedy/below_group_frac": float((greedy_scores < sampled_mean - 1e-6).float().mean()),
        }
        batch = dataclasses.replace(batch, greedy=torch.zeros(batch.batch_size, dtype=torch.bool))
        greedy = dataclasses.replace(greedy, greedy=torch.ones(greedy.batch_size, dtype=torch.bool))
        return (*join_groups([batch, greedy], [scores, greedy_scores], self.pad_token_id), metrics)

    def _observe(self, batch: RolloutBatch, scores: torch.Tensor, offset: int) -> None:
        """What each prompt's group scored: the curriculum's feedback."""
        if batch.batch_size:
            ids, _, means, equal = group_outcomes(scores, batch.group_ids)
            self.prompts.observe((ids - offset).tolist(), means.tolist(), equal.tolist())

    def _more_samples(self, step: int, on_chunk: ChunkCallback | None) -> MoreSamples:
        """Adaptive group size: ``k`` new samples of group ``gid``'s prompt (the latest draw's), in that
        group, sampled with a seed of growth round ``r`` of step ``step``."""
        rows, offset = self._drawn

        def more(asks: list[tuple[int, int]], r: int) -> tuple[RolloutBatch, torch.Tensor]:
            base = self._params(step, GROWTH_ROUNDS + r)
            params = [dataclasses.replace(base, n=k) for _, k in asks]
            batch, scores, _ = self._sample([rows[gid - offset] for gid, _ in asks], params, 0, on_chunk)
            gids = torch.tensor([gid for gid, _ in asks], dtype=torch.long)[batch.group_ids]
            return dataclasses.replace(batch, group_ids=gids), scores

        return more

    def _add_episodes(
        self, scores: torch.Tensor, metrics: dict[str, float]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Scores plus the episodes' environment returns; with an ``env``, the episode metrics too."""
        episodes = self.episodes.last
        if episodes is None:
            return scores, metrics
        if self.cfg.env is not None:
            metrics = {**metrics, **episodes.metrics}
        return scores + episodes.returns, metrics

    def __call__(self, step: int, on_chunk: ChunkCallback | None = None) -> ScoredBatch:
        """Step ``step``'s scored batch; ``on_chunk`` is the engine's in-flight weight-update hook."""
        self._state = trainer_state(self.cfg, step, len(self.prompts.dataset))
        scored = self._step(step, on_chunk)
        if self.temperature is not None:  # the temperature this step used, then the next step's
            entropy = sampled_entropy(scored.batch.behavior_logprobs, scored.batch.response_mask)
            scored.metrics["rollout/temperature"] = self.temperature.value
            scored.metrics["rollout/sampled_entropy"] = entropy
            if scored.batch.batch_size and self.steer_temperature:
                self.temperature.update(entropy)
        return scored

    def follow_temperature(self, value: float | None) -> None:
        """A decoupled worker samples at the temperature its learner published with the weights
        (:mod:`tandem.orchestration.decoupled.controls`; None: unchanged)."""
        if self.temperature is not None and value is not None:
            self.temperature.value = value

    def state_dict(self) -> dict[str, Any]:
        """What a resume needs beyond the prompt source: the adaptive temperature (None when off)."""
        return {"temperature": None if self.temperature is None else self.temperature.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.temperature is not None and state.get("temperature") is not None:
            self.temperature.value = float(state["temperature"])

    def _step(self, step: int, on_chunk: ChunkCallback | None) -> ScoredBatch:
        algo = self.cfg.algorithm
        grow = algo.adaptive_group
        batch, scores, metrics = self.generate(step, 0, on_chunk, observe=not grow.enabled)
        metrics["reward/mean"] = float(scores.mean())  # of everything sampled (in round 0)
        metrics["reward/std"] = float(scores.std()) if scores.numel() > 1 else 0.0
        metrics.update(degeneracy_metrics(scores, batch.group_ids))  # before any dynamic-sampling filter
        metrics.update(self.prompts.draw_metrics())
        if grow.enabled:  # the checks keep it apart from dynamic sampling
            batch, scores, grown = grow_groups(
                (batch, scores),
                self._more_samples(step, on_chunk),
                max_n=grow.max_n,
                per_round=grow.per_round or self.cfg.rollout.n,
                which=grow.which,
                pad_token_id=self.pad_token_id,
            )
            self._observe(batch, scores, self._drawn[1])  # the curriculum sees the grown groups
            return self._add_references(ScoredBatch(batch, scores, {**metrics, **grown}))
        if not algo.dynamic_sampling:  # the checks keep reference answers apart from dynamic sampling
            return self._add_references(ScoredBatch(batch, scores, metrics))
        batch, scores, dapo = collect_dynamic(
            (batch, scores),
            lambda round_: self.generate(step, round_, on_chunk)[:2],
            want=self.cfg.samples_per_step,
            max_rounds=algo.max_resample_rounds,
            pad_token_id=self.pad_token_id,
        )
        return ScoredBatch(batch, scores, {**metrics, **dapo})


def sample_rows(batch: RolloutBatch, scores: torch.Tensor, n: int, group_size: int) -> list[dict[str, Any]]:
    """The first sample of up to ``n`` groups: prompt, completion and reward, to read for reward hacking.
    A multi-turn episode's completion is its whole conversation (model turns and observations)."""
    rows = range(0, batch.batch_size, max(1, group_size))[:n]
    extras = batch.extras or [{}] * batch.batch_size
    return [
        {
            "prompt": batch.prompts[i],
            "completion": extras[i].get("conversation", batch.completions[i]),
            "reward": float(scores[i]),
        }
        for i in rows
    ]


def rollout_metrics(batch: RolloutBatch, gen_seconds: float) -> dict[str, float]:
    """Response-length and generation-throughput metrics of one batch."""
    if batch.batch_size == 0:
        return {}
    lengths = batch.response_lengths.float()
    return {
        "response/length_mean": float(lengths.mean()),
        "response/length_max": float(lengths.max()),
        "response/clip_ratio": float(batch.truncated.sum()) / batch.batch_size,
        "perf/gen_tokens_per_s": float(lengths.sum()) / max(1e-9, gen_seconds),
    }
