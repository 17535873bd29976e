"""An open channel holds a render task only while it has events to show.

A bot holds hundreds of channels open; a task per channel following its events
cost each ~1 KB while it sat idle.  Now a channel's task starts with its next
event and ends when nothing is left to render; each channel still has its own,
so one held up by its transport (IRC flood control, a Slack 429) never holds up
another's answers.
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc

from agentik.bot.bridge import Bridge, ChannelOptions
from agentik.core import Agent
from agentik.core.store.sqlite import SQLiteStore
from agentik.core.testing.scripted import ScriptedModel
from agentik.transports.base import OutgoingMessage
from agentik.transports.testing import MemoryTransport
from helpers import open_channels

from rigs import eventually


def _renderers() -> list[asyncio.Task]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("agentik-render")]


class HeldTransport(MemoryTransport):
    """A transport whose sends to one channel wait until released (as IRC flood
    control or a rate-limited Slack API holds a channel's messages)."""

    def __init__(self, held: str) -> None:
        super().__init__(name="mem")
        self.held = held
        self.release = asyncio.Event()
        self.holding = asyncio.Event()

    async def send(self, message: OutgoingMessage) -> None:
        if message.channel_key == self.held and not self.release.is_set():
            self.holding.set()
            await self.release.wait()
        await super().send(message)


async def test_idle_open_channels_hold_no_render_task(db_path):
    async with Agent(llm=ScriptedModel(), store=SQLiteStore(db_path)) as agent:
        bridge = Bridge(agent, idle_seconds=3600)  # held open all along
        t = MemoryTransport(name="mem")
        bridge.attach(t, ChannelOptions(answer="all"))
        await t.start(bridge)
        for i in range(5):
            await t.inject(f"hello {i}", channel_key=f"mem:#c{i}", author="alice")
        for i in range(5):
            await bridge.flush(f"mem:#c{i}")
        assert bridge.open_channels == 5
        # (A task still finishing the last events after the answer ends on its own.)
        await eventually(lambda: _renderers() == [], "render tasks to end")
        # The next message in an open channel is answered as ever, one line after
        # another, in the same channel state (its renderer is kept between tasks).
        await t.inject("again", channel_key="mem:#c2", author="alice")
        await bridge.flush("mem:#c2")
        assert [m.text for m in t.sent if m.channel_key == "mem:#c2"] == [
            "echo: hello 2",
            "echo: again",
        ]
        await eventually(lambda: _renderers() == [], "render tasks to end")
        await bridge.aclose()


async def test_a_channel_held_up_by_its_transport_does_not_hold_up_the_others(db_path):
    async with Agent(llm=ScriptedModel(), store=SQLiteStore(db_path)) as agent:
        bridge = Bridge(agent, idle_seconds=3600)
        t = HeldTransport(held="mem:#slow")
        bridge.attach(t, ChannelOptions(answer="all"))
        await t.start(bridge)
        await t.inject("first", channel_key="mem:#slow", author="alice")
        async with asyncio.timeout(60):
            await t.holding.wait()
        # The slow channel's answer waits on its transport; another channel's doesn't.
        await t.inject("second", channel_key="mem:#fast", author="bob")
        await bridge.flush("mem:#fast")
        assert t.texts() == ["echo: second"]
        await eventually(
            lambda: [task.get_name() for task in _renderers()] == ["agentik-render:mem:#slow"],
            "only the held channel's render task",
        )
        t.release.set()
        await bridge.flush("mem:#slow")
        assert t.texts() == ["echo: second", "echo: first"]
        await eventually(lambda: _renderers() == [], "render tasks to end")
        await bridge.aclose()


async def test_a_quiet_open_channel_costs_the_bridge_under_1_kb(db_path):
    # A bot holds hundreds of channels open at once: what the bridge keeps for each
    # between its answers (the channel, its renderer and subscription) is counted by
    # where it was allocated (the innermost frame of agentik's code in bot/).  It was
    # 4.1 KB with a lock and condition per channel, 2.1 KB with a render task and
    # fresh maps per channel, 0.6 KB once they were made on demand.
    async with Agent(llm=ScriptedModel(), store=SQLiteStore(db_path)) as agent:
        # What the first turns load once is not counted.
        bridge, t = await open_channels(agent, [f"mem:#warm{i}" for i in range(3)])
        channels = 100
        tracemalloc.start(40)
        try:
            gc.collect()
            before = tracemalloc.take_snapshot()
            keys = [f"mem:#c{i}" for i in range(channels)]
            await open_channels(agent, keys, bridge=bridge, transport=t)
            await eventually(lambda: _renderers() == [], "render tasks to end")
            gc.collect()
            after = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
        assert bridge.open_channels == channels + 3
        held = 0
        for stat in after.compare_to(before, "traceback"):
            ours = [f.filename for f in stat.traceback if "/agentik/" in f.filename]
            if ours and "/agentik/bot/" in ours[-1] and "/testing/" not in ours[-1]:
                held += stat.size_diff
        assert held / channels < 1024
        await bridge.aclose()
