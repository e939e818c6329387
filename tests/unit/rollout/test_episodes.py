"""Multi-turn episodes: token exactness, masks, limits, concurrency, malformed tool calls."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from tandem.agents.calculator import Calculator
from tandem.config.env import EnvConfig
from tandem.errors import ConfigError
from tandem.models import load_causal_lm, load_tokenizer
from tandem.models.forward import response_logprobs
from tandem.rollout import EngineSpec, build_engine
from tandem.rollout.base import SamplingParams
from tandem.rollout.environments import env_factory, episode_runner
from tandem.rollout.episodes import EnvError, EpisodeRunner, EpisodeSettings
from tandem.types import RolloutBatch


class Echo:
    """Never done: answers every action with a fixed observation (a multi-byte one for BPE)."""

    def __init__(self, obs: str = " tool said: 42 ok\n") -> None:
        self.obs = obs

    def reset(self, row):
        return row["prompt"]

    def step(self, action):
        return self.obs, 0.25, False, {"tool_calls": 1}


class Recording:
    """Wraps an engine and records what every turn was given and sampled."""

    def __init__(self, engine) -> None:
        self.engine, self.tokenizer = engine, engine.tokenizer
        self.contexts: list[list[list[int]]] = []
        self.samples: list[list[list[int]]] = []

    @property
    def version(self):
        return self.engine.version

    def _record(self, batch: RolloutBatch) -> RolloutBatch:
        n = batch.response_mask.sum(1).tolist()
        self.samples.append([batch.response_ids[i, : n[i]].tolist() for i in range(batch.batch_size)])
        return batch

    def generate(self, prompts, params, **kw):
        return self._record(self.engine.generate(prompts, params, **kw))

    def generate_ids(self, prompt_ids, params, **kw):
        self.contexts.append([list(p) for p in prompt_ids])
        return self._record(self.engine.generate_ids(prompt_ids, params, **kw))


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    from tandem.models import init_model

    out = tmp_path_factory.mktemp("bpe") / "m"
    return init_model(out, tokenizer="bpe", vocab_size=400, hidden_size=32, num_layers=2, num_heads=1, seed=0)


def _hf(path):
    model, tok = load_causal_lm(path), load_tokenizer(path)
    return build_engine("hf", EngineSpec(model=model, tokenizer=tok)), model, tok


def test_episode_rows_are_exactly_the_sampled_and_observation_ids(bpe_dir):
    engine, model, tok = _hf(bpe_dir)
    rec = Recording(engine)
    runner = EpisodeRunner(rec, Echo, EpisodeSettings(max_turns=3))
    params = SamplingParams(max_new_tokens=6, temperature=1.0, n=2, stop=[], seed=5)
    batch = runner.generate(["12+34=", "7*8="], params, extras=[{"a": 1}, {"a": 2}])
    obs = tok(" tool said: 42 ok\n", add_special_tokens=False)["input_ids"]
    retokenised_differs = False
    for b in range(batch.batch_size):
        prompt = batch.prompt_ids[b][batch.prompt_mask[b]].tolist()
        want, mask = [], []
        for t in range(3):
            sampled = rec.samples[t][b] if t == 0 else rec.samples[t][b]
            if t > 0:  # the context of turn t is the prompt + everything so far, as ids
                assert rec.contexts[t - 1][b] == prompt + want
            want += sampled
            mask += [True] * len(sampled)
            if t < 2:
                want += obs
                mask += [False] * len(obs)
        n = len(want)
        assert batch.response_ids[b, :n].tolist() == want
        assert batch.response_mask[b, :n].tolist() == mask
        assert not batch.response_mask[b, n:].any()
        assert (batch.behavior_logprobs[b][~batch.response_mask[b]] == 0).all()
        text = tok.decode(prompt + want)
        retokenised_differs |= tok(text, add_special_tokens=False)["input_ids"] != prompt + want
    # The check above would catch a decode -> encode round trip: it does not give the same ids here.
    assert retokenised_differs
    # The trainer's recomputed log-probs (env tokens attended, not scored) equal the behaviour ones.
    with torch.no_grad():
        lp, _ = response_logprobs(
            model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask
        )
        packed, _ = response_logprobs(
            model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask,
            micro_batch_tokens=64,
        )  # fmt: skip
        shared, _ = response_logprobs(
            model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask,
            share_prefix=True,
        )  # fmt: skip
    m = batch.response_mask
    assert torch.allclose(lp[m], batch.behavior_logprobs[m], atol=1e-4)
    assert torch.allclose(packed[m], lp[m], atol=1e-4)
    assert torch.allclose(shared[m], lp[m], atol=1e-4)  # one prompt forward per group
    assert (lp[~m] == 0).all()
    assert runner.last.metrics["agent/turns_mean"] == 3
    assert runner.last.metrics["agent/tool_calls_mean"] == 3  # every action is stepped, the last too
    assert runner.last.returns.tolist() == [0.75] * 4
    assert batch.finish_reasons == ["length"] * 4  # max_turns, not the environment, ended them
    assert "tool said" in batch.extras[0]["conversation"] and batch.extras[0]["a"] == 1


def test_single_turn_is_the_engines_own_batch(tiny_model_dir):
    engine, _, _ = _hf(tiny_model_dir)
    params = SamplingParams(max_new_tokens=5, n=3, seed=11)
    direct = engine.generate(["1+2=", "3+4="], params, group_offset=4, extras=[{"x": 1}, {"x": 2}])
    runner = episode_runner(None, engine)
    ours = runner.generate(["1+2=", "3+4="], params, group_offset=4, extras=[{"x": 1}, {"x": 2}])
    for name in ("prompt_ids", "response_ids", "response_mask", "behavior_logprobs", "group_ids"):
        assert torch.equal(getattr(ours, name), getattr(direct, name)), name
    assert ours.completions == direct.completions and ours.extras == direct.extras
    assert runner.last.returns.tolist() == [0.0] * 6


def test_single_turn_skips_the_event_loop_with_the_same_batch_and_stats(tiny_model_dir, monkeypatch):
    """SingleTurn episodes take the engine's batch directly; a subclass of it (same behaviour, not the
    built-in) goes through the event loop, one task per episode: same batch, same stats."""
    from tandem.agents.env import SingleTurn
    from tandem.rollout import episodes as mod

    class Stepped(SingleTurn):
        pass

    engine, _, _ = _hf(tiny_model_dir)
    params = [SamplingParams(max_new_tokens=5, n=3, seed=11), SamplingParams(max_new_tokens=3, n=2, seed=2)]
    fast, slow = EpisodeRunner(engine), EpisodeRunner(engine, Stepped)
    loops: list[int] = []
    real = mod.EnvLoop.__init__
    monkeypatch.setattr(mod.EnvLoop, "__init__", lambda self, *a: loops.append(1) or real(self, *a))
    fast.log, slow.log = [], []
    a = fast.generate(["1+2=", "3+4="], params, group_offset=2)
    assert loops == []  # no event loop, no tasks
    b = slow.generate(["1+2=", "3+4="], params, group_offset=2)
    assert loops == [1]
    for name in ("prompt_ids", "response_ids", "response_mask", "behavior_logprobs", "group_ids"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert a.completions == b.completions and a.finish_reasons == b.finish_reasons
    assert fast.log == [fast.last] and torch.equal(fast.last.returns, slow.last.returns)
    timing = "timing/env"
    assert {k: v for k, v in fast.last.metrics.items() if k != timing} == {
        k: v for k, v in slow.last.metrics.items() if k != timing
    }


class Scripted:
    """A fake engine for loop mechanics: every row answers ``reply(context_text)``; log-prob -0.5."""

    def __init__(self, tokenizer, reply) -> None:
        self.tokenizer, self.reply, self.version, self.calls = tokenizer, reply, 0, 0

    def _batch(self, contexts: list[list[int]], n: int) -> RolloutBatch:
        self.calls += 1
        rows = [c for c in contexts for _ in range(n)]
        texts = [self.reply(self.tokenizer.decode(c)) for c in rows]
        resp = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        B, P, R = len(rows), max(map(len, rows)), max(map(len, resp))
        pid, pm = torch.zeros(B, P, dtype=torch.long), torch.zeros(B, P, dtype=torch.bool)
        rid, rm = torch.zeros(B, R, dtype=torch.long), torch.zeros(B, R, dtype=torch.bool)
        for i, (c, r) in enumerate(zip(rows, resp, strict=True)):
            pid[i, P - len(c) :], pm[i, P - len(c) :] = torch.tensor(c), True
            rid[i, : len(r)], rm[i, : len(r)] = torch.tensor(r), True
        return RolloutBatch(
            pid, pm, rid, rm, rm.float() * -0.5, torch.arange(len(contexts)).repeat_interleave(n),
            torch.zeros(B, dtype=torch.long), [""] * B, [t.rstrip("\n") for t in texts], ["stop"] * B,
            [str(i) for i in range(B)], [{} for _ in range(B)],
        )  # fmt: skip

    def generate(self, prompts, params, *, group_offset=0, extras=None, **kw):
        b = self._batch([self.tokenizer(p)["input_ids"] for p in prompts], params.n)
        b.extras = [dict(e) for e in (extras or [{}] * len(prompts)) for _ in range(params.n)]
        return b

    def generate_ids(self, prompt_ids, params, **kw):
        n = 1 if isinstance(params, SamplingParams) else 1
        return self._batch(prompt_ids, n)


def test_calculator_tool_calls_malformed_calls_and_answers(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)

    def reply(context: str) -> str:
        if "ERROR" not in context:
            return "CALL calc(12*)\n"  # malformed: an error observation, not a crash
        if "RESULT" not in context:
            return "CALL calc(12*34)\n"
        return context.rsplit("RESULT ", 1)[1].split("\n")[0] + "\n"

    runner = EpisodeRunner(Scripted(tok, reply), Calculator, EpisodeSettings(max_turns=4))
    batch = runner.generate(["12*34="], SamplingParams(max_new_tokens=8, n=2), extras=[{"answer": "408"}])
    conv = batch.extras[0]["conversation"]
    assert "ERROR" in conv and "RESULT 408" in conv
    assert batch.completions == ["408", "408"]
    assert runner.last.returns.tolist() == [1.0, 1.0]
    m = runner.last.metrics
    assert (
        m["agent/turns_mean"] == 3 and m["agent/tool_calls_mean"] == 2 and m["agent/tool_error_rate"] == 0.5
    )
    assert batch.finish_reasons == ["stop", "stop"]


class Slow:
    """An async environment whose every step takes ``delay`` seconds (a tool call's latency)."""

    delay = 0.05

    def reset(self, row):
        return row["prompt"]

    async def step(self, action):
        await asyncio.sleep(self.delay)
        return "ok\n", 0.0, False, {}


def test_env_steps_of_a_turn_overlap(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    params = SamplingParams(max_new_tokens=4, n=8)
    times = {}
    for concurrent in (True, False):
        runner = EpisodeRunner(
            Scripted(tok, lambda c: "x\n"), Slow, EpisodeSettings(max_turns=3, concurrent=concurrent)
        )
        t0 = time.perf_counter()
        runner.generate(["a", "b"], params)
        times[concurrent] = time.perf_counter() - t0
        assert runner.last.metrics["agent/turns_mean"] == 3
    assert times[False] >= 16 * 3 * 0.05 * 0.9  # 16 episodes x 3 steps, one after another
    assert times[True] < times[False] / 4


def test_episode_timeout_ends_the_episode_not_the_run(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)

    class Stuck(Slow):
        delay = 5.0

    runner = EpisodeRunner(Scripted(tok, lambda c: "x\n"), Stuck, EpisodeSettings(max_turns=4, timeout_s=0.2))
    t0 = time.perf_counter()
    batch = runner.generate(["a"], SamplingParams(max_new_tokens=4, n=2))
    assert time.perf_counter() - t0 < 2.0
    assert runner.last.metrics["agent/timeouts"] == 2 and runner.last.metrics["agent/turns_mean"] == 1
    assert batch.finish_reasons == ["stop", "stop"]  # one turn, unchanged: the engine's batch


def test_max_turns_and_bad_environments(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    engine = Scripted(tok, lambda c: "y\n")
    runner = EpisodeRunner(engine, Echo, EpisodeSettings(max_turns=2))
    runner.generate(["a"], SamplingParams(max_new_tokens=4, n=3))
    assert engine.calls == 2 and runner.last.metrics["agent/unfinished_frac"] == 1.0

    class BadStep(Echo):
        def step(self, action):
            return "obs", "lots", False, {}

    with pytest.raises(EnvError, match="reward must be a number"):
        EpisodeRunner(engine, BadStep, EpisodeSettings(max_turns=2)).generate(["a"], SamplingParams(4))

    class Raises(Echo):
        def step(self, action):
            raise RuntimeError("boom")

    with pytest.raises(EnvError, match="step raised RuntimeError: boom"):
        EpisodeRunner(engine, Raises, EpisodeSettings(max_turns=2)).generate(["a"], SamplingParams(4))

    for counter in ("many", 1.5, float("nan"), True):

        class BadCounter(Echo):
            def step(self, action, counter=counter):
                return "obs", 0.0, False, {"tool_calls": counter}

        with pytest.raises(EnvError, match=r"step's info\['tool_calls'\] must be a whole number"):
            EpisodeRunner(engine, BadCounter, EpisodeSettings(max_turns=2)).generate(["a"], SamplingParams(4))


@pytest.mark.parametrize(
    "reward",
    ["1.0", True, None, [1.0], torch.tensor([1.0, 2.0]), 10**400],
    ids=["str", "bool", "none", "list", "tensor", "huge_int"],
)
def test_a_step_reward_that_is_not_a_number_stops_the_call(tiny_model_dir, reward):
    # "1.0" used to be coerced by float() and the run went on; True is `done` in the reward's place
    tok = load_tokenizer(tiny_model_dir)

    class Bad(Echo):
        def step(self, action):
            return "", reward, True, {}

    huge = isinstance(reward, int) and not isinstance(reward, bool)
    what = "must be finite" if huge else "must be a number"
    with pytest.raises(EnvError, match=f"env: step's reward {what}"):
        EpisodeRunner(Scripted(tok, lambda c: "y\n"), Bad).generate(["a"], SamplingParams(4))


def test_numpy_and_torch_number_rewards_are_numbers(tiny_model_dir):
    import numpy as np

    tok = load_tokenizer(tiny_model_dir)
    for reward in (1, 0.5, np.float32(0.5), np.int64(1), torch.tensor(0.5), torch.tensor([2])):

        class Scalar(Echo):
            def step(self, action, reward=reward):
                return "", reward, True, {}

        runner = EpisodeRunner(Scripted(tok, lambda c: "y\n"), Scalar)
        runner.generate(["a"], SamplingParams(4, n=2))
        assert runner.last.metrics["agent/return_mean"] == pytest.approx(float(reward)), reward


@pytest.mark.parametrize("done", ["no", None, 1, [True]])
def test_a_step_done_that_is_not_a_bool_stops_the_call(tiny_model_dir, done):
    # "no" was read as True (every episode ended after one turn) and None as "never done"
    tok = load_tokenizer(tiny_model_dir)

    class Bad(Echo):
        def step(self, action):
            return "", 1.0, done, {}

    with pytest.raises(EnvError, match="env: step's done must be True or False"):
        EpisodeRunner(Scripted(tok, lambda c: "y\n"), Bad).generate(["a"], SamplingParams(4))


def test_numpy_bool_done_is_a_bool(tiny_model_dir):
    import numpy as np

    tok = load_tokenizer(tiny_model_dir)

    class NumpyDone(Echo):
        def step(self, action):
            return "", 1.0, np.bool_(True), {}

    runner = EpisodeRunner(Scripted(tok, lambda c: "y\n"), NumpyDone)
    runner.generate(["a"], SamplingParams(4, n=2))
    assert runner.last.metrics["agent/turns_mean"] == 1.0


def test_env_config_errors_are_one_line():
    with pytest.raises(ConfigError, match="env.name.*unknown environment 'nope'"):
        env_factory(EnvConfig(name="nope"))
    with pytest.raises(ConfigError, match="env.options"):
        env_factory(EnvConfig(name="guess", options={"colour": 1}))
    with pytest.raises(ConfigError, match="env.path"):
        env_factory(EnvConfig(path="math:pi"))
    assert isinstance(env_factory(EnvConfig(name="calculator"))(), Calculator)


def test_an_episode_that_would_pass_the_models_positions_ends(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    # prompt 1 + reply 2 + observation 17 = 20 tokens; the next turn needs 4 more: 24 > 22
    runner = EpisodeRunner(
        Scripted(tok, lambda c: "y\n"), Echo, EpisodeSettings(max_turns=5, max_context_tokens=22)
    )
    runner.generate(["a"], SamplingParams(max_new_tokens=4, n=2))
    assert runner.last.metrics["agent/context_full"] == 2 and runner.last.metrics["agent/turns_mean"] == 1
    engine, _, _ = _hf(tiny_model_dir)
    assert episode_runner(EnvConfig(name="guess"), engine).settings.max_context_tokens == 256


def test_a_step_that_never_returns_does_not_keep_the_process_alive():
    # Python joins a ThreadPoolExecutor's threads at exit: a step stuck past env.timeout_s hung the process
    script = textwrap.dedent(
        """
        import threading, time
        from concurrent.futures import FIRST_COMPLETED
        from tandem.rollout.env_loop import EnvLoop, call

        loop = EnvLoop(2, threaded=False)
        never = threading.Event()
        job = loop.submit(call(never.wait))
        assert not loop.wait([job], 0.2, FIRST_COMPLETED)  # still stuck
        loop.close()
        print("closed", flush=True)
        """
    )
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "closed" in out.stdout, out.stderr
    assert time.perf_counter() - t0 < 30
