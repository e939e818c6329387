"""Trajectory serialisation, the multiprocessing queue channel and the shared-memory weight channel."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from tandem.channels import BACKENDS, TrajectoryMessage, open_channel
from tandem.channels.queue import QueueChannel
from tandem.channels.serialize import decode_message, encode_message
from tandem.channels.weights import SharedMemoryWeights
from tandem.errors import ConfigError, DataError
from tandem.types import RolloutBatch


def make_message(ticket: int = 3, B: int = 4, P: int = 3, R: int = 5) -> TrajectoryMessage:
    g = torch.Generator().manual_seed(ticket)
    batch = RolloutBatch(
        prompt_ids=torch.randint(0, 50, (B, P), generator=g),
        prompt_mask=torch.rand(B, P, generator=g) > 0.2,
        response_ids=torch.randint(0, 50, (B, R), generator=g),
        response_mask=torch.rand(B, R, generator=g) > 0.3,
        behavior_logprobs=-torch.rand(B, R, generator=g),
        group_ids=torch.tensor([7, 7, 8, 8]),
        policy_version=torch.full((B,), 2, dtype=torch.long),
        prompts=["1+1=", "1+1=", "2+3=", "2+3="],
        completions=["2", "3", "5", "é\n"],
        finish_reasons=["stop", "length", "stop", "stop"],
        sample_ids=[f"s{i}" for i in range(B)],
        extras=[{"answer": "2"}, {"answer": "2"}, {"answer": "5", "x": [1, 2]}, {"answer": "5"}],
    )
    return TrajectoryMessage(
        batch,
        torch.tensor([1.0, 0.0, 0.5, -1.0]),
        ticket,
        1,
        {"worker/idle_ratio": 0.25},
        curriculum={"drawn": [3, 9], "observed": [[3, 0.5, False], [9, 1.0, True]]},
    )


def assert_same(a: TrajectoryMessage, b: TrajectoryMessage) -> None:
    assert (a.ticket, a.worker_id, a.meta, a.curriculum) == (b.ticket, b.worker_id, b.meta, b.curriculum)
    assert torch.equal(a.scores, b.scores)
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "behavior_logprobs"):
        x, y = getattr(a.batch, name), getattr(b.batch, name)
        assert x.dtype == y.dtype and torch.equal(x, y), name
    for name in (
        "group_ids",
        "policy_version",
        "prompts",
        "completions",
        "finish_reasons",
        "sample_ids",
        "extras",
    ):
        x, y = getattr(a.batch, name), getattr(b.batch, name)
        assert (x == y) if isinstance(x, list) else torch.equal(x, y), name


def test_serialisation_round_trip_is_exact_and_not_pickle():
    msg = make_message()
    data = encode_message(msg)
    assert b"\x80\x04" not in data[:2]  # not a pickle stream
    assert_same(msg, decode_message(data))


def test_corrupt_bytes_are_a_one_line_data_error():
    with pytest.raises(DataError, match="corrupt trajectory message"):
        decode_message(b"\x00" * 20)


def test_queue_channel_moves_messages_between_processes():
    ctx = mp.get_context("spawn")
    ch = QueueChannel(ctx)
    ch.put(make_message(1))
    ch.put(make_message(2))
    got = [ch.get(timeout=5), ch.get(timeout=5)]
    assert [d.message.ticket for d in got] == [1, 2]
    assert_same(got[1].message, make_message(2))
    assert ch.get(timeout=0.05) is None
    ch.ack([d.delivery_id for d in got])  # no-op, must not fail
    ch.close()


def test_open_channel_unknown_backend_names_the_key():
    with pytest.raises(ConfigError, match=r"architecture.channel.backend: unknown channel backend 'kafka'"):
        open_channel("kafka")
    assert set(BACKENDS) >= {"queue", "redis"}


def _reader(weights: SharedMemoryWeights, out) -> None:
    got = weights.fetch(-1)
    out.put((got[1], {k: v.tolist() for k, v in got[0].items()}))
    weights.close()


def test_shared_memory_weights_publish_fetch_across_processes():
    state = {
        "a": torch.randn(3, 4),
        "b": torch.arange(5, dtype=torch.float32),
        "c": torch.ones(2, dtype=torch.bfloat16),
    }
    # fork keeps this unit test fast; the spawn path (re-attach by name) runs in the decoupled integration tests
    ctx = mp.get_context("fork")
    w = SharedMemoryWeights(state, ctx)
    try:
        assert w.version == -1 and w.fetch(-1) is None
        new = {k: v * 2 for k, v in state.items()}
        w.publish(new, 7)
        assert w.fetch(7) is None  # not newer than what the caller has
        out = ctx.Queue()
        p = ctx.Process(target=_reader, args=(w, out))
        p.start()
        version, got = out.get(timeout=60)
        p.join(30)
        assert version == 7
        for k in state:
            assert torch.equal(torch.tensor(got[k], dtype=state[k].dtype), new[k]), k
    finally:
        w.unlink()


def test_shared_memory_weights_publish_stream():
    """A sharded learner publishes tensor by tensor: each goes into its slot as it arrives; a stream that
    misses a tensor or fails midway raises and leaves nothing loadable (version -1)."""
    state = {"a": torch.randn(3, 4), "b": torch.arange(5, dtype=torch.float32), "c": torch.ones(2).bfloat16()}
    w = SharedMemoryWeights(state)
    try:
        new = {k: v * 3 for k, v in state.items()}
        assert w.publish_stream(iter(new.items()), 4) == 12 * 4 + 5 * 4 + 2 * 2
        got, version = w.fetch(-1)
        assert version == 4 and all(torch.equal(got[k], new[k]) for k in state)
        with pytest.raises(KeyError, match="lack 1 tensors, e.g. c"):
            w.publish_stream(((k, v) for k, v in new.items() if k != "c"), 5)
        assert w.version == -1 and w.fetch(-1) is None

        def broken():
            yield "a", new["a"]
            raise RuntimeError("a rank died")

        w.publish(state, 6)
        with pytest.raises(RuntimeError, match="a rank died"):
            w.publish_stream(broken(), 7)
        assert w.version == -1
    finally:
        w.unlink()
