"""One bad exchange never wedges a conversation.

Oversized tool arguments, tool results and answers stay whole in the audit log
but enter the working memory cut; a model that keeps calling tools past the
cap ends the turn with ``tool_limit``; quirks real OpenAI-compatible servers
produce on the wire are a normal stream.  The OpenAI tests run the real
``openai`` SDK against the fake server over loopback.
"""

from __future__ import annotations

import json

import openai
import pytest

from agentik.bot.app import load_registry
from agentik.bot.bridge import Bridge, ChannelOptions
from agentik.bot.builder import AgentBuilder
from agentik.bot.config import parse_config
from agentik.core import (
    Agent,
    ConfigError,
    OpenAIBackend,
    SQLiteStore,
    ToolError,
    TurnPolicy,
    tool,
)
from agentik.core.testing import openai_server as fake
from agentik.core.testing.openai_server import FakeOpenAIServer
from agentik.core.testing.scripted import Reply, ScriptedModel, call
from agentik.core.tools.base import ToolResult
from agentik.core.turn import MAX_TOOL_ERROR_CHARS
from agentik.transports.testing import MemoryTransport
from helpers import collect_turn

WAIT = 60.0  # only guards against a hang


def openai_llm(server: FakeOpenAIServer) -> OpenAIBackend:
    return OpenAIBackend(model="fake-model", base_url=server.base_url, max_retries=0, timeout=30)


async def turn(conv, text: str) -> list:
    sub = conv.events()
    await conv.send(text)
    return await collect_turn(sub, wait=WAIT)


def wire_size(body: dict) -> int:
    return len(json.dumps(body).encode())


# -- the fake server reproduces what real endpoints do ---------------------------------------


async def test_the_fake_server_refuses_a_body_over_its_limit_with_413(openai_server):
    client = openai.AsyncOpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0)
    big = "x" * (openai_server.max_body_bytes + 1)
    with pytest.raises(openai.APIStatusError) as err:
        await client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": big}]
        )
    assert err.value.status_code == 413 and "too large" in err.value.message
    assert openai_server.too_large == 1 and openai_server.requests == []
    # A body under the limit is served as before.
    done = await client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "small"}]
    )
    assert done.choices[0].message.content == "echo: small"
    await client.close()


async def test_the_fake_server_sends_both_stream_quirks_on_the_wire(openai_server):
    """What the SDK sees: the name in every tool-call delta; [DONE] with no finish_reason."""
    client = openai.AsyncOpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0)
    openai_server.enqueue(
        fake.Reply.tool_calls(
            [("c1", "weather", '{"city": "Paris"}')], split=3, repeat_name=True, finish_reason=None
        )
    )
    stream = await client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    names, finishes = [], []
    async for chunk in stream:
        for choice in chunk.choices:
            finishes.append(choice.finish_reason)
            names += [tc.function.name for tc in choice.delta.tool_calls or ()]
    await client.close()
    assert names == ["weather"] * 4  # the header delta and all 3 argument deltas
    assert finishes and set(finishes) == {None}


# -- oversized tool arguments ------------------------------------------------------------------


async def test_a_10mb_tool_argument_does_not_wedge_the_conversation(openai_server, db_path):
    ran = []

    @tool
    async def save(text: str) -> str:
        """Save a text."""
        ran.append(len(text))
        return "saved"

    huge = json.dumps({"text": "x" * (10 * 1024 * 1024)})
    openai_server.enqueue(
        fake.Reply.tool_calls([("call_big", "save", huge)], split=4),
        fake.Reply.text("That was too big to save.", chunks=2),
    )
    async with Agent(llm=openai_llm(openai_server), store=SQLiteStore(db_path), tools=[save]) as a:
        conv = await a.create_conversation()
        first = await turn(conv, "save this")
        second = await turn(conv, "are you still there?")
        rows = await conv.messages()
        wm = await conv.working_memory()
    # The call was refused, not run, and the model was told why.
    assert ran == []
    ended = next(e for e in first if e.kind == "tool_call_ended")
    assert ended.is_error and "too large" in ended.result and str(len(huge)) in ended.result
    started = next(e for e in first if e.kind == "tool_call_started")
    assert len(started.arguments) < 200  # events do not carry the 10 MB either
    assert first[-1].stop_reason == "stop" and first[-1].text == "That was too big to save."
    # The next turn answers: no request was refused as too large.
    assert second[-1].stop_reason == "stop" and second[-1].text == "echo: are you still there?"
    assert not [e for e in first + second if e.kind == "error"]
    assert openai_server.too_large == 0 and len(openai_server.requests) == 3
    assert all(wire_size(b) < openai_server.max_body_bytes // 10 for b in openai_server.requests)
    # The model saw a valid context: the call with small, valid JSON arguments
    # and the refusal as its result.
    msgs = openai_server.requests[1]["messages"]
    wire_call = msgs[1]["tool_calls"][0]
    assert wire_call["id"] == "call_big" and wire_call["function"]["name"] == "save"
    assert "_cut" in json.loads(wire_call["function"]["arguments"])
    assert msgs[2]["role"] == "tool" and "too large" in msgs[2]["content"]
    # The audit log keeps the arguments whole.
    logged = next(m for m in rows if m.kind == "tool_call")
    assert logged.arguments == huge
    assert "_cut" in json.loads(wm[1].tool_calls[0].arguments)


async def test_arguments_within_the_limit_run_and_reach_the_model_whole(scripted, db_path):
    ran = []

    @tool
    async def save(text: str) -> str:
        """Save a text."""
        ran.append(text)
        return "saved"

    policy = TurnPolicy(max_tool_argument_chars=100)
    ok = json.dumps({"text": "y" * 80})
    scripted.enqueue(
        Reply(tool_calls=[call("save", ok, id="a"), call("save", {"text": "z" * 200}, id="b")]),
        "one saved",
    )
    async with Agent(llm=scripted, store=SQLiteStore(db_path), tools=[save], policy=policy) as a:
        conv = await a.create_conversation()
        events = await turn(conv, "save both")
        wm = await conv.working_memory()
    assert ran == ["y" * 80]
    results = {e.call_id: e for e in events if e.kind == "tool_call_ended"}
    assert not results["a"].is_error and results["b"].is_error
    assert "the limit is 100" in results["b"].result
    kept = {c.id: c.arguments for c in wm[1].tool_calls}
    assert kept["a"] == ok and "_cut" in json.loads(kept["b"])


# -- oversized tool results ----------------------------------------------------------------------


async def test_a_huge_tool_result_is_whole_in_the_audit_log_and_cut_for_the_model(
    openai_agent, openai_server
):
    big = "".join(f"line {i}\n" for i in range(100_000))  # ~790,000 characters

    @tool
    async def dump() -> str:
        """Dump everything."""
        return big

    openai_agent.add_tool(dump)
    openai_server.enqueue(
        fake.Reply.tool_calls([("d1", "dump", "{}")]), fake.Reply.text("It is long.")
    )
    conv = await openai_agent.create_conversation()
    events = await turn(conv, "dump it")
    rows = await conv.messages()
    wm = await conv.working_memory()
    assert events[-1].stop_reason == "stop" and events[-1].text == "It is long."
    assert openai_server.too_large == 0
    limit = TurnPolicy().max_tool_result_chars
    sent = openai_server.requests[1]["messages"][2]["content"]
    assert sent.startswith(big[:limit]) and len(sent) < limit + 100
    assert sent.endswith(f"[… result cut: too long ({len(big)} characters)]")
    assert wm[2].role == "tool" and wm[2].content == sent
    logged = next(m for m in rows if m.kind == "tool_result")
    assert logged.content == big


async def test_a_tools_own_error_text_reaches_the_model_as_written_but_capped(
    openai_agent, openai_server
):
    # A tool's (an MCP server's) own error message is its word to the model:
    # passed on as written, but a runaway one is cut much shorter than a result.
    long_error = "the server says: " + "no such row; " * 1000

    @tool
    async def rows() -> ToolResult:
        """Rows."""
        return ToolResult(text=long_error, is_error=True)

    @tool
    async def query() -> str:
        """Query."""
        raise ToolError("table 'users' has no column 'emial'")

    openai_agent.add_tool(rows)
    openai_agent.add_tool(query)
    openai_server.enqueue(
        fake.Reply.tool_calls([("r1", "rows", "{}"), ("q1", "query", "{}")]),
        fake.Reply.text("Sorry."),
    )
    conv = await openai_agent.create_conversation()
    events = await turn(conv, "look it up")
    assert events[-1].text == "Sorry."
    sent = {
        m["tool_call_id"]: m["content"]
        for m in openai_server.requests[1]["messages"]
        if m["role"] == "tool"
    }
    assert sent["q1"] == "error: table 'users' has no column 'emial'"
    assert sent["r1"].startswith(long_error[:MAX_TOOL_ERROR_CHARS])
    assert sent["r1"].endswith(f"[… result cut: too long ({len(long_error)} characters)]")
    assert len(sent["r1"]) < MAX_TOOL_ERROR_CHARS + 100 < len(long_error)
    logged = {m.tool_call_id: m.content for m in await conv.messages() if m.kind == "tool_result"}
    assert logged["r1"] == long_error  # the audit log keeps it whole


# -- an answer that never ends -------------------------------------------------------------------


async def test_an_endless_answer_is_stopped_at_max_answer_chars(openai_server, db_path):
    policy = TurnPolicy(max_answer_chars=5000)
    openai_server.enqueue(fake.Reply.endless("la "))
    async with Agent(llm=openai_llm(openai_server), store=SQLiteStore(db_path), policy=policy) as a:
        conv = await a.create_conversation()
        events = await turn(conv, "sing")
        # The stream was closed: the server saw the client go away.
        await openai_server.wait_disconnect(timeout=WAIT)
        again = await turn(conv, "and now?")
        rows = await conv.messages()
    shown = "".join(e.text for e in events if e.kind == "text_delta")
    assert events[-1].stop_reason == "length"
    assert shown == ("la " * 2000)[:5000] and events[-1].text == shown
    assert not [e for e in events if e.kind == "error"]
    answer = next(m for m in rows if m.kind == "assistant")
    assert answer.content.startswith(shown) and answer.status == "complete"
    # The next turn answers, and its request carries the cut answer with a marker.
    assert again[-1].stop_reason == "stop" and again[-1].text == "echo: and now?"
    sent = openai_server.requests[1]["messages"][1]["content"]
    assert sent.startswith(shown) and "[… answer cut: too long" in sent
    assert len(sent) < 5000 + 100


async def test_a_long_scripted_answer_is_cut_and_the_model_stopped(db_path):
    model = ScriptedModel()
    model.enqueue(Reply(chunks=["0123456789"] * 1000))
    policy = TurnPolicy(max_answer_chars=25)
    async with Agent(llm=model, store=SQLiteStore(db_path), policy=policy) as a:
        conv = await a.create_conversation()
        events = await turn(conv, "count")
        wm = await conv.working_memory()
    deltas = [e.text for e in events if e.kind == "text_delta"]
    assert deltas == ["0123456789", "0123456789", "01234"]
    assert events[-1].stop_reason == "length" and events[-1].text == "".join(deltas)
    assert wm[1].content.startswith("".join(deltas) + "\n[… answer cut")


# -- a model that ignores "no more tools" ---------------------------------------------------------


@pytest.mark.parametrize("cap", [0, 3])
async def test_a_model_that_always_calls_tools_ends_with_tool_limit(db_path, cap):
    ran = []

    @tool
    async def ping() -> str:
        """Ping."""
        ran.append(1)
        return "pong"

    model = ScriptedModel(default=lambda request: Reply(tool_calls=[call("ping")]))
    policy = TurnPolicy(max_tool_calls=cap)
    async with Agent(llm=model, store=SQLiteStore(db_path), tools=[ping], policy=policy) as a:
        conv = await a.create_conversation()
        events = await turn(conv, "ping forever")
        model.default = lambda request: Reply(text="fine, here is my answer")
        again = await turn(conv, "just answer")
        rows = await conv.messages()
        wm = await conv.working_memory()
        # Both turns count as finished: a restart does not run them again.
        assert await a.pending_turns() == []
    end = next(e for e in events if e.kind == "turn_ended")
    assert end.stop_reason == "tool_limit" and end.tool_calls == cap
    assert len(ran) == cap
    # cap requests with tools, then one without: the model called anyway, and that was it.
    first_turn = model.requests[: cap + 1]
    assert len(model.requests) == cap + 2  # + the next turn's single request
    assert all(r.tools for r in first_turn[:cap]) and first_turn[cap].tools == []
    assert first_turn[cap].tool_choice == "none"
    # The ignored call is in the audit log, refused; the next turn starts clean.
    refused = [m for m in rows if m.kind == "tool_result" and m.is_error]
    assert len(refused) == 1 and "tool call limit" in refused[0].content
    assert again[-1].stop_reason == "stop" and again[-1].text == "fine, here is my answer"
    roles = [m.role for m in wm]
    assert roles == ["user"] + ["assistant", "tool"] * cap + ["assistant", "user", "assistant"]
    assert "tool call limit" in wm[2 * cap + 1].content


async def test_tool_limit_through_the_openai_stack_counts_the_servers_requests(
    openai_server, db_path
):
    ran = []

    @tool
    async def ping() -> str:
        """Ping."""
        ran.append(1)
        return "pong"

    count = iter(range(1000))
    openai_server.default = lambda body: fake.Reply.tool_calls(
        [(f"call_{next(count)}", "ping", "{}")]
    )
    policy = TurnPolicy(max_tool_calls=4)
    llm = openai_llm(openai_server)
    async with Agent(llm=llm, store=SQLiteStore(db_path), tools=[ping], policy=policy) as a:
        conv = await a.create_conversation()
        events = await turn(conv, "ping forever")
        assert len(openai_server.requests) == 5  # cap + 1
        openai_server.default = fake.echo_reply
        again = await turn(conv, "answer now")
    assert events[-1].stop_reason == "tool_limit" and len(ran) == 4
    bodies = openai_server.requests
    assert all("tools" in b for b in bodies[:4]) and "tools" not in bodies[4]
    # The next request is a valid context: every tool call has its result, and
    # the turn that hit the limit ends with an assistant message.
    msgs = bodies[5]["messages"]
    assert [m["role"] for m in msgs] == ["user"] + ["assistant", "tool"] * 4 + [
        "assistant",
        "user",
    ]
    assert again[-1].stop_reason == "stop" and again[-1].text == "echo: answer now"


# -- stream quirks through the real SDK --------------------------------------------------------


async def test_a_tool_name_repeated_in_every_delta_is_not_concatenated(openai_agent, openai_server):
    cities = []

    @tool
    async def weather(city: str) -> str:
        """Weather in a city."""
        cities.append(city)
        return "sunny"

    openai_agent.add_tool(weather)
    openai_server.enqueue(
        fake.Reply.tool_calls(
            [("w1", "weather", '{"city": "Paris"}'), ("w2", "weather", '{"city": "Rome"}')],
            split=4,
            repeat_name=True,
        ),
        fake.Reply.text("Sunny in both."),
    )
    conv = await openai_agent.create_conversation()
    events = await turn(conv, "weather?")
    started = [(e.call_id, e.name) for e in events if e.kind == "tool_call_started"]
    assert started == [("w1", "weather"), ("w2", "weather")]
    assert sorted(cities) == ["Paris", "Rome"]
    assert not [e for e in events if e.kind == "tool_call_ended" and e.is_error]
    assert events[-1].text == "Sunny in both."


async def test_done_without_finish_reason_is_a_normal_end(openai_agent, openai_server):
    @tool
    async def clock() -> str:
        """The time."""
        return "noon"

    openai_agent.add_tool(clock)
    openai_server.enqueue(
        fake.Reply.text("Hello there", chunks=3, finish_reason=None),
        fake.Reply.tool_calls([("c1", "clock", "{}")], finish_reason=None),
        fake.Reply.text("It is noon.", finish_reason=None),
    )
    conv = await openai_agent.create_conversation()
    first = await turn(conv, "hi")
    second = await turn(conv, "time?")
    assert first[-1].stop_reason == "stop" and first[-1].text == "Hello there"
    assert second[-1].stop_reason == "stop" and second[-1].text == "It is noon."
    ended = next(e for e in second if e.kind == "tool_call_ended")
    assert ended.result == "noon" and not ended.is_error
    assert not [e for e in first + second if e.kind == "error"]
    rows = await conv.messages()
    assert all(m.status == "complete" for m in rows)


@pytest.mark.parametrize("how", ["clean end", "dropped"])
async def test_a_stream_without_done_or_finish_reason_is_still_an_error(
    openai_agent, openai_server, how
):
    reply = fake.Reply.text("half an answer", chunks=2, finish_reason=None)
    if how == "clean end":
        reply.done = False  # the body ends properly, but there was no [DONE]
    else:
        reply.drop_after = 2  # both chunks, then the connection dies
    openai_server.enqueue(reply)
    conv = await openai_agent.create_conversation()
    events = await turn(conv, "hi")
    assert events[-1].stop_reason == "error"
    assert next(e for e in events if e.kind == "error").error_type == "LLMConnectionError"
    assistant = next(m for m in await conv.messages() if m.kind == "assistant")
    assert assistant.status == "error" and assistant.content == "half an answer"


# -- what a chat channel shows -------------------------------------------------------------------


async def test_the_channel_is_told_when_an_answer_is_cut_or_tools_ran_out(db_path):
    model = ScriptedModel()

    @tool
    async def ping() -> str:
        """Ping."""
        return "pong"

    policy = TurnPolicy(max_answer_chars=12, max_tool_calls=1)
    agent = Agent(llm=model, store=SQLiteStore(db_path), tools=[ping], policy=policy)
    async with agent:
        bridge = Bridge(agent)
        t = MemoryTransport(name="mem")
        bridge.attach(t, ChannelOptions(command_prefix="!"))
        await t.start(bridge)
        model.enqueue(Reply(text="a very long answer indeed"))
        await t.inject("talk", channel_key="mem:alice", author="alice", direct=True)
        await bridge.flush("mem:alice")
        model.enqueue(Reply(tool_calls=[call("ping")]), Reply(tool_calls=[call("ping")]))
        await t.inject("ping", channel_key="mem:alice", author="alice", direct=True)
        await bridge.flush("mem:alice")
        model.enqueue("short")
        await t.inject("again", channel_key="mem:alice", author="alice", direct=True)
        await bridge.flush("mem:alice")
        await bridge.aclose()
    assert t.texts("answer") == ["a very long ", "short"]
    notices = t.texts("notice")
    assert notices.count("(answer cut: too long)") == 1
    assert notices.count("(stopped: tool call limit)") == 1


# -- configuration ---------------------------------------------------------------------------


def test_the_size_limits_come_from_the_config_file(tmp_path):
    limits = {"max_tool_argument_chars": 10, "max_tool_result_chars": 20, "max_answer_chars": 30}
    config = parse_config(
        {
            "llm": {"backend": "scripted"},
            "storage": {"path": str(tmp_path / "c.db")},
            "tools": limits,
        },
        env={},
    )
    agent = AgentBuilder.from_config(config, load_registry(config)).build()
    policy = agent.policy
    assert (
        policy.max_tool_argument_chars,
        policy.max_tool_result_chars,
        policy.max_answer_chars,
    ) == (10, 20, 30)
    defaults = parse_config({"llm": {"backend": "scripted"}}, env={}).tools
    assert defaults.max_answer_chars == TurnPolicy().max_answer_chars == 100_000
    with pytest.raises(ConfigError, match=r"tools\.max_answer_chars"):
        parse_config({"tools": {"max_answer_chars": 0}}, env={})
