"""The store contract, checked on every engine we ship."""

from __future__ import annotations

import asyncio
import sqlite3
import time

import pytest

from agentik.core import MemoryStore, SQLiteStore, StoreError
from agentik.core.errors import ClosedError
from agentik.core.messages import ChatMessage, NewMessage
from agentik.core.store.base import ConversationRecord


@pytest.fixture(params=["sqlite-file", "sqlite-memory", "memory"])
async def store(request, tmp_path):
    if request.param == "sqlite-file":
        s = SQLiteStore(str(tmp_path / "s.db"))
    elif request.param == "sqlite-memory":
        s = SQLiteStore(":memory:")
    else:
        s = MemoryStore()
    async with s:
        yield s


def rec(cid, t=1.0, title=""):
    return ConversationRecord(id=cid, title=title, created_at=t, updated_at=t)


def user(text, **kw):
    return NewMessage(kind="user", content=text, created_at=time.time(), **kw)


async def test_conversation_crud_and_listing(store):
    await store.create_conversation(rec("a", 1.0, "first"))
    await store.create_conversation(rec("b", 2.0))
    assert (await store.get_conversation("a")).title == "first"
    assert await store.get_conversation("zzz") is None
    assert [r.id for r in await store.list_conversations()] == ["b", "a"]
    await store.update_conversation("a", title="renamed", updated_at=3.0)
    page = await store.list_conversations(limit=1)
    assert [(r.id, r.title) for r in page] == [("a", "renamed")]
    assert [r.id for r in await store.list_conversations(limit=1, offset=1)] == ["b"]


async def test_append_returns_ids_and_pages_history(store):
    await store.create_conversation(rec("c"))
    rows = await store.append("c", log=[user(f"m{i}", author="bob") for i in range(10)])
    ids = [r.id for r in rows]
    assert ids == sorted(ids) and len(set(ids)) == 10
    assert rows[0].author == "bob" and rows[0].conversation_id == "c"
    assert [m.content for m in await store.messages("c", limit=3)] == ["m7", "m8", "m9"]
    assert [m.content for m in await store.messages("c", after=ids[2], limit=2)] == ["m3", "m4"]
    assert [m.content for m in await store.messages("c", before=ids[2], limit=5)] == ["m0", "m1"]
    assert [m.content for m in await store.messages("c", offset=8, limit=5)] == ["m8", "m9"]
    assert await store.count_messages("c") == 10


async def test_messages_filter_by_kind_and_keep_fields(store):
    await store.create_conversation(rec("c"))
    await store.append(
        "c",
        log=[
            user("hi"),
            NewMessage(kind="tool_call", tool_call_id="t1", tool_name="add", arguments='{"a":1}'),
            NewMessage(
                kind="tool_result",
                tool_call_id="t1",
                tool_name="add",
                content="2",
                data={"sum": 2},
                is_error=False,
                duration=0.25,
            ),
            NewMessage(kind="assistant", content="partial", status="interrupted", run_id="r1"),
        ],
    )
    results = await store.messages("c", kinds=["tool_result"])
    assert len(results) == 1 and results[0].data == {"sum": 2} and results[0].duration == 0.25
    assistant = (await store.messages("c", kinds=["assistant"]))[0]
    assert assistant.status == "interrupted" and assistant.run_id == "r1"


async def test_working_memory_append_and_compact_leaves_audit_log(store):
    await store.create_conversation(rec("c"))
    for i in range(6):
        await store.append(
            "c", log=[user(f"u{i}")], memory=[ChatMessage(role="user", content=f"u{i}")]
        )
    entries = await store.load_memory("c")
    assert [e.message.content for e in entries] == [f"u{i}" for i in range(6)]
    await store.compact("c", entries[3].pos, ChatMessage(role="system", content="summary"))
    after = [e.message.content for e in await store.load_memory("c")]
    assert after == ["summary", "u4", "u5"]
    # Appends after a compaction go after the kept tail.
    await store.append("c", memory=[ChatMessage(role="user", content="u6")])
    assert [e.message.content for e in await store.load_memory("c")][-1] == "u6"
    assert await store.count_messages("c") == 6


async def test_delete_cascades_to_every_row(store):
    await store.create_conversation(rec("gone"), channel_key="irc:net:#gone")
    await store.create_conversation(rec("kept"), channel_key="irc:net:#kept")
    for cid in ("gone", "kept"):
        await store.append(cid, log=[user("x")], memory=[ChatMessage(role="user", content="x")])
    assert await store.delete_conversation("gone") is True
    assert await store.delete_conversation("gone") is False
    assert await store.get_conversation("gone") is None
    assert await store.get_binding("irc:net:#gone") is None
    assert await store.messages("gone") == []
    assert await store.load_memory("gone") == []
    assert await store.get_binding("irc:net:#kept") == "kept"
    assert await store.count_messages("kept") == 1


async def test_bindings(store):
    await store.create_conversation(rec("a"), channel_key="stdio:local")
    await store.create_conversation(rec("b"))
    assert await store.get_binding("stdio:local") == "a"
    await store.set_binding("stdio:local", "b")
    assert await store.get_binding("stdio:local") == "b"


async def test_todo_checklist_is_replaced_cleared_and_goes_with_its_conversation(store):
    from agentik.core.questions import Checklist

    await store.create_conversation(rec("a"))
    await store.create_conversation(rec("b"))
    assert await store.todo_get("a") is None
    first = Checklist(
        items=({"text": "plan", "status": "in_progress"},), run_id="r1", updated_at=1.0
    )
    await store.todo_set("a", first)
    await store.todo_set("b", first)
    assert await store.todo_get("a") == first
    later = Checklist(
        items=({"text": "plan", "status": "done"}, {"text": "ship ✓", "status": "pending"}),
        run_id="r2",
        updated_at=2.0,
    )
    await store.todo_set("a", later)  # replaces the whole list
    assert await store.todo_get("a") == later
    await store.todo_set("a", Checklist(items=(), run_id="r3", updated_at=3.0))  # emptied: gone
    assert await store.todo_get("a") is None
    await store.todo_set("a", later)
    await store.todo_set("a", None)
    assert await store.todo_get("a") is None
    with pytest.raises(StoreError):
        await store.todo_set("nope", first)
    assert await store.delete_conversation("b") is True
    assert await store.todo_get("b") is None


async def test_append_to_missing_conversation_fails_cleanly(store):
    with pytest.raises(StoreError):
        await store.append("nope", log=[user("x")])


async def test_create_conversation_with_its_first_rows(store):
    stored = await store.create_conversation_with(
        rec("k", 5.0, "child"),
        log=[user("task", author="bob", run_id="run_1")],
        memory=[ChatMessage(role="user", content="task", message_id=-1)],
        updated_at=6.0,
    )
    assert [(m.content, m.conversation_id) for m in stored] == [("task", "k")]
    got = await store.get_conversation("k")
    assert (got.title, got.updated_at) == ("child", 6.0)
    assert [m.id for m in await store.messages("k")] == [stored[0].id]
    [entry] = await store.load_memory("k")
    assert entry.message.message_id == stored[0].id
    # A second conversation with that id fails and writes none of its rows.
    with pytest.raises(StoreError):
        await store.create_conversation_with(rec("k"), log=[user("again")])
    assert [m.content for m in await store.messages("k")] == ["task"]


async def test_internal_conversation_writes_commit_and_leave_full_sync(tmp_path):
    """A child run's conversation (internal) commits without its own fsync; its
    rows are committed all the same, and other writes keep ``synchronous = full``."""
    path = str(tmp_path / "s.db")
    async with SQLiteStore(path) as s:
        s.set_internal("k", True)
        await s.create_conversation_with(rec("k"), log=[user("task", run_id="run_1")])
        await asyncio.gather(s.append("k", log=[user("more")]), s.append("k", log=[user("end")]))
        s.set_internal("k", False)
        mode = await s.run_write(lambda conn: conn.execute("PRAGMA synchronous").fetchone()[0])
        assert mode == 2  # FULL
        await s.create_conversation(rec("top"))
        await s.append("top", log=[user("hello")])
    async with SQLiteStore(path) as s:
        assert [m.content for m in await s.messages("k")] == ["task", "more", "end"]
        assert [m.content for m in await s.messages("top")] == ["hello"]


async def test_every_engine_takes_a_deferred_write(store):
    await store.create_conversation(rec("c"))
    first = asyncio.ensure_future(store.append("c", log=[user("held")], defer=True))
    await asyncio.sleep(0)  # submitted first
    await store.append("c", log=[user("next")])
    assert [m.content for m in await first] == ["held"]
    assert [m.content for m in await store.messages("c")] == ["held", "next"]


async def test_a_deferred_write_commits_with_the_write_that_follows(tmp_path):
    """``defer``: a child run's last write waits for its parent's tool result and
    both go in one transaction (one COMMIT; one fsync for the two)."""
    path = str(tmp_path / "d.db")
    async with SQLiteStore(path) as s:
        await s.create_conversation(rec("child"))
        await s.create_conversation(rec("parent"))
        statements: list[str] = []
        await s.run_write(lambda conn: conn.set_trace_callback(statements.append))
        statements.clear()
        end = asyncio.ensure_future(s.append("child", log=[user("answer")], defer=True))
        await asyncio.sleep(0)  # submitted: held, not written
        assert not end.done() and statements == []
        result = await s.append("parent", log=[user("tool result")])
        assert end.done() and [m.content for m in end.result()] == ["answer"]
        assert statements.count("COMMIT") == 1, statements
        assert result[0].id == end.result()[0].id + 1  # in submission order
        await s.run_write(lambda conn: conn.set_trace_callback(None))
    async with SQLiteStore(path) as s:
        assert [m.content for m in await s.messages("child")] == ["answer"]


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
