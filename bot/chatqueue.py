"""Chat turns through the turn queue: a chat transport every worker serves, and a
conversation linked across transports.

Several workers on one PostgreSQL database share a turn queue
(:mod:`agentik.core.cluster.conversations`).  A connection one worker owns (an
IRC network, a Slack Socket Mode app) brings all of its messages to that worker:
its turns need no queue.  A transport every worker serves
(:attr:`~agentik.transports.base.Transport.served_anywhere`: Slack's HTTP mode
behind a load balancer) brings each message to whichever worker the balancer
picked, so two events of one thread may reach two workers at once.  Their turns
are queued, as the HTTP API's are (:meth:`ChatQueue.submit`):

* the worker that received the message writes it with its queue row (one
  transaction) and, holding the conversation's lease or taking it, runs it;
  otherwise the lease holder claims it and runs it, after the turns before it;
* what the worker running it needs travels in the queue row's payload (ids and
  names, no secret): the speaker as the transport presented them (verified id,
  name, the details the access policy reads), where the answer goes
  (``reply_to``: the Slack thread) and the channel's ``busy`` mode;
* on the worker that claims it, the chat front end (``chat:<transport name>``,
  :meth:`ChatQueue.admit`) decides again what the speaker may do there, opens the
  channel (its renderer sends the answer through that worker's transport, into the
  right thread) and gives the turn the channel's settings in force;
* ``busy = "steer"`` and ``"interrupt"`` reaching a worker that does not run the
  conversation's turn: the turn running elsewhere is found in the stored events;
  a steer is queued naming it (the holder sends it into that turn), an interrupt
  asks that worker to stop it, then queues the new turn — as the HTTP API does.

**A conversation linked across transports** (``[[links]]``, :mod:`agentik.bot.links`:
an IRC channel of the worker owning IRC with a Slack channel of the worker owning
Slack) takes questions on several workers at once, each through a connection its
worker owns.  Those questions go through the turn queue too, from every transport
(:meth:`ChatQueue.queues`), so one worker at a time runs the conversation's turns,
in the order they were committed, each with the exchanges before it in its
context.  The rule is the link, not who owns the connections or the lease now:

* "its channels are owned by different workers *now*" flips at a failover or a
  rolling restart, while turns queued before may still run on the old holder: a
  question taken directly then would run beside them;
* "another worker holds the conversation's lease" is a store read per message
  (the common case would pay it) and races: two workers reading at the same moment
  both find it free and both run directly;
* "linked with a channel of another transport instance" is known from memory (the
  links every worker keeps in force), is the same on every worker, and stays so
  while ownership moves: either every question of the conversation is queued, or
  (not linked across transports: one connection, one owner) none is.

A conversation not linked across transports keeps the direct path: no store read or
write more than on one process.  A queued turn claimed by a worker that does not own
the asking channel's connection (asked on IRC, run by the worker owning Slack) is
run there without opening that channel (:meth:`ChatQueue.admit`); its answer
reaches the asking channel as any linked channel another worker owns gets it: the
worker owning that connection holds the channel open following the conversation's
stored events (:meth:`agentik.bot.links.Links.follow`), so its renderer streams the
answer as it is written (IRC lines, Slack edits), into the asker's thread (noted here
as the turn is queued); the whole answer written to the outbox at the turn's end
(:meth:`agentik.bot.links.Links._answered_here`) is then the same rows, sent only
where nobody streamed it (that worker took the connection over mid-turn).

On one process (SQLite, the in-memory store) there is no turn queue and nothing
here changes a message's path: it is submitted to the conversation as before.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol

from agentik.core.gate import Speaker
from agentik.core.turnsettings import TurnOrigin
from agentik.transports.base import IncomingMessage

from .chat import speaker_key

if TYPE_CHECKING:
    from agentik.core import Agent, Conversation
    from agentik.core.access import Decision
    from agentik.core.cluster.conversations import Admission, TurnQueue
    from agentik.core.conversation import Sent
    from agentik.core.gate import Gate, Ticket
    from agentik.core.messages import Content, Message
    from agentik.core.store.records import QueuedTurn
    from agentik.core.turnsettings import TurnSettings
    from agentik.transports.base import Transport

    from .channel import ChannelOptions, OpenChannel
    from .chansettings import Effective
    from .links import Links

__all__ = ["VIA_PREFIX", "ChatQueue", "ChatQueueHost"]

log = logging.getLogger(__name__)

#: A queued chat turn's front end: ``chat:<transport instance>``.
VIA_PREFIX = "chat:"


class ChatQueueHost(Protocol):
    """What the chat front end uses of the bridge (the bridge implements it)."""

    agent: Agent
    links: Links

    @property
    def gate(self) -> Gate: ...

    def serves(self, transport: Transport) -> bool:
        """Whether this worker serves ``transport``'s connection now."""
        ...

    async def unopened(self, key: str, transport: Transport, conv: Conversation) -> OpenChannel:
        """Channel ``key`` with its settings in force, not opened."""
        ...

    async def effective(self, channel_key: str, transport: Transport) -> Effective: ...

    async def channel(self, key: str, transport: Transport, opts: ChannelOptions) -> OpenChannel:
        """The channel ``key``, opened if it is not."""
        ...


class ChatQueue:
    """The chat transports' way into the turn queue (see the module docstring)."""

    def __init__(self, host: ChatQueueHost, transports: Mapping[str, Transport]) -> None:
        self.host = host
        #: The bridge's attached transport instances, by name (read at each claim: a
        #: reload may have replaced one).
        self.transports = transports
        self._queue: TurnQueue | None = None

    # -- wiring ---------------------------------------------------------------------------
    def start(self, queue: TurnQueue) -> None:
        """Run through ``queue`` the turns of the transports every worker serves (the bot
        calls it once it made its turn queue, before that starts)."""
        self._queue = queue
        for transport in list(self.transports.values()):
            self.attached(transport)

    def attached(self, transport: Transport) -> None:
        """``transport`` was attached: its queued turns are run here too (any transport:
        a linked conversation's turns are queued from each, and any worker may run
        them)."""
        if self._queue is not None:
            name = transport.name
            self._queue.front_end(
                VIA_PREFIX + name,
                lambda conv, turn, message: self.admit(name, conv, turn, message),
            )

    def queues(self, transport: Transport, key: str) -> TurnQueue | None:
        """The turn queue a question asked in channel ``key`` through ``transport`` goes
        through (``None``: submitted here): with a turn queue, when every worker serves
        the transport, or the channel is linked with a channel of another transport
        (the module's doc says why that rule).  Memory only: no store read."""
        queue = self.host.agent.turn_queue
        if queue is None:
            return None
        if transport.served_anywhere or self.host.links.across(key, transport):
            return queue
        return None

    # -- the receiving worker -------------------------------------------------------------
    async def submit(
        self,
        ticket: Ticket,
        ch: OpenChannel,
        message: IncomingMessage,
        transport: Transport,
        content: Content,
        *,
        text: str,
        author: str,
        author_id: str | None,
        decision: Decision,
        busy: Literal["queue", "steer", "interrupt"],
        settings: TurnSettings,
    ) -> Sent | None:
        """Submit ``message``'s turn: to its conversation (one process, or a transport
        one worker owns), or through the turn queue.  ``None``: queued; the worker that
        runs it renders its answer (:meth:`admit`), nothing more to do here."""
        conv = ch.conversation
        queue = self.queues(transport, message.channel_key)
        if queue is None or not await self._queued(queue, conv, busy):
            return await ticket.submit(
                conv, content, author=author, author_id=author_id, allow_tool=decision.tools,
                busy=busy, settings=settings,
            )  # fmt: skip
        payload: dict[str, Any] = {
            "via": VIA_PREFIX + transport.name,
            "asked": message.channel_key,
            "author": author,
            "author_id": message.author_id,
            "verified": message.verified,
            "direct": message.direct,
            "meta": _plain(message.meta),
            "reply_to": _json_or_none(message.reply_to),
        }
        running = await queue.running_elsewhere(conv.id) if busy != "queue" else None
        if busy == "steer" and running is not None:
            # Queued (nothing lost), and the worker running that turn takes it in.
            payload["steer"] = running
        run_id, here = await queue.submit(
            conv, content, author=author, author_id=author_id, channel=None,
            settings=settings, payload=payload,
        )  # fmt: skip
        if ch.follows and "steer" not in payload:
            # Its answer streams here whoever runs it (the channel follows the turns of
            # other workers): into the asker's thread, and ``!stop`` knows who asked.
            ch.asked(run_id, message.reply_to, speaker_key(transport, message))
        if busy == "interrupt" and running is not None:
            await queue.stop_elsewhere(conv.id, running)
        if here:
            ticket.bind(run_id, chars=len(text))
        return None

    async def _queued(self, queue: TurnQueue, conv: Conversation, busy: str) -> bool:
        """Whether the turn goes through the queue: not when this worker runs the
        conversation and the message steers or interrupts its turn or answers its
        question (straight in, as on one process), nor when a turn on another worker
        waits for an answer (the message answers it there)."""
        if queue.holds(conv.id) and (busy != "queue" or conv.awaiting_human):
            return False
        questions = self.host.agent.questions
        return not (questions.shared and await questions.waits_elsewhere(conv.id))

    # -- the worker running it ------------------------------------------------------------
    async def admit(
        self, name: str, conv: Conversation, turn: QueuedTurn, message: Message
    ) -> Admission:
        """A chat turn queued through transport ``name``, claimed by this worker: the
        speaker's rights decided again here, the channel opened (its renderer sends the
        answer, where ``reply_to`` says), and the turn's settings: the channel's in
        force.  ``None``: refused (the speaker may not ask here any more, or no such
        transport here)."""
        transport = self.transports.get(name)
        p = turn.payload
        key = str(p.get("asked") or conv.channel_key or "")
        if transport is None or not key:
            log.warning("conversation %s: a turn queued through %s, which this worker does"
                        " not have: refused", conv.id, name)  # fmt: skip
            return None
        meta = p.get("meta")
        speaking = IncomingMessage(
            channel_key=key, text=message.content, author_id=str(p.get("author_id") or ""),
            author_name=str(p.get("author") or ""), verified=bool(p.get("verified")),
            direct=bool(p.get("direct")), addressed=True,
            meta=dict(meta) if isinstance(meta, dict) else {}, reply_to=p.get("reply_to"),
        )  # fmt: skip
        speaker = Speaker.of(name, speaking)
        decision = self.host.gate.decide(speaker, key)
        if decision.role == "ignored" or not decision.answer:
            log.info("conversation %s: a queued message's asker is not answered in %s now",
                     conv.id, key)  # fmt: skip
            return None
        if not self.host.serves(transport):
            # The asking channel's connection is another worker's (a linked conversation:
            # asked on IRC, run by the worker owning Slack): not opened here (its renderer
            # could not send); the links hand the answer over at the turn's end, to the
            # worker owning that connection (Links._answered_here), as to any linked
            # channel of another worker, where its ``reply_to`` says (a Slack thread).
            ch = await self.host.unopened(key, transport, conv)
            settings = self.host.links.settings(ch).with_origin(TurnOrigin.of_speaker(speaker, key))
            self.host.links.asked_elsewhere(turn.run_id, speaking.reply_to)
            return decision.tools, settings
        opts = (await self.host.effective(key, transport)).options
        ch = await self.host.channel(key, transport, opts)
        settings = self.host.links.settings(ch).with_origin(TurnOrigin.of_speaker(speaker, key))
        steer = p.get("steer")
        if not (isinstance(steer, str) and steer and conv.running_run_id == steer):
            # Its own turn (not one being sent into the running turn): its answer goes
            # where it was asked, and the channel waits for it.
            ch.reply_to = speaking.reply_to
            ch.direct = speaking.direct
            ch.asked(turn.run_id, speaking.reply_to, speaker_key(transport, speaking))
            ch.add_pending((turn.run_id,))
        return decision.tools, settings


def _plain(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The scalar details of a message (Slack's ``team``, IRC's ``account``): what the
    access policy reads, nothing nested (an assistant thread's context stays here)."""
    return {k: v for k, v in meta.items() if v is None or isinstance(v, str | int | float | bool)}


def _json_or_none(value: object) -> Any:
    """``value`` if it goes into JSON as it is (a Slack ``reply_to``), else ``None``."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return None
    return value
