"""Finding one's way around the web chat page, in headless Chromium: an address per
conversation (reload, back and forward, links), rename in place, delete after a
confirmation, search across conversations, regenerate and edit-and-resend.

Screenshots go to ``tests/artifacts/`` (git-ignored), as in test_web_page.py.
"""

from __future__ import annotations

import asyncio
import re
from urllib.parse import quote

from playwright.async_api import expect
from test_web_page import ARTIFACTS, LAPTOP, PHONE, SIZES, _open

from agentik.core.errors import LLMStatusError
from agentik.core.testing.scripted import Reply

from httpserver import TOKENS, running_server

SETTINGS = {
    "tokens": [
        {"name": "ada", "env": "ADMIN_TOKEN"},
        {"name": "alice", "env": "ALICE_TOKEN", "channels": ["http:web:alice:"]},
    ]
}
ADA = TOKENS["ADMIN_TOKEN"]
ALICE = TOKENS["ALICE_TOKEN"]


async def _conversation(server, title: str, *questions: str, token: str = ADA) -> str:
    """A conversation made through the API, its questions answered (echo)."""
    async with server.client(token) as c:
        cid = (await c.post("/conversations", json={"title": title})).json()["id"]
        for q in questions:
            await c.post(f"/conversations/{cid}/messages", json={"content": q})
            await (await server.agent.get_conversation(cid)).wait_idle()
    return cid


async def _pick(page, size, title: str) -> None:
    if size is PHONE:
        await page.click("#menu")
    await page.locator("#conversations li button", has_text=title).click()
    await expect(page.locator("#title")).to_have_text(title)


def _path(cid: str) -> str:
    return "/c/" + quote(cid, safe="")


@SIZES
async def test_each_conversation_has_an_address_that_reload_back_forward_and_links_open(
    db_path, browser, size
):
    expect.set_options(timeout=60_000)
    async with running_server(db_path, settings=SETTINGS, environ=TOKENS) as server:
        rain = await _conversation(server, "Rain", "Rain in Lyon?")
        snow = await _conversation(server, "Snow", "Snow in Oslo?")
        page, errors = await _open(browser, server, size)
        await expect(page.locator("#conversations li")).to_have_count(2)
        await _pick(page, size, "Rain")
        await expect(page).to_have_url(server.url + _path(rain))
        await expect(page.locator(".msg.assistant")).to_have_text([re.compile("echo: Rain")])
        await _pick(page, size, "Snow")
        await expect(page).to_have_url(server.url + _path(snow))
        await expect(page.locator(".msg.assistant")).to_have_text([re.compile("echo: Snow")])
        # Back and forward go from one conversation to the other, history and all.
        await page.go_back()
        await expect(page.locator("#title")).to_have_text("Rain")
        await expect(page.locator(".msg.assistant")).to_have_text([re.compile("echo: Rain")])
        await expect(page.locator("#status")).to_have_text("live")
        await page.go_forward()
        await expect(page.locator("#title")).to_have_text("Snow")
        await expect(page.locator(".msg.assistant")).to_have_text([re.compile("echo: Snow")])
        # A reload stays where it was, and can go on talking there.
        await page.reload()
        await expect(page.locator("#title")).to_have_text("Snow")
        await expect(page.locator("#status")).to_have_text("live")
        await page.fill("#input", "And tomorrow?")
        await page.press("#input", "Enter")
        await expect(page.locator(".msg.assistant").last).to_contain_text("echo: And tomorrow?")
        await page.screenshot(path=str(ARTIFACTS / f"web-nav-address-{size['width']}.png"))
        # A link given to someone opens that conversation in a fresh tab.
        other = await page.context.new_page()
        await other.goto(server.url + _path(rain))
        await expect(other.locator("#title")).to_have_text("Rain")
        await expect(other.locator(".msg.assistant")).to_have_text([re.compile("echo: Rain")])
        # Back to where the page started: nothing open.
        await other.goto(server.url + "/")
        await other.goto(server.url + _path(snow))
        await other.go_back()
        await expect(other.locator("#title")).to_have_text("No conversation")
        # A link to a conversation that is gone (or not the token's) says so.
        await other.goto(server.url + _path("no-such-conversation"))
        await expect(other.locator("#messages .empty")).to_have_text(
            re.compile("no conversation at this address")
        )
        await expect(other.locator("#input")).to_be_disabled()
        assert not errors, errors


async def test_any_conversation_id_has_an_address_served_by_the_page(db_path):
    async with running_server(db_path) as server:
        async with server.client() as c:
            for path in ("/c/abc", "/c/a%2Fb%20c", "/c/%E2%9C%93"):
                r = await c.get(server.url + path)
                assert r.status_code == 200 and "<html" in r.text, path
                assert "content-security-policy" in r.headers


async def test_rename_started_while_the_conversation_still_opens_keeps_the_focus(db_path, browser):
    """The message box takes the focus when a conversation has opened, but not
    from a field the user went to meanwhile: Rename clicked while the history
    still loads keeps its field, and what is typed there."""
    expect.set_options(timeout=60_000)
    async with running_server(db_path, settings=SETTINGS, environ=TOKENS) as server:
        await _conversation(server, "Old title", "Rain?")
        page, errors = await _open(browser, server, LAPTOP)
        asked, release = asyncio.Event(), asyncio.Event()

        async def hold_status(route) -> None:
            asked.set()
            await release.wait()
            await route.continue_()

        await page.route(lambda url: url.endswith("/status"), hold_status)
        await _pick(page, LAPTOP, "Old title")
        await asyncio.wait_for(asked.wait(), 60)
        await expect(page.locator("#input")).to_be_disabled()  # (still opening)
        await page.click("#rename")
        await expect(page.locator("#title-edit")).to_be_focused()
        await page.keyboard.type("Trip")
        release.set()
        await expect(page.locator("#input")).to_be_enabled()
        await expect(page.locator("#title-edit")).to_be_focused()
        await expect(page.locator("#title-edit")).to_have_value("Trip")
        # Opening a conversation from the list still lands in the message box.
        await page.keyboard.press("Escape")
        await page.goto(server.url + "/")
        await _pick(page, LAPTOP, "Old title")
        await expect(page.locator("#input")).to_be_focused()
        assert not errors, errors


async def test_rename_in_place_and_delete_after_a_confirmation(db_path, browser):
    expect.set_options(timeout=60_000)
    async with running_server(db_path, settings=SETTINGS, environ=TOKENS) as server:
        cid = await _conversation(server, "Old title", "Rain?")
        keep = await _conversation(server, "Keep me", "Snow?")
        page, errors = await _open(browser, server, LAPTOP)
        await _pick(page, LAPTOP, "Old title")
        # Esc leaves the title as it was.
        await page.click("#rename")
        await expect(page.locator("#title-edit")).to_be_focused()
        await page.keyboard.type("Not this")
        await page.keyboard.press("Escape")
        await expect(page.locator("#title")).to_have_text("Old title")
        await expect(page.locator("#rename")).to_be_focused()
        # Enter saves: the header, the list, the tab and the server agree.
        await page.click("#rename")
        await page.fill("#title-edit", "Trip to Lyon")
        await page.press("#title-edit", "Enter")
        await expect(page.locator("#title")).to_have_text("Trip to Lyon")
        await expect(page.locator("#conversations li.active .title")).to_have_text("Trip to Lyon")
        await expect(page).to_have_title("Trip to Lyon · agentik")
        async with server.client(ADA) as c:
            assert (await c.get(f"/conversations/{cid}")).json()["title"] == "Trip to Lyon"
        # A title the server refuses (a control character) is said so, and nothing changes.
        await page.click("#rename")
        await page.fill("#title-edit", "bad\u0007title")
        await page.press("#title-edit", "Enter")
        await expect(page.locator(".notice").last).to_contain_text("Not renamed")
        await expect(page.locator("#title")).to_have_text("Trip to Lyon")
        await page.reload()
        await expect(page.locator("#title")).to_have_text("Trip to Lyon")
        # Delete asks first; Cancel keeps it.
        await page.click("#delete")
        dialog = page.locator("#confirm-delete")
        await expect(dialog).to_be_visible()
        await expect(dialog).to_contain_text("“Trip to Lyon” and all of its history")
        await expect(dialog.get_by_role("button", name="Cancel")).to_be_focused()
        await page.screenshot(path=str(ARTIFACTS / "web-nav-delete.png"))
        await dialog.get_by_role("button", name="Cancel").click()
        await expect(dialog).to_be_hidden()
        await expect(page.locator("#conversations li")).to_have_count(2)
        await page.click("#delete")
        await dialog.get_by_role("button", name="Delete").click()
        await expect(page.locator("#conversations li")).to_have_count(1)
        await expect(page.locator("#conversations li .title")).to_have_text("Keep me")
        await expect(page.locator("#title")).to_have_text("No conversation")
        await expect(page).to_have_url(server.url + "/")
        async with server.client(ADA) as c:
            assert (await c.get(f"/conversations/{cid}")).status_code == 404
            assert (await c.get(f"/conversations/{keep}")).status_code == 200
        # The refused title is the only error the browser logged.
        assert [e for e in errors if "status of 422" not in e] == [], errors


async def test_rename_and_delete_need_the_right_to_see_the_conversation(db_path):
    async with running_server(db_path, settings=SETTINGS, environ=TOKENS) as server:
        cid = await _conversation(server, "Ada's")
        async with server.client(ALICE) as alice:
            r = await alice.patch(f"/conversations/{cid}", json={"title": "mine now"})
            assert r.status_code == 404
            assert (await alice.delete(f"/conversations/{cid}")).status_code == 404
        async with server.client(ADA) as ada:
            assert (await ada.get(f"/conversations/{cid}")).json()["title"] == "Ada's"


@SIZES
async def test_search_finds_a_word_from_an_old_conversation(db_path, browser, size):
    expect.set_options(timeout=60_000)
    async with running_server(db_path, settings=SETTINGS, environ=TOKENS) as server:
        old = await _conversation(
            server, "Holiday plans", "Which museums in Lyon show Lumière films?"
        )
        for i in range(4):
            await _conversation(server, f"Newer {i}", f"Something else entirely, number {i}")
        page, errors = await _open(browser, server, size)
        await expect(page.locator("#conversations li")).to_have_count(5)
        if size is PHONE:
            await page.click("#menu")
        await page.keyboard.press("Alt+Shift+K")
        await expect(page.locator("#filter")).to_be_focused()
        # No title holds the word: the messages do (the question and its echo).
        await page.keyboard.type("lumi")
        await page.keyboard.press("Enter")
        await expect(page.locator("#conversations li:visible")).to_have_count(0)
        found = page.locator("#found-list li")
        await expect(page.locator("#found-what")).to_have_text("2 messages found")
        await expect(found.first).to_contain_text("Holiday plans")
        await expect(found.last).to_contain_text("Which museums in Lyon show Lumière films?")
        await page.screenshot(path=str(ARTIFACTS / f"web-nav-search-{size['width']}.png"))
        # Opening one shows its conversation, at that message.
        await found.last.get_by_role("button").click()
        await expect(page.locator("#title")).to_have_text("Holiday plans")
        await expect(page).to_have_url(server.url + _path(old))
        await expect(page.locator(".msg.user.found")).to_contain_text("Lumière films")
        # Words nobody wrote find nothing, and say so.
        if size is PHONE:
            await page.click("#menu")
        await page.fill("#filter", "zeppelin")
        await page.press("#filter", "Enter")
        await expect(page.locator("#found-what")).to_have_text("No message holds these words.")
        await expect(found).to_have_count(0)
        assert not errors, errors


async def test_search_pages_and_shows_only_what_the_token_may_see(db_path):
    async with running_server(db_path, settings=SETTINGS, environ=TOKENS) as server:
        ada = await _conversation(server, "Ada's", "the secret word is marmalade")
        async with server.client(ALICE) as alice:
            mine = (await alice.post("/conversations", json={"title": "Alice's"})).json()["id"]
            conv = await server.agent.get_conversation(mine)
            for i in range(5):
                await alice.post(
                    f"/conversations/{mine}/messages", json={"content": f"marmalade {i}"}
                )
                await conv.wait_idle()
            first = (await alice.get("/search", params={"q": "Marmalade", "limit": 4})).json()
            assert {h["conversation_id"] for h in first["items"]} == {mine}
            assert first["next_offset"] == 4 and len(first["items"]) == 4
            rest = (await alice.get("/search", params={"q": "marmalade", "offset": 4})).json()
            # Five questions and five echoes, newest first; never Ada's.
            texts = [h["snippet"] for h in first["items"] + rest["items"]]
            assert len(texts) == 10 and rest["next_offset"] is None
            assert texts[0] == "echo: marmalade 4" and texts[-1] == "marmalade 0"
            assert first["items"][0]["conversation_title"] == "Alice's"
            blank = await alice.get("/search", params={"q": " ?! "})
            assert blank.status_code == 200 and blank.json()["items"] == []
            bad = await alice.get("/search", params={"q": "x", "limit": 0})
            assert bad.status_code == 422
        async with server.client(ADA) as c:
            hits = (await c.get("/search", params={"q": "secret marmalade"})).json()["items"]
            assert [(h["conversation_id"], h["kind"]) for h in hits] == [
                (ada, "assistant"),
                (ada, "user"),
            ]
            # A deleted conversation is found no more.
            await c.delete(f"/conversations/{ada}")
            assert (await c.get("/search", params={"q": "secret"})).json()["items"] == []


async def test_regenerate_and_edit_start_a_branch_and_the_audit_log_keeps_both(db_path, browser):
    expect.set_options(timeout=60_000)
    async with running_server(db_path, settings=SETTINGS, environ=TOKENS) as server:
        cid = await _conversation(server, "Weather", "Rain in Lyon?")
        page, errors = await _open(browser, server, LAPTOP)
        await _pick(page, LAPTOP, "Weather")
        answers = page.locator(".msg.assistant")
        await expect(answers).to_have_text([re.compile("echo: Rain in Lyon")])
        # Regenerate: a new answer; the first one stays, marked as an earlier version.
        server.model.enqueue("Rain, 12 mm, in Lyon.")
        await page.keyboard.press("Alt+Shift+R")
        await expect(answers.last).to_contain_text("Rain, 12 mm, in Lyon.")
        await expect(answers.first.locator(".who")).to_contain_text("earlier version")
        await expect(page.locator("#stop")).to_be_disabled()
        # Edit and resend: the last question comes back into the box, and is replaced.
        await page.locator("#input").focus()
        await page.keyboard.press("ArrowUp")
        await expect(page.locator("#editing")).to_be_visible()
        await expect(page.locator("#input")).to_have_value("Rain in Lyon?")
        await page.fill("#input", "Snow in Oslo?")
        await page.press("#input", "Enter")
        await expect(answers.last).to_contain_text("echo: Snow in Oslo?")
        await expect(page.locator("#editing")).to_be_hidden()
        # The model saw only the new branch.
        said = [(m.role, m.content) for m in server.model.requests[-1].messages]
        assert [x for x in said if x[0] in ("user", "assistant")] == [("user", "Snow in Oslo?")]
        # The audit log keeps both branches, each new question naming the one it replaced.
        async with server.client(ADA) as c:
            rows = (await c.get(f"/conversations/{cid}/messages")).json()["items"]
        assert [(m["kind"], m["content"]) for m in rows] == [
            ("user", "Rain in Lyon?"),
            ("assistant", "echo: Rain in Lyon?"),
            ("user", "Rain in Lyon?"),
            ("assistant", "Rain, 12 mm, in Lyon."),
            ("user", "Snow in Oslo?"),
            ("assistant", "echo: Snow in Oslo?"),
        ]
        assert rows[2]["data"]["branch_of"] == rows[0]["id"]
        assert rows[4]["data"]["branch_of"] == rows[2]["id"]
        # After a reload: every version shown, the earlier ones marked.
        await page.reload()
        await expect(answers).to_have_count(3)
        await expect(page.locator(".msg.replaced")).to_have_count(4)
        await expect(answers.last.locator(".who")).not_to_contain_text("earlier")
        await expect(answers.last).to_contain_text("echo: Snow in Oslo?")
        await page.screenshot(path=str(ARTIFACTS / "web-nav-branches.png"))
        assert not errors, errors


async def test_regenerate_and_edit_through_the_api(db_path):
    async with running_server(db_path, settings=SETTINGS, environ=TOKENS) as server:
        async with server.client(ADA) as c:
            cid = (await c.post("/conversations", json={})).json()["id"]
            nothing = await c.post(f"/conversations/{cid}/regenerate")
            assert nothing.status_code == 409
            assert nothing.json()["error"]["code"] == "cannot_branch"
            assert (
                await c.post(f"/conversations/{cid}/edit", json={"content": "x"})
            ).status_code == 409
            await c.post(f"/conversations/{cid}/messages", json={"content": "first"})
            await (await server.agent.get_conversation(cid)).wait_idle()
            bad = await c.post(f"/conversations/{cid}/edit", json={"content": " "})
            assert bad.status_code == 422
            again = await c.post(f"/conversations/{cid}/regenerate", json={})
            assert again.status_code == 202
            first_id = (await c.get(f"/conversations/{cid}/messages")).json()["items"][0]["id"]
            assert again.json()["branch_of"] == first_id
            await (await server.agent.get_conversation(cid)).wait_idle()
            edited = await c.post(f"/conversations/{cid}/edit", json={"content": "second"})
            assert edited.status_code == 202
            await (await server.agent.get_conversation(cid)).wait_idle()
            rows = (await c.get(f"/conversations/{cid}/messages")).json()["items"]
            assert [m["content"] for m in rows] == [
                "first", "echo: first", "first", "echo: first", "second", "echo: second",
            ]  # fmt: skip
        # Another token's conversation cannot be branched (it is not there for it).
        async with server.client(ALICE) as alice:
            assert (await alice.post(f"/conversations/{cid}/regenerate")).status_code == 404


async def test_a_failed_turn_is_an_error_entry_of_the_audit_log_the_page_shows(db_path, browser):
    expect.set_options(timeout=60_000)
    secret = "http://10.9.8.7:8000/v1/chat/completions with key sk-live-abcdef0123456789"
    async with running_server(db_path, settings=SETTINGS, environ=TOKENS) as server:
        cid = await _conversation(server, "Failing")
        server.model.enqueue(
            Reply(fail_after=0, error=LLMStatusError(f"bad request to {secret}", status_code=400)),
            Reply(chunks=["Half an ", "answer"], fail_after=1),
        )
        async with server.client(ADA) as c:
            for q in ("Will it rain?", "And snow?"):
                await c.post(f"/conversations/{cid}/messages", json={"content": q})
                await (await server.agent.get_conversation(cid)).wait_idle()
            rows = (await c.get(f"/conversations/{cid}/messages")).json()["items"]
        # Each failure is a row of the history: an empty answer, or the partial one.
        failed = [m for m in rows if m["kind"] == "assistant"]
        assert [(m["content"], m["status"], m["data"]["error"]["type"]) for m in failed] == [
            ("", "error", "LLMStatusError"),
            ("Half an ", "error", "LLMConnectionError"),
        ]
        assert "10.9.8.7" not in str(rows) and "sk-live" not in str(rows)
        assert "(address hidden)" in failed[0]["data"]["error"]["message"]
        # A browser that never saw the turns shows both failures, from the history.
        page, errors = await _open(browser, server, LAPTOP)
        await page.goto(server.url + _path(cid))
        await expect(page.locator(".msg")).to_have_text(
            [
                re.compile(r"Will it rain\?"),
                re.compile(
                    r"The answer failed \(LLMStatusError\): bad request to \(address hidden\)"
                ),
                re.compile(r"And snow\?"),
                re.compile(r"Half an[\s\S]*The answer failed \(LLMConnectionError\)"),
            ]
        )
        assert "sk-live" not in await page.locator("body").inner_text()
        await page.screenshot(path=str(ARTIFACTS / "web-nav-failed-history.png"))
        assert not errors, errors
