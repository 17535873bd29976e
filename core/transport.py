"""Deprecated alias of :mod:`agentik.transports.base`, the channel contract.

``from agentik.core.transport import Transport`` still works (same objects)
but warns: import from ``agentik.transports.base`` instead.  This module goes
away in a future release.
"""

from __future__ import annotations

from typing import Any

from .compat import moved_attribute

__all__ = [
    "ChannelCaps",  # noqa: F822 - resolved by __getattr__
    "DeliveryCallback",  # noqa: F822 - resolved by __getattr__
    "IncomingMessage",  # noqa: F822 - resolved by __getattr__
    "MessageSink",  # noqa: F822 - resolved by __getattr__
    "OutgoingKind",  # noqa: F822 - resolved by __getattr__
    "OutgoingMessage",  # noqa: F822 - resolved by __getattr__
    "Transport",  # noqa: F822 - resolved by __getattr__
    "parse_settings",  # noqa: F822 - resolved by __getattr__
]


def __getattr__(name: str) -> Any:
    # Every public name of the new module, same object, with a DeprecationWarning.
    return moved_attribute(__name__, "agentik.transports.base", name)


def __dir__() -> list[str]:
    return sorted(__all__)
