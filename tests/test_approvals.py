"""Approvals in chat: a tool call waits for a person's yes or no (issue 19).

Through real transports: IRC (a real server, ``!approve``/``!deny``), Slack
(the real slack-bolt stack against the fake Slack, a Block Kit button), the
HTTP API (uvicorn, real requests); a restart on the same SQLite file.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from contextlib import asynccontextmanager

import pytest

from agentik.bot.bridge import Bridge
from agentik.core import Agent, SQLiteStore
from agentik.core.access import AccessPolicy, AccessSettings
from agentik.core.approvals import ApprovalRule, at_least, mask_arguments
from agentik.core.testing.scripted import Reply, ScriptedModel, call
from agentik.core.tools.base import tool
from agentik.transports.irc.wire import casefold
from helpers import chat_page

from ircservers import IRCTestClient
from rigs import eventually, from_bot, irc_bot, people, slack_bot, tool_results

pytest_plugins = ["ircservers"]


def writer_tool(calls: list[dict]):
    @tool(
        name="fs__write_file",
        description="Write a file",
        parameters={
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        },
    )
    async def write(path: str, content: str = "", api_key: str = "") -> str:
        calls.append({"path": path, "content": content})
        return f"wrote {len(content)} characters to {path}"

    return write


async def next_event(sub, kind: str, wait: float = 60.0):
    async with asyncio.timeout(wait):
        async for event in sub:
            if event.kind == kind:
                return event
    raise AssertionError(f"the stream ended before {kind}")


_BRIDGES: dict[Agent, Bridge] = {}


@asynccontextmanager
async def approvals_bot(
    port, tmp_path, rules, *, role_for=None, identity="hostmask", db=None, access=None
):
    """:func:`rigs.irc_bot` in #ops whose write tool (recording its calls) is behind the
    approval ``rules``; yields its model, agent and the calls the tool ran."""
    calls: list[dict] = []
    async with irc_bot(
        port, tmp_path, db=db or tmp_path / "approvals.db",
        agent_kw={"tools": [writer_tool(calls)], "approvals": rules},
        bridge_kw={"role_for": role_for, "access": access},
        channels=["#ops"], unverified_identity=identity, joined_to=["#ops"],
    ) as bot:  # fmt: skip
        _BRIDGES[bot.agent] = bot.bridge
        try:
            yield bot.model, bot.agent, calls
        finally:
            _BRIDGES.pop(bot.agent, None)


async def ask_for_a_write(model: ScriptedModel, alice: IRCTestClient, **args) -> str:
    """alice asks; the model calls the tool; returns the approval id the channel was shown."""
    model.enqueue(
        Reply(tool_calls=[call("fs__write_file", {"path": "/srv/motd", "content": "hi", **args})]),
        "all done",
    )
    alice.privmsg("#ops", "agentik: update the motd")
    asked = await alice.wait_for(lambda m: from_bot(m) and "asked me to run" in m.text)
    return asked.text.split("approval ", 1)[1].split(":", 1)[0]


async def test_irc_round_trip_by_approve(miniircd, tmp_path):
    rules = [ApprovalRule(tools=("fs__write_*",), approvers="user")]
    async with approvals_bot(miniircd.port, tmp_path, rules) as (model, agent, calls):
        alice, bob = await people(miniircd.port, "alice", "bob")
        model.enqueue(
            Reply(tool_calls=[call("fs__write_file", {
                "path": "/srv/motd", "content": "hi", "api_key": "sk-abcdefghijklmnop"})]),
            "all done",
        )  # fmt: skip
        alice.privmsg("#ops", "agentik: update the motd")
        asked = await bob.wait_for(lambda m: from_bot(m) and "asked me to run" in m.text)
        # Who asked, the tool, its arguments (the secret masked), how to answer.
        assert "alice asked me to run fs__write_file(" in asked.text
        assert 'path="/srv/motd"' in asked.text and 'api_key="***"' in asked.text
        assert "sk-abcdef" not in asked.text
        approval_id = asked.text.split("approval ", 1)[1].split(":", 1)[0]
        assert len(approval_id) == 3 and int(approval_id, 16) >= 0
        assert f"!approve {approval_id}" in asked.text and f"!deny {approval_id}" in asked.text
        assert calls == []  # nothing runs before the decision
        bob.privmsg("#ops", "!approvals")
        listed = await bob.wait_for(lambda m: from_bot(m) and "waiting for approval" in m.text)
        assert f"{approval_id}: fs__write_file(" in listed.text
        bob.privmsg("#ops", f"!approve {approval_id} looks fine")
        done = await alice.wait_for(lambda m: from_bot(m) and "approved by" in m.text)
        assert done.text.endswith(
            f"approval {approval_id} (fs__write_file): approved by bob: looks fine"
        )
        await alice.wait_for(lambda m: from_bot(m) and "all done" in m.text)
        assert calls == [{"path": "/srv/motd", "content": "hi"}]
        assert tool_results(model) == ["wrote 2 characters to /srv/motd"]
        # The record: masked arguments, who asked, who decided.
        with sqlite3.connect(tmp_path / "approvals.db") as con:
            row = con.execute(
                "SELECT tool, arguments, asker_id, state, decision, approver_id, reason"
                " FROM approval"
            ).fetchone()
        assert row[0] == "fs__write_file" and "sk-abcdef" not in row[1] and "***" in row[1]
        assert row[2].startswith("testnet:alice!") and row[3:5] == ("resolved", "approved")
        assert row[5].startswith("testnet:bob!") and row[6] == "looks fine"
        for c in (alice, bob):
            await c.close()


async def test_irc_denial_reaches_the_model_and_self_approval_is_refused(miniircd, tmp_path):
    rules = [ApprovalRule(tools=("fs__write_*",), approvers="user")]
    async with approvals_bot(miniircd.port, tmp_path, rules) as (model, agent, calls):
        alice, bob = await people(miniircd.port, "alice", "bob")
        approval_id = await ask_for_a_write(model, alice)
        # The asker may not approve their own call (self_approve is off by default).
        alice.privmsg("#ops", f"!approve {approval_id}")
        refused = await alice.wait_for(lambda m: from_bot(m) and "someone else" in m.text)
        assert f"approval {approval_id}: you asked for this call" in refused.text
        bob.privmsg("#ops", f"!deny {approval_id} not on a Friday")
        await alice.wait_for(lambda m: from_bot(m) and "denied by bob: not on a Friday" in m.text)
        await alice.wait_for(lambda m: from_bot(m) and "all done" in m.text)
        assert calls == []
        assert tool_results(model) == [
            "error: not run: the call was denied by bob: not on a Friday"
        ]
        # A decision taken stays taken.
        bob.privmsg("#ops", f"!approve {approval_id}")
        late = await bob.wait_for(lambda m: from_bot(m) and "already" in m.text)
        assert "denied" in late.text
        for c in (alice, bob):
            await c.close()


async def test_irc_unverified_nick_cannot_approve_and_the_request_expires(miniircd, tmp_path):
    # No services accounts and no hostmask opt-in: every nick is unverified.
    rules = [ApprovalRule(tools=("fs__write_*",), approvers="user", timeout=3)]
    async with approvals_bot(miniircd.port, tmp_path, rules, identity="none") as (
        model,
        agent,
        calls,
    ):
        alice, bob = await people(miniircd.port, "alice", "bob")
        conv = await agent.conversation_for_channel("irc:testnet:#ops")
        sub = conv.events()
        approval_id = await ask_for_a_write(model, alice)
        bob.privmsg("#ops", f"!approve {approval_id}")
        refused = await bob.wait_for(lambda m: from_bot(m) and "verified" in m.text)
        assert "only a verified identity may decide" in refused.text
        resolved = await next_event(sub, "approval_resolved")
        assert (resolved.approval_id, resolved.decision) == (approval_id, "expired")
        await alice.wait_for(lambda m: from_bot(m) and f"approval {approval_id}" in m.text
                             and "expired" in m.text)  # fmt: skip
        await alice.wait_for(lambda m: from_bot(m) and "all done" in m.text)
        assert calls == []
        assert tool_results(model) == ["error: not run: no one approved the call within 3 s"]
        await sub.aclose()
        for c in (alice, bob):
            await c.close()


async def test_an_admin_named_by_host_mask_approves_on_a_network_without_services(
    miniircd, tmp_path
):
    """No services and no `unverified_identity = "hostmask"`: an admin the operator
    named by `mask:` decides as configured; an unverified nick still may not."""
    access = AccessPolicy(
        AccessSettings(admins=("testnet:mask:carol!*@*",)), {"testnet": "irc"},
        irc_casefold=casefold,
    )  # fmt: skip
    rules = [ApprovalRule(tools=("fs__write_*",), approvers="admin")]
    async with approvals_bot(miniircd.port, tmp_path, rules, identity="none", access=access) as (
        model,
        agent,
        calls,
    ):
        alice, bob, carol = await people(miniircd.port, "alice", "bob", "carol")
        approval_id = await ask_for_a_write(model, alice)
        bob.privmsg("#ops", f"!approve {approval_id}")
        refused = await bob.wait_for(lambda m: from_bot(m) and "verified" in m.text)
        assert "only a verified identity may decide" in refused.text
        carol.privmsg("#ops", f"!approve {approval_id} ok")
        await alice.wait_for(lambda m: from_bot(m) and "approved by carol: ok" in m.text)
        await alice.wait_for(lambda m: from_bot(m) and "all done" in m.text)
        assert calls == [{"path": "/srv/motd", "content": "hi"}]
        with sqlite3.connect(tmp_path / "approvals.db") as con:
            (approver_id,) = con.execute("SELECT approver_id FROM approval").fetchone()
        assert approver_id.startswith("testnet:mask:carol!")
        # Her own call (an unverified asker has no id): someone else must approve it.
        model.enqueue(
            Reply(tool_calls=[call("fs__write_file", {"path": "/srv/motd", "content": "hi"})]),
            "not done",
        )
        carol.privmsg("#ops", "agentik: update the motd")
        asked = await carol.wait_for(lambda m: from_bot(m) and "carol asked me to run" in m.text)
        approval_id = asked.text.split("approval ", 1)[1].split(":", 1)[0]
        carol.privmsg("#ops", f"!approve {approval_id}")
        refused = await carol.wait_for(lambda m: from_bot(m) and "someone else" in m.text)
        assert f"approval {approval_id}: you asked for this call" in refused.text
        carol.privmsg("#ops", f"!deny {approval_id}")
        await carol.wait_for(lambda m: from_bot(m) and "denied by carol" in m.text)
        for c in (alice, bob, carol):
            await c.close()


async def test_stop_during_a_pending_approval_cancels_it(miniircd, tmp_path):
    rules = [ApprovalRule(tools=("fs__write_*",), approvers="user")]
    async with approvals_bot(miniircd.port, tmp_path, rules) as (model, agent, calls):
        (alice,) = await people(miniircd.port, "alice")
        approval_id = await ask_for_a_write(model, alice)
        alice.privmsg("#ops", "!stop")
        await alice.wait_for(lambda m: from_bot(m) and f"approval {approval_id}" in m.text
                             and "cancelled" in m.text)  # fmt: skip
        await alice.wait_for(lambda m: from_bot(m) and "(interrupted)" in m.text)
        assert calls == []
        assert await agent.approvals.pending("irc:testnet:#ops") == []
        alice.privmsg("#ops", f"!approve {approval_id}")
        late = await alice.wait_for(lambda m: from_bot(m) and "already cancelled" in m.text)
        assert approval_id in late.text
        await alice.close()


async def test_admin_rule_with_an_injected_role_function(miniircd, tmp_path):
    def role_for(transport: str, message, channel_key: str) -> str:
        return "admin" if message.author_name == "carol" else "user"

    rules = [ApprovalRule(tools=("fs__*",), approvers="admin")]
    async with approvals_bot(miniircd.port, tmp_path, rules, role_for=role_for) as (
        model,
        agent,
        calls,
    ):
        alice, bob, carol = await people(miniircd.port, "alice", "bob", "carol")
        approval_id = await ask_for_a_write(model, alice)
        bob.privmsg("#ops", f"!approve {approval_id}")
        refused = await bob.wait_for(lambda m: from_bot(m) and "only admins" in m.text)
        assert "you are user" in refused.text
        carol.privmsg("#ops", f"!approve {approval_id}")
        await alice.wait_for(lambda m: from_bot(m) and "approved by carol" in m.text)
        await alice.wait_for(lambda m: from_bot(m) and "all done" in m.text)
        assert calls == [{"path": "/srv/motd", "content": "hi"}]
        for c in (alice, bob, carol):
            await c.close()


def test_roles_compare_by_rank_and_named_roles_need_their_name_or_admin():
    assert at_least("owner", "admin") and at_least("admin", "admin")
    assert not at_least("user", "admin") and not at_least("ignored", "user")
    assert at_least("deployers", "user") and not at_least("deployers", "admin")
    assert at_least("deployers", "deployers") and at_least("admin", "deployers")
    assert not at_least("user", "deployers")


def test_arguments_are_masked_and_cut():
    shown = mask_arguments(json.dumps({
        "url": "https://x", "password": "hunter2",
        "headers": {"Authorization": "Bearer abcdefghijkl"},
        "note": "key sk-ABCDEFGHIJKLMNOPQRST inside", "body": "x" * 1000,
    }))  # fmt: skip
    assert "hunter2" not in shown and "abcdefghijkl" not in shown and "sk-ABCD" not in shown
    assert '"password": "***"' in shown and "https://x" in shown
    assert len(shown) <= 400


# -- Slack: Block Kit buttons -------------------------------------------------------------


@asynccontextmanager
async def approvals_slack_bot(slack, tmp_path, rules, *, access=None, **settings):
    """:func:`rigs.slack_bot` (answers edited in place) whose write tool is behind the
    approval ``rules``; yields its transport, model, agent, bridge and the tool's calls."""
    calls: list[dict] = []
    async with slack_bot(
        slack, tmp_path, tools=[writer_tool(calls)], agent_kw={"approvals": rules},
        bridge_kw={"access": access}, **{"streaming": "edit", **settings},
    ) as bot:  # fmt: skip
        if access is not None:
            # As the bot wires it (bot/app.py): approvers compare by the access policy.
            bot.agent.approvals.at_least = access.at_least
        yield (*bot, calls)


def asking_message(slack, channel: str) -> tuple[str, dict]:
    return next(
        (ts, m) for (ch, ts), m in sorted(slack.messages.items())
        if ch == channel and m.get("user") == slack.bot_user_id and "asked me to run" in m["text"]
    )  # fmt: skip


async def test_slack_round_trip_by_a_button_in_socket_mode(tmp_path):
    from fakeslack import FakeSlack

    rules = [ApprovalRule(tools=("fs__write_*",), approvers="user")]
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        slack.add_user("U2", "bob")
        async with approvals_slack_bot(slack, tmp_path, rules) as (
            bot,
            model,
            agent,
            bridge,
            calls,
        ):
            model.enqueue(
                Reply(tool_calls=[call("fs__write_file", {"path": "/srv/motd", "content": "hi"})]),
                "all done",
            )
            mention = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> update the motd")
            await slack.push_event(mention)
            posted = await slack.wait_for_call(
                "chat.postMessage", lambda p: "asked me to run" in (p.get("text") or "")
            )
            assert posted["thread_ts"] == mention["ts"]  # in the asker's thread
            ts, msg = asking_message(slack, "C1")
            buttons = [e for b in msg["blocks"] if b["type"] == "actions" for e in b["elements"]]
            assert [(b["text"]["text"], b.get("style")) for b in buttons] == [
                ("Approve", "primary"), ("Deny", "danger"),
            ]  # fmt: skip
            # alice asked: her own button press is refused (self_approve is off).
            own = slack.block_actions_payload("C1", ts, buttons[0]["action_id"], user="U1")
            await slack.wait_for_ack(await slack.push_interactive(own))
            await slack.wait_for_call(
                "chat.postMessage", lambda p: "someone else must approve" in (p.get("text") or "")
            )
            assert calls == []
            payload = slack.block_actions_payload("C1", ts, buttons[0]["action_id"], user="U2")
            envelope = await slack.push_interactive(payload)
            await slack.wait_for_ack(envelope)
            # The asking message is updated to say who decided; its buttons are gone.
            update = await slack.wait_for_call("chat.update", lambda p: p.get("ts") == ts)
            assert "approved by bob" in update["text"]
            assert all(b["type"] != "actions" for b in slack.messages[("C1", ts)]["blocks"])
            await bridge.flush(f"slack:T1:C1:{mention['ts']}")
            assert calls == [{"path": "/srv/motd", "content": "hi"}]
            row = (await agent.approvals.recent(limit=1))[0]
            assert (row.decision, row.approver_id) == ("approved", "slack:U2")


async def test_slack_admin_rule_decided_by_the_access_policy(tmp_path):
    # approvers = "admin" with a real [access] policy: a user's button press is
    # refused, the configured admin's goes through.
    from agentik.core.access import AccessPolicy, AccessSettings

    from fakeslack import FakeSlack

    rules = [ApprovalRule(tools=("fs__write_*",), approvers="admin")]
    access = AccessPolicy(AccessSettings(admins=("slack:T1:U3",)), {"slack": "slack"})
    async with FakeSlack() as slack:
        for uid, name in (("U1", "alice"), ("U2", "bob"), ("U3", "carol")):
            slack.add_user(uid, name)
        async with approvals_slack_bot(slack, tmp_path, rules, access=access) as (
            bot, model, agent, bridge, calls,
        ):  # fmt: skip
            model.enqueue(
                Reply(tool_calls=[call("fs__write_file", {"path": "/srv/motd", "content": "hi"})]),
                "all done",
            )
            mention = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> update the motd")
            await slack.push_event(mention)
            await slack.wait_for_call(
                "chat.postMessage", lambda p: "asked me to run" in (p.get("text") or "")
            )
            ts, msg = asking_message(slack, "C1")
            approve = next(
                e["action_id"] for b in msg["blocks"] if b["type"] == "actions"
                for e in b["elements"] if e["text"]["text"] == "Approve"
            )  # fmt: skip
            # bob is a user: refused, nothing runs.
            await slack.wait_for_ack(
                await slack.push_interactive(
                    slack.block_actions_payload("C1", ts, approve, user="U2")
                )
            )
            await slack.wait_for_call(
                "chat.postMessage", lambda p: "only admins may decide" in (p.get("text") or "")
            )
            assert calls == []
            # carol is an admin by the policy: approved, the tool runs.
            await slack.wait_for_ack(
                await slack.push_interactive(
                    slack.block_actions_payload("C1", ts, approve, user="U3")
                )
            )
            update = await slack.wait_for_call("chat.update", lambda p: p.get("ts") == ts)
            assert "approved by carol" in update["text"]
            await bridge.flush(f"slack:T1:C1:{mention['ts']}")
            assert calls == [{"path": "/srv/motd", "content": "hi"}]
            row = (await agent.approvals.recent(limit=1))[0]
            assert (row.decision, row.approver_id) == ("approved", "slack:U3")


async def test_slack_deny_button_over_http_mode(tmp_path):
    from urllib.parse import urlencode

    import aiohttp

    from fakeslack import FakeSlack

    rules = [ApprovalRule(tools=("fs__write_*",), approvers="user")]
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        slack.add_user("U2", "bob")
        async with approvals_slack_bot(
            slack, tmp_path, rules, mode="http", signing_secret=slack.signing_secret, http_port=0
        ) as (bot, model, agent, bridge, calls):
            url = f"http://127.0.0.1:{bot.http_port}/slack/events"
            model.enqueue(
                Reply(tool_calls=[call("fs__write_file", {"path": "/srv/motd", "content": "hi"})]),
                "all done",
            )
            event = slack.message_event("D1", "update the motd", channel_type="im")
            body = json.dumps(slack.event_callback(event)).encode()
            async with aiohttp.ClientSession() as http:
                headers = {**slack.sign(body), "Content-Type": "application/json"}
                async with http.post(url, data=body, headers=headers) as resp:
                    assert resp.status == 200
                await slack.wait_for_call(
                    "chat.postMessage", lambda p: "asked me to run" in (p.get("text") or "")
                )
                ts, msg = asking_message(slack, "D1")
                deny = next(e for b in msg["blocks"] if b["type"] == "actions"
                            for e in b["elements"] if e["text"]["text"] == "Deny")  # fmt: skip
                payload = slack.block_actions_payload("D1", ts, deny["action_id"], user="U2")
                form = urlencode({"payload": json.dumps(payload)}).encode()
                bad = {**slack.sign(form), "X-Slack-Signature": "v0=" + "0" * 64,
                       "Content-Type": "application/x-www-form-urlencoded"}  # fmt: skip
                async with http.post(url, data=form, headers=bad) as resp:
                    assert resp.status == 401  # an unsigned press is refused
                signed = {**slack.sign(form), "Content-Type": "application/x-www-form-urlencoded"}
                async with http.post(url, data=form, headers=signed) as resp:
                    assert resp.status == 200
            update = await slack.wait_for_call("chat.update", lambda p: p.get("ts") == ts)
            assert "denied by bob" in update["text"]
            await bridge.flush("slack:T1:D1")
            assert calls == []
            assert tool_results(model) == ["error: not run: the call was denied by bob"]


# -- HTTP API ----------------------------------------------------------------------------------


async def test_http_list_and_decide_with_events_on_the_stream(tmp_path):
    from httpserver import TOKENS, running_server, sse

    settings = {"tokens": [{"name": "admin", "env": "ADMIN_TOKEN"},
                           {"name": "alice", "env": "ALICE_TOKEN",
                            "channels": ["http:web:alice:"]}]}  # fmt: skip
    calls: list[dict] = []
    rules = [ApprovalRule(tools=("fs__write_*",), approvers="user")]
    async with running_server(
        str(tmp_path / "http.db"), settings=settings, environ=TOKENS,
        tools=[writer_tool(calls)], approvals=rules,
    ) as server:  # fmt: skip
        server.model.enqueue(
            Reply(tool_calls=[call("fs__write_file", {"path": "/srv/motd", "content": "hi"})]),
            "all done",
        )
        async with (
            server.client(TOKENS["ALICE_TOKEN"]) as alice,
            server.client(TOKENS["ADMIN_TOKEN"]) as admin,
        ):
            conv = (await alice.post("/conversations", json={})).json()
            base = f"/conversations/{conv['id']}"
            async with sse(alice, base + "/events", params={"profile": "chat"}) as events:
                r = await alice.post(base + "/messages", json={"content": "update the motd"})
                assert r.status_code == 202
                asked = (await events.until("approval_requested"))[-1].data
                assert asked["name"] == "fs__write_file" and asked["asker"] == "alice"
                assert asked["asker_id"] == "web:alice"
                pending = (await alice.get(base + "/approvals")).json()["items"]
                assert [(a["id"], a["state"]) for a in pending] == [
                    (asked["approval_id"], "pending")
                ]
                url = f"{base}/approvals/{asked['approval_id']}"
                # The asker may not approve their own call; an unknown id is 404.
                own = await alice.post(url, json={"decision": "approve"})
                assert own.status_code == 403 and own.json()["error"]["code"] == "forbidden"
                missing = await admin.post(f"{base}/approvals/zzz", json={"decision": "deny"})
                assert missing.status_code == 404
                assert missing.json()["error"]["code"] == "approval_not_found"
                bad = await admin.post(url, json={"decision": "maybe"})
                assert bad.status_code == 422
                ok = await admin.post(url, json={"decision": "approve", "reason": "go"})
                assert ok.status_code == 200, ok.text
                assert (ok.json()["decision"], ok.json()["approver_id"]) == (
                    "approved",
                    "web:admin",
                )
                resolved = (await events.until("approval_resolved"))[-1].data
                assert (resolved["decision"], resolved["approver"], resolved["reason"]) == (
                    "approved", "admin", "go",
                )  # fmt: skip
                await events.until("turn_ended")
            again = await admin.post(url, json={"decision": "deny"})
            assert again.status_code == 409
            assert again.json()["error"]["code"] == "approval_not_pending"
            assert (await alice.get(base + "/approvals")).json()["items"] == []
            every = (await alice.get(base + "/approvals", params={"state": "all"})).json()
            assert [a["decision"] for a in every["items"]] == ["approved"]
        assert calls == [{"path": "/srv/motd", "content": "hi"}]


# -- across a restart --------------------------------------------------------------------------


async def test_a_pending_approval_survives_a_restart_and_is_offered_again(miniircd, tmp_path):
    rules = [ApprovalRule(tools=("fs__write_*",), approvers="user")]
    db = tmp_path / "restart.db"
    async with approvals_bot(miniircd.port, tmp_path, rules, db=db) as (model, agent, calls):
        alice, bob = await people(miniircd.port, "alice", "bob")
        approval_id = await ask_for_a_write(model, alice)
        [before] = await agent.approvals.pending("irc:testnet:#ops")
    # The bot stopped mid-wait: the approval is still pending, the turn unanswered.
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT id, state FROM approval").fetchall() == [
            (approval_id, "pending")
        ]
    async with approvals_bot(miniircd.port, tmp_path, rules, db=db) as (model, agent, calls):
        # The resumed turn asks again from the stored call (no model request
        # first); the model's next answer follows the tool's result.
        model.enqueue("all done")
        bridge_counts = await _resume(agent)
        assert bridge_counts["answer"] == 1 and bridge_counts["approvals_expired"] == 0
        again = await bob.wait_for(
            lambda m: from_bot(m) and "asked again after a restart" in m.text
        )
        assert f"approval {approval_id}: alice asked me to run fs__write_file(" in again.text
        bob.privmsg("#ops", f"!approve {approval_id}")
        await alice.wait_for(lambda m: from_bot(m) and "approved by bob" in m.text)
        await alice.wait_for(lambda m: from_bot(m) and "all done" in m.text)
        assert calls == [{"path": "/srv/motd", "content": "hi"}]
        assert len(model.requests) == 1
        assert model.requests[0].messages[-1].role == "tool"
        [after] = await agent.approvals.recent(limit=5)
        assert (after.serial, after.expires_at) == (before.serial, before.expires_at)
        assert after.decision == "approved"
    for c in (alice, bob):
        await c.close()


async def test_a_pending_approval_whose_turn_is_not_resumed_expires_with_a_notice(
    miniircd, tmp_path
):
    rules = [ApprovalRule(tools=("fs__write_*",), approvers="user")]
    db = tmp_path / "restart.db"
    async with approvals_bot(miniircd.port, tmp_path, rules, db=db) as (model, agent, calls):
        (alice,) = await people(miniircd.port, "alice")
        approval_id = await ask_for_a_write(model, alice)
    async with approvals_bot(miniircd.port, tmp_path, rules, db=db) as (model, agent, calls):
        counts = await _resume(agent, resume="note")
        assert counts["note"] == 1 and counts["approvals_expired"] == 1
        notice = await alice.wait_for(lambda m: from_bot(m) and f"approval {approval_id}" in m.text
                                      and "expired" in m.text)  # fmt: skip
        assert "restarted" in notice.text
        await alice.wait_for(lambda m: from_bot(m) and "please ask again" in m.text)
        assert calls == [] and model.requests == []
        assert await agent.approvals.leftovers() == []
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT state, decision FROM approval").fetchall() == [
            ("resolved", "expired")
        ]
    await alice.close()


async def _resume(agent: Agent, *, resume: str = "answer") -> dict[str, int]:
    """The bot's start-up step after its transports are up: take up what the restart left."""
    bridge = _BRIDGES[agent]
    bridge.resume = resume
    return await bridge.resume_pending()


# -- the CLI -------------------------------------------------------------------------------------


def test_cli_lists_pending_approvals_and_recent_decisions(tmp_path):
    import subprocess

    from helpers import AGENTIK

    db = tmp_path / "cli.db"
    asyncio.run(_two_approvals(db))
    config = tmp_path / "agentik.toml"
    config.write_text(f'[storage]\npath = "{db}"\n')
    out = subprocess.run(
        [AGENTIK, "access", "approvals", "-c", str(config)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "waiting for approval: 1"
    assert lines[1].lstrip().startswith("3f2 ") and "fs__write_file" in lines[1]
    assert "asked by net:alice" in lines[1] and "expires in 10 min" in lines[1]
    assert lines[2] == "recent decisions: 1"
    assert lines[3].rstrip().endswith("denied by net:bob: not today")
    only = subprocess.run(
        [AGENTIK, "access", "approvals", "--pending", "-c", str(config)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "recent decisions" not in only.stdout and "3f2" in only.stdout


async def _two_approvals(db) -> None:
    """One approval pending and one denied, written through the store."""
    import time

    from agentik.core.approvals import Approval
    from agentik.core.store.base import ConversationRecord

    async with SQLiteStore(str(db)) as store:
        await store.create_conversation(ConversationRecord(id="c1", created_at=1, updated_at=1))
        now = time.time()
        base = dict(scope="irc:net:#ops", conversation_id="c1", channel_key="irc:net:#ops",
                    run_id="run_1", tool="fs__write_file", arguments='{"path": "/a"}',
                    asker_id="net:alice", approvers="admin", created_at=now,
                    expires_at=now + 600)  # fmt: skip
        await store.approval_add(Approval(id="3f2", call_id="c-1", **base))
        done = await store.approval_add(Approval(id="a07", call_id="c-2", **base))
        await store.approval_resolve(done, "denied", "bob", "net:bob", "not today", now)
        # A short id is unique among the pending ones of its channel.
        assert await store.approval_add(Approval(id="3f2", call_id="c-3", **base)) is None


# -- the rules in the turn engine -----------------------------------------------------------------


async def test_first_use_asks_once_per_conversation_and_waiting_does_not_use_the_time_budget(
    tmp_path,
):
    from agentik.core import TurnPolicy

    model = ScriptedModel()
    calls: list[dict] = []
    rules = [
        ApprovalRule(tools=("fs__write_file",), approve="never"),
        ApprovalRule(tools=("fs__*",), approve="first-use", approvers="user"),
    ]
    agent = Agent(
        llm=model, store=SQLiteStore(str(tmp_path / "rules.db")), tools=[writer_tool(calls)],
        approvals=rules, policy=TurnPolicy(time_budget=0.5),
    )  # fmt: skip
    # "never" is an exception to the broader rule below it.
    assert agent.approvals.rule_for("fs__write_file", "x").approve == "never"
    agent.approvals.rules = rules[1:]
    async with agent:
        conv = await agent.conversation_for_channel("fake:chat:#c")
        sub = conv.events()
        write = {"path": "/a", "content": "x"}
        model.enqueue(Reply(tool_calls=[call("fs__write_file", write)]), "one")
        await conv.send("first", author="alice", author_id="chat:alice")
        asked = await next_event(sub, "approval_requested")
        # A person takes longer than the turn's whole time budget: the wait does not count.
        await asyncio.sleep(1.0)
        [pending] = await agent.approvals.pending("fake:chat:#c")
        await agent.approvals.decide(
            pending, "approve", approver="bob", approver_id="chat:bob", role="user"
        )
        ended = await next_event(sub, "turn_ended")
        assert (ended.stop_reason, ended.text) == ("stop", "one")
        assert asked.approval_id == pending.id and len(calls) == 1
        # The same tool again in this conversation: no second request.
        model.enqueue(Reply(tool_calls=[call("fs__write_file", write)]), "two")
        await conv.send("second", author="alice", author_id="chat:alice")
        kinds = [e.kind async for e in _until_turn_end(sub)]
        assert "approval_requested" not in kinds and len(calls) == 2
        # A new conversation for the channel (!new) asks again.
        fresh = await agent.new_conversation_for_channel("fake:chat:#c")
        sub2 = fresh.events()
        model.enqueue(Reply(tool_calls=[call("fs__write_file", write)]), "three")
        await fresh.send("third", author="alice", author_id="chat:alice")
        await next_event(sub2, "approval_requested")
        await fresh.interrupt()
        await sub.aclose()
        await sub2.aclose()


async def _until_turn_end(sub):
    async with asyncio.timeout(60):
        async for event in sub:
            yield event
            if event.kind == "turn_ended":
                return


# -- the store contract (every engine) -------------------------------------------------------------


@pytest.mark.parametrize("engine", ["sqlite-file", "memory"])
async def test_store_keeps_approvals_unique_among_pending_and_decided_once(engine, tmp_path):
    import time

    from agentik.core import MemoryStore
    from agentik.core.approvals import Approval
    from agentik.core.store.base import ConversationRecord

    store = SQLiteStore(str(tmp_path / "s.db")) if engine == "sqlite-file" else MemoryStore()
    async with store:
        await store.create_conversation(ConversationRecord(id="c1", created_at=1, updated_at=1))
        now = time.time()
        base = dict(scope="k", conversation_id="c1", run_id="r", tool="t", approvers="user",
                    created_at=now, expires_at=now + 60)  # fmt: skip
        first = await store.approval_add(Approval(id="abc", call_id="1", **base))
        assert first is not None
        assert await store.approval_add(Approval(id="abc", call_id="2", **base)) is None
        other_scope = await store.approval_add(
            Approval(id="abc", call_id="3", **{**base, "scope": "elsewhere"})
        )
        assert other_scope is not None
        assert await store.approval_resolve(first, "approved", "bob", "n:bob", None, now)
        # Decided once: a second decision does not overwrite the first.
        assert not await store.approval_resolve(first, "denied", "eve", "n:eve", None, now)
        assert (await store.approval_get(first)).approver == "bob"
        # Decided, its id is free again in its scope.
        again = await store.approval_add(Approval(id="abc", call_id="4", **base))
        assert again is not None
        await store.approval_rebind(again, "5")
        assert (await store.approval_get(again)).call_id == "5"
        assert [a.serial for a in await store.approvals(scope="k", state="pending")] == [again]
        assert [a.serial for a in await store.approvals(short_id="abc", newest_first=True)] == [
            again, other_scope, first,
        ]  # fmt: skip
        assert await store.approval_used("c1", "t") and not await store.approval_used("c1", "u")
        # Deleting the conversation deletes its approvals.
        await store.delete_conversation("c1")
        assert await store.approvals() == []


async def test_config_rules_reach_the_agent():
    from agentik.bot.builder import AgentBuilder
    from agentik.bot.config import parse_config
    from agentik.core.plugins import load_plugins

    config = parse_config({
        "storage": {"path": ":memory:"}, "memory": {"backend": "none"},
        "llm": {"backend": "scripted"},
        "approvals": [{"tools": ["git__push"], "approvers": "admin", "timeout": 30},
                      {"tools": ["fs__*"], "approve": "first-use", "self_approve": True}],
    })  # fmt: skip
    registry = load_plugins(env={"AGENTIK_PLUGINS": ""}, entry_points=False)
    agent = AgentBuilder.from_config(config, registry).build()
    rule = agent.approvals.rule_for("git__push", "irc:n:#c")
    assert (rule.approvers, rule.timeout, rule.self_approve) == ("admin", 30.0, False)
    assert agent.approvals.rule_for("fs__read", None).approve == "first-use"
    assert agent.approvals.rule_for("web__get", None) is None


# -- the web page ------------------------------------------------------------------------------


async def test_the_web_page_shows_approve_and_deny_buttons(tmp_path, browser):
    import re

    from playwright.async_api import expect

    from httpserver import TOKENS, running_server

    expect.set_options(timeout=60_000)
    calls: list[dict] = []
    # One person at the page: they approve their own calls.
    rules = [ApprovalRule(tools=("fs__write_*",), approvers="user", self_approve=True)]
    settings = {"tokens": [{"name": "ada", "env": "ADMIN_TOKEN"}]}
    async with running_server(
        str(tmp_path / "web.db"), settings=settings, environ=TOKENS,
        tools=[writer_tool(calls)], approvals=rules,
    ) as server:  # fmt: skip
        page, errors = await chat_page(browser, server.url, TOKENS["ADMIN_TOKEN"])
        write = {"path": "/srv/<b>motd</b>", "content": "hi"}
        for answer in ("first done", "second done"):
            server.model.enqueue(Reply(tool_calls=[call("fs__write_file", write)]), answer)
        await page.fill("#input", "update the motd")
        await page.press("#input", "Enter")
        box = page.locator(".approval").last
        await expect(box).to_contain_text("ada asked to run fs__write_file(")
        await expect(box).to_contain_text("<b>motd</b>")  # shown as text, never as HTML
        await box.get_by_role("button", name="Approve").click()
        await expect(box).to_have_text(re.compile(r"approved by ada$"))
        await expect(page.locator(".msg.assistant").last).to_contain_text("first done")
        assert calls == [{"path": "/srv/<b>motd</b>", "content": "hi"}]
        await page.fill("#input", "again")
        await page.press("#input", "Enter")
        box = page.locator(".approval").last
        await box.get_by_role("button", name="Deny").click()
        await expect(box).to_have_text(re.compile(r"denied by ada$"))
        await expect(page.locator(".msg.assistant").last).to_contain_text("second done")
        assert len(calls) == 1 and not errors, errors


async def test_the_web_page_offers_approve_only_to_approvers_and_sees_a_new_admin_at_once(
    tmp_path, browser
):
    """ada is a `user`: her page shows no Approve/Deny for an admin-only call, and
    says so.  Made an admin by a configuration reload (the bridge's policy
    replaced, as SIGHUP does), her page offers Approve for the next call, and it
    works, without a restart of the HTTP transport."""
    import re

    from playwright.async_api import expect

    from httpserver import TOKENS, running_server

    expect.set_options(timeout=60_000)
    calls: list[dict] = []
    # One person at the page: self_approve, so only her role decides.
    rules = [ApprovalRule(tools=("fs__write_*",), approvers="admin", timeout=3, self_approve=True)]
    settings = {"tokens": [{"name": "ada", "env": "ADMIN_TOKEN"}]}
    async with running_server(
        str(tmp_path / "web.db"), settings=settings, environ=TOKENS,
        tools=[writer_tool(calls)], approvals=rules,
    ) as server:  # fmt: skip
        page, _ = await chat_page(browser, server.url, TOKENS["ADMIN_TOKEN"])
        write = {"path": "/srv/motd", "content": "hi"}
        for answer in ("first done", "second done"):
            server.model.enqueue(Reply(tool_calls=[call("fs__write_file", write)]), answer)
        await page.fill("#input", "update the motd")
        await page.press("#input", "Enter")
        box = page.locator(".approval").last
        await expect(box).to_contain_text("you may not decide this one")
        await expect(box.get_by_role("button", name="Approve")).to_be_hidden()
        await expect(box.get_by_role("button", name="Deny")).to_be_hidden()
        await expect(box).to_contain_text("expired: no one answered in time")
        await expect(page.locator(".msg.assistant").last).to_contain_text("first done")

        access = AccessPolicy(AccessSettings(admins=("web:token:ada",)), {"web": "http"})
        server.bridge.access = access  # what a reload does
        server.bridge.role_for = access.role_for
        await page.fill("#input", "again")
        await page.press("#input", "Enter")
        box = page.locator(".approval").last
        await box.get_by_role("button", name="Approve").click()
        await expect(box).to_have_text(re.compile(r"approved by ada$"))
        await expect(page.locator(".msg.assistant").last).to_contain_text("second done")
        assert calls == [write]


# -- kill -9 while an approval waits ---------------------------------------------------------------

CHILD = """
import asyncio, json, sys
from agentik.bot.app import Bot
from agentik.bot.config import parse_config
from agentik.core.tools.base import tool
from agentik.transports.base import ChannelCaps
from agentik.transports.testing.fake import FakeTransport

class PrintingFake(FakeTransport):
    async def send(self, message):
        await super().send(message)
        print("POST", json.dumps([message.kind, message.text]), flush=True)

@tool(name="fs__write_file", description="Write a file",
      parameters={"type": "object", "properties": {"path": {"type": "string"}}})
async def write(path: str) -> str:
    print("WROTE", path, flush=True)
    return f"wrote {path}"

async def main(db, base_url, phase):
    config = parse_config({
        "llm": {"backend": "openai", "base_url": base_url, "model": "fake-model",
                "api_key": "sk-test", "max_retries": 0},
        "storage": {"path": db}, "memory": {"backend": "none"},
        "compaction": {"enabled": False},
        "approvals": [{"tools": ["fs__*"], "approvers": "user"}],
    })
    fake = PrintingFake(name="chat", caps=ChannelCaps(streaming="message"))
    bot = Bot(config, transports={"chat": fake})
    bot.agent.add_tool(write)
    async with bot:
        if phase == "first":
            await fake.say("agentik: write the motd", channel="ops", user="alice")
            await asyncio.Event().wait()  # until killed
        # Start-up resumed the turn; it asks again: bob approves what is asked.
        async for e in bot.agent.events(after=0, kinds=["approval_requested"]):
            await fake.say(f"!approve {e.approval_id}", channel="ops", user="bob")
            break
        await bot.bridge.flush(fake.key(channel="ops"))
        print("END", flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
"""


async def test_kill_9_while_an_approval_waits_then_it_is_asked_again_and_runs_once(
    openai_server, tmp_path
):
    import signal
    import sys

    from agentik.core.testing.openai_server import Reply as HttpReply

    def model(body: dict) -> HttpReply:
        # Done once the write went through; asked again after a call was cut off.
        last = body["messages"][-1]
        if last["role"] == "tool" and str(last.get("content", "")).startswith("wrote"):
            return HttpReply.text("all done")
        return HttpReply.tool_calls([("call_1", "fs__write_file", '{"path": "/srv/motd"}')])

    openai_server.default = model
    db = str(tmp_path / "kill.db")

    async def child(phase: str) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-c", CHILD, db, openai_server.base_url, phase,
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip

    proc = await child("first")
    try:
        async with asyncio.timeout(60):
            while True:
                line = (await proc.stdout.readline()).decode()
                assert line, "the child exited early"
                if line.startswith("POST") and "asked me to run" in line:
                    asked = json.loads(line[5:])[1]
                    break
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    approval_id = asked.split("approval ", 1)[1].split(":", 1)[0]
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT id, state FROM approval").fetchall() == [
            (approval_id, "pending")
        ]

    proc = await child("second")
    lines: list[str] = []
    try:
        async with asyncio.timeout(100):
            while line := (await proc.stdout.readline()).decode():
                lines.append(line.strip())
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
            print("CHILD SAID", lines)
    posts = [json.loads(x[5:])[1] for x in lines if x.startswith("POST")]
    assert any(
        p.startswith(f"(asked again after a restart) approval {approval_id}:") for p in posts
    )
    assert any(f"approval {approval_id} (fs__write_file): approved by bob" in p for p in posts)
    assert "all done" in posts[-1]
    assert [x for x in lines if x.startswith("WROTE")] == ["WROTE /srv/motd"]  # once
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT id, decision, approver_id FROM approval").fetchall() == [
            (approval_id, "approved", "chat:bob")
        ]


async def test_kill_9_while_an_approval_waits_re_asks_the_stored_call_even_if_the_model_would_not(
    openai_server, tmp_path
):
    """Issue 28 item 7: the re-ask after kill -9 no longer depends on the model
    calling the tool again.  This model, told that its call was cut off, would
    give up; the resumed turn instead asks again from the stored call, runs it
    once approved, and the model's first request after the restart carries the
    tool's result."""
    import signal
    import sys

    from agentik.core.testing.openai_server import Reply as HttpReply

    def model(body: dict) -> HttpReply:
        last = body["messages"][-1]
        if last["role"] == "tool":
            content = str(last.get("content", ""))
            return HttpReply.text("all done" if content.startswith("wrote") else "I give up")
        return HttpReply.tool_calls([("call_1", "fs__write_file", '{"path": "/srv/motd"}')])

    openai_server.default = model
    db = str(tmp_path / "kill.db")

    async def child(phase: str) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-c", CHILD, db, openai_server.base_url, phase,
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip

    proc = await child("first")
    try:
        async with asyncio.timeout(60):
            while True:
                line = (await proc.stdout.readline()).decode()
                assert line, "the child exited early"
                if line.startswith("POST") and "asked me to run" in line:
                    asked = json.loads(line[5:])[1]
                    break
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    approval_id = asked.split("approval ", 1)[1].split(":", 1)[0]
    before = len(openai_server.requests)

    proc = await child("second")
    lines: list[str] = []
    try:
        async with asyncio.timeout(100):
            while line := (await proc.stdout.readline()).decode():
                lines.append(line.strip())
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
            print("CHILD SAID", lines)
    posts = [json.loads(x[5:])[1] for x in lines if x.startswith("POST")]
    assert any(
        p.startswith(f"(asked again after a restart) approval {approval_id}:") for p in posts
    ), posts
    assert "all done" in posts[-1] and not any("I give up" in p for p in posts), posts
    assert [x for x in lines if x.startswith("WROTE")] == ["WROTE /srv/motd"]  # once
    # After the restart the model was asked once, with the result of the stored call.
    after = openai_server.requests[before:]
    assert len(after) == 1, after
    last = after[0]["messages"][-1]
    assert last["role"] == "tool" and last["content"].startswith("wrote /srv/motd")
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT id, decision, approver_id FROM approval").fetchall() == [
            (approval_id, "approved", "chat:bob")
        ]


async def test_a_call_left_open_by_an_expired_approval_gets_a_result_in_the_next_request(
    miniircd, tmp_path
):
    """A shutdown leaves a call that waits for approval open (so a resumed turn
    can ask again); when its turn is not resumed, the next request still gives
    that call a result — endpoints refuse a tool call without one."""
    rules = [ApprovalRule(tools=("fs__write_*",), approvers="user")]
    db = tmp_path / "restart.db"
    async with approvals_bot(miniircd.port, tmp_path, rules, db=db) as (model, agent, calls):
        (alice,) = await people(miniircd.port, "alice")
        await ask_for_a_write(model, alice)
    async with approvals_bot(miniircd.port, tmp_path, rules, db=db) as (model, agent, calls):
        await _resume(agent, resume="note")
        await alice.wait_for(lambda m: from_bot(m) and "please ask again" in m.text)
        model.enqueue("fine")
        alice.privmsg("#ops", "agentik: hello again")
        await alice.wait_for(lambda m: from_bot(m) and "fine" in m.text)
        sent = model.requests[-1].messages
        [asked] = [i for i, m in enumerate(sent) if m.tool_calls]
        assert sent[asked + 1].role == "tool" and sent[asked + 1].is_error
        assert sent[asked + 1].tool_call_id == sent[asked].tool_calls[0].id
        assert calls == []
    await alice.close()


# -- a restart's left-over approval expires once, saying why ---------------------------------------


async def _cut_off_by_a_restart(tmp_path) -> tuple[Agent, list]:
    """A turn waits for approval of a write when the bot shuts down; a new agent on the
    same database is started and has not taken anything up yet."""
    rules = [ApprovalRule(tools=("fs__write_*",), approvers="user")]
    db = str(tmp_path / "restart.db")
    model = ScriptedModel()
    model.enqueue(Reply(tool_calls=[call("fs__write_file", {"path": "/srv/motd"})]), "done")
    agent = await Agent(
        llm=model, store=SQLiteStore(db), tools=[writer_tool([])], approvals=rules
    ).start()
    conv = await agent.conversation_for_channel("irc:net:#ops")
    await conv.send("update the motd", author="alice", author_id="net:alice")
    await eventually(lambda: agent.approvals.pending(conversation_id=conv.id), "the approval")
    await agent.aclose()
    again = await Agent(
        llm=ScriptedModel(), store=SQLiteStore(db), tools=[writer_tool([])], approvals=rules
    ).start()
    return again, await again.pending_turns()


async def test_a_turn_noted_after_a_restart_expires_its_approval_saying_the_bot_restarted(
    tmp_path,
):
    """The note a restart leaves instead of an answer ends the turn; the approval it
    left pending expires with the restart as its reason (the same words whichever of
    the note and the start-up sweep gets there first)."""
    agent, [m] = await _cut_off_by_a_restart(tmp_path)
    try:
        conv = await agent.get_conversation(m.conversation_id)
        sub = conv.events(kinds=["approval_resolved", "run_stream_end"])
        conv.resume([m], mode="note")
        resolved = await next_event(sub, "approval_resolved")
        assert resolved.decision == "expired"
        assert resolved.reason == "the bot restarted and that turn was not taken up again"
        [stored] = await agent.approvals.recent(limit=5)
        assert (stored.decision, stored.reason) == ("expired", resolved.reason)
    finally:
        await agent.aclose()


async def test_an_approval_expired_twice_at_once_is_announced_once(tmp_path):
    """The start-up sweep and the end of the approval's turn may expire it at the same
    time: one decision is recorded and one ``approval_resolved`` (one notice) sent."""
    agent, [m] = await _cut_off_by_a_restart(tmp_path)
    try:
        conv = await agent.get_conversation(m.conversation_id)
        [left] = await agent.approvals.leftovers()
        sub = conv.events(kinds=["approval_resolved", "run_stream_end"])
        await asyncio.gather(
            agent.approvals.expire(conv.parts, left, "one"),
            agent.approvals.expire(conv.parts, left, "two"),
        )
        conv.resume([m], mode="note")  # ends with run_stream_end: nothing after it is ours
        seen = []
        async with asyncio.timeout(60):
            async for event in sub:
                if event.kind == "run_stream_end":
                    break
                seen.append(event)
        assert [e.kind for e in seen] == ["approval_resolved"]
        [stored] = await agent.approvals.recent(limit=5)
        assert stored.reason == seen[0].reason
    finally:
        await agent.aclose()
