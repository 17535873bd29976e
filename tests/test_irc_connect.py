"""IRC connection handling: SASL when services are down, failures, logs, exit status.

Against the scripted server of ``tests/ircservers.py`` (to script what real
networks do: services relinking, fakelag on QUIT, a rejected login) and real
servers (miniircd, ngircd), with the real irc3 stack and the real CLI.
"""

from __future__ import annotations

import asyncio
import logging
import signal

import pytest

from agentik.transports.base import TransportFailed
from agentik.transports.irc.transport import IRCTransport
from helpers import AGENTIK, clean_env

from ircservers import ScriptedIRCServer, registration_handler, sasl_plain

pytest_plugins = ["ircservers"]

SASL = {"sasl_mechanism": "plain", "sasl_username": "bot", "sasl_password": "pw-secret"}
FAST = {"tls": False, "reconnect_min": 0.1, "reconnect_max": 0.2}


class _NullSink:
    async def handle(self, message, transport):
        return None


def _transport(port: int, **settings) -> IRCTransport:
    return IRCTransport(name="s", settings={"port": port, **FAST, **settings})


async def _logged(caplog, predicate) -> logging.LogRecord:
    """The first log record matching ``predicate``, waiting for it."""
    async with asyncio.timeout(60):
        while True:
            for record in caplog.records:
                if predicate(record):
                    return record
            await asyncio.sleep(0.02)


def _saying(text: str):
    return lambda record: text in record.getMessage()


async def _synced(client, server, tag: str) -> None:
    """Wait until the bot handled everything the server sent this client so far."""
    since = server.mark()
    client.send(f"PING :{tag}")
    await server.wait_for_line(f"PONG {tag}", since=since)


def _services_down(base):
    """A handler whose clients are not offered ``sasl`` until the test says so."""

    async def handler(client, line):
        client.state.setdefault("caps_offered", ["message-tags", "server-time"])
        await base(client, line)

    return handler


# -- SASL configured, the server does not offer it ---------------------------------------------


async def test_sasl_not_offered_holds_registration_until_cap_new_sasl(caplog):
    base = registration_handler(
        caps_offered="sasl message-tags", sasl=sasl_plain("bot", "pw-secret")
    )
    async with ScriptedIRCServer(_services_down(base)) as server:
        t = _transport(server.port, channels=["#room"], sasl_wait=600, **SASL)
        await t.start(_NullSink())
        try:
            await server.wait_for_line("CAP REQ")  # the other caps: message-tags, server-time
            client = await server.wait_for_client(0)
            await _synced(client, server, "after-ack")
            warning = await _logged(caplog, _saying("does not offer SASL"))
            assert warning.levelno == logging.WARNING
            assert "not registering without logging in" in warning.getMessage()
            # Registration is held: no CAP END, so the server never registered us.
            assert "CAP END" not in server.received
            assert not client.registered and not t.registered.is_set()
            assert not any(line.startswith("JOIN") for line in server.received)
            # The services are back: the server announces sasl (cap-notify).
            client.state["caps_offered"] = ["message-tags", "server-time", "sasl"]
            client.send(f":{server.name} CAP agentik NEW :sasl")
            await asyncio.wait_for(t.registered.wait(), 60)
            await server.wait_for_line("JOIN #room")
            lines = server.received
            order = ["CAP REQ sasl", "AUTHENTICATE PLAIN", "CAP END", "JOIN #room"]
            assert [lines.index(x) for x in order] == sorted(lines.index(x) for x in order)
            assert client.state["sasl_payloads"] == [b"bot\0bot\0pw-secret"]
            assert len(server.clients) == 1
            assert "pw-secret" not in caplog.text
        finally:
            await t.aclose()


async def test_sasl_not_offered_reconnects_after_sasl_wait_and_logs_in_later(caplog):
    base = registration_handler(
        caps_offered="sasl message-tags", sasl=sasl_plain("bot", "pw-secret")
    )

    async def handler(client, line):
        if client.index == 0:  # services down during the first connection only
            client.state.setdefault("caps_offered", ["message-tags"])
        await base(client, line)

    async with ScriptedIRCServer(handler) as server:
        t = _transport(server.port, channels=["#room"], sasl_wait=0.5, **SASL)
        await t.start(_NullSink())
        try:
            await asyncio.wait_for(t.registered.wait(), 60)
            await server.wait_for_line("JOIN #room")
            first, second = server.clients[0], server.clients[1]
            # The first connection waited, then quit without ever finishing registration.
            assert any(line.startswith("QUIT") for line in first.received)
            assert "CAP END" not in first.received and not first.registered
            assert not any(line.startswith("JOIN") for line in first.received)
            # The second one logged in before registering.
            assert second.received.index("AUTHENTICATE PLAIN") < second.received.index("CAP END")
            hang_up = await _logged(caplog, _saying("no SASL login within 0.5 s"))
            assert hang_up.levelno == logging.WARNING
        finally:
            await t.aclose()


async def test_sasl_required_false_registers_with_a_warning_and_logs_in_when_offered(caplog):
    base = registration_handler(
        caps_offered="sasl message-tags", sasl=sasl_plain("bot", "pw-secret")
    )
    async with ScriptedIRCServer(_services_down(base)) as server:
        t = _transport(server.port, channels=["#room"], sasl_required=False, **SASL)
        await t.start(_NullSink())
        try:
            await asyncio.wait_for(t.registered.wait(), 60)
            await server.wait_for_line("JOIN #room")
            warning = await _logged(caplog, _saying("registering WITHOUT logging in"))
            assert warning.levelno == logging.WARNING
            client = server.clients[0]
            assert "AUTHENTICATE PLAIN" not in client.received
            client.state["caps_offered"] = ["message-tags", "server-time", "sasl"]
            client.send(f":{server.name} CAP agentik NEW :sasl")
            caplog.set_level(logging.INFO, logger="agentik.transports.irc")
            await _logged(caplog, _saying("logged in as bot (SASL)"))
            assert client.state["sasl_payloads"] == [b"bot\0bot\0pw-secret"]
            assert t.failed is None and len(server.clients) == 1
        finally:
            await t.aclose()


async def test_sasl_required_false_logs_in_after_services_return_without_cap_new(caplog):
    """InspIRCd 3 after a services-only restart offers `sasl` again but sends no
    `CAP NEW`: the bot asks again (CAP LS) every sasl_wait seconds and logs in."""
    base = registration_handler(
        caps_offered="sasl message-tags", sasl=sasl_plain("bot", "pw-secret")
    )
    caplog.set_level(logging.INFO, logger="agentik.transports.irc")
    async with ScriptedIRCServer(_services_down(base)) as server:
        t = _transport(server.port, channels=["#room"], sasl_required=False, sasl_wait=0.5, **SASL)
        await t.start(_NullSink())
        try:
            await asyncio.wait_for(t.registered.wait(), 60)
            await server.wait_for_line("JOIN #room")
            client = server.clients[0]
            assert "AUTHENTICATE PLAIN" not in client.received
            client.state["caps_offered"] = ["message-tags", "server-time", "sasl"]  # no CAP NEW
            await _logged(caplog, _saying("logged in as bot (SASL)"))
            assert client.state["sasl_payloads"] == [b"bot\0bot\0pw-secret"]
            assert t.account == "bot" and t.failed is None and len(server.clients) == 1
        finally:
            await t.aclose()


@pytest.mark.parametrize("required", [False, True])
async def test_hung_services_bound_the_sasl_login_with_our_own_timeout(caplog, required):
    """The server offers SASL but its services never answer AUTHENTICATE: after
    sasl_wait the bot says so and registers without the login (sasl_required =
    false) or leaves to retry (true), instead of waiting silently."""

    def silent(client, line):  # services that hang
        return None

    async with ScriptedIRCServer(registration_handler(sasl=silent)) as server:
        t = _transport(server.port, channels=["#room"], sasl_required=required, sasl_wait=1, **SASL)
        await t.start(_NullSink())
        try:
            said = await _logged(caplog, _saying("the SASL login got no answer within 1 s"))
            assert said.levelno == logging.WARNING
            if required:
                assert "disconnecting, will retry" in said.getMessage()
                await server.wait_for_line("QUIT reconnecting")
            else:
                assert "going on WITHOUT logging in" in said.getMessage()
                await server.wait_for_line("AUTHENTICATE *")
                await server.wait_for_line("JOIN #room")
                assert t.failed is None
        finally:
            await t.aclose()


async def test_a_refused_capability_request_still_logs_in_with_sasl_alone():
    base = registration_handler(
        caps_offered="sasl echo-message message-tags", sasl=sasl_plain("bot", "pw-secret")
    )

    async def picky(client, line):
        if line.startswith("CAP REQ") and "echo-message" in line:  # offered, then refused
            client.send(f":{client.server.name} CAP * NAK :{line.split(' ', 2)[2].lstrip(':')}")
            return
        await base(client, line)

    async with ScriptedIRCServer(picky) as server:
        t = _transport(server.port, **SASL)
        await t.start(_NullSink())
        try:
            await asyncio.wait_for(t.registered.wait(), 60)
            lines = server.received
            assert lines.index("CAP REQ sasl") < lines.index("AUTHENTICATE PLAIN")
            assert lines.index("AUTHENTICATE PLAIN") < lines.index("CAP END")
        finally:
            await t.aclose()


async def test_a_server_without_cap_support_is_left_when_sasl_is_required(caplog):
    base = registration_handler(caps_offered="")

    async def no_cap(client, line):
        if line.startswith("CAP"):
            client.reply("421", "CAP", "Unknown command")
            return
        await base(client, line)

    async with ScriptedIRCServer(no_cap) as server:
        t = _transport(server.port, channels=["#room"], **SASL)
        await t.start(_NullSink())
        try:
            await server.wait_for_line("QUIT")
            await server.wait_for_line("QUIT")  # and again after reconnecting
            await _logged(caplog, _saying("registered us without SASL"))
        finally:
            await t.aclose()
        assert not any(line.startswith(("JOIN", "PRIVMSG")) for line in server.received)


async def test_a_rejected_login_is_a_permanent_failure_and_serve_raises(caplog):
    handler = registration_handler(sasl=sasl_plain("bot", "other", succeed=False))
    async with ScriptedIRCServer(handler) as server:
        t = _transport(server.port, **SASL)
        await t.start(_NullSink())
        try:
            with pytest.raises(TransportFailed, match=r"SASL PLAIN login rejected \(904\)"):
                await asyncio.wait_for(t.serve(), 60)
            assert len(server.clients) == 1  # not retried
            assert not [r for r in caplog.records if r.levelno >= logging.CRITICAL]
        finally:
            await t.aclose()


# -- shutdown -----------------------------------------------------------------------------------


async def test_shutdown_logs_nothing_critical_even_when_the_server_is_slow_to_hang_up(caplog):
    """Under fakelag a server handles QUIT late; we hang up ourselves, quietly."""
    base = registration_handler(caps_offered="")

    async def fakelag(client, line):
        if not line.startswith("QUIT"):  # QUIT is held back: the server keeps the link
            await base(client, line)

    async with ScriptedIRCServer(fakelag) as server:
        t = _transport(server.port)
        await t.start(_NullSink())
        await asyncio.wait_for(t.registered.wait(), 60)
        await t.aclose()
        await server.wait_for_line("QUIT")
        await asyncio.wait_for(server.clients[0].disconnected, 60)
    ours = [r for r in caplog.records if r.name.startswith(("agentik", "irc3"))]
    errors = [r.getMessage() for r in ours if r.levelno >= logging.ERROR]
    assert errors == []


async def test_start_and_stop_against_a_real_server_log_nothing_critical(irc_server, caplog):
    t = _transport(irc_server.port, channels=["#quiet"])
    await t.start(_NullSink())
    try:
        await asyncio.wait_for(t.registered.wait(), 60)
    finally:
        await t.aclose()
    ours = [r for r in caplog.records if r.name.startswith(("agentik", "irc3"))]
    assert [r.getMessage() for r in ours if r.levelno >= logging.ERROR] == []


# -- what the log says -------------------------------------------------------------------------


async def test_start_up_facts_and_a_restored_connection_are_logged(caplog):
    caplog.set_level(logging.INFO, logger="agentik.transports.irc")
    async with ScriptedIRCServer(registration_handler(caps_offered="")) as server:
        t = _transport(server.port, channels=["#room"])
        await t.start(_NullSink())
        try:
            await _logged(caplog, _saying("joined #room"))
            messages = [r.getMessage() for r in caplog.records]
            assert f"irc s: connecting to 127.0.0.1:{server.port} (plain text)" in messages
            assert f"irc s: connected to 127.0.0.1:{server.port} (plain text)" in messages
            assert "irc s: registered as agentik on Test" in messages
            server.clients[0].close()  # the server drops us
            lost = await _logged(caplog, _saying("lost"))
            restored = await _logged(caplog, _saying("connection restored"))
            assert lost.levelno == restored.levelno == logging.WARNING
            assert restored.getMessage().startswith("irc s: registered as agentik on Test")
        finally:
            await t.aclose()


async def test_tls_to_a_plain_text_server_names_the_error_and_suggests_tls_false(caplog):
    # Like InspIRCd or Solanum, the server greets first: the TLS handshake reads IRC.
    greeting = ["NOTICE * :*** Looking up your hostname..."]
    async with ScriptedIRCServer(
        registration_handler(caps_offered=""), greeting=greeting
    ) as server:
        caplog.set_level(logging.INFO, logger="agentik.transports.irc")
        t = _transport(server.port, tls=True, reconnect_min=30, reconnect_max=30)
        await t.start(_NullSink())
        try:
            failure = await _logged(caplog, _saying("cannot connect"))
        finally:
            await t.aclose()
    text = failure.getMessage()
    assert failure.levelno == logging.WARNING
    assert "TLS handshake failed: SSLError" in text
    assert "set tls = false" in text
    messages = [r.getMessage() for r in caplog.records]
    assert f"irc s: connecting to 127.0.0.1:{server.port} (TLS)" in messages


async def test_tls_to_a_silent_plain_text_server_times_out_and_suggests_tls_false(ngircd, caplog):
    # ngircd waits for a line; the TLS ClientHello never ends one: the handshake hangs.
    t = _transport(ngircd.port, tls=True, connect_timeout=5, reconnect_min=30, reconnect_max=30)
    await t.start(_NullSink())
    try:
        failure = await _logged(caplog, _saying("cannot connect"))
    finally:
        await t.aclose()
    text = failure.getMessage()
    assert "TLS handshake timed out after 5 s" in text
    assert "answers in plain text on this port: set tls = false" in text


async def test_a_refused_connection_names_the_reason(caplog):
    async with ScriptedIRCServer() as server:
        port = server.port
    t = _transport(port, reconnect_min=30, reconnect_max=30)  # nothing listens there now
    await t.start(_NullSink())
    try:
        failure = await _logged(caplog, _saying("cannot connect"))
    finally:
        await t.aclose()
    assert f"cannot connect to 127.0.0.1:{port}: ConnectionRefusedError" in failure.getMessage()


# -- agentik run: exit status -------------------------------------------------------------------


def _config(tmp_path, openai_server, transports: dict[str, int]) -> str:
    text = f"""
[llm]
base_url = "{openai_server.base_url}"
model = "fake-model"
[storage]
path = "{tmp_path / "bot.db"}"
"""
    for name, port in transports.items():
        text += f"""
[transports.{name}]
type = "irc"
host = "127.0.0.1"
port = {port}
tls = false
nick = "agentik"
reconnect_min = 0.1
reconnect_max = 0.2
"""
        if name.startswith("locked"):
            text += 'sasl_mechanism = "plain"\nsasl_username = "bot"\n'
            text += 'sasl_password = "${IRC_TEST_SASL}"\n'
    path = tmp_path / "bot.toml"
    path.write_text(text)
    return str(path)


async def test_agentik_run_exits_1_when_its_only_transport_fails(openai_server, tmp_path):
    handler = registration_handler(sasl=sasl_plain("bot", "right", succeed=False))
    async with ScriptedIRCServer(handler) as server:
        config = _config(tmp_path, openai_server, {"locked": server.port})
        proc = await asyncio.create_subprocess_exec(
            AGENTIK, "run", "-c", config, env=clean_env(IRC_TEST_SASL="wrong-secret"),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            _, err = await asyncio.wait_for(proc.communicate(), 90)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    stderr = err.decode()
    assert proc.returncode == 1, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("agentik: irc locked: SASL PLAIN login rejected (904)"), stderr
    assert "Traceback" not in stderr and "CRITICAL" not in stderr
    assert "wrong-secret" not in stderr


async def test_agentik_run_keeps_serving_when_one_of_two_transports_fails(openai_server, tmp_path):
    rejecting = registration_handler(sasl=sasl_plain("bot", "right", succeed=False))
    async with (
        ScriptedIRCServer(rejecting) as locked,
        ScriptedIRCServer(registration_handler(caps_offered="")) as open_server,
    ):
        config = _config(tmp_path, openai_server, {"locked": locked.port, "open": open_server.port})
        proc = await asyncio.create_subprocess_exec(
            AGENTIK, "run", "-c", config, env=clean_env(IRC_TEST_SASL="wrong-secret"),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        lines: list[str] = []
        try:
            assert proc.stderr is not None
            async with asyncio.timeout(90):
                while not any("transport locked failed" in line for line in lines):
                    raw = await proc.stderr.readline()
                    assert raw, "agentik ended early:\n" + "".join(lines)
                    lines.append(raw.decode())
            failed = next(line for line in lines if "transport locked failed" in line)
            assert "ERROR" in failed and "1 other transport(s) keep running" in failed
            # The other network still answers.
            client = await open_server.wait_for_client(0)
            await asyncio.wait_for(asyncio.shield(_registered(client)), 60)
            client.send(":alice!a@h PRIVMSG agentik :still there?")
            answer = await open_server.wait_for_line(lambda x: x.startswith("PRIVMSG alice"))
            assert "still there?" in answer
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0, "".join(lines)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def _registered(client) -> None:
    while not client.registered:  # noqa: ASYNC110
        await asyncio.sleep(0.02)
