"""Linked channels (issue 33): one conversation across a real IRC server (ngircd), the
Slack fake and the HTTP API, with people relayed and the agent answering everywhere."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest

from agentik.bot.bridge import Bridge, ChannelOptions
from agentik.bot.links import LinkSettings
from agentik.core import Agent, SQLiteStore
from agentik.core.access import AccessPolicy, AccessSettings
from agentik.core.testing.scripted import Reply, ScriptedModel
from agentik.transports.http.transport import HttpTransport
from agentik.transports.irc.wire import casefold

from fakeslack import FakeSlack
from ircservers import IRCTestClient
from rigs import WAIT, eventually, irc_transport, joined, slack_transport

pytest_plugins = ["ircservers"]

IRC_KEY = "irc:testnet:#team"
SLACK_KEY = "slack:T1:C1"
WEB_KEY = "http:web:team"
TOKEN = "s3cret-web-token"
ZWSP = "\u200b"


class Linked(NamedTuple):
    model: ScriptedModel
    agent: Agent
    bridge: Bridge
    irc: Any
    slack_t: Any
    web: HttpTransport


@asynccontextmanager
async def linked_bot(
    port: int, slack: FakeSlack, tmp_path: Path, monkeypatch: Any, *, links: Any = None,
    db: str = "links.db", channel_settings: Any = None, load: bool = True,
    admins: tuple[str, ...] = ("slack:T1:U9",), **slack_settings: Any,
) -> AsyncIterator[Linked]:  # fmt: skip
    """A bot on IRC (#team), Slack (conversations per channel) and the HTTP API (token
    ``web``), its channels linked as ``team`` unless ``links`` says otherwise.  The
    Slack user U9 is an admin (or whoever ``admins`` names); everyone else a user."""
    monkeypatch.setenv("WEB_TOKEN", TOKEN)
    model = ScriptedModel()
    agent = Agent(llm=model, store=SQLiteStore(str(tmp_path / db)))
    await agent.start()
    access = AccessPolicy(
        AccessSettings(admins=admins),
        {"testnet": "irc", "slack": "slack", "web": "http"},
        irc_casefold=casefold,
    )
    await access.load(agent.store)
    if links is None:
        links = [LinkSettings(name="team", channels=[IRC_KEY, SLACK_KEY, WEB_KEY])]
    bridge = Bridge(agent, access=access, links=links, channel_settings=channel_settings)
    irc = irc_transport(port, channels=["#team"])
    slack_t = slack_transport(
        slack, tmp_path, conversation_per="channel", streaming="edit", **slack_settings
    )
    web = HttpTransport(
        name="web", settings={"port": 0, "tokens": [{"name": "web", "env": "WEB_TOKEN"}]}
    )
    for t in (irc, slack_t, web):
        bridge.attach(t, ChannelOptions(command_prefix="!"))
    if load:  # (as the bot does at start; else the first linked message does it)
        await bridge.links.load()
    await irc.start(bridge)
    await slack_t.start(bridge)
    await web.start(bridge)
    try:
        await joined(irc, "#team")
        yield Linked(model, agent, bridge, irc, slack_t, web)
    finally:
        await web.aclose()
        await slack_t.aclose()
        await irc.aclose()
        await bridge.aclose()
        await agent.aclose()


def posts(slack: FakeSlack, channel: str = "C1") -> list[dict[str, Any]]:
    """The bot's chat.postMessage calls in ``channel``, in order."""
    return [c for c in slack.calls_to("chat.postMessage") if c.get("channel") == channel]


def relays_in(slack: FakeSlack, channel: str = "C1") -> list[dict[str, Any]]:
    """The relayed posts (under a person's name) in ``channel``."""
    return [c for c in posts(slack, channel) if c.get("username")]


def relay_lines(client: IRCTestClient) -> list[Any]:
    return [
        m for m in client.received
        if m.command == "PRIVMSG" and m.nick == "agentik" and m.text.startswith("<")
    ]  # fmt: skip


async def person(port: int, nick: str) -> IRCTestClient:
    c = await IRCTestClient.connect(port, nick)
    await c.join("#team")
    return c


# -- one conversation, answered in all three --------------------------------------------------
async def test_a_question_on_irc_is_answered_on_irc_slack_and_the_web(
    ngircd, tmp_path, monkeypatch
):
    # A bridge whose links were never loaded: the first linked message binds them.
    async with (
        FakeSlack() as slack,
        linked_bot(ngircd.port, slack, tmp_path, monkeypatch, load=False) as b,
    ):
        alice = await person(ngircd.port, "alice")
        try:
            b.model.enqueue(Reply(text="the build is green"))
            alice.privmsg("#team", "agentik: how is the build?")
            # IRC: the answer, addressed to alice.
            line = await alice.wait_for(
                lambda m: m.nick == "agentik" and "the build is green" in m.text, WAIT
            )
            assert line.params[0] == "#team"
            # Slack: the same answer in the linked channel (and alice's question relayed).
            await slack.wait_until(
                lambda: any("the build is green" in (m.get("text") or "")
                            for m in slack.messages.values()),
                WAIT, "the answer in Slack",
            )  # fmt: skip
            [asked] = relays_in(slack)
            assert asked["username"] == "alice@testnet"
            assert asked["text"] == "agentik: how is the build?"
            # The model saw one user message, its author qualified by network.
            assert [(m.author, m.content) for m in b.model.requests[0].messages] == [
                ("alice@testnet", "how is the build?")
            ]
            # The web: the link's conversation, through the HTTP API, holds the answer.
            conv = await b.agent.conversation_for_channel(WEB_KEY)
            assert conv.id == (await b.agent.conversation_for_channel(IRC_KEY)).id
            auth = {"Authorization": f"Bearer {TOKEN}"}
            async with httpx.AsyncClient(base_url=f"{b.web.url}/agentik", timeout=60) as http:

                async def answered_on_the_web() -> bool:
                    r = await http.get(f"/conversations/{conv.id}/messages", headers=auth)
                    return any(
                        m["kind"] == "assistant" and m["content"] == "the build is green"
                        for m in r.json()["items"]
                    )

                await eventually(answered_on_the_web, "the answer over the HTTP API")
        finally:
            await alice.close()


# -- relay: Slack -> IRC, attributed and split --------------------------------------------------
async def test_a_slack_message_reaches_irc_attributed_and_split_at_the_byte_limit(
    ngircd, tmp_path, monkeypatch
):
    async with FakeSlack() as slack, linked_bot(ngircd.port, slack, tmp_path, monkeypatch) as b:
        slack.add_user("U2", "bob", display_name="bob")
        alice = await person(ngircd.port, "alice")
        try:
            words = " ".join(f"word{i:03d}" for i in range(150))  # ~1,200 bytes
            event = slack.message_event("C1", words, user="U2")
            await slack.push_event(event)
            got = await alice.collect(
                lambda m: m.nick == "agentik" and m.text.startswith(f"<b{ZWSP}ob (Slack)> "),
                3, WAIT,
            )  # fmt: skip
            # Every piece fits the protocol's 512 bytes and carries the name.
            assert all(len(m.raw) + 2 <= 512 for m in got)
            prefix = f"<b{ZWSP}ob (Slack)> "
            assert " ".join(m.text[len(prefix) :] for m in got) == words
            # Chatter is relayed, not answered: the model was never asked.
            assert b.model.requests == []
            # The message map: the Slack message (by its ts) and its IRC copy.
            await b.bridge.links.drain()
            canonical = await b.agent.store.link_map_find(SLACK_KEY, event["ts"])
            rows = await b.agent.store.link_map(canonical)
            assert [(r.channel_key, r.origin) for r in rows] == [
                (SLACK_KEY, True), (IRC_KEY, False)
            ]  # fmt: skip
        finally:
            await alice.close()


# -- relay: IRC -> Slack, escaped ----------------------------------------------------------------
async def test_an_irc_message_reaches_slack_under_its_name_and_escaped(
    ngircd, tmp_path, monkeypatch
):
    async with FakeSlack() as slack, linked_bot(ngircd.port, slack, tmp_path, monkeypatch) as b:
        mallory = await person(ngircd.port, "mallory")
        try:
            mallory.privmsg("#team", "<!channel> wake up <@U9> and <https://x.example|click>")
            await slack.wait_until(lambda: relays_in(slack) or None, WAIT, "the relayed line")
            [post] = relays_in(slack)
            assert post["username"] == "mallory@testnet"
            # Shown as typed; nothing Slack would read as a mention, a broadcast or a link.
            assert post["text"] == (
                "&lt;!channel&gt; wake up &lt;@U9&gt; and &lt;https://x.example|click&gt;"
            )
            assert not any("<!" in (m.get("text") or "") for m in slack.messages.values())
            await b.bridge.links.drain()
            assert b.bridge.links.relayed == 1
        finally:
            await mallory.close()


# -- relay into Slack: each author's name and icon ----------------------------------------------
async def test_copies_in_slack_show_each_authors_name_and_icon(ngircd, tmp_path, monkeypatch):
    """IRC and web people get their network's icon (the link's ``icons``); a Slack person
    relayed into another Slack channel keeps their profile image (users.info, once)."""
    links = [
        LinkSettings(
            name="team", channels=[IRC_KEY, SLACK_KEY, "slack:T1:C2", WEB_KEY],
            icons={"testnet": ":speech_balloon:", "web": "https://example.org/web.png"},
        )
    ]  # fmt: skip
    async with (
        FakeSlack() as slack,
        linked_bot(ngircd.port, slack, tmp_path, monkeypatch, links=links) as b,
    ):
        bob = slack.add_user("U2", "bob")
        alice = await person(ngircd.port, "alice")
        try:
            alice.privmsg("#team", "hello from irc")
            for i in range(2):
                await slack.push_event(slack.message_event("C1", f"slack line {i}", user="U2"))
            b.model.enqueue(Reply(text="ok"))
            conv = await b.agent.conversation_for_channel(WEB_KEY)
            auth = {"Authorization": f"Bearer {TOKEN}"}
            async with httpx.AsyncClient(base_url=f"{b.web.url}/agentik", timeout=60) as http:
                said = {"content": "hello from the web", "author": "carol"}
                r = await http.post(f"/conversations/{conv.id}/messages", headers=auth, json=said)
                assert r.status_code == 202, r.text
            await slack.wait_until(
                lambda: len(relays_in(slack, "C2")) == 4 or None, WAIT, "four copies in C2"
            )
            await b.bridge.links.drain()
            shown = {
                c["text"]: (c["username"], c.get("icon_emoji"), c.get("icon_url"))
                for c in relays_in(slack, "C2")
            }
            image = bob["profile"]["image_72"]
            assert shown == {
                "hello from irc": ("alice@testnet", ":speech_balloon:", None),
                "slack line 0": ("bob (Slack)", None, image),
                "slack line 1": ("bob (Slack)", None, image),
                "hello from the web": ("carol (web)", None, "https://example.org/web.png"),
            }
            # Slack shows them so (the icon on the message), and bob was looked up once.
            in_c2 = [m for (ch, _), m in slack.messages.items() if ch == "C2"]
            assert {m["text"]: m.get("icons") for m in in_c2 if m.get("username")} == {
                "hello from irc": {"emoji": ":speech_balloon:"},
                "slack line 0": {"image_48": image},
                "slack line 1": {"image_48": image},
                "hello from the web": {"image_48": "https://example.org/web.png"},
            }
            assert [c["user"] for c in slack.calls_to("users.info")].count("U2") == 1
        finally:
            await alice.close()


async def test_without_the_customize_scope_copies_say_their_author_in_the_text(
    ngircd, tmp_path, monkeypatch
):
    """An app without ``chat:write.customize``: Slack refuses a post under another name
    (``missing_scope``), so the copy says who wrote it (``*alice@testnet*: …``); none is
    lost, and the later ones are not tried under a name again."""
    async with FakeSlack() as slack, linked_bot(ngircd.port, slack, tmp_path, monkeypatch) as b:
        slack.scopes.discard("chat:write.customize")
        alice = await person(ngircd.port, "alice")
        try:
            for i in range(3):
                alice.privmsg("#team", f"<b>line {i}</b>")
            await slack.wait_until(
                lambda: len([m for m in slack.messages.values() if "line" in m["text"]]) == 3
                or None, WAIT, "three copies",
            )  # fmt: skip
            await b.bridge.links.drain()
            texts = [m["text"] for m in slack.messages.values()]
            assert texts == [f"*alice@testnet*: &lt;b&gt;line {i}&lt;/b&gt;" for i in range(3)]
            assert not any(m.get("username") for m in slack.messages.values())
            tried = slack.calls_to("chat.postMessage")
            # One refused try under the name, then each copy once, signed in its text.
            assert [bool(c.get("username")) for c in tried] == [True, False, False, False]
            assert b.bridge.links.relayed == 3
            assert b.slack_t.customize is False
        finally:
            await alice.close()


# -- !stop anywhere stops the answer everywhere ----------------------------------------------------
async def test_stop_from_slack_stops_the_answer_on_irc(ngircd, tmp_path, monkeypatch):
    async with FakeSlack() as slack, linked_bot(ngircd.port, slack, tmp_path, monkeypatch) as b:
        slack.add_user("U2", "bob")
        slack.add_user("U9", "root")
        alice = await person(ngircd.port, "alice")
        try:
            reply = Reply(text="line one\nline two\nline three", hold_after=1)
            b.model.enqueue(reply)
            alice.privmsg("#team", "agentik: tell me three things")
            await reply.started.wait()
            # bob (a user) may not stop alice's answer from Slack, as he could not on IRC.
            await slack.push_event(slack.message_event("C1", "!stop", user="U2"))
            await slack.wait_until(
                lambda: any("only the asker" in (c.get("text") or "") for c in posts(slack)),
                WAIT, "the refusal",
            )  # fmt: skip
            # The admin's !stop in the linked Slack channel (a command: not relayed).
            await slack.push_event(slack.message_event("C1", "!stop", user="U9"))
            await alice.wait_for(lambda m: m.nick == "agentik" and "(interrupted)" in m.text, WAIT)
            reply.release.set()
            conv = await b.agent.conversation_for_channel(IRC_KEY)
            await conv.wait_idle()
            said = [m.text for m in alice.received if m.nick == "agentik"]
            assert not any("line three" in t for t in said)
            assert not any("!stop" in (c.get("text") or "") for c in relays_in(slack))
        finally:
            await alice.close()


# -- privacy: DMs are never relayed ----------------------------------------------------------------
async def test_direct_messages_on_every_transport_are_never_relayed(ngircd, tmp_path, monkeypatch):
    async with FakeSlack() as slack, linked_bot(ngircd.port, slack, tmp_path, monkeypatch) as b:
        slack.add_user("U2", "bob")
        alice = await person(ngircd.port, "alice")
        watcher = await person(ngircd.port, "watcher")
        try:
            b.model.enqueue(Reply(text="irc dm answer"))
            b.model.enqueue(Reply(text="slack dm answer"))
            b.model.enqueue(Reply(text="web answer"))
            alice.privmsg("agentik", "secret on irc")
            await alice.wait_for(lambda m: "irc dm answer" in m.text, WAIT)
            await slack.push_event(
                slack.message_event("D1", "secret on slack", user="U2", channel_type="im")
            )
            await slack.wait_until(
                lambda: any("slack dm answer" in (c.get("text") or "") for c in posts(slack, "D1"))
                or any("slack dm answer" in (m.get("text") or "") for m in slack.messages.values()),
                WAIT, "the Slack DM answered",
            )  # fmt: skip
            auth = {"Authorization": f"Bearer {TOKEN}"}
            async with httpx.AsyncClient(base_url=f"{b.web.url}/agentik", timeout=60) as http:
                r = await http.post("/conversations", headers=auth, json={})
                cid = r.json()["id"]
                r = await http.post(f"/conversations/{cid}/messages", headers=auth,
                                    json={"content": "secret on the web"})  # fmt: skip
                assert r.status_code == 202, r.text
                await (await b.agent.get_conversation(cid)).wait_idle()
            await watcher.sync()
            assert b.bridge.links.relayed == 0
            assert relays_in(slack) == [] and relays_in(slack, "D1") == []
            assert relay_lines(watcher) == []
            said = " ".join(m.text for m in watcher.received)
            assert "secret" not in said
        finally:
            await alice.close()
            await watcher.close()


# -- no loops ---------------------------------------------------------------------------------
async def test_a_relay_never_loops(ngircd, tmp_path, monkeypatch):
    async with FakeSlack() as slack, linked_bot(ngircd.port, slack, tmp_path, monkeypatch) as b:
        slack.add_user("U2", "bob")
        alice = await person(ngircd.port, "alice")
        watcher = await person(ngircd.port, "watcher")
        try:
            alice.privmsg("#team", "hello from irc")
            await slack.push_event(slack.message_event("C1", "hello from slack", user="U2"))
            await watcher.wait_for(lambda m: "hello from slack" in m.text, WAIT)
            await slack.wait_until(lambda: relays_in(slack) or None, WAIT, "the IRC line in Slack")
            # Slack sends the bot's own posts back as events (with its bot_id): the relayed
            # copy comes back as Slack would send it, and is never taken in again.
            [copy] = relays_in(slack)
            echo = slack.message_event("C1", copy["text"], user=slack.bot_user_id)
            echo["bot_id"] = slack.bot_id
            await slack.push_event(echo)
            await b.bridge.links.drain()
            await watcher.sync()
            alice_lines = [m for m in relay_lines(watcher) if "hello from irc" in m.text]
            slack_lines = [m for m in relay_lines(watcher) if "hello from slack" in m.text]
            assert (len(alice_lines), len(slack_lines)) == (0, 1)  # IRC: bob's line, once
            assert [c["text"] for c in relays_in(slack)] == ["hello from irc"]  # Slack: once
            assert b.bridge.links.relayed == 2
        finally:
            await alice.close()
            await watcher.close()


# -- !link / !unlink: admins, persisted --------------------------------------------------------
async def test_link_and_unlink_in_chat_by_an_admin_persist_across_a_restart(
    ngircd, tmp_path, monkeypatch
):
    slack_said = lambda slack, words: slack.wait_until(  # noqa: E731
        lambda: any(words in (c.get("text") or "") for c in posts(slack)), WAIT, words
    )
    async with FakeSlack() as slack:
        slack.add_user("U2", "bob")
        slack.add_user("U9", "root")
        mention = f"<@{slack.bot_user_id}>"
        async with linked_bot(ngircd.port, slack, tmp_path, monkeypatch, links=[]) as b:
            # A user may not link channels; the admin (a verified Slack identity) may.
            await slack.push_event(
                slack.message_event("C1", f"{mention} !link team {IRC_KEY}", user="U2")
            )
            await slack_said(slack, "!link is for admins")
            assert await b.agent.store.links() == []
            await slack.push_event(
                slack.message_event("C1", f"{mention} !link team {IRC_KEY}", user="U9")
            )
            await slack_said(slack, "linked team")
            [record] = await b.agent.store.links()
            assert record.channels == (SLACK_KEY, IRC_KEY)
            assert record.created_by == "slack:T1:U9"
        # A new process on the same database: the link is there, and works.
        async with linked_bot(ngircd.port, slack, tmp_path, monkeypatch, links=[]) as b:
            assert [link.name for link in b.bridge.links.links.values()] == ["team"]
            slack_conv = await b.agent.conversation_for_channel(SLACK_KEY)
            assert (await b.agent.conversation_for_channel(IRC_KEY)).id == slack_conv.id
            watcher = await person(ngircd.port, "watcher")
            try:
                await slack.push_event(slack.message_event("C1", "after the restart", user="U2"))
                await watcher.wait_for(lambda m: "after the restart" in m.text, WAIT)
            finally:
                await watcher.close()
            await slack.push_event(slack.message_event("C1", f"{mention} !unlink team", user="U9"))
            await slack_said(slack, "unlinked team")
            assert await b.agent.store.links() == []
            assert (await b.agent.conversation_for_channel(IRC_KEY)).id != slack_conv.id
        async with linked_bot(ngircd.port, slack, tmp_path, monkeypatch, links=[]) as b:
            assert b.bridge.links.links == {}


# -- answer = "asked", opt-outs, verified_only, history ---------------------------------------
async def test_answer_asked_shows_the_answer_where_asked_and_a_pointer_elsewhere(
    ngircd, tmp_path, monkeypatch
):
    links = [LinkSettings(name="team", channels=[IRC_KEY, SLACK_KEY], answer="asked")]
    async with (
        FakeSlack() as slack,
        linked_bot(ngircd.port, slack, tmp_path, monkeypatch, links=links) as b,
    ):
        alice = await person(ngircd.port, "alice")
        try:
            b.model.enqueue(Reply(text="only here"))
            alice.privmsg("#team", "agentik: where?")
            await alice.wait_for(lambda m: "only here" in m.text, WAIT)
            pointer = "(answered in irc:testnet:#team, asked by alice@testnet)"
            await slack.wait_until(
                lambda: any(pointer in (c.get("text") or "") for c in posts(slack)) or None,
                WAIT, "the pointer in Slack",
            )  # fmt: skip
            assert not any("only here" in (m.get("text") or "") for m in slack.messages.values())
        finally:
            await alice.close()


async def test_opt_out_prefix_and_verified_only_are_not_relayed(ngircd, tmp_path, monkeypatch):
    links = [
        LinkSettings(
            name="team", channels=[IRC_KEY, SLACK_KEY], verified_only=True, opt_out_prefix="[nr]"
        )
    ]
    async with (
        FakeSlack() as slack,
        linked_bot(ngircd.port, slack, tmp_path, monkeypatch, links=links) as b,
    ):
        slack.add_user("U2", "bob")
        alice = await person(ngircd.port, "alice")  # a nick without an account
        try:
            alice.privmsg("#team", "unverified words")
            await slack.push_event(slack.message_event("C1", "[nr] off the record", user="U2"))
            await slack.push_event(slack.message_event("C1", "on the record", user="U2"))
            await alice.wait_for(lambda m: "on the record" in m.text, WAIT)
            await alice.sync()
            await b.bridge.links.drain()
            assert [m.text.split("> ", 1)[1] for m in relay_lines(alice)] == ["on the record"]
            assert relays_in(slack) == []
            assert b.bridge.links.relayed == 1
        finally:
            await alice.close()


async def test_a_channel_joining_a_link_gets_its_recent_history(ngircd, tmp_path, monkeypatch):
    async with FakeSlack() as slack:
        slack.add_user("U9", "root")
        async with linked_bot(ngircd.port, slack, tmp_path, monkeypatch, links=[]) as b:
            alice = await person(ngircd.port, "alice")
            try:
                b.model.enqueue(Reply(text="tuesday"))
                alice.privmsg("#team", "agentik: when is the release?")
                await alice.wait_for(lambda m: "tuesday" in m.text, WAIT)
                await b.bridge.flush(IRC_KEY)
            finally:
                await alice.close()
            mention = f"<@{slack.bot_user_id}>"
            await slack.push_event(slack.message_event(
                "C1", f"{mention} !link team {IRC_KEY} history=2", user="U9"
            ))  # fmt: skip
            shown = await slack.wait_until(
                lambda: next((c["text"] for c in posts(slack)
                              if "earlier in this conversation" in (c.get("text") or "")), None),
                WAIT, "the history",
            )  # fmt: skip
            # (asked before the link: her name as IRC gave it)
            assert "alice: when is the release? | agent: tuesday" in shown


# -- flood: in order, exactly once ------------------------------------------------------------
async def test_a_burst_of_50_slack_messages_reaches_irc_in_order_once_each(
    ngircd, tmp_path, monkeypatch
):
    async with FakeSlack() as slack, linked_bot(ngircd.port, slack, tmp_path, monkeypatch) as b:
        slack.add_user("U2", "bob")
        alice = await person(ngircd.port, "alice")
        try:
            for i in range(50):
                await slack.push_event(slack.message_event("C1", f"burst {i:02d}", user="U2"))
            await alice.collect(lambda m: "burst 49" in m.text, 1, WAIT)
            await b.bridge.links.drain()
            await alice.sync()
            got = [m.text.split("> ", 1)[1] for m in relay_lines(alice)]
            assert got == [f"burst {i:02d}" for i in range(50)]
        finally:
            await alice.close()


async def test_a_rate_limited_slack_still_gets_every_copy_in_order(ngircd, tmp_path, monkeypatch):
    async with FakeSlack() as slack, linked_bot(ngircd.port, slack, tmp_path, monkeypatch) as b:
        alice = await person(ngircd.port, "alice")
        try:
            slack.rate_limit("chat.postMessage", times=2, retry_after=1)
            for i in range(5):
                alice.privmsg("#team", f"line {i}")
            await slack.wait_until(
                lambda: len({c["text"] for c in relays_in(slack)}) == 5 or None,
                WAIT, "five copies",
            )  # fmt: skip
            await b.bridge.links.drain()
            # Refused calls were retried after Slack's Retry-After: each copy shows once.
            shown = [m["text"] for m in slack.messages.values() if m["text"].startswith("line")]
            assert shown == [f"line {i}" for i in range(5)]
        finally:
            await alice.close()


# -- a network down: its copies wait in the outbox -------------------------------------------
async def test_copies_slack_refused_are_delivered_after_a_restart_in_order_once(
    ngircd, tmp_path, monkeypatch
):
    def down_posts() -> list[str]:
        return [m["text"] for m in slack.messages.values() if m["text"].startswith("while")]

    async with FakeSlack() as slack:
        async with linked_bot(ngircd.port, slack, tmp_path, monkeypatch, rate_limit_retries=0):
            # Slack refuses every post for now (the transport does not retry; the relay
            # tries again later, and this process stops before Slack is back).
            slack.rate_limit("chat.postMessage", times=10_000, retry_after=1)
            alice = await person(ngircd.port, "alice")
            try:
                for i in range(3):
                    alice.privmsg("#team", f"while slack was down {i}")
                await slack.wait_until(
                    lambda: len(slack.calls_to("chat.postMessage")) >= 3 or None,
                    WAIT, "three refused posts",
                )  # fmt: skip
            finally:
                await alice.close()
            assert down_posts() == []
        slack.rate_limit("chat.postMessage", times=0)  # Slack is back
        # The next process sends what the outbox holds: in order, under her name, once.
        async with linked_bot(ngircd.port, slack, tmp_path, monkeypatch) as b:
            assert await b.bridge.redeliver() == 3
            assert down_posts() == [f"while slack was down {i}" for i in range(3)]
            names = {m.get("username") for m in slack.messages.values()}
            assert names == {"alice@testnet"}
            await b.bridge.outbox.drain()  # their deliveries recorded: nothing left to send
            assert await b.bridge.redeliver() == 0


# -- configuration ------------------------------------------------------------------------------
def test_links_in_the_configuration_are_checked_with_the_key_named():
    from agentik.bot.config import parse_config
    from agentik.core import ConfigError

    ok = parse_config({"links": [{"name": "team", "channels": [IRC_KEY, SLACK_KEY]}]}, env={})
    assert ok.links[0].answer == "everywhere" and ok.links[0].relay is True
    bad = [
        ("links.0.channels", {"name": "t", "channels": [IRC_KEY, "not a key"]}, "not a channel"),
        ("links.0.channels", {"name": "t", "channels": [IRC_KEY]}, "at least 2"),
        ("links.0.answer", {"name": "t", "channels": [IRC_KEY, SLACK_KEY], "answer": "loud"},
         "everywhere"),
        ("links.0.name", {"name": "a b", "channels": [IRC_KEY, SLACK_KEY]}, "pattern"),
    ]  # fmt: skip
    for where, link, why in bad:
        with pytest.raises(ConfigError) as info:
            parse_config({"links": [link]}, env={})
        assert f"{where}: " in str(info.value) and why in str(info.value)
    twice = [
        {"name": "a", "channels": [IRC_KEY, SLACK_KEY]},
        {"name": "b", "channels": [WEB_KEY, SLACK_KEY]},
    ]
    with pytest.raises(ConfigError) as info:
        parse_config({"links": twice}, env={})
    assert "links.1.channels.1: 'slack:T1:C1' is already in link 'a'" in str(info.value)


# -- settings conflicts: the link's rule ------------------------------------------------------
async def test_the_link_settings_rule_decides_whose_persona_a_turn_has(
    ngircd, tmp_path, monkeypatch
):
    from agentik.bot.chansettings import ChannelSettings

    personas = {
        IRC_KEY: ChannelSettings(persona="You speak like a pirate."),
        SLACK_KEY: ChannelSettings(persona="You speak like a butler."),
    }
    for rule, expected in (("asking", "butler"), ("link", "pirate")):
        links = [LinkSettings(name="team", channels=[IRC_KEY, SLACK_KEY], settings=rule)]
        async with (
            FakeSlack() as slack,
            # (a folder each: the Slack transport's handled events are its own)
            linked_bot(ngircd.port, slack, _folder(tmp_path / rule), monkeypatch, links=links,
                       channel_settings=personas) as b,
        ):  # fmt: skip
            slack.add_user("U2", "bob")
            b.model.enqueue(Reply(text="at your service"))
            mention = f"<@{slack.bot_user_id}>"
            await slack.push_event(slack.message_event("C1", f"{mention} hello", user="U2"))
            await eventually(lambda: b.model.requests, f"the model asked ({rule})")
            system = b.model.requests[0].system or ""
            # Asked in Slack: its own persona ("asking"), or the link's first channel's.
            assert expected in system
            assert ({"pirate", "butler"} - {expected}).pop() not in system


def _folder(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


# -- health ---------------------------------------------------------------------------------
async def test_health_shows_a_link_naming_a_channel_the_bot_cannot_serve(
    ngircd, tmp_path, monkeypatch
):
    links = [
        LinkSettings(name="team", channels=[IRC_KEY, SLACK_KEY]),
        LinkSettings(name="far", channels=[IRC_KEY.replace("#team", "#elsewhere"), "slack:T9:C9"]),
    ]
    async with (
        FakeSlack() as slack,
        linked_bot(ngircd.port, slack, tmp_path, monkeypatch, links=links) as b,
    ):
        found = b.agent.health.components()
        assert found["link:team"].state == "connected"
        far = found["link:far"]
        assert far.state == "degraded"
        assert far.reason == (
            "irc:testnet:#elsewhere: not joined to #elsewhere; slack:T9:C9: no transport serves it"
        )


async def test_slack_down_for_a_while_gets_the_irc_lines_afterwards_in_order_marked_late(
    ngircd, tmp_path, monkeypatch
):
    async with (
        FakeSlack() as slack,
        linked_bot(ngircd.port, slack, tmp_path, monkeypatch, rate_limit_retries=0) as b,
    ):
        b.bridge.links.late_after = 0.0  # every copy not sent at once shows when it was said
        slack.rate_limit("chat.postMessage", times=2, retry_after=1)  # down for two tries
        alice = await person(ngircd.port, "alice")
        try:
            for i in range(3):
                alice.privmsg("#team", f"meanwhile {i}")
            await slack.wait_until(lambda: len(relays_in(slack)) >= 5 or None, WAIT, "copies")
            await b.bridge.links.drain()
            shown = [m["text"] for m in slack.messages.values() if m.get("username")]
            assert [t.split(") ", 1)[1] for t in shown] == [f"meanwhile {i}" for i in range(3)]
            assert all(re.fullmatch(r"\(late: \d\d:\d\d UTC\) meanwhile \d", t) for t in shown)
        finally:
            await alice.close()


# -- edits and deletes, through the persistent message map ------------------------------------
async def test_an_edit_and_a_delete_of_a_message_sent_before_a_restart_propagate(
    ngircd, tmp_path, monkeypatch
):
    other = "slack:T1:C2"  # a second Slack channel: its copy can be edited
    links = [LinkSettings(name="team", channels=[IRC_KEY, SLACK_KEY, other])]
    async with FakeSlack() as slack:
        slack.add_user("U2", "bob", display_name="bob")
        watcher = await person(ngircd.port, "watcher")
        try:
            async with linked_bot(ngircd.port, slack, tmp_path, monkeypatch, links=links) as b:
                said = slack.message_event("C1", "the meeting is at 3", user="U2")
                await slack.push_event(said)
                await watcher.wait_for(lambda m: "the meeting is at 3" in m.text, WAIT)
                await slack.wait_until(lambda: relays_in(slack, "C2") or None, WAIT, "the copy")
                [copy_ts] = [ts for (ch, ts), m in slack.messages.items()
                             if ch == "C2" and m.get("username")]  # fmt: skip
                await b.bridge.links.drain()
            # A new process on the same database: the message map tells where the copies are.
            async with linked_bot(ngircd.port, slack, tmp_path, monkeypatch, links=links) as b:
                await slack.push_event(slack.message_changed_event(said, "the meeting is at 4"))
                edit = await watcher.wait_for(lambda m: "the meeting is at 4" in m.text, WAIT)
                assert edit.nick == "agentik"
                assert edit.text == f"<b{ZWSP}ob (Slack)> (edit) the meeting is at 4"
                # Slack: the copy itself now says it (still under bob's name), no new post.
                await slack.wait_until(
                    lambda: slack.messages[("C2", copy_ts)]["text"] == "the meeting is at 4"
                    or None, WAIT, "the copy updated",
                )  # fmt: skip
                assert slack.messages[("C2", copy_ts)]["username"] == "bob (Slack)"
                assert len(relays_in(slack, "C2")) == 1
                await slack.push_event(slack.message_deleted_event(said))
                gone = await watcher.wait_for(lambda m: "(deleted their message" in m.text, WAIT)
                # (the time it was said tells IRC which message; its words are not repeated)
                assert re.fullmatch(
                    rf"<b{ZWSP}ob \(Slack\)> \(deleted their message of \d\d:\d\d UTC\)", gone.text
                )
                await slack.wait_until(
                    lambda: ("C2", copy_ts) not in slack.messages or None, WAIT, "the copy gone"
                )
                [deleted] = slack.calls_to("chat.delete")
                assert (deleted["channel"], deleted["ts"]) == ("C2", copy_ts)
                await b.bridge.links.drain()
                assert b.bridge.links.changed == 4  # (IRC, C2) x (edit, delete)
                assert b.bridge.links.relayed == 0  # a change is not a new message
                assert b.model.requests == []
        finally:
            await watcher.close()


# -- threads ------------------------------------------------------------------------------------
async def test_a_slack_thread_is_quoted_on_irc_and_an_irc_reply_goes_into_it(
    ngircd, tmp_path, monkeypatch
):
    async with FakeSlack() as slack, linked_bot(ngircd.port, slack, tmp_path, monkeypatch) as b:
        slack.add_user("U2", "bob", display_name="bob")
        slack.add_user("U3", "carol", display_name="carol")
        alice = await person(ngircd.port, "alice")
        try:
            # alice's line, relayed to Slack; bob answers it in a thread there.
            alice.privmsg("#team", "the deploy failed")
            await slack.wait_until(lambda: relays_in(slack) or None, WAIT, "the copy")
            [copy_ts] = [ts for (ch, ts), m in slack.messages.items() if m.get("username")]
            await slack.push_event(
                slack.message_event("C1", "which step?", user="U2", thread_ts=copy_ts)
            )
            line = await alice.wait_for(lambda m: "which step?" in m.text, WAIT)
            # IRC is one thread: the reply quotes what it answers.
            assert (
                line.text
                == f"<b{ZWSP}ob (Slack)> (re alice@testnet: the deploy failed) which step?"
            )
            # alice answers bob by name: her line goes into bob's thread, under her name.
            alice.privmsg("#team", "bob: the migration")
            post = await slack.wait_until(
                lambda: next((c for c in relays_in(slack) if "the migration" in c["text"]), None),
                WAIT, "alice's reply in Slack",
            )  # fmt: skip
            assert (post["thread_ts"], post["username"]) == (copy_ts, "alice@testnet")
            assert post["text"] == "bob: the migration"
            # A thread of a Slack person's message: quoted by its first words.
            root = slack.message_event(
                "C1", "lunch at the usual place at noon, anyone coming along today?", user="U3"
            )
            await slack.push_event(root)
            await slack.push_event(
                slack.message_event("C1", "count me in", user="U2", thread_ts=root["ts"])
            )
            line = await alice.wait_for(lambda m: "count me in" in m.text, WAIT)
            assert line.text == (
                f"<b{ZWSP}ob (Slack)> (re carol: lunch at the usual place at noon, anyone…)"
                " count me in"
            )
            # A line naming nobody relayed stays in the channel.
            alice.privmsg("#team", "anyone else?")
            plain = await slack.wait_until(
                lambda: next((c for c in relays_in(slack) if "anyone else" in c["text"]), None),
                WAIT, "the plain line",
            )  # fmt: skip
            assert not plain.get("thread_ts")
            await b.bridge.links.drain()
            assert b.model.requests == []
        finally:
            await alice.close()


# -- attachments ----------------------------------------------------------------------------------
async def test_slack_attachments_reach_irc_as_links(ngircd, tmp_path, monkeypatch):
    async with FakeSlack() as slack, linked_bot(ngircd.port, slack, tmp_path, monkeypatch) as b:
        slack.add_user("U2", "bob", display_name="bob")
        alice = await person(ngircd.port, "alice")
        try:
            with_words = slack.message_event(
                "C1", "here is the log", user="U2", subtype="file_share"
            )
            bare = slack.message_event("C1", "", user="U2", subtype="file_share")
            await slack.push_event(with_words)
            await slack.push_event(bare)
            got = await alice.collect(lambda m: "/files/U2/" in m.text, 2, WAIT)
            [link1] = [f["permalink"] for f in with_words["files"]]
            [link2] = [f["permalink"] for f in bare["files"]]
            assert [m.text for m in got] == [
                f"<b{ZWSP}ob (Slack)> here is the log [notes.txt: {link1}]",
                f"<b{ZWSP}ob (Slack)> [notes.txt: {link2}]",
            ]
            await b.bridge.links.drain()
            assert b.bridge.links.relayed == 2
        finally:
            await alice.close()


# -- draft/relaymsg ------------------------------------------------------------------------------
async def test_relayed_lines_use_relaymsg_when_the_server_offers_it(tmp_path, monkeypatch):
    # No real server here offers draft/relaymsg (ngircd does not; Ergo is not installed):
    # a scripted server speaks the wire format of the IRCv3 draft (extensions/relaymsg.md).
    from ircservers import ScriptedIRCServer, registration_handler

    base = registration_handler(caps_offered="message-tags echo-message draft/relaymsg=/")
    msgids: dict[str, str] = {}  # the server's msgid of each relayed line, by its text

    async def handler(client, line):
        if line.startswith("RELAYMSG "):
            _, chan, nick, text = line.split(" ", 3)
            # As the spec has the server deliver it (echo-message: to us too), tagged with
            # the relaying bot's nick.
            text = text.removeprefix(":")
            msgids[text] = f"m{len(server.received)}"
            client.send(f"@draft/relaymsg={client.nick};msgid={msgids[text]} "
                        f":{nick}!relay@relay.test PRIVMSG {chan} :{text}")  # fmt: skip
            return
        await base(client, line)

    async with (
        ScriptedIRCServer(handler) as server,
        FakeSlack() as slack,
        linked_bot(server.port, slack, tmp_path, monkeypatch) as b,
    ):
        slack.add_user("U2", "bob", display_name="bob")
        assert "draft/relaymsg" in b.irc.caps_enabled
        hello = slack.message_event("C1", "hello from slack", user="U2")
        await slack.push_event(hello)
        line = await server.wait_for_line("RELAYMSG #team")
        # Under bob/Slack itself: no <b\u200bob (Slack)> name in the text.
        assert line == "RELAYMSG #team bob/Slack :hello from slack"
        # A name with what the spec reserves for nicks (blanks, "!", "."): left out.
        slack.add_user("U4", "Dr. Who!", display_name="Dr. Who!")
        await slack.push_event(slack.message_event("C1", "ok?", user="U4"))
        assert await server.wait_for_line("RELAYMSG #team") == "RELAYMSG #team DrWho/Slack ok?"
        # A person on IRC is relayed to Slack; our own relayed lines, which come back
        # under bob/Slack tagged with our nick, never are.
        client = await server.wait_for_client()
        client.send(":carol!c@h.test PRIVMSG #team :hi from irc")
        await slack.wait_until(lambda: relays_in(slack) or None, WAIT, "carol's line")
        since = server.mark()
        client.send("PING :synced")
        await server.wait_for_line("PONG synced", since=since)
        await b.bridge.links.drain()
        assert [(c["username"], c["text"]) for c in relays_in(slack)] == [
            ("carol@testnet", "hi from irc")
        ]
        assert b.bridge.links.relayed == 3
        # The server's msgid of each relayed line is in the message map (for +draft/reply).
        await b.bridge.outbox.drain()
        await eventually(lambda: _irc_refs(b), "the relayed lines' msgids in the message map")


async def _irc_refs(b: Linked) -> bool:
    import sqlite3

    with sqlite3.connect(b.agent.store.path) as conn:
        rows = conn.execute(
            "SELECT ref FROM link_message WHERE channel_key = ? AND origin = 0", (IRC_KEY,)
        ).fetchall()
    return len(rows) == 2 and all(r[0] and r[0].startswith("m") for r in rows)


# -- the web --------------------------------------------------------------------------------------
async def test_a_message_posted_on_the_web_is_relayed_to_irc_and_slack_with_its_badge(
    ngircd, tmp_path, monkeypatch
):
    async with FakeSlack() as slack, linked_bot(ngircd.port, slack, tmp_path, monkeypatch) as b:
        alice = await person(ngircd.port, "alice")
        try:
            b.model.enqueue(Reply(text="noted"))
            conv = await b.agent.conversation_for_channel(WEB_KEY)
            auth = {"Authorization": f"Bearer {TOKEN}"}
            async with httpx.AsyncClient(base_url=f"{b.web.url}/agentik", timeout=60) as http:
                said = {"content": "hi from the web", "author": "carol"}
                r = await http.post(f"/conversations/{conv.id}/messages", headers=auth, json=said)
                assert r.status_code == 202, r.text
            # IRC and Slack see it said, under the web person's name and network.
            line = await alice.wait_for(lambda m: "hi from the web" in m.text, WAIT)
            assert line.text == f"<c{ZWSP}arol (web)> hi from the web"
            post = await slack.wait_until(lambda: relays_in(slack) or None, WAIT, "the copy")
            assert [(c["username"], c["text"]) for c in post] == [
                ("carol (web)", "hi from the web")
            ]
            await b.bridge.links.drain()
            assert b.bridge.links.relayed == 2
            # A question to the agent too: its answer shows in IRC and Slack as written
            # (the linked channels are opened before the turn starts, so they render it
            # from its start, never "(no answer: …)").
            await alice.wait_for(lambda m: m.nick == "agentik" and m.text == "noted", WAIT)
            await slack.wait_until(
                lambda: any(m.get("text") == "noted" for m in slack.messages.values()),
                WAIT, "the answer in Slack",
            )  # fmt: skip
            await (await b.agent.get_conversation(conv.id)).wait_idle()
            await alice.sync()
            said = [m.text for m in alice.received if m.nick == "agentik"]
            assert not any("no answer" in t for t in said), said
            assert not any("no answer" in (m.get("text") or "") for m in slack.messages.values())
        finally:
            await alice.close()


async def test_a_copy_slack_got_just_before_a_crash_is_not_posted_again(
    ngircd, tmp_path, monkeypatch
):
    import sqlite3

    async with FakeSlack() as slack:
        async with linked_bot(ngircd.port, slack, tmp_path, monkeypatch) as b:
            alice = await person(ngircd.port, "alice")
            try:
                alice.privmsg("#team", "said once")
                await slack.wait_until(lambda: relays_in(slack) or None, WAIT, "the copy")
                await b.bridge.links.drain()
                await b.bridge.outbox.drain()
            finally:
                await alice.close()
        # As if the process died after Slack took the copy, before it wrote that down.
        with sqlite3.connect(tmp_path / "links.db") as conn:
            assert (
                conn.execute(
                    "UPDATE outbox SET state = 'queued', ref = NULL WHERE kind = 'relay'"
                ).rowcount
                == 1
            )
        async with linked_bot(ngircd.port, slack, tmp_path, monkeypatch) as b:
            assert await b.bridge.redeliver() == 1
            await b.bridge.outbox.drain()
            # Found in the channel by its metadata: not posted a second time, and done.
            assert [c["text"] for c in relays_in(slack)] == ["said once"]
            assert len(slack.calls_to("conversations.history")) == 1
            assert slack.calls_to("chat.update") == []
            assert await b.bridge.redeliver() == 0


async def test_a_copy_into_a_slack_thread_slack_got_just_before_a_crash_is_not_posted_again(
    ngircd, tmp_path, monkeypatch
):
    """The same lookup as for answers (the piece metadata), in the thread the copy went
    into: an IRC reply relayed into a Slack thread is not doubled by a restart."""
    import sqlite3

    async with FakeSlack() as slack:
        slack.add_user("U2", "bob", display_name="bob")
        alice = await person(ngircd.port, "alice")
        try:
            async with linked_bot(ngircd.port, slack, tmp_path, monkeypatch) as b:
                alice.privmsg("#team", "the deploy failed")
                await slack.wait_until(lambda: relays_in(slack) or None, WAIT, "the copy")
                [copy_ts] = [ts for (ch, ts), m in slack.messages.items() if m.get("username")]
                await slack.push_event(
                    slack.message_event("C1", "which step?", user="U2", thread_ts=copy_ts)
                )
                await alice.wait_for(lambda m: "which step?" in m.text, WAIT)
                alice.privmsg("#team", "bob: the migration")
                await slack.wait_until(
                    lambda: [c for c in relays_in(slack) if "the migration" in c["text"]] or None,
                    WAIT, "alice's reply in the thread",
                )  # fmt: skip
                await b.bridge.links.drain()
                await b.bridge.outbox.drain()
        finally:
            await alice.close()
        # As if the process died after Slack took the copy, before it wrote that down.
        with sqlite3.connect(tmp_path / "links.db") as conn:
            changed = conn.execute(
                "UPDATE outbox SET state = 'queued', ref = NULL"
                " WHERE kind = 'relay' AND text = 'bob: the migration'"
            ).rowcount
        assert changed == 1
        async with linked_bot(ngircd.port, slack, tmp_path, monkeypatch) as b:
            assert await b.bridge.redeliver() == 1
            await b.bridge.outbox.drain()
            # Found in its thread by its metadata: there once, and done.
            in_thread = [
                m for (ch, ts), m in slack.messages.items()
                if ch == "C1" and m.get("thread_ts") == copy_ts and "the migration" in m["text"]
            ]  # fmt: skip
            assert len(in_thread) == 1
            assert len([c for c in relays_in(slack) if "the migration" in c["text"]]) == 1
            assert [c["ts"] for c in slack.calls_to("conversations.replies")][-1:] == [copy_ts]
            assert await b.bridge.redeliver() == 0


async def test_an_edit_and_a_delete_made_while_slack_is_down_are_applied_after_a_restart(
    ngircd, tmp_path, monkeypatch
):
    """Changes go through the outbox: made while the target refuses them, and the bot
    stopped before they got through, the next process applies them, once each; IRC
    (no edits) shows each as one line, never twice."""
    other = "slack:T1:C2"  # a second Slack channel: its copy can be edited
    links = [LinkSettings(name="team", channels=[IRC_KEY, SLACK_KEY, other])]
    async with FakeSlack() as slack:
        slack.add_user("U2", "bob", display_name="bob")
        watcher = await person(ngircd.port, "watcher")
        try:
            kw: dict[str, Any] = {"links": links, "rate_limit_retries": 0}
            async with linked_bot(ngircd.port, slack, tmp_path, monkeypatch, **kw) as b:
                said = slack.message_event("C1", "the meeting is at 3", user="U2")
                await slack.push_event(said)
                await watcher.wait_for(lambda m: "the meeting is at 3" in m.text, WAIT)
                await slack.wait_until(lambda: relays_in(slack, "C2") or None, WAIT, "the copy")
                [copy_ts] = [ts for (ch, ts), m in slack.messages.items()
                             if ch == "C2" and m.get("username")]  # fmt: skip
                await b.bridge.links.drain()
                # Slack refuses every edit and deletion from now on (down for them).
                slack.rate_limit("chat.update", times=10_000, retry_after=1)
                slack.rate_limit("chat.delete", times=10_000, retry_after=1)
                await slack.push_event(slack.message_changed_event(said, "the meeting is at 4"))
                await watcher.wait_for(lambda m: "(edit) the meeting is at 4" in m.text, WAIT)
                await slack.wait_until(
                    lambda: slack.calls_to("chat.update") or None, WAIT, "a refused update"
                )
                await slack.push_event(slack.message_deleted_event(said))
                await watcher.wait_for(lambda m: "(deleted their message" in m.text, WAIT)
                await eventually(lambda: _irc_lines_confirmed(b), "IRC's lines confirmed")
            # Stopped before Slack took either change: the copy is as it was.
            assert slack.messages[("C2", copy_ts)]["text"] == "the meeting is at 3"
            slack.rate_limit("chat.update", times=0)
            slack.rate_limit("chat.delete", times=0)  # Slack is back
            async with linked_bot(ngircd.port, slack, tmp_path, monkeypatch, links=links) as b:
                assert await b.bridge.redeliver() == 2  # the edit, then the deletion
                await b.bridge.outbox.drain()
                updates = [c for c in slack.calls_to("chat.update") if c.get("ts") == copy_ts]
                assert updates[-1]["text"] == "the meeting is at 4"
                assert ("C2", copy_ts) not in slack.messages  # deleted, after its edit
                [deleted] = slack.calls_to("chat.delete")[-1:]
                assert (deleted["channel"], deleted["ts"]) == ("C2", copy_ts)
                assert len(relays_in(slack, "C2")) == 1  # a change is never a new post
                assert await b.bridge.redeliver() == 0
            lines = [m.text for m in relay_lines(watcher)]
            assert len([t for t in lines if "(edit) the meeting is at 4" in t]) == 1
            assert len([t for t in lines if "(deleted their message" in t]) == 1
        finally:
            await watcher.close()


async def _irc_lines_confirmed(b: Linked) -> bool:
    return await _irc_lines_delivered(b, 3)


async def _irc_lines_delivered(b: Linked, n: int) -> bool:
    import sqlite3

    with sqlite3.connect(b.agent.store.path) as conn:
        rows = conn.execute(
            "SELECT state, awaits_confirm FROM outbox WHERE channel_key = ? AND kind = 'relay'",
            (IRC_KEY,),
        ).fetchall()
    # (delivered: confirmed, or sent where the server will not confirm)
    return len(rows) == n and all(r[0] == "confirmed" or (r[0], r[1]) == ("sent", 0) for r in rows)


async def test_a_copy_and_its_edit_waiting_for_slack_across_a_restart_go_once_it_is_back(
    ngircd, tmp_path, monkeypatch
):
    """Slack still down when the bot starts again: what the outbox holds for it (a copy,
    then an edit of it) is tried again until Slack is back, in order, without another
    restart; the edit finds the copy's ts once the copy is posted."""
    other = "slack:T1:C2"
    links = [LinkSettings(name="team", channels=[IRC_KEY, SLACK_KEY, other])]
    kw: dict[str, Any] = {"links": links, "rate_limit_retries": 0}
    async with FakeSlack() as slack:
        slack.add_user("U2", "bob", display_name="bob")
        watcher = await person(ngircd.port, "watcher")
        try:
            slack.rate_limit("chat.postMessage", times=10_000, retry_after=1)  # Slack down
            async with linked_bot(ngircd.port, slack, tmp_path, monkeypatch, **kw) as b:
                said = slack.message_event("C1", "the meeting is at 3", user="U2")
                await slack.push_event(said)
                await watcher.wait_for(lambda m: "the meeting is at 3" in m.text, WAIT)
                await slack.push_event(slack.message_changed_event(said, "the meeting is at 4"))
                await watcher.wait_for(lambda m: "(edit) the meeting is at 4" in m.text, WAIT)
                await slack.wait_until(
                    lambda: slack.calls_to("chat.postMessage") or None, WAIT, "a refused post"
                )
                await eventually(lambda: _irc_lines_delivered(b, 2), "IRC's lines delivered")
            assert [m for (ch, _), m in slack.messages.items() if ch == "C2"] == []
            async with linked_bot(ngircd.port, slack, tmp_path, monkeypatch, **kw) as b:
                assert await b.bridge.redeliver() == 0  # refused again: queued, not lost
                slack.rate_limit("chat.postMessage", times=0)  # Slack is back
                copy = await slack.wait_until(
                    lambda: [m for (ch, _), m in slack.messages.items()
                             if ch == "C2" and m.get("username")] or None,
                    WAIT, "the copy",
                )  # fmt: skip
                await slack.wait_until(
                    lambda: copy[0]["text"] == "the meeting is at 4" or None, WAIT, "the edit"
                )
                assert len(copy) == 1 and copy[0]["username"] == "bob (Slack)"
                await b.bridge.links.drain()
                await b.bridge.outbox.drain()
                assert await b.bridge.redeliver() == 0
            lines = [m.text for m in relay_lines(watcher)]
            assert len([t for t in lines if "(edit) the meeting is at 4" in t]) == 1
            assert len([t for t in lines if t.endswith("the meeting is at 3")]) == 1
        finally:
            await watcher.close()


async def test_with_edits_none_irc_shows_no_change_and_slack_still_updates_its_copy(
    ngircd, tmp_path, monkeypatch
):
    other = "slack:T1:C2"
    links = [LinkSettings(name="team", channels=[IRC_KEY, SLACK_KEY, other], edits="none")]
    async with FakeSlack() as slack:
        slack.add_user("U2", "bob", display_name="bob")
        watcher = await person(ngircd.port, "watcher")
        try:
            async with linked_bot(ngircd.port, slack, tmp_path, monkeypatch, links=links) as b:
                said = slack.message_event("C1", "the meeting is at 3", user="U2")
                await slack.push_event(said)
                await slack.wait_until(lambda: relays_in(slack, "C2") or None, WAIT, "the copy")
                [copy_ts] = [ts for (ch, ts), m in slack.messages.items()
                             if ch == "C2" and m.get("username")]  # fmt: skip
                await slack.push_event(slack.message_changed_event(said, "the meeting is at 4"))
                await slack.wait_until(
                    lambda: slack.messages[("C2", copy_ts)]["text"] == "the meeting is at 4"
                    or None, WAIT, "the copy updated",
                )  # fmt: skip
                # A line said after the edit: IRC's queue is in order, so the edit's line
                # would have come before it.
                await slack.push_event(slack.message_event("C1", "see you there", user="U2"))
                await watcher.wait_for(lambda m: "see you there" in m.text, WAIT)
                lines = [m.text for m in relay_lines(watcher)]
                assert [t.split("> ", 1)[1] for t in lines] == [
                    "the meeting is at 3", "see you there"
                ]  # fmt: skip
                await b.bridge.links.drain()
                assert b.bridge.links.changed == 1  # Slack's copy only
        finally:
            await watcher.close()
