"""The HTTP+SSE transport: agentik's REST API and a web chat page.

``[transports.<name>] type = "http"``; keys in :mod:`.settings`, the server
and its lifecycle in :mod:`.transport`, the routes in :mod:`.api`, event
streams in :mod:`.sse`, tokens in :mod:`.auth`, the OpenAPI document in
:mod:`.openapi`, and the page in ``static/index.html``.
"""

from __future__ import annotations

from typing import Any

from agentik.core.hookspecs import hookimpl
from agentik.core.plugins import LazyFactory

__all__ = ["register_transports"]


@hookimpl
def register_transports(register: Any) -> None:
    # Imported when a [transports.*] table of type "http" is made: a bot without one
    # does not pay for the transport, its auth and its settings model (issue 31).
    register("http", LazyFactory("agentik.transports.http.transport:HttpTransport"))
