"""Redaction: a message's text is replaced by a tombstone everywhere it was stored
(audit log, working memory, derived notes, the database file itself), the act is
audited, and the ``before_store`` hook scrubs secrets before anything is written."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from agentik.bot.bridge import Bridge, ChannelOptions
from agentik.core import Agent, OpenAIBackend, SQLiteStore
from agentik.core.background import MemoryWorker
from agentik.core.errors import NotFound
from agentik.core.hookspecs import hookimpl
from agentik.core.memory import BackgroundPolicy
from agentik.core.memory.sqlite import SQLiteMemory
from agentik.core.redaction import PatternScrubber, RedactionError, RedactionSettings
from agentik.core.testing.openai_server import FakeOpenAIServer, Reply
from agentik.transports.testing import MemoryTransport

from rigs import asked_and_answered

SECRET = "zq7-unique-hunter2-passphrase-X91"


def ok(request) -> str:
    """A model that never repeats what it was told."""
    return "ok"


def texts_of(body: dict) -> list[str]:
    out = []
    for m in body["messages"]:
        c = m.get("content")
        if isinstance(c, list):
            c = " ".join(p.get("text", "") for p in c)
        out.append(c or "")
    return out


def raw_db_bytes(path: str) -> bytes:
    data = b""
    for p in (path, path + "-wal", path + "-journal"):
        if os.path.exists(p):
            with open(p, "rb") as f:
                data += f.read()
    return data


class OutboxTransport(MemoryTransport):
    """Persists its outgoing pieces in the bridge's outbox, as IRC and Slack do."""

    outbox = True


class Rig:
    def __init__(
        self, server: FakeOpenAIServer, db_path: str, plugins=(), reflect=False, outbox=False
    ):
        self.server = server
        self.db_path = db_path
        llm = OpenAIBackend(
            model="fake-model", base_url=server.base_url, api_key="sk-test", max_retries=2,
            timeout=60,
        )  # fmt: skip
        self.store = SQLiteStore(db_path)
        self.worker = MemoryWorker(BackgroundPolicy(mining=False, reflection_debounce=0))
        self.agent = Agent(
            llm=llm,
            store=self.store,
            memory=SQLiteMemory(self.store),
            background=[self.worker] if reflect else (),
            hooks=list(plugins),
        )
        self.bridge = Bridge(self.agent)
        self.t = (OutboxTransport if outbox else MemoryTransport)(name="net")

    async def __aenter__(self) -> Rig:
        await self.agent.start()
        self.bridge.attach(self.t, ChannelOptions(command_prefix="!", answer="all"))
        await self.t.start(self.bridge)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.bridge.aclose()
        await self.agent.aclose()

    async def say(self, text: str, author: str = "alice", channel: str = "net:#a") -> None:
        await self.t.inject(text, channel_key=channel, author=author)
        await self.bridge.flush(channel)


@pytest.fixture
async def server():
    async with FakeOpenAIServer(model="fake-model") as s:
        s.default = lambda body: Reply.text("noted")
        yield s


async def test_redaction_removes_the_text_everywhere(server, db_path):
    async with Rig(server, db_path, reflect=True) as rig:
        await rig.say(f"my password is {SECRET}, keep it safe")
        conv = await rig.agent.conversation_for_channel("net:#a")
        [msg] = [m for m in await conv.messages() if SECRET in m.content]
        # The reflection on this conversation quotes the secret: a derived note.
        server.enqueue(Reply.text(f"Alice shared her password {SECRET}."))
        await rig.say("!new")
        await asyncio.wait_for(rig.worker.wait_for("reflection"), 60)
        [note] = await rig.agent.memory.list(["channel:net:#a"])
        assert SECRET in note.text
        await rig.agent.memory.save(note.scope, note.text + " (edited)", note_id=note.id)
        assert [n.id for n in await rig.agent.memory.search(SECRET)] == [note.id]

        done = await rig.agent.redact(conv.id, msg.id, by="admin:carol", reason="leaked password")
        assert done.notes_removed == 1

        # The audit log keeps a tombstone: who, when, why; the text is gone.
        [row] = [m for m in await conv.messages() if m.id == msg.id]
        assert SECRET not in row.content
        assert row.content.startswith("[message redacted by admin:carol at ")
        assert "leaked password" in row.content
        # The audit row.
        [audit] = await rig.store.redactions(conv.id)
        assert (audit.message_id, audit.by, audit.reason, audit.notes_removed) == (
            msg.id, "admin:carol", "leaked password", 1,
        )  # fmt: skip
        # Derived notes: gone with every version, and from the FTS index.
        assert await rig.agent.memory.get(note.id, include_deleted=True) is None
        assert await rig.agent.memory.search(SECRET) == []
        assert await rig.agent.memory.search("password Alice") == []
        # Working memory: the stored context carries the tombstone.
        wm = await conv.working_memory()
        assert not any(SECRET in m.content for m in wm)
        assert any(m.content == row.content for m in wm)
        # Redacting twice is a clear error; unknown messages are NotFound.
        with pytest.raises(RedactionError, match="already redacted"):
            await rig.agent.redact(conv.id, msg.id, by="admin:carol")
        with pytest.raises(NotFound):
            await rig.agent.redact(conv.id, 999_999, by="admin:carol")
    # The database file (and its WAL) hold no trace of the text.
    data = raw_db_bytes(db_path)
    assert SECRET.encode() not in data
    assert b"hunter2" not in data


async def test_the_next_request_carries_the_tombstone_not_the_text(server, db_path):
    async with Rig(server, db_path) as rig:
        await rig.say(f"the token is {SECRET}")
        conv = await rig.agent.conversation_for_channel("net:#a")
        [msg] = [m for m in await conv.messages() if SECRET in m.content]
        assert any(SECRET in t for t in texts_of(server.requests[-1]))
        await rig.agent.redact(conv.id, msg.id, by="alice", reason="oops")
        # Checked before the process closes: the raw file is clean at once.
        assert SECRET.encode() not in raw_db_bytes(db_path)
        await rig.say("what did I just say?")
        sent = texts_of(server.requests[-1])
        assert not any(SECRET in t for t in sent)
        assert any("[message redacted by alice at " in t and "oops" in t for t in sent)


async def test_redacting_an_answer_that_repeated_the_secret(server, db_path):
    server.default = lambda body: Reply.text(f"Got it: {SECRET}")
    async with Rig(server, db_path, outbox=True) as rig:
        await rig.say(f"remember {SECRET}")
        assert rig.t.texts("answer")[-1] == f"Got it: {SECRET}"
        conv = await rig.agent.conversation_for_channel("net:#a")
        leaks = [m for m in await conv.messages() if SECRET in m.content]
        assert [m.kind for m in leaks] == ["user", "assistant"]
        for m in leaks:
            await rig.agent.redact(conv.id, m.id, by="admin:carol")
        # Gone from the audit log, the working memory and the channel outbox.
        assert SECRET.encode() not in raw_db_bytes(db_path)
        await rig.say("and now?")
        assert not any(SECRET in t for t in texts_of(server.requests[-1]))


async def test_a_queued_message_redacted_before_its_turn_never_reaches_the_model(server, db_path):
    held = Reply.text("first answer", chunks=2, hold_after=1)
    server.enqueue(held)
    async with Rig(server, db_path) as rig:
        conv = await rig.agent.conversation_for_channel("net:#q")
        await conv.send("first", author="alice")
        await held.wait_held()  # the first turn is mid-answer
        await conv.send(f"second {SECRET}", author="alice")  # queued behind it
        [queued] = [m for m in await conv.messages() if SECRET in m.content]
        await rig.agent.redact(conv.id, queued.id, by="alice")
        held.release()
        async with asyncio.timeout(60):
            await server.wait_requests(2)
            await conv.wait_idle()
        sent = texts_of(server.requests[1])
        assert not any(SECRET in t for t in sent)
        assert any("[message redacted by alice at " in t for t in sent)
    assert SECRET.encode() not in raw_db_bytes(db_path)


async def test_the_append_only_trigger_allows_only_a_redaction(server, db_path):
    import sqlite3

    async with Rig(server, db_path) as rig:
        await rig.say("hello there")
    conn = sqlite3.connect(db_path)
    try:
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            conn.execute("UPDATE message SET content = 'changed' WHERE id = 1")
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            conn.execute("UPDATE message SET content = 'x', author = 'mallory', redacted = 1")
        conn.execute("UPDATE message SET content = '[gone]', redacted = 1 WHERE id = 1")
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            conn.execute("UPDATE message SET content = 'back', redacted = 0 WHERE id = 1")
    finally:
        conn.close()


async def test_the_scrubber_replaces_a_pasted_key_before_the_db_and_the_model(server, db_path):
    key = "sk-proj-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4"
    scrubber = PatternScrubber(RedactionSettings(scrub=True))
    async with Rig(server, db_path, plugins=[scrubber]) as rig:
        await rig.say(f"use this key: {key} please")
        conv = await rig.agent.conversation_for_channel("net:#a")
        stored = [m.content for m in await conv.messages()]
        assert "use this key: [redacted:openai-key] please" in stored
        sent = texts_of(server.requests[-1])
        assert any("[redacted:openai-key]" in t for t in sent)
        assert not any(key in t for t in sent)
        note = await rig.agent.memory.save("global", f"the key is {key}")
        assert note.text == "the key is [redacted:openai-key]"
    assert key.encode() not in raw_db_bytes(db_path)


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("xoxb-1234567890-abcdefghijkl", "slack-token"),
        ("ghp_" + "a" * 36, "github-token"),
        ("AKIAIOSFODNN7EXAMPLE", "aws-key"),
        (
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
            "jwt",
        ),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----", "private-key"),
    ],
)
def test_the_builtin_patterns(text, kind):
    scrubber = PatternScrubber()
    assert scrubber.scrub(f"see {text} here") == f"see [redacted:{kind}] here"
    assert scrubber.scrub("nothing secret: sk-short, ghp_x") == "nothing secret: sk-short, ghp_x"


def test_user_patterns_and_bad_patterns():
    from pydantic import ValidationError

    s = RedactionSettings.__pydantic_validator__.validate_python(
        {"scrub": True, "patterns": [{"kind": "ticket", "pattern": r"TCK-\d{6}"}]}
    )
    assert PatternScrubber(s).scrub("see TCK-123456") == "see [redacted:ticket]"
    only = RedactionSettings.__pydantic_validator__.validate_python(
        {"builtin_patterns": False, "patterns": [{"kind": "ticket", "pattern": r"TCK-\d{6}"}]}
    )
    key = "sk-" + "a" * 30
    assert PatternScrubber(only).scrub(f"{key} TCK-123456") == f"{key} [redacted:ticket]"
    with pytest.raises(ValidationError, match="regular expression"):
        RedactionSettings.__pydantic_validator__.validate_python(
            {"patterns": [{"kind": "x", "pattern": "(unclosed"}]}
        )


class Shouty:
    """A third-party plugin: scrubs the word 'classified' from everything stored."""

    def __init__(self) -> None:
        self.kinds: list[str] = []

    @hookimpl
    def before_store(self, kind, text):
        self.kinds.append(kind)
        return text.replace("classified", "[scrubbed]")


async def test_a_plugin_before_store_hook_scrubs_every_write(server, db_path):
    plugin = Shouty()
    server.default = lambda body: Reply.text("the classified answer")
    async with Rig(server, db_path, plugins=[plugin]) as rig:
        await rig.say("a classified question")
        conv = await rig.agent.conversation_for_channel("net:#a")
        stored = [m.content for m in await conv.messages()]
        assert stored == ["a [scrubbed] question", "the [scrubbed] answer"]
        assert {"user", "assistant"} <= set(plugin.kinds)
        note = await rig.agent.memory.save("global", "classified note")
        assert note.text == "[scrubbed] note"
    assert b"classified" not in raw_db_bytes(db_path)


# -- !redact in chat (Slack: the real slack-bolt stack against the fake Slack API) ----------
async def test_chat_redact_by_the_author_or_an_admin_only(tmp_path):
    from agentik.core.access import AccessPolicy, AccessSettings
    from agentik.core.testing.scripted import ScriptedModel
    from agentik.transports.slack.transport import SlackTransport

    from fakeslack import FakeSlack

    async with FakeSlack() as slack:
        for uid, name in (("U1", "alice"), ("U2", "bob"), ("U3", "carol")):
            slack.add_user(uid, name)
        access = AccessPolicy(AccessSettings(admins=("slack:T1:U1",)), {"slack": "slack"})
        model = ScriptedModel(default=ok)
        db = str(tmp_path / "s.db")
        agent = Agent(llm=model, store=SQLiteStore(db))
        await agent.start()
        await access.load(agent.store)
        bridge = Bridge(agent, access=access)
        transport = SlackTransport(name="slack", settings={
            "bot_token": slack.bot_token, "app_token": slack.app_token, "api_url": slack.api_url,
            "state_file": str(tmp_path / "seen.sqlite3"), "streaming": "edit",
        })  # fmt: skip
        bridge.attach(transport, ChannelOptions(command_prefix="!"))
        await transport.start(bridge)
        posted = lambda text: slack.wait_for_call(  # noqa: E731
            "chat.postMessage", lambda p: p.get("text") == text
        )
        try:
            top = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> hello", user="U2")
            await slack.push_event(top)
            key = f"slack:T1:C1:{top['ts']}"
            thread = {"thread_ts": top["ts"]}
            await slack.push_event(
                slack.message_event("C1", f"my token is {SECRET}", user="U2", **thread)
            )
            await asked_and_answered(model, 2, bridge, key)
            conv_id = await agent.store.get_binding(key)
            [leak] = [m for m in await agent.store.messages(conv_id) if SECRET in m.content]
            # Carol is neither the author nor an admin: refused, nothing changes.
            await slack.push_event(
                slack.message_event("C1", f"!redact {leak.id}", user="U3", **thread)
            )
            await posted(f"only its author or an admin may redact message #{leak.id}")
            # Carol has no message here: "last" finds nothing of hers.
            await slack.push_event(slack.message_event("C1", "!redact", user="U3", **thread))
            await posted("no message of yours to redact here")
            assert any(SECRET in m.content for m in await agent.store.messages(conv_id))
            # The listing shows numbers, never the text.
            await slack.push_event(slack.message_event("C1", "!redact list", user="U2", **thread))
            listing = await slack.wait_for_call(
                "chat.postMessage", lambda p: p.get("text", "").startswith("recent messages:")
            )
            assert f"#{leak.id} bob" in listing["text"] and SECRET not in listing["text"]
            # Bob, the author, redacts his own last message.
            await slack.push_event(
                slack.message_event("C1", "!redact last pasted by mistake", user="U2", **thread)
            )
            await posted(f"message #{leak.id} redacted")
            [row] = [m for m in await agent.store.messages(conv_id) if m.id == leak.id]
            assert SECRET not in row.content and "pasted by mistake" in row.content
            assert "slack:U2" in row.content
            # The admin may redact anyone's message (bob's greeting).
            [hello] = [m for m in await agent.store.messages(conv_id) if "hello" in m.content]
            await slack.push_event(
                slack.message_event("C1", f"!redact {hello.id}", user="U1", **thread)
            )
            await posted(f"message #{hello.id} redacted")
            audit = await agent.store.redactions(conv_id)
            assert [(a.message_id, a.by) for a in audit] == [
                (leak.id, "slack:U2"),
                (hello.id, "slack:U1"),
            ]
        finally:
            await transport.aclose()
            await bridge.aclose()
            await agent.aclose()
        assert SECRET.encode() not in raw_db_bytes(db)


# -- HTTP and CLI --------------------------------------------------------------------------
async def test_http_redact_route(tmp_path, monkeypatch):
    import httpx

    from agentik.core.access import AccessPolicy, AccessSettings
    from agentik.core.testing.scripted import ScriptedModel
    from agentik.transports.http.transport import HttpTransport

    monkeypatch.setenv("BOB_TOKEN", "b" * 32)
    monkeypatch.setenv("EVE_TOKEN", "e" * 32)
    monkeypatch.setenv("ADMIN_TOKEN", "a" * 32)
    access = AccessPolicy(AccessSettings(admins=("web:token:admin",)), {"web": "http"})
    db = str(tmp_path / "h.db")
    agent = Agent(llm=ScriptedModel(default=ok), store=SQLiteStore(db))
    await agent.start()
    bridge = Bridge(agent, access=access)
    transport = HttpTransport(name="web", settings={"port": 0, "tokens": [
        {"name": "bob", "env": "BOB_TOKEN"}, {"name": "eve", "env": "EVE_TOKEN"},
        {"name": "admin", "env": "ADMIN_TOKEN"},
    ]})  # fmt: skip
    bridge.attach(transport)
    await transport.start(bridge)
    auth = {n: {"Authorization": f"Bearer {n[0] * 32}"} for n in ("bob", "eve", "admin")}
    try:
        async with httpx.AsyncClient(base_url=transport.url + "/agentik", timeout=60) as http:
            r = await http.post("/conversations", headers=auth["bob"], json={})
            cid = r.json()["id"]
            r = await http.post(f"/conversations/{cid}/messages", headers=auth["bob"],
                                json={"content": f"key {SECRET}"})  # fmt: skip
            assert r.status_code == 202, r.text
            conv = await agent.get_conversation(cid)
            await conv.wait_idle()
            [leak] = [m for m in await conv.messages() if SECRET in m.content]
            url = f"/conversations/{cid}/messages/{leak.id}/redact"
            r = await http.post(url, headers=auth["eve"], json={"reason": "x"})
            assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
            r = await http.post(url, headers=auth["bob"], json={"reason": "my mistake"})
            assert r.status_code == 200, r.text
            body = r.json()
            assert (body["message_id"], body["by"], body["reason"]) == (
                leak.id, "web:bob", "my mistake",
            )  # fmt: skip
            r = await http.post(url, headers=auth["admin"], json={})
            assert r.status_code == 409 and r.json()["error"]["code"] == "already_redacted"
            r = await http.post(
                f"/conversations/{cid}/messages/999999/redact", headers=auth["admin"]
            )
            assert r.status_code == 404
            # The admin may redact the bot's answer.
            [answer] = [m for m in await conv.messages() if m.kind == "assistant"]
            r = await http.post(
                f"/conversations/{cid}/messages/{answer.id}/redact", headers=auth["admin"]
            )
            assert r.status_code == 200, r.text
            r = await http.get(f"/conversations/{cid}/messages", headers=auth["bob"])
            assert SECRET not in r.text
            spec = (await http.get("/openapi.json", headers=auth["bob"])).json()
            assert "post" in spec["paths"]["/agentik/conversations/{conversation_id}"
                                            "/messages/{message_id}/redact"]  # fmt: skip
    finally:
        await transport.aclose()
        await bridge.aclose()
        await agent.aclose()
    assert SECRET.encode() not in raw_db_bytes(db)


async def _one_secret_conversation(db: str) -> tuple[str, int]:
    from agentik.core.testing.scripted import ScriptedModel

    async with Agent(llm=ScriptedModel(default=ok), store=SQLiteStore(db)) as agent:
        conv = await agent.create_conversation()
        await conv.send(f"psst {SECRET}", author="alice")
        await conv.wait_idle()
        [leak] = [m for m in await conv.messages() if SECRET in m.content]
        return conv.id, leak.id


def test_cli_redact(tmp_path):
    import subprocess

    from helpers import AGENTIK

    db = str(tmp_path / "bot.db")
    cid, mid = asyncio.run(_one_secret_conversation(db))
    config = tmp_path / "bot.toml"
    config.write_text(f'[storage]\npath = "{db}"\n', encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AGENTIK_"))}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [AGENTIK, "conversations", *args, "-c", str(config)],
            env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path,
        )  # fmt: skip

    r = run("redact", cid, str(mid), "--reason", "leaked", "--by", "ops")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"redacted message {mid} of {cid}"
    shown = run("show", cid).stdout
    assert SECRET not in shown and "[message redacted by ops at " in shown and "leaked" in shown
    again = run("redact", cid, str(mid))
    assert again.returncode != 0 and "already redacted" in again.stderr
    assert "Traceback" not in again.stderr
    missing = run("redact", cid, "999999")
    assert missing.returncode != 0 and "no message 999999" in missing.stderr
    assert SECRET.encode() not in raw_db_bytes(db)


# -- configuration: [redaction] ---------------------------------------------------------------
async def test_scrub_from_the_configuration(server, tmp_path):
    from agentik.bot.app import load_registry
    from agentik.bot.builder import AgentBuilder
    from agentik.bot.config import parse_config

    key = "sk-" + "Zx9" * 10
    db = str(tmp_path / "c.db")
    config = parse_config(
        {
            "llm": {"base_url": server.base_url, "model": "fake-model", "timeout": 60},
            "storage": {"path": db},
            "redaction": {
                "scrub": True,
                "patterns": [{"kind": "ticket", "pattern": "TCK-[0-9]{6}"}],
            },
        },
        env={"OPENAI_API_KEY": "sk-test"},
    )
    agent = AgentBuilder.from_config(config, load_registry(config)).build()
    async with agent:
        conv = await agent.create_conversation()
        await conv.send(f"key {key} for TCK-123456", author="alice")
        await conv.wait_idle()
        first = (await conv.messages())[0]
        assert first.content == "key [redacted:openai-key] for [redacted:ticket]"
        assert not any(key in t or "TCK-123456" in t for t in texts_of(server.requests[-1]))
    assert key.encode() not in raw_db_bytes(db) and b"TCK-123456" not in raw_db_bytes(db)
    # Off by default.
    plain = parse_config({}, env={})
    assert plain.redaction.scrub is False


def test_a_bad_pattern_is_a_configuration_error_naming_the_key():
    from agentik.bot.config import parse_config
    from agentik.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"redaction\.patterns\.0\.pattern"):
        parse_config({"redaction": {"patterns": [{"kind": "x", "pattern": "(oops"}]}}, env={})


async def _http_redactions(tmp_path, monkeypatch, access) -> list[int]:
    """bob posts over HTTP; then the owner's, eve's and the admin's tokens each try to
    redact one of bob's messages: their status codes."""
    import httpx

    from agentik.core.testing.scripted import ScriptedModel
    from agentik.transports.http.transport import HttpTransport

    names = ("bob", "eve", "olga", "admin")
    for n in names:
        monkeypatch.setenv(f"{n.upper()}_TOKEN", n[0] * 32)
    agent = Agent(llm=ScriptedModel(default=ok), store=SQLiteStore(str(tmp_path / "o.db")))
    await agent.start()
    bridge = Bridge(agent, access=access)
    transport = HttpTransport(name="web", settings={"port": 0, "tokens": [
        {"name": n, "env": f"{n.upper()}_TOKEN"} for n in names]})  # fmt: skip
    bridge.attach(transport)
    await transport.start(bridge)
    auth = {n: {"Authorization": f"Bearer {n[0] * 32}"} for n in names}
    codes = []
    try:
        async with httpx.AsyncClient(base_url=transport.url + "/agentik", timeout=60) as http:
            cid = (await http.post("/conversations", headers=auth["bob"], json={})).json()["id"]
            for i in range(3):
                r = await http.post(f"/conversations/{cid}/messages", headers=auth["bob"],
                                    json={"content": f"message {i}"})  # fmt: skip
                assert r.status_code == 202, r.text
                await (await agent.get_conversation(cid)).wait_idle()
            conv = await agent.get_conversation(cid)
            mine = [m for m in await conv.messages() if m.kind == "user"]
            for who, m in zip(("olga", "eve", "admin"), mine, strict=True):
                url = f"/conversations/{cid}/messages/{m.id}/redact"
                codes.append((await http.post(url, headers=auth[who], json={})).status_code)
    finally:
        await transport.aclose()
        await bridge.aclose()
        await agent.aclose()
    return codes


async def test_http_redaction_rights_by_rank_owners_included(tmp_path, monkeypatch):
    from agentik.core.access import AccessPolicy, AccessSettings

    settings = AccessSettings(owners=("web:token:olga",), admins=("web:token:admin",))
    access = AccessPolicy(settings, {"web": "http"})
    # The owner ranks above admins: as in chat, they may redact another's message;
    # eve (a user, not the author) may not; the admin may.
    assert await _http_redactions(tmp_path, monkeypatch, access) == [200, 403, 200]


async def test_http_redaction_without_access_is_not_restricted(tmp_path, monkeypatch):
    # No [access]: nobody has a role, and the documented rule (author or admin,
    # "with access rules configured") does not apply: any token reaching it may.
    assert await _http_redactions(tmp_path, monkeypatch, None) == [200, 200, 200]


async def test_sse_replay_and_export_after_redacting_an_answer_and_an_ask_user_answer(tmp_path):
    """Issue 28 item 5: after a redaction, ``events?after=0`` (the conversation's
    and the agent-wide stream) replays tombstones, not the text; the person who
    answered an ``ask_user`` question may redact their answer, which takes the
    stored ``question.answer`` and the export's copy with it."""
    import httpx

    from agentik.core import TurnPolicy
    from agentik.core.access import AccessPolicy, AccessSettings
    from agentik.core.testing.scripted import Reply, ScriptedModel, call
    from agentik.transports.http.transport import HttpTransport

    from httpserver import sse

    def model(request) -> Reply:
        last = request.messages[-1]
        if last.role == "tool":  # repeats what it was told: the answer, in its reply
            return Reply(text=f"noted, {last.content}", chunks=["noted, ", last.content])
        return Reply(tool_calls=[call("ask_user", {"question": "which passphrase?"})])

    env = {"BOB_TOKEN": "b" * 32, "EVE_TOKEN": "e" * 32, "ADMIN_TOKEN": "a" * 32}
    access = AccessPolicy(AccessSettings(admins=("web:token:admin",)), {"web": "http"})
    db = str(tmp_path / "h.db")
    agent = Agent(
        llm=ScriptedModel(default=model), store=SQLiteStore(db), policy=TurnPolicy(ask_user=True)
    )
    await agent.start()
    bridge = Bridge(agent, access=access)
    transport = HttpTransport(name="web", environ=env, settings={"port": 0, "tokens": [
        {"name": "bob", "env": "BOB_TOKEN"}, {"name": "eve", "env": "EVE_TOKEN"},
        {"name": "admin", "env": "ADMIN_TOKEN"},
    ]})  # fmt: skip
    bridge.attach(transport)
    await transport.start(bridge)
    auth = {n: {"Authorization": f"Bearer {n[0] * 32}"} for n in ("bob", "eve", "admin")}
    try:
        async with httpx.AsyncClient(base_url=transport.url + "/agentik", timeout=60) as http:
            cid = (await http.post("/conversations", headers=auth["bob"], json={})).json()["id"]
            base = f"/conversations/{cid}"
            async with sse(http, base + "/events", headers=auth["bob"]) as live:
                r = await http.post(base + "/messages", headers=auth["bob"], json={"content": "go"})
                assert r.status_code == 202, r.text
                await live.until("question_asked")
                # Bob's message answers the question: his words, in the tool result.
                r = await http.post(
                    base + "/messages", headers=auth["bob"], json={"content": SECRET}
                )
                assert r.status_code == 202, r.text
                await live.until("turn_ended")
            conv = await agent.get_conversation(cid)
            await conv.wait_idle()
            rows = await conv.messages()
            [answer] = [m for m in rows if m.kind == "tool_result"]
            [reply] = [m for m in rows if m.kind == "assistant" and SECRET in m.content]
            assert SECRET in answer.content
            (q,) = await agent.store.questions(conversation_id=cid)
            assert q.answer == SECRET
            # Before: the replay has the text (what the fix must remove).
            async with sse(http, base + "/events", headers=auth["bob"], params={"after": 0}) as ev:
                before = await ev.until("turn_ended")
            assert any(SECRET in json.dumps(m.data) for m in before)

            url = base + "/messages/{}/redact"
            r = await http.post(url.format(answer.id), headers=auth["eve"], json={})
            assert r.status_code == 403, r.text
            r = await http.post(url.format(answer.id), headers=auth["bob"], json={"reason": "mine"})
            assert r.status_code == 200, r.text
            r = await http.post(url.format(reply.id), headers=auth["admin"], json={})
            assert r.status_code == 200, r.text

            async with sse(http, base + "/events", headers=auth["bob"], params={"after": 0}) as ev:
                replay = await ev.until("turn_ended")
            async with sse(http, "/events", headers=auth["admin"], params={"after": 0}) as ev:
                wide = await ev.until("turn_ended")
            for stream in (replay, wide):
                dumped = [json.dumps(m.data) for m in stream]
                assert not [d for d in dumped if SECRET in d], dumped
                kinds = {m.kind: m.data for m in stream}
                assert "redacted by web:admin" in kinds["turn_ended"]["text"]
                assert "redacted by web:bob" in kinds["question_answered"]["answer"]
                assert "redacted by web:bob" in kinds["tool_call_ended"]["result"]
                deltas = [m.data["text"] for m in stream if m.kind == "text_delta"]
                assert "redacted by web:admin" in "".join(deltas)
            # The sequence numbers are kept: no gap for a reconnecting client.
            assert [m.id for m in replay] == [m.id for m in before]

            r = await http.get(base + "/export", headers=auth["admin"])
            assert r.status_code == 200, r.text
            assert SECRET not in r.text
            (q,) = await agent.store.questions(conversation_id=cid)
            assert q.answer is not None and "redacted by web:bob" in q.answer
    finally:
        await transport.aclose()
        await bridge.aclose()
        await agent.aclose()
    assert SECRET.encode() not in raw_db_bytes(db)


async def test_chat_the_person_who_answered_a_question_redacts_their_answer(tmp_path):
    """Issue 28 item 5 in chat: an ``ask_user`` answer is listed by ``!redact
    list`` as its answerer's and ``!redact last`` redacts it, with the stored
    question's answer."""
    from agentik.core import TurnPolicy
    from agentik.core.access import AccessPolicy, AccessSettings
    from agentik.core.testing.scripted import Reply, ScriptedModel, call
    from agentik.transports.slack.transport import SlackTransport

    from fakeslack import FakeSlack

    def model(request) -> Reply:
        last = request.messages[-1]
        if last.role == "tool":
            return Reply(text="thanks, noted")
        return Reply(tool_calls=[call("ask_user", {"question": "which token?"})])

    async with FakeSlack() as slack:
        slack.add_user("U2", "bob")
        slack.add_user("U3", "carol")
        access = AccessPolicy(AccessSettings(), {"slack": "slack"})
        db = str(tmp_path / "s.db")
        agent = Agent(
            llm=ScriptedModel(default=model), store=SQLiteStore(db),
            policy=TurnPolicy(ask_user=True),
        )  # fmt: skip
        await agent.start()
        bridge = Bridge(agent, access=access)
        transport = SlackTransport(name="slack", settings={
            "bot_token": slack.bot_token, "app_token": slack.app_token, "api_url": slack.api_url,
            "state_file": str(tmp_path / "seen.sqlite3"), "streaming": "edit",
        })  # fmt: skip
        bridge.attach(transport, ChannelOptions(command_prefix="!"))
        await transport.start(bridge)

        def posted(start: str):
            return slack.wait_for_call(
                "chat.postMessage", lambda p: p.get("text", "").startswith(start)
            )

        try:
            top = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> go", user="U2")
            await slack.push_event(top)
            thread = {"thread_ts": top["ts"]}
            await slack.wait_for_call(
                "chat.postMessage", lambda p: "which token?" in p.get("text", "")
            )
            await slack.push_event(slack.message_event("C1", SECRET, user="U2", **thread))
            key = f"slack:T1:C1:{top['ts']}"
            conv_id = await agent.store.get_binding(key)
            assert conv_id is not None
            async with asyncio.timeout(60):
                while not any(  # noqa: ASYNC110
                    m.kind == "assistant" for m in await agent.store.messages(conv_id)
                ):
                    await asyncio.sleep(0.02)
            await (await agent.get_conversation(conv_id)).wait_idle()
            await bridge.flush(key)
            [answer] = [m for m in await agent.store.messages(conv_id) if SECRET in m.content]
            assert answer.kind == "tool_result"
            # Carol did not answer: not hers to redact.
            await slack.push_event(
                slack.message_event("C1", f"!redact {answer.id}", user="U3", **thread)
            )
            await posted(f"only its author or an admin may redact message #{answer.id}")
            await slack.push_event(slack.message_event("C1", "!redact list", user="U2", **thread))
            listing = await posted("recent messages:")
            assert f"#{answer.id} answer of bob" in listing["text"]
            assert SECRET not in listing["text"]
            await slack.push_event(slack.message_event("C1", "!redact last", user="U2", **thread))
            await posted(f"message #{answer.id} redacted")
            (q,) = await agent.store.questions(conversation_id=conv_id)
            assert q.answer is not None and SECRET not in q.answer and "slack:" in q.answer
        finally:
            await transport.aclose()
            await bridge.aclose()
            await agent.aclose()
        assert SECRET.encode() not in raw_db_bytes(db)
