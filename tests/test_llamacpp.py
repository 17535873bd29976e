"""The llamacpp backend on the real SmolLM2-135M-Instruct GGUF (the default local model).

Every test here loads the real model file through our backend and generates
with it (``temperature=0``, few tokens, one thread).  They assert what a user
would notice — answers stream, history reaches the model, interrupting frees
the model, a forced tool call runs — never the model's wording.  Without the
``local`` extra they skip, and fail under ``CI=true`` (``make test`` installs it).
"""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from agentik.bot.app import load_registry
from agentik.bot.builder import AgentBuilder, backend_choice, resolve_backend
from agentik.bot.config import load_config, parse_config
from agentik.core import Agent, ConfigError, SQLiteStore, TurnPolicy, tool
from agentik.core.compaction import CompactionPolicy
from agentik.core.llm.base import (
    FinishItem,
    LLMRequest,
    TextChunk,
    ToolCallItem,
    ToolSpec,
    UsageItem,
)
from agentik.core.messages import ChatMessage
from helpers import AGENTIK, collect_turn, require_local_model

pytestmark = pytest.mark.timeout(300)

SYSTEM = "You are a helpful assistant. Answer briefly."
EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "config.example.toml")


def make_backend(**settings):
    from agentik.core.llm.llamacpp_backend import LlamaCppBackend

    settings = {"temperature": 0, "max_tokens": 24, "n_threads": 1, "n_ctx": 1024, **settings}
    return LlamaCppBackend(**settings)


@pytest.fixture(scope="module")
def model():
    """A backend on the default model, alive for the whole module.

    Backends with the same file and settings share one loaded model, so while
    this one lives, the others below load nothing.
    """
    require_local_model()
    backend = make_backend()
    yield backend
    backend.close()


@pytest.fixture
def llm(model):
    """A backend of this test's own (an agent closes its backend), on the shared model."""
    backend = make_backend()
    assert backend.shared_model is model.shared_model
    return backend


@pytest.fixture
async def agent(llm, db_path):
    async with Agent(llm=llm, store=SQLiteStore(db_path), system_prompt=SYSTEM) as a:
        yield a


def ask(text: str, **fields) -> LLMRequest:
    return LLMRequest(messages=[ChatMessage(role="user", content=text)], system=SYSTEM, **fields)


# -- streaming -------------------------------------------------------------------------------


async def test_a_streamed_answer_arrives_as_several_deltas(agent, llm):
    conv = await agent.create_conversation()
    sub = conv.events()
    await conv.send("Tell me about the sea.", author="alice")
    events = await collect_turn(sub, wait=120)
    deltas = [e.text for e in events if e.kind == "text_delta"]
    end = events[-1]
    assert end.kind == "turn_ended" and end.stop_reason in ("stop", "length")
    assert len(deltas) >= 2, deltas
    assert "".join(deltas) == end.text and end.text.strip()
    stats = llm.last_generation
    assert end.usage.completion_tokens == stats.completion_tokens > 1
    assert end.usage.prompt_tokens == stats.prompt_tokens > 10
    assert stats.completion_tokens <= 24  # max_tokens
    history = await conv.messages()
    assert [(m.kind, m.content) for m in history] == [
        ("user", "Tell me about the sea."),
        ("assistant", end.text),
    ]


async def test_the_event_loop_keeps_running_while_the_model_generates(model):
    ticks = 0
    stop = asyncio.Event()

    async def ticker():
        nonlocal ticks
        while not stop.is_set():
            await asyncio.sleep(0.001)
            ticks += 1

    task = asyncio.create_task(ticker())
    seen: list[int] = []  # the tick count when each chunk arrived
    async for item in model.stream(ask("Count from one to twenty.", max_tokens=32)):
        if isinstance(item, TextChunk):
            seen.append(ticks)
    stop.set()
    await task
    assert len(seen) >= 2
    # The loop ran other work between the chunks: generation is not on the loop.
    assert seen[-1] > seen[0]


async def test_a_multi_turn_conversation_sends_the_history(agent, llm):
    conv = await agent.create_conversation()
    await conv.send("My name is Ada and I like tea.")
    await conv.wait_idle()
    first = llm.last_generation
    answer = (await conv.messages())[-1]
    assert answer.kind == "assistant" and answer.content
    await conv.send("What do I like?")
    await conv.wait_idle()
    second = llm.last_generation
    # The second prompt starts with the whole first prompt (same rendering, so
    # its KV cache is reused) and goes on with the answer and the new question.
    assert second.reused_tokens >= first.prompt_tokens
    assert second.prompt_tokens > first.prompt_tokens + first.completion_tokens // 2
    assert [m.kind for m in await conv.messages()] == ["user", "assistant"] * 2


async def test_interrupt_stops_generation_and_the_next_turn_works(model, db_path):
    long = make_backend(max_tokens=100)
    assert long.shared_model is model.shared_model  # same file and settings: one model in memory
    try:
        async with Agent(llm=long, store=SQLiteStore(db_path), system_prompt=SYSTEM) as agent:
            conv = await agent.create_conversation()
            sub = conv.events()
            await conv.send("Write a very long story about a dragon and a knight.")
            async for event in sub:
                if event.kind == "text_delta":
                    break
            assert await conv.interrupt() is True
            events = await collect_turn(sub, wait=60)
            assert events[-1].stop_reason == "interrupted"
            await long.wait_idle()  # every earlier request is over
            stats = long.last_generation
            # Stopped by the interrupt, between two tokens, far from max_tokens.
            assert stats.finish == "cancelled"
            assert stats.completion_tokens < 100
            partial = [m for m in await conv.messages() if m.kind == "assistant"]
            assert len(partial) == 1 and partial[0].status == "interrupted"
            # The model is free: the next turn answers.
            await conv.send("Thanks. Say hello.")
            events = await collect_turn(sub, wait=120)
            assert events[-1].kind == "turn_ended"
            assert events[-1].stop_reason in ("stop", "length") and events[-1].text.strip()
    finally:
        await long.aclose()
    assert model.last_generation is not None  # the module's backend still works
    async for _ in model.stream(ask("Hi", max_tokens=2)):
        pass


async def test_turns_of_several_conversations_queue_for_the_one_model(agent):
    convs = [await agent.create_conversation() for _ in range(3)]
    await asyncio.gather(*(c.send(f"Say the number {i}.") for i, c in enumerate(convs)))
    await asyncio.gather(*(c.wait_idle() for c in convs))
    for c in convs:
        kinds_status = [(m.kind, m.status) for m in await c.messages()]
        assert kinds_status == [("user", "complete"), ("assistant", "complete")]


# -- tool calls ------------------------------------------------------------------------------

WEATHER = ToolSpec(
    name="get_weather",
    description="The current weather in a city.",
    parameters={
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "The city"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
    },
)
CLOCK = ToolSpec(
    name="get_time",
    description="The current time.",
    parameters={"type": "object", "properties": {}},
)


async def test_a_required_tool_call_is_a_valid_call_of_an_offered_tool(model):
    items = [
        item
        async for item in model.stream(
            ask(
                "What is the weather in Paris?",
                tools=[WEATHER, CLOCK],
                tool_choice="required",
                max_tokens=64,
            )
        )
    ]
    calls = [i.call for i in items if isinstance(i, ToolCallItem)]
    assert len(calls) == 1
    assert not [i for i in items if isinstance(i, TextChunk)]  # the call is not shown as text
    assert isinstance(items[-1], FinishItem) and items[-1].reason == "tool_calls"
    assert any(isinstance(i, UsageItem) for i in items)
    call = calls[0]
    assert call.name in ("get_weather", "get_time") and call.id
    args = json.loads(call.arguments)
    if call.name == "get_weather":
        assert isinstance(args["city"], str) and args["unit"] in ("celsius", "fahrenheit")
    else:
        assert isinstance(args, dict)


async def test_auto_mode_does_not_show_tools_to_a_model_whose_template_has_none(model):
    # SmolLM2's chat template has no tool support: it answers in text.
    assert model.template_tools is False
    items = [i async for i in model.stream(ask("Hello!", tools=[WEATHER], max_tokens=8))]
    assert not [i for i in items if isinstance(i, ToolCallItem)]
    assert "".join(i.text for i in items if isinstance(i, TextChunk)).strip()


async def test_a_forced_tool_call_runs_through_the_tool_loop(model, db_path):
    forcing = make_backend(tool_choice="required", max_tokens=64)
    calls: list[dict] = []

    @tool(
        name="get_weather",
        parameters={
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    )
    async def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append({"city": city})
        return f"Sunny and 21 degrees in {city}."

    try:
        async with Agent(
            llm=forcing,
            store=SQLiteStore(db_path),
            system_prompt=SYSTEM,
            tools=[get_weather],
            policy=TurnPolicy(max_tool_calls=2),
        ) as agent:
            conv = await agent.create_conversation()
            sub = conv.events()
            await conv.send("What is the weather in Paris?")
            events = await collect_turn(sub, wait=120)
            rows = [m.kind for m in await conv.messages()]
    finally:
        await forcing.aclose()
    started = [e for e in events if e.kind == "tool_call_started"]
    ended = [e for e in events if e.kind == "tool_call_ended"]
    # One call, forced on the first step; the tool ran with the model's arguments.
    assert len(started) == 1 and started[0].name == "get_weather"
    assert calls == [json.loads(started[0].arguments)] and isinstance(calls[0]["city"], str)
    assert len(ended) == 1 and not ended[0].is_error and "Sunny" in ended[0].result
    # After the result the model answers in text (auto mode on later steps).
    assert events[-1].kind == "turn_ended" and events[-1].stop_reason in ("stop", "length")
    assert events[-1].text.strip() and events[-1].tool_calls == 1
    assert rows == ["user", "tool_call", "tool_result", "assistant"]


# A ChatML template that shows tools the way Qwen/Hermes templates do.
TOOL_TEMPLATE = """
{%- if messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}
{%- if tools %}

# Tools
<tools>
{%- for t in tools %}
{{ t | tojson }}
{%- endfor %}
</tools>
Call a tool with <tool_call>{"name": ..., "arguments": ...}</tool_call>.
{%- endif %}<|im_end|>
{% endif %}
{%- for m in messages if m.role != 'system' %}
{%- if m.role == 'tool' %}<|im_start|>user
<tool_response>{{ m.content }}</tool_response><|im_end|>
{% elif m.tool_calls %}<|im_start|>assistant
{{ m.content }}
{%- for c in m.tool_calls %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


async def test_a_template_that_shows_tools_gets_them_and_renders_the_tool_history(model, db_path):
    backend = make_backend(chat_template=TOOL_TEMPLATE, tool_choice="required", max_tokens=48)
    assert backend.template_tools is True and model.template_tools is False
    ran: list[str] = []

    @tool(parameters={"type": "object", "properties": {"city": {"type": "string"}}})
    async def get_weather(city: str = "") -> str:
        """The current weather in a city."""
        ran.append(city)
        return "Sunny."

    try:
        async with Agent(
            llm=backend,
            store=SQLiteStore(db_path),
            system_prompt=SYSTEM,
            tools=[get_weather],
            policy=TurnPolicy(max_tool_calls=2),
        ) as agent:
            conv = await agent.create_conversation()
            sub = conv.events()
            await conv.send("What is the weather in Rome?")
            events = await collect_turn(sub, wait=120)
            rows = [m.kind for m in await conv.messages()]
    finally:
        await backend.aclose()
    # The forced first step called the tool; later steps (auto mode, tools shown by
    # the template, the tool call and its result rendered into the history) may
    # call it again, up to the policy's limit, and the turn ends with an answer.
    assert ran and len(ran) <= 2
    assert rows[:3] == ["user", "tool_call", "tool_result"] and rows[-1] == "assistant"
    assert events[-1].kind == "turn_ended" and events[-1].stop_reason in ("stop", "length")
    assert "<tool_call>" not in events[-1].text or events[-1].tool_calls == 2


# -- context ---------------------------------------------------------------------------------


async def test_a_long_conversation_drops_its_oldest_exchanges_to_fit_n_ctx(db_path):
    require_local_model()
    small = make_backend(n_ctx=256, max_tokens=16)
    try:
        # Compaction off: the oldest turns are still dropped to fit the window.
        off = CompactionPolicy(enabled=False)
        async with Agent(
            llm=small, store=SQLiteStore(db_path), system_prompt=SYSTEM, compaction=off
        ) as agent:
            conv = await agent.create_conversation()
            for i in range(6):
                await conv.send(f"Fact {i}: " + "the sky is blue and the grass is green. " * 5)
                await conv.wait_idle()
            rows = await conv.messages(limit=100)
            assert [m.status for m in rows] == ["complete"] * 12
            # The history no longer fits the context, yet every turn was answered.
            history = " ".join(m.content for m in rows).encode()
            assert len(small.shared_model.llama.tokenize(history, add_bos=False)) > 256
            stats = small.last_generation
            assert stats.prompt_tokens + stats.completion_tokens <= 256
            # A single message larger than the whole context is a clear error.
            sub = conv.events()
            await conv.send("word " * 400)
            events = await collect_turn(sub, wait=60)
            errors = [e for e in events if e.kind == "error"]
            assert errors and errors[0].error_type == "ContextTooLong"
            assert "too long for the model's context" in errors[0].message
            assert small.last_generation is stats, "no request was made"
    finally:
        await small.aclose()


async def test_an_interrupted_long_answer_is_trimmed_away_and_the_next_turn_answers(model, db_path):
    long = make_backend(max_tokens=1000)  # n_ctx 1024: the module's model, shared
    assert long.shared_model is model.shared_model
    try:
        async with Agent(llm=long, store=SQLiteStore(db_path), system_prompt=SYSTEM) as agent:
            conv = await agent.create_conversation()
            sub = conv.events()
            await conv.send("Write a very long story about a dragon and a knight.")
            # The story runs to ~675 tokens; interrupt it once ~100 have arrived.
            text = ""
            async for event in sub:
                assert event.kind != "turn_ended", "the story ended before the interrupt"
                if event.kind == "text_delta":
                    text += event.text
                    if len(text) >= 400:
                        break
            assert await conv.interrupt() is True
            first = await collect_turn(sub, wait=60)
            assert first[-1].stop_reason == "interrupted"
            partial = first[-1].text
            assert len(partial) >= 400

            # A long next message: alone it fits the window, after the
            # interrupted answer it does not (sized with the model's tokenizer).
            memory = await conv.working_memory()
            notice = ChatMessage(role="system", content="[3 earlier messages were dropped.]")

            async def tokens(messages) -> int:
                return await long.count_tokens(LLMRequest(messages=messages, system=SYSTEM))

            unit = "The grass is green and the sky is blue. "
            k = 1
            while await tokens([notice, user(unit * (k + 1))]) < long.context_window - 40:
                k += 1
            message = unit * k
            assert await tokens([*memory, user(message)]) > long.context_window
            await conv.send(message)
            events = await collect_turn(sub, wait=120)
            rows = await conv.messages()
            working = await conv.working_memory()
    finally:
        await long.aclose()
    end = events[-1]
    assert not [e for e in events if e.kind == "error"]
    assert end.stop_reason in ("stop", "length") and end.text.strip()
    (trimmed,) = [e for e in events if e.kind == "compacted"]
    assert trimmed.fallback and trimmed.reason == "window" and trimmed.messages == 2
    assert trimmed.tokens_after <= long.context_window < trimmed.tokens_before
    assert working[0].role == "system" and working[1].content == message
    # The audit log keeps the interrupted answer.
    assert [(m.kind, m.status) for m in rows] == [
        ("user", "complete"),
        ("assistant", "interrupted"),
        ("user", "complete"),
        ("assistant", "complete"),
    ]
    assert rows[1].content == partial


def user(text: str) -> ChatMessage:
    return ChatMessage(role="user", content=text)


async def test_compaction_counts_with_the_models_tokenizer_and_keeps_requests_in_context(
    db_path,
):
    require_local_model()
    small = make_backend(n_ctx=512, max_tokens=16)
    try:
        assert small.context_window == 512 - 16
        short, long = ask("hi"), ask("hi " + "the grass is green. " * 20)
        n_short, n_long = await small.count_tokens(short), await small.count_tokens(long)
        assert n_long - n_short >= 100  # ~5 tokens a repeat, counted by the model's tokenizer
        async with Agent(
            llm=small,
            store=SQLiteStore(db_path),
            system_prompt=SYSTEM,
            compaction=CompactionPolicy(keep_turns=1, summary_tokens=64),
        ) as agent:
            conv = await agent.create_conversation()
            events = conv.events(kinds={"compacted"})
            for i in range(6):
                await conv.send(f"Fact {i}: " + "the sky is blue and the grass is green. " * 5)
                await conv.wait_idle()
                assert small.last_generation.prompt_tokens <= small.context_window
            compacted = await asyncio.wait_for(anext(events), 60)
            assert compacted.tokens_before > 0.8 * small.context_window
            rows = await conv.messages(limit=100)
            assert [m.status for m in rows] == ["complete"] * 12  # nothing lost, all answered
    finally:
        await small.aclose()


# -- configuration and the command line -------------------------------------------------------


def test_the_example_config_without_environment_builds_the_local_default(model):
    config = load_config(EXAMPLE, env={})
    assert backend_choice(config, env={}) == "llamacpp"
    backend = resolve_backend(config, load_registry(config), env={})
    try:
        assert backend.name == "llamacpp"
        assert backend.model == "SmolLM2-135M-Instruct.Q4_1"
        assert backend.model_path.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
        assert backend.n_ctx == 2048 and backend.tool_choice == "auto"
    finally:
        backend.close()


def test_a_missing_model_file_names_the_key(tmp_path):
    require_local_model()
    config = parse_config({"llm": {"backend": "llamacpp", "model_path": "nope.gguf"}}, env={})
    with pytest.raises(ConfigError, match=r"llm\.model_path: no such file: .*nope\.gguf"):
        AgentBuilder.from_config(config, load_registry(config))


def test_a_file_that_is_not_a_model_names_the_key(tmp_path):
    require_local_model()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model at all" * 100)
    source = tmp_path / "bot.toml"
    source.write_text('[llm]\nbackend = "llamacpp"\nmodel_path = "bad.gguf"\n')
    config = load_config(source, env={})
    with pytest.raises(ConfigError, match=r"bot\.toml: llm\.model_path: cannot load .*bad\.gguf"):
        AgentBuilder.from_config(config, load_registry(config))


async def test_a_chat_template_that_is_not_jinja_is_a_config_error_naming_the_key(model, tmp_path):
    """A broken llm.chat_template gave a jinja2 traceback from check and run."""
    config = tmp_path / "bot.toml"
    config.write_text(
        '[llm]\nbackend = "llamacpp"\nn_threads = 1\nchat_template = "{% if %}"\n'
        '[storage]\npath = "bot.db"\n[transports.terminal]\ntype = "stdio"\n'
    )
    for command in ("check", "run"):
        code, out, err = await _run(command, "-c", str(config), stdin=b"hi\n")
        assert code == 2, (command, err)
        assert "Traceback" not in err
        assert err.startswith(f"agentik: {config}: llm.chat_template: not a valid Jinja template:")


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AGENTIK_"))}
    env.update(extra)
    return env


async def _run(*args: str, stdin: bytes = b"", cwd=None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        AGENTIK, *args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=_clean_env(), cwd=cwd,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(stdin), 180)
    return proc.returncode, out.decode(), err.decode()


async def test_check_says_the_local_backend_and_model_will_be_used(model, tmp_path):
    code, out, err = await _run("check", "-c", EXAMPLE, cwd=tmp_path)
    assert code == 0, err
    assert "backend 'llamacpp' (configured 'auto')" in out
    assert "model 'SmolLM2-135M-Instruct.Q4_1'" in out
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in out
    assert "n_threads:" in out and "n_ctx: 2048" in out


async def test_the_terminal_chat_answers_with_the_local_model_with_no_configuration(
    model, tmp_path
):
    # What `make run` does on a fresh machine, piped: no environment, no key, offline.
    config = tmp_path / "bot.toml"
    config.write_text(
        "[llm]\ntemperature = 0\nmax_tokens = 16\nn_threads = 1\n"
        '[storage]\npath = "bot.db"\n[transports.terminal]\ntype = "stdio"\nuser = "tester"\n'
    )
    code, out, err = await _run("chat", "-c", str(config), stdin=b"What is the sun?\n")
    assert code == 0, err
    assert out.strip() and "No language model" not in out
    assert "Traceback" not in err
