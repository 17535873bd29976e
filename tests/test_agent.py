"""The Agent and Conversation contracts, on a scripted model and a real SQLite file."""

from __future__ import annotations

import asyncio
import gc
import sqlite3

import pytest

from agentik.core import (
    Agent,
    ClosedError,
    NotFound,
    SQLiteStore,
    ToolError,
    TurnPolicy,
    TurnSettings,
    tool,
)
from agentik.core.testing.scripted import Reply, ScriptedModel, call
from helpers import collect_turn


async def test_send_commits_before_returning_and_runs_a_turn(agent, scripted, db_path):
    conv = await agent.create_conversation(title="t")
    sub = conv.events()
    gate = asyncio.Event()
    scripted.enqueue(Reply(text="hello alice", gate=gate))
    run_id = await conv.send("hi", author="alice")
    # Committed: visible from another connection while the turn is still blocked.
    con = sqlite3.connect(db_path)
    assert con.execute("SELECT kind, content, author, run_id FROM message").fetchall() == [
        ("user", "hi", "alice", run_id)
    ]
    con.close()
    gate.set()
    events = await collect_turn(sub)
    kinds = [e.kind for e in events]
    assert kinds[0] == "turn_started" and kinds[-1] == "turn_ended"
    assert "".join(e.text for e in events if e.kind == "text_delta") == "hello alice"
    assert all(e.run_id == run_id for e in events)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[-1].text == "hello alice" and events[-1].stop_reason == "stop"
    history = await conv.messages()
    assert [(m.kind, m.content) for m in history] == [("user", "hi"), ("assistant", "hello alice")]
    # The model saw the author's name.
    assert scripted.requests[0].messages[-1].author == "alice"


async def test_fifty_messages_to_one_conversation_make_fifty_ordered_turns(agent, scripted):
    conv = await agent.create_conversation()
    scripted.default = lambda req: Reply(text="ok " + req.messages[-1].content, delay=0.001)
    sub = conv.events(kinds={"turn_started", "turn_ended"})
    run_ids = await asyncio.gather(*(conv.send(f"m{i}") for i in range(50)))
    await conv.wait_idle()
    assert [r.messages[-1].content for r in scripted.requests] == [f"m{i}" for i in range(50)]
    events = []
    while len(events) < 100:
        events.append(await asyncio.wait_for(anext(sub), 60))
    # Strictly one at a time: started/ended alternate, in send order.
    assert [e.kind for e in events] == ["turn_started", "turn_ended"] * 50
    assert [e.run_id for e in events[::2]] == list(run_ids)
    history = await conv.messages(limit=200)
    users = [m.content for m in history if m.kind == "user"]
    answers = [m.content for m in history if m.kind == "assistant"]
    assert users == [f"m{i}" for i in range(50)]
    assert answers == [f"ok m{i}" for i in range(50)]
    # Each turn's context holds exactly the earlier exchanges plus its own message.
    assert [len(r.messages) for r in scripted.requests] == [2 * i + 1 for i in range(50)]


async def test_fifty_conversations_run_in_parallel(agent, scripted):
    gate = asyncio.Event()
    convs = [await agent.create_conversation() for _ in range(50)]
    replies = [Reply(text=f"answer {i}", gate=gate) for i in range(50)]
    scripted.enqueue(*replies)
    await asyncio.gather(*(c.send(f"q{i}") for i, c in enumerate(convs)))
    # All 50 turns reach the model before any may finish: they run concurrently.
    await asyncio.wait_for(asyncio.gather(*(r.started.wait() for r in replies)), 60)
    gate.set()
    await asyncio.gather(*(c.wait_idle() for c in convs))
    for c in convs:
        msgs = await c.messages()
        assert [m.kind for m in msgs] == ["user", "assistant"]


async def test_message_sent_during_a_turn_is_queued_not_dropped(agent, scripted):
    conv = await agent.create_conversation()
    gate = asyncio.Event()
    first = Reply(text="first answer", gate=gate)
    scripted.enqueue(first, "second answer")
    await conv.send("one")
    await first.started.wait()
    await conv.send("two")
    assert conv.busy and conv.queued == 1
    gate.set()
    await conv.wait_idle()
    contents = [(m.kind, m.content) for m in await conv.messages()]
    assert contents == [
        ("user", "one"),
        ("user", "two"),
        ("assistant", "first answer"),
        ("assistant", "second answer"),
    ]
    assert scripted.requests[1].messages[-1].content == "two"
    assert scripted.requests[1].messages[-2].content == "first answer"


async def test_a_queued_turn_withdrawn_never_runs_and_ends_cancelled(agent, scripted):
    conv = await agent.create_conversation()
    sub = conv.events()
    gate = asyncio.Event()
    first = Reply(text="first answer", gate=gate)
    scripted.enqueue(first, "third answer")
    one = await conv.send("one")
    await first.started.wait()
    two = await conv.send("two")
    three = await conv.send("three")
    assert conv.queued_run_ids() == [two, three]
    assert not await conv.withdraw(one)  # running: that is interrupt()'s
    assert not await conv.withdraw("run_unknown")
    assert await conv.withdraw(two)
    assert not await conv.withdraw(two)  # once
    assert conv.queued_run_ids() == [three]
    gate.set()
    await conv.wait_idle()
    events = []
    async with asyncio.timeout(60):
        async for event in sub:
            events.append(event)
            if event.kind == "run_stream_end" and event.run_id == three:
                break
    withdrawn = [e.kind for e in events if e.run_id == two]
    assert withdrawn == ["turn_ended", "run_stream_end"]  # never started
    assert next(e for e in events if e.run_id == two).stop_reason == "interrupted"
    assert len(scripted.requests) == 2
    assert [m.content for m in scripted.requests[1].messages if m.role == "user"] == [
        "one", "three",
    ]  # fmt: skip
    assert await agent.store.turn_ended(conv.id, two)
    assert [m.run_id for m in await agent.store.pending_turns()] == []


async def test_interrupt_keeps_partial_answer_marked_interrupted(agent, scripted):
    conv = await agent.create_conversation()
    sub = conv.events()
    # Held after two words until the test says go on (it never does): the
    # interrupt always lands mid-answer, however slow the machine.
    slow = Reply(text="one two three four five six seven", hold_after=2)
    scripted.enqueue(slow, "next answer")
    await conv.send("talk")
    async for e in sub:
        if e.kind == "text_delta":
            break
    assert await conv.interrupt() is True
    events = await collect_turn(sub)
    kinds = [e.kind for e in events]
    assert "interrupted" in kinds and kinds[-1] == "turn_ended"
    assert events[-1].stop_reason == "interrupted"
    assert scripted.cancelled == 1
    partial = [m for m in await conv.messages() if m.kind == "assistant"]
    assert len(partial) == 1 and partial[0].status == "interrupted"
    assert partial[0].content and "seven" not in partial[0].content
    # The conversation goes on; the model sees the partial answer as context.
    await conv.send("again")
    await conv.wait_idle()
    assert scripted.requests[-1].messages[-2].content == partial[0].content
    assert (await conv.messages())[-1].content == "next answer"
    assert await conv.interrupt() is False


async def test_tool_calls_run_concurrently_and_results_reach_the_model(agent, scripted):
    both_started = asyncio.Event()
    started = []

    @tool(parameters={"type": "object", "properties": {"name": {"type": "string"}}})
    async def rendezvous(name: str) -> str:
        """Wait until both calls are running."""
        started.append(name)
        if len(started) == 2:
            both_started.set()
        await asyncio.wait_for(both_started.wait(), 60)
        return f"hello {name}"

    agent.add_tool(rendezvous)
    scripted.enqueue(
        Reply(
            text="Let me check.",
            tool_calls=[
                call("rendezvous", {"name": "a"}, id="c1"),
                call("rendezvous", {"name": "b"}, id="c2"),
            ],
        ),
        "done",
    )
    conv = await agent.create_conversation()
    sub = conv.events()
    await conv.send("go")
    events = await collect_turn(sub)
    ended = {e.call_id: e.result for e in events if e.kind == "tool_call_ended"}
    assert ended == {"c1": "hello a", "c2": "hello b"}
    second = scripted.requests[1].messages
    assert second[-3].role == "assistant" and [c.id for c in second[-3].tool_calls] == ["c1", "c2"]
    assert {m.tool_call_id: m.content for m in second[-2:]} == ended
    assert [t.name for t in scripted.requests[0].tools] == ["rendezvous"]
    kinds = [m.kind for m in await conv.messages()]
    assert kinds == [
        "user",
        "assistant",
        "tool_call",
        "tool_call",
        "tool_result",
        "tool_result",
        "assistant",
    ]


async def test_tool_errors_go_back_to_the_model(agent, scripted, caplog):
    @tool
    async def broken() -> str:
        """Always fails."""
        raise RuntimeError("disk on fire at /srv/agentik/data")

    @tool
    async def picky() -> str:
        """Refuses on purpose."""
        raise ToolError("the city is not known; give a country too")

    agent.add_tool(broken)
    agent.add_tool(picky)
    scripted.enqueue(
        Reply(
            tool_calls=[
                call("broken", id="c1"),
                call("missing_tool", id="c2"),
                call("broken", "{not json", id="c3"),
                call("picky", id="c4"),
            ]
        ),
        "sorry",
    )
    conv = await agent.create_conversation()
    await conv.send("go")
    await conv.wait_idle()
    results = {m.tool_call_id: m for m in scripted.requests[1].messages if m.role == "tool"}
    # An accident inside a tool reaches the model as a short generic line with a
    # reference; its text (a path here) and the traceback are in the log only.
    broken_result = results["c1"].content
    assert results["c1"].is_error
    assert broken_result.startswith("error: tool broken failed (internal error, ref ")
    assert "/srv" not in broken_result and "RuntimeError" not in broken_result
    ref = broken_result.rsplit("ref ", 1)[1].rstrip(")")
    logged = [r for r in caplog.records if f"ref {ref}" in r.getMessage()]
    assert logged and logged[0].levelname == "ERROR" and logged[0].exc_info is not None
    assert "disk on fire at /srv/agentik/data" in caplog.text
    # A ToolError is the tool's own word to the model, kept as written.
    assert results["c4"].content == "error: the city is not known; give a country too"
    assert "unknown tool 'missing_tool'" in results["c2"].content
    assert "not valid JSON" in results["c3"].content
    assert (await conv.messages())[-1].content == "sorry"


async def test_tool_call_cap_then_answer_without_tools(scripted, db_path):
    calls = []

    @tool
    async def ping() -> str:
        """Ping."""
        calls.append(1)
        return "pong"

    policy = TurnPolicy(max_tool_calls=3)
    async with Agent(llm=scripted, store=SQLiteStore(db_path), tools=[ping], policy=policy) as a:
        scripted.enqueue(
            Reply(tool_calls=[call("ping") for _ in range(2)]),
            Reply(tool_calls=[call("ping") for _ in range(2)]),
            "final",
        )
        conv = await a.create_conversation()
        sub = conv.events()
        await conv.send("ping a lot")
        events = await collect_turn(sub)
    assert len(calls) == 3
    assert events[-1].tool_calls == 3 and events[-1].text == "final"
    refused = [e for e in events if e.kind == "tool_call_ended" and e.is_error]
    assert len(refused) == 1 and "limit reached" in refused[0].result
    assert scripted.requests[2].tools == [] and scripted.requests[2].tool_choice == "none"


async def test_time_budget_stops_a_slow_turn(scripted, db_path):
    @tool
    async def sleepy() -> str:
        """Sleeps."""
        await asyncio.sleep(60)
        return "never"

    policy = TurnPolicy(time_budget=0.3)
    async with Agent(llm=scripted, store=SQLiteStore(db_path), tools=[sleepy], policy=policy) as a:
        scripted.enqueue(Reply(text="checking", tool_calls=[call("sleepy", id="s1")]))
        conv = await a.create_conversation()
        sub = conv.events()
        await conv.send("go")
        events = await collect_turn(sub)
        assert events[-1].stop_reason == "time_budget"
        rows = await conv.messages()
        result = [m for m in rows if m.kind == "tool_result"]
        assert len(result) == 1 and result[0].is_error and "time budget" in result[0].content
        # The working memory stays a valid context: every tool call has a result.
        wm = await conv.working_memory()
        assert [m.role for m in wm] == ["user", "assistant", "tool"]


async def test_tool_timeout_is_an_error_result(scripted, db_path):
    @tool
    async def sleepy() -> str:
        """Sleeps."""
        await asyncio.sleep(60)
        return "never"

    policy = TurnPolicy(tool_timeout=0.05)
    async with Agent(llm=scripted, store=SQLiteStore(db_path), tools=[sleepy], policy=policy) as a:
        scripted.enqueue(Reply(tool_calls=[call("sleepy")]), "gave up")
        conv = await a.create_conversation()
        await conv.send("go")
        await conv.wait_idle()
        tool_msg = next(m for m in scripted.requests[1].messages if m.role == "tool")
        assert "timed out" in tool_msg.content


async def test_interrupt_during_tool_call_cancels_it(agent, scripted):
    cancelled = asyncio.Event()
    running = asyncio.Event()

    @tool
    async def forever() -> str:
        """Runs until cancelled."""
        running.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    agent.add_tool(forever)
    scripted.enqueue(Reply(tool_calls=[call("forever", id="f1")]), "after")
    conv = await agent.create_conversation()
    await conv.send("go")
    await asyncio.wait_for(running.wait(), 60)
    await conv.interrupt()
    assert cancelled.is_set()
    wm = await conv.working_memory()
    assert wm[-1].role == "tool" and wm[-1].tool_call_id == "f1" and wm[-1].is_error
    await conv.send("and now?")
    await conv.wait_idle()
    assert (await conv.messages())[-1].content == "after"


async def test_tool_policy_hides_tools(agent, scripted):
    @tool
    async def secret() -> str:
        """Secret."""
        return "s"

    @tool
    async def public_info() -> str:
        """Public."""
        return "p"

    agent.add_tool(secret)
    agent.add_tool(public_info)
    conv = await agent.create_conversation()
    settings = TurnSettings(policy=TurnPolicy(allowed_tools=("public_*",)))
    scripted.enqueue(Reply(tool_calls=[call("secret", id="x")]), "ok")
    await conv.send("hi", settings=settings)
    await conv.wait_idle()
    assert [t.name for t in scripted.requests[0].tools] == ["public_info"]
    tool_msg = next(m for m in scripted.requests[1].messages if m.role == "tool")
    assert tool_msg.is_error and "unknown tool" in tool_msg.content


async def test_reasoning_events(agent, scripted):
    scripted.enqueue(Reply(reasoning="thinking hard", text="42"))
    conv = await agent.create_conversation()
    sub = conv.events()
    await conv.send("q")
    kinds = [e.kind for e in await collect_turn(sub)]
    assert kinds.index("reasoning_started") < kinds.index("reasoning_delta")
    assert kinds.index("reasoning_delta") < kinds.index("response_started")
    chat = conv.events(after=0, profile="chat")
    await conv.aclose()
    # chat leaves reasoning out; it keeps the lifecycle (run_stream_end included,
    # and the conversation's end: closing it is one).
    assert {e.kind async for e in chat} == {
        "turn_started",
        "text_delta",
        "turn_ended",
        "run_stream_end",
        "conversation_ended",
    }


async def test_events_after_replays_missed_events(agent, scripted):
    conv = await agent.create_conversation()
    await conv.send("one")
    await conv.wait_idle()
    first_turn_end = None
    replay = conv.events(after=0)
    while True:
        e = await anext(replay)
        if e.kind == "run_stream_end":  # the last event of a run, after its turn_ended
            first_turn_end = e.seq
            break
    await conv.send("two")
    await conv.wait_idle()
    resumed = conv.events(after=first_turn_end)
    e = await anext(resumed)
    assert e.kind == "turn_started" and e.seq == first_turn_end + 1


async def test_a_watched_conversation_stays_the_one_its_subscribers_watch(agent, scripted):
    # An HTTP client subscribes in one request and posts in the next; nobody else
    # holds the conversation in between.  Its subscription keeps it in memory, so
    # the lookup finds the same conversation and the subscriber sees the turn.
    conv = await agent.create_conversation()
    cid = conv.id
    sub = conv.events()
    del conv
    gc.collect()
    again = await agent.get_conversation(cid)
    run_id = await again.send("still there?")
    events = await collect_turn(sub, run_id=run_id)
    assert events[-1].text == "echo: still there?"


async def test_agent_event_stream_covers_all_conversations(agent, scripted):
    sub = agent.events(profile="metrics")
    a = await agent.create_conversation()
    b = await agent.create_conversation()
    await a.send("x")
    await b.send("y")
    seen = set()
    while len(seen) < 2:
        e = await asyncio.wait_for(anext(sub), 60)
        if e.kind == "turn_ended":
            seen.add(e.conversation_id)
    assert seen == {a.id, b.id}


async def test_model_error_mid_stream_is_an_error_event_and_keeps_partial(agent, scripted):
    scripted.enqueue(Reply(text="half of it", fail_after=1), "recovered")
    conv = await agent.create_conversation()
    sub = conv.events()
    await conv.send("q1")
    events = await collect_turn(sub)
    err = [e for e in events if e.kind == "error"]
    assert len(err) == 1 and err[0].retryable and "dropped" in err[0].message
    assert events[-1].stop_reason == "error"
    rows = await conv.messages()
    assert [(m.kind, m.status) for m in rows] == [("user", "complete"), ("assistant", "error")]
    assert rows[1].content == "half "
    await conv.send("q2")
    await conv.wait_idle()
    assert (await conv.messages())[-1].content == "recovered"


async def test_conversation_lifecycle(agent, scripted, db_path):
    conv = await agent.create_conversation(title="hello")
    await conv.rename("renamed")
    got = await agent.get_conversation(conv.id)
    assert got is conv and got.title == "renamed"
    temp = await agent.create_conversation(temp=True)
    await temp.send("secret temp message")
    await temp.wait_idle()
    assert [m.kind for m in await temp.messages()] == ["user", "assistant"]
    listed = [r.id for r in await agent.list_conversations()]
    assert set(listed) == {conv.id, temp.id}
    con = sqlite3.connect(db_path)
    assert con.execute("SELECT COUNT(*) FROM conversation WHERE id = ?", (temp.id,)).fetchone() == (
        0,
    )
    assert con.execute("SELECT COUNT(*) FROM message").fetchone() == (0,)
    con.close()
    await agent.delete_conversation(temp.id)
    await conv.send("x")
    await conv.wait_idle()
    await agent.delete_conversation(conv.id)
    with pytest.raises(NotFound):
        await agent.get_conversation(conv.id)
    with pytest.raises(NotFound):
        await agent.delete_conversation(conv.id)
    with pytest.raises(ClosedError):
        await conv.send("after delete")


async def test_channel_binding_persists_across_restart(db_path):
    model = ScriptedModel()
    async with Agent(llm=model, store=SQLiteStore(db_path)) as a:
        conv = await a.conversation_for_channel("irc:libera:#agentik")
        same = await a.conversation_for_channel("irc:libera:#agentik")
        assert same is conv
        await conv.send("remember me")
        await conv.wait_idle()
        first_id = conv.id
        # Concurrent get-or-create of a new channel makes one conversation.
        many = await asyncio.gather(*(a.conversation_for_channel("slack:T1:C1") for _ in range(10)))
        assert len({c.id for c in many}) == 1
    async with Agent(llm=model, store=SQLiteStore(db_path)) as a:
        conv = await a.conversation_for_channel("irc:libera:#agentik")
        assert conv.id == first_id and conv.channel_key == "irc:libera:#agentik"
        await conv.send("and now")
        await conv.wait_idle()
        ctx = [m.content for m in model.requests[-1].messages]
        assert ctx == ["remember me", "echo: remember me", "and now"]
        fresh = await a.new_conversation_for_channel("irc:libera:#agentik")
        assert fresh.id != first_id
        assert (await a.conversation_for_channel("irc:libera:#agentik")).id == fresh.id
        assert (await a.get_conversation(first_id)).id == first_id


async def test_a_new_channels_binding_is_written_with_its_first_message(db_path):
    """A channel opened for a message (a new Slack thread): its conversation, its
    binding and that message commit together; opened and left, nothing is stored."""
    model = ScriptedModel()
    key = "slack:T1:C1:1700000000.000100"
    async with Agent(llm=model, store=SQLiteStore(db_path)) as a:
        store = a.store
        conv = await a.conversation_for_channel(key, lazy=True)
        assert await a.conversation_for_channel(key, lazy=True) is conv
        assert await store.get_binding(key) is None  # nothing written yet
        await store.trace_statements(True)
        await conv.send("hello")
        statements = await store.trace_statements(False)
        # One transaction made it all: the conversation, the binding, the message.
        start = next(i for i, s in enumerate(statements) if "INTO conversation " in s)
        end = statements.index("COMMIT", start)
        one = statements[start:end]
        assert any("INTO channel_binding" in s for s in one), statements
        assert any("INTO message " in s for s in one), statements
        assert sum("INTO channel_binding" in s for s in statements) == 1
        assert await store.get_binding(key) == conv.id
        await conv.wait_idle()
        # A channel opened and closed with nothing said leaves no conversation.
        quiet = await a.conversation_for_channel("slack:T1:C1:1700000001.000100", lazy=True)
        await quiet.aclose()
        assert [r.id for r in await store.list_conversations()] == [conv.id]
        # A note (ambient chat) is the first write: it writes the binding first.
        other = await a.conversation_for_channel("irc:net:#other", lazy=True)
        await other.note("said in passing", author="bob")
        assert await store.get_binding("irc:net:#other") == other.id
        # Asked without lazy (links, commands), a pending one is stored at once.
        third = await a.conversation_for_channel("irc:net:#third", lazy=True)
        assert (await a.conversation_for_channel("irc:net:#third")) is third
        assert await store.get_binding("irc:net:#third") == third.id
    async with Agent(llm=model, store=SQLiteStore(db_path)) as a:
        again = await a.conversation_for_channel(key, lazy=True)
        assert again.id == conv.id
        assert [m.content for m in await again.messages()] == ["hello", "echo: hello"]


async def test_system_prompt_goes_first(scripted, db_path):
    async with Agent(llm=scripted, store=SQLiteStore(db_path), system_prompt="Be brief.") as a:
        conv = await a.create_conversation()
        await conv.send("hi")
        await conv.wait_idle()
    assert scripted.requests[0].system == "Be brief."


async def test_close_interrupts_running_turns_and_leaves_no_tasks(scripted, db_path):
    gate = asyncio.Event()
    scripted.enqueue(Reply(text="never finishes", gate=gate))
    a = Agent(llm=scripted, store=SQLiteStore(db_path))
    await a.start()
    conv = await a.create_conversation()
    sub = conv.events()
    await conv.send("hello")
    await conv.send("queued")
    before = {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}
    assert any(t.get_name().startswith("agentik-turn") for t in before)
    await a.aclose()
    kinds = [e.kind async for e in sub]
    # The conversation ends with the agent (issue 35): its end is the last event.
    assert "interrupted" in kinds
    assert kinds[-3:] == ["turn_ended", "run_stream_end", "conversation_ended"]
    leftover = [
        t
        for t in asyncio.all_tasks()
        if t is not asyncio.current_task() and t.get_name().startswith("agentik")
    ]
    assert leftover == []
    assert scripted.closed
    with pytest.raises(ClosedError):
        await conv.send("late")
    # Both user messages were kept; the queued one reaches the model next time.
    model2 = ScriptedModel()
    async with Agent(llm=model2, store=SQLiteStore(db_path)) as a2:
        conv2 = await a2.get_conversation(conv.id)
        await conv2.send("back")
        await conv2.wait_idle()
        assert [m.content for m in model2.requests[0].messages if m.role == "user"] == [
            "hello",
            "queued",
            "back",
        ]


async def test_replay_buffers_share_a_budget(scripted, db_path):
    async with Agent(
        llm=scripted, store=SQLiteStore(db_path), event_buffer=64, event_budget=100
    ) as a:
        first = await a.create_conversation()
        await first.send(" ".join(f"w{i}" for i in range(30)))
        await first.wait_idle()
        others = [await a.create_conversation() for _ in range(10)]
        for c in others:
            await c.send(" ".join(f"w{i}" for i in range(30)))
            await c.wait_idle()
        assert a.services.buffered <= 100
        # The least recently active conversation lost its replay buffer ...
        gone = first.events(after=0)
        assert (await anext(gone)).kind == "events_lost"
        # ... the most recent one still has it.
        kept = others[-1].events(after=0)
        assert (await anext(kept)).kind == "turn_started"
        # Bindings leave no per-channel lock behind.
        for i in range(20):
            await a.conversation_for_channel(f"irc:net:#c{i}")
        assert a.channel_locks == 0


async def test_replay_buffers_share_a_budget_of_bytes(db_path):
    # Tool outputs travel in events (tool_call_ended): counted in events alone, the
    # budget let 50,000 of them hold gigabytes with large outputs.
    big = "x" * 20_000
    model = ScriptedModel(
        [r for _ in range(8) for r in (Reply(tool_calls=[call("echo", {"text": big})]), "done")]
    )

    async def echo(text: str) -> str:
        """Say it back."""
        return text

    async with Agent(
        llm=model, store=SQLiteStore(db_path), tools=[tool(echo)], event_bytes=100_000
    ) as a:
        convs = [await a.create_conversation() for _ in range(8)]
        for c in convs:
            await c.send("go")
            await c.wait_idle()
        # Each turn's events carry its 20 KB argument and result: about 40 KB.
        assert a.services.buffered_bytes <= 100_000
        # The least recently active conversations lost their replay ...
        assert (await anext(convs[0].events(after=0))).kind == "events_lost"
        # ... the latest keeps its whole turn, the large result included.
        kept = convs[-1].events(after=0)
        seen = []
        while not seen or seen[-1].kind != "turn_ended":
            seen.append(await anext(kept))
        assert any(e.kind == "tool_call_ended" and e.result == big for e in seen)


async def test_the_agent_wide_replay_keeps_a_budget_of_bytes_too(db_path):
    # Agent.events(after=...) (the HTTP API's /agentik/events) replays the agent-wide
    # stream's buffer: counted in events alone (4,096), it held every recent 20-64 KB
    # tool output, also once every conversation was idle and dropped.
    big = "x" * 20_000
    replies = [r for _ in range(8) for r in (Reply(tool_calls=[call("echo", {"text": big})]), "ok")]
    model = ScriptedModel([*replies, "small"])

    async def echo(text: str) -> str:
        """Say it back."""
        return text

    async with Agent(
        llm=model, store=SQLiteStore(db_path), tools=[tool(echo)], event_bytes=100_000
    ) as a:
        for _ in range(8):
            conv = await a.create_conversation()
            await conv.send("go")
            await conv.wait_idle()
        replay = a.events(after=0)
        last = await a.create_conversation()
        await last.send("hi")
        seen = []
        while not (seen and seen[-1].kind == "turn_ended" and seen[-1].conversation_id == last.id):
            seen.append(await anext(replay))
        assert seen[0].kind == "events_lost"  # the oldest are gone ...
        carrying = [e for e in seen if big in (getattr(e, "result", "") or "")
                    or big in (getattr(e, "arguments", "") or "")]  # fmt: skip
        assert len(carrying) <= 1  # ... a quarter of event_bytes (25 KB) is kept
        assert seen[-1].text == "small"  # and what happens now still streams


async def test_a_dropped_conversation_leaves_no_events_behind(agent, scripted):
    # A conversation nobody holds reloads from the store as a new object, with a
    # stream of its own: the old stream's replay buffer is freed with it, and
    # leaves the budget shared by the others (it does not wait to be pushed out).
    convs = [await agent.create_conversation() for _ in range(5)]
    for i, conv in enumerate(convs):
        await conv.send(f"hello {i}")
        await conv.wait_idle()
    ids = [c.id for c in convs]
    held = agent.services.buffered
    assert held > 0
    kept = convs[-1]
    del conv, convs
    gc.collect()
    await asyncio.sleep(0)  # taken out on the event loop
    assert agent.services.buffered == held // 5
    # The one still held replays its turn; the others, reloaded, start afresh.
    assert (await anext(kept.events(after=0))).kind == "turn_started"
    again = await agent.get_conversation(ids[0])
    await again.send("back")
    await again.wait_idle()
    assert [m.content for m in scripted.requests[-1].messages if m.role == "user"] == [
        "hello 0",
        "back",
    ]


async def test_compaction_keeps_the_audit_log_and_invents_no_messages(db_path):
    model = ScriptedModel()
    async with Agent(llm=model, store=SQLiteStore(db_path)) as a:
        conv = await a.create_conversation()
        for i in range(3):
            await conv.send(f"question {i}")
            await conv.wait_idle()
        entries = await a.store.load_memory(conv.id)
        assert len(entries) == 6
        await conv.compact(entries[3].pos, "Summary: asked questions 0 and 1.")
        await conv.send("question 3")
        await conv.wait_idle()
        ctx = [(m.role, m.content) for m in model.requests[-1].messages]
        assert ctx == [
            ("system", "Summary: asked questions 0 and 1."),
            ("user", "question 2"),
            ("assistant", "echo: question 2"),
            ("user", "question 3"),
        ]
        assert await conv.count_messages() == 8
    async with Agent(llm=model, store=SQLiteStore(db_path)) as a:
        conv = await a.get_conversation(conv.id)
        await conv.send("question 4")
        await conv.wait_idle()
        users = [m.content for m in model.requests[-1].messages if m.role == "user"]
        assert users == ["question 2", "question 3", "question 4"]


async def test_ambient_notes_reach_the_model_with_the_next_turn(agent, scripted):
    conv = await agent.conversation_for_channel("irc:net:#room")
    await conv.note("anyone seen the build?", author="bob")
    await conv.note("it is red again", author="carol")
    for i in range(5):
        await conv.note(f"old chatter {i}", author="dave", keep=3)
    await conv.send("what is going on?", author="alice")
    await conv.wait_idle()
    ctx = [(m.author, m.content) for m in scripted.requests[-1].messages]
    assert ctx == [
        ("dave", "old chatter 2"),
        ("dave", "old chatter 3"),
        ("dave", "old chatter 4"),
        ("alice", "what is going on?"),
    ]
    # All of it is in the audit log; nothing was answered but alice.
    rows = await conv.messages()
    assert [m.kind for m in rows].count("user") == 8
    assert [m.kind for m in rows].count("assistant") == 1
    # While a turn runs, notes wait for the next turn (never inside a turn's context).
    gate = asyncio.Event()
    scripted.enqueue(Reply(text="thinking", gate=gate), "second")
    await conv.send("first question")
    await conv.note("meanwhile…", author="bob")
    await conv.send("second question")
    gate.set()
    await conv.wait_idle()
    assert [m.content for m in scripted.requests[-1].messages][-3:] == [
        "thinking",
        "meanwhile…",
        "second question",
    ]


async def test_the_agent_has_an_id(scripted):
    """The seed's ``agent.id``: given, or a fresh one per agent (it had none)."""
    async with Agent(llm=scripted, id="support-bot") as named, Agent(llm=scripted) as a:
        assert named.id == "support-bot"
        b = Agent(llm=scripted)
        assert isinstance(a.id, str) and len(a.id) == 32 and a.id != b.id
        assert "support-bot" in repr(named)
