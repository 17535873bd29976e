"""IRC identity and rendering under attack (issue 17 items 4, 5, 7; issue 18's IRC rules).

Each test reproduces a finding through the real transport: real IRC servers
(miniircd, ngircd) where they can show it, the scripted server where only a
hostile or IRCv3-capable server can (account tags, ``$*`` relayed as is,
STATUSMSG, nicks no real server allows).  Then a hypothesis fuzz over IRC
lines fed through the parser and the transport's message handling.
"""

from __future__ import annotations

import asyncio
import logging
import re
from functools import partial

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agentik.core.canonical import Canonical
from agentik.core.memory import NO_IDENTITY
from agentik.core.testing.scripted import Reply, call
from agentik.transports.base import IncomingMessage, OutgoingMessage
from agentik.transports.irc.transport import IRCTransport
from agentik.transports.irc.wire import casefold, parse_line, strip_formatting

import rigs
from ircservers import IRCTestClient, ScriptedIRCServer, registration_handler
from rigs import FAST, eventually, from_bot, joined, turn_tool_results

pytest_plugins = ["ircservers"]

#: A bot with SQLite memory on one IRC server (network ``testnet``).
irc_bot = partial(rigs.irc_bot, memory=True)

PIN = "alice's bank PIN is 4711"
#: A server with accounts: the IRCv3 account tag, RFC 1459 casemapping, STATUSMSG.
ACCOUNTS = registration_handler(
    caps_offered="account-tag message-tags",
    isupport="CASEMAPPING=rfc1459 CHANTYPES=#& STATUSMSG=@+ NETWORK=Test",
)


class RecordingSink:
    def __init__(self) -> None:
        self.messages: list[IncomingMessage] = []
        self.changed = asyncio.Event()

    async def handle(self, message, transport) -> None:
        self.messages.append(message)
        self.changed.set()
        self.changed = asyncio.Event()

    async def wait(self, predicate) -> IncomingMessage:
        async with asyncio.timeout(60):
            while True:
                found = [m for m in self.messages if predicate(m)]
                if found:
                    return found[0]
                await self.changed.wait()


async def sentinel(server: ScriptedIRCServer, sink: RecordingSink, text: str) -> None:
    """Send a plain private message and wait for it: every line before it was handled."""
    server.clients[0].send(f":carol!c@h PRIVMSG agentik :{text}")
    await sink.wait(lambda m: m.text == text)


# -- item 4: identity ------------------------------------------------------------------------


async def test_a_nick_taken_without_an_account_cannot_read_the_owners_user_notes(
    irc_server, tmp_path
):
    """Nobody has an account on these servers: a nick is a claim, not an identity."""
    async with irc_bot(irc_server.port, tmp_path, channels=["#room"]) as (bot, model, agent, _):
        await joined(bot, "#room")
        # What the old code wrote for nick "alice": her user notes and her DM notes.
        await agent.memory.save("user:testnet:alice", PIN, author="testnet:alice")
        await agent.memory.save("channel:irc:testnet:alice", PIN, author="testnet:alice")
        mallory = await IRCTestClient.connect(irc_server.port, "alice")  # took the nick
        model.enqueue(
            Reply(
                tool_calls=[
                    call("memory_search", {"query": "PIN"}),
                    call("memory_list", {"scope": "user"}),
                    call("memory_list", {}),
                    call("memory_save", {"text": "alice likes mallory", "scope": "user"}),
                ]
            ),
            "I know nothing about that.",
        )
        mallory.privmsg("agentik", "what is my bank PIN?")
        answer = await mallory.wait_for(lambda m: from_bot(m) and m.command == "PRIVMSG")
        assert answer.params[0] == "alice" and answer.text == "I know nothing about that."
        # (Tool calls of one step run together: their results come in any order.)
        assert sorted(turn_tool_results(model)) == sorted(
            ["nothing found for 'PIN'", NO_IDENTITY, "no notes", f"error: {NO_IDENTITY}"]
        )
        assert len(await agent.memory.list()) == 2  # nothing written for the claimed nick
        # In a channel, the unverified nick is no speaker whose notes others see.
        await mallory.join("#room")
        mallory.privmsg("#room", "agentik: hello everyone")
        await mallory.wait_for(lambda m: from_bot(m) and m.text.endswith("echo: hello everyone"))
        bob = await IRCTestClient.connect(irc_server.port, "bob")
        await bob.join("#room")
        model.enqueue(Reply(tool_calls=[call("memory_search", {"query": "PIN"})]), "no idea")
        bob.privmsg("#room", "agentik: what is alice's PIN?")
        await bob.wait_for(lambda m: from_bot(m) and m.text == "bob: no idea")
        assert turn_tool_results(model) == ["nothing found for 'PIN'"]
        await mallory.close()
        await bob.close()


async def test_an_account_keeps_its_notes_whatever_the_nick_case_and_a_bare_nick_does_not(
    tmp_path,
):
    async with ScriptedIRCServer(ACCOUNTS) as server:
        async with irc_bot(server.port, tmp_path) as (bot, model, agent, _):
            await asyncio.wait_for(bot.registered.wait(), 60)
            assert "account-tag" in bot.caps_enabled
            client = server.clients[0]
            model.enqueue(
                Reply(tool_calls=[call("memory_save", {"text": PIN, "scope": "user"})]), "noted it"
            )
            client.send("@account=Alice[m] :Alice[m]!a@h PRIVMSG agentik :remember my PIN")
            await server.wait_for_line("PRIVMSG Alice[m] :noted it")
            [note] = await agent.memory.list()
            assert note.scope == "user:testnet:alice{m}"
            # The same account in other case (RFC 1459: [] and {} are one): the same notes.
            model.enqueue(Reply(tool_calls=[call("memory_search", {"query": "PIN"})]), "found it")
            client.send("@account=ALICE{M} :ALICE{M}!a@h PRIVMSG AGENTIK :my PIN?")
            await server.wait_for_line("PRIVMSG ALICE{M} :found it")
            assert PIN in turn_tool_results(model)[0]
            first = await agent.conversation_for_channel("irc:testnet:alice{m}")
            assert [m.content for m in await first.messages() if m.kind == "user"] == [
                "remember my PIN",
                "my PIN?",
            ]
            # The nick without the account: no identity, another conversation.
            search = Reply(tool_calls=[call("memory_search", {"query": "PIN"})])
            model.enqueue(search, "nope, nothing")
            client.send(":Alice[m]!evil@elsewhere PRIVMSG agentik :my PIN?")
            await server.wait_for_line("PRIVMSG Alice[m] :nope, nothing")
            assert turn_tool_results(model) == ["nothing found for 'PIN'"]
            other = await agent.conversation_for_channel("irc:testnet:alice{m}!*@*")
            assert other.id != first.id
            assert [m.content for m in await other.messages() if m.kind == "user"] == ["my PIN?"]


async def test_an_account_tag_counts_only_when_the_server_negotiated_account_tag():
    handler = registration_handler(caps_offered="message-tags", isupport="NETWORK=Test")
    async with ScriptedIRCServer(handler) as server:
        sink = RecordingSink()
        t = IRCTransport(name="s", settings={"port": server.port, "tls": False})
        await t.start(sink)
        try:
            await asyncio.wait_for(t.registered.wait(), 60)
            server.clients[0].send("@account=alice :alice!a@h PRIVMSG agentik :trust me")
            message = await sink.wait(lambda m: m.text == "trust me")
            assert not message.verified and message.channel_key == "irc:s:alice!*@*"
        finally:
            await t.aclose()


async def test_hostmask_identity_is_an_opt_in_with_a_warning(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="agentik.transports.irc.transport")
    async with ScriptedIRCServer(ACCOUNTS) as server:
        async with irc_bot(server.port, tmp_path, unverified_identity="hostmask") as (
            bot, model, agent, _,
        ):  # fmt: skip
            await asyncio.wait_for(bot.registered.wait(), 60)
            assert 'unverified_identity = "hostmask"' in caplog.text
            model.enqueue(
                Reply(tool_calls=[call("memory_save", {"text": "likes tea", "scope": "user"})]),
                "ok then",
            )
            server.clients[0].send(":Bob!~bob@Host.Example PRIVMSG agentik :I like tea")
            await server.wait_for_line("PRIVMSG Bob :ok then")
            [note] = await agent.memory.list()
            assert note.scope == "user:testnet:bob!~bob@host.example"
            # The same nick from another host is someone else.
            model.enqueue(Reply(tool_calls=[call("memory_search", {"query": "tea"})]), "no idea")
            server.clients[0].send(":Bob!~bob@other.example PRIVMSG agentik :what do I like?")
            await server.wait_for_line("PRIVMSG Bob :no idea")
            assert turn_tool_results(model) == ["nothing found for 'tea'"]


# -- CASEMAPPING -------------------------------------------------------------------------------


async def test_nick_and_channel_case_do_not_split_keys_or_miss_the_address():
    async with ScriptedIRCServer(ACCOUNTS) as server:
        sink = RecordingSink()
        t = IRCTransport(
            name="s",
            settings={"port": server.port, "tls": False, "nick": "agent[x]",
                      "channels": ["#Room[1]"], "address_mode": "prefix"},
        )  # fmt: skip
        await t.start(sink)
        try:
            await joined(t, "#room{1}")
            client = server.clients[0]
            client.send("@account=Alice :Alice!a@h PRIVMSG #Room[1] :agent[x]: one")
            client.send("@account=ALICE :ALICE!a@h PRIVMSG #ROOM{1} :AGENT{X}: two")
            client.send("@account=alice :alice!a@h PRIVMSG #room{1} :AGENT[x], three")
            client.send("@account=alice :alice!a@h PRIVMSG AGENT{X} :four")
            await sink.wait(lambda m: m.text == "four")
            one, two, three, four = sink.messages
            assert [m.text for m in (one, two, three)] == ["one", "two", "three"]
            assert all(m.addressed and not m.direct for m in (one, two, three))
            assert {m.channel_key for m in (one, two, three)} == {"irc:s:#room{1}"}
            assert {m.author_id for m in sink.messages} == {"alice"}
            assert four.direct and four.channel_key == "irc:s:alice"
        finally:
            await t.aclose()


async def test_the_address_check_ignores_case_on_a_real_server(irc_server, tmp_path):
    async with irc_bot(irc_server.port, tmp_path, channels=["#Case"]) as (bot, model, agent, _):
        await joined(bot, "#case")
        alice = await IRCTestClient.connect(irc_server.port, "alice")
        await alice.join("#CASE")
        alice.privmsg("#CASE", "AGENTIK: loud hello")
        await alice.wait_for(lambda m: from_bot(m) and m.text == "alice: echo: loud hello")
        alice.privmsg("#case", "Agentik, quiet hello")
        await alice.wait_for(lambda m: from_bot(m) and m.text == "alice: echo: quiet hello")
        conv = await agent.conversation_for_channel("irc:testnet:#case")
        assert [m.content for m in await conv.messages() if m.kind == "user"] == [
            "loud hello",
            "quiet hello",
        ]
        await alice.close()


def test_casefold_follows_the_casemapping():
    assert casefold("Alice[m]\\~") == "alice{m}|^"  # rfc1459, also when not announced
    assert casefold("Alice[m]\\~", "rfc1459") == "alice{m}|^"
    assert casefold("Alice[m]\\~", "strict-rfc1459") == "alice{m}|~"
    assert casefold("Alice[m]\\~", "ascii") == "alice[m]\\~"
    assert casefold("ÄLICE", "ascii") == "Älice"
    assert casefold("ÄLICE", "rfc8265") == "älice"


# -- item 5: CTCP from model text ---------------------------------------------------------------

HOSTILE = (
    "\x01DCC SEND evil.exe 2130706433 4444 1\x01\n"
    "\x01PING 1\x01 everyone\n"
    "\x02\x01ACTION dances\x01\x02 and rings \x07 the bell"
)


async def test_model_text_never_makes_a_ctcp(irc_server, tmp_path):
    async with irc_bot(irc_server.port, tmp_path, channels=["#ctcp"]) as (bot, model, agent, _):
        await joined(bot, "#ctcp")
        alice = await IRCTestClient.connect(irc_server.port, "alice")
        await alice.join("#ctcp")
        model.enqueue(HOSTILE, HOSTILE)
        alice.privmsg("#ctcp", "agentik: say something nasty")
        alice.privmsg("agentik", "and in private?")
        await alice.wait_for(lambda m: from_bot(m) and m.target == "#ctcp" and "bell" in m.text)
        await alice.wait_for(lambda m: from_bot(m) and m.target == "alice" and "bell" in m.text)
        lines = [m for m in alice.received if from_bot(m)]
        assert len(lines) == 6
        assert not any(b"\x01" in m.raw or b"\x07" in m.raw for m in lines)
        texts = [m.text for m in lines if m.target == "alice"]
        assert texts == [
            "DCC SEND evil.exe 2130706433 4444 1",
            "PING 1 everyone",
            "\x02ACTION dances\x02 and rings  the bell",
        ]
        await alice.close()


async def test_no_outgoing_kind_carries_a_ctcp():
    """Answers, notices, errors and command replies: every line the transport writes."""
    async with ScriptedIRCServer(registration_handler(caps_offered="")) as server:
        t = IRCTransport(name="s", settings={"port": server.port, "tls": False})
        await t.start(RecordingSink())
        try:
            await asyncio.wait_for(t.registered.wait(), 60)
            for kind in ("answer", "notice", "error", "command"):
                await t.send(
                    OutgoingMessage(
                        channel_key="irc:s:alice!*@*", text=f"{kind} \x01PING 1\x01",
                        kind=kind, run_id="r1", reply_to="alice",
                    )
                )  # fmt: skip
            await server.wait_for_line("PRIVMSG alice :command PING 1")
            sent = [line for line in server.received if "alice" in line]
            assert sent == [
                "PRIVMSG alice :answer PING 1",
                "NOTICE alice :notice PING 1",
                "PRIVMSG alice :error PING 1",
                "PRIVMSG alice :command PING 1",
            ]
            # Our own CTCP replies are still CTCP.
            since = server.mark()
            server.clients[0].send(":alice!a@h PRIVMSG agentik :\x01VERSION\x01")
            version = await server.wait_for_line(
                lambda line: line.startswith("NOTICE alice"), since=since
            )
            assert version.startswith("NOTICE alice :\x01VERSION ") and version.endswith("\x01")
        finally:
            await t.aclose()


# -- item 7: hostile nicks and targets ------------------------------------------------------------


async def test_hostile_nicks_from_the_server_are_skipped_not_crashed_on(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="agentik")
    async with ScriptedIRCServer(registration_handler(caps_offered="")) as server:
        async with irc_bot(server.port, tmp_path) as (bot, model, agent, bridge):
            await asyncio.wait_for(bot.registered.wait(), 60)
            client = server.clients[0]
            for nick in (":evil", "", "ev,il", "#secret", "$mask", "a*b", "bell\x07"):
                client.send(f":{nick}!u@h PRIVMSG agentik :\x01VERSION\x01")
                client.send(f":{nick}!u@h PRIVMSG agentik :hello from {nick!r}")
            client.send(":alice!a@h PRIVMSG agentik :still there?")
            await server.wait_for_line("PRIVMSG alice :echo: still there?")
            assert model.requests and len(model.requests) == 1  # only alice reached the model
            written = [line for line in server.received if line.startswith(("PRIVMSG", "NOTICE"))]
            assert written == ["PRIVMSG alice :echo: still there?"]
            # An answer addressed to such a target (an old outbox row, a hostile
            # reply_to) is dropped, not raised.
            await bot.send(
                OutgoingMessage(channel_key="irc:testnet::evil", text="hi", reply_to=":evil")
            )
            await bot.send(OutgoingMessage(channel_key="irc:testnet::evil", text="hi"))
        assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
        assert "unusable nick ':evil'" in caplog.text


# -- issue 18: what is direct -------------------------------------------------------------------


async def test_broadcasts_server_messages_and_statusmsg_are_never_answered(tmp_path):
    async with ScriptedIRCServer(ACCOUNTS) as server:
        async with irc_bot(server.port, tmp_path, channels=["#room"]) as (
            bot, model, agent, bridge,
        ):  # fmt: skip
            await joined(bot, "#room")
            client = server.clients[0]
            name = server.name
            client.send(":oper!o@staff.example PRIVMSG $* :agentik: network maintenance soon")
            client.send(":oper!o@staff.example PRIVMSG $*.example :agentik: hello servers")
            client.send(":oper!o@staff.example PRIVMSG #*.example :agentik: hello hosts")
            client.send(f":{name} PRIVMSG agentik :server speaking, answer me")
            client.send(":services.example PRIVMSG agentik :a server without a dot-free name")
            client.send(f":{name} NOTICE agentik :*** a server notice")
            client.send("NOTICE agentik :no source at all")
            client.send(":alice!a@h PRIVMSG @#room :agentik: ops only, answer me")
            client.send(":alice!a@h PRIVMSG +#room :agentik: voiced only")
            client.send(":alice!a@h PRIVMSG #elsewhere :agentik: a channel we are not in")
            client.send(":alice!a@h NOTICE agentik :notices are never answered")
            client.send(":alice!a@h NOTICE #room :agentik: not even addressed ones")
            client.send(":alice!a@h PRIVMSG #room :agentik: the one real question")
            await server.wait_for_line("PRIVMSG #room :alice: echo: the one real question")
            conv = await agent.conversation_for_channel("irc:testnet:#room")
            await conv.wait_idle()
            assert [m.content for m in model.requests[-1].messages] == ["the one real question"]
            assert len(model.requests) == 1
            written = [line for line in server.received if line.startswith(("PRIVMSG", "NOTICE"))]
            assert written == ["PRIVMSG #room :alice: echo: the one real question"]


async def test_only_a_privmsg_to_our_own_nick_is_direct(irc_server, tmp_path):
    async with irc_bot(irc_server.port, tmp_path) as (bot, model, agent, _):
        await asyncio.wait_for(bot.registered.wait(), 60)
        alice = await IRCTestClient.connect(irc_server.port, "alice")
        alice.privmsg("AgEnTiK", "private, in any case")
        answer = await alice.wait_for(from_bot)
        assert answer.command == "PRIVMSG" and answer.params[0] == "alice"
        assert answer.text == "echo: private, in any case"
        alice.notice("agentik", "a notice")
        alice.privmsg("agentik", "after the notice")
        later = await alice.wait_for(from_bot)
        assert later.text == "echo: after the notice"  # the notice got nothing
        await alice.close()


# -- issue 18: manners ----------------------------------------------------------------------------


async def test_answers_in_channels_name_the_asker_once_and_private_ones_do_not(
    irc_server, tmp_path
):
    async with irc_bot(irc_server.port, tmp_path, channels=["#manners"]) as (
        bot, model, agent, _,
    ):  # fmt: skip
        await joined(bot, "#manners")
        alice = await IRCTestClient.connect(irc_server.port, "alice")
        bob = await IRCTestClient.connect(irc_server.port, "bob")
        await alice.join("#manners")
        await bob.join("#manners")
        # alice's answer is held while bob asks: each answer names its own asker.
        gate = asyncio.Event()
        held = Reply(text="first line\nsecond line\nthird line", gate=gate)
        model.enqueue(held)
        alice.privmsg("#manners", "agentik: three lines please")
        await held.started.wait()
        bob.privmsg("#manners", "agentik: and me?")
        await bob.sync()
        conv = await agent.conversation_for_channel("irc:testnet:#manners")
        await eventually(lambda: conv.queued, "bob's question to wait behind alice's")
        gate.set()
        await alice.wait_for(lambda m: from_bot(m) and m.text == "bob: echo: and me?")
        texts = [m.text for m in alice.received if from_bot(m)]
        assert texts == [
            "alice: first line",
            "second line",
            "third line",
            "bob: echo: and me?",
        ]
        # A model that already named the asker is not made to say it twice.
        model.enqueue("alice: yes, you")
        alice.privmsg("#manners", "agentik: me?")
        await alice.wait_for(lambda m: from_bot(m) and m.text == "alice: yes, you")
        # Private answers have no prefix.
        alice.privmsg("agentik", "private question")
        private = await alice.wait_for(lambda m: from_bot(m) and m.target == "alice")
        assert private.text == "echo: private question"
        await alice.close()
        await bob.close()


async def test_address_asker_can_be_switched_off(miniircd, tmp_path):
    async with irc_bot(miniircd.port, tmp_path, channels=["#plain"], address_asker=False) as (
        bot, model, agent, _,
    ):  # fmt: skip
        await joined(bot, "#plain")
        alice = await IRCTestClient.connect(miniircd.port, "alice")
        await alice.join("#plain")
        alice.privmsg("#plain", "agentik: hi")
        answer = await alice.wait_for(from_bot)
        assert answer.text == "echo: hi"
        await alice.close()


# -- fuzz: hostile lines through the parser and the message handling ----------------------------

_PREFIXES = st.one_of(
    st.none(),
    st.sampled_from(
        [
            "irc.scripted.test",
            "services.",
            "alice!a@h",
            ":evil!u@h",
            "!@",
            "a!b",
            "x@y",
            "AGENTIK!me@h",
            "#chan!u@h",
            "$*!u@h",
            "ev il",
        ]
    ),
    st.text(min_size=1, max_size=30).map(lambda s: s.replace(" ", "")),
)
_TARGETS = st.one_of(
    st.sampled_from(
        [
            "agentik",
            "AGENTIK",
            "#chan",
            "#CHAN",
            "$*",
            "@#chan",
            "+#chan",
            "#*.tld",
            "",
            ":",
            "alice",
        ]
    ),
    st.text(max_size=20),
)
_TAGS = st.dictionaries(
    st.sampled_from(["account", "bot", "batch", "time", "+draft/x", "msgid"]),
    st.text(max_size=20),
    max_size=3,
)
_TEXTS = st.one_of(
    st.text(max_size=200),
    st.sampled_from(
        [
            "\x01VERSION\x01",
            "\x01PING 1\x01",
            "\x01ACTION x\x01",
            "\x01",
            "agentik: hi",
            "AGENTIK, hi",
            "\x01DCC SEND x 1 2 3\x01",
        ]
    ),
)


def _escape_tag(value: str) -> str:
    return (
        value.replace("\\", "\\\\")
        .replace(";", "\\:")
        .replace(" ", "\\s")
        .replace("\r", "\\r")
        .replace("\n", "\\n")
    )


_USERS = st.one_of(
    st.sampled_from(
        [
            "alice!a@h",
            "ALICE!a@h",
            "bob!~b@host.example",
            "al[ice]!a@h",
            ":evil!u@h",
            "x!y@z",
            "#chan!u@h",
            "a,b!u@h",
            "$x!u@h",
            "a*!u@h",
            ":!u@h",
        ]
    ),
    st.text(min_size=1, max_size=12).map(lambda s: s.replace(" ", "") + "!u@h"),
)


_USER_TAGS = st.dictionaries(
    st.sampled_from(["account", "time", "msgid", "+draft/x", "batch"]),
    st.text(max_size=20),
    max_size=2,
)
_USER_TARGETS = st.one_of(
    st.sampled_from(["agentik", "AGENTIK", "#chan", "#CHAN", "$*", "@#chan", "#*.tld"]),
    st.text(max_size=10),
)


@st.composite
def irc_lines(draw) -> bytes:
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.binary(max_size=600))  # anything, invalid UTF-8 included
    tags = draw(_TAGS)
    if kind <= 3:  # any command, any source
        prefix = draw(_PREFIXES)
        command = draw(
            st.sampled_from(
                [
                    "PRIVMSG",
                    "NOTICE",
                    "JOIN",
                    "PART",
                    "KICK",
                    "NICK",
                    "QUIT",
                    "005",
                    "001",
                    "PING",
                    "CAP",
                    "ERROR",
                    "376",
                    "433",
                    "903",
                    "904",
                ]
            )
        )
    else:  # a message from someone who looks like a user
        prefix = draw(_USERS)
        command = draw(st.sampled_from(["PRIVMSG", "PRIVMSG", "PRIVMSG", "NOTICE"]))
        tags = draw(_USER_TAGS)
    target = draw(_TARGETS if kind <= 3 else _USER_TARGETS)
    text = draw(_TEXTS)
    line = ""
    if tags:
        line += "@" + ";".join(f"{k}={_escape_tag(v)}" for k, v in tags.items()) + " "
    if prefix is not None:
        line += f":{prefix} "
    line += f"{command} {target} :{text}"
    data = line.encode("utf-8", "surrogatepass")
    if draw(st.booleans()):
        data += b"x" * draw(st.integers(0, 9000))  # huge lines
    if kind == 1:
        data = data.replace(b"a", b"\xff\xfe")  # invalid UTF-8 inside
    return data


_HOSTILE_BITS = st.sampled_from(
    ["\x01", "\x01DCC SEND x.exe 1 2 3\x01", "\x01PING 1\x01", "\x01ACTION hi\x01", "\r\n",
     "\x00", "\r", "\n", "\x02", "\x03", "\x034,5", "\x07", "\x0f", "\x16", "\x1d", "\x7f",
     "```", "**", "`", "[x](http://e/\x01)", "\ud800", "agentik: ", "alice: "]
)  # fmt: skip
#: Model output: plain text with hostile pieces mixed in, up to a few KB.
_MODEL_TEXT = st.lists(
    st.one_of(_HOSTILE_BITS, st.text(max_size=60), st.just("word " * 120)),
    min_size=1,
    max_size=25,
).map("".join)


async def _fuzz_once(lines: list[bytes], model_text: str, casemapping: str) -> None:
    sink = RecordingSink()
    t = IRCTransport(name="fz", settings={"tls": False, "channels": ["#chan"]})
    t._sink = sink
    t.nick = "agentik"
    t.isupport.update({"CASEMAPPING": casemapping, "STATUSMSG": "@+"})
    t.caps_enabled.add("account-tag")
    t.joined.add(t._fold("#chan"))
    for raw in lines:
        line = parse_line(raw)
        if line is not None:
            t._handle(line)  # raises if anything goes wrong
    await asyncio.gather(*list(t._tasks))
    before = len(t._queue)
    for message in sink.messages:
        assert "\n" not in message.channel_key and "\r" not in message.channel_key
        for kind in ("answer", "notice", "error", "command"):
            await t.send(
                OutgoingMessage(
                    channel_key=message.channel_key, text=model_text, kind=kind, run_id="r",
                    reply_to=message.reply_to,
                )
            )  # fmt: skip
        await t.send(
            OutgoingMessage(channel_key=message.channel_key, text="", kind="end", run_id="r",
                            reply_to=message.reply_to)
        )  # fmt: skip
    for out in t._queue:
        for piece in out.line.split("\r\n"):
            assert not ({"\r", "\n", "\x00"} & set(piece)), piece
    for out in list(t._queue)[before:]:
        assert "\x01" not in out.line, out.line  # nothing from model text makes a CTCP
        parsed = parse_line(out.line)
        assert parsed is not None and parsed.command in ("PRIVMSG", "NOTICE")
        assert parsed.params[0] == out.target


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    lines=st.lists(irc_lines(), min_size=1, max_size=8),
    model_text=_MODEL_TEXT,
    casemapping=st.sampled_from(["rfc1459", "ascii", "strict-rfc1459", "rfc8265", "bogus"]),
)
@example(  # the findings themselves, always tried
    lines=[
        b"::evil!u@h PRIVMSG agentik :\x01VERSION\x01",
        b"::evil!u@h PRIVMSG agentik :hello",
        b":alice!a@h PRIVMSG agentik :hello",
        b":alice!a@h PRIVMSG #chan :agentik: hello",
    ],
    model_text="\x01DCC SEND evil.exe 1 2 3\x01\n\x01PING 1\x01",
    casemapping="rfc1459",
)
def test_fuzzed_lines_never_crash_and_never_make_unsafe_output(lines, model_text, casemapping):
    asyncio.run(_fuzz_once(lines, model_text, casemapping))


# -- review (rv-chat): CTCP floods ----------------------------------------------------------------


async def test_a_ctcp_flood_from_one_nick_gets_no_more_replies_than_its_rate_limit(
    miniircd, tmp_path
):
    """A CTCP request is a message like any other: the per-user rate limit applies.

    Before, CTCP was answered before the rate limit was checked: each
    ``\\x01VERSION\\x01`` cost the bot one NOTICE, without end.
    """
    async with irc_bot(miniircd.port, tmp_path, user_rate_limit=5) as (bot, *_):
        await asyncio.wait_for(bot.registered.wait(), 60)
        alice = await IRCTestClient.connect(miniircd.port, "alice")
        for _ in range(30):
            alice.privmsg("agentik", "\x01VERSION\x01")
        await alice.wait_for(lambda m: from_bot(m) and "too fast" in m.text)
        bob = await IRCTestClient.connect(miniircd.port, "bob")
        bob.privmsg("agentik", "\x01PING end\x01")
        await bob.wait_for(lambda m: from_bot(m) and m.text == "\x01PING end\x01")
        await alice.sync()  # every reply written before bob's has reached alice
        versions = [m for m in alice.received if from_bot(m) and "VERSION" in m.text]
        assert len(versions) == 5
        await alice.close()
        await bob.close()


async def test_ctcp_from_many_nicks_is_answered_at_most_ten_times_a_minute():
    """Many nicks (a botnet, a channel-wide CTCP) never make the bot flood: the
    replies have a budget of their own, and later lines are not held up."""
    async with ScriptedIRCServer(ACCOUNTS) as server:
        sink = RecordingSink()
        t = IRCTransport(name="s", settings={"port": server.port, "nick": "agentik", **FAST})
        await t.start(sink)
        try:
            await asyncio.wait_for(t.registered.wait(), 60)
            client = server.clients[0]
            for i in range(40):
                client.send(f":n{i}!u@h{i} PRIVMSG agentik :\x01VERSION\x01")
            await sentinel(server, sink, "all sent")  # the 40 were handled before it
            await t.send(OutgoingMessage(channel_key="irc:s:carol", text="marker", kind="notice"))
            await server.wait_for_line(
                lambda line: line.startswith("NOTICE carol") and "marker" in line
            )
            replies = [line for line in server.received if "VERSION agentik" in line]
            assert len(replies) == 10, replies
        finally:
            await t.aclose()


# -- review (rv-chat): our displayed host changes after we joined ----------------------------------

CLOAK = "agentik/bot/" + "c" * 51  # 63 bytes, as long as HOSTLEN allows


async def test_lines_are_cut_to_the_new_prefix_when_the_server_cloaks_our_host():
    """A network cloaks the bot after it logs in (396, or CHGHOST with the chghost cap).

    The budget of each line comes from our ``nick!user@host`` as the server
    relays it; before, only the JOIN echo taught the host, so after a cloak
    longer than the real host the server cut the end off every full line.
    """
    handler = registration_handler(caps_offered="chghost", isupport="NETWORK=Test")
    async with ScriptedIRCServer(handler) as server:
        sink = RecordingSink()
        t = IRCTransport(
            name="s", settings={"port": server.port, "nick": "agentik", "channels": ["#c"], **FAST}
        )
        await t.start(sink)
        try:
            await joined(t, "#c")
            assert "chghost" in t.caps_enabled
            client = server.clients[0]
            words = " ".join(f"word{i}" for i in range(400))
            for change, user in (
                (f":irc.scripted.test 396 agentik {CLOAK} :is now your displayed host", "~agentik"),
                (f":agentik!~agentik@{CLOAK} CHGHOST agentikbot {CLOAK}", "agentikbot"),
            ):
                client.send(change)
                await sentinel(server, sink, f"after {user}")  # the change was handled
                since = server.mark()
                await t.send(OutgoingMessage(channel_key="irc:s:#c", text=words, kind="notice"))
                await t.send(OutgoingMessage(channel_key="irc:s:#c", text="end", kind="notice"))
                await server.wait_for_line(lambda line: line == "NOTICE #c end", since=since)
                lines = [line for line in server.received[since:] if line.startswith("NOTICE #c")]
                relayed = [f":agentik!{user}@{CLOAK} {line}\r\n".encode() for line in lines]
                assert max(len(line) for line in relayed) <= 512
                sent = " ".join(line.partition(" :")[2] for line in lines[:-1])
                assert sent == words  # nothing cut off
        finally:
            await t.aclose()


# -- review (rv-chat): mass highlight ---------------------------------------------------------


async def test_an_answer_naming_the_whole_channel_highlights_only_five_of_them(miniircd, tmp_path):
    """Anyone can paste the nick list and ask the bot to repeat it: a mass highlight,
    which gets a bot kicked or banned.  Past five members an answer names, the
    others' nicks carry a zero-width space: they read the same, notify nobody."""
    async with irc_bot(miniircd.port, tmp_path, channels=["#c"]) as (bot, model, *_):
        await joined(bot, "#c")
        nicks = [f"m{i}" for i in range(1, 9)]
        people = [await IRCTestClient.connect(miniircd.port, n) for n in nicks]
        for person in people:
            await person.join("#c")
        alice = await IRCTestClient.connect(miniircd.port, "alice")
        await alice.join("#c")
        roll = "Roll call: " + ", ".join(nicks) + " and alice. Then again: m8!"
        model.enqueue(roll)
        alice.privmsg("#c", "agentik: repeat the nick list")
        line = await alice.wait_for(lambda m: from_bot(m) and "Roll call" in m.text)
        assert line.text.replace("\u200b", "") == f"alice: {roll}"
        named = [n for n in nicks if re.search(rf"(?<![\w\u200b]){n}(?![\w\u200b])", line.text)]
        assert named == nicks[:5]
        # Messages outside an answer (notices, command replies) count one by one.
        for group in (nicks[:4], nicks[4:]):
            text = "seen: " + " ".join(group)
            await bot.send(OutgoingMessage(channel_key="irc:testnet:#c", text=text, kind="notice"))
            notice = await alice.wait_for(lambda m, t=text: from_bot(m) and m.text == t)
            assert "\u200b" not in notice.text
        for person in people:
            await person.close()
        await alice.close()


# -- review (rv-chat): echo-message from a channel that strips formatting ----------------------


async def test_an_echo_with_formatting_stripped_still_confirms_the_line():
    """Channels with mode +c (Solanum, Libera) or +S (InspIRCd) strip formatting codes
    from what they relay, the sender's echo-message included.  The echo was
    compared with the line as written, never matched, and every answer with
    bold or code stayed unconfirmed in the outbox: a restart sent it again."""
    base = registration_handler(caps_offered="echo-message", isupport="NETWORK=Test")

    async def handler(client, line: str) -> None:
        if line.startswith("PRIVMSG #c :"):
            stripped = strip_formatting(line.partition(" :")[2])
            client.send(f":{client.prefix} PRIVMSG #c :{stripped}")
            return
        await base(client, line)

    async with ScriptedIRCServer(handler) as server:
        t = IRCTransport(
            name="s", settings={"port": server.port, "nick": "agentik", "channels": ["#c"], **FAST}
        )
        marks: list[tuple[int, str]] = []
        confirmed = asyncio.Event()

        def on_delivery(oid, state, awaits, ref):
            marks.append((oid, state))
            if state == "confirmed" and oid == 2:
                confirmed.set()

        t.on_delivery = on_delivery
        await t.start(RecordingSink())
        try:
            await joined(t, "#c")
            assert "echo-message" in t.caps_enabled
            for oid, text in ((1, "**bold** and `code`"), (2, "plain words")):
                message = OutgoingMessage(
                    channel_key="irc:s:#c", text=text, run_id="r1", outbox_id=oid,
                    reply_to={"target": "#c", "asker": "alice"},
                )  # fmt: skip
                await t.send(message)
            await asyncio.wait_for(confirmed.wait(), 60)  # echoes come back in order
            assert (1, "confirmed") in marks
        finally:
            await t.aclose()


# -- review (rv-chat): kicked from a channel ---------------------------------------------------


async def test_lines_for_a_channel_we_were_kicked_from_do_not_hold_up_the_others(ngircd, tmp_path):
    """Lines for a configured channel wait until the bot is (re)joined.  They waited
    at the head of the one queue: once an operator kicked the bot while a line
    for the channel was queued, nothing else was ever sent (private answers
    included) until the bot reconnected."""
    alice = await IRCTestClient.connect(ngircd.port, "alice")
    await alice.join("#ops")  # first in: alice is the channel operator
    async with irc_bot(ngircd.port, tmp_path, channels=["#ops"]) as (bot, model, *_):
        await joined(bot, "#ops")
        alice.send_raw("KICK #ops agentik :not here")
        await eventually(lambda: "#ops" not in bot.joined, "the kick from #ops")
        await bot.send(
            OutgoingMessage(channel_key="irc:testnet:#ops", text="for #ops", kind="notice")
        )
        assert bot.queued == 1  # held until the bot is back in #ops
        model.enqueue("a private answer")
        alice.privmsg("agentik", "are you there?")
        await alice.wait_for(lambda m: from_bot(m) and m.text == "a private answer")
        assert bot.queued == 1
    await alice.close()


# -- review (rv-chat): the asker's nick changes hands before the private answer --------------


async def test_a_private_answer_follows_the_asker_not_the_nick(ngircd, tmp_path):
    """A private answer went to the nick that asked, whoever held it by then: alice
    asks, changes nick or quits while the model works, mallory takes her nick and
    reads alice's answer.  Now it follows alice's renames and is not sent to a
    nick whose holder left (as far as the bot sees them: in a shared channel)."""
    async with irc_bot(ngircd.port, tmp_path, channels=["#c"]) as (bot, model, _, bridge):
        await joined(bot, "#c")
        alice = await IRCTestClient.connect(ngircd.port, "alice")
        mallory = await IRCTestClient.connect(ngircd.port, "mallory")
        for person in (alice, mallory):
            await person.join("#c")
        pings = 0

        async def seen_by_bot(person) -> None:
            """A CTCP PING answered: the bot has read everything sent before it."""
            nonlocal pings
            pings += 1
            person.privmsg("agentik", f"\x01PING {pings}\x01")
            await person.wait_for(lambda m: from_bot(m) and m.text == f"\x01PING {pings}\x01")

        async def rename(person, nick: str) -> None:
            person.send_raw(f"NICK {nick}")
            await person.wait_for(lambda m: m.command == "NICK" and m.text == nick)
            person.nick = nick

        # 1. alice -> alice2, then mallory takes "alice": the answer follows alice.
        held = Reply(text="the first secret", gate=asyncio.Event())
        model.enqueue(held)
        alice.privmsg("agentik", "tell me my secret")
        await held.started.wait()
        await rename(alice, "alice2")
        await rename(mallory, "alice")
        await seen_by_bot(mallory)
        held.gate.set()
        got = await alice.wait_for(lambda m: from_bot(m) and "first secret" in m.text)
        assert got.target == "alice2"

        # 2. alice (alice2) asks and quits, mallory takes "alice2": nobody gets it.
        held = Reply(text="the second secret", gate=asyncio.Event())
        model.enqueue(held)
        alice.privmsg("agentik", "and the other one?")
        await held.started.wait()
        alice.send_raw("QUIT :bye")
        await mallory.wait_for(lambda m: m.command == "QUIT" and m.nick == "alice2")
        await alice.close()
        await rename(mallory, "alice2")
        await seen_by_bot(mallory)
        held.gate.set()
        await bridge.flush("irc:testnet:alice2!*@*")
        await seen_by_bot(mallory)  # a line for mallory queued before would be here first
        assert not [m for m in mallory.received if from_bot(m) and "secret" in m.text]
        await mallory.close()


async def test_a_channel_answer_names_the_asker_under_their_new_nick(ngircd, tmp_path):
    """The first line of a channel answer names the asker: after a rename while the
    model worked, under the new nick (not the old one, which someone else may take)."""
    async with irc_bot(ngircd.port, tmp_path, channels=["#c"]) as (bot, model, *_):
        await joined(bot, "#c")
        alice = await IRCTestClient.connect(ngircd.port, "alice")
        await alice.join("#c")
        held = Reply(text="here you go", gate=asyncio.Event())
        model.enqueue(held)
        alice.privmsg("#c", "agentik: help me")
        await held.started.wait()
        alice.send_raw("NICK alice_away")
        await alice.wait_for(lambda m: m.command == "NICK" and m.text == "alice_away")
        alice.privmsg("agentik", "\x01PING 1\x01")  # answered: the bot has seen the rename
        await alice.wait_for(lambda m: from_bot(m) and m.text == "\x01PING 1\x01")
        held.gate.set()
        line = await alice.wait_for(lambda m: from_bot(m) and "here you go" in m.text)
        assert line.text == "alice_away: here you go"
        await alice.close()


def test_the_strings_channels_share_stay_bounded_under_a_flood_of_names():
    # Open channels share the strings they keep of a message (one speaker in many
    # channels: one object); a flood of distinct names from the network only ever
    # fills a bounded table (sys.intern kept them forever on Python 3.12.0-3.12.5).
    shared: Canonical[str] = Canonical(most=100)
    alice = shared("".join(["ali", "ce!a@host"]))
    assert shared("".join(["alice!a", "@host"])) is alice
    for i in range(10_000):
        assert shared(f"nick{i}!u@h") == f"nick{i}!u@h"
        assert len(shared) <= 100
