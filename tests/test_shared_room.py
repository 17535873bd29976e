"""Manners in a shared IRC room (issue 29): nothing dropped on ``!new``, rights on
``!new``, approvals that tell the channel, short ``!help``/``!status``, ``!more``
pages formatted on their own, multiline batches ended and confirmed, and turns
that end without an answer saying so."""

from __future__ import annotations

import asyncio
import sqlite3

from agentik.bot.bridge import ChannelOptions
from agentik.core.access import AccessPolicy, AccessSettings
from agentik.core.approvals import ApprovalRule
from agentik.core.hookspecs import hookimpl
from agentik.core.llm.openai_backend import OpenAIBackend
from agentik.core.testing.openai_server import Reply as OpenAIReply
from agentik.core.testing.scripted import Reply, call
from agentik.core.tools.base import tool
from agentik.transports.irc.wire import casefold

from ircservers import IRCTestClient, ScriptedIRCServer, parse_line, registration_handler
from rigs import WAIT, eventually, from_bot, irc_bot, joined, said_by_bot

pytest_plugins = ["ircservers"]


def answer_line(line) -> bool:
    """A line of an answer (not the ``… N more lines`` hint)."""
    return said_by_bot(line) and "more lines: " not in line.text


async def room(port: int, channel: str, *nicks: str) -> list[IRCTestClient]:
    clients = []
    for nick in nicks:
        c = await IRCTestClient.connect(port, nick)
        await c.join(channel)
        clients.append(c)
    return clients


# -- item 12: !more pages ------------------------------------------------------------------
async def test_more_pages_do_not_inherit_code_formatting_from_an_earlier_answer(miniircd, tmp_path):
    options = ChannelOptions(command_prefix="!", max_answer_lines=2)
    async with irc_bot(miniircd.port, tmp_path, channels=["#code"], options=options) as (
        bot, model, agent, bridge,
    ):  # fmt: skip
        await joined(bot, "#code")
        [alice] = await room(miniircd.port, "#code", "alice")
        # A code block cut by the cap: its first page opens the block, the second
        # page continues it, and the block is never closed in what is shown.
        model.enqueue(Reply(text="a0\na1\n```\nc1\nc2\nc3"))
        alice.privmsg("#code", "agentik: some code")
        await alice.collect(answer_line, 2, WAIT)
        alice.privmsg("#code", "!more")
        [page1] = await alice.collect(answer_line, 1, WAIT)
        assert page1.text == "\x11c1\x11"
        alice.privmsg("#code", "!more")
        # The next page still reads as code: it continues the block.
        assert [m.text for m in await alice.collect(answer_line, 2, WAIT)] == [
            "\x11c2\x11",
            "\x11c3\x11",
        ]
        # A new answer's pages are plain text, whatever the last page left open.
        model.enqueue(Reply(text="b0\nb1\nplain words"))
        alice.privmsg("#code", "agentik: some prose")
        await alice.collect(answer_line, 2, WAIT)
        alice.privmsg("#code", "!more")
        [prose] = await alice.collect(answer_line, 1, WAIT)
        assert prose.text == "plain words"
        await alice.close()


def multiline_echo_handler(echo: bool = True):
    """A server offering draft/multiline (and echo-message): it relays the bot's
    batches back to it as ergo does, and answers nothing else."""
    caps = "batch message-tags draft/multiline=max-bytes=4096,max-lines=24"
    base = registration_handler(caps_offered=caps + (" echo-message" if echo else ""))

    async def handler(client, line: str) -> None:
        msg = parse_line(line)
        if echo and "echo-message" in client.caps and msg.command in ("BATCH", "PRIVMSG"):
            tags = f"@batch={msg.tags['batch']} " if "batch" in msg.tags else ""
            client.send(f"{tags}:{client.prefix} {line.split(' ', 1)[1] if tags else line}")
            return
        await base(client, line)

    return handler


async def test_multiline_more_page_is_sent_at_once_and_batches_are_echo_confirmed(tmp_path):
    options = ChannelOptions(command_prefix="!", max_answer_lines=2)
    async with ScriptedIRCServer(multiline_echo_handler()) as server:
        async with irc_bot(server.port, tmp_path, options=options) as (bot, model, agent, _):
            await asyncio.wait_for(bot.registered.wait(), WAIT)
            assert {"draft/multiline", "echo-message"} <= bot.caps_enabled
            model.enqueue(Reply(text="\n".join(f"line {i}" for i in range(6))))
            server.clients[0].send(":alice!a@h PRIVMSG agentik :six lines please")
            first = await server.wait_for_line(lambda line: line.startswith("BATCH +"))
            await server.wait_for_line(f"BATCH -{first.split()[1][1:]}")
            await server.wait_for_line("NOTICE alice :… 4 more lines: !more")
            server.clients[0].send(":alice!a@h PRIVMSG agentik :!more")
            page = await server.wait_for_line(lambda line: line.startswith("BATCH +"))
            await server.wait_for_line(f"BATCH -{page.split()[1][1:]}")
            server.clients[0].send(":alice!a@h PRIVMSG agentik :!more")
            # The last page (no hint after it) goes out without anyone else's reply.
            last = await server.wait_for_line(lambda line: line.startswith("BATCH +"))
            ref = last.split()[1][1:]
            await server.wait_for_line(f"BATCH -{ref}")
            start = server.received.index(last)
            assert server.received[start + 1 : start + 3] == [
                f"@batch={ref} PRIVMSG alice :line 4",
                f"@batch={ref} PRIVMSG alice :line 5",
            ]
            # The answer's batch, echoed back, is confirmed in the outbox.
            db = str(tmp_path / "irc.db")

            def states():
                con = sqlite3.connect(db, timeout=30)
                try:
                    return con.execute(
                        "SELECT state FROM outbox WHERE kind = 'answer' ORDER BY id"
                    ).fetchall()
                finally:
                    con.close()

            async def confirmed() -> bool:
                return await asyncio.to_thread(states) == [("confirmed",), ("confirmed",)]

            # The outbox writes its marks off the rendering path: wait for them.
            await eventually(confirmed, "both pieces confirmed", wait=WAIT, interval=0.05)


# -- items 1 and 2: !new -----------------------------------------------------------------
async def wait_until(predicate) -> None:
    """Wait for a condition of the bot's state (no event to wait on from outside)."""
    await eventually(predicate, "the bot's state", wait=WAIT, interval=0.02)


async def test_new_moves_queued_messages_and_obeys_the_rights_of_stop(miniircd, tmp_path):
    async with irc_bot(miniircd.port, tmp_path, channels=["#new"]) as (bot, model, agent, _):
        await joined(bot, "#new")
        alice, bob, carol = await room(miniircd.port, "#new", "alice", "bob", "carol")
        slow = Reply(text="a long story " * 20, hold_after=2)
        model.enqueue(slow)
        alice.privmsg("#new", "agentik: tell me a long story")
        await slow.held.wait()
        old = await agent.conversation_for_channel("irc:testnet:#new")
        bob.privmsg("#new", "agentik: first queued question")
        await wait_until(lambda: old.queued == 1)
        carol.privmsg("#new", "agentik: second queued question")
        await wait_until(lambda: old.queued == 2)
        # bob may not start over while alice's answer is being written (as !stop).
        bob.privmsg("#new", "!new")
        refusal = await bob.wait_for(lambda m: said_by_bot(m) and "!new" in m.text, WAIT)
        assert "only its asker (or an admin)" in refusal.text
        assert (await agent.conversation_for_channel("irc:testnet:#new")).id == old.id
        # alice may: her answer stops, the queued messages move to the new conversation.
        alice.privmsg("#new", "!new")
        started = await alice.wait_for(lambda m: said_by_bot(m) and "new conversation" in m.text)
        assert started.text == (
            f"started a new conversation (the previous one is kept as {old.id});"
            " 2 queued messages moved to it"
        )
        first = await bob.wait_for(lambda m: said_by_bot(m) and "first queued" in m.text, WAIT)
        assert first.text == "bob: echo: first queued question"
        second = await carol.wait_for(lambda m: said_by_bot(m) and "second queued" in m.text, WAIT)
        assert second.text == "carol: echo: second queued question"
        # They were answered in the new conversation, which holds them alone.
        new = await agent.conversation_for_channel("irc:testnet:#new")
        assert new.id != old.id
        await new.wait_idle()
        assert [(m.author, m.content) for m in await new.messages()] == [
            ("bob", "first queued question"),  # both were queued, in order
            ("carol", "second queued question"),
            (None, "echo: first queued question"),
            (None, "echo: second queued question"),
        ]
        assert [m.content for m in model.requests[-1].messages if m.role == "user"] == [
            "first queued question",
            "second queued question",
        ]
        # Nothing is left for a restart to take up again (once the old conversation
        # has recorded the moved turns' end).
        await old.wait_idle()
        assert await agent.pending_turns() == []
        for c in (alice, bob, carol):
            await c.close()


async def test_an_admin_may_start_over_during_someone_elses_answer(miniircd, tmp_path):
    access = AccessPolicy(
        AccessSettings(admins=("testnet:mask:dave!*@*",)), {"testnet": "irc"},
        irc_casefold=casefold,
    )  # fmt: skip
    async with irc_bot(
        miniircd.port, tmp_path, channels=["#adm"], bridge_kw={"access": access},
        unverified_identity="hostmask",
    ) as (bot, model, agent, _):  # fmt: skip
        await joined(bot, "#adm")
        alice, bob, dave = await room(miniircd.port, "#adm", "alice", "bob", "dave")
        slow = Reply(text="a long story " * 20, hold_after=2)
        model.enqueue(slow)
        alice.privmsg("#adm", "agentik: tell me a long story")
        await slow.held.wait()
        old = await agent.conversation_for_channel("irc:testnet:#adm")
        bob.privmsg("#adm", "agentik: a queued question")
        await wait_until(lambda: old.queued == 1)
        dave.privmsg("#adm", "!new")
        started = await dave.wait_for(lambda m: said_by_bot(m) and "new conversation" in m.text)
        assert started.text.endswith("; 1 queued message moved to it")
        answer = await bob.wait_for(lambda m: said_by_bot(m) and "queued question" in m.text, WAIT)
        assert answer.text == "bob: echo: a queued question"
        for c in (alice, bob, dave):
            await c.close()


# -- item 15: a turn that ends with nothing to show ------------------------------------------
class FilterEverything:
    """A plugin that filters every answer to nothing (as a moderation filter may)."""

    @hookimpl
    def after_response(self, text):
        return "" if "secret" in text else None


async def test_a_turn_without_a_visible_answer_says_so(miniircd, tmp_path):
    agent_kw = {"hooks": [FilterEverything()]}
    async with irc_bot(miniircd.port, tmp_path, channels=["#quiet"], agent_kw=agent_kw) as (
        bot, model, agent, _,
    ):  # fmt: skip
        await joined(bot, "#quiet")
        [alice] = await room(miniircd.port, "#quiet", "alice")
        # Tool calls, then no text at all.
        model.enqueue(Reply(tool_calls=[call("memory_list", {})]))
        model.enqueue(Reply(text=""))
        alice.privmsg("#quiet", "agentik: look at your notes")
        told = await alice.wait_for(from_bot, WAIT)
        assert (told.command, told.text) == (
            "NOTICE", "(no answer: the model ended its turn without writing one)",
        )  # fmt: skip
        # An answer a plugin filtered to nothing.
        model.enqueue(Reply(text="the secret is 42"))
        alice.privmsg("#quiet", "agentik: tell me the secret")
        told = await alice.wait_for(from_bot, WAIT)
        assert told.text == "(no answer: the model ended its turn without writing one)"
        # The provider's content filter.
        model.enqueue(Reply(text="", finish_reason="content_filter"))
        alice.privmsg("#quiet", "agentik: something filtered")
        told = await alice.wait_for(from_bot, WAIT)
        assert told.text == "(no answer: the model's provider filtered it)"
        # An ordinary answer gets no such line.
        alice.privmsg("#quiet", "agentik: hello")
        assert (await alice.wait_for(from_bot, WAIT)).text == "alice: echo: hello"
        await alice.close()


# -- item 11: !help and !status in a shared channel -------------------------------------------
async def test_help_and_status_are_short_in_a_shared_channel_and_full_in_private(
    miniircd, tmp_path
):
    async with irc_bot(miniircd.port, tmp_path, channels=["#help"]) as (bot, model, agent, _):
        await joined(bot, "#help")
        alice, bob = await room(miniircd.port, "#help", "alice", "bob")
        alice.privmsg("#help", "!help")
        line = await bob.wait_for(from_bot, WAIT)
        assert line.text.startswith("commands: !new !stop !more !status")
        assert line.text.endswith(
            "— !help <command> says what one does; !help in a private message lists them all"
        )
        assert len(line.text) < 300
        assert "!role" not in line.text and "!set" not in line.text  # admins' commands
        alice.privmsg("#help", "!help new")
        line = await bob.wait_for(from_bot, WAIT)
        assert line.text.startswith("!new — start a fresh conversation")
        alice.privmsg("#help", "!status")
        line = await bob.wait_for(from_bot, WAIT)
        assert line.text.startswith("model scripted · conversation ")
        assert line.text.endswith(" · idle")
        alice.privmsg("#help", "!status settings")
        line = await bob.wait_for(from_bot, WAIT)
        assert line.text.startswith("settings of irc:testnet:#help: persona")
        # (Each answer above came right after the one before: !help and !status
        # were one line each in the channel.)
        # In private: every command, with what it does; the status with the settings.
        alice.privmsg("agentik", "!help")
        text = ""
        while "!redact — " not in text:  # the last command listed
            text += (await alice.wait_for(lambda m: from_bot(m) and m.params[0] == "alice")).text
        packed = "".join(text.split())  # split lines lose the blanks at their ends
        assert "!role—show" in packed and "!memory—list" in packed and "!approve—approve" in packed
        alice.privmsg("agentik", "!status")
        found = ""
        while "settings of irc:testnet:alice" not in found:
            found += (await alice.wait_for(lambda m: from_bot(m) and m.params[0] == "alice")).text
        await alice.close()
        await bob.close()


# -- item 6: a pending approval tells the channel ------------------------------------------
@tool(
    name="fs__write_file",
    description="Write a file",
    parameters={"type": "object", "properties": {"path": {"type": "string"}}},
)
async def write_file(path: str) -> str:
    return f"wrote {path}"


async def test_messages_queued_behind_an_approval_are_told_once_what_the_channel_waits_on(
    miniircd, tmp_path
):
    agent_kw = {
        "tools": [write_file],
        "approvals": [ApprovalRule(tools=("fs__write_*",), approvers="user")],
    }
    async with irc_bot(
        miniircd.port, tmp_path, channels=["#ops"], agent_kw=agent_kw,
        unverified_identity="hostmask",
    ) as (bot, model, agent, _):  # fmt: skip
        await joined(bot, "#ops")
        alice, bob, carol = await room(miniircd.port, "#ops", "alice", "bob", "carol")
        model.enqueue(Reply(tool_calls=[call("fs__write_file", {"path": "/srv/motd"})]), "done")
        alice.privmsg("#ops", "agentik: update the motd")
        asked = await bob.wait_for(lambda m: from_bot(m) and "asked me to run" in m.text, WAIT)
        approval_id = asked.text.split("approval ", 1)[1].split(":", 1)[0]
        bob.privmsg("#ops", "agentik: what time is it?")
        told = await bob.wait_for(lambda m: from_bot(m) and "waits on approval" in m.text, WAIT)
        assert told.command == "NOTICE"
        assert told.text.startswith(
            f"this channel waits on approval {approval_id} (fs__write_file, asked by alice;"
        )
        assert "new messages are queued and answered after it — !approvals shows it" in told.text
        # Once per approval: carol's message is queued without another notice.
        carol.privmsg("#ops", "agentik: and the weather?")
        conv = await agent.conversation_for_channel("irc:testnet:#ops")
        await wait_until(lambda: conv.queued == 2)
        bob.privmsg("#ops", f"!approve {approval_id}")
        await carol.wait_for(lambda m: from_bot(m) and "echo: and the weather?" in m.text, WAIT)
        notices = [m for m in carol.received if from_bot(m) and "waits on approval" in m.text]
        assert len(notices) == 1
        # The queued questions were answered after the approved turn, in order.
        answers = [m.text for m in carol.received if said_by_bot(m) and "echo:" in m.text]
        assert answers == ["bob: echo: what time is it?", "carol: echo: and the weather?"]
        for c in (alice, bob, carol):
            await c.close()


async def test_a_content_filtered_answer_from_an_openai_endpoint_says_so(
    miniircd, tmp_path, openai_server
):
    llm = OpenAIBackend(model="fake-model", base_url=openai_server.base_url, api_key="sk-test",
                        max_retries=0, timeout=60)  # fmt: skip
    async with irc_bot(miniircd.port, tmp_path, channels=["#cf"], llm=llm) as (bot, *_):
        await joined(bot, "#cf")
        [alice] = await room(miniircd.port, "#cf", "alice")
        openai_server.enqueue(OpenAIReply.text("", finish_reason="content_filter"))
        alice.privmsg("#cf", "agentik: something the provider filters")
        told = await alice.wait_for(from_bot, WAIT)
        assert (told.command, told.text) == (
            "NOTICE", "(no answer: the model's provider filtered it)",
        )  # fmt: skip
        await alice.close()
