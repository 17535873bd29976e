"""Memory after idle: what released conversations freed goes back to the system.

glibc keeps freed memory in its arenas for reuse, so a bot's RSS stayed near its
peak after every conversation was released (the soak benchmark: ~20 MB "free but
kept").  After conversations leave memory the agent asks glibc to give it back
(``malloc_trim(0)``, at most once per ``memory_trim`` seconds, in a worker
thread); an operator sees it as ``agentik_memory_trims_total``.  RSS figures are
the benchmarks' business (``benchmarks/bench_soak.py``), not these tests'.
"""

from __future__ import annotations

import asyncio
import platform

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentik.bot.bridge import Bridge
from agentik.bot.metrics import Metrics
from agentik.core import Agent
from agentik.core.memtrim import malloc_trim
from agentik.core.store.sqlite import SQLiteStore
from agentik.core.testing.scripted import ScriptedModel
from helpers import open_channels, release_idle_channels

from rigs import eventually

glibc = pytest.mark.skipif(
    malloc_trim() is None, reason=f"malloc_trim is glibc's ({platform.libc_ver()[0] or 'no libc'})"
)


def _trims(metrics: Metrics) -> float:
    text = metrics.render()[0].decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "agentik_memory_trims_total":
                return sample.value
    raise AssertionError("agentik_memory_trims_total is not exposed")


async def _release_all(agent: Agent, channels: int) -> Bridge:
    """Open ``channels`` channels through a bridge, answer one message in each,
    then let the bridge release them all (as it does idle channels)."""
    # Nothing released while they fill up.
    bridge, t = await open_channels(agent, [f"mem:#c{i}" for i in range(channels)])
    await release_idle_channels(bridge, t, "mem:#last")
    return bridge


@glibc
async def test_released_conversations_hand_their_memory_back_to_the_system(db_path):
    async with Agent(llm=ScriptedModel(), store=SQLiteStore(db_path)) as agent:
        metrics = Metrics(agent)
        assert _trims(metrics) == 0  # nothing released yet: nothing trimmed
        bridge = await _release_all(agent, 10)
        assert len(agent.services.open) == 0  # every conversation left memory
        # One trim for the whole release (they come in bursts), soon after it.
        await eventually(lambda: agent.memory_trims >= 1, "a trim")
        assert _trims(metrics) == 1
        await bridge.aclose()


@glibc
async def test_trims_come_at_most_once_per_interval(db_path):
    async with Agent(llm=ScriptedModel(), store=SQLiteStore(db_path), memory_trim=3600) as agent:
        first = await _release_all(agent, 3)
        await eventually(lambda: agent.memory_trims >= 1, "a trim")
        await first.aclose()
        # More conversations leave memory within the hour: the next trim waits
        # for the hour to pass (it is due then, not dropped).
        second = await _release_all(agent, 3)
        for _ in range(20):
            await asyncio.sleep(0)
        assert agent.memory_trims == 1
        assert agent.services.trim is not None and agent.services.trim.due is not None
        assert agent.services.trim.due > 3000
        await second.aclose()


async def test_no_trim_when_switched_off(db_path, monkeypatch):
    # An operator who wants glibc's own behaviour (or another C library) gets no
    # trim: AGENTIK_MALLOC_TRIM=0, or memory_trim=0 for a library user.
    monkeypatch.setenv("AGENTIK_MALLOC_TRIM", "0")
    async with Agent(llm=ScriptedModel(), store=SQLiteStore(db_path)) as agent:
        bridge = await _release_all(agent, 3)
        assert agent.services.trim is not None and not agent.services.trim.active
        assert agent.services.trim.due is None  # nothing scheduled
        assert _trims(Metrics(agent)) == 0
        await bridge.aclose()
    monkeypatch.delenv("AGENTIK_MALLOC_TRIM")
    async with Agent(llm=ScriptedModel(), store=SQLiteStore(db_path), memory_trim=0) as agent:
        assert agent.services.trim is not None and not agent.services.trim.active
