"""AgentBuilder: required parts, the soul, tools, background work, from a config."""

from __future__ import annotations

import asyncio
import sys

import pytest

from agentik.bot.app import load_registry
from agentik.bot.builder import (
    NO_MODEL_HELP,
    AgentBuilder,
    NoModelBackend,
    backend_choice,
    resolve_backend,
)
from agentik.bot.config import load_config, parse_config
from agentik.core import ConfigError, OpenAIBackend, SQLiteStore, tool
from agentik.core.memory import NoMemory
from agentik.core.testing.scripted import Reply, ScriptedModel, call


@pytest.mark.parametrize("missing", ["llm", "storage", "memory"])
def test_required_parts(missing):
    b = AgentBuilder()
    if missing != "llm":
        b.llm(ScriptedModel())
    if missing != "storage":
        b.storage(SQLiteStore())
    if missing != "memory":
        b.memory(NoMemory())
    with pytest.raises(ConfigError, match=f"missing required part.*{missing}"):
        b.build()


async def test_soul_tools_memory_tools_and_background(tmp_path):
    soul = tmp_path / "soul.md"
    soul.write_text("You are Ada, terse.\n")
    seen: list[str] = []
    started = asyncio.Event()
    got = asyncio.Event()

    @tool
    async def ping() -> str:
        """Ping."""
        return "pong"

    class NotesMemory(NoMemory):  # the storage methods of "remember nothing"
        name = "notes"

        def tools(self):
            @tool
            async def memory_list() -> str:
                """List notes."""
                return "nothing yet"

            return [memory_list]

    async def watcher(agent):
        # Background work reacts to events; it does not poll.
        started.set()
        async for event in agent.events(kinds={"turn_ended"}):
            seen.append(event.text)
            got.set()

    model = ScriptedModel()
    agent = (
        AgentBuilder()
        .llm(model)
        .storage(SQLiteStore(str(tmp_path / "b.db")))
        .memory(NotesMemory())
        .system_prompt("Be helpful.")
        .soul(file=soul)
        .tools(ping)
        .background(watcher)
        .build()
    )
    async with agent:
        await started.wait()
        conv = await agent.create_conversation()
        await conv.send("hi")
        await conv.wait_idle()
        await asyncio.wait_for(got.wait(), 60)
    assert model.requests[0].system == "Be helpful.\n\nYou are Ada, terse."
    assert sorted(t.name for t in model.requests[0].tools) == ["memory_list", "ping"]
    assert seen == ["echo: hi"]
    leftover = [t for t in asyncio.all_tasks() if t.get_name().startswith("agentik-background")]
    assert leftover == []


def test_missing_soul_file_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"agent\.soul: cannot read"):
        AgentBuilder().soul(file=tmp_path / "nope.md")


def test_from_config_wires_backend_storage_and_policy(tmp_path):
    config = parse_config(
        {
            "agent": {"system_prompt": "Hello."},
            "llm": {"base_url": "http://127.0.0.1:9/v1", "model": "m", "timeout": 5},
            "storage": {
                "path": str(tmp_path / "c.db"),
                "synchronous": "normal",
                "writer": "thread",
            },
            "tools": {"max_tool_calls": 3, "allowed": ["safe_*"]},
        },
        env={},
    )
    agent = AgentBuilder.from_config(config, load_registry(config)).build()
    assert isinstance(agent.llm, OpenAIBackend) and agent.llm.model == "m"
    assert agent.store.synchronous == "normal" and agent.store.writer == "thread"
    assert agent.policy.max_tool_calls == 3 and agent.policy.allowed_tools == ("safe_*",)
    assert agent.system_prompt == "Hello."


def test_auto_picks_openai_then_litert_then_the_local_model():
    litert = {"AGENTIK_GOOGLE_MODEL_PATH": "/models/gemma.litertlm"}

    def choice(llm: dict, env: dict) -> str:
        return backend_choice(parse_config({"llm": llm}, env={}), env=env)

    assert choice({"base_url": "http://127.0.0.1:9/v1"}, litert) == "openai"
    assert choice({"api_key": "sk-x"}, {}) == "openai"
    assert choice({}, litert) == "litert"
    assert choice({}, {}) == "llamacpp"
    assert choice({"backend": "scripted"}, litert) == "scripted"
    # The variables reach the choice through the configuration (as overrides).
    env = {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}
    assert backend_choice(parse_config({}, env=env), env=env) == "openai"


def test_litert_chosen_but_not_installed_says_so():
    config = parse_config({}, env={})
    registry = load_registry(config)
    registry.llm_backends.pop("litert", None)  # as where no plugin provides it
    with pytest.raises(ConfigError) as info:
        resolve_backend(config, registry, env={"AGENTIK_GOOGLE_MODEL_PATH": "/m.litertlm"})
    message = str(info.value)
    assert "AGENTIK_GOOGLE_MODEL_PATH is set" in message
    assert "'litert'" in message and "no installed plugin registers it" in message
    assert "registered: " in message and "openai" in message


async def test_without_the_local_extra_auto_answers_with_setup_help(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as if it were not installed
    config = parse_config({"storage": {"path": ":memory:"}}, env={})
    agent = AgentBuilder.from_config(config, load_registry(config)).build()
    assert isinstance(agent.llm, NoModelBackend)
    assert "llama-cpp-python" in agent.llm.reason and "agentik[local]" in agent.llm.reason
    assert "agentik[local]" in NO_MODEL_HELP and "OPENAI_BASE_URL" in NO_MODEL_HELP
    async with agent:
        conv = await agent.create_conversation()
        await conv.send("hello?")
        await conv.wait_idle()
        assert (await conv.messages())[-1].content == NO_MODEL_HELP


def test_naming_llamacpp_without_the_local_extra_is_a_config_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    source = tmp_path / "bot.toml"
    source.write_text('[llm]\nbackend = "llamacpp"\n')
    config = load_config(source, env={})
    with pytest.raises(ConfigError) as info:
        AgentBuilder.from_config(config, load_registry(config))
    message = str(info.value)
    assert message.startswith(f"{source}: llm.backend: ")
    assert "llama-cpp-python" in message and "pip install 'agentik[local]'" in message


def test_other_backends_come_from_the_registry():
    config = parse_config({"llm": {"backend": "scripted", "model": "x"}}, env={})
    agent = AgentBuilder.from_config(config, load_registry(config)).build()
    assert isinstance(agent.llm, ScriptedModel) and agent.llm.model == "x"
    bad = parse_config({"llm": {"backend": "nope"}}, env={})
    with pytest.raises(ConfigError, match="unknown LLM backend 'nope'"):
        AgentBuilder.from_config(bad, load_registry(bad))


async def test_toolsets_are_asked_every_turn_and_follow_the_agent_lifecycle(tmp_path):
    @tool
    async def first() -> str:
        """First."""
        return "1"

    @tool
    async def second() -> str:
        """Second."""
        return "2"

    class Growing:
        def __init__(self):
            self.offered = [first]
            self.started = self.closed = False

        def tools(self):
            return list(self.offered)

        async def start(self):
            self.started = True

        async def aclose(self):
            self.closed = True

    toolset = Growing()
    model = ScriptedModel()
    agent = (
        AgentBuilder()
        .llm(model)
        .storage(SQLiteStore(str(tmp_path / "t.db")))
        .memory(NoMemory())
        .toolset(toolset)
        .build()
    )
    async with agent:
        assert toolset.started
        conv = await agent.create_conversation()
        await conv.send("a")
        await conv.wait_idle()
        toolset.offered.append(second)  # e.g. an MCP server announced a new tool
        await conv.send("b")
        await conv.wait_idle()
    assert toolset.closed
    assert [[t.name for t in r.tools] for r in model.requests] == [["first"], ["first", "second"]]


@pytest.mark.parametrize("backend", ["sqlite", "markdown", "none"])
async def test_from_config_picks_the_memory_backend(tmp_path, backend):
    from agentik.bot.config import load_config
    from agentik.core.background import MemoryWorker
    from agentik.core.memory.markdown import MarkdownMemory
    from agentik.core.memory.sqlite import SQLiteMemory
    from agentik.core.plugins import load_plugins

    conf = tmp_path / "bot.toml"
    conf.write_text(
        f'[llm]\nbackend = "scripted"\n[storage]\npath = "bot.db"\n'
        f'[memory]\nbackend = "{backend}"\npath = "notes"\nreflection = false\n'
        "[compaction]\ncontext_tokens = 2048\nkeep_turns = 3\n"
    )
    agent = AgentBuilder.from_config(load_config(conf), load_plugins()).build()
    expected = {"sqlite": SQLiteMemory, "markdown": MarkdownMemory, "none": NoMemory}[backend]
    assert type(agent.memory) is expected
    assert agent.compactor.budget == 2048 and agent.compactor.policy.keep_turns == 3
    workers = [w for w in agent.background if isinstance(w, MemoryWorker)]
    assert len(workers) == (0 if backend == "none" else 1)
    names = {t.name for t in agent.tools}
    assert ("memory_save" in names) == (backend != "none")
    async with agent:
        if backend == "markdown":
            conv = await agent.create_conversation()
            agent.llm.enqueue(Reply(tool_calls=[call("memory_save", {"text": "hi"})]), "ok")
            await conv.send("remember hi")
            await conv.wait_idle()
            assert (tmp_path / "notes" / "channel").is_dir()  # relative to the config file


def test_from_config_hands_the_configured_settings_to_the_agent(tmp_path):
    from agentik.core.background import MemoryWorker

    config = parse_config(
        {
            "agent": {"event_buffer": 64},
            "llm": {"backend": "scripted"},
            "storage": {"path": str(tmp_path / "s.db")},
            "tools": {"max_tool_calls": 2, "time_budget": 9, "allowed": ["x_*"]},
            "compaction": {"keep_turns": 2, "summary_tokens": 64, "prompt": "Sum up: {words}"},
            "memory": {"mining_debounce": 1.5, "timeout": 7, "reflection": False},
        },
        env={},
    )
    agent = AgentBuilder.from_config(config, load_registry(config)).build()
    assert agent.event_buffer == 64
    assert agent.policy == config.tools
    assert agent.policy.time_budget == 9 and agent.policy.allows("x_y")
    assert not agent.policy.allows("y")
    assert agent.compactor.policy == config.compaction
    assert agent.compactor.policy.prompt == "Sum up: {words}"
    (worker,) = [w for w in agent.background if isinstance(w, MemoryWorker)]
    assert worker.policy.mining_debounce == 1.5 and worker.policy.timeout == 7
    assert not worker.policy.reflection


def test_the_event_buffer_default_is_the_same_everywhere(tmp_path):
    from agentik.core import Agent

    built = AgentBuilder().llm(ScriptedModel()).storage(SQLiteStore()).memory(NoMemory()).build()
    by_hand = Agent(llm=ScriptedModel())
    configured = parse_config({}, env={}).agent.event_buffer
    assert built.event_buffer == by_hand.event_buffer == configured == 1024
