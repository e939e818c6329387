"""Redis Streams channel: durable delivery, ack-after-checkpoint, re-delivery after a learner crash.

Each test module run starts Debian's ``redis-server`` on 127.0.0.1 on a free port (no persistence) and
stops it by PID. Skipped when the binary is absent (CI installs it: ``apt-get install -y redis-server``).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from tandem.config import build_config
from tandem.models import load_causal_lm
from tandem.orchestration.decoupled.runtime import train_decoupled
from tandem.train.checkpoint import latest_checkpoint

redis = pytest.importorskip("redis", reason="the redis extra is not installed")
pytestmark = [
    pytest.mark.redis,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server binary not installed"),
]
DIGITS = f"{Path(__file__).parents[1] / 'e2e' / 'digits_reward.py'}:digit_share"


def make_message(ticket: int):
    from tandem.channels import TrajectoryMessage
    from tandem.types import RolloutBatch

    ids = torch.full((2, 3), ticket, dtype=torch.long)
    mask = torch.ones(2, 3, dtype=torch.bool)
    batch = RolloutBatch(
        *(ids, mask, ids + 1, mask, torch.zeros(2, 3), torch.tensor([0, 0]), torch.tensor([1, 1])),
        prompts=["p", "p"],
        completions=[f"c{ticket}-0", f"c{ticket}-1"],
        finish_reasons=["stop", "stop"],
    )
    return TrajectoryMessage(batch, torch.tensor([0.0, 1.0]), ticket, 0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    port = _free_port()
    workdir = tmp_path_factory.mktemp("redis")
    cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(
        [*cmd, "--dir", str(workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    client = redis.Redis(port=port)
    try:
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        client.close()
        proc.terminate()
        proc.wait(timeout=10)


def test_channel_delivers_acks_and_redelivers(redis_url):
    from tandem.channels.redis import RedisStreamChannel

    producer = RedisStreamChannel(redis_url, "t:basic", trim_acked=False)
    for t in range(3):
        producer.put(make_message(t))
    first = RedisStreamChannel(redis_url, "t:basic")
    got = [first.get(timeout=1) for _ in range(3)]
    assert [d.message.ticket for d in got] == [0, 1, 2] and not any(d.redelivered for d in got)
    assert torch.equal(got[2].message.batch.response_ids, make_message(2).batch.response_ids)
    assert got[2].message.batch.completions == ["c2-0", "c2-1"]
    assert first.get(timeout=0.05) is None and first.depth() == 0
    first.ack([got[0].delivery_id])  # 1 and 2 were received but never acknowledged: the consumer "crashes"
    first.close()
    second = RedisStreamChannel(redis_url, "t:basic", consumer="learner-2")
    again = [second.get(timeout=0.5), second.get(timeout=0.5)]
    assert [d.message.ticket for d in again] == [1, 2] and all(d.redelivered for d in again)
    assert second.get(timeout=0.05) is None
    second.ack([d.delivery_id for d in again])
    assert producer.stats() == {"added": 3, "length": 0, "pending": 0}  # consumers trim acked entries
    for c in (producer, second):
        c.close()


def test_retention_by_age_trims_old_entries(redis_url):
    """``max_age_s``: entries older than the limit are trimmed on the next put; younger ones stay."""
    from tandem.channels.redis import RedisStreamChannel

    channel = RedisStreamChannel(redis_url, "t:age", trim_acked=False)
    for t in range(3):
        channel.put(make_message(t))
    time.sleep(0.3)
    aged = RedisStreamChannel(redis_url, "t:age", trim_acked=False, max_age_s=0.2)
    aged.put(make_message(3))  # trims the three entries older than 0.2 s
    assert channel.stats()["length"] == 1
    got = channel.get(timeout=1)
    assert got is not None and got.message.ticket == 3
    assert channel.trim_older_than(60.0) == 0  # nothing is a minute old
    for c in (channel, aged):
        c.close()


def test_unreachable_redis_is_a_config_error():
    from tandem.channels.redis import RedisStreamChannel
    from tandem.errors import ConfigError

    with pytest.raises(ConfigError, match="architecture.channel.options.redis_url: cannot reach Redis"):
        RedisStreamChannel(f"redis://127.0.0.1:{_free_port()}/0", "t:none")


def _setting(run_name: str, *, resume: bool):
    """The ``ChannelSetting`` a decoupled run's learner opens its channel with: a new run is ``fresh``."""
    from tandem.channels import ChannelSetting

    return ChannelSetting(run_name=run_name, fresh=not resume)


def _leave_behind(url: str, stream: str) -> None:
    """What an earlier run of the same name leaves: an acknowledged entry, two pending (received, never
    acknowledged), two unread."""
    from tandem.channels.redis import RedisStreamChannel

    earlier = RedisStreamChannel(url, stream, trim_acked=False)
    for t in range(3):
        earlier.put(make_message(t))
    got = [earlier.get(timeout=1) for _ in range(3)]
    earlier.ack([got[0].delivery_id])
    for t in (3, 4):
        earlier.put(make_message(t))
    earlier.close()


def test_a_new_run_starts_on_an_empty_stream_and_a_resumed_one_keeps_it(redis_url):
    """Opened for a run that is not resuming, the channel drops everything an earlier run of the same name
    left (unread and pending entries) but keeps what its own workers write after it is open; opened for a
    resume it re-delivers the pending entries, then the unread ones."""
    from tandem.channels import open_channel

    options = {"redis_url": redis_url, "trim_acked": False}
    _leave_behind(redis_url, "tandem:again")
    fresh = open_channel("redis", options, _setting("again", resume=False))
    assert fresh.recover() == []
    assert fresh.stats() == {"added": 0, "length": 0, "pending": 0}
    worker = pickle.loads(pickle.dumps(fresh))  # how a rollout worker gets it: no reset there
    worker.put(make_message(0))
    got = fresh.get(timeout=1)
    assert got is not None and got.message.ticket == 0 and not got.redelivered
    fresh.ack([got.delivery_id])
    assert fresh.stats() == {"added": 1, "length": 1, "pending": 0} and fresh.redelivered == 0

    _leave_behind(redis_url, "tandem:crashed")
    resumed = open_channel("redis", options, _setting("crashed", resume=True))
    again = resumed.recover()
    assert [(d.message.ticket, d.redelivered) for d in again] == [
        (1, True),
        (2, True),
        (3, False),
        (4, False),
    ]
    for c in (fresh, worker, resumed):
        c.close()


def test_entries_of_another_run_never_reach_the_new_run(redis_url):
    """A rollout worker of a crashed run that has not yet noticed its learner is gone keeps writing to the
    stream a new run of the same name has just reset: its entries carry the old run's token and are deleted
    unread; the new run's own entries, and a resume's, still arrive."""
    from tandem.channels import open_channel

    options = {"redis_url": redis_url, "trim_acked": False}
    crashed = open_channel("redis", options, _setting("orphan", resume=False))
    orphan = pickle.loads(pickle.dumps(crashed))  # the earlier run's worker, still running
    crashed.close()
    new = open_channel("redis", options, _setting("orphan", resume=False))
    worker = pickle.loads(pickle.dumps(new))
    orphan.put(make_message(7))
    orphan.put(make_message(8))
    worker.put(make_message(0))
    orphan.put(make_message(9))
    got = new.get(timeout=1)
    assert got is not None and got.message.ticket == 0
    assert new.get(timeout=0.2) is None
    assert new.foreign == 3
    new.ack([got.delivery_id])
    assert new.stats() == {"added": 4, "length": 1, "pending": 0}  # the foreign entries are gone

    worker.put(make_message(1))  # left unread by the new run, which then crashes
    resumed = open_channel("redis", options, _setting("orphan", resume=True))
    assert resumed.run_token == new.run_token
    assert [d.message.ticket for d in resumed.recover()] == [1]
    for c in (orphan, new, worker, resumed):
        c.close()


def test_a_server_that_refuses_the_url_is_a_config_error(redis_url):
    """A database the server does not have shows only on connecting: one line naming the option."""
    from tandem.channels.redis import RedisStreamChannel
    from tandem.errors import ConfigError

    bad = redis_url.rpartition("/")[0] + "/99"
    refused = r"^architecture.channel.options.redis_url: Redis at .*/99 refused: DB index is out of range$"
    with pytest.raises(ConfigError, match=refused):
        RedisStreamChannel(bad, "t:db")
    with pytest.raises(ConfigError, match=refused):
        RedisStreamChannel(bad, "t:db", fresh=True)
    client = redis.Redis.from_url(redis_url)
    client.set("t:text", "not a stream")
    with pytest.raises(ConfigError, match="options.stream: key 't:text' on .* is not a stream"):
        RedisStreamChannel(redis_url, "t:text", fresh=True)
    assert client.get("t:text") == b"not a stream"  # never deleted
    client.close()


def test_malformed_redis_url_stops_a_decoupled_run_before_it_writes(tiny_model_dir, tmp_path, redis_url):
    from tandem.errors import ConfigError

    data = _cfg(tiny_model_dir, tmp_path / "run", "notaurl", "t:url")
    with pytest.raises(
        ConfigError, match="^architecture.channel.options.redis_url: 'notaurl' is not a Redis"
    ):
        train_decoupled(build_config(data))
    assert not (tmp_path / "run").exists()


def _cfg(model_dir, out, url, stream, total=5):
    return {
        "run": {"output_dir": str(out), "seed": 11, "name": stream},
        "model": {"path": str(model_dir)},
        "data": {"task": "arith", "prompts_per_step": 2, "eval_size": 0, "train_size": 32},
        "rollout": {"n": 4, "max_new_tokens": 4},
        "reward": {"task_reward": False, "functions": [{"path": DIGITS}]},
        "algorithm": {"name": "grpo"},
        "trainer": {"total_steps": total, "lr": 3e-3},
        "architecture": {
            "mode": "decoupled",
            "staleness": 0,
            "channel": {"backend": "redis", "redis_url": url, "stream": stream, "trim_acked": False},
        },
        "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
        "checkpoint": {"every": 2, "keep_last": 5},
    }


@pytest.mark.slow
def test_a_new_run_never_trains_on_what_an_earlier_run_left(tiny_model_dir, tmp_path, redis_url):
    """Two runs with the same run.name (so the same stream), the second not resuming: it receives exactly
    what its own workers produced, even though the first run's trajectories are still in the stream."""
    torch.set_num_threads(1)
    earlier = _cfg(tiny_model_dir, tmp_path / "earlier", redis_url, "t:rerun", total=2)
    earlier["run"]["seed"] = 12
    train_decoupled(build_config(earlier))
    client = redis.Redis.from_url(redis_url)
    for _, fields in client.xrange("t:rerun"):  # unread for the group, whatever the first run consumed
        client.xadd("t:rerun", fields)
    assert client.xinfo_groups("t:rerun")[0]["lag"] > 0

    result = train_decoupled(build_config(_cfg(tiny_model_dir, tmp_path / "again", redis_url, "t:rerun", 3)))
    acc = json.loads((result.run_dir / "summary.json").read_text())["accounting"]
    B = 8
    assert acc["received_samples"] == acc["trained_samples"] == 3 * B
    assert acc["redelivered_samples"] == acc["duplicate_samples"] == acc["dropped_samples"] == 0
    tickets = [int(f[b"ticket"]) for _, f in client.xrange("t:rerun")]
    assert sorted(tickets) == list(range(len(tickets))), "only this run's tickets, each once"
    assert client.xinfo_stream("t:rerun")["entries-added"] == len(tickets)
    client.close()


CRASHING_LEARNER = textwrap.dedent(
    """
    import json, os, signal, sys, torch
    from tandem.config import build_config
    from tandem.orchestration.decoupled.runtime import RunHooks, train_decoupled

    def crash(run, step):
        if step == 3:  # trained on ticket 2, not yet checkpointed (every 2 steps): die without cleanup
            os.kill(os.getpid(), signal.SIGKILL)

    if __name__ == "__main__":
        torch.set_num_threads(1)
        train_decoupled(build_config(json.loads(sys.argv[1])), hooks=RunHooks(on_step=crash))
    """
)


@pytest.mark.slow
def test_learner_crash_redelivers_unacknowledged_samples(tiny_model_dir, tmp_path, redis_url):
    """Kill the learner (SIGKILL) after an update that is not checkpointed; restart from the checkpoint.
    The un-acknowledged batch is re-delivered and trained once in the surviving run; accounting is exact;
    with η = 0 the final weights equal an uninterrupted run's bit for bit."""
    torch.set_num_threads(1)
    ref = train_decoupled(build_config(_cfg(tiny_model_dir, tmp_path / "ref", redis_url, "t:ref")))
    script = tmp_path / "crash.py"
    script.write_text(CRASHING_LEARNER)
    data = _cfg(tiny_model_dir, tmp_path / "run", redis_url, "t:crash")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path.cwd())}
    proc = subprocess.run([sys.executable, str(script), json.dumps(data)], env=env, timeout=300, check=False)
    assert proc.returncode == -signal.SIGKILL
    assert latest_checkpoint(tmp_path / "run" / "checkpoints").name == "step-00000002"
    time.sleep(1.0)  # orphaned workers notice the dead learner and exit

    result = train_decoupled(build_config(data), resume=True)
    assert result.steps == 5
    summary = json.loads((result.run_dir / "summary.json").read_text())
    acc = summary["accounting"]
    B = 8
    assert acc["redelivered_samples"] >= B  # ticket 2: received by the dead learner, never acknowledged
    assert acc["trained_samples"] == 5 * B and acc["dropped_samples"] == 0
    client = redis.Redis.from_url(redis_url)
    entries = client.xrange("t:crash")
    tickets = [int(f[b"ticket"]) for _, f in entries]
    assert len(tickets) == len(set(tickets)), "a ticket was produced twice"
    assert client.xinfo_stream("t:crash")["entries-added"] == len(tickets)
    leftover = [t for t in tickets if t >= 5]  # produced ahead of the end of the run, never consumed
    assert len(tickets) == 5 + len(leftover)
    assert (
        acc["received_samples"] == acc["trained_samples"] + acc["dropped_samples"] + acc["duplicate_samples"]
    )
    pending = client.xpending("t:crash", "t:crash:learner")["pending"]
    assert pending == 0  # everything trained was checkpointed, then acknowledged
    client.close()
    w_ref = load_causal_lm(latest_checkpoint(ref.run_dir / "checkpoints") / "model").state_dict()
    w_run = load_causal_lm(latest_checkpoint(result.run_dir / "checkpoints") / "model").state_dict()
    for k in w_ref:
        assert torch.equal(w_ref[k], w_run[k]), k
