"""A conversation never outgrows its model: fitting each request to the context window.

Before every request the context is measured against the model's real window;
compaction (when enabled) and then trimming of the oldest whole turns make it
fit, and a request the model refuses as too large (HTTP 413, an OpenAI-style
``context_length_exceeded``) is shrunk and retried once.  The scripted model
stands in for a model with a small window (``ScriptedModel(context_window=…)``
refuses anything larger, like a real one); the refusals go through the real
``openai`` SDK against the fake OpenAI-compatible server.
"""

from __future__ import annotations

from agentik.core import Agent, ContextTooLong, OpenAIBackend, SQLiteStore, tool
from agentik.core.compaction import CompactionPolicy, estimate_tokens
from agentik.core.testing.openai_server import Reply as HTTPReply
from agentik.core.testing.scripted import Reply, ScriptedModel, call
from helpers import ended, turn

WINDOW = 200


def compacted(events) -> list:
    return [e for e in events if e.kind == "compacted"]


def size(request) -> int:
    return estimate_tokens(request.messages, request.system, request.tools)


def tool_pairs_intact(memory) -> bool:
    """Every tool result in ``memory`` follows the call it answers."""
    seen: set[str] = set()
    for m in memory:
        seen.update(c.id for c in m.tool_calls)
        if m.role == "tool" and m.tool_call_id not in seen:
            return False
    return True


async def test_with_compaction_off_the_oldest_turns_are_dropped_to_fit_the_window(db_path):
    model = ScriptedModel(context_window=WINDOW)
    policy = CompactionPolicy(enabled=False)
    async with Agent(llm=model, store=SQLiteStore(db_path), compaction=policy) as agent:
        conv = await agent.create_conversation()
        notices = []
        for i in range(6):
            events = await turn(conv, f"message {i} " + "words " * 25)
            assert ended(events).stop_reason == "stop"
            assert ended(events).text.startswith(f"echo: message {i}")
            notices += compacted(events)
        memory = await conv.working_memory()
        rows = await conv.messages()
    # Six turns of ~80 tokens each never fit 200: the oldest were dropped,
    # every request fitted, and no request was refused.
    assert notices, "the history outgrew the window and was trimmed"
    assert all(e.fallback and e.reason == "window" and e.messages > 0 for e in notices)
    assert all(e.tokens_after <= WINDOW < e.tokens_before for e in notices)
    assert not model.refused
    assert len(model.requests) == 6, "compaction is off: no summary was asked for"
    assert all(size(r) <= WINDOW for r in model.requests)
    # The working memory says what happened, and ends with the latest exchange.
    assert memory[0].role == "system" and "dropped to fit" in memory[0].content
    assert memory[-2].content.startswith("message 5") and memory[-1].role == "assistant"
    # The audit log keeps every message.
    assert [m.kind for m in rows] == ["user", "assistant"] * 6


async def test_trimming_never_separates_a_tool_call_from_its_result(db_path):
    model = ScriptedModel(context_window=WINDOW)
    policy = CompactionPolicy(enabled=False)
    async with Agent(llm=model, store=SQLiteStore(db_path), compaction=policy) as agent:

        @tool
        async def lookup(key: str) -> str:
            """Look a key up."""
            return "value " * 30

        agent.add_tool(lookup)
        conv = await agent.create_conversation()
        for i in range(4):
            model.enqueue(Reply(tool_calls=[call("lookup", {"key": f"k{i}"})]), f"done {i}")
            events = await turn(conv, f"look up k{i}")
            assert ended(events).stop_reason == "stop"
        memory = await conv.working_memory()
    assert not model.refused
    # Every request the model saw (including the steps after a tool result)
    # kept each result next to its call.
    for request in model.requests:
        assert size(request) <= WINDOW
        assert tool_pairs_intact(request.messages)
        assert request.messages[-1].role in ("user", "tool")
    assert memory[0].role == "system" and tool_pairs_intact(memory)
    assert memory[-1].content == "done 3"


async def test_a_message_too_long_for_the_window_ends_its_turn_with_a_clear_error(db_path):
    model = ScriptedModel(context_window=WINDOW)
    policy = CompactionPolicy(enabled=False)
    async with Agent(llm=model, store=SQLiteStore(db_path), compaction=policy) as agent:
        conv = await agent.create_conversation()
        ended(await turn(conv, "hello"))
        events = await turn(conv, "x " * 2000)
        end = ended(events)
        errors = [e for e in events if e.kind == "error"]
        # No engine error, no request sent: a clear message instead.
        assert end.stop_reason == "error" and len(errors) == 1
        assert errors[0].error_type == "ContextTooLong"
        assert "too long for the model's context" in errors[0].message
        assert len(model.requests) == 1 and not model.refused
        # The conversation is not wedged: the next message is answered, the
        # huge one dropped from the context (the audit log keeps it).
        after = await turn(conv, "shorter now")
        assert ended(after).stop_reason == "stop" and ended(after).text == "echo: shorter now"
        assert size(model.requests[-1]) <= WINDOW
        rows = await conv.messages()
    # The failed turn's answer is its error, in the audit log (not in the context).
    assert [m.kind for m in rows] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert rows[2].content == "x " * 2000
    assert (rows[3].content, rows[3].status) == ("", "error")
    assert rows[3].data["error"]["type"] == "ContextTooLong"


async def test_compaction_that_leaves_too_much_is_followed_by_trimming(db_path):
    def answer(request):
        if request.tool_choice == "none" and "Summarise" in (request.system or ""):
            return "They talked at length."
        return "long answer " * 90  # ~275 tokens: one fits the window, two do not

    model = ScriptedModel(["short answer"], context_window=300, default=answer)
    policy = CompactionPolicy(keep_turns=2)
    async with Agent(llm=model, store=SQLiteStore(db_path), compaction=policy) as agent:
        conv = await agent.create_conversation()
        seen = []
        for i in range(3):
            events = await turn(conv, f"question {i} " + "words " * 10)
            assert ended(events).stop_reason == "stop"
            seen += compacted(events)
        memory = await conv.working_memory()
    # The third request passed the trigger: the first turn was summarised,
    # but the two turns kept verbatim were still more than the window holds,
    # so the older of them was dropped too.
    assert [(e.reason, e.fallback) for e in seen] == [("budget", False), ("window", True)]
    assert not model.refused
    assert all(size(r) <= 300 for r in model.requests)
    assert memory[0].role == "system" and memory[1].content.startswith("question 2")


# -- the model refuses a request as too large: shrink and retry once ------------------------


async def refusing_agent(server, db_path, **policy):
    llm = OpenAIBackend(
        model="fake-model", base_url=server.base_url, api_key="sk-test", max_retries=0
    )
    return Agent(llm=llm, store=SQLiteStore(db_path), compaction=CompactionPolicy(**policy))


async def fill(conv, n: int) -> None:
    for i in range(n):
        assert ended(await turn(conv, f"earlier message {i} " + "text " * 40)).stop_reason == "stop"


async def test_a_413_is_answered_by_trimming_and_one_retry(openai_server, db_path):
    async with await refusing_agent(openai_server, db_path, enabled=False) as agent:
        conv = await agent.create_conversation()
        await fill(conv, 3)
        before = len(openai_server.requests)
        openai_server.enqueue(HTTPReply.error(413, "Request Entity Too Large"))
        events = await turn(conv, "and now?")
        memory = await conv.working_memory()
    end = ended(events)
    assert end.stop_reason == "stop" and end.text == "echo: alice: and now?"
    assert not [e for e in events if e.kind == "error"]
    (notice,) = compacted(events)
    assert notice.reason == "refused" and notice.fallback and notice.messages > 0
    refused, retried = openai_server.requests[before:]
    # The retry carried a smaller context, still ending with the new message.
    assert len(retried["messages"]) < len(refused["messages"])
    assert retried["messages"][-1] == {"role": "user", "content": "alice: and now?"}
    assert memory[0].role == "system" and "dropped" in memory[0].content


async def test_context_length_exceeded_is_answered_by_compaction_and_one_retry(
    openai_server, db_path
):
    async with await refusing_agent(openai_server, db_path, keep_turns=1) as agent:
        conv = await agent.create_conversation()
        await fill(conv, 3)
        before = len(openai_server.requests)
        openai_server.enqueue(
            HTTPReply.error(
                400,
                "This model's maximum context length is 4096 tokens.",
                code="context_length_exceeded",
            ),
            HTTPReply.text("A summary of the earlier messages."),
        )
        events = await turn(conv, "and now?")
        memory = await conv.working_memory()
    end = ended(events)
    assert end.stop_reason == "stop" and end.text == "echo: alice: and now?"
    notices = compacted(events)
    assert notices and notices[0].reason == "refused" and not notices[0].fallback
    refused, summary, retried = openai_server.requests[before:]
    assert "Summarise" in summary["messages"][0]["content"]
    assert len(retried["messages"]) < len(refused["messages"])
    assert memory[0].content.startswith("Summary of the earlier conversation")


async def test_a_second_refusal_ends_the_turn_and_the_next_one_still_works(openai_server, db_path):
    async with await refusing_agent(openai_server, db_path, enabled=False) as agent:
        conv = await agent.create_conversation()
        await fill(conv, 3)
        before = len(openai_server.requests)
        openai_server.enqueue(HTTPReply.error(413), HTTPReply.error(413))
        events = await turn(conv, "and now?")
        errors = [e for e in events if e.kind == "error"]
        assert ended(events).stop_reason == "error" and len(errors) == 1
        assert errors[0].error_type == "ContextTooLong" and "too large" in errors[0].message
        assert "sk-test" not in errors[0].message
        # One retry, not a loop.
        assert len(openai_server.requests) - before == 2
        after = await turn(conv, "hello again")
        assert ended(after).stop_reason == "stop"
        assert ended(after).text == "echo: alice: hello again"


async def test_the_openai_backend_maps_size_refusals_to_context_too_long(openai_server):
    from agentik.core.llm.base import LLMRequest
    from agentik.core.messages import ChatMessage

    llm = OpenAIBackend(model="fake-model", base_url=openai_server.base_url, max_retries=0)
    request = LLMRequest(messages=(ChatMessage(role="user", content="hi"),))
    cases = [
        HTTPReply.error(413),
        HTTPReply.error(400, "too long", code="context_length_exceeded"),
        HTTPReply.error(400, "the prompt exceeds the context size of the model"),
    ]
    try:
        for reply in cases:
            openai_server.enqueue(reply)
            try:
                [item async for item in llm.stream(request)]
            except ContextTooLong as exc:
                assert exc.status_code == reply.status
            else:
                raise AssertionError("no error")
        # Other client errors stay what they were.
        openai_server.enqueue(HTTPReply.error(400, "bad temperature"))
        try:
            [item async for item in llm.stream(request)]
        except ContextTooLong:
            raise AssertionError("not a size refusal") from None
        except Exception as exc:
            assert type(exc).__name__ == "LLMStatusError"
    finally:
        await llm.aclose()


async def test_the_channel_is_told_when_older_messages_were_dropped(db_path):
    from agentik.bot.bridge import Bridge, ChannelOptions
    from agentik.transports.testing import MemoryTransport

    model = ScriptedModel(context_window=WINDOW)
    policy = CompactionPolicy(enabled=False)
    async with Agent(llm=model, store=SQLiteStore(db_path), compaction=policy) as agent:
        bridge = Bridge(agent)
        t = MemoryTransport(name="mem")
        bridge.attach(t, ChannelOptions(command_prefix="!"))
        await t.start(bridge)
        try:
            await t.inject("first " * 40, channel_key="mem:alice", author="alice", direct=True)
            await bridge.flush("mem:alice")
            assert t.texts("notice") == [], "nothing dropped yet"
            await t.inject("words " * 60, channel_key="mem:alice", author="alice", direct=True)
            await bridge.flush("mem:alice")
        finally:
            await bridge.aclose()
    # In the chat profile too (not only when debugging): the people in the
    # channel learn that the model no longer sees the earlier messages.
    assert t.texts("notice") == ["(context compacted: 2 older messages dropped)"]
    assert t.texts("answer")[-1].startswith("echo: words")


async def test_plugins_see_the_messages_dropped_to_fit_before_they_go(db_path):
    from agentik.core.hookspecs import hookimpl

    class Keeper:
        def __init__(self) -> None:
            self.seen: list[tuple[str, list[str]]] = []

        @hookimpl
        def before_compact(self, conversation, messages, reason):
            self.seen.append((reason, [m.content for m in messages]))

    keeper = Keeper()
    model = ScriptedModel(context_window=WINDOW)
    policy = CompactionPolicy(enabled=False)
    async with Agent(
        llm=model, store=SQLiteStore(db_path), compaction=policy, hooks=[keeper]
    ) as agent:
        conv = await agent.create_conversation()
        first = "first " * 40
        ended(await turn(conv, first))
        ended(await turn(conv, "second " * 40))
    assert keeper.seen == [("window", [first, "echo: " + first])]
