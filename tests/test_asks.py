"""The bot asks (issue 20): ``ask_user``, ``todo`` and MCP progress in chat.

Through real transports: IRC (a real server), Slack (the real slack-bolt
stack against the fake Slack, in a thread), the HTTP API (uvicorn, real
requests, SSE); a restart on the same SQLite file; the in-suite MCP server
(``tests/mcp_server.py``) reporting progress.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from agentik.bot.bridge import Bridge, ChannelOptions
from agentik.core import Agent, SQLiteStore, TurnPolicy
from agentik.core.testing.scripted import Reply, ScriptedModel, call
from agentik.core.tools.mcp import MCPServerConfig, MCPToolset
from helpers import chat_page

from rigs import from_bot, irc_bot, people, tool_results

pytest_plugins = ["ircservers"]

ASKING = TurnPolicy(ask_user=True, todo=True)
MCP_SERVER = str(Path(__file__).with_name("mcp_server.py"))


async def next_event(sub, kind: str, wait: float = 60.0):
    async with asyncio.timeout(wait):
        async for event in sub:
            if event.kind == kind:
                return event
    raise AssertionError(f"the stream ended before {kind}")


_BRIDGES: dict[Agent, Bridge] = {}


@asynccontextmanager
async def asking_bot(port, db, *, policy=ASKING, options=None, toolsets=()):
    """:func:`rigs.irc_bot` on ``db`` in #ops, its turns under ``policy`` (``ask_user``
    on); yields its model and agent."""
    async with irc_bot(
        port, Path(db).parent, db=db, options=options,
        agent_kw={"policy": policy, "toolsets": toolsets}, channels=["#ops"], joined_to=["#ops"],
    ) as bot:  # fmt: skip
        _BRIDGES[bot.agent] = bot.bridge
        try:
            yield bot.model, bot.agent
        finally:
            _BRIDGES.pop(bot.agent, None)


REGION = {"question": "which region?", "to": "alice", "choices": ["eu", "us"]}


# -- ask_user -------------------------------------------------------------------------------------


async def test_irc_round_trip_only_the_asked_person_answers(miniircd, tmp_path):
    db = tmp_path / "asks.db"
    async with asking_bot(miniircd.port, db) as (model, agent):
        alice, bob = await people(miniircd.port, "alice", "bob")
        model.enqueue(Reply(tool_calls=[call("ask_user", REGION)]), "deploying to eu")
        alice.privmsg("#ops", "agentik: deploy the release")
        asked = await bob.wait_for(lambda m: from_bot(m) and "which region?" in m.text)
        assert asked.text == "@alice: which region? (eu / us)"
        conv = await agent.conversation_for_channel("irc:testnet:#ops")
        assert conv.awaiting_human and [q.text for q in conv.pending_questions()] == [
            "which region?"
        ]
        # bob is not the one asked: his message is an ordinary one (queued as a turn).
        bob.privmsg("#ops", "agentik: us")
        alice.privmsg("#ops", "eu")  # not addressed to the bot: still the answer
        await alice.wait_for(lambda m: from_bot(m) and m.text == "alice: deploying to eu")
        assert model.requests[1].messages[-1].content == "alice answered: eu"
        # Then bob's message gets its own turn (the scripted model echoes it).
        await alice.wait_for(lambda m: from_bot(m) and m.text == "bob: echo: us")
        assert not conv.awaiting_human and conv.pending_questions() == []
        for c in (alice, bob):
            await c.close()
    with sqlite3.connect(db) as con:
        row = con.execute(
            "SELECT asker_target, text, choices, state, outcome, answer, answered_by FROM question"
        ).fetchone()
        # The answer is the tool result, not a user message of its own.
        users = [r[0] for r in con.execute("SELECT content FROM message WHERE kind = 'user'")]
    assert row == ("alice", "which region?", '["eu", "us"]', "resolved", "answered", "eu", "alice")
    assert users == ["deploy the release", "us"]


async def test_nobody_answers_in_time_and_the_model_is_told(tmp_path):
    model = ScriptedModel()
    agent = Agent(llm=model, store=SQLiteStore(str(tmp_path / "t.db")), policy=ASKING)
    async with agent:
        conv = await agent.conversation_for_channel("fake:chat:#c")
        sub = conv.events()
        model.enqueue(
            Reply(tool_calls=[call("ask_user", {"question": "ready?", "timeout": 0.2})]), "ok"
        )
        await conv.send("go", author="alice", author_id="chat:alice")
        asked = await next_event(sub, "question_asked")
        # Without ``to`` the question is for the person whose message started the turn.
        assert (asked.to, asked.answer_from, asked.timeout) == ("alice", "asked", 0.2)
        ended = await next_event(sub, "question_answered")
        assert (ended.outcome, ended.answer, ended.answered_by) == ("expired", "", None)
        await next_event(sub, "turn_ended")
        assert tool_results(model) == ["nobody answered within 0.2 seconds"]
        [q] = await agent.store.questions()
        assert (q.state, q.outcome) == ("resolved", "expired")
        await sub.aclose()


async def test_anyone_may_answer_when_so_configured_and_temp_conversations_cannot_ask(tmp_path):
    model = ScriptedModel()
    policy = TurnPolicy(ask_user=True, answer_from="anyone")
    agent = Agent(llm=model, store=SQLiteStore(str(tmp_path / "t.db")), policy=policy)
    async with agent:
        conv = await agent.conversation_for_channel("fake:chat:#c")
        sub = conv.events()
        model.enqueue(Reply(tool_calls=[call("ask_user", REGION)]), "fine")
        await conv.send("go", author="alice", author_id="chat:alice")
        await next_event(sub, "question_asked")
        run = await conv.send("us", author="bob", author_id="chat:bob")
        answered = await next_event(sub, "question_answered")
        assert (answered.outcome, answered.answer) == ("answered", "us")
        assert answered.answered_by == "bob"
        ended = await next_event(sub, "turn_ended")
        assert ended.run_id == run  # bob's message went to the waiting turn
        assert tool_results(model) == ["bob answered: us"]
        # A temporary conversation has nobody to ask: the tool is not offered there.
        temp = await agent.create_conversation(temp=True)
        await temp.send("hi")
        await temp.wait_idle()
        assert "ask_user" not in [t.name for t in model.requests[-1].tools]
        assert "ask_user" in [t.name for t in model.requests[0].tools]
        await sub.aclose()


async def test_stop_while_a_question_waits_cancels_it(tmp_path):
    model = ScriptedModel()
    agent = Agent(llm=model, store=SQLiteStore(str(tmp_path / "t.db")), policy=ASKING)
    async with agent:
        conv = await agent.conversation_for_channel("fake:chat:#c")
        sub = conv.events()
        model.enqueue(Reply(tool_calls=[call("ask_user", REGION)]))
        await conv.send("go", author="alice")
        await next_event(sub, "question_asked")
        assert await conv.interrupt()
        cancelled = await next_event(sub, "question_answered")
        assert cancelled.outcome == "cancelled"
        await next_event(sub, "turn_ended")
        assert not conv.awaiting_human
        # alice's next message is an ordinary one.
        await conv.send("eu", author="alice")
        ended = await next_event(sub, "turn_ended")
        assert ended.text == "echo: eu"
        await sub.aclose()


async def test_a_pending_question_survives_a_restart_and_the_answer_finishes_the_turn(
    miniircd, tmp_path
):
    db = tmp_path / "restart.db"
    async with asking_bot(miniircd.port, db) as (model, agent):
        alice, bob = await people(miniircd.port, "alice", "bob")
        model.enqueue(Reply(tool_calls=[call("ask_user", REGION)]), "never said")
        alice.privmsg("#ops", "agentik: deploy the release")
        await bob.wait_for(lambda m: from_bot(m) and m.text == "@alice: which region? (eu / us)")
        [before] = await agent.store.questions(state="pending")
    # The bot stopped while the question waited: it is still pending in the file.
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT state FROM question").fetchall() == [("pending",)]
    async with asking_bot(miniircd.port, db) as (model, agent):
        # The resumed turn asks the model again, which asks the same question again.
        model.enqueue(Reply(tool_calls=[call("ask_user", REGION)]), "deploying to eu")
        counts = await _BRIDGES[agent].resume_pending()
        assert counts["answer"] == 1
        again = await bob.wait_for(lambda m: from_bot(m) and "asked again after" in m.text)
        assert again.text.endswith("@alice: which region? (eu / us)")
        alice.privmsg("#ops", "eu")
        await bob.wait_for(lambda m: from_bot(m) and m.text.endswith("deploying to eu"))
        assert tool_results(model)[-1] == "alice answered: eu"
        [after] = await agent.store.questions()
        # The same question (same id and deadline) was taken over and answered.
        assert (after.id, after.deadline) == (before.id, before.deadline)
        assert (after.outcome, after.answer, after.answered_by) == ("answered", "eu", "alice")
    for c in (alice, bob):
        await c.close()


async def test_slack_thread_round_trip_and_the_checklist_is_edited(tmp_path):
    from agentik.transports.slack.transport import SlackTransport

    from fakeslack import FakeSlack

    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        slack.add_user("U2", "bob")
        model = ScriptedModel()
        agent = Agent(llm=model, store=SQLiteStore(str(tmp_path / "slack.db")), policy=ASKING)
        await agent.start()
        bridge = Bridge(agent)
        transport = SlackTransport(
            name="slack",
            settings={
                "bot_token": slack.bot_token, "app_token": slack.app_token,
                "api_url": slack.api_url, "state_file": str(tmp_path / "seen.sqlite3"),
                "streaming": "edit", "edit_interval": 0.05,
            },
        )  # fmt: skip
        bridge.attach(transport, ChannelOptions(command_prefix="!"))
        await transport.start(bridge)
        try:
            steps = [{"text": "pick a region", "status": "in_progress"},
                     {"text": "deploy", "status": "pending"}]  # fmt: skip
            later = [{"text": "pick a region", "status": "done"},
                     {"text": "deploy", "status": "in_progress"}]  # fmt: skip
            region = {"question": "which region?", "choices": ["eu", "us"]}
            model.enqueue(
                Reply(tool_calls=[call("todo", {"items": steps})]),
                Reply(tool_calls=[call("ask_user", region)]),
                Reply(tool_calls=[call("todo", {"items": later})]),
                "deploying to eu",
            )
            mention = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> deploy", user="U1")
            await slack.push_event(mention)
            listed = await slack.wait_for_call(
                "chat.postMessage", lambda p: "todo 0/2" in (p.get("text") or "")
            )
            assert listed["thread_ts"] == mention["ts"]
            assert "▸ pick a region" in listed["text"] and "○ deploy" in listed["text"]
            asked = await slack.wait_for_call(
                "chat.postMessage", lambda p: "which region?" in (p.get("text") or "")
            )
            assert asked["thread_ts"] == mention["ts"]  # in the asker's thread
            assert asked["text"] == "@alice: which region? (eu / us)"
            # bob answers in the thread: not the one asked, so it is not the answer.
            await slack.push_event(
                slack.message_event("C1", "us", user="U2", thread_ts=mention["ts"])
            )
            # alice answers in the thread, without mentioning the bot.
            await slack.push_event(
                slack.message_event("C1", "eu", user="U1", thread_ts=mention["ts"])
            )
            edited = await slack.wait_for_call(
                "chat.update", lambda p: "alice: eu" in (p.get("text") or "")
            )
            assert "which region?" in edited["text"]
            # The checklist message is edited, not posted again.
            update = await slack.wait_for_call(
                "chat.update", lambda p: "todo 1/2" in (p.get("text") or "")
            )
            [(_, ts)] = [k for k, m in slack.messages.items() if "todo" in (m.get("text") or "")]
            assert update["ts"] == ts
            assert "✓ pick a region" in update["text"] and "▸ deploy" in update["text"]
            await bridge.flush(f"slack:T1:C1:{mention['ts']}")
            assert tool_results(model)[1] == "alice answered: eu"
            posted = [p.get("text") or "" for p in slack.calls_to("chat.postMessage")]
            assert sum("todo" in t for t in posted) == 1
        finally:
            await transport.aclose()
            await bridge.aclose()
            await agent.aclose()


async def test_http_question_on_the_stream_and_a_posted_message_answers_it(tmp_path):
    from httpserver import TOKENS, running_server, sse

    settings = {"tokens": [{"name": "alice", "env": "ALICE_TOKEN"}]}
    async with running_server(
        str(tmp_path / "http.db"), settings=settings, environ=TOKENS, policy=ASKING
    ) as server:
        server.model.enqueue(
            Reply(tool_calls=[call("ask_user", {"question": "which region?"})]), "eu it is"
        )
        async with server.client(TOKENS["ALICE_TOKEN"]) as alice:
            conv = (await alice.post("/conversations", json={})).json()
            base = f"/conversations/{conv['id']}"
            async with sse(alice, base + "/events", params={"profile": "chat"}) as events:
                r = await alice.post(base + "/messages", json={"content": "deploy"})
                assert r.status_code == 202
                run_id = r.json()["run_id"]
                asked = (await events.until("question_asked"))[-1].data
                assert (asked["question"], asked["to"]) == ("which region?", "alice")
                answer = await alice.post(base + "/messages", json={"content": "eu"})
                assert answer.status_code == 202 and answer.json()["run_id"] == run_id
                answered = (await events.until("question_answered"))[-1].data
                assert (answered["outcome"], answered["answer"]) == ("answered", "eu")
                ended = (await events.until("turn_ended"))[-1].data
                assert ended["text"] == "eu it is"
        assert tool_results(server.model) == ["alice answered: eu"]


# -- todo on IRC -----------------------------------------------------------------------------------


async def test_irc_todo_says_one_line_per_change(miniircd, tmp_path):
    async with asking_bot(miniircd.port, tmp_path / "todo.db") as (model, agent):
        (alice,) = await people(miniircd.port, "alice")
        a = {"text": "read the logs", "status": "in_progress"}
        b = {"text": "fix the bug", "status": "pending"}
        model.enqueue(
            Reply(tool_calls=[call("todo", {"items": [a, b]})]),
            # The same list again: nothing changed, nothing said.
            Reply(tool_calls=[call("todo", {"items": [a, b]})]),
            Reply(tool_calls=[call("todo", {"items": [{**a, "status": "done"}, b]})]),
            "done for now",
        )
        alice.privmsg("#ops", "agentik: look into it")
        await alice.wait_for(lambda m: from_bot(m) and m.text == "alice: done for now")
        lines = [m.text for m in alice.received if from_bot(m) and m.text.startswith("todo")]
        assert lines == [
            "todo 0/2: ▸ read the logs; ○ fix the bug",
            "todo 1/2: ✓ read the logs",
        ]
        await alice.close()


# -- MCP progress ----------------------------------------------------------------------------------


async def test_mcp_progress_from_the_in_suite_server_is_shown_in_irc(miniircd, tmp_path):
    for interval, expected in ((0.0, 3), (3600.0, 1)):
        toolset = MCPToolset(
            [MCPServerConfig(name="srv", command=sys.executable, args=(MCP_SERVER, "--progress"))]
        )
        options = ChannelOptions(command_prefix="!", events="chat", progress_interval=interval)
        async with asking_bot(
            miniircd.port, tmp_path / f"p{expected}.db", options=options, toolsets=[toolset]
        ) as (model, agent):
            (alice,) = await people(miniircd.port, f"carol{expected}")
            sub = agent.events()
            model.enqueue(Reply(tool_calls=[call("srv__build", {"steps": 3})]), "built")
            alice.privmsg("#ops", "agentik: build it")
            await alice.wait_for(lambda m: from_bot(m) and m.text.endswith(": built"))
            shown = [m.text for m in alice.received if from_bot(m) and "srv__build:" in m.text]
            # The first report at once; with a long interval, no more lines.
            assert shown == [f"⚙ srv__build: {p}% step {i} of 3" for i, p in
                             ((1, 33), (2, 67), (3, 100))][:expected]  # fmt: skip
            progress = []
            async with asyncio.timeout(60):
                async for e in sub:
                    if e.kind == "tool_progress":
                        progress.append((e.progress, e.total, e.message))
                    if e.kind == "turn_ended":
                        break
            assert progress == [(1.0, 3.0, "step 1 of 3"), (2.0, 3.0, "step 2 of 3"),
                                (3.0, 3.0, "step 3 of 3")]  # fmt: skip
            assert tool_results(model) == ["built in 3 steps"]
            await sub.aclose()
            await alice.close()


# -- the web page ----------------------------------------------------------------------------------


async def test_the_web_page_shows_the_question_with_choices_and_the_checklist(tmp_path, browser):
    from playwright.async_api import expect

    from httpserver import TOKENS, running_server

    expect.set_options(timeout=60_000)
    settings = {"tokens": [{"name": "ada", "env": "ADMIN_TOKEN"}]}
    async with running_server(
        str(tmp_path / "web.db"), settings=settings, environ=TOKENS, policy=ASKING
    ) as server:
        page, errors = await chat_page(browser, server.url, TOKENS["ADMIN_TOKEN"])
        first = [{"text": "pick a region", "status": "in_progress"}]
        server.model.enqueue(
            Reply(tool_calls=[call("todo", {"items": first})]),
            Reply(
                tool_calls=[
                    call(
                        "ask_user",
                        {"question": "<b>which</b> region?", "choices": ["eu", "us"]},
                    )
                ]
            ),
            Reply(tool_calls=[call("todo", {"items": [{**first[0], "status": "done"}]})]),
            "deploying to eu",
        )
        await page.fill("#input", "deploy")
        await page.press("#input", "Enter")
        question = page.locator(".question").last
        await expect(question).to_contain_text("@ada: <b>which</b> region?")  # text, not HTML
        await question.get_by_role("button", name="eu").click()
        await expect(question).to_contain_text("ada answered: eu")
        await expect(page.locator(".msg.assistant").last).to_contain_text("deploying to eu")
        todo = page.locator(".todo")
        await expect(todo).to_have_count(1)  # one checklist, updated in place
        await expect(todo).to_contain_text("todo 1/1")
        await expect(todo).to_contain_text("✓ pick a region")
        assert tool_results(server.model)[1] == "ada answered: eu"
        # Opened afresh (a reload), the page shows the stored checklist.
        await page.reload()
        await page.locator("#conversations li").first.click()
        await expect(page.locator("#status")).to_have_text("live")
        await expect(page.locator(".msg.assistant").last).to_contain_text("deploying to eu")
        await expect(todo).to_have_count(1)
        await expect(todo).to_contain_text("todo 1/1")
        await expect(todo).to_contain_text("✓ pick a region")
        assert not errors, errors


async def test_mcp_progress_on_slack_is_one_line_edited_in_place(tmp_path):
    from agentik.transports.slack.transport import SlackTransport

    from fakeslack import FakeSlack

    toolset = MCPToolset(
        [MCPServerConfig(name="srv", command=sys.executable, args=(MCP_SERVER, "--progress"))]
    )
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        model = ScriptedModel()
        agent = Agent(llm=model, store=SQLiteStore(str(tmp_path / "slack.db")), toolsets=[toolset])
        await agent.start()
        bridge = Bridge(agent)
        transport = SlackTransport(
            name="slack",
            settings={
                "bot_token": slack.bot_token, "app_token": slack.app_token,
                "api_url": slack.api_url, "state_file": str(tmp_path / "seen.sqlite3"),
                "streaming": "edit", "edit_interval": 0.05,
            },
        )  # fmt: skip
        bridge.attach(transport, ChannelOptions(command_prefix="!", progress_interval=0))
        await transport.start(bridge)
        try:
            model.enqueue(Reply(tool_calls=[call("srv__build", {"steps": 3})]), "built")
            mention = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> build", user="U1")
            await slack.push_event(mention)
            done = await slack.wait_for_call(
                "chat.update", lambda p: "srv__build: done" in (p.get("text") or "")
            )
            await bridge.flush(f"slack:T1:C1:{mention['ts']}")
            posted = [
                p
                for p in slack.calls_to("chat.postMessage")
                if "srv__build:" in (p.get("text") or "")
            ]
            # One line, posted at the first report and edited after.
            assert [p["text"] for p in posted] == ["⚙ srv__build: 33% step 1 of 3"]
            edits = [
                p["text"]
                for p in slack.calls_to("chat.update")
                if p.get("ts") == done["ts"] and "srv__build" in (p.get("text") or "")
            ]
            assert edits[:2] == ["⚙ srv__build: 67% step 2 of 3", "⚙ srv__build: 100% step 3 of 3"]
            assert edits[-1].startswith("⚙ srv__build: done (")
            assert tool_results(model) == ["built in 3 steps"]
        finally:
            await transport.aclose()
            await bridge.aclose()
            await agent.aclose()


# -- the store contract (every engine) -------------------------------------------------------------


@pytest.mark.parametrize("engine", ["sqlite-file", "memory"])
async def test_store_settles_a_question_once_and_deleting_the_conversation_removes_it(
    engine, tmp_path
):
    import time

    from agentik.core import MemoryStore
    from agentik.core.questions import Question

    store = SQLiteStore(str(tmp_path / "q.db")) if engine == "sqlite-file" else MemoryStore()
    agent = Agent(llm=ScriptedModel(), store=store)
    async with agent:
        conv = await agent.create_conversation()
        now = time.time()
        q = Question(conversation_id=conv.id, run_id="r1", call_id="c1", asker_target="alice",
                     text="which region?", choices=("eu", "us"), created_at=now,
                     deadline=now + 60)  # fmt: skip
        qid = await store.question_add(q)
        await store.question_rebind(qid, "c2")
        [pending] = await store.questions(conversation_id=conv.id, state="pending")
        assert (pending.id, pending.call_id, pending.choices) == (qid, "c2", ("eu", "us"))
        assert await store.question_settle(qid, "answered", "eu", "alice", now + 1)
        # A second outcome (a late timeout) does not overwrite the first.
        assert not await store.question_settle(qid, "expired", None, None, now + 2)
        got = await store.question_get(qid)
        assert got is not None
        assert (got.state, got.outcome, got.answer, got.answered_by) == (
            "resolved", "answered", "eu", "alice",
        )  # fmt: skip
        assert await store.questions(state="pending") == []
        await agent.delete_conversation(conv.id)
        assert await store.questions() == [] and await store.question_get(qid) is None


async def test_an_answer_goes_through_before_prompt_hooks_and_a_refused_one_leaves_it_waiting(
    tmp_path,
):
    from agentik.core.errors import PromptRefused
    from agentik.core.hooks import Refuse
    from agentik.core.hookspecs import hookimpl

    class Gate:
        @hookimpl
        def before_prompt(self, conversation, text):
            if "password" in text:
                return Refuse("I do not handle passwords here.")
            return text.replace("EU", "eu")

    model = ScriptedModel()
    agent = Agent(
        llm=model, store=SQLiteStore(str(tmp_path / "t.db")), policy=ASKING, hooks=[Gate()]
    )
    async with agent:
        conv = await agent.conversation_for_channel("fake:chat:#c")
        sub = conv.events()
        model.enqueue(Reply(tool_calls=[call("ask_user", REGION)]), "ok")
        await conv.send("go", author="alice")
        await next_event(sub, "question_asked")
        with pytest.raises(PromptRefused, match="passwords"):
            await conv.send("the password is x", author="alice")
        assert conv.awaiting_human  # still waiting
        await conv.send("EU", author="alice")
        answered = await next_event(sub, "question_answered")
        assert answered.answer == "eu"  # as the hook left it
        await next_event(sub, "turn_ended")
        assert tool_results(model) == ["alice answered: eu"]
        await sub.aclose()
