"""The openai backend: the real ``openai`` SDK against a local OpenAI-compatible server."""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from agentik.core import (
    Agent,
    ConfigError,
    LLMError,
    LLMStatusError,
    OpenAIBackend,
    SQLiteStore,
    tool,
)
from agentik.core.llm.base import (
    FinishItem,
    LLMRequest,
    ReasoningChunk,
    TextChunk,
    ToolCallItem,
    UsageItem,
)
from agentik.core.messages import ChatMessage, ToolCall, Usage
from agentik.core.testing.openai_server import Reply
from helpers import collect_turn

SECRET = "sk-test-secret"


async def test_plain_streaming_turn(openai_agent, openai_server):
    openai_server.enqueue(Reply.text("Hello from the model", chunks=4, usage=(12, 5)))
    conv = await openai_agent.create_conversation()
    sub = conv.events()
    await conv.send("hi there", author="alice")
    events = await collect_turn(sub)
    deltas = [e.text for e in events if e.kind == "text_delta"]
    assert len(deltas) == 4 and "".join(deltas) == "Hello from the model"
    end = events[-1]
    assert end.stop_reason == "stop" and end.text == "Hello from the model"
    # The usage chunk (empty choices) arrived and was counted.
    assert (end.usage.prompt_tokens, end.usage.completion_tokens, end.usage.total_tokens) == (
        12,
        5,
        17,
    )
    body = openai_server.requests[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["model"] == "fake-model"
    # Several people share a channel: the author reaches the model in the text.
    assert body["messages"] == [{"role": "user", "content": "alice: hi there"}]
    assert openai_server.request_headers[0]["authorization"] == f"Bearer {SECRET}"
    rows = await conv.messages()
    assert [(m.kind, m.content) for m in rows] == [
        ("user", "hi there"),
        ("assistant", "Hello from the model"),
    ]


async def test_split_tool_call_deltas_for_two_parallel_calls(openai_agent, openai_server):
    @tool(
        parameters={
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        }
    )
    async def weather(city: str) -> str:
        """Current weather for a city."""
        return f"sunny in {city}"

    @tool(parameters={"type": "object", "properties": {"tz": {"type": "string"}}})
    async def clock(tz: str) -> str:
        """Current time in a time zone."""
        return f"12:00 {tz}"

    openai_agent.add_tool(weather)
    openai_agent.add_tool(clock)
    openai_server.enqueue(
        Reply.tool_calls(
            [
                ("call_w", "weather", '{"city": "Paris, France"}'),
                ("call_t", "clock", '{"tz": "Europe/Paris"}'),
            ],
            split=5,
            text="Checking both.",
        ),
        Reply.text("It is noon and sunny.", chunks=3),
    )
    conv = await openai_agent.create_conversation()
    sub = conv.events()
    await conv.send("weather and time in Paris?")
    events = await collect_turn(sub)
    started = {e.call_id: (e.name, e.arguments) for e in events if e.kind == "tool_call_started"}
    assert started == {
        "call_w": ("weather", '{"city": "Paris, France"}'),
        "call_t": ("clock", '{"tz": "Europe/Paris"}'),
    }
    first, second = openai_server.requests
    assert [t["function"]["name"] for t in first["tools"]] == ["weather", "clock"]
    assert first["tools"][0]["function"]["parameters"]["required"] == ["city"]
    msgs = second["messages"]
    assert msgs[1]["role"] == "assistant" and msgs[1]["content"] == "Checking both."
    assert [c["id"] for c in msgs[1]["tool_calls"]] == ["call_w", "call_t"]
    results = {m["tool_call_id"]: m["content"] for m in msgs[2:]}
    assert results == {"call_w": "sunny in Paris, France", "call_t": "12:00 Europe/Paris"}
    assert events[-1].text == "It is noon and sunny."


async def test_rate_limited_then_success(openai_agent, openai_server):
    openai_server.enqueue(Reply.error(429, retry_after=0.01), Reply.text("made it", chunks=2))
    conv = await openai_agent.create_conversation()
    sub = conv.events()
    await conv.send("hello")
    events = await collect_turn(sub)
    assert events[-1].stop_reason == "stop" and events[-1].text == "made it"
    assert len(openai_server.requests) == 2
    assert not [e for e in events if e.kind == "error"]


async def test_connection_dropped_mid_stream(openai_agent, openai_server):
    openai_server.enqueue(
        Reply.text("this answer will break off", chunks=5, drop_after=2),
        Reply.text("second try works", chunks=2),
    )
    conv = await openai_agent.create_conversation()
    sub = conv.events()
    await conv.send("first question")
    events = await collect_turn(sub)
    errors = [e for e in events if e.kind == "error"]
    assert len(errors) == 1 and errors[0].error_type == "LLMConnectionError"
    assert events[-1].stop_reason == "error"
    partial = "".join(e.text for e in events if e.kind == "text_delta")
    assert partial and partial != "this answer will break off"
    rows = await conv.messages()
    assert [(m.kind, m.content, m.status) for m in rows] == [
        ("user", "first question", "complete"),
        ("assistant", partial, "error"),
    ]
    await conv.send("second question")
    events = await collect_turn(sub)
    assert events[-1].text == "second try works"
    last = openai_server.requests[-1]["messages"]
    assert [m["content"] for m in last] == ["first question", partial, "second question"]


async def test_slow_model_interrupted_closes_the_http_stream(openai_agent, openai_server):
    # Two chunks, then the stream holds until released (never): still open when interrupted.
    openai_server.enqueue(Reply.text("a b c d e f g h i j k l m n o p", chunks=16, hold_after=2))
    conv = await openai_agent.create_conversation()
    sub = conv.events()
    await conv.send("tell me a long story")
    async for e in sub:
        if e.kind == "text_delta":
            break
    assert await conv.interrupt()
    # The server saw the client go away: the HTTP response was closed.
    await openai_server.wait_disconnect(timeout=60)
    events = await collect_turn(sub)
    assert events[-1].stop_reason == "interrupted"
    assistant = [m for m in await conv.messages() if m.kind == "assistant"]
    assert assistant[0].status == "interrupted"
    assert assistant[0].content.startswith("a ")


async def test_stalled_stream_times_out(openai_server, db_path):
    llm = OpenAIBackend(
        model="fake-model", base_url=openai_server.base_url, timeout=0.3, max_retries=0
    )
    async with Agent(llm=llm, store=SQLiteStore(db_path)) as agent:
        openai_server.enqueue(Reply.text("too slow", chunks=2, delay=30))
        conv = await agent.create_conversation()
        sub = conv.events()
        await conv.send("anyone?")
        events = await collect_turn(sub)
    err = next(e for e in events if e.kind == "error")
    assert err.error_type == "LLMTimeout" and "timed out" in err.message


async def test_unreachable_endpoint_is_an_error_event(db_path):
    llm = OpenAIBackend(model="m", base_url="http://127.0.0.1:9/v1", max_retries=1, timeout=2)
    async with Agent(llm=llm, store=SQLiteStore(db_path)) as agent:
        conv = await agent.create_conversation()
        sub = conv.events()
        await conv.send("hello?")
        events = await collect_turn(sub)
        err = next(e for e in events if e.kind == "error")
        assert err.error_type == "LLMConnectionError" and "127.0.0.1:9" in err.message
        # The failure is the turn's answer in the audit log, without the address.
        rows = await conv.messages()
        assert [(m.kind, m.status) for m in rows] == [("user", "complete"), ("assistant", "error")]
        assert rows[1].data["error"]["type"] == "LLMConnectionError"
        assert "127.0.0.1:9" not in rows[1].data["error"]["message"]


async def test_secret_never_reaches_errors_logs_or_database(
    openai_server, db_path, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.DEBUG)
    llm = OpenAIBackend(
        model="fake-model", base_url=openai_server.base_url, api_key=SECRET, max_retries=0
    )
    openai_server.enqueue(Reply.error(401, f"Incorrect API key provided: {SECRET}"))
    async with Agent(llm=llm, store=SQLiteStore(db_path)) as agent:
        conv = await agent.create_conversation()
        sub = conv.events()
        await conv.send("hi")
        events = await collect_turn(sub)
    err = next(e for e in events if e.kind == "error")
    assert "401" in err.message and SECRET not in err.message and "***" in err.message
    assert not err.retryable
    assert SECRET not in caplog.text
    assert SECRET not in repr(llm)
    con = sqlite3.connect(db_path)
    dump = "\n".join(con.iterdump())
    con.close()
    assert SECRET not in dump


async def test_backend_streams_directly(openai_server):
    llm = OpenAIBackend(model="fake-model", base_url=openai_server.base_url)
    openai_server.enqueue(Reply.text("thought done", reasoning="let me think", chunks=2))
    items = [
        i
        async for i in llm.stream(
            LLMRequest(messages=[ChatMessage(role="user", content="q")], system="sys")
        )
    ]
    await llm.aclose()
    assert "".join(i.text for i in items if isinstance(i, TextChunk)) == "thought done"
    assert any(isinstance(i, UsageItem) for i in items)
    assert type(items[0]).__name__ == "ReasoningChunk"
    assert openai_server.requests[0]["messages"][0] == {"role": "system", "content": "sys"}


async def test_status_error_is_typed(openai_server):
    llm = OpenAIBackend(model="fake-model", base_url=openai_server.base_url, max_retries=0)
    openai_server.enqueue(Reply.error(500, "upstream exploded"))
    with pytest.raises(LLMStatusError) as info:
        async for _ in llm.stream(LLMRequest(messages=[ChatMessage(role="user", content="q")])):
            pass
    await llm.aclose()
    assert info.value.status_code == 500 and info.value.retryable


def test_model_is_required(monkeypatch):
    monkeypatch.delenv("OPENAI_MODEL", raising=False)
    with pytest.raises(ConfigError, match=r"llm\.model"):
        OpenAIBackend()


async def test_author_modes(openai_server):
    for mode, expected in [
        ("name", {"role": "user", "content": "hi", "name": "Zo_B"}),
        ("none", {"role": "user", "content": "hi"}),
    ]:
        llm = OpenAIBackend(model="fake-model", base_url=openai_server.base_url, author_mode=mode)
        msgs = [ChatMessage(role="user", content="hi", author="Zoë B")]
        async for _ in llm.stream(LLMRequest(messages=msgs)):
            pass
        await llm.aclose()
        assert openai_server.requests[-1]["messages"] == [expected]


async def test_extra_body_and_sampling_settings_reach_the_endpoint(openai_server):
    llm = OpenAIBackend(
        model="fake-model", base_url=openai_server.base_url, temperature=0.2, max_tokens=64,
        extra_body={"top_k": 5, "repeat_penalty": 1.1},
    )  # fmt: skip
    async for _ in llm.stream(LLMRequest(messages=[ChatMessage(role="user", content="q")])):
        pass
    await llm.aclose()
    body = openai_server.requests[-1]
    assert (body["temperature"], body["max_tokens"]) == (0.2, 64)
    assert (body["top_k"], body["repeat_penalty"]) == (5, 1.1)


def _llama_cpp_like(refuse: str):
    """A server refusing as llama.cpp's own server does: HTTP 500 for a streamed
    request with tools (``refuse="stream"``), or for any request that names a
    ``tool_choice`` (``refuse="tool_choice"``); otherwise a tool call, then an answer."""

    def answer(body: dict) -> Reply:
        if body.get("tools") and (
            (refuse == "stream" and body.get("stream"))
            or (refuse == "tool_choice" and "tool_choice" in body)
        ):
            return Reply.error(500, "Cannot use tools with stream" if refuse == "stream"
                               else "Unsupported param: tool_choice")  # fmt: skip
        if body["messages"][-1]["role"] == "tool":
            return Reply.text("It is 12:00 in Paris.", chunks=2)
        return Reply.tool_calls([("call_1", "clock", '{"tz": "Europe/Paris"}')])

    return answer


@pytest.mark.parametrize("refuse", ["tool_choice", "stream"])
async def test_tool_calls_work_against_a_server_refusing_tool_choice_or_streamed_tools(
    openai_server, db_path, caplog, refuse
):
    @tool(parameters={"type": "object", "properties": {"tz": {"type": "string"}}})
    async def clock(tz: str) -> str:
        """Current time in a time zone."""
        return f"12:00 {tz}"

    openai_server.default = _llama_cpp_like(refuse)
    llm = OpenAIBackend(model="fake-model", base_url=openai_server.base_url, max_retries=0)
    async with Agent(llm=llm, store=SQLiteStore(db_path), tools=[clock]) as agent:
        for question in ("time in Paris?", "and now?"):
            conv = await agent.create_conversation()
            sub = conv.events()
            await conv.send(question)
            events = await collect_turn(sub)
            await sub.aclose()
            assert [e.kind for e in events if e.kind == "error"] == []
            assert [e.name for e in events if e.kind == "tool_call_started"] == ["clock"]
            assert events[-1].text == "It is 12:00 in Paris."
    bodies = openai_server.requests
    # Refused once per step, then never again: the backend remembers.
    refused = 1 if refuse == "tool_choice" else 2
    assert len(bodies) == refused + 4
    later = bodies[refused:]
    assert all("tool_choice" not in b for b in later)
    assert all(b["stream"] is (refuse == "tool_choice") for b in later)
    warned = [
        r.getMessage() for r in caplog.records if "refused the request's tool" in r.getMessage()
    ]
    assert len(warned) == refused


# -- chunks as servers send them (raw SSE at the network boundary) -----------------------------
@contextlib.asynccontextmanager
async def _sse_endpoint(events: list[str]) -> AsyncIterator[str]:
    """A chat-completions endpoint on 127.0.0.1 streaming ``events`` (each a ``data:``
    payload) verbatim; yields its base URL."""

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for data in events:
            await response.write(f"data: {data}\n\n".encode())
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    finally:
        await runner.cleanup()


def _chunk(**fields: Any) -> str:
    return json.dumps({"id": "c", "object": "chat.completion.chunk", "model": "m", **fields})


async def _items(url: str) -> list[Any]:
    llm = OpenAIBackend(model="m", base_url=url, max_retries=0)
    try:
        return [
            item
            async for item in llm.stream(
                LLMRequest(messages=[ChatMessage(role="user", content="q")])
            )
        ]
    finally:
        await llm.aclose()


async def test_every_part_of_a_streamed_chunk_reaches_the_turn():
    """Reasoning under either name, text, a tool call split over chunks, the usage chunk
    (no choices) and the finish reason all come through; a second choice (``n`` > 1) and
    what is not shaped as the API says are left out."""
    events = [
        _chunk(choices=[{"index": 0, "delta": {"role": "assistant", "reasoning": "think "}}]),
        _chunk(choices=[{"index": 0, "delta": {"reasoning_content": "more"}}]),
        _chunk(choices=[{"index": 1, "delta": {"content": "the other choice"}}]),
        _chunk(choices=[{"index": 0, "delta": {"content": "Hi"}}, "not a choice"]),
        _chunk(choices=[{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "call_1", "type": "function",
             "function": {"name": "clock", "arguments": ""}}]}}]),
        _chunk(choices=[{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"name": "clock", "arguments": '{"tz": '}}]}}]),
        _chunk(choices=[{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": '"UTC"}'}}]}, "finish_reason": "tool_calls"}]),
        _chunk(choices=[], usage={"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}),
        "[DONE]",
    ]  # fmt: skip
    async with _sse_endpoint(events) as url:
        items = await _items(url)
    assert items == [
        ReasoningChunk("think "),
        ReasoningChunk("more"),
        TextChunk("Hi"),
        UsageItem(Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5)),
        ToolCallItem(ToolCall(id="call_1", name="clock", arguments='{"tz": "UTC"}')),
        FinishItem("tool_calls"),
    ]


async def test_an_error_chunk_mid_stream_is_a_model_error():
    """A server that fails after it began answering says so in an ``error`` chunk: the
    stream ends with an LLMError naming it (the text so far was already streamed)."""
    events = [
        _chunk(choices=[{"index": 0, "delta": {"content": "Hel"}}]),
        json.dumps({"error": {"message": "the model is overloaded", "type": "server_error"}}),
        _chunk(choices=[{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]),
        "[DONE]",
    ]
    llm = None
    async with _sse_endpoint(events) as url:
        llm = OpenAIBackend(model="m", base_url=url, max_retries=0)
        got: list[Any] = []
        with pytest.raises(LLMError, match="the model is overloaded"):
            async for item in llm.stream(
                LLMRequest(messages=[ChatMessage(role="user", content="q")])
            ):
                got.append(item)
        await llm.aclose()
    assert got == [TextChunk("Hel")]
