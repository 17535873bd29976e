"""The HTTP+SSE transport: agentik's REST API and a web chat page.

``[transports.<name>] type = "http"``; keys in :mod:`.settings`, the server
and its lifecycle in :mod:`.transport`, the routes in :mod:`.api`, event
streams in :mod:`.sse`, tokens in :mod:`.auth`, the OpenAPI document in
:mod:`.openapi`, and the page in ``static/index.html``.
"""

from __future__ import annotations

from typing import Any

from agentik.core.hookspecs import hookimpl

__all__ = ["register_transports"]


@hookimpl
def register_transports(register: Any) -> None:
    from .transport import HttpTransport

    register("http", HttpTransport)
