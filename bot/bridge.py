"""The bridge: the one place that maps channels to conversations.

Transports hand it :class:`~agentik.transports.base.IncomingMessage` values.
For each one it decides whether to answer (always in direct messages; in
shared channels when addressed, or per the instance's ``answer`` setting),
runs chat commands (:mod:`agentik.bot.commands`), and sends the text to the
channel's conversation, with the author's name.  The conversation queues
turns, so nothing is dropped while one runs.

The channels it holds open live in :mod:`agentik.bot.channels`: a renderer
task per open channel (:mod:`agentik.bot.render`) follows the conversation's
events and turns them into the channel's messages, which the bridge sends
(:meth:`Bridge.send`), persisting each piece first on a transport with an
outbox.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from typing import TYPE_CHECKING, Literal

from agentik.core import Agent
from agentik.core.access import AccessPolicy, Decision
from agentik.core.agents import AGENT_TOOL_PREFIX as _AGENT_TOOL_PREFIX
from agentik.core.budgets import Budgets, Subject
from agentik.core.conversation import ResumeMode
from agentik.core.errors import AgentikError, AttachmentRejected, PromptRefused
from agentik.core.gate import Gate, Speaker
from agentik.core.keyedlocks import KeyedLocks
from agentik.core.messages import Message, TextPart
from agentik.core.turnsettings import TurnOrigin
from agentik.transports.base import (
    NEW_CHANNEL,
    Action,
    AgentAccess,
    AgentHost,
    Form,
    IncomingMessage,
    OutgoingKind,
    Transport,
    database_file,
)

from .channel import ChannelOptions, OpenChannel, options_from, resolved_options
from .channels import Channels
from .chansettings import (
    ChannelSettings,
    ChannelSettingsBook,
    Effective,
    RoleFor,
    default_role_for,
    settings_scope,
)
from .chat import author_id as _author_id
from .chat import error_line as _error_line
from .chat import speaker_key as _speaker
from .chatqueue import ChatQueue
from .commands import CommandContext, CommandRegistry, builtin_commands, load_commands
from .config import AgentSection
from .delivery import Delivery
from .links import Links, LinkSettings
from .outbox import Outbox
from .recovery import Recovery, resumed_asker

if TYPE_CHECKING:
    from agentik.core import Conversation
    from agentik.core.cluster.events import ClusterSubscription

    from .metrics import Metrics

__all__ = [
    "COMMANDS",
    "Bridge",
    "ChannelOptions",
    "RoleFor",
    "default_role_for",
    "options_from",
]

# RoleFor and default_role_for (everyone is a ``user``; the coordinator wires
# ``AccessPolicy.role_for`` in its place) are declared once, in .chansettings.

#: The ``[agent]`` defaults (resume mode and age), declared once in the configuration.
_AGENT = AgentSection()

log = logging.getLogger(__name__)

#: The built-in chat commands and their help lines (``!help`` lists these and
#: the plugins' commands: see :mod:`agentik.bot.commands`).
COMMANDS: dict[str, str] = builtin_commands().help()

#: An open channel (declared in :mod:`agentik.bot.channel`, where the commands read it).
_Channel = OpenChannel


def _everyone(transport: Transport) -> bool:
    return True


class Bridge(AgentAccess):
    """Connects transports to one :class:`~agentik.core.Agent`.

    Each active channel holds a renderer task and its conversation; a channel
    left idle for ``idle_seconds`` (no message, no turn running) is released,
    so memory stays bounded however many channels and threads a bot has
    seen.  It reopens, with the same conversation, on its next message (a
    capped answer's unsent rest, ``!more``, does not survive the release).

    It is the transports' :class:`~agentik.transports.base.AgentAccess`: a
    transport that serves the agent directly (HTTP) takes it, and the tools
    its instance allows, from here.
    """

    def __init__(
        self,
        agent: Agent,
        *,
        idle_seconds: float = 900.0,
        resume: ResumeMode = _AGENT.resume,
        resume_max_age: float = _AGENT.resume_max_age,
        access: AccessPolicy | None = None,
        budgets: Budgets | None = None,
        channel_settings: Mapping[str, ChannelSettings] | None = None,
        settings_role: str = _AGENT.settings_role,
        role_for: RoleFor | None = None,
        announce: bool = False,
        links: Collection[LinkSettings] = (),
    ) -> None:
        self.agent = agent
        #: Tell channels when background memory work saved notes from them
        #: (``[memory] announce``; a channel's ``announce`` setting overrides it).
        self.announce = announce
        #: Who may do what (``[access]``); empty: everyone is a ``user``, defaults apply.
        self.access = access or AccessPolicy()
        #: Usage limits per speaker and channel (``None``: unlimited).
        self.budgets = budgets
        #: The speaker's role (for budgets and ``!set``): the access policy's by default.
        self.role_for: RoleFor = role_for or self.access.role_for
        if budgets is not None and agent.hooks.pm is not None:
            agent.hooks.pm.register(budgets.hook, name=f"agentik-budgets-{id(budgets):x}")
        self.idle_seconds = idle_seconds
        #: What :meth:`resume_pending` does with a message a crash left unanswered.
        self.resume = resume
        #: Older pending messages (seconds) only get a notice; 0: no limit.
        self.resume_max_age = resume_max_age
        self._options: dict[str, ChannelOptions] = {}
        self._transports: dict[str, Transport] = {}
        #: The channels held open (:mod:`agentik.bot.channels`).
        self.channels = Channels(self)
        self._channels: dict[str, _Channel] = self.channels.open
        #: Per channel key: the lock its arriving messages take in turn, and its users.
        self._arrivals = KeyedLocks()
        #: Outgoing pieces and their delivery state, persisted (see :meth:`redeliver`).
        self.outbox = Outbox(agent.store)
        #: Per-channel settings: ``[channels."<pattern>"]`` and ``!set`` (see
        #: :mod:`agentik.bot.chansettings`).
        self.settings = ChannelSettingsBook(
            agent.store, channel_settings, profiles=getattr(agent, "profiles", {})
        )
        #: The role ``!set``/``!unset`` need.
        self.settings_role = settings_role
        #: Sends what goes out, persisting it first on an outbox transport.
        self.delivery = Delivery(agent.store, self.outbox, self._transports)
        #: Takes up what a crash left unanswered (:meth:`resume_pending`).
        self.recovery = Recovery(self)
        #: The chat commands: the built-ins, then the plugins' (``register_commands``).
        self.commands: CommandRegistry = load_commands(agent.hooks.pm)
        #: Linked channels (``[[links]]``, ``!link``): one conversation across
        #: transports, people relayed (:mod:`agentik.bot.links`).
        self.links = Links(self, links)
        self.delivery.relays = self.links
        #: Turns of a transport every worker serves, through the turn queue (several
        #: workers: :mod:`agentik.bot.chatqueue`).
        self.chat_queue = ChatQueue(self, self._transports)
        #: Whether this process serves ``transport``'s connection now: the bot sets it
        #: (several workers: another may own it, and a relayed copy for it goes
        #: through the outbox to that worker); by default every attached one.
        self.serves: Callable[[Transport], bool] = _everyone

    @property
    def metrics(self) -> Metrics | None:
        """Where messages in and out are counted (the bot's :class:`~agentik.bot.metrics.Metrics`
        ``message_in``/``message_out``)."""
        return self.delivery.metrics

    @metrics.setter
    def metrics(self, metrics: Metrics | None) -> None:
        self.delivery.metrics = metrics

    @property
    def released_channels(self) -> int:
        """How many idle channels have been released so far."""
        return self.channels.released

    def attach(self, transport: Transport, options: ChannelOptions | None = None) -> None:
        """Register a transport instance and its options.

        Options left unset take the transport's defaults (``max_answer_lines``:
        :attr:`~agentik.transports.base.Transport.default_max_answer_lines`).
        """
        self._transports[transport.name] = transport
        self._options[transport.name] = resolved_options(transport, options)
        self.access.transports.setdefault(transport.name, transport.type)
        if transport.outbox:
            # (through the links: a relayed copy's id goes into the message map)
            transport.on_delivery = self.links.on_delivery
        transport.hears = self.links.hears
        self.chat_queue.attached(transport)

    async def detach(self, name: str) -> None:
        """Transport instance ``name`` is gone (a configuration reload removed it):
        its open channels are released."""
        self._transports.pop(name, None)
        self._options.pop(name, None)
        await self.channels.detach(name)

    def rebind(self, name: str, transport: Transport) -> None:
        """Instance ``name`` was restarted as ``transport`` (new settings): its open
        channels, and the answers they are rendering, carry on through it."""
        self.channels.rebind(name, transport)

    def policy_changed(self) -> None:
        """The agent's tool policy changed: open channels take it for their next turn
        (each channel's own ``tools`` setting is applied again on its next message)."""
        self.channels.policy_changed()

    def options_for(self, transport: Transport) -> ChannelOptions:
        """The options a transport instance was attached with (defaults if none)."""
        return self._options.get(transport.name) or resolved_options(transport, None)

    def allowed_tools(self, transport: Transport) -> tuple[str, ...] | None:
        """The ``allowed_tools`` of the options ``transport`` was attached with."""
        return self.options_for(transport).allowed_tools

    @property
    def gate(self) -> Gate:
        """The admission gate in force (:mod:`agentik.core.gate`): built from the access
        policy, budgets and role function the bridge holds now (a reload replaces them)."""
        return Gate(self.access, self.budgets, self.role_for)

    @property
    def database(self) -> str | None:
        """The agent's database file (``None``: in memory, or not a file)."""
        return database_file(self.agent)

    def as_host(self) -> AgentHost:
        """The bridge as its transports see it: an :class:`~agentik.transports.base.AgentHost`
        (the type checker verifies it implements every member)."""
        return self

    # -- incoming -------------------------------------------------------------
    async def handle(self, message: IncomingMessage, transport: Transport) -> None:
        """Decide, run a command, or send the message to the channel's conversation.

        A transport may hand over each message as its own task (IRC does); the
        messages of one channel are still taken in the order they arrived: each
        waits for the one before it to be queued (or its command started) before
        anything of its own that awaits (settings and budgets read the store).
        """
        if self.metrics is not None:
            self.metrics.message_in(transport.name)
        text = message.text.strip()
        if not text and not message.attachments and not message.meta.get("change"):
            return
        # In a linked channel: the link's key, the author qualified by network.
        message = self.links.arriving(message, transport)
        if message.meta.get("change"):
            # An edit or a deletion: the links carry it to the relayed copies (in order
            # behind the channel's messages); nothing else takes it.
            async with self._arrival(message.channel_key):
                await self.links.change(message, transport)
            return
        async with self._arrival(message.channel_key):
            command = await self._take(message, transport, text)
        if command is not None:
            # Outside the channel's turn: a long command (!compact) does not hold up
            # the messages after it, and those are queued behind it in order anyway.
            await command()

    async def _take(
        self, message: IncomingMessage, transport: Transport, text: str
    ) -> Callable[[], Awaitable[None]] | None:
        """Queue ``message`` in its conversation, or return the command it starts.

        A message for the model passes the gate (:mod:`agentik.core.gate`): the
        speaker's access decision, then budgets, then submit and bind."""
        gate = self.gate
        speaker = Speaker.of(transport.name, message)
        decision = gate.decide(speaker, message.channel_key)
        if decision.role == "ignored":
            return None  # no answer, no command, not even recorded
        self.access.seen(transport.name, message)
        opts = (await self.effective(message.channel_key, transport)).options
        # A linked channel: the link's channels held open, people's words copied to
        # the others (in arrival order).
        await self.links.relay(message, transport, opts.command_prefix)
        command = self._parse_command(text, opts)
        if command is not None:
            # Unknown "commands" in a shared channel are just chatter: ignore.
            if command in self.commands or message.direct or message.addressed:
                name = command
                return lambda: self._command(name, message, transport, opts, decision)
            return None
        if decision.answer and await self.channels.answers_question(message, transport, text):
            return None  # the answer to the turn's question (ask_user), not a new turn
        if not decision.answer or not self._should_answer(message, opts):
            if opts.ambient and not message.direct:
                # Not for us, but the model should know what was said here.
                ch = await self.channels.channel(message.channel_key, transport, opts)
                await ch.conversation.note(
                    text[: opts.max_input_chars],
                    author=message.author_name or message.author_id,
                    author_id=_author_id(transport, message),
                    keep=opts.ambient_lines,
                )
            return None
        if len(text) > opts.max_input_chars:
            await self._send(
                transport,
                message.channel_key,
                f"message too long ({len(text)} characters; the limit is "
                f"{opts.max_input_chars}): not sent to the model",
                "error",
                message.reply_to,
            )
            return None
        await self._submit_turn(message, transport, text, speaker, decision, opts)
        return None

    async def _submit_turn(
        self,
        message: IncomingMessage,
        transport: Transport,
        text: str,
        speaker: Speaker,
        decision: Decision,
        opts: ChannelOptions,
    ) -> None:
        """Admit ``message`` as a turn (budgets), submit it with its channel's settings
        and record who asked where, so its answer finds its way back."""
        ticket = await self.gate.admit(
            speaker, message.channel_key, chars=len(text), decision=decision
        )
        if ticket.refused is not None:
            # One notice per window; later messages get nothing, and no model call.
            if ticket.refused.notice:
                await self._send(transport, message.channel_key, ticket.refused.notice, "notice",
                                 message.reply_to)  # fmt: skip
            return None
        try:
            # Leaving the ticket gives back a reservation no turn of its own took.
            async with ticket:
                ch = await self.channels.channel(
                    message.channel_key, transport, opts,
                    unbound=message.meta.get(NEW_CHANNEL) == message.channel_key,
                )  # fmt: skip
                ch.reply_to = message.reply_to
                ch.direct = message.direct
                ch.more.clear()
                ch.more_in_code = False
                # To the conversation, or through the turn queue (several workers, a
                # transport every worker serves: bot/chatqueue.py).
                sent = await self.chat_queue.submit(
                    ticket, ch, message, transport,
                    [TextPart(text=text), *message.attachments] if message.attachments else text,
                    text=text,
                    author=message.author_name or message.author_id,
                    author_id=_author_id(transport, message),
                    decision=decision,
                    busy=_busy_mode(opts, message, transport),
                    # The channel's persona, tools and model, and who asked where.
                    settings=self.links.settings(ch).with_origin(
                        TurnOrigin.of_speaker(speaker, message.channel_key)
                    ),
                )  # fmt: skip
                if sent is None or sent.steered:
                    # Queued (the worker running it renders it), or joined the running
                    # turn (its answer, asker and budget stay).
                    return None
                run_id = sent.run_id
        except (PromptRefused, AttachmentRejected) as exc:
            # A plugin's words, or why an attachment was not taken: shown as they are.
            await self._send(transport, message.channel_key, str(exc), "error", message.reply_to)
            return None
        except AgentikError as exc:
            line = _error_line(
                type(exc).__name__, str(exc), where=message.channel_key, prefix=opts.command_prefix,
                retryable=getattr(exc, "retryable", False),
            )  # fmt: skip
            await self._send(transport, message.channel_key, line, "error", message.reply_to)
            return None
        ch.asked(run_id, message.reply_to, _speaker(transport, message))
        ch.add_pending((run_id,))
        await self.channels.tell_approval_wait(ch, transport, message, opts)

    @contextlib.asynccontextmanager
    async def _arrival(self, key: str) -> AsyncIterator[None]:
        """One channel's arrivals, one at a time, first come first served (asyncio
        locks wake their waiters in order); a channel's lock is kept while anyone
        holds or waits for it (:class:`~agentik.core.keyedlocks.KeyedLocks`)."""
        lock = self._arrivals(key)  # this reference keeps it while we wait
        async with lock:
            yield

    @staticmethod
    def _parse_command(text: str, opts: ChannelOptions) -> str | None:
        prefix = opts.command_prefix
        if not prefix or not text.startswith(prefix):
            return None
        word = text[len(prefix) :].split(maxsplit=1)
        return word[0].lower() if word else None

    @staticmethod
    def _should_answer(message: IncomingMessage, opts: ChannelOptions) -> bool:
        if message.direct:
            return True
        if opts.answer == "direct":
            return False
        return opts.answer == "all" or message.addressed

    # -- channels --------------------------------------------------------------------
    async def effective(self, channel_key: str, transport: Transport) -> Effective:
        """The settings in force in a channel: the transport's options overlaid
        with ``[channels."<pattern>"]`` tables and the channel's ``!set`` values."""
        scope = settings_scope(transport, channel_key)
        return await self.settings.effective(scope, self.options_for(transport))

    @property
    def open_channels(self) -> int:
        """Channels holding a renderer now (idle ones are released)."""
        return len(self._channels)

    # -- after a restart ---------------------------------------------------------------
    async def resume_pending(
        self, *, only: Callable[[str], bool] | None = None, before: float | None = None
    ) -> dict[str, int]:
        """Take up every message a crash left unanswered (in the channels ``only``
        accepts, written ``before`` the transports started); call once they are
        (:meth:`agentik.bot.recovery.Recovery.resume_pending`).  Returns how many
        messages went each way."""
        return await self.recovery.resume_pending(only=only, before=before)

    def transport_for(self, key: str) -> Transport | None:
        """The attached transport instance that owns channel ``key``, if any."""
        return next((t for t in self._transports.values() if key and t.owns(key)), None)

    def standby_for(self, key: str) -> Transport | None:
        """The attached transport another worker serves ``key`` with (several workers on
        one database): the one owning ``key`` if this worker does not serve it, else the
        only one of ``key``'s type it does not serve (a Slack app waiting for its lease
        has not learnt its team yet); ``None`` when this worker serves it or cannot tell."""
        found = self.transport_for(key)
        if found is not None:
            return None if self.serves(found) else found
        waiting = self.waiting(key.partition(":")[0])
        return waiting[0] if len(waiting) == 1 else None

    def waiting(self, kind: str) -> list[Transport]:
        """The attached instances of transport type ``kind`` another worker serves."""
        return [t for t in self._transports.values() if t.type == kind and not self.serves(t)]

    async def admit_resumed(
        self, key: str, transport: Transport, m: Message
    ) -> tuple[Callable[[str], bool] | None, Subject | None] | None:
        """The front door for a resumed turn (see :meth:`_admit_resumed`)."""
        return await self._admit_resumed(key, transport, m)

    async def _admit_resumed(
        self, key: str, transport: Transport, m: Message
    ) -> tuple[Callable[[str], bool] | None, Subject | None] | None:
        """The front door for a resumed turn, like :meth:`_take` for a new message:
        the asker's role must still be answered here (``None``: refused, recorded
        as such), and budgets must admit it (counted like a new message; over budget:
        refused, with the budget's one notice).  Returns the tools the turn may offer
        and the budget subject its run is counted for."""
        asked = resumed_asker(key, transport, m, self.access.transports)
        gate = self.gate
        # The policy's own role (not a role function's): the asker is rebuilt from the log.
        role = gate.access.role_for(transport.name, asked, key)
        decision = gate.decide_role(role, key)
        if role == "ignored" or not decision.answer:
            log.info("resumed message %d in %s: its asker (%s) is not answered there", m.id,
                     key, role)  # fmt: skip
            return None
        ticket = await gate.admit(
            Speaker.of(transport.name, asked), key, role=role, name=m.author or "",
            decision=decision,
        )  # fmt: skip
        if ticket.refused is not None:
            if ticket.refused.notice:
                await self._send(transport, key, ticket.refused.notice, "notice", None)
            return None
        return decision.tools, ticket.subject

    async def posting(self, conversation_id: str, instance: str) -> None:
        """A post over the HTTP API is about to be submitted: the channels linked with its
        conversation are opened first (:meth:`agentik.bot.links.Links.posting`)."""
        await self.links.posting(conversation_id, instance)

    async def posted(self, conversation_id: str, instance: str, author: str, text: str) -> int:
        """A message posted over the HTTP API: relayed to the channels linked with its
        conversation (:meth:`agentik.bot.links.Links.posted`)."""
        return await self.links.posted(conversation_id, instance, author, text)

    async def interrupt(self, channel_key: str) -> bool:
        """Interrupt the turn running in ``channel_key``; ``False`` if none."""
        ch = self._channels.get(channel_key)
        return bool(ch is not None and await ch.conversation.interrupt())

    async def flush(self, channel_key: str) -> None:
        """Wait until every answer asked for in ``channel_key`` has been sent."""
        ch = self._channels.get(channel_key)
        if ch is None:
            return
        await ch.flushed()

    def busy(self, channel_key: str) -> bool:
        ch = self._channels.get(channel_key)
        return bool(ch is not None and ch.conversation.busy)

    async def settle(self) -> None:
        """Wait until the delivery of every piece sent so far is recorded in the outbox
        (a worker handing its connections over calls it first: the next owner then
        does not send those pieces again)."""
        await self.outbox.drain()

    async def aclose(self) -> None:
        """Stop every renderer (the agent is closed separately)."""
        await self.links.aclose()
        await self.channels.aclose()
        await self.outbox.drain()
        if self.budgets is not None:
            await self.budgets.aclose()

    # -- delivery after a restart ---------------------------------------------------------
    async def redeliver(self, *, transports: Collection[str] | None = None) -> int:
        """Send what the outbox says a previous process left undelivered (for the
        transport instances named, or all); how many pieces
        (:meth:`agentik.bot.delivery.Delivery.redeliver`).  Called once the
        transports have started."""
        return await self.delivery.redeliver(transports=transports)

    # -- commands ----------------------------------------------------------------------
    async def _command(
        self,
        name: str,
        message: IncomingMessage,
        transport: Transport,
        opts: ChannelOptions,
        decision: Decision | None = None,
    ) -> None:
        """Run chat command ``name`` (:mod:`agentik.bot.commands`), if the speaker may."""
        key, reply_to, p = message.channel_key, message.reply_to, opts.command_prefix
        decision = decision or self.access.check(transport.name, message, key)
        command = self.commands.get(name)
        if command is None:
            await self._send(transport, key, f"unknown command {p}{name}; try {p}help", "command",
                             reply_to)  # fmt: skip
            return
        needs = command.needs_role
        if not decision.may_command(name) or (
            needs is not None and not self.access.at_least(decision.role, needs)
        ):
            # A command needing a role (the role commands: admins, everywhere) says
            # so; the others follow the access rules.
            refused = (
                f"{p}{name} is for {needs}s"
                if needs is not None and not self.access.at_least(decision.role, needs)
                else f"{p}{name} is not for {decision.role}s here"
            )
            await self._send(transport, key, refused, "command", reply_to)
            return
        args = message.text.strip()[len(p) :].split()[1:]
        await command.handler(
            CommandContext(
                name=name, args=args, message=message, transport=transport, options=opts,
                decision=decision, host=self,
            )
        )  # fmt: skip

    async def start_over(self, key: str, transport: Transport) -> tuple[_Channel | None, int]:
        """``!new``: a new conversation for channel ``key``; nothing queued is lost.

        Messages queued behind the running answer (not started yet) move to the
        new conversation, in order, with their authors, and are answered there
        to whoever asked; the running answer is stopped.  Returns the channel
        held before (``None`` if none was open) and how many messages moved.
        """
        # Arrivals wait meanwhile: a message is queued in the old conversation
        # (and moved) or in the new one, never lost between the two.
        async with self._arrival(key):
            return await self.channels.start_over(key, transport)

    # What the commands use of the bridge (:class:`~agentik.bot.commands.CommandHost`).
    async def channel(self, key: str, transport: Transport, opts: ChannelOptions) -> _Channel:
        """The channel ``key``, opened (with its conversation) if it is not."""
        return await self.channels.channel(key, transport, opts)

    async def unopened(self, key: str, transport: Transport, conv: Conversation) -> _Channel:
        """Channel ``key`` with its settings in force, not opened (see
        :meth:`agentik.bot.channels.Channels.unopened`)."""
        return await self.channels.unopened(key, transport, conv)

    async def follow(
        self, key: str, transport: Transport, conv: Conversation
    ) -> ClusterSubscription | None:
        """The events channel ``key`` is rendered from when it follows the turns other
        workers run too (:meth:`agentik.bot.links.Links.follow`); ``None``: this
        process's."""
        return await self.links.follow(key, transport, conv)

    def open_channel(self, key: str) -> _Channel | None:
        """The channel ``key`` if it is open now, else ``None``."""
        return self._channels.get(key)

    async def release(self, key: str) -> None:
        """Release channel ``key`` if it is open (it reopens with its next message)."""
        await self.channels.release(key)

    async def settings_changed(self, channel_key: str, transport: Transport) -> Effective:
        """A channel's settings changed (``!set``): in force from its next turn."""
        return await self.channels.settings_changed(channel_key, transport)

    def subject(self, message: IncomingMessage, transport: Transport) -> Subject:
        """Who ``message`` is counted for by the budgets (``!budget``)."""
        return self._subject(message, transport)

    async def send(
        self,
        transport: Transport,
        key: str,
        text: str,
        kind: OutgoingKind,
        reply_to: object,
        run_id: str | None = None,
        *,
        piece: int | None = None,
        outbox_id: int | None = None,
        actions: tuple[Action, ...] = (),
        tag: str | None = None,
        updates: str | None = None,
        author: str | None = None,
        form: Form | None = None,
    ) -> int:
        """Send ``text`` to channel ``key`` (a command's answer, a renderer's piece, a
        relayed message from ``author``); how many pieces it took
        (:meth:`agentik.bot.delivery.Delivery.send`)."""
        return await self.delivery.send(
            transport, key, text, kind, reply_to, run_id, piece=piece, outbox_id=outbox_id,
            actions=actions, tag=tag, updates=updates, author=author, form=form,
        )  # fmt: skip

    # -- budgets (issue 19) ----------------------------------------------------------------
    def _subject(self, message: IncomingMessage, transport: Transport) -> Subject:
        """Who ``message`` is counted for: its speaker (by role) and its channel."""
        key = message.channel_key
        return Subject(
            transport=transport.name, channel=key, identity=_author_id(transport, message),
            role=self.role_for(transport.name, message, key),
            name=message.author_name or message.author_id,
        )  # fmt: skip

    # -- rendering -----------------------------------------------------------------------
    # The bridge's own lines and the commands' go out as the renderer's do.
    _send = send


def __getattr__(name: str) -> object:
    # Names that moved to the rooms the bridge was split into (issue 30).
    if name == "AGENT_TOOL_PREFIX":
        warnings.warn(
            "agentik.bot.bridge.AGENT_TOOL_PREFIX moved: import it from agentik.core.agents",
            DeprecationWarning,
            stacklevel=2,
        )
        return _AGENT_TOOL_PREFIX
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _busy_mode(
    opts: ChannelOptions, message: IncomingMessage, transport: Transport
) -> Literal["queue", "steer", "interrupt"]:
    """The channel's ``busy`` setting; ``auto``: ``steer`` in direct conversations and
    threads (one person, or a few, on one topic), ``queue`` in shared channels."""
    if opts.busy != "auto":
        return opts.busy
    direct = message.direct or transport.in_thread(message.channel_key)
    return "steer" if direct else "queue"
