"""Checkpoints (issue 35): listable per conversation through the library, the HTTP
API (real HTTP to uvicorn) and the chat commands; automatic ones bounded to the
last N.  A real SQLite file, the scripted model (the store contract suite runs the
repository on every engine, PostgreSQL included)."""

from __future__ import annotations

import json

from test_compaction import Brain, chat, make_agent
from test_http_api import SECURED, error_code

from agentik.bot.bridge import Bridge, ChannelOptions
from agentik.core.checkpoints import CheckpointSettings, CheckpointWorker
from agentik.core.client import RemoteAgent
from agentik.core.lifecycle import import_conversation
from agentik.core.store.sqlite import SQLiteStore
from agentik.core.testing.scripted import ScriptedModel
from agentik.transports.testing.fake import FakeTransport
from helpers import rows

from httpserver import TOKENS, running_server


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
    """``keep_automatic = 2``: closed, ``!new`` and idle ends each take one, only the
    latest two stay; one taken on request is never trimmed."""
    brain = Brain()
    worker = CheckpointWorker(CheckpointSettings(keep_automatic=2))
    async with make_agent(brain, db_path, worker=worker, budget=100_000) as agent:
        conv = await agent.conversation_for_channel("net:#ops")
        await chat(conv, 1, size=0)
        mine = await conv.checkpoint("mine")
        for i in range(3):
            await chat(conv, 1, start=i + 1, size=0)
            await agent.end_conversation(conv, "idle")
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
        assert sum(m["kind"] == "user" for m in doc["messages"]) == 4
        # !new: the old conversation's end is checkpointed too; a deleted one's is not.
        await agent.new_conversation_for_channel("net:#ops")
        assert worker.taken == 5
        assert [c.label for c in await (await agent.get_conversation(conv.id)).checkpoints()][
            :2
        ] == ["reset", "closed"]


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
