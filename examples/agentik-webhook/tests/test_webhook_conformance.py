"""The webhook transport runs agentik's transport conformance suite.

People are HTTP clients POSTing signed JSON to the transport; what they see
is what the transport POSTs to a local callback server.
"""

from __future__ import annotations

from typing import Any

import pytest_asyncio

from agentik.bot.bridge import Bridge
from agentik.transports.base import Transport
from agentik.transports.testing import Place, TransportConformance, TransportHarness

from webhook_peer import CallbackServer, post, require_installed

require_installed()

from agentik_webhook import WebhookTransport  # noqa: E402

SECRET = "conformance-secret"


class WebhookHarness(TransportHarness):
    transport_type = "webhook"
    place_kinds = frozenset({"channel", "direct", "thread"})

    def __init__(self, callback: CallbackServer) -> None:
        super().__init__(sink_factory=Bridge)
        self.callback = callback
        callback.on_receive = self.notify
        self.transport: WebhookTransport | None = None

    def make_transport(self, *, name: str, extra: dict[str, Any] | None = None) -> Transport:
        settings = {
            "port": 0, "callback_url": self.callback.url, "secret": SECRET, "max_chars": 300,
            "retry_delay": 0.05,
        }  # fmt: skip
        return WebhookTransport(name=name, settings={**settings, **(extra or {})})

    async def ready(self, transport: Transport) -> None:
        assert isinstance(transport, WebhookTransport)
        self.transport = transport

    async def say(self, place: Place, text: str, *, user: str, addressed: bool) -> None:
        assert self.transport is not None
        message: dict[str, Any] = {"user": user, "text": text}
        if place.kind != "direct":
            message["text"] = f"@agentik {text}" if addressed else text
            message["channel"] = (place.parent or place).name
            if place.kind == "thread":
                message["thread"] = place.name
        status, body = await post(self.transport.url, message, secret=SECRET)
        assert status == 202, body

    def received(self, place: Place) -> list[str]:
        def here(p: dict[str, Any]) -> bool:
            if place.kind == "direct":
                return p["direct"] and p["user"] == place.name
            if place.kind == "thread":
                assert place.parent is not None
                return p["channel"] == place.parent.name and p["thread"] == place.name
            return p["channel"] == place.name and p["thread"] is None

        return [p["text"] for p in self.callback.received if here(p)]


class TestWebhookConformance(TransportConformance):
    @pytest_asyncio.fixture
    async def transport_harness(self):
        async with CallbackServer(secret=SECRET) as callback:
            yield WebhookHarness(callback)
