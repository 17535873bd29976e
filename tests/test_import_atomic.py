"""A snapshot import is one transaction (issue 35): when the database refuses its last
parts (a checkpoint, an A2A task record), nothing of the snapshot is left behind —
on a real SQLite file and a real PostgreSQL server (tests/pgserver.py).  The
refusal is the database's own: a trigger the test installs, as an operator's
constraint or a full disk would refuse a row."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from agentik.core.lifecycle import SnapshotError, export_conversation, import_conversation
from agentik.core.messages import ChatMessage, NewMessage
from agentik.core.store.records import A2ATaskRecord, ConversationRecord, TurnEnd
from agentik.core.store.sqlite import SQLiteStore

pytest_plugins = ["pgserver"]

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
#: Text a snapshot may hold that no error may repeat.
SECRET = "sk-live-7f3a9c-do-not-echo"
#: Every table a snapshot writes to.
TABLES = ("conversation", "message", "working_memory", "turn_end", "channel_binding", "run",
          "checkpoint", "a2a_task", "attachment")  # fmt: skip


async def _snapshot(tmp_path: Any) -> dict[str, Any]:
    """A conversation with a turn, a binding, an image, two checkpoints and two A2A
    task records, exported from its own SQLite file."""
    async with SQLiteStore(str(tmp_path / "source.db")) as src:
        await src.create_conversation(
            ConversationRecord(id="c", title="t", created_at=1.0, updated_at=1.0, meta={}),
            channel_key="irc:n:#src",
        )
        await src.append(
            "c",
            log=[
                NewMessage(
                    kind="user",
                    content=f"my key is {SECRET}",
                    author="bob",
                    run_id="r1",
                    created_at=2.0,
                ),
                NewMessage(kind="assistant", content="noted", run_id="r1", created_at=3.0),
            ],
            memory=[ChatMessage(role="user", content=f"my key is {SECRET}", message_id=-1)],
            updated_at=3.0,
            ended=TurnEnd("r1", "stop"),
        )
        await src.attachment_put("c", PNG, "image/png", at=2.5)
        for label in ("first", "second"):
            await src.checkpoint_add(
                "c", json.dumps(await export_conversation(src, "c", checkpoints=False)),
                at=4.0, label=label,
            )  # fmt: skip
        for task_id in ("t1", "t2"):
            await src.a2a_task_put(A2ATaskRecord(
                owner="alice", task_id=task_id, conversation_id="c", run_id="r1",
                state="TASK_STATE_COMPLETED", final=True, updated_at=5.0,
                body=json.dumps({"id": task_id, "note": SECRET}),
            ))  # fmt: skip
        doc = await export_conversation(src, "c")
    assert doc is not None and len(doc["checkpoints"]) == 2 and len(doc["a2a_tasks"]) == 2
    return json.loads(json.dumps(doc))


class Engine:
    """The store under test and how to make its database refuse a table's inserts."""

    store: Any

    async def refuse(self, table: str) -> None:
        raise NotImplementedError

    async def allow(self, table: str) -> None:
        raise NotImplementedError

    async def counts(self) -> dict[str, int]:
        return {t: int((await self.store.run_read(f"SELECT COUNT(*) FROM {t}"))[0][0])
                for t in TABLES}  # fmt: skip

    def blobs(self) -> list[str]:
        return []


class SQLiteEngine(Engine):
    def __init__(self, store: SQLiteStore) -> None:
        self.store = store

    async def refuse(self, table: str) -> None:
        await self.store.run_write(
            lambda conn: conn.execute(
                f"CREATE TRIGGER refuse_{table} BEFORE INSERT ON {table}"
                " BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
            )
        )

    async def allow(self, table: str) -> None:
        await self.store.run_write(lambda conn: conn.execute(f"DROP TRIGGER refuse_{table}"))

    def blobs(self) -> list[str]:
        folder = self.store.attachment_folder
        return sorted(os.listdir(folder)) if folder and os.path.isdir(folder) else []


class PostgresEngine(Engine):
    def __init__(self, store: Any) -> None:
        self.store = store

    async def refuse(self, table: str) -> None:
        await self.store.run_write(
            lambda conn: conn.execute(
                "CREATE OR REPLACE FUNCTION agentik_test_refuse() RETURNS trigger"
                " LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'refused by the test'"
                # (The detail quotes the row, as a constraint's "Failing row contains"
                # does: it must not reach the error.)
                " USING DETAIL = row_to_json(NEW)::text; END $$;"
                f" CREATE TRIGGER refuse_{table} BEFORE INSERT ON {table}"
                " FOR EACH ROW EXECUTE FUNCTION agentik_test_refuse()"
            )
        )

    async def allow(self, table: str) -> None:
        await self.store.run_write(
            lambda conn: conn.execute(f"DROP TRIGGER IF EXISTS refuse_{table} ON {table}")
        )


async def _existing(store: Any) -> None:
    """What the target database holds already: none of it may change."""
    await store.create_conversation(
        ConversationRecord(id="here", title="here", created_at=1.0, updated_at=1.0, meta={}),
        channel_key="irc:n:#here",
    )
    await store.append(
        "here",
        log=[NewMessage(kind="user", content="hello", run_id="h1", created_at=2.0)],
        memory=[ChatMessage(role="user", content="hello", message_id=-1)],
        ended=TurnEnd("h1", "stop"),
    )
    await store.checkpoint_add("here", '{"n": 0}', at=3.0, label="mine")
    await store.a2a_task_put(A2ATaskRecord(
        owner="carol", task_id="h", conversation_id="here", run_id="h1",
        state="TASK_STATE_COMPLETED", final=True, updated_at=4.0, body="{}",
    ))  # fmt: skip


class AtomicImport:
    """The tests, on each engine's ``engine`` fixture."""

    @pytest.mark.parametrize(
        ("table", "part"),
        [("checkpoint", "checkpoints[0]"), ("a2a_task", "a2a_tasks[0]")],
    )
    async def test_a_part_the_database_refuses_leaves_the_database_as_it_was(
        self, engine: Engine, tmp_path: Any, table: str, part: str
    ) -> None:
        doc = await _snapshot(tmp_path)
        await _existing(engine.store)
        before = await engine.counts()
        blobs = engine.blobs()
        await engine.refuse(table)
        with pytest.raises(SnapshotError) as caught:
            await import_conversation(engine.store, json.loads(json.dumps(doc)), new_ids=True)
        message = str(caught.value)
        # Named: which part, and the database's reason; never what the snapshot said.
        assert message.startswith(f"{part}: cannot be restored: "), message
        assert "refused by the test" in message
        assert SECRET not in message and "my key is" not in message
        assert await engine.counts() == before
        # (SQLite keeps attachment bytes in files: none is left for the refused import.)
        assert engine.blobs() == blobs
        assert await engine.store.get_binding("irc:n:#src") is None
        # The same snapshot, once the database takes it: everything of it is in.
        await engine.allow(table)
        result = await import_conversation(engine.store, json.loads(json.dumps(doc)), new_ids=True)
        after = await engine.counts()
        grown = {t: after[t] - before[t] for t in TABLES}
        assert grown == {"conversation": 1, "message": 2, "working_memory": 1, "turn_end": 1,
                         "channel_binding": 1, "run": 0, "checkpoint": 2, "a2a_task": 2,
                         "attachment": 1}  # fmt: skip
        cid = result.conversation_id
        assert [c.label for c in await engine.store.checkpoints(cid)] == ["second", "first"]
        [held] = await engine.store.attachments(cid)
        assert await engine.store.attachment_data(held.sha256) == PNG
        task = await engine.store.a2a_task_get("imported:alice", "t1")
        assert (task.conversation_id, task.answer) == (cid, "noted")

    async def test_a_refused_import_on_a_busy_store_loses_no_other_write(
        self, engine: Engine, tmp_path: Any
    ) -> None:
        """The import fails while other writes of the bot go on: theirs commit, none of
        the snapshot's does (each engine batches writes into shared transactions)."""
        doc = await _snapshot(tmp_path)
        await _existing(engine.store)
        before = await engine.counts()
        await engine.refuse("a2a_task")
        writes = [
            engine.store.append(
                "here",
                log=[NewMessage(kind="user", content=f"m{i}", run_id=f"x{i}", created_at=10.0 + i)],
            )
            for i in range(5)
        ]
        got = await asyncio.gather(
            import_conversation(engine.store, json.loads(json.dumps(doc)), new_ids=True),
            *writes,
            return_exceptions=True,
        )
        assert isinstance(got[0], SnapshotError), got[0]
        assert not any(isinstance(g, BaseException) for g in got[1:]), got[1:]
        after = await engine.counts()
        assert after == {**before, "message": before["message"] + 5}


class TestSQLite(AtomicImport):
    @pytest_asyncio.fixture
    async def engine(self, tmp_path: Any) -> AsyncIterator[Engine]:
        async with SQLiteStore(str(tmp_path / "target.db")) as store:
            yield SQLiteEngine(store)


class TestPostgres(AtomicImport):
    @pytest_asyncio.fixture
    async def engine(self, postgres_dsn: str) -> AsyncIterator[Engine]:
        from agentik.core.store.postgres import PostgresStore

        async with PostgresStore(postgres_dsn) as store:
            pg = PostgresEngine(store)
            try:
                yield pg
            finally:  # (the database is reused by the next test: its rows go, triggers stay)
                for table in ("checkpoint", "a2a_task"):
                    await pg.allow(table)
                await store.run_write(
                    lambda conn: conn.execute("DROP FUNCTION IF EXISTS agentik_test_refuse()")
                )
