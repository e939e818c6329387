"""OpenAI API conformance of a real ``tandem serve`` process, checked with the official ``openai`` client.

Written from the OpenAI API reference (completions and chat completions) and informed by the behaviours
vLLM's OpenAI-server tests assert that do not depend on the model: response shapes, usage, streaming,
``n``, stop strings, seeds, log-probs, echo, ``logit_bias``, ``stream_options``, token-id prompts, text
content parts and errors. The served model is the session's tiny random Llama, so no test asserts what
it says; they assert mechanisms — the same greedy text streamed or not, a +100 bias that forces a token,
log-probs equal to the ones training recomputes (:func:`tandem.models.forward.response_logprobs`).
One server per module; every request is a few tokens.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time

import pytest
from console import TANDEM

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
torch = pytest.importorskip("torch")

KEY = "conformance-key"
CAP = 48  # --max-tokens-limit: the server-side cap on max_tokens (and on chat's default)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    """``tandem serve`` in a subprocess; yields its base URL.

    The port is free when picked but the server binds it only after importing torch (tens of seconds on a
    busy machine), so another process can take it meanwhile: on "address already in use" it retries on a
    new port."""
    log_path = tmp_path_factory.mktemp("serve") / "stderr.log"
    for _attempt in range(3):
        port = _free_port()
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [
                    *TANDEM,
                    "serve",
                    str(tiny_model_dir),
                    "--name",
                    "tiny",
                    "--port",
                    str(port),
                    "--api-key",
                    KEY,
                ]
                + ["--max-tokens-limit", str(CAP), "--max-wait-ms", "2"],
                stdout=subprocess.DEVNULL,
                stderr=log,
                env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
            )
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while proc.poll() is None and time.time() < deadline:
            try:
                if httpx.get(url + "/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            proc.kill()
            proc.wait()
            err = log_path.read_bytes().decode(errors="replace")
            if "address already in use" in err:
                continue
            pytest.fail(f"tandem serve did not start: {err[-800:]}")
        break
    else:
        pytest.fail("tandem serve found no free port in 3 tries")
    yield url
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def raw(server):
    with httpx.Client(base_url=server, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def lm(tiny_model_dir):
    from tandem.models import load_causal_lm, load_tokenizer

    model = load_causal_lm(tiny_model_dir)
    model.eval()
    return model, load_tokenizer(tiny_model_dir)


def _id(lm, char: str) -> int:
    return lm[1].convert_tokens_to_ids(char)


def _no_eos(lm) -> dict[str, int]:
    """A logit_bias that bans EOS, so a request runs to its token limit whatever the random model says."""
    return {str(lm[1].eos_token_id): -100}


def _bad(call, param: str | None = None) -> openai.BadRequestError:
    """``call()`` must be a 400 in OpenAI's error shape naming ``param``."""
    with pytest.raises(openai.BadRequestError) as info:
        call()
    err = info.value
    assert set(err.body) == {"message", "type", "param", "code"} and err.body["message"]
    if param is not None:
        assert err.body["param"] == param, err.body
    return err


def _sse(raw, path: str, body: dict) -> list[dict | str]:
    """The parsed ``data:`` events of a streamed request (``"[DONE]"`` kept as a string)."""
    events: list[dict | str] = []
    with raw.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: ") :]
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


# --- shapes, usage, models, errors (behaviours that already held) ----------------------------------


def test_completion_shape_and_usage(client, lm):
    out = client.completions.create(model="tiny", prompt="12+3=", max_tokens=5, temperature=0)
    assert out.id.startswith("cmpl-") and out.object == "text_completion" and out.model == "tiny"
    assert len(out.choices) == 1 and out.choices[0].index == 0 and out.choices[0].logprobs is None
    assert out.choices[0].finish_reason in ("stop", "length")
    assert out.usage.prompt_tokens == len(lm[1]("12+3=")["input_ids"])
    assert 1 <= out.usage.completion_tokens <= 5
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def test_chat_shape(client):
    out = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0
    )
    assert out.id.startswith("chatcmpl-") and out.object == "chat.completion"
    assert out.choices[0].message.role == "assistant" and isinstance(out.choices[0].message.content, str)
    assert out.choices[0].logprobs is None and out.usage.completion_tokens <= 4


def test_models_list(client):
    assert "tiny" in [m.id for m in client.models.list().data]


def test_unknown_model_is_404_in_error_shape(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="nope", prompt="a", max_tokens=1)
    assert info.value.body["param"] == "model"


def test_limits_are_400_naming_the_field(client):
    _bad(lambda: client.completions.create(model="tiny", prompt="a", max_tokens=CAP + 1), "max_tokens")
    _bad(lambda: client.completions.create(model="tiny", prompt="a", temperature=2.5), "temperature")
    _bad(lambda: client.completions.create(model="tiny", prompt="a", stop=["a", "b", "c", "d", "e"]), "stop")


def test_n_choices_have_their_indices(client):
    out = client.completions.create(model="tiny", prompt="7", max_tokens=4, n=3, seed=5, temperature=1.0)
    assert [c.index for c in out.choices] == [0, 1, 2]


def test_stop_string_is_cut_and_reported(client, lm):
    full = client.completions.create(
        model="tiny", prompt="ab", max_tokens=8, temperature=0, logit_bias=_no_eos(lm)
    ).choices[0]
    assert len(full.text) == 8
    stop = full.text[3]
    cut = client.completions.create(
        model="tiny", prompt="ab", max_tokens=8, temperature=0, logit_bias=_no_eos(lm), stop=[stop]
    ).choices[0]
    assert cut.text == full.text[: full.text.index(stop)] and cut.finish_reason == "stop"


def test_seeds_reproduce_and_a_seed_beyond_int64_is_400(client):
    def sample(seed: int) -> str:
        return (
            client.completions.create(model="tiny", prompt="1", max_tokens=6, temperature=1.0, seed=seed)
            .choices[0]
            .text
        )

    assert sample(11) == sample(11)
    sample(2**63 - 1)
    sample(-(2**63))
    _bad(lambda: sample(2**63), "seed")
    _bad(lambda: sample(2**64), "seed")


# --- streaming -------------------------------------------------------------------------------------


def test_completion_stream_matches_plain_and_ends_with_one_finish_and_done(client, raw):
    plain = client.completions.create(model="tiny", prompt="3+4=", max_tokens=6, temperature=0).choices[0]
    events = _sse(raw, "/v1/completions", {"prompt": "3+4=", "max_tokens": 6, "temperature": 0})
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    chunks = events[:-1]
    assert "".join(c["choices"][0]["text"] for c in chunks) == plain.text
    finishes = [c for c in chunks if c["choices"][0]["finish_reason"] is not None]
    assert finishes == [chunks[-1]] and finishes[0]["choices"][0]["finish_reason"] == plain.finish_reason
    assert chunks[-1]["choices"][0]["text"] == ""  # the finish chunk carries no text


def test_chat_stream_opens_with_role_and_closes_with_empty_finish_delta(client):
    messages = [{"role": "user", "content": "hello"}]
    plain = client.chat.completions.create(model="tiny", messages=messages, max_tokens=5, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=5, temperature=0, stream=True
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].delta.role is None for c in chunks[1:])
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == plain.choices[0].message.content
    assert [c.choices[0].finish_reason is not None for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[-1].choices[0].delta.content is None


def test_streamed_n_gives_each_choice_one_finish_chunk_last(raw):
    events = _sse(raw, "/v1/completions", {"prompt": "9", "max_tokens": 4, "n": 2, "seed": 3})
    chunks = events[:-1]
    for index in (0, 1):
        mine = [c for c in chunks if c["choices"][0]["index"] == index]
        assert [c["choices"][0]["finish_reason"] is not None for c in mine][-1]
        assert sum(c["choices"][0]["finish_reason"] is not None for c in mine) == 1


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_include_usage_sends_a_final_usage_chunk(raw, path):
    body = {"max_tokens": 5, "temperature": 0, "n": 2, "stream_options": {"include_usage": True}}
    body |= {"prompt": "5*5="} if "chat" not in path else {"messages": [{"role": "user", "content": "5*5="}]}
    events = _sse(raw, path, body)
    assert events[-1] == "[DONE]"
    final, chunks = events[-2], events[:-2]
    assert final["choices"] == [] and final["usage"]["total_tokens"] == (
        final["usage"]["prompt_tokens"] + final["usage"]["completion_tokens"]
    )
    assert all(c["usage"] is None for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] is not None  # the finish chunk precedes the usage
    plain = raw.post(path, json={k: v for k, v in body.items() if k != "stream_options"}).json()
    assert final["usage"] == plain["usage"]


def test_stream_options_without_stream_is_400(client):
    _bad(
        lambda: client.completions.create(
            model="tiny", prompt="a", max_tokens=2, stream_options={"include_usage": True}
        ),
        "stream_options",
    )


# --- log-probabilities -----------------------------------------------------------------------------


def test_completion_logprobs_shape(client, lm):
    out = client.completions.create(
        model="tiny", prompt="2+2=", max_tokens=8, temperature=0.8, seed=7, logprobs=0, logit_bias=_no_eos(lm)
    ).choices[0]
    lp = out.logprobs
    assert "".join(lp.tokens) == out.text and len(lp.tokens) == 8
    assert [list(d) for d in lp.top_logprobs] == [[t] for t in lp.tokens]  # logprobs=0: the sampled token
    assert lp.text_offset == list(range(8)) and all(v <= 0 for v in lp.token_logprobs)


def test_logprobs_equal_the_behaviour_logprobs_training_recomputes(client, lm):
    from tandem.models.forward import response_logprobs

    model, tok = lm
    lp = (
        client.completions.create(
            model="tiny", prompt="abc", max_tokens=6, temperature=0.7, seed=2, logprobs=1
        )
        .choices[0]
        .logprobs
    )
    ids = [tok.convert_tokens_to_ids(t) for t in lp.tokens]
    prompt, response = torch.tensor([tok("abc")["input_ids"]]), torch.tensor([ids])
    with torch.no_grad():
        want, _ = response_logprobs(
            model, prompt, torch.ones_like(prompt, dtype=torch.bool), response,
            torch.ones_like(response, dtype=torch.bool), temperature=0.7,
        )  # fmt: skip
    assert torch.allclose(torch.tensor(lp.token_logprobs), want[0], atol=1e-4)


def test_top_logprobs_count_and_order(client):
    lp = (
        client.completions.create(model="tiny", prompt="x", max_tokens=4, temperature=0, logprobs=5)
        .choices[0]
        .logprobs
    )
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert 5 <= len(top) <= 6 and top[token] == pytest.approx(value) and value <= 0
        assert max(top.values()) == pytest.approx(value)  # greedy: the sampled token is the likeliest


def test_too_many_logprobs_is_400_plain_and_streamed(client, raw):
    _bad(
        lambda: client.completions.create(model="tiny", prompt=[0, 0, 0], max_tokens=2, logprobs=21),
        "logprobs",
    )
    r = raw.post(
        "/v1/completions", json={"prompt": [0, 0, 0], "max_tokens": 2, "logprobs": 30, "stream": True}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"
    assert client.completions.create(model="tiny", prompt=[0, 0, 0], max_tokens=2, logprobs=20).choices


def test_chat_logprobs_shape(client):
    messages = [{"role": "user", "content": "q"}]
    none = client.chat.completions.create(model="tiny", messages=messages, max_tokens=3, logprobs=True)
    assert all(e.top_logprobs == [] for e in none.choices[0].logprobs.content)
    out = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=4, temperature=0, logprobs=True, top_logprobs=5
    )
    content = out.choices[0].logprobs.content
    assert "".join(e.token for e in content if e.token != "</s>") == out.choices[0].message.content
    for entry in content:
        assert len(entry.top_logprobs) == 5 and entry.bytes == list(entry.token.encode())
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True) and entry.logprob == pytest.approx(values[0])


def test_chat_top_logprobs_limits(client):
    messages = [{"role": "user", "content": "q"}]
    _bad(
        lambda: client.chat.completions.create(
            model="tiny", messages=messages, logprobs=True, top_logprobs=21
        ),
        "top_logprobs",
    )
    _bad(
        lambda: client.chat.completions.create(model="tiny", messages=messages, top_logprobs=2),
        "top_logprobs",
    )


def test_streamed_logprobs_equal_plain_ones(client):
    kwargs = {"model": "tiny", "prompt": "ab", "max_tokens": 6, "temperature": 0.9, "seed": 4, "logprobs": 2}
    plain = client.completions.create(**kwargs).choices[0].logprobs
    tokens, values, offsets = [], [], []
    for chunk in client.completions.create(**kwargs, stream=True):
        if chunk.choices[0].logprobs is not None:
            tokens += chunk.choices[0].logprobs.tokens
            values += chunk.choices[0].logprobs.token_logprobs
            offsets += chunk.choices[0].logprobs.text_offset
    assert tokens == plain.tokens and offsets == plain.text_offset
    assert values == pytest.approx(plain.token_logprobs)
    messages = [{"role": "user", "content": "ab"}]
    chat = {"model": "tiny", "messages": messages, "max_tokens": 5, "temperature": 0, "logprobs": True}
    want = [e.token for e in client.chat.completions.create(**chat).choices[0].logprobs.content]
    got = [
        e.token
        for c in client.chat.completions.create(**chat, stream=True)
        if c.choices[0].logprobs is not None
        for e in c.choices[0].logprobs.content
    ]
    assert got == want


# --- echo ------------------------------------------------------------------------------------------


def test_echo_prefixes_the_prompt(client):
    plain = client.completions.create(model="tiny", prompt="6*7=", max_tokens=4, temperature=0).choices[0]
    echo = client.completions.create(model="tiny", prompt="6*7=", max_tokens=4, temperature=0, echo=True)
    assert echo.choices[0].text == "6*7=" + plain.text
    streamed = client.completions.create(
        model="tiny", prompt="6*7=", max_tokens=4, temperature=0, echo=True, stream=True
    )
    texts = [c.choices[0].text for c in streamed]
    assert texts[0] == "6*7=" and "".join(texts) == echo.choices[0].text


@pytest.mark.parametrize("stream", [False, True])
def test_echo_with_logprobs_scores_the_prompt(client, lm, stream):
    model, tok = lm
    kwargs = {
        "model": "tiny",
        "prompt": "hello",
        "max_tokens": 3,
        "temperature": 0,
        "echo": True,
        "logprobs": 1,
    }
    if stream:
        parts = [c.choices[0].logprobs for c in client.completions.create(**kwargs, stream=True)]
        tokens = [t for p in parts if p for t in p.tokens]
        values = [v for p in parts if p for v in p.token_logprobs]
        tops = [t for p in parts if p for t in p.top_logprobs]
    else:
        lp = client.completions.create(**kwargs).choices[0].logprobs
        tokens, values, tops = lp.tokens, lp.token_logprobs, lp.top_logprobs
        assert lp.text_offset == list(range(len(lp.tokens)))  # one character per token
    ids = tok("hello")["input_ids"]
    assert values[0] is None and tops[0] is None and len(tokens) == len(ids) + 3
    assert tokens[: len(ids)] == list("hello")
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits.float()
    want = torch.log_softmax(logits[0, :-1], -1).gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(torch.tensor(values[1 : len(ids)]), want, atol=1e-4)
    assert all(1 <= len(top) <= 2 for top in tops[1:])


# --- logit_bias, penalties, best_of ----------------------------------------------------------------


def test_logit_bias_plus_100_forces_a_token_and_minus_100_bans_it(client, lm):
    seven = _id(lm, "7")
    forced = client.completions.create(
        model="tiny", prompt="ab", max_tokens=6, temperature=1.0, seed=0, logit_bias={str(seven): 100}
    )
    assert forced.choices[0].text == "7" * 6
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=3, logit_bias={str(seven): 100}
    )
    assert chat.choices[0].message.content == "777"
    kwargs = {"model": "tiny", "prompt": "ab", "max_tokens": 1, "temperature": 0}
    greedy = client.completions.create(**kwargs, logit_bias=_no_eos(lm)).choices[0].text
    banned = client.completions.create(**kwargs, logit_bias=_no_eos(lm) | {str(_id(lm, greedy)): -100})
    assert banned.choices[0].text != greedy


def test_logit_bias_out_of_vocab_is_400_naming_the_id(client):
    err = _bad(
        lambda: client.completions.create(model="tiny", prompt="a", logit_bias={"100000": 5}), "logit_bias"
    )
    assert "100000" in err.body["message"]
    _bad(lambda: client.completions.create(model="tiny", prompt="a", logit_bias={"5": 101}))
    _bad(lambda: client.completions.create(model="tiny", prompt="a", logit_bias={"x": 1}))


def test_frequency_penalty_lowers_repeated_tokens(client, lm):
    bias = {str(_id(lm, "a")): 10, str(_id(lm, "b")): 7}
    kwargs = {"model": "tiny", "prompt": "z", "max_tokens": 8, "temperature": 0, "logit_bias": bias}
    assert client.completions.create(**kwargs).choices[0].text == "a" * 8
    penalised = client.completions.create(**kwargs, frequency_penalty=2.0).choices[0].text
    assert penalised[0] == "a" and "b" in penalised and penalised.count("a") < 8
    _bad(lambda: client.completions.create(model="tiny", prompt="a", presence_penalty=3), "presence_penalty")


def test_vllm_sampling_extensions_min_p_and_repetition_penalty(client, lm):
    """vLLM's extra sampling fields: a greedy request with a repetition penalty is not answered from the
    greedy cache of the same request without one; out-of-range values are 400s naming the field."""
    kwargs = {"model": "tiny", "prompt": "x", "max_tokens": 8, "temperature": 0}
    plain = client.completions.create(**kwargs).choices[0].text
    again = client.completions.create(**kwargs).choices[0].text  # cached
    penalised = client.completions.create(**kwargs, extra_body={"repetition_penalty": 1.8}).choices[0].text
    assert plain == again and penalised != plain
    top_only = client.completions.create(
        **{**kwargs, "temperature": 1.0, "seed": 3}, extra_body={"min_p": 1.0}
    )
    assert top_only.choices[0].text == plain  # min_p = 1 keeps the likeliest token only: greedy
    _bad(lambda: client.completions.create(**kwargs, extra_body={"min_p": 2}), "min_p")
    _bad(
        lambda: client.completions.create(**kwargs, extra_body={"repetition_penalty": 0}),
        "repetition_penalty",
    )


def test_best_of_returns_the_likeliest_of_its_samples(client):
    kwargs = {"model": "tiny", "prompt": "q", "max_tokens": 5, "temperature": 1.0, "seed": 9, "logprobs": 0}
    samples = client.completions.create(**kwargs, n=4).choices
    best = client.completions.create(**kwargs, n=1, best_of=4)
    means = {c.text: sum(c.logprobs.token_logprobs) / len(c.logprobs.token_logprobs) for c in samples}
    assert len(best.choices) == 1 and best.choices[0].text == max(means, key=means.get)
    assert best.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in samples)
    _bad(lambda: client.completions.create(model="tiny", prompt="q", n=3, best_of=2), "best_of")


# --- prompts and messages --------------------------------------------------------------------------


def test_token_id_prompts(client, lm):
    ids = lm[1]("1+2=")["input_ids"]
    by_text = client.completions.create(model="tiny", prompt="1+2=", max_tokens=4, temperature=0)
    by_ids = client.completions.create(model="tiny", prompt=ids, max_tokens=4, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage.prompt_tokens == len(ids)
    batch = client.completions.create(model="tiny", prompt=[[0, 0, 0], [5, 6]], max_tokens=2, temperature=0)
    assert len(batch.choices) == 2 and batch.usage.prompt_tokens == 5


@pytest.mark.parametrize("prompt", [[0, -1], [[5, 6], [7, 100000]]])
def test_bad_token_ids_are_400_naming_the_id(client, prompt):
    err = _bad(lambda: client.completions.create(model="tiny", prompt=prompt, max_tokens=2), "prompt")
    assert ("-1" if prompt == [0, -1] else "100000") in err.body["message"]


def test_content_as_text_parts(client):
    parts = [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}]
    as_parts = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": parts}], max_tokens=4, temperature=0
    )
    as_text = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi\nthere"}], max_tokens=4, temperature=0
    )
    assert as_parts.choices[0].message.content == as_text.choices[0].message.content
    image = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    _bad(lambda: client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": image}]))


def test_chat_without_max_tokens_uses_the_rest_of_the_context_up_to_the_cap(client, lm):
    short = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "go"}], logit_bias=_no_eos(lm)
    )
    assert short.usage.completion_tokens == CAP and short.choices[0].finish_reason == "length"
    long = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "x" * 200}], logit_bias=_no_eos(lm)
    )
    context = 256  # the tiny model's max_position_embeddings
    assert CAP > context - long.usage.prompt_tokens > 0
    assert long.usage.prompt_tokens + long.usage.completion_tokens == context


def test_usage_counts_each_prompt_once_with_n(client, lm):
    one = client.completions.create(model="tiny", prompt="1+1=", max_tokens=2, temperature=0)
    three = client.completions.create(model="tiny", prompt="1+1=", max_tokens=3, n=3, seed=1, logprobs=0)
    assert three.usage.prompt_tokens == one.usage.prompt_tokens == len(lm[1]("1+1=")["input_ids"])
    assert three.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in three.choices)


# --- refused fields, strict types, content type --------------------------------------------------


def test_response_format(client):
    messages = [{"role": "user", "content": "json please"}]
    ok = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=2, response_format={"type": "text"}
    )
    assert ok.choices
    _bad(
        lambda: client.chat.completions.create(
            model="tiny",
            messages=messages,
            response_format={"type": "json_schema", "json_schema": {"name": "x"}},
        ),
        "response_format.json_schema.schema",
    )
    for fmt in ({"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}):
        err = _bad(
            lambda fmt=fmt: client.chat.completions.create(
                model="tiny", messages=messages, response_format=fmt
            )
        )
        assert err.body["param"] == "response_format" and "not supported" in err.body["message"]


def test_unsupported_fields_are_refused_not_ignored(client):
    _bad(lambda: client.completions.create(model="tiny", prompt="a", suffix="b"), "suffix")
    function = {"name": "f", "parameters": {"type": "object"}}  # legacy function calling (tools are served)
    messages = [{"role": "user", "content": "a"}]
    _bad(
        lambda: client.chat.completions.create(model="tiny", messages=messages, functions=[function]),
        "functions",
    )


@pytest.mark.parametrize(
    ("path", "field", "value"),
    [
        ("/v1/completions", "stream", "yes"),
        ("/v1/completions", "echo", "true"),
        ("/v1/completions", "stream", 1),
        ("/v1/chat/completions", "logprobs", 1),
    ],
)
def test_stream_yes_and_other_non_booleans_are_400(raw, path, field, value):
    body = {"prompt": "a"} if "chat" not in path else {"messages": [{"role": "user", "content": "a"}]}
    r = raw.post(path, json=body | {field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field


def test_tiny_temperature_decodes_greedily_without_nan(client):
    greedy = client.completions.create(model="tiny", prompt="ab", max_tokens=5, temperature=0).choices[0].text
    tiny = client.completions.create(model="tiny", prompt="ab", max_tokens=5, temperature=1e-39, logprobs=0)
    assert tiny.choices[0].text == greedy
    assert all(v == v for v in tiny.choices[0].logprobs.token_logprobs)  # no NaN


def test_form_body_is_415(raw):
    r = raw.post("/v1/completions", data={"prompt": "a"})
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
    r = raw.post("/v1/chat/completions", content=b'{"messages": []}', headers={"content-type": "text/plain"})
    assert r.status_code == 415
