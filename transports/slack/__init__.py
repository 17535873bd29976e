"""The Slack transport (slack-bolt ``AsyncApp``, Socket Mode or HTTP Events API).

``[transports.<name>] type = "slack"``; keys in :mod:`.settings`, behaviour
in :mod:`.transport`.
"""

from __future__ import annotations

from typing import Any

from agentik.core.hookspecs import hookimpl
from agentik.core.plugins import LazyFactory

__all__ = ["register_transports"]


@hookimpl
def register_transports(register: Any) -> None:
    # Imported when a [transports.*] table of type "slack" is made: a bot without
    # one does not pay for the transport and its settings model.
    register("slack", LazyFactory("agentik.transports.slack.transport:SlackTransport"))
