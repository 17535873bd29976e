"""``!link`` sets what ``[[links]]`` can (issue 33): a network's icon in Slack, and a link
made in chat changed in place (options, channels), by verified admins only, stored.

A real ngircd (people on IRC are real clients), the Slack fake; an IRC admin needs a
services account, which ngircd cannot vouch for: that part runs on a scripted server
speaking the IRCv3 ``account-tag`` wire format."""

from __future__ import annotations

from typing import Any

from test_links import IRC_KEY, SLACK_KEY, linked_bot, person, posts, relays_in

from agentik.core.testing.scripted import Reply

from fakeslack import FakeSlack
from ircservers import ScriptedIRCServer, registration_handler
from rigs import WAIT

pytest_plugins = ["ircservers"]


async def said(slack: FakeSlack, words: str, channel: str = "C1", since: int = 0) -> str:
    """The bot's first post in ``channel`` holding ``words`` after its ``since`` first
    posts (waits for it)."""

    def find() -> str | None:
        got = [c.get("text") or "" for c in posts(slack, channel)[since:]]
        return next((t for t in got if words in t), None)

    await slack.wait_until(find, WAIT, words)
    return find() or ""


def copy_of(slack: FakeSlack, text: str, channel: str = "C1") -> dict[str, Any] | None:
    return next((c for c in relays_in(slack, channel) if c.get("text") == text), None)


async def test_link_in_chat_sets_icons_and_changes_its_link_in_place_across_a_restart(
    ngircd, tmp_path, monkeypatch
):
    async with FakeSlack() as slack:
        slack.add_user("U2", "bob")
        slack.add_user("U9", "root")
        at = f"<@{slack.bot_user_id}> "
        say = lambda text, user="U9": slack.push_event(  # noqa: E731
            slack.message_event("C1", at + text, user=user)
        )
        async with linked_bot(ngircd.port, slack, tmp_path, monkeypatch, links=[]) as b:
            alice = await person(ngircd.port, "alice")
            try:
                # The admin (a verified Slack user) links #team with its network's icon,
                # answers only where asked.
                await say(f"!link team {IRC_KEY} icons.testnet=:speech_balloon: answer=asked")
                await said(slack, "linked team")
                alice.privmsg("#team", "first from irc")
                await slack.wait_until(lambda: copy_of(slack, "first from irc"), WAIT, "copy")
                first = copy_of(slack, "first from irc")
                assert first is not None
                assert (first["username"], first.get("icon_emoji")) == (
                    "alice@testnet", ":speech_balloon:"
                )  # fmt: skip
                b.model.enqueue(Reply(text="only on irc"))
                alice.privmsg("#team", "agentik: where?")
                await alice.wait_for(lambda m: "only on irc" in m.text, WAIT)
                await said(slack, "(answered in irc:testnet:#team, asked by alice@testnet)")
                # Neither a user on Slack nor a nick on IRC (no account) may change it.
                await say("!link team icons.testnet=:x:", user="U2")
                await said(slack, "!link is for admins")
                alice.privmsg("#team", "!link team icons.testnet=:x:")
                await alice.wait_for(lambda m: "!link is for admins" in m.text, WAIT)
                # The admin changes it in place: an image URL (Slack sends a typed URL as
                # <…>), answers everywhere now; the open channels follow at once.
                await say("!link team icons.testnet=<https://example.org/irc.png> answer=")
                changed = await said(slack, "changed team")
                assert "icons testnet=https://example.org/irc.png" in changed
                assert "answer everywhere" in changed
                alice.privmsg("#team", "second from irc")
                await slack.wait_until(lambda: copy_of(slack, "second from irc"), WAIT, "copy")
                second = copy_of(slack, "second from irc")
                assert second is not None
                assert (second.get("icon_url"), second.get("icon_emoji")) == (
                    "https://example.org/irc.png", None
                )  # fmt: skip
                b.model.enqueue(Reply(text="everywhere now"))
                alice.privmsg("#team", "agentik: and now?")
                await alice.wait_for(lambda m: "everywhere now" in m.text, WAIT)
                await slack.wait_until(
                    lambda: any("everywhere now" in (m.get("text") or "")
                                for m in slack.messages.values()),
                    WAIT, "the answer in Slack",
                )  # fmt: skip
                # Bad input: a clear error naming the key; the link is as it was.
                await say("!link team icons.web=<ftp://example.org/x.png>")
                error = await said(slack, "neither a Slack emoji")
                assert error.startswith("icons: ")
                await say("!link team replay=true")
                assert "replay: Extra inputs are not permitted" in await said(slack, "replay")
                [record] = await b.agent.store.links()
                assert record.options == {"icons": {"testnet": "https://example.org/irc.png"}}
                assert record.created_by == "slack:T1:U9"
                before = len(posts(slack))
                await say("!links")
                listed = await said(slack, "team: ", since=before)
                assert listed.startswith(f"team: {SLACK_KEY} {IRC_KEY} (answer everywhere")
            finally:
                await alice.close()
        # A new process on the same database: the icon is there and used.
        async with linked_bot(ngircd.port, slack, tmp_path, monkeypatch, links=[]) as b:
            alice = await person(ngircd.port, "alice")
            try:
                alice.privmsg("#team", "after the restart")
                await slack.wait_until(lambda: copy_of(slack, "after the restart"), WAIT, "copy")
                again = copy_of(slack, "after the restart")
                assert again is not None and again.get("icon_url") == "https://example.org/irc.png"
                # A channel taken out of the link starts a conversation of its own.
                before = len(posts(slack))
                await say(f"!link team -{IRC_KEY} slack:T1:C2")
                await said(slack, "changed team", since=before)
                slack_conv = await b.agent.conversation_for_channel(SLACK_KEY)
                assert (await b.agent.conversation_for_channel("slack:T1:C2")).id == slack_conv.id
                assert (await b.agent.conversation_for_channel(IRC_KEY)).id != slack_conv.id
                [record] = await b.agent.store.links()
                assert record.channels == (SLACK_KEY, "slack:T1:C2")
            finally:
                await alice.close()


async def test_an_irc_admin_with_a_services_account_links_with_icons(tmp_path, monkeypatch):
    handler = registration_handler(caps_offered="account-tag message-tags")
    async with (
        ScriptedIRCServer(handler) as server,
        FakeSlack() as slack,
        linked_bot(
            server.port, slack, tmp_path, monkeypatch, links=[],
            admins=("testnet:account:alice",),
        ) as b,
    ):  # fmt: skip
        client = await server.wait_for_client()
        # The nick without an account cannot; the same nick logged in can.
        client.send(f":alice!a@h PRIVMSG #team :!link team {SLACK_KEY} icons.testnet=:irc:")
        await server.wait_for_line(lambda ln: "!link is for admins" in ln)
        assert await b.agent.store.links() == []
        client.send(
            f"@account=alice :alice!a@h PRIVMSG #team :!link team {SLACK_KEY} icons.testnet=:irc:"
        )
        await server.wait_for_line(lambda ln: "linked team" in ln)
        [record] = await b.agent.store.links()
        assert (record.options, record.created_by) == (
            {"icons": {"testnet": ":irc:"}}, "testnet:account:alice"
        )  # fmt: skip
        client.send(":carol!c@h PRIVMSG #team :hello slack")
        await slack.wait_until(lambda: copy_of(slack, "hello slack"), WAIT, "carol's copy")
        copy = copy_of(slack, "hello slack")
        assert copy is not None and copy.get("icon_emoji") == ":irc:"


async def test_link_values_with_blanks_are_given_in_quotes_and_a_bad_quote_is_named(
    ngircd, tmp_path, monkeypatch
):
    """``!link`` takes a value holding blanks in quotes (shell-like): the link is made
    with it, ``!links`` shows it quoted as it can be typed again, and it works (lines
    starting with the opt-out prefix stay on IRC).  A quote left open is a clear error
    naming it; nothing is made."""
    async with FakeSlack() as slack:
        slack.add_user("U9", "root")
        at = f"<@{slack.bot_user_id}> "
        say = lambda text: slack.push_event(  # noqa: E731
            slack.message_event("C1", at + text, user="U9")
        )
        async with linked_bot(ngircd.port, slack, tmp_path, monkeypatch, links=[]) as b:
            alice = await person(ngircd.port, "alice")
            try:
                # Open quote: the error names it and what follows; no link is made.
                await say(f'!link team {IRC_KEY} opt_out_prefix="[no relay] answer=asked')
                error = await said(slack, "is not closed")
                assert error == (
                    "!link: the \" before '[no relay] answer=asked' is not closed: close it,"
                    " or put a value holding a \" in '...'"
                )
                # An apostrophe in a bare word is a quote left open too.
                before = len(posts(slack))
                await say(f"!link team {IRC_KEY} opt_out_prefix=don't")
                error = await said(slack, "is not closed", since=before)
                assert "the ' before 't' is not closed" in error
                assert await b.agent.store.links() == []
                # Typographic quotes (a phone's) count as ", and the value keeps its blank.
                await say(f"!link team {IRC_KEY} opt_out_prefix=\u201c[no relay]\u201d")
                await said(slack, "linked team")
                [record] = await b.agent.store.links()
                assert record.options == {"opt_out_prefix": "[no relay]"}
                before = len(posts(slack))
                await say("!links")
                listed = await said(slack, "team: ", since=before)
                assert 'opt-out "[no relay]"' in listed
                # Changed in place with plain quotes: a value holding a " in '...'.
                before = len(posts(slack))
                await say("!link team opt_out_prefix='\"off the record\"'")
                changed = await said(slack, "changed team", since=before)
                assert "opt-out '\"off the record\"'" in changed
                [record] = await b.agent.store.links()
                assert record.options == {"opt_out_prefix": '"off the record"'}
                # It is in force: the line with the prefix stays on IRC, the next is relayed.
                alice.privmsg("#team", '"off the record" the password is hunter2')
                alice.privmsg("#team", "public line")
                await slack.wait_until(lambda: copy_of(slack, "public line"), WAIT, "copy")
                assert not any("hunter2" in (c.get("text") or "") for c in posts(slack))
            finally:
                await alice.close()
