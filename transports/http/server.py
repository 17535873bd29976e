"""Serving the HTTP API: uvicorn, plus the limits a socket open to hostile clients needs.

uvicorn gives us HTTP/1.1 (through httptools), keep-alive and graceful shutdown.  What
it does not give a server that anyone may connect to:

* **No deadline for the request head.**  ``timeout_keep_alive`` only starts once a
  response is complete, so a socket that connects and sends nothing, or trickles one
  header byte a second (slowloris), is kept open forever.
* **No useful connection cap.**  ``limit_concurrency`` answers 503 only after a
  complete request head, and counts every open connection: idle sockets still hold
  their descriptors, and clients that were already connected get 503 too.
* **No header limits with httptools.**  ``h11_max_incomplete_event_size`` exists only
  for h11 (a third more CPU per SSE event than httptools, and it answers 400);
  httptools buffers header names and values without bound.
* **An accept-error flood.**  asyncio's own accept loop
  (``BaseSelectorEventLoop._accept_connection``) does not stop at ``EMFILE``: each
  wake-up retries ``accept()`` up to ``backlog`` times, logging every failure with a
  traceback through the loop's exception handler and scheduling one more retry timer
  each time.  Under a descriptor limit that was 966,000 tracebacks (433 MB) in 45 s.

So :class:`ApiServer` serves through two pieces of our own:

:class:`GuardedHttpProtocol`
    uvicorn's httptools protocol with a **head deadline** (``header_timeout``: from
    accept, or from the first byte of the next request on a kept-alive connection, to
    the end of the request head; later bytes do not extend it; a connection that sent
    nothing is closed, one that sent part of a head gets 408 first), **head size and
    count limits** (``max_header_bytes`` over the request line and headers,
    ``max_headers``; 431), and quiet logging of malformed requests (DEBUG, so a client
    cannot fill the log).  A request whose head is complete is left alone: an event
    stream lives as long as its client keeps reading.

:class:`Listener`
    our accept loop on the listening socket, instead of ``loop.create_server``.  It
    enforces ``max_connections`` at accept time (an extra connection gets an immediate
    503 and is closed, before any protocol object exists, so established clients keep
    working), and on ``EMFILE``/``ENFILE``/``ENOBUFS``/``ENOMEM`` it stops accepting
    for a moment (50 ms doubling to 1 s, and at once when one of its connections
    closes) while waiting connections stay in the kernel's backlog; the failure is
    logged as one warning, then at most one a minute with a count
    (:class:`ThrottledWarning`).  So that one client cannot fill the cap with idle
    sockets and make everyone else's requests (and ``/health``) fail, it also caps the
    connections of one client address (``max_connections_per_client``: more get the
    same 503); and at ``max_connections`` it still takes ``reserved_connections``
    more, each for one ``/health`` or ``/ready`` check or one request carrying
    ``Authorization`` (without tokens: any one request), closed after its answer.  A
    reserved connection that sends anything else, or no complete head within
    ``reserved_header_timeout`` seconds (or ``header_timeout`` if shorter), gets the
    same 503 as a connection past the cap: so idle sockets cannot hold the reserve.

Why our own accept loop rather than a logging filter on the ``asyncio`` logger: a filter
would hide the records but not their cause (the retry loop and the growing pile of
timers keep a core busy while descriptors are short), it would be process-wide state
changed by one transport of a library, and a connection cap is best enforced at accept
time anyway.  The loop needs only ``loop.add_reader`` and the public
``loop.connect_accepted_socket``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

__all__ = [
    "ApiServer",
    "GuardedHttpProtocol",
    "Limits",
    "Listener",
    "ThrottledWarning",
    "listen_tcp",
]

log = logging.getLogger(__name__)

#: Seconds between two warnings about the same kind of refused connections.
WARN_INTERVAL = 60.0

#: Errors of one pending connection (accept(2) on Linux): skip it, take the next.  Any
#: other error (EMFILE, ENFILE, ENOBUFS, ENOMEM: out of descriptors or memory) pauses
#: accepting for a moment.
_SKIP = frozenset(
    getattr(errno, name)
    for name in (
        "ECONNABORTED", "EPROTO", "ENOPROTOOPT", "EHOSTDOWN", "ENONET", "EHOSTUNREACH",
        "EOPNOTSUPP", "ENETDOWN", "ENETUNREACH", "EPERM", "ETIMEDOUT",
    )
    if hasattr(errno, name)
)  # fmt: skip
#: Connections taken per wake-up of the listening socket (then other work gets a turn).
_ACCEPT_BATCH = 64
#: Descriptors max_connections should leave to the rest of the process.
_FD_RESERVE = 64
_BACKOFF_MIN = 0.05
_BACKOFF_MAX = 1.0

_BUSY_BODY = (
    b'{"error": {"code": "unavailable", "message": "too many open connections; try again"}}'
)
_BUSY = b"".join(
    [
        STATUS_LINE[503],
        b"content-type: application/json\r\n",
        b"content-length: %d\r\n" % len(_BUSY_BODY),
        b"retry-after: 1\r\n",
        b"connection: close\r\n\r\n",
        _BUSY_BODY,
    ]
)


@dataclass(frozen=True)
class Limits:
    """What one connection may take (the transport's settings of the same names)."""

    #: Seconds to send a complete request head (see :class:`GuardedHttpProtocol`).
    header_timeout: float = 10.0
    #: Request line plus headers, in bytes.
    max_header_bytes: int = 32768
    #: Header lines per request.
    max_headers: int = 100
    #: Connections open at once, event streams included.
    max_connections: int = 256
    #: Connections open at once from one client address (0: no per-client cap).
    max_connections_per_client: int = 64
    #: Connections past ``max_connections`` kept for health checks and requests with
    #: credentials (one request each; see :class:`Listener`).
    reserved_connections: int = 4
    #: Seconds a reserved connection gets to send its request head (at most
    #: ``header_timeout``).
    reserved_header_timeout: float = 2.0
    #: Seconds an idle kept-alive connection stays open after a response.
    keepalive_timeout: float = 30.0
    #: Connections the kernel queues until the server accepts them (the listening
    #: socket's backlog: whoever binds it passes this to ``listen``).
    backlog: int = 128

    @classmethod
    def of(cls, settings: Any) -> Limits:
        """The limits ``settings`` sets under the same names (``HttpSettings``)."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)})


def listen_tcp(host: str, port: int, backlog: int) -> socket.socket:
    """A non-blocking socket listening on ``host:port`` (the first address ``host``
    resolves to; ``SO_REUSEADDR``); OSError when that cannot be done."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class ThrottledWarning:
    """A warning logged at once, then at most once per ``interval`` with a count.

    ``note()`` reports one occurrence.  The first occurrence in a quiet period is
    logged immediately; later ones within ``interval`` seconds are only counted, and
    the count is logged when the interval ends (which starts the next one).
    """

    def __init__(self, logger: logging.Logger, message: str, *, interval: float = WARN_INTERVAL):
        self.logger = logger
        self.message = message
        self.interval = interval
        self.count = 0
        self._args: tuple[Any, ...] = ()
        self._window: asyncio.TimerHandle | None = None

    def note(self, *args: Any) -> None:
        """One occurrence; ``args`` fill ``message`` (the latest ones are reported)."""
        self._args = args
        if self._window is None:
            self.logger.warning(self.message, *args)
            self._window = asyncio.get_running_loop().call_later(self.interval, self._flush)
        else:
            self.count += 1

    def _flush(self) -> None:
        self._window = None
        if self.count:
            count, self.count = self.count, 0
            self.logger.warning(
                self.message + " (%d more times in the last %g s)",
                *self._args,
                count,
                self.interval,
            )
            self._window = asyncio.get_running_loop().call_later(self.interval, self._flush)

    def close(self) -> None:
        if self._window is not None:
            self._window.cancel()
            self._window = None


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a head deadline and head limits.

    The *head phase* of a connection runs from accept (or from the end of the previous
    request) until the parser has the whole request head.  Its deadline starts at
    accept, or at the first byte of a following request on a kept-alive connection
    (until then uvicorn's keep-alive timeout applies), and is never extended.  Bytes
    fed in the head phase are counted against ``max_header_bytes``; a chunk that holds
    the end of the head and the start of the body is fed in two parts so only the
    head counts.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        limits: Limits,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.limits = limits
        self._on_close = on_close
        #: Taken past ``max_connections``: one health check or credentialed request.
        self.reserved = False
        #: Whether a reserved connection may serve requests without credentials (the
        #: API has no tokens: nobody has any).
        self.open_api = False
        self._in_head = True
        self._head_bytes = 0
        self._header_count = 0
        self._head_deadline: asyncio.TimerHandle | None = None
        #: Set by a parser callback that refuses the request (status, reason).
        self._refusal: tuple[int, str] | None = None

    # -- connection ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_deadline()
        super().connection_lost(exc)
        if self._on_close is not None:
            self._on_close()

    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        rest: bytes | memoryview = data
        if self._in_head:
            if self._head_deadline is None:
                self._arm_head_deadline()
            room = self.limits.max_header_bytes - self._head_bytes
            if len(data) > room:
                self._head_bytes += room
                if not self._feed(memoryview(data)[:room]):
                    return
                if self._in_head:
                    self._refuse(431, "Request header fields too large.")
                    return
                rest = memoryview(data)[room:]
            else:
                self._head_bytes += len(data)
        self._feed(rest)

    def _feed(self, data: bytes | memoryview) -> bool:
        """Parse ``data``; False when the connection is done with (refused or upgraded)."""
        if self.parser is None or self.transport.is_closing():
            return False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self._refusal is not None:
                self._refuse(*self._refusal)
            else:
                log.debug("invalid HTTP request from %s", self.client)
                self.send_400_response("Invalid HTTP request received.")
            return False
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return False
        return True

    def _unsupported_upgrade_warning(self) -> None:
        # uvicorn warns twice per such request: a client could fill the log.
        log.debug("unsupported upgrade request from %s", self.client)

    # -- parser callbacks ---------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._header_count = 0
        super().on_message_begin()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self.limits.max_headers:
            self._refusal = (431, "Too many request header fields.")
            raise ValueError("too many header fields")  # stops the parser
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel_head_deadline()
        if self.reserved and not self._reserved_may_serve():
            self._refusal = (503, "")
            raise ValueError("not for a reserved connection")  # stops the parser
        super().on_headers_complete()
        if self.reserved and self.cycle is not None:
            # One request: a reserved slot is not kept alive.
            self.cycle.keep_alive = False

    def _reserved_may_serve(self) -> bool:
        try:
            path = httptools.parse_url(self.url).path
        except httptools.HttpParserInvalidURLError:
            return False
        if path in (b"/health", b"/ready"):
            return True
        return self.open_api or any(name == b"authorization" for name, _ in self.headers)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        # What follows is the next request's head.
        self._in_head = True
        self._head_bytes = 0

    # -- the head deadline --------------------------------------------------------------
    def _arm_head_deadline(self) -> None:
        self._cancel_head_deadline()
        timeout = self.limits.header_timeout
        if self.reserved:
            timeout = min(timeout, self.limits.reserved_header_timeout)
        self._head_deadline = self.loop.call_later(timeout, self._head_deadline_passed)

    def _cancel_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_deadline_passed(self) -> None:
        self._head_deadline = None
        if self.transport.is_closing():
            return
        log.debug(
            "closing connection from %s: no complete request head within %s s (%d bytes)",
            self.client,
            self.limits.header_timeout,
            self._head_bytes,
        )
        answering = self.cycle is not None and not self.cycle.response_complete
        if self.reserved and not answering:
            self._refuse(503, "")
        elif self._head_bytes and not answering:
            self._refuse(408, "Request head not received in time.")
        else:
            self.transport.close()

    def _refuse(self, status: int, message: str) -> None:
        """Answer ``status`` with a one-line text body and close the connection."""
        self._cancel_head_deadline()
        if self.transport.is_closing():
            return
        if status == 503:
            # Past the cap (a reserved connection not used as one): the Listener's answer.
            self.transport.write(_BUSY)
            self.transport.close()
            return
        body = message.encode("ascii")
        content = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            content.extend([name, b": ", value, b"\r\n"])
        content.extend(
            [
                b"content-type: text/plain; charset=utf-8\r\n",
                b"content-length: %d\r\n" % len(body),
                b"connection: close\r\n\r\n",
                body,
            ]
        )
        self.transport.write(b"".join(content))
        self.transport.close()


class Listener:
    """Our accept loop on one listening socket (see the module docstring for why).

    ``factory(listener)`` makes the protocol of each accepted connection; that
    protocol calls :meth:`connection_closed` when its connection ends.  ``count``
    says how many connections are open (uvicorn's live protocols).
    """

    def __init__(
        self,
        sock: socket.socket,
        factory: Callable[[Listener], asyncio.Protocol],
        *,
        count: Callable[[], int],
        max_connections: int,
        name: str,
        max_per_client: int = 0,
        reserved: int = 0,
    ) -> None:
        self.sock = sock
        self.factory = factory
        self.count = count
        self.max_connections = max_connections
        self.max_per_client = max_per_client
        self.reserved = reserved
        #: Open connections by client address, and the protocols (oldest first).
        self._per_client: dict[str, int] = {}
        self._live: dict[asyncio.Protocol, str] = {}
        self.loop = asyncio.get_running_loop()
        self._pending: set[asyncio.Task[None]] = set()
        self._reading = False
        self._closed = False
        self._retry: asyncio.TimerHandle | None = None
        self._backoff = _BACKOFF_MIN
        self.exhausted = ThrottledWarning(
            log,
            f"transport {name}: cannot accept a connection: %s; new connections wait in "
            "the listen backlog until descriptors are free (%d open HTTP connections; "
            "raise the open-files limit, ulimit -n, or lower max_connections)",
        )
        self.busy = ThrottledWarning(
            log,
            f"transport {name}: %d connections are open (max_connections): "
            "a new one was answered 503 and closed",
        )
        self.busy_client = ThrottledWarning(
            log,
            f"transport {name}: client %s has %d connections open "
            "(max_connections_per_client): a new one was answered 503 and closed",
        )

    @property
    def open_connections(self) -> int:
        """Open connections, counting those accepted but not yet handed to a protocol."""
        return self.count() + len(self._pending)

    def start(self) -> None:
        self.sock.setblocking(False)
        self._resume()

    def _resume(self) -> None:
        self._retry = None
        if not self._closed and not self._reading:
            self.loop.add_reader(self.sock.fileno(), self._accept)
            self._reading = True

    def _pause(self, delay: float) -> None:
        if self._reading:
            self.loop.remove_reader(self.sock.fileno())
            self._reading = False
        if self._retry is None and not self._closed:
            self._retry = self.loop.call_later(delay, self._resume)

    def connection_closed(self) -> None:
        """A connection ended: a descriptor is free, so stop waiting to accept."""
        if self._retry is not None:
            self._retry.cancel()
            self._resume()

    def _accept(self) -> None:
        for _ in range(_ACCEPT_BATCH):
            try:
                conn, addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _SKIP:
                    continue
                if self._closed:
                    return
                reason = f"{exc.strerror or exc} ({errno.errorcode.get(exc.errno or 0, '?')})"
                self.exhausted.note(reason, self.count())
                self._pause(self._backoff)
                self._backoff = min(self._backoff * 2, _BACKOFF_MAX)
                return
            self._backoff = _BACKOFF_MIN
            conn.setblocking(False)
            client = str(addr[0]) if isinstance(addr, tuple) and addr else ""
            held = self._per_client.get(client, 0)
            if self.max_per_client and held >= self.max_per_client:
                self.busy_client.note(client, held)
                self._turn_away(conn, warn=False)
                continue
            reserved = False
            if self.open_connections >= self.max_connections:
                if self.open_connections >= self.max_connections + self.reserved:
                    self._turn_away(conn)
                    continue
                reserved = True
            self._per_client[client] = held + 1
            task = self.loop.create_task(self._attach(conn, client, reserved))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    def _forget(self, proto: asyncio.Protocol) -> None:
        client = self._live.pop(proto, None)
        if client is not None:
            self._uncount(client)

    def _uncount(self, client: str) -> None:
        left = self._per_client.get(client, 0) - 1
        if left > 0:
            self._per_client[client] = left
        else:
            self._per_client.pop(client, None)

    async def _attach(self, conn: socket.socket, client: str, reserved: bool) -> None:
        made: list[asyncio.Protocol] = []

        def protocol() -> asyncio.Protocol:
            proto = self.factory(self)
            made.append(proto)
            self._live[proto] = client
            if isinstance(proto, GuardedHttpProtocol):
                proto.reserved = reserved
                closed = proto._on_close

                def on_close() -> None:
                    self._forget(proto)
                    if closed is not None:
                        closed()

                proto._on_close = on_close
            return proto

        try:
            await self.loop.connect_accepted_socket(protocol, sock=conn)
        except Exception as exc:
            log.debug("could not set up an accepted connection: %s", exc)
            conn.close()
            if made:
                self._forget(made[0])
            else:
                self._uncount(client)  # counted at accept

    def _turn_away(self, conn: socket.socket, *, warn: bool = True) -> None:
        """At the cap: a 503 for the client, and its descriptor back at once."""
        if warn:
            self.busy.note(self.open_connections)
        with contextlib.suppress(OSError):
            # Read what already arrived, so closing sends FIN (not RST) and the client
            # gets to read the answer.
            with contextlib.suppress(BlockingIOError):
                conn.recv(65536)
            conn.send(_BUSY)
        conn.close()

    def close(self) -> None:
        self._closed = True
        if self._reading:
            self.loop.remove_reader(self.sock.fileno())
            self._reading = False
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        self.exhausted.close()
        self.busy.close()
        self.busy_client.close()

    async def wait_closed(self) -> None:
        if self._pending:
            await asyncio.wait(set(self._pending))


class ApiServer(uvicorn.Server):
    """uvicorn's server as one task of our loop, serving through :class:`Listener`.

    No signal handlers (the bot owns SIGINT/SIGTERM); ``ready`` is set once it listens.
    """

    def __init__(self, config: uvicorn.Config, limits: Limits, *, name: str) -> None:
        super().__init__(config)
        self.limits = limits
        self.name = name
        self.ready = asyncio.Event()
        self.servers: list[Any] = []
        #: The API has no tokens: a reserved connection serves any one request.
        self.open_api = False

    @classmethod
    def create(cls, app: Any, limits: Limits, *, name: str, grace: int) -> ApiServer:
        """The hardened server of ASGI ``app``: ``limits``, and ``grace`` seconds for
        in-flight requests when it stops; no lifespan, access log or server header."""
        config = uvicorn.Config(
            app,
            interface="asgi3",
            loop="none",
            lifespan="off",
            # httptools (a dependency; GuardedHttpProtocol builds on its protocol): its
            # chunk writing costs a third less CPU per SSE event than h11's
            # (benchmarks/bench_http.py).
            http=GuardedHttpProtocol,
            ws="none",
            log_config=None,
            access_log=False,
            server_header=False,
            timeout_graceful_shutdown=grace,
            timeout_keep_alive=limits.keepalive_timeout,  # type: ignore[arg-type]
            backlog=limits.backlog,
        )
        return cls(config, limits, name=name)

    async def wait_started(self, serving: asyncio.Future[Any]) -> None:
        """Wait until it listens; ``serving`` is the task of :meth:`serve`.  When that
        ends first, a RuntimeError says why (the task's exception)."""
        ready = asyncio.ensure_future(self.ready.wait())
        try:
            await asyncio.wait({ready, serving}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
        if not self.ready.is_set():
            raise RuntimeError(str(serving.exception() if serving.done() else None))

    async def stop(self, serving: asyncio.Future[Any] | None) -> bool:
        """Ask the server to exit and wait for ``serving`` (its :meth:`serve` task) to end:
        the grace period plus 2 s.  ``False`` when it did not end cleanly in that time."""
        if serving is None or serving.done():
            return True
        self.should_exit = True
        try:
            await asyncio.wait_for(
                asyncio.shield(serving), (self.config.timeout_graceful_shutdown or 0) + 2
            )
        except (TimeoutError, Exception):
            return False
        return True

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def _check_descriptors(self) -> None:
        """Warn when ``max_connections`` can use up the process's open-files limit."""
        try:
            import resource
        except ImportError:  # not on POSIX
            return
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and self.limits.max_connections > soft - _FD_RESERVE:
            log.warning(
                "transport %s: max_connections (%d) leaves fewer than %d of the open-files "
                "limit (%d) to the rest of the bot: when connections use them up, new ones "
                "wait and other files may fail to open; raise ulimit -n or lower "
                "max_connections",
                self.name,
                self.limits.max_connections,
                _FD_RESERVE,
                soft,
            )

    def _protocol(
        self,
        config: uvicorn.Config,
        state: ServerState,
        loop: asyncio.AbstractEventLoop,
        listener: Listener,
    ) -> GuardedHttpProtocol:
        proto = GuardedHttpProtocol(
            config=config,
            server_state=state,
            app_state=self.lifespan.state,
            _loop=loop,
            limits=self.limits,
            on_close=listener.connection_closed,
        )
        proto.open_api = self.open_api
        return proto

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        # Replaces uvicorn's startup, whose loop.create_server we do not want (see the
        # module docstring); the rest is what it does for sockets passed in.
        if not sockets:
            raise ValueError("ApiServer serves sockets it is given")
        await self.lifespan.startup()
        self._check_descriptors()
        config = self.config
        loop = asyncio.get_running_loop()
        state = self.server_state
        for sock in sockets:
            listener = Listener(
                sock,
                lambda listener: self._protocol(config, state, loop, listener),
                count=lambda: len(state.connections),
                max_connections=self.limits.max_connections,
                name=self.name,
                max_per_client=self.limits.max_connections_per_client,
                reserved=self.limits.reserved_connections,
            )
            listener.start()
            self.servers.append(listener)
        self.started = True
        self.ready.set()
