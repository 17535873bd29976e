"""The IRC transport (irc3): one transport instance per IRC network.

``[transports.<name>] type = "irc"``; see :mod:`.settings` for its keys and
:mod:`.transport` for its behaviour.  The protocol helpers (parsing,
formatting, splitting) are in :mod:`.wire`.
"""

from __future__ import annotations

from typing import Any

from agentik.core.hookspecs import hookimpl

__all__ = ["register_transports"]


@hookimpl
def register_transports(register: Any) -> None:
    from .transport import IRCTransport

    register("irc", IRCTransport)
