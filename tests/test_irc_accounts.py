"""IRC identities beyond the ``account`` tag (issue 19): extended-join, account-notify, WHOX.

The bot connects to the scripted IRC server (tests/ircservers.py), which
offers the capabilities each test names and lets the test play the other
users' lines (JOIN with an account, ``ACCOUNT``, NICK, PART, WHOX replies).
What the transport hands on is recorded by a plain sink; the ``!role`` test
goes through the real bridge and access policy on a real SQLite file.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentik.bot.bridge import Bridge, ChannelOptions
from agentik.core import Agent, SQLiteStore
from agentik.core.access import AccessPolicy, AccessSettings
from agentik.core.testing.scripted import ScriptedModel
from agentik.transports.base import IncomingMessage
from agentik.transports.irc.transport import IRCTransport
from agentik.transports.irc.wire import casefold

from ircservers import ScriptedIRCServer, registration_handler, sasl_plain
from rigs import FAST, joined

ISUPPORT = "CASEMAPPING=rfc1459 CHANTYPES=#& NETWORK=Test"
TRACKING = "extended-join account-notify message-tags"


class Recorder:
    """A message sink that keeps what the transport hands on."""

    def __init__(self) -> None:
        self.messages: list[IncomingMessage] = []
        self._changed = asyncio.Event()

    async def handle(self, message: IncomingMessage, transport: Any) -> None:
        self.messages.append(message)
        self._changed.set()

    async def next(self) -> IncomingMessage:
        """The next message (waits for it); messages are taken in order."""
        taken = getattr(self, "_taken", 0)
        async with asyncio.timeout(60):
            while len(self.messages) <= taken:
                self._changed.clear()
                await self._changed.wait()
        self._taken = taken + 1
        return self.messages[taken]


async def start_bot(port: int, sink: Any, **settings: Any) -> IRCTransport:
    transport = IRCTransport(
        name="testnet",
        settings={"host": "127.0.0.1", "port": port, "nick": "agentik", "channels": ["#team"],
                  **FAST, **settings},
    )  # fmt: skip
    await transport.start(sink)
    await joined(transport, "#team")
    return transport


async def say(client: Any, sink: Recorder, line: str) -> IncomingMessage:
    client.send(line)
    return await sink.next()


async def test_extended_join_verifies_untagged_messages_until_the_user_logs_out():
    sink = Recorder()
    async with ScriptedIRCServer(registration_handler(TRACKING, isupport=ISUPPORT)) as server:
        bot = await start_bot(server.port, sink)
        try:
            assert {"extended-join", "account-notify"} <= bot.caps_enabled
            client = server.clients[0]
            client.send(":Bob!b@h JOIN #team Bob[x] :Bob the builder")
            client.send(":mallory!m@h JOIN #team * :not logged in")
            msg = await say(client, sink, ":Bob!b@h PRIVMSG #team :agentik: hello")
            assert (msg.verified, msg.author_id, msg.meta["account"]) == (True, "bob{x}", "bob{x}")
            assert msg.meta["account_via"] == "tracked"
            msg = await say(client, sink, ":mallory!m@h PRIVMSG #team :agentik: me too")
            assert (msg.verified, msg.author_id, msg.meta["account"]) == (False, "mallory", None)
            # A private message from Bob, still in #team with us: verified too.
            msg = await say(client, sink, ":Bob!b@h PRIVMSG agentik :psst")
            assert msg.verified and msg.channel_key == "irc:testnet:bob{x}"
            # account-notify: Bob logs out; his next message is a nick's, unverified.
            client.send(":Bob!b@h ACCOUNT *")
            msg = await say(client, sink, ":Bob!b@h PRIVMSG #team :agentik: again")
            assert (msg.verified, msg.author_id, msg.meta["account"]) == (False, "bob", None)
            # ... and logs in to another account: that one counts.
            client.send(":Bob!b@h ACCOUNT robert")
            msg = await say(client, sink, ":Bob!b@h PRIVMSG #team :agentik: now?")
            assert (msg.verified, msg.author_id) == (True, "robert")
        finally:
            await bot.aclose()


async def test_a_nick_change_keeps_the_account_and_leaving_every_channel_forgets_it():
    sink = Recorder()
    async with ScriptedIRCServer(registration_handler(TRACKING, isupport=ISUPPORT)) as server:
        bot = await start_bot(server.port, sink)
        try:
            client = server.clients[0]
            client.send(":bob!b@h JOIN #team bob :Bob")
            client.send(":bob!b@h NICK :robert")
            msg = await say(client, sink, ":robert!b@h PRIVMSG #team :agentik: renamed")
            assert (msg.verified, msg.author_id, msg.author_name) == (True, "bob", "robert")
            # Someone else takes the old nick, without an account: not bob.
            client.send(":bob!x@elsewhere JOIN #team * :impostor")
            msg = await say(client, sink, ":bob!x@elsewhere PRIVMSG #team :agentik: I am bob")
            assert (msg.verified, msg.author_id) == (False, "bob")
            # robert leaves our only shared channel: his account is forgotten, so a
            # private message from that nick is only a nick's.
            client.send(":robert!b@h PART #team :bye")
            msg = await say(client, sink, ":robert!b@h PRIVMSG agentik :still me")
            assert (msg.verified, msg.author_id) == (False, "robert")
            # QUIT forgets too (the impostor's entry was None anyway; carol's was not).
            client.send(":carol!c@h JOIN #team carol :Carol")
            client.send(":carol!c@h QUIT :gone")
            msg = await say(client, sink, ":carol!c@h PRIVMSG agentik :back by query")
            assert (msg.verified, msg.author_id) == (False, "carol")
            # Kicked: forgotten as well.
            client.send(":dave!d@h JOIN #team dave :Dave")
            msg = await say(client, sink, ":dave!d@h PRIVMSG #team :agentik: hi")
            assert msg.verified
            client.send(":op!o@h KICK #team dave :out")
            msg = await say(client, sink, ":dave!d@h PRIVMSG agentik :why")
            assert (msg.verified, msg.author_id) == (False, "dave")
        finally:
            await bot.aclose()


async def test_a_whox_query_on_join_learns_the_accounts_of_who_is_already_there():
    sink = Recorder()
    base = registration_handler(f"sasl {TRACKING}", sasl=sasl_plain("Bot", "pw-secret"),
                                isupport=f"{ISUPPORT} WHOX PREFIX=(ov)@+")  # fmt: skip

    async def handler(client: Any, line: str) -> None:
        await base(client, line)
        if line.startswith("JOIN #team"):
            client.send(f":{client.server.name} 353 {client.nick} = #team :agentik @carol +dave")
            client.reply("366", "#team", "End of /NAMES list.")
        if line.startswith("WHO #team "):
            token = line.rpartition(",")[2]
            client.send(f":{client.server.name} 354 {client.nick} {token} #team carol Carol")
            client.send(f":{client.server.name} 354 {client.nick} {token} #team dave 0")
            client.send(f":{client.server.name} 354 {client.nick} 999 #team dave dave")
            client.reply("315", "#team", "End of WHO list.")

    async with ScriptedIRCServer(handler) as server:
        bot = await start_bot(server.port, sink, sasl_mechanism="plain", sasl_username="Bot",
                              sasl_password="pw-secret")  # fmt: skip
        try:
            assert bot.account == "bot"  # our own, from 900 RPL_LOGGEDIN
            who = await server.wait_for_line(lambda ln: ln.startswith("WHO #team "))
            assert who.startswith("WHO #team %tcna,") and who.rpartition(",")[2].isdigit()
            client = server.clients[0]
            msg = await say(client, sink, ":carol!c@h PRIVMSG #team :agentik: hi")
            assert (msg.verified, msg.author_id) == (True, "carol")
            # dave has no account ("0"); a reply with another token is not ours.
            msg = await say(client, sink, ":dave!d@h PRIVMSG #team :agentik: hi")
            assert (msg.verified, msg.author_id) == (False, "dave")
            # dave was in the NAMES list: account-notify reaches him there.
            client.send(":dave!d@h ACCOUNT dave")
            msg = await say(client, sink, ":dave!d@h PRIVMSG #team :agentik: now")
            assert (msg.verified, msg.author_id) == (True, "dave")
        finally:
            await bot.aclose()


async def test_without_account_notify_only_the_account_tag_counts():
    sink = Recorder()
    handler = registration_handler("extended-join message-tags", isupport=f"{ISUPPORT} WHOX")
    async with ScriptedIRCServer(handler) as server:
        bot = await start_bot(server.port, sink)
        try:
            assert "extended-join" in bot.caps_enabled
            assert "account-notify" not in bot.caps_enabled
            client = server.clients[0]
            client.send(":bob!b@h JOIN #team bob :Bob")
            msg = await say(client, sink, ":bob!b@h PRIVMSG #team :agentik: hello")
            assert (msg.verified, msg.author_id) == (False, "bob")
            assert bot.account_of("irc:testnet:#team", "bob") is None
        finally:
            await bot.aclose()


async def test_with_account_tag_the_tag_decides_even_against_what_was_tracked():
    sink = Recorder()
    handler = registration_handler(f"account-tag {TRACKING}", isupport=ISUPPORT)
    async with ScriptedIRCServer(handler) as server:
        bot = await start_bot(server.port, sink)
        try:
            client = server.clients[0]
            client.send(":bob!b@h JOIN #team bob :Bob")
            msg = await say(client, sink, "@account=carol :bob!b@h PRIVMSG #team :agentik: a")
            assert (msg.verified, msg.author_id, msg.meta["account_via"]) == (True, "carol", "tag")
            # account-tag puts the tag on every message of a logged-in user: none, no account.
            msg = await say(client, sink, ":bob!b@h PRIVMSG #team :agentik: b")
            assert (msg.verified, msg.author_id) == (False, "bob")
        finally:
            await bot.aclose()


async def test_role_by_nick_uses_the_tracked_account_of_someone_who_never_spoke(tmp_path):
    access = AccessPolicy(AccessSettings(owners=("testnet:account:alice",)), {"testnet": "irc"},
                          irc_casefold=casefold)  # fmt: skip
    model = ScriptedModel()
    store = SQLiteStore(str(tmp_path / "roles.db"))
    agent = Agent(llm=model, store=store)
    await agent.start()
    await access.load(store)
    bridge = Bridge(agent, access=access)
    async with ScriptedIRCServer(registration_handler(TRACKING, isupport=ISUPPORT)) as server:
        transport = IRCTransport(
            name="testnet",
            settings={"host": "127.0.0.1", "port": server.port, "nick": "agentik",
                      "channels": ["#team"], **FAST},
        )  # fmt: skip
        bridge.attach(transport, ChannelOptions(command_prefix="!"))
        await transport.start(bridge)
        try:
            await joined(transport, "#team")
            client = server.clients[0]
            client.send(":alice!a@h JOIN #team alice :Alice")
            client.send(":Bob!b@h JOIN #team BobAcct :Bob")
            client.send(":alice!a@h PRIVMSG #team :!role bob admin")
            await server.wait_for_line(lambda ln: "testnet:account:bobacct: user → admin" in ln)
            # Someone who is not in a shared channel and never spoke: as before.
            client.send(":alice!a@h PRIVMSG #team :!role zed admin")
            await server.wait_for_line(lambda ln: "I have not seen zed speak" in ln)
            assert access.role_of_key("testnet:account:bobacct") == "admin"
        finally:
            await transport.aclose()
            await bridge.aclose()
            await agent.aclose()


async def test_an_account_learnt_by_whox_is_forgotten_when_its_user_leaves_and_comes_back():
    # No extended-join: a JOIN says nothing of the account, so what was known
    # before the user left (they may have logged out meanwhile) must not return.
    sink = Recorder()
    base = registration_handler("account-notify message-tags", isupport=f"{ISUPPORT} WHOX")

    async def handler(client: Any, line: str) -> None:
        await base(client, line)
        if line.startswith("WHO #team "):
            token = line.rpartition(",")[2]
            client.send(f":{client.server.name} 354 {client.nick} {token} #team carol carol")
            client.reply("315", "#team", "End of WHO list.")

    async with ScriptedIRCServer(handler) as server:
        bot = await start_bot(server.port, sink)
        try:
            await server.wait_for_line(lambda ln: ln.startswith("WHO #team "))
            client = server.clients[0]
            msg = await say(client, sink, ":carol!c@h PRIVMSG #team :agentik: hi")
            assert (msg.verified, msg.author_id) == (True, "carol")
            assert bot.account_of("irc:testnet:#team", "Carol") == "carol"
            client.send(":carol!c@h PART #team")
            client.send(":carol!c@h JOIN #team")
            msg = await say(client, sink, ":carol!c@h PRIVMSG #team :agentik: back")
            assert (msg.verified, msg.author_id) == (False, "carol")
            assert bot.account_of("irc:testnet:#team", "carol") is None
            assert bot.account_of("slack:T1:C1", "carol") is None  # another transport's key
        finally:
            await bot.aclose()
