"""Tool-call helpers of the local backend: the forced-call schema, the markup scanner."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from agentik.core.llm._toolcalls import ToolCallScanner, forced_call_schema, parse_call
from agentik.core.llm.base import ToolSpec

WEATHER = ToolSpec(
    name="weather",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
)


def scan(chunks: list[str], names=("weather",)) -> tuple[str, list[tuple[str, str]]]:
    scanner = ToolCallScanner(names)
    shown = "".join(scanner.feed(c) for c in chunks) + scanner.finish()
    return shown, scanner.calls


def test_text_and_a_call_split_anywhere_come_apart():
    answer = 'Let me look.<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>'
    for cut in range(1, len(answer)):
        shown, calls = scan([answer[:cut], answer[cut:]])
        assert shown == "Let me look."
        assert calls == [("weather", '{"city": "Oslo"}')]


def test_text_that_only_looks_like_a_tag_is_shown_once_it_cannot_be_one():
    scanner = ToolCallScanner(["weather"])
    assert scanner.feed("a <tool") == "a "  # might still become <tool_call>
    assert scanner.feed("s> b") == "<tools> b"
    assert scanner.finish() == ""


def test_a_block_that_is_not_a_call_of_an_offered_tool_stays_text():
    unknown = '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
    assert scan(["x", unknown]) == ("x" + unknown, [])
    broken = "<tool_call>{not json</tool_call>"
    assert scan([broken]) == (broken, [])


def test_an_unclosed_block_at_the_end_is_a_call_if_it_parses():
    assert scan(['<tool_call>{"name": "weather", "arguments": {"city": "Rome"}}']) == (
        "",
        [("weather", '{"city": "Rome"}')],
    )
    assert scan(["<tool_call>{half"]) == ("<tool_call>{half", [])


@given(st.text(alphabet="ab<>/_toolcaé ", max_size=60), st.integers(1, 8))
def test_plain_text_comes_through_unchanged_however_it_is_chunked(text, size):
    if "<tool_call>" in text:
        return
    chunks = [text[i : i + size] for i in range(0, len(text), size)]
    assert scan(chunks) == (text, [])


def test_parse_call_accepts_arguments_as_object_string_or_parameters():
    assert parse_call('{"name": "weather", "arguments": {"city": "X"}}', ["weather"]) == (
        "weather",
        '{"city": "X"}',
    )
    assert parse_call('{"name": "weather", "arguments": "{\\"city\\": \\"X\\"}"}', ["weather"])
    assert parse_call('{"name": "weather", "parameters": {}}', ["weather"]) == ("weather", "{}")
    assert parse_call('{"name": "weather", "arguments": [1]}', ["weather"]) is None
    assert parse_call('{"name": "other", "arguments": {}}', ["weather"]) is None


def test_forced_schema_admits_only_offered_tools_and_their_arguments():
    clock = ToolSpec(name="clock")
    schema = forced_call_schema([WEATHER, clock])
    names = [o["properties"]["name"]["const"] for o in schema["anyOf"]]
    assert names == ["weather", "clock"]
    assert schema["anyOf"][0]["properties"]["arguments"] == WEATHER.parameters
    assert schema["anyOf"][1]["properties"]["arguments"] == {"type": "object", "properties": {}}
    assert forced_call_schema([WEATHER])["required"] == ["name", "arguments"]
    # Keywords a grammar cannot express fall back to any arguments object.
    odd = ToolSpec(name="odd", parameters={"type": "object", "properties": {"x": {"$ref": "#/a"}}})
    assert forced_call_schema([odd])["properties"]["arguments"] == {"type": "object"}
    json.dumps(schema)  # plain JSON
