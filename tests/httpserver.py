"""A running HTTP transport for the tests: a real agent, a real SQLite file,
uvicorn on a random 127.0.0.1 port, and an SSE reader for httpx."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from agentik.bot.bridge import Bridge, ChannelOptions
from agentik.core import Agent, SQLiteStore
from agentik.core.access import AccessPolicy, AccessSettings
from agentik.core.memory import MemoryBackend
from agentik.core.store.base import Store
from agentik.core.testing.scripted import ScriptedModel
from agentik.transports.http.transport import HttpTransport

#: Token values used by the tests (long enough for the transport's minimum).
TOKENS = {
    "ADMIN_TOKEN": "admin-0123456789abcdef",
    "ALICE_TOKEN": "alice-0123456789abcdef",
    "CAROL_TOKEN": "carol-0123456789abcdef",
}


def admins(*tokens: str) -> AccessPolicy:
    """An ``[access]`` policy where the ``web`` transport's ``tokens`` rank as admin."""
    return AccessPolicy(
        AccessSettings(admins=tuple(f"web:token:{t}" for t in tokens)), {"web": "http"}
    )


@dataclass
class Server:
    """One HTTP transport serving one agent."""

    agent: Agent
    model: ScriptedModel
    transport: HttpTransport
    bridge: Bridge

    @property
    def url(self) -> str:
        assert self.transport.url is not None
        return self.transport.url

    @property
    def api(self) -> str:
        return self.url + self.transport.options.prefix

    def client(self, token: str | None = None, **kwargs: Any) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.AsyncClient(base_url=self.api, headers=headers, timeout=60, **kwargs)


@contextlib.asynccontextmanager
async def running_server(
    db_path: str,
    *,
    settings: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
    model: ScriptedModel | None = None,
    options: ChannelOptions | None = None,
    access: AccessPolicy | None = None,
    memory: Callable[[SQLiteStore], MemoryBackend] | None = None,
    store: Store | None = None,
    **agent_kwargs: Any,
) -> AsyncIterator[Server]:
    """Start an agent and its HTTP transport on a free port; close both after.

    ``access``: the bridge's ``[access]`` policy (the transport is named ``web``);
    ``memory``: makes the agent's memory backend from its store; ``store``: the store
    (default: a SQLite file at ``db_path``)."""
    model = model or ScriptedModel()
    if store is None:
        sqlite = store = SQLiteStore(db_path)
        if memory is not None:
            agent_kwargs["memory"] = memory(sqlite)
    agent = Agent(llm=model, store=store, **agent_kwargs)
    await agent.start()
    bridge = Bridge(agent, access=access)
    transport = HttpTransport(
        name="web", settings={"port": 0, **(settings or {})}, environ=environ or {}
    )
    bridge.attach(transport, options)
    try:
        await transport.start(bridge)
        try:
            yield Server(agent=agent, model=model, transport=transport, bridge=bridge)
        finally:
            await transport.aclose()
    finally:
        await bridge.aclose()
        await agent.aclose()


@dataclass
class SSEMessage:
    id: int | None
    data: dict[str, Any] | None
    comment: str | None = None

    @property
    def kind(self) -> str | None:
        return self.data["kind"] if self.data else None


@dataclass
class SSEReader:
    """Parses a ``text/event-stream`` response line by line (as EventSource does)."""

    response: httpx.Response
    _lines: AsyncIterator[str] | None = None
    retry: int | None = None
    messages: list[SSEMessage] = field(default_factory=list)

    async def next(self, *, comments: bool = False, timeout: float = 60.0) -> SSEMessage:  # noqa: ASYNC109
        return await asyncio.wait_for(self._next(comments), timeout)

    async def _next(self, comments: bool) -> SSEMessage:
        if self._lines is None:
            self._lines = self.response.aiter_lines()
        event_id: int | None = None
        data: list[str] = []
        async for line in self._lines:
            if line == "":
                if data:
                    msg = SSEMessage(event_id, json.loads("\n".join(data)))
                    self.messages.append(msg)
                    return msg
                continue
            if line.startswith(":"):
                if comments:
                    return SSEMessage(None, None, line[1:].strip())
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "id":
                event_id = int(value)
            elif name == "data":
                data.append(value)
            elif name == "retry":
                self.retry = int(value)
        raise EOFError("the event stream ended")

    async def until(self, kind: str, *, timeout: float = 60.0) -> list[SSEMessage]:  # noqa: ASYNC109
        """Messages up to and including the first of ``kind``."""
        got: list[SSEMessage] = []
        while True:
            msg = await self.next(timeout=timeout)
            got.append(msg)
            if msg.kind == kind:
                return got

    async def rest(self, *, timeout: float = 60.0) -> list[SSEMessage]:  # noqa: ASYNC109
        """Every message until the server ends the stream."""
        got: list[SSEMessage] = []
        with contextlib.suppress(EOFError):
            while True:
                got.append(await self.next(timeout=timeout))
        return got


@contextlib.asynccontextmanager
async def sse(client: httpx.AsyncClient, path: str, **kwargs: Any) -> AsyncIterator[SSEReader]:
    """Open an event stream; yields a reader once the headers have arrived."""
    async with client.stream("GET", path, **kwargs) as response:
        assert response.status_code == 200, response.status_code
        assert response.headers["content-type"].startswith("text/event-stream")
        yield SSEReader(response)


class ThreadedServer:
    """The same server on its own event loop in a thread, for synchronous
    clients (schemathesis, browsers driven from sync code)."""

    def __init__(self, db_path: str, **kwargs: Any) -> None:
        self.db_path = db_path
        self.kwargs = kwargs
        self.server: Server | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="http-test-server", daemon=True)

    def _main(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            async with running_server(self.db_path, **self.kwargs) as server:
                self.server = server
                self._ready.set()
                await self._stop.wait()
        except BaseException as exc:
            self._error = exc
            self._ready.set()

    def __enter__(self) -> Server:
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error
        assert self.server is not None
        return self.server

    def __exit__(self, *exc: object) -> None:
        assert self.loop is not None and self._stop is not None
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


@contextlib.contextmanager
def threaded_server(db_path: str, **kwargs: Any) -> Iterator[Server]:
    with ThreadedServer(db_path, **kwargs) as server:
        yield server
