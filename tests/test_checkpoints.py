"""Checkpoints (issue 35): listable per conversation through the library, the HTTP
API (real HTTP to uvicorn) and the chat commands; automatic ones bounded to the
last N.  A real SQLite file, the scripted model (the store contract suite runs the
repository on every engine, PostgreSQL included)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
from typing import Any

import httpx
import pytest
from test_compaction import Brain, chat, make_agent
from test_http_api import SECURED, error_code

from agentik.bot.bridge import Bridge, ChannelOptions
from agentik.core.access import AccessPolicy, AccessSettings
from agentik.core.checkpoints import CheckpointSettings, CheckpointWorker, take_checkpoint
from agentik.core.client import RemoteAgent
from agentik.core.errors import CheckpointLimit
from agentik.core.lifecycle import (
    MAX_CHECKPOINT_BYTES,
    MAX_SNAPSHOT_CHECKPOINTS,
    SnapshotError,
    export_conversation,
    import_conversation,
)
from agentik.core.store.sqlite import SQLiteStore
from agentik.core.testing.scripted import ScriptedModel
from agentik.transports.testing.fake import FakeTransport
from helpers import AGENTIK, rows

from httpserver import TOKENS, running_server, sse


async def test_a_conversation_lists_its_checkpoints_and_one_restores_as_it_was(db_path):
    brain = Brain()
    async with make_agent(brain, db_path, budget=100_000) as agent:
        conv = await agent.create_conversation(title="plans")
        await chat(conv, 1, size=0)
        first = await conv.checkpoint("before\nthe  second question")
        await chat(conv, 1, start=1, size=0)
        second = await conv.checkpoint()
        other = await agent.create_conversation(title="other")
        await other.checkpoint("elsewhere")
        listed = await conv.checkpoints()
        assert [c.id for c in listed] == [second.id, first.id]
        # A label is one line (it is shown in chat lists).
        assert first.label == "before the second question" and second.label == ""
        assert not first.automatic and first.size > 0
        # Kept in the database file itself.
        assert rows(db_path, "SELECT COUNT(*) FROM checkpoint WHERE conversation_id = ?",
                    conv.id) == [(2,)]  # fmt: skip
        doc = await conv.checkpoint_document(first.id)
        assert await other.checkpoint_document(first.id) is None
        assert [m["content"] for m in doc["messages"] if m["kind"] == "user"] == ["question 0 "]
        # Taken back as a new conversation: the state it had then; the original stays.
        restored = await import_conversation(agent.store, doc, new_ids=True)
        back = await agent.get_conversation(restored.conversation_id)
        assert [m.content for m in await back.messages() if m.kind == "user"] == ["question 0 "]
        assert len([m for m in await conv.messages() if m.kind == "user"]) == 2
        # A deleted conversation's checkpoints go with it.
        await agent.delete_conversation(conv.id)
        assert rows(db_path, "SELECT COUNT(*) FROM checkpoint WHERE conversation_id = ?",
                    conv.id) == [(0,)]  # fmt: skip


async def test_automatic_checkpoints_at_each_end_keep_the_last_n(db_path):
    """``keep_automatic = 2``: closed, ``!new`` and idle ends each take one when the
    conversation changed since its newest checkpoint, only the latest two stay; one
    taken on request is never trimmed."""
    brain = Brain()
    worker = CheckpointWorker(CheckpointSettings(keep_automatic=2))
    async with make_agent(brain, db_path, worker=worker, budget=100_000) as agent:
        conv = await agent.conversation_for_channel("net:#ops")
        await chat(conv, 1, size=0)
        mine = await conv.checkpoint("mine")
        # Nothing new since the asked-for one: an end takes none.
        await agent.end_conversation(conv, "idle")
        assert worker.taken == 0
        for i in range(3):
            await chat(conv, 1, start=i + 1, size=0)
            await agent.end_conversation(conv, "idle")
            await agent.end_conversation(conv, "idle")  # the second is unchanged
        await chat(conv, 1, start=4, size=0)
        await conv.aclose()
        assert worker.taken == 4
        found = await (await agent.get_conversation(conv.id)).checkpoints()
        assert [(c.automatic, c.label) for c in found] == [
            (True, "closed"),
            (True, "idle"),
            (False, "mine"),
        ]
        assert found[2].id == mine.id
        # The newest automatic one has every turn.
        doc = json.loads(
            rows(db_path, "SELECT document FROM checkpoint WHERE id = ?", found[0].id)[0][0]
        )
        assert sum(m["kind"] == "user" for m in doc["messages"]) == 5
        # !new: the old conversation's end is checkpointed when it changed.
        fresh = await agent.new_conversation_for_channel("net:#ops")
        assert worker.taken == 4
        await chat(fresh, 1, size=0)
        empty = await agent.new_conversation_for_channel("net:#ops")
        assert worker.taken == 5
        assert [(c.automatic, c.label) for c in await fresh.checkpoints()] == [(True, "reset")]
        # An empty conversation ending takes none; a deleted one's checkpoints go.
        await agent.new_conversation_for_channel("net:#ops")
        assert worker.taken == 5 and await empty.checkpoints() == []
        await agent.delete_conversation(conv.id)
        await agent.delete_conversation(fresh.id)
        assert rows(db_path, "SELECT COUNT(*) FROM checkpoint") == [(0,)]


async def test_closing_the_agent_checkpoints_each_conversation_that_changed(db_path):
    """At shutdown (``Agent.aclose()``): one automatic checkpoint (``shutdown``) per
    conversation with turns since its last checkpoint, whether still in memory or
    not; none for an unchanged, an empty or a temporary conversation."""
    brain = Brain()
    worker = CheckpointWorker(CheckpointSettings(keep_automatic=2))
    async with make_agent(brain, db_path, worker=worker, budget=100_000) as agent:
        busy = await agent.create_conversation(title="busy")
        await chat(busy, 2, size=0)
        left = await agent.create_conversation(title="left memory")
        await chat(left, 1, size=0)
        await left.aclose()  # closed: checkpointed, then one more turn after
        left = await agent.get_conversation(left.id)
        await chat(left, 1, start=1, size=0)
        ids = {"busy": busy.id, "left": left.id}
        still = await agent.create_conversation(title="unchanged")
        await chat(still, 1, size=0)
        await still.checkpoint("by hand")
        ids["still"] = still.id
        ids["empty"] = (await agent.create_conversation(title="empty")).id
        temp = await agent.create_conversation(title="temp", temp=True)
        await chat(temp, 1, size=0)
    assert worker.taken == 3
    got = {
        name: rows(
            db_path,
            "SELECT label, automatic FROM checkpoint WHERE conversation_id = ? ORDER BY id",
            cid,
        )
        for name, cid in ids.items()
    }
    assert got == {
        "busy": [("shutdown", 1)],
        "left": [("closed", 1), ("shutdown", 1)],
        "still": [("by hand", 0)],
        "empty": [],
    }
    # Only the main database: nothing of the temporary conversation is written.
    assert rows(db_path, "SELECT COUNT(*) FROM checkpoint") == [(4,)]


async def test_the_chat_commands_take_and_list_checkpoints(db_path):
    agent = await make_agent(Brain(), db_path, budget=100_000).start()
    bridge = Bridge(agent)
    fake = FakeTransport(name="chat")
    bridge.attach(fake, ChannelOptions(command_prefix="!"))
    await fake.start(bridge)
    try:
        await fake.say("!checkpoints", user="bob", channel="ops")
        assert fake.texts("command")[-1] == "no checkpoints yet; !checkpoint [label] takes one"
        await fake.say("agentik: hello", user="bob", channel="ops")
        await bridge.flush(fake.key(channel="ops"))
        await fake.say("!checkpoint before the deploy", user="bob", channel="ops")
        line = fake.texts("command")[-1]
        assert line.startswith("checkpoint #") and "“before the deploy” kept (" in line
        await fake.say("!checkpoint", user="bob", channel="ops")
        await fake.say("!checkpoints", user="bob", channel="ops")
        listed = fake.texts("command")[-2:]
        assert " taken (" in listed[0] and "“" not in listed[0]
        assert listed[1].endswith(" bytes)") and " taken “before the deploy” (" in listed[1]
        # Another channel's conversation has its own (none).
        await fake.say("!checkpoints", user="bob", channel="dev")
        assert fake.texts("command")[-1].startswith("no checkpoints yet")
    finally:
        await fake.aclose()
        await bridge.aclose()
        await agent.aclose()


async def test_the_http_api_lists_takes_and_serves_checkpoints_per_token(db_path):
    async with running_server(db_path, settings=SECURED, environ=TOKENS,
                              model=ScriptedModel()) as server:  # fmt: skip
        alice = server.client(TOKENS["ALICE_TOKEN"])
        carol = server.client(TOKENS["CAROL_TOKEN"])
        async with alice, carol:
            conv = (await alice.post("/conversations", json={"title": "mine"})).json()
            base = f"/conversations/{conv['id']}/checkpoints"
            assert (await alice.get(base)).json() == {"items": []}
            r = await alice.post(base, json={"label": "first"})
            assert r.status_code == 201, r.text
            first = r.json()
            assert (first["label"], first["automatic"], first["conversation_id"]) == (
                "first", False, conv["id"],
            )  # fmt: skip
            second = (await alice.post(base)).json()  # no body: no label
            assert second["label"] == ""
            items = (await alice.get(base)).json()["items"]
            assert [c["id"] for c in items] == [second["id"], first["id"]]
            doc = (await alice.get(f"{base}/{first['id']}")).json()
            assert doc["format"] == "agentik.conversation"
            assert doc["conversation"]["id"] == conv["id"]
            # Errors: a bad label, an unknown or foreign checkpoint, another token.
            bad = await alice.post(base, json={"label": "two\nlines"})
            assert bad.status_code == 422 and error_code(bad) == "invalid_body"
            for missing in ("999999", "99999999999999999999999"):
                r = await alice.get(f"{base}/{missing}")
                assert r.status_code == 404 and error_code(r) == "checkpoint_not_found"
            r = await alice.get(f"{base}/x")
            assert r.status_code == 422 and error_code(r) == "invalid_parameter"
            for r in (await carol.get(base), await carol.post(base),
                      await carol.get(f"{base}/{first['id']}")):  # fmt: skip
                assert r.status_code == 404 and error_code(r) == "conversation_not_found"
    async with SQLiteStore(db_path) as store:
        assert len(await store.checkpoints(conv["id"])) == 2


async def test_the_remote_client_lists_and_takes_checkpoints_as_in_process(db_path):
    """``RemoteConversation`` drives the same checkpoints over the HTTP API."""
    async with running_server(db_path) as server, RemoteAgent(server.url) as remote:
        conv = await remote.create_conversation(title="remote")
        taken = await conv.checkpoint("over the wire")
        assert (taken.label, taken.automatic) == ("over the wire", False)
        local = await server.agent.get_conversation(conv.id)
        mine = await local.checkpoint("in process")
        assert [c.id for c in await conv.checkpoints()] == [mine.id, taken.id]
        assert await conv.checkpoints() == await local.checkpoints()
        doc = await conv.checkpoint_document(taken.id)
        assert doc == await local.checkpoint_document(taken.id)
        assert await conv.checkpoint_document(10_000) is None
        assert await conv.delete_checkpoint(taken.id) is True
        assert await conv.delete_checkpoint(taken.id) is False
        assert [c.id for c in await local.checkpoints()] == [mine.id]


async def test_a_new_in_chat_leaves_an_automatic_checkpoint_in_chat_and_over_http(db_path):
    """``!new`` in a chat channel: the old conversation's automatic checkpoint is
    listed by ``!checkpoints <old id>`` (only in its channel) and by the HTTP API,
    and its document has the chat."""
    worker = CheckpointWorker(CheckpointSettings(keep_automatic=2))
    settings = {"local_channels": ["*"]}  # the no-token caller sees chat channels too
    async with running_server(db_path, settings=settings, background=[worker]) as server:
        fake = FakeTransport(name="chat")
        server.bridge.attach(fake, ChannelOptions(command_prefix="!"))
        await fake.start(server.bridge)
        try:
            await fake.say("agentik: remember the blue door", user="bob", channel="ops")
            await server.bridge.flush(fake.key(channel="ops"))
            old = await server.agent.store.get_binding(fake.key(channel="ops"))
            await fake.say("!new", user="bob", channel="ops")
            assert worker.taken == 1
            # The channel's new conversation has none; the old one has the reset's.
            await fake.say("!checkpoints", user="bob", channel="ops")
            assert fake.texts("command")[-1].startswith("no checkpoints yet")
            async with server.client() as http:
                base = f"/conversations/{old}/checkpoints"
                items = (await http.get(base)).json()["items"]
                assert [(c["label"], c["automatic"]) for c in items] == [("reset", True)]
                doc = (await http.get(f"{base}/{items[0]['id']}")).json()
                said = [m["content"] for m in doc["messages"] if m["kind"] == "user"]
                assert any("remember the blue door" in text for text in said)
            # The chat lists the earlier conversation's by the id !new named.
            assert f"the previous one is kept as {old}" in fake.texts("command")[-2]
            await fake.say(f"!checkpoints {old}", user="bob", channel="ops")
            line = fake.texts("command")[-1]
            assert line.startswith(f"#{items[0]['id']} ") and " automatic “reset” (" in line
            # Another channel cannot read them, nor tell them from no conversation.
            await fake.say(f"!checkpoints {old}", user="eve", channel="dev")
            await fake.say("!checkpoints nonesuch", user="eve", channel="dev")
            assert fake.texts("command")[-2:] == [
                f"this channel has no conversation {old!r}",
                "this channel has no conversation 'nonesuch'",
            ]
        finally:
            await fake.aclose()


async def test_agentik_run_stopped_by_sigterm_checkpoints_what_changed(tmp_path):
    """A real ``agentik run`` with ``keep_automatic = 2``, stopped by SIGTERM: one
    ``shutdown`` checkpoint for the conversation with a turn; none for the one
    checkpointed by hand after its turn, nor for the empty one."""
    db = tmp_path / "bot.db"
    config = tmp_path / "bot.toml"
    config.write_text(
        f'[llm]\nbackend = "scripted"\n[storage]\npath = "{db}"\n'
        "[checkpoints]\nkeep_automatic = 2\n"
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AGENTIK_"))}
    env["AGENTIK_PORT"] = str(port)
    proc = await asyncio.create_subprocess_exec(
        AGENTIK, "-v", "run", "-c", str(config), env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr
    stderr: list[str] = []
    try:
        url = None
        while url is None:
            line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
            assert line, "agentik exited: " + "".join(stderr)
            stderr.append(line)
            if m := re.search(r"HTTP API on (http://127\.0\.0\.1:\d+)/agentik", line):
                url = m.group(1)
        drain = asyncio.ensure_future(_collect(proc.stderr, stderr))
        ids = {}
        async with httpx.AsyncClient(base_url=url + "/agentik", timeout=60) as c:
            for title in ("talked", "by hand", "empty"):
                ids[title] = (await c.post("/conversations", json={"title": title})).json()["id"]
            for title in ("talked", "by hand"):
                path = f"/conversations/{ids[title]}"
                async with sse(c, path + "/events", params={"profile": "chat"}) as events:
                    await c.post(path + "/messages", json={"content": f"hello {title}"})
                    await events.until("turn_ended", timeout=60)
            r = await c.post(f"/conversations/{ids['by hand']}/checkpoints", json={"label": "x"})
            assert r.status_code == 201, r.text
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 60)
        await drain
        assert proc.returncode == 0, "".join(stderr)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    got = {
        title: rows(
            str(db),
            "SELECT label, automatic FROM checkpoint WHERE conversation_id = ? ORDER BY id",
            cid,
        )
        for title, cid in ids.items()
    }
    assert got == {"talked": [("shutdown", 1)], "by hand": [("x", 0)], "empty": []}
    doc = json.loads(
        rows(str(db), "SELECT document FROM checkpoint WHERE label = 'shutdown'")[0][0]
    )
    assert [m["content"] for m in doc["messages"] if m["kind"] == "user"] == ["hello talked"]


async def _collect(stream: asyncio.StreamReader, into: list[str]) -> None:
    while line := await stream.readline():
        into.append(line.decode())


async def test_a_snapshot_carries_the_checkpoints_and_restores_them(db_path, tmp_path):
    """Export → import into another database file: the checkpoints come along (oldest
    first, label, automatic, the time taken, the document as it was); a checkpoint's
    own document holds no checkpoints, so snapshots do not nest."""
    brain = Brain()
    async with make_agent(brain, db_path, budget=100_000) as agent:
        conv = await agent.create_conversation(title="plans")
        await chat(conv, 1, size=0)
        first = await conv.checkpoint("before ✓")
        await chat(conv, 1, start=1, size=0)
        await take_checkpoint(agent.store, conv.id, label="reset", automatic=True, keep=2)
        doc = await export_conversation(agent.store, conv.id)
        assert doc is not None
    assert [(c["label"], c["automatic"]) for c in doc["checkpoints"]] == [
        ("before ✓", False), ("reset", True),
    ]  # fmt: skip
    assert doc["checkpoints"][0]["created_at"] == first.created_at
    assert all("checkpoints" not in c["document"] for c in doc["checkpoints"])
    other = str(tmp_path / "other.db")
    async with SQLiteStore(other) as store:
        result = await import_conversation(store, json.loads(json.dumps(doc)), new_ids=True)
        restored = await store.checkpoints(result.conversation_id)
        assert [(c.label, c.automatic, c.created_at) for c in reversed(restored)] == [
            (c["label"], c["automatic"], c["created_at"]) for c in doc["checkpoints"]
        ]
        back = json.loads(await store.checkpoint_get(result.conversation_id, restored[-1].id))
        assert back == doc["checkpoints"][0]["document"]
        users = [m["content"] for m in back["messages"] if m["kind"] == "user"]
        assert users == ["question 0 "]
        # Exported again, the same checkpoints (a round trip loses nothing).
        again = await export_conversation(store, result.conversation_id)
        assert again["checkpoints"] == doc["checkpoints"]


async def test_a_hostile_snapshot_checkpoint_is_refused_and_nothing_is_written(db_path):
    brain = Brain()
    async with make_agent(brain, db_path, budget=100_000) as agent:
        conv = await agent.create_conversation(title="plans")
        await chat(conv, 1, size=0)
        await conv.checkpoint("fine")
        good = await export_conversation(agent.store, conv.id)
    inner = good["checkpoints"][0]["document"]

    def with_checkpoint(**change: Any) -> dict[str, Any]:
        doc = json.loads(json.dumps(good))
        doc["checkpoints"][0].update(change)
        return doc

    huge = json.loads(json.dumps(inner))
    huge["messages"][0]["content"] = "x" * (MAX_CHECKPOINT_BYTES + 1)
    nested = json.loads(json.dumps(inner))
    nested["checkpoints"] = []
    bad_format = {**inner, "format": "something else"}
    bad_message = json.loads(json.dumps(inner))
    bad_message["messages"][0]["kind"] = "system"
    cases = [
        (with_checkpoint(document=huge), "checkpoints[0].document: 16,778,"),
        (with_checkpoint(document=nested), "checkpoints[0].document: a checkpoint holds no"),
        (with_checkpoint(document=bad_format), "checkpoints[0].document: format: expected"),
        (with_checkpoint(document=bad_message), "checkpoints[0].document: messages[0].kind"),
        (with_checkpoint(document="{}"), "checkpoints[0].document: expected object"),
        (with_checkpoint(label="x" * 201), "checkpoints[0].label: at most 200 characters"),
        (with_checkpoint(automatic="yes"), "checkpoints[0].automatic: expected boolean"),
        ({**good, "checkpoints": {"a": 1}}, "checkpoints: expected array, got dict"),
        ({**good, "checkpoints": [good["checkpoints"][0]] * (MAX_SNAPSHOT_CHECKPOINTS + 1)},
         "checkpoints: at most 1000 checkpoints"),
    ]  # fmt: skip
    async with SQLiteStore(db_path) as store:
        before = rows(db_path, "SELECT COUNT(*) FROM conversation")
        for doc, message in cases:
            with pytest.raises(SnapshotError) as caught:
                await import_conversation(store, doc, new_ids=True)
            assert str(caught.value).startswith(message), str(caught.value)[:200]
        assert rows(db_path, "SELECT COUNT(*) FROM conversation") == before
        assert rows(db_path, "SELECT COUNT(*) FROM checkpoint") == [(1,)]


def _manual(db_path: str, cid: str) -> list[tuple[Any, ...]]:
    return rows(
        db_path,
        "SELECT id, label FROM checkpoint WHERE conversation_id = ? AND automatic = 0 ORDER BY id",
        cid,
    )


async def test_keep_manual_refuses_the_next_checkpoint_in_chat_until_an_admin_deletes_one(
    db_path,
):
    """``keep_manual = 2``: the third ``!checkpoint`` is refused (nothing dropped, the
    message says how to make room); only an admin may ``!checkpoints rm N``, and that
    makes room for the next."""
    agent = await make_agent(
        Brain(), db_path, budget=100_000, checkpoints=CheckpointSettings(keep_manual=2)
    ).start()
    bridge = Bridge(agent, access=AccessPolicy(AccessSettings(admins=("chat:boss",)),
                                               {"chat": "fake"}))  # fmt: skip
    fake = FakeTransport(name="chat")
    bridge.attach(fake, ChannelOptions(command_prefix="!"))
    await fake.start(bridge)

    async def command(text: str, user: str = "bob") -> str:
        await fake.say(text, user=user, channel="ops")
        return fake.texts("command")[-1]

    try:
        await fake.say("agentik: hello", user="bob", channel="ops")
        await bridge.flush(fake.key(channel="ops"))
        cid = await agent.store.get_binding(fake.key(channel="ops"))
        first = await command("!checkpoint one")
        assert first.startswith("checkpoint #") and "“one” kept" in first
        await command("!checkpoint two", user="carol")
        refused = await command("!checkpoint three")
        assert refused == (
            "not taken: this conversation keeps at most 2 checkpoints taken by hand and has"
            " them all; an admin can delete one with !checkpoints rm N (!checkpoints lists them)"
        )
        kept = _manual(db_path, cid)
        assert [label for _, label in kept] == ["one", "two"]
        # Deleting needs an admin; a bad number or one of no checkpoint says so.
        assert (
            await command(f"!checkpoints rm {kept[0][0]}") == "only admins may delete checkpoints"
        )
        assert await command("!checkpoints rm x", user="boss") == (
            "usage: !checkpoints rm N (the checkpoint's number, from !checkpoints)"
        )
        assert await command("!checkpoints rm 99999", user="boss") == (
            "this conversation has no checkpoint #99999"
        )
        assert _manual(db_path, cid) == kept
        assert await command(f"!checkpoints rm #{kept[0][0]}", user="boss") == (
            f"checkpoint #{kept[0][0]} deleted"
        )
        assert "“three” kept" in await command("!checkpoint three")
        assert [label for _, label in _manual(db_path, cid)] == ["two", "three"]
        # The library's call keeps the same cap.
        conv = await agent.get_conversation(cid)
        with pytest.raises(CheckpointLimit):
            await conv.checkpoint("from code")
    finally:
        await fake.aclose()
        await bridge.aclose()
        await agent.aclose()


async def test_keep_manual_refuses_over_http_with_409_and_delete_makes_room(db_path):
    settings = CheckpointSettings(keep_manual=2)
    async with running_server(db_path, settings=SECURED, environ=TOKENS,
                              model=ScriptedModel(), checkpoints=settings) as server:  # fmt: skip
        alice = server.client(TOKENS["ALICE_TOKEN"])
        carol = server.client(TOKENS["CAROL_TOKEN"])
        async with alice, carol:
            conv = (await alice.post("/conversations", json={"title": "mine"})).json()
            base = f"/conversations/{conv['id']}/checkpoints"
            taken = []
            for label in ("one", "two"):
                r = await alice.post(base, json={"label": label})
                assert r.status_code == 201, r.text
                taken.append(r.json()["id"])
            r = await alice.post(base, json={"label": "three"})
            assert r.status_code == 409 and error_code(r) == "checkpoint_limit", r.text
            message = r.json()["error"]["message"]
            assert "2 checkpoints taken by hand" in message
            assert f"DELETE /agentik{base}/{{checkpoint_id}}" in message
            assert [c["label"] for c in (await alice.get(base)).json()["items"]] == ["two", "one"]
            # Another token cannot delete them, nor tell them from no conversation.
            r = await carol.delete(f"{base}/{taken[0]}")
            assert r.status_code == 404 and error_code(r) == "conversation_not_found"
            r = await alice.delete(f"{base}/{taken[0]}")
            assert r.status_code == 204, r.text
            for missing in (str(taken[0]), "99999999999999999999999"):
                r = await alice.delete(f"{base}/{missing}")
                assert r.status_code == 404 and error_code(r) == "checkpoint_not_found"
            r = await alice.delete(f"{base}/x")
            assert r.status_code == 422 and error_code(r) == "invalid_parameter"
            r = await alice.post(base, json={"label": "three"})
            assert r.status_code == 201, r.text
            assert [c["label"] for c in (await alice.get(base)).json()["items"]] == [
                "three", "two",
            ]  # fmt: skip
