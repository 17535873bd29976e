"""The SQLite writer process (``[storage] writer = "process"``, the default for a
database file): where the dual log's writes and the outbox's run, so writing never
waits for the bot's GIL.  What it must hold to: the same rows and ids as the
thread, the order writes were handed in (across the process and the thread, which
keeps the closures), a failing job failing alone, a killed writer failing only the
batch it held (the thread takes over), and a killed bot taking its writer with it
(a write it never saw committed does not commit after its death)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from agentik.core import SQLiteStore, StoreError
from agentik.core.messages import ChatMessage, NewMessage
from agentik.core.store.base import ConversationRecord, TurnEnd
from agentik.core.store.records import OutboxEntry

from rigs import eventually

SRC = str(Path(__file__).resolve().parent.parent / "src")


def rec(cid: str, t: float = 1.0) -> ConversationRecord:
    return ConversationRecord(id=cid, title="", created_at=t, updated_at=t)


def user(text: str, **kw: object) -> NewMessage:
    return NewMessage(kind="user", content=text, created_at=time.time(), **kw)  # type: ignore[arg-type]


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def status(pid: int) -> str:
    return Path(f"/proc/{pid}/status").read_text()


async def test_a_database_file_gets_a_writer_process_that_the_store_reaps(tmp_path):
    async with SQLiteStore(str(tmp_path / "a.db")) as s:
        pid = s.writer_pid
        assert pid is not None and alive(pid)
        assert b"sqlite_writer" in cmdline(pid)
        assert f"PPid:\t{os.getpid()}\n" in status(pid)  # the store's own child
    assert not alive(pid)  # closed and reaped: no zombie left behind
    async with SQLiteStore(str(tmp_path / "b.db"), writer="thread") as s:
        assert s.writer_pid is None
    async with SQLiteStore(":memory:") as s:
        assert s.writer_pid is None


def test_a_writer_that_is_not_process_or_thread_is_refused():
    with pytest.raises(ValueError, match=r"writer must be process\|thread, not 'fork'"):
        SQLiteStore("x.db", writer="fork")  # type: ignore[arg-type]


@pytest.mark.parametrize("writer", ["process", "thread"])
async def test_both_writers_store_the_same_rows_ids_links_and_outbox(tmp_path, writer):
    """The dual log, a working-memory entry linked to its audit row, a turn's end,
    the outbox and its marks, as read back: the same from either writer."""
    path = str(tmp_path / f"{writer}.db")
    async with SQLiteStore(path, writer=writer) as s:
        first = await s.create_conversation_with(
            rec("c"),
            log=[user("ünïcode ✓", run_id="r1", data={"k": ["v", 1]})],
            memory=[ChatMessage(role="user", content="ünïcode ✓", message_id=-1)],
            channel_key="irc:net:#c",
        )
        second = await s.append(
            "c",
            log=[NewMessage(kind="assistant", content="answer", run_id="r1")],
            memory=[ChatMessage(role="assistant", content="answer", message_id=-1)],
            ended=TurnEnd(run_id="r1", outcome="stop"),
            updated_at=5.0,
        )
        ids = await s.outbox_add(
            [OutboxEntry(channel_key="irc:net:#c", run_id="r1", piece=0, transport="irc",
                         kind="text", text="answer", reply_to={"thread": "t"})]
        )  # fmt: skip
        await s.outbox_mark([(ids[0], "sent", True, "ref-1")])  # sent, awaits its confirmation
    assert second[0].id == first[0].id + 1
    async with SQLiteStore(path, writer="thread") as s:
        assert await s.get_binding("irc:net:#c") == "c"
        stored = await s.messages("c")
        assert [(m.id, m.content, m.data) for m in stored] == [
            (first[0].id, "ünïcode ✓", {"k": ["v", 1]}),
            (second[0].id, "answer", None),
        ]
        assert stored == first + second  # what the writes returned is what was stored
        memory = [e.message for e in await s.load_memory("c")]
        assert [(m.content, m.message_id) for m in memory] == [
            ("ünïcode ✓", first[0].id),
            ("answer", second[0].id),
        ]
        assert await s.pending_turns() == []  # the turn's end was written
        assert (await s.get_conversation("c")).updated_at == 5.0
        (entry,) = await s.outbox_undelivered()
        got = (entry.id, entry.state, entry.awaits_confirm, entry.ref, entry.reply_to)
        assert got == (ids[0], "sent", True, "ref-1", {"thread": "t"})


async def test_closures_and_process_writes_keep_the_order_they_were_handed_in(tmp_path):
    """A closure (``run_write``) runs in the thread, appends in the process: each
    sees everything handed in before it, and ids follow the order of submission."""
    path = str(tmp_path / "o.db")
    async with SQLiteStore(path) as s:
        await s.create_conversation(rec("c"))
        seen: list[int] = []

        def count(conn: sqlite3.Connection) -> int:
            n = conn.execute("SELECT COUNT(*) FROM message").fetchone()[0]
            seen.append(n)
            return n

        writes = []
        for i in range(5):
            writes.append(s.append("c", log=[user(f"m{i}")]))
            writes.append(s.run_write(count))
        results = await asyncio.gather(*writes)
        assert seen == [1, 2, 3, 4, 5]
        ids = [r[0].id for r in results[::2]]
        assert ids == sorted(ids)


async def test_a_failing_job_fails_alone_in_the_process(tmp_path):
    path = str(tmp_path / "f.db")
    async with SQLiteStore(path) as s:
        await s.create_conversation(rec("c"))
        blocker = asyncio.ensure_future(s.append("c", log=[user("first")]))
        writes = [
            s.append("c", log=[user("kept")]),
            s.append("no such conversation", log=[user("refused")]),
            s.outbox_add([OutboxEntry(channel_key="k", run_id="r", piece=0, transport="t",
                                      kind="text", text="x")]),
        ]  # fmt: skip
        await blocker
        kept, refused, outbox = await asyncio.gather(*writes, return_exceptions=True)
        assert isinstance(refused, StoreError) and "FOREIGN KEY" in str(refused)
        assert [m.content for m in kept] == ["kept"] and isinstance(outbox, list)
        assert [m.content for m in await s.messages("c")] == ["first", "kept"]


async def test_a_killed_writer_fails_its_batch_and_the_thread_takes_over(tmp_path, caplog):
    """Killed mid-batch (the OOM killer, say): that batch fails, and says it may or
    may not have committed; the next writes go through the thread, nothing else lost."""
    path = str(tmp_path / "k.db")
    async with SQLiteStore(path, busy_timeout=30.0) as s:
        await s.create_conversation(rec("c"))
        await s.append("c", log=[user("before")])
        pid = s.writer_pid
        assert pid is not None
        lock = sqlite3.connect(path, isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")  # the process's next batch waits for it
        try:
            pending = asyncio.ensure_future(s.append("c", log=[user("in the killed batch")]))
            await asyncio.sleep(0.2)
            assert not pending.done()
            with caplog.at_level(logging.ERROR):
                os.kill(pid, signal.SIGKILL)
                with pytest.raises(StoreError, match="writer process exited"):
                    await asyncio.wait_for(pending, 30)
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        assert "writing from a thread from now on" in caplog.text
        after = await s.append("c", log=[user("after")])
        assert s.writer_pid is None
        assert [m.content for m in await s.messages("c")] == ["before", "after"]
        assert after[0].content == "after"


_CHILD = """
import asyncio, sys
sys.path.insert(0, sys.argv[2])
from agentik.core import SQLiteStore
from agentik.core.store.base import ConversationRecord
from agentik.core.messages import NewMessage

async def main():
    async with SQLiteStore(sys.argv[1], busy_timeout=60.0) as s:
        record = ConversationRecord(id="c", title="", created_at=1, updated_at=1)
        await s.create_conversation(record)
        print(s.writer_pid, flush=True)
        sys.stdin.readline()
        await s.append("c", log=[NewMessage(kind="user", content="never seen committed")])

asyncio.run(main())
"""


async def test_a_killed_bot_takes_its_writer_and_its_unseen_write_with_it(tmp_path):
    """SIGKILL of the bot while its write waits for another's lock: when the lock
    is free, the writer process rolls that write back and ends, so a write the bot
    never saw committed does not commit after its death (as with a writer thread)."""
    path = str(tmp_path / "bot.db")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CHILD, path, SRC,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    lock = sqlite3.connect(path, isolation_level=None, timeout=60)
    try:
        writer = int((await asyncio.wait_for(proc.stdout.readline(), 60)).strip())
        assert alive(writer)
        lock.execute("BEGIN IMMEDIATE")
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
        await asyncio.sleep(0.3)  # the append is in the writer, waiting for the lock
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        assert alive(writer)  # still waiting for the lock
    finally:
        if lock.in_transaction:
            lock.execute("ROLLBACK")
    await eventually(lambda: not alive(writer), "the writer process to end after the bot")
    try:
        assert lock.execute("SELECT content FROM message").fetchall() == []
    finally:
        lock.close()


async def test_a_batch_that_is_not_plain_data_is_written_by_the_thread(tmp_path):
    """A ``str`` subclass (a plugin's) cannot cross to the process: that batch is
    written from the thread, the same rows."""

    class Tagged(str):
        pass

    path = str(tmp_path / "t.db")
    async with SQLiteStore(path) as s:
        await s.create_conversation(rec("c"))
        [m] = await s.append("c", log=[user(Tagged("tagged text"))])
        assert s.writer_pid is not None  # the process stays
        assert [x.content for x in await s.messages("c")] == ["tagged text"]
        assert m.content == "tagged text"


async def test_no_interpreter_to_start_means_the_thread_writes(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))
    with caplog.at_level(logging.WARNING):
        async with SQLiteStore(str(tmp_path / "n.db")) as s:
            assert s.writer_pid is None
            await s.create_conversation(rec("c"))
            await s.append("c", log=[user("hello")])
            assert [m.content for m in await s.messages("c")] == ["hello"]
    assert "writer process not started" in caplog.text


def private_kb(pid: int) -> int:
    total = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(("Private_Clean:", "Private_Dirty:")):
            total += int(line.split()[1])
    return total


async def test_a_burst_of_large_rows_does_not_stay_in_the_writers_memory(tmp_path):
    """512 tool outputs of 20 KB in one batch (about 10 MB of rows): once written,
    the process gives their memory back (it kept 37 MB after such a burst)."""
    async with SQLiteStore(str(tmp_path / "m.db")) as s:
        pid = s.writer_pid
        assert pid is not None
        await s.create_conversation(rec("c"))
        before = private_kb(pid)
        for _ in range(2):
            await asyncio.gather(
                *[
                    s.append("c", log=[NewMessage(kind="tool_result", content=f"{i}" + "y" * 20_000,
                                                  tool_call_id="t")])
                    for i in range(512)
                ]
            )  # fmt: skip
        assert await s.count_messages("c") == 1024
        grown = private_kb(pid) - before
        assert grown < 8 * 1024, f"the writer process kept {grown} KB"


@pytest.mark.parametrize("writer", ["process", "thread"])
async def test_a_row_that_cannot_be_written_fails_alone_and_the_writer_goes_on(tmp_path, writer):
    """Data that is not JSON fails its own write with a StoreError; the writes
    queued with it commit, and the next ones too."""
    async with SQLiteStore(str(tmp_path / "j.db"), writer=writer) as s:
        await s.create_conversation(rec("c"))
        blocker = asyncio.ensure_future(s.append("c", log=[user("first")]))
        bad, good = await asyncio.gather(
            s.append("c", log=[user("bad", data={"not json": object()})]),
            s.append("c", log=[user("queued with it")]),
            return_exceptions=True,
        )
        await blocker
        assert isinstance(bad, StoreError) and "JSON serializable" in str(bad)
        assert [m.content for m in good] == ["queued with it"]
        await s.append("c", log=[user("after")])
        assert [m.content for m in await s.messages("c")] == ["first", "queued with it", "after"]
