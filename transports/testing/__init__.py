"""Test kit for transport adapters: a fake transport and the conformance suite.

Shipped in the package so third-party transport authors prove their adapter
the same way the built-in ones do::

    from agentik.transports.testing import TransportConformance, TransportHarness

* :class:`TransportConformance` — a pytest test class; subclass it, provide a
  ``transport_harness`` fixture, and your transport runs the shared contract
  tests through the real bridge and agent (see :mod:`.conformance`).  It needs
  ``pytest`` and ``pytest-asyncio`` (the ``agentik[testing]`` extra) and is
  imported only when asked for, so the rest of this package does not.
* :class:`TransportHarness`, :class:`Place` — what a harness implements: build
  the transport, let a person on the peer say something, read what the peer
  received (see :mod:`.harness`); it is given the bot side the transport is
  attached to as a :data:`SinkFactory` (the bot's ``Bridge``).
* :class:`FakeTransport` — a chat network that lives in the test (channels,
  threads, private messages, addressing; it enforces its declared limits),
  and :class:`FakeHarness`, its harness and the smallest complete example.
* :class:`MemoryTransport` (:mod:`.memory`) — the bare in-memory transport, the
  ``memory`` plugin (it moved here from ``agentik.core.testing.transport``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .memory import MemoryTransport

if TYPE_CHECKING:
    from .conformance import Conformance, TransportConformance
    from .fake import FakeHarness, FakePost, FakeTransport
    from .harness import ConformanceSink, Place, PlaceKind, SinkFactory, TransportHarness

__all__ = [
    "Conformance",
    "ConformanceSink",
    "FakeHarness",
    "FakePost",
    "FakeTransport",
    "MemoryTransport",
    "Place",
    "PlaceKind",
    "SinkFactory",
    "TransportConformance",
    "TransportHarness",
]


#: Where the names imported when first asked for live: the suite imports pytest, and
#: every bot loads the ``memory`` plugin (this package) at start-up, which needs neither
#: the fake network nor the harness.
_LAZY = {
    "TransportConformance": "conformance",
    "Conformance": "conformance",
    "FakeHarness": "fake",
    "FakePost": "fake",
    "FakeTransport": "fake",
    "ConformanceSink": "harness",
    "Place": "harness",
    "PlaceKind": "harness",
    "SinkFactory": "harness",
    "TransportHarness": "harness",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is not None:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{module}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
