"""Linked channels across workers (issue 33): the IRC connection owned by one worker, the
Slack one by another, on one PostgreSQL database.

Real processes all the way, as tests/test_cluster_failover.py: two ``agentik run``
workers (tests/cluster.py) on a real PostgreSQL (tests/pgserver.py), a real IRC server
(ngircd), the Slack fake (tests/fakeslack.py) and the fake OpenAI-compatible server.  A
line said on IRC reaches the worker owning IRC; its copy for Slack is an outbox row that
the worker owning Slack is told of (ids only) and posts.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable

import asyncpg
import pytest
from cluster import PATIENCE, Worker, last_user, owner_of, until, worker_config

from agentik.core.testing.openai_server import Reply

from fakeslack import FakeSlack
from ircservers import IRCTestClient

pytest_plugins = ["pgserver", "ircservers"]

CHANNEL = "#relay"


def _irc(port: int) -> str:
    return f"""
[transports.libera]
type = "irc"
host = "127.0.0.1"
port = {port}
tls = false
nick = "agentik"
channels = ["{CHANNEL}"]
reconnect_min = 0.2
reconnect_max = 1.0
"""


def _slack(slack: FakeSlack) -> str:
    return f"""
[transports.slack]
type = "slack"
bot_token = "{slack.bot_token}"
app_token = "{slack.app_token}"
api_url = "{slack.api_url}"
conversation_per = "channel"
streaming = "edit"
"""


LINK = f"""
[[links]]
name = "team"
channels = ["irc:libera:{CHANNEL}", "slack:T1:C1"]
icons = {{ libera = ":speech_balloon:" }}
"""


@contextlib.asynccontextmanager
async def _watched(
    alice: IRCTestClient, *workers: Worker, then: Callable[[], None] | None = None
) -> AsyncIterator[None]:
    """A test's body with its workers: on a failure each worker's log tail is printed
    with it; at the end ``then`` runs (a held reply released), alice leaves IRC and the
    workers stop."""
    try:
        yield
    except BaseException:
        for w in workers:
            print(f"--- {w.folder.name}\n{w.stderr()[-6000:]}")
        raise
    finally:
        if then is not None:
            then()
        await alice.close()
        for w in workers:
            w.stop()


def _pair(slack: FakeSlack, ngircd_port: int, tmp_path, openai_url: str, dsn: str,
          access: str = "", link: str = LINK) -> tuple[Worker, Worker]:  # fmt: skip
    """Worker ``s`` (Slack, owned once it starts alone) and ``i`` (IRC, Slack in standby),
    the two channels linked by ``link``."""
    ws = Worker(tmp_path / "s", worker_config("s", openai_url, before_cluster=access,
                                               extra=_slack(slack) + link), dsn)  # fmt: skip
    wi = Worker(tmp_path / "i", worker_config("i", openai_url, before_cluster=access,
                                               extra=_irc(ngircd_port) + _slack(slack) + link),
                dsn)  # fmt: skip
    return ws, wi


async def _start_pair(ws: Worker, wi: Worker, slack: FakeSlack, alice: IRCTestClient) -> None:
    await alice.join(CHANNEL)
    ws.start()
    await owner_of([ws], "slack")
    await slack.wait_for_socket(1, PATIENCE)
    wi.start()
    await owner_of([wi], "libera")
    await alice.wait_for(
        lambda m: m.command == "JOIN" and (m.nick or "").startswith("agentik"), PATIENCE
    )


async def _start_irc_first(ws: Worker, wi: Worker, slack: FakeSlack, alice: IRCTestClient) -> None:
    """``i``, started first, owns IRC; then ``s`` starts, and Slack is connected by
    whichever of the two took it (``i`` has a Slack table too)."""
    await alice.join(CHANNEL)
    wi.start()
    await owner_of([wi], "libera")
    await alice.wait_for(
        lambda m: m.command == "JOIN" and (m.nick or "").startswith("agentik"), PATIENCE
    )
    ws.start()
    await owner_of([ws, wi], "slack")
    await slack.wait_for_socket(1, PATIENCE)


async def _relays_waiting(dsn: str) -> int:
    """Relayed copies in the outbox not confirmed delivered yet (straight from the database)."""
    conn = await asyncpg.connect(dsn)
    try:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM outbox WHERE kind = 'relay' AND state != 'confirmed'"
            )
        )
    finally:
        await conn.close()


async def _none_waiting(dsn: str) -> bool:
    return await _relays_waiting(dsn) == 0


@pytest.mark.timeout(400)  # two workers started one after the other on a loaded machine
async def test_a_line_on_irc_reaches_slack_through_the_worker_owning_slack(
    ngircd, postgres_dsn, openai_server, tmp_path
) -> None:
    """Worker ``s`` owns Slack (it alone has it at first), worker ``i`` owns IRC and keeps
    Slack in standby: people's lines said on IRC reach the Slack channel under their
    names, in order, once each, posted by ``s`` (``i`` never opens a Slack socket)."""
    openai_server.default = lambda body: Reply.text("noted")
    async with FakeSlack() as slack:
        ws = Worker(
            tmp_path / "s",
            worker_config("s", openai_server.base_url, extra=_slack(slack) + LINK),
            postgres_dsn,
        )
        wi = Worker(tmp_path / "i", worker_config("i", openai_server.base_url,
                                                   extra=_irc(ngircd.port) + _slack(slack) + LINK),
                    postgres_dsn)  # fmt: skip
        alice = await IRCTestClient.connect(ngircd.port, "alice")
        async with _watched(alice, ws, wi):
            # ``s`` alone, with Slack only, owns Slack; then IRC is free: ``i`` owns IRC.
            await _start_pair(ws, wi, slack, alice)
            lines = [f"line {i} from irc" for i in range(5)]
            for line in lines:
                alice.privmsg(CHANNEL, line)

            def copies() -> list[dict]:
                return [c for c in slack.calls_to("chat.postMessage")
                        if c.get("channel") == "C1" and c.get("username")]  # fmt: skip

            await until(lambda: len(copies()) >= len(lines) or None, "the copies in Slack")
            got = copies()
            assert [c["text"] for c in got] == lines  # in order, once each
            assert {(c["username"], c.get("icon_emoji")) for c in got} == {
                ("alice@libera", ":speech_balloon:")
            }
            # Posted by the worker owning Slack: it is the only one with a socket, and the
            # copies left the outbox (delivered, none waiting).
            assert slack.socket_connections == 1
            await until(lambda: _none_waiting(postgres_dsn), "the copies confirmed in the outbox")
            # Still Slack's owner: no failover happened on the way.
            assert (await owner_of([ws, wi], "slack")) is ws


@pytest.mark.timeout(400)  # two workers started one after the other on a loaded machine
async def test_an_answer_on_irc_reaches_the_linked_slack_channel_another_worker_owns(
    ngircd, postgres_dsn, openai_server, tmp_path
) -> None:
    """Worker ``s`` owns Slack, worker ``i`` owns IRC: a question asked on IRC is a turn
    that ``i`` runs; ``i`` renders the answer on IRC and writes it to the outbox for the
    linked Slack channel, which ``s`` posts (as the bot, in Slack's formatting): once
    in each place, in the order asked."""
    openai_server.default = lambda body: Reply.text(f"**answer** to: {last_user(body)}")
    async with FakeSlack() as slack:
        ws = Worker(
            tmp_path / "s",
            worker_config("s", openai_server.base_url, extra=_slack(slack) + LINK),
            postgres_dsn,
        )
        wi = Worker(tmp_path / "i", worker_config("i", openai_server.base_url,
                                                   extra=_irc(ngircd.port) + _slack(slack) + LINK),
                    postgres_dsn)  # fmt: skip
        alice = await IRCTestClient.connect(ngircd.port, "alice")
        async with _watched(alice, ws, wi):
            await _start_pair(ws, wi, slack, alice)
            questions = ["how is the build?", "and the deploy?"]
            for q in questions:
                alice.privmsg(CHANNEL, f"agentik: {q}")
                # (one at a time: the second is asked once the first was answered on IRC)
                await alice.wait_for(lambda m, q=q: m.command == "PRIVMSG" and q in m.text,
                                     PATIENCE)  # fmt: skip

            def answers() -> list[dict]:
                return [c for c in slack.calls_to("chat.postMessage")
                        if c.get("channel") == "C1" and not c.get("username")
                        and "to: " in (c.get("text") or "")]  # fmt: skip

            await until(lambda: len(answers()) >= len(questions) or None, "the answers in Slack")
            await until(lambda: _none_waiting_at_all(postgres_dsn), "the outbox delivered")
            alice.privmsg(CHANNEL, "agentik: last one?")  # behind it in every queue
            await alice.wait_for(lambda m: "last one?" in m.text and m.nick != "alice", PATIENCE)
            await until(lambda: len(answers()) > len(questions) or None, "the last answer")
            await alice.sync()
            # Slack: each answer once, in order, posted by the bot (no relayed name), in
            # Slack's formatting (Markdown bold is mrkdwn *bold*); the model saw the asker
            # qualified by network.
            assert [c["text"] for c in answers()] == [
                f"*answer* to: alice@libera: {q}" for q in (*questions, "last one?")
            ]
            # IRC: each answer once, rendered there by the worker that ran the turn.
            said = [m.text for m in alice.received
                    if m.command == "PRIVMSG" and (m.nick or "").startswith("agentik")]  # fmt: skip
            for q in (*questions, "last one?"):
                assert sum(q in line for line in said) == 1, said
            # The questions were relayed to Slack too (under alice's name), once each.
            relayed = [c["text"] for c in slack.calls_to("chat.postMessage") if c.get("username")]
            assert relayed == [f"agentik: {q}" for q in (*questions, "last one?")]
            assert slack.socket_connections == 1
            assert (await owner_of([ws, wi], "slack")) is ws


async def _none_waiting_at_all(dsn: str) -> bool:
    """No outbox row (answers and copies alike) is waiting for its delivery."""
    conn = await asyncpg.connect(dsn)
    try:
        return not await conn.fetchval(
            "SELECT count(*) FROM outbox WHERE state = 'queued'"
            " OR (state = 'sent' AND awaits_confirm)"
        )
    finally:
        await conn.close()


@pytest.mark.timeout(400)
async def test_a_link_changed_in_chat_on_one_worker_is_in_force_on_the_other(
    ngircd, postgres_dsn, openai_server, tmp_path
) -> None:
    """An admin on Slack (worker ``s``) links #side with a Slack channel, then changes the
    link's icon for IRC people with ``!link``: worker ``i``, which owns IRC and relays
    #side's lines, shows the new icon from the next line on (the ``links`` topic)."""
    openai_server.default = lambda body: Reply.text("ok")
    access = '[access]\nadmins = ["slack:T1:U9"]\n'
    irc = _irc(ngircd.port).replace(f'["{CHANNEL}"]', f'["{CHANNEL}", "#side"]')
    async with FakeSlack() as slack:
        slack.add_user("U9", "root")
        ws = Worker(tmp_path / "s", worker_config("s", openai_server.base_url,
                                                   before_cluster=access, extra=_slack(slack)),
                    postgres_dsn)  # fmt: skip
        wi = Worker(tmp_path / "i", worker_config("i", openai_server.base_url,
                                                   before_cluster=access,
                                                   extra=irc + _slack(slack)),
                    postgres_dsn)  # fmt: skip
        alice = await IRCTestClient.connect(ngircd.port, "alice")
        async with _watched(alice, ws, wi):
            await alice.join("#side")
            ws.start()
            await owner_of([ws], "slack")
            await slack.wait_for_socket(1, PATIENCE)
            wi.start()
            await owner_of([wi], "libera")
            await alice.wait_for(
                lambda m: m.command == "JOIN" and (m.nick or "").startswith("agentik"), PATIENCE
            )
            at = f"<@{slack.bot_user_id}> "

            def said(words: str) -> bool:
                return any(
                    words in (c.get("text") or "") for c in slack.calls_to("chat.postMessage")
                )

            def copy(text: str) -> dict | None:
                return next((c for c in slack.calls_to("chat.postMessage")
                             if c.get("username") and c.get("text") == text), None)  # fmt: skip

            link = at + "!link side irc:libera:#side icons.libera=:one:"
            await slack.push_event(slack.message_event("C2", link, user="U9"))
            await until(lambda: said("linked side") or None, "the link made")
            # i reads it (the links topic) and relays #side with the first icon.
            alice.privmsg("#side", "first")
            await until(lambda: copy("first"), "the first copy")
            assert copy("first")["icon_emoji"] == ":one:"  # type: ignore[index]
            await slack.push_event(
                slack.message_event("C2", at + "!link side icons.libera=:two:", user="U9")
            )
            await until(lambda: said("changed side") or None, "the link changed")

            tries = iter(range(1_000))

            async def relayed_with_two() -> bool:
                # (i reads the change as the links topic tells it: a line said before
                # that may still show the first icon, so lines are said until one shows)
                text = f"again {next(tries)}"
                alice.privmsg("#side", text)
                got = await until(lambda: copy(text), f"the copy of {text!r}")
                return got["icon_emoji"] == ":two:"

            await until(relayed_with_two, "a copy with the new icon")


def _slack_app(name: str, slack: FakeSlack) -> str:
    return _slack(slack).replace("[transports.slack]", f"[transports.{name}]")


@pytest.mark.timeout(500)  # three workers started one after the other on a loaded machine
async def test_two_slack_apps_owned_by_two_workers_both_get_copies_and_answers(
    ngircd, postgres_dsn, openai_server, tmp_path
) -> None:
    """Two Slack apps (teams T1 and T2), each owned by its own worker, and IRC owned by a
    third that holds both apps in standby: it learns each app's team (``auth.test``, no
    socket), so a line said on IRC and the answer to a question asked there reach both
    teams' linked channels, each through the worker owning that app, once each.

    Lines said on IRC before the third worker knows app two's team (its ``auth.test``
    answered late) wait for it: their copies are not lost."""
    openai_server.default = lambda body: Reply.text(f"answer to: {last_user(body)}")
    link = f"""
[[links]]
name = "team"
channels = ["irc:libera:{CHANNEL}", "slack:T1:C1", "slack:T2:C1"]
"""
    async with FakeSlack() as one, FakeSlack(team_id="T2") as two:
        apps = _slack_app("one", one) + _slack_app("two", two)
        crew = [
            Worker(tmp_path / "a", worker_config("a", openai_server.base_url,
                                                  extra=_slack_app("one", one) + link),
                   postgres_dsn),
            Worker(tmp_path / "b", worker_config("b", openai_server.base_url,
                                                  extra=_slack_app("two", two) + link),
                   postgres_dsn),
            Worker(tmp_path / "i", worker_config("i", openai_server.base_url,
                                                  extra=_irc(ngircd.port) + apps + link),
                   postgres_dsn),
        ]  # fmt: skip
        wa, wb, wi = crew
        alice = await IRCTestClient.connect(ngircd.port, "alice")
        async with _watched(alice, *crew):
            await alice.join(CHANNEL)
            wa.start()
            await owner_of([wa], "one")
            await one.wait_for_socket(1, PATIENCE)
            wb.start()
            await owner_of([wb], "two")
            await two.wait_for_socket(1, PATIENCE)
            asked_before = len(two.calls_to("auth.test"))
            two.hold("auth.test")  # i's question: which team is app two in?
            wi.start()
            await owner_of([wi], "libera")
            await alice.wait_for(
                lambda m: m.command == "JOIN" and (m.nick or "").startswith("agentik"), PATIENCE
            )
            await two.wait_until(lambda: "auth.test" in two.held, PATIENCE, "i's auth.test")
            alice.privmsg(CHANNEL, "hello both teams")
            alice.privmsg(CHANNEL, "agentik: are you there?")

            def waiting() -> bool:
                lines = wi.stderr().splitlines()
                return any("links: copies for" in x and "slack:T2:C1" in x for x in lines)

            await until(lambda: waiting() or None, "the copies waiting for app two's team")
            two.release()
            await alice.wait_for(lambda m: "answer to:" in m.text, PATIENCE)

            def posted(slack: FakeSlack) -> list[tuple[str | None, str]]:
                calls = slack.calls_to("chat.postMessage")
                return [(c.get("username"), c.get("text") or "") for c in calls
                        if c.get("channel") == "C1"]  # fmt: skip

            for slack in (one, two):
                await until(lambda s=slack: len(posted(s)) >= 3 or None, "copies and answer")
            await until(lambda: _none_waiting_at_all(postgres_dsn), "the outbox delivered")
            for slack in (one, two):
                assert posted(slack) == [
                    ("alice@libera", "hello both teams"),
                    ("alice@libera", "agentik: are you there?"),
                    (None, "answer to: alice@libera: are you there?"),
                ]
                assert slack.socket_connections == 1  # only its owner connected
            # (i asked app two's team once: the waiting copies shared that one call)
            assert len(two.calls_to("auth.test")) == asked_before + 1
            assert (await owner_of(crew, "one")) is wa
            assert (await owner_of(crew, "two")) is wb


@pytest.mark.timeout(400)
async def test_with_answer_asked_the_slack_channel_another_worker_owns_gets_the_pointer(
    ngircd, postgres_dsn, openai_server, tmp_path
) -> None:
    """``answer = "asked"``: a question asked on IRC (worker ``i``) is answered there; the
    linked Slack channel (worker ``s``) gets the one-line pointer, once, not the answer."""
    openai_server.default = lambda body: Reply.text("only on irc")
    link = LINK.replace('name = "team"', 'name = "team"\nanswer = "asked"')
    async with FakeSlack() as slack:
        ws, wi = _pair(slack, ngircd.port, tmp_path, openai_server.base_url, postgres_dsn,
                       link=link)  # fmt: skip
        alice = await IRCTestClient.connect(ngircd.port, "alice")
        async with _watched(alice, ws, wi):
            await _start_pair(ws, wi, slack, alice)
            alice.privmsg(CHANNEL, "agentik: where?")
            await alice.wait_for(lambda m: "only on irc" in m.text, PATIENCE)
            pointer = f"(answered in irc:libera:{CHANNEL}, asked by alice@libera)"

            def bot_posts() -> list[str]:
                return [c.get("text") or "" for c in slack.calls_to("chat.postMessage")
                        if not c.get("username")]  # fmt: skip

            await until(lambda: any(pointer in t for t in bot_posts()) or None, "the pointer")
            await until(lambda: _none_waiting_at_all(postgres_dsn), "the outbox delivered")
            assert sum(pointer in t for t in bot_posts()) == 1
            assert not any("only on irc" in (m.get("text") or "") for m in slack.messages.values())


@pytest.mark.timeout(500)
async def test_an_answer_from_slack_reaches_irc_on_another_worker_capped_as_the_channel_says(
    ngircd, postgres_dsn, openai_server, tmp_path
) -> None:
    """The other way: a question asked in Slack runs on the worker owning Slack; the
    IRC channel (the other worker's) gets the answer after the relayed question, capped
    at IRC's 4 lines, and ``!more`` there gives the rest.  Once an admin on IRC has set
    the channel's own cap (``!set max_answer_lines 2``, on the worker owning IRC), the
    next answer handed over is capped at 2 lines, and so is each ``!more`` page."""

    def steps(body: dict) -> Reply:
        tag = "again" if "again" in last_user(body) else "first"
        return Reply.text("\n".join(f"{tag} step {n}" for n in range(1, 8)))

    openai_server.default = steps
    lines = [f"first step {n}" for n in range(1, 8)]
    again = [f"again step {n}" for n in range(1, 8)]
    # (no services on ngircd: the IRC admin is named by a hostmask pattern)
    access = '[access]\nadmins = ["libera:mask:alice!*@*"]\n'
    irc = _irc(ngircd.port) + 'unverified_identity = "hostmask"\n'
    async with FakeSlack() as slack:
        slack.add_user("U2", "bob", display_name="bob")
        # (i alone first, with IRC only: it owns IRC; s has both, IRC in standby)
        wi = Worker(tmp_path / "i", worker_config("i", openai_server.base_url,
                                                   before_cluster=access, extra=irc + LINK),
                    postgres_dsn)  # fmt: skip
        ws = Worker(tmp_path / "s", worker_config("s", openai_server.base_url,
                                                   before_cluster=access,
                                                   extra=_slack(slack) + irc + LINK),
                    postgres_dsn)  # fmt: skip
        alice = await IRCTestClient.connect(ngircd.port, "alice")
        async with _watched(alice, ws, wi):
            await _start_irc_first(ws, wi, slack, alice)
            ask = slack.message_event("C1", f"<@{slack.bot_user_id}> the steps?", user="U2")
            await slack.push_event(ask)
            note = await alice.wait_for(lambda m: "more lines: !more" in m.text, PATIENCE)
            assert note.text.startswith("… 3 more lines")

            def from_bot() -> list[str]:
                mine = [m for m in alice.received if (m.nick or "").startswith("agentik")]
                return [m.text for m in mine if m.command == "PRIVMSG"]

            said = from_bot()
            assert "the steps?" in said[0]  # the relayed question first
            assert [t for t in said if t.startswith("first step")] == lines[:4]
            alice.privmsg(CHANNEL, "!more")
            await alice.wait_for(lambda m: m.text == "first step 7", PATIENCE)
            assert [t for t in from_bot() if t.startswith("first step")] == lines
            # The channel's own cap, set in chat on IRC, applies to answers handed over.
            alice.privmsg(CHANNEL, "!set max_answer_lines 2")
            await alice.wait_for(lambda m: "max_answer_lines is now 2" in m.text, PATIENCE)
            ask = slack.message_event("C1", f"<@{slack.bot_user_id}> again?", user="U2")
            await slack.push_event(ask)
            note = await alice.wait_for(lambda m: "5 more lines: !more" in m.text, PATIENCE)
            assert [t for t in from_bot() if t.startswith("again step")] == again[:2]
            alice.privmsg(CHANNEL, "!more")
            await alice.wait_for(lambda m: "3 more lines: !more" in m.text, PATIENCE)
            assert [t for t in from_bot() if t.startswith("again step")] == again[:4]


@pytest.mark.timeout(400)
async def test_a_question_in_a_slack_thread_is_answered_in_the_thread_and_on_irc(
    ngircd, postgres_dsn, openai_server, tmp_path
) -> None:
    """Worker ``i`` owns IRC, worker ``s`` Slack: a question asked in a thread of the linked
    Slack channel is answered in that thread (its ``thread_ts``), never in the channel
    itself, and on IRC (the other worker's) once, after the relayed question."""
    openai_server.default = lambda body: Reply.text(f"answer to: {last_user(body)}")
    async with FakeSlack() as slack:
        slack.add_user("U2", "bob", display_name="bob")
        wi = Worker(tmp_path / "i", worker_config("i", openai_server.base_url,
                                                   extra=_irc(ngircd.port) + LINK),
                    postgres_dsn)  # fmt: skip
        ws = Worker(tmp_path / "s", worker_config("s", openai_server.base_url,
                                                   extra=_slack(slack) + _irc(ngircd.port) + LINK),
                    postgres_dsn)  # fmt: skip
        alice = await IRCTestClient.connect(ngircd.port, "alice")
        async with _watched(alice, ws, wi):
            await _start_irc_first(ws, wi, slack, alice)
            root = slack.message_event("C1", "a thread about the deploy", user="U2")
            await slack.push_event(root)
            await alice.wait_for(lambda m: "a thread about the deploy" in m.text, PATIENCE)
            ask = slack.message_event(
                "C1", f"<@{slack.bot_user_id}> which step failed?", user="U2",
                thread_ts=root["ts"],
            )  # fmt: skip
            await slack.push_event(ask)
            answer = "answer to: bob (Slack): which step failed?"
            await alice.wait_for(lambda m: m.text == answer, PATIENCE)

            def in_slack() -> list[dict]:
                return [m for m in slack.messages.values()
                        if answer in (m.get("text") or "")]  # fmt: skip

            await until(lambda: in_slack() or None, "the answer in Slack")
            await until(lambda: _none_waiting_at_all(postgres_dsn), "the outbox delivered")
            assert [m.get("thread_ts") for m in in_slack()] == [root["ts"]]
            said = [m.text for m in alice.received
                    if m.command == "PRIVMSG" and (m.nick or "").startswith("agentik")]  # fmt: skip
            assert sum(answer == line for line in said) == 1
            asked = next(i for i, line in enumerate(said) if "which step failed?" in line)
            assert asked < said.index(answer)  # the relayed question first


async def _stored(dsn: str, words: str) -> bool:
    """A user message holding ``words`` is in the audit log (straight from the database)."""
    conn = await asyncpg.connect(dsn)
    try:
        return bool(
            await conn.fetchval(
                "SELECT count(*) FROM message WHERE kind = 'user' AND content LIKE $1",
                f"%{words}%",
            )
        )
    finally:
        await conn.close()


@pytest.mark.timeout(400)
async def test_questions_asked_at_once_on_two_workers_run_one_after_the_other(
    ngircd, postgres_dsn, openai_server, tmp_path
) -> None:
    """Worker ``i`` owns IRC, worker ``s`` Slack, the two channels linked: a question asked
    in Slack while the answer to one asked on IRC is being written (held mid-stream) is
    queued behind it, not run beside it: the model gets it once the first turn ended,
    with the first exchange in its context.  Each answer reaches both channels once; the
    Slack question, asked in a thread and run by ``i`` (it holds the conversation), is
    answered in that thread."""
    first = Reply.text("the build is green", chunks=2)
    first.hold_after = 1
    openai_server.enqueue(first)
    openai_server.default = lambda body: Reply.text(f"answer to: {last_user(body)}")
    async with FakeSlack() as slack:
        slack.add_user("U2", "bob", display_name="bob")
        ws, wi = _pair(slack, ngircd.port, tmp_path, openai_server.base_url, postgres_dsn)
        alice = await IRCTestClient.connect(ngircd.port, "alice")
        async with _watched(alice, ws, wi, then=first.release):
            await _start_pair(ws, wi, slack, alice)
            root = slack.message_event("C1", "a thread about the deploy", user="U2")
            await slack.push_event(root)  # (``s`` has no IRC transport: not relayed there)
            alice.privmsg(CHANNEL, "agentik: how is the build?")
            await first.wait_held(PATIENCE)
            ask = slack.message_event("C1", f"<@{slack.bot_user_id}> and the deploy?", user="U2",
                                      thread_ts=root["ts"])  # fmt: skip
            await slack.push_event(ask)
            # Taken in by ``s`` (its user message committed) while the first turn runs on
            # ``i``: on the direct path ``s`` would ask the model now, beside it.
            await until(lambda: _stored(postgres_dsn, "and the deploy?"), "the question stored")
            assert len(openai_server.requests) == 1
            first.release()
            await openai_server.wait_requests(2, PATIENCE)
            second = json.dumps(openai_server.requests[1]["messages"])
            assert "how is the build?" in second and "the build is green" in second
            assert "and the deploy?" in last_user(openai_server.requests[1])
            answer = "answer to: bob (Slack): and the deploy?"
            await alice.wait_for(lambda m: m.text == answer, PATIENCE)

            def bot_posts() -> list[str]:
                # (the bot's messages as they read now: an answer streamed into Slack is
                # posted with its first words, then edited)
                return [m.get("text") or "" for (where, _), m in slack.messages.items()
                        if where == "C1" and m.get("user") == slack.bot_user_id
                        and not m.get("username")]  # fmt: skip

            await until(lambda: any(answer in t for t in bot_posts()) or None, "both in Slack")
            await until(lambda: _none_waiting_at_all(postgres_dsn), "the outbox delivered")
            await alice.sync()
            posted = bot_posts()
            assert sum("the build is green" in t for t in posted) == 1, posted
            assert sum(answer in t for t in posted) == 1, posted
            where = {m.get("thread_ts") for m in slack.messages.values()
                     if answer in (m.get("text") or "")}  # fmt: skip
            assert where == {root["ts"]}  # in the asker's thread
            said = [m.text for m in alice.received
                    if m.command == "PRIVMSG" and (m.nick or "").startswith("agentik")]  # fmt: skip
            assert sum("the build is green" in line for line in said) == 1, said
            assert sum(answer == line for line in said) == 1, said
            assert said.index(answer) > next(
                i for i, line in enumerate(said) if "the build is green" in line
            )
            assert len(openai_server.requests) == 2  # no turn ran twice


@pytest.mark.timeout(400)
async def test_stop_in_slack_stops_the_turn_another_worker_runs_and_the_queued_one_follows(
    ngircd, postgres_dsn, openai_server, tmp_path
) -> None:
    """A question asked on IRC is being answered (endlessly) by worker ``i``; a question
    asked in Slack meanwhile waits behind it (the turn queue); ``!stop`` typed in Slack by
    an admin (worker ``s``) stops the turn running on ``i``, and the Slack question is
    answered next, in both channels, its request holding the stopped exchange."""
    endless = Reply.endless("la ")
    openai_server.enqueue(endless)
    openai_server.default = lambda body: Reply.text(f"answer to: {last_user(body)}")
    access = '[access]\nadmins = ["slack:T1:U9"]\n'
    async with FakeSlack() as slack:
        slack.add_user("U9", "root", display_name="root")
        ws, wi = _pair(slack, ngircd.port, tmp_path, openai_server.base_url, postgres_dsn,
                       access)  # fmt: skip
        alice = await IRCTestClient.connect(ngircd.port, "alice")
        async with _watched(alice, ws, wi):
            await _start_pair(ws, wi, slack, alice)
            alice.privmsg(CHANNEL, "agentik: sing")
            await openai_server.wait_requests(1, PATIENCE)  # its answer is being written
            at = f"<@{slack.bot_user_id}> "
            await slack.push_event(slack.message_event("C1", at + "what next?", user="U9"))
            await until(lambda: _stored(postgres_dsn, "what next?"), "the question stored")
            assert len(openai_server.requests) == 1  # queued behind the running turn
            await slack.push_event(slack.message_event("C1", at + "!stop", user="U9"))
            await openai_server.wait_disconnect(PATIENCE)  # the endless answer stopped
            await openai_server.wait_requests(2, PATIENCE)
            assert "what next?" in last_user(openai_server.requests[1])
            assert "sing" in json.dumps(openai_server.requests[1]["messages"])
            answer = "answer to: root (Slack): what next?"
            await alice.wait_for(lambda m: m.text == answer, PATIENCE)

            def bot_posts() -> list[str]:
                return [c.get("text") or "" for c in slack.calls_to("chat.postMessage")
                        if c.get("channel") == "C1" and not c.get("username")]  # fmt: skip

            await until(lambda: any(answer in t for t in bot_posts()) or None, "the answer")
            await until(lambda: _none_waiting_at_all(postgres_dsn), "the outbox delivered")
            assert sum(answer in t for t in bot_posts()) == 1
            assert len(openai_server.requests) == 2


def _from_bot(alice: IRCTestClient) -> list[str]:
    """The lines the bot said in the IRC channel so far, in order."""
    return [m.text for m in alice.received
            if m.command == "PRIVMSG" and (m.nick or "").startswith("agentik")]  # fmt: skip


@pytest.mark.timeout(400)
async def test_an_answer_another_worker_writes_streams_into_irc_line_by_line(
    ngircd, postgres_dsn, openai_server, tmp_path
) -> None:
    """Worker ``s`` owns Slack and runs the turn of a question asked there; worker ``i``
    owns IRC and follows the conversation's stored events: the answer's first line is
    said on IRC while the model still holds the rest (streamed, not handed over whole
    at the turn's end), and every line once, in order, after the turn's end too (the
    whole answer ``s`` writes to the outbox at its end is the same rows, not sent
    again)."""
    lines = ["first line of the answer", "second line", "third line"]
    slow = Reply(steps=[{"content": lines[0] + "\n"}, {"content": lines[1] + "\n"},
                        {"content": lines[2]}], hold_after=1)  # fmt: skip
    openai_server.enqueue(slow)
    openai_server.default = lambda body: Reply.text(f"answer to: {last_user(body)}")
    async with FakeSlack() as slack:
        slack.add_user("U2", "bob", display_name="bob")
        ws, wi = _pair(slack, ngircd.port, tmp_path, openai_server.base_url, postgres_dsn)
        alice = await IRCTestClient.connect(ngircd.port, "alice")
        async with _watched(alice, ws, wi, then=slow.release):
            await _start_pair(ws, wi, slack, alice)
            ask = slack.message_event("C1", f"<@{slack.bot_user_id}> in three?", user="U2")
            await slack.push_event(ask)
            await slow.wait_held(PATIENCE)
            # The model sent the first line and holds the others: it is on IRC already.
            await alice.wait_for(lambda m: m.text == lines[0], PATIENCE)
            assert slow.held.is_set() and not slow._released.is_set()
            assert not any(t in lines[1:] for t in _from_bot(alice))
            slow.release()
            await alice.wait_for(lambda m: m.text == lines[2], PATIENCE)

            def answers() -> list[dict]:
                return [m for (where, _), m in slack.messages.items()
                        if where == "C1" and lines[0] in (m.get("text") or "")]  # fmt: skip

            await until(lambda: any(lines[2] in m["text"] for m in answers()) or None,
                        "the whole answer in Slack")  # fmt: skip
            await until(lambda: _none_waiting_at_all(postgres_dsn), "the outbox delivered")
            # Behind it in every queue: once this is answered, nothing of the first is due.
            alice.privmsg(CHANNEL, "agentik: anything else?")
            await alice.wait_for(lambda m: "anything else?" in m.text and m.nick != "alice",
                                 PATIENCE)  # fmt: skip
            await until(lambda: _none_waiting_at_all(postgres_dsn), "the outbox delivered")
            await alice.sync()
            assert [t for t in _from_bot(alice) if t in lines] == lines  # once each, in order
            assert len(answers()) == 1  # Slack: one message, the asker's, once
            assert len(openai_server.requests) == 2


@pytest.mark.timeout(400)
async def test_the_asking_slack_channel_streams_the_answer_another_worker_writes(
    ngircd, postgres_dsn, openai_server, tmp_path
) -> None:
    """A question asked in Slack (worker ``s``) while worker ``i`` runs the conversation's
    turn is queued, and ``i``, holding the conversation, runs it too: its answer shows in
    the asking Slack channel (posted, then edited by ``s``) while the model still holds
    its end, and ends as one message holding the whole answer, once."""
    first = Reply.text("the build is green", chunks=2)
    first.hold_after = 1
    openai_server.enqueue(first)
    head, tail = "streamed part one", "and the part held back"
    second = Reply(steps=[{"content": head + " "}, {"content": tail}], hold_after=1)
    openai_server.enqueue(second)
    openai_server.default = lambda body: Reply.text(f"answer to: {last_user(body)}")
    async with FakeSlack() as slack:
        slack.add_user("U2", "bob", display_name="bob")
        ws, wi = _pair(slack, ngircd.port, tmp_path, openai_server.base_url, postgres_dsn)
        alice = await IRCTestClient.connect(ngircd.port, "alice")
        async with _watched(alice, ws, wi, then=lambda: (first.release(), second.release())):
            await _start_pair(ws, wi, slack, alice)
            alice.privmsg(CHANNEL, "agentik: how is the build?")
            await first.wait_held(PATIENCE)  # run by ``i``, which holds the conversation
            ask = slack.message_event("C1", f"<@{slack.bot_user_id}> stream it?", user="U2")
            await slack.push_event(ask)
            await until(lambda: _stored(postgres_dsn, "stream it?"), "the question stored")
            first.release()
            await second.wait_held(PATIENCE)

            def bot_messages(words: str) -> list[dict]:
                return [m for (where, _), m in slack.messages.items()
                        if where == "C1" and not m.get("username")
                        and words in (m.get("text") or "")]  # fmt: skip

            # The model holds the answer's end: its beginning shows in Slack already.
            await until(lambda: bot_messages(head) or None, "the answer's beginning in Slack")
            assert second.held.is_set() and not second._released.is_set()
            assert not bot_messages(tail)
            second.release()
            await until(lambda: bot_messages(tail) or None, "the whole answer in Slack")
            await alice.wait_for(lambda m: tail in m.text, PATIENCE)
            await until(lambda: _none_waiting_at_all(postgres_dsn), "the outbox delivered")
            await alice.sync()
            assert len(bot_messages(head)) == 1  # one message, edited: the answer once
            assert bot_messages(head)[0]["text"] == f"{head} {tail}"
            posts = [c for c in slack.calls_to("chat.postMessage")
                     if head in (c.get("text") or "")]  # fmt: skip
            assert len(posts) == 1
            assert sum(head in t for t in _from_bot(alice)) == 1
            assert len(openai_server.requests) == 2


async def _line_delivered(dsn: str, text: str) -> bool:
    """The outbox row of the IRC line ``text`` is recorded delivered (from the database)."""
    conn = await asyncpg.connect(dsn)
    try:
        return bool(
            await conn.fetchval(
                "SELECT count(*) FROM outbox WHERE channel_key LIKE 'irc:%' AND text = $1"
                " AND (state = 'confirmed' OR (state = 'sent' AND NOT awaits_confirm))",
                text,
            )
        )
    finally:
        await conn.close()


@pytest.mark.timeout(500)
async def test_irc_owner_killed_mid_answer_the_next_owner_sends_only_the_missing_lines(
    ngircd, postgres_dsn, openai_server, tmp_path
) -> None:
    """Worker ``i`` owns IRC and streams there the answer worker ``s`` writes (asked in
    Slack); ``i`` is killed (-9) after the first line, while the model holds the rest;
    ``s`` takes IRC over, and when the answer ends the channel has every line once: the
    first (``i`` sent it) is not said again, the others are said by ``s``."""
    lines = ["first line of the answer", "second line", "third line"]
    slow = Reply(steps=[{"content": lines[0] + "\n"}, {"content": lines[1] + "\n"},
                        {"content": lines[2]}], hold_after=1)  # fmt: skip
    openai_server.enqueue(slow)
    openai_server.default = lambda body: Reply.text(f"answer to: {last_user(body)}")
    async with FakeSlack() as slack:
        slack.add_user("U2", "bob", display_name="bob")
        # (i alone first, with IRC only: it owns IRC; s has both, IRC in standby)
        wi = Worker(
            tmp_path / "i",
            worker_config("i", openai_server.base_url, extra=_irc(ngircd.port) + LINK),
            postgres_dsn,
        )
        ws = Worker(tmp_path / "s", worker_config("s", openai_server.base_url,
                                                   extra=_slack(slack) + _irc(ngircd.port) + LINK),
                    postgres_dsn)  # fmt: skip
        alice = await IRCTestClient.connect(ngircd.port, "alice")
        async with _watched(alice, ws, wi, then=slow.release):
            await _start_irc_first(ws, wi, slack, alice)
            ask = slack.message_event("C1", f"<@{slack.bot_user_id}> in three?", user="U2")
            await slack.push_event(ask)
            await slow.wait_held(PATIENCE)
            await alice.wait_for(lambda m: m.text == lines[0], PATIENCE)
            await until(lambda: _line_delivered(postgres_dsn, lines[0]), "line 1 recorded")
            wi.kill()
            await wi.wait()
            assert (await owner_of([ws], "libera")) is ws
            slow.release()
            await alice.wait_for(lambda m: m.text == lines[2], PATIENCE)
            await until(lambda: _none_waiting_at_all(postgres_dsn), "the outbox delivered")
            alice.privmsg(CHANNEL, "agentik: anything else?")  # behind it in every queue
            await alice.wait_for(lambda m: "anything else?" in m.text and m.nick != "alice",
                                 PATIENCE)  # fmt: skip
            await until(lambda: _none_waiting_at_all(postgres_dsn), "the outbox delivered")
            await alice.sync()
            assert [t for t in _from_bot(alice) if t in lines] == lines  # once each, in order
