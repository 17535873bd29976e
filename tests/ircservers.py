"""IRC test infrastructure: real IRC servers, a raw-socket client, a scripted server.

PYTEST_DONT_REWRITE (test modules import from here before pytest loads the plugin).

* :class:`IRCServerProcess` runs a real IRC server (``miniircd`` from the venv or
  ``ngircd`` from the system) on 127.0.0.1 and a free port; :func:`start_miniircd`
  and :func:`start_ngircd` build and start one. A missing server binary skips the
  test, or fails it when ``CI=true``.
* The fixtures ``miniircd``, ``ngircd`` and ``irc_server`` (parametrized over both)
  yield a started server and stop it afterwards. Use them with
  ``pytest_plugins = ["ircservers"]`` in a test module.
* :class:`IRCTestClient` is a tiny raw-socket IRC client with its own parser that
  records every line it receives (:class:`ParsedLine`, raw bytes included).
* :class:`ScriptedIRCServer` is an in-process IRC server whose replies come from a
  handler, for CAP/SASL negotiation tests; :func:`registration_handler` answers the
  common registration flow and :func:`sasl_plain` scripts SASL PLAIN.

Nothing here imports agentik but its standard-library port picker: the tests check
agentik's IRC code against it.
"""

# ruff: noqa: ASYNC109  (``timeout=`` arguments are this module's API)
from __future__ import annotations

import asyncio
import atexit
import base64
import contextlib
import inspect
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from agentik.core.testing.ports import PortBlock, worker_block

__all__ = [
    "HOST",
    "NGIRCD_OPER",
    "IRCServerProcess",
    "IRCTestClient",
    "ParsedLine",
    "ScriptedClient",
    "ScriptedIRCServer",
    "free_port",
    "irc_server",
    "miniircd",
    "missing_server",
    "ngircd",
    "parse_line",
    "registration_handler",
    "sasl_plain",
    "start_miniircd",
    "start_ngircd",
]

HOST = "127.0.0.1"
READY_TIMEOUT = 60.0  # seconds a server gets to accept connections
STOP_TIMEOUT = 5.0  # seconds between SIGTERM and SIGKILL
NGIRCD_OPER = ("testoper", "testoper-secret")  # an [Operator] block in ngircd.conf


# --------------------------------------------------------------------------- helpers


#: Ports :func:`free_port` hands out: a block of its own per xdist worker
#: (agentik/core/testing/ports.py).
_PORT_FLOOR = 20000
_PORT_BLOCK = 1500
_ports: PortBlock | None = None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now, for a server the test starts next:
    from this xdist worker's block, below the kernel's ephemeral range."""
    global _ports
    if _ports is None:
        _ports = worker_block(_PORT_FLOOR, _PORT_BLOCK)
    return _ports.take(HOST)


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def missing_server(reason: str) -> None:
    """Skip the test, or fail it under ``CI=true``: CI must run every server."""
    if _ci():
        pytest.fail(f"{reason} (CI=true: IRC test servers must be installed)", pytrace=False)
    pytest.skip(reason)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def _can_connect(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


# --------------------------------------------------------------------------- servers

_LIVE: set[IRCServerProcess] = set()


@atexit.register
def _kill_leftovers() -> None:  # a crashed test session must not leave servers behind
    for server in list(_LIVE):
        server.stop_sync(timeout=0)


class IRCServerProcess:
    """A real IRC server process listening on ``host:port``.

    ``argv`` is the full command line (the port is fixed for the object's
    lifetime, so :meth:`restart` comes back on the same port). Output goes to
    ``log_path`` (appended across restarts); failures include its tail.
    """

    def __init__(
        self,
        name: str,
        argv: list[str],
        *,
        port: int,
        log_path: Path,
        cwd: Path | None = None,
        host: str = HOST,
    ) -> None:
        self.name = name
        self.argv = argv
        self.port = port
        self.host = host
        self.log_path = log_path
        self.cwd = cwd
        self.password: str | None = None
        self.config_path: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<IRCServerProcess {self.name} {self.host}:{self.port} {state}>"

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log(self) -> str:
        """The server's output so far (for diagnosing failures)."""
        return _tail(self.log_path, 10_000)

    async def start(self) -> None:
        """Start the process and wait until it accepts TCP connections."""
        if self.running:
            raise RuntimeError(f"{self!r} is already running")
        self._spawn()
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self._reap()
                raise RuntimeError(
                    f"{self.name} exited with {code} before accepting connections on "
                    f"{self.host}:{self.port}; log {self.log_path}:\n{_tail(self.log_path)}"
                )
            if await asyncio.to_thread(_can_connect, self.host, self.port):
                if self._proc.poll() is None:  # it is ours answering, not someone else
                    return
                continue
            if time.monotonic() > deadline:
                await self.stop()
                raise RuntimeError(
                    f"{self.name} did not accept connections on {self.host}:{self.port} "
                    f"within {READY_TIMEOUT}s; log {self.log_path}:\n{_tail(self.log_path)}"
                )
            await asyncio.sleep(0.02)

    def _spawn(self) -> None:
        with self.log_path.open("ab") as log:
            log.write(f"--- {time.strftime('%H:%M:%S')} start: {self.argv}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
                start_new_session=True,  # own process group: killpg reaches helpers too
            )
        _LIVE.add(self)

    async def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM, then SIGKILL after ``timeout``; always reaps the process."""
        await asyncio.to_thread(self.stop_sync, timeout)

    def stop_sync(self, timeout: float = STOP_TIMEOUT) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)  # the whole process group
        self._reap()

    async def kill(self) -> None:
        """SIGKILL the server (a crash): connections drop, the port is freed."""
        proc = self._proc
        if proc is None:
            return
        self._signal(signal.SIGKILL)
        await asyncio.to_thread(proc.wait)
        self._reap()

    async def restart(self) -> None:
        """Start again on the same port (stopping it first if it still runs)."""
        await self.stop()
        await self.start()

    def _signal(self, sig: signal.Signals) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:  # not yet reaped: its PID is still ours
            return
        try:
            os.killpg(proc.pid, sig)  # the group we created with start_new_session
        except PermissionError:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass

    def _reap(self) -> None:
        if self._proc is not None:
            self._proc.wait()
        self._proc = None
        _LIVE.discard(self)


async def _start_with_fresh_ports(
    build: Callable[[int], IRCServerProcess], attempts: int = 3
) -> IRCServerProcess:
    """Start ``build(port)``; retry on a new port if another process raced us to it."""
    for attempt in range(attempts):
        server = build(free_port())
        try:
            await server.start()
        except RuntimeError:
            if attempt == attempts - 1:
                raise
            continue
        return server
    raise AssertionError("unreachable")


def _miniircd_argv() -> list[str]:
    script = Path(sys.executable).parent / "miniircd"
    if script.exists():
        return [str(script)]
    found = shutil.which("miniircd")
    if found:
        return [found]
    import importlib.util

    if importlib.util.find_spec("miniircd") is not None:
        return [sys.executable, "-c", "import miniircd; miniircd.main()"]
    missing_server(
        "miniircd is not installed (expected next to the Python interpreter: "
        f"{script}); run 'make test' or pip install -e '.[dev]'"
    )
    raise AssertionError("unreachable")


#: miniircd with the IRCv3 ``echo-message`` capability: offered in ``CAP LS``,
#: and a client that enabled it gets its own channel PRIVMSG/NOTICE back.
_MINIIRCD_ECHO = """
import miniircd, sys
C = miniircd.Client
def cap(self, args):
    if args and args[0] == b"LS":
        self.reply(b"CAP * LS :echo-message")
        self._Client__awaiting_cap_end = True
    elif len(args) > 1 and args[0] == b"REQ":
        if set(args[1].split()) <= {b"echo-message"}:
            self.echo_message = True
            self.reply(b"CAP * ACK :%s" % args[1])
        else:
            self.reply(b"CAP * NAK :%s" % args[1])
        self._Client__awaiting_cap_end = True
    elif args and args[0] == b"END":
        self._Client__awaiting_cap_end = False
C._Client__handle_cap_command = cap
plain = C.message_channel
def message_channel(self, channel, command, message, include_self=False):
    echo = getattr(self, "echo_message", False) and command in (b"PRIVMSG", b"NOTICE")
    plain(self, channel, command, message, include_self or echo)
C.message_channel = message_channel
sys.argv[0] = "miniircd"
miniircd.main()
"""


async def start_miniircd(
    tmp_path: Path, *, password: str | None = None, echo_message: bool = False
) -> IRCServerProcess:
    """Start miniircd (from the venv) on 127.0.0.1 and a free port.

    ``echo_message``: a miniircd that offers IRCv3 ``echo-message`` (patched
    in at start-up; plain miniircd offers no capability).
    """
    base = _miniircd_argv()
    if echo_message:
        _miniircd_argv()  # skips or fails when miniircd is missing
        base = [sys.executable, "-c", _MINIIRCD_ECHO]
    workdir = Path(tmp_path) / "miniircd"
    workdir.mkdir(parents=True, exist_ok=True)

    def build(port: int) -> IRCServerProcess:
        argv = [*base, "--listen", HOST, "--ports", str(port), "--verbose"]
        argv += ["--log-file", str(workdir / "miniircd-internal.log")]
        if password is not None:
            argv += ["--password", password]
        if os.geteuid() == 0:  # miniircd refuses to run as root unless told to
            argv += ["--setuid", "root"]
        server = IRCServerProcess(
            "miniircd", argv, port=port, log_path=workdir / "miniircd.log", cwd=workdir
        )
        server.password = password
        return server

    return await _start_with_fresh_ports(build)


def _ngircd_binary() -> str | None:
    found = shutil.which("ngircd")
    if found:
        return found
    for candidate in ("/usr/sbin/ngircd", "/usr/local/sbin/ngircd"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def _ngircd_conf(workdir: Path, port: int) -> str:
    include_dir = workdir / "conf.d"  # empty: keeps /etc/ngircd/ngircd.conf.d out
    include_dir.mkdir(exist_ok=True)
    oper_name, oper_password = NGIRCD_OPER
    # Started as root, ngircd drops to "nobody" before writing its PID file, and
    # nobody cannot write into pytest's private tmp dirs: then no PidFile (the
    # default is none; the test knows the PID anyway).
    pid_file = "" if os.geteuid() == 0 else f"PidFile = {workdir / 'ngircd.pid'}"
    return f"""\
# Written by tests/ircservers.py for one test; nothing here is read from /etc.
[Global]
    Name = irc.ngircd.test
    Info = agentik test server
    Network = AgentikTest
    AdminInfo1 = agentik tests
    AdminInfo2 = 127.0.0.1
    AdminEMail = tests@example.invalid
    Listen = {HOST}
    Ports = {port}
    MotdPhrase = agentik test server
    {pid_file}

[Limits]
    MaxConnections = 0
    MaxConnectionsIP = 0
    MaxJoins = 0
    MaxNickLength = 30
    MaxPenaltyTime = 0
    MaxListSize = 1000
    PingTimeout = 120
    PongTimeout = 60
    IdleTimeout = 0

[Options]
    PAM = no
    Ident = no
    DNS = no
    IncludeDir = {include_dir}
    OperCanUseMode = yes
    RequireAuthPing = no

[Operator]
    Name = {oper_name}
    Password = {oper_password}
"""


async def start_ngircd(tmp_path: Path) -> IRCServerProcess:
    """Start ngircd (from the system) in the foreground on 127.0.0.1 and a free port."""
    binary = _ngircd_binary()
    if binary is None:
        missing_server(
            "ngircd is not installed (looked in PATH and /usr/sbin); "
            "run 'make test' as root or: apt-get install ngircd"
        )
        raise AssertionError("unreachable")
    workdir = Path(tmp_path) / "ngircd"
    workdir.mkdir(parents=True, exist_ok=True)
    conf = workdir / "ngircd.conf"

    def build(port: int) -> IRCServerProcess:
        conf.write_text(_ngircd_conf(workdir, port))
        server = IRCServerProcess(
            "ngircd",
            [binary, "--nodaemon", "--passive", "--config", str(conf)],
            port=port,
            log_path=workdir / "ngircd.log",
            cwd=workdir,
        )
        server.config_path = conf
        return server

    try:
        return await _start_with_fresh_ports(build)
    except RuntimeError as exc:
        check = await asyncio.to_thread(
            subprocess.run,
            [binary, "--configtest", "--config", str(conf)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        raise RuntimeError(f"{exc}\nngircd --configtest:\n{check.stdout}{check.stderr}") from exc


_STARTERS: dict[str, Callable[[Path], Awaitable[IRCServerProcess]]] = {
    "miniircd": start_miniircd,
    "ngircd": start_ngircd,
}


@pytest_asyncio.fixture
async def miniircd(tmp_path: Path) -> AsyncIterator[IRCServerProcess]:
    """A started miniircd on 127.0.0.1, stopped after the test."""
    server = await start_miniircd(tmp_path)
    try:
        yield server
    finally:
        await server.stop()


@pytest_asyncio.fixture
async def ngircd(tmp_path: Path) -> AsyncIterator[IRCServerProcess]:
    """A started ngircd on 127.0.0.1, stopped after the test."""
    server = await start_ngircd(tmp_path)
    try:
        yield server
    finally:
        await server.stop()


@pytest_asyncio.fixture(params=list(_STARTERS))
async def irc_server(request: pytest.FixtureRequest, tmp_path: Path):
    """Each real IRC server in turn (``miniircd``, ``ngircd``), stopped after the test."""
    server = await _STARTERS[request.param](tmp_path)
    try:
        yield server
    finally:
        await server.stop()


# --------------------------------------------------------------------------- parsing


@dataclass(frozen=True)
class ParsedLine:
    """One IRC line. ``raw`` is the line exactly as received, without CR/LF.

    ``source`` is the prefix without ``:`` (``None`` if absent), ``nick`` its
    part before ``!``, ``command`` is upper-cased, ``params`` are the
    parameters with the trailing one's ``:`` removed and ``text`` is the last
    parameter (``""`` if there is none). ``tags`` holds IRCv3 message tags.
    """

    raw: bytes
    command: str
    params: tuple[str, ...] = ()
    source: str | None = None
    tags: dict[str, str] = field(default_factory=dict, hash=False)

    @property
    def nick(self) -> str | None:
        if self.source is None:
            return None
        return self.source.split("!", 1)[0].split("@", 1)[0]

    @property
    def text(self) -> str:
        return self.params[-1] if self.params else ""

    @property
    def target(self) -> str | None:
        """The first parameter (a PRIVMSG/NOTICE/JOIN target)."""
        return self.params[0] if self.params else None

    @property
    def line(self) -> str:
        return self.raw.decode("utf-8", "replace")

    def __str__(self) -> str:
        return self.line


_TAG_UNESCAPE = {":": ";", "s": " ", "\\": "\\", "r": "\r", "n": "\n"}


def _unescape_tag(value: str) -> str:
    out: list[str] = []
    chars = iter(value)
    for ch in chars:
        if ch == "\\":
            nxt = next(chars, "")
            out.append(_TAG_UNESCAPE.get(nxt, nxt))
        else:
            out.append(ch)
    return "".join(out)


def parse_line(raw: bytes | str) -> ParsedLine:
    """Parse one IRC line (trailing CR/LF is dropped)."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogateescape")
    raw = raw.rstrip(b"\r\n")
    rest = raw.decode("utf-8", "replace")
    tags: dict[str, str] = {}
    source = None
    if rest.startswith("@"):
        tag_part, _, rest = rest[1:].partition(" ")
        for item in tag_part.split(";"):
            if item:
                key, _, value = item.partition("=")
                tags[key] = _unescape_tag(value)
        rest = rest.lstrip(" ")
    if rest.startswith(":"):
        source, _, rest = rest[1:].partition(" ")
        rest = rest.lstrip(" ")
    params: list[str] = []
    command, _, rest = rest.partition(" ")
    while rest:
        rest = rest.lstrip(" ")
        if not rest:
            break
        if rest.startswith(":"):
            params.append(rest[1:])
            break
        param, _, rest = rest.partition(" ")
        params.append(param)
    return ParsedLine(
        raw=raw, command=command.upper(), params=tuple(params), source=source, tags=tags
    )


def _encode_line(line: str | bytes) -> bytes:
    data = line.encode("utf-8") if isinstance(line, str) else bytes(line)
    if not data.endswith(b"\n"):
        data += b"\r\n"
    return data


def _done() -> asyncio.Future[None]:
    """An already finished future: callers may ``await`` a send or not."""
    fut = asyncio.get_running_loop().create_future()
    fut.set_result(None)
    return fut


Predicate = Callable[[ParsedLine], bool]


# --------------------------------------------------------------------------- client


class IRCTestClient:
    """A minimal IRC client over a raw asyncio socket, for driving real servers.

    Every received line is appended to :attr:`received` (as :class:`ParsedLine`,
    raw bytes included). :meth:`wait_for` and :meth:`collect` return lines
    that match and have not been returned by an earlier ``wait_for``/``collect``
    (each line is handed out once), looking at lines that arrived before
    the call too; pass ``since=client.mark()`` to only consider later lines.
    PINGs are answered automatically. When the server goes away (restart,
    crash, QUIT) :attr:`closed` is resolved and waits fail fast with
    :class:`ConnectionError`.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        nick: str,
        *,
        host: str = HOST,
        port: int = 0,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.nick = nick
        self.host = host
        self.port = port
        self.received: list[ParsedLine] = []
        self.sent: list[bytes] = []
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.close_reason: str | None = None
        self._taken: set[int] = set()
        self._syncs = 0
        self._changed = asyncio.Event()
        self._task = asyncio.create_task(self._read_loop(), name=f"IRCTestClient[{nick}]")

    def __repr__(self) -> str:
        return f"<IRCTestClient {self.nick} {self.host}:{self.port}>"

    @classmethod
    async def open(
        cls, port: int, nick: str = "*", host: str = HOST, *, timeout: float = 60.0
    ) -> IRCTestClient:
        """Connect without registering: the test sends CAP/NICK/USER itself."""
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, limit=1 << 20), timeout
        )
        return cls(reader, writer, nick, host=host, port=port)

    @classmethod
    async def connect(
        cls,
        port: int,
        nick: str,
        host: str = HOST,
        *,
        user: str | None = None,
        realname: str = "agentik test client",
        password: str | None = None,
        timeout: float = 60.0,
    ) -> IRCTestClient:
        """Connect, register as ``nick`` and wait for 001 and the end of the MOTD."""
        client = await cls.open(port, nick, host, timeout=timeout)
        try:
            if password is not None:
                client.send_raw(f"PASS {password}")
            client.send_raw(f"NICK {nick}")
            client.send_raw(f"USER {user or nick} 0 * :{realname}")
            first = await client.wait_for(
                lambda m: m.command in {"001", "431", "432", "433", "436", "464", "465", "ERROR"},
                timeout,
            )
            if first.command != "001":
                raise ConnectionError(f"registration as {nick!r} failed: {first.line}")
            client.nick = first.params[0] if first.params else nick
            await client.wait_for(lambda m: m.command in {"376", "422"}, timeout)
        except BaseException:
            await client.close()
            raise
        return client

    # ----------------------------------------------------------------- sending

    def send_raw(self, line: str | bytes) -> asyncio.Future[None]:
        """Send one line (CRLF added unless it ends with LF). Awaiting is optional."""
        data = _encode_line(line)
        self.sent.append(data)
        if not self.writer.is_closing():
            self.writer.write(data)
        return _done()

    def privmsg(self, target: str, text: str) -> asyncio.Future[None]:
        return self.send_raw(f"PRIVMSG {target} :{text}")

    def notice(self, target: str, text: str) -> asyncio.Future[None]:
        return self.send_raw(f"NOTICE {target} :{text}")

    async def drain(self) -> None:
        await self.writer.drain()

    async def join(self, channel: str, key: str | None = None, timeout: float = 60.0) -> None:
        """JOIN ``channel`` and wait for the server's JOIN echo and end of NAMES."""
        since = self.mark()
        self.send_raw(f"JOIN {channel}" + (f" {key}" if key else ""))
        folded = channel.lower()
        errors = {"403", "405", "437", "471", "473", "474", "475", "476", "477"}

        def answer(m: ParsedLine) -> bool:
            if m.command == "JOIN" and _same_nick(m.nick, self.nick):
                return bool(m.params) and m.params[0].lower() == folded
            return m.command in errors and len(m.params) > 1 and m.params[1].lower() == folded

        reply = await self.wait_for(answer, timeout, since=since)
        if reply.command != "JOIN":
            raise ConnectionError(f"cannot join {channel}: {reply.line}")
        await self.wait_for(
            lambda m: m.command == "366" and len(m.params) > 1 and m.params[1].lower() == folded,
            timeout,
            since=since,
        )

    async def part(self, channel: str, reason: str = "bye", timeout: float = 60.0) -> None:
        since = self.mark()
        self.send_raw(f"PART {channel} :{reason}")
        await self.wait_for(
            lambda m: (
                m.command == "PART"
                and _same_nick(m.nick, self.nick)
                and m.params[0].lower() == channel.lower()
            ),
            timeout,
            since=since,
        )

    # ----------------------------------------------------------------- receiving

    def mark(self) -> int:
        """An index into :attr:`received`; pass as ``since=`` to skip older lines."""
        return len(self.received)

    def peek(self, predicate: Predicate, *, since: int = 0) -> ParsedLine | None:
        """A matching line not handed out yet, if one has arrived; does not wait or take it."""
        i = self._find(predicate, since)
        return None if i is None else self.received[i]

    async def sync(self, timeout: float = 60.0) -> None:
        """A barrier: PING the server and wait for its PONG.

        The server answers in order, so afterwards every reply to what this
        client sent before has arrived: "no 001 yet" or "no error" can be
        checked without sleeping.
        """
        self._syncs += 1
        token = f"sync-{self._syncs}-{id(self):x}"
        self.send_raw(f"PING :{token}")
        await self.wait_for(lambda m: m.command == "PONG" and m.text == token, timeout)

    def _find(self, predicate: Predicate, since: int) -> int | None:
        for i in range(since, len(self.received)):
            if i not in self._taken and predicate(self.received[i]):
                return i
        return None

    async def wait_for(
        self, predicate: Predicate, timeout: float = 60.0, *, since: int = 0
    ) -> ParsedLine:
        """The first line not handed out yet that matches ``predicate``."""
        return (await self.collect(predicate, 1, timeout, since=since))[0]

    async def collect(
        self, predicate: Predicate, count: int, timeout: float = 60.0, *, since: int = 0
    ) -> list[ParsedLine]:
        """``count`` matching lines not handed out yet, in order of arrival."""
        found: list[int] = []

        def scan() -> bool:
            start = found[-1] + 1 if found else since
            while len(found) < count:
                i = self._find(predicate, start)
                if i is None:
                    return False
                found.append(i)
                start = i + 1
            return True

        try:
            async with asyncio.timeout(timeout):
                while not scan():
                    if self.closed.done():
                        raise ConnectionError(
                            f"{self!r}: connection closed ({self.close_reason}) "
                            f"with {len(found)}/{count} matching lines; "
                            f"last received:\n{self._recent()}"
                        )
                    await self._changed.wait()
        except TimeoutError:
            raise TimeoutError(
                f"{self!r}: {len(found)}/{count} matching lines after {timeout}s; "
                f"last received:\n{self._recent()}"
            ) from None
        self._taken.update(found)
        return [self.received[i] for i in found]

    def _recent(self, n: int = 25) -> str:
        return "\n".join(f"  {m.line}" for m in self.received[-n:]) or "  (nothing)"

    async def _read_loop(self) -> None:
        reason = "EOF"
        try:
            while True:
                try:
                    data = await self.reader.readuntil(b"\n")
                except asyncio.IncompleteReadError as exc:
                    if exc.partial.strip():
                        self._deliver(exc.partial)
                    break
                except asyncio.LimitOverrunError:
                    reason = "line too long"
                    break
                if data.strip(b"\r\n"):
                    self._deliver(data)
        except (ConnectionError, OSError) as exc:
            reason = f"{type(exc).__name__}: {exc}"
        except asyncio.CancelledError:
            reason = "closed by test"
            raise
        finally:
            self.close_reason = reason
            if not self.closed.done():
                self.closed.set_result(None)
            self.writer.close()
            self._notify()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _deliver(self, data: bytes) -> None:
        msg = parse_line(data)
        if msg.command == "PING":
            token = msg.params[-1] if msg.params else ""
            self.send_raw(f"PONG :{token}")
        elif msg.command == "NICK" and _same_nick(msg.nick, self.nick) and msg.params:
            self.nick = msg.params[0]
        self.received.append(msg)
        self._notify()

    async def wait_closed(self, timeout: float = 60.0) -> None:
        """Wait until the server closed the connection."""
        await asyncio.wait_for(asyncio.shield(self.closed), timeout)

    async def quit(self, message: str = "bye", timeout: float = 60.0) -> None:
        """QUIT and wait (bounded) for the server to close the connection."""
        if not self.closed.done():
            self.send_raw(f"QUIT :{message}")
            with contextlib.suppress(TimeoutError, ConnectionError, OSError):
                await self.wait_closed(timeout)
        await self.close()

    async def close(self) -> None:
        """Close the socket now (idempotent)."""
        if not self._task.done():
            self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()
        self._notify()

    async def __aenter__(self) -> IRCTestClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _same_nick(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and a.lower() == b.lower()


# --------------------------------------------------------------------------- scripted server

Handler = Callable[["ScriptedClient", str], Awaitable[None] | None]


class ScriptedClient:
    """One connection to a :class:`ScriptedIRCServer`, as seen by its handler."""

    def __init__(self, server: ScriptedIRCServer, writer: asyncio.StreamWriter, index: int):
        self.server = server
        self.writer = writer
        self.index = index
        self.received: list[str] = []
        self.sent: list[str] = []
        self.state: dict[str, Any] = {}  # scratch space for handlers
        self.nick: str | None = None
        self.user: str | None = None
        self.caps: set[str] = set()
        self.registered = False
        self.disconnected = asyncio.get_running_loop().create_future()

    def __repr__(self) -> str:
        return f"<ScriptedClient #{self.index} nick={self.nick!r}>"

    @property
    def prefix(self) -> str:
        return f"{self.nick or '*'}!{self.user or 'user'}@{HOST}"

    def send(self, line: str | bytes) -> asyncio.Future[None]:
        """Send one line to this client (CRLF added). Awaiting is optional."""
        data = _encode_line(line)
        self.sent.append(data.rstrip(b"\r\n").decode("utf-8", "replace"))
        if not self.writer.is_closing():
            self.writer.write(data)
        return _done()

    def reply(self, numeric: str, *params: str) -> asyncio.Future[None]:
        """``:<server> <numeric> <nick or *> <params...>`` (last param gets ``:``)."""
        args = [self.nick or "*", *params]
        if args:
            args[-1] = ":" + args[-1]
        return self.send(f":{self.server.name} {numeric} " + " ".join(args))

    def close(self) -> None:
        """Drop the connection from the server side."""
        self.writer.close()


class ScriptedIRCServer:
    """An IRC server on 127.0.0.1 whose every reply is scripted by ``handler``.

    ``handler(client, line)`` (plain or ``async``) runs for each line a client
    sends, in order; ``line`` has no CR/LF. Every line from every client is
    recorded in :attr:`received` (``received_raw`` keeps the bytes). An
    exception in the handler is re-raised when the ``async with`` block exits.
    The default handler is :func:`registration_handler()`. ``greeting`` lines are
    sent to each client as soon as it connects (as real servers send
    ``NOTICE * :*** Looking up your hostname...``).
    """

    name = "irc.scripted.test"

    def __init__(
        self,
        handler: Handler | None = None,
        *,
        host: str = HOST,
        ssl: Any = None,
        greeting: Iterable[str] = (),
    ) -> None:
        self.handler: Handler = handler or registration_handler()
        self.greeting = list(greeting)
        self.host = host
        self.ssl = ssl  # an ssl.SSLContext to serve TLS
        self.port = 0
        self.received: list[str] = []
        self.received_raw: list[bytes] = []
        self.clients: list[ScriptedClient] = []
        self.errors: list[BaseException] = []
        self._taken: set[int] = set()
        self._changed = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> ScriptedIRCServer:
        self._server = await asyncio.start_server(
            self._serve, self.host, 0, limit=1 << 20, ssl=self.ssl
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        for client in self.clients:
            client.close()
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> ScriptedIRCServer:
        return await self.start()

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        await self.stop()
        if exc_type is None and self.errors:
            raise self.errors[0]

    def broadcast(self, line: str | bytes) -> None:
        """Send ``line`` to every connected client."""
        for client in self.clients:
            client.send(line)

    async def wait_for_client(self, index: int = 0, timeout: float = 60.0) -> ScriptedClient:
        """The ``index``-th client to connect (0 = first), waiting for it."""
        async with asyncio.timeout(timeout):
            while len(self.clients) <= index:
                await self._changed.wait()
        return self.clients[index]

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def mark(self) -> int:
        """An index into :attr:`received`; pass as ``since=`` to skip older lines."""
        return len(self.received)

    async def wait_for_line(
        self,
        predicate: Callable[[str], bool] | str,
        timeout: float = 60.0,
        *,
        since: int = 0,
    ) -> str:
        """The first received line, not handed out before, matching ``predicate``.

        Lines that arrived before the call count too (pass ``since=server.mark()``
        to only look at later ones). A string predicate matches that exact line
        or a line starting with it and a space (``"CAP END"``, ``"PRIVMSG #chan"``).
        """
        if isinstance(predicate, str):
            prefix = predicate
            predicate = lambda line: line == prefix or line.startswith(prefix + " ")  # noqa: E731
        check = predicate

        def find() -> int | None:
            for i in range(since, len(self.received)):
                if i not in self._taken and check(self.received[i]):
                    return i
            return None

        try:
            async with asyncio.timeout(timeout):
                while (i := find()) is None:
                    await self._changed.wait()
        except TimeoutError:
            recent = "\n".join(f"  {line}" for line in self.received[-25:]) or "  (nothing)"
            raise TimeoutError(
                f"no matching line from clients within {timeout}s; received:\n{recent}"
            ) from None
        self._taken.add(i)
        return self.received[i]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        client = ScriptedClient(self, writer, len(self.clients))
        self.clients.append(client)
        self._notify()
        for line in self.greeting:
            client.send(line)
        try:
            while True:
                try:
                    data = await reader.readuntil(b"\n")
                except asyncio.IncompleteReadError as exc:
                    data = exc.partial
                    if not data.strip():
                        break
                raw = data.rstrip(b"\r\n")
                if not raw:
                    continue
                line = raw.decode("utf-8", "replace")
                client.received.append(line)
                self.received.append(line)
                self.received_raw.append(raw)
                self._notify()
                result = self.handler(client, line)
                if inspect.isawaitable(result):
                    await result
                if writer.is_closing():
                    break
        except (ConnectionError, OSError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # surfaced by __aexit__
            self.errors.append(exc)
        finally:
            if not client.disconnected.done():
                client.disconnected.set_result(None)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self._tasks.discard(task)


SaslHandler = Callable[[ScriptedClient, str], Awaitable[None] | None]


def _cap_name(cap: str) -> str:
    return cap.split("=", 1)[0]


def _chunks(items: list[str], size: int) -> Iterable[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def registration_handler(
    caps_offered: str = "sasl message-tags server-time",
    sasl: SaslHandler | None = None,
    isupport: str = "BOT=B LINELEN=512 NETWORK=Test",
) -> Callable[[ScriptedClient, str], Awaitable[None]]:
    """A handler for the usual registration flow, to use or to wrap.

    * ``CAP LS [302]`` -> ``CAP * LS :<caps_offered>`` (and registration waits
      for ``CAP END``); ``client.state["caps_offered"]`` (a list), when set,
      replaces ``caps_offered`` for that client (announce a change with
      ``CAP <nick> NEW :<cap>``); ``CAP REQ :a b`` -> ``CAP * ACK :a b`` if every cap is
      offered, else ``CAP * NAK :a b``; ``CAP LIST``; ``CAP END``.
    * ``NICK``/``USER`` -> 001..005 (005 carries ``isupport``) and 376 once
      both arrived and no CAP negotiation is open; ``433`` for a nick in
      ``client.state["taken_nicks"]``; NICK after registration is echoed.
    * ``AUTHENTICATE ...`` -> ``sasl(client, line)``, or 904 without ``sasl``.
    * ``PING x`` -> ``PONG``; ``JOIN #a,#b`` -> JOIN echo, 353, 366;
      ``PART`` -> echo; ``QUIT`` -> ``ERROR`` and close. Anything else is only
      recorded.

    Wrap it to script more: ``base = registration_handler()`` then, in your
    handler, ``await base(client, line)`` for the lines you don't handle.
    """
    offered = caps_offered.split()
    tokens = isupport.split()

    def try_register(client: ScriptedClient) -> None:
        if client.registered or client.state.get("cap_open") or not (client.nick and client.user):
            return
        client.registered = True
        client.reply("001", f"Welcome to the scripted test network {client.prefix}")
        client.reply("002", f"Your host is {client.server.name}, running scripted-1.0")
        client.reply("003", "This server was created for a test")
        client.send(
            f":{client.server.name} 004 {client.nick} {client.server.name} scripted-1.0 iow ntk"
        )
        for chunk in _chunks(tokens, 13) if tokens else [[]]:
            client.send(
                f":{client.server.name} 005 {client.nick} "
                + " ".join([*chunk, ":are supported by this server"])
            )
        client.reply("376", "End of /MOTD command.")

    async def handler(client: ScriptedClient, line: str) -> None:
        msg = parse_line(line)
        cmd, params = msg.command, msg.params
        if cmd == "CAP":
            sub = params[0].upper() if params else ""
            who = client.nick or "*"
            caps = client.state.get("caps_offered", offered)
            if sub == "LS":
                client.state["cap_open"] = not client.registered
                client.send(f":{client.server.name} CAP {who} LS :{' '.join(caps)}")
            elif sub == "REQ":
                if not client.registered:
                    client.state["cap_open"] = True
                wanted = params[1] if len(params) > 1 else ""
                names = [c.lstrip("-") for c in wanted.split()]
                if names and all(n in {_cap_name(c) for c in caps} for n in names):
                    for cap in wanted.split():
                        if cap.startswith("-"):
                            client.caps.discard(cap[1:])
                        else:
                            client.caps.add(cap)
                    client.send(f":{client.server.name} CAP {who} ACK :{wanted}")
                else:
                    client.send(f":{client.server.name} CAP {who} NAK :{wanted}")
            elif sub == "LIST":
                client.send(
                    f":{client.server.name} CAP {who} LIST :{' '.join(sorted(client.caps))}"
                )
            elif sub == "END":
                client.state["cap_open"] = False
                try_register(client)
            else:
                client.reply("410", sub, "Invalid CAP command")
        elif cmd == "AUTHENTICATE":
            if sasl is None:
                client.reply("904", "SASL authentication failed")
            else:
                result = sasl(client, line)
                if inspect.isawaitable(result):
                    await result
        elif cmd == "NICK" and params:
            new = params[0]
            if new.lower() in {n.lower() for n in client.state.get("taken_nicks", ())}:
                client.reply("433", new, "Nickname is already in use")
            elif client.registered:
                client.send(f":{client.prefix} NICK :{new}")
                client.nick = new
            else:
                client.nick = new
                try_register(client)
        elif cmd == "USER" and params:
            client.user = params[0]
            try_register(client)
        elif cmd == "PING":
            client.send(f":{client.server.name} PONG {client.server.name} :{msg.text}")
        elif cmd == "JOIN" and params:
            for channel in params[0].split(","):
                client.send(f":{client.prefix} JOIN {channel}")
                client.send(f":{client.server.name} 353 {client.nick} = {channel} :{client.nick}")
                client.reply("366", channel, "End of /NAMES list.")
        elif cmd == "PART" and params:
            for channel in params[0].split(","):
                client.send(f":{client.prefix} PART {channel}")
        elif cmd == "QUIT":
            client.send(f"ERROR :Closing link: {HOST} (Quit: {msg.text})")
            client.close()

    return handler


def sasl_plain(
    account: str = "bot", password: str = "secret", *, succeed: bool | None = None
) -> SaslHandler:
    """A ``sasl=`` script for SASL PLAIN checking ``account``/``password``.

    ``AUTHENTICATE PLAIN`` -> ``AUTHENTICATE +``; the credentials -> 900 + 903
    when they match (or ``succeed=True``), else 904 (also ``succeed=False``).
    Other mechanisms -> 908 + 904. ``client.state["sasl_payloads"]`` records
    the decoded payloads.
    """

    def handler(client: ScriptedClient, line: str) -> None:
        arg = parse_line(line).text
        if client.state.get("sasl_mech") is None:
            if arg.upper() == "PLAIN":
                client.state["sasl_mech"] = "PLAIN"
                client.send("AUTHENTICATE +")
            else:
                client.reply("908", "PLAIN", "are available SASL mechanisms")
                client.reply("904", "SASL authentication failed")
            return
        client.state["sasl_mech"] = None
        if arg == "*":
            client.reply("906", "SASL authentication aborted")
            return
        try:
            payload = base64.b64decode(arg, validate=True)
        except ValueError:
            payload = b""
        client.state.setdefault("sasl_payloads", []).append(payload)
        parts = payload.split(b"\0")
        ok = len(parts) == 3 and parts[1:] == [account.encode(), password.encode()]
        if succeed is not None:
            ok = succeed
        if ok:
            client.reply("900", client.prefix, account, f"You are now logged in as {account}")
            client.reply("903", "SASL authentication successful")
        else:
            client.reply("904", "SASL authentication failed")

    return handler
