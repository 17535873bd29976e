"""How a child run (sub-agent) shows in a channel, over a real IRC server: one line
with the task in the chat profile (its text never reaches the channel: its answer
feeds the parent), nested lines in the debug profile.  The parent is the scripted
model calling ``agent__researcher``, a real child agent on a scripted model of its
own (tests/childruns.py)."""

from __future__ import annotations

from contextlib import asynccontextmanager

from agentik.bot.bridge import Bridge, ChannelOptions
from agentik.core import Agent, SQLiteStore
from agentik.core.streamprofiles import StreamProfileSettings, resolve_profiles
from agentik.core.testing.scripted import Reply, ScriptedModel, call

from childruns import CHILD_ANSWER, CHILD_SECOND_LINE, CHILD_TEXT, with_researcher
from ircservers import IRCTestClient
from rigs import from_bot, irc_bot

pytest_plugins = ["ircservers"]

FAST = {"tls": False, "reconnect_min": 0.2, "reconnect_max": 1.0, "flood_burst": 50,
        "flood_rate": 500.0}  # fmt: skip

TASK = "look up the release notes of version 2.0 and say when it shipped; " * 4
FINAL = "Release 2.0 shipped on Monday."


@asynccontextmanager
async def delegating_bot(port: int, tmp_path, options: ChannelOptions, **agent_kwargs):
    """:func:`rigs.irc_bot` in #room whose agent may delegate to a scripted researcher;
    yields its model."""
    async with irc_bot(
        port, tmp_path, options=options, agent_kw=with_researcher(ScriptedModel(), **agent_kwargs),
        channels=["#room"], joined_to=["#room"], **FAST,
    ) as bot:  # fmt: skip
        yield bot.model


async def delegated_turn(port: int, model: ScriptedModel) -> list[str]:
    """Ask in #room; the parent delegates, then answers.  Every bot line up to the answer."""
    model.enqueue(
        Reply(text="Let me ask.", tool_calls=[call("agent__researcher", {"task": TASK}, id="k1")])
    )
    model.enqueue(Reply(text=FINAL))
    alice = await IRCTestClient.connect(port, "alice")
    try:
        await alice.join("#room")
        since = alice.mark()
        alice.privmsg("#room", "agentik: when did 2.0 ship?")
        await alice.wait_for(lambda m: from_bot(m) and FINAL in m.text)
        # Then a second turn: whatever the first one sent is in before its answer.
        model.enqueue(Reply(text="nothing more"))
        alice.privmsg("#room", "agentik: anything else?")
        await alice.wait_for(lambda m: from_bot(m) and "nothing more" in m.text)
        return [m.text for m in alice.received[since:] if from_bot(m)]
    finally:
        await alice.close()


async def test_a_child_run_is_one_line_and_its_text_never_reaches_the_channel(irc_server, tmp_path):
    async with delegating_bot(
        irc_server.port, tmp_path, ChannelOptions(command_prefix="!")
    ) as model:
        lines = await delegated_turn(irc_server.port, model)
    child_lines = [t for t in lines if t.startswith("→ researcher:")]
    assert len(child_lines) == 1, lines
    [line] = child_lines
    # The task, on one line, trimmed.
    assert line.startswith("→ researcher: look up the release notes of version 2.0")
    assert line.endswith("…") and len(line) < len(TASK)
    # The child's own text, tool calls and answer never show; no tool line for the agent call.
    assert not [t for t in lines if CHILD_TEXT[:12] in t or CHILD_SECOND_LINE in t or "fetch" in t]
    assert not [t for t in lines if "agent__researcher" in t]
    # What the parent said before delegating comes first, then the line, then the answer.
    said = [i for i, t in enumerate(lines) if "Let me ask." in t]
    answer = [i for i, t in enumerate(lines) if FINAL in t]
    assert said and answer and said[0] < lines.index(line) < answer[0]
    # The child's answer fed the parent: it is the tool result the model saw.
    tool_msg = next(m for m in model.requests[1].messages if m.role == "tool")
    assert tool_msg.content == CHILD_ANSWER


async def test_the_debug_profile_shows_the_child_run_nested(miniircd, tmp_path):
    options = ChannelOptions(command_prefix="!", events="debug", max_answer_lines=0)
    async with delegating_bot(miniircd.port, tmp_path, options) as model:
        lines = await delegated_turn(miniircd.port, model)
    nested = [t for t in lines if t.startswith("↳ researcher: ")]
    assert nested[0].startswith("↳ researcher: ⚙ fetch(")
    assert any(t == f"↳ researcher: {CHILD_TEXT}" for t in nested), nested
    assert f"↳ researcher: {CHILD_SECOND_LINE}" in nested
    assert nested[-1].startswith("↳ researcher: done: stop")
    # Its steps in order, each on lines of its own: the draft shows before the tool call
    # that follows it, and the answer (its last step) never runs into the draft.
    steps = [t.removeprefix("↳ researcher: ") for t in nested]
    assert len(steps) == 8, nested
    assert steps[0] == '⚙ fetch(url="https://example.org/notes")'
    assert steps[1].startswith("⚙ fetch → ")
    assert steps[2:4] == [CHILD_TEXT, CHILD_SECOND_LINE]
    assert steps[4] == '⚙ fetch(url="https://example.org/notes/2.0")'
    assert steps[5].startswith("⚙ fetch → ")
    assert steps[6] == CHILD_ANSWER
    # Still one line for the child run itself, and the answer is the parent's alone.
    assert len([t for t in lines if t.startswith("→ researcher:")]) == 1
    answers = [t for t in lines if FINAL in t]
    assert answers and all(CHILD_TEXT[:12] not in t for t in answers)


async def test_a_channel_profile_without_child_runs_or_tools(miniircd, tmp_path):
    # events = debug, but the channel's profile leaves out tool events and child runs.
    profiles = resolve_profiles(
        {
            "answers-only": StreamProfileSettings(
                extends="debug",
                exclude=["tool_call_started", "tool_call_ended", "child_run_linked"],
                child_runs=False,
            )
        }
    )
    options = ChannelOptions(command_prefix="!", events="debug", profile="answers-only")
    async with delegating_bot(miniircd.port, tmp_path, options, stream_profiles=profiles) as model:
        lines = await delegated_turn(miniircd.port, model)
    assert not [t for t in lines if "researcher" in t or "⚙" in t or CHILD_TEXT[:12] in t]
    assert any(FINAL in t for t in lines)


async def test_on_slack_a_child_run_is_one_message_in_the_thread(tmp_path):
    from agentik.transports.slack.transport import SlackTransport

    from fakeslack import FakeSlack

    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        model = ScriptedModel()
        agent = Agent(
            llm=model,
            store=SQLiteStore(str(tmp_path / "slack.db")),
            **with_researcher(ScriptedModel()),
        )
        await agent.start()
        bridge = Bridge(agent)
        transport = SlackTransport(
            name="slack",
            settings={
                "bot_token": slack.bot_token, "app_token": slack.app_token,
                "api_url": slack.api_url, "state_file": str(tmp_path / "seen.sqlite3"),
                "edit_interval": 0.05,
            },
        )  # fmt: skip
        bridge.attach(transport, ChannelOptions(command_prefix="!"))
        await transport.start(bridge)
        try:
            model.enqueue(
                Reply(
                    text="Let me ask.",
                    tool_calls=[call("agent__researcher", {"task": TASK}, id="k1")],
                )
            )
            model.enqueue(Reply(text=FINAL))
            event = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> when did 2.0 ship?")
            await slack.push_event(event)
            key = f"slack:T1:C1:{event['ts']}"
            # (A short answer is posted whole: chat.postMessage, its Markdown.)
            await slack.wait_for_call(
                "chat.postMessage", lambda p: FINAL in (p.get("markdown_text") or "")
            )
            await bridge.flush(key)
            mine = [
                m
                for (ch, _), m in sorted(slack.messages.items(), key=lambda kv: kv[0][1])
                if ch == "C1" and m.get("user") == slack.bot_user_id
            ]
        finally:
            await transport.aclose()
            await bridge.aclose()
            await agent.aclose()
    texts = [m["text"] for m in mine]
    child_lines = [t.strip("_") for t in texts if "researcher" in t]  # a notice: in italics
    assert len(child_lines) == 1 and child_lines[0].startswith("→ researcher: look up"), texts
    assert not [t for t in texts if CHILD_TEXT[:12] in t or CHILD_SECOND_LINE in t]
    # The answer: what the parent said before and after delegating, as two lines.
    assert f"Let me ask.\n{FINAL}" in texts
    # Everything went to the question's thread.
    assert {m.get("thread_ts") for m in mine} == {event["ts"]}
