"""The web chat page as people use it, in headless Chromium at a laptop's and a
phone's size: Markdown answers (tables, highlighted code, safe links), hostile
model output kept inert, the phone drawer, keyboard-only use, tool cards in the
order they ran, a failed turn that still says so after a reload, the assistant's
configured name, and axe-core's accessibility check.

Screenshots go to ``tests/artifacts/`` (git-ignored).  axe-core comes from npm
(``make test`` installs it into ``.npm-tools``, as it does the MCP reference
server; ``AGENTIK_AXE`` names another copy); it is never served by the bot.
"""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import expect

from agentik.core.errors import LLMStatusError
from agentik.core.testing.scripted import Reply, call
from agentik.core.tools.base import TurnPolicy, tool

from httpserver import TOKENS, running_server

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
SETTINGS = {"tokens": [{"name": "ada", "env": "ADMIN_TOKEN"}]}
LAPTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
SIZES = pytest.mark.parametrize("size", [LAPTOP, PHONE], ids=["1280x800", "390x844"])

MARKDOWN = """## Weather

| city | rain |
|------|------|
| Lyon | 12 mm |
| Oslo | 30 mm |

```python
def rain(city: str) -> int:
    return 12  # millimetres
```

See [the forecast](https://example.org/forecast) and `inline code`.
"""

#: Hostile model output (after the DOMPurify test payloads): none of it may run,
#: carry an event handler, a ``javascript:`` link, or an SVG or image element.
XSS = [
    "<script>window.__xss = 1</script>",
    '<img src=x onerror="window.__xss = 2">',
    '<svg onload="window.__xss = 3"><circle r="4"/></svg>',
    "[click me](javascript:window.__xss=4)",
    '<a href="javascript:window.__xss=5">link</a>',
    '<iframe src="javascript:window.__xss=6"></iframe>',
    "![pixel](https://tracker.example/p.png)",
    '<math><mtext><table><mglyph><style><img src=x onerror="window.__xss=7">',
    '<details open ontoggle="window.__xss=8">x</details>',
    "[data](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
]


def _axe_path() -> Path | None:
    given = os.environ.get("AGENTIK_AXE")
    path = Path(given) if given else ROOT / ".npm-tools/node_modules/axe-core/axe.min.js"
    return path if path.exists() else None


async def _open(
    browser,
    server,
    size: dict[str, int],
    token: str | None = TOKENS["ADMIN_TOKEN"],
    **context: Any,
):
    """A page of the web chat at ``size``, signed in; returns it and its error list
    (JavaScript errors and console errors, e.g. a Content-Security-Policy refusal)."""
    page = await (await browser.new_context(viewport=size, **context)).new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    # The first request without a token is answered 401 (then the page asks for
    # one): the browser logs that refusal, and nothing else may be logged.
    page.on(
        "console",
        lambda m: (
            errors.append(m.text) if m.type == "error" and "(Unauthorized)" not in m.text else None
        ),
    )
    page.on("dialog", lambda d: errors.append("dialog: " + d.message))
    await page.goto(server.url + "/")
    if token is not None:
        await page.fill("#token", token)
        await page.click("#save-token")
    return page, errors


async def _new_conversation(page, size: dict[str, int]) -> None:
    if size is PHONE:
        await page.click("#menu")
    await page.click("#new")
    await expect(page.locator("#status")).to_have_text("live")


async def _ask(page, text: str) -> None:
    await page.fill("#input", text)
    await page.press("#input", "Enter")


@SIZES
async def test_markdown_answers_render_tables_highlighted_code_and_safe_links(
    db_path, browser, size
):
    expect.set_options(timeout=60_000)
    async with running_server(db_path, settings=SETTINGS, environ=TOKENS, id="Ada") as server:
        page, errors = await _open(browser, server, size)
        await _new_conversation(page, size)
        server.model.enqueue(Reply(chunks=[MARKDOWN[:40], MARKDOWN[40:90], MARKDOWN[90:]]))
        await _ask(page, "Rain in **Lyon**?")
        answer = page.locator(".msg.assistant").last
        await expect(answer.locator("table tr")).to_have_count(3)
        await expect(answer.locator("h2")).to_have_text("Weather")
        # Highlighted (highlight.js marks the block and its keywords), with a copy button.
        code = answer.locator("pre code")
        await expect(code).to_have_class(re.compile("hljs"))
        await expect(code.locator(".hljs-keyword").first).to_have_text("def")
        await expect(answer.get_by_role("button", name="Copy code")).to_have_count(1)
        link = answer.locator("a")
        await expect(link).to_have_attribute("href", "https://example.org/forecast")
        await expect(link).to_have_attribute("rel", "noopener noreferrer")
        await expect(link).to_have_attribute("target", "_blank")
        # The assistant goes by the configured name; the question is shown as typed.
        await expect(answer.locator(".who")).to_have_text("Ada")
        await expect(page.locator(".msg.user .text").last).to_have_text("Rain in **Lyon**?")
        # The same after a reload, from the history.
        await page.reload()
        if size is PHONE:
            await page.click("#menu")
        await page.locator("#conversations li button").first.click()
        history = page.locator(".msg.assistant").last
        await expect(history.locator("table tr")).to_have_count(3)
        await expect(history.locator("pre code .hljs-keyword").first).to_have_text("def")
        await expect(history.locator(".who")).to_have_text("Ada")
        await page.screenshot(path=str(ARTIFACTS / f"web-markdown-{size['width']}.png"))
        assert not errors, errors


async def test_hostile_model_output_titles_and_tool_results_stay_inert(db_path, browser):
    expect.set_options(timeout=60_000)

    @tool(name="fetch_page", description="Fetch a page", parameters={"type": "object"})
    async def fetch_page() -> str:
        return "\n".join(XSS)

    payload = "\n\n".join(XSS)
    async with running_server(
        db_path, settings=SETTINGS, environ=TOKENS, tools=[fetch_page]
    ) as server:
        async with server.client(TOKENS["ADMIN_TOKEN"]) as c:
            await c.post("/conversations", json={"title": '<img src=x onerror="window.__xss=9">'})
        page, errors = await _open(browser, server, LAPTOP)
        await expect(page.locator("#conversations li")).to_have_count(1)
        await page.locator("#conversations li button").first.click()
        await expect(page.locator("#status")).to_have_text("live")
        await expect(page.locator("#title")).to_have_text('<img src=x onerror="window.__xss=9">')
        server.model.enqueue(Reply(tool_calls=[call("fetch_page", {})]), Reply(text=payload))
        await _ask(page, payload)
        answer = page.locator(".msg.assistant").last
        await expect(answer.locator(".tool")).to_contain_text("fetch_page — done")
        await expect(answer).to_contain_text("click me")
        await expect(page.locator("#stop")).to_be_disabled()
        found = await page.evaluate(
            """() => {
                const all = [...document.querySelectorAll("body *")];
                return {
                    xss: window.__xss || null,
                    scripts: document.querySelectorAll("#messages script, #title script").length,
                    handlers: all
                        .filter((e) => [...e.attributes].some((a) => a.name.startsWith("on")))
                        .map((e) => e.outerHTML.slice(0, 80)),
                    risky: [...document.querySelectorAll("#messages a[href], #messages iframe")]
                        .map((e) => e.getAttribute("href") || e.tagName)
                        .filter((h) => !/^https:/.test(h)),
                    media: document.querySelectorAll("#messages svg, #messages img, #messages math")
                        .length,
                };
            }"""
        )
        assert found == {"xss": None, "scripts": 0, "handlers": [], "risky": [], "media": 0}
        # The payloads are shown as text, for a person to read.
        await expect(answer).to_contain_text("<script>window.__xss = 1</script>")
        await expect(answer.locator(".tool pre.result")).to_contain_text(
            'onerror="window.__xss = 2"'
        )
        assert not [e for e in errors if "Content Security Policy" not in e], errors


async def test_on_a_phone_the_list_is_a_drawer_and_nothing_scrolls_sideways(db_path, browser):
    expect.set_options(timeout=60_000)
    async with running_server(db_path, settings=SETTINGS, environ=TOKENS) as server:
        async with server.client(TOKENS["ADMIN_TOKEN"]) as c:
            earlier = (await c.post("/conversations", json={"title": "Weather in Lyon"})).json()
            await c.post(f"/conversations/{earlier['id']}/messages", json={"content": "Rain?"})
            await (await server.agent.get_conversation(earlier["id"])).wait_idle()
        page, errors = await _open(browser, server, PHONE)
        sidebar = page.locator("#sidebar")
        await expect(sidebar).not_to_be_in_viewport()
        await page.click("#menu")
        await expect(sidebar).to_be_in_viewport()
        await expect(page.locator("#menu")).to_have_attribute("aria-expanded", "true")
        await page.screenshot(path=str(ARTIFACTS / "web-phone-drawer.png"))
        await page.locator("#conversations li button").first.click()
        await expect(sidebar).not_to_be_in_viewport()
        await expect(page.locator(".msg.assistant")).to_have_text([re.compile("echo: Rain\\?")])
        long_word = "x" * 400
        await _ask(page, long_word + "\n```\n" + "y" * 300 + "\n```")
        await expect(page.locator(".msg.assistant")).to_have_count(2)
        size = await page.evaluate(
            """() => ({page: document.documentElement.scrollWidth,
                       body: document.body.scrollWidth,
                       input: document.getElementById("input").getBoundingClientRect().width,
                       send: document.getElementById("send").getBoundingClientRect().right})"""
        )
        assert size["page"] <= 390 and size["body"] <= 390, size
        assert size["input"] >= 250 and size["send"] <= 390, size
        await page.screenshot(path=str(ARTIFACTS / "web-phone-chat.png"))
        assert not errors, errors


async def test_a_keyboard_alone_opens_a_conversation_sends_and_uses_the_shortcuts(db_path, browser):
    expect.set_options(timeout=60_000)
    async with running_server(db_path) as server:
        async with server.client() as c:
            earlier = (await c.post("/conversations", json={"title": "Weather in Lyon"})).json()
            await c.post(f"/conversations/{earlier['id']}/messages", json={"content": "Rain?"})
            await (await server.agent.get_conversation(earlier["id"])).wait_idle()
        page, errors = await _open(browser, server, LAPTOP, token=None)
        await expect(page.locator("#conversations li")).to_have_count(1)
        # Tab from the top: the skip link, New, the search box, then the conversation.
        focused = []
        for _ in range(4):
            await page.keyboard.press("Tab")
            focused.append(await page.evaluate("() => document.activeElement.textContent.trim()"))
        assert focused[-1].startswith("Weather in Lyon"), focused
        await page.keyboard.press("Enter")
        await expect(page.locator("#title")).to_have_text("Weather in Lyon")
        await expect(page.locator("#input")).to_be_focused()
        await page.keyboard.type("Sunny tomorrow?")
        await page.keyboard.press("Enter")
        await expect(page.locator(".msg.assistant").last).to_contain_text("echo: Sunny tomorrow?")
        # The answer's text can show before its turn ends; editing a running turn is refused.
        await expect(page.locator("#stop")).to_be_disabled()
        # Edit the last message: it comes back into the box.
        await page.keyboard.press("ArrowUp")
        await expect(page.locator("#input")).to_have_value("Sunny tomorrow?")
        await page.keyboard.press("Control+A")
        await page.keyboard.type("Windy tomorrow?")
        await page.keyboard.press("Enter")
        await expect(page.locator(".msg.assistant").last).to_contain_text("echo: Windy tomorrow?")
        await expect(page.locator("#stop")).to_be_disabled()
        # Regenerate: the last question again.
        await page.keyboard.press("Alt+Shift+R")
        await expect(page.locator(".msg.assistant")).to_have_count(4)
        # The list of shortcuts, and back.
        await page.locator("#messages").focus()
        await page.keyboard.press("?")
        await expect(page.locator("#help")).to_be_visible()
        await page.keyboard.press("Escape")
        await expect(page.locator("#help")).to_be_hidden()
        # Search the list, then a new conversation.
        await page.keyboard.press("Alt+Shift+K")
        await expect(page.locator("#filter")).to_be_focused()
        await page.keyboard.type("nothing like this")
        await expect(page.locator("#conversations li:visible")).to_have_count(0)
        await page.keyboard.press("Alt+Shift+N")
        await expect(page.locator("#title")).to_have_text("Untitled")
        await expect(page.locator("#input")).to_be_focused()
        # Dark mode, toggled from the keyboard.
        before = await page.evaluate("() => document.documentElement.dataset.theme")
        await page.keyboard.press("Alt+Shift+L")
        after = await page.evaluate("() => document.documentElement.dataset.theme")
        assert {before, after} == {"light", "dark"}
        assert not errors, errors


async def test_dark_mode_follows_the_system(db_path, browser):
    expect.set_options(timeout=60_000)
    async with running_server(db_path) as server:
        context = await browser.new_context(color_scheme="dark", viewport=LAPTOP)
        page = await context.new_page()
        await page.goto(server.url + "/")
        await expect(page.locator("html")).to_have_attribute("data-theme", "dark")
        await expect(page.locator("#theme")).to_have_attribute("aria-pressed", "true")
        await page.screenshot(path=str(ARTIFACTS / "web-dark.png"))
        await context.close()


#: The page's background in each theme (``--bg``), as the browser computes it.
BACKGROUND = {"light": "rgb(246, 247, 249)", "dark": "rgb(20, 23, 28)"}


@pytest.mark.parametrize(
    ("system", "chosen", "shown"),
    [("light", "dark", "dark"), ("dark", None, "dark"), ("dark", "light", "light")],
    ids=["chosen-dark", "system-dark", "chosen-light"],
)
async def test_the_page_paints_in_its_theme_before_its_script_runs(
    db_path, browser, system, chosen, shown
):
    """The page's code (app.js) runs after its first paint; the theme (the system's,
    or the one chosen with the toggle) is set before it, so a page in dark mode never
    flashes light, and what the script adds afterwards moves nothing on screen."""
    expect.set_options(timeout=60_000)
    async with running_server(db_path) as server:
        conv = await server.agent.create_conversation(channel_key="http:web:local:t")
        await conv.rename("Theme")
        context = await browser.new_context(color_scheme=system, viewport=LAPTOP)
        if chosen is not None:
            await context.add_init_script(f"localStorage.setItem('agentik.theme', '{chosen}')")
        page = await context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        held, release = asyncio.Event(), asyncio.Event()

        async def hold_script(route) -> None:
            held.set()
            await release.wait()
            await route.continue_()

        await page.route(lambda url: "/static/app.js" in url, hold_script)
        await page.goto(server.url + "/", wait_until="commit")
        await asyncio.wait_for(held.wait(), 60)
        await page.wait_for_function(
            "() => performance.getEntriesByName('first-contentful-paint').length > 0"
        )
        # Painted, the script not run yet (it defines openConversation), in its theme.
        assert await page.evaluate("() => typeof openConversation") == "undefined"
        await expect(page.locator("html")).to_have_attribute("data-theme", shown)
        background = await page.evaluate("() => getComputedStyle(document.body).backgroundColor")
        assert background == BACKGROUND[shown]
        await page.screenshot(path=str(ARTIFACTS / f"web-before-script-{shown}.png"))
        await page.evaluate(
            """() => { window.shifted = 0; new PerformanceObserver((list) => {
                for (const e of list.getEntries()) if (!e.hadRecentInput) window.shifted += e.value;
            }).observe({type: "layout-shift", buffered: true}); }"""
        )
        release.set()
        await expect(page.locator("#conversations li")).to_have_text([re.compile("Theme")])
        pressed = "true" if shown == "dark" else "false"
        await expect(page.locator("#theme")).to_have_attribute("aria-pressed", pressed)
        await expect(page.locator("html")).to_have_attribute("data-theme", shown)
        # A frame after the list was drawn, nothing on screen has moved.
        await page.evaluate("() => new Promise((r) => requestAnimationFrame(() => setTimeout(r)))")
        assert await page.evaluate("() => window.shifted") == 0
        assert not errors, errors
        await context.close()


async def test_tool_cards_sit_in_the_answer_in_the_order_they_ran(db_path, browser):
    expect.set_options(timeout=60_000)

    @tool(name="lookup", description="Look up", parameters={"type": "object"})
    async def lookup(city: str = "") -> str:
        return "12 mm"

    async with running_server(db_path, settings=SETTINGS, environ=TOKENS, tools=[lookup]) as server:
        page, errors = await _open(browser, server, LAPTOP)
        await _new_conversation(page, LAPTOP)
        last = Reply(chunks=["It will ", "rain 12 mm."], hold_after=1)
        server.model.enqueue(
            Reply(chunks=["Let me check."], tool_calls=[call("lookup", {"city": "Lyon"})]), last
        )
        await _ask(page, "Rain in Lyon?")
        answer = page.locator(".msg.assistant").last
        await asyncio.wait_for(last.held.wait(), 60)
        # While it is still being written, the card stands between the two texts.
        await expect(answer.locator(":scope > .text, :scope > .tool")).to_have_text(
            ["Let me check.", re.compile("lookup — done"), re.compile("It will")]
        )
        await expect(answer.locator(".tool summary")).to_have_text("⚙ lookup — done")
        last.release.set()
        await expect(answer.locator(":scope > .text").last).to_have_text("It will rain 12 mm.")
        # The card opens to show the arguments and the result.
        await answer.locator(".tool summary").click()
        await expect(answer.locator(".tool pre.args")).to_contain_text('"city": "Lyon"')
        await expect(answer.locator(".tool pre.result")).to_have_text("12 mm")
        # The history shows the same order.
        await page.reload()
        await page.locator("#conversations li button").first.click()
        again = page.locator(".msg.assistant").last
        await expect(again.locator(":scope > .text, :scope > .tool")).to_have_text(
            ["Let me check.", re.compile("lookup — done"), "It will rain 12 mm."]
        )
        assert not errors, errors


async def test_a_failed_turn_says_so_without_secrets_and_still_after_a_reload(db_path, browser):
    expect.set_options(timeout=60_000)
    secret = "http://10.9.8.7:8000/v1/chat/completions with key sk-live-abcdef0123456789"
    async with running_server(db_path, settings=SETTINGS, environ=TOKENS) as server:
        page, errors = await _open(browser, server, LAPTOP)
        await _new_conversation(page, LAPTOP)
        server.model.enqueue(
            Reply(fail_after=0, error=LLMStatusError(f"bad request to {secret}", status_code=400))
        )
        await _ask(page, "Will it rain?")
        answer = page.locator(".msg.assistant").last
        await expect(answer.locator(".failure")).to_contain_text(
            "The answer failed (LLMStatusError)"
        )
        await expect(page.locator("#stop")).to_be_disabled()
        text = await page.locator("body").inner_text()
        assert "10.9.8.7" not in text and "sk-live" not in text
        # A later turn works, and after a reload the failed one still says it failed.
        await _ask(page, "And now?")
        await expect(page.locator(".msg.assistant").last).to_contain_text("echo: And now?")
        await page.reload()
        await page.locator("#conversations li button").first.click()
        await expect(page.locator(".msg")).to_have_text(
            [
                re.compile("Will it rain\\?"),
                re.compile(r"The answer failed \(LLMStatusError\)"),
                re.compile("And now\\?"),
                re.compile("echo: And now\\?"),
            ]
        )
        await page.screenshot(path=str(ARTIFACTS / "web-failed-turn.png"))
        assert not errors, errors


@SIZES
async def test_axe_finds_no_serious_violations(db_path, browser, size):
    axe = _axe_path()
    if axe is None:
        message = (
            "axe-core is missing: `make test` installs it into .npm-tools (or set AGENTIK_AXE)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    expect.set_options(timeout=60_000)
    from agentik.core.approvals import ApprovalRule

    @tool(name="lookup", description="Look up", parameters={"type": "object"})
    async def lookup() -> str:
        return "12 mm"

    @tool(name="fs__write_file", description="Write", parameters={"type": "object"})
    async def write() -> str:
        return "written"

    rules = [ApprovalRule(tools=("fs__*",), approvers="user", self_approve=True)]
    async with running_server(
        db_path, settings=SETTINGS, environ=TOKENS, tools=[lookup, write], approvals=rules
    ) as server:
        # axe is injected as a script of its own: the page's policy would refuse it.
        # The phone is in dark mode (the system's), the laptop in light.
        scheme = "dark" if size is PHONE else "light"
        page, _ = await _open(browser, server, size, bypass_csp=True, color_scheme=scheme)
        await expect(page.locator("html")).to_have_attribute("data-theme", scheme)
        await expect(page.locator("#conversations")).to_be_attached()
        assert await _serious(page, axe) == []
        await _new_conversation(page, size)
        server.model.enqueue(
            Reply(text=MARKDOWN, tool_calls=[call("lookup", {})]),
            Reply(tool_calls=[call("fs__write_file", {})]),
        )
        await _ask(page, "Rain?")
        await expect(
            page.locator(".approval").last.get_by_role("button", name="Approve")
        ).to_be_visible()
        assert await _serious(page, axe) == []
        await page.locator(".approval").last.get_by_role("button", name="Deny").click()
        await expect(page.locator("#stop")).to_be_disabled()
        server.model.enqueue(Reply(fail_after=0, error=LLMStatusError("no", status_code=400)))
        await _ask(page, "Again?")
        await expect(page.locator(".failure")).to_have_count(1)
        await expect(page.locator("pre code.hljs")).to_have_count(1)
        assert await _serious(page, axe) == []
        if size is PHONE:
            await page.click("#menu")
            assert await _serious(page, axe) == []
        await page.screenshot(path=str(ARTIFACTS / f"web-axe-{size['width']}.png"), full_page=True)


async def _serious(page, axe: Path) -> list[dict[str, Any]]:
    """axe-core's serious and critical violations on the page as it stands."""
    if not await page.evaluate("() => !!window.axe"):
        await page.add_script_tag(path=str(axe))
    result = await page.evaluate("async () => (await axe.run(document)).violations")
    return [
        {"id": v["id"], "nodes": [n["target"] for n in v["nodes"]][:3]}
        for v in result
        if v["impact"] in ("serious", "critical")
    ]


async def test_the_local_user_named_an_admin_may_approve_from_the_page(db_path, browser):
    """docs/web.md: without tokens the person at the page is ``web:token:local``;
    ``[access] admins = ["web:token:local"]`` lets them approve admin-only calls."""
    from agentik.core.access import AccessPolicy, AccessSettings
    from agentik.core.approvals import ApprovalRule

    expect.set_options(timeout=60_000)
    calls: list[str] = []

    @tool(name="fs__write_file", description="Write", parameters={"type": "object"})
    async def write() -> str:
        calls.append("write")
        return "written"

    rules = [ApprovalRule(tools=("fs__*",), approvers="admin", self_approve=True)]
    access = AccessPolicy(AccessSettings(admins=("web:token:local",)), {"web": "http"})
    async with running_server(db_path, tools=[write], approvals=rules, access=access) as server:
        page, errors = await _open(browser, server, LAPTOP, token=None)
        await _new_conversation(page, LAPTOP)
        server.model.enqueue(Reply(tool_calls=[call("fs__write_file", {})]), "written it")
        await _ask(page, "write it")
        box = page.locator(".approval").last
        await box.get_by_role("button", name="Approve").click()
        await expect(box).to_have_text(re.compile(r"approved by local$"))
        await expect(page.locator(".msg.assistant").last).to_contain_text("written it")
        assert calls == ["write"] and not errors, errors


async def test_streaming_into_a_long_chat_touches_only_the_answer_being_written(db_path, browser):
    # 90+ messages: an answer streaming in changes its own bubble and nothing
    # before it (the page does not redraw the list per piece of text).
    expect.set_options(timeout=60_000)
    async with running_server(db_path) as server:
        async with server.client() as c:
            cid = (await c.post("/conversations", json={"title": "Long"})).json()["id"]
        conv = await server.agent.get_conversation(cid)
        for i in range(48):
            server.model.enqueue(Reply(text=f"answer {i}\n\n```python\nx = {i}\n```"))
            await conv.send(f"question {i}")
            await conv.wait_idle()
        page, errors = await _open(browser, server, LAPTOP, token=None)
        await page.locator("#conversations li button").first.click()
        # The history is shown (its latest page at least: older ones may come too).
        await expect(page.locator(".msg.user .text").last).to_have_text("question 47")
        # The highlighter, loaded with the first code block, has done its work.
        await expect(page.locator(".msg.assistant pre code.hljs").last).to_be_attached()
        await page.evaluate(
            """() => {
                window.touched = new Set();
                const box = document.getElementById("messages");
                const before = new Set(box.children);
                // History answers still shown as plain text may turn into Markdown as
                // they come near the screen: that is not the stream's doing.
                const lazy = [...box.querySelectorAll(".text.pending")];
                new MutationObserver((records) => {
                    for (const r of records) {
                        if (lazy.some((part) => part.contains(r.target))) continue;
                        let node = r.target;
                        while (node && node.parentNode !== box) node = node.parentNode;
                        if (node && before.has(node)) window.touched.add(node.textContent);
                    }
                }).observe(box, {subtree: true, childList: true, characterData: true,
                                 attributes: true});
            }"""
        )
        reply = Reply(chunks=[f"piece {i} " for i in range(60)], delay=0.005)
        server.model.enqueue(reply)
        await _ask(page, "stream")
        await expect(page.locator(".msg.assistant").last).to_contain_text("piece 59")
        await expect(page.locator("#stop")).to_be_disabled()
        assert await page.evaluate("() => [...window.touched]") == []
        assert not errors, errors


async def test_a_long_chat_opens_at_its_latest_page_and_older_ones_come_on_scrolling_up(
    db_path, browser
):
    expect.set_options(timeout=60_000)

    @tool(name="clock", description="The time", parameters={"type": "object"})
    async def clock() -> str:
        return "noon"

    async with running_server(db_path, tools=[clock]) as server:
        async with server.client() as c:
            cid = (await c.post("/conversations", json={"title": "Long"})).json()["id"]
        conv = await server.agent.get_conversation(cid)
        for i in range(40):
            if i == 5:  # a turn with a tool call: it stays whole across pages
                server.model.enqueue(Reply(tool_calls=[call("clock", {})]))
            server.model.enqueue(Reply(text=f"answer {i}"))
            await conv.send(f"question {i}")
            await conv.wait_idle()
        page, errors = await _open(browser, server, LAPTOP, token=None)
        await page.locator("#conversations li button").first.click()
        questions = page.locator(".msg.user .text")
        await expect(questions.last).to_have_text("question 39")
        shown = await questions.count()
        assert shown < 40
        # Scrolling up brings the earlier messages, above, in order, without a jump
        # of what was on screen.
        for _ in range(10):
            if await page.locator("#messages .earlier").count() == 0:
                break
            await page.locator("#messages").evaluate("(box) => { box.scrollTop = 0; }")
            await page.wait_for_function(
                "(n) => document.querySelectorAll('.msg.user').length > n"
                " || !document.querySelector('#messages .earlier')",
                arg=await questions.count(),
            )
        await expect(questions).to_have_count(40)
        texts = await questions.all_text_contents()
        assert texts == [f"question {i}" for i in range(40)]
        answers = await page.locator(".msg.assistant").all_text_contents()
        assert len(answers) == 40 and all(f"answer {i}" in a for i, a in enumerate(answers))
        await expect(page.locator(".msg.assistant .tool")).to_have_count(1)
        await expect(page.locator(".msg.assistant").nth(5).locator(".tool")).to_have_count(1)
        assert not errors, errors


async def _turns(conv, server, texts: list[str], long_at: int, steps: int) -> None:
    """One turn per text, each answered; the turn ``long_at`` runs ``steps`` tool calls
    (each step a line of text, then the call: three rows of the history a step)."""
    for i, text in enumerate(texts):
        if i == long_at:
            for n in range(steps):
                server.model.enqueue(Reply(text=f"step {n}", tool_calls=[call("clock", {})]))
        server.model.enqueue(Reply(text=f"answer {i}"))
        await conv.send(text)
        await conv.wait_idle()


async def test_a_turn_longer_than_a_history_page_is_shown_whole_and_in_order(db_path, browser):
    """A turn of 25 tool calls (77 rows of the history, a page is 50): shown as one
    answer, its steps and tool cards in order, each card with its result, under its
    question, whether it is the latest turn or one an older page brings."""
    expect.set_options(timeout=60_000)
    steps = 25

    @tool(name="clock", description="The time", parameters={"type": "object"})
    async def clock() -> str:
        return "noon"

    whole = ["step 0", *(x for n in range(1, steps) for x in ("⚙ clock — done", f"step {n}")),
             "⚙ clock — done"]  # fmt: skip
    async with running_server(
        db_path, tools=[clock], policy=TurnPolicy(max_tool_calls=100)
    ) as server:
        async with server.client() as c:
            middle = (await c.post("/conversations", json={"title": "Middle"})).json()["id"]
            last = (await c.post("/conversations", json={"title": "Last"})).json()["id"]
        # The long turn in the middle: the latest page is its tail and the turn after it.
        questions = [f"question {i}" for i in range(5)]
        await _turns(await server.agent.get_conversation(middle), server, questions, 3, steps)
        # The long turn last: the latest page starts inside it.
        await _turns(await server.agent.get_conversation(last), server, questions[:2], 1, steps)

        page, errors = await _open(browser, server, LAPTOP, token=None)
        asked = page.locator(".msg.user .text")
        answers = page.locator(".msg.assistant")
        await page.locator("#conversations li button", has_text="Last").click()
        await expect(asked).to_have_text(["question 0", "question 1"])
        await expect(answers).to_have_count(2)
        await expect(answers.nth(1).locator(":scope > .text, :scope > .tool summary")).to_have_text(
            [*whole, "answer 1"]
        )
        await page.screenshot(path=str(ARTIFACTS / "long-turn-latest.png"))

        async with page.expect_response(lambda r: "/messages?" in r.url) as first:
            await page.locator("#conversations li button", has_text="Middle").click()
        # Its latest page: the turn after the long one (the long one is read when the
        # reader goes up, or at once when the page's top is near the screen: that
        # depends on the layout, so the page read first is what is checked).
        latest = await (await first.value).json()
        assert "question 4" in {m["content"] for m in latest["items"]}
        assert "question 3" not in {m["content"] for m in latest["items"]}
        await expect(asked.last).to_have_text("question 4")
        for _ in range(10):
            if await page.locator("#messages .earlier").count() == 0:
                break
            await page.locator("#messages").evaluate("(box) => { box.scrollTop = 0; }")
            await page.wait_for_function(
                "(n) => document.querySelectorAll('.msg.user').length > n"
                " || !document.querySelector('#messages .earlier')",
                arg=await asked.count(),
            )
        await expect(asked).to_have_text(questions)
        await expect(answers).to_have_count(5)
        # One answer, under its question, from its first step to its last, each card
        # with its result (a call and its result on two pages of the history included).
        await expect(answers.nth(3).locator(":scope > .text, :scope > .tool summary")).to_have_text(
            [*whole, "answer 3"]
        )
        await expect(answers.nth(3).locator(".tool pre.result")).to_have_count(steps)
        await page.screenshot(path=str(ARTIFACTS / "long-turn-older.png"))
        assert not errors, errors


async def test_a_long_answer_streams_without_redrawing_what_it_has_shown(db_path, browser):
    # Each frame shows the answer's tail again, not its whole length: what is above
    # stays the same elements (a selection there survives), and the result is the
    # same Markdown as read from the history (a code fence with a blank line in it
    # is never cut).
    expect.set_options(timeout=60_000)
    paragraphs = [f"Paragraph {i}: " + "words " * 60 for i in range(8)]
    code = "```python\ndef f():\n\n    return 1\n```"
    text = "\n\n".join([*paragraphs[:4], code, "1. one\n2. two", "3. three", *paragraphs[4:]])
    chunks = [text[i : i + 40] for i in range(0, len(text), 40)]
    async with running_server(db_path) as server:
        page, errors = await _open(browser, server, LAPTOP, token=None)
        await _new_conversation(page, LAPTOP)
        reply = Reply(chunks=chunks, hold_after=len(chunks) // 2)
        server.model.enqueue(reply)
        await _ask(page, "a long one")
        await reply.held.wait()
        answer = page.locator(".msg.assistant").last
        first = answer.locator("p").first
        await expect(first).to_contain_text("Paragraph 0")
        # What is held (past 1,500 characters) is cut once the page has shown it: the
        # paragraphs above the cut are then shown for good, in a part of their own. Mark
        # one only then: a frame that came before the cut (a loaded machine's SSE
        # deltas arrive in several) still had it in the tail, drawn again at the cut.
        await expect(answer.locator(".text").nth(1)).to_be_attached()
        await first.evaluate("(p) => { p.kept = true; }")
        reply.release.set()
        await expect(page.locator("#stop")).to_be_disabled()
        await expect(answer).to_contain_text("Paragraph 7")
        assert await first.evaluate("(p) => p.kept === true && p.isConnected")
        assert await answer.locator(".text").count() > 1

        async def shown() -> tuple[int, list[str], int]:
            return (
                await answer.locator("p").count(),
                await answer.locator("pre code").all_text_contents(),
                await answer.locator("li").count(),
            )

        live = await shown()
        assert live[0] >= 8 and live[1:] == (["def f():\n\n    return 1\n"], 3), live
        await page.reload()
        await page.locator("#conversations li button").first.click()
        await expect(answer.locator("pre code")).to_have_count(1)
        assert await shown() == live
        assert not errors, errors


async def test_math_is_typeset_by_katex_loaded_only_when_a_message_holds_math(db_path, browser):
    expect.set_options(timeout=60_000)
    async with running_server(db_path) as server:
        page, errors = await _open(browser, server, LAPTOP, token=None)
        asked: list[str] = []
        page.on("request", lambda r: asked.append(r.url))
        await _new_conversation(page, LAPTOP)
        # Prices with dollars are not math: nothing of KaTeX is fetched for them.
        server.model.enqueue(
            Reply(text="It costs $5, or $10 with **shipping**.\n\n```python\nx = 1\n```")
        )
        await _ask(page, "how much?")
        answer = page.locator(".msg.assistant").last
        await expect(answer.locator("strong")).to_have_text("shipping")
        await expect(answer.locator("pre code.hljs")).to_have_count(1)
        await expect(answer).to_contain_text("It costs $5, or $10 with shipping.")
        assert not [u for u in asked if "katex" in u], asked
        server.model.enqueue(
            Reply(
                text="Euler: \\(e^{i\\pi} + 1 = 0\\), for $3.\n\n"
                "$$\n\\sum_{k=1}^{n} k_i = \\frac{n(n+1)}{2}\n$$\n\n"
                "Not a link: \\(\\href{javascript:alert(1)}{x}\\)"
            )
        )
        await _ask(page, "some math")
        answer = page.locator(".msg.assistant").last
        # Typeset: an inline formula and a display, each with MathML for screen readers.
        await expect(answer.locator(".katex")).to_have_count(3)
        await expect(answer.locator(".katex-display")).to_have_count(1)
        await expect(answer.locator(".katex-mathml math")).to_have_count(3)
        await expect(answer.locator(".katex-display .mfrac")).to_have_count(1)
        # The underscore and backslashes reached KaTeX, not marked's emphasis.
        await expect(answer.locator("em")).to_have_count(0)
        await expect(answer).to_contain_text("for $3.")
        # KaTeX's \href is refused (trust is off): no link.
        await expect(answer.locator("a")).to_have_count(0)
        assert any("/static/vendor/katex/katex.min.js?v=" in u for u in asked), asked
        assert any("/static/vendor/katex/katex.min.css?v=" in u for u in asked), asked
        # The same from the history, after a reload (KaTeX loaded again, for this page).
        await page.reload()
        await page.locator("#conversations li button").first.click()
        again = page.locator(".msg.assistant").last
        await expect(again.locator(".katex-display .mfrac")).to_have_count(1)
        await page.screenshot(path=str(ARTIFACTS / "web-math.png"))
        assert not errors, errors


async def test_a_huge_paste_waits_beside_the_box_and_is_sent_with_the_message(db_path, browser):
    expect.set_options(timeout=60_000)
    lines = "\n".join(f"line {i}: some pasted log text" for i in range(20_000))
    async with running_server(db_path) as server:
        page, errors = await _open(browser, server, PHONE, token=None)
        await _new_conversation(page, PHONE)
        await page.fill("#input", "What went wrong here?")
        await page.evaluate(
            """(text) => {
                const data = new DataTransfer();
                data.setData("text/plain", text);
                document.getElementById("input").dispatchEvent(new ClipboardEvent("paste",
                    {clipboardData: data, bubbles: true, cancelable: true}));
            }""",
            lines,
        )
        await expect(page.locator("#pasted")).to_contain_text("Pasted text: 20,000 lines")
        await expect(page.locator("#input")).to_have_value("What went wrong here?")
        await page.press("#input", "Enter")
        sent = page.locator(".msg.user").last
        await expect(sent.get_by_role("button", name=re.compile("Show all"))).to_have_text(
            re.compile("20,002 lines")
        )
        await expect(page.locator("#pasted")).to_be_hidden()
        await expect(page.locator(".msg.assistant").last).to_contain_text(
            "echo: What went wrong here?"
        )
        await sent.get_by_role("button", name=re.compile("Show all")).click()
        await expect(sent.locator(".text")).to_contain_text("line 19999: some pasted log text")
        assert not errors, errors
    with sqlite3.connect(db_path) as db:
        (content,) = db.execute("SELECT content FROM message WHERE kind = 'user'").fetchone()
    assert content == "What went wrong here?\n\n" + lines


async def test_a_wrong_token_is_said_so_in_the_token_dialog(db_path, browser):
    expect.set_options(timeout=60_000)
    async with running_server(db_path, settings=SETTINGS, environ=TOKENS) as server:
        page, errors = await _open(browser, server, LAPTOP, token="not-the-token")
        await expect(page.locator("#auth")).to_be_visible()
        await expect(page.locator("#auth-error")).to_have_text(
            "That token was not accepted (wrong or expired)."
        )
        await page.fill("#token", TOKENS["ADMIN_TOKEN"])
        await page.click("#save-token")
        await expect(page.locator("#auth")).to_be_hidden()
        await _new_conversation(page, LAPTOP)
        assert not errors, errors


async def test_the_page_scripts_are_served_compressed_revalidated_and_nothing_else(db_path):
    async with running_server(db_path) as server:
        async with server.client() as c:
            page = await c.get(server.url + "/", headers={"Accept-Encoding": "gzip"})
            assert page.headers["content-encoding"] == "gzip" and "<html" in page.text
            policy = page.headers["content-security-policy"]
            scripts = next(p for p in policy.split("; ") if p.startswith("script-src "))
            assert scripts.split()[-1] == "'self'" and "unsafe" not in policy
            # The page's own code: deferred (the markup paints first), asked for by the
            # version of the static files, so kept for good (a reload asks for nothing),
            # as are the libraries the page asks for by it; another version (an older
            # page's) is only revalidated.
            (src,) = re.findall(r'<script defer src="([^"]+)"></script>', page.text)
            (version,) = re.findall(r' data-v="(\w+)">', page.text)
            assert src == "/static/app.js?v=" + version
            script = await c.get(server.url + src, headers={"Accept-Encoding": "gzip"})
            assert script.status_code == 200 and "function openConversation" in script.text
            assert script.headers["cache-control"] == "max-age=31536000, immutable"
            assert script.headers["content-encoding"] == "gzip"
            library = await c.get(server.url + "/static/vendor/purify.min.js?v=" + version)
            assert library.headers["cache-control"] == "max-age=31536000, immutable"
            assert "DOMPurify" in library.text
            for stale in ("/static/app.js?v=0123", "/static/app.js"):
                again = await c.get(server.url + stale)
                assert again.status_code == 200 and again.headers["cache-control"] == "no-cache"
            url = server.url + "/static/vendor/marked.umd.js"
            first = await c.get(url, headers={"Accept-Encoding": "gzip"})
            assert first.status_code == 200 and "marked v18" in first.text
            assert first.headers["content-encoding"] == "gzip"
            assert first.headers["content-type"].startswith("text/javascript")
            again = await c.get(url, headers={"If-None-Match": first.headers["etag"]})
            assert again.status_code == 304 and again.content == b""
            plain = await c.get(
                server.url + "/static/highlight.js", headers={"Accept-Encoding": ""}
            )
            assert "content-encoding" not in plain.headers and "registerLanguage" in plain.text
            # KaTeX's stylesheet (compressed) and fonts (woff2 is compressed already).
            css = await c.get(
                server.url + "/static/vendor/katex/katex.min.css",
                headers={"Accept-Encoding": "gzip"},
            )
            assert css.headers["content-type"].startswith("text/css")
            assert css.headers["content-encoding"] == "gzip" and ".katex" in css.text
            font = await c.get(
                server.url + "/static/vendor/katex/fonts/KaTeX_Main-Regular.woff2",
                headers={"Accept-Encoding": "gzip"},
            )
            assert font.status_code == 200 and font.headers["content-type"] == "font/woff2"
            assert "content-encoding" not in font.headers and font.content[:4] == b"wOF2"
            font_policy = next(p for p in policy.split("; ") if p.startswith("font-src "))
            assert font_policy == "font-src 'self'"
            for other in (
                "/static/index.html",
                "/static/vendor/README.md",
                "/static/vendor/LICENSE.marked",
                "/static/vendor/LICENSE.katex",
                "/static/vendor/katex/fonts/KaTeX_Main-Regular.ttf",
                "/static/../api.py",
                "/static/vendor/nothing.js",
            ):
                assert (await c.get(server.url + other)).status_code == 404, other


async def test_an_image_attached_on_the_page_reaches_the_model_as_an_image_part(db_path, browser):
    import base64

    from agentik.core import OpenAIBackend
    from agentik.core.testing.openai_server import FakeOpenAIServer
    from agentik.core.testing.openai_server import Reply as OpenAIReply

    png = base64.b64decode(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
    )
    expect.set_options(timeout=60_000)
    async with FakeOpenAIServer(model="fake-model") as fake:
        fake.enqueue(OpenAIReply.text("a red dot"))
        llm = OpenAIBackend(model="fake-model", base_url=fake.base_url, api_key="sk-test",
                            max_retries=0, image_in=True)  # fmt: skip
        async with running_server(db_path, model=llm) as server:
            page, errors = await _open(browser, server, LAPTOP, token=None)
            await _new_conversation(page, LAPTOP)
            await page.set_input_files(
                "#attach-file", files=[{"name": "dot.png", "mimeType": "image/png", "buffer": png}]
            )
            chip = page.locator("#attached .chip")
            await expect(chip).to_contain_text("dot.png")
            await expect(chip.locator("img.thumb")).to_have_attribute("src", re.compile("^blob:"))
            await _ask(page, "what is this?")
            await expect(page.locator(".msg.assistant").last).to_contain_text("a red dot")
            await expect(page.locator(".msg.user .parts img.thumb")).to_have_count(1)
            await expect(page.locator("#attached")).to_be_hidden()
            user = [m for m in fake.requests[-1]["messages"] if m["role"] == "user"][-1]
            assert user["content"][1]["image_url"]["url"].startswith("data:image/png;base64,")
            # After a reload the message still shows its image.
            await page.reload()
            await page.locator("#conversations li button").first.click()
            await expect(page.locator(".msg.user .parts img.thumb")).to_have_attribute(
                "src", re.compile("^blob:")
            )
            assert not errors, errors


async def test_an_image_sent_without_words_reaches_the_model_with_no_made_up_text(db_path, browser):
    """The page used to send "(attached)" for an image without words; the API takes an
    image on its own now, and the page sends it as it is."""
    import base64

    from agentik.core import OpenAIBackend
    from agentik.core.testing.openai_server import FakeOpenAIServer
    from agentik.core.testing.openai_server import Reply as OpenAIReply

    png = base64.b64decode(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
    )
    expect.set_options(timeout=60_000)
    async with FakeOpenAIServer(model="fake-model") as fake:
        fake.enqueue(OpenAIReply.text("a red dot"))
        llm = OpenAIBackend(model="fake-model", base_url=fake.base_url, api_key="sk-test",
                            max_retries=0, image_in=True)  # fmt: skip
        async with running_server(db_path, model=llm) as server:
            page, errors = await _open(browser, server, PHONE, token=None)
            await _new_conversation(page, PHONE)
            await page.set_input_files(
                "#attach-file", files=[{"name": "dot.png", "mimeType": "image/png", "buffer": png}]
            )
            await expect(page.locator("#attached .chip")).to_contain_text("dot.png")
            await _ask(page, "")  # Enter in an empty message box: the image alone
            await expect(page.locator(".msg.assistant").last).to_contain_text("a red dot")
            user = [m for m in fake.requests[-1]["messages"] if m["role"] == "user"][-1]
            kinds = [p["type"] for p in user["content"]]
            assert "image_url" in kinds
            assert not any("attached" in p.get("text", "") for p in user["content"])
            bubble = page.locator(".msg.user").last
            await expect(bubble.locator(".parts img.thumb")).to_have_count(1)
            await expect(bubble).not_to_contain_text("attached")
            # After a reload (the conversation's URL opens it again): the image, still
            # no words made up for it.
            await page.reload()
            bubble = page.locator(".msg.user").last
            await expect(bubble.locator(".parts img.thumb")).to_have_attribute(
                "src", re.compile("^blob:")
            )
            await expect(bubble).not_to_contain_text("attached")
            assert not errors, errors


async def test_a_page_opened_while_an_answer_is_written_shows_all_of_it(db_path, browser):
    """The page opened while an answer is being written shows the pieces sent before it
    came (its stream starts with the running turn: ``replay=turn``; it showed only
    "written." of "The answer is being written." before), then the rest."""
    expect.set_options(timeout=60_000)
    async with running_server(db_path, settings=SETTINGS, environ=TOKENS) as server:
        conv = await server.agent.create_conversation(channel_key="http:web:admin:late")
        await conv.rename("Late")
        held = Reply(chunks=["The answer ", "is being ", "written."], hold_after=2)
        server.model.enqueue(held)
        await conv.send("Write it", author="admin")
        await asyncio.wait_for(held.held.wait(), 60)
        page, errors = await _open(browser, server, LAPTOP)
        await page.locator("#conversations li button", has_text="Late").click()
        await expect(page.locator("#status")).to_have_text("live")
        answer = page.locator(".msg.assistant").last
        # It follows the turn from its start (``replay=turn``): the pieces written before
        # it was opened are there while the rest is held.
        await expect(answer.locator(".text")).to_have_text(["The answer is being"])
        held.release.set()
        await expect(answer.locator(".text")).to_have_text(["The answer is being written."])
        assert not errors, errors


async def test_a_turn_that_ends_while_the_page_reads_the_history_is_shown_answered(
    db_path, browser
):
    """Opening a conversation reads it (a turn runs), its history (no answer yet) and its
    status; when the turn ends between those reads, the status says nothing runs and the
    history has the question alone.  The page showed "No answer: this turn failed" under
    it and then the answer in a second bubble (CI, two workers); it reads the history
    again instead and shows the one answer."""
    expect.set_options(timeout=60_000)
    async with running_server(db_path, settings=SETTINGS, environ=TOKENS) as server:
        conv = await server.agent.create_conversation(channel_key="http:web:admin:ending")
        await conv.rename("Ending")
        held = Reply(chunks=["Done ", "in time."], hold_after=1)
        server.model.enqueue(held)
        await conv.send("Finish it", author="admin")
        await asyncio.wait_for(held.held.wait(), 60)
        page, errors = await _open(browser, server, LAPTOP)
        status_asked, ended = asyncio.Event(), asyncio.Event()

        async def hold_status(route) -> None:
            if not ended.is_set():
                status_asked.set()
                await ended.wait()
            await route.continue_()

        await page.route(lambda url: url.endswith("/status"), hold_status)
        async with page.expect_response(lambda r: "/messages?" in r.url):
            await page.locator("#conversations li button", has_text="Ending").click()
        await asyncio.wait_for(status_asked.wait(), 60)
        # The history is read with the turn running; now it ends, then the status is read.
        held.release.set()
        await conv.wait_idle()
        ended.set()
        await expect(page.locator("#status")).to_have_text("live")
        await expect(page.locator(".msg.assistant")).to_have_text([re.compile("Done in time.")])
        await expect(page.locator("#stop")).to_be_disabled()
        assert await page.locator(".msg .failure").count() == 0
        assert not errors, errors
