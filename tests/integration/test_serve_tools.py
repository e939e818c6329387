"""Tool calling through ``/v1/chat/completions`` (OpenAI ``tools`` / ``tool_choice`` in, ``tool_calls``
out), driven with the official ``openai`` client over FastAPI's test client, and recorded conversations
exported as training rows.

A named ``tool_choice`` runs end to end on a real model: a bigram chain (tests/bigram_models.py) that
continues the forced ``CALL calc(`` opening with ``7)``. Answers a random tiny model would never write
(Hermes calls, several per turn, malformed ones) come from a fake generator standing in for the model
(the server's decoder, ``decode_rows``), so what is tested is the server's rendering and parsing around it.
"""

from __future__ import annotations

import json
import shutil

import pytest
from bigram_models import bigram_model

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from fastapi.testclient import TestClient  # noqa: E402

from tandem.errors import ConfigError  # noqa: E402
from tandem.serve import engines  # noqa: E402
from tandem.serve.decode import RowResult, TokenLogprob  # noqa: E402
from tandem.serve.feedback import export_conversations  # noqa: E402
from tandem.serve.server import build_state, make_app  # noqa: E402
from tandem.serve.state import ServeSettings  # noqa: E402

CALC = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate arithmetic.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
            "required": ["city"],
        },
    },
}
ASK = [{"role": "user", "content": "12*34?"}]
TEMPLATE = (
    "{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif %}"
    "{% for m in messages %}{{ m.role }}:{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<call {{ c.function.name }} {{ c.function.arguments | tojson }}>{% endfor %}"
    "\n{% endfor %}assistant:"
)


def _call(name: str, args: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


class FakeModel:
    """Stands in for the decoder: answers every row with ``self.text`` and records the prompts."""

    def __init__(self, monkeypatch):
        self.text, self.prompts = "", []
        fake = self

        def decode_rows(model, tokenizer, rows, on_token=None, **kwargs):
            out = []
            for row in rows:
                fake.prompts.append(row.prompt_text)
                ids = tokenizer(fake.text, add_special_tokens=False)["input_ids"]
                logprobs = [TokenLogprob(t, -0.1, []) for t in ids]
                out.append(RowResult(ids, "stop", fake.text, logprobs))
            return out

        monkeypatch.setattr(engines, "decode_rows", decode_rows)


@pytest.fixture
def fake(monkeypatch):
    return FakeModel(monkeypatch)


def _client(state) -> tuple[TestClient, openai.OpenAI]:
    http = TestClient(make_app(state))
    return http, openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http, max_retries=0)


@pytest.fixture(scope="module")
def long_model_dir(tmp_path_factory):
    """A tiny char model (no chat template) with room for tool declarations (2048 positions)."""
    from tandem.models import init_tiny_model

    out = tmp_path_factory.mktemp("models") / "long"
    return init_tiny_model(out, hidden_size=16, num_layers=1, num_heads=2, max_position_embeddings=2048)


@pytest.fixture
def served(long_model_dir, tmp_path):
    """The long tiny model, hermes format, conversations recorded."""
    settings = ServeSettings(max_wait_ms=1, feedback_db=str(tmp_path / "fb.db"))
    http, client = _client(build_state({"main": str(long_model_dir)}, settings, name="tiny"))
    with http:
        yield http, client, tmp_path / "fb.db"


def test_named_tool_choice_on_a_real_model_in_the_plain_format(tmp_path):
    chain = bigram_model(tmp_path / "chain", {"(": "7", "7": ")"})
    state = build_state({"main": str(chain)}, ServeSettings(tool_format="plain", max_wait_ms=1), name="chain")
    http, client = _client(state)
    with http:
        choice = {"type": "function", "function": {"name": "calc"}}
        out = client.chat.completions.create(
            model="chain", messages=ASK, tools=[CALC], tool_choice=choice, max_tokens=8, temperature=0
        )
    (only,) = out.choices
    assert only.finish_reason == "tool_calls" and only.message.content is None
    (call,) = only.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert (call.function.name, json.loads(call.function.arguments)) == ("calc", {"expression": "7"})


def test_auto_parses_several_calls_and_keeps_prose(served, fake):
    http, client, _ = served
    fake.text = (
        "Let me check.\n" + _call("calc", {"expression": "12*34"}) + _call("weather", {"city": "Oslo"})
    )
    out = client.chat.completions.create(model="tiny", messages=ASK, tools=[CALC, WEATHER], max_tokens=8)
    msg = out.choices[0].message
    assert out.choices[0].finish_reason == "tool_calls" and msg.content == "Let me check."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls] == [
        ("calc", {"expression": "12*34"}),
        ("weather", {"city": "Oslo"}),
    ]
    assert len({c.id for c in msg.tool_calls}) == 2
    # the prompt declared both tools in the hermes format (no template: role lines)
    assert '"name": "weather"' in fake.prompts[-1] and "<tool_call>" in fake.prompts[-1]
    single = client.chat.completions.create(
        model="tiny", messages=ASK, tools=[CALC, WEATHER], parallel_tool_calls=False, max_tokens=8
    )
    assert [c.function.name for c in single.choices[0].message.tool_calls] == ["calc"]


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>{not json}</tool_call>",
        _call("rm", {"path": "/"}),
        _call("weather", {"city": "Oslo", "unit": "K"}),
        "The answer is 408.",
    ],
)
def test_text_that_is_not_a_valid_call_stays_content(served, fake, text):
    _, client, _ = served
    fake.text = text
    out = client.chat.completions.create(model="tiny", messages=ASK, tools=[CALC, WEATHER], max_tokens=8)
    assert out.choices[0].finish_reason == "stop"
    assert out.choices[0].message.content == text and out.choices[0].message.tool_calls is None


def test_tool_choice_none_hides_the_tools_and_parses_nothing(served, fake):
    _, client, _ = served
    fake.text = _call("calc", {"expression": "1"})
    out = client.chat.completions.create(
        model="tiny", messages=ASK, tools=[CALC], tool_choice="none", max_tokens=8
    )
    assert out.choices[0].message.content == fake.text and out.choices[0].finish_reason == "stop"
    assert "calc" not in fake.prompts[-1]


def test_required_starts_the_turn_inside_a_call(served, fake):
    _, client, _ = served
    fake.text = json.dumps({"name": "calc", "arguments": {"expression": "2+2"}}) + "\n</tool_call>"
    out = client.chat.completions.create(
        model="tiny", messages=ASK, tools=[CALC], tool_choice="required", max_tokens=8
    )
    assert fake.prompts[-1].endswith("assistant:<tool_call>\n")
    assert out.choices[0].message.tool_calls[0].function.arguments == '{"expression": "2+2"}'


def test_history_with_tool_calls_and_results_is_rendered(served, fake):
    _, client, _ = served
    fake.text = "408"
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"expression": "12*34"}'}}
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": "408"},
    ]  # fmt: skip
    out = client.chat.completions.create(model="tiny", messages=history, tools=[CALC], max_tokens=8)
    assert out.choices[0].message.content == "408" and out.choices[0].finish_reason == "stop"
    prompt = fake.prompts[-1]
    assert (
        'assistant: <tool_call>\n{"name": "calc", "arguments": {"expression": "12*34"}}\n</tool_call>'
        in prompt
    )
    assert "tool: <tool_response>\n408\n</tool_response>" in prompt


def test_a_template_that_reads_tools_renders_them(long_model_dir, tmp_path, fake):
    folder = tmp_path / "templated"
    shutil.copytree(long_model_dir, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    http, client = _client(build_state({"main": str(folder)}, ServeSettings(max_wait_ms=1), name="t"))
    history = [
        *ASK,
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"expression": "1"}'}}
        ]},
    ]  # fmt: skip
    fake.text = "ok"
    with http:
        client.chat.completions.create(model="t", messages=history, tools=[CALC, WEATHER], max_tokens=4)
    # (templates run with trim_blocks: the newline after a block tag is dropped)
    assert (
        fake.prompts[-1]
        == 'TOOLS:calc;weather;user:12*34?assistant:<call calc {"expression": "1"}>assistant:'
    )


def test_streaming_with_tools_sends_calls_as_deltas(served, fake):
    http, client, _ = served
    fake.text = "hm " + _call("calc", {"expression": "3*3"})
    stream = client.chat.completions.create(
        model="tiny",
        messages=ASK,
        tools=[CALC],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant" and "".join(d.content or "" for d in deltas) == "hm"
    calls = [tc for d in deltas for tc in d.tool_calls or []]
    assert [(tc.index, tc.function.name, tc.function.arguments) for tc in calls] == [
        (0, "calc", '{"expression": "3*3"}')
    ]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"] and chunks[-1].usage is not None and not chunks[-1].choices


BAD = [
    ({"tools": [{"type": "retrieval"}]}, "tools.0.type"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools.0.function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools.0.function.parameters"),
    ({"tools": [CALC, CALC]}, "tools.1.function.name"),
    ({"tools": [{**CALC, "function": {**CALC["function"], "strict": True}}]}, "tools.0.function.strict"),
    ({"tools": [CALC], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [CALC], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
    ({"messages": [*ASK, {"role": "tool", "content": "408"}]}, "messages.1"),
    ({"messages": [{"role": "user", "content": "a", "tool_calls": []}, {"role": "user", "content": None}]},
     "messages.1"),
    ({"messages": [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "calc", "arguments": "{bad"}}]}]},
     "messages.1.tool_calls.0.function.arguments"),
    ({"functions": [CALC["function"]]}, "functions"),
]  # fmt: skip


@pytest.mark.parametrize(("extra", "param"), BAD, ids=[p for _, p in BAD])
def test_malformed_tools_are_one_line_400s(served, extra, param):
    http, _, _ = served
    r = http.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 4, **extra})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and "\n" not in error["message"], error


def test_conversations_are_recorded_and_exported_with_their_tool_calls(served, fake, tmp_path):
    _, client, db = served
    fake.text = _call("calc", {"expression": "12*34"})
    first = client.chat.completions.create(model="tiny", messages=ASK, tools=[CALC], max_tokens=8, n=2)
    fake.text = "408"
    follow = [*ASK, first.choices[0].message.model_dump(exclude_none=True),
              {"role": "tool", "tool_call_id": first.choices[0].message.tool_calls[0].id, "content": "408"}]  # fmt: skip
    client.chat.completions.create(model="tiny", messages=follow, tools=[CALC], max_tokens=8)
    out = tmp_path / "conv.jsonl"
    assert export_conversations(db, out) == 3
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["tools"] == [CALC] and rows[0]["finish_reason"] == "tool_calls"
    assert rows[0]["messages"][:-1] == ASK
    call = rows[0]["messages"][-1]["tool_calls"][0]
    assert call["function"] == {"name": "calc", "arguments": '{"expression": "12*34"}'}
    assert rows[0]["completion"] == fake_call_text() and rows[0]["prompt"].endswith(
        "user: 12*34?\nassistant:"
    )
    assert rows[2]["messages"][-1] == {"role": "assistant", "content": "408"}
    assert rows[2]["messages"][2]["role"] == "tool" and rows[2]["completion"] == "408"

    from typer.testing import CliRunner

    from tandem.cli.main import app

    missing = CliRunner().invoke(
        app, ["data", "export-conversations", str(tmp_path / "no.db"), "--out", str(out)]
    )
    assert missing.exit_code != 0 and "feedback database does not exist" in missing.output
    cli_out = tmp_path / "cli.jsonl"
    done = CliRunner().invoke(app, ["data", "export-conversations", str(db), "--out", str(cli_out)])
    assert done.exit_code == 0 and cli_out.read_text() == out.read_text(), done.output


def fake_call_text() -> str:
    return _call("calc", {"expression": "12*34"})


def test_unknown_tool_format_is_a_config_error():
    with pytest.raises(ConfigError, match="--tool-format: unknown tool call format 'xml'"):
        ServeSettings(tool_format="xml")
