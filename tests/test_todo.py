"""The ``todo`` checklist is durable and visible (issue 20): stored per
conversation in SQLite (migration 13), so a restart of the bot keeps it and
the next ``todo`` call edits it; shown in the conversation status (HTTP and
``!status``) and kept by export/import; gone with its conversation.

Real components: SQLite files, a real IRC server, the HTTP API (uvicorn, real
requests, SSE), the real slack-bolt stack against the fake Slack, and the
scripted model.
"""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import asynccontextmanager

from test_asks import asking_bot

from agentik.core import Agent, SQLiteStore, TurnPolicy
from agentik.core.lifecycle import SnapshotError, export_conversation, import_conversation
from agentik.core.testing.scripted import Reply, ScriptedModel, call

from rigs import from_bot, people, slack_bot, tool_results

pytest_plugins = ["ircservers"]

TODO = TurnPolicy(todo=True)
READ = {"text": "read the logs", "status": "in_progress"}
FIX = {"text": "fix the bug", "status": "pending"}
READ_DONE = {**READ, "status": "done"}


def stored(db) -> list[tuple[str, str]]:
    """The checklist rows in the database file: (conversation id, items JSON)."""
    with sqlite3.connect(db) as con:
        return con.execute("SELECT conversation_id, items FROM todo").fetchall()


# -- a restart (IRC) ---------------------------------------------------------------------------


async def test_irc_restart_keeps_the_checklist_and_only_real_changes_are_said(miniircd, tmp_path):
    db = tmp_path / "todo.db"
    async with asking_bot(miniircd.port, db, policy=TODO) as (model, agent):
        (alice,) = await people(miniircd.port, "alice")
        model.enqueue(Reply(tool_calls=[call("todo", {"items": [READ, FIX]})]), "on it")
        alice.privmsg("#ops", "agentik: look into it")
        await alice.wait_for(lambda m: from_bot(m) and m.text == "alice: on it")
    # The bot is gone; the list is in the file.
    [(conv_id, _)] = stored(db)
    async with asking_bot(miniircd.port, db, policy=TODO) as (model, agent):
        model.enqueue(
            # The list as it was before the restart: nothing changed, nothing said.
            Reply(tool_calls=[call("todo", {"items": [READ, FIX]})]),
            Reply(tool_calls=[call("todo", {"items": [READ_DONE, FIX]})]),
            "done for now",
        )
        alice.privmsg("#ops", "agentik: carry on")
        await alice.wait_for(lambda m: from_bot(m) and m.text == "alice: done for now")
        lines = [m.text for m in alice.received if from_bot(m) and m.text.startswith("todo")]
        assert lines == [
            "todo 0/2: ▸ read the logs; ○ fix the bug",  # before the restart
            "todo 1/2: ✓ read the logs",  # after it: the one real change
        ]
        assert tool_results(model)[-2:] == [
            "checklist updated (0/2 done)",
            "checklist updated (1/2 done)",
        ]
        alice.privmsg("#ops", "!status")
        status = await alice.wait_for(lambda m: from_bot(m) and "conversation " in m.text)
        assert conv_id in status.text and status.text.endswith(" · todo 1/2")
        conv = await agent.conversation_for_channel("irc:testnet:#ops")
        checklist = await conv.todo()
        assert checklist is not None and checklist.items == (READ_DONE, FIX)
        await alice.close()


# -- status, export/import and delete over HTTP ----------------------------------------------------


async def test_http_status_shows_the_stored_checklist_and_export_import_keeps_it(tmp_path):
    from httpserver import TOKENS, running_server, sse

    db = str(tmp_path / "http.db")
    settings = {"tokens": [{"name": "alice", "env": "ALICE_TOKEN"}]}
    async with running_server(db, settings=settings, environ=TOKENS, policy=TODO) as server:
        server.model.enqueue(Reply(tool_calls=[call("todo", {"items": [READ, FIX]})]), "on it")
        async with server.client(TOKENS["ALICE_TOKEN"]) as alice:
            conv = (await alice.post("/conversations", json={})).json()
            base = f"/conversations/{conv['id']}"
            assert (await alice.get(base + "/status")).json()["todo"] is None
            async with sse(alice, base + "/events") as events:
                await alice.post(base + "/messages", json={"content": "look into it"})
                await events.until("turn_ended")
    async with running_server(db, settings=settings, environ=TOKENS, policy=TODO) as server:
        async with server.client(TOKENS["ALICE_TOKEN"]) as alice:
            # A new process: the status shows the list from the database.
            todo = (await alice.get(base + "/status")).json()["todo"]
            assert (todo["items"], todo["done"], todo["total"]) == ([READ, FIX], 0, 2)
            server.model.enqueue(
                Reply(tool_calls=[call("todo", {"items": [READ_DONE, FIX]})]), "half done"
            )
            async with sse(alice, base + "/events") as events:
                await alice.post(base + "/messages", json={"content": "carry on"})
                updated = (await events.until("todo_updated"))[-1].data
                await events.until("turn_ended")
            # Edited, not started afresh: only the item that changed is new.
            assert updated["items"] == [READ_DONE, FIX] and updated["changed"] == [0]
            status = (await alice.get(base + "/status")).json()
            assert status["state"] == "idle" and (
                status["todo"]["done"],
                status["todo"]["total"],
            ) == (
                1,
                2,
            )

            # Export, then import as a new conversation: the checklist comes along.
            snapshot = (await alice.get(base + "/export")).json()
            assert snapshot["version"] == 1 and snapshot["todo"]["items"] == [READ_DONE, FIX]
            copy = await alice.post("/conversations/import", json=snapshot)
            assert copy.status_code == 201, copy.text
            copied = (await alice.get(f"/conversations/{copy.json()['id']}/status")).json()
            assert copied["todo"]["items"] == [READ_DONE, FIX]

            # A snapshot from before the checklist was exported still imports (none).
            old = {k: v for k, v in snapshot.items() if k != "todo"}
            plain = await alice.post("/conversations/import", json=old)
            assert plain.status_code == 201, plain.text
            plain_status = await alice.get(f"/conversations/{plain.json()['id']}/status")
            assert plain_status.json()["todo"] is None

            # A bad checklist is refused, naming the field, and nothing is created.
            listed = len((await alice.get("/conversations")).json()["items"])
            bad = {**snapshot, "todo": {"items": [{"text": "x", "status": "later"}]}}
            refused = await alice.post("/conversations/import", json=bad)
            assert refused.status_code == 422
            assert "todo.items[0].status" in refused.json()["error"]["message"]
            assert len((await alice.get("/conversations")).json()["items"]) == listed

            # Deleting a conversation deletes its checklist.
            assert len(stored(db)) == 2
            assert (await alice.delete(base)).status_code == 204
            assert conv["id"] not in {cid for cid, _ in stored(db)}
            assert len(stored(db)) == 1


# -- Slack: the checklist message after a restart -------------------------------------------------


@asynccontextmanager
async def todo_slack_bot(slack, tmp_path, db: str, *replies):
    """:func:`rigs.slack_bot` on ``db`` with the ``todo`` tool, answering ``replies``
    (answers edited in place); yields its agent, bridge and transport."""
    model = ScriptedModel()
    model.enqueue(*replies)
    async with slack_bot(
        slack, tmp_path, model=model, store=SQLiteStore(db), agent_kw={"policy": TODO},
        streaming="edit",
    ) as bot:  # fmt: skip
        yield bot.agent, bot.bridge, bot.transport


async def test_slack_after_a_restart_the_checklist_is_posted_once_again_then_edited(tmp_path):

    from fakeslack import FakeSlack

    db = str(tmp_path / "slack.db")
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")

        def bot(*replies):
            return todo_slack_bot(slack, tmp_path, db, *replies)

        def has(text):
            return lambda p: text in (p.get("text") or "")

        async with bot(
            Reply(tool_calls=[call("todo", {"items": [READ, FIX]})]), "on it"
        ) as running:
            mention = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> look", user="U1")
            await slack.push_event(mention)
            first = await slack.wait_for_call("chat.postMessage", has("todo 0/2"))
            await running[1].flush(f"slack:T1:C1:{mention['ts']}")
        async with bot(
            Reply(tool_calls=[call("todo", {"items": [READ_DONE, FIX]})]),
            Reply(tool_calls=[call("todo", {"items": [READ_DONE, {**FIX, "status": "done"}]})]),
            "all done",
        ) as running:
            again = slack.app_mention_event(
                "C1", f"<@{slack.bot_user_id}> carry on", user="U1", thread_ts=mention["ts"]
            )
            await slack.push_event(again)
            # The old message's id went with the old process: the list is posted
            # once again, whole (the item done before the restart included) ...
            posted = await slack.wait_for_call("chat.postMessage", has("todo 1/2"))
            assert posted["thread_ts"] == mention["ts"]
            assert "✓ read the logs" in posted["text"] and "○ fix the bug" in posted["text"]
            # ... and that message is the one edited from then on.
            edited = await slack.wait_for_call("chat.update", has("todo 2/2"))
            [(_, ts)] = [
                k for k, m in slack.messages.items() if "todo 2/2" in (m.get("text") or "")
            ]
            assert edited["ts"] == ts
            await running[1].flush(f"slack:T1:C1:{mention['ts']}")
            checklists = [p for p in slack.calls_to("chat.postMessage") if "todo" in p["text"]]
            assert [p["text"].split("\n")[0] for p in checklists] == ["todo 0/2", "todo 1/2"]
            assert first["text"] != posted["text"]


# -- the store: deletion, redaction, temporary conversations -----------------------------------


async def test_delete_and_redaction_leave_no_checklist_behind(tmp_path):
    db = tmp_path / "lib.db"
    model = ScriptedModel()
    agent = Agent(llm=model, store=SQLiteStore(str(db)), policy=TODO)
    await agent.start()
    try:
        kept = await agent.create_conversation(title="kept")
        gone = await agent.create_conversation(title="gone")
        for conv in (kept, gone):
            model.enqueue(Reply(tool_calls=[call("todo", {"items": [READ, FIX]})]), "ok")
            await conv.send("plan it")
            await conv.wait_idle()
        assert {cid for cid, _ in stored(db)} == {kept.id, gone.id}
        await agent.delete_conversation(gone.id)
        assert [cid for cid, _ in stored(db)] == [kept.id]

        # Redacting the call that wrote the list takes the list with it.
        [row] = [m for m in await kept.messages() if m.kind == "tool_call"]
        await agent.redact(kept.id, row.id, by="admin", reason="pasted a secret")
        assert stored(db) == [] and await kept.todo() is None
        assert "todo" not in kept.status(todo=await kept.todo()).line()

        # A temporary conversation keeps its list in memory, with it.
        temp = await agent.create_conversation(temp=True)
        model.enqueue(Reply(tool_calls=[call("todo", {"items": [FIX]})]), "ok")
        await temp.send("plan it")
        await temp.wait_idle()
        checklist = await temp.todo()
        assert checklist is not None and checklist.items == (FIX,)
        assert stored(db) == []
        await agent.delete_conversation(temp.id)
        assert await agent.temp_store.todo_get(temp.id) is None
    finally:
        await agent.aclose()


async def test_library_export_import_round_trip_and_a_bad_checklist_is_refused(tmp_path):
    source = SQLiteStore(str(tmp_path / "a.db"))
    target = SQLiteStore(str(tmp_path / "b.db"))
    model = ScriptedModel()
    agent = Agent(llm=model, store=source, policy=TODO)
    await agent.start()
    try:
        conv = await agent.create_conversation(title="plan")
        model.enqueue(Reply(tool_calls=[call("todo", {"items": [READ_DONE, FIX]})]), "ok")
        await conv.send("plan it")
        await conv.wait_idle()
        doc = await export_conversation(source, conv.id)
    finally:
        await agent.aclose()
    assert doc is not None
    await target.start()
    try:
        await import_conversation(target, doc)
        checklist = await target.todo_get(conv.id)
        assert checklist is not None and checklist.items == (READ_DONE, FIX)
        assert checklist.run_id == doc["todo"]["run_id"]
        for bad, field in (
            ({"items": "read the logs"}, "todo.items"),
            ({"items": [{"text": "", "status": "done"}]}, "todo.items[0].text"),
            ({"items": [READ] * 31}, "todo.items"),
            ({"items": [READ], "done": -1}, "todo.done"),
            ("read the logs", "snapshot.todo"),
        ):
            try:
                await import_conversation(target, {**doc, "todo": bad}, new_ids=True)
            except SnapshotError as exc:
                assert str(exc).startswith(field), exc
            else:
                raise AssertionError(f"{bad!r} was imported")
        assert len(await target.list_conversations()) == 1
    finally:
        await target.aclose()


async def test_a_secret_in_an_item_is_scrubbed_before_the_database(tmp_path):
    from agentik.core.redaction import PatternScrubber, RedactionSettings

    key = "sk-proj-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4"
    db = tmp_path / "scrub.db"
    model = ScriptedModel()
    scrubber = PatternScrubber(RedactionSettings(scrub=True))
    agent = Agent(llm=model, store=SQLiteStore(str(db)), policy=TODO, hooks=[scrubber])
    await agent.start()
    try:
        conv = await agent.create_conversation()
        sub = conv.events()
        item = {"text": f"rotate {key} today", "status": "pending"}
        model.enqueue(Reply(tool_calls=[call("todo", {"items": [item]})]), "ok")
        await conv.send("plan it")
        await conv.wait_idle()
        async with asyncio.timeout(60):
            async for event in sub:
                if event.kind == "todo_updated":
                    break
        # What is stored is what is shown.
        assert event.items == ({"text": "rotate [redacted:openai-key] today", "status": "pending"},)
        checklist = await conv.todo()
        assert checklist is not None and checklist.items == event.items
        await sub.aclose()
    finally:
        await agent.aclose()
    with sqlite3.connect(db) as con:
        [(items,)] = con.execute("SELECT items FROM todo").fetchall()
    assert key not in items


async def test_slack_a_long_checklist_is_still_edited(tmp_path):
    """A section block holds 3000 characters at most (Slack answers ``invalid_blocks``).

    The checklist is edited with its text in one section: a list of 30 items
    of up to 200 characters passed that, every edit was refused, and the list
    on screen stopped changing.
    """

    from fakeslack import FakeSlack

    items = [{"text": f"step {i}: " + "check the logs & the <config> " * 5, "status": "pending"}
             for i in range(20)]  # fmt: skip
    done = [{**items[0], "status": "done"}, *items[1:]]
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        async with todo_slack_bot(
            slack,
            tmp_path,
            str(tmp_path / "slack.db"),
            Reply(tool_calls=[call("todo", {"items": items})]),
            Reply(tool_calls=[call("todo", {"items": done})]),
            "all done",
        ) as (agent, bridge, transport):
            mention = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> look", user="U1")
            await slack.push_event(mention)
            await slack.wait_for_call("chat.update", lambda p: "todo 1/20" in (p.get("text") or ""))
            await bridge.flush(f"slack:T1:C1:{mention['ts']}")
            [checklist] = [
                m for m in slack.messages.values() if (m.get("text") or "").startswith("todo")
            ]
            assert checklist["text"].startswith("todo 1/20\n✓ step 0: check the logs &amp; the")
            sections = [b["text"]["text"] for b in checklist["blocks"]]
            assert len(sections) > 1 and all(len(s) <= 3000 for s in sections)
            assert "\n".join(sections) == checklist["text"]  # cut at line breaks, nothing lost
