"""The decoupled seams are typed protocols, and every implementation (embedded and Ray) has every member:
weight channel, trajectory channel (``durable`` and ``recover`` included), admission control, worker
supervisor. The Ray classes are checked on the class, so the test needs no Ray instance."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from tandem.channels import BACKENDS
from tandem.channels.base import TrajectoryChannel, WeightChannel
from tandem.channels.queue import QueueChannel
from tandem.channels.weights import SharedMemoryWeights
from tandem.orchestration.decoupled.coordination import Coordination
from tandem.orchestration.decoupled.seams import Admission, WorkerSupervisor
from tandem.orchestration.staleness import StalenessController


def _members(protocol: type) -> set[str]:
    """The names a protocol declares: methods, properties and annotated attributes."""
    names = {n for n in vars(protocol) if not n.startswith("_")}
    names |= {n for n in getattr(protocol, "__annotations__", {}) if not n.startswith("_")}
    return names


def _missing_on_class(cls: type, protocol: type) -> set[str]:
    """Members of ``protocol`` that ``cls`` does not define (instance attributes set in ``__init__`` are
    looked up in its source)."""
    import inspect

    source = inspect.getsource(cls)
    return {n for n in _members(protocol) if not hasattr(cls, n) and f"self.{n}" not in source}


@pytest.mark.parametrize(
    ("cls", "protocol"),
    [
        ("tandem.channels.weights:SharedMemoryWeights", WeightChannel),
        ("tandem.channels.ray_weights:RayObjectStoreWeights", WeightChannel),
        ("tandem.orchestration.decoupled.coordination:Coordination", Admission),
        ("tandem.orchestration.decoupled.ray_coordination:RayCoordination", Admission),
        ("tandem.orchestration.decoupled.supervisor:LocalSupervisor", WorkerSupervisor),
        ("tandem.orchestration.decoupled.ray_supervisor:RaySupervisor", WorkerSupervisor),
        *[(path, TrajectoryChannel) for path in BACKENDS.values()],
    ],
)
def test_every_implementation_has_every_member(cls, protocol):
    import importlib

    module, _, name = cls.partition(":")
    assert _missing_on_class(getattr(importlib.import_module(module), name), protocol) == set()


def test_embedded_parts_satisfy_the_protocols():
    ctx = mp.get_context("spawn")
    weights = SharedMemoryWeights({"w": torch.zeros(3)}, ctx)
    channel = QueueChannel(ctx)
    try:
        coord = Coordination(ctx, StalenessController(0, 1))
        assert isinstance(weights, WeightChannel) and isinstance(coord, Admission)
        assert isinstance(channel, TrajectoryChannel)
        assert channel.durable is False and channel.recover() == []
        weights.publish({"w": torch.ones(3)}, 4)
        state, version = weights.fetch(-1)
        assert version == 4 and torch.equal(state["w"], torch.ones(3)) and weights.fetch(4) is None
    finally:
        channel.close()
        weights.unlink()
