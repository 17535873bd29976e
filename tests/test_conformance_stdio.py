"""The terminal transport runs the conformance suite: lines into a real pipe, output read back."""

from __future__ import annotations

import io
import os
from typing import Any

import pytest_asyncio

from agentik.bot.bridge import Bridge
from agentik.transports.base import Transport
from agentik.transports.stdio import StdioTransport
from agentik.transports.testing import Place, TransportConformance, TransportHarness


class _Screen(io.TextIOBase):
    """What the person at the terminal sees: stdout and stderr, interleaved."""

    def __init__(self, harness: StdioHarness) -> None:
        self.harness = harness
        self.text = ""

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self.text += s
        self.harness.notify()
        return len(s)


class StdioHarness(TransportHarness):
    """A piped terminal: one channel, one person, no shared channels."""

    transport_type = "stdio"
    place_kinds = frozenset({"direct"})
    users = ("alice",)

    def __init__(self) -> None:
        super().__init__(sink_factory=Bridge)
        read_fd, self.write_fd = os.pipe()
        self.stdin = os.fdopen(read_fd, "rb", buffering=0)
        self.screen = _Screen(self)

    def make_transport(self, *, name: str, extra: dict[str, Any] | None = None) -> Transport:
        settings = {"channel": "conformance", "user": "alice", "interactive": False}
        return StdioTransport(
            name=name,
            settings={**settings, **(extra or {})},
            stdin=self.stdin,
            stdout=self.screen,
            stderr=self.screen,
        )

    async def say(self, place: Place, text: str, *, user: str, addressed: bool) -> None:
        os.write(self.write_fd, text.encode() + b"\n")

    def received(self, place: Place) -> list[str]:
        return [line for line in self.screen.text.splitlines() if line.strip()]

    def close(self) -> None:
        os.close(self.write_fd)
        self.stdin.close()


class TestStdioConformance(TransportConformance):
    @pytest_asyncio.fixture
    async def transport_harness(self):
        harness = StdioHarness()
        try:
            yield harness
        finally:
            harness.close()
