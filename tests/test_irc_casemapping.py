"""IRC account matching under each ``CASEMAPPING`` (issue 28, item 2).

An owner pattern (``account:alice[m]``) must name the same account the
network means, whatever mapping the network announces: ``[`` and ``{`` are
one character under ``rfc1459`` and ``strict-rfc1459`` only, and an IRC
pattern's brackets are never a glob character class.  The bot runs against
the scripted IRC server (tests/ircservers.py) announcing each mapping, with
the real bridge and access policy; the role shows in the tools the scripted
model is offered (the owner alone is offered ``deploy``).
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager

from agentik.bot.bridge import Bridge, ChannelOptions
from agentik.core import Agent, SQLiteStore, tool
from agentik.core.access import AccessPolicy, AccessRule, AccessSettings
from agentik.core.testing.scripted import ScriptedModel
from agentik.transports.irc.transport import IRCTransport
from agentik.transports.irc.wire import casefold

from ircservers import IRCTestClient, ScriptedIRCServer, registration_handler
from rigs import FAST, eventually

pytest_plugins = ["ircservers"]

OWNERS = ("testnet:account:alice[m]", "testnet:account:jürgen")


@tool
async def read_notes() -> str:
    """Read the team's notes."""
    return "notes"


@tool
async def deploy() -> str:
    """Deploy the release."""
    return "deployed"


def owner_policy() -> AccessPolicy:
    settings = AccessSettings(
        owners=OWNERS,
        rules=[AccessRule(roles=("owner",), tools=("*",)), AccessRule(tools=("read_*",))],
    )
    return AccessPolicy(settings, {"testnet": "irc"}, irc_casefold=casefold)


@asynccontextmanager
async def bot_on(
    mapping: str, db: str, port: int | None = None, access: AccessPolicy | None = None
):
    if port is not None:  # a real server
        async with _bot(port, db, access or owner_policy()) as (transport, model):
            yield transport, model
        return
    handler = registration_handler(
        caps_offered="account-tag message-tags",
        isupport=f"CASEMAPPING={mapping} CHANTYPES=#& NETWORK=Test",
    )
    async with ScriptedIRCServer(handler) as server:
        async with _bot(server.port, db, owner_policy()) as (_, model):
            yield server, model


@asynccontextmanager
async def _bot(port: int, db: str, access: AccessPolicy):
    model = ScriptedModel()
    agent = Agent(llm=model, store=SQLiteStore(db), tools=[read_notes, deploy])
    await agent.start()
    bridge = Bridge(agent, access=access)
    transport = IRCTransport(name="testnet", settings={"port": port, "nick": "agentik", **FAST})
    bridge.attach(transport, ChannelOptions(command_prefix="!"))
    await transport.start(bridge)
    try:
        await asyncio.wait_for(transport.registered.wait(), 60)
        yield transport, model
    finally:
        await transport.aclose()
        await bridge.aclose()
        await agent.aclose()


async def offered_to(server: ScriptedIRCServer, model: ScriptedModel, account: str) -> list[str]:
    """The tools the model is offered for a private message from ``account``."""
    before = len(model.requests)
    server.clients[0].send(f"@account={account} :someone!u@h PRIVMSG agentik :hello {before}")
    await eventually(lambda: len(model.requests) > before, "the model to be asked")
    return sorted(t.name for t in model.requests[before].tools)


OWNER = ["deploy", "read_notes"]
USER = ["read_notes"]


async def test_an_account_pattern_names_the_account_the_network_means_under_each_mapping(
    tmp_path, caplog
):
    """Before: under ``rfc8265`` (Ergo) ``alice{m}`` was the owner (unknown mappings
    folded ``[`` to ``{`` as ``rfc1459``); under ``ascii`` the pattern was a glob, so
    ``alicem`` was the owner and the real ``alice[m]`` was refused."""
    cases = {
        # mapping: {account the network sends: the role's tools}
        "rfc8265": {"alice[m]": OWNER, "ALICE[M]": OWNER, "alice{m}": USER, "alicem": USER,
                    "JÜRGEN": OWNER,
                    "\uff2aÜ\uff32\uff27\uff25\uff2e": OWNER,  # fullwidth
                    "\uff4a\uff55\uff52\uff47\uff45\uff4e": USER, "jurgen": USER},
        "ascii": {"alice[m]": OWNER, "Alice[M]": OWNER, "alice{m}": USER, "alicem": USER,
                  "JÜRGEN": USER, "jürgen": OWNER},
        "rfc1459": {"alice[m]": OWNER, "ALICE{M}": OWNER, "alicem": USER},
        "strict-rfc1459": {"alice[m]": OWNER, "alice{M}": OWNER, "alicem": USER},
        # Unknown: A-Z folded only, nothing merged that the network may keep apart.
        "rfc9999": {"alice[m]": OWNER, "ALICE[m]": OWNER, "alice{m}": USER, "alicem": USER},
    }  # fmt: skip
    caplog.set_level(logging.WARNING)
    for mapping, accounts in cases.items():
        async with bot_on(mapping, str(tmp_path / f"{mapping}.db")) as (server, model):
            got = {account: await offered_to(server, model, account) for account in accounts}
            assert got == accounts, mapping
    unknown = [r.getMessage() for r in caplog.records if "CASEMAPPING=rfc9999" in r.getMessage()]
    assert unknown and "A-Z only" in unknown[0]


def test_casefold_rfc8265_is_the_precis_username_case_mapped_profile():
    # Width mapping, lower case, NFC (RFC 8265, section 3.3).
    assert casefold("\uff21\uff2c\uff29\uff23\uff25", "rfc8265") == "alice"  # fullwidth
    assert casefold("\uff76", "rfc8265") == "カ"  # halfwidth katakana
    assert casefold("A\u0308LICE", "rfc8265") == "älice"  # NFC: one code point
    assert casefold("ÄLICE", "rfc8265") == casefold("älice", "precis") == "älice"
    # Lower case, not case folding: Ergo keeps "straße" and "strasse" apart.
    assert casefold("STRAßE", "rfc8265") == "straße" != casefold("strasse", "rfc8265")
    # Brackets and their rfc1459 "lower case" stay distinct.
    assert casefold("Alice[m]\\~", "rfc8265") == "alice[m]\\~"
    assert casefold("Alice[m]\\~", "rfc7613") == "alice[m]\\~"
    # Unknown mappings fold A-Z only.
    assert casefold("Alice[m]\\~Ä", "no-such-mapping") == "alice[m]\\~Ä"
    assert casefold("Alice[m]", None) == "alice{m}"  # none announced: rfc1459 (RFC 2812)


def test_a_pattern_whose_meaning_depends_on_the_mapping_is_a_warning_at_start(caplog):
    caplog.set_level(logging.WARNING, logger="agentik.core.access")
    settings = AccessSettings(
        owners=("testnet:account:alice[m]", "testnet:account:bob"),
        ignored=("testnet:mask:*!*@*.example", "testnet:mask:troll^!*@*"),
    )
    AccessPolicy(settings, {"testnet": "irc"}, irc_casefold=casefold)
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2, warned
    assert warned[0].startswith("access.owners[0]: 'testnet:account:alice[m]' names different")
    assert "as 'alice{m}' under rfc1459" in warned[0] and "'alice[m]' under ascii" in warned[0]
    assert warned[1].startswith("access.ignored[1]: 'testnet:mask:troll^!*@*'")


def test_irc_mask_brackets_are_literal():
    """``mask:`` patterns are IRC masks: ``*`` and ``?`` only, brackets are nick characters."""
    from agentik.transports.base import IncomingMessage

    p = AccessPolicy(
        AccessSettings(ignored=("testnet:mask:troll[x]!*@*",)), {"testnet": "irc"},
        irc_casefold=casefold,
    )  # fmt: skip

    def role(mask: str) -> str:
        message = IncomingMessage(channel_key="irc:testnet:#c", text="", author_id="x",
                                  author_name=mask.partition("!")[0], verified=False,
                                  meta={"hostmask": mask, "casemapping": "ascii"})  # fmt: skip
        return p.role_for("testnet", message, "irc:testnet:#c")

    assert role("troll[x]!u@h") == "ignored"
    assert role("TROLL[X]!u@h") == "ignored"
    assert role("trollx!u@h") == "user"
    # Named in chat as a full pattern: one identity (before: "a pattern"), folded as
    # the network last announced.
    assert p.resolve("testnet:account:Alice[m]", "testnet") == "testnet:account:alice[m]"


async def test_a_mask_with_brackets_on_real_servers_ignores_whom_the_server_means(
    irc_server, tmp_path
):
    """``mask:troll[x]!*@*`` on ngircd (``CASEMAPPING=ascii``) and miniircd (none
    announced: ``rfc1459``).  Before: under ``ascii`` ``[x]`` was a character class,
    so ``trollx`` was ignored and ``troll{x}`` too was compared wrongly."""
    access = AccessPolicy(AccessSettings(ignored=("testnet:mask:troll[x]!*@*",)),
                          {"testnet": "irc"}, irc_casefold=casefold)  # fmt: skip
    ascii_server = irc_server.name == "ngircd"
    async with bot_on("", str(tmp_path / "m.db"), irc_server.port, access) as (bot, model):
        assert bot.isupport.get("CASEMAPPING") == ("ascii" if ascii_server else None)
        for nick in ("troll[x]", "trollx", "TROLL{X}", "bob"):
            client = await IRCTestClient.connect(irc_server.port, nick, user="u")
            client.privmsg("agentik", f"hello from {nick}")
            await client.sync()
            await client.close()
        # bob is answered; every line before his reached the bot first.
        await eventually(
            lambda: any("hello from bob" in str(r.messages[-1].content) for r in model.requests),
            "bob to be answered",
        )
        answered = sorted(str(r.messages[-1].content) for r in model.requests)
    expected = ["hello from bob", "hello from trollx"]
    if ascii_server:
        expected.insert(0, "hello from TROLL{X}")  # a different nick there
    assert answered == sorted(expected)


def test_a_key_named_without_a_message_is_compared_under_the_networks_mapping():
    """``!role``/``!ignore`` check the named key's configured role (an owner cannot
    be changed): on an rfc8265 network ``alice{m}`` is not the owner ``alice[m]``."""
    from agentik.transports.base import IncomingMessage

    p = owner_policy()
    hello = IncomingMessage(channel_key="irc:testnet:bob", text="", author_id="bob",
                            author_name="bob", verified=True,
                            meta={"account": "bob", "casemapping": "rfc8265"})  # fmt: skip
    p.role_for("testnet", hello, "irc:testnet:bob")  # the network's mapping, seen
    meta = {"casemapping": "rfc8265"}
    assert p.role_of_key(p.resolve("account:alice{m}", "testnet", meta)) == "user"
    assert p.role_of_key(p.resolve("account:ALICE[m]", "testnet", meta)) == "owner"
