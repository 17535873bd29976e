"""The store contract suite (agentik.core.store.testing) on every engine we ship:
SQLite in a file, SQLite in memory (``:memory:``), the in-memory engine and PostgreSQL
(a real server, tests/pgserver.py: one per worker, a fresh database per test)."""

from __future__ import annotations

import pytest_asyncio

from agentik.core import Agent, MemoryStore, SQLiteStore
from agentik.core.lifecycle import export_conversation
from agentik.core.messages import ChatMessage, NewMessage
from agentik.core.store.base import CAPABILITIES
from agentik.core.store.records import Checklist, ConversationRecord, RunRecord, TurnEnd
from agentik.core.store.testing import StoreContract
from agentik.core.store.testing.kit import approval, question
from agentik.core.testing.scripted import ScriptedModel

pytest_plugins = ["pgserver"]


class TestSQLiteFileContract(StoreContract):
    @pytest_asyncio.fixture
    async def store(self, tmp_path):
        async with SQLiteStore(str(tmp_path / "contract.db")) as s:
            yield s


class TestSQLiteFileThreadContract(StoreContract):
    """A file written from the thread (``writer = "thread"``), not the default process."""

    @pytest_asyncio.fixture
    async def store(self, tmp_path):
        async with SQLiteStore(str(tmp_path / "contract.db"), writer="thread") as s:
            yield s


class TestSQLiteMemoryContract(StoreContract):
    @pytest_asyncio.fixture
    async def store(self):
        async with SQLiteStore(":memory:") as s:
            yield s


class TestMemoryContract(StoreContract):
    @pytest_asyncio.fixture
    async def store(self):
        async with MemoryStore() as s:
            yield s


class TestPostgresContract(StoreContract):
    @pytest_asyncio.fixture
    async def store(self, postgres_dsn):
        from agentik.core.store.postgres import PostgresStore

        async with PostgresStore(postgres_dsn) as s:
            yield s


# -- one snapshot, whatever the engine -----------------------------------------------------
async def _seed(store) -> None:
    """The same conversation, written the same way: a bound channel, one finished turn
    that asked for an approval and a question, a run, a checklist, one open turn."""
    await store.create_conversation(
        ConversationRecord(id="c", title="t", created_at=1.0, updated_at=1.0, meta={"k": 1}),
        channel_key="irc:n:#c",
    )
    await store.append(
        "c",
        log=[
            NewMessage(kind="user", content="hi", author="bob", run_id="r1", created_at=2.0),
            NewMessage(kind="assistant", content="yo", run_id="r1", created_at=3.0),
        ],
        memory=[ChatMessage(role="user", content="hi", message_id=-1)],
        updated_at=3.0,
        ended=TurnEnd("r1", "stop", RunRecord(run_id="r1", conversation_id="c", started=2.0)),
    )
    serial = await store.approval_add(approval("c"))
    await store.approval_resolve(serial, "approved", "al", None, "ok", 4.0)
    qid = await store.question_add(question("c"))
    await store.question_settle(qid, "answered", "red", "bob", 5.0)
    await store.todo_set("c", Checklist(items=({"text": "x", "status": "done"},), updated_at=6.0))
    await store.append(
        "c", log=[NewMessage(kind="user", content="and?", run_id="r2", created_at=7.0)]
    )


def _differences(a, b, where="snapshot") -> list[str]:
    """Every field where two snapshots differ (their times of writing aside)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{where}.{k}: only in one" for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            if k == "exported_at" or (where.startswith("turn_ends") and k == "created_at"):
                if not (isinstance(a[k], float) and isinstance(b[k], float)):
                    out.append(f"{where}.{k}: not a time")
                continue
            out += _differences(a[k], b[k], f"{where}.{k}" if where != "snapshot" else k)
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} rows against {len(b)}"]
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in _differences(x, y, f"{where}[{i}]")
        ]
    return [] if a == b and type(a) is type(b) else [f"{where}: {a!r} against {b!r}"]


async def test_every_engine_exports_the_same_snapshot(tmp_path):
    docs = []
    for store in (SQLiteStore(str(tmp_path / "a.db")), SQLiteStore(":memory:"), MemoryStore()):
        async with store:
            await _seed(store)
            docs.append(await export_conversation(store, "c"))
    sqlite_file, sqlite_memory, memory = docs
    assert set(sqlite_file) >= {"approvals", "questions", "runs", "turn_ends", "bindings"}
    assert len(sqlite_file["turn_ends"]) == 1 and len(sqlite_file["approvals"]) == 1
    assert _differences(sqlite_file, sqlite_memory) == []
    assert _differences(sqlite_file, memory) == []


async def test_a_one_turn_conversation_exports_alike_from_sqlite_and_memory(tmp_path):
    """The same turn through a real agent: the snapshot has the same shape on both."""
    docs = []
    for store in (SQLiteStore(str(tmp_path / "a.db")), MemoryStore()):
        model = ScriptedModel()
        model.enqueue("hello there")
        async with Agent(llm=model, store=store) as agent:
            conv = await agent.create_conversation()
            await conv.send("hi")
            await conv.wait_idle()
            docs.append(await export_conversation(agent.store, conv.id))
    on_sqlite, in_memory = docs
    assert set(on_sqlite) == set(in_memory)
    for key in (
        "messages",
        "working_memory",
        "bindings",
        "turn_ends",
        "approvals",
        "questions",
        "runs",
    ):
        assert len(on_sqlite[key]) == len(in_memory[key]), key
    assert len(on_sqlite["turn_ends"]) == 1
    assert [t["outcome"] for t in on_sqlite["turn_ends"]] == [
        t["outcome"] for t in in_memory["turn_ends"]
    ]
    assert [(m["kind"], m["content"]) for m in on_sqlite["messages"]] == [
        (m["kind"], m["content"]) for m in in_memory["messages"]
    ]


async def test_the_built_in_engines_keep_every_optional_group(tmp_path):
    for store in (SQLiteStore(str(tmp_path / "a.db")), MemoryStore()):
        assert store.capabilities == set(CAPABILITIES)
