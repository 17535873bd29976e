"""A hostile remote agent: what it sends the client is capped (issue 35).

The remote is a local aiohttp server speaking just enough of the HTTP API
(docs/http-api.md) to be called as ``agent__evil``, then misbehaving on the wire:
an event over :data:`~agentik.core.client.remote.MAX_EVENT_BYTES`, a line that
never ends, an answer that never ends.  The real client (``httpx2``) reads it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web

from agentik.core import Agent, SQLiteStore
from agentik.core.agents import AgentSpec
from agentik.core.client import RemoteAgent
from agentik.core.client.remote import MAX_EVENT_BYTES
from agentik.core.errors import RemoteError
from agentik.core.testing.scripted import Reply, ScriptedModel, call

from ircservers import free_port
from rigs import eventually

CHUNK = b"x" * 65536


class Hostile:
    """The remote. ``mode``: ``huge`` (one event of twice ``cap``), ``endless`` (a
    ``data:`` line that never ends). ``sent`` counts the bytes of event data it got
    out; ``streaming`` is whether it is still writing one."""

    def __init__(self, mode: str, cap: int) -> None:
        self.mode = mode
        self.cap = cap
        self.port = free_port()
        self.connections = 0
        self.interrupts: list[Any] = []
        self.sent = 0
        self.streaming = False
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _events(self, request: web.Request) -> web.StreamResponse:
        self.connections += 1
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        started = {"kind": "turn_started", "conversation_id": "c1", "run_id": "r1", "seq": 1}
        await response.write(b"id: 1\ndata: " + json.dumps(started).encode() + b"\n\n")
        self.streaming = True
        try:
            await response.write(b"id: 2\ndata: ")
            if self.mode == "huge":
                for _ in range(2 * self.cap // len(CHUNK)):
                    await response.write(CHUNK)
                    self.sent += len(CHUNK)
                await response.write(b"\n\n")
            while True:  # endless (and after the huge event: never an end)
                await response.write(CHUNK)
                self.sent += len(CHUNK)
                await asyncio.sleep(0)
        except (ConnectionError, asyncio.CancelledError):
            pass  # the client closed the connection
        finally:
            self.streaming = False
        return response

    async def _endless_json(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        try:
            await response.write(b'{"id": "c1", "title": "')
            while True:
                await response.write(CHUNK)
                await asyncio.sleep(0)
        except (ConnectionError, asyncio.CancelledError):
            pass
        return response

    async def _status(self, request: web.Request) -> web.Response:
        return web.json_response({"agent_id": "evil"})

    async def _conversation(self, request: web.Request) -> web.Response:
        return web.json_response({"id": "c1", "title": "evil"}, status=201)

    async def _message(self, request: web.Request) -> web.Response:
        return web.json_response({"run_id": "r1", "steered": False}, status=202)

    async def _interrupt(self, request: web.Request) -> web.Response:
        self.interrupts.append(await request.json())
        return web.json_response({"stopped": True})

    async def start(self) -> Hostile:
        app = web.Application()
        app.router.add_get("/agentik/status", self._status)
        app.router.add_post("/agentik/conversations", self._conversation)
        app.router.add_get("/agentik/conversations/big", self._endless_json)
        app.router.add_get("/agentik/conversations/c1/events", self._events)
        app.router.add_post("/agentik/conversations/c1/messages", self._message)
        app.router.add_post("/agentik/conversations/c1/interrupt", self._interrupt)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


#: The cap the client tests set (the tool runs with the default, MAX_EVENT_BYTES).
CAP = 256 * 1024


@pytest.fixture
async def hostile(request) -> Any:
    mode, cap = request.param if isinstance(request.param, tuple) else (request.param, CAP)
    remote = await Hostile(mode, cap).start()
    yield remote
    await remote.stop()


@pytest.mark.parametrize("hostile", ["huge", "endless"], indirect=True)
async def test_an_event_over_the_cap_ends_the_stream_with_a_clear_error(hostile):
    async with RemoteAgent(hostile.url, max_event_bytes=CAP) as remote:
        conv = await remote.create_conversation()
        events = conv.events(after=0)
        first = await anext(events)
        assert first.kind == "turn_started"
        with pytest.raises(RemoteError, match=f"event larger than {CAP} bytes"):
            await anext(events)
        # Ended, not reconnected (the remote would send the same again).
        with pytest.raises(StopAsyncIteration):
            await anext(events)
        await events.aclose()
    await eventually(lambda: not hostile.streaming, "the remote's writes cut off")
    assert hostile.connections == 1
    # The client stopped reading at the cap (socket buffers aside), not at the end.
    assert hostile.sent < 64 * CAP


@pytest.mark.parametrize("hostile", ["huge"], indirect=True)
async def test_an_answer_that_never_ends_is_refused_at_the_cap(hostile):
    async with RemoteAgent(hostile.url, max_answer_bytes=4 * CAP) as remote:
        with pytest.raises(RemoteError, match=r"get a conversation: the answer is larger than"):
            await remote.get_conversation("big")
        # The client goes on: a good answer after the bad one.
        conv = await remote.create_conversation()
        assert conv.title == "evil"


@pytest.mark.parametrize(
    "hostile", [("huge", MAX_EVENT_BYTES), ("endless", MAX_EVENT_BYTES)], indirect=True
)
async def test_a_hostile_remote_agent_fails_its_tool_call_and_the_turn_goes_on(hostile, tmp_path):
    main = ScriptedModel()
    main.enqueue(
        Reply(tool_calls=[call("agent__evil", {"task": "hello?"}, id="c1")]), "went on without it"
    )
    agent = Agent(
        llm=main,
        store=SQLiteStore(str(tmp_path / "a.db")),
        agents={"evil": AgentSpec(url=hostile.url, description="a remote gone bad")},
        uses=("evil",),
    )
    async with agent:
        conv = await agent.create_conversation()
        sub = conv.events()
        run_id = await conv.send("go", author="alice")
        events = []
        async with asyncio.timeout(120):
            async for event in sub:
                events.append(event)
                if event.kind == "run_stream_end" and event.run_id == run_id:
                    break
        await sub.aclose()
        history = await conv.messages()
    (result,) = [e for e in events if e.kind == "tool_call_ended"]
    assert result.is_error
    assert f"event larger than {MAX_EVENT_BYTES} bytes" in result.result
    (ended,) = [e for e in events if e.kind == "turn_ended" and e.run_id == run_id]
    assert ended.text == "went on without it"
    # The remote run was told to stop; nothing of the parent's is lost.
    assert hostile.interrupts == [{"run_id": "r1"}]
    assert [(m.kind, m.content) for m in history if m.kind in ("user", "assistant")] == [
        ("user", "go"), ("assistant", "went on without it"),
    ]  # fmt: skip
    (tool_row,) = [m for m in history if m.kind == "tool_result"]
    assert tool_row.is_error and "larger than" in tool_row.content
    assert hostile.connections == 1
