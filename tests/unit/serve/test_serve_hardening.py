"""Hostile-input probes of the server's parts (issue 11's audit): one bad row in a batch, empty keys,
non-finite split weights, shared admin state, deep or non-Unicode JSON, hostile chat templates, and
feedback that teaches nothing."""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import sys
import threading
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi")

from tandem.errors import ConfigError, ModelError  # noqa: E402
from tandem.models import load_causal_lm, load_tokenizer  # noqa: E402
from tandem.rollout import SamplingParams  # noqa: E402
from tandem.serve import admin_state as ops  # noqa: E402
from tandem.serve.app import MAX_JSON_DEPTH, json_depth_exceeds, parse_json_object  # noqa: E402
from tandem.serve.batcher import DynamicBatcher, RowFailedError  # noqa: E402
from tandem.serve.decode import RowRequest, RowResult, decode_rows  # noqa: E402
from tandem.serve.feedback import FeedbackStore, check_pair, check_rating, preference_pairs  # noqa: E402
from tandem.serve.middleware import key_from_headers, key_matches  # noqa: E402
from tandem.serve.model import ServedModel  # noqa: E402
from tandem.serve.protocol import ApiError  # noqa: E402
from tandem.serve.state import ServeSettings, check_key  # noqa: E402


async def _run_batch(runner, rows: list[RowRequest], stream: bool = False) -> list:
    """Submit ``rows`` together to one batcher (one batch) and return each result or exception."""
    batcher = DynamicBatcher(runner, max_batch_size=len(rows), max_wait_ms=50, max_queue=64)
    batcher.start()
    try:
        jobs = [batcher.submit(row, stream=stream) for row in rows]
        return await asyncio.gather(*(job.future for job in jobs), return_exceptions=True)
    finally:
        await batcher.stop()


def test_row_whose_sampling_setup_raises_does_not_fail_concurrent_rows(tiny_model_dir):
    """The audit's probe: a seed beyond 2**64 overflows torch's generator while the batch's sampler is
    built, on the generation thread shared by every request in the batch."""
    model, tok = load_causal_lm(tiny_model_dir), load_tokenizer(tiny_model_dir)
    ids = tok("1+1=")["input_ids"]
    good = [RowRequest(ids, SamplingParams(max_new_tokens=3, temperature=0.8, seed=i)) for i in range(7)]
    bad = RowRequest(ids, SamplingParams(max_new_tokens=3, temperature=0.8, seed=2**64))
    rows = good[:3] + [bad] + good[3:]
    out = asyncio.run(_run_batch(lambda rs, cb: decode_rows(model, tok, rs, cb), rows))
    assert isinstance(out[3], RowFailedError) and "generation failed" in str(out[3])
    innocent = out[:3] + out[4:]
    assert all(isinstance(r, RowResult) and len(r.token_ids) >= 1 for r in innocent), innocent
    alone = decode_rows(model, tok, [good[0]])[0]  # seeded: the same tokens as generated alone
    assert innocent[0].token_ids == alone.token_ids


def test_rows_that_already_streamed_fail_with_their_batch_but_the_rest_are_retried():
    calls = []

    def runner(rows, on_token):
        calls.append(len(rows))
        for i, row in enumerate(rows):
            if row.prompt_ids == [7]:
                on_token(i, 5)  # this row streamed a token, then the batch broke
        if any(row.prompt_ids == [9] for row in rows):
            raise RuntimeError("boom")
        return [RowResult([1], "length", "x") for _ in rows]

    rows = [RowRequest([p], SamplingParams(max_new_tokens=1)) for p in (1, 7, 9, 2)]
    out = asyncio.run(_run_batch(runner, rows, stream=True))
    assert isinstance(out[1], RowFailedError) and "mid-stream" in str(out[1])
    assert isinstance(out[2], RowFailedError) and "boom" in str(out[2])
    assert isinstance(out[0], RowResult) and isinstance(out[3], RowResult)
    assert calls[0] == 4 and max(calls[1:]) <= 2  # retried in halves, not as the whole batch again


@pytest.mark.parametrize("key", ["", " ", "\t", "a b", " key"])
def test_empty_or_whitespace_api_key_is_refused(key):
    with pytest.raises(ConfigError, match="--api-key"):
        check_key(key, "--api-key")
    with pytest.raises(ConfigError):
        ServeSettings(api_keys=[key])
    with pytest.raises(ConfigError, match="--admin-key"):
        ServeSettings(admin_key=key)


def test_empty_presented_key_never_matches():
    assert not key_matches("", [""]) and not key_matches(None, ["k"])
    assert key_from_headers([(b"x-api-key", b"")]) == ""
    assert key_matches(key_from_headers([(b"authorization", b"Bearer k1")]), ["k1"])


@pytest.mark.parametrize(
    "weights",
    [
        {"a": math.nan},
        {"a": math.inf},
        {"a": 1.0, "b": -math.inf},
        {"a": -1.0, "b": 2.0},
        {"a": 0.0, "b": 0.0},
        {"a": True},
        {"a": "1"},
        {"zzz": 1.0},
        {"a": 1e308, "b": 1e308},  # each finite, the sum is not
    ],
)
def test_invalid_split_weights_are_refused_and_nothing_is_stored(weights):
    store = ops.MemoryStore(ops.initial({"a": "/m/a", "b": "/m/b"}))
    before = store.read()
    with pytest.raises(ops.SplitError):
        store.update(lambda cfg: ops.set_split(cfg, weights))
    assert store.read() is before and before.current.split == {"a": 1.0, "b": 0.0}


def test_file_store_is_one_state_for_every_replica(tmp_path):
    """Two stores on one folder stand for two replicas: a change through one is what the other reads,
    and concurrent changes are serialised by the lock (none is lost)."""
    ops.FileStore(tmp_path).create(ops.initial({"a": "/m/a", "b": "/m/b"}))
    one, two = ops.FileStore(tmp_path), ops.FileStore(tmp_path)
    assert one.version() == two.version() == 0
    one.update(lambda cfg: ops.set_split(cfg, {"a": 1, "b": 3}))
    assert two.version() == 1 and two.read().current.split == {"a": 0.25, "b": 0.75}

    def bump(store):
        for _ in range(10):
            store.update(lambda cfg: ops.set_split(cfg, {"a": 1}))

    threads = [threading.Thread(target=bump, args=(s,)) for s in (one, two)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert one.version() == two.version() == 21
    assert two.update(ops.rollback).current.split == {"a": 1.0, "b": 0.0}
    with pytest.raises(ops.SplitError):
        two.update(lambda cfg: ops.set_split(cfg, {"a": math.nan}))
    assert one.version() == 22  # the refused change wrote nothing


def test_rollback_restores_the_arms_before_a_load():
    cfg = ops.add_arm(ops.initial({"main": "/m"}), "b", "load-1", "/m2", weight=1.0)
    assert cfg.current.arms == {"main": "start-main", "b": "load-1"} and cfg.paths["load-1"] == "/m2"
    back = ops.rollback(cfg)
    assert back.current.arms == {"main": "start-main"} and back.current.split == {"main": 1.0}
    with pytest.raises(IndexError):
        ops.rollback(back)
    assert ops.AdminConfig.from_json(cfg.to_json()) == cfg


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}", "json_too_deep"),
        (b'{"prompt": "a\\ud800b"}', "invalid_unicode"),
        (b'{"messages": [{"role": "user", "content": "\\udfff"}]}', "invalid_unicode"),
        (b"[1]", "invalid_body"),
        (b"\xff\xfe", "json_invalid"),
    ],
)
def test_hostile_json_bodies_are_400(raw, code):
    with pytest.raises(ApiError) as err:
        parse_json_object(raw)
    assert err.value.status == 400 and err.value.code == code


def _nested(levels: int) -> bytes:
    """A body whose object holds ``levels - 1`` nested lists: ``levels`` levels deep in all."""
    return b'{"prompt": ' + b"[" * (levels - 1) + b"]" * (levels - 1) + b"}"


def test_nesting_limit_is_the_same_on_every_interpreter():
    """Python 3.11's parser refuses 5000 levels, 3.12's parses them: the limit must not be the parser's."""
    assert parse_json_object(_nested(MAX_JSON_DEPTH)) == json.loads(_nested(MAX_JSON_DEPTH))
    with pytest.raises(ApiError) as err:
        parse_json_object(_nested(MAX_JSON_DEPTH + 1))
    assert err.value.code == "json_too_deep" and str(MAX_JSON_DEPTH) in str(err.value)
    # the hostile body above, as a parser that goes deeper than 5000 levels (Python 3.12's) sees it
    deeper = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)
    try:
        with pytest.raises(ApiError) as err:
            parse_json_object(_nested(5000))
    finally:
        sys.setrecursionlimit(deeper)
    assert err.value.code == "json_too_deep"
    # brackets inside strings are text, not depth
    assert parse_json_object(b'{"prompt": "' + b"[{" * 500 + b'"}')["prompt"] == "[{" * 500
    assert json_depth_exceeds({"a": [{"b": [1]}]}, 4) is False and json_depth_exceeds(
        {"a": [{"b": [[1]]}]}, 4
    )


def test_valid_surrogate_pairs_are_text():
    assert parse_json_object(b'{"prompt": "\\ud83d\\ude00"}') == {"prompt": "\U0001f600"}


def _with_template(src: str, dst: Path, template: str) -> Path:
    shutil.copytree(src, dst)
    config = dst / "tokenizer_config.json"
    data = json.loads(config.read_text())
    data["chat_template"] = template
    config.write_text(json.dumps(data))
    return dst


def test_hostile_chat_template_is_refused_at_load(tiny_model_dir, tmp_path):
    bad = _with_template(tiny_model_dir, tmp_path / "m", "{{ ''.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ModelError, match="sandbox blocks"):
        ServedModel.load(bad)


def test_chat_template_errors_are_400_for_that_conversation(tiny_model_dir, tmp_path):
    template = (
        "{% for m in messages %}{% if m['content'] == 'evil' %}{{ m.__class__.__mro__ }}{% endif %}"
        "{% if m['role'] == 'system' %}{{ raise_exception('no system turns') }}{% endif %}"
        "{{ m['content'] }}{% endfor %}"
    )
    model = ServedModel.load(_with_template(tiny_model_dir, tmp_path / "m", template))
    assert model.render_chat([{"role": "user", "content": "hi"}]) == "hi"
    for message, text in (
        ({"role": "user", "content": "evil"}, "unsafe"),
        ({"role": "system", "content": "x"}, "no system"),
    ):
        with pytest.raises(ApiError) as err:
            model.render_chat([message])
        assert err.value.status == 400 and err.value.param == "messages" and text in err.value.message


def test_served_model_label_hides_the_path(tiny_model_dir, tmp_path):
    model = ServedModel.load(tiny_model_dir)
    assert model.label == Path(tiny_model_dir).name and "/" not in model.label
    run = tmp_path / "myrun" / "checkpoints" / "step-00000010"
    shutil.copytree(tiny_model_dir, run / "model")
    (run / "COMPLETE").write_text("")
    assert ServedModel.load(tmp_path / "myrun").label == "myrun/step-00000010"


@pytest.mark.parametrize("rating", [math.nan, math.inf, -math.inf, 1e400, 1.5, -2, True, "1"])
def test_non_finite_or_out_of_range_ratings_are_refused(rating, tmp_path):
    with pytest.raises(ValueError):
        check_rating(rating)
    store = FeedbackStore(tmp_path / "fb.db")
    with pytest.raises(ValueError):
        store.add(response_id="r", prompt="p", arm="main", rating=rating, chosen="x")
    assert store.rows() == []
    assert check_rating(0) == 0.0 and check_rating(-1) == -1.0 and check_rating(1) == 1.0
    with pytest.raises(ValueError):
        check_rating(None)  # the endpoint needs a rating unless it gets a pair


def test_pair_with_itself_or_same_text_is_refused_and_old_rows_are_not_exported(tmp_path):
    with pytest.raises(ValueError, match="different response"):
        check_pair("a", "a", "x", "y")
    with pytest.raises(ValueError, match="same text"):
        check_pair("a", "b", "x", "x")
    rows = [
        {"prompt": "p", "rating": None, "chosen": "x", "rejected": "x"},  # written before the check
        {"prompt": "q", "rating": math.nan, "chosen": "a", "rejected": None},
        {"prompt": "q", "rating": 0.0, "chosen": "b", "rejected": None},
    ]
    assert preference_pairs(rows) == []


def test_a_seed_is_reproducible_within_a_batch_after_isolation(tiny_model_dir):
    """Retried rows are generated again from scratch: a seeded row still gets its own tokens."""
    model, tok = load_causal_lm(tiny_model_dir), load_tokenizer(tiny_model_dir)
    ids = tok("2+2=")["input_ids"]
    torch.manual_seed(0)
    row = RowRequest(ids, SamplingParams(max_new_tokens=4, temperature=1.0, seed=123))
    bad = RowRequest(ids, SamplingParams(max_new_tokens=4, temperature=1.0, seed=-(2**64)))
    out = asyncio.run(_run_batch(lambda rs, cb: decode_rows(model, tok, rs, cb), [bad, row]))
    assert isinstance(out[0], RowFailedError)
    assert out[1].token_ids == decode_rows(model, tok, [row])[0].token_ids
