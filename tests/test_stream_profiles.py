"""Stream profiles as data: built-in and ``[profiles.<name>]`` profiles filter what a
subscriber gets — over real SSE (httpx → uvicorn → the HTTP transport), from
``Conversation.events`` and ``Agent.events`` — and bad declarations are refused
naming the key."""

from __future__ import annotations

import asyncio

import pytest

from agentik.bot.config import parse_config
from agentik.core import Agent, SQLiteStore
from agentik.core.errors import ConfigError
from agentik.core.messages import Usage
from agentik.core.streamprofiles import (
    BUILTIN_PROFILES,
    StreamProfileSettings,
    UnknownProfileError,
    resolve_profiles,
)
from agentik.core.testing.scripted import Reply, ScriptedModel, call

from childruns import CHILD_ANSWER, CHILD_TEXT, with_researcher
from httpserver import SSEMessage, SSEReader, running_server, sse

PROFILES_TOML = {
    # Answers only: chat without the tool notices.
    "quiet": {"extends": "chat", "exclude": ["tool_call_started", "tool_call_ended"]},
    # Chat, with the sub-agents' events too.
    "nested": {"extends": "chat", "child_runs": True, "kinds": ["reasoning_delta"]},
    # Everything but child runs, and no usage numbers (a public dashboard).
    "public": {"extends": "debug", "child_runs": False, "usage": False},
    # Built from nothing: just the lifecycle of turns.
    "turns": {"kinds": ["turn_started", "turn_ended"], "child_runs": False},
}


def declared() -> dict:
    return resolve_profiles(parse_config({"profiles": PROFILES_TOML}).profiles)


async def until_parent_ended(reader: SSEReader) -> list[SSEMessage]:
    """Messages up to the parent turn's ``turn_ended`` (a child's may come first)."""
    got: list[SSEMessage] = []
    while True:
        msg = await reader.next(timeout=60)
        got.append(msg)
        if msg.kind == "turn_ended" and msg.data and msg.data["parent_run_id"] is None:
            return got


def delegating_turn(model: ScriptedModel) -> None:
    model.enqueue(
        Reply(reasoning="I should ask", tool_calls=[call("agent__researcher", {"task": "notes"})])
    )
    model.enqueue(
        Reply(
            text="The researcher says: " + CHILD_ANSWER,
            usage=Usage(prompt_tokens=9, total_tokens=9),
        )
    )


async def test_custom_profiles_filter_the_sse_stream(db_path):
    kwargs = with_researcher(ScriptedModel(), stream_profiles=declared())
    async with running_server(db_path, **kwargs) as server:
        delegating_turn(server.model)
        async with server.client() as c:
            conv = (await c.post("/conversations", json={})).json()
            path = f"/conversations/{conv['id']}/events"
            names = ("quiet", "nested", "public", "turns", "chat", "debug")
            async with (
                sse(c, path, params={"profile": "quiet"}) as quiet,
                sse(c, path, params={"profile": "nested"}) as nested,
                sse(c, path, params={"profile": "public"}) as public,
                sse(c, path, params={"profile": "turns"}) as turns,
                sse(c, path, params={"profile": "chat"}) as chat,
                sse(c, path) as debug,
            ):
                r = await c.post(f"/conversations/{conv['id']}/messages", json={"content": "q"})
                assert r.status_code == 202
                readers = (quiet, nested, public, turns, chat, debug)
                got = dict(
                    zip(names, await asyncio.gather(*map(until_parent_ended, readers)), strict=True)
                )
    kinds = {name: [m.kind for m in msgs] for name, msgs in got.items()}
    child = {name: [m for m in msgs if m.data["parent_run_id"]] for name, msgs in got.items()}

    # The custom profile without tool events gets none — neither the parent's nor
    # the child's — but the answer and the child run's one link.
    assert "tool_call_started" not in kinds["quiet"] and "tool_call_ended" not in kinds["quiet"]
    assert "text_delta" in kinds["quiet"] and "child_run_linked" in kinds["quiet"]
    assert child["quiet"] == []
    link = next(m for m in got["quiet"] if m.kind == "child_run_linked").data
    assert link["agent"] == "researcher" and link["parent_run_id"] is None

    # child_runs = false: no event of the child run, in a profile of all kinds too.
    assert child["public"] == [] and child["chat"] == [] and child["turns"] == []
    assert "reasoning_delta" in kinds["public"] and "tool_call_started" in kinds["public"]
    # ... and usage = false: the numbers are gone from turn_ended.
    ended = got["public"][-1].data
    assert ended["usage"] == {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    assert got["debug"][-1].data["usage"]["total_tokens"] > 0

    # child_runs = true: the child's events arrive, marked with the parent run.
    parent_run = got["debug"][-1].data["run_id"]
    assert child["nested"] and {m.data["parent_run_id"] for m in child["nested"]} == {parent_run}
    assert "".join(m.data["text"] for m in child["nested"] if m.kind == "text_delta").startswith(
        CHILD_TEXT
    )
    # It extends chat: chat's kinds plus the one it added, nothing else.
    assert "reasoning_delta" in kinds["nested"] and "response_started" not in kinds["nested"]
    # Built from nothing: exactly the kinds listed.
    assert set(kinds["turns"]) == {"turn_started", "turn_ended"}
    # The built-in debug profile still has everything.
    assert {m.kind for m in child["debug"]} >= {"turn_started", "tool_call_started", "text_delta"}


async def test_an_unknown_profile_is_refused_naming_it(db_path):
    async with running_server(db_path, stream_profiles=declared()) as server:
        async with server.client() as c:
            conv = (await c.post("/conversations", json={})).json()
            for path in (f"/conversations/{conv['id']}/events", "/events"):
                r = await c.get(path, params={"profile": "loud"})
                assert r.status_code == 422
                error = r.json()["error"]
                assert error["code"] == "invalid_parameter"
                assert "'loud'" in error["message"] and "quiet" in error["message"]
            # The OpenAPI document lists the declared profiles with the built-in ones.
            doc = (await c.get("/openapi.json")).json()
            [param] = [
                q
                for q in doc["paths"]["/agentik/events"]["get"]["parameters"]
                if q["name"] == "profile"
            ]
            assert param["schema"]["enum"] == sorted(["chat", "debug", "metrics", *PROFILES_TOML])
            # A declared one is accepted on the agent-wide stream too.
            async with sse(c, "/events", params={"profile": "quiet"}) as quiet:
                await c.post(f"/conversations/{conv['id']}/messages", json={"content": "hi"})
                assert (await quiet.until("turn_ended"))[-1].data["conversation_id"] == conv["id"]


async def test_library_subscribers_name_profiles(db_path):
    model = ScriptedModel()
    kwargs = with_researcher(ScriptedModel(), stream_profiles=declared())
    async with Agent(llm=model, store=SQLiteStore(db_path), **kwargs) as agent:
        conv = await agent.create_conversation()
        with pytest.raises(UnknownProfileError, match="'loud'"):
            conv.events(profile="loud")
        with pytest.raises(ValueError, match="unknown event profile"):
            agent.events(profile="loud")
        quiet = conv.events(profile="quiet")
        everything = agent.events(profile=BUILTIN_PROFILES["debug"])
        delegating_turn(model)
        await conv.send("q")
        seen_quiet = await asyncio.wait_for(_until_parent_ended(quiet), 60)
        seen_all = await asyncio.wait_for(_until_parent_ended(everything), 60)
        await quiet.aclose()
        await everything.aclose()
    assert seen_quiet and all(e.parent_run_id is None for e in seen_quiet)
    assert not {e.kind for e in seen_quiet} & {"tool_call_started", "tool_call_ended"}
    assert any(e.parent_run_id for e in seen_all)


async def _until_parent_ended(sub) -> list:
    got = []
    async for e in sub:
        got.append(e)
        if e.kind == "turn_ended" and e.parent_run_id is None:
            break
    return got


@pytest.mark.parametrize(
    ("table", "key", "words"),
    [
        ({"q": {"kinds": ["text_delta", "txt_delta"]}}, "profiles.q.kinds", "txt_delta"),
        ({"q": {"exclude": ["nope"]}}, "profiles.q.exclude", "nope"),
        ({"q": {"extends": "chatty"}}, "profiles.q.extends", "chatty"),
        ({"a": {"extends": "b"}, "b": {"extends": "a"}}, ".extends", "extend each other"),
        ({"chat": {"kinds": ["text_delta"]}}, "profiles.chat", "built-in"),
        ({"q": {"kindz": ["text_delta"]}}, "profiles.q.kindz", ""),
        ({"q": {"child_runs": "maybe"}}, "profiles.q.child_runs", ""),
        ({"bad name": {}}, "profiles.bad name", "profile name"),
    ],
)
def test_bad_profile_declarations_name_the_key(table, key, words):
    with pytest.raises(ConfigError) as info:
        parse_config({"profiles": table})
    assert key in str(info.value) and words in str(info.value)


def test_a_channel_or_transport_naming_an_unknown_profile_is_refused():
    with pytest.raises(ConfigError, match=r'channels\."irc:\*"\.profile: no profile \'quiet\''):
        parse_config({"channels": {"irc:*": {"profile": "quiet"}}})
    with pytest.raises(ConfigError, match=r"transports\.irc\.profile: no profile 'loud'"):
        parse_config({"transports": {"irc": {"type": "irc", "profile": "loud"}}})
    ok = parse_config(
        {"profiles": {"quiet": {"extends": "chat"}}, "channels": {"irc:*": {"profile": "quiet"}}}
    )
    assert ok.channels["irc:*"].profile == "quiet"


def test_extends_inherits_and_overrides():
    got = resolve_profiles(
        {
            "a": StreamProfileSettings(extends="metrics", usage=False),
            "b": StreamProfileSettings(extends="a", kinds=["text_delta"], exclude=["error"]),
        }
    )
    metrics = BUILTIN_PROFILES["metrics"]
    assert got["a"].kinds == metrics.kinds and got["a"].usage is False
    assert got["b"].usage is False and got["b"].child_runs is metrics.child_runs
    assert got["b"].kinds == (metrics.kinds | {"text_delta"}) - {"error"}


async def test_set_profile_changes_an_open_channel(db_path):
    """``!set profile <name>`` picks a declared profile for the channel from its next
    turn (here: debug without tool events); an unknown name is refused naming the known."""
    from agentik.bot.bridge import Bridge, ChannelOptions
    from agentik.core import tool
    from agentik.transports.testing import MemoryTransport

    @tool
    async def clock() -> str:
        """The time."""
        return "noon"

    profiles = resolve_profiles(
        {"notools": StreamProfileSettings(extends="debug", exclude=["tool_call_started"])}
    )
    model = ScriptedModel()
    store = SQLiteStore(db_path)
    async with Agent(llm=model, store=store, tools=[clock], stream_profiles=profiles) as agent:
        bridge = Bridge(agent, role_for=lambda *_: "admin")
        t = MemoryTransport(name="mem")
        bridge.attach(t, ChannelOptions(command_prefix="!", events="debug"))
        await t.start(bridge)
        try:
            key = "mem:#room"
            model.enqueue(Reply(tool_calls=[call("clock")]), "Noon.")
            await t.inject("time?", channel_key=key, addressed=True)
            await bridge.flush(key)
            assert any(n.startswith("⚙ clock(") for n in t.texts("notice"))
            await t.inject("!set profile loud", channel_key=key)
            assert (
                "profile: no profile 'loud'; profiles: debug, chat, metrics, notools"
                in (t.texts("command")[-1])
            )
            await t.inject("!set profile notools", channel_key=key)
            before = len(t.texts("notice"))
            model.enqueue(Reply(tool_calls=[call("clock")]), "Noon again.")
            await t.inject("time now?", channel_key=key, addressed=True)
            await bridge.flush(key)
            later = t.texts("notice")[before:]
            # The call's start is gone; the rest of debug (its end, the turn's line) stays.
            assert not any(n.startswith("⚙ clock(") for n in later)
            assert any(n.startswith("⚙ clock →") for n in later)
            assert "Noon again." in t.texts("answer")
        finally:
            await t.aclose()
            await bridge.aclose()
