"""Events and waits across workers: two ``agentik run`` processes on one PostgreSQL.

Real processes all the way (as tests/test_cluster_failover.py): two workers on a real
PostgreSQL (tests/pgserver.py), each serving the HTTP API on its own port, the fake
OpenAI-compatible server streaming slowly (so clients connect and reconnect while a
turn runs).  What a user of the API would notice:

* an SSE client on worker A sees every event of a turn that runs on worker B, with
  the ``id`` (``seq``) and the JSON a client on B gets;
* a client that drops mid-turn and reconnects with ``Last-Event-ID`` — to the other
  worker, or to the same — gets the rest, with no gap and no duplicate;
* an approval of a turn running on A, decided through B's API, resumes the turn on
  A; a question asked by a turn on A, answered through B, too.

Every wait is on something observable (an event on a stream, an HTTP answer) with a
generous deadline: a loaded machine starts processes slowly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from cluster import PATIENCE, http_transport, until, worker_config, workers

from agentik.core.events import event_to_json
from agentik.core.testing.openai_server import Reply

from httpserver import TOKENS, SSEMessage, SSEReader, sse

pytest_plugins = ["pgserver"]

DSN_ENV = "AGENTIK_TEST_EVENTS_DSN"
ALICE, ADMIN = TOKENS["ALICE_TOKEN"], TOKENS["ADMIN_TOKEN"]
#: Both workers: ask_user and todo on, todo's calls approved by an admin, the HTTP API
#: with a token for alice and one for the admin.
TOOLS = """[tools]
ask_user = true
todo = true
"""
ACCESS = """[access]
admins = ["web:token:admin"]
[[approvals]]
tools = ["todo"]
approvers = "admin"
"""
TOKENS_LINE = (
    'tokens = [{ name = "alice", env = "ALICE_TOKEN" }, { name = "admin", env = "ADMIN_TOKEN" }]'
)


def two_workers(
    tmp_path: Path, dsn: str, openai_url: str, *, log: str = "warning", extra: str = ""
) -> Any:
    """Workers ``a`` and ``b`` serving the HTTP API, started and ready (``log``: their
    log level; ``extra``: more configuration, before ``[cluster]``)."""

    def config(name: str, port: int) -> str:
        web = http_transport("web", port, TOKENS_LINE)
        logging = f'[logging]\nlevel = "{log}"\n'
        return worker_config(name, openai_url, dsn_env=DSN_ENV, poll=2.0, health=False,
                             before_cluster=TOOLS + logging + extra,
                             extra=ACCESS + web)  # fmt: skip

    return workers(["a", "b"], tmp_path, dsn, config, dsn_env=DSN_ENV,
                   env={"ALICE_TOKEN": ALICE, "ADMIN_TOKEN": ADMIN}, ready="/ready",
                   stop=signal.SIGTERM)  # fmt: skip


def frames(messages: list[SSEMessage]) -> list[tuple[int | None, str]]:
    """Each event as the client got it: its ``id`` and its JSON (keys sorted)."""
    return [(m.id, json.dumps(m.data, sort_keys=True)) for m in messages if m.data is not None]


async def read_until(reader: SSEReader, kind: str, count: int = 1) -> list[SSEMessage]:
    """Messages up to and including the ``count``-th of ``kind``."""
    got: list[SSEMessage] = []
    while sum(m.kind == kind for m in got) < count:
        got += await reader.until(kind, timeout=PATIENCE)
    return got


def tool_results(body: dict[str, Any]) -> list[str]:
    return [str(m.get("content")) for m in body["messages"] if m["role"] == "tool"]


async def test_an_sse_client_on_one_worker_follows_a_turn_on_the_other(
    postgres_dsn, openai_server, tmp_path
):
    openai_server.default = lambda body: Reply.text(
        "one two three four five six seven eight nine ten " * 3, chunks=30, delay=0.03
    )
    async with two_workers(tmp_path, postgres_dsn, openai_server.base_url) as (a, b):
        async with b.client(ALICE) as on_b, a.client(ALICE) as on_a:
            conv = (await on_b.post("/conversations", json={})).json()
            path = f"/conversations/{conv['id']}/events"
            # (1) A client on each worker from the start; the turn runs on B.
            async with sse(on_a, path, params={"after": "0"}) as ra, sse(on_b, path) as rb:
                r = await on_b.post(f"/conversations/{conv['id']}/messages",
                                    json={"content": "count to ten"})  # fmt: skip
                assert r.status_code == 202
                seen_b = await read_until(rb, "run_stream_end")
                seen_a = await read_until(ra, "run_stream_end")
            assert next(m.kind for m in seen_a if m.data) == "turn_started"
            assert sum(m.kind == "text_delta" for m in seen_b) >= 10
            # Every event, the same ids, the same JSON: a client cannot tell the workers apart.
            assert frames(seen_a) == frames(seen_b)
            ids = [m.id for m in seen_a if m.data]
            assert ids == list(range(ids[0], ids[0] + len(ids)))

            # (2) A second turn, run on B: a client on B drops mid-turn and reconnects to
            # A with Last-Event-ID, then drops again and reconnects to A again.
            async with sse(on_b, path, params={"after": str(ids[-1])}) as whole:
                await on_b.post(f"/conversations/{conv['id']}/messages",
                                json={"content": "again"})  # fmt: skip
                async with sse(on_b, path, params={"after": str(ids[-1])}) as first:
                    part1 = await read_until(first, "text_delta", 3)
                last = part1[-1].id
                assert last is not None
                async with sse(on_a, path, headers={"Last-Event-ID": str(last)}) as second:
                    part2 = await read_until(second, "text_delta", 3)
                last = part2[-1].id
                assert last is not None
                async with sse(on_a, path, headers={"Last-Event-ID": str(last)}) as third:
                    part3 = await read_until(third, "run_stream_end")
                everything = await read_until(whole, "run_stream_end")
            assert frames(part1 + part2 + part3) == frames(everything)
            got = [m.id for m in part1 + part2 + part3 if m.data]
            assert got == list(range(ids[-1] + 1, ids[-1] + 1 + len(got)))  # no gap, no twice

            # (3) A turn on A after B's: it continues B's numbers (seq is the conversation's).
            async with sse(on_b, path, params={"after": str(got[-1])}) as rb:
                r = await on_a.post(f"/conversations/{conv['id']}/messages", json={"content": "3"})
                third_turn = await read_until(rb, "run_stream_end")
            started = next(m for m in third_turn if m.kind == "turn_started")
            assert started.data is not None and started.data["run_id"] == r.json()["run_id"]
            assert [m.id for m in third_turn] == list(
                range(got[-1] + 1, got[-1] + 1 + len(third_turn))
            )


async def test_an_approval_decided_on_another_worker_resumes_the_turn(
    postgres_dsn, openai_server, tmp_path
):
    items = {"items": [{"text": "ship it", "status": "pending"}]}
    openai_server.enqueue(
        Reply.tool_calls([("call-1", "todo", json.dumps(items))]),
        Reply.text("the list is set", chunks=3),
    )
    async with two_workers(tmp_path, postgres_dsn, openai_server.base_url) as (a, b):
        async with a.client(ALICE) as alice_a, b.client(ADMIN) as admin_b:
            conv = (await alice_a.post("/conversations", json={})).json()
            base = f"/conversations/{conv['id']}"
            async with sse(alice_a, base + "/events") as events:
                r = await alice_a.post(base + "/messages", json={"content": "make a list"})
                assert r.status_code == 202
                asked = (await events.until("approval_requested", timeout=PATIENCE))[-1].data
                assert asked is not None and asked["name"] == "todo"
                # Decided through B's API, whose process holds no waiter for it.
                pending = (await admin_b.get(base + "/approvals")).json()["items"]
                assert [(p["id"], p["may_approve"]) for p in pending] == [
                    (asked["approval_id"], True)
                ]
                url = f"{base}/approvals/{asked['approval_id']}"
                ok = await admin_b.post(url, json={"decision": "approve", "reason": "go"})
                assert ok.status_code == 200, ok.text
                assert ok.json()["decision"] == "approved"
                rest = await events.until("turn_ended", timeout=PATIENCE)
            resolved = next(m.data for m in rest if m.kind == "approval_resolved")
            assert resolved is not None
            assert (resolved["decision"], resolved["approver"]) == ("approved", "admin")
            ended = rest[-1].data
            assert ended is not None and ended["stop_reason"] == "stop"
            # The tool ran on A: the model's next request has its result, not a refusal.
            results = tool_results(openai_server.requests[-1])
            assert len(results) == 1 and not results[0].startswith("error")
            again = await admin_b.post(url, json={"decision": "deny"})
            assert again.status_code == 409


async def test_a_question_answered_on_another_worker_resumes_the_turn(
    postgres_dsn, openai_server, tmp_path
):
    ask = {"question": "which colour?", "choices": ["red", "blue"]}
    openai_server.enqueue(
        Reply.tool_calls([("call-1", "ask_user", json.dumps(ask))]),
        Reply.text("blue it is", chunks=3),
    )
    async with two_workers(tmp_path, postgres_dsn, openai_server.base_url) as (a, b):
        async with a.client(ALICE) as alice_a, b.client(ALICE) as alice_b:
            conv = (await alice_a.post("/conversations", json={})).json()
            base = f"/conversations/{conv['id']}"
            async with sse(alice_a, base + "/events") as events:
                r = await alice_a.post(base + "/messages", json={"content": "paint it"})
                assert r.status_code == 202
                turn = r.json()["run_id"]
                await events.until("question_asked", timeout=PATIENCE)
                # Alice's answer arrives through B: it answers, it starts no turn of its own.
                answer = await alice_b.post(base + "/messages", json={"content": "blue"})
                assert answer.status_code == 202, answer.text
                assert answer.json()["run_id"] == turn
                rest = await events.until("turn_ended", timeout=PATIENCE)
            answered = next(m.data for m in rest if m.kind == "question_answered")
            assert answered is not None
            assert (answered["outcome"], answered["answer"]) == ("answered", "blue")
            assert [m.kind for m in rest].count("turn_started") == 0
            results = tool_results(openai_server.requests[-1])
            assert len(results) == 1 and "blue" in results[0]


async def test_a_form_answered_in_parts_through_the_other_worker_resumes_the_turn(
    postgres_dsn, openai_server, tmp_path
):
    ask = {
        "questions": [
            {"id": "colour", "text": "which colour?", "choices": ["red", "blue"]},
            {"id": "coats", "text": "how many coats?"},
        ]
    }
    openai_server.enqueue(
        Reply.tool_calls([("call-1", "ask_user", json.dumps(ask))]),
        Reply.text("two blue coats", chunks=3),
    )
    async with two_workers(tmp_path, postgres_dsn, openai_server.base_url) as (a, b):
        async with a.client(ALICE) as alice_a, b.client(ALICE) as alice_b:
            conv = (await alice_a.post("/conversations", json={})).json()
            base = f"/conversations/{conv['id']}"
            async with sse(alice_a, base + "/events") as events:
                r = await alice_a.post(base + "/messages", json={"content": "paint it"})
                assert r.status_code == 202
                asked = (await events.until("question_asked", timeout=PATIENCE))[-1].data
                assert asked is not None
                form = f"{base}/questions/{asked['question_id']}"
                # Both parts through both workers: the store keeps the first for the second.
                part = await alice_b.post(
                    form, json={"answers": {"colour": "blue"}, "submit": False}
                )
                assert part.status_code == 200, part.text
                assert part.json()["missing"] == ["coats"]
                rest_b = await alice_b.post(form, json={"answers": {"coats": "2"}})
                assert rest_b.status_code == 200, rest_b.text
                assert rest_b.json()["done"] is True
                rest = await events.until("turn_ended", timeout=PATIENCE)
            answered = next(m.data for m in rest if m.kind == "question_answered")
            assert answered is not None and answered["outcome"] == "answered"
            assert json.loads(answered["answer"]) == {"colour": "blue", "coats": "2"}
            results = tool_results(openai_server.requests[-1])
            assert [json.loads(r) for r in results] == [{"colour": "blue", "coats": "2"}]


async def test_a_redaction_on_one_worker_scrubs_the_replay_on_both(
    postgres_dsn, openai_server, tmp_path
):
    openai_server.default = lambda body: Reply.text("the secret is swordfish", chunks=4)
    async with two_workers(tmp_path, postgres_dsn, openai_server.base_url) as (a, b):
        async with a.client(ADMIN) as on_a, b.client(ADMIN) as on_b:
            conv = (await on_b.post("/conversations", json={})).json()
            base = f"/conversations/{conv['id']}"
            async with sse(on_b, base + "/events") as rb:
                await on_b.post(base + "/messages", json={"content": "tell me"})
                await read_until(rb, "run_stream_end")
            # Both workers replay it (B from its buffer and the stored events, A stored).
            for client in (on_a, on_b):
                async with sse(client, base + "/events", params={"after": "0"}) as r:
                    said = "".join(
                        (m.data or {}).get("text", "") for m in await read_until(r, "turn_ended")
                    )
                assert "swordfish" in said
            rows = (await on_a.get(base + "/messages")).json()["items"]
            answer = next(m for m in rows if m["kind"] == "assistant")
            # Redacted through A: neither worker replays what it said any more.
            done = await on_a.post(f"{base}/messages/{answer['id']}/redact", json={"reason": "x"})
            assert done.status_code == 200, done.text

            async def replayed(client: httpx.AsyncClient) -> str:
                async with sse(client, base + "/events", params={"after": "0"}) as r:
                    got = await read_until(r, "turn_ended")
                return json.dumps([m.data for m in got])

            assert "swordfish" not in await replayed(on_a)
            # B's own buffer is scrubbed on the notification (within moments).
            await until(
                lambda: _without(replayed(on_b), "swordfish"), "B's replay without the secret"
            )


async def _stored_turn_started(dsn: str) -> bool:
    """Whether a worker stored a ``turn_started`` event (straight from the database)."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        found = await conn.fetchval(
            "SELECT count(*) FROM run_event WHERE data LIKE '%\"turn_started\"%'"
        )
    finally:
        await conn.close()
    return bool(found)


async def _without(text: Any, word: str) -> bool:
    return word not in await text


# -- in one process: what is written, and where nothing is -----------------------------------
async def test_on_postgresql_a_turn_is_stored_but_a_temporary_conversation_never(postgres_dsn):
    from agentik.core import Agent
    from agentik.core.store.postgres import PostgresStore
    from agentik.core.testing.scripted import ScriptedModel

    model = ScriptedModel()
    model.enqueue("kept", "never kept")
    async with Agent(llm=model, store=PostgresStore(postgres_dsn)) as agent:
        kept = await agent.create_conversation()
        await kept.send("hi")
        await kept.wait_idle()
        temp = await agent.create_conversation(temp=True)
        await temp.send("hi")
        await temp.wait_idle()
        stored = await agent.store.run_events_after(kept.id, 0)
        # Every event of the turn, numbered from 1, as the stream sent them.
        kinds = [json.loads(d)["kind"] for _, d in stored]
        assert kinds[0] == "turn_started" and kinds[-1] == "run_stream_end"
        assert [s for s, _ in stored] == list(range(1, len(stored) + 1))
        assert await agent.store.run_events_last(temp.id) == 0
        # Deleted: its events go with it.
        await agent.delete_conversation(kept.id)
        assert await agent.store.run_events_last(kept.id) == 0


async def test_on_sqlite_nothing_is_stored_and_nothing_follows(tmp_path):
    import sqlite3

    from agentik.core import Agent, SQLiteStore
    from agentik.core.testing.scripted import ScriptedModel

    model = ScriptedModel()
    model.enqueue("hello")
    path = tmp_path / "one.db"
    async with Agent(llm=model, store=SQLiteStore(str(path))) as agent:
        conv = await agent.create_conversation()
        await conv.send("hi")
        await conv.wait_idle()
        assert agent.cluster_events is None
        assert agent.store.notifier().topics == frozenset()
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT count(*) FROM run_event").fetchone() == (0,)


async def test_a_follower_whose_listening_connection_drops_misses_nothing(postgres_dsn):
    """Two agents on one database in one process: B follows a turn that runs on A.
    B's listening connection is killed by the server mid-turn; the notifications sent
    meanwhile are lost, and B's stream still gets every event (the notifier's resync
    after it reconnects reads them)."""
    import asyncpg

    from agentik.core import Agent
    from agentik.core.store.postgres import PostgresStore
    from agentik.core.testing.scripted import Reply as Scripted
    from agentik.core.testing.scripted import ScriptedModel

    reply = Scripted(text=" ".join(f"w{i}" for i in range(30)), hold_after=5)
    model = ScriptedModel()
    model.enqueue(reply)
    async with (
        Agent(llm=model, store=PostgresStore(postgres_dsn)) as on_a,
        Agent(llm=ScriptedModel(), store=PostgresStore(postgres_dsn)) as on_b,
    ):
        assert on_a.cluster_events is not None and on_b.cluster_events is not None
        conv = await on_a.create_conversation()
        await on_b.store.notifier().listening()
        follower = await on_b.cluster_events.subscribe(
            await on_b.get_conversation(conv.id), after=0
        )
        await conv.send("go")
        got = []
        async for event in follower:
            got.append(event)
            if sum(e.kind == "text_delta" for e in got) == 5:
                break
        await asyncio.wait_for(reply.held.wait(), PATIENCE)
        # The server drops B's listening connection; A goes on meanwhile.
        listener = on_b.store.notifier()._conn
        assert listener is not None
        admin = await asyncpg.connect(postgres_dsn)
        try:
            await admin.execute("SELECT pg_terminate_backend($1)", listener.get_server_pid())
        finally:
            await admin.close()
        reply.release.set()
        async for event in follower:
            got.append(event)
            if event.kind == "run_stream_end":
                break
        await follower.aclose()
        assert on_b.store.notifier().connections >= 2  # it was dropped, and listens again
    assert "events_lost" not in [e.kind for e in got]
    assert [e.seq for e in got] == list(range(1, len(got) + 1))
    assert "".join(e.text for e in got if e.kind == "text_delta").split() == [
        f"w{i}" for i in range(30)
    ]


async def test_an_agent_wide_client_resumes_on_the_other_agent_with_the_same_ids(
    postgres_dsn,
):
    """Two agents on one database in one process.  A client of B's agent-wide stream
    drops; turns run on A and on B while it is away; it resumes on A with its last id
    and gets exactly what a client of B connected all along got after that id: the
    same events, the same ids, in the same order.  An id from before what the
    retention pruned gets ``events_lost`` first, then what is still stored; an id
    that is no position of these events gets ``events_lost``, then the events to come."""
    from agentik.core import Agent
    from agentik.core.store.postgres import PostgresStore
    from agentik.core.testing.scripted import Reply as Scripted
    from agentik.core.testing.scripted import ScriptedModel

    words = [f"w{i}" for i in range(12)]

    def model() -> ScriptedModel:
        m = ScriptedModel()
        for _ in range(4):
            m.enqueue(Scripted(text=" ".join(words), chunks=words))
        return m

    async def read_turns(stream: Any, n: int, got: list[Any] | None = None) -> list[Any]:
        got = [] if got is None else got
        while sum(e.kind == "turn_ended" for e in got) < n:
            got.append(await asyncio.wait_for(anext(stream), PATIENCE))
        return got

    def frames(events: list[Any]) -> list[tuple[int, str]]:
        return [(e.stream_seq, event_to_json(e)) for e in events]

    async with (
        Agent(llm=model(), store=PostgresStore(postgres_dsn)) as on_a,
        Agent(llm=model(), store=PostgresStore(postgres_dsn)) as on_b,
    ):
        hub_a, hub_b = on_a.cluster_events, on_b.cluster_events
        assert hub_a is not None and hub_b is not None
        for agent in (on_a, on_b):
            await agent.store.notifier().listening()
        here, there = await on_a.create_conversation(), await on_b.create_conversation()
        whole = await hub_b.subscribe_all(after=None)
        client = await hub_b.subscribe_all(after=None)
        await here.send("one")
        first = await read_turns(client, 1)
        last = first[-1].stream_seq
        await client.aclose()
        # Away: a turn on A, one on B.
        await here.send("two")
        await there.send("two")
        await here.wait_idle()
        await there.wait_idle()
        everything = await read_turns(whole, 3)
        hub_a.page = 7  # (the gap is read in several pages)
        resumed = await hub_a.subscribe_all(after=last)
        again = await read_turns(resumed, 2)
        expected = [e for e in everything if e.stream_seq > last]
        assert frames(again) == frames(expected)
        ids = [e.stream_seq for e in first + again]
        assert ids == sorted(set(ids))  # none twice, in order
        for conv in (here, there):
            said = "".join(
                e.text for e in again if e.kind == "text_delta" and e.conversation_id == conv.id
            )
            assert said == "".join(words)
        # Live on A from there: B's next turn comes with the ids B's client gets.
        await there.send("three")
        live_a = await read_turns(resumed, 1)
        live_b = await read_turns(whole, 1)
        assert frames(live_a) == frames(live_b)
        await resumed.aclose()
        await whole.aclose()

        # The retention pruned the first turns: resuming from before them is told.
        assert await hub_a.prune(now=time.time() + 2 * 24 * 3600) > 0
        await there.send("four")
        await there.wait_idle()
        old = await hub_a.subscribe_all(after=last)
        got = await read_turns(old, 1)
        assert got[0].kind == "events_lost" and got[0].stream_seq == last
        assert got[1].kind == "turn_started"
        assert "".join(e.text for e in got if e.kind == "text_delta") == "".join(words)
        await old.aclose()
        # An id that is no position here (another database's): told, then what comes.
        newest, _ = await on_a.store.run_events_position()
        foreign = await hub_a.subscribe_all(after=newest + 1000)
        assert (await asyncio.wait_for(anext(foreign), PATIENCE)).kind == "events_lost"
        await here.send("five")
        fifth = await read_turns(foreign, 1)
        assert fifth[0].kind == "turn_started"
        assert fifth[0].stream_seq > newest
        await foreign.aclose()


async def test_a_temporary_conversation_reaches_the_agent_wide_stream_live_without_an_id(
    postgres_dsn,
):
    """A temporary conversation is never stored: its events reach the agent-wide
    clients of the agent running it as they come, framed without an SSE ``id`` (the
    client's ``Last-Event-ID`` stays the last stored event's), and a stored
    conversation's events go on with positions after it."""
    from agentik.core import Agent
    from agentik.core.store.postgres import PostgresStore
    from agentik.core.testing.scripted import Reply as Scripted
    from agentik.core.testing.scripted import ScriptedModel
    from agentik.transports.http.sse import FrameCache

    model = ScriptedModel()
    model.enqueue(Scripted(text="gone soon", chunks=["gone ", "soon"]))
    model.enqueue(Scripted(text="kept", chunks=["kept"]))
    async with Agent(llm=model, store=PostgresStore(postgres_dsn)) as agent:
        hub = agent.cluster_events
        assert hub is not None
        stream = await hub.subscribe_all(after=None)
        temp = await agent.create_conversation(temp=True)
        kept = await agent.create_conversation()
        got: list[Any] = []

        async def until_ended(conv_id: str) -> None:
            while not any(e.kind == "turn_ended" and e.conversation_id == conv_id for e in got):
                got.append(await asyncio.wait_for(anext(stream), PATIENCE))

        await temp.send("hi")
        await until_ended(temp.id)
        await kept.send("hi")
        await until_ended(kept.id)
        await stream.aclose()
        mine = [e for e in got if e.conversation_id == temp.id]
        assert "".join(e.text for e in mine if e.kind == "text_delta") == "gone soon"
        assert {e.stream_seq for e in mine} == {0}
        cache = FrameCache()
        assert all(not cache.frame(e, global_ids=True).startswith(b"id:") for e in mine)
        stored = [e for e in got if e.conversation_id == kept.id]
        assert stored and all(e.stream_seq > 0 for e in stored)
        assert cache.frame(stored[-1], global_ids=True).startswith(
            b"id: %d\n" % stored[-1].stream_seq
        )
        # Nothing of it was stored: a resumption from before it does not replay it.
        assert not await agent.store.run_events_after(temp.id, 0)


@pytest.mark.timeout(400)  # two workers and three slow turns, on a loaded machine
async def test_an_interrupt_through_one_worker_stops_the_turn_running_on_the_other(
    postgres_dsn, openai_server, tmp_path
):
    """The HTTP API's interrupt reaches the worker running the turn: asked through B,
    whose process runs nothing, the turn on A stops (its partial answer kept, marked
    interrupted); asked again once it ended, B says no turn is running."""
    words = [f"w{i}" for i in range(300)]

    def model(body: dict[str, Any]) -> Reply:
        users = [m for m in body["messages"] if m["role"] == "user"]
        if users and "stop that" in str(users[-1].get("content")):
            return Reply.text("stopped", chunks=1)
        return Reply.text(" ".join(words), chunks=300, delay=0.1)

    openai_server.default = model
    async with two_workers(tmp_path, postgres_dsn, openai_server.base_url) as (a, b):
        async with a.client(ALICE) as on_a, b.client(ALICE) as on_b:
            conv = (await on_a.post("/conversations", json={})).json()
            path = f"/conversations/{conv['id']}/events"
            # B's follower reads what A stores: once it sees the answer coming, B can too.
            async with sse(on_b, path, params={"after": "0"}) as rb:
                r = await on_a.post(f"/conversations/{conv['id']}/messages",
                                    json={"content": "count slowly"})  # fmt: skip
                assert r.status_code == 202
                run_id = r.json()["run_id"]
                seen = await read_until(rb, "text_delta", 3)
                stop = await on_b.post(f"/conversations/{conv['id']}/interrupt", json={})
                assert stop.status_code == 202, stop.text
                assert stop.json()["run_id"] == run_id
                seen += await read_until(rb, "run_stream_end")
            kinds = [m.kind for m in seen]
            assert "interrupted" in kinds, kinds
            assert sum(k == "text_delta" for k in kinds) < len(words)
            history = (await on_b.get(f"/conversations/{conv['id']}/messages")).json()["items"]
            answer = [m for m in history if m["kind"] == "assistant" and m["run_id"] == run_id]
            assert answer and answer[-1]["status"] == "interrupted"
            again = await on_b.post(f"/conversations/{conv['id']}/interrupt", json={})
            assert again.status_code == 409
            assert again.json()["error"]["code"] == "no_turn_running"

            # A message with busy = "interrupt" through B: A's running turn stops, the
            # message gets its own turn.
            async with sse(on_b, path, params={"after": str(seen[-1].id)}) as rb:
                r = await on_a.post(f"/conversations/{conv['id']}/messages",
                                    json={"content": "count slowly again"})  # fmt: skip
                second = r.json()["run_id"]
                more = await read_until(rb, "text_delta", 3)
                r = await on_b.post(f"/conversations/{conv['id']}/messages",
                                    json={"content": "stop that", "busy": "interrupt"})  # fmt: skip
                assert r.status_code == 202, r.text
                third = r.json()["run_id"]
                more += await read_until(rb, "run_stream_end", 2)
            stopped = [m for m in more if m.kind == "interrupted"]
            assert stopped and stopped[0].data is not None
            assert stopped[0].data["run_id"] == second
            started = [m.data["run_id"] for m in more if m.kind == "turn_started" and m.data]
            assert started == [second, third]


@pytest.mark.timeout(400)  # two workers and two turns, on a loaded machine
async def test_a_message_steered_through_one_worker_joins_the_turn_running_on_the_other(
    postgres_dsn, openai_server, tmp_path
):
    """``busy = "steer"`` through B, whose process runs nothing, while the turn on A
    runs a tool (waiting for an admin's approval): the message joins A's turn at its
    next model request — no turn of its own, answered once — as on one process."""
    items = {"items": [{"text": "buy bread", "status": "pending"}]}
    openai_server.enqueue(
        Reply.tool_calls([("call-1", "todo", json.dumps(items))]),
        Reply.text("bread and milk then", chunks=3),
    )
    async with two_workers(tmp_path, postgres_dsn, openai_server.base_url, log="info") as (a, b):
        async with (
            a.client(ALICE) as alice_a,
            b.client(ALICE) as alice_b,
            a.client(ADMIN) as admin_a,
        ):
            conv = (await alice_a.post("/conversations", json={})).json()
            base = f"/conversations/{conv['id']}"
            async with sse(alice_b, base + "/events", params={"after": "0"}) as events:
                r = await alice_a.post(base + "/messages", json={"content": "make a list"})
                assert r.status_code == 202
                turn = r.json()["run_id"]
                # B reads what A stores: once it sees the tool waiting, the turn runs there.
                asked = (await events.until("approval_requested", timeout=PATIENCE))[-1].data
                assert asked is not None
                steer = await alice_b.post(
                    base + "/messages", json={"content": "also add milk", "busy": "steer"}
                )
                assert steer.status_code == 202, steer.text
                assert (steer.json()["steered"], steer.json()["run_id"]) == (True, turn)

                # A claims it from the queue and sends it into its turn (it says so in its
                # log), where it waits for the turn's next request.  Then the admin lets
                # the tool run.
                await until(
                    lambda: "steers run" in a.stderr(),
                    lambda: f"A taking the message in; A's log: {a.stderr()[-2000:]}",
                )
                url = f"{base}/approvals/{asked['approval_id']}"
                ok = await admin_a.post(url, json={"decision": "approve"})
                assert ok.status_code == 200, ok.text
                rest = await events.until("turn_ended", timeout=PATIENCE)
            ended = rest[-1].data
            assert ended is not None and ended["run_id"] == turn
            # The model's second request: the tool's result, then the steering message.
            last = openai_server.requests[-1]["messages"]
            assert [m["role"] for m in last][-2:] == ["tool", "user"]
            assert "also add milk" in str(last[-1]["content"])
            assert len(openai_server.requests) == 2  # no turn of its own
            history = (await alice_b.get(base + "/messages")).json()["items"]
            answers = [m for m in history if m["kind"] == "assistant"]
            assert [m["content"] for m in answers] == ["bread and milk then"]

            # Nothing is left queued: a turn started later runs at once, alone.
            openai_server.enqueue(Reply.text("ok", chunks=1))
            async with sse(alice_b, base + "/events", params={"after": str(rest[-1].id)}) as ev:
                r = await alice_b.post(base + "/messages", json={"content": "thanks"})
                later = await ev.until("turn_ended", timeout=PATIENCE)
            started = [m.data["run_id"] for m in later if m.kind == "turn_started" and m.data]
            assert started == [r.json()["run_id"]]
            assert len(openai_server.requests) == 3


@pytest.mark.timeout(400)
async def test_a_steering_message_the_other_workers_turn_cannot_take_gets_its_own_turn(
    postgres_dsn, openai_server, tmp_path
):
    """Steered through B while A's turn streams what may be its final answer (no model
    request sure to follow): it becomes the next turn, answered once, after A's."""

    def model(body: dict[str, Any]) -> Reply:
        users = [m for m in body["messages"] if m["role"] == "user"]
        if "and in French" in str(users[-1].get("content")):
            return Reply.text("un deux trois", chunks=1)
        return Reply.text(" ".join(f"w{i}" for i in range(40)), chunks=40, delay=0.1)

    openai_server.default = model
    async with two_workers(tmp_path, postgres_dsn, openai_server.base_url) as (a, b):
        async with a.client(ALICE) as alice_a, b.client(ALICE) as alice_b:
            conv = (await alice_a.post("/conversations", json={})).json()
            base = f"/conversations/{conv['id']}"
            async with sse(alice_b, base + "/events", params={"after": "0"}) as events:
                r = await alice_a.post(base + "/messages", json={"content": "count"})
                first = r.json()["run_id"]
                seen = await read_until(events, "text_delta", 3)
                steer = await alice_b.post(
                    base + "/messages", json={"content": "and in French", "busy": "steer"}
                )
                assert steer.status_code == 202, steer.text
                seen += await read_until(events, "turn_ended", 2)
            started = [m.data["run_id"] for m in seen if m.kind == "turn_started" and m.data]
            assert started[0] == first and len(started) == 2
            ended = [m.data for m in seen if m.kind == "turn_ended" and m.data]
            assert [e["run_id"] for e in ended] == started
            history = (await alice_b.get(base + "/messages")).json()["items"]
            answers = [m["content"] for m in history if m["kind"] == "assistant"]
            assert len(answers) == 2 and answers[-1] == "un deux trois"
            assert len(openai_server.requests) == 2


@pytest.mark.timeout(400)
async def test_stop_in_slack_http_mode_reaches_the_turn_another_worker_runs(
    postgres_dsn, openai_server, tmp_path
):
    """Slack's HTTP mode behind a load balancer: a message's event reaches worker A,
    which runs its turn; the ``!stop`` that follows reaches worker B, whose process
    runs nothing: the answer on A stops, marked interrupted, as on one process."""
    from slackcluster import slack_http_workers

    words = [f"w{i}" for i in range(300)]
    openai_server.default = lambda body: Reply.text(" ".join(words), chunks=300, delay=0.1)
    async with slack_http_workers(tmp_path, postgres_dsn, openai_server.base_url) as rig:
        slack = rig.slack
        talk = slack.message_event("D1", "count to 300", channel_type="im")
        assert await rig.post(rig.a, slack.event_callback(talk)) == 200
        await slack.wait_for_call(
            "chat.postMessage", lambda p: p.get("text", "").startswith("w0"), timeout=PATIENCE
        )
        # B finds the turn in the events A stores (within 50 ms): once they are there,
        # B's !stop finds it running.
        await until(partial(_stored_turn_started, postgres_dsn), "A's turn stored")
        stop = slack.message_event("D1", "!stop", channel_type="im")
        assert await rig.post(rig.b, slack.event_callback(stop)) == 200
        await until(
            lambda: any("_(interrupted)_" in t for t in rig.texts("D1")),
            lambda: f"the answer marked interrupted; posted: {rig.texts('D1')}",
        )
        texts = rig.texts("D1")
        assert not any("nothing to stop" in t for t in texts), texts
        answer = next(t for t in texts if t.startswith("w0"))
        assert "w299" not in answer  # cut, not finished


async def test_the_agent_wide_stream_on_one_worker_shows_a_turn_on_the_other(
    postgres_dsn, openai_server, tmp_path
):
    """``/agentik/events`` on A while a turn runs on B: A's client sees it whole (as
    the conversation's own stream does), each event once, with ids that only grow."""
    openai_server.default = lambda body: Reply.text(
        " ".join(f"w{i}" for i in range(20)), chunks=20, delay=0.03
    )
    async with two_workers(tmp_path, postgres_dsn, openai_server.base_url) as (a, b):
        async with a.client(ALICE) as on_a, b.client(ALICE) as on_b:
            conv = (await on_b.post("/conversations", json={})).json()
            async with sse(on_a, "/events") as everything:
                r = await on_b.post(f"/conversations/{conv['id']}/messages",
                                    json={"content": "count"})  # fmt: skip
                assert r.status_code == 202
                run_id = r.json()["run_id"]
                seen = await read_until(everything, "turn_ended")
            mine = [m for m in seen if m.data and m.data.get("run_id") == run_id]
            kinds = [m.kind for m in mine]
            assert kinds[0] == "turn_started" and kinds[-1] == "turn_ended", kinds
            text = "".join(str(m.data["text"]) for m in mine if m.kind == "text_delta" and m.data)
            assert text.split() == [f"w{i}" for i in range(20)]
            seqs = [m.data["seq"] for m in mine if m.data]
            assert seqs == sorted(set(seqs))  # in order, none twice
            ids = [m.id for m in seen if m.id is not None]
            assert ids == sorted(set(ids))


async def test_the_agent_wide_stream_replays_the_other_workers_events_after_a_gap(
    postgres_dsn, openai_server, tmp_path
):
    """A client of ``/agentik/events`` on A drops; meanwhile a turn runs on B and one on
    A.  Reconnecting to A with ``Last-Event-ID`` it gets both turns whole, each event
    once and in its conversation's order, with ids that only grow, and nothing it had
    already got."""
    words = [f"w{i}" for i in range(12)]
    openai_server.default = lambda body: Reply.text(" ".join(words), chunks=12, delay=0.03)
    async with two_workers(tmp_path, postgres_dsn, openai_server.base_url) as (a, b):
        async with a.client(ALICE) as on_a, b.client(ALICE) as on_b:
            far = (await on_b.post("/conversations", json={})).json()["id"]
            near = (await on_a.post("/conversations", json={})).json()["id"]
            # (1) Connected to A: a turn on B reaches the client.
            async with sse(on_a, "/events") as first:
                r = await on_b.post(f"/conversations/{far}/messages", json={"content": "one"})
                assert r.status_code == 202
                part1 = await read_until(first, "turn_ended")
            last = max(m.id for m in part1 if m.id is not None)

            # (2) The client is gone: a turn on B and one on A run to their end.
            runs = {}
            for client, cid in ((on_b, far), (on_a, near)):
                r = await client.post(f"/conversations/{cid}/messages", json={"content": "two"})
                assert r.status_code == 202
                runs[r.json()["run_id"]] = cid

            async def answered(client: Any, cid: str, n: int) -> bool:
                items = (await client.get(f"/conversations/{cid}/messages")).json()["items"]
                return sum(m["kind"] == "assistant" for m in items) >= n

            await until(partial(answered, on_b, far, 2), "the second answer on B")
            await until(partial(answered, on_a, near, 1), "the answer on A")

            # (3) Back on A with Last-Event-ID: both turns, whole, once, in order.
            async with sse(on_a, "/events", headers={"Last-Event-ID": str(last)}) as again:
                part2 = await read_until(again, "turn_ended", 2)
            assert not any(m.kind == "events_lost" for m in part2), [m.kind for m in part2]
            ids = [m.id for m in part2 if m.id is not None]
            assert ids and ids[0] > last and ids == sorted(set(ids))
            for run_id, cid in runs.items():
                mine = [m.data for m in part2 if m.data and m.data.get("run_id") == run_id]
                kinds = [d["kind"] for d in mine]
                assert kinds[0] == "turn_started" and "turn_ended" in kinds, (cid, kinds)
                text = "".join(str(d["text"]) for d in mine if d["kind"] == "text_delta")
                assert text.split() == words, (cid, text)
                seqs = [d["seq"] for d in mine]
                assert seqs == sorted(set(seqs)), (cid, seqs)
            # Nothing the client had before the gap comes again.
            before = {(m.data["conversation_id"], m.data["seq"]) for m in part1 if m.data}
            after = [(m.data["conversation_id"], m.data["seq"]) for m in part2 if m.data]
            assert len(after) == len(set(after)) and not before & set(after)


async def test_an_agent_wide_client_moved_to_the_other_worker_gets_the_rest_once(
    postgres_dsn, openai_server, tmp_path
):
    """Behind a load balancer: a client of ``/agentik/events`` on A drops mid-turn,
    while turns sent through both workers stream, and reconnects to B with its
    ``Last-Event-ID``.  It gets the rest exactly once and in order: together, its two
    connections got what a client of B connected all along got, the same ids and
    the same JSON."""
    words = [f"w{i}" for i in range(30)]
    openai_server.default = lambda body: Reply.text(" ".join(words), chunks=30, delay=0.05)
    async with two_workers(tmp_path, postgres_dsn, openai_server.base_url) as (a, b):
        async with a.client(ALICE) as on_a, b.client(ALICE) as on_b:
            near = (await on_a.post("/conversations", json={})).json()["id"]
            far = (await on_b.post("/conversations", json={})).json()["id"]
            # From the first stored event, on both: the two streams start alike.
            async with sse(on_b, "/events", params={"after": "0"}) as whole:
                async with sse(on_a, "/events", params={"after": "0"}) as first:
                    for client, cid in ((on_a, near), (on_b, far)):
                        r = await client.post(
                            f"/conversations/{cid}/messages", json={"content": "count"}
                        )
                        assert r.status_code == 202, r.text
                    part1 = await read_until(first, "text_delta", 5)
                last = part1[-1].id
                assert last is not None
                ended = sum(m.kind == "turn_ended" for m in part1)
                assert ended < 2  # (mid-stream)
                async with sse(on_b, "/events", headers={"Last-Event-ID": str(last)}) as second:
                    part2 = await read_until(second, "turn_ended", 2 - ended)
                everything = await read_until(whole, "turn_ended", 2)
            assert not any(m.kind == "events_lost" for m in part1 + part2)
            assert frames(part1 + part2) == frames(everything)
            ids = [m.id for m in part1 + part2 if m.data]
            assert None not in ids and ids == sorted(set(ids))  # in order, none twice
            for cid in (near, far):
                mine = [
                    m.data for m in part1 + part2 if m.data and m.data["conversation_id"] == cid
                ]
                text = "".join(str(d["text"]) for d in mine if d["kind"] == "text_delta")
                assert text.split() == words, (cid, text)
                seqs = [d["seq"] for d in mine if d["seq"]]
                assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), (cid, seqs)


@pytest.mark.timeout(400)
async def test_a_token_budget_for_one_turn_admits_one_of_two_started_on_two_workers(
    postgres_dsn, openai_server, tmp_path
):
    """Token reservations are in the database: a budget whose window holds one turn's
    estimate, two turns started at once through A and B → one runs, the other is
    refused with the budget message (each worker alone would have admitted its own)."""
    openai_server.default = lambda body: Reply.text("counted", chunks=2, delay=0.5)
    budgets = """[budgets]
turn_tokens_estimate = 1000
[budgets.user]
tokens_per_day = 300
"""
    async with two_workers(tmp_path, postgres_dsn, openai_server.base_url, extra=budgets) as (
        a,
        b,
    ):
        async with a.client(ALICE) as alice_a, b.client(ALICE) as alice_b:
            one = (await alice_a.post("/conversations", json={})).json()["id"]
            two = (await alice_b.post("/conversations", json={})).json()["id"]
            answers = await asyncio.gather(
                alice_a.post(f"/conversations/{one}/messages", json={"content": "hi"}),
                alice_b.post(f"/conversations/{two}/messages", json={"content": "hi"}),
            )
            codes = sorted(r.status_code for r in answers)
            assert codes == [202, 429], [r.text for r in answers]
            refused = next(r for r in answers if r.status_code == 429).json()["error"]
            assert refused["code"] == "budget_exceeded"
            assert refused["message"].endswith(
                ": daily token budget used up (300, counting 1,000 reserved by turns still"
                " running); resets at 00:00 UTC"
            ), refused


@pytest.mark.timeout(400)
async def test_a_turn_longer_than_its_reservation_keeps_it_and_a_dead_workers_lapses(
    postgres_dsn, openai_server, tmp_path
):
    """With ``reservation_seconds = 3``: a turn on A that runs for three times that
    still holds its tokens (a message through B is refused, counting them), and once
    A is killed mid-turn its reservation stops counting (B admits one again)."""
    # It uses 200 tokens: A's next turn reserves that much (the mean of its turns).
    first = Reply.text("a long answer", chunks=4, hold_after=1, usage=(100, 100))
    openai_server.default = lambda body: first
    budgets = """[budgets]
turn_tokens_estimate = 1000
reservation_seconds = 3
[budgets.user]
tokens_per_day = 300
"""
    refusal = (
        ": daily token budget used up (300, counting 1,000 reserved by turns still"
        " running); resets at 00:00 UTC"
    )
    async with two_workers(tmp_path, postgres_dsn, openai_server.base_url, extra=budgets) as (
        a,
        b,
    ):
        async with a.client(ALICE) as alice_a, b.client(ALICE) as alice_b:
            one = (await alice_a.post("/conversations", json={})).json()["id"]
            two = (await alice_b.post("/conversations", json={})).json()["id"]
            r = await alice_a.post(f"/conversations/{one}/messages", json={"content": "hi"})
            assert r.status_code == 202, r.text
            await first.wait_held(timeout=PATIENCE)
            # The turn outlives its first reservation three times over (no renewal: it
            # would have lapsed twice by now).
            deadline = time.time() + 3 * 3.0
            await until(lambda: time.time() > deadline, "three reservation periods")
            r = await alice_b.post(f"/conversations/{two}/messages", json={"content": "hi"})
            assert r.status_code == 429, r.text
            assert r.json()["error"]["message"].endswith(refusal), r.text
            first.release()

            async def answered(client: Any, cid: str, n: int) -> bool:
                items = (await client.get(f"/conversations/{cid}/messages")).json()["items"]
                return sum(m["kind"] == "assistant" for m in items) >= n

            await until(partial(answered, alice_a, one, 1), "A's answer")

            # A dies mid-turn: its reservation is renewed no more and lapses.
            second = Reply.text("another long answer", chunks=4, hold_after=1)
            openai_server.default = lambda body: second
            three = (await alice_a.post("/conversations", json={})).json()["id"]
            r = await alice_a.post(f"/conversations/{three}/messages", json={"content": "hi"})
            assert r.status_code == 202, r.text
            await second.wait_held(timeout=PATIENCE)
            r = await alice_b.post(f"/conversations/{two}/messages", json={"content": "hi"})
            assert r.status_code == 429, r.text  # 200 counted + 200 held while A lives
            assert "counting 200 reserved" in r.json()["error"]["message"], r.text
            a.kill()
            await a.wait()
            openai_server.default = lambda body: Reply.text("short")
            second.release()

            async def admitted() -> bool:
                r = await alice_b.post(f"/conversations/{two}/messages", json={"content": "hi"})
                assert r.status_code in (202, 429), r.text
                return r.status_code == 202

            # Refused while the dead worker's reservation counts, then admitted.
            await until(admitted, "B admitting a message once A's reservation lapsed")
