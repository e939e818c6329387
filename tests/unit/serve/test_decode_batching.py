"""Per-row batched decoding equals one-by-one generation; batcher, cache, metrics and router units."""

from __future__ import annotations

import asyncio

import pytest
import torch

from tandem.models import load_causal_lm, load_tokenizer
from tandem.rollout import HFEngine, SamplingParams
from tandem.serve import admin_state as ops
from tandem.serve.batcher import DynamicBatcher, QueueFullError
from tandem.serve.cache import LRUCache, cache_key
from tandem.serve.decode import RowRequest, RowResult, decode_rows
from tandem.serve.metrics import Metrics
from tandem.serve.router import Arm, Router


@pytest.fixture(scope="module")
def lm(tiny_model_dir):
    torch.manual_seed(0)
    return load_causal_lm(tiny_model_dir), load_tokenizer(tiny_model_dir)


def test_batched_rows_match_single_generation(lm):
    model, tok = lm
    engine = HFEngine(model, tok)
    specs = [
        ("1+2=", SamplingParams(max_new_tokens=5, temperature=0)),
        ("hello world", SamplingParams(max_new_tokens=9, temperature=0, stop=["o"])),
        ("9", SamplingParams(max_new_tokens=7, temperature=0.9, top_k=5, seed=3)),
        ("abc", SamplingParams(max_new_tokens=4, temperature=1.3, top_p=0.8, seed=11)),
    ]
    rows = [RowRequest(tok(p)["input_ids"], params) for p, params in specs]
    batched = decode_rows(model, tok, rows)
    for (prompt, params), got in zip(specs, batched, strict=True):
        alone = engine.generate([prompt], params)
        want_len = int(alone.response_lengths[0])
        assert got.token_ids == alone.response_ids[0, :want_len].tolist(), prompt
        assert got.text == alone.completions[0]
        assert len(got.token_ids) <= params.max_new_tokens


def test_cancelled_row_is_dropped(lm):
    model, tok = lm
    keep = RowRequest(tok("12")["input_ids"], SamplingParams(max_new_tokens=8, temperature=0))
    gone = RowRequest(
        tok("34")["input_ids"], SamplingParams(max_new_tokens=8, temperature=0), cancelled=lambda: True
    )
    seen: list[int] = []
    out = decode_rows(model, tok, [keep, gone], on_token=lambda row, token: seen.append(row))
    assert out[1].token_ids == [] and 1 not in seen and out[0].token_ids


def test_batcher_groups_concurrent_rows_and_bounds_queue():
    calls: list[int] = []

    def runner(rows, on_token):
        calls.append(len(rows))
        return [RowResult([1], "length", text=str(r.prompt_ids)) for r in rows]

    async def scenario():
        batcher = DynamicBatcher(runner, max_batch_size=4, max_wait_ms=50, max_queue=6)
        batcher.start()
        jobs = [batcher.submit(RowRequest([i], SamplingParams(max_new_tokens=1))) for i in range(6)]
        with pytest.raises(QueueFullError):
            batcher.submit(RowRequest([9], SamplingParams(max_new_tokens=1)))
        results = [await job.future for job in jobs]
        await batcher.stop()
        return results

    results = asyncio.run(scenario())
    assert [r.text for r in results] == [f"[{i}]" for i in range(6)]
    assert calls == [4, 2]


def test_lru_cache_evicts_least_recent_and_key_depends_on_version():
    cache: LRUCache[int] = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    cache.put("c", 3)
    assert cache.get("b") is None and cache.get("a") == 1 and len(cache) == 2
    assert cache_key("v1", [1, 2], 8, []) != cache_key("v2", [1, 2], 8, [])
    assert cache_key("v1", [1, 2], 8, []) != cache_key("v1", [1, 2], 9, [])


def test_metrics_render_prometheus_text():
    m = Metrics()
    m.inc("requests_total", 2, "Requests.", arm="a")
    m.observe("latency_seconds", 0.3, (0.1, 0.5), "Latency.", arm="a")
    text = m.render()
    assert "# TYPE tandem_requests_total counter" in text and 'tandem_requests_total{arm="a"} 2' in text
    assert 'tandem_latency_seconds_bucket{arm="a",le="0.1"} 0' in text
    assert 'tandem_latency_seconds_bucket{arm="a",le="0.5"} 1' in text
    assert 'tandem_latency_seconds_count{arm="a"} 1' in text


def test_router_sticky_split_promote_rollback():
    cfg = ops.initial({"a": "/m/a"})
    cfg = ops.add_arm(cfg, "b", "load-b", "/m/b", weight=1.0)
    assert cfg.current.split == {"a": 0.5, "b": 0.5}
    loaded = {"start-a": Arm("a", None, None, LRUCache(0)), "load-b": Arm("b", None, None, LRUCache(0))}
    router = Router()
    router.show(cfg.current, loaded)
    picks = {u: router.pick(u).name for u in (f"user{i}" for i in range(200))}
    assert all(router.pick(u).name == arm for u, arm in picks.items())  # sticky
    assert 60 < sum(a == "a" for a in picks.values()) < 140  # roughly the split
    router.show(ops.promote(cfg, "b").current, loaded)
    assert {router.pick(u).name for u in picks} == {"b"}
    back = ops.rollback(ops.promote(cfg, "b"))
    assert back.current.split == {"a": 0.5, "b": 0.5} and back.version == cfg.version + 2
    with pytest.raises(ops.SplitError):
        ops.set_split(cfg, {"zzz": 1.0})
