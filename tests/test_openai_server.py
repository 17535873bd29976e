"""Tests for the fake OpenAI server, driven by the real ``openai`` SDK."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator

import openai
import pytest

from agentik.core.testing.openai_server import FakeOpenAIServer, Reply

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
CALLS = [("call_1", "get_weather", '{"city": "Paris"}'), ("call_2", "get_time", '{"tz": "UTC"}')]


@pytest.fixture
async def server() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer(model="fake-model") as srv:
        yield srv


@pytest.fixture
async def client(server: FakeOpenAIServer) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0) as c:
        yield c


async def test_base_url_is_loopback(server: FakeOpenAIServer) -> None:
    assert server.base_url == f"http://127.0.0.1:{server.port}/v1"
    assert server.port > 0


async def test_streaming_text_with_usage(server, client) -> None:
    server.enqueue(Reply.text("Hello world", chunks=3, usage=(12, 5)))
    stream = await client.chat.completions.create(
        model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]

    assert len(chunks) == 4
    assert "".join(c.choices[0].delta.content for c in chunks[:3]) == "Hello world"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks[:3]] == [None, None, "stop"]
    assert all(c.usage is None for c in chunks[:3])
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
    assert chunks[0].model == "fake-model" and chunks[0].object == "chat.completion.chunk"
    last = chunks[-1]
    assert last.choices == []
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (12, 5)
    assert last.usage.total_tokens == 17
    assert server.requests[0]["messages"] == MESSAGES
    assert server.requests[0]["stream"] is True
    assert server.request_headers[0]["authorization"] == "Bearer x"


async def test_no_usage_chunk_unless_requested(server, client) -> None:
    server.enqueue(Reply.text("Hello world", chunks=2, usage=(1, 1)))
    stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    chunks = [chunk async for chunk in stream]
    assert len(chunks) == 2
    assert all(c.choices and c.usage is None for c in chunks)


async def test_raw_wire_format(server, client) -> None:
    server.enqueue(Reply.text("ab", chunks=2, usage=(3, 2)))
    async with client.chat.completions.with_streaming_response.create(
        model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line async for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert all(line.startswith("data: ") for line in lines)
    events = [json.loads(line[len("data: ") :]) for line in lines[:-1]]
    first = events[0]
    assert set(first) == {
        "id",
        "object",
        "created",
        "model",
        "system_fingerprint",
        "choices",
        "usage",
    }
    assert first["system_fingerprint"] is None and first["usage"] is None
    assert first["choices"] == [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": "a"},
            "logprobs": None,
            "finish_reason": None,
        }
    ]
    assert events[1]["choices"][0]["delta"] == {"content": "b"}
    assert events[1]["choices"][0]["finish_reason"] == "stop"
    assert events[2]["choices"] == []
    assert events[2]["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


async def test_parallel_tool_calls_reassembled_by_index(server, client) -> None:
    server.enqueue(Reply.tool_calls(CALLS, split=3))
    stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    acc: dict[int, dict[str, str]] = {}
    order: list[int] = []
    finish = None
    async for chunk in stream:
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for tc in choice.delta.tool_calls or []:
            order.append(tc.index)
            slot = acc.setdefault(tc.index, {"id": "", "name": "", "args": ""})
            if tc.id:
                assert tc.type == "function" and tc.function.name
                slot["id"], slot["name"] = tc.id, tc.function.name
            slot["args"] += tc.function.arguments or ""

    assert finish == "tool_calls"
    assert order == [0, 1] * 4  # header chunks, then 3 interleaved argument pieces each
    assert [(acc[i]["id"], acc[i]["name"], acc[i]["args"]) for i in sorted(acc)] == CALLS
    assert json.loads(acc[0]["args"]) == {"city": "Paris"}


async def test_sdk_stream_helper_accumulates_tool_calls(server, client) -> None:
    server.enqueue(Reply.tool_calls(CALLS, split=3, text="Let me check."))
    async with client.chat.completions.stream(model="m", messages=MESSAGES) as stream:
        final = await stream.get_final_completion()
    message = final.choices[0].message
    assert message.content == "Let me check."
    assert [(t.id, t.function.name, t.function.arguments) for t in message.tool_calls] == CALLS


async def test_429_then_success_uses_sdk_retry(server) -> None:
    server.enqueue(Reply.error(429, retry_after=0), Reply.text("ok now", chunks=2))
    async with openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=2) as c:
        stream = await c.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream])
    assert text == "ok now"
    assert len(server.requests) == 2
    assert server.request_headers[1].get("x-stainless-retry-count") == "1"


async def test_error_body_and_headers(server, client) -> None:
    server.enqueue(Reply.error(429, "slow down", retry_after=7))
    with pytest.raises(openai.RateLimitError) as info:
        await client.chat.completions.create(model="m", messages=MESSAGES)
    err = info.value
    assert err.status_code == 429
    assert err.code == "rate_limit_exceeded" and err.message.endswith("slow down")
    assert err.response.headers["retry-after"] == "7"
    assert err.response.headers["retry-after-ms"] == "7000"
    assert len(server.requests) == 1


async def test_drop_after_raises_connection_error_mid_stream(server, client) -> None:
    server.enqueue(Reply.text("partial answer here", chunks=4, drop_after=2))
    stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    received = []
    with pytest.raises(openai.APIConnectionError):
        async for chunk in stream:
            received.append(chunk.choices[0].delta.content)
    assert len(received) == 2
    assert "partial answer here".startswith("".join(received))
    assert server.disconnects == 0  # a deliberate drop is not a client disconnect


async def test_client_close_is_counted_as_disconnect(server, client) -> None:
    server.enqueue(Reply.text("slow", chunks=50, hold_after=2))
    stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    await stream.__anext__()
    await stream.__anext__()
    await stream.close()
    await server.wait_disconnect()
    assert server.disconnects == 1


async def test_wait_disconnect_times_out(server) -> None:
    with pytest.raises(TimeoutError):
        await server.wait_disconnect(timeout=0.05)


async def test_non_streaming(server, client) -> None:
    server.enqueue(Reply.text("Hello world", chunks=3, usage=(12, 5)))
    completion = await client.chat.completions.create(model="m", messages=MESSAGES)
    assert completion.object == "chat.completion"
    assert completion.choices[0].message.content == "Hello world"
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage.total_tokens == 17

    server.enqueue(Reply.tool_calls([("c1", "f", '{"a": 1}')], split=2))
    completion = await client.chat.completions.create(model="m", messages=MESSAGES)
    message = completion.choices[0].message
    assert completion.choices[0].finish_reason == "tool_calls"
    assert message.content is None
    assert [(t.id, t.function.name, t.function.arguments) for t in message.tool_calls] == [
        ("c1", "f", '{"a": 1}')
    ]


async def test_reasoning_content_before_content(server, client) -> None:
    server.enqueue(Reply.text("thinking done", reasoning="let me think", chunks=2))
    stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    deltas = [chunk.choices[0].delta async for chunk in stream]
    reasoning = [getattr(d, "reasoning_content", None) for d in deltas]
    assert reasoning == ["let me", " think", None, None]
    assert [d.content for d in deltas] == [None, None, "thinkin", "g done"]
    assert deltas[0].role == "assistant"


async def test_default_echo_and_models(server, client) -> None:
    completion = await client.chat.completions.create(model="m", messages=MESSAGES)
    assert completion.choices[0].message.content == "echo: hi there"
    assert completion.usage.prompt_tokens > 0

    server.default = lambda body: Reply.text(f"n={len(body['messages'])}")
    stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    assert "".join([c.choices[0].delta.content async for c in stream]) == "n=2"

    models = [m.id async for m in client.models.list()]
    assert models == ["fake-model"]


def test_in_thread_with_sync_client() -> None:
    with FakeOpenAIServer.in_thread(model="thread-model") as server:
        server.enqueue(Reply.text("from a thread", chunks=3))
        with openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0) as client:
            stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
            chunks = list(stream)
            assert "".join(c.choices[0].delta.content for c in chunks) == "from a thread"
            assert chunks[0].model == "thread-model"

            completion = client.chat.completions.create(model="m", messages=MESSAGES)
            assert completion.choices[0].message.content == "echo: hi there"

            server.enqueue(Reply.text("slow", chunks=50, hold_after=2))
            stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
            next(stream)
            stream.close()
            server.wait_disconnect_sync()
        assert len(server.requests) == 3
        assert server.disconnects == 1


def test_cli_serves_echo_and_exits_on_sigterm() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentik.core.testing.openai_server", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        base_url = proc.stdout.readline().strip()
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
        with openai.OpenAI(base_url=base_url, api_key="x", max_retries=0) as client:
            completion = client.chat.completions.create(model="m", messages=MESSAGES)
        assert completion.choices[0].message.content == "echo: hi there"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
