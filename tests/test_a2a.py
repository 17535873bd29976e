"""A2A (agent-to-agent protocol v1.0): our server (``[transports.<name>.a2a]``) and our
client (``[agents.<name>] a2a_url``) against each other.

The served agent answers through the fake OpenAI-compatible server (real ``openai``
client stack), its HTTP transport listens on 127.0.0.1 with a real SQLite file; the
calling agent runs a scripted model and calls it as the tool ``agent__far``. The
hostile-input tests speak JSON-RPC with plain httpx, as any client could.
(tests/test_a2a_js.py puts the JavaScript SDK on either side.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from aiohttp import web

from agentik.core import Agent, OpenAIBackend, SQLiteStore
from agentik.core.agents import AgentSpec
from agentik.core.store.records import A2ATaskRecord
from agentik.core.testing.openai_server import FakeOpenAIServer
from agentik.core.testing.openai_server import Reply as WireReply
from agentik.core.testing.scripted import Reply, ScriptedModel, call
from helpers import rows

from httpserver import TOKENS, Server, running_server
from rigs import eventually

pytest_plugins = ["pgserver"]

WAIT = 60.0
ALICE, CAROL = TOKENS["ALICE_TOKEN"], TOKENS["CAROL_TOKEN"]
A2A = {"enabled": True, "name": "far-bot", "description": "Knows about foo."}
TOKEN_SETTINGS = [
    {"name": "alice", "env": "ALICE_TOKEN", "channels": ["http:web:alice:"]},
    {"name": "carol", "env": "CAROL_TOKEN", "channels": ["http:web:carol:"]},
]


@pytest.fixture
async def served(openai_server, tmp_path) -> AsyncIterator[Server]:
    """An agent served over A2A, answering through the fake OpenAI server."""
    llm = OpenAIBackend(model="fake-model", base_url=openai_server.base_url, max_retries=0)
    async with running_server(
        str(tmp_path / "served.db"),
        model=llm,  # type: ignore[arg-type]  # any LLM backend
        settings={"tokens": TOKEN_SETTINGS, "a2a": A2A},
        environ=TOKENS,
        agents={"helper": AgentSpec(description="Helps with bar.")},
        uses=("helper",),
    ) as server:
        yield server


def caller(tmp_path, url: str, model: ScriptedModel, **spec: Any) -> Agent:
    """An agent whose tool ``agent__far`` is the A2A agent at ``url`` (token: alice's)."""
    return Agent(
        llm=model,
        store=SQLiteStore(str(tmp_path / "caller.db")),
        agents={"far": AgentSpec(a2a_url=url, token_env="FAR_TOKEN", description="far", **spec)},
        uses=("far",),
    )


async def tree_events(sub: Any, run_id: str) -> list[Any]:
    """Events from ``sub`` until run ``run_id``'s stream ends."""
    events = []
    async with asyncio.timeout(WAIT):
        async for event in sub:
            events.append(event)
            if event.kind == "run_stream_end" and event.run_id == run_id:
                return events
    raise AssertionError(f"the stream ended early: {[e.kind for e in events]}")


def a2a_workers(tmp_path: Any, dsn: str, model_url: str) -> Any:
    """Workers ``a`` and ``b`` (real ``agentik run`` processes on one PostgreSQL
    database), each serving the HTTP API with A2A on and alice's token."""
    from cluster import http_transport, worker_config, workers

    tokens = (
        'tokens = [{ name = "alice", env = "ALICE_TOKEN" }]\n[transports.web.a2a]\nenabled = true'
    )

    def config(name: str, port: int) -> str:
        web = http_transport("web", port, tokens)
        return worker_config(name, model_url, dsn_env="AGENTIK_TEST_A2A_DSN", poll=2.0,
                             health=False, extra=web)  # fmt: skip

    return workers(["a", "b"], tmp_path, dsn, config, dsn_env="AGENTIK_TEST_A2A_DSN",
                   env={"ALICE_TOKEN": ALICE}, ready="/ready")  # fmt: skip


@contextlib.asynccontextmanager
async def a2a_clients(a: Any, b: Any) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    """Alice's clients of workers ``a`` and ``b``, speaking A2A 1.0."""
    async with a.client(ALICE) as on_a, b.client(ALICE) as on_b:
        for http in (on_a, on_b):
            http.headers["A2A-Version"] = "1.0"
        yield on_a, on_b


def rpc(method: str, params: dict[str, Any], *, rid: Any = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}


def send_params(text: str, context_id: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {
        "messageId": uuid.uuid4().hex,
        "role": "ROLE_USER",
        "parts": [{"text": text}],
    }
    if context_id is not None:
        message["contextId"] = context_id
    return {"message": message}


def client(server: Server, token: str | None = ALICE) -> httpx.AsyncClient:
    headers = {"A2A-Version": "1.0"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.AsyncClient(base_url=server.url, headers=headers, timeout=WAIT)


async def test_our_agent_calls_our_served_agent_as_a_tool_and_its_task_nests_in_the_run_tree(
    served, openai_server, tmp_path, monkeypatch
):
    monkeypatch.setenv("FAR_TOKEN", ALICE)
    openai_server.enqueue(WireReply.text("foo is 42", chunks=3, usage=(7, 5)))
    main = ScriptedModel()
    main.enqueue(Reply(tool_calls=[call("agent__far", {"task": "what is foo?"}, id="c1")]), "42")
    async with caller(tmp_path, served.url, main) as agent:
        conv = await agent.create_conversation()
        sub = conv.events()
        run_id = await conv.send("ask far")
        events = await tree_events(sub, run_id)
    (linked,) = [e for e in events if e.kind == "child_run_linked"]
    assert linked.run_id == run_id and linked.agent == "far" and linked.call_id == "c1"
    child = [e for e in events if e.run_id == linked.child_run_id]
    kinds = [e.kind for e in child]
    assert kinds[0] == "turn_started" and kinds[-2:] == ["turn_ended", "run_stream_end"]
    assert all(e.parent_run_id == run_id for e in child)
    assert "".join(e.text for e in child if e.kind == "text_delta") == "foo is 42"
    assert child[-2].usage.total_tokens == 12  # reported by the served agent
    (result,) = [e for e in events if e.kind == "tool_call_ended"]
    assert not result.is_error and result.result == "foo is 42"
    # The served side: the task's context is a conversation of alice's token, in its store.
    served_conv = await served.agent.get_conversation(linked.child_conversation_id)
    assert served_conv.channel_key.startswith("http:web:alice:")
    said = [(m.kind, m.content) for m in await served_conv.messages()]
    assert ("user", "what is foo?") in said and ("assistant", "foo is 42") in said


async def test_the_card_names_the_agent_its_agents_its_endpoint_and_the_bearer_scheme(served):
    async with httpx.AsyncClient(base_url=served.url, timeout=WAIT) as http:
        r = await http.get("/.well-known/agent-card.json")  # no token: the card is public
    assert r.status_code == 200
    card = r.json()
    assert card["name"] == "far-bot" and card["description"] == "Knows about foo."
    (interface,) = card["supportedInterfaces"]
    assert interface == {
        "url": served.url + "/agentik/a2a",
        "protocolBinding": "JSONRPC",
        "protocolVersion": "1.0",
    }
    assert card["capabilities"]["streaming"] is True
    assert not card["capabilities"].get("pushNotifications")
    assert {s["name"]: s["description"] for s in card["skills"]}["helper"] == "Helps with bar."
    assert card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == "Bearer"


async def test_a_private_card_and_every_call_need_a_token(openai_server, tmp_path):
    async with running_server(
        str(tmp_path / "s.db"),
        settings={"tokens": TOKEN_SETTINGS, "a2a": {**A2A, "public_card": False}},
        environ=TOKENS,
    ) as server:
        async with client(server, token=None) as http:
            card = await http.get("/.well-known/agent-card.json")
            call_ = await http.post("/agentik/a2a", json=rpc("SendMessage", send_params("hi")))
        async with client(server, token="wrong-0123456789abcdef") as http:
            wrong = await http.post("/agentik/a2a", json=rpc("GetTask", {"id": "x"}))
        assert card.status_code == 401
        assert call_.status_code == 401 and "bearer token" in call_.json()["error"]["message"]
        assert wrong.status_code == 401
        assert await server.agent.store.list_conversations() == []  # nothing was started


async def test_a2a_is_off_unless_enabled(tmp_path):
    async with running_server(str(tmp_path / "s.db")) as server:
        async with client(server, token=None) as http:
            assert (await http.get("/.well-known/agent-card.json")).status_code == 404
            r = await http.post("/agentik/a2a", json=rpc("SendMessage", send_params("hi")))
            assert r.status_code in (404, 405)


async def test_hostile_requests_get_clear_errors_and_lose_nothing(served, openai_server):
    openai_server.enqueue(WireReply.text("first answer"))
    async with client(served) as http:
        # A real task first: its conversation must come through what follows untouched.
        r = await http.post("/agentik/a2a", json=rpc("SendMessage", send_params("hello")))
        task = r.json()["result"]["task"]
        cid = task["contextId"]
        assert task["status"]["state"] == "TASK_STATE_COMPLETED"

        huge = send_params("x" * 2_000_000)
        r = await http.post("/agentik/a2a", json=rpc("SendMessage", huge))
        assert r.status_code == 413 and "larger than" in r.json()["error"]["message"]

        r = await http.post(
            "/agentik/a2a", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert r.json()["error"]["code"] == -32700

        r = await http.post("/agentik/a2a", json={"jsonrpc": "2.0", "id": 2, "method": 5})
        assert r.json()["error"]["code"] in (-32600, -32601)
        r = await http.post("/agentik/a2a", json=rpc("tasks/explode", {}))
        assert r.json()["error"]["code"] == -32601

        r = await http.post("/agentik/a2a", json=rpc("GetTask", {"id": "no-such-task"}))
        assert r.json()["error"]["code"] == -32001  # TaskNotFound
        r = await http.post("/agentik/a2a", json=rpc("CancelTask", {"id": "no-such-task"}))
        assert r.json()["error"]["code"] == -32001

        for bad in ("../../etc/passwd", "x" * 500, "\x1b[31mred", "0" * 32):
            r = await http.post("/agentik/a2a", json=rpc("SendMessage", send_params("hi", bad)))
            error = r.json()["error"]
            assert error["code"] == -32602 and "unknown contextId" in error["message"]
            assert "\x1b" not in error["message"] or "\\x1b" in error["message"]

    # Another token may neither continue alice's conversation nor read her task.
    async with client(served, token=CAROL) as http:
        r = await http.post("/agentik/a2a", json=rpc("SendMessage", send_params("hi", cid)))
        assert r.json()["error"]["code"] == -32602
        r = await http.post("/agentik/a2a", json=rpc("GetTask", {"id": task["id"]}))
        assert r.json()["error"]["code"] == -32001

    conv = await served.agent.get_conversation(cid)
    said = [(m.kind, m.content) for m in await conv.messages()]
    assert said == [("user", "hello"), ("assistant", "first answer")]
    assert len(await served.agent.store.list_conversations()) == 1


async def test_a_message_with_a_context_id_continues_that_conversation(served, openai_server):
    openai_server.enqueue(WireReply.text("one"), WireReply.text("two"))
    async with client(served) as http:
        r = await http.post("/agentik/a2a", json=rpc("SendMessage", send_params("first")))
        cid = r.json()["result"]["task"]["contextId"]
        r = await http.post("/agentik/a2a", json=rpc("SendMessage", send_params("second", cid)))
        second = r.json()["result"]["task"]
        r = await http.post("/agentik/a2a", json=rpc("GetTask", {"id": second["id"]}))
        got = r.json()["result"]
    assert second["contextId"] == cid and got["status"]["state"] == "TASK_STATE_COMPLETED"
    assert "".join(p["text"] for p in got["artifacts"][0]["parts"]) == "two"
    conv = await served.agent.get_conversation(cid)
    said = [m.content for m in await conv.messages()]
    assert said == ["first", "one", "second", "two"]


async def test_interrupting_the_caller_cancels_the_remote_task_and_stops_its_turn(
    served, openai_server, tmp_path, monkeypatch
):
    monkeypatch.setenv("FAR_TOKEN", ALICE)
    held = WireReply.text("never finished", chunks=3, hold_after=1)
    openai_server.enqueue(held)
    main = ScriptedModel()
    main.enqueue(Reply(tool_calls=[call("agent__far", {"task": "think long"}, id="c1")]))
    try:
        async with caller(tmp_path, served.url, main) as agent:
            conv = await agent.create_conversation()
            sub = conv.events()
            watch = conv.events()
            run_id = await conv.send("go")
            await held.wait_held(WAIT)
            # The remote turn's first words came back (its request goes out before its
            # message is stored: only then is it mid-answer).
            async with asyncio.timeout(WAIT):
                async for e in watch:
                    if e.kind == "text_delta" and e.run_id != run_id:
                        break
            assert await conv.interrupt()
            events = await tree_events(sub, run_id)
    finally:
        held.release()
    (linked,) = [e for e in events if e.kind == "child_run_linked"]
    child_end = next(
        e for e in events if e.kind == "turn_ended" and e.run_id == linked.child_run_id
    )
    assert child_end.stop_reason == "interrupted"
    # The served turn was interrupted, its partial answer kept.
    served_conv = await served.agent.get_conversation(linked.child_conversation_id)
    async with asyncio.timeout(WAIT):
        await served_conv.wait_idle()
    last = (await served_conv.messages())[-1]
    assert last.kind == "assistant" and last.content.startswith("never")
    assert last.status == "interrupted"
    async with client(served) as http:
        r = await http.post("/agentik/a2a", json=rpc("GetTask", {"id": linked.child_run_id}))
    assert r.json()["result"]["status"]["state"] == "TASK_STATE_CANCELED"


async def test_the_served_agents_usage_counts_for_the_callers_budget(
    served, openai_server, tmp_path, monkeypatch
):
    monkeypatch.setenv("FAR_TOKEN", ALICE)
    openai_server.enqueue(WireReply.text("expensive", usage=(400, 200)))
    main = ScriptedModel()
    main.enqueue(Reply(tool_calls=[call("agent__far", {"task": "spend"}, id="c1")]), "unused")
    async with caller(tmp_path, served.url, main, token_budget=100) as agent:
        conv = await agent.create_conversation()
        sub = conv.events()
        run_id = await conv.send("go")
        events = await tree_events(sub, run_id)
    (result,) = [e for e in events if e.kind == "tool_call_ended"]
    assert result.is_error and "ran out of its token budget" in result.result


async def _dropping_server(cards: dict[str, Any]) -> tuple[web.AppRunner, str]:
    """An A2A server (the real wire format) that sends a task and one chunk of its
    answer on the stream, then drops the connection."""

    async def card(request: web.Request) -> web.Response:
        return web.json_response(cards["card"])

    async def rpc_(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        ids = {"taskId": "t-1", "contextId": "c-1"}
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        task = {"id": "t-1", "contextId": "c-1", "status": {"state": "TASK_STATE_WORKING"}}
        chunk = {
            **ids,
            "artifact": {"artifactId": "a", "parts": [{"text": "half an ans"}]},
        }
        for result in ({"task": task}, {"artifactUpdate": chunk}):
            data = json.dumps({"jsonrpc": "2.0", "id": body["id"], "result": result})
            await response.write(f"data: {data}\n\n".encode())
        assert request.transport is not None
        request.transport.abort()  # mid-stream
        return response

    app = web.Application()
    app.router.add_get("/.well-known/agent-card.json", card)
    app.router.add_post("/rpc", rpc_)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    url = f"http://127.0.0.1:{port}"
    cards["card"] = {
        "name": "dropper",
        "description": "drops",
        "version": "1",
        "supportedInterfaces": [
            {"url": url + "/rpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
        ],
        "capabilities": {"streaming": True},
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain"],
        "skills": [],
    }
    return runner, url


async def test_a_remote_that_drops_mid_stream_is_a_tool_error_and_the_turn_goes_on(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("FAR_TOKEN", ALICE)
    runner, url = await _dropping_server({})
    main = ScriptedModel()
    main.enqueue(Reply(tool_calls=[call("agent__far", {"task": "work"}, id="c1")]), "carried on")
    try:
        async with caller(tmp_path, url, main) as agent:
            conv = await agent.create_conversation()
            sub = conv.events()
            run_id = await conv.send("go")
            events = await tree_events(sub, run_id)
    finally:
        await runner.cleanup()
    (result,) = [e for e in events if e.kind == "tool_call_ended"]
    assert result.is_error and "agent far" in result.result
    assert "half an ans" in result.result  # the partial answer is not lost
    ended = next(e for e in events if e.kind == "turn_ended" and e.run_id == run_id)
    assert ended.text == "carried on"


async def test_an_unreachable_a2a_agent_is_a_tool_error(tmp_path, monkeypatch):
    monkeypatch.setenv("FAR_TOKEN", ALICE)
    main = ScriptedModel()
    main.enqueue(Reply(tool_calls=[call("agent__far", {"task": "hi"}, id="c1")]), "alone")
    async with caller(tmp_path, "http://127.0.0.1:9", main) as agent:
        conv = await agent.create_conversation()
        sub = conv.events()
        run_id = await conv.send("go")
        events = await tree_events(sub, run_id)
    (result,) = [e for e in events if e.kind == "tool_call_ended"]
    assert result.is_error and "agent far could not be reached" in result.result
    assert ALICE not in result.result


def test_url_and_a2a_url_together_are_a_clear_error(tmp_path):
    from agentik.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"agents\.far: give url .* or a2a_url"):
        Agent(
            llm=ScriptedModel(),
            store=SQLiteStore(str(tmp_path / "a.db")),
            agents={"far": AgentSpec(url="http://a", a2a_url="http://b")},
            uses=("far",),
        )


_ = FakeOpenAIServer  # the served agent's model server (conftest's openai_server)


async def test_a_client_that_drops_mid_stream_loses_nothing(served, openai_server):
    """The stream's reader goes away mid-answer: the turn still ends, its answer is
    recorded, and tasks/get has the whole task."""
    held = WireReply.text("all of the answer", chunks=4, hold_after=1)
    openai_server.enqueue(held)
    try:
        async with client(served) as http:
            request = rpc("SendStreamingMessage", send_params("stream please"))
            async with http.stream("POST", "/agentik/a2a", json=request) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data:") and "artifactUpdate" in line:
                        task_id = json.loads(line[5:])["result"]["artifactUpdate"]["taskId"]
                        break  # and the connection is closed mid-answer
            held.release()
            async with asyncio.timeout(WAIT):
                while True:
                    r = await http.post("/agentik/a2a", json=rpc("GetTask", {"id": task_id}))
                    task = r.json()["result"]
                    if task["status"]["state"] == "TASK_STATE_COMPLETED":
                        break
                    await (await served.agent.get_conversation(task["contextId"])).wait_idle()
    finally:
        held.release()
    assert "".join(p["text"] for p in task["artifacts"][0]["parts"]) == "all of the answer"
    conv = await served.agent.get_conversation(task["contextId"])
    said = [(m.kind, m.content) for m in await conv.messages()]
    assert said == [("user", "stream please"), ("assistant", "all of the answer")]


def at_once(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` of a SendMessage that returns the task at once (not when it ends)."""
    return {**params, "configuration": {"returnImmediately": True}}


async def test_cancelling_a_task_that_waits_its_turn_withdraws_it(served, openai_server):
    held = WireReply.text("first answer", chunks=3, hold_after=1)
    openai_server.enqueue(held, WireReply.text("third answer"))
    try:
        async with client(served) as http:
            r = await http.post(
                "/agentik/a2a", json=rpc("SendMessage", at_once(send_params("one")))
            )
            one = r.json()["result"]["task"]
            cid = one["contextId"]
            await held.wait_held(WAIT)
            tasks = []
            for text in ("two", "three"):
                params = at_once(send_params(text, cid))
                tasks.append((await http.post("/agentik/a2a", json=rpc("SendMessage", params)))
                             .json()["result"]["task"])  # fmt: skip
            two, three = tasks
            conv = await served.agent.get_conversation(cid)
            await eventually(lambda: conv.queued == 2, "both accepted, waiting behind one")
            r = await http.post("/agentik/a2a", json=rpc("CancelTask", {"id": two["id"]}))
            assert r.json()["result"]["status"]["state"] == "TASK_STATE_CANCELED"
            held.release()
            states = {}
            async with asyncio.timeout(WAIT):
                while set(states.values()) - {"TASK_STATE_CANCELED", "TASK_STATE_COMPLETED"} or (
                    len(states) < 3
                ):
                    await conv.wait_idle()
                    for t in (one, two, three):
                        r = await http.post("/agentik/a2a", json=rpc("GetTask", {"id": t["id"]}))
                        states[t["id"]] = r.json()["result"]["status"]["state"]
    finally:
        held.release()
    assert [states[t["id"]] for t in (one, two, three)] == [
        "TASK_STATE_COMPLETED", "TASK_STATE_CANCELED", "TASK_STATE_COMPLETED",
    ]  # fmt: skip
    # "two" never ran: the model was asked twice, never with it; its turn ended cancelled.
    assert len(openai_server.requests) == 2
    asked = [m["content"] for m in openai_server.requests[-1]["messages"] if m["role"] == "user"]
    assert "two" not in str(asked) and "three" in str(asked)
    record = await served.agent.store.a2a_task_get("alice", two["id"])
    assert record.run_id is not None and record.answer is None
    assert await served.agent.store.turn_ended(cid, record.run_id)
    said = [(m.kind, m.content) for m in await conv.messages()]
    assert said == [("user", "one"), ("user", "two"), ("user", "three"),
                    ("assistant", "first answer"), ("assistant", "third answer")]  # fmt: skip


async def test_tasks_outlive_a_restart(openai_server, tmp_path):
    """tasks/get and tasks/list answer from the store after a restart: the task as it
    ended, its question and answer read back from the conversation's audit log."""
    openai_server.enqueue(WireReply.text("foo is 42"), WireReply.text("bar is 7"))
    db = str(tmp_path / "served.db")
    settings = {"tokens": TOKEN_SETTINGS, "a2a": A2A}
    llm = OpenAIBackend(model="fake-model", base_url=openai_server.base_url, max_retries=0)
    async with running_server(db, model=llm, settings=settings, environ=TOKENS) as server:  # type: ignore[arg-type]
        async with client(server) as http:
            r = await http.post("/agentik/a2a", json=rpc("SendMessage", send_params("foo?")))
            first = r.json()["result"]["task"]
            params = send_params("bar?", first["contextId"])
            r = await http.post("/agentik/a2a", json=rpc("SendMessage", params))
            second = r.json()["result"]["task"]
    llm = OpenAIBackend(model="fake-model", base_url=openai_server.base_url, max_retries=0)
    async with running_server(db, model=llm, settings=settings, environ=TOKENS) as server:  # type: ignore[arg-type]
        async with client(server) as http:
            r = await http.post("/agentik/a2a", json=rpc("GetTask", {"id": first["id"]}))
            got = r.json()["result"]
            r = await http.post(
                "/agentik/a2a", json=rpc("ListTasks", {"contextId": first["contextId"],
                                                       "includeArtifacts": True})
            )  # fmt: skip
            listed = r.json()["result"]
            r = await http.post("/agentik/a2a", json=rpc("CancelTask", {"id": first["id"]}))
            not_cancelable = r.json()["error"]["code"]
            r = await http.post("/agentik/a2a", json=rpc("ListTasks", {"pageSize": 1}))
            page1 = r.json()["result"]
            params = {"pageSize": 1, "pageToken": page1["nextPageToken"]}
            page2 = (await http.post("/agentik/a2a", json=rpc("ListTasks", params))).json()
            params = {"pageToken": "not a token"}
            bad = (await http.post("/agentik/a2a", json=rpc("ListTasks", params))).json()
        async with client(server, token=CAROL) as http:
            r = await http.post("/agentik/a2a", json=rpc("GetTask", {"id": first["id"]}))
            assert r.json()["error"]["code"] == -32001  # still alice's only
    assert got["status"]["state"] == "TASK_STATE_COMPLETED"
    assert got["status"]["message"]["parts"] == [{"text": "foo is 42"}]
    assert got["status"]["message"] == {**first["status"]["message"]}
    assert got["artifacts"] == first["artifacts"]
    assert [p["text"] for m in got["history"] for p in m["parts"]] == ["foo?"]
    assert got["metadata"]["agentik"]["usage"] == first["metadata"]["agentik"]["usage"]
    assert [t["id"] for t in listed["tasks"]] == [second["id"], first["id"]]
    assert listed["totalSize"] == 2
    assert "".join(p["text"] for p in listed["tasks"][0]["artifacts"][0]["parts"]) == "bar is 7"
    assert not_cancelable == -32002  # TaskNotCancelable: it is over
    assert [t["id"] for t in page1["tasks"]] == [second["id"]]
    assert [t["id"] for t in page2["result"]["tasks"]] == [first["id"]]
    assert not page2["result"].get("nextPageToken")
    assert bad["error"]["code"] == -32602 and "pageToken" in bad["error"]["message"]


async def test_a_task_run_on_one_worker_is_read_through_another(openai_server, postgres_dsn):
    """Two workers (each its store, its HTTP server) on one PostgreSQL database: a task
    run on A is seen through B while it runs (its status) and once it ended (its
    answer, read from the audit log A wrote)."""
    from agentik.core.store.postgres import PostgresStore

    held = WireReply.text("answered on A", chunks=3, hold_after=1)
    openai_server.enqueue(held)
    settings = {"tokens": TOKEN_SETTINGS, "a2a": A2A}

    def llm() -> Any:
        return OpenAIBackend(model="fake-model", base_url=openai_server.base_url, max_retries=0)

    def get(task_id: str) -> dict[str, Any]:
        return rpc("GetTask", {"id": task_id})

    try:
        async with (
            running_server("", store=PostgresStore(postgres_dsn), model=llm(),
                           settings=settings, environ=TOKENS) as a,
            running_server("", store=PostgresStore(postgres_dsn), model=llm(),
                           settings=settings, environ=TOKENS) as b,
            client(a) as on_a,
            client(b) as on_b,
        ):  # fmt: skip
            r = await on_a.post("/agentik/a2a", json=rpc("SendMessage", at_once(send_params("q?"))))
            task = r.json()["result"]["task"]
            await held.wait_held(WAIT)

            async def state_on_b() -> str:
                return str((await on_b.post("/agentik/a2a", json=get(task["id"]))).json()
                           ["result"]["status"]["state"])  # fmt: skip

            await eventually(
                lambda: _is(state_on_b(), "TASK_STATE_WORKING"), "working, seen through B"
            )
            held.release()
            await eventually(
                lambda: _is(state_on_b(), "TASK_STATE_COMPLETED"), "completed, seen through B"
            )
            got = (await on_b.post("/agentik/a2a", json=get(task["id"]))).json()["result"]
            r = await on_b.post("/agentik/a2a", json=rpc("ListTasks", {"includeArtifacts": True}))
            listed = r.json()["result"]
            r = await on_b.post("/agentik/a2a", json=rpc("CancelTask", {"id": task["id"]}))
            over = r.json()["error"]["code"]
            async with client(b, token=CAROL) as other:
                r = await other.post("/agentik/a2a", json=get(task["id"]))
                hidden = r.json()["error"]["code"]
    finally:
        held.release()
    assert "".join(p["text"] for p in got["artifacts"][0]["parts"]) == "answered on A"
    assert [p["text"] for m in got["history"] for p in m["parts"]] == ["q?"]
    assert [t["id"] for t in listed["tasks"]] == [task["id"]]
    assert over == -32002 and hidden == -32001


async def _is(value: Any, wanted: Any) -> bool:
    return bool(await value == wanted)


@pytest.mark.timeout(400)  # two `agentik run` workers, on a loaded machine
@pytest.mark.parametrize("written", [20, 0], ids=["mid-answer", "before-the-first-word"])
async def test_a_cancel_through_another_worker_stops_the_turn_and_the_task_ends_canceled(
    postgres_dsn, openai_server, tmp_path, written
):
    """Two real ``agentik run`` workers on one PostgreSQL database: a task sent to A
    (whose turn runs there), canceled through B (which runs nothing), stops the turn
    on A — its partial answer kept, marked interrupted (none when the model had written
    nothing yet: the question stays unanswered) — and reads ``canceled`` on both
    workers; a second cancel is refused as the task is over.  The model holds its
    answer after ``written`` pieces until the end, so the cancel comes mid-answer (or
    before its first word) whatever the machine's speed."""
    from cluster import until

    words = [f"w{i}" for i in range(300)]
    held = WireReply.text(" ".join(words), chunks=300, hold_after=written)
    openai_server.enqueue(held)
    async with a2a_workers(tmp_path, postgres_dsn, openai_server.base_url) as (a, b):
        async with a2a_clients(a, b) as (on_a, on_b):
            r = await on_a.post("/a2a", json=rpc("SendMessage", at_once(send_params("count"))))
            task = r.json()["result"]["task"]
            cid = task["contextId"]

            async def state(http: httpx.AsyncClient) -> str:
                got = (await http.post("/a2a", json=rpc("GetTask", {"id": task["id"]}))).json()
                return str(got["result"]["status"]["state"])

            async def status() -> str:
                return str((await on_b.get(f"/conversations/{cid}/status")).json().get("state"))

            async def answering() -> bool:
                return await status() == "running" and await state(on_b) == "TASK_STATE_WORKING"

            try:
                await held.wait_held()
                await until(answering, "the turn running on A, seen through B")
                r = await on_b.post("/a2a", json=rpc("CancelTask", {"id": task["id"]}))
                assert r.json()["result"]["status"]["state"] == "TASK_STATE_CANCELED", r.text

                async def stopped() -> bool:
                    return await status() == "idle"

                await until(stopped, "the turn on A stopped")
            finally:
                held.release()
            items = (await on_b.get(f"/conversations/{cid}/messages")).json()["items"]
            answers = [m for m in items if m["kind"] == "assistant"]
            if written:
                [answer] = answers
                assert answer["status"] == "interrupted"
                # What the model had written when it was held: a start of the answer.
                assert 0 < len(answer["content"]) < len(" ".join(words))
                assert " ".join(words).startswith(answer["content"])
            else:
                assert answers == []

            async def canceled_on_both() -> bool:
                return {await state(on_a), await state(on_b)} == {"TASK_STATE_CANCELED"}

            await until(canceled_on_both, "canceled, read through A and through B")
            r = await on_a.post("/a2a", json=rpc("CancelTask", {"id": task["id"]}))
            assert r.json()["error"]["code"] == -32002  # TaskNotCancelable: it is over


async def test_a_snapshot_carries_the_task_records_as_history_that_grants_nothing(
    served, openai_server, tmp_path
):
    """Export → import into another SQLite file: the conversation's task records come
    along, read with their text from the imported audit log, under the owner
    ``imported:<token>`` (no token is named so: tasks/get there finds nothing), a task
    not over closed; a hostile record is refused naming its field, nothing written."""
    from agentik.core.lifecycle import (
        MAX_A2A_TASK_BYTES,
        SnapshotError,
        export_conversation,
        import_conversation,
    )

    openai_server.enqueue(WireReply.text("foo is 42"))
    async with client(served) as http:
        r = await http.post("/agentik/a2a", json=rpc("SendMessage", send_params("foo?")))
        done = r.json()["result"]["task"]
    cid = done["contextId"]
    # A task still open when the snapshot is taken (its worker died, say).
    record = await served.agent.store.a2a_task_get("alice", done["id"])
    body = json.loads(record.body)
    body["id"], body["status"]["state"] = "open-1", "TASK_STATE_WORKING"
    await served.agent.store.a2a_task_put(A2ATaskRecord(
        owner="carol", task_id="open-1", conversation_id=cid, state="TASK_STATE_WORKING",
        updated_at=record.updated_at + 1, body=json.dumps(body), run_id="r-none",
    ))  # fmt: skip
    doc = await export_conversation(served.agent.store, cid)
    assert [(t["owner"], t["task_id"], t["final"]) for t in doc["a2a_tasks"]] == [
        ("alice", done["id"], True), ("carol", "open-1", False),
    ]  # fmt: skip
    other = str(tmp_path / "other.db")
    async with SQLiteStore(other) as store:
        result = await import_conversation(store, json.loads(json.dumps(doc)), new_ids=True)
        assert await store.a2a_tasks("alice") == []  # the token's name grants nothing
        kept = await store.a2a_task_get("imported:alice", done["id"])
        assert kept.conversation_id == result.conversation_id and kept.final
        assert (kept.state, kept.question, kept.answer) == (
            "TASK_STATE_COMPLETED", "foo?", "foo is 42",
        )  # fmt: skip
        closed = await store.a2a_task_get("imported:carol", "open-1")
        assert (closed.state, closed.final) == ("TASK_STATE_FAILED", True)
        assert json.loads(closed.body)["status"]["state"] == "TASK_STATE_FAILED"
        # Exported again, imported again: the records stay imported once, not twice.
        again = await export_conversation(store, result.conversation_id)
        assert {t["owner"] for t in again["a2a_tasks"]} == {"imported:alice", "imported:carol"}
        second = await import_conversation(store, again, new_ids=True)
        assert await store.a2a_conversation_tasks(second.conversation_id) == []

        def hostile(**change: Any) -> dict[str, Any]:
            bad = json.loads(json.dumps(doc))
            bad["a2a_tasks"][0].update(change)
            return bad

        cases = [
            (hostile(body="{}"), "a2a_tasks[0].body: expected object, got str"),
            (hostile(body=[1]), "a2a_tasks[0].body: expected object, got list"),
            (hostile(body={"x": "y" * MAX_A2A_TASK_BYTES}),
             "a2a_tasks[0].body: larger than 1,048,576 bytes"),
            (hostile(owner="a" * 201), "a2a_tasks[0].owner: 1 to 200 characters, no control"),
            (hostile(task_id="bad\x1b[31m"), "a2a_tasks[0].task_id: 1 to 200 characters, no"),
            (hostile(final="yes"), "a2a_tasks[0].final: expected boolean"),
            (hostile(updated_at=None), "a2a_tasks[0].updated_at: expected"),
            ({**doc, "a2a_tasks": "all"}, "a2a_tasks: expected array, got str"),
        ]  # fmt: skip
        count = rows(other, "SELECT COUNT(*) FROM conversation")
        for bad, message in cases:
            with pytest.raises(SnapshotError) as caught:
                await import_conversation(store, bad, new_ids=True)
            assert str(caught.value).startswith(message), str(caught.value)[:200]
        assert rows(other, "SELECT COUNT(*) FROM conversation") == count


@pytest.mark.timeout(400)  # two `agentik run` workers, on a loaded machine
async def test_a_task_sent_through_the_worker_that_does_not_run_its_conversation_ends(
    postgres_dsn, openai_server, tmp_path
):
    """Two real workers on one PostgreSQL database: while A runs a turn of a context, a
    second message of that context sent through B (queued: A runs the conversation's
    turns) is answered on A — and B's SendMessage, which waits for the task's end,
    returns it completed with its answer (B follows the turn A runs)."""
    from cluster import until

    def reply(body: dict[str, Any]) -> WireReply:
        asked = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
        if "first" in str(asked):
            return WireReply.text(" ".join(f"w{i}" for i in range(40)), chunks=40, delay=0.1)
        return WireReply.text("the second answer")

    openai_server.default = reply
    async with a2a_workers(tmp_path, postgres_dsn, openai_server.base_url) as (a, b):
        async with a2a_clients(a, b) as (on_a, on_b):
            r = await on_a.post("/a2a", json=rpc("SendMessage", at_once(send_params("first"))))
            cid = r.json()["result"]["task"]["contextId"]

            async def running() -> bool:
                got = (await on_b.get(f"/conversations/{cid}/status")).json()
                return bool(got.get("state") == "running")

            await until(running, "the first turn running on A")
            r = await on_b.post(
                "/a2a", json=rpc("SendMessage", send_params("second", cid)), timeout=WAIT
            )
            task = r.json()["result"]["task"]
            assert task["status"]["state"] == "TASK_STATE_COMPLETED", r.text
            [artifact] = task["artifacts"]
            assert "".join(p["text"] for p in artifact["parts"]) == "the second answer"


@pytest.mark.timeout(400)  # two `agentik run` workers, on a loaded machine
async def test_a_cancel_withdraws_a_task_queued_behind_a_turn_another_worker_runs(
    postgres_dsn, openai_server, tmp_path
):
    """Two real workers on one PostgreSQL database: A runs a context's turn; two more
    messages of it come through B (queued: A runs its turns); the first of them is
    canceled through B before it starts.  It never runs (the model is never asked it;
    its turn's end is recorded ``cancelled``), the one after it is answered, and the
    three tasks read completed, canceled, completed on both workers."""
    from cluster import until

    def reply(body: dict[str, Any]) -> WireReply:
        asked = str([m for m in body["messages"] if m["role"] == "user"][-1]["content"])
        if "first" in asked:
            return WireReply.text(" ".join(f"w{i}" for i in range(60)), chunks=60, delay=0.1)
        return WireReply.text(f"answer to {asked.split()[-1]}")

    openai_server.default = reply
    async with a2a_workers(tmp_path, postgres_dsn, openai_server.base_url) as (a, b):
        async with a2a_clients(a, b) as (on_a, on_b):
            r = await on_a.post("/a2a", json=rpc("SendMessage", at_once(send_params("first"))))
            first = r.json()["result"]["task"]
            cid = first["contextId"]

            async def running() -> bool:
                got = (await on_b.get(f"/conversations/{cid}/status")).json()
                return bool(got.get("state") == "running")

            await until(running, "the first turn running on A")
            tasks = []
            for text in ("the second", "the third"):
                r = await on_b.post(
                    "/a2a", json=rpc("SendMessage", at_once(send_params(text, cid)))
                )
                tasks.append(r.json()["result"]["task"])
            second, third = tasks
            r = await on_b.post("/a2a", json=rpc("CancelTask", {"id": second["id"]}))
            assert r.json()["result"]["status"]["state"] == "TASK_STATE_CANCELED", r.text

            async def states(http: httpx.AsyncClient) -> list[str]:
                out = []
                for t in (first, second, third):
                    got = (await http.post("/a2a", json=rpc("GetTask", {"id": t["id"]}))).json()
                    out.append(str(got["result"]["status"]["state"]))
                return out

            done = ["TASK_STATE_COMPLETED", "TASK_STATE_CANCELED", "TASK_STATE_COMPLETED"]

            async def all_over() -> bool:
                return await states(on_a) == done and await states(on_b) == done

            await until(all_over, "first and third completed, second canceled, on both")
            items = (await on_b.get(f"/conversations/{cid}/messages")).json()["items"]
            answers = [m["content"] for m in items if m["kind"] == "assistant"]
            assert answers[-1] == "answer to third" and len(answers) == 2, answers
    asked = [
        str([m for m in body["messages"] if m["role"] == "user"][-1]["content"])
        for body in openai_server.requests
    ]
    assert not any("second" in q for q in asked), asked


@pytest.mark.timeout(400)  # two `agentik run` workers, on a loaded machine
async def test_a_cancel_of_a_task_queued_behind_another_turn_on_another_worker_sticks(
    postgres_dsn, openai_server, tmp_path
):
    """Two real ``agentik run`` workers on one PostgreSQL database.  Task 1's turn runs on
    A (its answer held); tasks 2 and 3, sent to B into the same conversation, wait in
    the shared turn queue behind it, their turns started nowhere.  Task 2 is canceled
    through B (which accepted it), task 3 through A (which did not, and may not know its
    run yet): neither ever runs — the model is never asked them, no answer is stored
    for them, their turns end ``cancelled`` — and both read ``canceled`` on both
    workers, while task 4, sent after, is answered."""
    import asyncpg
    from cluster import last_user, until

    held = WireReply.text("first answer", chunks=3, hold_after=1)
    openai_server.enqueue(held)
    try:
        async with a2a_workers(tmp_path, postgres_dsn, openai_server.base_url) as (a, b):
            async with a2a_clients(a, b) as (on_a, on_b):

                async def send(http: httpx.AsyncClient, text: str, cid: str | None) -> Any:
                    params = at_once(send_params(text, cid))
                    r = await http.post("/a2a", json=rpc("SendMessage", params))
                    return r.json()["result"]["task"]

                async def state(http: httpx.AsyncClient, task_id: str) -> str:
                    got = (await http.post("/a2a", json=rpc("GetTask", {"id": task_id}))).json()
                    return str(got["result"]["status"]["state"])

                first = await send(on_a, "first", None)
                cid = first["contextId"]
                await held.wait_held(WAIT)
                second = await send(on_b, "second", cid)
                third = await send(on_b, "third", cid)

                async def queued() -> bool:
                    items = (await on_a.get(f"/conversations/{cid}/messages")).json()["items"]
                    return [m["content"] for m in items if m["kind"] == "user"] == [
                        "first", "second", "third",
                    ]  # fmt: skip

                await until(queued, "tasks 2 and 3 queued behind task 1")
                for http, task in ((on_b, second), (on_a, third)):
                    r = await http.post("/a2a", json=rpc("CancelTask", {"id": task["id"]}))
                    assert r.json()["result"]["status"]["state"] == "TASK_STATE_CANCELED", r.text
                held.release()
                fourth = await send(on_a, "fourth", cid)

                async def answered() -> bool:
                    return await state(on_a, fourth["id"]) == "TASK_STATE_COMPLETED"

                await until(answered, "task 4 answered, after the queue's turns 2 and 3")
                items = (await on_b.get(f"/conversations/{cid}/messages")).json()["items"]
                for task in (second, third):
                    assert {await state(on_a, task["id"]), await state(on_b, task["id"])} == {
                        "TASK_STATE_CANCELED"
                    }
                assert await state(on_b, first["id"]) == "TASK_STATE_COMPLETED"
    finally:
        held.release()
    asked = [last_user(body) for body in openai_server.requests]
    assert asked == ["alice: first", "alice: fourth"], asked
    said = [(m["kind"], m["content"]) for m in items if m["kind"] in ("user", "assistant")]
    # (Tasks 2 and 3 were committed while task 1 was being answered.)
    assert said == [
        ("user", "first"), ("user", "second"), ("user", "third"),
        ("assistant", "first answer"), ("user", "fourth"), ("assistant", "echo: alice: fourth"),
    ], said  # fmt: skip
    runs = {m["content"]: m["run_id"] for m in items if m["kind"] == "user"}
    conn = await asyncpg.connect(postgres_dsn)
    try:
        ends = dict(await conn.fetch(
            "SELECT run_id, outcome FROM turn_end WHERE conversation_id = $1", cid
        ))  # fmt: skip
    finally:
        await conn.close()
    assert (ends[runs["second"]], ends[runs["third"]]) == ("cancelled", "cancelled")
