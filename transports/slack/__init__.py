"""The Slack transport (slack-bolt ``AsyncApp``, Socket Mode or HTTP Events API).

``[transports.<name>] type = "slack"``; keys in :mod:`.settings`, behaviour
in :mod:`.transport`.
"""

from __future__ import annotations

from typing import Any

from agentik.core.hookspecs import hookimpl

__all__ = ["register_transports"]


@hookimpl
def register_transports(register: Any) -> None:
    from .transport import SlackTransport

    register("slack", SlackTransport)
