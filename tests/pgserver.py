"""A real PostgreSQL server for the tests of the PostgreSQL store.

PYTEST_DONT_REWRITE (test modules import from here before pytest loads the plugin).

* :class:`PostgresServer` runs ``initdb`` into a temporary folder and ``pg_ctl start``
  on 127.0.0.1 and a free port (and a unix socket in that folder), trust
  authentication, no fsync (a test server: a crash of it loses nothing we keep).
  The binaries come from ``PATH`` or ``/usr/lib/postgresql/<version>/bin`` (the
  newest); ``make postgres`` installs Debian's ``postgresql`` when they are missing.
* PostgreSQL refuses to run as root: as root the server runs as the ``postgres``
  system user (Debian's package creates it) or, failing that, ``nobody``.
* The fixture ``postgres_server`` (session scope: one server per pytest-xdist worker)
  starts it once and stops it at the end of the session; ``postgres_dsn`` gives each
  test an empty database with every migration applied (one database made once from
  a migrated template, emptied before each test: cheap, and the tests of one worker
  run one at a time), ``postgres_blank_dsn`` a new database with no schema at all.
  Use them with ``pytest_plugins = ["pgserver"]`` in a test module.
* A missing PostgreSQL skips the tests, or fails them under ``CI=true``.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

__all__ = [
    "PostgresServer",
    "empty_database",
    "find_binaries",
    "missing_postgres",
    "postgres_blank_dsn",
    "postgres_dsn",
    "postgres_server",
]

HOST = "127.0.0.1"
READY_TIMEOUT = 60  # seconds pg_ctl waits for the server to accept connections
#: A database with every migration applied, made once per server.
TEMPLATE = "agentik_template"
#: The tests' database (a copy of the template), emptied before each test.
TESTS = "agentik_tests"
USER = "agentik"


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def missing_postgres(reason: str) -> None:
    """Skip the test, or fail it under ``CI=true``: CI must run PostgreSQL."""
    if _ci():
        pytest.fail(f"{reason} (CI=true: PostgreSQL must be installed: make postgres)",
                    pytrace=False)  # fmt: skip
    pytest.skip(reason)


def find_binaries() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl``: the newest
    ``/usr/lib/postgresql/*/bin`` (Debian keeps them off ``PATH``), else ``PATH``'s."""

    def version(path: str) -> tuple[int, ...]:
        name = Path(path).parent.name
        return tuple(int(p) for p in name.split(".") if p.isdigit()) or (0,)

    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True):
        if os.access(os.path.join(folder, "initdb"), os.X_OK) and os.access(
            os.path.join(folder, "pg_ctl"), os.X_OK
        ):
            return Path(folder)
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if initdb and pg_ctl:
        return Path(os.path.realpath(initdb)).parent
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _run_as() -> str | None:
    """The unprivileged user to run the server as (``None``: ourselves, not root)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise RuntimeError("running as root and there is no 'postgres' nor 'nobody' user")


_LIVE: set[PostgresServer] = set()


@atexit.register
def _stop_leftovers() -> None:  # a crashed session must not leave servers behind
    for server in list(_LIVE):
        server.stop()


class PostgresServer:
    """A PostgreSQL server of our own in a temporary folder (see the module docstring)."""

    def __init__(self, bindir: Path, *, base: Path | None = None) -> None:
        self.bindir = bindir
        self.base = Path(tempfile.mkdtemp(prefix="agentik-pg-", dir=base))
        self.data = self.base / "data"
        self.socket_dir = self.base / "sock"
        self.log_path = self.base / "postgres.log"
        self.port = 0
        self.user = USER
        self._as = _run_as()
        self._running = False

    def __repr__(self) -> str:
        return f"<PostgresServer {HOST}:{self.port} {'running' if self._running else 'stopped'}>"

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}@{HOST}:{self.port}/{database}"

    def _cmd(self, *argv: str) -> list[str]:
        if self._as is None:
            return list(argv)
        return ["runuser", "-u", self._as, "--", *argv]

    def _run(self, *argv: str, timeout: float = 120) -> None:
        done = subprocess.run(
            self._cmd(*argv), capture_output=True, text=True, timeout=timeout,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        if done.returncode != 0:
            log = (
                self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""
            )
            output = done.stdout + done.stderr
            raise RuntimeError(f"{' '.join(argv[:2])} failed ({done.returncode}):\n{output}\n{log}")

    def start(self) -> None:
        """``initdb`` (once) and ``pg_ctl start`` on a free port; returns once it accepts."""
        self.socket_dir.mkdir(exist_ok=True)
        if self._as is not None:
            os.chmod(self.base, 0o755)  # mkdtemp's 0700 keeps the server user out
            info = pwd.getpwnam(self._as)
            for path in (self.base, self.socket_dir):
                os.chown(path, info.pw_uid, info.pw_gid)
        if not self.data.exists():
            self._run(
                str(self.bindir / "initdb"), "-D", str(self.data), "-U", self.user,
                "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions",
            )  # fmt: skip
        options = " ".join(
            (
                f"-c listen_addresses={HOST}",
                f"-c unix_socket_directories={self.socket_dir}",
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off",
                "-c max_connections=200 -c shared_buffers=16MB",
            )
        )
        for attempt in range(3):  # another process may take the free port first
            self.port = _free_port()
            try:
                self._run(
                    str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log_path),
                    "-w", "-t", str(READY_TIMEOUT), "-o", f"{options} -p {self.port}", "start",
                    timeout=READY_TIMEOUT + 30,
                )  # fmt: skip
            except RuntimeError:
                if attempt == 2:
                    raise
                continue
            break
        self._running = True
        _LIVE.add(self)

    def stop(self) -> None:
        """Stop the server (fast) and remove its folder."""
        if self._running:
            with contextlib.suppress(Exception):
                self._run(
                    str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
                    "-w", "stop", timeout=60,
                )  # fmt: skip
            self._running = False
        _LIVE.discard(self)
        shutil.rmtree(self.base, ignore_errors=True)


async def make_template(server: PostgresServer) -> None:
    """Create :data:`TEMPLATE` with every migration applied (by the engine itself), and
    the database the tests use, :data:`TESTS`, from it."""
    import asyncpg

    from agentik.core.store.postgres import PostgresStore

    conn = await asyncpg.connect(server.dsn())
    try:
        await conn.execute(f"CREATE DATABASE {TEMPLATE}")
        async with PostgresStore(server.dsn(TEMPLATE), pool_min=2, pool_max=2):
            pass
        await conn.execute(f"CREATE DATABASE {TESTS} TEMPLATE {TEMPLATE}")
    finally:
        await conn.close()


async def empty_database(dsn: str) -> None:
    """Empty the migrated database at ``dsn`` (as cloned from the template): every row
    deleted, every sequence back at 1, every other connection to it closed.

    Cheap (a few milliseconds, where cloning a database takes most of a second on a
    loaded machine): each test starts from an empty database of its own."""
    import asyncpg

    from agentik.core.store.postgres_migrations import MIGRATIONS

    known = max(m.number for m in MIGRATIONS)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid != pg_backend_pid()"
        )
        tables = [
            r[0]
            for r in await conn.fetch(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
                " AND tablename != 'schema_migrations'"
            )
        ]
        sequences = [r[0] for r in await conn.fetch("SELECT sequencename FROM pg_sequences")]
        async with conn.transaction():
            # The audit log's trigger lets retention delete: this transaction is it.
            await conn.execute("SET LOCAL agentik.retention = 'on'")
            await conn.execute(
                "".join(f"DELETE FROM {t};" for t in tables)
                + "".join(f"SELECT setval('{q}', 1, false);" for q in sequences)
            )
            # A test may have recorded a migration this agentik does not know.
            await conn.execute("DELETE FROM schema_migrations WHERE number > $1", known)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A started PostgreSQL server for this session (this xdist worker), with the template."""
    bindir = find_binaries()
    if bindir is None:
        missing_postgres("PostgreSQL is not installed (no initdb/pg_ctl): run `make postgres`")
        raise AssertionError("unreachable")
    server = PostgresServer(bindir)
    try:
        server.start()
        import asyncio

        asyncio.run(make_template(server))
    except BaseException:
        server.stop()
        raise
    yield server
    server.stop()


_NAMES = itertools.count(1)


@pytest_asyncio.fixture
async def postgres_dsn(postgres_server: PostgresServer) -> str:
    """The DSN of an empty, migrated database for this test alone (emptied before it)."""
    dsn = postgres_server.dsn(TESTS)
    await empty_database(dsn)
    return dsn


@pytest_asyncio.fixture
async def postgres_blank_dsn(postgres_server: PostgresServer) -> AsyncIterator[str]:
    """The DSN of a new database with no schema at all (no migration applied), dropped
    afterwards: for the tests of migrations themselves (slower: a database is created)."""
    import asyncpg

    name = f"blank{os.getpid()}_{next(_NAMES)}_{int(time.time() * 1000) % 100000}"
    admin = await asyncpg.connect(postgres_server.dsn())
    try:
        await admin.execute(f"CREATE DATABASE {name} TEMPLATE template0")
        yield postgres_server.dsn(name)
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await admin.close()
