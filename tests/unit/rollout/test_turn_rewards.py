"""Per-turn rewards (``env.turn_rewards``): each step's reward on the last sampled token of its turn,
the rows and masks unchanged, the batch carried through concatenation and the channel wire format."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fake_replies import reply_batch

from tandem.channels import TrajectoryMessage
from tandem.channels.serialize import decode_message, encode_message
from tandem.config.env import EnvConfig
from tandem.config.loader import load_config
from tandem.errors import ConfigError
from tandem.models import load_tokenizer
from tandem.rollout.base import SamplingParams
from tandem.rollout.environments import episode_runner, episode_settings
from tandem.rollout.episodes import EpisodeRunner, EpisodeSettings
from tandem.types import RolloutBatch, concat_rollouts

REPO = Path(__file__).resolve().parents[3]
OBS = "ok!\n"
REPLIES = ("ab\n", "cdef\n", "g\n")  # turn t samples REPLIES[t]: turns of different lengths
REWARDS = (1.0, 0.0, 2.0)  # step t's reward; the last step ends the episode


class Rewarded:
    """Rewards 1.0 after turn 1, nothing after turn 2, 2.0 at the end (turn 3, done)."""

    inline = True

    def __init__(self) -> None:
        self.t = 0

    def reset(self, row):
        return row["prompt"]

    def step(self, action):
        self.t += 1
        return OBS, REWARDS[self.t - 1], self.t == len(REWARDS), {}


class Turns:
    """A fake engine for the loop's bookkeeping: every row of call ``t`` samples ``REPLIES[t]``
    (log-prob -0.5)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.version, self.calls = tokenizer, 0, 0

    def _batch(self, contexts: list[list[int]], n: int) -> RolloutBatch:
        reply = REPLIES[self.calls]
        self.calls += 1
        return reply_batch(self.tokenizer, contexts, n, reply)

    def generate(self, prompts, params, **kw):
        return self._batch([self.tokenizer(p)["input_ids"] for p in prompts], params.n)

    def generate_ids(self, prompt_ids, params, **kw):
        return self._batch(prompt_ids, 1)


def _run(tok, turn_rewards: str) -> tuple[RolloutBatch, EpisodeRunner]:
    runner = EpisodeRunner(Turns(tok), Rewarded, EpisodeSettings(max_turns=3, turn_rewards=turn_rewards))
    params = SamplingParams(max_new_tokens=8, n=2, stop=[], seed=1)
    return runner.generate(["1+2=", "3+4="], params), runner


def test_step_rewards_land_on_the_last_sampled_token_of_their_turn(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    lens = [len(tok(r, add_special_tokens=False)["input_ids"]) for r in REPLIES]
    n_obs = len(tok(OBS, add_special_tokens=False)["input_ids"])
    ends = [lens[0] - 1, lens[0] + n_obs + lens[1] - 1, lens[0] + lens[1] + 2 * n_obs + lens[2] - 1]
    per_turn, runner = _run(tok, "per_turn")
    summed, _ = _run(tok, "sum")
    assert summed.turn_rewards is None  # the default: the whole return at the end, as before
    assert runner.last.returns.tolist() == [sum(REWARDS)] * 4  # the return is the sum either way
    want = torch.zeros(4, per_turn.response_ids.shape[1])
    for t, reward in enumerate(REWARDS):
        want[:, ends[t]] = reward
    assert torch.equal(per_turn.turn_rewards, want)
    assert per_turn.response_mask[:, ends].all()  # sampled tokens, each its turn's last
    assert not per_turn.response_mask[:, [e + 1 for e in ends[:2]]].any()  # an observation follows
    for name in ("response_ids", "response_mask", "behavior_logprobs", "prompt_ids"):  # rows unchanged
        assert torch.equal(getattr(per_turn, name), getattr(summed, name)), name
    # selected rows keep their rewards; a batch without them concatenates as zeros (all at the end)
    assert torch.equal(per_turn.select([3, 0]).turn_rewards, want[[3, 0]])
    both = concat_rollouts([summed, per_turn], pad_token_id=0)
    assert torch.equal(both.turn_rewards, torch.cat([torch.zeros_like(want), want]))
    assert concat_rollouts([summed, summed], pad_token_id=0).turn_rewards is None


def test_single_turn_batch_is_unchanged_with_per_turn_rewards(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    engine = Turns(tok)
    direct = engine.generate(["1+2=", "3+4="], SamplingParams(max_new_tokens=8, n=2, seed=1))
    engine.calls = 0
    cfg = EnvConfig(name="single_turn", max_turns=1, turn_rewards="per_turn")
    runner = episode_runner(cfg, engine, tokenizer=tok)
    ours = runner.generate(["1+2=", "3+4="], SamplingParams(max_new_tokens=8, n=2, seed=1))
    assert ours.turn_rewards is None
    for name in ("prompt_ids", "response_ids", "response_mask", "behavior_logprobs", "group_ids"):
        assert torch.equal(getattr(ours, name), getattr(direct, name)), name
    assert ours.completions == direct.completions and ours.extras == direct.extras


def test_turn_rewards_round_trip_the_channel_wire_format(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    per_turn, _ = _run(tok, "per_turn")
    summed, _ = _run(tok, "sum")
    for batch in (per_turn, summed):
        scores = torch.arange(batch.batch_size, dtype=torch.float32)
        back = decode_message(encode_message(TrajectoryMessage(batch, scores, 5, 1, {"x": 1.0}))).batch
        if batch.turn_rewards is None:
            assert back.turn_rewards is None
        else:
            assert torch.equal(back.turn_rewards, batch.turn_rewards)
        assert torch.equal(back.response_mask, batch.response_mask)


def test_turn_rewards_config_is_checked():
    assert episode_settings(EnvConfig(name="calculator", turn_rewards="per_turn")).turn_rewards == "per_turn"
    assert episode_settings(EnvConfig(name="calculator")).turn_rewards == "sum"
    with pytest.raises(
        ConfigError, match=r"^override 'env.turn_rewards=each': env.turn_rewards: .*'sum' or 'per_turn'"
    ):
        load_config(REPO / "configs" / "agent_calculator.yaml", ["env.turn_rewards=each"])
    with pytest.raises(ConfigError, match="env.turn_rewards.*unknown turn_rewards 'each'"):
        EpisodeRunner(Turns(None), Rewarded, EpisodeSettings(turn_rewards="each"))
