"""The PostgreSQL store beyond the contract suite: the rules the database itself
enforces, its migrations, its errors, several stores on one database, and a bot
configured with ``[storage] backend = "postgres"`` end to end (tests/pgserver.py
runs the real server)."""

from __future__ import annotations

import asyncio
import functools
import json
import subprocess
import sys

import asyncpg
import pytest

import helpers
from agentik.core.errors import MigrationError, StoreError
from agentik.core.messages import NewMessage
from agentik.core.store.postgres import PostgresStore, describe_dsn
from agentik.core.store.postgres_migrations import MIGRATIONS
from agentik.core.store.records import ConversationRecord, TurnEnd
from helpers import AGENTIK

pytest_plugins = ["pgserver"]

clean_env = functools.partial(helpers.clean_env, drop=("PYTHONASYNCIODEBUG",))


def rec(cid: str) -> ConversationRecord:
    return ConversationRecord(id=cid, created_at=1.0, updated_at=1.0)


async def _refused(conn: asyncpg.Connection, sql: str, *args: object) -> str:
    """Run ``sql``, which the database must refuse; the error's text."""
    with pytest.raises(asyncpg.PostgresError) as info:
        await conn.execute(sql, *args)
    return str(info.value)


# -- what the database enforces ----------------------------------------------------------------
async def test_the_audit_log_refuses_updates_and_deletes_through_a_raw_connection(postgres_dsn):
    async with PostgresStore(postgres_dsn) as store:
        await store.create_conversation(rec("c"))
        [row] = await store.append("c", log=[NewMessage(kind="user", content="said", run_id="r")])
    conn = await asyncpg.connect(postgres_dsn)
    try:
        for sql in (
            "UPDATE message SET content = 'rewritten' WHERE id = $1",
            "UPDATE message SET author = 'mallory' WHERE id = $1",
            # Even a redaction may not change who said it, nor redact twice.
            "UPDATE message SET redacted = true, author = 'x' WHERE id = $1",
            "DELETE FROM message WHERE id = $1",
        ):
            assert "append-only" in await _refused(conn, sql, row.id)
        assert await conn.fetchval("SELECT content FROM message WHERE id = $1", row.id) == "said"
        await conn.execute(
            "UPDATE message SET redacted = true, content = '-' WHERE id = $1", row.id
        )
        assert "append-only" in await _refused(
            conn, "UPDATE message SET redacted = false WHERE id = $1", row.id
        )
        # Deleting the conversation takes its rows (a cascade), and only that way.
        await conn.execute("DELETE FROM conversation WHERE id = 'c'")
        assert await conn.fetchval("SELECT COUNT(*) FROM message") == 0
    finally:
        await conn.close()


async def test_turn_ends_redactions_and_setting_audits_are_append_only(postgres_dsn):
    async with PostgresStore(postgres_dsn) as store:
        await store.create_conversation(rec("c"))
        [row] = await store.append(
            "c",
            log=[NewMessage(kind="user", content="x", run_id="r1")],
            ended=TurnEnd("r1", "stop"),
        )
        await store.redact_message("c", row.id, content="-", by="a", reason="", at=1.0)
        await store.set_channel_setting("k", "x", "1", actor="a", at=1.0)
    conn = await asyncpg.connect(postgres_dsn)
    try:
        for sql in (
            "UPDATE turn_end SET outcome = 'error'",
            "UPDATE redaction SET redacted_by = 'nobody'",
            "UPDATE channel_setting_audit SET actor = 'nobody'",
        ):
            assert "append-only" in await _refused(conn, sql)
    finally:
        await conn.close()


async def test_a_redacted_messages_old_row_version_is_vacuumed_away(postgres_dsn):
    """No tuple of the table, live or dead, holds the old text after a redaction (the
    engine vacuums).  PostgreSQL cannot promise more: the freed bytes stay in the page
    until reused, and in the WAL until it is recycled (docs/operations.md)."""
    secret = "zq7-unique-hunter2-passphrase"
    async with PostgresStore(postgres_dsn) as store:
        await store.create_conversation(rec("c"))
        [row] = await store.append("c", log=[NewMessage(kind="user", content=secret)])
        await store.redact_message("c", row.id, content="[r]", by="a", reason="", at=1.0)
    conn = await asyncpg.connect(postgres_dsn)
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pageinspect")
        tuples = await conn.fetch(
            "SELECT t_data FROM generate_series(0, pg_relation_size('message')"
            " / current_setting('block_size')::int - 1) AS p,"
            " heap_page_items(get_raw_page('message', p::int)) WHERE t_data IS NOT NULL"
        )
        assert len(tuples) == 1 and b"[r]" in tuples[0][0]
        assert not [t for t in tuples if secret.encode() in t[0]]
    finally:
        await conn.execute("DROP EXTENSION IF EXISTS pageinspect")
        await conn.close()


# -- migrations -------------------------------------------------------------------------------
async def test_migrations_are_numbered_recorded_and_applied_once(postgres_blank_dsn):
    async with PostgresStore(postgres_blank_dsn):
        pass
    # Three processes starting at once on the blank database: one migrates (under the
    # advisory lock), the others find it done.
    stores = [PostgresStore(postgres_blank_dsn) for _ in range(3)]
    await asyncio.gather(*(s.start() for s in stores))
    await asyncio.gather(*(s.aclose() for s in stores))
    conn = await asyncpg.connect(postgres_blank_dsn)
    try:
        rows = await conn.fetch("SELECT number, name FROM schema_migrations ORDER BY number")
        assert [(r[0], r[1]) for r in rows] == [(m.number, m.name) for m in MIGRATIONS]
    finally:
        await conn.close()


async def test_a_schema_newer_than_this_agentik_is_refused(postgres_dsn):
    conn = await asyncpg.connect(postgres_dsn)
    try:
        await conn.execute(
            "INSERT INTO schema_migrations (number, name, applied_at) VALUES (999, 'future', 0)"
        )
    finally:
        await conn.close()
    with pytest.raises(MigrationError, match="newer than this agentik knows"):
        await PostgresStore(postgres_dsn).start()


# -- errors -----------------------------------------------------------------------------------
async def test_an_unreachable_server_is_a_clear_error_without_the_password():
    from ircservers import free_port

    dsn = f"postgresql://bot:hunter2-secret@127.0.0.1:{free_port()}/agentik"
    store = PostgresStore(dsn, connect_timeout=5)
    with pytest.raises(StoreError) as info:
        await store.start()
    message = str(info.value)
    assert "cannot open PostgreSQL database 127.0.0.1" in message
    assert "hunter2" not in message and "hunter2" not in repr(store)
    assert describe_dsn(dsn) == f"127.0.0.1:{dsn.rsplit(':', 1)[1].split('/')[0]}/agentik"


async def test_a_closed_store_refuses_work(postgres_dsn):
    store = PostgresStore(postgres_dsn)
    async with store:
        await store.create_conversation(rec("c"))
    from agentik.core.errors import ClosedError

    with pytest.raises(ClosedError):
        await store.append("c", log=[NewMessage(kind="user", content="late")])


async def test_nul_characters_are_stored_as_replacement_characters(postgres_dsn):
    """PostgreSQL's text and jsonb cannot hold NUL (SQLite's can): nothing is lost but it."""
    async with PostgresStore(postgres_dsn) as store:
        await store.create_conversation(rec("c"))
        await store.append(
            "c", log=[NewMessage(kind="user", content="a\x00b", data={"k": "x\x00y"})]
        )
        [row] = await store.messages("c")
        assert (row.content, row.data) == ("a\ufffdb", {"k": "x\ufffdy"})


async def test_a_held_write_queued_behind_a_commit_waits_for_the_next_write(postgres_dsn):
    """As on SQLite: a held write (``defer=True``) that arrives while a commit is in
    flight does not make a commit of its own when that one ends; it goes in with the
    next write that is not held (its rows share that transaction's ``xmin``)."""
    async with PostgresStore(postgres_dsn, defer_max=60.0) as store:  # no timer here
        await store.create_conversation(rec("a"))
        await store.create_conversation(rec("b"))
        first = asyncio.ensure_future(
            store.append("a", log=[NewMessage(kind="user", content="in flight")])
        )
        await asyncio.sleep(0)  # the writer took it: a commit is in flight
        held = asyncio.ensure_future(
            store.append("b", log=[NewMessage(kind="user", content="held")], defer=True)
        )
        await first
        assert not held.done()
        await store.append("a", log=[NewMessage(kind="user", content="next")])
        assert [m.content for m in held.result()] == ["held"]
        late = asyncio.ensure_future(
            store.append("b", log=[NewMessage(kind="user", content="at close")], defer=True)
        )
        await asyncio.sleep(0)
    assert [m.content for m in late.result()] == ["at close"]  # closing commits it
    conn = await asyncpg.connect(postgres_dsn)
    try:
        rows = await conn.fetch("SELECT content, xmin::text AS x FROM message ORDER BY id")
    finally:
        await conn.close()
    xmin = {r["content"]: r["x"] for r in rows}
    assert xmin["held"] == xmin["next"] != xmin["in flight"]


# -- several stores, one database ---------------------------------------------------------------
async def test_two_stores_write_one_database_at_once(postgres_dsn):
    """Two engines on one database (as two bot processes will be): ids come from the
    database, so every row lands once, each store's in its own order."""
    a, b = PostgresStore(postgres_dsn), PostgresStore(postgres_dsn)
    async with a, b:
        await a.create_conversation(rec("ca"))
        await b.create_conversation(rec("cb"))
        results = await asyncio.gather(
            *(a.append("ca", log=[NewMessage(kind="user", content=f"a{i}")]) for i in range(40)),
            *(b.append("cb", log=[NewMessage(kind="user", content=f"b{i}")]) for i in range(40)),
        )
        ids = [r[0].id for r in results]
        assert len(set(ids)) == 80
        assert ids[:40] == sorted(ids[:40]) and ids[40:] == sorted(ids[40:])
        assert [m.content for m in await b.messages("ca", limit=100)] == [
            f"a{i}" for i in range(40)
        ]
        assert [r.id for r in await a.list_conversations()] == ["ca", "cb"]


# -- the bot ------------------------------------------------------------------------------------
def test_asyncpg_is_imported_only_when_the_engine_starts():
    script = (
        "import sys\n"
        "import agentik.core, agentik.bot.app, agentik.bot.builder, agentik.bot.check\n"
        "from agentik.core.store.postgres import PostgresStore\n"
        "PostgresStore('postgresql://u@127.0.0.1/x')\n"
        "print('asyncpg' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def _config(tmp_path, base_url: str, memory: str = "none") -> str:
    path = tmp_path / "bot.toml"
    path.write_text(
        "\n".join(
            [
                "[llm]",
                f'base_url = "{base_url}"',
                'model = "fake-model"',
                "max_retries = 0",
                "[storage]",
                'backend = "postgres"',
                "[memory]",
                f'backend = "{memory}"',
                "[transports.terminal]",
                'type = "stdio"',
                'user = "tester"',
            ]
        )
        + "\n"
    )
    return str(path)


async def _chat(config: str, stdin: bytes, env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        AGENTIK, "chat", "-c", config,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(stdin), 90)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_a_bot_on_postgres_answers_and_its_history_survives_a_restart(
    openai_server, tmp_path, postgres_dsn
):
    """``agentik chat`` (the real stdio transport, the real bot) with ``backend =
    "postgres"``: answers, then a second process continues the same conversation, its
    history read back from PostgreSQL; no SQLite file is made."""
    config = _config(tmp_path, openai_server.base_url)
    env = clean_env(AGENTIK_POSTGRES_DSN=postgres_dsn)
    code, out, err = await _chat(config, b"hello\n", env)
    assert code == 0, err
    assert out.splitlines() == ["echo: tester: hello"], err
    code, out, err = await _chat(config, b"and again\n", env)
    assert code == 0, err
    assert out.splitlines() == ["echo: tester: and again"], err
    history = [m["content"] for m in openai_server.requests[-1]["messages"]]
    assert history[1:] == ["tester: hello", "echo: tester: hello", "tester: and again"]
    assert not (tmp_path / "agentik.db").exists()
    conn = await asyncpg.connect(postgres_dsn)
    try:
        rows = await conn.fetch("SELECT kind, content FROM message ORDER BY id")
        assert [(r[0], r[1]) for r in rows] == [
            ("user", "hello"),
            ("assistant", "echo: tester: hello"),
            ("user", "and again"),
            ("assistant", "echo: tester: and again"),
        ]
        assert await conn.fetchval("SELECT COUNT(*) FROM turn_end") == 2
        assert await conn.fetchval("SELECT COUNT(*) FROM channel_binding") == 1
    finally:
        await conn.close()
    assert "postgresql://" not in err


async def test_check_probe_reports_the_server_version_and_extensions(
    openai_server, tmp_path, postgres_dsn
):
    config = _config(tmp_path, openai_server.base_url)
    done = await asyncio.to_thread(
        helpers.agentik,
        "check", "--probe", "-c", config, cwd=tmp_path, env={"AGENTIK_POSTGRES_DSN": postgres_dsn},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    where = describe_dsn(postgres_dsn)
    assert f"storage: postgres {where} (DSN from $AGENTIK_POSTGRES_DSN; pool 2-10 connections)" in (
        lines
    )
    [probe] = [line for line in lines if line.startswith("probe storage: ")]
    assert probe.startswith("probe storage: ok: PostgreSQL 15") or probe.startswith(
        "probe storage: ok: PostgreSQL 1"
    ), probe
    assert f"at {where}; schema version {max(m.number for m in MIGRATIONS)};" in probe
    assert "extensions: " in probe and "plpgsql 1.0" in probe and "pgvector" in probe
    assert postgres_dsn not in done.stdout + done.stderr


def test_check_names_what_a_postgres_configuration_lacks(openai_server, tmp_path):
    config = _config(tmp_path, openai_server.base_url, memory="sqlite")
    done = helpers.agentik("check", "-c", config, cwd=tmp_path)
    assert done.returncode == 2
    err = done.stderr
    assert "storage.dsn_env: environment variable AGENTIK_POSTGRES_DSN is not set" in err
    # Memory notes live in PostgreSQL too (tests/test_postgres_memory.py): not a problem.
    assert "memory.backend" not in err


async def test_a_probe_of_an_unreachable_server_fails_without_the_password(openai_server, tmp_path):
    from ircservers import free_port

    config = _config(tmp_path, openai_server.base_url)
    dsn = f"postgresql://bot:hunter2-secret@127.0.0.1:{free_port()}/agentik"
    done = await asyncio.to_thread(
        helpers.agentik,
        "check", "--probe", "--timeout", "5", "-c", config, cwd=tmp_path,
        env={"AGENTIK_POSTGRES_DSN": dsn},
    )  # fmt: skip
    assert done.returncode == 1
    [probe] = [line for line in done.stdout.splitlines() if line.startswith("probe storage: ")]
    assert probe.startswith("probe storage: FAILED: cannot connect to PostgreSQL at 127.0.0.1:")
    assert "hunter2" not in done.stdout + done.stderr


@pytest.mark.parametrize(
    "command",
    [
        ("conversations", "list"),
        ("memory", "list"),
        ("access", "roles"),
        ("db", "prune", "--dry-run"),
    ],
)
def test_no_command_refuses_a_postgres_configuration(
    openai_server, tmp_path, postgres_dsn, command
):
    # (What each does on PostgreSQL: tests/test_cli_postgres.py, test_postgres_memory.py;
    # the SQLite file tools name their PostgreSQL equivalents there too.)
    config = _config(tmp_path, openai_server.base_url, memory="database")
    done = helpers.agentik(
        *command, "-c", config, cwd=tmp_path, env={"AGENTIK_POSTGRES_DSN": postgres_dsn}
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SQLite" not in done.stderr


async def test_the_postgres_store_exports_what_sqlite_exports(tmp_path, postgres_dsn):
    """The same conversation, written the same way, exports the same snapshot."""
    from test_store_contract import _differences, _seed

    from agentik.core.lifecycle import export_conversation
    from agentik.core.store.sqlite import SQLiteStore

    docs = []
    for store in (SQLiteStore(str(tmp_path / "a.db")), PostgresStore(postgres_dsn)):
        async with store:
            await _seed(store)
            docs.append(json.loads(json.dumps(await export_conversation(store, "c"))))
    on_sqlite, on_postgres = docs
    assert len(on_postgres["approvals"]) == 1 and len(on_postgres["turn_ends"]) == 1
    assert _differences(on_sqlite, on_postgres) == []


async def test_a_lost_connection_fails_one_write_as_retryable_and_the_next_one_lands(
    postgres_dsn,
):
    """The server drops every connection (a restart, a failover): the write in flight
    fails with a retryable StoreError (what the agent retries), the writer takes a new
    connection, and the next write and read work."""
    async with PostgresStore(postgres_dsn) as store:
        await store.create_conversation(rec("c"))
        admin = await asyncpg.connect(postgres_dsn)
        try:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid != pg_backend_pid()"
            )
        finally:
            await admin.close()
        with pytest.raises(StoreError) as info:
            await store.append("c", log=[NewMessage(kind="user", content="lost")])
        assert info.value.retryable
        [row] = await store.append("c", log=[NewMessage(kind="user", content="again")])
        # Reads are repeated on another connection by the store itself.
        assert [m.content for m in await store.messages("c")] == ["again"]
        assert row.content == "again"


def test_the_dsn_and_its_password_are_secrets_to_the_logs(monkeypatch):
    from agentik.bot.config import parse_config

    monkeypatch.setenv("AGENTIK_POSTGRES_DSN", "postgresql://bot:s3cr%40t@db/agentik")
    config = parse_config(
        {"storage": {"backend": "postgres"}, "memory": {"backend": "none"}}, env={}
    )
    secrets = config.secrets()
    assert "postgresql://bot:s3cr%40t@db/agentik" in secrets and "s3cr@t" in secrets


async def test_sigkill_mid_turn_loses_no_committed_message(openai_server, postgres_dsn):
    """tests/test_crash.py on PostgreSQL: a bot killed mid-turn loses no message whose
    send returned, and the next start continues the conversation with all of them."""
    conv_id, sent = await helpers.kill_mid_turn(openai_server, "postgres", postgres_dsn)
    conn = await asyncpg.connect(postgres_dsn)
    try:
        rows = await conn.fetch("SELECT run_id, content FROM message WHERE kind = 'user'")
    finally:
        await conn.close()
    stored = {r[0]: r[1] for r in rows}
    for i, run_id in sent:
        assert stored.get(run_id) == f"message {i}"

    await helpers.back_after_the_kill(openai_server, PostgresStore(postgres_dsn), conv_id, sent)


async def test_one_outbox_write_may_name_a_piece_twice_as_on_sqlite(tmp_path, postgres_dsn):
    """One statement writes a call's pieces; a call naming one piece twice (which that
    statement cannot do) is written piece by piece: the same ids and texts as SQLite."""
    from agentik.core.store.sqlite import SQLiteStore
    from agentik.core.store.testing.kit import outbox

    got = []
    for store in (SQLiteStore(str(tmp_path / "a.db")), PostgresStore(postgres_dsn)):
        async with store:
            ids = await store.outbox_add(
                [outbox(0, "", complete=False), outbox(1, "b"), outbox(0, "whole")]
            )
            texts = [(e.piece, e.text, e.complete) for e in await store.outbox_undelivered()]
            got.append((ids[0] == ids[2] != ids[1], texts))
    assert got[0] == got[1] == (True, [(0, "whole", True), (1, "b", True)])


async def _deadlocks(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(
            await conn.fetchval(
                "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
            )
        )
    finally:
        await conn.close()


async def test_batches_locking_in_opposite_orders_on_two_stores_queue_instead_of_deadlocking(
    postgres_dsn,
):
    """Two stores (two workers' writers) batch a budget take (its counter's lock) and
    run events (the agent-wide numbering's lock) in opposite orders, many times at
    once: every write lands, and PostgreSQL never had to break a deadlock (each one
    would stall a worker for its deadlock_timeout) — the writer takes every lock a
    batch declares first, in one order.  The server's deadlock count is read after
    the stores' connections ended (a backend reports its counts as it exits)."""
    from rigs import eventually

    before, others = await _deadlocks(postgres_dsn), await _backends(postgres_dsn)
    a, b = PostgresStore(postgres_dsn), PostgresStore(postgres_dsn)
    check = [("channel", "shared", "messages", 60, 10_000)]
    add = [("channel", "shared", "messages", 60, 1)]
    async with a, b:
        await a.create_conversation(rec("da"))
        await b.create_conversation(rec("db"))

        def events(cid: str, n: int) -> list[tuple[str, int, float, str]]:
            return [(cid, n * 2 + i + 1, 1.0, json.dumps({"kind": "x", "n": i})) for i in range(2)]

        for n in range(60):
            await asyncio.gather(
                a.budget_take(check, add),
                a.run_events_add(events("da", n)),
                b.run_events_add(events("db", n)),
                b.budget_take(check, add),
            )
        [(*_, counted)] = await a.budget_rows(0)
        assert counted == 120
        assert len(await b.run_events_after("da", 0, limit=1000)) == 120
        assert (await a.run_events_position())[0] >= 240

    # (No store connection is left: the server has their counts once they exit.)
    async def gone() -> bool:
        return not (await _backends(postgres_dsn) - others)

    await eventually(gone, "the stores' connections gone", wait=30, interval=0.1)
    assert await _deadlocks(postgres_dsn) == before


async def _backends(dsn: str) -> set[int]:
    """The server processes of this database's client connections (not this one)."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        )
        return {int(r[0]) for r in rows}
    finally:
        await conn.close()
