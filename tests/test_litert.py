"""The litert backend: the real LiteRT-LM engine running a real (tiny, random) model.

``tests/fixtures/tiny-random.litertlm`` is built by ``tools/build_tiny_litertlm.py``:
a 2-layer Llama-style model with random weights, a SentencePiece tokenizer and a
Gemma-style chat template with no system role and strictly alternating turns.
It talks gibberish, so these tests assert behaviour, never wording.
``tests/fixtures/tiny-toolcall.litertlm`` (``build_tiny_litertlm.py --toolcall``)
declares function calling and, greedily, always calls ``add`` with a=2, b=3 in
Qwen3's ``<tool_call>`` format, which the engine parses into a tool call.  The engine
(``litert-lm-api``) comes with ``agentik[dev]``; without it this module fails
to import — a failure, not a skip.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import litert_lm  # noqa: F401 - a missing engine must fail the suite, not skip it
import pytest

from agentik.bot.builder import resolve_backend
from agentik.bot.config import parse_config
from agentik.core import Agent, ConfigError, SQLiteStore, TurnPolicy, tool
from agentik.core.hookspecs import hookimpl
from agentik.core.llm.base import (
    FinishItem,
    LLMRequest,
    TextChunk,
    ToolCallItem,
    UsageItem,
)
from agentik.core.llm.litert_backend import LiteRTBackend, LiteRTSettings, to_engine_messages
from agentik.core.messages import ChatMessage, ToolCall
from agentik.core.plugins import load_plugins
from agentik.core.testing.scripted import Reply, ScriptedModel
from agentik.core.tools.base import spec_of
from helpers import collect_turn, ended, turn

from rigs import eventually

FIXTURE = Path(__file__).parent / "fixtures" / "tiny-random.litertlm"
TOOLCALL_FIXTURE = Path(__file__).parent / "fixtures" / "tiny-toolcall.litertlm"
SYSTEM = "You are a tiny test model."


def make_backend(tmp_path: Path, **kw) -> LiteRTBackend:
    kw.setdefault("cache_dir", tmp_path / "litert-cache")
    kw.setdefault("top_k", 1)
    kw.setdefault("seed", 7)
    kw.setdefault("max_tokens", 24)
    kw.setdefault("threads", 1)
    kw.setdefault("model_path", FIXTURE)
    return LiteRTBackend(**kw)


@pytest.fixture
async def llm(tmp_path):
    backend = make_backend(tmp_path)
    yield backend
    await backend.aclose()


@pytest.fixture
async def llm_tools(tmp_path):
    backend = make_backend(tmp_path, model_path=TOOLCALL_FIXTURE)
    yield backend
    await backend.aclose()


@pytest.fixture
async def agent(llm, db_path):
    async with Agent(llm=llm, store=SQLiteStore(db_path), system_prompt=SYSTEM) as a:
        yield a


def deltas(events) -> list[str]:
    return [e.text for e in events if e.kind == "text_delta"]


# -- streaming and reuse ----------------------------------------------------------------------


async def test_a_turn_streams_the_models_tokens_as_deltas(tmp_path, db_path):
    llm = make_backend(tmp_path, max_tokens=400)
    agent = Agent(llm=llm, store=SQLiteStore(db_path), system_prompt=SYSTEM)
    async with agent:
        conv = await agent.create_conversation()
        events = await turn(conv, "hello the cat")
        rows = await conv.messages()
    end = ended(events)
    parts = deltas(events)
    # The tiny model is fast: tokens that arrive within a few milliseconds
    # share a delta, but the answer still streams in several pieces.
    assert len(parts) >= 3, "the answer arrives piece by piece, not at the end"
    assert end.stop_reason in ("stop", "length") and end.text == "".join(parts)
    assert 0 < end.usage.completion_tokens <= 400 and end.usage.prompt_tokens > 0
    assert [(m.kind, m.content) for m in rows] == [
        ("user", "hello the cat"),
        ("assistant", end.text),
    ]
    assert llm.stats.builds == 1 and llm.stats.engine_loads == 1


async def test_later_turns_reuse_the_engine_conversation(agent, llm):
    conv = await agent.create_conversation()
    usages = []
    for text in ("first message", "second message", "third message"):
        end = ended(await turn(conv, text))
        assert end.stop_reason in ("stop", "length")
        usages.append(end.usage)
    # One engine conversation served all three turns: only the new message
    # was fed each time, its KV cache kept the rest.
    assert (llm.stats.builds, llm.stats.reuses) == (1, 2)
    assert llm.live_conversations == 1
    # The context the model saw grew with the history.
    assert usages[0].prompt_tokens < usages[1].prompt_tokens < usages[2].prompt_tokens


async def test_each_agent_conversation_has_its_own_engine_conversation(agent, llm):
    a = await agent.create_conversation()
    b = await agent.create_conversation()
    for conv in (a, b, a, b):
        ended(await turn(conv, "hi"))
    assert (llm.stats.builds, llm.stats.reuses) == (2, 2)
    assert llm.live_conversations == 2


async def test_one_engine_per_process(tmp_path):
    first, second = make_backend(tmp_path), make_backend(tmp_path)
    async with (
        Agent(llm=first, store=SQLiteStore(":memory:")) as a,
        Agent(llm=second, store=SQLiteStore(":memory:")) as b,
    ):
        for agent in (a, b):
            conv = await agent.create_conversation()
            ended(await turn(conv, "hi"))
        assert first.stats.engine_loads == 1
        assert second.stats.engine_loads == 0, "the second backend found the engine loaded"


async def test_the_system_prompt_is_folded_for_templates_without_a_system_role(tmp_path, db_path):
    # The fixture's chat template (like Gemma's) rejects a system role.
    for fold in (True, False):
        backend = make_backend(tmp_path, fold_system_prompt=fold)
        async with Agent(llm=backend, store=SQLiteStore(":memory:"), system_prompt=SYSTEM) as a:
            conv = await a.create_conversation()
            events = await turn(conv, "hi")
        await backend.aclose()
        if fold:
            assert ended(events).stop_reason in ("stop", "length")
        else:
            errors = [e for e in events if e.kind == "error"]
            assert len(errors) == 1 and ended(events).stop_reason == "error"
            assert str(FIXTURE) in errors[0].message
            assert "fold_system_prompt" in errors[0].message


# -- interrupt, restart, compaction: rebuilt from history ---------------------------------------


async def test_interrupt_then_the_next_turn_works_on_a_rebuilt_conversation(tmp_path, db_path):
    backend = make_backend(tmp_path, max_tokens=900)
    async with Agent(llm=backend, store=SQLiteStore(db_path), system_prompt=SYSTEM) as a:
        conv = await a.create_conversation()
        sub = conv.events()
        await conv.send("talk for a long time")
        async for event in sub:
            if event.kind == "text_delta":
                break
        assert await conv.interrupt()
        events = await collect_turn(sub, wait=30)
        await sub.aclose()
        interrupted = [e for e in events if e.kind == "interrupted"]
        assert interrupted and interrupted[0].reason == "interrupt"
        end = ended(events)
        assert end.stop_reason == "interrupted"
        # The engine stopped early: far fewer than the 900 tokens it was allowed.
        assert 0 < len(end.text) and len(deltas(events)) + 1 < 900
        assert backend.stats.cancelled == 1
        rows = await conv.messages()
        assert rows[-1].kind == "assistant" and rows[-1].status == "interrupted"

        # The cancelled engine conversation is not reused: it is rebuilt from
        # the history (which keeps the partial answer), and the turn works.
        end2 = ended(await turn(conv, "and now?"))
        assert end2.stop_reason in ("stop", "length") and end2.text
        assert backend.stats.builds == 2 and backend.stats.reuses == 0
        end3 = ended(await turn(conv, "once more"))
        assert end3.stop_reason in ("stop", "length")
        # Reused when the engine conversation had room for another message and
        # answer, rebuilt from the (fitted) history when it had not — how long
        # the interrupted answer got depends on timing; an error never.
        assert backend.stats.builds + backend.stats.reuses == 3
    await backend.aclose()


# -- a conversation never outgrows the model ------------------------------------------------


@pytest.mark.parametrize("fixture", [FIXTURE, TOOLCALL_FIXTURE], ids=["random", "toolcall"])
async def test_a_history_too_long_after_an_interrupt_is_fitted_and_the_next_turn_answers(
    tmp_path, db_path, fixture
):
    # A long answer interrupted mid-stream — scripted, so its length does not
    # depend on how fast the machine is: longer than the model's whole context.
    partial = "the cat sat on the mat " * 200
    reply = Reply(text=partial + "and it went on", hold_after=len(partial.split()))
    scripted = ScriptedModel([reply])
    async with Agent(llm=scripted, store=SQLiteStore(db_path), system_prompt=SYSTEM) as a:
        conv = await a.conversation_for_channel("stdio:local")
        await conv.send("talk for a long time")
        await asyncio.wait_for(reply.held.wait(), 30)
        assert await conv.interrupt()

    backend = make_backend(tmp_path, model_path=fixture, max_tokens=900)
    async with Agent(llm=backend, store=SQLiteStore(db_path), system_prompt=SYSTEM) as a:
        conv = await a.conversation_for_channel("stdio:local")
        history = [*await conv.working_memory(), ChatMessage(role="user", content="and now?")]
        tokens = await backend.count_tokens(LLMRequest(messages=history, system=SYSTEM))
        assert tokens > backend.context_size > backend.context_window
        events = await turn(conv, "and now?")
        again = await turn(conv, "once more")
        rows = await conv.messages()
        memory = await conv.working_memory()
    await backend.aclose()
    # No engine error: the oldest turn was dropped with a notice, and the
    # model answered — twice.
    assert not [e for e in events + again if e.kind == "error"]
    assert ended(events).stop_reason in ("stop", "length") and ended(events).text
    assert ended(again).stop_reason in ("stop", "length")
    (notice,) = [e for e in events if e.kind == "compacted"]
    assert notice.fallback and notice.reason == "window" and notice.messages == 2
    assert memory[0].role == "system" and "dropped to fit" in memory[0].content
    # The audit log keeps the interrupted answer.
    assert rows[1].kind == "assistant" and rows[1].status == "interrupted"
    assert rows[1].content == partial


async def test_a_nearly_full_engine_conversation_is_rebuilt_instead_of_overrun(tmp_path, db_path):
    # How many prompt tokens the first message takes (the same in every run).
    probe = make_backend(tmp_path)
    async with Agent(llm=probe, store=SQLiteStore(":memory:"), system_prompt=SYSTEM) as a:
        prompt = ended(await turn(await a.create_conversation(), "hello")).usage.prompt_tokens
    await probe.aclose()
    # Answers that leave the KV cache 20 tokens short of full: too little room
    # for the engine to prefill even a short next message (its prefill works
    # in groups of 32 tokens: "Chosen prefill work group size exceeds
    # available state entries").
    room = 20
    backend = make_backend(tmp_path, max_tokens=backend_context(probe) - prompt - room)
    async with Agent(llm=backend, store=SQLiteStore(db_path), system_prompt=SYSTEM) as a:
        conv = await a.create_conversation()
        first = ended(await turn(conv, "hello"))
        assert first.usage.prompt_tokens + first.usage.completion_tokens == (
            backend.context_size - room
        ), "the model answered up to its cap"
        events = await turn(conv, "x")
    await backend.aclose()
    assert not [e for e in events if e.kind == "error"]
    assert ended(events).stop_reason in ("stop", "length")
    assert backend.stats.builds == 2 and backend.stats.reuses == 0


def backend_context(backend: LiteRTBackend) -> int:
    return backend.context_size


async def test_after_a_restart_the_history_is_rebuilt_into_a_new_engine_conversation(
    tmp_path, db_path
):
    first = make_backend(tmp_path)
    async with Agent(llm=first, store=SQLiteStore(db_path), system_prompt=SYSTEM) as a:
        conv = await a.conversation_for_channel("stdio:local")
        fresh = ended(await turn(conv, "remember this"))
        ended(await turn(conv, "and this"))
    await first.aclose()

    second = make_backend(tmp_path)  # a new process would start like this
    async with Agent(llm=second, store=SQLiteStore(db_path), system_prompt=SYSTEM) as a:
        conv = await a.conversation_for_channel("stdio:local")
        end = ended(await turn(conv, "what did I say?"))
        assert end.stop_reason in ("stop", "length")
        assert second.stats.builds == 1
        # The model saw the whole stored history, not just the new message.
        assert end.usage.prompt_tokens > 2 * fresh.usage.prompt_tokens
        ended(await turn(conv, "thanks"))
        assert second.stats.reuses == 1
    await second.aclose()


async def test_compaction_changes_the_context_so_the_engine_conversation_is_rebuilt(agent, llm):
    conv = await agent.create_conversation()
    ended(await turn(conv, "one"))
    before = ended(await turn(conv, "two"))
    assert (llm.stats.builds, llm.stats.reuses) == (1, 1)
    memory = await conv.working_memory()
    await conv.compact(len(memory) - 1, "The user said one and two.")
    after = ended(await turn(conv, "three"))
    assert after.stop_reason in ("stop", "length")
    assert llm.stats.builds == 2, "the compacted context is not a continuation"
    # The summary replaced the history: the new context is smaller.
    assert after.usage.prompt_tokens < before.usage.prompt_tokens + before.usage.completion_tokens
    ended(await turn(conv, "four"))
    assert llm.stats.reuses == 2


async def test_compaction_budgets_by_the_models_context(agent, llm):
    # The window leaves room in the KV cache for the answer and the prefill.
    assert llm.context_size == llm.model_context > llm.context_window > 0
    assert llm.context_window <= llm.model_context - llm.max_tokens
    assert agent.compactor.budget == agent.compactor.window == llm.context_window


# -- the event loop stays free ------------------------------------------------------------------


async def test_other_conversations_events_flow_while_the_model_generates(tmp_path, db_path):
    backend = make_backend(tmp_path, max_tokens=900)
    other_model = ScriptedModel(["I am another agent on the same event loop."])
    async with (
        Agent(llm=backend, store=SQLiteStore(db_path), system_prompt=SYSTEM) as a,
        Agent(llm=other_model, store=SQLiteStore(":memory:")) as b,
    ):
        slow = await a.create_conversation()
        fast = await b.create_conversation()
        slow_events: list = []
        streaming = asyncio.Event()

        async def follow(sub) -> None:
            async for event in sub:
                slow_events.append(event)
                if event.kind == "text_delta":
                    streaming.set()
                if event.kind == "turn_ended":
                    return

        follower = asyncio.create_task(follow(slow.events()))
        await slow.send("talk for a long time")
        await asyncio.wait_for(streaming.wait(), 30)
        # While the engine generates in its worker thread, another
        # conversation runs a whole turn on this loop.
        other = await turn(fast, "are you there?")
        assert ended(other).text == "I am another agent on the same event loop."
        assert not [e for e in slow_events if e.kind == "turn_ended"]
        seen = len(deltas(slow_events))
        await asyncio.wait_for(follower, 60)
        assert ended(slow_events).stop_reason in ("stop", "length")
        assert len(deltas(slow_events)) > seen, "the model kept streaming after the other turn"
    await backend.aclose()


# -- memory stays bounded ----------------------------------------------------------------------


async def test_idle_engine_conversations_are_released_then_rebuilt(tmp_path):
    backend = make_backend(tmp_path, idle_release_seconds=0.05)
    async with Agent(llm=backend, store=SQLiteStore(":memory:"), system_prompt=SYSTEM) as a:
        conv = await a.create_conversation()
        ended(await turn(conv, "hi"))
        # The idle timer fires in its own time.
        await eventually(lambda: not backend.live_conversations, "the idle release")
        assert backend.live_conversations == 0 and backend.stats.released_idle == 1
        end = ended(await turn(conv, "still there?"))
        assert end.stop_reason in ("stop", "length")
        assert backend.stats.builds == 2 and backend.live_conversations == 1
    await backend.aclose()


async def test_release_frees_one_conversations_engine_state(agent, llm):
    conv = await agent.create_conversation()
    ended(await turn(conv, "hi"))
    assert llm.release(conv.id) and llm.live_conversations == 0
    assert not llm.release(conv.id), "nothing left to free"
    ended(await turn(conv, "again"))
    assert (llm.stats.builds, llm.stats.reuses) == (2, 0)


async def test_at_most_max_conversations_keep_engine_state(tmp_path):
    backend = make_backend(tmp_path, max_conversations=2)
    async with Agent(llm=backend, store=SQLiteStore(":memory:"), system_prompt=SYSTEM) as a:
        convs = [await a.create_conversation() for _ in range(3)]
        for conv in convs:
            ended(await turn(conv, "hi"))
        assert backend.live_conversations == 2 and backend.stats.evicted == 1
        # The least recently used one was freed: it is rebuilt; the others reused.
        ended(await turn(convs[0], "back again"))
        ended(await turn(convs[2], "and you"))
        assert backend.stats.builds == 4 and backend.stats.reuses == 1
    await backend.aclose()


# -- tools --------------------------------------------------------------------------------------


async def test_a_model_without_function_calling_is_offered_no_tools(agent, llm):
    called = []

    @tool
    async def clock() -> str:
        """The time."""
        called.append(1)
        return "12:00"

    agent.add_tool(clock)
    assert llm.supports_tools is False  # the fixture does not declare function calling
    conv = await agent.create_conversation()
    events = await turn(conv, "what time is it?")
    assert ended(events).stop_reason in ("stop", "length")
    assert not [e for e in events if e.kind.startswith("tool_call")] and not called


class Adder:
    """A real tool ``add`` that counts its runs."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

        @tool
        async def add(a: int, b: int) -> str:
            """Add two whole numbers."""
            self.calls.append((a, b))
            return str(a + b)

        self.tool = add


def kinds(events) -> list[str]:
    return [e.kind for e in events]


async def test_the_models_tool_call_runs_in_our_tool_loop_and_the_turn_goes_on(tmp_path, db_path):
    llm = make_backend(tmp_path, model_path=TOOLCALL_FIXTURE)
    assert llm.supports_tools is True  # the model file declares function calling
    adder = Adder()
    agent = Agent(
        llm=llm,
        store=SQLiteStore(db_path),
        system_prompt=SYSTEM,
        policy=TurnPolicy(max_tool_calls=1),
    )
    agent.add_tool(adder.tool)
    async with agent:
        conv = await agent.create_conversation()
        events = await turn(conv, "what is 2 + 3?")
        rows = await conv.messages()
        first_runs = list(adder.calls)
        first_stats = (llm.stats.builds, llm.stats.reuses)
        # A second turn: the history now holds calls and results, and tools
        # are offered again, so the engine conversation is rebuilt from it.
        again = await turn(conv, "and once more?")
    await llm.aclose()
    end = ended(events)
    assert end.stop_reason in ("stop", "length")
    started = [e for e in events if e.kind == "tool_call_started"]
    finished = [e for e in events if e.kind == "tool_call_ended"]
    # The engine parsed the model's call; agentik's loop ran it, once.
    assert started[0].name == "add" and json.loads(started[0].arguments) == {"a": 2, "b": 3}
    assert finished[0].call_id == started[0].call_id
    assert finished[0].result == "5" and not finished[0].is_error
    # The engine's automatic tool calling stayed off: every run of the tool
    # is one our loop recorded.
    ran = [e for e in events if e.kind == "tool_call_ended" and not e.is_error]
    assert first_runs == [(2, 3)] and len(ran) == 1
    # The turn went on after the result: with the per-turn cap (1) used up,
    # the model was asked again without tools, and (nothing parsed as a call)
    # its answer ended the turn.
    assert len(started) == len(finished) == 1
    assert kinds(events).index("tool_call_ended") < kinds(events).index("turn_ended")
    log = [(m.kind, m.tool_name) for m in rows]
    assert log == [
        ("user", None),
        ("tool_call", "add"),
        ("tool_result", "add"),
        ("assistant", None),
    ]
    results = [m for m in rows if m.kind == "tool_result"]
    assert results[0].content == "5" and results[0].tool_call_id == started[0].call_id
    # One engine conversation per tool set: the last step, offered no tools,
    # was a new one.
    assert first_stats == (2, 0)
    assert ended(again).stop_reason in ("stop", "length")
    assert next(e.result for e in again if e.kind == "tool_call_ended") == "5"
    assert adder.calls == [(2, 3), (2, 3)]
    assert (llm.stats.builds, llm.stats.reuses) == (4, 0)


class Doubler:
    """A plugin: every ``add`` call the model makes runs with doubled arguments."""

    def __init__(self) -> None:
        self.seen = []

    @hookimpl
    def before_tool_call(self, call):
        self.seen.append(call.arguments)
        args = json.loads(call.arguments)
        return {k: 2 * v for k, v in args.items()}


async def test_tool_hooks_apply_to_the_models_calls(tmp_path):
    llm = make_backend(tmp_path, model_path=TOOLCALL_FIXTURE)
    adder, doubler = Adder(), Doubler()
    agent = Agent(
        llm=llm,
        store=SQLiteStore(":memory:"),
        system_prompt=SYSTEM,
        tools=(adder.tool,),
        hooks=[doubler],
        policy=TurnPolicy(max_tool_calls=1),
    )
    async with agent:
        conv = await agent.create_conversation()
        events = await turn(conv, "what is 2 + 3?")
    await llm.aclose()
    assert json.loads(doubler.seen[0]) == {"a": 2, "b": 3}
    assert adder.calls == [(4, 6)]
    assert next(e.result for e in events if e.kind == "tool_call_ended") == "10"


async def test_tool_definitions_reach_the_model_only_when_tools_are_offered(llm_tools):
    add = spec_of(Adder().tool)
    question = (ChatMessage(role="user", content="what is 2 + 3?"),)

    async def step(**kw) -> list:
        return [item async for item in llm_tools.stream(LLMRequest(messages=question, **kw))]

    offered = await step(tools=[add])
    bare = await step()
    declined = await step(tools=[add], tool_choice="none")
    # Offered tools, the engine turns the model's output into a tool call
    # (no text), and the definitions are in the prompt it saw.
    calls = [i.call for i in offered if isinstance(i, ToolCallItem)]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("add", {"a": 2, "b": 3})]
    assert calls[0].id, "each call gets an id for its result"
    assert not [i for i in offered if isinstance(i, TextChunk)]
    assert [i.reason for i in offered if isinstance(i, FinishItem)] == ["tool_calls"]
    # Without tools (none offered, or tool_choice "none") nothing is parsed:
    # the same output is plain text, and the prompt is shorter.
    for items in (bare, declined):
        assert not [i for i in items if isinstance(i, ToolCallItem)]
        text = "".join(i.text for i in items if isinstance(i, TextChunk))
        assert text.startswith("<tool_call>") and '"add"' in text
        assert [i.reason for i in items if isinstance(i, FinishItem)] == ["stop"]

    def prompt(items) -> int:
        return next(i.usage.prompt_tokens for i in items if isinstance(i, UsageItem))

    assert prompt(offered) > prompt(bare) == prompt(declined)


# -- errors name the path -----------------------------------------------------------------------


def test_a_missing_model_file_is_a_config_error_naming_it(tmp_path):
    missing = tmp_path / "nope.litertlm"
    with pytest.raises(ConfigError) as err:
        LiteRTBackend(model_path=missing, cache_dir=tmp_path / "c")
    assert str(missing) in str(err.value) and "llm.model_path" in str(err.value)


def test_a_file_that_is_not_a_model_is_a_config_error_naming_it(tmp_path):
    garbage = tmp_path / "garbage.litertlm"
    garbage.write_bytes(os.urandom(64 * 1024))
    with pytest.raises(ConfigError) as err:
        LiteRTBackend(model_path=garbage, cache_dir=tmp_path / "c")
    assert str(garbage) in str(err.value) and "not a LiteRT-LM model" in str(err.value)


def test_no_model_path_says_how_to_give_one(tmp_path, monkeypatch):
    monkeypatch.delenv("AGENTIK_GOOGLE_MODEL_PATH", raising=False)
    with pytest.raises(ConfigError, match="AGENTIK_GOOGLE_MODEL_PATH"):
        LiteRTBackend(cache_dir=tmp_path / "c")


async def test_a_missing_cache_dir_is_created_and_used(tmp_path):
    cache = tmp_path / "deep" / "cache"
    backend = make_backend(tmp_path, cache_dir=cache)
    assert cache.is_dir()
    async with Agent(llm=backend, store=SQLiteStore(":memory:"), system_prompt=SYSTEM) as a:
        conv = await a.create_conversation()
        ended(await turn(conv, "hi"))
    await backend.aclose()


def test_a_cache_dir_that_cannot_be_created_is_a_config_error_naming_it(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("in the way")
    with pytest.raises(ConfigError) as err:
        LiteRTBackend(model_path=FIXTURE, cache_dir=blocker / "cache")
    assert str(blocker / "cache") in str(err.value) and "llm.cache_dir" in str(err.value)


# -- configuration and plugin registration --------------------------------------------------------


def test_the_backend_registers_as_litert():
    factory = load_plugins(env={}).llm_backends["litert"]
    # By name: its keys are read without the backend's module (tests/test_imports.py).
    assert factory.settings_model is LiteRTSettings
    assert factory.load() is LiteRTBackend


async def test_configured_from_toml_and_the_seeds_environment_names(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    shutil.copyfile(FIXTURE, models / "m.litertlm")
    source = str(tmp_path / "bot.toml")
    data = {"llm": {"backend": "litert", "model_path": "models/m.litertlm", "top_k": 1}}
    config = parse_config(data, source=source, env={"AGENTIK_GOOGLE_THREADS": "1"})
    backend = resolve_backend(config, load_plugins(env={}))
    try:
        assert isinstance(backend, LiteRTBackend)
        assert backend.model_path == str(models / "m.litertlm")  # relative to the file
        assert backend.threads == 1 and backend.fold_system_prompt is True
    finally:
        await backend.aclose()
    cache = tmp_path / "env-cache"
    env = {"AGENTIK_GOOGLE_MODEL_PATH": str(FIXTURE), "AGENTIK_GOOGLE_CACHE_DIR": str(cache)}
    config = parse_config({"llm": {"backend": "litert"}}, source=source, env=env)
    backend = resolve_backend(config, load_plugins(env={}))
    try:
        assert backend.model_path == str(FIXTURE) and backend.cache_dir == str(cache)
        assert cache.is_dir()
    finally:
        await backend.aclose()


async def test_the_seeds_backend_name_google_and_its_fold_variable(tmp_path):
    """The standalone seed calls this backend ``google`` and turns folding off with
    ``AGENTIK_GOOGLE_FOLD_SYSTEM_INTO_FIRST_USER``: both work as written there."""
    source = str(tmp_path / "bot.toml")
    env = {
        "AGENTIK_GOOGLE_MODEL_PATH": str(FIXTURE),
        "AGENTIK_GOOGLE_CACHE_DIR": str(tmp_path / "cache"),
        "AGENTIK_GOOGLE_FOLD_SYSTEM_INTO_FIRST_USER": "false",
    }
    in_file = parse_config({"llm": {"backend": "google"}}, source=source, env=env)
    from_env = parse_config({}, source=source, env={**env, "AGENTIK_LLM_BACKEND": "google"})
    as_profile = parse_config(
        {"llm": {"backend": "openai", "profiles": {"local": {"backend": "google"}}}},
        source=source,
        env=env,
    )
    assert in_file.llm.backend == from_env.llm.backend == "litert"
    assert as_profile.llm.profiles["local"].backend == "litert"
    for config in (in_file, from_env):
        backend = resolve_backend(config, load_plugins(env={}))
        try:
            assert isinstance(backend, LiteRTBackend)
            assert backend.fold_system_prompt is False
        finally:
            await backend.aclose()
    env["AGENTIK_GOOGLE_FOLD_SYSTEM_INTO_FIRST_USER"] = "1"
    config = parse_config({"llm": {"backend": "google", "fold_system_prompt": False}}, env=env)
    assert config.llm.fold_system_prompt is True  # the variable wins, like the others
    env["AGENTIK_GOOGLE_FOLD_SYSTEM_INTO_FIRST_USER"] = "sometimes"
    with pytest.raises(ConfigError) as err:
        parse_config({"llm": {"backend": "google"}}, source=source, env=env)
    assert "llm.fold_system_prompt" in str(err.value)
    assert "AGENTIK_GOOGLE_FOLD_SYSTEM_INTO_FIRST_USER" in str(err.value)  # where to fix it


# -- message translation --------------------------------------------------------------------------


def test_folding_puts_the_system_prompt_and_summaries_in_user_turns():
    history = [
        ChatMessage(role="system", content="Summary: they talked."),
        ChatMessage(role="user", content="one", author="alice"),
        ChatMessage(role="user", content="two", author="bob"),
        ChatMessage(role="assistant", content="ok"),
        ChatMessage(role="user", content="three"),
    ]
    system, wire = to_engine_messages(history, "Be brief.")
    assert system is None
    assert wire == [
        {"role": "user", "content": "Be brief.\n\nSummary: they talked.\n\nalice: one\nbob: two"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "three"},
    ]
    system, wire = to_engine_messages(history, "Be brief.", fold_system_prompt=False)
    assert system == "Be brief."
    assert [m["role"] for m in wire] == ["system", "user", "user", "assistant", "user"]


def test_tool_calls_and_results_translate_to_the_engines_shapes():
    history = [
        ChatMessage(role="user", content="time in two places?"),
        ChatMessage(
            role="assistant",
            content="",
            tool_calls=(
                ToolCall(id="c1", name="clock", arguments='{"tz": "UTC"}'),
                ToolCall(id="c2", name="clock", arguments='{"tz": "CET"}'),
            ),
        ),
        ChatMessage(role="tool", content="12:00", tool_call_id="c1", name="clock"),
        ChatMessage(role="tool", content="13:00", tool_call_id="c2", name="clock"),
    ]
    _, wire = to_engine_messages(history, None)
    assert wire[1]["tool_calls"] == [
        {"type": "function", "function": {"name": "clock", "arguments": {"tz": "UTC"}}},
        {"type": "function", "function": {"name": "clock", "arguments": {"tz": "CET"}}},
    ]
    assert wire[2] == {
        "role": "tool",
        "content": [
            {"type": "tool_response", "name": "clock", "response": "12:00"},
            {"type": "tool_response", "name": "clock", "response": "13:00"},
        ],
    }


def test_a_blank_threads_key_is_unset_and_zero_is_refused():
    # ``threads = "${AGENTIK_GOOGLE_THREADS:-}"`` gives "" when the variable is unset.
    assert LiteRTSettings(threads="").threads is None
    assert LiteRTSettings(threads="3").threads == 3
    with pytest.raises(ValueError, match="threads"):
        LiteRTSettings(threads=0)
