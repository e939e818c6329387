"""Tool declarations, call parsing in every format, argument validation, execution and prompt rendering."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tandem.agents.schema import validate
from tandem.agents.tool_calls import (
    TOOL_CALL_FORMATS,
    ToolOutput,
    ToolSpec,
    get_format,
    messages_as_text,
    observation,
    parse_tool_calls,
    render_prompt,
    run_tool_calls,
    template_takes_tools,
)
from tandem.errors import ConfigError


def _calc(expression: str) -> str:
    return str(eval(expression, {"__builtins__": {}}))  # test tool: arithmetic only


CALC = ToolSpec(
    "calc",
    "Evaluate arithmetic.",
    {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    _calc,
)
ADD = ToolSpec(
    "add",
    "Add two integers.",
    {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "mode": {"enum": ["int", "str"]}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
    lambda a, b, mode="int": str(a + b),
)
TOOLS = [CALC, ADD]


def test_registry_lists_formats_and_unknown_is_a_config_error():
    assert {"hermes", "plain"} <= set(TOOL_CALL_FORMATS.names())
    with pytest.raises(ConfigError, match="valid names: hermes, plain"):
        get_format("xml", key="env.tool_format")


def test_toolspec_rejects_bad_name_and_schema():
    with pytest.raises(ConfigError, match="tool name"):
        ToolSpec("bad name", "", {"type": "object"}, _calc)
    with pytest.raises(ConfigError, match="type 'object'"):
        ToolSpec("t", "", {"type": "string"}, _calc)
    with pytest.raises(ConfigError, match="undeclared properties x"):
        ToolSpec("t", "", {"type": "object", "properties": {}, "required": ["x"]}, _calc)
    with pytest.raises(ConfigError, match="unknown type 'str'"):
        ToolSpec("t", "", {"type": "object", "properties": {"x": {"type": "str"}}}, _calc)
    assert CALC.to_openai()["function"]["name"] == "calc"


@pytest.mark.parametrize(
    ("value", "schema", "error"),
    [
        (1, {"type": "integer"}, None),
        (1.0, {"type": "integer"}, None),
        (1.5, {"type": "integer"}, "expected integer, got number"),
        (True, {"type": "integer"}, "expected integer, got boolean"),
        (True, {"type": "number"}, "expected number, got boolean"),
        ("x", {"type": ["integer", "null"]}, "expected integer or null, got string"),
        ("c", {"enum": ["a", "b"]}, "'c' is not one of 'a', 'b'"),
        (5, {"type": "integer", "maximum": 4}, "above the maximum 4"),
        ([1, "x"], {"type": "array", "items": {"type": "integer"}}, "arguments[1]: expected integer"),
        ({"a": {"b": 1}}, {"properties": {"a": {"properties": {"b": {"type": "string"}}}}}, "arguments.a.b:"),
        ({}, {"type": "object", "required": ["q"]}, "missing required argument 'q'"),
        (
            {"z": 1},
            {"type": "object", "properties": {}, "additionalProperties": False},
            "unexpected argument 'z'",
        ),
    ],
)
def test_validator(value, schema, error):
    got = validate(value, schema)
    if error is None:
        assert got is None
    else:
        assert got is not None and error in got, got


def test_hermes_several_calls_and_prose():
    text = (
        "Let me compute.\n<tool_call>\n"
        + json.dumps({"name": "calc", "arguments": {"expression": "12*34"}})
        + "\n</tool_call>\n<tool_call>"
        + json.dumps({"name": "add", "arguments": json.dumps({"a": 1, "b": 2})})
        + "</tool_call>"
    )
    parsed = parse_tool_calls(text, TOOLS, "hermes")
    assert not parsed.error
    assert parsed.content == "Let me compute."
    assert [(c.id, c.name, c.arguments) for c in parsed.calls] == [
        ("call_0", "calc", {"expression": "12*34"}),
        ("call_1", "add", {"a": 1, "b": 2}),  # arguments given as a JSON string are accepted
    ]
    assert parsed.calls[0].raw.startswith("<tool_call>") and parsed.calls[0].raw.endswith("</tool_call>")


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("{not json}", "not valid JSON"),
        ('["calc"]', '{"name": ..., "arguments": {...}}'),
        ('{"name": "rm", "arguments": {}}', "unknown tool 'rm' (tools: calc, add)"),
        ('{"name": "add", "arguments": {"a": 1}}', "tool 'add': arguments: missing required argument 'b'"),
        ('{"name": "add", "arguments": {"a": 1, "b": "2"}}', "arguments.b: expected integer, got string"),
        ('{"name": "add", "arguments": {"a": 1, "b": 2, "mode": "x"}}', "'x' is not one of"),
        ('{"name": "add", "arguments": {"a": 1, "b": 2, "c": 3}}', "unexpected argument 'c'"),
        ('{"name": "add", "arguments": "{bad"}', "arguments are not valid JSON"),
    ],
)
def test_hermes_malformed_calls_are_errors_not_exceptions(body, error):
    parsed = parse_tool_calls(f"ok <tool_call>{body}</tool_call> <tool_call>{{}}", TOOLS, "hermes")
    assert parsed.error
    assert error in parsed.calls[0].error
    assert "unterminated <tool_call>" in parsed.calls[1].error
    assert len(parsed.errors) == 2 and parsed.valid_calls == ()
    assert "\n" not in parsed.calls[0].error


def test_hermes_last_call_left_open_counts_when_its_json_is_complete():
    # generation stopped at the stop string "</tool_call>" (cut) or at EOS
    body = json.dumps({"name": "calc", "arguments": {"expression": "1+1"}})
    parsed = parse_tool_calls(f"ok <tool_call>{body}\n</tool_call><tool_call>\n{body}\n", TOOLS, "hermes")
    assert not parsed.error and [c.arguments for c in parsed.calls] == [{"expression": "1+1"}] * 2
    cut = parse_tool_calls(f"<tool_call>{body[:-2]}", TOOLS, "hermes")
    assert cut.error and cut.calls[0].error.startswith(
        "unterminated <tool_call>: tool call is not valid JSON"
    )


def test_declared_only_tool_is_parsed_but_not_run():
    declared = ToolSpec("calc", "", CALC.parameters)
    parsed = parse_tool_calls("CALL calc(1+1)", [declared], "plain")
    assert not parsed.error
    (result,) = asyncio.run(run_tool_calls(parsed, [declared]))
    assert result.error and "not runnable here" in result.content


def test_no_calls():
    parsed = parse_tool_calls("  The answer is 4. ", TOOLS, "hermes")
    assert parsed.calls == () and not parsed.error and parsed.content == "The answer is 4."
    assert parse_tool_calls("RECALL x(1)", TOOLS, "plain").calls == ()


def test_plain_single_argument_keeps_raw_text_with_nested_parens_and_strings():
    code = ToolSpec(
        "python", "Run code.", {"type": "object", "properties": {"code": {"type": "string"}}}, _calc
    )
    text = "x CALL calc((1+2)*3) y\nCALL python(print(')', (1, 2)))"
    parsed = parse_tool_calls(text, [CALC, code], "plain")
    assert [c.arguments for c in parsed.calls] == [{"expression": "(1+2)*3"}, {"code": "print(')', (1, 2))"}]
    assert parsed.content == "x  y" and not parsed.error


def test_plain_json_for_several_parameters_and_number_coercion():
    num = ToolSpec("sq", "Square.", {"type": "object", "properties": {"n": {"type": "integer"}}}, str)
    nothing = ToolSpec("now", "Time.", {"type": "object", "properties": {}}, lambda: "12:00")
    parsed = parse_tool_calls(
        'CALL add({"a": 1, "b": 2}) CALL sq(7) CALL now()', [ADD, num, nothing], "plain"
    )
    assert [c.arguments for c in parsed.calls] == [{"a": 1, "b": 2}, {"n": 7}, {}]
    bad = parse_tool_calls(
        "CALL add(1, 2) CALL sq(seven) CALL now(x) CALL nope(1) CALL sq(1", [ADD, num, nothing], "plain"
    )
    errors = [c.error for c in bad.calls]
    assert "takes a JSON object of arguments (a, b, mode)" in errors[0]
    assert "arguments.n: expected integer, got string" in errors[1]
    assert "takes no arguments" in errors[2]
    assert "unknown tool 'nope'" in errors[3]
    assert "unterminated CALL" in errors[4]


DEEP, LONG = "[" * 100_000, "1" * 5000  # past json's recursion limit; past int's 4300-digit limit


@pytest.mark.parametrize(
    ("fmt", "text", "error"),
    [
        ("hermes", f"<tool_call>{DEEP}</tool_call>", "tool call is not valid JSON: nested too deeply"),
        ("hermes", f"<tool_call>{DEEP}", "unterminated <tool_call>: tool call is not valid JSON: nested"),
        ("hermes", '<tool_call>{"name": "add", "arguments": {"a": ' + DEEP + "}}", "nested too deeply"),
        ("hermes", '<tool_call>{"name": "add", "arguments": "' + DEEP + '"}', "arguments are not valid JSON"),
        ("hermes", '<tool_call>{"name": "add", "arguments": {"a": ' + LONG + "}}", "Exceeds the limit"),
        ("plain", f"CALL add({DEEP})", "takes a JSON object of arguments (a, b, mode): nested too deeply"),
        ("plain", f"CALL add({LONG})", "takes a JSON object of arguments (a, b, mode): Exceeds the limit"),
        ("plain", f"CALL sq({DEEP})", "arguments.n: expected integer, got string"),  # kept as text
        ("plain", f"CALL sq({LONG})", "arguments.n: expected integer, got string"),
    ],
)
def test_runaway_nesting_and_huge_numbers_are_errors_not_exceptions(fmt, text, error):
    # A model's runaway "[[[[..." used to escape the parser as a RecursionError (a huge integer as a
    # ValueError) and, from an environment's step, stop the training run blaming the environment.
    num = ToolSpec("sq", "Square.", {"type": "object", "properties": {"n": {"type": "integer"}}}, str)
    parsed = parse_tool_calls(text, [ADD, num], fmt)
    (call,) = parsed.calls
    assert call.error is not None and error in call.error and "\n" not in call.error
    (result,) = asyncio.run(run_tool_calls(parsed, [ADD, num]))
    assert result.error and result.content == call.error
    assistant = {"role": "assistant", "content": "", "tool_calls": [{"name": "add", "arguments": DEEP}]}
    assert messages_as_text([assistant], [ADD], fmt)[-1]["content"]  # rendered, arguments dropped


@pytest.mark.parametrize("fmt", ["hermes", "plain"])
def test_render_call_round_trips_through_parse(fmt):
    f = get_format(fmt)
    table = {t.name: t for t in TOOLS}
    for name, args in [("calc", {"expression": "(2+3)*4"}), ("add", {"a": 5, "b": -1})]:
        parsed = f.parse("pre " + f.render_call(name, args, table), table)
        assert parsed.calls[0].name == name and parsed.calls[0].arguments == args and not parsed.error


def test_run_tool_calls_executes_concurrently_and_never_raises():
    async def slow(expression: str) -> str:
        await asyncio.sleep(0.2)
        return "slow:" + expression

    def boom(expression: str) -> str:
        raise RuntimeError("kaput\nsecond line")

    def sleepy(expression: str) -> str:
        time.sleep(0.2)
        return "sleepy"

    tools = [
        ToolSpec("slow", "", CALC.parameters, slow),
        ToolSpec("boom", "", CALC.parameters, boom),
        ToolSpec("sleepy", "", CALC.parameters, sleepy),
        ToolSpec("killed", "", CALC.parameters, lambda expression: ToolOutput("out", True, "memory")),
        ToolSpec("nonstr", "", CALC.parameters, lambda expression: 3),
        ToolSpec("big", "", CALC.parameters, lambda expression: "x" * 100),
    ]
    names = ["slow", "boom", "sleepy", "killed", "nonstr", "big", "slow", "sleepy", "missing"]
    text = "".join(f"CALL {n}(1)" for n in names)
    parsed = parse_tool_calls(text, tools, "plain")
    start = time.perf_counter()
    results = asyncio.run(run_tool_calls(parsed, tools, max_chars=10))
    elapsed = time.perf_counter() - start
    assert elapsed < 0.6, elapsed  # four 0.2 s calls overlap (serial: 0.8 s)
    by = [(r.name, r.content, r.error) for r in results]
    assert by[0] == ("slow", "slow:1", False)
    assert by[1][2] and by[1][1] == "tool 'boom' failed: RuntimeError: kaput"
    assert by[2] == ("sleepy", "sleepy", False)
    assert results[3].error and results[3].kill_reason == "memory"
    assert by[4][2] and "returned int" in by[4][1]
    assert by[5][1] == "x" * 10 + "...[truncated 90 chars]"
    assert by[8][2] and "unknown tool" in by[8][1]
    assert [r.call_id for r in results] == [f"call_{i}" for i in range(9)]


def test_timeout_is_an_error_result():
    async def forever(expression: str) -> str:
        await asyncio.sleep(10)
        return ""

    tools = [ToolSpec("forever", "", CALC.parameters, forever)]
    (result,) = asyncio.run(
        run_tool_calls(parse_tool_calls("CALL forever(1)", tools, "plain"), tools, timeout_s=0.05)
    )
    assert result.error and result.kill_reason == "wall_time" and "timed out after 0.05s" in result.content


def test_observation_text_per_format():
    parsed = parse_tool_calls("CALL calc(6*7) CALL calc(1/0)", TOOLS, "plain")
    results = asyncio.run(run_tool_calls(parsed, TOOLS))
    assert (
        observation(results, "plain")
        == "RESULT 42\nERROR tool 'calc' failed: ZeroDivisionError: division by zero"
    )
    assert observation(results[:1], "hermes") == "<tool_response>\n42\n</tool_response>"
    assert results[0].message() == {"role": "tool", "tool_call_id": "call_0", "name": "calc", "content": "42"}


class _Tok:
    """A duck-typed tokenizer: records what apply_chat_template received."""

    def __init__(self, template):
        self.chat_template = template
        self.seen = None

    def apply_chat_template(self, messages, tools=None, tokenize=False, add_generation_prompt=False):
        self.seen = (messages, tools)
        body = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        return body + ("<assistant>" if add_generation_prompt else "")


CONVO = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "12*34?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "calc", "arguments": '{"expression": "12*34"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "408"},
]


def test_template_with_tools_gets_declarations():
    tok = _Tok("{% if tools %}{{ tools }}{% endif %}{% for m in messages %}{% endfor %}")
    assert template_takes_tools(tok)
    render_prompt(tok, CONVO, TOOLS, "hermes")
    messages, tools = tok.seen
    assert tools == [t.to_openai() for t in TOOLS] and messages[2]["tool_calls"] == CONVO[2]["tool_calls"]


def test_template_without_tools_gets_instructions_and_text_calls():
    tok = _Tok("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert not template_takes_tools(tok)
    text = render_prompt(tok, CONVO, TOOLS, "hermes")
    messages, tools = tok.seen
    assert tools is None
    assert messages[0]["role"] == "system" and messages[0]["content"].startswith("Be brief.\n\n# Tools")
    assert '"name": "calc"' in messages[0]["content"]
    assert messages[2] == {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "calc", "arguments": {"expression": "12*34"}}\n</tool_call>',
    }
    assert messages[3] == {"role": "tool", "content": "<tool_response>\n408\n</tool_response>"}
    assert text.endswith("<assistant>")


def test_plain_text_without_template():
    text = render_prompt(None, CONVO[1:], [CALC], "plain")
    assert text == (
        "Tools:\ncalc(expression: string) - Evaluate arithmetic.\n"
        "Call a tool by writing CALL name(argument); its result comes back as RESULT <text>.\n"
        "12*34?\nCALL calc(12*34)\nRESULT 408\n"
    )
    assert messages_as_text(CONVO[1:2], [], "plain") == [{"role": "user", "content": "12*34?"}]
