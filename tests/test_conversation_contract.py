"""The library's conversation contract, run against both implementations.

Every test here runs twice: on an in-process :class:`~agentik.core.Agent`, and
on :class:`~agentik.core.client.RemoteAgent` driving a real ``agentik run``
process over its HTTP+SSE API. Both answer through the same fake
OpenAI-compatible server (the real ``openai`` SDK on both sides), so code
written against the library behaves the same against a remote bot.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from remotebots import RunningBot, bot_config, running_bot

from agentik.core import Agent, NotFound, OpenAIBackend, SQLiteStore
from agentik.core.client import RemoteAgent
from agentik.core.testing.openai_server import FakeOpenAIServer, Reply

WAIT = 60.0


@pytest.fixture(scope="module")
def llm() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer.in_thread() as server:
        yield server


@pytest.fixture(scope="module")
def remote_bot(llm, tmp_path_factory) -> Iterator[RunningBot]:
    folder = tmp_path_factory.mktemp("remote")
    with running_bot(bot_config(folder, llm.base_url, name="remote")) as bot:
        yield bot


@pytest.fixture
async def local_agent(llm, tmp_path) -> AsyncIterator[Agent]:
    backend = OpenAIBackend(model="fake-model", base_url=llm.base_url, api_key="x", timeout=60)
    async with Agent(llm=backend, store=SQLiteStore(str(tmp_path / "local.db"))) as agent:
        yield agent


@pytest.fixture
async def remote_agent(remote_bot) -> AsyncIterator[RemoteAgent]:
    async with remote_bot.client() as agent:
        yield agent


@pytest.fixture(params=["local", "remote"])
def agent(request) -> Any:
    """The agent under test: in process, or a remote bot through the client."""
    return request.getfixturevalue(f"{request.param}_agent")


async def _until(events: Any, kind: str, *, run_id: str | None = None) -> list[Any]:
    """Events up to and including the first ``kind`` (of ``run_id``, if given)."""
    seen = []
    async with asyncio.timeout(WAIT):
        async for event in events:
            seen.append(event)
            if event.kind == kind and (run_id is None or event.run_id == run_id):
                return seen
    raise AssertionError(f"the stream ended before {kind}: {[e.kind for e in seen]}")


async def test_send_commits_the_message_then_a_turn_answers_it(agent):
    conv = await agent.create_conversation()
    events = conv.events()
    run_id = await conv.send("hello there", author="alice")
    # Committed when send returns: the history has it already.
    assert [(m.kind, m.content) for m in await conv.messages()][:1] == [("user", "hello there")]
    seen = await _until(events, "run_stream_end", run_id=run_id)
    kinds = [e.kind for e in seen]
    assert kinds[0] == "turn_started" and "text_delta" in kinds
    assert kinds.index("turn_ended") < kinds.index("run_stream_end")
    ended = next(e for e in seen if e.kind == "turn_ended")
    assert ended.run_id == run_id and ended.stop_reason == "stop"
    assert ended.text == "echo: alice: hello there"
    assert "".join(e.text for e in seen if e.kind == "text_delta") == ended.text
    assert all(e.conversation_id == conv.id for e in seen)
    seqs = [e.seq for e in seen]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    history = await conv.messages()
    assert [(m.kind, m.run_id) for m in history] == [("user", run_id), ("assistant", run_id)]
    assert history[-1].content == ended.text
    await events.aclose()


async def test_messages_sent_during_a_turn_are_queued_and_answered_in_order(agent, llm):
    conv = await agent.create_conversation()
    events = conv.events(profile="chat")
    held = Reply.text("first answer", chunks=2, hold_after=1)
    llm.enqueue(held)
    first = await conv.send("one", author="alice")
    await held.wait_held(WAIT)
    second = await conv.send("two", author="alice")
    third = await conv.send("three", author="alice")
    assert len({first, second, third}) == 3
    held.release()
    ends = []
    async with asyncio.timeout(WAIT):
        async for event in events:
            if event.kind == "turn_ended":
                ends.append((event.run_id, event.text))
                if len(ends) == 3:
                    break
    assert ends == [
        (first, "first answer"),
        (second, "echo: alice: two"),
        (third, "echo: alice: three"),
    ]
    users = [m.content for m in await conv.messages() if m.kind == "user"]
    assert users == ["one", "two", "three"]


async def test_interrupt_stops_the_turn_and_keeps_its_partial_answer(agent, llm):
    conv = await agent.create_conversation()
    events = conv.events()
    # Held after its first words (never released): the interrupt lands mid-answer.
    llm.enqueue(Reply.text("partial words and the rest", chunks=3, hold_after=1))
    run_id = await conv.send("talk", author="alice")
    await _until(events, "text_delta", run_id=run_id)
    assert await conv.interrupt() is True
    seen = await _until(events, "turn_ended", run_id=run_id)
    assert "interrupted" in [e.kind for e in seen]
    assert seen[-1].stop_reason == "interrupted"
    partial = [m for m in await conv.messages() if m.kind == "assistant"]
    assert len(partial) == 1 and partial[0].status == "interrupted"
    assert partial[0].content and "rest" not in partial[0].content
    assert await conv.interrupt() is False  # nothing runs now
    # The conversation goes on.
    again = await conv.send("again", author="alice")
    ended = (await _until(events, "turn_ended", run_id=again))[-1]
    assert ended.text == "echo: alice: again"


async def test_events_after_a_sequence_number_replay_what_was_missed(agent):
    conv = await agent.create_conversation()
    events = conv.events()
    first = await conv.send("one", author="alice")
    first_turn = await _until(events, "run_stream_end", run_id=first)
    second = await conv.send("two", author="alice")
    second_turn = await _until(events, "run_stream_end", run_id=second)
    await events.aclose()
    # A subscriber that saw the first turn only reconnects after its last event.
    resumed = conv.events(after=first_turn[-1].seq)
    replayed = await _until(resumed, "run_stream_end", run_id=second)
    assert [(e.kind, e.seq, e.run_id) for e in replayed] == [
        (e.kind, e.seq, e.run_id) for e in second_turn
    ]
    await resumed.aclose()


async def test_a_reader_opening_mid_answer_gets_the_running_turn_from_its_start(agent, llm):
    """``events(from_turn=True)`` (the HTTP API's ``?replay=turn``): a subscriber that
    comes while an answer is being written first gets that turn's events from its
    ``turn_started``, the pieces sent before it came included; a plain subscriber gets
    what comes from then on."""
    conv = await agent.create_conversation()
    events = conv.events()
    held = Reply.text("the first words and the rest", chunks=3, hold_after=1)
    llm.enqueue(held)
    run_id = await conv.send("talk", author="alice")
    await _until(events, "text_delta", run_id=run_id)  # its first piece is out
    late, plain = conv.events(from_turn=True), conv.events()
    # Another question, queued behind the turn (it waits for the two streams to connect).
    queued = await conv.send("and then?", author="alice")
    held.release()
    whole = await _until(late, "run_stream_end", run_id=queued)
    rest = await _until(plain, "run_stream_end", run_id=queued)
    assert (whole[0].kind, whole[0].run_id) == ("turn_started", run_id)

    def said(seen: list[Any], run: str) -> str:
        return "".join(e.text for e in seen if e.kind == "text_delta" and e.run_id == run)

    assert said(whole, run_id) == "the first words and the rest"
    assert "the first words and the rest".endswith(said(rest, run_id))
    assert said(rest, run_id) != "the first words and the rest"
    # Both have the queued turn whole, with the same numbers.
    assert [e.seq for e in whole if e.run_id == queued] == [
        e.seq for e in rest if e.run_id == queued
    ]
    # No turn running: from now on, as without it.
    idle = conv.events(from_turn=True)
    after = await conv.send("last", author="alice")
    assert (await _until(idle, "turn_started"))[0].run_id == after
    for stream in (events, late, plain, idle):
        await stream.aclose()


async def test_conversations_are_created_found_listed_renamed_and_deleted(agent):
    made = await agent.create_conversation(title="first")
    other = await agent.create_conversation(title="second")
    found = await agent.get_conversation(made.id)
    assert (found.id, found.title) == (made.id, "first")
    listed = [r.id for r in await agent.list_conversations(limit=100)]
    assert made.id in listed and other.id in listed
    # Most recently active first: a rename is activity.
    await found.rename("renamed")
    assert (await agent.get_conversation(made.id)).title == "renamed"
    page = await agent.list_conversations(limit=1)
    assert [r.id for r in page] == [made.id] and page[0].title == "renamed"
    assert [r.id for r in await agent.list_conversations(limit=1, offset=1)] == [other.id]
    await agent.delete_conversation(made.id)
    with pytest.raises(NotFound):
        await agent.get_conversation(made.id)
    with pytest.raises(NotFound):
        await agent.delete_conversation(made.id)
    assert made.id not in [r.id for r in await agent.list_conversations(limit=100)]


async def test_history_comes_in_pages(agent):
    conv = await agent.create_conversation()
    events = conv.events(profile="chat")
    for text in ("a", "b", "c"):
        run_id = await conv.send(text, author="alice")
        await _until(events, "turn_ended", run_id=run_id)
    everything = await conv.messages()
    assert [m.content for m in everything if m.kind == "user"] == ["a", "b", "c"]
    assert len(everything) == 6
    latest = await conv.messages(limit=2)
    assert [m.id for m in latest] == [m.id for m in everything[-2:]]
    older = await conv.messages(before=latest[0].id, limit=2)
    assert [m.id for m in older] == [m.id for m in everything[-4:-2]]
    forward = await conv.messages(after=everything[1].id, limit=3)
    assert [m.id for m in forward] == [m.id for m in everything[2:5]]
    skipped = await conv.messages(offset=4, limit=10)
    assert [m.id for m in skipped] == [m.id for m in everything[4:]]


async def test_the_agent_wide_stream_carries_every_conversations_events(agent):
    events = agent.events(profile="metrics")
    a = await agent.create_conversation()
    b = await agent.create_conversation()
    runs = {await a.send("x", author="alice"): a.id, await b.send("y", author="alice"): b.id}
    seen: dict[str, str] = {}
    async with asyncio.timeout(WAIT):
        async for event in events:
            if event.kind == "turn_ended" and event.run_id in runs:
                seen[event.run_id] = event.conversation_id
                if len(seen) == 2:
                    break
    assert seen == runs
    await events.aclose()


async def test_an_unknown_conversation_is_not_found(agent):
    with pytest.raises(NotFound):
        await agent.get_conversation("0123456789abcdef0123456789abcdef")
