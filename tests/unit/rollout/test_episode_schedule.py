"""Episode scheduling (``env.schedule``): async episodes continue while other episodes' steps run,
token-exact and within the same limits as lockstep."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest
import torch
from fake_replies import reply_batch

from tandem.config.env import EnvConfig
from tandem.errors import ConfigError
from tandem.models import init_model, load_causal_lm, load_tokenizer
from tandem.models.forward import response_logprobs
from tandem.rollout import EngineSpec, build_engine
from tandem.rollout.base import SamplingParams
from tandem.rollout.environments import episode_settings
from tandem.rollout.episodes import EnvError, EpisodeRunner, EpisodeSettings
from tandem.types import RolloutBatch

OBS = " tool said: 42 ok\n"


class Staggered:
    """An async tool whose latency changes from step to step and episode to episode (0.01 s to 0.25 s:
    each turn another episode is the slow one); ``in_flight`` counts the steps running now (shared by
    the episodes of a test)."""

    in_flight = 0
    order = itertools.count()
    delays = (0.25, 0.01, 0.02, 0.05)

    def __init__(self) -> None:
        self.k = next(self.order)  # the episode's index, then its steps'

    def reset(self, row):
        return row["prompt"]

    async def step(self, action):
        type(self).in_flight += 1
        try:
            self.k += 1
            await asyncio.sleep(self.delays[(self.k - 1) % len(self.delays)])
        finally:
            type(self).in_flight -= 1
        return OBS, 0.25, False, {"tool_calls": 1}


def staggered(delays: tuple[float, ...] = Staggered.delays) -> type[Staggered]:
    """A fresh ``Staggered`` class (its own counters)."""
    return type("S", (Staggered,), {"in_flight": 0, "order": itertools.count(), "delays": delays})


class Fake:
    """A fake engine for the loop's mechanics: every row samples ``reply`` (log-prob -0.5); records the
    size of every call and how many environment steps were in flight when it was made."""

    def __init__(self, tokenizer, env: type[Staggered], reply: str = "x\n") -> None:
        self.tokenizer, self.env, self.reply, self.version = tokenizer, env, reply, 0
        self.sizes: list[int] = []
        self.busy: list[int] = []  # steps in flight at each generate_ids call

    def _batch(self, contexts: list[list[int]], n: int) -> RolloutBatch:
        return reply_batch(self.tokenizer, contexts, n, self.reply)

    def generate(self, prompts, params, **kw):
        return self._batch([self.tokenizer(p)["input_ids"] for p in prompts], params.n)

    def generate_ids(self, prompt_ids, params, **kw):
        self.sizes.append(len(prompt_ids))
        self.busy.append(self.env.in_flight)
        time.sleep(0.03)  # a turn's generation takes time, during which async steps go on
        return self._batch(prompt_ids, 1)


def test_async_steps_overlap_generation_and_lockstep_does_not(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    params = SamplingParams(max_new_tokens=4, n=4)
    for schedule in ("lockstep", "async"):
        env = staggered()
        engine = Fake(tok, env)
        runner = EpisodeRunner(engine, env, EpisodeSettings(max_turns=4, schedule=schedule))
        runner.generate(["a", "b"], params)
        m = runner.last.metrics
        assert m["agent/turns_mean"] == 4 and m["agent/tool_calls_mean"] == 4
        assert runner.last.returns.tolist() == [1.0] * 8
        if schedule == "lockstep":  # one call per later turn, every episode in it, no step running
            assert engine.sizes == [8, 8, 8] and engine.busy == [0, 0, 0]
        else:  # fast episodes went on while the slow ones' steps ran
            assert max(engine.busy) > 0 and len(engine.sizes) > 3 and sum(engine.sizes) == 24


def test_async_episodes_are_token_exact(tmp_path):
    path = init_model(
        tmp_path / "bpe", tokenizer="bpe", vocab_size=400, hidden_size=32, num_layers=2, num_heads=1, seed=0
    )
    model, tok = load_causal_lm(path), load_tokenizer(path)
    engine = build_engine("hf", EngineSpec(model=model, tokenizer=tok))
    contexts: list[list[int]] = []
    generate_ids = engine.generate_ids

    def recording(prompt_ids, params, **kw):
        contexts.extend(list(p) for p in prompt_ids)
        return generate_ids(prompt_ids, params, **kw)

    engine.generate_ids = recording
    env = staggered((0.2, 0.0, 0.01))
    settings = EpisodeSettings(max_turns=3, schedule="async", async_min_batch=0.3, async_max_wait_s=0.0)
    params = SamplingParams(max_new_tokens=6, temperature=1.0, n=3, stop=[], seed=5)
    batch = EpisodeRunner(engine, env, settings).generate(["12+34=", "7*8="], params)
    obs = tok(OBS, add_special_tokens=False)["input_ids"]
    full = []
    for b in range(batch.batch_size):
        prompt = batch.prompt_ids[b][batch.prompt_mask[b]].tolist()
        ids, mask = batch.response_ids[b].tolist(), batch.response_mask[b].tolist()
        n = max(i + 1 for i in range(len(mask)) if mask[i])
        # sampled turns of at most 6 tokens (fewer if one samples EOS: which rows share an engine call, and
        # so the sampled values, depends on timing), each followed by exactly the observation's ids
        runs = [(k, len(list(g))) for k, g in itertools.groupby(mask[:n])]
        assert [k for k, _ in runs] == [True, False] * (len(runs) // 2) + [True]
        assert all(1 <= size <= 6 for k, size in runs if k) and len(runs) // 2 + 1 <= 3
        at = 0
        for k, size in runs:
            assert k or (size == len(obs) and ids[at : at + size] == obs)
            at += size
        assert not any(mask[n:])
        full.append((prompt, ids[:n]))
    # every later turn was given its episode's prompt and response so far, as ids
    assert len(contexts) == 2 * batch.batch_size
    for c in contexts:
        assert any(c == p + r[: len(c) - len(p)] and len(c) > len(p) for p, r in full)
    assert (batch.behavior_logprobs[~batch.response_mask] == 0).all()
    with torch.no_grad():
        lp, _ = response_logprobs(
            model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask
        )
    m = batch.response_mask
    assert torch.allclose(lp[m], batch.behavior_logprobs[m], atol=1e-4)


def test_async_keeps_the_limits_and_one_line_errors(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    settings = EpisodeSettings(max_turns=3, schedule="async", async_max_wait_s=0.0)
    env = staggered()
    engine = Fake(tok, env)
    runner = EpisodeRunner(engine, env, settings)
    runner.generate(["a"], SamplingParams(max_new_tokens=4, n=4))
    assert sum(engine.sizes) == 8 and runner.last.metrics["agent/unfinished_frac"] == 1.0  # max_turns

    slow = staggered((5.0, 0.01, 0.01, 0.01))  # one episode's tool hangs past the budget; the other goes on
    runner = EpisodeRunner(
        Fake(tok, slow), slow, EpisodeSettings(max_turns=3, timeout_s=0.3, schedule="async")
    )
    t0 = time.perf_counter()
    runner.generate(["a"], SamplingParams(max_new_tokens=4, n=2))
    assert time.perf_counter() - t0 < 2.0
    assert runner.last.metrics["agent/timeouts"] == 1 and runner.last.metrics["agent/turns_mean"] == 2

    # prompt 1 + reply 2 + observation 17 = 20 tokens; the next turn needs 4 more: 24 > 22
    full = staggered((0.0,))
    runner = EpisodeRunner(Fake(tok, full, "y\n"), full, replace_schedule(max_context_tokens=22))
    runner.generate(["a"], SamplingParams(max_new_tokens=4, n=2))
    assert runner.last.metrics["agent/context_full"] == 2 and runner.last.metrics["agent/turns_mean"] == 1

    class Raises(Staggered):
        async def step(self, action):
            raise RuntimeError("boom")

    with pytest.raises(EnvError, match="step raised RuntimeError: boom"):
        EpisodeRunner(Fake(tok, Raises), Raises, settings).generate(["a"], SamplingParams(4, n=2))


def replace_schedule(**kw) -> EpisodeSettings:
    return EpisodeSettings(max_turns=5, schedule="async", **kw)


def test_schedule_config():
    assert episode_settings(EnvConfig(name="guess")).schedule == "lockstep"  # deterministic by default
    s = episode_settings(EnvConfig(name="guess", schedule="async", async_min_batch=1.0, async_max_wait_s=0.1))
    assert (s.schedule, s.async_min_batch, s.async_max_wait_s) == ("async", 1.0, 0.1)
    with pytest.raises(ValueError, match="schedule"):
        EnvConfig(name="guess", schedule="fast")
    with pytest.raises(ConfigError, match="env.schedule.*unknown schedule 'fast'"):
        EpisodeRunner(object(), settings=EpisodeSettings(schedule="fast"))
