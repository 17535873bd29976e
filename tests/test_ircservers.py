"""The IRC test infrastructure itself: real servers, the raw client, the scripted server."""

from __future__ import annotations

import asyncio
import base64

import pytest

from ircservers import (
    HOST,
    IRCServerProcess,
    IRCTestClient,
    ScriptedClient,
    ScriptedIRCServer,
    parse_line,
    registration_handler,
    sasl_plain,
    start_miniircd,
)

pytest_plugins = ["ircservers"]


def is_privmsg(text: str):
    return lambda m: m.command == "PRIVMSG" and m.text == text


# --------------------------------------------------------------------------- parser


def test_parse_line():
    m = parse_line(
        b"@time=2024-01-01T00:00:00.000Z;x=a\\sb :alice!al@host PRIVMSG #c :hi there\r\n"
    )
    assert m.raw == b"@time=2024-01-01T00:00:00.000Z;x=a\\sb :alice!al@host PRIVMSG #c :hi there"
    assert m.tags == {"time": "2024-01-01T00:00:00.000Z", "x": "a b"}
    assert (m.source, m.nick, m.command) == ("alice!al@host", "alice", "PRIVMSG")
    assert m.params == ("#c", "hi there")
    assert (m.target, m.text) == ("#c", "hi there")

    m = parse_line("PING :irc.example")
    assert (m.source, m.nick, m.command, m.params) == (None, None, "PING", ("irc.example",))
    m = parse_line(":srv 005 bot BOT=B LINELEN=512 :are supported")
    assert m.params == ("bot", "BOT=B", "LINELEN=512", "are supported")
    assert parse_line("QUIT").text == ""


# --------------------------------------------------------------------------- real servers


async def test_channel_and_private_messages(irc_server: IRCServerProcess):
    assert irc_server.host == HOST and irc_server.running
    alice = await IRCTestClient.connect(irc_server.port, "alice")
    bob = await IRCTestClient.connect(irc_server.port, "bob")
    try:
        await alice.join("#agentik")
        await bob.join("#agentik")
        await alice.wait_for(lambda m: m.command == "JOIN" and m.nick == "bob")

        alice.privmsg("#agentik", "hello from alice")
        got = await bob.wait_for(is_privmsg("hello from alice"))
        assert (got.nick, got.target) == ("alice", "#agentik")
        assert got.raw.endswith(b"PRIVMSG #agentik :hello from alice")

        await bob.privmsg("#agentik", "hi alice")  # awaiting a send is optional
        assert (await alice.wait_for(is_privmsg("hi alice"))).nick == "bob"

        alice.privmsg("bob", "psst, private")
        got = await bob.wait_for(is_privmsg("psst, private"))
        assert (got.nick, got.target) == ("alice", "bob")

        bob.notice("alice", "noted")
        got = await alice.wait_for(lambda m: m.command == "NOTICE" and m.text == "noted")
        assert got.nick == "bob"

        # Lines are handed out once, in order of arrival; .received keeps them all.
        for i in range(5):
            alice.privmsg("#agentik", f"burst {i}")
        burst = await bob.collect(lambda m: m.text.startswith("burst "), 5)
        assert [m.text for m in burst] == [f"burst {i}" for i in range(5)]
        assert sum(m.text.startswith("burst ") for m in bob.received) == 5
        assert bob.peek(is_privmsg("hello from alice")) is None
        await alice.sync()  # a PING/PONG barrier
        assert alice.peek(lambda m: m.command == "PONG") is None  # taken by sync()
    finally:
        await alice.quit()
        await bob.quit()
    assert alice.closed.done() and bob.closed.done()


async def test_kill_and_restart_on_same_port(irc_server: IRCServerProcess):
    port = irc_server.port
    client = await IRCTestClient.connect(port, "survivor")
    await irc_server.kill()
    assert not irc_server.running
    await client.wait_closed()
    with pytest.raises(ConnectionError):
        await client.wait_for(lambda m: m.command == "PRIVMSG")
    await client.close()

    await irc_server.restart()
    assert irc_server.port == port and irc_server.running
    again = await IRCTestClient.connect(port, "survivor")
    try:
        await again.join("#back")
    finally:
        await again.quit()

    await irc_server.stop()
    assert not irc_server.running
    await irc_server.stop()  # idempotent


async def test_miniircd_password(tmp_path):
    server = await start_miniircd(tmp_path, password="letmein")
    try:
        assert server.name == "miniircd" and server.password == "letmein"
        with pytest.raises(ConnectionError, match="464"):
            await IRCTestClient.connect(server.port, "nopass", password="wrong", timeout=60)
        client = await IRCTestClient.connect(server.port, "withpass", password="letmein")
        await client.quit()
    finally:
        await server.stop()
    assert "Accepted connection" in server.log()


# --------------------------------------------------------------------------- scripted server


async def test_scripted_registration_with_caps():
    async with ScriptedIRCServer(registration_handler()) as server:
        raw = await IRCTestClient.open(server.port, "bot")  # connected, not registered
        try:
            raw.send_raw("CAP LS 302")
            ls = await raw.wait_for(lambda m: m.command == "CAP" and m.params[1] == "LS")
            assert ls.text == "sasl message-tags server-time"
            raw.send_raw("NICK bot")
            raw.send_raw("USER bot 0 * :agentik bot")
            raw.send_raw("CAP REQ :message-tags server-time")
            ack = await raw.wait_for(lambda m: m.command == "CAP")
            assert ack.params[1:] == ("ACK", "message-tags server-time")
            await raw.sync()  # the server answered everything sent so far...
            assert raw.peek(lambda m: m.command == "001") is None  # ...without 001 before CAP END
            raw.send_raw("CAP END")
            welcome = await raw.wait_for(lambda m: m.command == "001")
            assert welcome.target == "bot"
            isupport = await raw.wait_for(lambda m: m.command == "005")
            assert isupport.params[1:4] == ("BOT=B", "LINELEN=512", "NETWORK=Test")
            await raw.wait_for(lambda m: m.command == "376")

            raw.send_raw("JOIN #chan")
            join = await raw.wait_for(lambda m: m.command == "JOIN")
            assert join.source == "bot!bot@127.0.0.1" and join.target == "#chan"
            raw.send_raw("PING :tok")
            assert (await raw.wait_for(lambda m: m.command == "PONG")).text == "tok"
            assert server.clients[0].sent[-1] == ":irc.scripted.test PONG irc.scripted.test :tok"
            raw.send_raw("PRIVMSG #chan :hello")
            assert await server.wait_for_line("PRIVMSG #chan") == "PRIVMSG #chan :hello"
            since = server.mark()
            raw.send_raw("NICK bot")  # the same line again: since= skips the first one
            assert await server.wait_for_line("NICK bot", since=since) == "NICK bot"
            assert server.received.index("NICK bot") < since
        finally:
            await raw.close()
        assert server.received[4].startswith("PING :sync-")  # from raw.sync()
        assert [line for i, line in enumerate(server.received) if i != 4] == [
            "CAP LS 302",
            "NICK bot",
            "USER bot 0 * :agentik bot",
            "CAP REQ :message-tags server-time",
            "CAP END",
            "JOIN #chan",
            "PING :tok",
            "PRIVMSG #chan :hello",
            "NICK bot",
        ]
        assert server.clients[0].caps == {"message-tags", "server-time"}
        assert server.clients[0].registered


async def test_scripted_registration_without_cap():
    async with ScriptedIRCServer() as server:
        client = await IRCTestClient.connect(server.port, "plain")
        try:
            assert client.nick == "plain"
            client.send_raw("CAP REQ :unknown-cap")
            nak = await client.wait_for(lambda m: m.command == "CAP")
            assert nak.params[1:] == ("NAK", "unknown-cap")
        finally:
            await client.quit()
        assert server.received[:2] == ["NICK plain", "USER plain 0 * :agentik test client"]
        assert server.received[-1].startswith("QUIT")


async def _sasl_exchange(server: ScriptedIRCServer, password: str) -> IRCTestClient:
    client = await IRCTestClient.open(server.port, "bot")
    for line in ("CAP LS 302", "NICK bot", "USER bot 0 * :bot", "CAP REQ :sasl"):
        client.send_raw(line)
    await client.wait_for(lambda m: m.command == "CAP" and m.params[1] == "ACK")
    client.send_raw("AUTHENTICATE PLAIN")
    await client.wait_for(lambda m: m.command == "AUTHENTICATE" and m.text == "+")
    client.send_raw("AUTHENTICATE " + base64.b64encode(f"bot\0bot\0{password}".encode()).decode())
    return client


async def test_scripted_sasl_plain_success_and_failure():
    async with ScriptedIRCServer(registration_handler(sasl=sasl_plain("bot", "hunter2"))) as server:
        good = await _sasl_exchange(server, "hunter2")
        bad = await _sasl_exchange(server, "wrong")
        try:
            assert (await good.wait_for(lambda m: m.command in {"903", "904"})).command == "903"
            assert any(m.command == "900" for m in good.received)
            assert (await bad.wait_for(lambda m: m.command in {"903", "904"})).command == "904"
            good.send_raw("CAP END")
            await good.wait_for(lambda m: m.command == "001")
        finally:
            await good.close()
            await bad.close()
        assert server.clients[0].state["sasl_payloads"] == [b"bot\0bot\0hunter2"]


async def test_scripted_custom_handler_and_errors():
    base = registration_handler()

    async def handler(client: ScriptedClient, line: str) -> None:
        if line.startswith("PRIVMSG "):
            client.send(f":{client.server.name} NOTICE {client.nick} :echo {line}")
        else:
            await base(client, line)

    async with ScriptedIRCServer(handler) as server:
        client = await IRCTestClient.connect(server.port, "custom")
        peer = await server.wait_for_client(0)
        peer.send(":someone!u@h PRIVMSG custom :pushed by the test")
        assert (await client.wait_for(lambda m: m.command == "PRIVMSG")).nick == "someone"
        client.privmsg("#x", "ping me")
        got = await client.wait_for(lambda m: m.command == "NOTICE")
        assert got.text == "echo PRIVMSG #x :ping me"
        await client.close()

    def broken(client: ScriptedClient, line: str) -> None:
        raise ValueError("handler bug")

    with pytest.raises(ValueError, match="handler bug"):
        async with ScriptedIRCServer(broken) as server:
            reader, writer = await asyncio.open_connection(HOST, server.port)
            writer.write(b"NICK x\r\n")
            await reader.read()  # the server drops the connection after the error
            writer.close()
            await writer.wait_closed()
