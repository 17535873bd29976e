"""Data lifecycle (issue 22): retention by channel pattern, ``agentik db prune``,
and checkpoint/resume (export → import into another database → the next model
request carries the whole history), over the CLI and over real HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import time
from pathlib import Path
from urllib.parse import quote

import pytest
from test_cli import agentik, write_config

from agentik.core import Agent, OpenAIBackend, SQLiteStore
from agentik.core.lifecycle import (
    RETENTION_AUTHOR,
    RetentionRule,
    RetentionSettings,
    RetentionWorker,
    SnapshotError,
    apply_retention,
    export_conversation,
    import_conversation,
    validate_snapshot,
)
from agentik.core.messages import ChatMessage, NewMessage
from agentik.core.store.base import ConversationRecord, TurnEnd
from agentik.core.testing.openai_server import Reply

from httpserver import TOKENS, running_server

DAY = 86400.0
NOW = time.time()


async def seed(store: SQLiteStore, cid: str, channel: str, turns: list[tuple[float, str, str]]):
    """A conversation bound to ``channel`` whose turns were written ``age`` days ago."""
    await store.create_conversation(
        ConversationRecord(
            id=cid,
            title=cid,
            created_at=NOW - 100 * DAY,
            updated_at=NOW,
            meta={"channel_key": channel},
        ),
        channel_key=channel,
    )
    for i, (age, question, answer) in enumerate(turns):
        at = NOW - age * DAY
        run = f"{cid}-run{i}"
        await store.append(
            cid,
            log=[
                NewMessage(
                    kind="user", content=question, author="alice", run_id=run, created_at=at
                ),
                NewMessage(kind="assistant", content=answer, run_id=run, created_at=at + 1),
            ],
            memory=[
                ChatMessage(role="user", content=question, author="alice", message_id=-1),
                ChatMessage(role="assistant", content=answer, message_id=-2),
            ],
            ended=TurnEnd(run_id=run, outcome="stop"),
        )


def contents(messages) -> list[str]:
    return [m.content for m in messages]


def request_text(body: dict) -> str:
    return json.dumps(body["messages"], ensure_ascii=False)


async def test_retention_deletes_old_messages_of_matching_channels_only(tmp_path):
    db = str(tmp_path / "a.db")
    turns = [(90, "old question ZEBRA-1", "old answer ZEBRA-2"), (1, "new question", "new answer")]
    async with SQLiteStore(db) as store:
        await seed(store, "irc", "irc:net:#ops", turns)
        await seed(store, "slack", "slack:T1:C1", [(90, "q", "a"), (1, "q", "a")])
        settings = RetentionSettings(
            rules=[RetentionRule(channels=["irc:*"], keep_days=30, action="delete")]
        )
        items = await apply_retention(store, settings)
        assert [(i.conversation_id, i.messages, i.done) for i in items] == [("irc", 2, True)]
        assert contents(await store.messages("irc")) == ["new question", "new answer"]
        assert len(await store.messages("slack")) == 4  # another channel: untouched
        memory = [e.message for e in await store.load_memory("irc")]
        assert memory[0].role == "system" and "2 earlier messages were deleted" in memory[0].content
        assert [m.content for m in memory[1:]] == ["new question", "new answer"]
        assert "ZEBRA" not in json.dumps([m.to_dict() for m in memory])
        # A second run finds nothing more to prune.
        assert await apply_retention(store, settings) == []
    # After a checkpoint, the pruned text is not in the file (secure_delete).
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    assert b"ZEBRA" not in await asyncio.to_thread(Path(db).read_bytes)


async def test_retention_keeps_a_turn_whole_and_an_unanswered_turn(tmp_path):
    async with SQLiteStore(str(tmp_path / "b.db")) as store:
        await seed(store, "c", "irc:net:#a", [(90, "q1", "a1")])
        # A turn that started long ago with a tool call whose result came later.
        await store.append(
            "c",
            log=[
                NewMessage(kind="user", content="q2", run_id="r2", created_at=NOW - 80 * DAY),
                NewMessage(
                    kind="tool_call",
                    content="",
                    tool_name="t",
                    tool_call_id="x",
                    run_id="r2",
                    created_at=NOW - 80 * DAY,
                ),
                NewMessage(
                    kind="tool_result",
                    content="r",
                    tool_name="t",
                    tool_call_id="x",
                    run_id="r2",
                    created_at=NOW - 1 * DAY,
                ),
            ],
            ended=TurnEnd(run_id="r2", outcome="stop"),
        )
        await store.append(
            "c",
            log=[
                NewMessage(
                    kind="user", content="q3 unanswered", run_id="r3", created_at=NOW - 70 * DAY
                )
            ],
        )
        settings = RetentionSettings(rules=[RetentionRule(channels=["*"], keep_days=30)])
        await apply_retention(store, settings)
        # q1/a1 go; the q2 turn is not split; the turn still waiting stays.
        assert contents(await store.messages("c")) == ["q2", "", "r", "q3 unanswered"]


async def test_summarise_leaves_a_summary_that_the_next_request_carries(openai_server, db_path):
    worker = RetentionWorker(
        RetentionSettings(
            rules=[RetentionRule(channels=["irc:net:*"], keep_days=7, action="summarise")]
        )
    )
    llm = OpenAIBackend(model="fake-model", base_url=openai_server.base_url, api_key="sk-x")
    async with Agent(llm=llm, store=SQLiteStore(db_path), background=[worker]) as agent:
        await worker.wait_runs(1)  # the start-up run: nothing yet
        conv = await agent.conversation_for_channel("irc:net:#dev")
        await seed_existing(agent.store, conv.id)
        await conv.working_memory()  # the conversation has it cached
        openai_server.enqueue(Reply.text("Alice deploys to the Hetzner box. SUMMARY-MARK"))
        worker.trigger()
        await worker.wait_runs(2)
        assert [i.done for i in worker.runs[1]] == [True]
        log = await agent.store.messages(conv.id)
        assert log[0].author == RETENTION_AUTHOR and "SUMMARY-MARK" in log[0].content
        assert contents(log[1:]) == ["recent question", "recent answer"]
        openai_server.enqueue(Reply.text("ok"))
        await conv.send("where do we deploy?", author="alice")
        await conv.wait_idle()
        await openai_server.wait_requests(2)
        body = openai_server.requests[1]
        text = request_text(body)
        assert "SUMMARY-MARK" in text and "recent question" in text
        assert "where do we deploy?" in text and "ancient question" not in text


async def seed_existing(store: SQLiteStore, cid: str) -> None:
    for age, q, a in (
        (60, "ancient question", "ancient answer"),
        (1, "recent question", "recent answer"),
    ):
        run = f"seed-{age}"
        await store.append(
            cid,
            log=[
                NewMessage(
                    kind="user", content=q, author="alice", run_id=run, created_at=NOW - age * DAY
                ),
                NewMessage(kind="assistant", content=a, run_id=run, created_at=NOW - age * DAY + 1),
            ],
            memory=[
                ChatMessage(role="user", content=q, author="alice", message_id=-1),
                ChatMessage(role="assistant", content=a, message_id=-2),
            ],
            ended=TurnEnd(run_id=run, outcome="stop"),
        )


RETENTION_TOML = """
[storage]
path = "bot.db"

[[retention.rules]]
channels = ["irc:*"]
keep_days = 30
action = "delete"
"""


async def test_db_prune_dry_run_changes_nothing_and_lists_counts(tmp_path):
    db = tmp_path / "bot.db"
    async with SQLiteStore(str(db)) as store:
        await seed(store, "irc1", "irc:net:#a", [(90, "q", "a"), (60, "q", "a"), (1, "q", "a")])
        await seed(store, "other", "slack:T:C", [(90, "q", "a")])
    config = write_config(tmp_path, RETENTION_TOML)
    before = (db.read_bytes(), os.stat(db).st_mtime_ns)
    result = agentik("db", "prune", "--dry-run", "-c", config, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "irc1  irc:net:#a  would delete 4 messages" in result.stdout
    assert "other" not in result.stdout
    assert "would prune 4 messages in 1 conversations" in result.stdout
    assert (db.read_bytes(), os.stat(db).st_mtime_ns) == before
    # The real run does it.
    result = agentik("db", "prune", "-c", config, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "pruned 4 messages in 1 conversations" in result.stdout
    async with SQLiteStore(str(db)) as store:
        assert await store.count_messages("irc1") == 2
        assert await store.count_messages("other") == 2


async def chat(agent: Agent, conv, server, *lines: str) -> None:
    for line in lines:
        server.enqueue(Reply.text(f"answer to {line}"))
        await conv.send(line, author="alice")
        await conv.wait_idle()


@pytest.mark.parametrize("ids", ["new", "keep"])
async def test_export_import_resume_the_next_request_carries_the_history(
    openai_server, tmp_path, ids
):
    def backend() -> OpenAIBackend:
        return OpenAIBackend(model="fake-model", base_url=openai_server.base_url, api_key="sk-x")

    async with Agent(llm=backend(), store=SQLiteStore(str(tmp_path / "bot.db"))) as agent:
        conv = await agent.conversation_for_channel("stdio:local")
        await chat(agent, conv, openai_server, "first point", "second point")
        cid = conv.id
    config = write_config(tmp_path, '[storage]\npath = "bot.db"\n')
    exported = agentik("conversations", "export", cid, "-c", config, cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    snapshot = json.loads(exported.stdout)
    assert snapshot["format"] == "agentik.conversation" and snapshot["version"] == 1
    assert snapshot["bindings"][0]["channel_key"] == "stdio:local"
    (tmp_path / "snap.json").write_text(exported.stdout)
    other = write_config(tmp_path, '[storage]\npath = "other.db"\n', name="other.toml")
    flag = "--new-ids" if ids == "new" else "--keep-ids"
    imported = agentik("conversations", "import", "snap.json", flag, "-c", other, cwd=tmp_path)
    assert imported.returncode == 0, imported.stderr
    new_id = imported.stdout.split()[1]
    assert (new_id != cid) if ids == "new" else (new_id == cid)
    assert "bound stdio:local" in imported.stdout
    again = agentik("conversations", "import", "snap.json", flag, "-c", other, cwd=tmp_path)
    if ids == "keep":  # the same id twice: refused, naming the field
        assert again.returncode == 2 and "conversation.id" in again.stderr
    else:
        assert again.returncode == 0
        assert "not bound stdio:local" in again.stdout  # never steals a channel

    seen = len(openai_server.requests)
    async with Agent(llm=backend(), store=SQLiteStore(str(tmp_path / "other.db"))) as agent:
        conv = await agent.conversation_for_channel("stdio:local")
        assert conv.id == new_id
        await chat(agent, conv, openai_server, "third point")
    text = request_text(openai_server.requests[seen])
    for piece in (
        "first point",
        "answer to first point",
        "second point",
        "answer to second point",
        "third point",
    ):
        assert piece in text
    assert text.index("first point") < text.index("second point") < text.index("third point")


async def test_http_export_import_round_trip(tmp_path):
    async with (
        running_server(
            str(tmp_path / "a.db"),
            settings={"tokens": [{"name": "admin", "env": "ADMIN_TOKEN"}]},
            environ=TOKENS,
        ) as a,
        running_server(
            str(tmp_path / "b.db"),
            settings={"tokens": [{"name": "admin", "env": "ADMIN_TOKEN"}]},
            environ=TOKENS,
        ) as b,
    ):
        a.model.enqueue("the answer is 42")
        async with a.client(TOKENS["ADMIN_TOKEN"]) as c:
            conv = (await c.post("/conversations", json={"title": "t"})).json()
            await c.post(f"/conversations/{conv['id']}/messages", json={"content": "what is it?"})
            await (await a.agent.get_conversation(conv["id"])).wait_idle()
            r = await c.get(f"/conversations/{conv['id']}/export")
            assert r.status_code == 200
            snapshot = r.json()
        async with b.client(TOKENS["ADMIN_TOKEN"]) as c:
            r = await c.post("/conversations/import?ids=keep", json=snapshot)
            assert r.status_code == 201, r.text
            assert r.json()["id"] == conv["id"]
            r = await c.post("/conversations/import?ids=keep", json=snapshot)
            assert r.status_code == 409 and r.json()["error"]["code"] == "conversation_exists"
            bad = {**snapshot, "version": 7}
            r = await c.post("/conversations/import", json=bad)
            assert r.status_code == 422 and "version" in r.json()["error"]["message"]
            r = await c.post(
                "/conversations/import",
                content=b"x=1",
                headers={"content-type": "application/x-www-form-urlencoded"},
            )
            assert r.status_code == 415
            b.model.enqueue("still 42")
            r = await c.post(f"/conversations/{conv['id']}/messages", json={"content": "again?"})
            assert r.status_code == 202, r.text
            await (await b.agent.get_conversation(conv["id"])).wait_idle()
            r = await c.get(f"/conversations/{conv['id']}/messages")
            assert [m["content"] for m in r.json()["items"]] == [
                "what is it?",
                "the answer is 42",
                "again?",
                "still 42",
            ]
        request = b.model.requests[-1]
        said = [m.content for m in request.messages]
        assert "what is it?" in said and "the answer is 42" in said and "again?" in said


def good_snapshot() -> dict:
    return {
        "format": "agentik.conversation",
        "version": 1,
        "conversation": {
            "id": "c1",
            "title": "",
            "created_at": 1.0,
            "updated_at": 1.0,
            "meta": {},
        },
        "messages": [{"id": 1, "kind": "user", "content": "hi", "created_at": 1.0}],
        "working_memory": [
            {"pos": 1, "message": {"role": "user", "content": "hi", "message_id": 1}}
        ],
    }


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d.update(version=2), "version"),
        (lambda d: d.update(format="other"), "format"),
        (lambda d: d.pop("messages"), "snapshot.messages"),
        (lambda d: d["messages"][0].update(kind="shout"), "messages[0].kind"),
        (lambda d: d["messages"][0].update(created_at="yesterday"), "messages[0].created_at"),
        # What the history API may answer: the status is one of the message statuses.
        (lambda d: d["messages"][0].update(status="\u00da,"), "messages[0].status"),
        (
            lambda d: d["working_memory"][0]["message"].update(role="god"),
            "working_memory[0].message.role",
        ),
        (lambda d: d["conversation"].pop("id"), "conversation.id"),
    ],
)
def test_malformed_or_unknown_version_snapshots_are_refused_naming_the_field(change, field):
    doc = good_snapshot()
    validate_snapshot(doc)
    change(doc)
    with pytest.raises(SnapshotError) as err:
        validate_snapshot(doc)
    assert str(err.value).startswith(field)


async def test_cli_import_of_a_bad_file_changes_nothing(tmp_path):
    config = write_config(tmp_path, '[storage]\npath = "bot.db"\n')
    (tmp_path / "bad.json").write_text(json.dumps({**good_snapshot(), "version": 99}))
    result = agentik("conversations", "import", "bad.json", "-c", config, cwd=tmp_path)
    assert result.returncode == 2 and "version" in result.stderr and "99" in result.stderr
    (tmp_path / "bad.json").write_text("{not json")
    result = agentik("conversations", "import", "bad.json", "-c", config, cwd=tmp_path)
    assert result.returncode == 2 and "not JSON" in result.stderr
    async with SQLiteStore(str(tmp_path / "bot.db")) as store:
        assert await store.list_conversations() == []
        # A good one imports, relinking working memory to the new audit ids.
        res = await import_conversation(store, good_snapshot(), new_ids=True, bind="stdio:x")
        doc = await export_conversation(store, res.conversation_id)
        assert doc is not None
        mid = doc["messages"][0]["id"]
        assert doc["working_memory"][0]["message"]["message_id"] == mid
        assert doc["bindings"][0]["channel_key"] == "stdio:x"


def test_integral_numbers_and_lone_surrogates_are_normalised_not_refused():
    doc = good_snapshot()
    doc["messages"][0]["id"] = 1.0
    doc["messages"][0]["content"] = "half a pair: \ud800"
    validate_snapshot(doc)
    assert doc["messages"][0]["id"] == 1 and isinstance(doc["messages"][0]["id"], int)
    assert doc["messages"][0]["content"] == "half a pair: \ufffd"
    doc["messages"][0]["id"] = 1.5
    with pytest.raises(SnapshotError, match=r"^messages\[0\]\.id: expected integer"):
        validate_snapshot(doc)


async def test_a_bot_built_from_the_config_prunes_at_start_up(tmp_path):
    from agentik.bot.builder import AgentBuilder
    from agentik.bot.config import load_config
    from agentik.core.plugins import load_plugins

    async with SQLiteStore(str(tmp_path / "bot.db")) as store:
        await seed(store, "c", "irc:net:#a", [(90, "stale", "stale answer"), (1, "q", "a")])
    conf = tmp_path / "bot.toml"
    conf.write_text('[llm]\nbackend = "scripted"\n' + RETENTION_TOML)
    agent = AgentBuilder.from_config(load_config(conf), load_plugins()).build()
    workers = [w for w in agent.background if isinstance(w, RetentionWorker)]
    assert len(workers) == 1
    async with agent:
        await workers[0].wait_runs(1)
        assert [(i.conversation_id, i.messages, i.done) for i in workers[0].runs[0]] == [
            ("c", 2, True)
        ]
        assert contents(await agent.store.messages("c")) == ["q", "a"]
    # No rules: no worker at all.
    conf.write_text('[llm]\nbackend = "scripted"\n[storage]\npath = "bot.db"\n')
    agent = AgentBuilder.from_config(load_config(conf), load_plugins()).build()
    assert not [w for w in agent.background if isinstance(w, RetentionWorker)]


async def test_the_job_runs_again_after_every_turns_finished_turns(db_path):
    from agentik.core.testing.scripted import ScriptedModel

    worker = RetentionWorker(
        RetentionSettings(rules=[RetentionRule(channels=["*"], keep_days=7)], every_turns=2)
    )
    model = ScriptedModel()
    async with Agent(llm=model, store=SQLiteStore(db_path), background=[worker]) as agent:
        await worker.wait_runs(1)
        conv = await agent.conversation_for_channel("stdio:a")
        await seed_existing(agent.store, conv.id)
        model.enqueue("one")
        await conv.send("first")
        await conv.wait_idle()
        assert len(worker.runs) == 1  # one turn: not yet
        assert "ancient question" in contents(await agent.store.messages(conv.id))
        model.enqueue("two")
        await conv.send("second")
        await worker.wait_runs(2)
        await conv.wait_idle()
        assert "ancient question" not in contents(await agent.store.messages(conv.id))
        assert [m.content for m in await conv.working_memory()][-2:] == ["second", "two"]


NOTES_TOML = """
[storage]
path = "bot.db"

[[retention.rules]]
channels = ["irc:*"]
keep_days = 30
notes = true

[[retention.rules]]
channels = ["slack:*"]
keep_days = 30
"""


async def test_notes_go_only_where_a_rule_says_so(tmp_path):
    from agentik.core.memory.sqlite import SQLiteMemory

    db = tmp_path / "bot.db"
    async with SQLiteStore(str(db)) as store:
        await seed(store, "irc", "irc:net:#a", [(1, "q", "a")])
        await seed(store, "slack", "slack:T:C", [(1, "q", "a")])
        memory = SQLiteMemory(store)
        await memory.start()
        for scope in ("channel:irc:net:#a", "channel:slack:T:C", "global"):
            await memory.save(scope, f"old fact of {scope}")
        await memory.save("channel:irc:net:#a", "fresh fact")
        # Age the first three notes by 60 days.
        await store.run_write(
            lambda c: c.execute(
                "UPDATE memory_note SET updated_at = updated_at - ? WHERE text LIKE 'old fact%'",
                (60 * DAY,),
            )
        )
        await memory.aclose()
    config = write_config(tmp_path, NOTES_TOML)
    before = db.read_bytes()
    dry = agentik("db", "prune", "--dry-run", "-c", config, cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "channel:irc:net:#a  would purge 1 memory notes" in dry.stdout
    assert "channel:slack" not in dry.stdout
    assert db.read_bytes() == before
    done = agentik("db", "prune", "-c", config, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "channel:irc:net:#a  purged 1 memory notes" in done.stdout
    async with SQLiteStore(str(db)) as store:
        memory = SQLiteMemory(store)
        await memory.start()
        left = sorted(n.text for n in await memory.list(include_deleted=True))
        await memory.aclose()
    assert left == [
        "fresh fact",
        "old fact of channel:slack:T:C",
        "old fact of global",
    ]


async def test_the_run_tree_travels_and_a_second_import_keeps_it_whole(tmp_path):
    async with SQLiteStore(str(tmp_path / "a.db")) as store:
        await seed(store, "parent", "stdio:p", [(1, "delegate", "done")])
        await seed(store, "child", "stdio:c", [(1, "task", "result")])
        await store.run_write(
            lambda c: c.execute(
                "INSERT INTO run (run_id, conversation_id, parent_run_id,"
                " parent_conversation_id, agent, depth, started) VALUES"
                " ('child-run', 'child', 'parent-run0', 'parent', 'helper', 1, 1.0)"
            )
        )
        snapshot = await export_conversation(store, "child")
    assert snapshot is not None
    assert [r["run_id"] for r in snapshot["runs"]] == ["child-run"]
    async with SQLiteStore(str(tmp_path / "b.db")) as store:
        await import_conversation(store, snapshot)  # the parent is not in this database
        again = await import_conversation(store, snapshot, new_ids=True)
        rows = await store.run_read(
            "SELECT run_id, conversation_id, parent_conversation_id, agent FROM run", ()
        )
        assert rows == [("child-run", "child", None, "helper")]
        assert contents(await store.messages(again.conversation_id)) == ["task", "result"]


async def test_http_export_of_a_temp_conversation(tmp_path):
    settings = {"tokens": [{"name": "admin", "env": "ADMIN_TOKEN"}]}
    async with running_server(str(tmp_path / "a.db"), settings=settings, environ=TOKENS) as a:
        a.model.enqueue("kept in memory only")
        async with a.client(TOKENS["ADMIN_TOKEN"]) as c:
            conv = (await c.post("/conversations", json={"temp": True})).json()
            await c.post(f"/conversations/{conv['id']}/messages", json={"content": "hello"})
            await (await a.agent.get_conversation(conv["id"])).wait_idle()
            r = await c.get(f"/conversations/{conv['id']}/export")
            assert r.status_code == 200, r.text
            snapshot = validate_snapshot(r.json())
            assert contents_of(snapshot) == ["hello", "kept in memory only"]
            r = await c.get("/conversations/nope/export")
            assert r.status_code == 404


def contents_of(snapshot: dict) -> list[str]:
    return [m["content"] for m in snapshot["messages"]]


async def test_a_redacted_message_stays_redacted_through_export_and_import(tmp_path):
    from agentik.core.redaction import RedactionError
    from agentik.core.testing.scripted import ScriptedModel

    secret = "hunter2-7f3c9e"
    model = ScriptedModel()
    model.enqueue("noted")
    async with Agent(llm=model, store=SQLiteStore(str(tmp_path / "a.db"))) as agent:
        conv = await agent.create_conversation()
        await conv.send(f"my password is {secret}")
        await conv.wait_idle()
        first = (await agent.store.messages(conv.id))[0]
        await agent.redact(conv.id, first.id, by="admin", reason="a password")
        doc = await export_conversation(agent.store, conv.id)
    assert doc is not None and secret not in json.dumps(doc)
    async with Agent(llm=ScriptedModel(), store=SQLiteStore(str(tmp_path / "b.db"))) as other:
        result = await import_conversation(other.store, doc, new_ids=True)
        imported = (await other.store.messages(result.conversation_id))[0]
        assert secret not in imported.content and "redacted" in imported.content
        # It is a redacted message there too: not an ordinary row that reads like one.
        with pytest.raises(RedactionError):
            await other.redact(result.conversation_id, imported.id, by="admin")


async def test_http_import_keeping_a_non_ascii_id_answers_with_an_ascii_location(tmp_path):
    doc = good_snapshot()
    doc["conversation"]["id"] = "käse-\U000a667e"
    async with running_server(
        str(tmp_path / "b.db"),
        settings={"tokens": [{"name": "admin", "env": "ADMIN_TOKEN"}]},
        environ=TOKENS,
    ) as b:
        async with b.client(TOKENS["ADMIN_TOKEN"]) as c:
            r = await c.post("/conversations/import", params={"ids": "keep"}, json=doc)
    assert r.status_code == 201, r.text
    assert r.json()["id"] == "käse-\U000a667e"
    location = r.headers["location"]
    assert location.isascii()
    assert location.endswith("/conversations/" + quote("käse-\U000a667e", safe=""))
