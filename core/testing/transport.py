"""Deprecated alias of :mod:`agentik.transports.testing.memory` (``MemoryTransport``).

``from agentik.core.testing.transport import MemoryTransport`` still works
(the same class) but warns: import it from ``agentik.transports.testing``
instead.  The ``memory`` plugin is registered from the new module.  This
module goes away in a future release.
"""

from __future__ import annotations

from typing import Any

from ..compat import moved_attribute

__all__ = [
    "MemoryTransport",  # noqa: F822 - resolved by __getattr__
]


def __getattr__(name: str) -> Any:
    # Every public name of the new module, same object, with a DeprecationWarning.
    return moved_attribute(__name__, "agentik.transports.testing.memory", name)


def __dir__() -> list[str]:
    return sorted(__all__)
