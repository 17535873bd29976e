"""Who may do what (issue 19, access): identities, roles, rules, through real transports.

IRC on a real server (miniircd: nobody has an account there) and on the
scripted server (services accounts by ``account-tag``), Slack through the
real slack-bolt stack against the fake Slack, HTTP through uvicorn and the
real ``httpx`` client; the model is the scripted one, whose requests show the
tools it was offered.  Roles given in chat are stored in real SQLite files.
"""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from agentik.bot.bridge import Bridge, ChannelOptions
from agentik.bot.cli import main
from agentik.bot.config import parse_config
from agentik.core import Agent, SQLiteStore, tool
from agentik.core.access import AccessPolicy, AccessRule, AccessSettings, RoleSettings
from agentik.core.errors import ConfigError
from agentik.core.testing.scripted import ScriptedModel
from agentik.transports.http.transport import HttpTransport
from agentik.transports.irc.wire import casefold
from agentik.transports.slack.transport import SlackTransport

from fakeslack import FakeSlack
from ircservers import IRCTestClient, ScriptedIRCServer, registration_handler
from rigs import eventually, from_bot, irc_bot, joined

pytest_plugins = ["ircservers"]

ACCOUNTS = registration_handler(
    caps_offered="account-tag message-tags",
    isupport="CASEMAPPING=rfc1459 CHANTYPES=#& NETWORK=Test",
)


@tool
async def read_notes() -> str:
    """Read the team's notes."""
    return "notes"


@tool
async def deploy() -> str:
    """Deploy the release."""
    return "deployed"


def offered(model: ScriptedModel, index: int = -1) -> list[str]:
    return sorted(t.name for t in model.requests[index].tools)


async def turns(model: ScriptedModel, n: int) -> None:
    """Wait until the model has been asked ``n`` times."""
    await eventually(lambda: len(model.requests) >= n, f"{n} model requests")


def policy(settings: AccessSettings, **types: str) -> AccessPolicy:
    return AccessPolicy(settings, types or {"testnet": "irc"}, irc_casefold=casefold)


@asynccontextmanager
async def guarded_bot(port: int, db: str, access: AccessPolicy, *, ambient=False, **settings):
    """:func:`rigs.irc_bot` on ``db`` with the ``read_notes``/``deploy`` tools, answering
    under ``access``."""
    async with irc_bot(
        port, Path(db).parent, db=db, options=ChannelOptions(command_prefix="!", ambient=ambient),
        agent_kw={"tools": [read_notes, deploy]}, bridge_kw={"access": access}, **settings,
    ) as bot:  # fmt: skip
        yield bot


# -- real IRC server: nobody has an account ----------------------------------------------------
async def test_an_ignored_hostmask_gets_no_answer_no_command_and_is_not_recorded(
    miniircd, tmp_path
):
    access = policy(AccessSettings(ignored=("testnet:mask:mallory!*@*",)))
    async with guarded_bot(miniircd.port, str(tmp_path / "a.db"), access, ambient=True,
                           channels=["#team"]) as (bot, model, agent, _):  # fmt: skip
        await joined(bot, "#team")
        mallory = await IRCTestClient.connect(miniircd.port, "mallory")
        alice = await IRCTestClient.connect(miniircd.port, "alice")
        await mallory.join("#team")
        await alice.join("#team")
        mallory.privmsg("#team", "agentik: answer me")
        mallory.privmsg("#team", "!help")
        mallory.privmsg("#team", "psst, the password is hunter2")
        mallory.privmsg("agentik", "answer me in private")
        await mallory.sync()
        alice.privmsg("#team", "agentik: hello")
        await alice.wait_for(lambda m: from_bot(m) and m.text == "alice: echo: hello")
        # One turn, alice's, and nothing of mallory's reached the model, not even as context.
        assert len(model.requests) == 1
        assert [m.content for m in model.requests[0].messages] == ["hello"]
        # The bot said nothing to or about mallory (its only line is alice's answer).
        await mallory.sync()
        said = [m.text for m in mallory.received if from_bot(m)]
        assert said == ["alice: echo: hello"]
        await mallory.close()
        await alice.close()


async def test_an_unverified_nick_matching_an_admins_account_gets_no_admin_rights(
    miniircd, tmp_path
):
    """``admins = ["testnet:account:alice"]``: a nick alice without an account is a user."""
    access = policy(
        AccessSettings(
            admins=("testnet:account:alice",),
            rules=[AccessRule(roles=("user",), tools=("read_*",))],
        )
    )
    async with guarded_bot(miniircd.port, str(tmp_path / "a.db"), access,
                           channels=["#team"]) as (bot, model, agent, bridge):  # fmt: skip
        await joined(bot, "#team")
        alice = await IRCTestClient.connect(miniircd.port, "alice")
        await alice.join("#team")
        alice.privmsg("#team", "!role bob admin")
        refused = await alice.wait_for(lambda m: from_bot(m) and "role" in m.text)
        assert refused.text == "!role is for admins"
        alice.privmsg("#team", "!ignore mask:*!*@*")
        refused = await alice.wait_for(lambda m: from_bot(m) and "ignore" in m.text)
        assert refused.text == "!ignore is for admins"
        # The model is offered what a user may use, not what an admin may.
        alice.privmsg("#team", "agentik: deploy please")
        await alice.wait_for(lambda m: from_bot(m) and m.text == "alice: echo: deploy please")
        assert offered(model) == ["read_notes"]
        assert bridge.access.grants == {}
        await alice.close()


async def test_a_tool_denied_to_users_is_never_offered_and_stop_of_anothers_answer_needs_admin(
    miniircd, tmp_path
):
    access = policy(AccessSettings(rules=[AccessRule(channels=("irc:testnet:#team",),
                                                     tools=("*", "-deploy"))]))  # fmt: skip
    async with guarded_bot(miniircd.port, str(tmp_path / "a.db"), access,
                           channels=["#team"]) as (bot, model, agent, bridge):  # fmt: skip
        await joined(bot, "#team")
        alice = await IRCTestClient.connect(miniircd.port, "alice")
        bob = await IRCTestClient.connect(miniircd.port, "bob")
        await alice.join("#team")
        await bob.join("#team")
        alice.privmsg("#team", "agentik: deploy the release")
        await alice.wait_for(lambda m: from_bot(m) and m.text.startswith("alice: echo"))
        assert offered(model) == ["read_notes"]
        # In a private message the rule does not apply: every tool is offered.
        alice.privmsg("agentik", "deploy the release")
        await alice.wait_for(lambda m: from_bot(m) and m.text == "echo: deploy the release")
        assert offered(model) == ["deploy", "read_notes"]
        # bob may not stop alice's answer (stop-others is for admins); alice may.
        from agentik.core.testing.scripted import Reply

        slow = Reply(text="word " * 100, hold_after=5)
        model.enqueue(slow)
        alice.privmsg("#team", "agentik: talk slowly")
        await slow.held.wait()
        bob.privmsg("#team", "!stop")
        refused = await bob.wait_for(lambda m: from_bot(m) and "stop" in m.text)
        assert refused.text == "only the asker (or an admin) may stop this answer"
        assert bridge.busy("irc:testnet:#team")
        alice.privmsg("#team", "!stop")
        await alice.wait_for(lambda m: from_bot(m) and "(interrupted)" in m.text)
        await alice.close()
        await bob.close()


# -- scripted IRC server: services accounts ----------------------------------------------------
async def test_roles_given_in_chat_apply_at_once_persist_across_a_restart_and_are_audited(
    tmp_path,
):
    db = str(tmp_path / "roles.db")
    settings = AccessSettings(
        owners=("testnet:account:alice",),
        roles={"deployer": RoleSettings()},
        rules=[
            AccessRule(roles=("deployer", "owner", "admin"), tools=("*",)),
            AccessRule(tools=("read_*",)),
            AccessRule(channels=("irc:testnet:#team",), roles=("user", "deployer"),
                       commands=("*", "-new")),
        ],
    )  # fmt: skip
    async with ScriptedIRCServer(ACCOUNTS) as server:
        async with guarded_bot(server.port, db, policy(settings),
                               channels=["#team"]) as (bot, model, agent, bridge):  # fmt: skip
            await joined(bot, "#team")
            client = server.clients[0]
            # bob speaks (with his account): a user, offered the reading tool only,
            # and !new is for admins in #team.
            client.send("@account=Bob :Bob!b@h PRIVMSG #team :agentik: deploy")
            await server.wait_for_line("PRIVMSG #team :Bob: echo: deploy")
            assert offered(model) == ["read_notes"]
            client.send("@account=Bob :Bob!b@h PRIVMSG #team :!new")
            await server.wait_for_line(lambda ln: "!new is not for users here" in ln)
            # Unverified "Alice" (no account tag) cannot give roles ...
            client.send(":Alice!x@elsewhere PRIVMSG #team :!role Bob deployer")
            await server.wait_for_line(lambda ln: "!role is for admins" in ln)
            # ... the owner, logged in, can: by nick (bob's account was seen) ...
            client.send("@account=alice :alice!a@h PRIVMSG #team :!role bob deployer")
            await server.wait_for_line(lambda ln: "testnet:account:bob: user → deployer" in ln)
            # ... and it applies to bob's next turn, without a restart.
            client.send("@account=BOB :BOB!b@h PRIVMSG #team :agentik: deploy now")
            await server.wait_for_line("PRIVMSG #team :BOB: echo: deploy now")
            assert offered(model) == ["deploy", "read_notes"]
            client.send("@account=alice :alice!a@h PRIVMSG #team :!ignore account:carol")
            await server.wait_for_line(lambda ln: "testnet:account:carol: user → ignored" in ln)
            client.send("@account=alice :alice!a@h PRIVMSG #team :!role dave admin")
            await server.wait_for_line(lambda ln: "I have not seen dave speak" in ln)
            client.send("@account=alice :alice!a@h PRIVMSG #team :!role bob owner")
            await server.wait_for_line(lambda ln: "owners are set in the configuration" in ln)
        # The same database, a new process: the roles are still there.
        async with guarded_bot(server.port, db, policy(settings),
                               channels=["#team"]) as (bot, model, agent, bridge):  # fmt: skip
            await joined(bot, "#team")
            client = server.clients[-1]
            client.send("@account=carol :carol!c@h PRIVMSG #team :agentik: hello?")
            client.send("@account=bob :bob!b@h PRIVMSG #team :agentik: deploy again")
            await server.wait_for_line("PRIVMSG #team :bob: echo: deploy again")
            assert len(model.requests) == 1  # carol is still ignored
            assert offered(model) == ["deploy", "read_notes"]
            client.send("@account=alice :alice!a@h PRIVMSG #team :!roles")
            await server.wait_for_line(
                lambda ln: (
                    "roles given in chat: testnet:account:bob deployer,"
                    " testnet:account:carol ignored" in ln
                )
            )
            client.send("@account=alice :alice!a@h PRIVMSG #team :!unignore carol")
            await server.wait_for_line(lambda ln: "I have not seen carol speak" in ln)
            client.send("@account=alice :alice!a@h PRIVMSG #team :!unignore account:Carol")
            await server.wait_for_line(lambda ln: "testnet:account:carol: ignored → user" in ln)
    with sqlite3.connect(db) as con:
        audit = con.execute(
            "SELECT actor, identity, old_role, new_role, channel FROM access_audit ORDER BY id"
        ).fetchall()
    assert audit == [
        ("testnet:account:alice", "testnet:account:bob", None, "deployer", "irc:testnet:#team"),
        ("testnet:account:alice", "testnet:account:carol", None, "ignored", "irc:testnet:#team"),
        ("testnet:account:alice", "testnet:account:carol", "ignored", None, "irc:testnet:#team"),
    ]


async def test_an_admin_cannot_change_another_admin_or_an_owner(tmp_path):
    settings = AccessSettings(owners=("testnet:account:alice",),
                              admins=("testnet:account:carol", "testnet:account:dan"))  # fmt: skip
    async with ScriptedIRCServer(ACCOUNTS) as server:
        async with guarded_bot(server.port, str(tmp_path / "a.db"), policy(settings),
                               channels=["#team"]) as (bot, model, agent, bridge):  # fmt: skip
            await joined(bot, "#team")
            client = server.clients[0]
            say = "@account=carol :carol!c@h PRIVMSG #team :"
            client.send(say + "!ignore account:alice")
            await server.wait_for_line(lambda ln: "is an owner (owners are set in the" in ln)
            client.send(say + "!role account:dan user")
            await server.wait_for_line(lambda ln: "is admin: only an owner changes that" in ln)
            client.send(say + "!role account:erin admin")
            await server.wait_for_line(lambda ln: "testnet:account:erin: user → admin" in ln)
            client.send(say + "!role account:erin user")  # erin is an admin now
            await server.wait_for_line(lambda ln: "erin is admin: only an owner changes" in ln)
            client.send(say + "!role account:frank wizard")
            await server.wait_for_line(lambda ln: "unknown role 'wizard'" in ln)
            assert set(bridge.access.grants) == {"testnet:account:erin"}
            # The owner can.
            client.send("@account=alice :alice!a@h PRIVMSG #team :!role account:dan user")
            await server.wait_for_line(lambda ln: "testnet:account:dan: admin → user" in ln)


# -- Slack ----------------------------------------------------------------------------------------
async def test_slack_roles_by_user_id_and_new_for_admins_only(tmp_path):
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        slack.add_user("U2", "bob")
        access = AccessPolicy(
            AccessSettings(
                admins=("slack:T1:U1",),
                rules=[AccessRule(roles=("user",), commands=("*", "-new"), tools=("read_*",))],
            ),
            {"slack": "slack"},
        )
        model = ScriptedModel()
        agent = Agent(llm=model, store=SQLiteStore(str(tmp_path / "s.db")),
                      tools=[read_notes, deploy])  # fmt: skip
        await agent.start()
        await access.load(agent.store)
        bridge = Bridge(agent, access=access)
        transport = SlackTransport(name="slack", settings={
            "bot_token": slack.bot_token, "app_token": slack.app_token, "api_url": slack.api_url,
            "state_file": str(tmp_path / "seen.sqlite3"), "streaming": "edit",
        })  # fmt: skip
        bridge.attach(transport, ChannelOptions(command_prefix="!"))
        await transport.start(bridge)
        try:
            top = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> start", user="U2")
            await slack.push_event(top)
            key = f"slack:T1:C1:{top['ts']}"
            await turns(model, 1)
            await bridge.flush(key)
            assert offered(model) == ["read_notes"]
            thread = {"thread_ts": top["ts"]}
            await slack.push_event(slack.message_event("C1", "!new", user="U2", **thread))
            await slack.wait_for_call(
                "chat.postMessage", lambda p: p.get("text") == "!new is not for users here"
            )
            # The admin (by user id) may start over, and names bob by mention.
            await slack.push_event(slack.message_event("C1", "!new", user="U1", **thread))
            await slack.wait_for_call(
                "chat.postMessage", lambda p: "started a new conversation" in p.get("text", "")
            )
            await slack.push_event(
                slack.message_event("C1", "!role <@U2> admin", user="U1", **thread)
            )
            await slack.wait_for_call(
                "chat.postMessage", lambda p: p.get("text") == "slack:T1:U2: user → admin"
            )
            await slack.push_event(slack.message_event("C1", "deploy", user="U2", **thread))
            await turns(model, 2)
            await bridge.flush(key)
            assert offered(model) == ["deploy", "read_notes"]
        finally:
            await transport.aclose()
            await bridge.aclose()
            await agent.aclose()


# -- HTTP ---------------------------------------------------------------------------------------
async def test_http_token_names_are_identities(tmp_path, monkeypatch):
    monkeypatch.setenv("CI_TOKEN", "c" * 32)
    monkeypatch.setenv("SPAM_TOKEN", "s" * 32)
    access = AccessPolicy(
        AccessSettings(
            ignored=("web:token:spam",),
            roles={"deployer": RoleSettings(members=("web:token:ci",))},
            rules=[AccessRule(roles=("deployer",), tools=("*",)), AccessRule(tools=("read_*",))],
        ),
        {"web": "http"},
    )
    model = ScriptedModel()
    agent = Agent(llm=model, store=SQLiteStore(str(tmp_path / "h.db")),
                  tools=[read_notes, deploy])  # fmt: skip
    await agent.start()
    bridge = Bridge(agent, access=access)
    transport = HttpTransport(name="web", settings={"port": 0, "tokens": [
        {"name": "ci", "env": "CI_TOKEN"}, {"name": "spam", "env": "SPAM_TOKEN"},
    ]})  # fmt: skip
    bridge.attach(transport)
    await transport.start(bridge)
    try:
        async with httpx.AsyncClient(base_url=transport.url + "/agentik", timeout=60) as http:
            for who, token in (("ci", "c" * 32), ("spam", "s" * 32)):
                auth = {"Authorization": f"Bearer {token}"}
                r = await http.post("/conversations", headers=auth, json={})
                assert r.status_code == 201, r.text
                cid = r.json()["id"]
                r = await http.post(f"/conversations/{cid}/messages", headers=auth,
                                    json={"content": "deploy"})  # fmt: skip
                if who == "spam":
                    assert r.status_code == 403
                    assert r.json()["error"]["code"] == "forbidden"
                    conv = await agent.get_conversation(cid)
                    assert await conv.messages() == []  # nothing stored
                    continue
                assert r.status_code == 202, r.text
                conv = await agent.get_conversation(cid)
                await conv.wait_idle()
                assert offered(model) == ["deploy", "read_notes"]
        assert len(model.requests) == 1
    finally:
        await transport.aclose()
        await bridge.aclose()
        await agent.aclose()


# -- configuration ---------------------------------------------------------------------------------
IRC = {"libera": {"type": "irc", "host": "irc.example", "tls": False}}


@pytest.mark.parametrize(
    ("access", "error"),
    [
        ({"admins": ["libera:alice"]}, "access.admins[0]: 'libera:alice': an IRC identity is"),
        (
            {"owners": ["freenode:account:x"]},
            "access.owners[0]: 'freenode:account:x': no transport",
        ),
        ({"ignored": ["libera:mask:bob"]}, "access.ignored[0]: 'libera:mask:bob': a mask is nick!"),
        ({"admins": ["alice"]}, "access.admins[0]: 'alice' is not an identity pattern"),
        ({"roles": {"ops": {"members": ["libera:nick:x"]}}}, "access.roles.ops.members[0]:"),
        ({"rules": [{"roles": ["wizard"]}]}, "access.rules[0].roles: unknown role 'wizard'"),
        ({"rules": [{"tool": ["x"]}]}, "access.rules.0.tool: unknown key"),
        ({"roles": {"admin": {}}}, "access.roles.admin: a role name is a word"),
        ({"rules": [{"roles": ["ignored"]}]}, "access.rules[0].roles: ignored speakers get"),
        ({"roles": {"x": {"rank": "owner"}}}, "access.roles.x.rank:"),
    ],
)
def test_configuration_errors_name_the_key(access, error):
    with pytest.raises(ConfigError) as exc:
        parse_config({"transports": IRC, "access": access}, env={})
    assert error in str(exc.value)


def test_identity_matching_per_transport():
    """Casefolding as the IRC server compares names; Slack and token names exactly."""
    from agentik.transports.base import IncomingMessage

    p = AccessPolicy(
        AccessSettings(
            owners=("libera:account:Alice[m]",),
            admins=("slack:U9", "web:token:ci", "libera:mask:*!*@trusted.example"),
            ignored=("libera:mask:*!*@*.spam.example", "term:*"),
        ),
        {"libera": "irc", "slack": "slack", "web": "http", "term": "stdio"},
        irc_casefold=casefold,
    )

    def irc(account, mask="n!u@h", cm="rfc1459"):
        return IncomingMessage(channel_key="irc:libera:#c", text="", author_id="x",
                               author_name=mask.partition("!")[0], verified=account is not None,
                               meta={"account": account, "hostmask": mask,
                                     "casemapping": cm})  # fmt: skip

    def msg(author, meta=None, verified=True):
        return IncomingMessage(channel_key="k", text="", author_id=author, author_name=author,
                               verified=verified, meta=meta or {})  # fmt: skip

    assert p.role_for("libera", irc("alice{m}"), "c") == "owner"
    assert p.role_for("libera", irc("ALICE[M]"), "c") == "owner"
    assert p.role_for("libera", irc("alice{m}", cm="ascii"), "c") == "user"  # [ and { differ
    assert p.role_for("libera", irc(None, "Alice[m]!a@h"), "c") == "user"  # a nick is no account
    assert p.role_for("libera", irc(None, "x!y@TRUSTED.example"), "c") == "admin"
    assert p.role_for("libera", irc(None, "x!y@a.spam.example"), "c") == "ignored"
    assert p.role_for("slack", msg("U9", {"team": "T1"}), "c") == "admin"
    assert p.role_for("slack", msg("u9", {"team": "T1"}), "c") == "user"
    assert p.role_for("web", msg("ci"), "c") == "admin"
    assert p.role_for("web", msg("CI"), "c") == "user"
    assert p.role_for("term", msg("me"), "c") == "ignored"
    assert p.role_for("term", msg("me", verified=False), "c") == "user"
    assert p.at_least("owner", "admin") and not p.at_least("user", "admin")


# -- agentik access ------------------------------------------------------------------------------
def test_access_cli_lists_roles_audit_and_checks_an_identity(tmp_path, capsys):
    db = tmp_path / "bot.db"
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f"""
[storage]
path = "{db}"
[transports.libera]
type = "irc"
host = "irc.example"
[access]
owners = ["libera:account:alice"]
ignored = ["libera:mask:*!*@spam.example"]
[access.roles.deployer]
members = ["libera:account:ci"]
[[access.rules]]
channels = ["irc:libera:#team"]
roles = ["user"]
tools = ["read_*"]
commands = ["*", "-new"]
""",
        encoding="utf-8",
    )
    config = parse_config({"storage": {"path": str(db)}, "transports": IRC}, env={})
    from agentik.bot.app import access_policy

    async def grant() -> None:
        p = access_policy(config)
        async with SQLiteStore(str(db)) as store:
            await p.load(store)
            await p.grant("libera:account:bob", "admin", by="libera:alice",
                          channel="irc:libera:#team")  # fmt: skip

    asyncio.run(grant())
    assert main(["access", "roles", "-c", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "owner      libera:account:alice  (configuration)" in out
    assert "deployer   libera:account:ci  (configuration)" in out
    assert "admin      libera:account:bob  (given by libera:alice" in out
    assert main(["access", "audit", "-c", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "libera:alice: libera:account:bob - → admin in irc:libera:#team" in out
    assert main(["access", "check", "-c", str(cfg), "libera:account:dave",
                 "--channel", "irc:libera:#team"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "role: user in irc:libera:#team" in out
    assert "tools: read_*" in out
    assert (
        "commands: stop, more, status, compact, budget, checkpoint, checkpoints, help, tool, "
        "approve, deny, approvals, answer, memory, forget, redact\n"
    ) in out
    assert main(["access", "check", "-c", str(cfg), "libera:account:Bob"]) == 0
    out = capsys.readouterr().out
    assert "role: admin" in out and "stop-others" in out and "role, ignore" in out
    assert main(["access", "check", "-c", str(cfg), "libera:mask:x!y@spam.example"]) == 0
    assert "role: ignored" in capsys.readouterr().out
    assert main(["access", "check", "-c", str(cfg), "libera:account:*"]) == 2
    assert "a pattern" in capsys.readouterr().err
    assert main(["check", "-c", str(cfg)]) == 0
    assert (
        "access: 1 owner pattern(s), 0 admin pattern(s), 1 ignored pattern(s), 1 named role(s),"
        " 1 rule(s)" in capsys.readouterr().out
    )


# -- after a crash ---------------------------------------------------------------------------------
async def test_a_turn_resumed_after_a_restart_keeps_its_askers_tool_limits(tmp_path):
    from agentik.core.testing.scripted import Reply
    from agentik.transports.testing.fake import FakeTransport

    db = str(tmp_path / "resume.db")
    user_rule = AccessRule(roles=("user",), tools=("read_*",))
    settings = AccessSettings(admins=("chat:boss",), rules=[user_rule])
    # Two people ask; the bot stops mid-answer (held), leaving both unanswered.
    held = [Reply(text="never finished", hold_after=1) for _ in range(2)]
    agent = await Agent(llm=ScriptedModel(held), store=SQLiteStore(db),
                        tools=[read_notes, deploy]).start()  # fmt: skip
    bridge = Bridge(agent, access=AccessPolicy(settings, {"chat": "fake"}))
    fake = FakeTransport(name="chat")
    bridge.attach(fake)
    await fake.start(bridge)
    await fake.say("agentik: deploy ops", channel="ops", user="pat")
    await fake.say("agentik: deploy dev", channel="dev", user="boss")
    async with asyncio.timeout(60):
        for r in held:
            await r.held.wait()
    assert sorted(offered(agent.llm, 0) + offered(agent.llm, 1)) == [
        "deploy", "read_notes", "read_notes"]  # fmt: skip
    await bridge.aclose()
    await agent.aclose()
    # The restart answers both, each with the tools its asker may use.
    model = ScriptedModel()
    agent = await Agent(llm=model, store=SQLiteStore(db), tools=[read_notes, deploy]).start()
    bridge = Bridge(agent, access=AccessPolicy(settings, {"chat": "fake"}))
    fake = FakeTransport(name="chat")
    bridge.attach(fake)
    await fake.start(bridge)
    try:
        assert (await bridge.resume_pending())["answer"] == 2
        async with asyncio.timeout(60):
            await bridge.flush(fake.key(channel="ops"))
            await bridge.flush(fake.key(channel="dev"))
        by_channel = {r.messages[-1].content: offered(model, i)
                      for i, r in enumerate(model.requests)}  # fmt: skip
        assert len(model.requests) == 2
        # pat is a user: the reading tool only; boss is an admin: every tool.
        assert by_channel == {"deploy ops": ["read_notes"], "deploy dev": ["deploy", "read_notes"]}
        assert fake.received(channel="ops") == ["echo: deploy ops"]
    finally:
        await bridge.aclose()
        await agent.aclose()


async def test_the_bot_loads_roles_given_in_chat_at_start(tmp_path):
    """``Bot`` builds the policy from ``[access]`` and loads the stored grants before
    the first message; a role given in chat is written to the same database."""
    from agentik.bot.app import Bot
    from agentik.transports.testing.fake import FakeTransport

    db = str(tmp_path / "bot.db")
    async with SQLiteStore(db) as store:
        await store.access_set("term:user:pat", "ignored", by="term:user:boss")
    config = parse_config({
        "llm": {"backend": "scripted"}, "storage": {"path": db},
        "memory": {"backend": "none"}, "compaction": {"enabled": False},
        "transports": {"term": {"type": "stdio"}},
        "access": {"admins": ["term:user:boss"]},
    }, env={})  # fmt: skip
    fake = FakeTransport(name="term")
    async with Bot(config, transports={"term": fake}) as bot:
        await fake.say("agentik: hello from pat", channel="c", user="pat")
        await fake.say("agentik: hello from sam", channel="c", user="sam")
        await bot.bridge.flush(fake.key(channel="c"))
        assert [r.messages[-1].content for r in bot.agent.llm.requests] == ["hello from sam"]
        await fake.say("!unignore pat", channel="c", user="boss")
        await fake.say("!role sam admin", channel="c", user="sam")
        await fake.say("agentik: hello again", channel="c", user="pat")
        await bot.bridge.flush(fake.key(channel="c"))
        assert fake.received(channel="c")[1:3] == ["term:user:pat: ignored → user",
                                                  "!role is for admins"]  # fmt: skip
        assert bot.agent.llm.requests[-1].messages[-1].content == "hello again"
    async with SQLiteStore(db) as store:
        assert await store.access_grants() == []
        assert [(c.actor, c.new_role) for c in await store.access_audit()] == [
            ("term:user:boss", None), ("term:user:boss", "ignored")]  # fmt: skip


async def test_the_role_commands_say_their_usage_show_roles_and_undo_only_chat_ignores(tmp_path):
    """``!role``, ``!ignore`` and ``!unignore`` naming nobody answer with their own
    usage; ``!role <who>`` shows the role; ``!ignore`` then ``!unignore`` round-trips;
    ``!unignore`` of someone not ignored in chat (or ignored by the configuration) says so."""
    from agentik.bot.app import Bot
    from agentik.transports.testing.fake import FakeTransport

    config = parse_config({
        "llm": {"backend": "scripted"}, "storage": {"path": str(tmp_path / "roles.db")},
        "memory": {"backend": "none"}, "compaction": {"enabled": False},
        "transports": {"term": {"type": "stdio"}},
        "access": {"admins": ["term:user:boss"], "ignored": ["term:user:spam"]},
    }, env={})  # fmt: skip
    fake = FakeTransport(name="term")
    async with Bot(config, transports={"term": fake}) as bot:
        for line in ("!role", "!ignore", "!unignore", "!role pat", "!ignore pat",
                     "!role pat", "!unignore pat", "!unignore pat", "!unignore spam"):  # fmt: skip
            await fake.say(line, channel="c", user="boss")
        await bot.bridge.flush(fake.key(channel="c"))
        assert fake.received(channel="c") == [
            "name someone; usage: !role <who> [<role>]",
            "name someone; usage: !ignore <who>",
            "name someone; usage: !unignore <who>",
            "term:user:pat is user",
            "term:user:pat: user → ignored",
            "term:user:pat is ignored",
            "term:user:pat: ignored → user",
            "term:user:pat is not ignored in chat",
            "term:user:spam is not ignored in chat (by the configuration: change it there)",
        ]


async def test_a_role_given_in_chat_that_the_configuration_dropped_counts_as_user(tmp_path, caplog):
    db = str(tmp_path / "dropped.db")
    async with SQLiteStore(db) as store:
        await store.access_set("chat:user:pat", "deployer", by="chat:user:boss")
        p = AccessPolicy(AccessSettings(rules=[AccessRule(roles=("user",), tools=("read_*",))]),
                         {"chat": "stdio"})  # fmt: skip
        with caplog.at_level("WARNING", logger="agentik.core.access"):
            await p.load(store)
    assert "which the configuration no longer defines" in caplog.text
    from agentik.transports.base import IncomingMessage

    pat = IncomingMessage(channel_key="stdio:chat", text="", author_id="pat", author_name="pat")
    decision = p.check("chat", pat, "stdio:chat")
    assert decision.role == "user" and not decision.may_use_tool("deploy")


async def test_budgets_count_by_the_role_the_access_policy_gives(tmp_path):
    """With ``[access]`` and ``[budgets]`` together an admin has the admin limits
    (unlimited here) and a user the user limits: the bridge asks the policy."""
    from agentik.bot.app import Bot
    from agentik.transports.testing.fake import FakeTransport

    config = parse_config({
        "llm": {"backend": "scripted"}, "storage": {"path": str(tmp_path / "b.db")},
        "memory": {"backend": "none"}, "compaction": {"enabled": False},
        "transports": {"term": {"type": "stdio"}},
        "access": {"admins": ["term:user:boss"]},
        "budgets": {"user": {"messages_per_minute": 1}},
    }, env={})  # fmt: skip
    fake = FakeTransport(name="term")
    async with Bot(config, transports={"term": fake}) as bot:
        for who in ("boss", "boss", "pat", "pat"):
            await fake.say(f"agentik: from {who}", channel=who, user=who)
            await bot.bridge.flush(fake.key(channel=who))
        asked = [r.messages[-1].content for r in bot.agent.llm.requests]
        assert asked == ["from boss", "from boss", "from pat"]
