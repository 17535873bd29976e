"""The conformance kit catches broken transports: each bug below fails its check.

The suite runs in a separate pytest process (pytester), in pytest-asyncio's
default strict mode, as it would in a third-party plugin's repository.
"""

from __future__ import annotations

import re

import pytest

from agentik.transports.testing import TransportConformance

pytest_plugins = ["pytester"]

BROKEN = r'''
import asyncio
import dataclasses

import pytest_asyncio

from agentik.bot.bridge import Bridge
from agentik.transports.base import ChannelCaps
from agentik.transports.testing import FakeHarness, FakeTransport, TransportConformance


class Quick(FakeHarness):
    # Broken transports fail by a wait running out: keep those waits short. The
    # correct ones (TestControl, TestSkips) keep the kit's generous default, so a
    # loaded machine cannot fail them.
    timeout = 1.5


def harness_of(transport_cls, base=Quick, **attrs):
    class Harness(base):
        def make_transport(self, *, name, extra=None):
            t = super().make_transport(name=name, extra=extra)
            t.__class__ = transport_cls
            return t
    for k, v in attrs.items():
        setattr(Harness, k, v)
    return Harness


class SharedKeys(FakeTransport):
    def key(self, *, channel=None, thread=None, user=""):
        return f"fake:{self.name}:everything"


class Batching(FakeTransport):
    """Joins the lines of an answer into one message and forgets its declared limit."""

    async def send(self, message):
        last = self.posts[-1] if self.posts else None
        if message.kind == "answer" and last and last.run_id == message.run_id:
            self.posts[-1] = dataclasses.replace(last, text=f"{last.text}\n{message.text}")
            return
        await super().send(message)


class DropsWhileBusy(FakeTransport):
    async def say(self, text, *, user="alice", channel=None, thread=None):
        key = self.key(channel=channel, thread=thread, user=user)
        if self.sink.busy(key):
            return
        await super().say(text, user=user, channel=channel, thread=thread)


class EveryoneAddressed(FakeTransport):
    async def say(self, text, *, user="alice", channel=None, thread=None):
        if channel is not None and not text.startswith(self.nick):
            text = f"{self.nick}: {text}"
        await super().say(text, user=user, channel=channel, thread=thread)


class ServeNeverReturns(FakeTransport):
    async def serve(self):
        await asyncio.Event().wait()


class LeavesATask(FakeTransport):
    async def start(self, sink):
        await super().start(sink)
        loop = asyncio.get_running_loop()
        self.worker = loop.create_task(asyncio.Event().wait(), name="forgotten")


class LaxSettings(Quick):
    def make_transport(self, *, name, extra=None):
        return super().make_transport(name=name)


def suite(harness_cls):
    class Suite(TransportConformance):
        @pytest_asyncio.fixture
        async def transport_harness(self):
            return harness_cls(sink_factory=Bridge)
    return Suite


TestControl = suite(FakeHarness)
TestSharedKeys = suite(harness_of(SharedKeys))
TestBatching = suite(harness_of(Batching))
TestDropsWhileBusy = suite(harness_of(DropsWhileBusy))
TestEveryoneAddressed = suite(harness_of(EveryoneAddressed))
TestServeNeverReturns = suite(harness_of(ServeNeverReturns))
TestLeavesATask = suite(harness_of(LeavesATask))
TestLaxSettings = suite(LaxSettings)
TestSkips = suite(harness_of(FakeTransport, base=FakeHarness, place_kinds=frozenset({"direct"}),
                             users=("solo",),
                             unsupported={"test_shutdown_leaves_nothing_running": "no reason"}))
'''

EXPECTED = {
    "TestSharedKeys": {"test_channel_keys_are_distinct_per_place_and_answers_stay_there"},
    "TestBatching": {"test_a_long_answer_is_split_within_the_limits_and_nothing_is_lost"},
    "TestDropsWhileBusy": {"test_messages_sent_while_a_turn_runs_are_not_lost"},
    "TestEveryoneAddressed": {"test_a_channel_answers_only_when_addressed"},
    "TestServeNeverReturns": {
        "test_shutdown_leaves_nothing_running",
        "test_shutdown_during_a_turn_leaves_nothing_running",
    },
    "TestLeavesATask": {
        "test_shutdown_leaves_nothing_running",
        "test_shutdown_during_a_turn_leaves_nothing_running",
    },
    "TestLaxSettings": {"test_an_unknown_setting_is_refused_naming_the_key"},
}


# A whole pytest run in a subprocess (20 s on an idle machine): more than the
# suite's 120 s guard is needed under load.
@pytest.mark.timeout(400)
def test_each_broken_transport_fails_the_check_for_its_bug(pytester):
    pytester.makepyfile(test_broken=BROKEN)
    # The correct fake runs everything; each broken one only the checks for its bug.
    selected = ["test_broken.py::TestControl", "test_broken.py::TestSkips"]
    selected += [
        f"test_broken.py::{cls}::{test}" for cls, tests in EXPECTED.items() for test in tests
    ]
    result = pytester.runpytest_subprocess(*selected, "-rfEs", "-p", "no:cacheprovider")
    out = result.stdout.str()
    failed: set[str] = set(re.findall(r"^(?:FAILED|ERROR) test_broken\.py::(\w+::\w+)", out, re.M))
    expected = {f"{cls}::{test}" for cls, tests in EXPECTED.items() for test in tests}
    assert failed == expected, out
    # Checks a transport cannot take part in are skipped with a visible reason.
    assert "Harness has no channel places: there are no shared channels" in out, out
    assert "Harness has a single place to talk in" in out, out
    assert "Harness: no reason" in out, out
    checks = [name for name in dir(TransportConformance) if name.startswith("test_")]
    outcomes = result.parseoutcomes()
    assert outcomes["skipped"] == 4, out
    assert outcomes["passed"] == 2 * len(checks) - 4, out
