"""Helper threads leave the event loop's CPU to the loop (agentik.core.threads): a
helper that wakes does not preempt the loop thread, on Linux (``SCHED_BATCH``)."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from agentik.core.threads import yield_to_loop

linux = pytest.mark.skipif(sys.platform != "linux", reason="SCHED_BATCH is Linux's")


def _policy_in_thread(target) -> int:
    """The scheduling policy of a thread after it ran ``target``."""
    out: list[int] = []

    def run() -> None:
        target()
        out.append(os.sched_getscheduler(0))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return out[0]


@linux
def test_a_helper_thread_becomes_a_batch_thread_and_only_it():
    before = os.sched_getscheduler(0)
    assert _policy_in_thread(yield_to_loop) == os.SCHED_BATCH
    # Only the calling thread: the others (the event loop's, here the test's) are
    # left as they were, and a new thread starts as they do.
    assert os.sched_getscheduler(0) == before
    assert _policy_in_thread(lambda: None) == before


@linux
async def test_the_slack_handled_events_file_writes_from_a_batch_thread(tmp_path):
    from agentik.transports.slack.transport import _Seen

    seen = _Seen(str(tmp_path / "seen.sqlite3"), keep=100)
    seen.open()
    try:
        # A write done by the file's thread: it has set its policy by then.
        await seen.write(["event:first"])
        thread = seen._thread
        assert thread is not None and thread.native_id is not None
        assert os.sched_getscheduler(thread.native_id) == os.SCHED_BATCH
    finally:
        seen.close()
    again = _Seen(str(tmp_path / "seen.sqlite3"), keep=100)
    again.open()
    try:
        assert list(again.keys) == ["event:first"]  # and the write was done
    finally:
        again.close()


@linux
async def test_the_sqlite_store_writes_from_a_batch_thread(tmp_path):
    from agentik.core.store.records import ConversationRecord
    from agentik.core.store.sqlite import SQLiteStore

    store = SQLiteStore(str(tmp_path / "agentik.db"))
    await store.start()
    try:
        # A write: the thread has run (and set its policy) by then.
        await store.create_conversation(ConversationRecord(id="c1", title="t"))
        writers = [t for t in threading.enumerate() if t.name == "agentik-sqlite-writer"]
        assert writers and writers[0].native_id is not None
        assert os.sched_getscheduler(writers[0].native_id) == os.SCHED_BATCH
        got = await store.get_conversation("c1")
        assert got is not None and got.title == "t"  # and the write was done
    finally:
        await store.aclose()
