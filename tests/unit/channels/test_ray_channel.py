"""Ray components on one module-scoped local Ray instance (2 CPUs): the actor-queue trajectory channel, the
object-store weight channel and the admission coordinator, each used from inside a Ray actor as a rollout
worker would. Without the ``ray`` package only the missing-dependency error is tested."""

from __future__ import annotations

import sys

import pytest
import torch

from tandem.channels import BACKENDS, TrajectoryMessage, check_channel
from tandem.config import build_config
from tandem.errors import ConfigError
from tandem.orchestration.staleness import StalenessController
from tandem.types import RolloutBatch


def make_message(ticket: int) -> TrajectoryMessage:
    g = torch.Generator().manual_seed(ticket)
    ids, mask = torch.randint(0, 50, (2, 3), generator=g), torch.ones(2, 3, dtype=torch.bool)
    batch = RolloutBatch(
        *(
            ids,
            mask,
            ids + 1,
            mask,
            -torch.rand(2, 3, generator=g),
            torch.tensor([0, 0]),
            torch.tensor([4, 4]),
        ),
        prompts=["p", "p"],
        completions=[f"c{ticket}-0", f"c{ticket}-1"],
        finish_reasons=["stop", "length"],
    )
    return TrajectoryMessage(batch, torch.tensor([0.5, 1.0]), ticket, 1, {"worker/idle_ratio": 0.25})


def _cfg(**arch):
    return build_config(
        {
            "model": {"path": "unused"},
            "data": {"task": "arith"},
            "architecture": {"mode": "decoupled", "ray": {"num_cpus": 2}, **arch},
        }
    )


def test_missing_ray_names_the_runtime_key(monkeypatch):
    from tandem.channels.ray import import_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` fail
    with pytest.raises(ConfigError, match=r"architecture.runtime.*pip install 'tandem-rl\[ray\]'"):
        import_ray()


def _check(cfg) -> None:
    ch = cfg.architecture.channel
    check_channel(ch.backend, ch.options, cfg.architecture.runtime)


def test_ray_runtime_rejects_the_multiprocessing_queue_and_the_ray_channel_needs_ray():
    """Each backend declares the runtimes it serves; the pre-flight derives the message from them."""
    with pytest.raises(ConfigError) as err:
        _check(_cfg(runtime="ray", channel={"backend": "queue"}))
    assert str(err.value) == (
        "architecture.channel.backend: channel 'queue' cannot serve architecture.runtime=ray "
        "(it serves: embedded); use redis or ray"
    )
    with pytest.raises(ConfigError, match="channel 'ray' cannot serve architecture.runtime=embedded"):
        _check(_cfg(runtime="embedded", channel={"backend": "ray"}))
    _check(_cfg(runtime="ray", channel={"backend": "ray"}))
    assert BACKENDS["ray"] == "tandem.channels.ray:RayQueueChannel"


def test_a_learner_actor_run_checks_its_channel_before_ray_starts(monkeypatch):
    """The driver refuses a channel the Ray runtime cannot use before starting a Ray instance (seconds)."""
    import tandem.orchestration.decoupled.ray_learner as ray_learner
    from tandem.orchestration.runner import train

    def started(*args, **kwargs):
        raise AssertionError("the learner actor (and Ray) started before the channel was checked")

    monkeypatch.setattr(ray_learner, "train_in_learner_actor", started)
    cfg = _cfg(runtime="ray", channel={"backend": "queue"}, ray={"num_cpus": 2, "learner_actor": True})
    with pytest.raises(ConfigError, match="channel 'queue' cannot serve architecture.runtime=ray"):
        train(cfg)


@pytest.fixture(scope="module")
def ray_instance():
    ray = pytest.importorskip("ray")
    from tandem.orchestration.decoupled.ray_cluster import RayCluster

    # Ray workers cannot import this test module: ship its classes and functions by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

    cluster = RayCluster(_cfg(runtime="ray", channel={"backend": "ray"}))
    yield cluster
    cluster.close()


@pytest.fixture(scope="module")
def worker(ray_instance):
    """One actor for the module's tests (starting a Ray worker process costs seconds)."""
    import ray

    actor = ray.remote(Producer).options(num_cpus=0).remote()
    yield actor
    ray.kill(actor)


class Producer:
    """Stands in for a rollout worker: uses the channel, weights and coordination it was handed."""

    def put(self, channel, tickets):
        for t in tickets:
            channel.put(make_message(t))
        channel.close()  # a reader's close must not free the owner's queue
        return len(tickets)

    def fetch(self, weights, known):
        got = weights.fetch(known)
        return None if got is None else ({k: v.clone() for k, v in got[0].items()}, got[1])

    def acquire(self, coord, slot):
        return coord.acquire(slot)


@pytest.mark.ray
def test_queue_channel_across_an_actor(worker):
    import ray

    from tandem.channels import open_channel

    channel = open_channel("ray")
    assert channel.durable is False and channel.depth() == 0
    assert channel.get(0.0) is None and channel.get(0.1) is None  # empty: both forms time out
    assert ray.get(worker.put.remote(channel, [3, 4])) == 2
    assert channel.depth() == 2
    first, second = channel.get(1.0), channel.get(0.0)
    assert [first.message.ticket, second.message.ticket] == [3, 4]  # FIFO
    assert first.delivery_id == "ray-3" and not first.redelivered
    expected = make_message(3)
    assert torch.equal(first.message.batch.behavior_logprobs, expected.batch.behavior_logprobs)
    assert first.message.batch.completions == expected.batch.completions
    assert first.message.meta == expected.meta and torch.equal(first.message.scores, expected.scores)
    channel.ack([first.delivery_id])  # not durable: a no-op that must not fail
    assert channel.depth() == 0
    queue_actor = channel._queue.actor
    channel.close()
    channel.close()  # idempotent
    with pytest.raises(ray.exceptions.RayActorError):  # the owner's close freed the queue actor
        ray.get(queue_actor.qsize.remote())


@pytest.mark.ray
def test_object_store_weights_versions_and_dtypes(worker):
    import ray

    from tandem.channels.ray_weights import RayObjectStoreWeights

    weights = RayObjectStoreWeights()
    assert weights.version == -1 and weights.fetch(-1) is None
    v1 = {"w": torch.randn(4, 3), "b16": torch.randn(5).bfloat16(), "step": torch.tensor([1, 2])}
    weights.publish(v1, 1)
    state, version = ray.get(worker.fetch.remote(weights, -1))
    assert version == 1 and state.keys() == v1.keys()
    for k in v1:
        assert state[k].dtype == v1[k].dtype and torch.equal(state[k], v1[k]), k
    assert ray.get(worker.fetch.remote(weights, 1)) is None  # nothing newer than what the reader has
    v1["w"].add_(1.0)  # the published copy is a snapshot, not a view of the learner's tensors
    v2 = {k: t + 1 if t.is_floating_point() else t for k, t in v1.items()}
    weights.publish(v2, 2)
    state, version = weights.fetch(1)
    assert version == 2 and torch.equal(state["w"], v2["w"]) and weights.version == 2
    state["w"].zero_()  # private tensors: writing them leaves the published weights alone
    assert torch.equal(weights.fetch(1)[0]["w"], v2["w"])
    weights.unlink()


@pytest.mark.ray
def test_object_store_weights_publish_stream_in_chunks(worker, monkeypatch):
    """Streamed weights (a sharded learner gathers one tensor at a time) go into the object store in
    chunks; a reader gets them all back, dtypes included."""
    import ray

    from tandem.channels import ray_weights

    monkeypatch.setattr(ray_weights, "CHUNK_BYTES", 40)  # 4x3 float32 (48 B) fills a chunk alone
    weights = ray_weights.RayObjectStoreWeights()
    state = {
        "w": torch.randn(4, 3),
        "b16": torch.randn(5).bfloat16(),
        "v": torch.randn(6),
        "i": torch.arange(3),
    }
    assert weights.publish_stream(iter(state.items()), 3) == 48 + 10 + 24 + 24
    got, version = ray.get(worker.fetch.remote(weights, -1))
    assert version == 3 and list(got) == list(state)
    for k in state:
        assert got[k].dtype == state[k].dtype and torch.equal(got[k], state[k]), k
    weights.unlink()


@pytest.mark.ray
def test_ray_coordination_admits_under_the_bound(worker):
    import ray

    from tandem.orchestration.decoupled.ray_coordination import RayCoordination

    coord = RayCoordination(StalenessController(eta=0))
    assert ray.get(worker.acquire.remote(coord, 0)) == 0  # from an actor: the same shared state
    assert coord.issued == 1 and coord.orphaned(0) == 0
    coord.done(0)
    assert coord.acquire(1, alive=lambda: False, poll_s=0.0) is None  # η = 0: wait for consumption
    coord.consume(1)
    assert coord.acquire(1) == 1 and coord.consumed == 1
    coord.retire(1)
    assert coord.retired(1) and coord.acquire(1) == 1  # its unfinished ticket first
    coord.reassign(1, 2)
    assert coord.orphaned(2) == 1 and coord.acquire(1) is None
    coord.retire(1, False)
    coord.set_counters(issued=5, consumed=5)
    assert (coord.issued, coord.consumed) == (5, 5)
    assert not coord.stop.is_set()
    coord.shutdown()
    assert coord.stop.is_set() and ray.get(worker.acquire.remote(coord, 3)) is None
    coord.close()


@pytest.mark.ray
def test_placement_that_cannot_fit_names_the_resource_key(ray_instance):
    from tandem.orchestration.decoupled.ray_supervisor import RaySupervisor

    cfg = _cfg(runtime="ray", channel={"backend": "ray"}, worker={"cpus": 8})  # the instance has 2 CPUs
    supervisor = RaySupervisor(cfg, None, None, None, placement_timeout_s=1.0)
    with pytest.raises(ConfigError, match=r"architecture.worker.cpus: the Ray cluster cannot reserve 1"):
        supervisor.start(1)
    assert supervisor.placement_group is None and not supervisor.actors


def test_unreachable_cluster_address_fails_fast_naming_the_key():
    import socket

    from tandem.orchestration.decoupled.ray_cluster import check_reachable

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConfigError, match=rf"architecture.ray.address: cannot reach .*127.0.0.1:{port}"):
        check_reachable(f"127.0.0.1:{port}")
    check_reachable("auto")  # left to Ray
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        check_reachable(f"127.0.0.1:{server.getsockname()[1]}")  # listening: no error
