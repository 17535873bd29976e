"""``agentik db copy``: a whole database moved between engines (SQLite -> PostgreSQL ->
SQLite) and proven alike; run as a user runs it (the installed command, a real
PostgreSQL from tests/pgserver.py, real SQLite files)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from agentik.core import SQLiteStore
from agentik.core.memory.sqlite import SQLiteMemory
from agentik.core.messages import ChatMessage, NewMessage, ToolCall
from agentik.core.store.copy import TABLES, CopyError, copy_store, verify
from agentik.core.store.postgres import PostgresStore
from agentik.core.store.records import (
    Checklist,
    ConversationRecord,
    LinkMessage,
    LinkRecord,
    OutboxEntry,
    RunRecord,
    TurnEnd,
)
from agentik.core.store.testing.kit import approval, question
from helpers import agentik

pytest_plugins = ["pgserver"]

#: The message count of the big conversation (several batches of the copy).
BIG = 1200


def rec(cid: str, t: float, **kw: Any) -> ConversationRecord:
    return ConversationRecord(id=cid, created_at=t, updated_at=t, **kw)


async def seed(store: Any, *, notes: bool = False) -> None:
    """A database with every kind of row a bot keeps, written through the store API."""
    await store.create_conversation(
        rec("c-main", 10.0, title="Ops ✓ naïve", meta={"channel_key": "irc:libera:#ops", "k": [1]}),
        channel_key="irc:libera:#ops",
    )
    await store.set_binding("slack:T1:C1", "c-main")
    await store.create_conversation(rec("c-child", 11.0, meta={"parent_conversation_id": "c-main",
                                                               "agent": "researcher"}))  # fmt: skip
    await store.create_conversation(rec("c-big", 12.0, title="long"))
    rows = await store.append(
        "c-main",
        log=[
            NewMessage(kind="user", content="hello", author="alice", channel="#ops", run_id="r1",
                       data={"author_id": "libera:account:alice"}, created_at=20.0),
            NewMessage(kind="tool_call", content="", run_id="r1", tool_call_id="call1",
                       tool_name="shell", arguments='{"cmd": "ls"}', created_at=21.0),
            NewMessage(kind="tool_result", content="boom", run_id="r1", tool_call_id="call1",
                       tool_name="shell", is_error=True, duration=0.25, created_at=22.0),
            NewMessage(kind="assistant", content="partial", run_id="r1", status="interrupted",
                       data={"usage": {"total_tokens": 7, "prompt_tokens": 5}}, created_at=23.0),
        ],
        memory=[
            ChatMessage(role="system", content="be brief"),
            ChatMessage(role="user", content="hello", author="alice", message_id=-1),
            ChatMessage(role="assistant", content="", message_id=-2, tool_calls=(
                ToolCall(id="call1", name="shell", arguments='{"cmd": "ls"}'),)),
        ],
        updated_at=23.0,
        ended=TurnEnd("r1", "interrupted", run=RunRecord(
            run_id="r1", conversation_id="c-main", started=20.0, ended=23.0,
            stop_reason="interrupted", usage={"total_tokens": 7, "prompt_tokens": 5})),
    )  # fmt: skip
    await store.run_add(RunRecord(run_id="k1", conversation_id="c-child", parent_run_id="r1",
                                  parent_conversation_id="c-main", parent_call_id="call1",
                                  agent="researcher", depth=1, started=21.0, ended=22.0,
                                  stop_reason="stop"))  # fmt: skip
    await store.append("c-child", log=[NewMessage(kind="user", content="research", run_id="k1",
                                                  created_at=21.5)])  # fmt: skip
    await store.redact_message("c-main", rows[0].id, content="[redacted by ops]", by="ops",
                               reason="pii", at=30.0)  # fmt: skip
    # An open turn (no end): a copy keeps it resumable as it is.
    await store.append("c-main", log=[NewMessage(kind="user", content="still there?",
                                                 run_id="r2", created_at=40.0)])  # fmt: skip
    for i in range(0, BIG, 400):
        await store.append("c-big", log=[
            NewMessage(kind="user" if j % 2 == 0 else "assistant", content=f"line {j} " + "x" * 50,
                       run_id=f"b{j // 2}", created_at=100.0 + j)
            for j in range(i, i + 400)
        ])  # fmt: skip
    await store.compact("c-main", rows[1].id, ChatMessage(role="system", content="summary"))
    ids = await store.outbox_add([
        OutboxEntry(channel_key="irc:libera:#ops", run_id="r1", piece=i, transport="irc",
                    kind="answer", text=f"piece {i}", reply_to={"nick": "alice"},
                    created_at=50.0 + i)
        for i in range(3)
    ])  # fmt: skip
    await store.outbox_mark([(ids[0], "confirmed", True, "ts1"), (ids[1], "sent", None, None)])
    serial = await store.approval_add(approval("c-main", "a1"))
    await store.approval_add(approval("c-main", "a2", call_id="c2"))
    await store.approval_resolve(serial, "approved", "bob", "libera:account:bob", "ok", 15.0)
    qid = await store.question_add(question("c-main"))
    await store.question_settle(qid, "answered", "blue", "bob", 16.0)
    await store.question_add(question("c-main", "and now?", call_id="q2"))
    await store.todo_set("c-main", Checklist(items=({"text": "a", "status": "done"},
                                                    {"text": "b", "status": "pending"}),
                                             run_id="r1", updated_at=17.0))  # fmt: skip
    await store.access_set("libera:account:bob", "admin", by="owner", channel="#ops")
    await store.access_set("slack:T1:U2", "user", by="owner")
    await store.access_set("slack:T1:U2", None, by="owner")
    await store.set_channel_setting("irc:libera:#ops", "tools", '["shell"]', actor="bob", at=18.0)
    await store.set_channel_setting("irc:libera:#ops", "persona", '"terse"', actor="bob", at=18.5)
    await store.set_channel_setting("irc:libera:#ops", "persona", None, actor="bob", at=19.0)
    await store.budget_add([("identity", "libera:account:bob", "tokens", 86400, 120),
                            ("channel", "irc:libera:#ops", "messages", 60, 3)])  # fmt: skip
    await store.seen_first(["event:E1", "msg:C1:1.0"], now=60.0, window=3600.0)
    await store.link_save(LinkRecord(name="team", channels=("irc:libera:#ops", "slack:T1:C1"),
                                     options={"relay": True}, created_by="libera:account:bob",
                                     created_at=61.0))  # fmt: skip
    await store.link_map_add([
        LinkMessage(link="team", canonical="m1", channel_key="irc:libera:#ops", ref=None,
                    origin=True, created_at=62.0),
        LinkMessage(link="team", canonical="m1", channel_key="slack:T1:C1", ref="1.0",
                    run_id="r1", piece=0, created_at=62.5),
    ])  # fmt: skip
    if notes:
        memory = SQLiteMemory(store)
        await memory.start()
        note = await memory.save("global", "the deploy key lives in vault", author="bob")
        await memory.save("global", "the deploy key lives in vault/ops", author="bob",
                          note_id=note.id)  # fmt: skip
        gone = await memory.save("channel:irc:libera:#ops", "retro on fridays", author="alice")
        await memory.delete(gone.id, author="alice")
        await store.note_source_add(note.id, "c-main", rows[0].id, rows[-1].id)
        await memory.aclose()


def seed_file(path: Path, *, notes: bool = False) -> None:
    async def go() -> None:
        async with SQLiteStore(str(path)) as store:
            await seed(store, notes=notes)

    asyncio.run(go())


def _value(v: Any) -> Any:
    """A column's value as compared: JSON text parsed (``jsonb`` keeps no key order)."""
    if isinstance(v, str) and v[:1] in "[{":
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v


#: Tables keyed by text (or several columns): their rowid order is the order rows happened
#: to be written in, which nothing reads (PostgreSQL keeps no such order): compared sorted.
#: Every other table is compared in rowid order (its id, or for runs the order written).
KEYED = frozenset({"conversation", "channel_binding", "working_memory", "turn_end",
                   "access_grant", "budget_usage", "channel_setting", "todo"})  # fmt: skip


def table_rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table a bot keeps, in rowid order, JSON parsed."""
    out = {}
    with sqlite3.connect(path) as conn:
        for t in TABLES:
            try:
                rows = conn.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall()
            except sqlite3.OperationalError:  # WITHOUT ROWID: by its key
                rows = conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall()
            out[t] = [tuple(_value(v) for v in r) for r in rows]
            if t in KEYED:
                out[t].sort(key=repr)
    return out


def run_copy(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    return agentik("db", "copy", *args, cwd=tmp_path, env=env, timeout=300)


# -- the round trip ---------------------------------------------------------------------------
def test_sqlite_to_postgres_and_back_gives_the_same_database(tmp_path, postgres_dsn):
    first, again = tmp_path / "first.db", tmp_path / "again.db"
    seed_file(first)
    env = {"PGDSN": postgres_dsn}
    there = run_copy(tmp_path, "first.db", "env:PGDSN", env=env)
    assert there.returncode == 0, there.stderr
    assert "verified: 3 conversations" in there.stdout
    assert "copying first.db -> PostgreSQL 127.0.0.1:" in there.stderr
    assert f"  message: {BIG + 6:,} rows" in there.stderr  # progress, on stderr
    back = run_copy(tmp_path, "env:PGDSN", str(again), env=env)
    assert back.returncode == 0, back.stderr
    assert "verified: 3 conversations" in back.stdout
    a, b = table_rows(first), table_rows(again)
    for t in TABLES:
        assert a[t] == b[t], t  # every row, ids, order, flags and times kept
    assert a["message"] and a["redaction"] and a["approval"] and a["seen_event"]
    assert a["link"] and len(a["link_message"]) == 2  # links made at run time, and the map
    assert [r[-1] for r in b["message"] if r[-1]] == [1]  # the redaction flag


async def test_a_copied_postgres_database_goes_on_after_the_copied_ids(tmp_path, postgres_dsn):
    first = tmp_path / "first.db"
    await asyncio.to_thread(seed_file, first)
    async with SQLiteStore(str(first)) as src, PostgresStore(postgres_dsn) as dst:
        await copy_store(src, dst, batch=500)
        assert await verify(src, dst, nul=True) == 3
        last = max(m.id for m in await src.messages("c-big", limit=10_000))
        [row] = await dst.append("c-main", log=[NewMessage(kind="user", content="after")])
        assert row.id == last + 1
        assert await dst.outbox_add(
            [OutboxEntry(channel_key="k", run_id="r9", piece=0, transport="irc", kind="answer",
                         text="t")]
        ) == [4]  # fmt: skip
        # Handled events came along: Slack's retry after the move is still a retry.
        assert await dst.seen_first(["event:E1"], now=70.0, window=3600.0) == []
        # The open turn is still open: a restart on PostgreSQL resumes it.
        pending = await dst.pending_turns()
        assert [m.id for m in pending] == [m.id for m in await src.pending_turns()]
        assert [m.content for m in pending if m.conversation_id == "c-main"] == ["still there?"]


async def test_the_verification_names_a_tampered_row(tmp_path, postgres_dsn):
    first = tmp_path / "first.db"
    await asyncio.to_thread(seed_file, first)
    async with SQLiteStore(str(first)) as src, PostgresStore(postgres_dsn) as dst:
        await copy_store(src, dst)
        conn = await asyncpg.connect(postgres_dsn)
        try:
            await conn.execute("UPDATE conversation SET title = 'forged' WHERE id = 'c-main'")
            with pytest.raises(CopyError, match=r"c-main: conversation\.title differs"):
                await verify(src, dst)
            await conn.execute("UPDATE conversation SET title = 'Ops ✓ naïve' WHERE id = 'c-main'")
            where = "WHERE conversation_id = 'c-main' AND body->>'content' = 'summary'"
            body = await conn.fetchval(f"SELECT body FROM working_memory {where}")
            await conn.execute(
                f"UPDATE working_memory SET body = jsonb_set(body, '{{content}}', '\"forged\"')"
                f" {where}"
            )
            with pytest.raises(CopyError, match=r"c-main: working_memory\[0\]\.message\.content"):
                await verify(src, dst)
            await conn.execute(
                "UPDATE working_memory SET body = $1 WHERE conversation_id = 'c-main'"
                " AND body->>'content' = 'forged'",
                body,
            )
            assert await verify(src, dst) == 3
            # A row outside any conversation: the row counts catch it.
            await conn.execute("DELETE FROM access_audit WHERE id = 1")
            with pytest.raises(CopyError, match="access_audit has 3 rows in the source and 2"):
                await verify(src, dst)
        finally:
            await conn.close()


def test_a_tampered_copy_fails_the_command(tmp_path):
    """The command's verification exits 1 naming the first difference: a copy into a
    SQLite file whose conversation was changed under it (a trigger forges every title)."""
    first, second = tmp_path / "first.db", tmp_path / "second.db"
    seed_file(first)
    asyncio.run(_migrated(second))
    with sqlite3.connect(second) as conn:
        conn.execute(
            "CREATE TRIGGER forge AFTER INSERT ON conversation BEGIN"
            " UPDATE conversation SET title = 'forged' WHERE id = new.id; END"
        )
    result = run_copy(tmp_path, str(first), str(second))
    assert result.returncode == 1
    assert "verification failed: conversation c-main: conversation.title differs" in result.stderr
    assert "Traceback" not in result.stderr


async def _migrated(path: Path) -> None:
    async with SQLiteStore(str(path)):
        pass


# -- refusing -------------------------------------------------------------------------------
def test_a_non_empty_destination_is_refused(tmp_path, postgres_dsn):
    first = tmp_path / "first.db"
    seed_file(first)
    env = {"PGDSN": postgres_dsn}
    assert run_copy(tmp_path, str(first), "env:PGDSN", env=env).returncode == 0
    again = run_copy(tmp_path, str(first), "env:PGDSN", env=env)
    assert again.returncode == 1
    assert "the destination is not empty (3 conversation" in again.stderr
    assert "createdb" in again.stderr  # how to start fresh
    # Nothing was written twice.
    back = tmp_path / "back.db"
    assert run_copy(tmp_path, "env:PGDSN", str(back), env=env).returncode == 0
    assert len(table_rows(back)["message"]) == BIG + 6
    # A SQLite destination with rows is refused the same way, and left as it was.
    refused = run_copy(tmp_path, str(first), str(back))
    assert refused.returncode == 1 and "not empty" in refused.stderr
    assert table_rows(back) == table_rows(first)


def test_a_failed_copy_leaves_no_new_file_behind(tmp_path):
    missing = run_copy(tmp_path, str(tmp_path / "nothing.db"), str(tmp_path / "new.db"))
    assert missing.returncode == 2 and "no such database" in missing.stderr
    assert not (tmp_path / "new.db").exists()


# -- secrets -------------------------------------------------------------------------------
def test_a_dsn_is_never_printed(tmp_path, postgres_server):
    """The DSN's password appears nowhere: not in progress, not in the summary, not in
    an error; a DSN given on the command line is refused without being echoed."""
    from pgserver import TESTS

    first = tmp_path / "first.db"
    seed_file(first)
    password = "pw-Sup3r-s3cret"
    good = postgres_server.dsn(TESTS).replace("://agentik@", f"://agentik:{password}@")
    assert password in good  # (the test server trusts: the password is not checked)
    asyncio.run(_empty(good))
    ok = run_copy(tmp_path, str(first), "env:PGDSN", env={"PGDSN": good})
    assert ok.returncode == 0, ok.stderr
    bad = f"postgresql://agentik:{password}@127.0.0.1:1/{TESTS}"  # nothing listens there
    failed = run_copy(tmp_path, str(first), "env:PGDSN", env={"PGDSN": bad})
    assert failed.returncode == 1
    assert "127.0.0.1:1/" in failed.stderr  # where, without who
    on_line = run_copy(tmp_path, str(first), bad)
    assert on_line.returncode == 2 and "env:VAR" in on_line.stderr
    for result in (ok, failed, on_line):
        assert password not in result.stdout + result.stderr
        assert "agentik:" + password not in result.stdout + result.stderr


async def _empty(dsn: str) -> None:
    from pgserver import empty_database

    await empty_database(dsn)


# -- memory notes --------------------------------------------------------------------------
def test_memory_notes_go_along_between_sqlite_files(tmp_path):
    first, second = tmp_path / "first.db", tmp_path / "second.db"
    seed_file(first, notes=True)
    result = run_copy(tmp_path, str(first), str(second))
    assert result.returncode == 0, result.stderr
    a, b = table_rows(first), table_rows(second)
    for t in TABLES:
        assert a[t] == b[t], t
    assert len(b["memory_version"]) == 4  # every version, the deletion's included

    async def search() -> list[str]:
        async with SQLiteStore(str(second)) as store:
            memory = SQLiteMemory(store, search="fts")
            await memory.start()
            found = [n.text for n in await memory.search("vault", ["global"])]
            history = await memory.history(1)
            await memory.aclose()
            return found + [v.text for v in history]

    # The copy's full-text index was built from the copied notes.
    assert asyncio.run(search()) == [
        "the deploy key lives in vault/ops",
        "the deploy key lives in vault",
        "the deploy key lives in vault/ops",
    ]


def test_notes_are_not_left_behind_without_saying_so(tmp_path, postgres_dsn):
    """Into a PostgreSQL without memory notes, notes are left behind only when asked
    (--skip-notes), and said; once PostgreSQL keeps notes, they go there and back."""
    first, back = tmp_path / "first.db", tmp_path / "back.db"
    seed_file(first, notes=True)
    env = {"PGDSN": postgres_dsn}
    if "memory_note" in asyncio.run(_postgres_tables(postgres_dsn)):
        there = run_copy(tmp_path, str(first), "env:PGDSN", env=env)
        assert there.returncode == 0, there.stderr
        assert run_copy(tmp_path, "env:PGDSN", str(back), env=env).returncode == 0
        a, b = table_rows(first), table_rows(back)
        assert all(a[t] == b[t] for t in TABLES) and len(b["memory_version"]) == 4
        return
    refused = run_copy(tmp_path, str(first), "env:PGDSN", env=env)
    assert refused.returncode == 1
    assert "memory notes (2 notes)" in refused.stderr and "--skip-notes" in refused.stderr
    skipped = run_copy(tmp_path, str(first), "env:PGDSN", "--skip-notes", env=env)
    assert skipped.returncode == 0, skipped.stderr
    assert "left out: 2 rows of memory_note" in skipped.stdout


async def _postgres_tables(dsn: str) -> dict[str, list[str]]:
    async with PostgresStore(dsn) as store:
        return await store.copy_tables()


def test_a_table_the_copy_does_not_know_is_named_not_silently_dropped(tmp_path):
    first = tmp_path / "first.db"
    seed_file(first)
    with sqlite3.connect(first) as conn:  # a plugin's (or a newer agentik's) own table
        conn.execute("CREATE TABLE plugin_state (k TEXT PRIMARY KEY, v TEXT)")
        conn.executemany("INSERT INTO plugin_state VALUES (?, ?)", [("a", "1"), ("b", "2")])
    result = run_copy(tmp_path, str(first), str(tmp_path / "second.db"))
    assert result.returncode == 0, result.stderr
    assert "not copied: 2 rows of plugin_state (a table db copy does not know)" in result.stdout
    assert "memory_fts" not in result.stdout  # (indexes the destination builds itself)
