"""Uploads through the HTTP API (issue 34): multipart in, capped while read, typed by
the bytes; served back with safe headers; a message naming an upload reaches the model
request (the fake OpenAI server records it, the real ``openai`` SDK sends it) as an
image part."""

from __future__ import annotations

import base64
import hashlib

import pytest

from agentik.core import OpenAIBackend
from agentik.core.attachments import AttachmentSettings
from agentik.core.testing.openai_server import FakeOpenAIServer, Reply

from httpserver import running_server

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
PNG_SHA = hashlib.sha256(PNG).hexdigest()


@pytest.fixture
async def openai_server():
    async with FakeOpenAIServer(model="fake-model") as server:
        yield server


def _llm(server: FakeOpenAIServer, *, image_in: bool = True) -> OpenAIBackend:
    return OpenAIBackend(
        model="fake-model", base_url=server.base_url, api_key="sk-test", max_retries=0,
        image_in=image_in,
    )  # fmt: skip


async def _wait_answer(c, cid: str) -> list[dict]:
    """The history once the turn's answer is in it (no sleeps: the events say when)."""
    # after=0: from the start of the replay buffer (the turn may be over already).
    async with c.stream("GET", f"/conversations/{cid}/events?after=0") as r:
        async for line in r.aiter_lines():
            if '"turn_ended"' in line:
                break
    return (await c.get(f"/conversations/{cid}/messages")).json()["items"]


async def test_an_uploaded_image_reaches_the_model_as_an_image_part(db_path, openai_server):
    openai_server.enqueue(Reply.text("a dot"))
    async with running_server(db_path, model=_llm(openai_server)) as s, s.client() as c:
        conv = (await c.post("/conversations", json={})).json()
        assert conv["capabilities"] == {"image_in": True, "image_out": False}
        up = await c.post(
            f"/conversations/{conv['id']}/attachments",
            files={"file": ("../../etc/dot.png", PNG, "text/html")},  # the claims are ignored
        )
        assert up.status_code == 201, up.text
        att = up.json()
        assert att == {
            "sha256": PNG_SHA, "media_type": "image/png", "size": len(PNG), "name": "dot.png",
            "kind": "image", "url": f"/agentik/conversations/{conv['id']}/attachments/{PNG_SHA}",
        }  # fmt: skip
        sent = await c.post(
            f"/conversations/{conv['id']}/messages",
            json={
                "content": "what is it?",
                "attachments": [{"sha256": PNG_SHA, "name": "dot.png"}],
            },
        )
        assert sent.status_code == 202, sent.text
        items = await _wait_answer(c, conv["id"])
        body = openai_server.requests[-1]
        user = [m for m in body["messages"] if m["role"] == "user"][-1]
        assert user["content"][1] == {
            "type": "image_url",
            "image_url": {"url": "data:image/png;base64," + base64.b64encode(PNG).decode()},
        }
        assert items[0]["data"]["parts"][0]["sha256"] == PNG_SHA
        assert items[-1]["content"] == "a dot"
        # Served back: the sniffed type, never sniffed again, sandboxed, inline (an image).
        got = await c.get(att["url"].removeprefix("/agentik"))
        assert got.status_code == 200 and got.content == PNG
        assert got.headers["content-type"] == "image/png"
        assert got.headers["x-content-type-options"] == "nosniff"
        assert got.headers["content-security-policy"].startswith("sandbox")
        assert got.headers["content-disposition"].startswith("inline")


async def test_a_text_file_is_served_as_a_download_and_a_model_without_vision_gets_words(
    db_path, openai_server
):
    openai_server.enqueue(Reply.text("ok"))
    page = b"<html><script>alert(1)</script></html>"
    async with (
        running_server(db_path, model=_llm(openai_server, image_in=False)) as s,
        s.client() as c,
    ):
        conv = (await c.post("/conversations", json={})).json()
        assert conv["capabilities"]["image_in"] is False
        up = (await c.post(f"/conversations/{conv['id']}/attachments",
                           files={"file": ("page.html", page, "text/html")})).json()  # fmt: skip
        assert up["media_type"] == "text/plain" and up["kind"] == "file"
        got = await c.get(up["url"].removeprefix("/agentik"))
        assert got.headers["content-type"] == "text/plain; charset=utf-8"
        assert got.headers["content-disposition"].startswith("attachment")
        img = (await c.post(f"/conversations/{conv['id']}/attachments",
                            files={"file": ("dot.png", PNG, "image/png")})).json()  # fmt: skip
        await c.post(
            f"/conversations/{conv['id']}/messages",
            json={"content": "see", "attachments": [{"sha256": img["sha256"], "name": "dot.png"}]},
        )
        await _wait_answer(c, conv["id"])
        user = [m for m in openai_server.requests[-1]["messages"] if m["role"] == "user"][-1]
        assert user["content"] == f"local: see\n[image: dot.png, {len(PNG)} bytes]"


async def test_too_large_wrong_type_or_foreign_uploads_are_refused_and_nothing_stored(
    db_path, openai_server
):
    async with (
        running_server(
            db_path, model=_llm(openai_server), attachments=AttachmentSettings(max_bytes=1000)
        ) as s,
        s.client() as c,
    ):
        conv = (await c.post("/conversations", json={})).json()
        url = f"/conversations/{conv['id']}/attachments"
        big = await c.post(url, files={"file": ("big.png", PNG + b"\0" * 2000, "image/png")})
        assert big.status_code == 413 and big.json()["error"]["code"] == "attachment_too_large"
        # A body far over the cap is refused by its length, before it is read.
        huge = await c.post(url, files={"file": ("huge.png", PNG + b"\0" * 10**6, "image/png")})
        assert huge.status_code == 413
        exe = await c.post(url, files={"file": ("cat.png", b"MZ\x90\x00\x03\x00", "image/png")})
        assert exe.status_code == 415 and exe.json()["error"]["code"] == "attachment_rejected"
        not_form = await c.post(url, content=PNG, headers={"content-type": "image/png"})
        assert not_form.status_code == 415
        no_file = await c.post(url, files={"other": ("x.png", PNG, "image/png")})
        assert no_file.status_code == 422
        # A hash uploaded to another conversation is not this one's.
        other = (await c.post("/conversations", json={})).json()
        assert (
            await c.post(
                f"/conversations/{other['id']}/attachments",
                files={"file": ("dot.png", PNG, "image/png")},
            )
        ).status_code == 201
        foreign = await c.post(
            f"/conversations/{conv['id']}/messages",
            json={"content": "x", "attachments": [{"sha256": PNG_SHA}]},
        )
        assert foreign.status_code == 409, foreign.text
        assert foreign.json()["error"]["code"] == "attachment_not_found"
        assert (
            await c.get(f"/conversations/{conv['id']}/attachments/{PNG_SHA}")
        ).status_code == 404
        assert await s.agent.store.attachments(conv["id"]) == []
        assert (await c.get(f"/conversations/{conv['id']}/messages")).json()["items"] == []
        assert openai_server.requests == []


async def test_an_image_on_its_own_is_a_message(db_path, openai_server):
    """No words needed (the web page sent "(attached)" for them): the image reaches the
    model as an image part with no made-up text, the history keeps it, the conversation is
    named after it; a body with neither words nor attachments is still refused."""
    openai_server.enqueue(Reply.text("a dot"))
    async with running_server(db_path, model=_llm(openai_server)) as s, s.client() as c:
        conv = (await c.post("/conversations", json={})).json()
        up = await c.post(f"/conversations/{conv['id']}/attachments",
                          files={"file": ("dot.png", PNG, "image/png")})  # fmt: skip
        assert up.status_code == 201, up.text
        for empty in ({}, {"content": "  ", "attachments": []}):
            r = await c.post(f"/conversations/{conv['id']}/messages", json=empty)
            assert r.status_code == 422 and "needs words" in r.text, r.text
        sent = await c.post(
            f"/conversations/{conv['id']}/messages",
            json={"attachments": [{"sha256": PNG_SHA, "name": "dot.png"}]},
        )
        assert sent.status_code == 202, sent.text
        assert sent.json()["title"] == "[attached: dot.png]"
        items = await _wait_answer(c, conv["id"])
        user = [m for m in openai_server.requests[-1]["messages"] if m["role"] == "user"][-1]
        images = [p for p in user["content"] if p["type"] == "image_url"]
        words = " ".join(p["text"] for p in user["content"] if p["type"] == "text")
        assert images == [{
            "type": "image_url",
            "image_url": {"url": "data:image/png;base64," + base64.b64encode(PNG).decode()},
        }]  # fmt: skip
        assert "attached" not in words
        assert items[0]["content"] == "" and items[0]["data"]["parts"][0]["sha256"] == PNG_SHA
        assert items[-1]["content"] == "a dot"


async def test_regenerate_and_edit_send_the_questions_image_again(db_path, openai_server):
    """The CI fuzzer found a 500: regenerate of an image-only question rebuilt it with no
    words and no attachments.  Regenerate now asks it again with its image, edit keeps the
    image beside the new words, and a question with nothing left (redacted) is a 409."""
    openai_server.enqueue(Reply.text("a dot"), Reply.text("still a dot"), Reply.text("red"))
    async with running_server(db_path, model=_llm(openai_server)) as s, s.client() as c:
        cid = (await c.post("/conversations", json={})).json()["id"]
        await c.post(f"/conversations/{cid}/attachments",
                     files={"file": ("dot.png", PNG, "image/png")})  # fmt: skip
        sent = await c.post(
            f"/conversations/{cid}/messages",
            json={"attachments": [{"sha256": PNG_SHA, "name": "dot.png"}]},
        )
        assert sent.status_code == 202, sent.text
        conv = await s.agent.get_conversation(cid)
        await conv.wait_idle()
        again = await c.post(f"/conversations/{cid}/regenerate", json={})
        assert again.status_code == 202, again.text
        await conv.wait_idle()
        edited = await c.post(f"/conversations/{cid}/edit", json={"content": "what colour?"})
        assert edited.status_code == 202, edited.text
        await conv.wait_idle()
        image = {
            "type": "image_url",
            "image_url": {"url": "data:image/png;base64," + base64.b64encode(PNG).decode()},
        }
        asked = [
            [m for m in r["messages"] if m["role"] == "user"][-1]["content"]
            for r in openai_server.requests
        ]
        assert len(asked) == 3
        assert [p for p in asked[1] if p["type"] == "image_url"] == [image]
        assert [p for p in asked[2] if p["type"] == "image_url"] == [image]
        assert "what colour?" in " ".join(p["text"] for p in asked[2] if p["type"] == "text")
        rows = (await c.get(f"/conversations/{cid}/messages")).json()["items"]
        words = ["", "a dot", "", "still a dot", "what colour?", "red"]
        assert [m["content"] for m in rows] == words
        # The last question redacted: nothing is left to ask again.
        redacted = await c.post(f"/conversations/{cid}/messages/{rows[4]['id']}/redact", json={})
        assert redacted.status_code == 200, redacted.text
        nothing = await c.post(f"/conversations/{cid}/regenerate", json={})
        assert nothing.status_code == 409 and nothing.json()["error"]["code"] == "cannot_branch"
        assert len(openai_server.requests) == 3
