"""Linked channels on the web page (issue 33): people of the linked networks show with
their name and a badge of their network (headless Chromium, as tests/test_http_browser.py)."""

from __future__ import annotations

from playwright.async_api import expect

from httpserver import TOKENS, running_server

SETTINGS = {"tokens": [{"name": "ada", "env": "ADMIN_TOKEN"}]}


async def test_the_page_shows_linked_authors_with_their_network_badge(db_path, browser):
    expect.set_options(timeout=60_000)
    async with running_server(db_path, settings=SETTINGS, environ=TOKENS) as server:
        async with server.client(TOKENS["ADMIN_TOKEN"]) as c:
            conv = (await c.post("/conversations", json={"title": "team"})).json()
            # Authors as a link records them (qualified by network), and a plain one.
            said = [("alice@libera", "from irc"), ("Bob (Slack)", "from slack"),
                    ("carol", "plain"), ("<b>x</b> (<i>y</i>)", "hostile")]  # fmt: skip
            for author, text in said:
                r = await c.post(f"/conversations/{conv['id']}/messages",
                                 json={"content": text, "author": author})  # fmt: skip
                assert r.status_code == 202, r.text
                await (await server.agent.get_conversation(conv["id"])).wait_idle()

        page = await browser.new_page(viewport={"width": 1180, "height": 760})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        await page.goto(server.url + "/")
        await page.fill("#token", TOKENS["ADMIN_TOKEN"])
        await page.click("#save-token")
        await page.locator("#conversations li").first.click()
        who = page.locator(".msg.user .who")
        await expect(who).to_have_count(4)
        # The name, then the network as a badge; a plain author as it is.
        await expect(page.locator(".msg.user .who .net")).to_have_text(
            ["libera", "Slack", "<i>y</i>"]
        )
        assert [t.strip() for t in await who.all_inner_texts()][:3] == [
            "alice libera", "Bob Slack", "carol",
        ]  # fmt: skip
        # Text, never markup: the hostile author's tags are shown, not made.
        assert await page.locator(".msg.user .who b, .msg.user .who i").count() == 0
        assert errors == []
