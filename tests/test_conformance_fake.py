"""The conformance suite run against the kit's own fake transport (its reference harness)."""

from __future__ import annotations

import pytest_asyncio

from agentik.transports.base import ChannelCaps
from agentik.transports.testing import FakeHarness, TransportConformance


class TestFakeTransportConformance(TransportConformance):
    @pytest_asyncio.fixture
    async def transport_harness(self):
        return FakeHarness()


class TestFakeTransportStreamingDeltas(TransportConformance):
    """The same contract when answers stream as deltas into one growing message."""

    @pytest_asyncio.fixture
    async def transport_harness(self):
        return FakeHarness(caps=ChannelCaps(max_bytes=200, streaming="deltas"))
