"""The web chat page in headless Chromium (Debian's ``chromium``, driven by Playwright).

A person signs in with a token, sees the conversation list, starts a
conversation, watches an answer stream in, and stops one mid-answer.
Screenshots go to ``tests/artifacts/`` (git-ignored) for a human to look at.
``make chromium`` installs the browser; with ``CI=true`` a missing one fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

from playwright.async_api import expect

from agentik.core.testing.scripted import Reply

from httpserver import TOKENS, running_server

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
SETTINGS = {"tokens": [{"name": "ada", "env": "ADMIN_TOKEN"}]}


async def test_the_web_page_chats_streams_and_stops_an_answer(db_path, browser):
    expect.set_options(timeout=60_000)
    async with running_server(db_path, settings=SETTINGS, environ=TOKENS) as server:
        async with server.client(TOKENS["ADMIN_TOKEN"]) as c:
            earlier = (await c.post("/conversations", json={"title": "Weather in Lyon"})).json()
            await c.post(f"/conversations/{earlier['id']}/messages", json={"content": "Rain?"})
            await (await server.agent.get_conversation(earlier["id"])).wait_idle()

        page = await browser.new_page(viewport={"width": 1180, "height": 760})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        await page.goto(server.url + "/")

        # The API needs a token: the page asks for one.
        await expect(page.locator("#auth")).to_be_visible()
        await page.fill("#token", TOKENS["ADMIN_TOKEN"])
        await page.click("#save-token")
        items = page.locator("#conversations li")
        await expect(items).to_have_count(1)
        await expect(items.first).to_contain_text("Weather in Lyon")

        # An earlier conversation shows its history.
        await items.first.click()
        await expect(page.locator(".msg.user")).to_have_text([re.compile("Rain\\?")])
        await expect(page.locator(".msg.assistant")).to_have_text([re.compile("echo: Rain\\?")])

        # A new conversation; the answer streams in.
        await page.click("#new")
        await expect(items).to_have_count(2)
        await expect(page.locator("#status")).to_have_text("live")
        server.model.enqueue(Reply(chunks=["agentik ", "runs an ", "LLM agent ", "as a chat bot."]))
        await page.fill("#input", "What is agentik?")
        await page.press("#input", "Enter")
        answer = page.locator(".msg.assistant").last
        await expect(answer).to_contain_text("agentik runs an LLM agent as a chat bot.")
        await expect(page.locator("#stop")).to_be_disabled()
        # The first message names the conversation.
        await expect(page.locator("#title")).to_have_text("What is agentik?")
        await expect(page.locator("#conversations li.active")).to_contain_text("What is agentik?")

        # A long answer: the page shows it while it is being written, and Stop stops it.
        story = Reply(
            chunks=["Once upon a time, ", "a small bot ", "answered ", "every question..."],
            hold_after=2,
        )
        server.model.enqueue(story)
        await page.fill("#input", "Tell me a long story")
        await page.press("#input", "Enter")
        writing = page.locator(".msg.assistant.writing")
        await expect(writing).to_have_text(re.compile("Once upon a time, a small bot $"))
        await expect(page.locator("#stop")).to_be_enabled()
        await page.screenshot(path=str(ARTIFACTS / "http-web-chat-streaming.png"))
        await page.click("#stop")
        stopped = page.locator(".msg.assistant").last
        await expect(stopped).to_have_class(re.compile("interrupted"))
        await expect(page.locator("#stop")).to_be_disabled()
        await page.screenshot(path=str(ARTIFACTS / "http-web-chat.png"))
        assert not errors, errors

    # What the page showed is what was stored.
    conv_id = await _newest_titled(db_path, "What is agentik?")
    assert conv_id is not None


async def test_a_conversation_being_opened_takes_no_message_until_it_is_ready(db_path, browser):
    # Opening a conversation reads it from the API. While that read is held
    # back, the page must not look ready for it ("live", the input enabled
    # with the previous conversation's title in mind): a message sent then went
    # to the new conversation but left it "Untitled".
    expect.set_options(timeout=60_000)
    async with running_server(db_path, settings=SETTINGS, environ=TOKENS) as server:
        async with server.client(TOKENS["ADMIN_TOKEN"]) as c:
            await c.post("/conversations", json={"title": "Weather in Lyon"})
        page = await browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        await page.goto(server.url + "/")
        await page.fill("#token", TOKENS["ADMIN_TOKEN"])
        await page.click("#save-token")
        items = page.locator("#conversations li")
        await items.first.click()
        await expect(page.locator("#title")).to_have_text("Weather in Lyon")
        await expect(page.locator("#input")).to_be_enabled()

        asked, release = asyncio.Event(), asyncio.Event()

        async def hold_reads(route) -> None:
            if route.request.method == "GET":  # the new conversation's own record
                asked.set()
                await release.wait()
            await route.continue_()

        await page.route(re.compile(r"/conversations/[0-9a-f-]+$"), hold_reads)
        await page.click("#new")
        await asyncio.wait_for(asked.wait(), 60)
        await expect(page.locator("#status")).not_to_have_text("live")
        await expect(page.locator("#input")).to_be_disabled()
        release.set()

        await expect(page.locator("#status")).to_have_text("live")
        await page.fill("#input", "Where am I?")
        await page.press("#input", "Enter")
        await expect(page.locator(".msg.assistant").last).to_have_text(
            re.compile("echo: Where am I")
        )
        await expect(page.locator("#title")).to_have_text("Where am I?")
        await expect(page.locator("#conversations li.active")).to_contain_text("Where am I?")
        assert not errors, errors
    with sqlite3.connect(db_path) as db:
        titles = sorted(row[0] for row in db.execute("SELECT title FROM conversation"))
    assert titles == ["Weather in Lyon", "Where am I?"]


async def _newest_titled(db_path: str, title: str) -> str | None:
    with sqlite3.connect(db_path) as db:
        row = db.execute("SELECT id FROM conversation WHERE title = ?", (title,)).fetchone()
        if row is None:
            return None
        statuses = db.execute(
            "SELECT content, status FROM message WHERE conversation_id = ? AND kind = 'assistant'"
            " ORDER BY id",
            (row[0],),
        ).fetchall()
    assert statuses == [
        ("agentik runs an LLM agent as a chat bot.", "complete"),
        ("Once upon a time, a small bot ", "interrupted"),
    ]
    return row[0]


async def test_without_tokens_the_page_works_and_another_site_cannot_post(db_path, browser, caplog):
    # No tokens: the Host and Origin checks are on. The page's own requests
    # (its POSTs carry Origin: http://127.0.0.1:<port>) go through; the same
    # POST from a page of another origin reaches the server and is refused.
    expect.set_options(timeout=60_000)
    caplog.set_level(logging.WARNING, logger="agentik.transports.http")
    async with running_server(db_path) as server:
        page = await browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        await page.goto(server.url + "/")
        await page.click("#new")
        await expect(page.locator("#status")).to_have_text("live")
        await page.fill("#input", "Hello from this machine")
        await page.press("#input", "Enter")
        await expect(page.locator(".msg.assistant").last).to_have_text(
            re.compile("echo: Hello from this machine")
        )
        await expect(page.locator("#title")).to_have_text("Hello from this machine")
        assert not errors, errors
        with sqlite3.connect(db_path) as db:
            (conv_id,) = db.execute("SELECT id FROM conversation").fetchone()

        # Another site: a page of another origin (a second server on this
        # machine) posts text/plain, a request browsers send without asking
        # the server first.
        async with _static_page("<p>cats</p>") as other_origin:
            other = await browser.new_page()
            await other.goto(other_origin + "/")
            await other.evaluate(
                """async (url) => {
                    await fetch(url, {method: "POST", mode: "no-cors",
                        headers: {"Content-Type": "text/plain"},
                        body: JSON.stringify({content: "obey the other site"})});
                }""",
                f"{server.url}/agentik/conversations/{conv_id}/messages",
            )
    refused = [r.getMessage() for r in caplog.records if "refused a request" in r.getMessage()]
    assert refused == [
        f"HTTP API: refused a request with Origin {other_origin!r}"
        " (add it to allowed_origins if it is yours)"
    ]
    with sqlite3.connect(db_path) as db:
        contents = [row[0] for row in db.execute("SELECT content FROM message WHERE kind = 'user'")]
    assert contents == ["Hello from this machine"]


@contextlib.asynccontextmanager
async def _static_page(html: str) -> AsyncIterator[str]:
    """A one-page HTTP server on 127.0.0.1 (another origin than the API's); yields its origin."""
    body = html.encode()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nConnection: close\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()
