"""Deprecated alias of :mod:`agentik.transports.text` (splitting text to a channel's limits).

``from agentik.core.text import split_text`` still works (same functions)
but warns: import from ``agentik.transports.text`` instead.  This module goes
away in a future release.
"""

from __future__ import annotations

from typing import Any

from .compat import moved_attribute

__all__ = [
    "fit_prefix",  # noqa: F822 - resolved by __getattr__
    "split_lines",  # noqa: F822 - resolved by __getattr__
    "split_text",  # noqa: F822 - resolved by __getattr__
]


def __getattr__(name: str) -> Any:
    # Every public name of the new module, same object, with a DeprecationWarning.
    return moved_attribute(__name__, "agentik.transports.text", name)


def __dir__() -> list[str]:
    return sorted(__all__)
