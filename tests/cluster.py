"""The worker rig of the multi-worker tests (tests/test_cluster_*.py): real ``agentik run``
processes on one PostgreSQL database (tests/pgserver.py).

* :class:`Worker`: one process with its own folder, ``bot.toml``, stderr log (each start
  appends, so a restarted worker's log keeps what came before), ``/health`` over the unix
  socket ``h.sock`` of its folder, and, when its config serves the HTTP API, that port
  (:attr:`Worker.url`); ``kill``/``wait``/``stop``.
* :func:`worker_config`: the config every worker starts from; a test's differences
  (leases, polling, sections of its own) are parameters.
* :func:`workers`: an async context manager starting N workers (and stopping them).
* :func:`until`: poll a condition with a deadline that only guards against a hang.

Every wait has a generous deadline (:data:`PATIENCE`): a loaded machine starts
processes slowly.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from helpers import AGENTIK, clean_env

from ircservers import free_port
from rigs import eventually

#: Seconds any one wait may take (processes start slowly on a loaded machine).
PATIENCE = 180.0
#: The environment variable the workers read the database's DSN from (``dsn_env``).
DSN_ENV = "AGENTIK_TEST_LEASE_DSN"
#: Where the HTTP API of a worker serves its routes (below :attr:`Worker.url`).
PREFIX = "/agentik"


async def until(check: Callable[[], Any], what: str, patience: float = PATIENCE) -> Any:
    """Poll ``check`` (sync or async) until it returns something true, and return that."""
    return await eventually(check, what, wait=patience, interval=0.05)


def worker_config(
    name: str,
    openai_url: str,
    *,
    dsn_env: str = DSN_ENV,
    lease: float = 3.0,
    beat: float = 0.5,
    poll: float | None = None,
    health: bool = True,
    before_cluster: str = "",
    extra: str = "",
) -> str:
    """A worker's ``bot.toml``: the fake model, PostgreSQL from ``$dsn_env``, no memory,
    no compaction, ``/health`` on ``unix:h.sock`` (unless ``health`` is false), the
    ``[cluster]`` section (``lease``/``beat``: its lease and heartbeat seconds, ``poll``:
    its ``poll_seconds`` when given, ``name``: the worker's name), ``before_cluster``
    just before that section and ``extra`` (transports, ...) after it."""
    health_section = '[health]\nlisten = "unix:h.sock"\n' if health else ""
    poll_line = f"poll_seconds = {poll}\n" if poll is not None else ""
    return f"""
[llm]
base_url = "{openai_url}"
model = "fake-model"
api_key = "sk-test"
max_retries = 0
[storage]
backend = "postgres"
dsn_env = "{dsn_env}"
[memory]
backend = "none"
[compaction]
enabled = false
{health_section}{before_cluster}[cluster]
lease_seconds = {lease}
heartbeat_seconds = {beat}
{poll_line}worker_name = "{name}"
{extra}
"""


def configs(openai_url: str, extra: str, **kw: Any) -> Callable[[str, int], str]:
    """For :func:`workers`: the :func:`worker_config` of each worker by its name, with
    ``extra`` (its transports) and ``kw`` the same for all."""
    return lambda name, _port: worker_config(name, openai_url, extra=extra, **kw)


def http_transport(name: str, port: int, extra: str = "") -> str:
    """An ``[transports.<name>]`` section serving the HTTP API on 127.0.0.1:``port``
    (and ``extra``, its further keys)."""
    section = f'[transports.{name}]\ntype = "http"\nhost = "127.0.0.1"\nport = {port}'
    return f"{section}\n{extra}" if extra else section


class Worker:
    """One ``agentik run`` process with its own folder, config, stderr log and health
    socket; ``port``: the HTTP API's, when its config serves one."""

    def __init__(
        self,
        folder: Path,
        config: str,
        dsn: str,
        *,
        dsn_env: str = DSN_ENV,
        env: dict[str, str] | None = None,
        port: int | None = None,
    ) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.config = folder / "bot.toml"
        self.config.write_text(config, encoding="utf-8")
        self.log = folder / "stderr.log"
        self.dsn = dsn
        self.env = {dsn_env: dsn, **(env or {})}
        self.port = port
        #: The HTTP API's root (``/ready``, ``/metrics``) and its routes' (``api``).
        self.url = f"http://127.0.0.1:{port}"
        self.api = self.url + PREFIX
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the process; its stderr is appended to :attr:`log`."""
        with open(self.log, "ab") as err:
            self.proc = subprocess.Popen(
                [AGENTIK, "run", "-c", str(self.config)], cwd=self.folder,
                env={**clean_env(), **self.env}, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=err,
            )  # fmt: skip

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stderr(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    async def health(self) -> dict[str, Any] | None:
        """``/health`` (with its ``cluster`` section), or ``None`` while not listening."""
        transport = httpx.AsyncHTTPTransport(uds=str(self.folder / "h.sock"), retries=0)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://w") as c:
                return dict((await c.get("/health", timeout=10)).json())
        except (httpx.TransportError, ValueError):
            return None

    async def ready(self, path: str = "/ready") -> bool:
        """Whether the HTTP API answers ``GET path`` with 200 (an exited worker fails)."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"worker exited: {self.stderr()}")
        try:
            async with httpx.AsyncClient() as c:
                return (await c.get(self.url + path, timeout=10)).status_code == 200
        except httpx.TransportError:
            return False

    def client(self, token: str) -> httpx.AsyncClient:
        """A client of the HTTP API's routes, with ``token`` as its bearer."""
        return httpx.AsyncClient(
            base_url=self.api,
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(PATIENCE),
        )

    def kill(self, sig: int = signal.SIGKILL) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    async def wait(self) -> int:
        assert self.proc is not None
        proc = self.proc
        return await asyncio.wait_for(asyncio.to_thread(proc.wait), PATIENCE)

    def stop(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` if it still runs and wait for it (killed when a gentler
        signal did not end it within 30 s)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                if sig == signal.SIGKILL:
                    raise
                self.proc.kill()
                self.proc.wait(30)


@contextlib.asynccontextmanager
async def workers(
    n: int | list[str],
    tmp_path: Path,
    dsn: str,
    config: Callable[[str, int], str],
    *,
    dsn_env: str = DSN_ENV,
    env: dict[str, str] | None = None,
    ready: str | None = None,
    stop: int = signal.SIGKILL,
) -> AsyncIterator[list[Worker]]:
    """``n`` workers (``w0``, ``w1``, ... or the names given), each in ``tmp_path/<name>``
    with ``config(name, port)`` (``port``: a free one for its HTTP API, if it serves one),
    started; with ``ready``, once each answers ``GET ready`` on its HTTP API. Stopped
    with ``stop`` on the way out."""
    names = [f"w{i}" for i in range(n)] if isinstance(n, int) else n
    crew = []
    for name in names:
        port = free_port()
        crew.append(
            Worker(tmp_path / name, config(name, port), dsn, dsn_env=dsn_env, env=env, port=port)
        )
    try:
        for w in crew:
            w.start()
        if ready is not None:
            for w in crew:
                await until(partial(w.ready, ready), f"{w.folder.name}'s HTTP API")
        yield crew
    finally:
        for w in crew:
            w.stop(stop)


async def owner_of(crew: list[Worker], transport: str) -> Worker:
    """The worker whose ``/health`` says it owns ``transport`` (once all alive agree)."""

    async def agreed() -> Worker | None:
        views = [await w.health() for w in crew if w.alive]
        if any(v is None or "cluster" not in v for v in views):
            return None
        owners = [w for w, v in zip([w for w in crew if w.alive], views, strict=True)
                  if transport in v["cluster"]["owns"]]  # fmt: skip
        seen = {v["cluster"]["connections"].get(transport, {}).get("owner") for v in views}
        if len(owners) == 1 and len(seen) == 1:
            return owners[0]
        return None

    found: Worker = await until(agreed, f"one owner of {transport} that every worker sees")
    return found


def last_user(body: dict[str, Any]) -> str:
    """The text of the last user message of a model request."""
    users = [m["content"] for m in body["messages"] if m["role"] == "user"]
    content = users[-1] if users else ""
    return content if isinstance(content, str) else str(content)
