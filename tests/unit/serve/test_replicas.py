"""Engine replicas of a served arm and their autoscaling, with the real HF engine on a bigram model.

Load is injected by holding replicas and the queue (never by timing), and time by a fake clock: a deep
queue while every replica is busy builds one more replica, which then serves the queued rows; an idle
replica is released once the clock passes ``scale_down_idle_s``, never below ``min_replicas`` and never
above ``max_replicas``.
"""

from __future__ import annotations

import asyncio

import pytest
from bigram_models import answer_chain, bigram_model

from tandem.rollout import SamplingParams
from tandem.serve.decode import RowRequest
from tandem.serve.replicas import ReplicaPool, ScalePolicy
from tandem.serve.router import build_arm
from tandem.serve.server import build_state
from tandem.serve.state import ServerState, ServeSettings


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def chain_dir(tmp_path_factory):
    return bigram_model(tmp_path_factory.mktemp("chain") / "m", {"a": "b", **answer_chain("bcd")})


def _arm(path, clock, **settings):
    state = ServerState(ServeSettings(max_wait_ms=5, **settings), "chain")
    state.clock = clock
    return state, build_arm(state, "main", path)


def _row(model, text="a"):
    return RowRequest(model.encode(text), SamplingParams(max_new_tokens=6, temperature=0), prompt_text=text)


def test_queued_load_adds_a_replica_that_serves_the_queue_and_idle_ones_are_released(chain_dir):
    clock = Clock()
    state, arm = _arm(
        chain_dir, clock, min_replicas=1, max_replicas=3, scale_up_queue=2, scale_down_idle_s=10
    )
    pool, batcher = arm.batcher.pool, arm.batcher

    async def scenario():
        batcher.start()
        held = await pool.acquire()  # the only replica is busy elsewhere: rows can only queue
        jobs = [batcher.submit(_row(arm.model)) for _ in range(5)]  # the 3rd: 3 waiting > 2 x 1 replica
        await pool.settle()
        assert len(pool.replicas) == 2 and [e.direction for e in pool.events] == ["up"]
        results = await asyncio.gather(*(job.future for job in jobs))  # served by the new replica
        pool.release(held)
        clock.now = 9.9
        batcher.autoscale()
        kept = len(pool.replicas)  # idle for less than scale_down_idle_s: nothing released
        clock.now = 10.0
        batcher.autoscale()
        status = pool.status()
        await batcher.stop()
        return results, kept, status

    results, kept, status = asyncio.run(scenario())
    assert [r.text for r in results] == ["bcd"] * 5
    assert kept == 2
    assert status["live"] == 1 and [e["direction"] for e in status["events"]] == ["up", "down"]
    assert "3 rows waiting > 2 per replica x 1" in status["events"][0]["reason"]
    text = state.metrics.render()
    assert 'tandem_engine_replicas{arm="main"} 1' in text
    assert 'tandem_engine_replica_scale_events_total{arm="main",direction="up"} 1' in text
    assert 'tandem_engine_replica_scale_events_total{arm="main",direction="down"} 1' in text


def test_replicas_stay_within_min_and_max(chain_dir):
    clock = Clock()
    _, arm = _arm(chain_dir, clock, min_replicas=2, max_replicas=3, scale_up_queue=1, scale_down_idle_s=5)
    pool = arm.batcher.pool
    assert len(pool.replicas) == 2  # min_replicas are built at start

    async def scenario():
        lives = []
        for _ in range(3):  # a deep queue, again and again: one build at a time, up to max
            pool.autoscale(depth=100)
            await pool.settle()
            lives.append(len(pool.replicas))
        clock.now = 1000.0  # everything idle for ages
        pool.autoscale(depth=0)
        lives.append(len(pool.replicas))
        await pool.close()
        return lives

    assert asyncio.run(scenario()) == [3, 3, 3, 2]
    assert [e.direction for e in pool.events] == ["up", "down"]


def test_no_scale_up_while_replicas_keep_up(chain_dir):
    clock = Clock()
    _, arm = _arm(chain_dir, clock, min_replicas=1, max_replicas=2, scale_up_queue=4)
    pool = arm.batcher.pool

    async def scenario():
        pool.autoscale(depth=4)  # 4 rows per replica is the threshold, not above it
        await pool.settle()
        await pool.close()

    asyncio.run(scenario())
    assert not pool.events


def test_failed_build_is_an_event_and_is_not_retried_at_once():
    clock = Clock()
    built = []

    def factory():
        if built:
            raise RuntimeError("engine would not start")
        built.append(1)
        return (lambda rows, on_token: [], lambda: None)

    pool = ReplicaPool(factory, ScalePolicy(1, 2, scale_up_queue=1), clock=clock)

    async def scenario():
        pool.autoscale(depth=5)
        await pool.settle()
        pool.autoscale(depth=5)  # within the retry delay: no second attempt
        await pool.settle()
        await pool.close()

    asyncio.run(scenario())
    assert [(e.direction, e.reason) for e in pool.events] == [("up_failed", "engine would not start")]
    assert len(built) == 1


def test_default_is_one_fixed_replica(chain_dir):
    state = build_state({"main": str(chain_dir)}, ServeSettings(), name="chain")
    pool = state.router.arms["main"].batcher.pool
    assert len(pool.replicas) == 1 and not pool.scales
    pool.autoscale(depth=10_000)  # nothing to decide: no event loop is even needed
    assert not pool.events


@pytest.mark.parametrize(
    ("flags", "where"),
    [
        ({"min_replicas": 0}, "--min-replicas"),
        ({"min_replicas": 3, "max_replicas": 2}, "--max-replicas"),
        ({"scale_up_queue": 0}, "--scale-up-queue"),
        ({"scale_down_idle_s": 0.0}, "--scale-down-idle-s"),
    ],
)
def test_bad_replica_settings_name_the_flag(flags, where):
    from tandem.errors import ConfigError

    with pytest.raises(ConfigError, match=f"^{where}: "):
        ServeSettings(**flags)


def test_admin_and_metrics_show_the_replicas(chain_dir):
    from fastapi.testclient import TestClient

    from tandem.serve.server import make_app

    settings = ServeSettings(min_replicas=2, max_replicas=2, admin_key="admin-key")
    state = build_state({"main": str(chain_dir)}, settings, name="chain")
    with TestClient(make_app(state)) as client:
        done = client.post("/v1/completions", json={"prompt": "a", "max_tokens": 6, "temperature": 0})
        metrics = client.get("/metrics").text
        arms = client.get("/admin/arms", headers={"Authorization": "Bearer admin-key"}).json()
    assert done.status_code == 200 and done.json()["choices"][0]["text"] == "bcd"
    assert 'tandem_engine_replicas{arm="main"} 2' in metrics
    replicas = arms["arms"]["main"]["engine_replicas"]
    assert (replicas["live"], replicas["min"], replicas["max"], replicas["events"]) == (2, 2, 2, [])
    assert arms["engine"] == "hf"
