"""The other side of the webhook: a callback server that records answers, and a sender.

PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

__all__ = ["CallbackServer", "post", "require_installed"]


def require_installed() -> None:
    """Skip (fail under CI=true) when the agentik-webhook distribution is not installed."""
    if importlib.util.find_spec("agentik_webhook") is not None:
        return
    why = (
        "agentik-webhook is not installed: 'make test' installs it, or "
        "pip install --no-build-isolation -e examples/agentik-webhook"
    )
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(why + " (CI=true: it must be)", pytrace=False)
    pytest.skip(why, allow_module_level=True)


class CallbackServer:
    """Receives the bot's answers on 127.0.0.1; checks their signatures when given a secret.

    ``received`` holds every JSON payload with a good signature, in arrival
    order; ``refused`` counts the others.  ``fail_next`` is a list of HTTP
    statuses to answer the next requests with (to test retries).
    """

    def __init__(self, secret: str | None = None) -> None:
        self.secret = secret
        self.received: list[dict[str, Any]] = []
        self.refused = 0
        self.fail_next: list[int] = []
        self.on_receive: Callable[[], None] | None = None
        self._changed = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/answers"

    async def __aenter__(self) -> CallbackServer:
        app = web.Application()
        app.router.add_post("/answers", self._answer)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _answer(self, request: web.Request) -> web.Response:
        body = await request.read()
        if self.fail_next:
            return web.Response(status=self.fail_next.pop(0))
        if self.secret is not None:
            from agentik_webhook import verify

            if verify(self.secret, body, request.headers) is not None:
                self.refused += 1
                return web.Response(status=401)
        self.received.append(json.loads(body))
        self._changed.set()
        if self.on_receive is not None:
            self.on_receive()
        return web.Response(status=204)

    async def wait_for(
        self,
        predicate: Callable[[dict[str, Any]], bool],
        timeout: float = 60.0,  # noqa: ASYNC109
    ) -> dict[str, Any]:
        """The first received payload matching ``predicate`` (waiting for it)."""
        async with asyncio.timeout(timeout):
            while True:
                for payload in self.received:
                    if predicate(payload):
                        return payload
                self._changed.clear()
                await self._changed.wait()


async def post(
    url: str, message: dict[str, Any] | bytes, *, secret: str | None = None, **headers: str
) -> tuple[int, dict[str, Any]]:
    """POST a message to the bot as a webhook sender would; returns (status, JSON body)."""
    body = message if isinstance(message, bytes) else json.dumps(message).encode()
    sent = {"Content-Type": "application/json", **headers}
    if secret is not None:
        from agentik_webhook import sign

        sent.update(sign(secret, body))
    async with aiohttp.ClientSession() as session, session.post(url, data=body, headers=sent) as r:
        return r.status, await r.json(content_type=None)
