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
session ends, or its server cannot be reached) the call in flight fails with a
:class:`ToolError` and the server is restarted in the background with
exponential backoff; the tools keep their names (and stay offered), so the next
call goes to the new session — or, while the server stays down, fails at once
with "MCP server X is unavailable (...); retrying".  An HTTP server that forgot
our session (404 for its ID, as after a restart) gets a new one, transparently:
the refused call is sent once more.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import os
import shutil
import sys
import sysconfig
import time
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import anyio
import httpx2
import pydantic

from ..errors import ToolError
from .base import Tool, ToolContext, ToolResult
from .mcp_config import MAX_TOOL_NAME, MCPServerConfig, tool_name, uncut_tool_name

if TYPE_CHECKING:
    import mcp_types as mt

# mcp_types (its pydantic models take ~80 ms to build) is imported where a session's
# messages are read, like the mcp SDK itself: reading the [mcp] configuration, or a bot
# with no MCP server, never imports it (docs/operations.md, "What a started bot imports").

__all__ = [
    "CommandNotFound",
    "MCPServerConfig",
    "MCPTool",
    "MCPToolset",
    "resolve_command",
    "tool_name",
]

log = logging.getLogger(__name__)

#: Pages of ``tools/list`` followed at most (a server looping on cursors stops here).
MAX_LIST_PAGES = 100
#: Seconds a server may take to start (at least; ``timeout`` when longer).
STARTUP_TIMEOUT = 30.0
#: Seconds ``aclose`` waits for a server task to wind down before cancelling it.
CLOSE_TIMEOUT = 15.0
#: Seconds between two warnings about a server's non-JSON stdout lines.
NOISE_INTERVAL = 60.0
#: Characters of an offending stdout line quoted in that warning.
NOISE_CHARS = 120


# -- finding a stdio server's program ------------------------------------------------------
class CommandNotFound(Exception):
    """A stdio server's ``command`` is neither in the bot's own environment nor on PATH."""


def _own_bin_dirs() -> list[str]:
    """The bot's own ``bin/`` folders: the interpreter's (a venv's ``bin``, not
    resolved through its symlink) and the install scheme's scripts folder."""
    dirs: list[str] = []
    for d in (os.path.dirname(sys.executable), sysconfig.get_path("scripts")):
        if d and d not in dirs:
            dirs.append(d)
    return dirs


def resolve_command(cfg: MCPServerConfig) -> str:
    """The program a stdio server runs: ``command`` as given when it names a path
    (has a slash); otherwise the first match in the bot's own ``bin/`` (its venv,
    so console scripts installed next to agentik work without an activated venv),
    then ``PATH`` (the server's ``env`` PATH if it sets one).

    Raises :class:`CommandNotFound` naming every place looked in.
    """
    command = cfg.command
    assert command is not None, "resolve_command is for stdio servers"
    if os.sep in command or (os.altsep and os.altsep in command):
        return command
    own = _own_bin_dirs()
    path = (cfg.env or {}).get("PATH", os.environ.get("PATH", os.defpath))
    places = own + [d for d in path.split(os.pathsep) if d and d not in own]
    found = shutil.which(command, path=os.pathsep.join(places))
    if found is not None:
        return found
    # The server's name comes with it wherever it is shown ("MCP server 'x' failed to
    # start: ..."); PATH's folders are listed one by one.
    searched = [d for d in path.split(os.pathsep) if d]
    raise CommandNotFound(
        f"command {command!r} not found in the bot's own environment ({', '.join(own)})"
        f" or on PATH ({', '.join(searched) or 'empty'})"
    )


# -- the stdio process id ------------------------------------------------------------
# ``stdio_client`` does not expose its process.  Its spawn helper is wrapped once
# so the task entering ``stdio_client`` learns the process through a context
# variable (task-local: each server task sets its own list).  If the SDK renames
# the helper, pids are simply not reported.
_spawned: ContextVar[list[Any] | None] = ContextVar("agentik_mcp_spawned", default=None)

#: The longest message (one JSON-RPC line) a stdio MCP server may send, in bytes.
#: A server that sends a longer one is stopped (and started again, as after a crash).
MAX_STDIO_MESSAGE = 16 * 1024 * 1024


class _Lines:
    """A stdio server's stdout, handed to the SDK a whole line (or several) at a time.

    The SDK's reader joins each chunk to what it holds of an unfinished line,
    which is quadratic on one long line: a 50 MB answer kept the event loop
    busy for minutes (every channel stalled).  Here the parts of a line are
    collected in a list and joined once; a line over ``limit`` bytes stops the
    server (its stdout then ends, the session with it) instead.
    """

    def __init__(self, inner: Any, limit: int, process: Any) -> None:
        self._inner = inner
        self._limit = limit
        self._process = process
        self._parts: list[bytes] = []
        self._size = 0
        self._raw = False  # after an overflow: the SDK drains what is left

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if self._raw:
            return bytes(await self._inner.receive(max_bytes))
        while True:
            try:
                data = bytes(await self._inner.receive(1 << 20))
            except anyio.EndOfStream:
                if not self._parts:
                    raise
                rest, self._parts, self._size = b"".join(self._parts), [], 0
                return rest
            cut = data.rfind(b"\n") + 1
            if not cut:
                self._parts.append(data)
                self._size += len(data)
                if self._size > self._limit:
                    self._overflow()
                continue
            head = b"".join([*self._parts, data[:cut]]) if self._parts else data[:cut]
            self._parts = [data[cut:]] if cut < len(data) else []
            self._size = len(data) - cut
            return head

    def _overflow(self) -> None:
        self._raw, self._parts, self._size = True, [], 0
        why = f"it sent a message over {self._limit} bytes"
        with contextlib.suppress(AttributeError):
            self._process._agentik_stopped = why
        log.warning(
            "MCP server (pid %s) sent a message over %d bytes: stopping it",
            getattr(self._process, "pid", "?"), self._limit,
        )  # fmt: skip
        with contextlib.suppress(ProcessLookupError, OSError):
            self._process.kill()
        raise ConnectionError(f"the MCP server: {why}")

    async def aclose(self) -> None:
        await self._inner.aclose()


def _install_spawn_hook() -> None:
    from mcp.client import stdio as mcp_stdio

    orig = getattr(mcp_stdio, "_create_platform_compatible_process", None)
    if orig is None or getattr(orig, "_agentik_hook", False):
        return

    async def spawn(*args: Any, **kwargs: Any) -> Any:
        process = await orig(*args, **kwargs)
        # anyio's asyncio Process keeps its stdout here; elsewhere the SDK's own
        # reader stays (no line limit).
        stdout = getattr(process, "_stdout", None)
        if stdout is not None and hasattr(stdout, "receive"):
            process._stdout = _Lines(stdout, MAX_STDIO_MESSAGE, process)
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


# -- stdout lines that are not JSON-RPC ---------------------------------------------------
# The SDK logs every such line with a full traceback (``logger.exception``) and then
# hands the parse error to the session, which passes it to our message handler; the
# traceback is dropped here and the handler logs one short, rate-limited warning
# naming the server instead.
_PARSE_FAILURE = "Failed to parse JSONRPC message from server"


class _NoParseTraceback(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != _PARSE_FAILURE


_NO_PARSE_TRACEBACK = _NoParseTraceback()


def _quiet_parse_failures() -> None:
    stdio_log = logging.getLogger("mcp.client.stdio")
    if _NO_PARSE_TRACEBACK not in stdio_log.filters:
        stdio_log.addFilter(_NO_PARSE_TRACEBACK)


def _offending_line(exc: BaseException) -> str | None:
    """The stdout line a JSON-RPC parse error was about (pydantic keeps it), or
    ``None`` when ``exc`` is no such error."""
    if not isinstance(exc, pydantic.ValidationError):
        return None
    errors = exc.errors()
    raw = errors[0].get("input") if errors else None
    if isinstance(raw, bytes):
        return raw.decode("utf-8", "replace")
    if isinstance(raw, str):
        return raw
    return json.dumps(raw, ensure_ascii=False, default=str)


# -- streamable HTTP: watching the session -------------------------------------------------
_SESSION_HEADER = "mcp-session-id"


def _session_refused(status: int, body: bytes) -> bool:
    """Whether a response to a request carrying a session ID says the session is gone.

    The MCP specification: 404 Not Found for a request with a session ID means
    the session is gone and the client MUST start a new one.  Some servers (the
    TypeScript reference servers) answer an unknown session ID with 400 and a
    message about the session instead.
    """
    if status == 404:
        return True
    if status != 400:
        return False
    text = body[:2000].decode("utf-8", "replace").lower()
    return "session" in text or "not initialized" in text


class _WatchedHTTP(httpx2.AsyncBaseTransport):
    """An ``httpx2`` transport that tells the server when its session is gone
    (404 for our session ID) or the server cannot be reached at all — and then
    does not send the session's closing DELETE to a server that cannot take it."""

    def __init__(self, inner: Any, on_gone: Any, on_unreachable: Any) -> None:
        self._inner = inner
        self._on_gone = on_gone
        self._on_unreachable = on_unreachable
        self._dead = False

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        in_session = _SESSION_HEADER in request.headers and request.method != "DELETE"
        if request.method == "DELETE" and self._dead:
            return httpx2.Response(204, request=request)
        try:
            response = await self._inner.handle_async_request(request)
        except (httpx2.NetworkError, httpx2.RemoteProtocolError):
            if in_session:
                self._dead = True
                self._on_unreachable()
            raise
        if in_session and response.status_code in (400, 404):
            body = await response.aread() if response.status_code == 400 else b""
            if _session_refused(response.status_code, body):
                self._dead = True
                self._on_gone(response.status_code)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


# -- results -------------------------------------------------------------------------
def _schema_size(schema: Any) -> int:
    """Bytes of ``schema`` as JSON (what it adds to each model request)."""
    try:
        return len(json.dumps(schema, ensure_ascii=False, separators=(",", ":")).encode())
    except (TypeError, ValueError):
        return 0


def _byte_count(data: str) -> int:
    try:
        return len(base64.b64decode(data, validate=False))
    except (binascii.Error, ValueError):
        return len(data) * 3 // 4


def _summarise(block: Any) -> str:
    import mcp_types as mt

    if isinstance(block, mt.TextContent):
        return block.text
    if isinstance(block, mt.ImageContent):
        return f"[image {block.mime_type}, {_byte_count(block.data)} bytes]"
    if isinstance(block, mt.AudioContent):
        return f"[audio {block.mime_type}, {_byte_count(block.data)} bytes]"
    if isinstance(block, mt.EmbeddedResource):
        res = block.resource
        if isinstance(res, mt.TextResourceContents):
            # The text is what the tool meant the model to read: the uri heads it
            # (the turn's result size limit cuts it like any other text).
            return f"[resource {res.uri} ({res.mime_type or 'text/plain'})]\n{res.text}"
        blob = getattr(res, "blob", "")
        mime = res.mime_type or "binary"
        return f"[resource {res.uri}: {mime}, {_byte_count(blob)} bytes]"
    if isinstance(block, mt.ResourceLink):
        return f"[resource link {block.uri}: {block.mime_type or 'unknown type'}]"
    return f"[{getattr(block, 'type', type(block).__name__)} content]"


def _is_text(block: Any) -> bool:
    import mcp_types as mt

    if isinstance(block, mt.EmbeddedResource):
        return isinstance(block.resource, mt.TextResourceContents)
    return isinstance(block, mt.TextContent)


def result_of(result: mt.CallToolResult) -> ToolResult:
    """Map an MCP ``CallToolResult`` to a :class:`ToolResult`.

    The model gets the content blocks as text.  Structured content is kept
    whole as ``data`` (for the audit log); the model gets its JSON only when
    the result has no text content — a tool that returns structured content
    SHOULD also return it serialised as text (MCP specification, "Structured
    Content"), and sending both would double every such result in the context.
    """
    text = "\n".join(_summarise(b) for b in result.content)
    structured = result.structured_content
    if structured is not None and not any(_is_text(b) for b in result.content):
        encoded = json.dumps(structured, ensure_ascii=False, default=str)
        text = f"{text}\n{encoded}" if text else encoded
    return ToolResult(text=text, data=structured, is_error=bool(result.is_error))


# -- tools -----------------------------------------------------------------------------
class MCPTool:
    """One tool of one MCP server, as a :class:`~agentik.core.tools.base.Tool`."""

    def __init__(self, server: _Server, remote: mt.Tool) -> None:
        self.server = server
        self.remote_name = remote.name
        self.name = tool_name(server.cfg.name, remote.name)
        self.update(remote)

    def update(self, remote: mt.Tool) -> None:
        description = remote.description or remote.title or ""
        cap = self.server.cfg.max_description
        #: Whether the description was cut to ``max_description``.
        self.cut = len(description) > cap
        self.description = description[: cap - 1] + "…" if self.cut else description
        schema = dict(remote.input_schema or {})
        schema.setdefault("type", "object")
        if schema.get("type") == "object":
            schema.setdefault("properties", {})
        self.parameters: dict[str, Any] = schema

    def __repr__(self) -> str:
        return f"MCPTool({self.name!r})"

    async def call(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        # The server's ``notifications/progress`` for this call become ``tool_progress`` events.
        return await self.server.call(self.remote_name, arguments, progress=context.progress)


# -- one server ------------------------------------------------------------------------
class _Server:
    def __init__(self, cfg: MCPServerConfig) -> None:
        self.cfg = cfg
        self._state = ""
        #: When ``state`` last changed (``time.time()``), for health reports.
        self.state_since = time.time()
        self.state = "lazy" if cfg.startup == "lazy" else "starting"
        self.error: str | None = None
        self.pid: int | None = None
        self.session: Any = None
        self.tools: dict[str, MCPTool] = {}
        self.task: asyncio.Task[None] | None = None
        self.startup_timeout = max(cfg.timeout, STARTUP_TIMEOUT)
        self._process: Any = None
        self._connected = asyncio.Event()  # set while a session is usable
        self._settled = asyncio.Event()  # set once a start attempt succeeded or failed
        self._failed = asyncio.Event()  # set when the latest connection attempt failed
        self._down = asyncio.Event()  # set once a session's teardown is over
        self._wake = asyncio.Event()
        self._closing = asyncio.Event()
        self._retry_now = asyncio.Event()  # a call wants a connection attempt now
        self._tick = asyncio.Event()  # replaced (and the old one set) at every outcome
        self._lost = False
        self._refresh = False
        #: Sessions are numbered; a transport reports for the session it served.
        self._generation = 0
        self._gone_generation = -1  # the server forgot this session (HTTP 404)
        self._unreachable_generation = -1  # the server could not be reached
        self._did_connect = False  # the current attempt got a session
        self._attempting = False  # a connection attempt is under way
        self._ever_connected = False
        self._trouble = False  # a loss or failure was logged since the last success
        self._trouble_level = logging.WARNING  # ... at this level
        self._said_unavailable = False  # a failed restart was logged since then
        self._noise_at: float | None = None  # last non-JSON stdout warning
        self._noise_skipped = 0
        self._cuts = ""  # what the caps left out at the last listing (warned once)

    @property
    def state(self) -> str:
        """lazy, starting, connected, restarting, failed or closed."""
        return self._state

    @state.setter
    def state(self, value: str) -> None:
        if value != self._state:
            self._state = value
            self.state_since = time.time()

    # -- helpers ------------------------------------------------------------------
    def _scrub(self, text: str) -> str:
        secrets = [self.cfg.token or ""]
        secrets += list((self.cfg.env or {}).values())
        secrets += list((self.cfg.headers or {}).values())
        for s in secrets:
            if s and len(s) >= 4:
                text = text.replace(s, "***")
        return text

    def _describe(self, exc: BaseException) -> str:
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        if isinstance(exc, CommandNotFound):
            return self._scrub(str(exc))
        msg = getattr(exc, "message", None) or str(exc)
        return self._scrub(f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__)

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.cfg.name,
            "state": self.state,
            "since": self.state_since,
            "error": self.error,
            "tools": sorted(self.tools),
        }
        if self.cfg.command is not None:
            out["pid"] = self.pid
        return out

    def offered(self) -> list[MCPTool]:
        # While a server that was up is being restarted its tools stay offered:
        # a call then gets a clear "unavailable" error rather than "unknown tool".
        if self.state in ("connected", "restarting") or (self.state == "starting" and self.tools):
            return list(self.tools.values())
        return []

    # -- lifecycle -------------------------------------------------------------------
    def launch(self) -> None:
        """Start the owning task (no-op when it runs or the toolset is closed)."""
        if self._closing.is_set() or (self.task is not None and not self.task.done()):
            return
        self._settled.clear()
        self._failed.clear()
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
        self._notify()

    def _notify(self) -> None:
        """Wake whoever waits for an attempt's outcome (see ``_ensure_session``)."""
        tick, self._tick = self._tick, asyncio.Event()
        tick.set()

    def _mark_lost(self) -> None:
        """The connection ended: the owning task restarts it (called from any task)."""
        self._lost = True
        self._connected.clear()
        if not self._closing.is_set() and self.state == "connected":
            self.state = "restarting"
        self._wake.set()

    def _session_gone(self, generation: int, status: int) -> None:
        """The HTTP server answered our session ID with "no such session"."""
        if generation != self._generation or self._gone_generation == generation:
            return
        self._gone_generation = generation
        log.info(
            "MCP server %r no longer knows our session (HTTP %d); opening a new one",
            self.cfg.name,
            status,
        )
        self._mark_lost()

    def _unreachable(self, generation: int) -> None:
        """A request of our HTTP session could not even connect: the server is down."""
        if generation != self._generation:
            return
        self._unreachable_generation = generation
        self._mark_lost()

    async def _run(self) -> None:
        _spawned.set([])
        delay = self.cfg.restart_min
        name = self.cfg.name
        if self.state == "restarting":
            self._ever_connected = True
        while not self._closing.is_set():
            self._lost = False
            self._refresh = False
            self._wake.clear()
            self._failed.clear()
            self._retry_now.clear()
            self._down = asyncio.Event()  # one per session: callers wait for theirs
            self._did_connect = False
            self._attempting = True
            self._generation += 1
            generation = self._generation
            try:
                await self._session_once(generation)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # anyio may wrap failures in groups
                if isinstance(exc, KeyboardInterrupt | SystemExit):
                    raise
                self.error = self._describe(exc)
            finally:
                self._attempting = False
                self.session = None
                self._connected.clear()
                self.pid = None
                self._down.set()
                self._notify()
            # A session that connected and then failed (an HTTP server gone away)
            # is a loss to recover from, not a failure to start.
            connected = self._did_connect
            if self._closing.is_set():
                break
            pause = delay
            if connected:
                self._ever_connected = True
                delay = self.cfg.restart_min
                pause = 0.0 if self._gone_generation == generation else delay
                if self._gone_generation != generation:
                    self._trouble, self._trouble_level = True, logging.WARNING
                    log.warning(
                        "MCP server %r stopped (%s); restarting",
                        name,
                        self.error or "connection lost",
                    )
                self.state = "restarting"
            elif self._ever_connected:
                self._failed.set()
                self.state = "restarting"
                if not self._said_unavailable:  # said once; the recovery is said too
                    self._said_unavailable = True
                    log.warning(
                        "MCP server %r is unavailable (%s); retrying with backoff (%g-%gs)",
                        name,
                        self.error,
                        self.cfg.restart_min,
                        self.cfg.restart_max,
                    )
                else:
                    log.debug("MCP server %r: still unavailable: %s", name, self.error)
                self._trouble = True
            elif self.cfg.command is not None:
                # A program that does not start is a configuration error.
                self.state = "failed"
                self._failed.set()
                log.error("MCP server %r failed to start: %s", name, self.error)
                self._settled.set()
                self._notify()
                return
            else:
                # An HTTP server may come up after us: keep trying, quietly.
                self.state = "failed"
                self._failed.set()
                if not self._trouble:
                    self._trouble_level = logging.ERROR
                    log.error(
                        "MCP server %r failed to start: %s; retrying in the background",
                        name,
                        self.error,
                    )
                else:
                    log.debug("MCP server %r: still failing: %s", name, self.error)
                self._trouble = True
                self._settled.set()
            self._notify()
            if pause:
                await self._pause(pause)
            if not connected:
                delay = min(delay * 2, self.cfg.restart_max)
        self._settled.set()
        self._notify()

    async def _pause(self, seconds: float) -> None:
        """The backoff between attempts; ends early on close or when a call asks."""
        waiters = [
            asyncio.ensure_future(self._closing.wait()),
            asyncio.ensure_future(self._retry_now.wait()),
        ]
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()

    async def _session_once(self, generation: int) -> None:
        """Connect and serve until the connection ends or close; sets ``_did_connect``."""
        from mcp.client.session import ClientSession

        cfg = self.cfg
        async with contextlib.AsyncExitStack() as stack:
            if cfg.command is not None:
                from mcp.client.stdio import StdioServerParameters, stdio_client

                _install_spawn_hook()
                _quiet_parse_failures()
                sink = _spawned.get()
                if sink is not None:
                    sink.clear()
                params = StdioServerParameters(
                    command=resolve_command(cfg), args=list(cfg.args), env=cfg.env, cwd=cfg.cwd
                )
                read, write = await stack.enter_async_context(
                    stdio_client(params, errlog=_errlog())
                )
                if sink:
                    self._process = sink[-1]
                    self.pid = getattr(self._process, "pid", None)
            else:
                from mcp.client.streamable_http import streamable_http_client
                from mcp.shared._httpx_utils import (
                    MCP_DEFAULT_SSE_READ_TIMEOUT,
                    MCP_DEFAULT_TIMEOUT,
                )

                headers = dict(cfg.headers or {})
                if cfg.token:
                    headers["Authorization"] = f"Bearer {cfg.token}"
                # What the SDK's create_mcp_http_client makes, with a transport
                # that watches for a forgotten session or an unreachable server.
                client = httpx2.AsyncClient(
                    headers=headers,
                    timeout=httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT),
                    transport=_WatchedHTTP(
                        httpx2.AsyncHTTPTransport(),
                        lambda status: self._session_gone(generation, status),
                        lambda: self._unreachable(generation),
                    ),
                )
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
            self._did_connect = True
            self._attempting = False
            self._connected.set()
            self._settled.set()
            self._notify()
            if self._trouble:
                # Said at the level the loss was: whoever saw that sees this.
                level, self._trouble_level = self._trouble_level, logging.WARNING
                self._trouble = self._said_unavailable = False
                log.log(
                    level, "mcp %s: back, %d tools", cfg.name, len(self.tools),
                    extra={"event": "mcp_restored", "server": cfg.name, "tools": len(self.tools)},
                )  # fmt: skip
            else:
                log.info(
                    "mcp %s: %d tools", cfg.name, len(self.tools),
                    extra={"event": "mcp_ready", "server": cfg.name, "tools": len(self.tools)},
                )  # fmt: skip
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

    async def _on_message(self, message: Any) -> None:
        import mcp_types as mt

        if isinstance(message, mt.ToolListChangedNotification):
            self._refresh = True
            self._wake.set()
        elif isinstance(message, Exception):
            line = _offending_line(message)
            if line is None:
                log.debug(
                    "MCP server %r transport error: %s", self.cfg.name, self._describe(message)
                )
                return
            self._noise(line)

    def _noise(self, line: str) -> None:
        """A stdout line that is not JSON-RPC: one short warning now and then."""
        now = time.monotonic()
        if self._noise_at is not None and now - self._noise_at < NOISE_INTERVAL:
            self._noise_skipped += 1
            return
        more = f" (and {self._noise_skipped} more lines)" if self._noise_skipped else ""
        self._noise_at, self._noise_skipped = now, 0
        shown = line if len(line) <= NOISE_CHARS else line[:NOISE_CHARS] + "…"
        log.warning(
            "MCP server %r wrote a line that is not JSON-RPC to stdout (ignored; servers"
            " should log to stderr)%s: %s",
            self.cfg.name,
            more,
            self._scrub(repr(shown)),
        )

    async def _list_tools(self, session: Any) -> None:
        import mcp_types as mt

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
        cfg = self.cfg
        tools: dict[str, MCPTool] = {}
        over = big = cut = renamed = 0
        for remote in listed:
            if not cfg.offers(remote.name):
                continue
            if len(tools) >= cfg.max_tools:
                over += 1
                continue
            if _schema_size(remote.input_schema) > cfg.max_schema:
                big += 1
                continue
            tool = self.tools.get(tool_name(cfg.name, remote.name))
            if tool is not None and tool.remote_name == remote.name:
                tool.update(remote)
            else:
                tool = MCPTool(self, remote)
            if tool.name in tools:
                log.warning("MCP server %r: duplicate tool name %r", cfg.name, tool.name)
                continue
            cut += tool.cut
            renamed += tool.name != uncut_tool_name(cfg.name, remote.name)
            tools[tool.name] = tool
        self.tools = tools
        cuts = []
        if over:
            cuts.append(f"{over} tool(s) past max_tools = {cfg.max_tools} left out")
        if big:
            cuts.append(f"{big} tool(s) with an input schema over max_schema = {cfg.max_schema}"
                        " bytes left out")  # fmt: skip
        if cut:
            cuts.append(f"{cut} description(s) cut to max_description = {cfg.max_description}"
                        " characters")  # fmt: skip
        if renamed:
            cuts.append(f"{renamed} name(s) over {MAX_TOOL_NAME} characters shortened")
        said = "; ".join(cuts)
        if said and said != self._cuts:
            # One warning per server (again only when what is cut changes).
            log.warning(
                "MCP server %r offers more than a model request should carry: %s (%d tools kept)",
                cfg.name, said, len(tools),
                extra={"event": "mcp_capped", "server": cfg.name, "tools": len(tools)},
            )  # fmt: skip
        self._cuts = said

    # -- calls ----------------------------------------------------------------------------
    def _unavailable(self) -> ToolError:
        why = f" ({self.error})" if self.error else ""
        return ToolError(f"MCP server {self.cfg.name!r} is unavailable{why}; retrying")

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
            # Wait for the outcome of a connection attempt that starts after this
            # call did: an attempt already under way may have begun before the
            # server came back, so its failure earns one more.
            for _ in range(2 if self._attempting else 1):
                await self._await_attempt()
                if self._connected.is_set() or self._closing.is_set():
                    break
        session = self.session
        if session is None or not self._connected.is_set():
            if self.state in ("restarting", "failed") and self.task and not self.task.done():
                raise self._unavailable()
            why = f": {self.error}" if self.error else ""
            raise ToolError(f"MCP server {name!r} is not available ({self.state}){why}")
        return session

    async def _await_attempt(self) -> None:
        """Wait for the outcome of the next connection attempt (``startup_timeout``
        at most).  When the last one failed and the server waits out its backoff,
        ask for one now (a burst of calls shares it)."""
        target = self._generation
        if self._failed.is_set() and self.task is not None and not self.task.done():
            target += 1
            self._retry_now.set()

        def settled() -> bool:
            return (
                self._connected.is_set()
                or (self._failed.is_set() and self._generation >= target)
                or self._closing.is_set()
                or self.task is None
                or self.task.done()
            )

        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.startup_timeout):
                while not settled():
                    await self._tick.wait()

    async def call(
        self, tool_name: str, arguments: dict[str, Any], *, progress: Progress | None = None
    ) -> ToolResult:
        try:
            return await self._call_once(tool_name, arguments, progress)
        except _SessionGone:
            # The server forgot our session (it restarted): the request was
            # refused, not run, so it goes once more over a new session.
            try:
                return await self._call_once(tool_name, arguments, progress)
            except _SessionGone:
                raise ToolError(
                    f"MCP server {self.cfg.name!r} refused our new session too; retrying"
                ) from None

    async def _call_once(
        self, tool_name: str, arguments: dict[str, Any], progress: Progress | None = None
    ) -> ToolResult:
        import mcp_types as mt
        from mcp.shared.exceptions import MCPError

        name, timeout = self.cfg.name, self.cfg.timeout
        session = await self._ensure_session()
        generation, down = self._generation, self._down
        try:
            async with asyncio.timeout(timeout + 1.0):
                result = await session.call_tool(
                    tool_name,
                    arguments,
                    read_timeout_seconds=timeout,
                    progress_callback=_progress_callback(progress),
                )
        except TimeoutError:
            raise ToolError(f"MCP server {name!r} did not answer within {timeout:g}s") from None
        except MCPError as exc:
            if self._gone_generation == generation:
                raise _SessionGone from None
            if exc.code == mt.REQUEST_TIMEOUT:
                raise ToolError(f"MCP server {name!r} did not answer within {timeout:g}s") from None
            if self._lost or exc.code == mt.CONNECTION_CLOSED or "terminated" in exc.message:
                if session is self.session:
                    self._mark_lost()
                # Stopped by us (a message over the limit): say why.
                why = getattr(self._process, "_agentik_stopped", None) or exc.message
                raise await self._stopped(generation, down, self._scrub(why)) from None
            raise ToolError(f"MCP server {name!r}: {self._scrub(exc.message)}") from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError) as exc:
            if self._gone_generation == generation:
                raise _SessionGone from None
            if session is self.session:
                self._mark_lost()
            raise await self._stopped(generation, down, self._describe(exc)) from None
        if not isinstance(result, mt.CallToolResult):  # pragma: no cover - extensions only
            return ToolResult(text=str(result))
        return result_of(result)

    async def _stopped(self, generation: int, down: asyncio.Event, why: str) -> ToolError:
        """The error for a call whose connection ended under it."""
        if self._unreachable_generation == generation:
            # The request could not even connect: the server is down.  Wait for
            # the session's teardown so the error names the real cause.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLOSE_TIMEOUT):
                    await down.wait()
            return self._unavailable()
        return ToolError(f"MCP server {self.cfg.name!r} stopped: {why}; restarting")


#: ``await progress(progress, total, message)``: a call's progress (``ToolContext.progress``).
Progress = Callable[[float, float | None, str | None], Awaitable[None]]


def _progress_callback(progress: Progress | None) -> Any:
    """The SDK's ``progress_callback`` for one call: a faulty report is logged, never fatal."""
    if progress is None:
        return None

    async def report(done: float, total: float | None, message: str | None) -> None:
        try:
            await progress(float(done), None if total is None else float(total), message)
        except Exception:
            log.exception("could not report the progress of an MCP tool call")

    return report


class _SessionGone(Exception):
    """The HTTP server answered a call with "no such session"."""


# -- the toolset ---------------------------------------------------------------------------
class MCPToolset:
    """Tools from several MCP servers; each server is a long-lived ClientSession."""

    def __init__(
        self, servers: Sequence[MCPServerConfig], *, start_wait: float | None = None
    ) -> None:
        names = [s.name for s in servers]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate MCP server names: {', '.join(dupes)}")
        self._servers = [_Server(cfg) for cfg in servers]
        self._closed = False
        #: Seconds :meth:`start` waits for the eager servers (``None``: each
        #: server's start-up timeout).  A server still starting then keeps
        #: connecting in the background; its tools are offered once it is up
        #: (:meth:`tools` is read for every turn).  The bot sets ``[mcp]
        #: start_wait`` so that one slow server cannot hold up its transports.
        self.start_wait = start_wait

    async def _wait_eager(self, eager: list[_Server]) -> None:
        waits = asyncio.gather(*(s.wait_settled() for s in eager))
        if self.start_wait is None:
            await waits
            return
        done, _ = await asyncio.wait([waits], timeout=self.start_wait)
        if not done:
            # The gather keeps running (each wait ends within its own timeout).
            waits.add_done_callback(lambda f: f.cancelled() or f.exception())
            for s in eager:
                if not s._settled.is_set():
                    log.warning(
                        "MCP server %r is still starting after %gs: going on without it;"
                        " its tools are offered once it is up",
                        s.cfg.name,
                        self.start_wait,
                    )

    def __repr__(self) -> str:
        return f"MCPToolset({[s.cfg.name for s in self._servers]!r})"

    async def start(self) -> None:
        """Connect the eager servers concurrently (waiting at most :attr:`start_wait`);
        a failing server is only marked failed."""
        eager = [s for s in self._servers if s.cfg.startup != "lazy"]
        for s in eager:
            s.launch()
        await self._wait_eager(eager)

    async def refresh(self) -> list[Tool]:
        """Start lazy servers, wait for every starting server to settle, return tools()."""
        for s in self._servers:
            if s.state == "lazy":
                s.launch()
        await asyncio.gather(
            *(s.wait_settled() for s in self._servers if s.state in ("starting", "restarting"))
        )
        return self.tools()

    async def reconfigure(
        self, servers: Sequence[MCPServerConfig]
    ) -> tuple[list[str], list[str], list[str]]:
        """Serve ``servers`` from now on: a server whose configuration is unchanged
        keeps its session; removed ones end, changed ones are restarted, new ones
        start (eager ones are waited for, like :meth:`start`).  Returns the names
        added, removed and restarted."""
        names = [s.name for s in servers]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate MCP server names: {', '.join(dupes)}")
        old = {s.cfg.name: s for s in self._servers}
        kept: list[_Server] = []
        fresh: list[_Server] = []
        added: list[str] = []
        restarted: list[str] = []
        for cfg in servers:
            server = old.pop(cfg.name, None)
            if server is not None and server.cfg == cfg:
                kept.append(server)
                continue
            (added if server is None else restarted).append(cfg.name)
            new = _Server(cfg)
            kept.append(new)
            fresh.append(new)
        ending = [*old.values(), *(s for s in self._servers if s.cfg.name in restarted)]
        # Tools of removed servers are gone from the next turn on.
        self._servers = kept
        await asyncio.gather(*(s.close() for s in ending))
        if not self._closed:
            eager = [s for s in fresh if s.cfg.startup != "lazy"]
            for s in eager:
                s.launch()
            # A reload waits for them (the transports are up already).
            await asyncio.gather(*(s.wait_settled() for s in eager))
        return added, sorted(old), restarted

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
