"""``tandem serve --engine``: arms generate through engines built by the registry.

The in-process ``hf`` engine shares the loaded module and runs the server's own decoder; an engine that
loads its own copy of the folder (vLLM when installed, and the real HF engine registered under a second
name, driven exactly as vLLM is: no module handed over, one ``generate`` per batch) answers the same
greedy text, and requests for what the engine protocol cannot carry are refused with a 400.
"""

from __future__ import annotations

import json
import shutil

import pytest
from bigram_models import answer_chain, bigram_model

from tandem.errors import ConfigError, ModelError
from tandem.models import load_causal_lm, load_tokenizer
from tandem.rollout import EngineSpec, SamplingParams, build_engine
from tandem.rollout.registry import DEFAULT_ENGINE, ENGINES
from tandem.serve.decode import RowRequest, decode_rows
from tandem.serve.engines import EngineRows
from tandem.serve.model import ServedModel
from tandem.serve.server import build_state
from tandem.serve.state import ServeSettings

COPY = "hf-copy"  # the HF engine under a name the server does not treat as in-process


@pytest.fixture(scope="module")
def chain_dir(tmp_path_factory):
    return bigram_model(tmp_path_factory.mktemp("chain") / "m", {"a": "b", **answer_chain("bcd"), "x": "y"})


@pytest.fixture
def copy_engine(monkeypatch):
    monkeypatch.setitem(ENGINES, COPY, ENGINES[DEFAULT_ENGINE])
    return COPY


def test_engine_rows_match_the_servers_decoder(chain_dir):
    model, tok = load_causal_lm(chain_dir), load_tokenizer(chain_dir)
    engine = build_engine(DEFAULT_ENGINE, EngineSpec(path=str(chain_dir)))  # its own copy
    prompts = ["a", "x", "ab"]
    rows = [
        RowRequest(tok(p)["input_ids"], SamplingParams(max_new_tokens=n, temperature=0), prompt_text=p)
        for p, n in zip(prompts, (6, 6, 2), strict=True)
    ]
    streamed: list[tuple[int, int]] = []
    got = EngineRows(engine, tok)(rows, lambda row, event: streamed.append((row, event.token)))
    want = decode_rows(model, tok, rows)
    for g, w in zip(got, want, strict=True):
        assert (g.token_ids, g.text, g.finish_reason) == (w.token_ids, w.text, w.finish_reason)
        assert [e.logprob for e in g.logprobs] == pytest.approx([e.logprob for e in w.logprobs], abs=1e-4)
    assert [t for row, t in streamed if row == 0] == got[0].token_ids


@pytest.mark.parametrize("engine", [COPY, pytest.param("vllm", marks=pytest.mark.slow)])
def test_served_through_an_engine_with_its_own_copy(chain_dir, copy_engine, engine):
    from fastapi.testclient import TestClient

    from tandem.serve.server import make_app

    if engine == "vllm":
        pytest.importorskip("vllm")
    state = build_state({"main": str(chain_dir)}, ServeSettings(engine=engine), name="chain")
    arm = state.router.arms["main"]
    assert arm.model.model is None and arm.through_engine == engine  # weights live in the engine
    base = {"prompt": "a", "max_tokens": 6, "temperature": 0}
    with TestClient(make_app(state)) as client:
        plain = client.post("/v1/completions", json={**base, "logprobs": 0}).json()
        with client.stream("POST", "/v1/completions", json={**base, "stream": True}) as r:
            events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        refused = {
            field: client.post("/v1/completions", json={**base, **extra}).json()["error"]
            for field, extra in {
                "top_logprobs": {"logprobs": 2},
                "logit_bias": {"logit_bias": {"5": 1.0}},
                "presence_penalty": {"presence_penalty": 0.5},
                "prompt": {"prompt": [1, 5]},
            }.items()
        }
    assert plain["choices"][0]["text"] == "bcd"
    assert len(plain["choices"][0]["logprobs"]["token_logprobs"]) == 4  # b, c, d, </s>
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "bcd" and events[-1] == "[DONE]"
    for field, error in refused.items():
        assert (error["param"], error["code"]) == (field, "unsupported_by_engine"), field
        assert engine in error["message"]


def test_an_engine_holding_less_context_than_the_model_bounds_requests(chain_dir, copy_engine, monkeypatch):
    """vLLM's max_model_len below the model's context: a request past it is the API's 400
    context_length_exceeded, not a generation failure inside the engine."""
    from fastapi.testclient import TestClient

    from tandem.rollout.registry import engine_class
    from tandem.serve.server import make_app

    monkeypatch.setattr(engine_class(copy_engine), "max_model_len", 8, raising=False)
    state = build_state({"main": str(chain_dir)}, ServeSettings(engine=copy_engine), name="chain")
    assert state.router.arms["main"].model.context_length == 8
    with TestClient(make_app(state)) as client:
        fits = client.post("/v1/completions", json={"prompt": "a", "max_tokens": 4, "temperature": 0})
        past = client.post("/v1/completions", json={"prompt": "a", "max_tokens": 20, "temperature": 0})
    assert fits.status_code == 200, fits.text
    assert past.status_code == 400 and past.json()["error"]["code"] == "context_length_exceeded", past.text


def test_an_export_needs_the_in_process_engine(chain_dir, tmp_path, copy_engine):
    folder = tmp_path / "export"
    shutil.copytree(chain_dir, folder)
    (folder / "tandem_export.json").write_text(json.dumps({"format": "int8"}))
    with pytest.raises(ModelError, match="only be served by the in-process engine"):
        ServedModel.load(folder, engine=copy_engine)


def test_unknown_engine_is_one_config_error(chain_dir):
    with pytest.raises(ConfigError, match="unknown rollout engine 'nope'; valid: "):
        build_state({"main": str(chain_dir)}, ServeSettings(engine="nope"), name="chain")
