"""The IRC transport (irc3): one transport instance per IRC network.

``[transports.<name>] type = "irc"``; see :mod:`.settings` for its keys and
:mod:`.transport` for its behaviour.  The protocol helpers (parsing,
formatting, splitting) are in :mod:`.wire`.
"""

from __future__ import annotations

from typing import Any

from agentik.core.hookspecs import hookimpl
from agentik.core.plugins import LazyFactory

__all__ = ["register_transports"]


@hookimpl
def register_transports(register: Any) -> None:
    # Imported when a [transports.*] table of type "irc" is made: a bot without
    # one does not pay for the transport and its settings model.
    register("irc", LazyFactory("agentik.transports.irc.transport:IRCTransport"))
