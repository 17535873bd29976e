"""Multi-question ``ask_user`` (issue 35): a form, answered at once or a question
at a time, rendered natively per transport.

Through real transports: IRC (a real server, the irc3 stack), Slack (the real
slack-bolt stack against the fake Slack: Block Kit inputs and a submit
``block_actions``), the HTTP API (uvicorn, real requests) and its web page (a
real browser), stdio (the terminal adapter); a restart on the same SQLite file.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import sqlite3
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from agentik.core import Agent, SQLiteStore, TurnPolicy
from agentik.core.questions import MAX_FORM_FIELDS
from agentik.core.testing.scripted import Reply, ScriptedModel, call

from rigs import from_bot, irc_bot, people, tool_results

pytest_plugins = ["ircservers"]

ASKING = TurnPolicy(ask_user=True)
AXE = Path(
    os.environ.get("AGENTIK_AXE")
    or Path(__file__).resolve().parent.parent / ".npm-tools/node_modules/axe-core/axe.min.js"
)

FORM = {
    "question": "deploy settings",
    "to": "alice",
    "questions": [
        {"id": "region", "text": "which region?", "choices": ["eu", "us"]},
        {"id": "count", "text": "how many replicas?"},
        {"id": "note", "text": "anything else?", "required": False},
    ],
}
HEAD = (
    "@alice: deploy settings — 3 questions; answer each with !answer <n> <text>, or one"
    " line each in order (- skips an optional one)"
)


async def next_event(sub, kind: str, wait: float = 60.0):
    async with asyncio.timeout(wait):
        async for event in sub:
            if event.kind == kind:
                return event
    raise AssertionError(f"the stream ended before {kind}")


_BRIDGES: dict = {}


@asynccontextmanager
async def asking_bot(port, db):
    async with irc_bot(
        port, Path(db).parent, db=db, agent_kw={"policy": ASKING}, channels=["#ops"],
        joined_to=["#ops"],
    ) as bot:  # fmt: skip
        _BRIDGES[bot.agent] = bot.bridge
        try:
            yield bot.model, bot.agent
        finally:
            _BRIDGES.pop(bot.agent, None)


# -- the tool: what the model may ask ----------------------------------------------------------


@pytest.mark.parametrize(
    ("questions", "error"),
    [
        ([], "`questions` must be a non-empty list"),
        ([{"id": f"q{n}", "text": "?"} for n in range(MAX_FORM_FIELDS + 1)], "at most 10"),
        ([{"id": "a", "text": "x"}, {"id": "a", "text": "y"}], "`id` 'a' is used twice"),
        ([{"id": "a b", "text": "x"}], "question 1: `id` must be 1 to 40 letters"),
        ([{"id": "a", "text": "  "}], "question 1 (a): `text` must be a non-empty string"),
        ([{"id": "a", "text": "x", "choices": "eu"}], "`choices` must be a list of strings"),
        ([{"id": "a", "text": "x", "required": "no"}], "`required` must be true or false"),
    ],
)
async def test_a_bad_form_is_a_clear_tool_error_and_nothing_is_asked(tmp_path, questions, error):
    model = ScriptedModel()
    agent = Agent(llm=model, store=SQLiteStore(str(tmp_path / "t.db")), policy=ASKING)
    async with agent:
        conv = await agent.conversation_for_channel("fake:chat:#c")
        model.enqueue(Reply(tool_calls=[call("ask_user", {"questions": questions})]), "ok")
        await conv.send("go", author="alice", author_id="chat:alice")
        await conv.wait_idle()
        [result] = tool_results(model)
        assert error in result
        assert await agent.store.questions() == []


async def test_the_configured_cap_on_questions_holds(tmp_path):
    model = ScriptedModel()
    policy = TurnPolicy(ask_user=True, ask_user_max_questions=2)
    agent = Agent(llm=model, store=SQLiteStore(str(tmp_path / "t.db")), policy=policy)
    async with agent:
        conv = await agent.conversation_for_channel("fake:chat:#c")
        model.enqueue(Reply(tool_calls=[call("ask_user", FORM)]), "ok")
        await conv.send("go", author="alice", author_id="chat:alice")
        await conv.wait_idle()
        assert "at most 2 questions at once" in tool_results(model)[0]
        assert await agent.store.questions() == []


async def test_a_form_waits_for_every_answer_and_the_result_is_a_json_object(tmp_path):
    model = ScriptedModel()
    agent = Agent(llm=model, store=SQLiteStore(str(tmp_path / "t.db")), policy=ASKING)
    async with agent:
        conv = await agent.conversation_for_channel("fake:chat:#c")
        sub = conv.events()
        model.enqueue(Reply(tool_calls=[call("ask_user", FORM)]), "done")
        await conv.send("go", author="alice", author_id="chat:alice")
        asked = await next_event(sub, "question_asked")
        assert [f["id"] for f in asked.form] == ["region", "count", "note"]
        assert [f["required"] for f in asked.form] == [True, True, False]
        # Someone else's words do not answer it: bob's message is a message of its own.
        assert await conv.answer("us", author="bob", author_id="chat:bob") is None
        q = await conv.answer("eu", author="alice", author_id="chat:alice")
        assert q.partial == {"region": "eu"} and q.state == "pending"
        progress = await next_event(sub, "question_progress")
        assert (progress.answered, progress.next, progress.by) == (("region",), "count", "alice")
        # A whole-form send with a required question left empty is refused; nothing kept.
        with pytest.raises(Exception, match="these questions need an answer: count"):
            await conv.answer_form({"note": "x"}, author="alice", author_id="chat:alice")
        assert (await agent.store.questions())[0].partial == {"region": "eu"}
        done = await conv.answer_form({"count": "3"}, author="alice", author_id="chat:alice")
        assert done.done
        answered = await next_event(sub, "question_answered")
        assert answered.outcome == "answered"
        await next_event(sub, "turn_ended")
        assert json.loads(tool_results(model)[0]) == {"region": "eu", "count": "3", "note": None}
        await sub.aclose()


async def test_an_expired_form_tells_the_model_what_was_answered(tmp_path):
    model = ScriptedModel()
    agent = Agent(llm=model, store=SQLiteStore(str(tmp_path / "t.db")), policy=ASKING)
    async with agent:
        conv = await agent.conversation_for_channel("fake:chat:#c")
        sub = conv.events()
        model.enqueue(Reply(tool_calls=[call("ask_user", {**FORM, "timeout": 1})]), "ok")
        await conv.send("go", author="alice", author_id="chat:alice")
        await next_event(sub, "question_asked")
        await conv.answer("us", author="alice", author_id="chat:alice")
        ended = await next_event(sub, "question_answered")
        assert ended.outcome == "expired"
        await next_event(sub, "turn_ended")
        [result] = tool_results(model)
        assert result == (
            "nobody answered: not every question was answered within 1 seconds;"
            ' answered so far: {"region": "us"}'
        )
        await sub.aclose()


# -- IRC -----------------------------------------------------------------------------------------


async def test_irc_numbered_lines_answered_by_number_or_in_order(miniircd, tmp_path):
    db = tmp_path / "form.db"
    async with asking_bot(miniircd.port, db) as (model, agent):
        alice, bob = await people(miniircd.port, "alice", "bob")
        model.enqueue(Reply(tool_calls=[call("ask_user", FORM)]), "deploying")
        alice.privmsg("#ops", "agentik: deploy")
        await bob.wait_for(lambda m: from_bot(m) and m.text == HEAD)
        await bob.wait_for(lambda m: from_bot(m) and m.text == "1. which region? (eu / us)")
        await bob.wait_for(lambda m: from_bot(m) and m.text == "2. how many replicas?")
        await bob.wait_for(lambda m: from_bot(m) and m.text == "3. anything else? (optional)")
        # bob is not the one asked.
        bob.privmsg("#ops", "!answer 1 us")
        await bob.wait_for(
            lambda m: from_bot(m) and m.text.endswith("no form waits for your answer here")
        )
        alice.privmsg("#ops", "!answer 9 x")
        await alice.wait_for(lambda m: from_bot(m) and "there is no question 9 (1 to 3)" in m.text)
        alice.privmsg("#ops", "!answer 2 three")
        await alice.wait_for(
            lambda m: from_bot(m) and m.text.endswith("(2 left) next: 1. which region? (eu / us)")
        )
        alice.privmsg("#ops", "-")  # the first open one is required: it cannot be skipped
        await alice.wait_for(
            lambda m: from_bot(m) and m.text.endswith("question 'region' needs an answer")
        )
        alice.privmsg("#ops", "eu")  # a plain line: the first question still open
        await alice.wait_for(
            lambda m: from_bot(m) and m.text.endswith("(1 left) next: 3. anything else? (optional)")
        )
        alice.privmsg("#ops", "-")  # skips the optional one: the form is complete
        await alice.wait_for(lambda m: from_bot(m) and m.text == "alice: deploying")
        assert json.loads(tool_results(model)[0]) == {
            "region": "eu", "count": "three", "note": None,
        }  # fmt: skip
        for c in (alice, bob):
            await c.close()
    with sqlite3.connect(db) as con:
        row = con.execute(
            "SELECT state, outcome, answer, answered_by, partial FROM question"
        ).fetchone()
    assert row[:2] == ("resolved", "answered") and row[3:] == ("alice", None)
    assert json.loads(row[2]) == {"region": "eu", "count": "three", "note": None}


async def test_a_restart_keeps_the_form_and_its_answers_so_far(miniircd, tmp_path):
    db = tmp_path / "restart.db"
    async with asking_bot(miniircd.port, db) as (model, agent):
        alice, bob = await people(miniircd.port, "alice", "bob")
        model.enqueue(Reply(tool_calls=[call("ask_user", FORM)]), "never said")
        alice.privmsg("#ops", "agentik: deploy")
        await bob.wait_for(lambda m: from_bot(m) and m.text == "3. anything else? (optional)")
        alice.privmsg("#ops", "!answer 2 5")
        await bob.wait_for(lambda m: from_bot(m) and "(2 left)" in m.text)
        [before] = await agent.store.questions(state="pending")
    # Stopped while it waited: the form and the answer given are in the file.
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT state, partial FROM question").fetchall() == [
            ("pending", '{"count": "5"}')
        ]
    async with asking_bot(miniircd.port, db) as (model, agent):
        model.enqueue(Reply(tool_calls=[call("ask_user", FORM)]), "deploying")
        counts = await _BRIDGES[agent].resume_pending()
        assert counts["answer"] == 1
        again = await bob.wait_for(lambda m: from_bot(m) and "asked again after" in m.text)
        assert again.text == "(asked again after a restart) " + HEAD
        # Only what is still open is asked again.
        await bob.wait_for(lambda m: from_bot(m) and m.text == "1. which region? (eu / us)")
        await bob.wait_for(lambda m: from_bot(m) and m.text == "3. anything else? (optional)")
        alice.privmsg("#ops", "!answer 3 none")
        alice.privmsg("#ops", "us")
        await bob.wait_for(lambda m: from_bot(m) and m.text.endswith("deploying"))
        assert json.loads(tool_results(model)[-1]) == {"region": "us", "count": "5", "note": "none"}
        [after] = await agent.store.questions()
        assert (after.id, after.deadline) == (before.id, before.deadline)
    for c in (alice, bob):
        await c.close()


# -- Slack -----------------------------------------------------------------------------------


async def test_slack_form_is_block_kit_inputs_and_a_submit_button(tmp_path):
    from agentik.bot.bridge import Bridge, ChannelOptions
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
            hostile = {
                **FORM,
                "question": "deploy <!channel>",
                "questions": [
                    {**FORM["questions"][0], "text": "which region? <!here> *bold*"},
                    *FORM["questions"][1:],
                ],
            }
            model.enqueue(Reply(tool_calls=[call("ask_user", hostile)]), "deploying")
            mention = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> deploy", user="U1")
            await slack.push_event(mention)
            asked = await slack.wait_for_call(
                "chat.postMessage", lambda p: "3 questions" in (p.get("text") or "")
            )
            assert asked["thread_ts"] == mention["ts"]
            # The model's words cannot mention anyone: escaped in the text...
            assert asked["text"].startswith("@alice: deploy &lt;!channel&gt; — 3 questions")
            [(_, ts)] = [k for k, m in slack.messages.items() if "3 questions" in m["text"]]
            blocks = slack.messages[("C1", ts)]["blocks"]
            inputs = [b for b in blocks if b["type"] == "input"]
            # ...and shown as written in plain_text labels, which Slack never parses.
            assert [(b["label"]["type"], b["label"]["text"], b["optional"]) for b in inputs] == [
                ("plain_text", "1. which region? <!here> *bold*", False),
                ("plain_text", "2. how many replicas?", False),
                ("plain_text", "3. anything else?", True),
            ]
            assert inputs[0]["element"]["type"] == "static_select"
            assert [o["value"] for o in inputs[0]["element"]["options"]] == ["eu", "us"]
            assert inputs[1]["element"]["type"] == "plain_text_input"
            [submit] = [e for b in blocks if b["type"] == "actions" for e in b["elements"]]
            assert submit["text"]["text"] == "Submit"

            async def press(user: str, **inputs: str) -> None:
                values = {f"agentik_field_{k}": v for k, v in inputs.items()}
                payload = slack.block_actions_payload(
                    "C1", ts, submit["action_id"], user=user, inputs=values
                )
                await slack.wait_for_ack(await slack.push_interactive(payload))

            # bob is not the one asked: his submit answers nothing.
            await press("U2", region="us", count="1")
            await slack.wait_for_call(
                "chat.postMessage",
                lambda p: "no form waits for your answer here" in (p.get("text") or ""),
            )
            # alice leaves a required one empty: told which, nothing kept.
            await press("U1", region="eu")
            await slack.wait_for_call(
                "chat.postMessage",
                lambda p: "these questions need an answer: count" in (p.get("text") or ""),
            )
            [q] = await agent.store.questions()
            assert (q.state, q.partial) == ("pending", {})
            await press("U1", region="eu", count="3")
            edited = await slack.wait_for_call(
                "chat.update", lambda p: p.get("ts") == ts and "alice:" in (p.get("text") or "")
            )
            assert edited["text"].endswith("how many replicas? 3; anything else? —")
            assert all(b["type"] != "input" for b in slack.messages[("C1", ts)]["blocks"])
            await bridge.flush(f"slack:T1:C1:{mention['ts']}")
            assert json.loads(tool_results(model)[0]) == {
                "region": "eu", "count": "3", "note": None,
            }  # fmt: skip
            [q] = await agent.store.questions()
            assert (q.outcome, q.answered_by) == ("answered", "alice")
        finally:
            await transport.aclose()
            await bridge.aclose()
            await agent.aclose()


# -- the HTTP API ------------------------------------------------------------------------------


async def test_http_a_form_is_answered_with_a_json_body(tmp_path):
    from httpserver import TOKENS, running_server, sse

    settings = {
        "tokens": [{"name": "alice", "env": "ALICE_TOKEN"}, {"name": "carol", "env": "CAROL_TOKEN"}]
    }
    async with running_server(
        str(tmp_path / "http.db"), settings=settings, environ=TOKENS, policy=ASKING
    ) as server:
        server.model.enqueue(Reply(tool_calls=[call("ask_user", FORM)]), "deploying")
        async with (
            server.client(TOKENS["ALICE_TOKEN"]) as alice,
            server.client(TOKENS["CAROL_TOKEN"]) as carol,
        ):
            conv = (await alice.post("/conversations", json={})).json()
            base = f"/conversations/{conv['id']}"
            async with sse(alice, base + "/events", params={"profile": "chat"}) as events:
                r = await alice.post(base + "/messages", json={"content": "deploy"})
                assert r.status_code == 202
                asked = (await events.until("question_asked"))[-1].data
                assert [f["id"] for f in asked["form"]] == ["region", "count", "note"]
                form = f"{base}/questions/{asked['question_id']}"
                # carol is not the one asked (the rule is the token, a verified identity).
                r = await carol.post(form, json={"answers": {"region": "us", "count": "1"}})
                assert (r.status_code, r.json()["error"]["code"]) == (403, "forbidden")
                assert r.json()["error"]["message"].endswith("asks someone else")
                # Nor by naming herself alice: the token decides (no author field).
                r = await carol.post(form, json={"answers": {"region": "us"}, "author": "alice"})
                assert (r.status_code, r.json()["error"]["code"]) == (422, "invalid_body")
                # A form nobody asked: 404.
                r = await alice.post(f"{base}/questions/999999", json={"answers": {}})
                assert (r.status_code, r.json()["error"]["code"]) == (404, "question_not_found")
                # Bad answers: a clear error naming what is wrong, nothing kept.
                r = await alice.post(form, json={"answers": {"nope": "x"}})
                assert (r.status_code, r.json()["error"]["code"]) == (422, "invalid_answer")
                assert "no such question: nope" in r.json()["error"]["message"]
                r = await alice.post(form, json={"answers": {"region": "eu"}})
                assert r.status_code == 422
                assert "these questions need an answer: count" in r.json()["error"]["message"]
                r = await alice.post(form, json={"answers": {"region": 3}})
                assert (r.status_code, r.json()["error"]["code"]) == (422, "invalid_body")
                # Part of it now, the rest later.
                r = await alice.post(form, json={"answers": {"region": "eu"}, "submit": False})
                assert r.status_code == 200
                assert r.json() == {
                    "question_id": asked["question_id"], "done": False,
                    "answered": ["region"], "missing": ["count", "note"],
                }  # fmt: skip
                progress = (await events.until("question_progress"))[-1].data
                assert (progress["answered"], progress["next"]) == (["region"], "count")
                r = await alice.post(form, json={"answers": {"count": "2", "note": ""}})
                assert r.status_code == 200 and r.json()["done"] is True
                answered = (await events.until("question_answered"))[-1].data
                assert answered["outcome"] == "answered"
                assert json.loads(answered["answer"]) == {
                    "region": "eu",
                    "count": "2",
                    "note": None,
                }
                ended = (await events.until("turn_ended"))[-1].data
                assert ended["text"] == "deploying"
                r = await alice.post(form, json={"answers": {"count": "3"}})
                assert r.status_code == 404  # it ended
        assert json.loads(tool_results(server.model)[0]) == {
            "region": "eu", "count": "2", "note": None,
        }  # fmt: skip


# -- the web page ------------------------------------------------------------------------------


async def test_the_web_page_shows_a_form_reachable_by_keyboard_and_axe_clean(tmp_path, browser):
    from playwright.async_api import expect

    from httpserver import TOKENS, running_server

    axe = AXE
    expect.set_options(timeout=60_000)
    settings = {"tokens": [{"name": "ada", "env": "ADMIN_TOKEN"}]}
    async with running_server(
        str(tmp_path / "web.db"), settings=settings, environ=TOKENS, policy=ASKING
    ) as server:
        # axe is injected as a script of its own: the page's policy would refuse it.
        context = await browser.new_context(bypass_csp=True)
        page = await context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        await page.goto(server.url + "/")
        await page.fill("#token", TOKENS["ADMIN_TOKEN"])
        await page.click("#save-token")
        await page.click("#new")
        await expect(page.locator("#status")).to_have_text("live")
        hostile = {
            "question": "<img src=x onerror=window.__xss=1>",
            "questions": [
                {"id": "region", "text": "<b>which</b> region?", "choices": ["eu", "<i>us</i>"]},
                {"id": "count", "text": "how many replicas?"},
                {"id": "note", "text": "anything else?", "required": False},
            ],
        }
        server.model.enqueue(Reply(tool_calls=[call("ask_user", hostile)]), "deploying")
        await page.fill("#input", "deploy")
        await page.press("#input", "Enter")
        form = page.locator("form.askform").last
        await expect(form.locator("legend")).to_have_text(
            "@ada: <img src=x onerror=window.__xss=1>"
        )  # text, not HTML
        region = form.get_by_label("1. <b>which</b> region?")
        await expect(region).to_be_visible()
        await expect(form.get_by_role("option", name="<i>us</i>")).to_have_count(1)
        if axe.exists():
            await page.add_script_tag(path=str(axe))
            found = await page.evaluate(
                "async () => (await axe.run(document.querySelector('form.askform'))).violations"
            )
            assert [v["id"] for v in found if v["impact"] in ("serious", "critical")] == []
        elif os.environ.get("CI") == "true":
            pytest.fail("axe-core is missing: `make test` installs it into .npm-tools")
        # By keyboard: the select, Tab to the next, type, Tab, Enter sends the form.
        await region.focus()
        await region.select_option("eu")
        await page.keyboard.press("Tab")
        await expect(form.get_by_label("2. how many replicas?")).to_be_focused()
        await page.keyboard.type("3")
        await page.keyboard.press("Tab")
        await expect(form.get_by_label("3. anything else? (optional)")).to_be_focused()
        await page.keyboard.press("Enter")
        done = page.locator(".question").last
        await expect(done).to_contain_text(
            "ada answered: <b>which</b> region? eu; how many replicas? 3; anything else? —"
        )
        await expect(page.locator("form.askform")).to_have_count(0)
        await expect(page.locator(".msg.assistant").last).to_contain_text("deploying")
        assert await page.evaluate("() => window.__xss") is None
        assert json.loads(tool_results(server.model)[0]) == {
            "region": "eu", "count": "3", "note": None,
        }  # fmt: skip
        assert not errors, errors
        await context.close()


# -- stdio -------------------------------------------------------------------------------------


class _Screen(io.TextIOBase):
    """What the person at the terminal sees; ``changed`` is set on each write."""

    def __init__(self) -> None:
        self.text = ""
        self.changed = asyncio.Event()

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self.text += s
        self.changed.set()
        return len(s)

    async def shows(self, what: str, wait: float = 60.0) -> None:
        async with asyncio.timeout(wait):
            while what not in self.text:
                self.changed.clear()
                await self.changed.wait()


async def test_stdio_asks_the_questions_one_after_another(tmp_path):
    from agentik.bot.bridge import Bridge, ChannelOptions
    from agentik.transports.stdio import StdioTransport

    model = ScriptedModel()
    agent = Agent(llm=model, store=SQLiteStore(str(tmp_path / "t.db")), policy=ASKING)
    await agent.start()
    bridge = Bridge(agent)
    read_fd, write_fd = os.pipe()
    stdin = os.fdopen(read_fd, "rb", buffering=0)
    screen = _Screen()
    transport = StdioTransport(
        name="stdio",
        settings={"channel": "form", "user": "alice", "interactive": False},
        stdin=stdin, stdout=screen, stderr=screen,
    )  # fmt: skip
    bridge.attach(transport, ChannelOptions(command_prefix="!"))
    await transport.start(bridge)
    try:
        form = {k: v for k, v in FORM.items() if k != "to"}
        model.enqueue(Reply(tool_calls=[call("ask_user", form)]), "deploying")
        os.write(write_fd, b"deploy\n")
        await screen.shows("1. which region? (eu / us)")
        assert "@alice: deploy settings — 3 questions" in screen.text
        assert "2. how many" not in screen.text  # one at a time
        os.write(write_fd, b"eu\n")
        await screen.shows("2. how many replicas?")
        assert "3. anything else" not in screen.text
        os.write(write_fd, b"4\n")
        await screen.shows("3. anything else? (optional)")
        os.write(write_fd, b"-\n")
        await screen.shows("deploying")
        assert json.loads(tool_results(model)[0]) == {"region": "eu", "count": "4", "note": None}
    finally:
        os.close(write_fd)
        await transport.aclose()
        await bridge.aclose()
        await agent.aclose()
        stdin.close()
