"""IRC image links (issue 34): in a channel with ``image_urls`` on, the image links of a
message for the bot are fetched (a real aiohttp server on 127.0.0.1 serves them) and reach
the model request (the real ``openai`` SDK against the fake OpenAI server) as image parts,
stored as attachments; every refused link (a loopback address without the allowance, a
redirect to a link-local address, too large, not an image, one too many) gets a short
notice and the words still reach the model.  The IRC server is a real ngircd."""

from __future__ import annotations

import base64
import hashlib

import pytest
from aiohttp import web

from agentik.bot.bridge import ChannelOptions
from agentik.core import OpenAIBackend
from agentik.core.attachments import AttachmentSettings
from agentik.core.testing.openai_server import FakeOpenAIServer, Reply
from agentik.transports.imagefetch import _refused_address, links_in

from ircservers import IRCTestClient
from rigs import irc_bot, said_in

pytest_plugins = ["ircservers"]

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
GIF = base64.b64decode("R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAICRAEAOw==")


class Images:
    """A real HTTP server on 127.0.0.1 serving images, a page, a fake image, a large
    one and redirects; ``hits`` lists the paths asked for."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> Images:
        async def handle(request: web.Request) -> web.StreamResponse:
            self.hits.append(request.path)
            path = request.path
            if path in ("/dot.png", "/noext"):
                return web.Response(body=PNG, content_type="image/png")
            if path == "/two.gif":
                return web.Response(body=GIF, content_type="image/gif")
            if path == "/page":
                return web.Response(text="<html>an article</html>", content_type="text/html")
            if path == "/fake.png":  # says PNG, is a page
                return web.Response(body=b"<html><script>x</script></html>",
                                    content_type="image/png")  # fmt: skip
            if path == "/big.png":  # announced
                return web.Response(body=PNG + b"\0" * 5000, content_type="image/png")
            if path == "/chunked.png":  # not announced: cut while reading
                response = web.StreamResponse(headers={"Content-Type": "image/png"})
                response.enable_chunked_encoding()
                await response.prepare(request)
                for _ in range(10):
                    await response.write(PNG + b"\0" * 1000)
                return response
            if path == "/inward.png":  # a redirect to the cloud metadata address
                raise web.HTTPFound("http://169.254.169.254/latest/meta-data/x.png")
            if path == "/hop.png":  # an allowed redirect
                raise web.HTTPFound("/dot.png")
            raise web.HTTPNotFound()

        app = web.Application()
        app.router.add_get("/{tail:.*}", handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


def _llm(server: FakeOpenAIServer, *, image_in: bool = True) -> OpenAIBackend:
    return OpenAIBackend(model="fake-model", base_url=server.base_url, api_key="sk-test",
                         max_retries=0, image_in=image_in)  # fmt: skip


def _user(server: FakeOpenAIServer, index: int = -1) -> dict:
    return [m for m in server.requests[index]["messages"] if m["role"] == "user"][-1]


def _images(content) -> list[bytes]:
    if isinstance(content, str):
        return []
    prefix = "data:image/"
    out = []
    for part in content:
        if part["type"] == "image_url":
            url = part["image_url"]["url"]
            assert url.startswith(prefix)
            out.append(base64.b64decode(url.split(",", 1)[1]))
    return out


def _text(content) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(p["text"] for p in content if p["type"] == "text")


async def _say(alice: IRCTestClient, server: FakeOpenAIServer, text: str, answer: str) -> None:
    server.enqueue(Reply.text(answer))
    alice.privmsg("#room", f"agentik: {text}")
    await alice.wait_for(said_in("#room", answer))


async def test_image_links_reach_the_model_and_each_refusal_is_told(ngircd, tmp_path):
    settings = AttachmentSettings(max_bytes=2000, url_allow_private=True, url_max_images=2)
    async with (
        Images() as images,
        FakeOpenAIServer(model="fake-model") as server,
        irc_bot(
            ngircd.port, tmp_path, llm=_llm(server), channels=["#room"], joined_to=["#room"],
            options=ChannelOptions(command_prefix="!", image_urls=True),
            agent_kw={"attachments": settings},
        ) as bot,
    ):  # fmt: skip
        alice = await IRCTestClient.connect(ngircd.port, "alice")
        await alice.join("#room")

        # An image link: fetched, the model sees it, stored by its hash.
        await _say(alice, server, f"what is this? {images.url('/dot.png')}", "a red dot")
        user = _user(server)
        assert _images(user["content"]) == [PNG]
        assert "what is this?" in _text(user["content"])
        conv = bot.bridge.open_channel("irc:testnet:#room").conversation
        held = await bot.agent.store.attachments(conv.id)
        assert [(a.sha256, a.media_type) for a in held] == [
            (hashlib.sha256(PNG).hexdigest(), "image/png")
        ]

        # A page link is left as words (no notice); a link without an extension whose
        # server says image/* is an image; an allowed redirect is followed.
        await _say(alice, server, f"{images.url('/page')} and {images.url('/noext')} "
                   f"and {images.url('/hop.png')}", "two dots")  # fmt: skip
        assert _images(_user(server)["content"]) == [PNG, PNG]
        assert images.hits[-4:] == ["/page", "/noext", "/hop.png", "/dot.png"]

        # Each refusal: a notice to the person, the words still reach the model.
        cases = [
            ("/fake.png", "not a PNG, JPEG, GIF or WebP image"),
            ("/big.png", "larger than 2000 bytes"),
            ("/chunked.png", "larger than 2000 bytes"),
            ("/inward.png", "169.254.169.254 is a link-local address"),
            ("/missing.png", "the server answered 404"),
        ]
        for path, reason in cases:
            await _say(alice, server, f"see {images.url(path)}", f"answer to {path}")
            notice = next(m for m in alice.received if said_in("#room", reason, notices=True)(m))
            assert notice.command == "NOTICE" and "link 1 (127.0.0.1)" in notice.text
            user = _user(server)
            assert _images(user["content"]) == []
            text = _text(user["content"])
            assert f"see {images.url(path)}" in text and reason in text
        # The redirect inward was never followed.
        assert "/latest/meta-data/x.png" not in images.hits

        # One image too many (url_max_images = 2): two taken, the third told.
        before = len(images.hits)
        await _say(alice, server, " ".join(images.url(p) for p in
                   ("/dot.png", "/two.gif", "/dot.png?again")), "three")  # fmt: skip
        assert _images(_user(server)["content"]) == [PNG, GIF]
        assert images.hits[before:] == ["/dot.png", "/two.gif"]  # the third not fetched
        await alice.wait_for(said_in("#room", "link 3", "at most 2 images", notices=True))

        # A message not for the bot fetches nothing.
        before = len(images.hits)
        alice.privmsg("#room", f"just chatting {images.url('/dot.png')}")
        await _say(alice, server, "and now?", "nothing to see")
        assert images.hits[before:] == []
        await alice.quit()


async def test_a_loopback_link_is_refused_without_the_allowance(ngircd, tmp_path):
    async with (
        Images() as images,
        FakeOpenAIServer(model="fake-model") as server,
        irc_bot(
            ngircd.port, tmp_path, llm=_llm(server), channels=["#room"], joined_to=["#room"],
            options=ChannelOptions(command_prefix="!", image_urls=True),
        ) as bot,
    ):  # fmt: skip
        alice = await IRCTestClient.connect(ngircd.port, "alice")
        await alice.join("#room")
        await _say(alice, server, f"look {images.url('/dot.png')}", "I cannot see it")
        await alice.wait_for(said_in("#room", "127.0.0.1 is a loopback address", notices=True))
        assert images.hits == []  # never connected
        assert _images(_user(server)["content"]) == []
        assert "look http://127.0.0.1" in _text(_user(server)["content"])
        conv = bot.bridge.open_channel("irc:testnet:#room").conversation
        assert await bot.agent.store.attachments(conv.id) == []
        await alice.quit()


@pytest.mark.parametrize("case", ["model without image_in", "channel setting off"])
async def test_no_fetch_for_a_text_model_or_when_the_channel_does_not_ask(case, ngircd, tmp_path):
    settings = AttachmentSettings(url_allow_private=True)
    async with (
        Images() as images,
        FakeOpenAIServer(model="fake-model") as server,
        irc_bot(
            ngircd.port, tmp_path, channels=["#room"], joined_to=["#room"],
            llm=_llm(server, image_in=case != "model without image_in"),
            options=ChannelOptions(command_prefix="!", image_urls=case != "channel setting off"),
            agent_kw={"attachments": settings},
        ),
    ):  # fmt: skip
        alice = await IRCTestClient.connect(ngircd.port, "alice")
        await alice.join("#room")
        await _say(alice, server, f"look {images.url('/dot.png')}", "words only")
        assert images.hits == []
        assert _user(server)["content"] == f"alice: look {images.url('/dot.png')}" or (
            _text(_user(server)["content"]).endswith(f"look {images.url('/dot.png')}")
        )
        assert not any(m.command == "NOTICE" and "image" in m.text for m in alice.received)
        await alice.quit()


def test_links_and_addresses():
    assert links_in("a https://x.org/a.png, (http://y.org/b.jpg). ftp://z/c.png x.png") == [
        "https://x.org/a.png",
        "http://y.org/b.jpg",
    ]
    assert len(links_in(" ".join(f"http://h/{i}.png" for i in range(30)))) == 10
    for address in ("127.0.0.1", "::1", "10.1.2.3", "192.168.0.1", "169.254.169.254",
                    "fe80::1", "224.0.0.1", "0.0.0.0", "::ffff:127.0.0.1", "100.64.0.1",
                    "fc00::1"):  # fmt: skip
        assert _refused_address(address, False) is not None, address
    assert _refused_address("93.184.216.34", False) is None
    assert _refused_address("2606:2800:220:1::1", False) is None
    # The allowance lets loopback and private in, never link-local, multicast, unspecified.
    for address in ("127.0.0.1", "::1", "10.1.2.3", "192.168.0.1", "::ffff:127.0.0.1"):
        assert _refused_address(address, True) is None, address
    for address in ("169.254.169.254", "fe80::1", "224.0.0.1", "0.0.0.0", "::"):
        assert _refused_address(address, True) is not None, address
