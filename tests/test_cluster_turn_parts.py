"""What the turn queue of several workers carries besides text (issue 34): a message's
attachments, and regenerate / edit-and-resend.

Real processes all the way (as tests/test_cluster_events.py): workers ``a`` and ``b``,
``agentik run`` on a real PostgreSQL (tests/pgserver.py), each serving the HTTP API on
its own port; the fake OpenAI-compatible server records what the real ``openai`` SDK
sends.  The conversation's turns run on ``b`` (it holds the conversation's lease: a
turn of it held mid-stream, or just ended with the lease kept while idle) and the
requests go through ``a`` (its HTTP API, and its web page in Chromium); ``/health`` says
which worker ran the queued turns.
"""

from __future__ import annotations

import base64
import hashlib
import re
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from cluster import PATIENCE, Worker, http_transport, until, worker_config, workers
from playwright.async_api import expect

from agentik.core.testing.openai_server import Reply

from httpserver import TOKENS

pytest_plugins = ["pgserver"]

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"

DSN_ENV = "AGENTIK_TEST_TURN_PARTS_DSN"
ALICE = TOKENS["ALICE_TOKEN"]
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
PNG_SHA = hashlib.sha256(PNG).hexdigest()


def two_workers(tmp_path: Path, dsn: str, openai_url: str, *, beat: float = 0.5) -> Any:
    """Workers ``a`` and ``b`` (a vision model: ``image_in``), the HTTP API with alice's
    token, ``/health`` on their sockets; ``beat``: their heartbeat (a conversation stays
    leased to the worker that ran it for two heartbeats after its last turn)."""

    def config(name: str, port: int) -> str:
        web = http_transport("web", port, 'tokens = [{ name = "alice", env = "ALICE_TOKEN" }]')
        text = worker_config(name, openai_url, dsn_env=DSN_ENV, poll=2.0, beat=beat,
                             lease=max(3.0, 6 * beat), extra=web)  # fmt: skip
        return text.replace('api_key = "sk-test"\n', 'api_key = "sk-test"\nimage_in = true\n')

    return workers(["a", "b"], tmp_path, dsn, config, dsn_env=DSN_ENV,
                   env={"ALICE_TOKEN": ALICE}, ready="/ready", stop=signal.SIGTERM)  # fmt: skip


async def ran_here(worker: Worker) -> int:
    """How many queued turns ``worker`` ran (its ``/health``)."""
    view = await until(worker.health, f"{worker.folder.name}'s /health")
    return int(view["cluster"]["queued_turns_run"])


async def running_on(c: httpx.AsyncClient, cid: str, run_id: str) -> bool:
    """Whether the worker of ``c`` says the turn ``run_id`` of ``cid`` runs (the status
    and the conversation JSON; the turn may run on another worker)."""
    status = (await c.get(f"/conversations/{cid}/status")).json()
    doc = (await c.get(f"/conversations/{cid}")).json()
    return bool(status["run_id"] == run_id == doc["running_run_id"])


async def history(c: httpx.AsyncClient, cid: str) -> list[dict[str, Any]]:
    r = await c.get(f"/conversations/{cid}/messages", params={"limit": 200})
    assert r.status_code == 200, r.text
    return list(r.json()["items"])


async def answered(c: httpx.AsyncClient, cid: str, n: int) -> list[dict[str, Any]] | None:
    """The history once it holds ``n`` answers (``None`` before)."""
    rows = await history(c, cid)
    return rows if sum(m["kind"] == "assistant" for m in rows) >= n else None


def said(body: dict[str, Any]) -> list[tuple[str, str]]:
    """(role, text) of a model request's user and assistant messages, in order (a user
    message with parts: its text parts)."""
    out = []
    for m in body["messages"]:
        if m["role"] not in ("user", "assistant"):
            continue
        content = m["content"]
        if not isinstance(content, str):
            content = " ".join(p.get("text", "") for p in content if p.get("type") == "text")
        out.append((m["role"], content))
    return out


async def test_an_image_uploaded_through_one_worker_reaches_the_model_from_the_other(
    postgres_dsn, openai_server, tmp_path
):
    held = Reply.text("first answer", chunks=4, hold_after=1)
    openai_server.enqueue(held, Reply.text("a dot"))
    async with two_workers(tmp_path, postgres_dsn, openai_server.base_url) as (a, b):
        async with a.client(ALICE) as on_a, b.client(ALICE) as on_b:
            cid = (await on_b.post("/conversations", json={})).json()["id"]
            r = await on_b.post(f"/conversations/{cid}/messages", json={"content": "hello"})
            assert r.status_code == 202, r.text
            await held.wait_held(PATIENCE)  # b runs the conversation now, holding its lease

            up = await on_a.post(f"/conversations/{cid}/attachments",
                                 files={"file": ("dot.png", PNG, "image/png")})  # fmt: skip
            assert up.status_code == 201, up.text
            assert up.json()["sha256"] == PNG_SHA
            r = await on_a.post(
                f"/conversations/{cid}/messages",
                json={"content": "what is this?",
                      "attachments": [{"sha256": PNG_SHA, "name": "dot.png"}]},
            )  # fmt: skip
            assert r.status_code == 202, r.text
            run_id = r.json()["run_id"]
            held.release()
            rows = await until(lambda: answered(on_a, cid, 2), "both answers")

            await openai_server.wait_requests(2, PATIENCE)
            assert len(openai_server.requests) == 2  # answered once
            last = openai_server.requests[-1]["messages"][-1]
            assert last["role"] == "user" and isinstance(last["content"], list)
            assert {"type": "image_url",
                    "image_url": {"url": "data:image/png;base64," + base64.b64encode(PNG).decode()},
                    } in last["content"]  # fmt: skip
            assert "what is this?" in str(last["content"])
            # Both turns ran on b; a, which took the message, queued it.
            assert await ran_here(b) == 2 and await ran_here(a) == 0
            asked = [m for m in rows if m["kind"] == "user" and m["run_id"] == run_id]
            assert len(asked) == 1
            assert [p["sha256"] for p in asked[0]["data"]["parts"]] == [PNG_SHA]
            answers = [m["content"] for m in rows if m["kind"] == "assistant"]
            assert answers == ["first answer", "a dot"]

            # A hash this conversation does not hold is refused, and nothing is queued.
            r = await on_a.post(
                f"/conversations/{cid}/messages",
                json={"content": "and this?", "attachments": [{"sha256": "0" * 64}]},
            )
            assert r.status_code == 409, r.text
            assert r.json()["error"]["code"] == "attachment_not_found"
            assert not [m for m in await history(on_b, cid) if m["content"] == "and this?"]


async def test_regenerate_and_edit_through_one_worker_branch_where_the_turns_run(
    postgres_dsn, openai_server, tmp_path
):
    held = Reply.text("first answer", chunks=4, hold_after=1)
    openai_server.enqueue(held, Reply.text("second answer"), Reply.text("third answer"))
    # Heartbeats of 5 s: b keeps the conversation 10 s after its last turn, time enough
    # for a's requests to reach it through the queue.
    async with two_workers(tmp_path, postgres_dsn, openai_server.base_url, beat=5.0) as (a, b):
        async with a.client(ALICE) as on_a, b.client(ALICE) as on_b:
            cid = (await on_b.post("/conversations", json={})).json()["id"]
            r = await on_b.post(f"/conversations/{cid}/messages", json={"content": "question"})
            assert r.status_code == 202, r.text
            first_run = r.json()["run_id"]
            await held.wait_held(PATIENCE)
            # While b runs the turn, a refuses to branch (it runs nothing of it itself).
            busy = await on_a.post(f"/conversations/{cid}/regenerate", json={})
            assert busy.status_code == 409, busy.text
            assert busy.json()["error"]["code"] == "cannot_branch"
            held.release()
            rows = await until(lambda: answered(on_a, cid, 1), "the first answer")
            asked = next(m for m in rows if m["kind"] == "user" and m["run_id"] == first_run)

            r = await on_a.post(f"/conversations/{cid}/regenerate", json={})
            assert r.status_code == 202, r.text
            assert r.json()["branch_of"] == asked["id"]
            rows = await until(lambda: answered(on_a, cid, 2), "the regenerated answer")
            again = [m for m in rows if m["kind"] == "user"]
            assert [m["content"] for m in again] == ["question", "question"]
            assert again[1]["data"]["branch_of"] == asked["id"]
            # The model saw the question once, without its earlier answer.
            assert said(openai_server.requests[1]) == [("user", "alice: question")]

            r = await on_a.post(f"/conversations/{cid}/edit", json={"content": "better question"})
            assert r.status_code == 202, r.text
            assert r.json()["branch_of"] == again[1]["id"]
            rows = await until(lambda: answered(on_a, cid, 3), "the edited question's answer")
            assert said(openai_server.requests[2]) == [("user", "alice: better question")]
            # The audit log keeps every branch; each question answered once.
            assert [(m["kind"], m["content"]) for m in rows if m["kind"] != "tool_call"] == [
                ("user", "question"), ("assistant", "first answer"),
                ("user", "question"), ("assistant", "second answer"),
                ("user", "better question"), ("assistant", "third answer"),
            ]  # fmt: skip
            assert len(openai_server.requests) == 3
            # Every turn ran on b: a only queued what it took.
            assert await ran_here(b) == 3 and await ran_here(a) == 0


@pytest.mark.timeout(400)  # two workers and Chromium, on a loaded machine
async def test_the_web_pages_regenerate_and_edit_on_one_worker_run_on_the_other(
    postgres_dsn, openai_server, browser, tmp_path
):
    expect.set_options(timeout=PATIENCE * 1000)
    held = Reply.text("first answer", chunks=4, hold_after=1)
    openai_server.enqueue(held, Reply.text("second answer"), Reply.text("third answer"))
    async with two_workers(tmp_path, postgres_dsn, openai_server.base_url, beat=5.0) as (a, b):
        async with b.client(ALICE) as on_b:
            cid = (await on_b.post("/conversations", json={"title": "Weather"})).json()["id"]
            r = await on_b.post(f"/conversations/{cid}/messages", json={"content": "Rain?"})
            assert r.status_code == 202, r.text
            await held.wait_held(PATIENCE)  # runs on b
            run_id = r.json()["run_id"]
            async with a.client(ALICE) as on_a:
                # a says so once b has stored the turn's start (its events are written
                # in batches): a page opened there follows the turn.
                await until(lambda: running_on(on_a, cid, run_id), "the turn running, seen on a")
        # The page of worker a, opened on the conversation while b answers.
        page = await (await browser.new_context(viewport={"width": 1280, "height": 800})).new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        await page.goto(a.url + "/")
        await page.fill("#token", ALICE)
        await page.click("#save-token")
        await page.locator("#conversations li button", has_text="Weather").click()
        answers = page.locator(".msg.assistant")
        # The page follows the turn from its start (``replay=turn``): the piece b sent
        # before the page was opened is shown while the rest is held.
        await expect(answers).to_have_text([re.compile(r"^agentik\s*fir\s*$")])
        held.release()
        await expect(answers).to_have_text([re.compile("first answer")])
        await expect(page.locator("#stop")).to_be_disabled()
        # Regenerate (b keeps the conversation for two heartbeats after its turn).
        await page.keyboard.press("Alt+Shift+R")
        await expect(answers.last).to_contain_text("second answer")
        await expect(answers.first.locator(".who")).to_contain_text("earlier version")
        await expect(page.locator("#stop")).to_be_disabled()
        # Edit and resend.
        await page.locator("#input").focus()
        await page.keyboard.press("ArrowUp")
        await expect(page.locator("#input")).to_have_value("Rain?")
        await page.fill("#input", "Snow?")
        await page.press("#input", "Enter")
        await expect(answers.last).to_contain_text("third answer")
        assert said(openai_server.requests[-1]) == [("user", "alice: Snow?")]
        assert len(openai_server.requests) == 3
        assert await ran_here(b) == 3 and await ran_here(a) == 0
        await page.reload()
        await expect(answers).to_have_count(3)
        await expect(page.locator(".msg.replaced")).to_have_count(4)
        await page.screenshot(path=str(ARTIFACTS / "cluster-web-branches.png"))
        assert not errors, errors


async def test_an_interrupt_naming_a_turn_queued_on_the_other_worker_withdraws_it(
    postgres_dsn, openai_server, tmp_path
):
    """b runs a turn; two more questions come through a (queued: b runs the turns); an
    interrupt through a naming the first of them withdraws it (202, ``withdrawn``): the
    model never sees it, its turn is recorded ``cancelled`` and ends ``interrupted``,
    and the one after it is answered.  Naming it again, or a run of no turn, is a 409."""
    held = Reply.text("first answer", chunks=4, hold_after=1)
    openai_server.enqueue(held, Reply.text("third answer"))
    async with two_workers(tmp_path, postgres_dsn, openai_server.base_url, beat=5.0) as (a, b):
        async with a.client(ALICE) as on_a, b.client(ALICE) as on_b:
            cid = (await on_b.post("/conversations", json={})).json()["id"]
            r = await on_b.post(f"/conversations/{cid}/messages", json={"content": "first"})
            assert r.status_code == 202, r.text
            await held.wait_held(PATIENCE)
            runs = []
            for text in ("second", "third"):
                r = await on_a.post(f"/conversations/{cid}/messages", json={"content": text})
                assert r.status_code == 202, r.text
                runs.append(r.json()["run_id"])
            second, third = runs
            r = await on_a.post(f"/conversations/{cid}/interrupt", json={"run_id": second})
            assert r.status_code == 202, r.text
            assert r.json() == {"conversation_id": cid, "run_id": second, "withdrawn": True}
            again = await on_a.post(f"/conversations/{cid}/interrupt", json={"run_id": second})
            assert again.status_code == 409, again.text
            nothing = await on_a.post(f"/conversations/{cid}/interrupt", json={"run_id": "r-x"})
            assert nothing.status_code == 409, nothing.text
            held.release()
            rows = await until(lambda: answered(on_a, cid, 2), "the first and third answers")
            assert [(m["kind"], m["content"]) for m in rows] == [
                ("user", "first"), ("user", "second"), ("user", "third"),
                ("assistant", "first answer"), ("assistant", "third answer"),
            ]  # fmt: skip
            assert len(openai_server.requests) == 2
            assert "second" not in str(openai_server.requests[1]["messages"])
