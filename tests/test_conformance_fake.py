"""The conformance suite run against the kit's own fake transport (its reference harness)."""

from __future__ import annotations

import pytest
import pytest_asyncio

from agentik.bot.bridge import Bridge
from agentik.transports.base import ChannelCaps
from agentik.transports.testing import Conformance, FakeHarness, TransportConformance


class TestFakeTransportConformance(TransportConformance):
    @pytest_asyncio.fixture
    async def transport_harness(self):
        return FakeHarness(sink_factory=Bridge)


class TestFakeTransportStreamingDeltas(TransportConformance):
    """The same contract when answers stream as deltas into one growing message."""

    @pytest_asyncio.fixture
    async def transport_harness(self):
        return FakeHarness(caps=ChannelCaps(max_bytes=200, streaming="deltas"), sink_factory=Bridge)


async def test_a_harness_without_a_sink_factory_still_runs_on_the_bot_bridge(tmp_path):
    """Harnesses written before the kit took a sink factory keep working, with a warning."""
    harness = FakeHarness()
    with pytest.warns(DeprecationWarning, match="sink_factory=agentik.bot.bridge.Bridge") as seen:
        rig = Conformance(harness, tmp_path)
    assert [w.filename for w in seen] == [__file__]  # it points at the caller
    assert rig.sink_factory is Bridge
    try:
        await rig.start()
        await rig.answer(harness.direct("alice"), "still here?")
        assert [m.text for m in rig.bridge.incoming] == ["still here?"]
    finally:
        await rig.aclose()
    assert not rig.leftover_tasks()
