"""Model profiles per channel (issue 19): ``[llm.profiles.<name>]`` and ``model``
in ``[channels."<pattern>"]`` / ``!set model``, end to end: a TOML file, the real
bot (builder, bridge, IRC transport) on a real IRC server, and two fake
OpenAI-compatible servers the real openai client talks to, so where each
model request goes — and which model it names — is what is checked."""

from __future__ import annotations

import sqlite3
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from agentik.bot.app import Bot
from agentik.bot.builder import resolve_profiles
from agentik.bot.chansettings import SettingError, parse_setting
from agentik.bot.config import load_config, parse_config
from agentik.core import Agent, OpenAIBackend, SQLiteStore, TurnSettings
from agentik.core.compaction import CompactionPolicy, estimate_tokens
from agentik.core.errors import ConfigError
from agentik.core.plugins import load_plugins
from agentik.core.testing.openai_server import FakeOpenAIServer
from agentik.core.testing.scripted import ScriptedModel
from helpers import collect_turn

from ircservers import IRCTestClient
from rigs import ask, said_in

pytest_plugins = ["ircservers"]

CHANNELS = ("#ops", "#dev", "#cfg")


def _config(tmp_path: Path, irc_port: int, main: FakeOpenAIServer, fast: FakeOpenAIServer) -> Path:
    path = tmp_path / "bot.toml"
    path.write_text(
        f"""
[agent]
settings_role = "user"
[llm]
backend = "openai"
base_url = "{main.base_url}"
api_key = "sk-main"
model = "main-model"
max_retries = 0
[llm.profiles.fast]
backend = "openai"
base_url = "{fast.base_url}"
api_key = "sk-fast"
model = "fast-model"
max_retries = 0
[llm.profiles.cheap]
model = "cheap-model"
[storage]
path = "{tmp_path / "bot.db"}"
[transports.testnet]
type = "irc"
host = "127.0.0.1"
port = {irc_port}
nick = "agentik"
tls = false
channels = {list(CHANNELS)!r}
unverified_identity = "hostmask"
reconnect_min = 0.2
reconnect_max = 1.0
flood_burst = 10
flood_rate = 200.0
[channels."irc:testnet:#cfg"]
model = "fast"
""".replace("'", '"'),
        encoding="utf-8",
    )
    return path


@asynccontextmanager
async def running(path: Path):
    async with Bot(load_config(path, env={})) as bot:
        transport = bot.transports["testnet"]
        await transport.wait_until(  # type: ignore[attr-defined]
            lambda: set(CHANNELS) <= set(transport.joined),  # type: ignore[attr-defined]
            timeout=60,
        )
        yield bot


def asked(server: FakeOpenAIServer, text: str) -> list[dict]:
    """The model requests ``server`` got whose last user message contains ``text``."""
    found = []
    for body in server.requests:
        users = [m for m in body["messages"] if m["role"] == "user"]
        if users and text in str(users[-1]["content"]):
            found.append(body)
    return found


@pytest.fixture
async def fast_server():
    async with FakeOpenAIServer(model="fast-model") as server:
        yield server


async def test_set_model_sends_that_channels_turns_to_the_profile_and_survives_a_restart(
    miniircd, openai_server, fast_server, tmp_path
):
    main = openai_server
    path = _config(tmp_path, miniircd.port, main, fast_server)
    async with running(path) as bot:
        assert set(bot.agent.profiles) == {"fast", "cheap"}
        alice = await IRCTestClient.connect(miniircd.port, "alice")
        for channel in CHANNELS:
            await alice.join(channel)
        await ask(alice, "#ops", "first in ops")
        [body] = asked(main, "first in ops")
        assert body["model"] == "main-model" and not asked(fast_server, "first in ops")

        alice.privmsg("#ops", "!set model fast")
        await alice.wait_for(said_in("#ops", "model is now fast in this channel"))
        await ask(alice, "#ops", "fast in ops")
        [body] = asked(fast_server, "fast in ops")
        assert body["model"] == "fast-model" and not asked(main, "fast in ops")
        # The conversation goes on: the profile's model sees what was said before.
        assert "first in ops" in str(body["messages"])

        # Another channel keeps [llm].
        await ask(alice, "#dev", "still main in dev")
        assert [b["model"] for b in asked(main, "still main in dev")] == ["main-model"]
        assert not asked(fast_server, "still main in dev")
        # A config pattern picks the profile for #cfg.
        await ask(alice, "#cfg", "configured")
        assert [b["model"] for b in asked(fast_server, "configured")] == ["fast-model"]

        # An unknown profile is refused, naming the allowed ones; nothing changes.
        alice.privmsg("#ops", "!set model turbo")
        refused = await alice.wait_for(said_in("#ops", "turbo"))
        assert "model: no profile 'turbo'; profiles: default, cheap, fast" in refused.text
        alice.privmsg("#ops", "!status")
        status = await alice.wait_for(said_in("#ops", "conversation"))
        assert status.text.startswith("model fast-model (profile fast) ·")
        alice.privmsg("#ops", "!status settings")  # a shared channel: settings on request
        settings = ""
        while "model fast [chat, testnet:alice!" not in settings:
            settings += (await alice.wait_for(said_in("#ops"))).text + " "
        alice.privmsg("#cfg", "!status")
        status = await alice.wait_for(said_in("#cfg", "conversation"))
        assert status.text.startswith("model fast-model (profile fast) ·")
        await alice.close()

    # A new process on the same database: #ops still uses the profile.
    async with running(path) as bot:
        alice = await IRCTestClient.connect(miniircd.port, "alice")
        for channel in ("#ops", "#dev"):
            await alice.join(channel)
        await ask(alice, "#ops", "after restart")
        assert [b["model"] for b in asked(fast_server, "after restart")] == ["fast-model"]
        assert not asked(main, "after restart")
        await ask(alice, "#dev", "dev after restart")
        assert [b["model"] for b in asked(main, "dev after restart")] == ["main-model"]

        # A profile without a backend of its own is [llm] with its keys changed.
        alice.privmsg("#dev", "!set model cheap")
        await alice.wait_for(said_in("#dev", "model is now cheap"))
        await ask(alice, "#dev", "cheap in dev")
        assert [b["model"] for b in asked(main, "cheap in dev")] == ["cheap-model"]

        # Back to [llm]: `!set model default` (overrides a config pattern too) and `!unset`.
        alice.privmsg("#ops", "!set model default")
        await alice.wait_for(said_in("#ops", "model is now default"))
        await ask(alice, "#ops", "default again")
        assert [b["model"] for b in asked(main, "default again")] == ["main-model"]
        alice.privmsg("#dev", "!unset model")
        await alice.wait_for(said_in("#dev", "model"))
        await ask(alice, "#dev", "unset in dev")
        assert [b["model"] for b in asked(main, "unset in dev")] == ["main-model"]
        await alice.close()
    with sqlite3.connect(tmp_path / "bot.db") as con:
        rows = con.execute(
            "SELECT channel_key, value FROM channel_setting WHERE key = 'model'"
        ).fetchall()
    assert rows == [("irc:testnet:#ops", '"default"')]


def test_profile_config_errors_name_the_key(tmp_path):
    def error(data: dict) -> str:
        with pytest.raises(ConfigError) as info:
            parse_config(data, env={})
        return str(info.value)

    assert error({"llm": {"profiles": {"fast": {"tempreature": 1}}}}) == (
        "<string>: llm.profiles.fast.tempreature: unknown key (did you mean 'temperature'?)"
    )
    assert error({"llm": {"profiles": {"fast": {"backend": "openai", "max_tokens": "lots"}}}}
                 ).startswith("<string>: llm.profiles.fast.max_tokens: ")  # fmt: skip
    assert "llm.profiles.default: not a usable profile name" in error(
        {"llm": {"profiles": {"default": {"model": "x"}}}}
    )
    assert "llm.profiles.fast.profiles: a profile cannot have profiles" in error(
        {"llm": {"profiles": {"fast": {"profiles": {}}}}}
    )
    assert error({"llm": {"profiles": {"fast": {"model": "x"}}},
                  "channels": {"irc:*": {"model": "turbo"}}}) == (
        "<string>: channels.\"irc:*\".model: no profile 'turbo'; profiles: default, fast"
        " (define [llm.profiles.turbo])"
    )  # fmt: skip
    # A secret is never quoted in an error.
    text = error({"llm": {"profiles": {"p": {"backend": "openai", "api_key": 12345678}}}})
    assert "llm.profiles.p.api_key" in text and "12345678" not in text
    # A backend the registry lacks is named where the profile says it.
    config = parse_config({"llm": {"backend": "scripted", "profiles": {
        "x": {"backend": "nosuchbackend"}}}}, env={})  # fmt: skip
    registry = load_plugins(env={"AGENTIK_PLUGINS": ""}, entry_points=False)
    with pytest.raises(ConfigError) as info:
        resolve_profiles(config, registry)
    assert "nosuchbackend" in str(info.value)


def test_parse_model_setting():
    assert parse_setting("model", ["fast"], profiles=("fast",)) == "fast"
    assert parse_setting("model", ["Default"], profiles=()) == "default"
    with pytest.raises(SettingError, match="model: no profile 'Fast'; profiles: default, fast"):
        parse_setting("model", ["Fast"], profiles=("fast",))
    with pytest.raises(SettingError, match="one value expected"):
        parse_setting("model", ["fast", "slow"], profiles=("fast", "slow"))


async def test_the_agent_closes_its_profile_backends(openai_server, fast_server):
    main = OpenAIBackend(model="m", base_url=openai_server.base_url, api_key="k")
    fast = OpenAIBackend(model="f", base_url=fast_server.base_url, api_key="k")
    async with Agent(llm=main, profiles={"fast": fast}) as agent:
        assert agent.llm_for("fast") is fast
        assert agent.llm_for(None) is main and agent.llm_for("gone") is main
        assert not fast.closed
    # The openai clients (their HTTP connection pools) are closed with the agent.
    assert main.closed and fast.closed


async def test_a_profiles_own_window_fits_the_context_of_its_conversations(tmp_path):
    """The main model's window is large; a profile's is small: a conversation on the
    profile is trimmed to the profile's window (no request refused), while one on
    the main backend keeps its whole history."""
    main, small = ScriptedModel(context_window=100_000), ScriptedModel(context_window=200)
    policy = CompactionPolicy(enabled=False)
    store = SQLiteStore(str(tmp_path / "fit.db"))
    async with Agent(llm=main, store=store, compaction=policy, profiles={"small": small}) as agent:
        on_small, on_main = await agent.create_conversation(), await agent.create_conversation()
        small_turns = TurnSettings(llm_profile="small")
        for i in range(6):
            for conv in (on_small, on_main):
                sub = conv.events()
                settings = small_turns if conv is on_small else None
                run_id = await conv.send(
                    f"message {i} " + "words " * 25, author="alice", settings=settings
                )
                events = await collect_turn(sub, run_id=run_id, wait=60)
                await sub.aclose()
                assert events[-1].kind == "turn_ended" and events[-1].stop_reason == "stop"
    assert len(small.requests) == 6 and len(main.requests) == 6
    assert not small.refused
    assert all(estimate_tokens(r.messages, r.system, r.tools) <= 200 for r in small.requests)
    assert "dropped to fit" in str(small.requests[-1].messages[0].content)
    # The main backend's conversation was never cut: all six messages are in its last request.
    assert len([m for m in main.requests[-1].messages if m.role == "user"]) == 6


def test_agentik_check_lists_the_profiles_and_fails_on_a_bad_one(tmp_path, capsys):
    from agentik.bot.cli import main as cli

    path = tmp_path / "bot.toml"
    base = f"""
[llm]
backend = "openai"
base_url = "http://127.0.0.1:9/v1"
api_key = "sk-secret-main"
model = "main-model"
[llm.profiles.cheap]
model = "cheap-model"
[storage]
path = "{tmp_path / "bot.db"}"
"""
    path.write_text(base, encoding="utf-8")
    assert cli(["check", "-c", str(path)]) == 0
    out = capsys.readouterr().out
    assert "llm.profiles.cheap: openai, model 'cheap-model' at http://127.0.0.1:9/v1" in out
    assert "sk-secret-main" not in out
    path.write_text(base + '[channels."irc:*"]\nmodel = "fast"\n', encoding="utf-8")
    assert cli(["check", "-c", str(path)]) != 0
    err = capsys.readouterr().err
    assert "channels.\"irc:*\".model: no profile 'fast'; profiles: default, cheap" in err
