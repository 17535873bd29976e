"""A2A against an independent implementation: the JavaScript SDK ``@a2a-js/sdk``.

* our agent calls a small A2A server built on the JS SDK (``tests/a2a_js/server.mjs``,
  node:http + the SDK's JSON-RPC handler) as the tool ``agent__js``: answer, run tree,
  and cancellation when our caller is interrupted;
* a small JS SDK client (``tests/a2a_js/client.mjs``) talks to our server: card,
  message/send, message/stream in the same context, a cancelled streaming task,
  tasks/get, an unknown task.

``make test`` installs the SDK into ``.npm-tools`` (``make a2a-js``); without node or
the package these tests skip (CI=true: fail).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentik.core import Agent, OpenAIBackend, SQLiteStore
from agentik.core.agents import AgentSpec
from agentik.core.testing.openai_server import Reply as WireReply
from agentik.core.testing.scripted import Reply, ScriptedModel, call
from helpers import in_ci

from httpserver import TOKENS, running_server

WAIT = 60.0
ROOT = Path(__file__).resolve().parent.parent
MODULES = ROOT / ".npm-tools/node_modules"
SCRIPTS = Path(__file__).resolve().parent / "a2a_js"
JS_TOKEN = "js-token-0123456789abcdef"


def require_node() -> str:
    """node, when it and @a2a-js/sdk are installed; else skip (CI=true: fail)."""
    node = shutil.which("node")
    problem = None
    if node is None:
        problem = "node is not installed: the A2A tests against @a2a-js/sdk need it"
    elif not (MODULES / "@a2a-js/sdk/package.json").exists():
        problem = "@a2a-js/sdk is missing (run `make a2a-js`)"
    if problem is not None:
        if in_ci():
            pytest.fail(f"{problem} (CI=true: `make test` installs it)", pytrace=False)
        pytest.skip(problem)
    assert node is not None
    return node


def script(tmp_path: Path, name: str) -> Path:
    """``name`` beside a ``node_modules`` link to .npm-tools' (ES modules resolve
    packages from the script's own folder, not from NODE_PATH)."""
    folder = tmp_path / "js"
    folder.mkdir(exist_ok=True)
    link = folder / "node_modules"
    if not link.exists():
        link.symlink_to(MODULES.resolve())
    shutil.copy(SCRIPTS / name, folder / name)
    return folder / name


@contextlib.asynccontextmanager
async def js_server(tmp_path: Path) -> AsyncIterator[tuple[str, list[str]]]:
    """The JS SDK's A2A server on a free port: its URL and the lines it prints."""
    node = require_node()
    proc = await asyncio.create_subprocess_exec(
        node,
        str(script(tmp_path, "server.mjs")),
        env={"PATH": os.environ.get("PATH", ""), "A2A_JS_TOKEN": JS_TOKEN},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(WAIT):
            while True:
                line = (await proc.stdout.readline()).decode()
                if not line:
                    raise AssertionError(f"the JS server exited: {''.join(lines)}")
                lines.append(line)
                if line.startswith("LISTENING "):
                    port = int(line.split()[1])
                    break

        async def pump() -> None:
            assert proc.stdout is not None
            while line := (await proc.stdout.readline()).decode():
                lines.append(line)

        reader = asyncio.create_task(pump())
        yield f"http://127.0.0.1:{port}", lines
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()
        with contextlib.suppress(NameError):
            await reader


def caller(tmp_path: Path, url: str, model: ScriptedModel) -> Agent:
    return Agent(
        llm=model,
        store=SQLiteStore(str(tmp_path / "caller.db")),
        agents={"js": AgentSpec(a2a_url=url, token_env="JS_TOKEN", description="js")},
        uses=("js",),
    )


async def tree_events(sub, run_id: str) -> list:
    events = []
    async with asyncio.timeout(WAIT):
        async for event in sub:
            events.append(event)
            if event.kind == "run_stream_end" and event.run_id == run_id:
                return events
    raise AssertionError(f"the stream ended early: {[e.kind for e in events]}")


async def test_our_agent_calls_a_js_sdk_agent_as_a_tool(tmp_path, monkeypatch):
    monkeypatch.setenv("JS_TOKEN", JS_TOKEN)
    async with js_server(tmp_path) as (url, _):
        main = ScriptedModel()
        main.enqueue(Reply(tool_calls=[call("agent__js", {"task": "ping"}, id="c1")]), "done")
        async with caller(tmp_path, url, main) as agent:
            conv = await agent.create_conversation()
            sub = conv.events()
            run_id = await conv.send("ask js")
            events = await tree_events(sub, run_id)
    (result,) = [e for e in events if e.kind == "tool_call_ended"]
    assert not result.is_error and result.result == "js says: ping"
    (linked,) = [e for e in events if e.kind == "child_run_linked"]
    child = [e.kind for e in events if e.run_id == linked.child_run_id]
    assert child[0] == "turn_started" and child[-2:] == ["turn_ended", "run_stream_end"]
    assert child.count("text_delta") == 2  # the two streamed chunks
    # The model saw the answer as the tool's result.
    assert any("js says: ping" in str(m) for m in main.requests[-1].messages)


async def test_interrupting_our_caller_cancels_the_js_agents_task(tmp_path, monkeypatch):
    monkeypatch.setenv("JS_TOKEN", JS_TOKEN)
    async with js_server(tmp_path) as (url, lines):
        main = ScriptedModel()
        main.enqueue(Reply(tool_calls=[call("agent__js", {"task": "wait for me"}, id="c1")]))
        async with caller(tmp_path, url, main) as agent:
            conv = await agent.create_conversation()
            sub = conv.events()
            run_id = await conv.send("go")
            before = []
            async with asyncio.timeout(WAIT):
                async for event in sub:  # the JS task has started answering
                    before.append(event)
                    if event.kind == "text_delta" and event.run_id != run_id:
                        break
            assert await conv.interrupt()
            events = before + await tree_events(sub, run_id)
        (linked,) = [e for e in events if e.kind == "child_run_linked"]
        assert f"CANCELED {linked.child_run_id}\n" in lines
    child_end = next(
        e for e in events if e.kind == "turn_ended" and e.run_id == linked.child_run_id
    )
    assert child_end.stop_reason == "interrupted" and child_end.text == "js says: "


async def test_a_js_sdk_client_talks_to_our_server(openai_server, tmp_path):
    node = require_node()
    held = WireReply.text("this is long", chunks=3, hold_after=1)
    openai_server.enqueue(WireReply.text("hi js"), WireReply.text("again js", chunks=2), held)
    llm = OpenAIBackend(model="fake-model", base_url=openai_server.base_url, max_retries=0)
    settings = {
        "tokens": [{"name": "js", "env": "ALICE_TOKEN"}],
        "a2a": {"enabled": True, "name": "ours"},
    }
    try:
        async with running_server(
            str(tmp_path / "s.db"),
            model=llm,  # type: ignore[arg-type]
            settings=settings,
            environ=TOKENS,
        ) as server:
            proc = await asyncio.create_subprocess_exec(
                node,
                str(script(tmp_path, "client.mjs")),
                env={
                    "PATH": os.environ.get("PATH", ""),
                    "A2A_URL": server.url,
                    "A2A_TOKEN": TOKENS["ALICE_TOKEN"],
                },
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            async with asyncio.timeout(WAIT * 2):
                out, err = await proc.communicate()
            assert proc.returncode == 0, err.decode()
            report = json.loads(out.decode().strip().splitlines()[-1])
            cid = report["send"]["contextId"]
            said = [m.content for m in await (await server.agent.get_conversation(cid)).messages()]
            cancelled = await server.agent.get_conversation(report["cancel"]["contextId"])
            last = (await cancelled.messages())[-1]
    finally:
        held.release()
    assert report["card"] == {"name": "ours", "skills": ["ours"], "streaming": True}
    assert report["send"]["state"] == "TASK_STATE_COMPLETED"
    assert report["send"]["answer"] == "hi js"
    assert report["streamContext"] == cid  # the same conversation
    assert report["stream"]["streamed"] == "again js"
    assert report["stream"]["last"] == "TASK_STATE_COMPLETED"
    assert "artifactUpdate" in report["stream"]["kinds"]
    assert said == ["hello from js", "hi js", "and again", "again js"]
    assert report["cancelReply"] == "TASK_STATE_CANCELED"
    assert report["cancel"]["got"] == "TASK_STATE_CANCELED"
    assert last.kind == "assistant" and last.status == "interrupted"  # partial answer kept
    assert "TaskNotFound" in report["unknown"] or "not found" in report["unknown"].lower()
