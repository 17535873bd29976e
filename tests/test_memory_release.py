"""The notes' vectors follow the scopes in use: a scope (a channel's notes, a
user's) that goes unused for ``[memory] release_vectors_after_idle`` leaves memory
and is read back from the database by its next search; a restarted bot counts
its vectors instead of reading them all.  Searches find the same notes either way,
on SQLite and on PostgreSQL (tests/memengines.py), and writes that land while a
scope is read back are not lost."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from memengines import Database

from agentik.bot.app import load_registry
from agentik.bot.builder import AgentBuilder
from agentik.bot.config import parse_config
from agentik.core import ConfigError
from agentik.core.memory.embeddings import BuiltinEmbedder, normalize
from agentik.core.memory.sqlite import RELEASE_AFTER, SQLiteMemory
from agentik.core.memory.vectors import VectorIndex

pytest_plugins = ["pgserver", "memengines"]

TOKYO = "Heidi speaks fluent Japanese and handles the Tokyo customers."
QUESTION = "who talks to our clients in Japan?"
FILLER = (
    "Alice's favourite colour is teal.",
    "Bob is allergic to peanuts; no satay at team lunches.",
    "Expense reports must be filed within thirty days of purchase.",
)
SCOPES = [f"channel:mem:#c{i}" for i in range(4)]


@pytest.fixture(scope="module")
def embedder() -> BuiltinEmbedder:
    return BuiltinEmbedder()


async def open_memory(db: Database, embedder: Any, **kw: Any) -> tuple[Any, SQLiteMemory]:
    store, memory_class = db()
    await store.start()
    memory = memory_class(store, embedder=embedder, **kw)
    await memory.start()
    return store, memory


async def wait_for(check: Any, what: str, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within} s: {what}")
        await asyncio.sleep(0.02)


async def fill(memory: SQLiteMemory) -> dict[str, int]:
    """Each scope gets the fillers and its own Tokyo note; returns the latter's ids."""
    tokyo = {}
    for scope in SCOPES:
        for text in FILLER:
            await memory.save(scope, f"{text} ({scope})")
        tokyo[scope] = (await memory.save(scope, f"{TOKYO} ({scope})")).id
    return tokyo


async def test_idle_scopes_leave_memory_and_their_next_search_reads_them_back(open_db, embedder):
    store, memory = await open_memory(open_db, embedder, release_after=0.2)
    trims: list[float] = []
    memory.on_release = lambda: trims.append(time.monotonic())
    try:
        tokyo = await fill(memory)
        before = {
            s: [(n.id, round(c, 5)) for n, c in await memory.recall(QUESTION, [s], k=4)]
            for s in SCOPES
        }
        assert all(before[s][0][0] == tokyo[s] for s in SCOPES)
        index = memory._index
        assert index is not None and memory.scopes_loaded == len(SCOPES)

        await wait_for(lambda: len(index) == 0, "every idle scope's vectors freed")
        assert memory.scopes_released >= len(SCOPES) and trims  # and the agent asked to trim
        assert index.count(SCOPES) >= 4 * len(SCOPES)  # recall still knows there is something

        # The same answers, read back from the database, one scope at a time.
        loaded = memory.scopes_loaded
        got = [(n.id, round(c, 5)) for n, c in await memory.recall(QUESTION, [SCOPES[1]], k=4)]
        assert got == before[SCOPES[1]]
        assert memory.scopes_loaded == loaded + 1  # that scope only
        hits = await memory.search_scored(QUESTION, SCOPES[2:], limit=2, mode="vector")
        assert {n.id for n, _ in hits} == {tokyo[SCOPES[2]], tokyo[SCOPES[3]]}

        # A note saved in a cold scope is found with the others once it is read back.
        await wait_for(lambda: len(index) == 0, "released again")
        new = await memory.save(SCOPES[0], "Heidi also covers the Osaka office.")
        hits = await memory.search_scored("Osaka office", [SCOPES[0]], limit=10, mode="vector")
        assert new.id in {n.id for n, _ in hits} and len(hits) == 5
        # A note deleted while its scope is cold is not found when it comes back.
        await wait_for(lambda: len(index) == 0, "released again")
        assert await memory.delete(tokyo[SCOPES[3]])
        hits = await memory.search_scored(QUESTION, [SCOPES[3]], limit=10, mode="vector")
        assert tokyo[SCOPES[3]] not in {n.id for n, _ in hits} and len(hits) == 3
    finally:
        await memory.aclose()
        await store.aclose()


async def test_a_restarted_bot_counts_the_vectors_and_reads_only_the_scopes_it_searches(
    open_db, embedder
):
    store, memory = await open_memory(open_db, embedder)
    try:
        tokyo = await fill(memory)
    finally:
        await store.aclose()
    store, memory = await open_memory(open_db, embedder, sync_interval=0)
    try:
        hits = await memory.search_scored(QUESTION, [SCOPES[0]], limit=1, mode="vector")
        assert hits[0][0].id == tokyo[SCOPES[0]]
        index = memory._index
        assert index is not None and len(index) == 4  # one scope of four in memory
        assert index.count(None) == 4 * len(SCOPES)
        # Searching everything reads every scope back.
        hits = await memory.search_scored(QUESTION, None, limit=4, mode="vector")
        assert {n.id for n, _ in hits} == set(tokyo.values()) and len(index) == 16
    finally:
        await store.aclose()


async def test_writes_while_a_scope_is_read_back_are_kept(open_db, embedder):
    """A save and a delete racing a search that reads the scope back: whichever
    order the database sees them in, the scope's vectors end up as the table's."""
    store, memory = await open_memory(open_db, embedder, release_after=3600)
    try:
        tokyo = await fill(memory)
        await memory.search(QUESTION, SCOPES)  # (the first search counts the vectors)
        index = memory._index
        assert index is not None
        for round_ in range(6):
            index.release_idle(time.monotonic() + 1)
            assert len(index) == 0
            scope = SCOPES[round_ % len(SCOPES)]
            victim = (await memory.save(scope, f"note to drop {round_}")).id
            index.release_idle(time.monotonic() + 1)
            search = asyncio.ensure_future(
                memory.search_scored(QUESTION, [scope], limit=50, mode="vector")
            )
            for _ in range(round_ % 3):
                await asyncio.sleep(0)
            saved, deleted = await asyncio.gather(
                memory.save(scope, f"Heidi's note number {round_}"), memory.delete(victim)
            )
            await search
            assert deleted
            hits = await memory.search_scored(QUESTION, [scope], limit=50, mode="vector")
            ids = {n.id for n, _ in hits}
            assert saved.id in ids and victim not in ids and tokyo[scope] in ids
            assert index.vector(saved.id) is not None and index.vector(victim) is None
    finally:
        await store.aclose()


# A model of the database (``live``) against the index, with scopes released and read
# back while puts, moves and removals land during the read.
_OPS = st.lists(
    st.tuples(
        st.sampled_from(["put", "put", "remove", "release", "load"]),
        st.integers(1, 20),
        st.sampled_from(["global", "a", "b", "c"]),
        st.integers(0, 2**31 - 1),
        st.integers(0, 3),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(ops=_OPS, during=_OPS, scopes=st.sets(st.sampled_from(["global", "a", "b", "c"])))
def test_release_and_read_back_keep_exactly_the_live_vectors(ops, during, scopes):
    index, live = VectorIndex(8), {}

    def apply(op: str, nid: int, scope: str, seed: int) -> None:
        if op == "put":
            vec = normalize(np.random.default_rng(seed).standard_normal(8))[0]
            index.put(nid, scope, vec)
            live[nid] = (scope, vec)
        elif op == "remove":
            index.remove(nid)
            live.pop(nid, None)
        elif op == "release":
            index.release_idle(time.monotonic() + 1)

    def load(names: list[str], ops_meanwhile: list[Any], read_after: int) -> None:
        """Read ``names`` back, with ``ops_meanwhile`` landing during the read (the
        database's snapshot is taken after ``read_after`` of them)."""
        index.begin_load(names)
        snapshot = None
        for i, (op, nid, scope, seed, _) in enumerate(ops_meanwhile):
            if i == read_after:
                snapshot = dict(live)
            if op in ("put", "remove"):
                apply(op, nid, scope, seed)
        if snapshot is None:
            snapshot = dict(live)
        for name in names:
            rows = [(n, v) for n, (s, v) in snapshot.items() if s == name]
            matrix = np.array([v for _, v in rows], dtype=np.float32).reshape(len(rows), 8)
            index.install(name, [n for n, _ in rows], matrix)

    for op, nid, scope, seed, at in ops:
        if op == "load":
            load(index.cold_scopes(None), during[: 3 * at], at)
        else:
            apply(op, nid, scope, seed)
    load(index.cold_scopes(None), during, len(during) // 2)
    load(index.cold_scopes(None), [], 0)  # (what a second search would do)
    assert index.cold_scopes(None) == []
    for s in scopes:  # a count is never below the truth
        assert index.count([s]) >= sum(1 for sc, _ in live.values() if sc == s)
    query = normalize(np.arange(1, 9, dtype=np.float32))[0]
    got = index.search(query, None, 100)
    want = sorted(((nid, float(v @ query)) for nid, (_, v) in live.items()), key=lambda x: -x[1])
    assert sorted(nid for nid, _ in got) == sorted(live)
    assert [round(s, 5) for _, s in got] == [round(s, 5) for _, s in want]
    for nid, (scope, _) in live.items():
        assert index.search(index.vector(nid), [scope], 100)  # found in its own scope
    assert len(index) == len(live)


def test_the_setting_is_validated_and_reaches_the_memory(tmp_path: Path):
    def build(value: Any) -> Any:
        config = parse_config(
            {
                "llm": {"base_url": "http://127.0.0.1:9/v1", "model": "m"},
                "storage": {"path": str(tmp_path / "c.db")},
                "memory": {"release_vectors_after_idle": value},
            },
            env={},
        )
        return AgentBuilder.from_config(config, load_registry(config)).build()

    agent = build("20m")
    assert isinstance(agent.memory, SQLiteMemory) and agent.memory.release_after == 1200
    assert agent.memory.on_release == agent.services.trim.released
    assert build(0).memory.release_after == 0
    with pytest.raises(ConfigError, match="release_vectors_after_idle"):
        build(-5)
    assert RELEASE_AFTER == 900
