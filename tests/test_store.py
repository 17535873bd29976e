"""What the SQLite engine promises beyond the store contract: durability, group
commit, deferred writes, file layout.  The contract itself (every engine) is
agentik.core.store.testing, run by tests/test_store_contract.py."""

from __future__ import annotations

import asyncio
import sqlite3
import time

import pytest

from agentik.core import SQLiteStore, StoreError
from agentik.core.errors import ClosedError
from agentik.core.messages import NewMessage
from agentik.core.store.base import ConversationRecord


def rec(cid, t=1.0, title=""):
    return ConversationRecord(id=cid, title=title, created_at=t, updated_at=t)


def user(text, **kw):
    return NewMessage(kind="user", content=text, created_at=time.time(), **kw)


async def test_internal_conversation_writes_commit_and_leave_full_sync(tmp_path):
    """A child run's conversation (internal) commits without its own fsync; its
    rows are committed all the same, and other writes keep ``synchronous = full``."""
    path = str(tmp_path / "s.db")
    async with SQLiteStore(path) as s:
        s.set_internal("k", True)
        await s.trace_statements(True)
        await s.create_conversation_with(rec("k"), log=[user("task", run_id="run_1")])
        await asyncio.gather(s.append("k", log=[user("more")]), s.append("k", log=[user("end")]))
        s.set_internal("k", False)
        await s.create_conversation(rec("top"))
        statements = await s.trace_statements(False)
        # The internal batches commit with NORMAL and set FULL back; "top" is written
        # with FULL (no NORMAL around its batch).
        modes = [st for st in statements if st.startswith("PRAGMA synchronous")]
        assert modes and modes[0] == "PRAGMA synchronous = NORMAL", statements
        assert modes[-1] == "PRAGMA synchronous = FULL", statements
        top = max(i for i, st in enumerate(statements) if "INTO conversation" in st)
        assert not any(st.startswith("PRAGMA synchronous") for st in statements[top:]), statements
        mode = await s.run_write(lambda conn: conn.execute("PRAGMA synchronous").fetchone()[0])
        assert mode == 2  # FULL
        await s.append("top", log=[user("hello")])
    async with SQLiteStore(path) as s:
        assert [m.content for m in await s.messages("k")] == ["task", "more", "end"]
        assert [m.content for m in await s.messages("top")] == ["hello"]


async def test_a_deferred_write_commits_with_the_write_that_follows(tmp_path):
    """``defer``: a child run's last write waits for its parent's tool result and
    both go in one transaction (one COMMIT; one fsync for the two)."""
    path = str(tmp_path / "d.db")
    async with SQLiteStore(path) as s:
        await s.create_conversation(rec("child"))
        await s.create_conversation(rec("parent"))
        await s.trace_statements(True)
        end = asyncio.ensure_future(s.append("child", log=[user("answer")], defer=True))
        for _ in range(5):
            await asyncio.sleep(0)  # submitted: held, not written
        assert not end.done()
        result = await s.append("parent", log=[user("tool result")])
        assert end.done() and [m.content for m in end.result()] == ["answer"]
        assert result[0].id == end.result()[0].id + 1  # in submission order
        statements = await s.trace_statements(False)
        assert statements.count("COMMIT") == 1, statements
    async with SQLiteStore(path) as s:
        assert [m.content for m in await s.messages("child")] == ["answer"]


async def test_a_deferred_write_queued_behind_a_commit_waits_for_the_next_write(tmp_path):
    """A held write that arrives while a commit is in flight does not make a commit
    of its own when that one ends (a sixth of the Slack benchmark's commits held
    only outbox rows): it goes in with the next write that is not held."""
    path = str(tmp_path / "q.db")
    async with SQLiteStore(path, defer_max=60.0) as s:  # the timer never decides here
        await s.create_conversation(rec("a"))
        await s.create_conversation(rec("b"))
        await s.trace_statements(True)
        first = asyncio.ensure_future(s.append("a", log=[user("in flight")]))
        held = asyncio.ensure_future(s.append("b", log=[user("held")], defer=True))
        await first
        assert not held.done()
        await s.append("a", log=[user("next")])
        assert [m.content for m in held.result()] == ["held"]
        statements = await s.trace_statements(False)
        # "in flight" alone, then held + next in one commit.
        assert statements.count("COMMIT") == 2, statements
        held_late = asyncio.ensure_future(s.append("b", log=[user("at close")], defer=True))
        await asyncio.sleep(0)
    # Closing commits what is still held.
    assert [m.content for m in held_late.result()] == ["at close"]
    async with SQLiteStore(path) as s:
        assert [m.content for m in await s.messages("a")] == ["in flight", "next"]
        assert [m.content for m in await s.messages("b")] == ["held", "at close"]


async def test_new_conversations_join_the_batch_and_a_duplicate_fails_alone(tmp_path):
    """New conversations (a Slack thread's first message) written in one batch with
    other appends share its statements: one read of the next message id, not one
    per conversation; one that cannot be written (its id is taken) fails alone."""
    path = str(tmp_path / "n.db")
    async with SQLiteStore(path) as s:
        await s.create_conversation(rec("old"))
        await s.trace_statements(True)
        blocker = asyncio.ensure_future(s.append("old", log=[user("in flight")]))
        writes = [
            s.create_conversation_with(rec(f"t{i}"), log=[user(f"q{i}")], channel_key=f"k{i}")
            for i in range(3)
        ]
        writes.append(s.append("old", log=[user("more")]))
        writes.append(s.create_conversation_with(rec("old"), log=[user("lost?")]))
        await blocker
        results = await asyncio.gather(*writes, return_exceptions=True)
        statements = await s.trace_statements(False)
        assert isinstance(results[-1], StoreError)
        assert [[m.content for m in r] for r in results[:4]] == [["q0"], ["q1"], ["q2"], ["more"]]
    # The batch failed whole once (the duplicate), then each write alone: count the first try.
    begins = [i for i, st in enumerate(statements) if st == "BEGIN IMMEDIATE"]
    first = statements[begins[1] : statements.index("ROLLBACK")]
    assert sum("MAX(id)" in st for st in first) == 1, first
    async with SQLiteStore(path) as s:
        for i in range(3):
            assert await s.get_binding(f"k{i}") == f"t{i}"
            assert [m.content for m in await s.messages(f"t{i}")] == [f"q{i}"]
        assert [m.content for m in await s.messages("old")] == ["in flight", "more"]


async def test_a_deferred_write_with_nothing_after_it_commits_anyway(tmp_path):
    """Nothing follows (the parent was stopped): it commits on its own, and a
    store closed at once still writes it."""
    path = str(tmp_path / "e.db")
    async with SQLiteStore(path) as s:
        await s.create_conversation(rec("c"))
        rows = await asyncio.wait_for(s.append("c", log=[user("alone")], defer=True), 60)
        assert [m.content for m in rows] == ["alone"]
        last = asyncio.ensure_future(s.append("c", log=[user("at close")], defer=True))
        await asyncio.sleep(0)
    assert [m.content for m in last.result()] == ["at close"]
    async with SQLiteStore(path) as s:
        assert [m.content for m in await s.messages("c")] == ["alone", "at close"]


async def test_sqlite_file_layout_and_append_only(tmp_path):
    path = str(tmp_path / "a.db")
    async with SQLiteStore(path) as s:
        await s.create_conversation(rec("c"))
        await s.append("c", log=[user("hello")])
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        con.execute("UPDATE message SET content = 'forged'")
    assert con.execute("SELECT content FROM message").fetchone()[0] == "hello"
    con.close()


async def test_concurrent_appends_are_group_committed_and_isolated(tmp_path):
    """Many writers at once: every commit lands; one bad write fails alone."""
    async with SQLiteStore(str(tmp_path / "g.db")) as s:
        for i in range(20):
            await s.create_conversation(rec(f"c{i}"))
        writes = [s.append(f"c{i % 20}", log=[user(f"m{i}")]) for i in range(400)]
        writes.insert(200, s.append("missing", log=[user("orphan")]))
        results = await asyncio.gather(*writes, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        assert len(errors) == 1 and isinstance(errors[0], StoreError)
        total = sum([await s.count_messages(f"c{i}") for i in range(20)])
        assert total == 400
        ids = [r[0].id for r in results if not isinstance(r, BaseException)]
        assert ids == sorted(ids), "audit-log order follows submission order"


async def test_messages_written_together_are_searchable_and_the_index_stays_whole(tmp_path):
    """A batch's audit-log rows go in as multi-row INSERTs (past 64 rows, more
    than one): each is found by search, a batch that fails is retried write by
    write, and redacting and deleting some rows leaves the index matching the
    log: one indexed document per user and assistant row, FTS5's and SQLite's
    integrity checks pass.  (FTS5's check against the content table, ``rank``
    1, cannot hold: the tool rows in it are not indexed, on purpose.)"""
    path = str(tmp_path / "f.db")

    def turn(i: int) -> list[NewMessage]:
        return [
            user(f"question{i} about walrus"),
            NewMessage(kind="tool_result", content=f"walrus tool {i}", tool_call_id="t"),
            NewMessage(kind="assistant", content=f"answer{i} about walrus"),
        ]

    async with SQLiteStore(path) as s:
        for i in range(5):
            await s.create_conversation(rec(f"c{i}"))
        await s.trace_statements(True)
        await asyncio.gather(*[s.append(f"c{i % 5}", log=turn(i)) for i in range(40)])
        statements = await s.trace_statements(False)
        inserts = {st for st in statements if st.startswith("INSERT INTO message (")}
        assert 0 < len(inserts) < 10, len(inserts)  # 40 appends, 120 rows
        writes = [s.append(f"c{i % 5}", log=turn(i)) for i in range(40, 60)]
        writes.insert(10, s.append("missing", log=[user("walrus orphan")]))
        results = await asyncio.gather(*writes, return_exceptions=True)
        assert sum(isinstance(r, StoreError) for r in results) == 1
        assert len(await s.search_messages("walrus", limit=500)) == 120  # not the tool's rows
        assert {h.snippet for h in await s.search_messages("question17")} == {
            "question17 about walrus"
        }
        (answer,) = await s.search_messages("answer17")
        await s.redact_message(
            answer.conversation_id, answer.message_id, content="(gone)", by="a", reason="", at=1.0
        )
        assert await s.search_messages("answer17") == []
        await s.delete_conversation("c3")
        assert len(await s.search_messages("walrus", limit=500)) == 120 - 24 - 1
    con = sqlite3.connect(path)
    indexed = con.execute("SELECT id FROM message_fts_docsize ORDER BY id").fetchall()
    said = "SELECT id FROM message WHERE kind IN ('user', 'assistant') ORDER BY id"
    assert indexed == con.execute(said).fetchall() and len(indexed) == 120 - 24
    con.execute("INSERT INTO message_fts (message_fts) VALUES ('integrity-check')")
    assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    con.close()


async def test_closed_store_refuses_work(tmp_path):
    s = SQLiteStore(str(tmp_path / "c.db"))
    await s.start()
    await s.aclose()
    with pytest.raises(ClosedError):
        await s.append("c", log=[user("x")])


async def test_unopenable_path_is_a_clear_error(tmp_path):
    bad = tmp_path / "no" / "such" / "dir" / "x.db"
    with pytest.raises(StoreError, match="cannot open database"):
        await SQLiteStore(str(bad)).start()
