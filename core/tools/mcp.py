"""Tools from MCP servers (Model Context Protocol, ``mcp`` SDK 2.x).

Each configured server is one long-lived :class:`mcp.client.session.ClientSession`
owned by its own task: that task enters the transport (``stdio_client`` or
``streamable_http_client``) and the session, and exits them again, so anyio
cancel scopes are entered and left in the same task.  Other tasks only await
session methods (requests travel over memory streams, which is safe from any
task)::

    toolset = MCPToolset([
        MCPServerConfig(name="calc", command="python", args=("server.py",)),
        MCPServerConfig(name="web", url="http://127.0.0.1:8000/mcp", bearer_token="..."),
    ])
    await toolset.start()
    agent = Agent(llm=..., tools=toolset.tools())
    ...
    await toolset.aclose()

Tools are named ``<server>__<tool>``.  When a server process dies (or an HTTP
session ends) the call in flight fails with a :class:`ToolError` and the
server is restarted in the background with exponential backoff; the tools
keep their names, so the next call goes to the new session.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import re
import sys
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Literal

import anyio
import mcp_types as mt

from ..errors import ToolError
from .base import Tool, ToolContext, ToolResult

__all__ = ["MCPServerConfig", "MCPTool", "MCPToolset"]

log = logging.getLogger(__name__)

#: Pages of ``tools/list`` followed at most (a server looping on cursors stops here).
MAX_LIST_PAGES = 100
#: Seconds a server may take to start (at least; ``timeout`` when longer).
STARTUP_TIMEOUT = 30.0
#: Seconds ``aclose`` waits for a server task to wind down before cancelling it.
CLOSE_TIMEOUT = 15.0

_NAME_BAD = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True, kw_only=True)
class MCPServerConfig:
    """One MCP server: a program spoken to over stdio, or a streamable HTTP URL."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] | None = None
    bearer_token: str | None = None
    allow: tuple[str, ...] | None = None
    deny: tuple[str, ...] = ()
    timeout: float = 60.0
    startup: Literal["eager", "lazy"] = "eager"
    restart_min: float = 0.5
    restart_max: float = 30.0

    def __post_init__(self) -> None:
        if not self.name or "__" in self.name or _NAME_BAD.search(self.name):
            raise ValueError(
                f"MCP server name {self.name!r}: use letters, digits, '_' or '-' (no '__')"
            )
        if (self.command is None) == (self.url is None):
            raise ValueError(f"MCP server {self.name!r}: give exactly one of command or url")
        if self.startup not in ("eager", "lazy"):
            raise ValueError(f"MCP server {self.name!r}: startup must be 'eager' or 'lazy'")
        if self.timeout <= 0 or self.restart_min <= 0 or self.restart_max < self.restart_min:
            raise ValueError(f"MCP server {self.name!r}: bad timeout or restart delays")

    def __repr__(self) -> str:
        # Never show the token, header or environment values.
        where = f"command={self.command!r}" if self.command else f"url={self.url!r}"
        return f"MCPServerConfig(name={self.name!r}, {where})"

    def offers(self, tool_name: str) -> bool:
        if any(fnmatchcase(tool_name, p) for p in self.deny):
            return False
        return self.allow is None or any(fnmatchcase(tool_name, p) for p in self.allow)


# -- the stdio process id ------------------------------------------------------------
# ``stdio_client`` does not expose its process.  Its spawn helper is wrapped once
# so the task entering ``stdio_client`` learns the process through a context
# variable (task-local: each server task sets its own list).  If the SDK renames
# the helper, pids are simply not reported.
_spawned: ContextVar[list[Any] | None] = ContextVar("agentik_mcp_spawned", default=None)


def _install_spawn_hook() -> None:
    from mcp.client import stdio as mcp_stdio

    orig = getattr(mcp_stdio, "_create_platform_compatible_process", None)
    if orig is None or getattr(orig, "_agentik_hook", False):
        return

    async def spawn(*args: Any, **kwargs: Any) -> Any:
        process = await orig(*args, **kwargs)
        sink = _spawned.get()
        if sink is not None:
            sink.append(process)
        return process

    spawn._agentik_hook = True  # type: ignore[attr-defined]
    mcp_stdio._create_platform_compatible_process = spawn


class _WatchedRead:
    """A transport read stream that reports when the connection ends."""

    def __init__(self, inner: Any, on_end: Any) -> None:
        self._inner = inner
        self._on_end = on_end

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_end()
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _WatchedRead:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _WatchedRead:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


def _errlog() -> Any:
    """Where server stderr goes: ours, if it is a real file (else the original one)."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return sys.__stderr__
    return sys.stderr


# -- results -------------------------------------------------------------------------
def _byte_count(data: str) -> int:
    try:
        return len(base64.b64decode(data, validate=False))
    except (binascii.Error, ValueError):
        return len(data) * 3 // 4


def _summarise(block: Any) -> str:
    if isinstance(block, mt.TextContent):
        return block.text
    if isinstance(block, mt.ImageContent):
        return f"[image {block.mime_type}, {_byte_count(block.data)} bytes]"
    if isinstance(block, mt.AudioContent):
        return f"[audio {block.mime_type}, {_byte_count(block.data)} bytes]"
    if isinstance(block, mt.EmbeddedResource):
        res = block.resource
        mime = res.mime_type or ("text/plain" if hasattr(res, "text") else "binary")
        return f"[resource {res.uri}: {mime}]"
    if isinstance(block, mt.ResourceLink):
        return f"[resource link {block.uri}: {block.mime_type or 'unknown type'}]"
    return f"[{getattr(block, 'type', type(block).__name__)} content]"


def result_of(result: mt.CallToolResult) -> ToolResult:
    """Map an MCP ``CallToolResult`` to a :class:`ToolResult`."""
    text = "\n".join(_summarise(b) for b in result.content)
    structured = result.structured_content
    if structured is not None:
        encoded = json.dumps(structured, ensure_ascii=False, default=str)
        try:
            already = json.loads(text) == structured
        except ValueError:
            already = encoded in text
        if not already:
            text = f"{text}\n{encoded}" if text else encoded
    return ToolResult(text=text, data=structured, is_error=bool(result.is_error))


# -- tools -----------------------------------------------------------------------------
class MCPTool:
    """One tool of one MCP server, as a :class:`~agentik.core.tools.base.Tool`."""

    def __init__(self, server: _Server, remote: mt.Tool) -> None:
        self.server = server
        self.remote_name = remote.name
        self.name = f"{server.cfg.name}__{_NAME_BAD.sub('_', remote.name)}"
        self.update(remote)

    def update(self, remote: mt.Tool) -> None:
        self.description = remote.description or remote.title or ""
        schema = dict(remote.input_schema or {})
        schema.setdefault("type", "object")
        if schema.get("type") == "object":
            schema.setdefault("properties", {})
        self.parameters: dict[str, Any] = schema

    def __repr__(self) -> str:
        return f"MCPTool({self.name!r})"

    async def call(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        return await self.server.call(self.remote_name, arguments)


# -- one server ------------------------------------------------------------------------
class _Server:
    def __init__(self, cfg: MCPServerConfig) -> None:
        self.cfg = cfg
        self.state: str = "lazy" if cfg.startup == "lazy" else "starting"
        self.error: str | None = None
        self.pid: int | None = None
        self.session: Any = None
        self.tools: dict[str, MCPTool] = {}
        self.task: asyncio.Task[None] | None = None
        self.startup_timeout = max(cfg.timeout, STARTUP_TIMEOUT)
        self._process: Any = None
        self._connected = asyncio.Event()  # set while a session is usable
        self._settled = asyncio.Event()  # set once a start attempt succeeded or failed
        self._wake = asyncio.Event()
        self._closing = asyncio.Event()
        self._lost = False
        self._refresh = False

    # -- helpers ------------------------------------------------------------------
    def _scrub(self, text: str) -> str:
        secrets = [self.cfg.bearer_token or ""]
        secrets += list((self.cfg.env or {}).values())
        secrets += list((self.cfg.headers or {}).values())
        for s in secrets:
            if s and len(s) >= 4:
                text = text.replace(s, "***")
        return text

    def _describe(self, exc: BaseException) -> str:
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        msg = getattr(exc, "message", None) or str(exc)
        return self._scrub(f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__)

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.cfg.name,
            "state": self.state,
            "error": self.error,
            "tools": sorted(self.tools),
        }
        if self.cfg.command is not None:
            out["pid"] = self.pid
        return out

    def offered(self) -> list[MCPTool]:
        if self.state in ("connected", "restarting") or (self.state == "starting" and self.tools):
            return list(self.tools.values())
        return []

    # -- lifecycle -------------------------------------------------------------------
    def launch(self) -> None:
        """Start the owning task (no-op when it runs or the toolset is closed)."""
        if self._closing.is_set() or (self.task is not None and not self.task.done()):
            return
        self._settled.clear()
        self.state = "starting" if self.state != "restarting" else "restarting"
        self.task = asyncio.get_running_loop().create_task(
            self._run(), name=f"mcp-server-{self.cfg.name}"
        )

    async def wait_settled(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.startup_timeout):
                await self._settled.wait()

    async def close(self) -> None:
        self._closing.set()
        self._wake.set()
        task = self.task
        if task is not None and not task.done():
            try:
                async with asyncio.timeout(CLOSE_TIMEOUT):
                    await asyncio.shield(task)
            except TimeoutError:
                log.warning("MCP server %r did not stop in time; cancelling", self.cfg.name)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self.state = "closed"
        self.session = None
        self._connected.clear()
        self._settled.set()

    def _mark_lost(self) -> None:
        """The connection ended: the owning task restarts it (called from any task)."""
        self._lost = True
        self._connected.clear()
        if not self._closing.is_set() and self.state == "connected":
            self.state = "restarting"
        self._wake.set()

    async def _run(self) -> None:
        _spawned.set([])
        delay = self.cfg.restart_min
        ever_connected = self.state == "restarting"
        while not self._closing.is_set():
            self._lost = False
            self._refresh = False
            self._wake.clear()
            try:
                connected = await self._session_once()
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # anyio may wrap failures in groups
                if isinstance(exc, KeyboardInterrupt | SystemExit):
                    raise
                connected = False
                self.error = self._describe(exc)
            finally:
                self.session = None
                self._connected.clear()
                self.pid = None
            if self._closing.is_set():
                break
            if connected:
                ever_connected = True
                delay = self.cfg.restart_min
                log.warning("MCP server %r stopped; restarting", self.cfg.name)
            elif not ever_connected:
                self.state = "failed"
                log.error("MCP server %r failed to start: %s", self.cfg.name, self.error)
                self._settled.set()
                return
            else:
                log.warning(
                    "MCP server %r restart failed (%s); retrying in %gs",
                    self.cfg.name,
                    self.error,
                    delay,
                )
            self.state = "restarting"
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._closing.wait()
            if not connected:
                delay = min(delay * 2, self.cfg.restart_max)
        self._settled.set()

    async def _session_once(self) -> bool:
        """Connect, serve until the connection ends or close; True if it connected."""
        from mcp.client.session import ClientSession

        cfg = self.cfg
        connected = False
        async with contextlib.AsyncExitStack() as stack:
            if cfg.command is not None:
                from mcp.client.stdio import StdioServerParameters, stdio_client

                _install_spawn_hook()
                sink = _spawned.get()
                if sink is not None:
                    sink.clear()
                params = StdioServerParameters(
                    command=cfg.command, args=list(cfg.args), env=cfg.env, cwd=cfg.cwd
                )
                read, write = await stack.enter_async_context(
                    stdio_client(params, errlog=_errlog())
                )
                if sink:
                    self._process = sink[-1]
                    self.pid = getattr(self._process, "pid", None)
            else:
                from mcp.client.streamable_http import streamable_http_client
                from mcp.shared._httpx_utils import create_mcp_http_client

                headers = dict(cfg.headers or {})
                if cfg.bearer_token:
                    headers["Authorization"] = f"Bearer {cfg.bearer_token}"
                client = create_mcp_http_client(headers=headers)
                await stack.enter_async_context(client)
                assert cfg.url is not None
                read, write = await stack.enter_async_context(
                    streamable_http_client(cfg.url, http_client=client)
                )
            session = await stack.enter_async_context(
                ClientSession(
                    _WatchedRead(read, self._mark_lost),
                    write,
                    message_handler=self._on_message,
                )
            )
            async with asyncio.timeout(self.startup_timeout):
                await session.initialize()
                await self._list_tools(session)
            self.session = session
            self.state = "connected"
            self.error = None
            connected = True
            self._connected.set()
            self._settled.set()
            log.info("MCP server %r connected (%d tools offered)", cfg.name, len(self.tools))
            while not (self._closing.is_set() or self._lost):
                await self._wake.wait()
                self._wake.clear()
                if self._refresh and not (self._closing.is_set() or self._lost):
                    self._refresh = False
                    try:
                        async with asyncio.timeout(cfg.timeout):
                            await self._list_tools(session)
                    except Exception as exc:
                        log.warning(
                            "MCP server %r: could not refresh tools: %s",
                            cfg.name,
                            self._describe(exc),
                        )
            self._connected.clear()
            if self._lost and not self._closing.is_set():
                self.error = "connection lost"
        return connected

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, mt.ToolListChangedNotification):
            self._refresh = True
            self._wake.set()
        elif isinstance(message, Exception):
            log.debug("MCP server %r transport error: %s", self.cfg.name, self._describe(message))

    async def _list_tools(self, session: Any) -> None:
        listed: list[mt.Tool] = []
        cursor: str | None = None
        seen: set[str] = set()
        for _ in range(MAX_LIST_PAGES):
            params = mt.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await session.list_tools(params=params)
            listed.extend(page.tools)
            cursor = page.next_cursor
            if not cursor or cursor in seen:
                break
            seen.add(cursor)
        tools: dict[str, MCPTool] = {}
        for remote in listed:
            if not self.cfg.offers(remote.name):
                continue
            tool = self.tools.get(f"{self.cfg.name}__{_NAME_BAD.sub('_', remote.name)}")
            if tool is not None and tool.remote_name == remote.name:
                tool.update(remote)
            else:
                tool = MCPTool(self, remote)
            if tool.name in tools:
                log.warning("MCP server %r: duplicate tool name %r", self.cfg.name, tool.name)
                continue
            tools[tool.name] = tool
        self.tools = tools

    # -- calls ----------------------------------------------------------------------------
    async def _ensure_session(self) -> Any:
        name = self.cfg.name
        if self._closing.is_set():
            raise ToolError(f"MCP server {name!r} is closed")
        process = self._process
        if (
            self.session is not None
            and process is not None
            and getattr(process, "returncode", None) is not None
        ):
            self._mark_lost()  # died between calls: wait for the restart
        if self.state in ("lazy", "failed"):
            self.launch()
        if not self._connected.is_set():
            try:
                async with asyncio.timeout(self.startup_timeout):
                    while not self._connected.is_set():
                        if self.task is None or self.task.done():
                            break
                        waiter = asyncio.ensure_future(self._connected.wait())
                        done = asyncio.ensure_future(asyncio.shield(self.task))
                        pair: list[asyncio.Future[Any]] = [waiter, done]
                        try:
                            await asyncio.wait(pair, return_when=asyncio.FIRST_COMPLETED)
                        finally:
                            waiter.cancel()
                            done.cancel()
            except TimeoutError:
                pass
        session = self.session
        if session is None or not self._connected.is_set():
            why = f": {self.error}" if self.error else ""
            raise ToolError(f"MCP server {name!r} is not available ({self.state}){why}")
        return session

    async def call(self, tool_name: str, arguments: dict[str, Any]) -> ToolResult:
        from mcp.shared.exceptions import MCPError

        name, timeout = self.cfg.name, self.cfg.timeout
        session = await self._ensure_session()
        try:
            async with asyncio.timeout(timeout + 1.0):
                result = await session.call_tool(tool_name, arguments, read_timeout_seconds=timeout)
        except TimeoutError:
            raise ToolError(f"MCP server {name!r} did not answer within {timeout:g}s") from None
        except MCPError as exc:
            if exc.code == mt.REQUEST_TIMEOUT:
                raise ToolError(f"MCP server {name!r} did not answer within {timeout:g}s") from None
            if self._lost or exc.code == mt.CONNECTION_CLOSED or "terminated" in exc.message:
                if session is self.session:
                    self._mark_lost()
                raise ToolError(
                    f"MCP server {name!r} stopped: {self._scrub(exc.message)}; restarting"
                ) from None
            raise ToolError(f"MCP server {name!r}: {self._scrub(exc.message)}") from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError) as exc:
            if session is self.session:
                self._mark_lost()
            raise ToolError(
                f"MCP server {name!r} stopped: {self._describe(exc)}; restarting"
            ) from None
        if not isinstance(result, mt.CallToolResult):  # pragma: no cover - extensions only
            return ToolResult(text=str(result))
        return result_of(result)


# -- the toolset ---------------------------------------------------------------------------
class MCPToolset:
    """Tools from several MCP servers; each server is a long-lived ClientSession."""

    def __init__(self, servers: Sequence[MCPServerConfig]) -> None:
        names = [s.name for s in servers]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate MCP server names: {', '.join(dupes)}")
        self._servers = [_Server(cfg) for cfg in servers]
        self._closed = False

    def __repr__(self) -> str:
        return f"MCPToolset({[s.cfg.name for s in self._servers]!r})"

    async def start(self) -> None:
        """Connect the eager servers concurrently; a failing server is only marked failed."""
        eager = [s for s in self._servers if s.cfg.startup == "eager"]
        for s in eager:
            s.launch()
        await asyncio.gather(*(s.wait_settled() for s in eager))

    async def refresh(self) -> list[Tool]:
        """Start lazy servers, wait for every starting server to settle, return tools()."""
        for s in self._servers:
            if s.state == "lazy":
                s.launch()
        await asyncio.gather(
            *(s.wait_settled() for s in self._servers if s.state in ("starting", "restarting"))
        )
        return self.tools()

    async def aclose(self) -> None:
        """End every session; every stdio server process ends."""
        self._closed = True
        await asyncio.gather(*(s.close() for s in self._servers))

    async def __aenter__(self) -> MCPToolset:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def tools(self) -> list[Tool]:
        """Current tools of all connected servers (lazy servers start connecting now)."""
        if not self._closed:
            for s in self._servers:
                if s.state == "lazy":
                    with contextlib.suppress(RuntimeError):  # no running loop
                        s.launch()
        return [t for s in self._servers for t in s.offered()]

    def status(self) -> list[dict[str, Any]]:
        return [s.status() for s in self._servers]
