"""Services recovery of a taken nick (issue 32): a worker taking over an IRC connection
finds the dead owner's session still holding the nick (until the server's ping
timeout) and asks NickServ to free it.

The services are real: Atheme (Debian's ``atheme-services``, installed by ``make
irc-servers`` as ngircd is) linked to a real ngircd as a services server.  The old
session is a client that still answers the server's PINGs: it would hold the nick
for as long as it lives, so a bot that gets the nick did not wait for a ping timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest_asyncio

from agentik.core.testing.scripted import Reply
from agentik.transports.irc.transport import IRCTransport

from ircservers import (
    IRCServerProcess,
    IRCTestClient,
    ScriptedIRCServer,
    missing_server,
    registration_handler,
    sasl_plain,
    start_ngircd,
)
from rigs import eventually, irc_bot, joined, said_by_bot

pytest_plugins = ["ircservers"]

PASSWORD = "s3cret-Ghost-pw"
_LINK_PASSWORD = "agentik-link"
_SERVICES = "services.ngircd.test"


@dataclass
class Network:
    """ngircd with Atheme's NickServ linked to it."""

    ircd: IRCServerProcess
    services: subprocess.Popen[bytes]
    log: Path

    @property
    def port(self) -> int:
        return self.ircd.port


def _atheme_conf(port: int, workdir: Path) -> str:
    modules = ["protocol/ngircd", "backend/opensex", "crypto/pbkdf2v2", "nickserv/main",
               "nickserv/register", "nickserv/identify", "nickserv/ghost", "nickserv/enforce",
               "nickserv/info", "nickserv/help"]  # fmt: skip
    loads = "".join(f'loadmodule "modules/{m}";\n' for m in modules)
    return f"""{loads}
pbkdf2v2 {{ }};
serverinfo {{
    name = "{_SERVICES}"; desc = "Atheme for the agentik tests"; numeric = "00A";
    recontime = 1; netname = "AgentikTest"; hidehostsuffix = "users.test";
    adminname = "tests"; adminemail = "tests@example.invalid";
    registeremail = "noreply@example.invalid"; loglevel = {{ error; info; admin; network; }};
    maxlogins = 5; maxusers = 50; mdlimit = 30; emaillimit = 10; emailtime = 300;
    auth = none; casemapping = rfc1459;
}};
uplink "irc.ngircd.test" {{
    host = "127.0.0.1"; port = {port};
    send_password = "{_LINK_PASSWORD}"; receive_password = "{_LINK_PASSWORD}";
}};
nickserv {{
    nick = "NickServ"; user = "NickServ"; host = "{_SERVICES}"; real = "Nickname Services";
    maxnicks = 5; expire = 30;
}};
logfile "{workdir / "atheme-all.log"}" {{ all; }};
general {{
    flood_msgs = 0; flood_time = 10; ratelimit_uses = 1000; ratelimit_period = 60;
    kline_time = 7; commit_interval = 5; default_clone_allowed = 50;
    default_clone_warn = 40; uplink_sendq_limit = 1048576; language = "en";
    immune_level = immune;
}};
"""


@pytest_asyncio.fixture
async def network(tmp_path: Path) -> AsyncIterator[Network]:
    """ngircd and Atheme linked: NickServ answers REGISTER, IDENTIFY, GHOST, REGAIN."""
    binary = shutil.which("atheme-services") or "/usr/bin/atheme-services"
    if not os.access(binary, os.X_OK):
        missing_server(
            "atheme-services is not installed; run 'make test' as root or:"
            " apt-get install atheme-services"
        )
    ircd = await start_ngircd(tmp_path)
    workdir = tmp_path / "atheme"
    (workdir / "data").mkdir(parents=True)
    try:
        # The services' link: a [Server] block in ngircd's include folder, then a restart.
        assert ircd.config_path is not None
        (ircd.config_path.parent / "conf.d" / "services.conf").write_text(
            f"[Server]\n    Name = {_SERVICES}\n    MyPassword = {_LINK_PASSWORD}\n"
            f"    PeerPassword = {_LINK_PASSWORD}\n    ServiceMask = *Serv\n"
        )
        await ircd.restart()
        conf = workdir / "atheme.conf"
        conf.write_text(_atheme_conf(ircd.port, workdir))
        log = workdir / "atheme.log"
        with log.open("ab") as out:
            services = await asyncio.to_thread(
                subprocess.Popen,
                [binary, "-n", "-c", str(conf), "-l", str(log), "-p", str(workdir / "pid"),
                 "-D", str(workdir / "data")],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=workdir, start_new_session=True,
            )  # fmt: skip
    except BaseException:
        await ircd.stop()
        raise
    net = Network(ircd, services, log)
    try:
        await _services_answer(net)
        yield net
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(services.pid, signal.SIGKILL)
        await asyncio.to_thread(services.wait)
        await ircd.stop()


async def _services_answer(net: Network) -> None:
    """Wait until NickServ answers (the services linked and burst)."""
    probe = await IRCTestClient.connect(net.port, "probe")
    try:
        for _ in range(600):
            if net.services.poll() is not None:
                raise RuntimeError(f"atheme exited: {net.log.read_text(errors='replace')}")
            since = probe.mark()
            probe.privmsg("NickServ", "HELP")
            await probe.sync()
            if probe.peek(lambda m: m.nick == "NickServ", since=since):
                return
            if not probe.peek(lambda m: m.command == "401", since=since):
                # Not "no such nick": NickServ is there; its answer is on its way.
                await probe.wait_for(lambda m: m.nick == "NickServ", 60, since=since)
                return
            await asyncio.sleep(0.1)  # polling a process coming up, not timing a result
        raise RuntimeError(f"NickServ never answered: {net.log.read_text(errors='replace')}")
    finally:
        await probe.quit()


async def old_session(port: int, *, register: bool = True) -> IRCTestClient:
    """The dead owner's session that lingers: it holds ``agentik`` (registered to
    PASSWORD with NickServ when ``register``) and sits in #room."""
    ghost = await IRCTestClient.connect(port, "agentik")
    if register:
        ghost.privmsg("NickServ", f"REGISTER {PASSWORD} bot@example.invalid")
        await ghost.wait_for(lambda m: m.nick == "NickServ" and "registered" in m.text, 60)
    await ghost.join("#room")
    return ghost


def _no_password_anywhere(caplog, transport: IRCTransport, password: str) -> None:
    records = [r.getMessage() + repr(getattr(r, "__dict__", {})) for r in caplog.records]
    assert not [r for r in records if password in r]
    assert password not in repr(transport.health)
    assert password not in str(transport.failed)


async def test_a_lingering_session_is_ghosted_and_the_nick_taken_back(network, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    ghost = await old_session(network.port)
    async with irc_bot(network.port, tmp_path, channels=["#room"], nickserv_password=PASSWORD) as (
        bot,
        model,
        agent,
        _,
    ):
        # The old session answers every PING: only the services can have freed the nick.
        await ghost.wait_closed(60)
        assert any("ghost" in m.text.lower() for m in ghost.received if m.command == "ERROR")
        await eventually(lambda: bot.nick == "agentik", "the nick back")
        await joined(bot, "#room")
        alice = await IRCTestClient.connect(network.port, "alice")
        await alice.join("#room")

        # Logged in again under the nick: NickServ marks it registered (+R; WHOIS 307).
        async def identified() -> bool:
            since = alice.mark()
            alice.send_raw("WHOIS agentik")
            await alice.wait_for(lambda m: m.command == "318", 60, since=since)
            return alice.peek(lambda m: m.command == "307", since=since) is not None

        await eventually(identified, "agentik identified with NickServ")
        model.enqueue(Reply(text="back"))
        alice.privmsg("#room", "agentik: are you there?")
        answer = await alice.wait_for(said_by_bot, 60)
        assert answer.text == "alice: back"
        _no_password_anywhere(caplog, bot, PASSWORD)
        await alice.quit()
    await ghost.close()


async def test_services_that_do_not_know_a_command_get_the_next(network, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    ghost = await old_session(network.port)
    async with irc_bot(
        network.port, tmp_path, channels=["#room"], nickserv_password=PASSWORD,
        nickserv_recover=["RECOVER", "GHOST"],  # Atheme has no RECOVER (Anope's)
    ) as (bot, *_):  # fmt: skip
        await ghost.wait_closed(60)
        await eventually(lambda: bot.nick == "agentik", "the nick back")
        said = [r.getMessage() for r in caplog.records if "NickServ" in r.getMessage()]
        assert any("(RECOVER)" in line for line in said)
        assert any("(GHOST)" in line for line in said)
        _no_password_anywhere(caplog, bot, PASSWORD)
    await ghost.close()


async def test_a_wrong_password_keeps_the_alternate_nick_until_the_holder_leaves(
    network, tmp_path, caplog
):
    caplog.set_level(logging.DEBUG)
    wrong = "not-the-Password-9"
    ghost = await old_session(network.port)
    async with irc_bot(
        network.port, tmp_path, channels=["#room"], nickserv_password=wrong,
        joined_to=["#room"],
    ) as (bot, *_):  # fmt: skip
        refused = await eventually(
            lambda: [r for r in caplog.records if "could not free the nick" in r.getMessage()],
            "the refusal logged",
        )
        assert refused[0].levelno == logging.WARNING
        assert "NickServ refused" in refused[0].getMessage()
        assert bot.nick == "agentik_" and not ghost.closed.done()
        # The old session goes (its ping timeout, here a QUIT): the nick is taken back.
        await ghost.quit()
        await eventually(lambda: bot.nick == "agentik", "the nick back after the holder left")
        _no_password_anywhere(caplog, bot, wrong)


async def test_without_credentials_nothing_is_asked_and_the_nick_is_regained_later(
    network, tmp_path, caplog
):
    caplog.set_level(logging.INFO)
    ghost = await old_session(network.port)
    async with irc_bot(network.port, tmp_path, channels=["#room"], joined_to=["#room"]) as (
        bot,
        *_,
    ):
        assert bot.nick == "agentik_"
        assert any("no services login" in r.getMessage() for r in caplog.records)
        assert not any("asking NickServ" in r.getMessage() for r in caplog.records)
        await ghost.quit()
        await eventually(lambda: bot.nick == "agentik", "the nick back after the holder left")


async def test_a_network_without_services_falls_back_to_regaining(ngircd, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    ghost = await old_session(ngircd.port, register=False)
    async with irc_bot(
        ngircd.port, tmp_path, channels=["#room"], nickserv_password=PASSWORD,
        joined_to=["#room"],
    ) as (bot, *_):  # fmt: skip
        gave_up = await eventually(
            lambda: [r for r in caplog.records if "could not free the nick" in r.getMessage()],
            "the transport to give up on NickServ",
        )
        assert "no NickServ" in gave_up[0].getMessage()
        await ghost.quit()
        await eventually(lambda: bot.nick == "agentik", "the nick back after the holder left")
        _no_password_anywhere(caplog, bot, PASSWORD)


async def test_logged_in_by_sasl_the_password_is_not_sent(caplog):
    """With SASL the services know us: GHOST goes without a password."""
    caplog.set_level(logging.DEBUG)
    base = registration_handler(caps_offered="sasl", sasl=sasl_plain("agentik", PASSWORD))

    async def handler(client, line):
        client.state.setdefault("taken_nicks", ["agentik"])
        if line.startswith("PRIVMSG NickServ :GHOST"):
            client.send(":NickServ!NickServ@services. NOTICE agentik_ :agentik has been ghosted.")
            client.state["taken_nicks"] = []
            return
        await base(client, line)

    async with ScriptedIRCServer(handler) as server:
        t = IRCTransport(
            name="s",
            settings={"port": server.port, "tls": False, "sasl_mechanism": "plain",
                      "sasl_username": "agentik", "sasl_password": PASSWORD},
        )  # fmt: skip

        class Sink:
            async def handle(self, message, transport):  # nothing is said in this test
                return None

        await t.start(Sink())
        try:
            await asyncio.wait_for(t.registered.wait(), 60)
            await server.wait_for_line("PRIVMSG NickServ :GHOST agentik")
            await server.wait_for_line("NICK agentik")
            await eventually(lambda: t.nick == "agentik", "the nick back")
            assert not [line for line in server.received if "NickServ" in line and
                        PASSWORD in line]  # fmt: skip
            _no_password_anywhere(caplog, t, PASSWORD)
        finally:
            await t.aclose()


async def test_services_down_end_the_asking_without_waiting(caplog):
    """A server answering 440 (ERR_SERVICESDOWN) to the NickServ message: the bot
    stops asking at once and keeps its alternate nick."""
    caplog.set_level(logging.INFO)
    base = registration_handler(caps_offered="")

    async def handler(client, line):
        client.state.setdefault("taken_nicks", ["agentik"])
        if line.startswith("PRIVMSG NickServ "):
            client.reply("440", "NickServ", "Services are currently down")
            return
        await base(client, line)

    async with ScriptedIRCServer(handler) as server:
        t = IRCTransport(
            name="s", settings={"port": server.port, "tls": False, "nickserv_password": PASSWORD}
        )

        class Sink:
            async def handle(self, message, transport):  # nothing is said in this test
                return None

        await t.start(Sink())
        try:
            await asyncio.wait_for(t.registered.wait(), 60)
            gave_up = await eventually(
                lambda: [r for r in caplog.records if "could not free" in r.getMessage()],
                "the transport to give up",
            )
            assert "services are down" in gave_up[0].getMessage()
            # GHOST, then (given up) IDENTIFY under the alternate nick, as without recovery.
            assert [line for line in server.received if "NickServ" in line] == [
                f"PRIVMSG NickServ :GHOST agentik {PASSWORD}",
                f"PRIVMSG NickServ :IDENTIFY {PASSWORD}",
            ]
            assert t.nick == "agentik_"
        finally:
            await t.aclose()
