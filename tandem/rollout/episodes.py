"""Token-exact multi-turn episodes: an engine's turns against an environment, batched over episodes.

:class:`EpisodeRunner` has an engine's ``generate`` signature, so a training step, a rollout worker and
the held-out evaluation call it where they called the engine. For ``n`` samples of each prompt it runs
``n`` episodes, each with its own environment (:mod:`tandem.agents.env`)::

    reset(row) -> first prompt                      (all resets concurrently)
    turn 1: engine.generate(prompts, params)        (exactly the single-turn call)
    every episode whose turn ended: env.step(action)   (a future, within the episode's time budget)
        observation -> token ids, ONCE, appended    (never decode-then-re-encode the history)
    repeat while steps are in flight or episodes wait to continue:
        when the schedule says go: engine.generate_ids(history ids of the waiting episodes)
        (one batched call), then their next steps start

Token exactness: an episode's response row is the concatenation of the ids the engine sampled and the
observation ids, in order; ``response_mask`` is True on sampled tokens only (the loss never sees
environment tokens, which the model still attends to: :func:`tandem.models.packing.attended`), and
``behavior_logprobs`` holds each sampled token's log-prob (0 on environment tokens). The history is
never re-tokenised, so what the trainer scores is what was sampled, even for tokenizers whose
``encode(decode(ids)) != ids``. An episode always ends on a model turn (the last observation is not
appended: nothing would learn from it).

A single-turn task is the one-step case of the same loop: with :class:`~tandem.agents.env.SingleTurn`
every episode ends after turn 1 and the batch returned is the engine's own, unchanged.

Concurrency: environment steps run as futures on an event loop (``async`` steps on the loop, plain
ones in worker threads), so the steps of many episodes overlap; the engine is only ever called from the
caller's thread, one call at a time. ``schedule`` decides when an engine call continues the episodes
whose step has ended:

- ``lockstep`` (the default): when every step that may continue its episode has ended, so each call
  holds every live episode at the same turn. A tool with latency ``L`` costs about ``L`` per turn (the
  turn's slowest step), not ``L`` times the episodes. Batches, seeds and so samples are the same for a
  seed every run (a resumed run samples what the original did). The loop runs on the caller's thread
  between engine calls.
- ``async``: as soon as ``async_min_batch`` of the episodes that may continue are waiting, or the first
  of them has waited ``async_max_wait_s``; the others' steps keep running meanwhile and are continued
  by a later call. The loop runs in a thread of its own, so steps overlap generation, and a slow step
  holds up its own episode only. What it gives up: which episodes share an engine call depends on
  timing, and with it the seed of each call, so sampling is not reproducible for a seed. Token
  exactness does not depend on the schedule.

``bench/agents_latency.py`` measures both against serial steps.

Rewards: an episode's return is the sum of its steps' rewards (:attr:`EpisodeStats.returns`, added to
the sequence score). ``turn_rewards`` says where the token-level estimators credit them: ``sum`` (the
default) on the episode's last sampled token with the rest of the score; ``per_turn`` on the last sampled
token of the turn whose step earned each (the batch's ``turn_rewards`` ``[B, R]``), so GAE and
REINFORCE++ credit a turn with what came after it only. Group estimators score the sum either way.
"""

from __future__ import annotations

import asyncio
import numbers
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, FIRST_EXCEPTION
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from tandem.agents.env import INFO_COUNTERS, SingleTurn
from tandem.data.chat import render_prompts
from tandem.errors import ConfigError, TandemError
from tandem.rollout.base import ChunkCallback, RolloutEngine, SamplingParams
from tandem.rollout.env_loop import EnvLoop, call, one_at_a_time
from tandem.rollout.rows import per_prompt
from tandem.types import RolloutBatch

EnvFactory = Callable[[], Any]
SCHEDULES = ("lockstep", "async")  # how turns are batched (EpisodeSettings.schedule)
TURN_REWARDS = ("sum", "per_turn")  # where step rewards are credited (EpisodeSettings.turn_rewards)
MAX_THREADS = 256  # worker threads for plain (non-async) environment steps and tools, per call


class EnvError(TandemError):
    """An environment's ``reset`` or ``step`` raised (a bug in the environment, not a model mistake)."""


@dataclass(frozen=True)
class EpisodeSettings:
    """Limits of every episode (``env`` config): turns, wall seconds in the environment, observation
    tokens; ``concurrent`` runs the environment steps together; ``schedule`` (and the ``async_*``
    knobs) says when an engine call continues the episodes whose step has ended."""

    max_turns: int = 1
    timeout_s: float | None = None
    max_observation_tokens: int | None = None
    concurrent: bool = True
    where: str = "env"  # config key named in errors
    max_context_tokens: int | None = None  # the model's positions: an episode that would pass them ends
    schedule: str = "lockstep"  # or "async": an episode continues without waiting for the others' steps
    async_min_batch: float = 0.5  # async: continue once this fraction of the continuing episodes is ready
    async_max_wait_s: float = 0.05  # async: or once the first ready episode has waited this long
    turn_rewards: str = "sum"  # or "per_turn": each step's reward on its turn's last sampled token


@dataclass
class Episode:
    """One episode's state: the response row so far (sampled and observation ids) and its counters."""

    env: Any
    budget: float  # seconds the episode may still spend in its environment
    ids: list[int] = field(default_factory=list)  # response row: sampled + observation ids
    mask: list[bool] = field(default_factory=list)  # True on sampled ids
    logprobs: list[float] = field(default_factory=list)  # behaviour log-prob, 0.0 on observation ids
    # the conversation after the prompt, for display: sampled turns as ids (decoded only when the batch is
    # assembled from several turns), observations as text
    pieces: list[list[int] | str] = field(default_factory=list)
    answer: str = ""  # the last action's text (what reward functions score)
    ret: float = 0.0  # sum of the environment's rewards
    earned: list[tuple[int, float]] = field(default_factory=list)  # (index in ids, reward) of each step
    turns: int = 0
    done: bool = False  # ended by the environment
    live: bool = True
    timed_out: bool = False
    context_full: bool = False  # ended because the next turn would pass the model's positions
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(INFO_COUNTERS, 0))


@dataclass
class EpisodeStats:
    """What one ``generate`` call's episodes add to the step: returns and metrics."""

    returns: torch.Tensor  # [B] float32, sum of environment rewards per episode
    metrics: dict[str, float]


class EpisodeRunner:
    """Runs episodes of ``make_env()`` environments with ``engine`` (see the module docstring).

    ``generate`` returns the episodes as a :class:`~tandem.types.RolloutBatch` (one row per episode,
    a prompt's ``n`` episodes consecutive, as an engine's samples); :attr:`last` then holds their
    returns and metrics. Prompts are the rendered texts an engine gets; the environment's ``reset``
    receives the row ``{"prompt": text, **extras}`` and returns the first prompt (text, or messages,
    rendered with the tokenizer's chat template)."""

    def __init__(
        self,
        engine: RolloutEngine,
        make_env: EnvFactory = SingleTurn,
        settings: EpisodeSettings | None = None,
        *,
        tokenizer: Any = None,
    ) -> None:
        self.engine, self.make_env = engine, make_env
        self.settings = settings or EpisodeSettings()
        if self.settings.schedule not in SCHEDULES:
            raise ConfigError(
                f"unknown schedule '{self.settings.schedule}'; valid: {', '.join(SCHEDULES)}",
                where="env.schedule",
            )
        if self.settings.turn_rewards not in TURN_REWARDS:
            raise ConfigError(
                f"unknown turn_rewards '{self.settings.turn_rewards}'; valid: {', '.join(TURN_REWARDS)}",
                where="env.turn_rewards",
            )
        self.tokenizer = tokenizer if tokenizer is not None else getattr(engine, "tokenizer", None)
        self.last: EpisodeStats | None = None
        self.log: list[EpisodeStats] | None = None  # a list: every call's stats are appended to it

    @property
    def version(self) -> int:
        return self.engine.version

    def close(self) -> None:
        """Close the engine (what a caller that owns it does when it is done)."""
        self.engine.close()

    def generate(
        self,
        prompts: list[str],
        params: SamplingParams | Sequence[SamplingParams],
        *,
        group_offset: int = 0,
        extras: list[dict] | None = None,
        on_chunk: ChunkCallback | None = None,
        chunk_tokens: int = 4,
    ) -> RolloutBatch:
        """The episodes of ``params.n`` samples per prompt (see the class docstring)."""
        each = per_prompt(params, len(prompts))
        if self.make_env is SingleTurn:  # nothing to step: the engine's batch and one-turn episodes' stats
            return self._single_turn(prompts, params, group_offset, extras, on_chunk, chunk_tokens)
        rows = [{**(extras[i] if extras else {}), "prompt": p} for i, p in enumerate(prompts)]
        # One thread per episode at most: plain (blocking) steps and tools of every episode overlap.
        envs = EnvLoop(min(MAX_THREADS, max(1, sum(p.n for p in each))), self.settings.schedule == "async")
        try:
            return self._run(envs, rows, params, each, group_offset, extras, on_chunk, chunk_tokens)
        finally:
            envs.close()

    def _single_turn(
        self,
        prompts: list[str],
        params: SamplingParams | Sequence[SamplingParams],
        group_offset: int,
        extras: list[dict] | None,
        on_chunk: ChunkCallback | None,
        chunk_tokens: int,
    ) -> RolloutBatch:
        """:meth:`_run` for :class:`SingleTurn` episodes without the event loop: its reset is the prompt
        and its one step ends the episode with reward 0, so the batch is the engine's and every episode
        took one turn (the same batch and stats, without a task per episode: ≈ 4 ms per 128 rows)."""
        batch = self.engine.generate(
            list(prompts), params, group_offset=group_offset, extras=extras, on_chunk=on_chunk,
            chunk_tokens=chunk_tokens,
        )  # fmt: skip
        episodes = [Episode(None, float("inf"), turns=1, done=True)] * batch.batch_size
        self.last = _stats(episodes, 0.0)
        if self.log is not None:
            self.log.append(self.last)
        return batch

    def _run(
        self,
        envs: EnvLoop,
        rows: list[dict[str, Any]],
        params: SamplingParams | Sequence[SamplingParams],
        each: list[SamplingParams],
        group_offset: int,
        extras: list[dict] | None,
        on_chunk: ChunkCallback | None,
        chunk_tokens: int,
    ) -> RolloutBatch:
        s = self.settings
        budget = s.timeout_s if s.timeout_s is not None else float("inf")
        episodes = [Episode(self._new_env(), budget) for p in each for _ in range(p.n)]
        owner = [i for i, p in enumerate(each) for _ in range(p.n)]  # prompt index of every episode
        t0 = time.perf_counter()
        firsts = self._gather(envs, [self._reset(e, rows[i]) for e, i in zip(episodes, owner, strict=True)])
        env_s = time.perf_counter() - t0
        first = self.engine.generate(
            self._first_prompts(firsts, owner, len(rows)),
            params,
            group_offset=group_offset,
            extras=extras,
            on_chunk=on_chunk,
            chunk_tokens=chunk_tokens,
        )
        for r in range(first.batch_size):
            _append_turn(episodes[r], first, r)
        env_s += self._turns(envs, first, episodes, each, owner)
        self.last = _stats(episodes, env_s)
        if self.log is not None:
            self.log.append(self.last)
        if all(not e.pieces[1:] for e in episodes):  # single-turn: the engine's batch, unchanged
            return first
        return _assemble(first, episodes, self.tokenizer, self.settings.turn_rewards == "per_turn")

    def _turns(
        self,
        envs: EnvLoop,
        first: RolloutBatch,
        episodes: list[Episode],
        each: list[SamplingParams],
        owner: list[int],
    ) -> float:
        """Step every episode and continue it until all have ended; the seconds spent waiting on
        environments. Steps run as futures on ``envs``; a batched ``generate_ids`` continues the
        episodes whose step has finished when :meth:`_go` says so (see the module docstring)."""
        lock = None if self.settings.concurrent else asyncio.Lock()  # serial: one step at a time
        steps: dict[Any, int] = {}  # step in flight (a future) -> its episode's row
        ready: dict[int, float] = {}  # row of an episode that continues -> when its step ended
        waited, calls = 0.0, 1  # calls: engine calls so far (turn 1's generate is the first)

        def launch(rows: list[int]) -> None:
            for r in rows:
                job = one_at_a_time(self._step(episodes[r], episodes[r].turns), lock)
                steps[envs.submit(job)] = r

        launch(list(range(len(episodes))))
        try:
            while steps or ready:
                if steps and not self._go(ready, steps, episodes):
                    t0 = time.perf_counter()
                    done = envs.wait(list(steps), self._patience(ready), FIRST_COMPLETED)
                    waited += time.perf_counter() - t0
                    for f in done:
                        r = steps.pop(f)
                        f.result()  # an EnvError ends the call
                        e = episodes[r]
                        if e.live and self._fits(
                            int(first.prompt_mask[r].sum()), e, each[owner[r]].max_new_tokens
                        ):
                            ready[r] = time.perf_counter()
                    continue
                rows = sorted(ready)  # row order: lockstep's batch is every live episode, as always
                ready.clear()
                calls += 1
                contexts = [_prompt_row(first, r) + episodes[r].ids for r in rows]
                batch = self.engine.generate_ids(contexts, _turn_params(each, owner, rows, calls))
                for k, r in enumerate(rows):
                    _append_turn(episodes[r], batch, k)
                launch(rows)
        finally:
            for f in steps:
                f.cancel()
        return waited

    def _go(self, ready: dict[int, float], steps: dict[Any, int], episodes: list[Episode]) -> bool:
        """Whether to continue the ``ready`` episodes now, with ``steps`` still in flight: always once
        no step in flight can continue its episode (its turn was the last); ``lockstep`` waits for
        every step, ``async`` goes once ``async_min_batch`` of the episodes that may continue are ready
        or the first ready one has waited ``async_max_wait_s``."""
        s = self.settings
        if not ready:
            return False
        pending = sum(1 for r in steps.values() if episodes[r].turns < s.max_turns)
        if not pending:
            return True
        if s.schedule == "lockstep":
            return False
        if len(ready) >= s.async_min_batch * (len(ready) + pending):
            return True
        return time.perf_counter() - min(ready.values()) >= s.async_max_wait_s

    def _patience(self, ready: dict[int, float]) -> float | None:
        """Seconds to wait for the next step to finish before :meth:`_go` is asked again (None: until one
        does)."""
        if self.settings.schedule == "lockstep" or not ready:
            return None
        return max(0.0, self.settings.async_max_wait_s - (time.perf_counter() - min(ready.values())))

    def _fits(self, prompt_len: int, e: Episode, max_new_tokens: int) -> bool:
        """Whether ``e``'s next turn fits the model's positions; if not, the episode ends here."""
        limit = self.settings.max_context_tokens
        if limit is None or prompt_len + len(e.ids) + max_new_tokens <= limit:
            return True
        e.live, e.context_full = False, True
        return False

    def _new_env(self) -> Any:
        try:
            return self.make_env()
        except TandemError:
            raise
        except Exception as err:
            raise EnvError(
                f"building the environment raised {type(err).__name__}: {err}", where=self.settings.where
            ) from None

    def _gather(self, envs: EnvLoop, jobs: list[Any]) -> list[Any]:
        """Run ``jobs`` (coroutines) on ``envs`` to completion: together, or one by one
        (``concurrent=False``); the first error is raised at once."""
        lock = None if self.settings.concurrent else asyncio.Lock()
        futures = [envs.submit(one_at_a_time(j, lock)) for j in jobs]
        if not futures:
            return []
        try:
            envs.wait(futures, None, FIRST_EXCEPTION)
            return [f.result() for f in futures]
        finally:
            for f in futures:
                f.cancel()

    async def _reset(self, e: Episode, row: dict[str, Any]) -> Any:
        try:
            return await _timed(e, call(e.env.reset, row))
        except TimeoutError:
            raise EnvError(
                f"the environment's reset took longer than {self.settings.timeout_s:g}s",
                where=f"{self.settings.where}.timeout_s",
            ) from None
        except TandemError:
            raise
        except Exception as err:
            raise EnvError(
                f"the environment's reset raised {type(err).__name__}: {err}", where=self.settings.where
            ) from None

    async def _step(self, e: Episode, turn: int) -> None:
        """Step ``e`` with its last action: reward, counters, then the observation ids (or the end)."""
        try:
            out = await _timed(e, call(e.env.step, e.answer))
        except TimeoutError:
            e.live, e.timed_out = False, True  # the episode stops here; no reward for the turn
            return
        except TandemError:
            raise
        except Exception as err:
            raise EnvError(
                f"the environment's step raised {type(err).__name__}: {err}", where=self.settings.where
            ) from None
        obs, reward, done, info = _check_step(out, self.settings.where)
        e.ret += reward
        e.earned.append((_last_sampled(e.mask), reward))  # before the observation is appended
        for key in INFO_COUNTERS:
            e.counters[key] += int(info.get(key, 0) or 0)
        e.done = bool(done)
        if e.done or turn >= self.settings.max_turns:
            e.live = False
            return
        ids = self.tokenizer(obs, add_special_tokens=False)["input_ids"] if obs else []  # tokenised once
        ids = ids[: self.settings.max_observation_tokens]
        e.ids += ids
        e.mask += [False] * len(ids)
        e.logprobs += [0.0] * len(ids)
        e.pieces.append(obs)

    def _first_prompts(self, firsts: list[Any], owner: list[int], num_prompts: int) -> list[str]:
        """One prompt text per row: the reset observation its episodes share (messages rendered)."""
        texts: list[str | None] = [None] * num_prompts
        for obs, i in zip(firsts, owner, strict=True):
            if not isinstance(obs, str | list):
                raise EnvError(
                    f"reset must return a prompt (text or messages), got {type(obs).__name__}",
                    where=self.settings.where,
                )
            text = (
                obs if isinstance(obs, str) else render_prompts(self.tokenizer, [obs], where="env reset")[0]
            )
            if texts[i] is None:
                texts[i] = text
            elif texts[i] != text:
                raise EnvError(
                    f"reset returned different prompts for the episodes of row {i}: a group's episodes must "
                    "start from the same observation",
                    where=self.settings.where,
                )
        return [t or "" for t in texts]


async def _timed(e: Episode, job: Any) -> Any:
    """Await ``job`` within what is left of ``e``'s environment budget (TimeoutError past it)."""
    t0 = time.perf_counter()
    try:
        return await asyncio.wait_for(job, None if e.budget == float("inf") else max(0.0, e.budget))
    finally:
        e.budget -= time.perf_counter() - t0


def _check_step(out: Any, where: str) -> tuple[str, float, bool, dict[str, Any]]:
    """``step``'s ``(observation, reward, done, info)``, checked; EnvError naming what is wrong."""
    if not isinstance(out, tuple | list) or len(out) != 4:
        raise EnvError("step must return (observation, reward, done, info)", where=where)
    obs, reward, done, info = out
    if not isinstance(obs, str):
        raise EnvError(f"step's observation must be text, got {type(obs).__name__}", where=where)
    reward = _step_reward(reward, where)
    if reward != reward or reward in (float("inf"), float("-inf")):
        raise EnvError(f"step's reward must be finite, got {reward}", where=where)
    if info is None:
        info = {}
    if not isinstance(info, dict):
        raise EnvError(f"step's info must be a dict, got {type(info).__name__}", where=where)
    for key in INFO_COUNTERS:  # counted per episode: a whole number (or nothing)
        value = info.get(key)
        whole = (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
        if value is not None and not whole:
            raise EnvError(f"step's info[{key!r}] must be a whole number, got {value!r}", where=where)
    numpy_bool = type(done).__module__ == "numpy" and type(done).__name__ in ("bool", "bool_")  # no subclass
    if not (isinstance(done, bool) or numpy_bool):
        got = f"{type(done).__name__} {done!r:.40}"  # "no" or None would read as True or as never done
        raise EnvError(f"step's done must be True or False, got {got}", where=where)
    return obs, reward, bool(done), info


def _step_reward(reward: Any, where: str) -> float:
    """``step``'s reward as a float: an int or float (a numpy or one-element torch number too); a string
    (``"1.0"``), a bool (``done`` in the reward's place) or anything else is EnvError, not coerced."""
    if isinstance(reward, torch.Tensor) and reward.numel() == 1:
        reward = reward.item()  # a Python bool, int or float
    if not isinstance(reward, numbers.Real) or isinstance(reward, bool):  # numpy.bool_ is no Real
        got = f"{type(reward).__name__} {reward!r:.40}"
        raise EnvError(f"step's reward must be a number, got {got}", where=where)
    try:
        return float(reward)
    except OverflowError:  # an int past float's range
        return float("inf") if reward > 0 else float("-inf")


def _prompt_row(batch: RolloutBatch, row: int) -> list[int]:
    """The real (unpadded) prompt ids of ``row``."""
    return batch.prompt_ids[row][batch.prompt_mask[row]].tolist()


def _append_turn(e: Episode, batch: RolloutBatch, row: int) -> None:
    """Append row ``row`` of a turn's batch (sampled ids and their log-probs) to ``e``; the action is
    the completion (stop string cut), the conversation shows the turn as sampled (stop string kept)."""
    n = int(batch.response_mask[row].sum())
    ids = batch.response_ids[row, :n].tolist()
    e.ids += ids
    e.mask += [True] * n
    e.logprobs += batch.behavior_logprobs[row, :n].tolist()
    e.answer = batch.completions[row]
    e.pieces.append(ids)
    e.turns += 1


def _turn_params(
    each: list[SamplingParams], owner: list[int], live_rows: list[int], turn: int
) -> SamplingParams | list[SamplingParams]:
    """Sampling parameters of a later turn, one sample per live episode: one set for the batch when the
    prompts share theirs (one RNG stream; the seed moved on per turn), else one per episode."""

    def turn_seed(p: SamplingParams, salt: int) -> int | None:
        return None if p.seed is None else (p.seed * 31 + turn * 1_000_003 + salt) % (2**31 - 1)

    if all(p == each[0] for p in each):
        return replace(each[0], n=1, seed=turn_seed(each[0], 0))
    return [replace(each[owner[r]], n=1, seed=turn_seed(each[owner[r]], r)) for r in live_rows]


def _last_sampled(mask: list[bool]) -> int:
    """Index of the last sampled token so far (-1 when none: its reward is credited at the end)."""
    return next((i for i in range(len(mask) - 1, -1, -1) if mask[i]), -1)


def _assemble(first: RolloutBatch, episodes: list[Episode], tokenizer: Any, per_turn: bool) -> RolloutBatch:
    """The episodes as one batch: turn 1's prompts and labels, the episodes' response rows; with
    ``per_turn``, each step's reward on the last sampled token of its turn (``turn_rewards``)."""
    pad = tokenizer.pad_token_id
    B, R = len(episodes), max(1, max(len(e.ids) for e in episodes))
    ids = torch.full((B, R), pad, dtype=torch.long)  # [B, R]
    mask = torch.zeros((B, R), dtype=torch.bool)  # [B, R]
    logprobs = torch.zeros((B, R), dtype=torch.float32)  # [B, R]
    for b, e in enumerate(episodes):
        n = len(e.ids)
        ids[b, :n] = torch.tensor(e.ids, dtype=torch.long)
        mask[b, :n] = torch.tensor(e.mask, dtype=torch.bool)
        logprobs[b, :n] = torch.tensor(e.logprobs, dtype=torch.float32)
    return replace(
        first,
        response_ids=ids,
        response_mask=mask,
        behavior_logprobs=logprobs,
        completions=[e.answer for e in episodes],
        finish_reasons=["stop" if e.done else "length" for e in episodes],
        extras=[
            {**x, "conversation": _conversation(e.pieces, tokenizer)}
            for x, e in zip(first.extras, episodes, strict=True)
        ],
        turn_rewards=_placed_rewards(episodes, R) if per_turn else None,
    )


def _placed_rewards(episodes: list[Episode], R: int) -> torch.Tensor:
    """Each episode's step rewards on the tokens that earned them ``[B, R]`` float32 (a step with no
    sampled token before it has its reward left to the end, with the rest of the score)."""
    out = torch.zeros((len(episodes), R), dtype=torch.float32)  # [B, R]
    for b, e in enumerate(episodes):
        for i, reward in e.earned:
            if i >= 0:
                out[b, i] += reward
    return out


def _conversation(pieces: list[list[int] | str], tokenizer: Any) -> str:
    """An episode's turns and observations as one text (sampled ids decoded, special tokens dropped)."""
    return "".join(p if isinstance(p, str) else tokenizer.decode(p, skip_special_tokens=True) for p in pieces)


def _stats(episodes: list[Episode], env_s: float) -> EpisodeStats:
    """Returns ``[B]`` and the per-episode means of a call's episodes."""
    B = max(1, len(episodes))
    calls = sum(e.counters["tool_calls"] for e in episodes)
    errors = sum(e.counters["tool_errors"] for e in episodes)
    metrics = {
        "agent/turns_mean": sum(e.turns for e in episodes) / B,
        "agent/tool_calls_mean": calls / B,
        "agent/tool_error_rate": errors / calls if calls else 0.0,
        "agent/sandbox_kills": float(sum(e.counters["sandbox_kills"] for e in episodes)),
        "agent/timeouts": float(sum(e.timed_out for e in episodes)),
        "agent/context_full": float(sum(e.context_full for e in episodes)),
        "agent/unfinished_frac": sum(not e.done for e in episodes) / B,
        "agent/return_mean": sum(e.ret for e in episodes) / B,
        "timing/env": env_s,
    }
    return EpisodeStats(torch.tensor([e.ret for e in episodes], dtype=torch.float32), metrics)


def mean_stats(stats: list[EpisodeStats]) -> dict[str, float]:
    """The metrics of several calls' episodes together (means weighted by episodes; counts and
    ``timing/env`` summed)."""
    total = sum(int(s.returns.numel()) for s in stats)
    if not total:
        return {}
    summed = {"agent/sandbox_kills", "agent/timeouts", "agent/context_full", "timing/env"}
    out: dict[str, float] = {}
    for key in stats[0].metrics:
        if key in summed:
            out[key] = sum(s.metrics[key] for s in stats)
        else:
            out[key] = sum(s.metrics[key] * s.returns.numel() for s in stats) / total
    calls = sum(s.metrics["agent/tool_calls_mean"] * s.returns.numel() for s in stats)
    errors = sum(
        s.metrics["agent/tool_error_rate"] * s.metrics["agent/tool_calls_mean"] * s.returns.numel()
        for s in stats
    )
    out["agent/tool_error_rate"] = errors / calls if calls else 0.0
    return out
