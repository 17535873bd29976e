"""Hostile sockets against the HTTP transport (issue 17, item 2), through uvicorn on a real
127.0.0.1 socket: idle and slow-header connections are closed at the head deadline,
oversized and overlong heads are refused, a connection cap turns extra connections away
while established clients keep working, event streams outlive all of that, and, in a
child process under a low open-files limit, file-descriptor exhaustion neither stops
the API for good nor floods the log."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import re
import resource
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from agentik.transports.http.server import ThrottledWarning
from helpers import AGENTIK

from httpserver import TOKENS, Server, running_server, sse
from rigs import eventually

ADMIN = TOKENS["ADMIN_TOKEN"]
SECURED = {"tokens": [{"name": "admin", "env": "ADMIN_TOKEN"}]}
#: Outer guard against hangs only; nothing below asserts how long anything took.
GUARD = 60


async def connect(server: Server) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    return await asyncio.open_connection(host, int(port))


async def read_to_eof(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := await asyncio.wait_for(reader.read(65536), GUARD):
            data += chunk
    return data


async def exchange(server: Server, request: bytes) -> bytes:
    """Send one raw request with ``Connection: close``; the whole answer."""
    reader, writer = await connect(server)
    try:
        writer.write(request)
        await writer.drain()
        return await read_to_eof(reader)
    finally:
        writer.close()


def status(answer: bytes) -> int:
    m = re.match(rb"HTTP/1\.1 (\d{3}) ", answer)
    assert m, answer[:200]
    return int(m.group(1))


async def trickle(writer: asyncio.StreamWriter, *, every: float = 0.1) -> int:
    """Slowloris: one header byte every ``every`` seconds, until the server hangs up."""
    sent = 0
    with contextlib.suppress(ConnectionError):
        while not writer.is_closing():
            writer.write(b"a")
            await writer.drain()
            sent += 1
            await asyncio.sleep(every)
    return sent


@pytest.fixture
async def secured(db_path) -> AsyncIterator[Server]:
    async with running_server(db_path, settings=SECURED, environ=TOKENS) as s:
        yield s


# -- the head deadline ---------------------------------------------------------------------


async def test_a_connection_that_sends_nothing_is_closed_at_the_header_timeout(db_path):
    async with running_server(db_path, settings={"header_timeout": 0.5}) as server:
        reader, writer = await connect(server)
        try:
            # Closed without a word: it never asked for anything.
            assert await read_to_eof(reader) == b""
        finally:
            writer.close()
        async with server.client() as c:
            assert (await c.get("/conversations")).status_code == 200


async def test_slowloris_is_closed_at_the_header_deadline_however_steadily_it_sends(db_path):
    async with running_server(db_path, settings={"header_timeout": 1.0}) as server:
        reader, writer = await connect(server)
        writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        # A byte every 0.1 s: if each byte pushed the deadline back, this never ended.
        slow = asyncio.ensure_future(trickle(writer))
        try:
            answer = await read_to_eof(reader)
        finally:
            writer.close()
        sent = await asyncio.wait_for(slow, GUARD)
        assert status(answer) == 408
        assert b"connection: close" in answer.lower()
        assert sent > 0


async def test_the_next_request_on_a_kept_alive_connection_has_a_head_deadline_too(db_path):
    async with running_server(db_path, settings={"header_timeout": 1.0}) as server:
        reader, writer = await connect(server)
        try:
            writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), GUARD)
            length = int(re.search(rb"content-length: (\d+)", head.lower()).group(1))
            body = await asyncio.wait_for(reader.readexactly(length), GUARD)
            assert status(head) == 200 and json.loads(body)["status"] == "ok"
            # Kept alive; the next request starts, then trickles.
            writer.write(b"GET /health HTTP/1.1\r\nX-Slow: ")
            slow = asyncio.ensure_future(trickle(writer))
            answer = await read_to_eof(reader)
        finally:
            writer.close()
        await asyncio.wait_for(slow, GUARD)
        assert status(answer) == 408


# -- head limits ---------------------------------------------------------------------------


async def test_an_oversized_request_head_gets_431_and_a_large_body_does_not(db_path):
    settings = {**SECURED, "max_header_bytes": 2048}
    async with running_server(db_path, settings=settings, environ=TOKENS) as server:
        big = "x" * 4000
        answer = await exchange(
            server,
            b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: %s\r\n"
            b"Connection: close\r\n\r\n" % big.encode(),
        )
        assert status(answer) == 431
        # A URL counts as part of the head.
        answer = await exchange(
            server, b"GET /health?%s HTTP/1.1\r\nConnection: close\r\n\r\n" % big.encode()
        )
        assert status(answer) == 431

        # The body is not part of the head: a message far larger than the head limit,
        # sent in one write with its head, is accepted (and the next request on the
        # same connection is parsed as usual).
        async with server.client(ADMIN) as c:
            conv = (await c.post("/conversations", json={"title": "big"})).json()
            r = await c.post(f"/conversations/{conv['id']}/messages", json={"content": big * 25})
            assert r.status_code == 202, r.text
            assert (await c.get(f"/conversations/{conv['id']}")).status_code == 200
            await (await server.agent.get_conversation(conv["id"])).wait_idle()
            messages = (await c.get(f"/conversations/{conv['id']}/messages")).json()
            assert big * 25 in [m["content"] for m in messages["items"]]
            # Headers up to the limit are fine.
            r = await c.get("/conversations", headers={"X-Pad": "p" * 1500})
            assert r.status_code == 200


async def test_the_default_head_limit_refuses_a_64_kib_header(server_defaults):
    answer = await exchange(
        server_defaults,
        b"GET /health HTTP/1.1\r\nX-Big: %s\r\nConnection: close\r\n\r\n" % (b"y" * 65536),
    )
    assert status(answer) == 431


@pytest.fixture
async def server_defaults(db_path) -> AsyncIterator[Server]:
    async with running_server(db_path) as s:
        yield s


async def test_too_many_header_lines_get_431(db_path):
    async with running_server(db_path, settings={"max_headers": 20}) as server:
        lines = b"".join(b"X-H%d: v\r\n" % i for i in range(30))
        answer = await exchange(
            server, b"GET /health HTTP/1.1\r\n%sConnection: close\r\n\r\n" % lines
        )
        assert status(answer) == 431
        lines = b"".join(b"X-H%d: v\r\n" % i for i in range(15))
        answer = await exchange(
            server, b"GET /health HTTP/1.1\r\n%sConnection: close\r\n\r\n" % lines
        )
        assert status(answer) == 200


async def test_a_malformed_request_gets_400_without_a_log_warning(server_defaults, caplog):
    caplog.set_level(logging.INFO)
    answer = await exchange(server_defaults, b"NOT HTTP AT ALL\r\n\r\n")
    assert status(answer) == 400
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


# -- the connection cap --------------------------------------------------------------------


async def test_extra_connections_are_turned_away_while_established_clients_keep_working(
    db_path,
):
    settings = {
        **SECURED,
        "max_connections": 4,
        # Nothing here may be reaped while the test runs, however slow the machine.
        "header_timeout": 3600,
        "keepalive_timeout": 3600,
    }
    async with running_server(db_path, settings=settings, environ=TOKENS) as server:
        pool = httpx.Limits(max_connections=1, keepalive_expiry=3600)
        async with server.client(ADMIN, limits=pool) as c:
            # An established, kept-alive client ...
            assert (await c.get("/conversations")).status_code == 200
            # ... and three idle sockets fill the cap.
            idle = [await connect(server) for _ in range(3)]
            await eventually(
                lambda: server.transport.open_connections >= 4,
                "4 connections accepted (no event for accepts)",
                wait=GUARD,
            )

            # The next connection is answered 503 at once and closed.
            reader, writer = await connect(server)
            try:
                answer = await read_to_eof(reader)
            finally:
                writer.close()
            assert status(answer) == 503
            assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "unavailable"

            # The established client is not affected.
            r = await c.post("/conversations", json={"title": "still here"})
            assert r.status_code == 201
            assert (await c.get("/conversations")).status_code == 200

            # A freed slot takes a new client again.
            idle[0][1].close()
            await eventually(
                lambda: server.transport.open_connections <= 3,
                "a connection closed (no event for closes)",
                wait=GUARD,
            )
            async with httpx.AsyncClient(base_url=server.url, timeout=GUARD) as fresh:
                assert (await fresh.get("/health")).json()["status"] == "ok"
            for _, w in idle[1:]:
                w.close()


# -- event streams are long-lived by design ------------------------------------------------


async def test_a_subscribed_event_stream_outlives_the_head_deadline(db_path):
    settings = {**SECURED, "header_timeout": 0.5, "heartbeat": 0.2, "max_connections": 8}
    async with running_server(db_path, settings=settings, environ=TOKENS) as server:
        async with server.client(ADMIN) as c:
            conv = (await c.post("/conversations", json={"title": "stream"})).json()
            path = f"/conversations/{conv['id']}"
            async with server.client(ADMIN) as follower, sse(follower, path + "/events") as ev:
                # Sockets opened after the stream, and idle, are closed at their
                # deadline: the stream's own deadline (had it one) is long past then.
                for _ in range(2):
                    reader, writer = await connect(server)
                    assert await read_to_eof(reader) == b""
                    writer.close()
                # Heartbeats still flow, and so do events.
                assert (await ev.next(comments=True)).comment == "ping"
                server.model.enqueue("still streaming")
                r = await c.post(path + "/messages", json={"content": "hello"})
                assert r.status_code == 202
                got = await ev.until("turn_ended")
                assert got[-1].data["text"] == "still streaming"


# -- the start-up line -----------------------------------------------------------------------


async def test_start_up_names_the_api_and_web_page_urls_and_no_token(db_path, caplog):
    caplog.set_level(logging.INFO, logger="agentik")
    async with running_server(db_path, settings=SECURED, environ=TOKENS) as server:
        url = server.url
    lines = [r.getMessage() for r in caplog.records if "HTTP API on" in r.getMessage()]
    assert lines == [f"transport web: HTTP API on {url}/agentik (web page {url}/)"]
    assert not any(value in caplog.text for value in TOKENS.values())


async def test_a_throttled_warning_is_one_line_now_and_one_count_per_interval(caplog):
    logger = logging.getLogger("agentik.test.throttled")
    warning = ThrottledWarning(logger, "cannot accept: %s", interval=0.2)
    try:
        for _ in range(1000):
            warning.note("EMFILE")
        lines = [r.getMessage() for r in caplog.records if r.name == logger.name]
        assert lines == ["cannot accept: EMFILE"]
        await eventually(
            lambda: len(caplog.records) >= 2,
            "two log records (the interval has no event)",
            wait=GUARD,
            interval=0.05,
        )
        lines = [r.getMessage() for r in caplog.records if r.name == logger.name]
        assert lines == [
            "cannot accept: EMFILE",
            "cannot accept: EMFILE (999 more times in the last 0.2 s)",
        ]
    finally:
        warning.close()


# -- file-descriptor exhaustion (a child process under a low limit) ------------------------

FD_LIMIT = 128
IDLE = 150
SLOW = 150


def _limit_fds() -> None:  # runs in the child, before exec
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, min(FD_LIMIT, hard)))


class Attacker:
    """Idle and slow-header sockets against one address, opened without waiting for the
    handshake (a full backlog would block a plain connect)."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address
        self.idle: list[socket.socket] = []
        self.slow: list[socket.socket] = []
        self.reconnect = True

    def _open(self) -> socket.socket:
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(self.address)
        return s

    def open(self) -> None:
        self.idle = [self._open() for _ in range(IDLE)]
        self.slow = [self._open() for _ in range(SLOW)]

    @staticmethod
    def _alive(s: socket.socket) -> bool:
        """False once the server closed or answered it, or it could not connect."""
        try:
            s.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            return True
        except OSError as exc:
            return exc.errno == errno.ENOTCONN  # still connecting
        return False

    async def run(self) -> None:
        """Every 0.2 s each slow socket sends its request line, then one header byte a
        tick; while ``reconnect`` is set, sockets the server closed are replaced."""
        started: set[socket.socket] = set()
        while True:
            for group in (self.idle, self.slow):
                for i, s in enumerate(group):
                    if self._alive(s):
                        if group is self.slow:
                            with contextlib.suppress(OSError):
                                s.send(
                                    b"a" if s in started else b"GET /health HTTP/1.1\r\nX-Slow: "
                                )
                                started.add(s)
                    elif self.reconnect:
                        started.discard(s)
                        s.close()
                        group[i] = self._open()
            await asyncio.sleep(0.2)

    def close(self) -> None:
        for s in self.idle + self.slow:
            s.close()


async def _read_lines(stream: asyncio.StreamReader, into: list[bytes]) -> None:
    while line := await stream.readline():
        into.append(line)


@pytest.mark.timeout(600)
async def test_out_of_file_descriptors_the_api_recovers_and_the_log_stays_small(
    openai_server, tmp_path
):
    token = "fd-test-token-0123456789"
    config = tmp_path / "bot.toml"
    config.write_text(
        f"""
[llm]
base_url = "{openai_server.base_url}"
model = "fake-model"
[storage]
path = "{tmp_path / "bot.db"}"
[transports.web]
type = "http"
port = 0
header_timeout = 2.0
# One attacker address must be able to reach the descriptor limit here.
max_connections_per_client = 0
tokens = [{{ name = "ops", env = "FD_TOKEN" }}]
"""
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AGENTIK_"))}
    env["FD_TOKEN"] = token
    proc = await asyncio.create_subprocess_exec(
        AGENTIK, "-v", "run", "-c", str(config), env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE, preexec_fn=_limit_fds,
    )  # fmt: skip
    assert proc.stderr is not None
    startup: list[bytes] = []
    later: list[bytes] = []
    attacker: Attacker | None = None
    drain: asyncio.Future[None] | None = None
    try:
        url = None
        while url is None:
            line = await asyncio.wait_for(proc.stderr.readline(), GUARD)
            assert line, "agentik exited: " + b"".join(startup).decode()
            startup.append(line)
            if m := re.search(rb"HTTP API on (http://127\.0\.0\.1:(\d+))/agentik", line):
                url, port = m.group(1).decode(), int(m.group(2))
        drain = asyncio.ensure_future(_read_lines(proc.stderr, later))
        # The default cap does not fit this limit, and start-up says so.
        assert b"max_connections (256) leaves fewer than" in b"".join(startup)
        limits = Path(f"/proc/{proc.pid}/limits").read_text()  # noqa: ASYNC240
        assert re.search(rf"Max open files\s+{FD_LIMIT}\s", limits), limits

        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=GUARD) as c:
            assert (await c.get("/health")).json()["status"] == "ok"

        # More idle and slow-header sockets than the child has descriptors, replaced
        # as the server closes them, until the server runs out of descriptors.
        attacker = Attacker(("127.0.0.1", port))
        attacker.open()
        attack = asyncio.ensure_future(attacker.run())
        await eventually(
            lambda: any(b"cannot accept a connection" in line for line in later),
            "the accept error logged",
            wait=GUARD,
            interval=0.1,
        )
        # Now the attacker stops replacing sockets; the ones it has stay open (the slow
        # ones keep sending).  The head deadline reaps them, and the API answers again.
        attacker.reconnect = False

        async def works() -> None:
            limits_ = httpx.Limits(max_keepalive_connections=0)
            async with httpx.AsyncClient(
                base_url=url, headers=headers, timeout=10, limits=limits_
            ) as c:
                assert (await c.get("/health")).json()["status"] == "ok"
                r = await c.post("/agentik/conversations", json={"title": "after the storm"})
                assert r.status_code == 201, r.text
                listed = (await c.get("/agentik/conversations")).json()
                assert "after the storm" in [x["title"] for x in listed["items"]]

        async with asyncio.timeout(4 * GUARD):
            while True:
                try:
                    await works()
                    break
                except httpx.TransportError:
                    await asyncio.sleep(0.5)
        attack.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await attack
    finally:
        if attacker is not None:
            attacker.close()
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), GUARD)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if drain is not None:
            await asyncio.wait_for(drain, GUARD)
    log = b"".join(later)
    assert proc.returncode == 0, log.decode(errors="replace")[-3000:]
    # What the attack cost in log: a few lines, not a traceback per failed accept.
    assert len(log) < 4096, log.decode(errors="replace")[-3000:]
    assert b"Traceback" not in log and b"out of system resource" not in log


# -- one client cannot starve the others (issue 28, item 4) --------------------------------


async def connect_from(server: Server, source: str):
    """A connection from another loopback address (another client, to the server)."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    return await asyncio.open_connection(host, int(port), local_addr=(source, 0))


async def fresh_requests(server: Server, n: int) -> list[int]:
    """``n`` rounds of /health and an authenticated API read, each on a new connection."""
    codes = []
    pool = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=server.url, timeout=GUARD, limits=pool) as c:
        for _ in range(n):
            codes.append((await c.get("/health")).status_code)
            r = await c.get("/agentik/conversations", headers={"Authorization": f"Bearer {ADMIN}"})
            codes.append(r.status_code)
    return codes


async def test_one_client_holding_idle_sockets_cannot_starve_the_others(db_path):
    settings = {
        **SECURED,
        "max_connections": 16,
        "max_connections_per_client": 4,
        # The attacker's idle sockets stay for as long as the test runs.
        "header_timeout": 3600,
        "keepalive_timeout": 3600,
    }
    async with running_server(db_path, settings=settings, environ=TOKENS) as server:
        held = [await connect_from(server, "127.0.0.2") for _ in range(4)]
        await eventually(
            lambda: server.transport.open_connections >= 4,
            "4 connections accepted (no event for accepts)",
            wait=GUARD,
        )
        # Past its cap, each new socket of that client is answered 503 and closed ...
        for _ in range(12):
            reader, writer = await connect_from(server, "127.0.0.2")
            try:
                answer = await read_to_eof(reader)
            finally:
                writer.close()
            assert status(answer) == 503
        # ... and every request of another client, /health included, is answered.
        assert await fresh_requests(server, 10) == [200] * 20
        for _, w in held:
            w.close()


async def test_a_full_server_keeps_a_reserved_slot_for_health_and_credentials(db_path):
    settings = {
        **SECURED,
        "max_connections": 4,
        "max_connections_per_client": 0,
        "reserved_connections": 1,
        # Generous for a loaded machine: a reserved request's head must arrive in it
        # (the silent socket below waits this long for its 503).
        "reserved_header_timeout": 10,
        "header_timeout": 3600,
        "keepalive_timeout": 3600,
    }
    async with running_server(db_path, settings=settings, environ=TOKENS) as server:
        # Idle sockets of one client fill the cap.
        held = [await connect_from(server, "127.0.0.2") for _ in range(4)]
        await eventually(
            lambda: server.transport.open_connections >= 4,
            "4 connections accepted (no event for accepts)",
            wait=GUARD,
        )
        # Health checks and requests with a token still get through, one per connection.
        assert await fresh_requests(server, 5) == [200] * 10
        # A request without credentials in the reserved slot is the cap's 503 ...
        answer = await exchange(
            server, b"GET /agentik/conversations HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        )
        assert status(answer) == 503
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "unavailable"
        # ... and so is a socket that sends nothing there: it cannot hold the reserve.
        reader, writer = await connect(server)
        try:
            assert status(await read_to_eof(reader)) == 503
        finally:
            writer.close()
        assert await fresh_requests(server, 1) == [200, 200]
        for _, w in held:
            w.close()
