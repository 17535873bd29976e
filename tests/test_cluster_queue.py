"""Several workers serve the HTTP API's conversations without sticky routing: the turn
queue and the conversation leases (issue 32).

Real processes all the way: ``agentik run`` workers on a real PostgreSQL
(tests/pgserver.py), each with the HTTP API on its own port, and the fake
OpenAI-compatible server counting requests.  Every message is posted to a worker
picked at random.  What a user would notice is checked: every message answered
exactly once (model requests and assistant messages counted), each answer made from
a history holding every earlier answer of its conversation in order (so no two
turns of one conversation ran at once, and none out of order), and a worker killed
with turns queued behind its running one: another takes them over and answers each
once.  Every wait is on something observable with a generous deadline.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from pathlib import Path
from typing import Any

import httpx
from cluster import PATIENCE, PREFIX, Worker, http_transport, until, worker_config, workers

from agentik.core.testing.openai_server import Reply

pytest_plugins = ["pgserver"]

_TAG = re.compile(r"\b(c\d+ m\d+|slow|after \d+)\b")


def api_workers(
    n: int, tmp_path: Path, dsn: str, openai_url: str, *, lease: float, beat: float
) -> Any:
    """``n`` workers, each with the HTTP API on a port of its own, started and answering;
    ``lease``/``beat``: their ``[cluster]`` lease and heartbeat seconds (a lease shorter
    than a loaded machine's stalls would hand conversations over while their turns run:
    at-least-once, as documented, not what these tests check)."""
    return workers(
        n, tmp_path, dsn,
        lambda name, port: worker_config(name, openai_url, lease=lease, beat=beat, poll=2.0,
                                         extra=http_transport("api", port)),
        ready=PREFIX + "/conversations",
    )  # fmt: skip


def _user_texts(body: dict[str, Any]) -> list[tuple[str, str]]:
    """The (role, text) of a model request's user and assistant messages, in order."""
    out = []
    for m in body["messages"]:
        if m["role"] in ("user", "assistant"):
            content = m["content"]
            out.append((m["role"], content if isinstance(content, str) else str(content)))
    return out


def _tag(text: str) -> str:
    found = _TAG.search(text)
    return found.group(1) if found else ""


async def _rows(dsn: str, sql: str, *args: Any) -> list[Any]:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


async def _answers(dsn: str) -> list[tuple[str, str]]:
    """``(conversation id, answer)`` of every assistant message, oldest first."""
    rows = await _rows(
        dsn, "SELECT conversation_id, content FROM message WHERE kind = 'assistant' ORDER BY id"
    )
    return [(str(r[0]), str(r[1])) for r in rows]


async def _post(client: httpx.AsyncClient, worker: Worker, cid: str, text: str) -> None:
    r = await client.post(f"{worker.api}/conversations/{cid}/messages", json={"content": text},
                          timeout=60)  # fmt: skip
    assert r.status_code == 202, r.text
    body = r.json()
    assert body["conversation_id"] == cid and body["run_id"] and body["steered"] is False


def _history_problems(requests: list[dict[str, Any]]) -> list[str]:
    """Each request must hold, before its own message, every earlier message of its
    conversation followed by its answer: a turn that overlapped the one before it, or
    ran before it, would miss that answer."""
    problems = []
    for body in requests:
        turns = _user_texts(body)
        if not turns or turns[-1][0] != "user":
            problems.append(f"no user message last: {turns}")
            continue
        tag = _tag(turns[-1][1])
        conv, _, n = tag.partition(" m")
        if not conv.startswith("c"):
            continue
        want: list[tuple[str, str]] = []
        for j in range(int(n)):
            want += [("user", f"{conv} m{j}"), ("assistant", f"answer to {conv} m{j}")]
        want.append(("user", tag))
        got = [(role, _tag(text) if role == "user" else text) for role, text in turns]
        if got != want:
            problems.append(f"{tag}: history {got}")
    return problems


async def test_any_worker_takes_any_message_each_answered_once_in_order(
    postgres_dsn, openai_server, tmp_path
):
    def model(body: dict[str, Any]) -> Reply:
        # Some time per answer (three pieces), so later messages arrive mid-turn.
        return Reply.text(f"answer to {_tag(_user_texts(body)[-1][1])}", chunks=3, delay=0.03)

    openai_server.default = model
    conversations, messages = 24, 3
    rng = random.Random(32)
    async with api_workers(
        3, tmp_path, postgres_dsn, openai_server.base_url, lease=15.0, beat=1.0
    ) as crew:
        async with httpx.AsyncClient() as client:
            ids = []
            for _ in range(conversations):
                r = await client.post(f"{rng.choice(crew).api}/conversations", timeout=60)
                assert r.status_code == 201, r.text
                ids.append(r.json()["id"])

            async def talk(i: int, cid: str) -> None:
                # One after another in a conversation (each committed before the
                # next is posted); every one to a worker picked at random.
                for j in range(messages):
                    await _post(client, rng.choice(crew), cid, f"c{i} m{j}")

            await asyncio.gather(*(talk(i, cid) for i, cid in enumerate(ids)))
        total = conversations * messages
        await until(
            lambda: _count_at_least(postgres_dsn, total), f"{total} answers", patience=PATIENCE
        )
        # Every queued turn ran and left the queue.
        await until(lambda: _queue_empty(postgres_dsn), "an empty turn queue")
        answers = await _answers(postgres_dsn)
        assert len(answers) == total
        by_conv: dict[str, list[str]] = {}
        for cid, text in answers:
            by_conv.setdefault(cid, []).append(text)
        for i, cid in enumerate(ids):
            # Exactly once each, in the order asked.
            assert by_conv.get(cid) == [f"answer to c{i} m{j}" for j in range(messages)], (
                cid,
                by_conv.get(cid),
            )
        asked = [_tag(_user_texts(b)[-1][1]) for b in openai_server.requests]
        assert len(asked) == total and len(set(asked)) == total
        assert _history_problems(openai_server.requests) == []
        # The workers shared the work, and /health says how much each ran.
        views = [await w.health() for w in crew]
        ran = [int((v or {}).get("cluster", {}).get("queued_turns_run", 0)) for v in views]
        assert sum(ran) == total, ran
        assert sum(1 for n in ran if n) >= 2, ran
        for w in crew:
            assert "Traceback" not in w.stderr(), w.stderr()[-3000:]


async def _count_at_least(dsn: str, n: int) -> bool:
    rows = await _rows(dsn, "SELECT count(*) FROM message WHERE kind = 'assistant'")
    return int(rows[0][0]) >= n


async def _queue_empty(dsn: str) -> bool:
    return int((await _rows(dsn, "SELECT count(*) FROM turn_queue"))[0][0]) == 0


async def _cluster(worker: Worker) -> dict[str, Any]:
    view = await worker.health()
    return dict((view or {}).get("cluster") or {})


async def test_kill_9_of_the_running_worker_hands_its_queued_turns_to_another(
    postgres_dsn, openai_server, tmp_path
):
    held: list[Reply] = []

    def model(body: dict[str, Any]) -> Reply:
        tag = _tag(_user_texts(body)[-1][1])
        if tag == "slow" and not held:
            # The first time: the answer starts and holds, so the kill lands mid-turn.
            held.append(Reply.text("", hold_after=0))
            return held[0]
        return Reply.text(f"answer to {tag}")

    openai_server.default = model
    try:
        # Leases short enough for a quick takeover after the kill.
        async with api_workers(
            3, tmp_path, postgres_dsn, openai_server.base_url, lease=5.0, beat=0.5
        ) as crew:
            first, second = crew[0], crew[1]
            async with httpx.AsyncClient() as client:
                cid = (await client.post(f"{first.api}/conversations", timeout=60)).json()["id"]
                # The first worker takes the conversation and runs its turn ...
                await _post(client, first, cid, "slow")
                await until(lambda: held, "the slow turn's model request")
                await held[0].wait_held(PATIENCE)
                # ... while two more arrive at another worker: queued behind it.
                await _post(client, second, cid, "after 1")
                await _post(client, second, cid, "after 2")
            runner = (await _cluster(first))["worker"]
            await until(lambda: _claimed_by(postgres_dsn, cid, runner, 3),
                        "the running worker to claim the queued turns")  # fmt: skip
            # (3) /health shows them queued.
            await until(lambda: _depth_seen(second, 3), "queue depth 3 in /health")
            assert (await _cluster(first))["conversations_held"] >= 1
            lease = await _rows(postgres_dsn, "SELECT owner, epoch FROM lease WHERE name = $1",
                                f"conv:{cid}")  # fmt: skip
            assert lease[0][0] == runner
            killed_at = time.monotonic()
            first.kill()
            await first.wait()
            await until(lambda: _count_at_least(postgres_dsn, 3), "the three answers")
            print(f"kill -9 to the three answers by another worker: "
                  f"{time.monotonic() - killed_at:.2f} s")  # fmt: skip
            await until(lambda: _queue_empty(postgres_dsn), "an empty turn queue")
            answers = [text for c, text in await _answers(postgres_dsn) if c == cid]
            assert answers == ["answer to slow", "answer to after 1", "answer to after 2"]
            asked = [_tag(_user_texts(b)[-1][1]) for b in openai_server.requests]
            # The killed turn ran again once; the queued ones ran once, after it.
            assert asked.count("slow") == 2
            assert asked.count("after 1") == 1 and asked.count("after 2") == 1
            after = await _rows(postgres_dsn, "SELECT owner, epoch FROM lease WHERE name = $1",
                                f"conv:{cid}")  # fmt: skip
            assert after[0][0] != runner and after[0][1] == lease[0][1] + 1
            taker = [w for w in crew[1:] if (await _cluster(w)).get("worker") == after[0][0]]
            assert taker, after
            view = await _cluster(taker[0])
            assert view["queued_turns_taken_over"] >= 3 and view["queued_turns_run"] >= 3
            await until(lambda: _depth_seen(taker[0], 0), "queue depth 0 in /health")
            # The gauges: the queue's depth, and the conversation the taker holds.
            async with httpx.AsyncClient() as client:
                body = (await client.get(f"http://127.0.0.1:{taker[0].port}/metrics",
                                         timeout=30)).text  # fmt: skip
            assert "agentik_turn_queue_depth 0.0" in body.splitlines()
            assert any(line.startswith("agentik_conversation_leases ")
                       for line in body.splitlines())  # fmt: skip
    finally:
        for r in held:
            r.release()


async def _claimed_by(dsn: str, cid: str, worker: str, n: int) -> bool:
    rows = await _rows(dsn, "SELECT claimed_by FROM turn_queue WHERE conversation_id = $1", cid)
    return len(rows) == n and all(r[0] == worker for r in rows)


async def _depth_seen(worker: Worker, n: int) -> bool:
    return (await _cluster(worker)).get("queue_depth") == n


# -- one process: nothing of it ------------------------------------------------------------
async def test_a_bot_on_sqlite_queues_nothing_and_takes_no_conversation_lease(
    openai_server, tmp_path
):
    import sqlite3
    import tomllib

    from agentik.bot.app import Bot
    from agentik.bot.config import parse_config

    openai_server.default = lambda body: Reply.text(f"answer to {_user_texts(body)[-1][1]}")
    db = tmp_path / "b.db"
    text = f"""
[llm]
base_url = "{openai_server.base_url}"
model = "fake-model"
api_key = "sk-test"
[storage]
path = "{db}"
[memory]
backend = "none"
[transports.api]
type = "http"
host = "127.0.0.1"
port = 0
"""
    async with Bot(parse_config(tomllib.loads(text), env={})) as bot:
        assert bot.turn_queue is None and bot.agent.turn_queue is None
        url = bot.transports["api"].url + PREFIX  # type: ignore[attr-defined]
        async with httpx.AsyncClient() as client:
            cid = (await client.post(f"{url}/conversations", timeout=60)).json()["id"]
            for j in range(3):
                r = await client.post(f"{url}/conversations/{cid}/messages",
                                      json={"content": f"m{j}"}, timeout=60)  # fmt: skip
                assert r.status_code == 202
        conv = await bot.agent.get_conversation(cid)
        await until(lambda: _answered(db, 3), "three answers")
        await conv.wait_idle()
        cluster = bot.status()["cluster"]
        assert cluster["shared"] is False and "queue_depth" not in cluster
    with sqlite3.connect(db) as conn:
        # No conversation lease, no queued turn: a one-process bot writes neither.
        assert conn.execute("SELECT count(*) FROM lease").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM turn_queue").fetchone()[0] == 0
        # Its messages are plain ones (not marked queued).
        rows = conn.execute("SELECT data FROM message WHERE kind = 'user'").fetchall()
        assert len(rows) == 3 and not any("queued" in (r[0] or "") for r in rows)


def _answered(db: Path, n: int) -> bool:
    import sqlite3

    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT count(*) FROM message WHERE kind = 'assistant'")
                   .fetchone()[0]) >= n  # fmt: skip


# -- fencing: two workers in this process, each with its own store on one database ----------
async def _queue_worker(dsn: str, name: str) -> Any:
    from agentik.core import Agent
    from agentik.core.cluster import ClusterSettings
    from agentik.core.cluster.conversations import TurnQueue
    from agentik.core.store.postgres import PostgresStore
    from agentik.core.testing.scripted import ScriptedModel

    agent = Agent(llm=ScriptedModel(default=lambda req: f"{name} answers"),
                  store=PostgresStore(dsn))  # fmt: skip
    await agent.start()
    queue = TurnQueue(agent, name, ClusterSettings(lease_seconds=3.0, heartbeat_seconds=0.2))

    async def admit(conv: Any, turn: Any, message: Any) -> Any:
        return None, conv.settings

    queue.front_end("test", admit)
    agent.turn_queue = queue
    await queue.start()
    await agent.store.notifier().listening()
    return agent


async def test_a_worker_that_lost_a_conversations_lease_starts_no_turn_of_it(postgres_dsn):
    a = await _queue_worker(postgres_dsn, "a")
    b = await _queue_worker(postgres_dsn, "b")
    try:
        conv = await a.create_conversation(title="fenced")
        await a.turn_queue.submit(conv, "one", author=None, author_id=None, channel=None,
                                  settings=conv.settings, payload={"via": "test"})  # fmt: skip
        await a.turn_queue.settled(conv.id)
        assert a.turn_queue.holds(conv.id)
        # Another worker took the lease (the next epoch), as after a stall of "a" longer
        # than the lease: "a"'s next renewal is refused.
        await _rows(postgres_dsn, "UPDATE lease SET owner = 'b', epoch = epoch + 1,"
                    " expires_at = expires_at + 30 WHERE name = $1", f"conv:{conv.id}")  # fmt: skip
        await until(lambda: not a.turn_queue.holds(conv.id), "a to see its lease lost")
        # A message reaching "a" now is queued for the holder, not run by "a".
        run_id, here = await a.turn_queue.submit(
            conv, "two", author=None, author_id=None, channel=None, settings=conv.settings,
            payload={"via": "test"},
        )  # fmt: skip
        assert not here
        await until(lambda: _queue_empty(postgres_dsn), "the holder to run it")
        rows = await _rows(postgres_dsn, "SELECT content FROM message WHERE conversation_id = $1"
                           " AND kind = 'assistant' ORDER BY id", conv.id)  # fmt: skip
        assert [r[0] for r in rows] == ["a answers", "b answers"]
        assert (a.turn_queue.ran, b.turn_queue.ran) == (1, 1)
        # The holder's context holds the first turn, run by "a" (read from the store).
        conv_b = await b.get_conversation(conv.id)
        memory = [m.content for m in await conv_b.working_memory()]
        assert memory[-4:] == ["one", "a answers", "two", "b answers"]
    finally:
        for agent in (b, a):
            await agent.turn_queue.aclose()
            await agent.aclose()
