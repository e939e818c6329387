"""Units behind the OpenAI fields: per-row log-probs, logit_bias and penalties in the batched decode loop,
prompt scoring, the log-prob shapes, and request validation."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from tandem.models import load_causal_lm, load_tokenizer
from tandem.models.forward import response_logprobs
from tandem.rollout import HFEngine, SamplingParams
from tandem.serve.decode import PromptScores, RowRequest, TokenLogprob, decode_rows, prompt_logprobs
from tandem.serve.logprobs import chat_logprobs, completion_logprobs, text_starts, visible_tokens
from tandem.serve.protocol import ApiError, ChatRequest, CompletionRequest
from tandem.serve.shapes import usage


@pytest.fixture(scope="module")
def lm(tiny_model_dir):
    return load_causal_lm(tiny_model_dir), load_tokenizer(tiny_model_dir)


def test_row_logprobs_equal_the_engine_behaviour_logprobs(lm):
    model, tok = lm
    engine = HFEngine(model, tok)
    specs = [
        ("1+2=", SamplingParams(max_new_tokens=5, temperature=0)),
        ("9", SamplingParams(max_new_tokens=6, temperature=0.7, seed=3)),
        ("abc", SamplingParams(max_new_tokens=4, temperature=1.3, top_p=0.8, seed=11)),
    ]
    rows = [RowRequest(tok(p)["input_ids"], params, top_logprobs=3) for p, params in specs]
    for (prompt, params), got in zip(specs, decode_rows(model, tok, rows), strict=True):
        alone = engine.generate([prompt], params)
        n = int(alone.response_lengths[0])
        assert [e.token for e in got.logprobs] == got.token_ids
        want = alone.behavior_logprobs[0, :n]
        assert torch.allclose(torch.tensor([e.logprob for e in got.logprobs]), want, atol=1e-5)
        for entry in got.logprobs:
            values = [lp for _, lp in entry.top]
            assert len(entry.top) == 3 and values == sorted(values, reverse=True)
            assert entry.logprob <= values[0] + 1e-6


def test_logit_bias_and_penalties_are_per_row(lm):
    model, tok = lm
    a, b = tok.convert_tokens_to_ids("a"), tok.convert_tokens_to_ids("b")
    greedy = SamplingParams(max_new_tokens=6, temperature=0)
    plain = RowRequest(tok("x")["input_ids"], greedy)
    forced = RowRequest(tok("x")["input_ids"], greedy, logit_bias={a: 100.0})
    penalised = RowRequest(tok("x")["input_ids"], greedy, logit_bias={a: 10.0, b: 7.0}, frequency_penalty=2.0)
    out = decode_rows(model, tok, [plain, forced, penalised])
    assert out[1].text == "aaaaaa" and out[1].logprobs[0].logprob > -1e-3  # log-probs include the bias
    assert "b" in out[2].text and out[2].text.count("a") < 6
    alone = decode_rows(model, tok, [RowRequest(tok("x")["input_ids"], greedy)])[0]
    assert out[0].token_ids == alone.token_ids  # the other rows' bias and penalties did not leak


def test_min_p_and_repetition_penalty_rows_equal_the_engine(lm):
    """A server row with vLLM's min_p / repetition_penalty extensions generates what the rollout engine does
    with the same parameters (greedy and seeded), beside a plain row in the same batch."""
    model, tok = lm
    engine = HFEngine(model, tok)
    specs = [
        ("x", SamplingParams(max_new_tokens=8, temperature=0, repetition_penalty=1.8)),
        ("9", SamplingParams(max_new_tokens=8, temperature=0.9, seed=4, min_p=0.1, repetition_penalty=1.3)),
        ("1+2=", SamplingParams(max_new_tokens=8, temperature=0)),
    ]
    rows = [RowRequest(tok(p)["input_ids"], params) for p, params in specs]
    for (prompt, params), got in zip(specs, decode_rows(model, tok, rows), strict=True):
        alone = engine.generate([prompt], params)
        assert got.token_ids == alone.response_ids[0, : int(alone.response_lengths[0])].tolist()
        want = alone.behavior_logprobs[0, : len(got.token_ids)]
        assert torch.allclose(torch.tensor([e.logprob for e in got.logprobs]), want, atol=1e-5)
    plain = engine.generate(["x"], SamplingParams(max_new_tokens=8, temperature=0))
    assert plain.completions != [decode_rows(model, tok, rows[:1])[0].text]  # the penalty did something
    req = CompletionRequest(model="tiny", prompt="a", min_p=0.2, repetition_penalty=1.1)
    assert (req.min_p, req.repetition_penalty) == (0.2, 1.1)
    for bad in ({"min_p": 1.5}, {"repetition_penalty": 0}):
        with pytest.raises(ValidationError):
            CompletionRequest(model="tiny", prompt="a", **bad)


def test_prompt_logprobs_match_training_logprobs_and_stream_first(lm):
    model, tok = lm
    ids = tok("hello world")["input_ids"]
    row = RowRequest(
        ids, SamplingParams(max_new_tokens=2, temperature=0.5), top_logprobs=2, prompt_logprobs=True
    )
    with torch.no_grad():
        scores = prompt_logprobs(model, row)
        prompt, response = torch.tensor([ids[:1]]), torch.tensor([ids[1:]])
        ones = torch.ones_like
        want, _ = response_logprobs(
            model,
            prompt,
            ones(prompt, dtype=torch.bool),
            response,
            ones(response, dtype=torch.bool),
            temperature=0.5,
        )
    assert scores[0] is None and [s.token for s in scores[1:]] == ids[1:]
    assert torch.allclose(torch.tensor([s.logprob for s in scores[1:]]), want[0], atol=1e-5)
    events: list = []
    result = decode_rows(model, tok, [row], on_token=lambda i, e: events.append(e))[0]
    assert isinstance(events[0], PromptScores) and all(isinstance(e, TokenLogprob) for e in events[1:])
    assert [s.logprob for s in result.prompt_logprobs[1:]] == pytest.approx([s.logprob for s in scores[1:]])


def test_shapes_of_logprobs(lm):
    _, tok = lm
    ids = tok("ab")["input_ids"]
    entries = [TokenLogprob(ids[0], -0.5, [(ids[1], -0.25)]), TokenLogprob(ids[1], -float("inf"), [])]
    body = completion_logprobs(tok, ids, entries, [0, 1])
    assert body == {
        "tokens": ["a", "b"],
        "token_logprobs": [-0.5, -9999.0],
        "top_logprobs": [{"b": -0.25, "a": -0.5}, {"b": -9999.0}],
        "text_offset": [0, 1],
    }
    assert completion_logprobs(tok, ids, [None, entries[1]], [0, 1])["top_logprobs"][0] is None
    chat = chat_logprobs(tok, entries[:1])["content"][0]
    assert chat == {
        "token": "a",
        "logprob": -0.5,
        "bytes": [97],
        "top_logprobs": [{"token": "b", "logprob": -0.25, "bytes": [98]}],
    }
    assert text_starts(tok, tok("abc")["input_ids"]) == [0, 1, 2]
    cut = tok("abcd")["input_ids"]
    assert visible_tokens(tok, cut, "ab") == 2 and visible_tokens(tok, cut, "abcd") == 4


def test_usage_counts_prompts_once():
    from tandem.serve.decode import RowResult

    results = [RowResult([1, 2], "length"), RowResult([3], "stop")]
    assert usage([[5, 6, 7]], results) == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "a", "stream": "yes"}, "stream"),
        ({"prompt": "a", "echo": 1}, "echo"),
        ({"prompt": "a", "seed": 2**63}, "seed"),
        ({"prompt": "a", "seed": -(2**63) - 1}, "seed"),
        ({"prompt": "a", "logprobs": 21}, "logprobs"),
        ({"prompt": "a", "logit_bias": {"x": 1}}, "logit_bias"),
        ({"prompt": "a", "logit_bias": {"1": -101}}, "logit_bias"),
        ({"prompt": [[]]}, "prompt"),
        ({"prompt": [1, "a"]}, "prompt"),
        ({"prompt": "a", "temperature": float("nan")}, "temperature"),
        ({"prompt": "a", "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
        ({"prompt": "a", "stream_options": {"other": True}}, "stream_options.other"),
    ],
)
def test_completion_validation_names_the_field(body, param):
    from tandem.serve.protocol import validation_param

    with pytest.raises(ValidationError) as info:
        CompletionRequest.model_validate(body)
    assert validation_param(tuple(info.value.errors()[0]["loc"])) == param


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "a", "stream_options": {"include_usage": True}}, "stream_options"),
        ({"prompt": "a", "best_of": 1, "n": 2}, "best_of"),
        ({"prompt": "a", "best_of": 3, "stream": True}, "best_of"),
        ({"prompt": "a", "suffix": "z"}, "suffix"),
    ],
)
def test_completion_cross_field_rules(body, param):
    with pytest.raises(ApiError) as info:
        CompletionRequest.model_validate(body).check()
    assert info.value.status == 400 and info.value.param == param


def test_completion_prompts_and_defaults():
    assert CompletionRequest(prompt=[1, 2]).prompts() == [[1, 2]]
    assert CompletionRequest(prompt=[[1], [2, 3]]).prompts() == [[1], [2, 3]]
    assert CompletionRequest(prompt=["a", "b"]).prompts() == ["a", "b"]
    nulls = CompletionRequest.model_validate({"prompt": "a", "temperature": None, "stream": None, "n": None})
    assert (nulls.temperature, nulls.stream, nulls.n, nulls.max_tokens) == (1.0, False, 1, 16)
    assert CompletionRequest(prompt="a", temperature=1e-39).effective_temperature() == 0.0
    assert CompletionRequest(prompt="a", logit_bias={"5": 100}).bias_ids() == {5: 100.0}


def test_chat_content_parts_and_rules():
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    req = ChatRequest(messages=[{"role": "user", "content": parts, "name": "ann"}])
    assert req.messages[0].for_template() == {"role": "user", "content": "a\nb", "name": "ann"}
    with pytest.raises(ValidationError):
        ChatRequest(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])
    for body, param in [
        ({"top_logprobs": 2}, "top_logprobs"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {}}},
            "response_format.json_schema.schema",
        ),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"functions": [{"name": "f"}]}, "functions"),  # legacy function calling (tools: tandem.serve.tools)
        ({"function_call": "auto"}, "function_call"),
        ({"store": True}, "store"),
    ]:
        with pytest.raises(ApiError) as info:
            ChatRequest.model_validate({"messages": [{"role": "user", "content": "a"}], **body}).check()
        assert info.value.param == param
    ok = {
        "messages": [{"role": "user", "content": "a"}],
        "tool_choice": "none",
        "response_format": {"type": "text"},
    }
    ChatRequest.model_validate(ok | {"parallel_tool_calls": True, "store": False}).check()
    assert ChatRequest.model_validate(ok | {"max_tokens": 3, "max_completion_tokens": 5}).token_limit() == 5
    assert ChatRequest.model_validate(ok).token_limit() is None
