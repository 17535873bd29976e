"""One front door (issue 30, gate): chat and HTTP admit by the same gate.

A real IRC server (miniircd: nobody has an account there, so the operator
vouches for a hostmask), the real uvicorn server and ``httpx`` client, a real
SQLite file, the scripted model.  One ``[access]`` rule — users get no answer
— is applied by the same :class:`~agentik.core.gate.Gate` whether the message
comes as an IRC line or as an HTTP post; the transports see their host only
through :class:`~agentik.transports.base.AgentHost`.
"""

from __future__ import annotations

from contextlib import asynccontextmanager

import httpx

from agentik.bot.bridge import Bridge, ChannelOptions
from agentik.core import Agent, SQLiteStore
from agentik.core.access import AccessPolicy, AccessRule, AccessSettings
from agentik.core.budgets import BudgetLimits, Budgets, BudgetSettings, UnverifiedLimits
from agentik.core.gate import Gate, Speaker
from agentik.core.testing.scripted import ScriptedModel
from agentik.transports.base import (
    AgentHost,
    BasicHost,
    IncomingMessage,
    OutgoingMessage,
    Transport,
    host_of,
)
from agentik.transports.http.transport import HttpTransport
from agentik.transports.irc.wire import casefold

from ircservers import IRCTestClient
from rigs import asked_and_answered, from_bot, irc_transport, joined

pytest_plugins = ["ircservers"]

BOSS, PLEB = "b" * 32, "p" * 32


def users_get_no_answer() -> AccessPolicy:
    """Admins (a hostmask the operator vouches for on IRC, a token over HTTP) are
    answered; everyone else ranks as ``user`` and gets no answer, anywhere."""
    return AccessPolicy(
        AccessSettings(
            admins=("testnet:mask:boss!*@*", "web:token:boss"),
            rules=[AccessRule(roles=("user",), answer=False)],
        ),
        {"testnet": "irc", "web": "http"},
        irc_casefold=casefold,
    )


@asynccontextmanager
async def front_doors(port: int, db: str, monkeypatch):
    """One bridge, one gate, two front doors: IRC in ``#team`` and the HTTP API."""
    monkeypatch.setenv("BOSS_TOKEN", BOSS)
    monkeypatch.setenv("PLEB_TOKEN", PLEB)
    model = ScriptedModel()
    store = SQLiteStore(db)
    agent = Agent(llm=model, store=store)
    await agent.start()
    access = users_get_no_answer()
    await access.load(store)
    bridge = Bridge(agent, access=access)
    irc = irc_transport(port, channels=["#team"])
    web = HttpTransport(name="web", settings={"port": 0, "tokens": [
        {"name": "boss", "env": "BOSS_TOKEN"}, {"name": "pleb", "env": "PLEB_TOKEN"},
    ]})  # fmt: skip
    bridge.attach(irc, ChannelOptions(command_prefix="!"))
    bridge.attach(web)
    await irc.start(bridge)
    await web.start(bridge)
    try:
        yield model, agent, bridge, irc, web
    finally:
        await web.aclose()
        await irc.aclose()
        await bridge.aclose()
        await agent.aclose()


async def test_one_rule_refuses_and_admits_over_irc_and_http_alike(miniircd, tmp_path, monkeypatch):
    async with front_doors(miniircd.port, str(tmp_path / "g.db"), monkeypatch) as (
        model, agent, bridge, irc, web,
    ):  # fmt: skip
        # -- IRC: alice (a user) is refused, boss (an admin by hostmask) admitted ------
        await joined(irc, "#team")
        alice = await IRCTestClient.connect(miniircd.port, "alice")
        boss = await IRCTestClient.connect(miniircd.port, "boss")
        try:
            await alice.join("#team")
            await boss.join("#team")
            alice.privmsg("#team", "agentik: what is the plan?")
            await alice.sync()  # relayed to the bot before boss speaks
            boss.privmsg("#team", "agentik: ship it")
            await asked_and_answered(model, 1, bridge, "irc:testnet:#team")
            conv = await agent.conversation_for_channel("irc:testnet:#team")
            said = [m.content for m in await conv.messages() if m.kind == "user"]
            # The channel's arrivals are taken in order: alice's went first, and the
            # gate refused it (not answered, not even recorded).
            assert said == ["ship it"]
        finally:
            await alice.close()
            await boss.close()

        # -- HTTP: the same rule, the same gate ---------------------------------------------
        async with httpx.AsyncClient(base_url=f"{web.url}/agentik", timeout=60) as http:
            for token, status in ((PLEB, 403), (BOSS, 202)):
                auth = {"Authorization": f"Bearer {token}"}
                r = await http.post("/conversations", headers=auth, json={})
                assert r.status_code == 201, r.text
                cid = r.json()["id"]
                r = await http.post(f"/conversations/{cid}/messages", headers=auth,
                                    json={"content": "ship it too"})  # fmt: skip
                assert r.status_code == status, r.text
                if status == 403:
                    assert r.json()["error"] == {
                        "code": "forbidden", "message": "this token may not ask the bot here",
                    }  # fmt: skip
                    assert await (await agent.get_conversation(cid)).messages() == []
                else:
                    await (await agent.get_conversation(cid)).wait_idle()
        assert len(model.requests) == 2

        # Both front doors asked one gate: the bridge's, as its host declares it.
        gate = bridge.gate
        assert isinstance(bridge, AgentHost)
        pleb = Speaker(transport="web", id="pleb", name="pleb")
        assert not gate.decide(pleb, "http:web:pleb:x").answer
        unverified_boss = Speaker(transport="testnet", id="boss", name="boss", verified=False,
                                  meta={"hostmask": "boss!~b@127.0.0.1"})  # fmt: skip
        assert gate.decide(unverified_boss, "irc:testnet:#team").answer


async def test_a_reload_gives_the_gate_its_new_policy_at_the_next_message(tmp_path):
    """The gate is read from the host at each message: a new ``[access]`` policy (a
    SIGHUP reload replaces the bridge's) decides at once, for every front door."""
    agent = Agent(llm=ScriptedModel(), store=SQLiteStore(str(tmp_path / "r.db")))
    await agent.start()
    try:
        bridge = Bridge(agent, access=AccessPolicy(AccessSettings(), {"web": "http"}))
        ci = Speaker(transport="web", id="ci", name="ci")
        assert bridge.gate.decide(ci, "http:web:ci:1").answer
        assert not bridge.gate.admin(ci, "http:web:ci:1")
        bridge.access = AccessPolicy(AccessSettings(admins=("web:token:ci",)), {"web": "http"})
        bridge.role_for = bridge.access.role_for
        assert bridge.gate.admin(ci, "http:web:ci:1")
        await bridge.aclose()
    finally:
        await agent.aclose()


class _Recorder(Transport):
    type = "recorder"

    async def start(self, sink) -> None:
        self.host = host_of(sink)

    async def send(self, message: OutgoingMessage) -> None:
        pass


async def test_a_plain_sink_gets_a_basic_host_with_documented_defaults(tmp_path):
    """A transport started by a sink that is no :class:`AgentHost` (the conformance
    kit's recorder, a plugin's own) gets a :class:`BasicHost`: no rules (everyone a
    ``user``), no budgets, the transport's own command prefix, never busy."""
    got: list[IncomingMessage] = []

    class Sink:
        async def handle(self, message: IncomingMessage, transport: Transport) -> None:
            got.append(message)

    transport = _Recorder(name="rec")
    await transport.start(Sink())
    host = transport.host
    assert isinstance(host, BasicHost) and isinstance(host, AgentHost)
    assert host.agent is None and host.database is None and host.metrics is None
    assert host.allowed_tools(transport) is None
    assert host.options_for(transport).command_prefix == "!"
    assert (await host.effective("rec:x", transport)).options.command_prefix == "!"
    assert not host.busy("rec:x") and not await host.interrupt("rec:x")
    await host.flush("rec:x")
    speaker = Speaker(transport="rec", id="u", name="u")
    assert isinstance(host.gate, Gate) and host.gate.role(speaker, "rec:x") == "user"
    ticket = await host.gate.admit(speaker, "rec:x", chars=5)
    assert ticket.admitted and ticket.subject is None
    message = IncomingMessage(channel_key="rec:x", text="hi", author_id="u", author_name="u")
    await host.handle(message, transport)
    assert got == [message]

    # An AgentAccess sink's agent and tools come through; its database is the file.
    agent = Agent(llm=ScriptedModel(), store=SQLiteStore(str(tmp_path / "b.db")))

    class Access(Sink):
        def __init__(self) -> None:
            self.agent = agent

        def allowed_tools(self, transport: Transport) -> tuple[str, ...] | None:
            return ("clock",)

    await transport.start(Access())
    assert transport.host.agent is agent
    assert transport.host.allowed_tools(transport) == ("clock",)
    assert transport.host.database == str(tmp_path / "b.db")
    # A plain agent served without the bot: the minimal host of that agent.
    plain = BasicHost(Sink(), agent=agent)
    assert plain.agent is agent and plain.database == str(tmp_path / "b.db")
    assert plain.allowed_tools(transport) is None


class Clock:
    """The budgets' clock, held still (2026-12-01 13:59:30 UTC): no window ends mid-test."""

    def __init__(self, now: float = 1_796_133_570.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def test_one_budget_refuses_over_irc_and_http_alike(miniircd, tmp_path, monkeypatch):
    """The gate's budget step, through both front doors: one message a minute each;
    the second gets the chat's one notice on IRC and a 429 over HTTP, and neither
    reaches the model or the log."""
    monkeypatch.setenv("CI_TOKEN", "c" * 32)
    settings = BudgetSettings(user=BudgetLimits(messages_per_minute=1),
                              unverified=UnverifiedLimits(messages_per_minute=1))  # fmt: skip
    model = ScriptedModel()
    agent = Agent(llm=model, store=SQLiteStore(str(tmp_path / "b.db")))
    await agent.start()
    bridge = Bridge(agent, budgets=Budgets(settings, agent.store, clock=Clock()))
    irc = irc_transport(miniircd.port, channels=["#b"])
    web = HttpTransport(name="web", settings={"port": 0, "tokens": [
        {"name": "ci", "env": "CI_TOKEN"}]})  # fmt: skip
    bridge.attach(irc, ChannelOptions(command_prefix="!"))
    bridge.attach(web)
    await irc.start(bridge)
    await web.start(bridge)
    try:
        await joined(irc, "#b")
        alice = await IRCTestClient.connect(miniircd.port, "alice")
        try:
            await alice.join("#b")
            alice.privmsg("#b", "agentik: one")
            await alice.wait_for(lambda m: from_bot(m) and m.text == "alice: echo: one")
            alice.privmsg("#b", "agentik: two")
            notice = await alice.wait_for(from_bot)
            assert notice.text == (
                "alice: message budget used up (1 a minute) for unverified speakers on testnet;"
                " resets at 14:00 UTC"
            )
        finally:
            await alice.close()
        auth = {"Authorization": "Bearer " + "c" * 32}
        api = f"{web.url}/agentik"
        async with httpx.AsyncClient(base_url=api, timeout=60, headers=auth) as http:
            cid = (await http.post("/conversations", json={})).json()["id"]
            path = f"/conversations/{cid}/messages"
            assert (await http.post(path, json={"content": "one"})).status_code == 202
            await (await agent.get_conversation(cid)).wait_idle()
            r = await http.post(path, json={"content": "two"})
            assert r.status_code == 429, r.text
            assert r.json()["error"]["code"] == "budget_exceeded"
            assert "message budget used up (1 a minute)" in r.json()["error"]["message"]
            texts = [m["content"] for m in (await http.get(path)).json()["items"]]
            assert texts == ["one", "echo: one"]
        assert len(model.requests) == 2
    finally:
        await web.aclose()
        await irc.aclose()
        await bridge.aclose()
        await agent.aclose()


def test_rights_read_the_same_rule_for_every_front_door():
    """The rights over what exists already, one rule each (agentik.core.access), as the
    gate applies them to a speaker: owners rank above admins everywhere."""
    gate = Gate(AccessPolicy(
        AccessSettings(owners=("web:token:olga",), admins=("web:token:adam",)), {"web": "http"},
    ))  # fmt: skip
    olga, adam, eve = (Speaker(transport="web", id=n, name=n) for n in ("olga", "adam", "eve"))
    anon = Speaker(transport="web", id="eve", name="eve", verified=False)
    key = "http:web:eve:1"
    # Redact: the author, or admin and above.
    assert gate.may_redact(eve, key, "web:eve") and not gate.may_redact(eve, key, "web:bob")
    assert gate.may_redact(olga, key, "web:bob") and gate.may_redact(adam, key, "web:bob")
    assert not gate.may_redact(anon, key, "web:eve")  # an unverified name owns nothing
    # Stop: nobody known asked, the asker, or stop-others (admins by default).
    assert gate.may_stop(eve, key, None) and gate.may_stop(eve, key, "web:eve")
    assert not gate.may_stop(eve, key, "web:bob") and gate.may_stop(olga, key, "web:bob")
    # Forget: a channel's note or one's own; a global or another's note needs admin.
    assert gate.may_forget(eve, key, "channel:x", "user:web:eve")
    assert gate.may_forget(eve, key, "user:web:eve", "user:web:eve")
    assert not gate.may_forget(eve, key, "global", "user:web:eve")
    assert gate.may_forget(adam, key, "global", "user:web:adam")
    # Decide an approval asked of admins; approving one's own needs self_approve.
    ask = {"approvers": "admin", "asker_id": "web:adam", "self_approve": False}
    assert not gate.may_decide(eve, key, approve=False, **ask)
    assert gate.may_decide(olga, key, approve=True, **ask)
    assert gate.may_decide(adam, key, approve=False, **ask)
    assert not gate.may_decide(adam, key, approve=True, **ask)
    assert gate.may_decide(adam, key, approve=True, **{**ask, "self_approve": True})
