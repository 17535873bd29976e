"""Structured child results (issue 35): an agent with a ``result_schema`` answers
in JSON, and its caller gets the value validated; a bad answer gets one repair
request, then the call is a tool error.  The agents run for real on SQLite with
the scripted model doubles, and from a configuration file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agentik.bot.app import load_registry
from agentik.bot.builder import AgentBuilder
from agentik.bot.config import load_config
from agentik.core import Agent, SQLiteStore
from agentik.core.agents import AgentSpec
from agentik.core.errors import ConfigError
from agentik.core.testing.scripted import Reply, ScriptedModel, call

WAIT = 60.0  # only guards against a hang

VERDICT = {
    "type": "object",
    "properties": {
        "verdict": {"type": "string", "enum": ["ship", "hold"]},
        "risks": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["verdict", "risks"],
    "additionalProperties": False,
}


def make_agent(tmp_path: Path, schema=VERDICT):
    main, child = ScriptedModel(), ScriptedModel()
    spec = AgentSpec(description="Reviews a change.", model="child", result_schema=schema)
    agent = Agent(
        llm=main,
        profiles={"child": child},
        store=SQLiteStore(str(tmp_path / "t.db")),
        agents={"reviewer": spec},
        uses=("reviewer",),
    )
    return agent, main, child


async def run_tree(agent, text: str):
    conv = await agent.conversation_for_channel("stdio:test")
    sub = conv.events()
    run_id = await conv.send(text, author="alice")
    events = []
    async with asyncio.timeout(WAIT):
        async for event in sub:
            events.append(event)
            if event.kind == "run_stream_end" and event.run_id == run_id:
                break
    return events


def tool_results(request):
    return [m for m in request.messages if m.role == "tool"]


REVIEW = Reply(tool_calls=[call("agent__reviewer", {"task": "review PR 7"}, id="c1")])


async def test_the_child_answers_through_the_schema_and_the_parent_gets_validated_json(tmp_path):
    agent, main, child = make_agent(tmp_path)
    main.enqueue(REVIEW, "Shipping it.")
    # Models wrap JSON in a code fence now and then: that is still the value.
    child.enqueue('```json\n{"verdict": "ship", "risks": ["none found"]}\n```')
    async with agent:
        events = await run_tree(agent, "review PR 7")
        conv = await agent.conversation_for_channel("stdio:test")
        log = await conv.messages(limit=50)
    # The child was told to answer with JSON matching its schema.
    assert "JSON Schema" in child.requests[0].system
    assert json.loads(child.requests[0].system.split("\n")[-1]) == VERDICT
    (result,) = tool_results(main.requests[1])
    assert not result.is_error
    assert json.loads(result.content) == {"verdict": "ship", "risks": ["none found"]}
    [stored] = [m for m in log if m.kind == "tool_result"]
    assert stored.data["result"] == {"verdict": "ship", "risks": ["none found"]}
    assert stored.data["repaired"] is False
    assert len([e for e in events if e.kind == "child_run_linked"]) == 1


async def test_a_bad_answer_gets_one_repair_request_in_the_same_child_conversation(tmp_path):
    agent, main, child = make_agent(tmp_path)
    main.enqueue(REVIEW, "Holding it.")
    child.enqueue('{"verdict": "maybe", "risks": []}', '{"verdict": "hold", "risks": ["flaky CI"]}')
    async with agent:
        events = await run_tree(agent, "review PR 7")
    repair = child.requests[1]
    asked = repair.messages[-1].content
    assert "does not match the required JSON Schema" in asked and "'maybe'" in asked
    # The child sees its own first answer: the repair is in the same conversation.
    assert [m.role for m in repair.messages][-3:] == ["user", "assistant", "user"]
    (result,) = tool_results(main.requests[1])
    assert json.loads(result.content) == {"verdict": "hold", "risks": ["flaky CI"]}
    # Two child runs, both linked to the parent's one call.
    linked = [e for e in events if e.kind == "child_run_linked"]
    assert [e.call_id for e in linked] == ["c1", "c1"]
    assert len({e.child_run_id for e in linked}) == 2
    assert len({e.child_conversation_id for e in linked}) == 1


async def test_two_bad_answers_are_a_tool_error_and_the_parent_goes_on(tmp_path):
    agent, main, child = make_agent(tmp_path)
    main.enqueue(REVIEW, "The reviewer could not say.")
    child.enqueue("Looks good to me!", '{"verdict": "ship"}')
    async with agent:
        events = await run_tree(agent, "review PR 7")
    assert len(child.requests) == 2  # one repair, no more
    (result,) = tool_results(main.requests[1])
    assert result.is_error
    assert result.content.startswith("error: agent reviewer gave no valid result")
    assert "'risks' is a required property" in result.content
    ended = [e for e in events if e.kind == "turn_ended" and e.parent_run_id is None]
    assert ended[-1].text == "The reviewer could not say."


def write_config(tmp_path: Path, schema_line: str) -> Path:
    path = tmp_path / "bot.toml"
    path.write_text(
        '[llm]\nbackend = "scripted"\n[agent]\nuses = ["reviewer"]\n'
        f'[agents.reviewer]\ndescription = "Reviews."\n{schema_line}\n',
        encoding="utf-8",
    )
    return path


def build(path: Path) -> Agent:
    config = load_config(path)
    return AgentBuilder.from_config(config, load_registry(config)).build()


def test_the_schema_is_inline_or_a_file_next_to_the_configuration(tmp_path):
    (tmp_path / "verdict.json").write_text(json.dumps(VERDICT), encoding="utf-8")
    from_file = build(write_config(tmp_path, 'result_schema = "verdict.json"'))
    assert from_file.agents["reviewer"].result_schema == VERDICT
    inline = build(
        write_config(tmp_path, 'result_schema = { type = "object", required = ["verdict"] }')
    )
    assert inline.agents["reviewer"].result_schema == {"type": "object", "required": ["verdict"]}


@pytest.mark.parametrize(
    ("line", "files", "message"),
    [
        ('result_schema = "missing.json"', {}, r"agents\.reviewer\.result_schema: cannot read"),
        ('result_schema = "bad.json"', {"bad.json": "{nope"}, r"result_schema: .*is not JSON"),
        (
            'result_schema = "odd.json"',
            {"odd.json": '{"type": 5}'},
            r"result_schema: .*not a valid JSON Schema",
        ),
        ('result_schema = { type = "nothing" }', {}, r"agents\.reviewer\.result_schema"),
    ],
)
def test_a_bad_schema_is_a_clear_error_naming_the_key(tmp_path, line, files, message):
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=message):
        build(write_config(tmp_path, line))
