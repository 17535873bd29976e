"""The Slack transport runs the conformance suite: slack-bolt over Socket Mode against FakeSlack.

People are Slack users whose events FakeSlack pushes over the Socket Mode
WebSocket as Slack would (a mention arrives as ``app_mention`` and as
``message``); what they see is FakeSlack's channel state after every
``chat.*`` call, edits and streams included.  A shared channel place is the
thread the bot starts when first mentioned there (the default
``conversation_per = "thread"``); a thread place is another thread.
"""

from __future__ import annotations

from typing import Any

import pytest_asyncio

from agentik.bot.bridge import Bridge
from agentik.transports.base import Transport
from agentik.transports.slack.transport import SlackTransport
from agentik.transports.testing import Place, TransportConformance, TransportHarness

from fakeslack import FakeSlack

CHANNELS = {"a": "CCONFA", "b": "CCONFB"}
USERS = {"alice": "UALICE", "bob": "UBOB"}


class SlackHarness(TransportHarness):
    transport_type = "slack"
    place_kinds = frozenset({"channel", "direct", "thread"})

    def __init__(self, slack: FakeSlack, state_file: str, **settings: Any) -> None:
        super().__init__(sink_factory=Bridge)
        self.slack = slack
        self.state_file = state_file
        self.settings = settings
        self.started = 0
        self.roots: dict[Place, str] = {}  # a channel or thread place -> its thread's ts

    def make_transport(self, *, name: str, extra: dict[str, Any] | None = None) -> Transport:
        s = self.slack
        settings = {
            "bot_token": s.bot_token, "app_token": s.app_token, "api_url": s.api_url,
            "state_file": self.state_file, "edit_interval": 0.05, "max_message_chars": 300,
            **self.settings,
        }  # fmt: skip
        return SlackTransport(name=name, settings={**settings, **(extra or {})})

    async def ready(self, transport: Transport) -> None:
        self.started += 1
        await self.slack.wait_for_socket(self.started, timeout=self.timeout)

    def _where(self, place: Place) -> tuple[str, str | None]:
        if place.kind == "direct":
            return f"D{USERS[place.name]}", None
        channel = CHANNELS[(place.parent or place).name]
        return channel, self.roots.get(place)

    async def _push(self, *events: dict[str, Any]) -> None:
        for event in events:
            await self.slack.wait_for_ack(await self.slack.push_event(event))

    async def say(self, place: Place, text: str, *, user: str, addressed: bool) -> None:
        s, uid = self.slack, USERS[user]
        channel, root = self._where(place)
        if place.kind == "direct":
            await self._push(s.message_event(channel, text, user=uid, channel_type="im"))
            return
        if not addressed:  # chatter in the channel, outside the bot's threads
            await self._push(s.message_event(channel, text, user=uid))
            return
        mention = s.app_mention_event(channel, f"<@{s.bot_user_id}> {text}", user=uid,
                                      thread_ts=root)  # fmt: skip
        if root is None:
            self.roots[place] = mention["ts"]
        # Slack delivers a mention twice: as app_mention and as a message event.
        twin = dict(mention, type="message", channel_type="channel")
        await self._push(mention, twin)

    async def command(self, place: Place, command: str, *, user: str, prefix: str) -> None:
        channel, root = self._where(place)
        if root is None:
            await self.say(place, prefix + command, user=user, addressed=True)
            return
        # In a thread the bot takes part in, people just type "!stop".
        await self._push(
            self.slack.message_event(channel, prefix + command, user=USERS[user], thread_ts=root)
        )

    def received(self, place: Place) -> list[str]:
        channel, root = self._where(place)
        if place.kind != "direct" and root is None:
            return []
        found = [
            (float(ts), m["text"])
            for (ch, ts), m in list(self.slack.messages.items())
            if ch == channel
            and m.get("user") == self.slack.bot_user_id
            and m.get("thread_ts") == root
        ]
        return [text for _, text in sorted(found)]


async def _slack():
    slack = FakeSlack()
    for name, uid in USERS.items():
        slack.add_user(uid, name, display_name=name)
    await slack.start()
    return slack


class TestSlackConformance(TransportConformance):
    """The defaults: in threads, an answer shorter than ``stream_buffer`` is posted whole
    and a longer one streamed natively (chat.startStream); posts and edits in DMs."""

    @pytest_asyncio.fixture
    async def transport_harness(self, tmp_path):
        slack = await _slack()
        try:
            yield SlackHarness(slack, str(tmp_path / "seen.sqlite3"))
        finally:
            await slack.stop()


class TestSlackNativeStreamingConformance(TransportConformance):
    """The same contract when every answer in a thread is streamed natively."""

    @pytest_asyncio.fixture
    async def transport_harness(self, tmp_path):
        slack = await _slack()
        try:
            yield SlackHarness(
                slack, str(tmp_path / "seen.sqlite3"), stream_buffer=1, edit_interval=0
            )
        finally:
            await slack.stop()


class TestSlackEditStreamingConformance(TransportConformance):
    """The same contract when answers are posted and then edited (chat.update)."""

    @pytest_asyncio.fixture
    async def transport_harness(self, tmp_path):
        slack = await _slack()
        try:
            yield SlackHarness(slack, str(tmp_path / "seen.sqlite3"), streaming="edit")
        finally:
            await slack.stop()
