"""The IRC transport against real IRC servers and a scripted one."""

from __future__ import annotations

import asyncio
import base64
import re

from agentik.bot.bridge import ChannelOptions
from agentik.core.testing.scripted import Reply
from agentik.transports.irc.transport import IRCTransport, sasl_chunks
from agentik.transports.irc.wire import strip_formatting
from helpers import AGENTIK

from ircservers import (
    IRCTestClient,
    ScriptedIRCServer,
    registration_handler,
    sasl_plain,
)
from rigs import eventually, irc_bot, joined
from rigs import said_by_bot as from_bot

pytest_plugins = ["ircservers"]


async def test_addressing_private_messages_and_two_users(irc_server, tmp_path):
    async with irc_bot(irc_server.port, tmp_path, channels=["#room"]) as (bot, model, agent, _):
        await joined(bot, "#room")
        alice = await IRCTestClient.connect(irc_server.port, "alice")
        bob = await IRCTestClient.connect(irc_server.port, "bob")
        await alice.join("#room")
        await bob.join("#room")
        bob.privmsg("#room", "just chatting, nothing for the bot")
        alice.privmsg("#room", "agentik: what is up?")
        answer = await alice.wait_for(from_bot)
        # In a channel the answer starts with the asker's nick (address_asker).
        assert list(answer.params) == ["#room", "alice: echo: what is up?"]
        bob.privmsg("#room", "I also want to ask, agentik, are you there?")
        answer = await bob.wait_for(lambda m: from_bot(m) and "there" in m.text)
        assert answer.text == "bob: echo: I also want to ask, agentik, are you there?"
        # Both speakers reached the model with their names; the chatter did not.
        users = [(m.author, m.content) for m in model.requests[-1].messages if m.role == "user"]
        assert users == [
            ("alice", "what is up?"),
            ("bob", "I also want to ask, agentik, are you there?"),
        ]
        alice.privmsg("agentik", "a private question")
        private = await alice.wait_for(lambda m: from_bot(m) and m.params[0] == "alice")
        assert private.text == "echo: a private question"  # no nick prefix in private
        # alice has no services account: her private conversation is keyed as an
        # unverified nick, apart from any account named alice.
        conv = await agent.conversation_for_channel("irc:testnet:alice!*@*")
        await conv.wait_idle()  # the line can go out before the turn has ended
        assert [m.content for m in await conv.messages()] == [
            "a private question",
            "echo: a private question",
        ]
        await alice.close()
        await bob.close()


async def test_commands_more_stop_new(miniircd, tmp_path):
    options = ChannelOptions(command_prefix="!", max_answer_lines=3)
    async with irc_bot(miniircd.port, tmp_path, channels=["#cmd"], options=options) as (
        bot,
        model,
        agent,
        _,
    ):
        await joined(bot, "#cmd")
        alice = await IRCTestClient.connect(miniircd.port, "alice")
        await alice.join("#cmd")
        model.enqueue(Reply(text="\n".join(f"line {i}" for i in range(8))))
        alice.privmsg("#cmd", "agentik: count to eight")
        lines = await alice.collect(from_bot, 3)
        assert [m.text for m in lines] == ["alice: line 0", "line 1", "line 2"]
        notice = await alice.wait_for(lambda m: m.command == "NOTICE" and "more" in m.text)
        assert "5 more lines: !more" in notice.text
        alice.privmsg("#cmd", "!more")
        assert [m.text for m in await alice.collect(from_bot, 3)] == ["line 3", "line 4", "line 5"]
        # !stop interrupts a slow answer.
        slow = Reply(text="word " * 100, hold_after=5)  # mid-answer until stopped
        model.enqueue(slow)
        alice.privmsg("#cmd", "agentik: talk slowly")
        await slow.held.wait()
        alice.privmsg("#cmd", "!stop")
        await alice.wait_for(lambda m: m.command == "NOTICE" and "(interrupted)" in m.text)
        # !new starts a fresh conversation for the channel.
        old = (await agent.conversation_for_channel("irc:testnet:#cmd")).id
        alice.privmsg("#cmd", "!new")
        reply = await alice.wait_for(lambda m: from_bot(m) and "new conversation" in m.text)
        assert old in reply.text
        alice.privmsg("#cmd", "agentik: fresh?")
        await alice.wait_for(lambda m: from_bot(m) and m.text == "alice: echo: fresh?")
        assert [m.content for m in model.requests[-1].messages] == ["fresh?"]
        await alice.close()


async def test_a_long_answer_stops_after_four_lines_by_default_and_more_shows_the_rest(
    miniircd, tmp_path
):
    # No max_answer_lines anywhere: IRC's default cap (4) applies.
    async with irc_bot(miniircd.port, tmp_path, channels=["#cap"]) as (bot, model, agent, _):
        await joined(bot, "#cap")
        alice = await IRCTestClient.connect(miniircd.port, "alice")
        await alice.join("#cap")
        model.enqueue(Reply(text="\n".join(f"line {i}" for i in range(10))))
        alice.privmsg("#cap", "agentik: count to ten")
        first = await alice.collect(from_bot, 4)
        # The first line names the asker (address_asker), the rest do not.
        assert [m.text for m in first] == ["alice: line 0"] + [f"line {i}" for i in range(1, 4)]
        hint = await alice.wait_for(lambda m: m.command == "NOTICE" and "more" in m.text)
        assert list(hint.params) == ["#cap", "… 6 more lines: !more"]
        # The hint comes after the lines it follows: these are all the channel got.
        assert len([m for m in alice.received if from_bot(m)]) == 4
        alice.privmsg("#cap", "!more")
        rest = await alice.collect(from_bot, 5)
        assert [m.text for m in rest] == [
            *(f"line {i}" for i in range(4, 8)),
            "… 2 more lines: !more",
        ]
        alice.privmsg("#cap", "!more")
        assert [m.text for m in await alice.collect(from_bot, 2)] == ["line 8", "line 9"]
        await alice.close()


LONG_ANSWER = (
    "# Report\n\n"
    + "\n\n".join(
        f"Paragraph {i}: "
        + " ".join(f"**word{j}** and `code{j}` with ünïcödé text" for j in range(14))
        for i in range(5)
    )
    + "\n\n```python\n"
    + "\n".join(f"def function_{i}(argument):  # a comment {'x' * 40}" for i in range(6))
    + "\n```\n\nSee [the docs](https://example.org/docs) for more."
)


def _words(text: str) -> list[str]:
    text = strip_formatting(text)
    text = re.sub(r"```\w*", " ", text)
    for ch in "*`#[]()<>":
        text = text.replace(ch, " ")
    return text.split()


async def test_a_long_answer_arrives_as_correctly_split_lines(irc_server, tmp_path):
    assert len(LONG_ANSWER) > 3000
    # The whole answer at once: max_answer_lines = 0 turns IRC's default cap (4) off.
    uncapped = ChannelOptions(command_prefix="!", max_answer_lines=0)
    async with irc_bot(irc_server.port, tmp_path, channels=["#long"], options=uncapped) as (
        bot,
        model,
        agent,
        _,
    ):
        await joined(bot, "#long")
        alice = await IRCTestClient.connect(irc_server.port, "alice")
        await alice.join("#long")
        model.enqueue(Reply(text=LONG_ANSWER))
        alice.privmsg("#long", "agentik: write a long report")
        last = await alice.wait_for(lambda m: from_bot(m) and "example.org" in m.text, timeout=30)
        lines = [m for m in alice.received if from_bot(m)]
        assert last is lines[-1]
        for m in lines:
            assert len(m.raw) <= 512, m.raw  # as relayed, with the server's prefix and CRLF
            assert b"\r" not in m.raw.rstrip(b"\r\n") and b"\x00" not in m.raw
        received = " ".join(m.text for m in lines)
        assert received.startswith("alice: ")  # the asker, once, on the first line
        assert _words(received.removeprefix("alice: ")) == _words(LONG_ANSWER)
        assert "\x02Report\x02" in lines[0].text  # Markdown became IRC formatting
        code = [m.text for m in lines if "def function_" in m.text]
        assert code and all(t.startswith("\x11") for t in code)
        assert lines[-1].text.endswith("the docs <https://example.org/docs> for more.")
        await alice.close()


async def test_server_restart_mid_conversation_delivers_the_queued_answer_once(miniircd, tmp_path):
    async with irc_bot(
        miniircd.port, tmp_path, channels=["#ops"], reconnect_min=1.5, reconnect_max=2.0
    ) as (bot, model, agent, _):
        await joined(bot, "#ops")
        alice = await IRCTestClient.connect(miniircd.port, "alice")
        await alice.join("#ops")
        gate = asyncio.Event()
        held = Reply(text="the answer written while the server was down", gate=gate)
        model.enqueue(held)
        alice.privmsg("#ops", "agentik: take your time")
        await held.started.wait()
        await miniircd.kill()
        await alice.wait_closed()
        gate.set()  # the answer is produced while disconnected: it must wait in the queue
        await bot.wait_until(lambda: bot.queued > 0, timeout=60)
        await miniircd.restart()
        alice = await IRCTestClient.connect(miniircd.port, "alice")
        await alice.join("#ops")
        answer = await alice.wait_for(from_bot, timeout=60)
        assert answer.text == "alice: the answer written while the server was down"
        # Something after it proves the first answer was not sent twice.
        alice.privmsg("#ops", "agentik: and now?")
        await alice.wait_for(lambda m: from_bot(m) and m.text == "alice: echo: and now?")
        texts = [m.text for m in alice.received if from_bot(m)]
        assert texts == [
            "alice: the answer written while the server was down",
            "alice: echo: and now?",
        ]
        await alice.close()


# -- negotiation against a scripted server ------------------------------------------------


async def test_cap_negotiation_and_sasl_plain_success():
    handler = registration_handler(
        caps_offered="sasl message-tags server-time account-tag echo-message batch",
        sasl=sasl_plain("botaccount", "s3cret"),
    )
    async with ScriptedIRCServer(handler) as server:
        t = IRCTransport(
            name="s",
            settings={"port": server.port, "tls": False, "sasl_mechanism": "plain",
                      "sasl_username": "botaccount", "sasl_password": "s3cret"},
        )  # fmt: skip
        sink = _NullSink()
        await t.start(sink)
        try:
            await asyncio.wait_for(t.registered.wait(), 60)
            lines = server.received
            assert lines[0] == "CAP LS 302"
            req = next(line for line in lines if line.startswith("CAP REQ"))
            assert set(req.split(":", 1)[1].split()) == {
                "sasl", "message-tags", "server-time", "account-tag", "echo-message", "batch",
            }  # fmt: skip
            auth = [line for line in lines if line.startswith("AUTHENTICATE")]
            assert auth[0] == "AUTHENTICATE PLAIN"
            assert base64.b64decode(auth[1].split()[1]) == b"botaccount\0botaccount\0s3cret"
            assert lines.index("CAP END") > lines.index(auth[-1])
            assert t.caps_enabled >= {"sasl", "echo-message"}
            # ISUPPORT BOT=B: the bot marks itself as a bot.
            await server.wait_for_line("MODE agentik +B")
        finally:
            await t.aclose()


async def test_sasl_failure_stops_with_a_clear_error(caplog):
    handler = registration_handler(sasl=sasl_plain("bot", "right", succeed=False))
    async with ScriptedIRCServer(handler) as server:
        t = IRCTransport(
            name="s",
            settings={"port": server.port, "tls": False, "sasl_mechanism": "plain",
                      "sasl_username": "bot", "sasl_password": "wrong-password",
                      "reconnect_min": 0.1},
        )  # fmt: skip
        await t.start(_NullSink())
        try:
            await asyncio.wait_for(t.closed.wait(), 60)
            assert t.failed and "SASL PLAIN login rejected (904)" in t.failed
            assert not t.registered.is_set()
            assert len(server.clients) == 1  # no reconnect loop on bad credentials
            assert "wrong-password" not in caplog.text and "wrong-password" not in t.failed
        finally:
            await t.aclose()


def test_sasl_payloads_are_split_at_400_bytes():
    assert sasl_chunks(b"") == ["+"]
    long = sasl_chunks(b"x" * 500)
    assert [len(c) for c in long] == [400, 268]
    exact = sasl_chunks(b"y" * 300)  # 400 base64 characters exactly
    assert [len(c) for c in exact] == [400, 1] and exact[-1] == "+"
    assert base64.b64decode("".join(long)) == b"x" * 500


def _chunked_sasl(account: str, password: str):
    """Server side of SASL PLAIN as the spec says: 400-byte chunks reassembled."""

    def sasl(client, line):
        arg = line.split(" ", 1)[1]
        if arg == "PLAIN":
            client.send("AUTHENTICATE +")
            return
        parts = client.state.setdefault("chunks", [])
        if arg != "+":
            parts.append(arg)
        if arg != "+" and len(arg) == 400:
            return  # more to come
        payload = base64.b64decode("".join(parts))
        if payload.split(b"\0")[1:] == [account.encode(), password.encode()]:
            client.reply("900", client.prefix, account, "logged in")
            client.reply("903", "SASL authentication successful")
        else:
            client.reply("904", "SASL authentication failed")

    return sasl


async def test_multi_chunk_authenticate_reaches_the_server():
    password = "p" * 700
    handler = registration_handler(sasl=_chunked_sasl("acct", password))
    async with ScriptedIRCServer(handler) as server:
        t = IRCTransport(
            name="s",
            settings={"port": server.port, "tls": False, "sasl_mechanism": "plain",
                      "sasl_username": "acct", "sasl_password": password},
        )  # fmt: skip
        await t.start(_NullSink())
        try:
            await asyncio.wait_for(t.registered.wait(), 60)
            chunks = [
                line.split()[1]
                for line in server.received
                if line.startswith("AUTHENTICATE") and line != "AUTHENTICATE PLAIN"
            ]
            assert len(chunks) >= 3 and all(len(c) <= 400 for c in chunks)
            assert base64.b64decode("".join(c for c in chunks if c != "+")).endswith(
                password.encode()
            )
        finally:
            await t.aclose()


async def test_nick_collision_takes_an_alternate_and_regains_it_later():
    base = registration_handler(caps_offered="")

    async def handler(client, line):
        client.state.setdefault("taken_nicks", ["agentik"])
        await base(client, line)

    async with ScriptedIRCServer(handler) as server:
        t = IRCTransport(name="s", settings={"port": server.port, "tls": False})
        await t.start(_NullSink())
        try:
            await asyncio.wait_for(t.registered.wait(), 60)
            assert t.nick == "agentik_"
            client = server.clients[0]
            client.state["taken_nicks"] = []
            since = server.mark()
            client.send(":agentik!x@elsewhere QUIT :gone")  # the holder leaves
            await server.wait_for_line("NICK agentik", since=since)
            await eventually(lambda: t.nick == "agentik", "the nick back")
        finally:
            await t.aclose()


async def test_ctcp_notices_echo_and_bots_are_handled():
    async with ScriptedIRCServer(registration_handler(caps_offered="")) as server:
        sink = _RecordingSink()
        t = IRCTransport(name="s", settings={"port": server.port, "tls": False})
        await t.start(sink)
        try:
            await asyncio.wait_for(t.registered.wait(), 60)
            client = server.clients[0]
            client.send(":alice!a@h PRIVMSG agentik :\x01VERSION\x01")
            version = await server.wait_for_line(lambda line: line.startswith("NOTICE alice"))
            assert "\x01VERSION agentik" in version
            client.send(":alice!a@h PRIVMSG agentik :\x01PING 12345\x01")
            assert "\x01PING 12345\x01" in await server.wait_for_line("NOTICE alice")
            client.send(":alice!a@h NOTICE agentik :a notice is never answered")
            client.send(":agentik!me@h PRIVMSG #x :our own echo")
            client.send("@bot :otherbot!b@h PRIVMSG agentik :hello from a bot")
            client.send(":alice!a@h PRIVMSG agentik :\x01ACTION waves\x01")
            client.send(":alice!a@h PRIVMSG agentik :caf\xe9 bytes?".encode("latin-1"))
            async with asyncio.timeout(60):
                while len(sink.messages) < 2:
                    await sink.changed.wait()
            assert [m.text for m in sink.messages] == ["* alice waves", "caf\ufffd bytes?"]
            assert all(m.direct and m.channel_key == "irc:s:alice!*@*" for m in sink.messages)
            assert not any(m.verified for m in sink.messages)  # no account: a claimed nick
        finally:
            await t.aclose()


async def test_incoming_rate_limit_answers_once_with_a_notice():
    async with ScriptedIRCServer(registration_handler(caps_offered="")) as server:
        sink = _RecordingSink()
        t = IRCTransport(
            name="s", settings={"port": server.port, "tls": False, "user_rate_limit": 3}
        )
        await t.start(sink)
        try:
            await asyncio.wait_for(t.registered.wait(), 60)
            for i in range(6):
                server.clients[0].send(f":spammer!s@h PRIVMSG agentik :message {i}")
            notice = await server.wait_for_line("NOTICE spammer")
            assert "too fast" in notice
            # Someone else speaks after the burst: once that arrived, the whole
            # burst was handled (lines are handled in order), so nothing more comes.
            server.clients[0].send(":bob!b@h PRIVMSG agentik :after the burst")
            async with asyncio.timeout(60):
                while not any(m.text == "after the burst" for m in sink.messages):
                    await sink.changed.wait()
            assert [m.text for m in sink.messages] == [
                "message 0", "message 1", "message 2", "after the burst"
            ]  # fmt: skip
            assert sum(line.startswith("NOTICE spammer") for line in server.received) == 1
        finally:
            await t.aclose()


async def test_ping_timeout_reconnects():
    async with ScriptedIRCServer(registration_handler(caps_offered="")) as server:
        t = IRCTransport(
            name="s",
            settings={"port": server.port, "tls": False, "ping_interval": 0.2,
                      "ping_timeout": 0.5, "reconnect_min": 0.1, "reconnect_max": 0.2},
        )  # fmt: skip
        await t.start(_NullSink())
        try:
            await asyncio.wait_for(t.registered.wait(), 60)
            first = server.clients[0]
            first.state["silent"] = True
            # The scripted server answers PING; make this client's server go silent.
            server.handler = _silent_for(first, server.handler)
            await server.wait_for_client(1, timeout=60)
            assert any(line.startswith("PING") for line in first.received)
        finally:
            await t.aclose()


def _silent_for(client, handler):
    async def wrapped(c, line):
        if c is client:
            return
        await handler(c, line)

    return wrapped


class _NullSink:
    async def handle(self, message, transport):
        return None


class _RecordingSink:
    def __init__(self):
        self.messages = []
        self.changed = asyncio.Event()

    async def handle(self, message, transport):
        self.messages.append(message)
        self.changed.set()
        self.changed = asyncio.Event()


# -- TLS ---------------------------------------------------------------------------------


def _pki(tmp_path):
    """A private CA, a server certificate for 127.0.0.1 and a client certificate."""
    import subprocess

    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp_path)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=agentik test CA")  # fmt: skip
    for name, ext in (
        ("server", "subjectAltName=IP:127.0.0.1"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
            f"{name}.csr", "-subj", f"/CN={name}")  # fmt: skip
        (tmp_path / f"{name}.ext").write_text(ext + "\n")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2",
            "-extfile", f"{name}.ext")  # fmt: skip
    return tmp_path


def _server_tls(pki, *, require_client_cert=False):
    import ssl

    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pki / "server.pem", pki / "server.key")
    if require_client_cert:
        ctx.load_verify_locations(pki / "ca.pem")
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


async def test_tls_verifies_the_certificate_by_default(tmp_path, caplog):
    pki = _pki(tmp_path)
    async with ScriptedIRCServer(
        registration_handler(caps_offered=""), ssl=_server_tls(pki)
    ) as server:
        # Verification on (the default) with an untrusted CA: no connection is made.
        t = IRCTransport(
            name="tls", settings={"port": server.port, "reconnect_min": 0.05,
                                  "reconnect_max": 0.1},
        )  # fmt: skip
        await t.start(_NullSink())
        try:
            await eventually(lambda: "certificate verify failed" in caplog.text, "the TLS error")
            assert not t.registered.is_set() and server.received == []
        finally:
            await t.aclose()
        # Trusting the network's CA: registered over TLS.
        t = IRCTransport(
            name="tls", settings={"port": server.port, "ssl_ca_file": str(pki / "ca.pem")}
        )
        await t.start(_NullSink())
        try:
            await asyncio.wait_for(t.registered.wait(), 60)
        finally:
            await t.aclose()
        # ssl_verify = false accepts any certificate (testing only).
        t = IRCTransport(name="tls", settings={"port": server.port, "ssl_verify": False})
        await t.start(_NullSink())
        try:
            await asyncio.wait_for(t.registered.wait(), 60)
        finally:
            await t.aclose()


async def test_sasl_external_with_a_client_certificate(tmp_path):
    pki = _pki(tmp_path)

    def external(client, line):
        arg = line.split(" ", 1)[1]
        if arg == "EXTERNAL":
            client.send("AUTHENTICATE +")
        elif arg == "+":
            client.reply("900", client.prefix, "client", "You are now logged in as client")
            client.reply("903", "SASL authentication successful")

    handler = registration_handler(caps_offered="sasl", sasl=external)
    tls = _server_tls(pki, require_client_cert=True)
    async with ScriptedIRCServer(handler, ssl=tls) as server:
        t = IRCTransport(
            name="ext",
            settings={"port": server.port, "ssl_ca_file": str(pki / "ca.pem"),
                      "sasl_mechanism": "external", "client_cert": str(pki / "client.pem"),
                      "client_key": str(pki / "client.key")},
        )  # fmt: skip
        await t.start(_NullSink())
        try:
            await asyncio.wait_for(t.registered.wait(), 60)
            assert "AUTHENTICATE EXTERNAL" in server.received
            assert server.received.index("AUTHENTICATE +") < server.received.index("CAP END")
        finally:
            await t.aclose()


async def test_agentik_run_serves_irc_from_a_config_file(miniircd, openai_server, tmp_path):
    """The whole path: the CLI, a TOML file, the OpenAI backend, IRC; SIGTERM quits cleanly."""
    import os
    import signal

    config = tmp_path / "bot.toml"
    config.write_text(
        f"""
[llm]
base_url = "{openai_server.base_url}"
model = "fake-model"
[storage]
path = "{tmp_path / "bot.db"}"
[transports.local]
type = "irc"
host = "127.0.0.1"
port = {miniircd.port}
tls = false
nick = "agentik"
channels = ["#e2e"]
"""
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AGENTIK_"))}
    proc = await asyncio.create_subprocess_exec(
        AGENTIK, "run", "-c", str(config), env=env, stdin=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    alice = None
    try:
        alice = await IRCTestClient.connect(miniircd.port, "alice")
        await alice.join("#e2e")
        await alice.wait_for(lambda m: m.command == "JOIN" and m.nick == "agentik", timeout=60)
        alice.privmsg("#e2e", "agentik: hello from IRC")
        answer = await alice.wait_for(from_bot, timeout=60)
        assert answer.text == "alice: echo: alice: hello from IRC"
        proc.send_signal(signal.SIGTERM)
        await alice.wait_for(lambda m: m.command == "QUIT" and m.nick == "agentik", timeout=60)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        assert b"Traceback" not in err
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        if alice is not None:
            await alice.close()


async def test_multiline_batches_an_answer_when_the_server_offers_it(tmp_path):
    handler = registration_handler(
        caps_offered="batch message-tags draft/multiline=max-bytes=4096,max-lines=24"
    )
    async with ScriptedIRCServer(handler) as server:
        async with irc_bot(server.port, tmp_path) as (bot, model, agent, _):
            await asyncio.wait_for(bot.registered.wait(), 60)
            assert "draft/multiline" in bot.caps_enabled
            model.enqueue(Reply(text="first line\nsecond line\nthird line"))
            server.clients[0].send(":alice!a@h PRIVMSG agentik :three lines please")
            opening = await server.wait_for_line(lambda line: line.startswith("BATCH +"))
            ref = opening.split()[1][1:]
            assert opening == f"BATCH +{ref} draft/multiline alice"
            await server.wait_for_line(f"BATCH -{ref}")
            start = server.received.index(opening)
            body = server.received[start + 1 : start + 4]
            assert body == [
                f"@batch={ref} PRIVMSG alice :first line",
                f"@batch={ref} PRIVMSG alice :second line",
                f"@batch={ref} PRIVMSG alice :third line",
            ]


async def test_server_password_nickserv_and_flood_control_keep_every_line_in_order(tmp_path):
    async with ScriptedIRCServer(registration_handler(caps_offered="")) as server:
        async with irc_bot(
            server.port, tmp_path, password="server-pass", nickserv_password="ns-pass",
            flood_burst=2, flood_rate=50.0,
            options=ChannelOptions(command_prefix="!", max_answer_lines=0),  # all 12 rows
        ) as (bot, model, agent, _):  # fmt: skip
            await asyncio.wait_for(bot.registered.wait(), 60)
            lines = server.received
            assert lines.index("PASS server-pass") < lines.index("NICK agentik")
            await server.wait_for_line("PRIVMSG NickServ :IDENTIFY ns-pass")
            model.enqueue(Reply(text="\n".join(f"row {i}" for i in range(12))))
            server.clients[0].send(":alice!a@h PRIVMSG agentik :twelve rows")
            for i in range(12):
                await server.wait_for_line(f"PRIVMSG alice :row {i}")
            sent = [line for line in server.received if line.startswith("PRIVMSG alice")]
            assert sent == [f"PRIVMSG alice :row {i}" for i in range(12)]


async def test_isupport_linelen_allows_longer_lines(tmp_path):
    handler = registration_handler(caps_offered="", isupport="LINELEN=1024 NETWORK=Test")
    async with ScriptedIRCServer(handler) as server:
        async with irc_bot(server.port, tmp_path) as (bot, model, agent, _):
            await asyncio.wait_for(bot.registered.wait(), 60)
            assert bot.linelen == 1024
            long_line = " ".join(f"word{i}" for i in range(120))  # ~830 bytes
            model.enqueue(Reply(text=long_line))
            server.clients[0].send(":alice!a@h PRIVMSG agentik :long please")
            first = await server.wait_for_line(lambda line: line.startswith("PRIVMSG alice"))
            assert len(first.encode()) > 512 and len(first.encode()) + 2 <= 1024
