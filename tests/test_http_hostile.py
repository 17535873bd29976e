"""A careless client or an attacker against the HTTP API and its web page (review round).

Everything runs against the real server (uvicorn on a real 127.0.0.1 socket, a
real agent with a SQLite file, the scripted model), driven by httpx, raw
sockets, or headless Chromium.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
from urllib.parse import quote, unquote

import httpx
import pytest
from playwright.async_api import expect
from test_http_browser import _static_page

from agentik.core.testing.scripted import Reply

from httpserver import TOKENS, admins, running_server

ADMIN_AND_ALICE = {
    "tokens": [
        {"name": "admin", "env": "ADMIN_TOKEN"},
        {"name": "alice", "env": "ALICE_TOKEN", "channels": ["http:web:alice:"]},
    ]
}
#: Importing a snapshot is an admin-level right: alice, limited to her own channels,
#: ranks as admin in these tests.
ALICE_IMPORTS = admins("alice")


def snapshot(cid: str) -> dict:
    return {
        "format": "agentik.conversation",
        "version": 1,
        "conversation": {"id": cid, "title": "", "created_at": 1.0, "updated_at": 1.0, "meta": {}},
        "messages": [{"id": 1, "kind": "user", "content": "hi", "created_at": 1.0}],
        "working_memory": [
            {"pos": 1, "message": {"role": "user", "content": "hi", "message_id": 1}}
        ],
    }


def filename_of(disposition: str) -> str:
    """The file name a browser takes from ``Content-Disposition`` (RFC 6266: the
    RFC 5987 ``filename*`` wins over ``filename``, which must be a quoted ASCII name)."""
    kind, *params = [p.strip() for p in disposition.split(";")]
    assert kind == "attachment", disposition
    found = dict(p.split("=", 1) for p in params)
    plain = found["filename"]
    assert plain.isascii() and plain[0] == plain[-1] == '"' and '"' not in plain[1:-1], plain
    charset, _, encoded = found["filename*"].partition("''")
    assert charset == "UTF-8", disposition
    return unquote(encoded, errors="strict")


# -- conversation ids from snapshots ------------------------------------------------------


@pytest.mark.parametrize(
    "cid",
    ["naïve-☃", "line\u2028sep", 'say "cheese"', "semi;colon", "x?y#z", "%41", "a b"],
)
async def test_a_kept_id_of_any_text_exports_under_its_own_name(db_path, cid, caplog):
    # An id kept from a snapshot is any text: the export's Content-Disposition
    # header (Latin-1 only, quotes delimit the name) was built from it as is, so
    # a non-Latin-1 id was a 500 with a traceback and a quote broke the header.
    caplog.set_level(logging.ERROR)
    async with running_server(
        db_path, settings=ADMIN_AND_ALICE, environ=TOKENS, access=ALICE_IMPORTS
    ) as server:
        async with server.client(TOKENS["ALICE_TOKEN"]) as c:
            r = await c.post("/conversations/import", params={"ids": "keep"}, json=snapshot(cid))
            assert r.status_code == 201, r.text
            r = await c.get(f"/conversations/{quote(cid, safe='')}/export")
    assert r.status_code == 200, r.text
    assert r.json()["conversation"]["id"] == cid
    assert filename_of(r.headers["content-disposition"]) == f"conversation-{cid}.json"
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]


async def test_an_existing_id_with_a_line_break_exports_with_a_valid_header(db_path, caplog):
    # Ids made by the library (or imported before the API checked them) may hold
    # anything; the export of one with CR LF dropped the connection without an answer.
    caplog.set_level(logging.ERROR)
    async with running_server(db_path, settings=ADMIN_AND_ALICE, environ=TOKENS) as server:
        cid = "two\r\nlines"
        await server.agent.create_conversation(conversation_id=cid, channel_key="http:web:alice:x")
        async with server.client(TOKENS["ALICE_TOKEN"]) as c:
            r = await c.get(f"/conversations/{quote(cid, safe='')}/export")
    assert r.status_code == 200, r.text
    assert filename_of(r.headers["content-disposition"]) == f"conversation-{cid}.json"
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]


@pytest.mark.parametrize(
    ("cid", "says"),
    [("a/b", "holds a /"), ("..", "resolve away"), (".", "resolve away"), ("x\r\ny", "control")],
)
async def test_an_id_the_api_could_not_address_is_not_kept(db_path, cid, says):
    # "a/b" was imported (201), then every request for it was 404 (the path
    # segment cannot hold a /): a conversation nobody could read or delete.
    async with running_server(
        db_path, settings=ADMIN_AND_ALICE, environ=TOKENS, access=ALICE_IMPORTS
    ) as server:
        async with server.client(TOKENS["ALICE_TOKEN"]) as c:
            for ids in ("keep", "new"):
                r = await c.post("/conversations/import", params={"ids": ids}, json=snapshot(cid))
                assert r.status_code == 422, r.text
                error = r.json()["error"]
                assert error["code"] == "invalid_snapshot"
                assert error["message"].startswith("conversation.id: ") and says in error["message"]
            # Nothing was stored.
            assert (await c.get("/conversations")).json()["items"] == []
            # The OpenAPI document says so too.
            doc = (await c.get("/openapi.json")).json()
            pattern = doc["components"]["schemas"]["SnapshotConversation"]["properties"]["id"]
            assert not re.fullmatch(pattern["pattern"], cid)


# -- the web page ---------------------------------------------------------------------------


async def test_the_page_deletes_the_conversation_it_shows_whatever_its_id(db_path, browser):
    # The page put conversation ids into URLs as they are. A token that may only
    # import into its own channels kept the id "<someone else's id>?": an admin
    # who opened it in the page saw the other conversation, and Delete sent
    # DELETE /conversations/<someone else's id>? — deleting that one instead.
    expect.set_options(timeout=60_000)
    async with running_server(
        db_path, settings=ADMIN_AND_ALICE, environ=TOKENS, access=ALICE_IMPORTS
    ) as server:
        async with server.client(TOKENS["ADMIN_TOKEN"]) as admin:
            victim = (await admin.post("/conversations", json={"title": "Payroll"})).json()["id"]
        async with server.client(TOKENS["ALICE_TOKEN"]) as alice:
            doc = snapshot(victim + "?")
            doc["conversation"]["title"] = "Harmless"
            r = await alice.post("/conversations/import", params={"ids": "keep"}, json=doc)
            assert r.status_code == 201, r.text

        page = await browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        await page.goto(server.url + "/")
        await page.fill("#token", TOKENS["ADMIN_TOKEN"])
        await page.click("#save-token")
        await page.locator("#conversations li", has_text="Harmless").click()
        await expect(page.locator("#title")).to_have_text("Harmless")
        await expect(page.locator("#status")).to_have_text("live")
        await expect(page.locator(".msg.user .text")).to_have_text(["hi"])
        await page.click("#delete")
        await page.locator("#confirm-delete").get_by_role("button", name="Delete").click()
        await expect(page.locator("#conversations li")).to_have_count(1)
        await expect(page.locator("#conversations li")).to_contain_text("Payroll")
        assert not errors, errors

        async with server.client(TOKENS["ADMIN_TOKEN"]) as admin:
            assert (await admin.get(f"/conversations/{victim}")).status_code == 200
            r = await admin.get(f"/conversations/{quote(victim + '?', safe='')}")
            assert r.status_code == 404


async def test_another_site_cannot_frame_the_page_and_the_page_runs_only_its_own_code(
    db_path,
    browser,
):
    # The page had no Content-Security-Policy and could be framed: a page of
    # another site could show it in an invisible frame over its own buttons and
    # have the local user click Approve (a tool call) or Delete for it.
    expect.set_options(timeout=60_000)
    async with running_server(db_path) as server:
        async with server.client() as c:
            r = await c.get(server.url + "/")
        policy = r.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in policy and "script-src 'sha256-" in policy
        assert "'unsafe-inline'" not in policy
        assert r.headers["x-frame-options"] == "DENY"

        # The page itself works under its policy (chats, streams: fetch to its own origin).
        page = await browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        await page.goto(server.url + "/")
        await page.click("#new")
        await expect(page.locator("#status")).to_have_text("live")
        await page.fill("#input", "hello")
        await page.press("#input", "Enter")
        await expect(page.locator(".msg.assistant .text")).to_have_text(["echo: hello"])
        assert not errors, errors

        # Another site frames it: the browser shows nothing of it.
        html = f'<iframe id="chat" src="{server.url}/"></iframe>'
        async with _static_page(html) as other_origin:
            other = await browser.new_page()
            refused: list[str] = []
            other.on("console", lambda m: refused.append(m.text))
            async with other.expect_event("console", lambda m: "frame" in m.text, timeout=60_000):
                await other.goto(other_origin + "/")
            assert any("frame-ancestors" in text for text in refused), refused
            framed = other.frame_locator("#chat")
            assert await framed.locator("#new").count() == 0


# -- the health listener --------------------------------------------------------------------


async def test_without_a_token_the_health_listener_tells_a_rebound_page_nothing():
    # The listener without a token served /status (channel keys of busy
    # conversations, components' failure reasons) and /metrics to any Host: a
    # web page the operator opens could rebind its own name to 127.0.0.1:<port>
    # and read them. Requests by IP address or localhost (probes, scrapers,
    # `agentik status`) are answered as before.
    from starlette.responses import JSONResponse

    from agentik.bot.health import HealthServer

    async def answer(request):
        return JSONResponse({"active": ["irc:libera:#secret-ops"]})

    listener = HealthServer("127.0.0.1:0", health=answer, ready=answer, status=answer)
    listener.route("/metrics", answer)
    await listener.start()
    try:
        assert listener.address is not None
        port = listener.address.rsplit(":", 1)[1]
        async with httpx.AsyncClient(base_url=listener.address, timeout=60) as c:
            for path in ("/status", "/metrics"):
                rebound = await c.get(path, headers={"Host": f"evil.example:{port}"})
                assert rebound.status_code == 403, rebound.text
                assert rebound.json()["error"]["code"] == "host_not_allowed"
                assert "secret-ops" not in rebound.text
                for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"10.1.2.3:{port}"):
                    direct = await c.get(path, headers={"Host": host})
                    assert direct.status_code == 200 and "secret-ops" in direct.text
            # Probes are answered under any name.
            probe = await c.get("/health", headers={"Host": "agentik.svc.cluster.local"})
            assert probe.status_code == 200
    finally:
        await listener.aclose()

    # With a token, the token is what counts, whatever the name.
    listener = HealthServer(
        "127.0.0.1:0", health=answer, ready=answer, status=answer, token="t0ken-t0ken-t0ken"
    )
    await listener.start()
    try:
        assert listener.address is not None
        async with httpx.AsyncClient(base_url=listener.address, timeout=60) as c:
            named = {"Host": "agentik.svc.cluster.local"}
            assert (await c.get("/status", headers=named)).status_code == 401
            auth = {**named, "Authorization": "Bearer t0ken-t0ken-t0ken"}
            assert (await c.get("/status", headers=auth)).status_code == 200
    finally:
        await listener.aclose()


async def test_after_a_restart_the_page_shows_what_was_said_while_it_reconnected(
    tmp_path,
    browser,
):
    # Event numbers start again in a new process. The page reconnected with the
    # Last-Event-ID of the old one, was told events_lost (its id was ahead of
    # the new sequence), and carried on without reading the history again: an
    # answer given while it was away never appeared.
    expect.set_options(timeout=60_000)
    db = str(tmp_path / "agentik.db")
    page = await browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    released = asyncio.Event()
    status_released = asyncio.Event()
    status_released.set()

    async def hold(route):
        await released.wait()
        await route.continue_()

    async def hold_status(route):
        await status_released.wait()
        await route.continue_()

    async with running_server(db) as first:
        port = int(first.url.rsplit(":", 1)[1])
        await page.goto(first.url + "/")
        await page.click("#new")
        await expect(page.locator("#status")).to_have_text("live")
        for n in ("one", "two", "three"):
            await page.fill("#input", n)
            await page.press("#input", "Enter")
            await expect(page.locator(".msg.assistant .text").last).to_have_text(f"echo: {n}")
        (cid,) = await page.evaluate("() => [state.current]")
        # From now on the page's reconnection waits until the test lets it through.
        await page.route(lambda url: "/events" in url, hold)
    await expect(page.locator("#status")).to_have_text("reconnecting…")

    async with running_server(db, settings={"port": port}) as second:
        async with second.client() as c:
            r = await c.post(f"/conversations/{cid}/messages", json={"content": "while away"})
            assert r.status_code == 202, r.text
            await (await second.agent.get_conversation(cid)).wait_idle()
            # The history read again is shown before its checklist is read: hold
            # that, and answer a message meanwhile. Its events wait for the history
            # (they were split over two bubbles, "echo: " in one the history
            # replaced and "back" in the next).
            status_released.clear()
            await page.route(lambda url: url.endswith("/status"), hold_status)
            released.set()
            await expect(page.locator("#status")).to_have_text("live")
            await expect(page.locator(".msg.assistant .text")).to_have_text(
                ["echo: one", "echo: two", "echo: three", "echo: while away"]
            )
            midway = Reply(chunks=["echo: ", "back"], hold_after=1)
            second.model.enqueue(midway)
            await page.fill("#input", "back")
            await page.press("#input", "Enter")
            await asyncio.wait_for(midway.held.wait(), 60)
            async with page.expect_response(lambda r: r.url.endswith("/status")):
                status_released.set()
            # What the page does on that answer is done before its next timer fires.
            await page.evaluate("() => new Promise((r) => setTimeout(r, 100))")
            midway.release.set()
            # And it follows the new process's events from there on.
            await expect(page.locator(".msg.assistant .text")).to_have_text(
                ["echo: one", "echo: two", "echo: three", "echo: while away", "echo: back"]
            )
            await page.fill("#input", "again")
            await page.press("#input", "Enter")
            await expect(page.locator(".msg.assistant .text").last).to_have_text("echo: again")
    assert not errors, errors


# -- bodies -----------------------------------------------------------------------------------


async def test_a_number_with_thousands_of_digits_is_a_plain_422(db_path):
    # Python refuses to parse integers over 4300 digits; its message ("use
    # sys.set_int_max_str_digits() to increase the limit") went to the client as is.
    async with running_server(db_path) as server:
        async with server.client() as c:
            conv = (await c.post("/conversations", json={})).json()["id"]
            body = b'{"content": "hi", "busy": ' + b"7" * 5000 + b"}"
            r = await c.post(
                f"/conversations/{conv}/messages",
                content=body,
                headers={"content-type": "application/json"},
            )
            assert r.status_code == 422
            error = r.json()["error"]
            assert error == {
                "code": "invalid_body",
                "message": "the body is not valid JSON: a number has too many digits",
            }
            # Not UTF-8 is still said as such.
            r = await c.post(
                f"/conversations/{conv}/messages",
                content=b'{"content": "\xff"}',
                headers={"content-type": "application/json"},
            )
            assert r.status_code == 422 and "utf-8" in r.json()["error"]["message"]
            assert (await c.get(f"/conversations/{conv}/messages")).json()["items"] == []


# -- titles ----------------------------------------------------------------------------------

ESCAPES = "\x1b]0;pwned\x07\x1b[2J"


async def test_a_title_cannot_carry_terminal_escapes_to_the_operator(db_path, tmp_path):
    # Titles set through the API (or taken from a first message) kept ESC
    # sequences, and `agentik conversations list` printed them to the operator's
    # terminal as they were: a token holder could retitle the window, clear the
    # screen or hide lines there.
    async with running_server(db_path, settings=ADMIN_AND_ALICE, environ=TOKENS) as server:
        async with server.client(TOKENS["ALICE_TOKEN"]) as c:
            r = await c.post("/conversations", json={"title": "plans" + ESCAPES})
            assert r.status_code == 422
            assert r.json()["error"] == {
                "code": "invalid_body",
                "message": "title: must be one line without control or invisible characters",
            }
            conv = (await c.post("/conversations", json={"title": "plans"})).json()["id"]
            for title in ("two\nlines", "bidi\u202eevil", "bell\x07"):
                r = await c.patch(f"/conversations/{conv}", json={"title": title})
                assert r.status_code == 422, title
            assert (await c.get(f"/conversations/{conv}")).json()["title"] == "plans"
            r = await c.patch(f"/conversations/{conv}", json={"title": "Plans for Q3 ☃"})
            assert r.status_code == 200 and r.json()["title"] == "Plans for Q3 ☃"

            # An untitled one is named by its first message, without the escapes;
            # the message itself is kept as sent.
            fresh = (await c.post("/conversations", json={})).json()["id"]
            content = f"\n{ESCAPES}hello\tthere{ESCAPES}\nsecond line"
            r = await c.post(f"/conversations/{fresh}/messages", json={"content": content})
            assert r.status_code == 202 and r.json()["title"] == "]0;pwned[2Jhello there]0;pwned[2J"
            await (await server.agent.get_conversation(fresh)).wait_idle()
            r = await c.get(f"/conversations/{fresh}/messages")
            assert r.json()["items"][0]["content"] == content

    # What the operator's terminal gets.
    config = tmp_path / "bot.toml"
    config.write_text(f'[llm]\nbackend = "scripted"\n[storage]\npath = "{db_path}"\n')
    cli = "import sys; from agentik.bot.cli import main; sys.exit(main())"
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-c", cli, "conversations", "list", "-c", str(config)],
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0
    listed = out.decode()
    assert "Plans for Q3 ☃" in listed and "hello there" in listed
    assert "\x1b" not in listed and "\x07" not in listed
