"""The bridge: the one place that maps channels to conversations and events
to channel messages.

Transports hand it :class:`~agentik.transports.base.IncomingMessage` values.
For each one it decides whether to answer (always in direct messages; in
shared channels when addressed, or per the instance's ``answer`` setting),
runs chat commands, and sends the text to the channel's conversation, with
the author's name.  The conversation queues turns, so nothing is dropped
while one runs.

A renderer task per channel follows the conversation's events and turns them
into :class:`~agentik.transports.base.OutgoingMessage` values fitted to the
transport's :class:`~agentik.transports.base.ChannelCaps`: deltas as they come,
complete lines, or whole messages, split to the size limits; long answers
are capped at ``max_answer_lines`` and the rest kept for ``more``.

Manners in shared channels: with ``events = "auto"`` (the default) a shared
channel sees the answer, errors and interruptions only, while direct
conversations and threads also get one line per tool call.  An error is one
short line with a reference (``error: the model is unavailable right now
(ref 3f9a0c)``); its details (URLs, backend messages) go to the log, in an
ERROR line with the same reference, never to a channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import secrets
import time
import uuid
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from agentik.core import Agent, Conversation
from agentik.core.access import AccessPolicy, Decision, may_redact
from agentik.core.approvals import ApprovalError
from agentik.core.budgets import Budgets, Subject
from agentik.core.conversation import ResumeMode
from agentik.core.errors import AgentikError, NotFound, PromptRefused, ToolError
from agentik.core.eventbus import Subscription
from agentik.core.events import (
    ApprovalRequested,
    ApprovalResolved,
    ChildRunLinked,
    Error,
    Event,
    MemoryNoted,
    QuestionAnswered,
    QuestionAsked,
    TodoUpdated,
    ToolCallEnded,
    ToolProgress,
    TurnEnded,
)
from agentik.core.gate import Gate, Speaker
from agentik.core.keyedlocks import KeyedLocks
from agentik.core.memory import channel_scope, user_scope
from agentik.core.messages import Message, MessageKind, ToolCall
from agentik.core.redaction import RedactionError
from agentik.core.settings import setting_fields
from agentik.core.store.base import OutboxEntry
from agentik.core.streamprofiles import BUILTIN_PROFILES, StreamProfile
from agentik.core.tools.base import ToolContext
from agentik.core.tools.passthrough import PassthroughTool
from agentik.transports.base import (
    Action,
    AgentAccess,
    AgentHost,
    ChannelCaps,
    IncomingMessage,
    OutgoingKind,
    OutgoingMessage,
    Transport,
    database_file,
    restrict_tools,
)
from agentik.transports.text import split_lines, split_text

from .channel import ChannelOptions
from .chansettings import (
    SETTING_KEYS,
    ChannelSettings,
    ChannelSettingsBook,
    Effective,
    RoleFor,
    SettingError,
    allowed_tool_names,
    default_role_for,
    describe,
    parse_setting,
    persona_block,
    recall_override,
    settings_scope,
    split_args,
)
from .config import AgentSection
from .logs import log_event
from .outbox import Outbox

if TYPE_CHECKING:
    from .metrics import Metrics

__all__ = ["COMMANDS", "Bridge", "ChannelOptions", "RoleFor", "default_role_for"]

# RoleFor and default_role_for (everyone is a ``user``; the coordinator wires
# ``AccessPolicy.role_for`` in its place) are declared once, in .chansettings.

#: Commands that change or list roles (for admins).
_MANAGE = frozenset({"role", "ignore", "unignore", "roles"})

#: The ``[agent]`` defaults (resume mode and age), declared once in the configuration.
_AGENT = AgentSection()

log = logging.getLogger(__name__)

COMMANDS: dict[str, str] = {
    "new": "start a fresh conversation in this channel (the old one stays in history)",
    "stop": "interrupt the answer being written",
    "more": "show the next part of a long answer",
    "status": "show the model, the conversation and whether a turn is running",
    "compact": "summarise the older part of this conversation now, to free context",
    "budget": "show what is left of your and this channel's budgets",
    "help": "list these commands",
    "tool": "run a passthrough tool directly, no model: tool <name> [key=value …]; tool alone "
    "lists them",
    # Per-channel settings (issue 19).
    "set": "change a setting of this channel (admins): set <key> <value>; set alone lists the keys",
    "unset": "return a setting of this channel to its configured value (admins): unset <key>",
    "role": "show someone's role, or give one: role <who> [<role>] (admins)",
    "ignore": "make the bot ignore someone: ignore <who> (admins)",
    "unignore": "stop ignoring someone: unignore <who> (admins)",
    "roles": "list the roles given in chat (admins)",
    # -- approvals (issue 19) --
    "approve": "approve a tool call waiting for approval: approve ID [reason]",
    "deny": "refuse a tool call waiting for approval: deny ID [reason]",
    "approvals": "list the tool calls waiting for approval here",
    # -- memory (issue 22) --
    "memory": "list the memory notes visible here, most recent first (with their ids)",
    "forget": "delete memory note N: forget N (global and others' notes: admins)",
    # -- redaction (issue 22) --
    "redact": (
        "remove a message's text from the bot's records: redact [last] (your last message),"
        " redact list, redact N [reason] (yours, or any as admin)"
    ),
}


@dataclass(eq=False)
class _Channel:
    key: str
    transport: Transport
    options: ChannelOptions
    conversation: Conversation
    subscription: Subscription | None = None
    task: asyncio.Task[None] | None = None
    more: deque[str] = field(default_factory=deque)
    #: The next line of :attr:`more` is inside a code block (a fence opened above it).
    more_in_code: bool = False
    reply_to: object = None
    #: The ``reply_to`` of the message each pending run answers (a transport may
    #: address the asker); runs without one use :attr:`reply_to`.
    run_reply_to: dict[str, object] = field(default_factory=dict)
    #: Who asked for each pending run (a speaker key), for ``!stop`` of another's answer.
    run_asker: dict[str, str] = field(default_factory=dict)
    #: Approvals the channel was told it waits on (once each, to queued askers).
    approvals_told: set[str] = field(default_factory=set)
    #: The channel is a direct conversation (its last message was direct).
    direct: bool = False
    pending: set[str] = field(default_factory=set)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    last_used: float = field(default_factory=time.monotonic)

    def idle(self, now: float, after: float) -> bool:
        return not self.pending and not self.conversation.busy and now - self.last_used >= after


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
    ) -> None:
        self.agent = agent
        #: Tell channels when background memory work saved notes from them
        #: (``[memory] announce``; a channel's ``announce`` setting overrides it).
        self.announce = announce
        self._announcer: asyncio.Task[None] | None = None
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
        self._channels: dict[str, _Channel] = {}
        #: Per channel key: the lock its arriving messages take in turn, and its users.
        self._arrivals: dict[str, list[Any]] = {}
        self._lock = KeyedLocks()
        self._reaper: asyncio.Task[None] | None = None
        #: How many idle channels have been released so far.
        self.released_channels = 0
        #: Outgoing pieces and their delivery state, persisted (see :meth:`redeliver`).
        self.outbox = Outbox(agent.store)
        #: Per-channel settings: ``[channels."<pattern>"]`` and ``!set`` (see
        #: :mod:`agentik.bot.chansettings`).
        self.settings = ChannelSettingsBook(
            agent.store, channel_settings, profiles=getattr(agent, "profiles", {})
        )
        #: The role ``!set``/``!unset`` need.
        self.settings_role = settings_role
        # Conversations whose tools a channel's ``tools`` setting narrowed (a
        # conversation object can outlive its channel's renderer).
        self._narrowed: weakref.WeakSet[Conversation] = weakref.WeakSet()
        #: Where messages in and out are counted (the bot's :class:`~agentik.bot.metrics.Metrics`).
        self.metrics: Metrics | None = None

    def attach(self, transport: Transport, options: ChannelOptions | None = None) -> None:
        """Register a transport instance and its options.

        Options left unset take the transport's defaults (``max_answer_lines``:
        :attr:`~agentik.transports.base.Transport.default_max_answer_lines`).
        """
        self._transports[transport.name] = transport
        self._options[transport.name] = _resolved(transport, options)
        self.access.transports.setdefault(transport.name, transport.type)
        if transport.outbox:
            transport.on_delivery = self.outbox.mark

    async def detach(self, name: str) -> None:
        """Transport instance ``name`` is gone (a configuration reload removed it):
        its open channels are released."""
        self._transports.pop(name, None)
        self._options.pop(name, None)
        for key, ch in list(self._channels.items()):
            if ch.transport.name != name:
                continue
            async with self._lock(key):
                if self._channels.get(key) is ch:
                    del self._channels[key]
                    await self._close_channel(ch)

    def rebind(self, name: str, transport: Transport) -> None:
        """Instance ``name`` was restarted as ``transport`` (new settings): its open
        channels, and the answers they are rendering, carry on through it."""
        for ch in self._channels.values():
            if ch.transport.name == name:
                ch.transport = transport

    def policy_changed(self) -> None:
        """The agent's tool policy changed: open channels take it for their next turn
        (each channel's own ``tools`` setting is applied again on its next message)."""
        for ch in self._channels.values():
            conv = ch.conversation
            conv.policy = None
            self._narrowed.discard(conv)
            restrict_tools(
                conv, self.options_for(ch.transport).allowed_tools, default=self.agent.policy
            )

    def options_for(self, transport: Transport) -> ChannelOptions:
        """The options a transport instance was attached with (defaults if none)."""
        return self._options.get(transport.name) or _resolved(transport, None)

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
        if not text:
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
        command = self._parse_command(text, opts)
        if command is not None:
            # Unknown "commands" in a shared channel are just chatter: ignore.
            if command in COMMANDS or message.direct or message.addressed:
                name = command
                return lambda: self._command(name, message, transport, opts, decision)
            return None
        if decision.answer and await self._answers_question(message, transport, text):
            return None  # the answer to the turn's question (ask_user), not a new turn
        if not decision.answer or not self._should_answer(message, opts):
            if opts.ambient and not message.direct:
                # Not for us, but the model should know what was said here.
                ch = await self._channel(message.channel_key, transport, opts)
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
        ticket = await gate.admit(speaker, message.channel_key, chars=len(text), decision=decision)
        if ticket.refused is not None:
            # One notice per window; later messages get nothing, and no model call.
            if ticket.refused.notice:
                await self._send(transport, message.channel_key, ticket.refused.notice, "notice",
                                 message.reply_to)  # fmt: skip
            return None
        try:
            # Leaving the ticket gives back a reservation no turn of its own took.
            async with ticket:
                ch = await self._channel(message.channel_key, transport, opts)
                ch.reply_to = message.reply_to
                ch.direct = message.direct
                ch.more.clear()
                ch.more_in_code = False
                sent = await ticket.submit(
                    ch.conversation,
                    text,
                    author=message.author_name or message.author_id,
                    author_id=_author_id(transport, message),
                    allow_tool=decision.tools,
                    busy=_busy_mode(opts, message, transport),
                )
                run_id = sent.run_id
                if sent.steered:
                    # Joined the running turn: its answer, asker and budget stay.
                    return None
        except PromptRefused as exc:
            # A plugin's words, shown as they are.
            await self._send(transport, message.channel_key, str(exc), "error", message.reply_to)
            return None
        except AgentikError as exc:
            line = _error_line(
                type(exc).__name__, str(exc), where=message.channel_key, prefix=opts.command_prefix,
                retryable=getattr(exc, "retryable", False),
            )  # fmt: skip
            await self._send(transport, message.channel_key, line, "error", message.reply_to)
            return None
        ch.run_reply_to[run_id] = message.reply_to
        ch.run_asker[run_id] = _speaker(transport, message)
        async with ch.changed:
            ch.pending.add(run_id)
        await self._tell_approval_wait(ch, transport, message, opts)
        return None

    async def _tell_approval_wait(
        self, ch: _Channel, transport: Transport, message: IncomingMessage, opts: ChannelOptions
    ) -> None:
        """A message queued behind a turn that waits on an approval: the channel is
        told once per approval what it waits for and where (``!approvals``).

        Other askers' turns do not run meanwhile: a conversation's turns run one
        at a time, in order (each sees the answers before it), so they wait
        until the approval is decided, expires, or its turn is stopped.
        """
        conv = ch.conversation
        if not conv.awaiting_human or self.agent.questions.waiting(conv.id):
            return
        waiting = [
            a for a in await self.agent.approvals.pending(ch.key) if a.conversation_id == conv.id
        ]
        fresh = [a for a in waiting if str(a.id) not in ch.approvals_told]
        if not fresh:
            return
        ch.approvals_told.update(str(a.id) for a in waiting)
        while len(ch.approvals_told) > 100:
            ch.approvals_told.pop()
        a = fresh[0]
        p = opts.command_prefix
        await self._send(
            transport, ch.key,
            f"this channel waits on approval {a.id} ({a.tool}, asked by {a.asker or 'someone'};"
            f" expires in {_wait(a.expires_at - time.time())}): new messages are queued and"
            f" answered after it — {p}approvals shows it; {_article(a.approvers)} may decide",
            "notice", message.reply_to,
        )  # fmt: skip

    async def _answers_question(
        self, message: IncomingMessage, transport: Transport, text: str
    ) -> bool:
        """Whether ``message`` answered a question the channel's turn waits for
        (``ask_user``): then it is the answer, addressed to the bot or not."""
        ch = self._channels.get(message.channel_key)
        if ch is None or not self.agent.questions.waiting(ch.conversation.id):
            return False
        author = message.author_name or message.author_id
        try:
            answered = await ch.conversation.answer(
                text, author=author, author_id=_author_id(transport, message)
            )
        except PromptRefused as exc:
            # A plugin's words, shown as they are; the question still waits.
            await self._send(transport, message.channel_key, str(exc), "error", message.reply_to)
            return True
        if answered is None:
            return False
        ch.last_used = time.monotonic()
        return True

    @contextlib.asynccontextmanager
    async def _arrival(self, key: str) -> AsyncIterator[None]:
        """One channel's arrivals, one at a time, first come first served (asyncio
        locks wake their waiters in order); the entry goes when nobody uses it."""
        entry = self._arrivals.get(key)
        if entry is None:
            entry = self._arrivals[key] = [asyncio.Lock(), 0]
        entry[1] += 1
        try:
            async with entry[0]:
                yield
        finally:
            entry[1] -= 1
            if entry[1] == 0 and self._arrivals.get(key) is entry:
                del self._arrivals[key]

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

    async def _channel(self, key: str, transport: Transport, opts: ChannelOptions) -> _Channel:
        eff = await self.effective(key, transport)
        ch = self._channels.get(key)
        if ch is not None and ch.conversation.state.value == "open":
            ch.last_used = time.monotonic()
            self._apply(ch, eff)
            return ch
        lock = self._lock(key)
        async with lock:
            ch = self._channels.get(key)
            if ch is not None and ch.conversation.state.value == "open":
                ch.last_used = time.monotonic()
                self._apply(ch, eff)
                return ch
            conv = await self.agent.conversation_for_channel(key)
            ch = self._open(key, transport, eff.options, conv)
            self._apply(ch, eff)
            return ch

    def _apply(self, ch: _Channel, eff: Effective) -> None:
        """Put a channel's settings in force for its next turn: options, persona, tools."""
        ch.options = eff.options
        conv = ch.conversation
        conv.system_addition = persona_block(ch.key, eff.persona) if eff.persona else None
        conv.llm_profile = eff.model
        conv.recall = recall_override(self.agent.memory.recall_policy, eff.recall)
        if eff.tools is None and conv not in self._narrowed:
            return  # the transport's bound, set when the channel opened
        outer = self.options_for(ch.transport).allowed_tools
        if outer is None:
            outer = self.agent.policy.allowed_tools
        if eff.tools is None:
            allowed = outer
        else:
            # Exact names: a tool must match the transport's bound and the channel's list.
            allowed = allowed_tool_names((t.name for t in self.agent.tools), outer, eff.tools)
        # TurnPolicy is a pydantic dataclass, which mypy does not see as a dataclass.
        conv.policy = dataclasses.replace(  # type: ignore[type-var]
            conv.policy or self.agent.policy, allowed_tools=allowed
        )
        if eff.tools is None:
            self._narrowed.discard(conv)
        else:
            self._narrowed.add(conv)

    def _open(
        self, key: str, transport: Transport, opts: ChannelOptions, conv: Conversation
    ) -> _Channel:
        restrict_tools(conv, opts.allowed_tools, default=self.agent.policy)
        ch = _Channel(key=key, transport=transport, options=opts, conversation=conv)
        # Everything is followed: a channel's ``events`` setting may change while it
        # is open; the renderer leaves out what the chat profile would not carry.
        ch.subscription = conv.events(profile="debug")
        ch.task = asyncio.create_task(self._render(ch), name=f"agentik-render:{key}")
        self._channels[key] = ch
        if self._reaper is None and self.idle_seconds > 0:
            self._reaper = asyncio.create_task(self._reap(), name="agentik-bridge-reaper")
        if self._announcer is None:
            self._announcer = asyncio.create_task(self._announce(), name="agentik-announcer")
        return ch

    @property
    def open_channels(self) -> int:
        """Channels holding a renderer now (idle ones are released)."""
        return len(self._channels)

    async def _reap(self) -> None:
        """Release channels idle for ``idle_seconds``; sleeps until the next may be."""
        try:
            while self._channels:
                now = time.monotonic()
                oldest = min(ch.last_used for ch in self._channels.values())
                await asyncio.sleep(max(0.0, oldest + self.idle_seconds - now) + 0.01)
                now = time.monotonic()
                for key, ch in list(self._channels.items()):
                    if now - ch.last_used < self.idle_seconds:
                        continue
                    if not ch.idle(now, self.idle_seconds):
                        ch.last_used = now  # a long turn: look again later
                        continue
                    async with self._lock(key):
                        if self._channels.get(key) is ch and ch.idle(now, self.idle_seconds):
                            del self._channels[key]
                            await self._close_channel(ch)
                            self.released_channels += 1
                            log.debug("released idle channel %s", key)
        finally:
            self._reaper = None

    async def _close_channel(self, ch: _Channel) -> None:
        if ch.subscription is not None:
            await ch.subscription.aclose()
        if ch.task is not None:
            ch.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ch.task

    # -- memory notes (issue 22) -------------------------------------------------------
    async def _announce(self) -> None:
        """Tell each channel, once per job, that reflection or mining saved notes
        from it (when its ``announce`` is on); runs while the bridge does."""
        kinds = {"memory_noted"}
        async with contextlib.aclosing(self.agent.events(kinds=kinds)) as events:
            async for e in events:
                if not isinstance(e, MemoryNoted) or not e.channel_key or not e.count:
                    continue
                try:
                    await self._announce_one(e, e.channel_key)
                except Exception:
                    log.exception("announcing saved notes in %s failed", e.channel_key)

    async def _announce_one(self, e: MemoryNoted, key: str) -> None:
        transport = next((t for t in self._transports.values() if t.owns(key)), None)
        if transport is None:
            return
        eff = await self.effective(key, transport)
        if not (self.announce if eff.announce is None else eff.announce):
            return
        what = "fact" if e.source == "mining" else "reflection"
        noun = what if e.count == 1 else f"{what}s"
        p = eff.options.command_prefix
        await self._send(
            transport, key, f"noted {e.count} {noun} — {p}memory to review", "notice", None
        )

    async def _visible_scopes(
        self, message: IncomingMessage, transport: Transport
    ) -> tuple[list[str], str | None]:
        """The memory scopes a channel sees (global, the channel, its recent
        verified speakers and the asker), and the asker's own user scope."""
        key = message.channel_key
        scopes = ["global", channel_scope(key)]
        mine = _author_id(transport, message)
        own = user_scope(mine) if mine else None
        speakers: list[str] = []
        conv_id = await self.agent.store.get_binding(key)
        if conv_id is not None:
            with contextlib.suppress(AgentikError):
                speakers = list(await (await self.agent.get_conversation(conv_id)).speakers())
        for who in (mine, *speakers):
            if who and user_scope(who) not in scopes:
                scopes.append(user_scope(who))
        return scopes, own

    async def _cmd_memory(
        self,
        message: IncomingMessage,
        transport: Transport,
        opts: ChannelOptions,
        say: Callable[[str], Awaitable[None]],
    ) -> None:
        """``!memory``: the notes visible here, most recent first, paged with ``more``."""
        key = message.channel_key
        scopes, own = await self._visible_scopes(message, transport)
        notes = await self.agent.memory.list(scopes, limit=200)
        if not notes:
            await say("no memory notes here")
            return

        def label(scope: str) -> str:
            if scope == "global":
                return "global"
            if scope == own:
                return "you"
            return "here" if scope.startswith("channel:") else scope.split(":", 1)[1]

        lines = []
        for n in notes:
            text = " ".join(n.text.split())
            text = text if len(text) <= 100 else text[:99] + "…"
            lines.append(f"#{n.id} [{label(n.scope)}] {text}")
        ch = await self._channel(key, transport, opts)
        cap = ch.options.max_answer_lines or len(lines)
        await say(f"{len(notes)} memory notes here (newest first; {opts.command_prefix}forget N "
                  "deletes one):")  # fmt: skip
        for line in lines[:cap]:
            await say(line)
        ch.more.clear()
        ch.more_in_code = False
        ch.more.extend(lines[cap:])
        if ch.more:
            await say(f"… {len(ch.more)} more lines: {opts.command_prefix}more")

    async def _cmd_forget(
        self,
        args: list[str],
        message: IncomingMessage,
        transport: Transport,
        decision: Decision,
        say: Callable[[str], Awaitable[None]],
        p: str,
    ) -> None:
        """``!forget N``: delete note N if it is visible here; a global note or
        another person's needs an admin (the deletion is a new, audited version)."""
        if len(args) != 1 or not args[0].lstrip("#").isdigit():
            await say(f"usage: {p}forget N (the note's id, from {p}memory)")
            return
        note_id = int(args[0].lstrip("#"))
        scopes, own = await self._visible_scopes(message, transport)
        note = await self.agent.memory.get(note_id)
        if note is None or note.scope not in scopes:
            await say(f"no memory note {note_id} here")
            return
        if not note.scope.startswith("channel:") and note.scope != own:
            if not self.access.at_least(decision.role, "admin"):
                whose = "a global note" if note.scope == "global" else "someone else's note"
                await say(f"note {note_id} is {whose}: only admins may forget it")
                return
        if await self.agent.memory.delete(note_id, author=self._actor(transport, message)):
            await say(f"forgot note {note_id}")
        else:
            await say(f"no memory note {note_id} here")

    # -- after a restart ---------------------------------------------------------------
    async def resume_pending(self) -> dict[str, int]:
        """Take up every message a crash left unanswered; call once transports are started.

        For each conversation with committed user messages that have no
        finished turn, the channel is opened on the attached transport that
        owns its key and the conversation resumes them by :attr:`resume`:
        ``answer`` runs the turn (rendered to the channel as usual),
        ``note`` posts a short notice instead, ``drop`` records it as dropped.
        A message older than :attr:`resume_max_age` only gets ``note`` (when
        the policy is ``answer``).  A conversation whose channel has no
        attached transport stays pending (logged) for a later start, and the
        search pages past it, so any number of such rows never hide a message
        a transport can take; one whose channel has since been bound to
        another conversation (``!new``) is recorded as superseded.  A turn taken
        up passes the gate a new message passes (:meth:`_admit_resumed`: its
        asker's role, then budgets).  Returns how many messages went each way.
        """
        counts = {"answer": 0, "note": 0, "drop": 0, "superseded": 0, "left": 0, "refused": 0}
        answered: set[str] = set()
        after = 0
        now = time.time()
        while pending := await self.agent.pending_turns(after=after):
            after = pending[-1].id
            by_conv: dict[str, list[Message]] = {}
            for m in pending:
                by_conv.setdefault(m.conversation_id, []).append(m)
            for cid, messages in by_conv.items():
                await self._resume_conversation(cid, messages, now, counts, answered)
        counts["approvals_expired"] = await self._expire_left_approvals(answered)
        return counts

    async def _resume_conversation(
        self,
        cid: str,
        messages: list[Message],
        now: float,
        counts: dict[str, int],
        answered: set[str],
    ) -> None:
        key = messages[-1].channel or ""
        transport = next((t for t in self._transports.values() if key and t.owns(key)), None)
        if transport is None:
            counts["left"] += len(messages)
            log.warning(
                "conversation %s: %d unanswered message(s) for %s, which no attached "
                "transport serves; left for a later start",
                cid,
                len(messages),
                key or "no channel",
            )
            return
        ch = await self._channel(key, transport, self.options_for(transport))
        conv = ch.conversation
        if conv.id != cid:
            old = await self.agent.get_conversation(cid)
            old.resume(messages, mode="drop", outcome="superseded")
            counts["superseded"] += len(messages)
            return
        for m in messages:
            mode: ResumeMode = self.resume
            max_age = self.resume_max_age
            if mode == "answer" and max_age and now - m.created_at > max_age:
                mode = "note"
            allow_tool: Callable[[str], bool] | None = None
            subject: Subject | None = None
            if mode == "answer":
                admitted = await self._admit_resumed(key, transport, m)
                if admitted is None:
                    conv.resume([m], mode="drop", outcome="refused")
                    counts["refused"] += 1
                    continue
                allow_tool, subject = admitted
            got = conv.resume([m], mode=mode, allow_tool=allow_tool)
            # At once (no await in between): the admission of the next one awaits, and
            # this turn may end meanwhile.
            ch.pending.update(got)
            if subject is not None and got:
                assert self.budgets is not None
                self.budgets.bind(m.run_id or "", subject, chars=len(m.content))
            if mode == "answer":
                answered.update(got)
            counts[mode] += 1
        log.info("resumed %d unanswered message(s) in %s", len(messages), key)

    def _resumed_asker(self, key: str, transport: Transport, m: Message) -> IncomingMessage:
        """The asker of a resumed turn, from the verified identity stored with it.

        Only the verified identity survives in the audit log: an unverified
        asker (hostmask roles are not known now), or an identity of another
        transport instance than the channel's (no transport writes that; a row
        not written by this bot), is taken as an unverified speaker.
        """
        author = (m.data or {}).get("author_id")
        instance, _, aid = author.partition(":") if isinstance(author, str) else ("", "", "")
        if instance != transport.name or not aid:
            return IncomingMessage(channel_key=key, text=m.content, author_id=m.author or "",
                                   author_name=m.author or "", verified=False)  # fmt: skip
        kind = self.access.transports.get(instance)
        meta: dict[str, object] = {}
        if kind == "irc":
            meta = {"account": aid}
        elif kind == "slack":
            meta = {"team": key.split(":")[1] if key.count(":") >= 2 else None}
        return IncomingMessage(channel_key=key, text=m.content, author_id=aid,
                               author_name=m.author or aid, meta=meta)  # fmt: skip

    async def _admit_resumed(
        self, key: str, transport: Transport, m: Message
    ) -> tuple[Callable[[str], bool] | None, Subject | None] | None:
        """The front door for a resumed turn, like :meth:`_take` for a new message:
        the asker's role must still be answered here (``None``: refused, recorded
        as such), and budgets must admit it (counted like a new message; over budget:
        refused, with the budget's one notice).  Returns the tools the turn may offer
        and the budget subject its run is counted for."""
        asked = self._resumed_asker(key, transport, m)
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

    async def _expire_left_approvals(self, answered: set[str]) -> int:
        """Approvals a restart left pending (issue 19): those of a turn being resumed wait
        for it (it takes one over when it calls the same tool again, or it expires when
        the turn ends); the others expire now, with a notice in their channel."""
        approvals = self.agent.approvals
        try:
            left = await approvals.leftovers()
        except NotImplementedError:
            return 0
        expired = 0
        for a in left:
            if a.run_id in answered:
                continue
            key = a.channel_key or ""
            transport = next((t for t in self._transports.values() if key and t.owns(key)), None)
            try:
                conv = await self.agent.get_conversation(a.conversation_id)
                if transport is not None and conv.channel_key == key:
                    # Open the channel first, so its renderer shows the notice.
                    await self._channel(key, transport, self.options_for(transport))
                await approvals.expire(
                    conv.parts, a, "the bot restarted and that turn was not taken up again"
                )
                expired += 1
            except Exception:
                log.exception("could not expire approval %s", a.id)
        return expired

    async def interrupt(self, channel_key: str) -> bool:
        """Interrupt the turn running in ``channel_key``; ``False`` if none."""
        ch = self._channels.get(channel_key)
        return bool(ch is not None and await ch.conversation.interrupt())

    async def flush(self, channel_key: str) -> None:
        """Wait until every answer asked for in ``channel_key`` has been sent."""
        ch = self._channels.get(channel_key)
        if ch is None:
            return
        async with ch.changed:
            await ch.changed.wait_for(lambda: not ch.pending)

    def busy(self, channel_key: str) -> bool:
        ch = self._channels.get(channel_key)
        return bool(ch is not None and ch.conversation.busy)

    async def aclose(self) -> None:
        """Stop every renderer (the agent is closed separately)."""
        if self._announcer is not None:
            self._announcer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._announcer
            self._announcer = None
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for ch in list(self._channels.values()):
            await self._close_channel(ch)
        self._channels.clear()
        await self.outbox.drain()
        if self.budgets is not None:
            await self.budgets.aclose()

    # -- delivery after a restart ---------------------------------------------------------
    async def redeliver(self) -> int:
        """Send what the outbox says a previous process left undelivered; how many pieces.

        Called once the transports have started.  Pieces still ``queued``
        (an IRC line waiting for flood control, a Slack answer not posted)
        are sent; so are pieces ``sent`` but awaiting a confirmation that
        never came (IRC with echo-message; a Slack answer whose final text was
        not in its message yet: that message is updated, not posted again).
        A streamed answer whose turn never reached the renderer's end is
        completed from the audit log when the turn did finish there.  Rows
        older than a week are pruned first.
        """
        store = self.agent.store
        await self.outbox.prune()
        rows = await store.outbox_undelivered()
        sent = 0
        ends: dict[tuple[str, str], OutboxEntry] = {}
        for row in rows:
            transport = self._transports.get(row.transport)
            if transport is None or not transport.outbox:
                continue  # that transport is not configured any more
            text = row.text
            if not row.complete:
                found = await self._answer_from_log(row)
                if found is None:
                    continue  # the turn did not finish: resuming it is not ours
                text = found
                await self.outbox.add([dataclasses.replace(row, text=text, complete=True)])
            kind: OutgoingKind = "answer" if row.kind == "stream" else row.kind  # type: ignore[assignment]
            try:
                await transport.send(
                    OutgoingMessage(
                        channel_key=row.channel_key, text=text, kind=kind, run_id=row.run_id,
                        reply_to=row.reply_to, outbox_id=row.id, replaces=row.ref,
                    )
                )  # fmt: skip
            except Exception:
                log.exception("transport %s could not redeliver to %s", row.transport,
                              row.channel_key)  # fmt: skip
                continue
            sent += 1
            ends[(row.channel_key, row.run_id)] = row
        for row in ends.values():
            transport = self._transports[row.transport]
            with contextlib.suppress(Exception):
                await transport.send(
                    OutgoingMessage(
                        channel_key=row.channel_key, text="", kind="end", run_id=row.run_id,
                        reply_to=row.reply_to,
                    )
                )  # fmt: skip
        if sent:
            log.info("redelivered %d outgoing pieces left undelivered by the last run", sent)
        return sent

    async def _answer_from_log(self, row: OutboxEntry) -> str | None:
        """The answer text of ``row``'s run if its turn completed in the audit log."""
        store = self.agent.store
        conv_id = await store.get_binding(row.channel_key)
        if conv_id is None:
            return None
        recent = await store.messages(conv_id, limit=200)
        run = [m for m in recent if m.run_id == row.run_id]
        if not run or run[-1].kind != "assistant" or run[-1].status != "complete":
            return None
        texts = [m.content for m in run if m.kind == "assistant" and m.content]
        return "\n".join(texts) or None

    # -- commands ----------------------------------------------------------------------
    async def _command(
        self,
        name: str,
        message: IncomingMessage,
        transport: Transport,
        opts: ChannelOptions,
        decision: Decision | None = None,
    ) -> None:
        key, reply_to, p = message.channel_key, message.reply_to, opts.command_prefix
        decision = decision or self.access.check(transport.name, message, key)

        async def say(text: str) -> None:
            await self._send(transport, key, text, "command", reply_to)

        if name in COMMANDS and not decision.may_command(name):
            # The role commands are for admins everywhere; the others follow the rules.
            await say(f"{p}{name} is for admins" if name in _MANAGE
                      else f"{p}{name} is not for {decision.role}s here")  # fmt: skip
            return
        args = message.text.strip()[len(p) :].split()[1:]

        handlers: dict[str, Callable[[], Awaitable[None]]] = {
            "help": lambda: self._cmd_help(args, message, transport, decision, say, p),
            "stop": lambda: self._cmd_stop_checked(key, message, transport, decision, say),
            "new": lambda: self._cmd_new(key, message, transport, opts, decision, say),
            "more": lambda: self._cmd_more(key, transport, say, p),
            "status": lambda: self._cmd_status(key, transport, opts, say, args, message),
            "compact": lambda: self._cmd_compact(key, transport, opts, say),
            "budget": lambda: self._cmd_budget(message, transport, say),
            # Per-channel settings (issue 19).
            "set": lambda: self._cmd_set(message, transport, say, p),
            "unset": lambda: self._cmd_unset(message, transport, say, p),
            "role": lambda: self._cmd_grant(name, args, message, transport, decision, say, p),
            "ignore": lambda: self._cmd_grant(name, args, message, transport, decision, say, p),
            "unignore": lambda: self._cmd_grant(name, args, message, transport, decision, say, p),
            "roles": lambda: self._cmd_roles(say),
            "approve": lambda: self._cmd_decide("approve", message, transport, opts, say),
            "deny": lambda: self._cmd_decide("deny", message, transport, opts, say),
            "approvals": lambda: self._cmd_approvals(key, opts, say),
            "tool": lambda: self._cmd_tool(message, transport, opts, decision, say, p),
            "memory": lambda: self._cmd_memory(message, transport, opts, say),
            "forget": lambda: self._cmd_forget(args, message, transport, decision, say, p),
            "redact": lambda: self._cmd_redact(args, message, transport, decision, say, p),
        }
        handler = handlers.get(name)
        if handler is None:
            await say(f"unknown command {p}{name}; try {p}help")
            return
        await handler()

    # -- access commands (issue 19: roles given in chat) ---------------------------------
    async def _cmd_stop_checked(
        self,
        key: str,
        message: IncomingMessage,
        transport: Transport,
        decision: Decision,
        say: Callable[[str], Awaitable[None]],
    ) -> None:
        """``!stop``; an answer someone else asked for needs ``stop-others``."""
        ch = self._channels.get(key)
        running = ch.conversation.running_run_id if ch is not None else None
        asker = ch.run_asker.get(running) if ch is not None and running else None
        if (
            asker is not None
            and asker != _speaker(transport, message)
            and not decision.may_command("stop-others")
        ):
            await say("only the asker (or an admin) may stop this answer")
            return
        await self._cmd_stop(key, say)

    def _actor(self, transport: Transport, message: IncomingMessage) -> str:
        """Who gives a command, as an identity key (``libera:account:alice``), else
        as :func:`_speaker` (an unverified speaker); recorded with what it changes."""
        return self.access.identity(transport.name, message).id or _speaker(transport, message)

    def _target(
        self, args: list[str], message: IncomingMessage, transport: Transport
    ) -> tuple[str, str]:
        """The identity key a command's first argument names and its role; ValueError."""
        if not args:
            raise ValueError("name someone")
        target = self.access.resolve(
            args[0], transport.name, message.meta,
            lambda name: transport.account_of(message.channel_key, name),
        )  # fmt: skip
        return target, self.access.role_of_key(target)

    async def _change_role(
        self,
        target: str,
        current: str,
        role: str | None,
        message: IncomingMessage,
        transport: Transport,
        decision: Decision,
    ) -> str:
        """Check and apply a change; the line to say."""
        access = self.access
        if current == "owner":
            return f"{target} is an owner (owners are set in the configuration)"
        if access.at_least(current, "admin") and decision.role != "owner":
            return f"{target} is {current}: only an owner changes that"
        if role == "owner":
            return "owners are set in the configuration only"
        if role is not None and role not in access.roles:
            return f"unknown role {role!r} (roles: {', '.join(access.roles)})"
        if ":mask:" in target and role not in (None, "ignored", "user"):
            return "a hostmask can only be ignored; roles go to accounts"
        actor = self._actor(transport, message)
        old = await access.grant(target, role, by=actor, channel=message.channel_key)
        now = access.role_of_key(target)
        was = old or current
        return f"{target}: {was} → {now}"

    async def _cmd_grant(
        self,
        name: str,
        args: list[str],
        message: IncomingMessage,
        transport: Transport,
        decision: Decision,
        say: Callable[[str], Awaitable[None]],
        p: str,
    ) -> None:
        """``!role <who> [<role>]`` (shows or sets a role), ``!ignore <who>``,
        ``!unignore <who>`` (only a chat grant of ``ignored`` is undone)."""
        try:
            target, current = self._target(args, message, transport)
        except ValueError as exc:
            await say(f"{exc}; usage: {p}{name} <who>{' [<role>]' if name == 'role' else ''}")
            return
        role: str | None = "ignored"
        if name == "role":
            if len(args) < 2:
                await say(f"{target} is {current}")
                return
            role = args[1]
        elif name == "unignore":
            grant = self.access.grants.get(target)
            if grant is None or grant.role != "ignored":
                note = " (by the configuration: change it there)" if current == "ignored" else ""
                await say(f"{target} is not ignored in chat{note}")
                return
            role = None
        await say(await self._change_role(target, current, role, message, transport, decision))

    async def _cmd_roles(self, say: Callable[[str], Awaitable[None]]) -> None:
        grants = sorted(self.access.grants.values(), key=lambda g: g.identity)
        configured = len(self.access.config_roles())
        given = ", ".join(f"{g.identity} {g.role}" for g in grants) or "none"
        await say(f"roles given in chat: {given}; {configured} set in the configuration")

    async def _cmd_stop(self, key: str, say: Callable[[str], Awaitable[None]]) -> None:
        if not await self.interrupt(key):
            await say("nothing to stop")

    async def _cmd_new(
        self,
        key: str,
        message: IncomingMessage,
        transport: Transport,
        opts: ChannelOptions,
        decision: Decision,
        say: Callable[[str], Awaitable[None]],
    ) -> None:
        """``!new``: start the channel over; nothing queued is lost.

        The answer being written is stopped, with the same rights as ``!stop``:
        when someone else asked for it (or it waits on an approval they asked
        for), only a speaker with ``stop-others`` (admins) may start over — the
        others are told to wait for it or ask its asker.  Messages queued
        behind it (not started yet) move to the new conversation, in order,
        with their authors, and are answered there to whoever asked.
        """
        old = self._channels.get(key)
        if old is not None:
            running = old.conversation.running_run_id
            asker = old.run_asker.get(running) if running else None
            if (
                asker is not None
                and asker != _speaker(transport, message)
                and not decision.may_command("stop-others")
            ):
                await say(
                    "someone else's answer is being written: only its asker (or an admin)"
                    f" may start over now; try {opts.command_prefix}new when it is done"
                )
                return
        moved: list[str] = []
        # Arrivals wait meanwhile: a message is queued in the old conversation
        # (and moved) or in the new one, never lost between the two.
        async with self._arrival(key):
            lock = self._lock(key)
            async with lock:
                conv = await self.agent.new_conversation_for_channel(key)
                eff = await self.effective(key, transport)
                # The new channel follows its conversation before anything is queued there.
                new = self._open(key, transport, eff.options, conv)
                self._apply(new, eff)
                if old is not None:
                    new.direct = old.direct
                    new.reply_to = old.reply_to
                    running = old.conversation.running_run_id
                    waiting = [r for r in old.pending if r != running]
                    # Who asked, and where the answer goes, before the moved turns run.
                    for run_id in waiting:
                        if run_id in old.run_reply_to:
                            new.run_reply_to[run_id] = old.run_reply_to[run_id]
                        if run_id in old.run_asker:
                            new.run_asker[run_id] = old.run_asker[run_id]
                    async with new.changed:
                        new.pending.update(waiting)
                    # First the queue (so the next turn does not start in the old
                    # conversation when the running one stops), then the running turn.
                    if old.conversation.state.value == "open":  # not closed under it
                        moved = await old.conversation.move_queued(conv)
                    async with new.changed:
                        new.pending.difference_update(set(waiting) - set(moved))
                        new.changed.notify_all()
                    await old.conversation.interrupt()
                    async with old.changed:
                        old.pending.clear()
                        old.changed.notify_all()
                    await self._close_channel(old)
        kept = f" (the previous one is kept as {old.conversation.id})" if old else ""
        count = len(moved)
        carried = (
            f"; {count} queued message{'s' if count != 1 else ''} moved to it" if count else ""
        )
        await say(f"started a new conversation{kept}{carried}")

    async def _cmd_redact(
        self,
        args: list[str],
        message: IncomingMessage,
        transport: Transport,
        decision: Decision,
        say: Callable[[str], Awaitable[None]],
        p: str,
    ) -> None:
        """``!redact`` / ``!redact last``: the speaker's own last message here;
        ``!redact list``: the recent messages' numbers (never their text);
        ``!redact N [reason]``: message N of this channel's conversation —
        the author's own (verified identity) or, for admins, anyone's."""
        key = message.channel_key
        conv_id = await self.agent.store.get_binding(key)
        if conv_id is None:
            await say("nothing to redact here")
            return
        me = _author_id(transport, message)
        # An ask_user answer (a tool result carrying its answerer's
        # author_id) is its author's words too: listed and redactable by them.
        kinds: list[MessageKind] = ["user", "assistant", "tool_result"]
        recent = [
            m
            for m in await self.agent.store.messages(conv_id, limit=50, kinds=kinds)
            if not _is_redacted(m) and (m.kind != "tool_result" or _data(m).get("author_id"))
        ]
        what = args[0].lower() if args else "last"
        reason = " ".join(args[1:])
        if what == "list":
            if not recent:
                await say("no messages to redact here")
                return
            shown = [
                f"#{m.id} {m.author or _redact_label(m)}"
                f" ({len(m.content)} chars, {_ago(m.created_at)})"
                for m in recent[-8:]
            ]
            await say(f"recent messages: {'; '.join(shown)} — {p}redact N [reason]")
            return
        if what == "last":
            mine = [m for m in recent if me is not None and _data(m).get("author_id") == me]
            if not mine:
                await say(
                    "no message of yours to redact here"
                    + ("" if me else " (your identity is not verified: ask an admin)")
                )
                return
            target = mine[-1]
        else:
            try:
                number = int(what.lstrip("#"))
            except ValueError:
                await say(f"usage: {p}redact [last] | {p}redact list | {p}redact N [reason]")
                return
            rows = await self.agent.store.messages(conv_id, after=number - 1, limit=1)
            if not rows or rows[0].id != number:
                await say(f"no message #{number} in this channel's conversation")
                return
            target = rows[0]
            if not may_redact(decision.admin, me, _data(target).get("author_id")):
                await say(f"only its author or an admin may redact message #{number}")
                return
        by = me or f"{transport.name}:{message.author_id}"
        try:
            done = await self.agent.redact(conv_id, target.id, by=by, reason=reason)
        except (NotFound, RedactionError) as exc:
            await say(f"cannot redact message #{target.id}: {exc}")
            return
        notes = (
            f"; {done.notes_removed} memory note(s) derived from it deleted"
            if done.notes_removed
            else ""
        )
        await say(f"message #{target.id} redacted{notes}")

    async def _cmd_more(
        self, key: str, transport: Transport, say: Callable[[str], Awaitable[None]], prefix: str
    ) -> None:
        ch = self._channels.get(key)
        if ch is None or not ch.more:
            await say("nothing more")
            return
        cap = ch.options.max_answer_lines or len(ch.more)
        page = [ch.more.popleft() for _ in range(min(cap, len(ch.more)))]
        lines_transport = transport.caps.streaming == "lines"
        if ch.more_in_code and lines_transport:
            # The page continues a code block: a line transport formats line by
            # line, so it is told (the fence line itself shows nothing).
            page.insert(0, "```")
        for line in page:
            await self._send(transport, key, line, "answer", ch.reply_to)
            if _is_fence(line):
                ch.more_in_code = not ch.more_in_code
        if lines_transport:
            # Each page is an answer of its own: the transport's formatting state
            # (an open code block) and a batch it collects (draft/multiline) end here.
            ch.more_in_code = ch.more_in_code and bool(ch.more)
            await self._send(transport, key, "", "end", ch.reply_to)
        if ch.more:
            await say(f"… {len(ch.more)} more lines: {prefix}more")

    async def _cmd_compact(
        self,
        key: str,
        transport: Transport,
        opts: ChannelOptions,
        say: Callable[[str], Awaitable[None]],
    ) -> None:
        ch = await self._channel(key, transport, opts)
        try:
            event = await ch.conversation.compact_now()
        except AgentikError as exc:
            line = _error_line(
                type(exc).__name__, str(exc), where=key, prefix=opts.command_prefix,
                retryable=getattr(exc, "retryable", False),
            )  # fmt: skip
            await say(f"could not compact: {line.removeprefix('error: ')}")
            return
        if event is None:
            await say("nothing to compact yet: the conversation is short")
            return
        how = "dropped (summarising failed)" if event.fallback else "summarised"
        await say(
            f"compacted: {event.messages} older messages {how}; context about "
            f"{event.tokens_before} → {event.tokens_after} tokens"
        )

    def _shared(self, message: IncomingMessage, transport: Transport) -> bool:
        """A shared room (not a direct conversation, not a thread): commands answer short."""
        return not message.direct and not transport.in_thread(message.channel_key)

    async def _cmd_help(
        self,
        args: list[str],
        message: IncomingMessage,
        transport: Transport,
        decision: Decision,
        say: Callable[[str], Awaitable[None]],
        p: str,
    ) -> None:
        """``!help``: in a shared room one short line (the commands this speaker may
        use); ``!help <command>`` says what one does; in private, every command
        with what it does."""
        if args:
            name = args[0].removeprefix(p).lower()
            what = COMMANDS.get(name)
            await say(f"{p}{name} — {what}" if what else f"no command {p}{name[:32]}; try {p}help")
            return
        if not self._shared(message, transport):
            await say("commands: " + "; ".join(f"{p}{n} — {d}" for n, d in COMMANDS.items()))
            return
        admin_only = _MANAGE | {"set", "unset"}
        names = [
            f"{p}{n}"
            for n in COMMANDS
            if decision.may_command(n) and (n not in admin_only or decision.admin)
        ]
        await say(
            f"commands: {' '.join(names)} — {p}help <command> says what one does;"
            f" {p}help in a private message lists them all"
        )

    async def _cmd_status(
        self,
        key: str,
        transport: Transport,
        opts: ChannelOptions,
        say: Callable[[str], Awaitable[None]],
        args: list[str] | None = None,
        message: IncomingMessage | None = None,
    ) -> None:
        """``!status``: the model, the conversation and what it does now, then the
        channel's settings; in a shared room the first line only (``!status
        settings`` shows the settings)."""
        ch = await self._channel(key, transport, opts)
        conv = ch.conversation
        count = await conv.count_messages()
        # idle | running | streaming | executing tools (names) | awaiting human, the
        # run, its requests and tokens so far, the queue, the checklist (todo 2/5).
        state = conv.status(todo=await conv.todo()).line()
        llm = self.agent.llm_for(conv.llm_profile)
        profile = f" (profile {conv.llm_profile})" if conv.llm_profile else ""
        settings = describe(await self.effective(key, transport))
        head = f"model {llm.model or llm.name}{profile} · conversation {conv.id} ({count} messages)"
        wanted = [a.lower() for a in args or ()]
        if wanted[:1] in (["settings"], ["all"]):
            await say(settings)
        elif message is not None and self._shared(message, transport):
            await say(f"{head} · {state}")
        else:
            await say(f"{head} · {state}\n{settings}")

    # -- passthrough tools (issue 20) -------------------------------------------------------
    async def _cmd_tool(
        self,
        message: IncomingMessage,
        transport: Transport,
        opts: ChannelOptions,
        decision: Decision,
        say: Callable[[str], Awaitable[None]],
        p: str,
    ) -> None:
        """``!tool [<name> [key=value …]]``: run a passthrough tool at once, no model.

        Only passthrough tools (``[[passthrough]]``) run this way, and only where
        the model could call them: the channel's tools and the speaker's rights
        allow both the tool and its target, no approval rule covers either, and
        no plugin's ``before_tool_call`` blocks it.  The result is said in the
        channel; it is not part of the conversation.
        """
        key = message.channel_key
        ch = await self._channel(key, transport, opts)
        conv = ch.conversation
        policy = conv.policy or self.agent.policy

        def usable(t: PassthroughTool) -> bool:
            return all(policy.allows(n) and decision.may_use_tool(n) for n in (t.name, t.spec.tool))

        tools = {
            t.name: t for t in self.agent.tools if isinstance(t, PassthroughTool) and usable(t)
        }
        raw = message.text.strip()[len(p) :]
        head = raw.split(None, 2)
        try:
            if len(head) == 3 and head[2].startswith("{"):
                words = [head[1], head[2]]  # a JSON object, quotes and all
            else:
                words = split_args(raw)[1:]
        except SettingError as exc:
            await say(f"{p}tool: {exc}")
            return
        if not words:
            listed = "; ".join(f"{n} — {t.description}" if t.description else n
                               for n, t in sorted(tools.items()))  # fmt: skip
            await say(f"tools: {listed}" if listed else "no passthrough tools here")
            return
        name, rest = words[0], words[1:]
        tool = tools.get(name)
        if tool is None:
            await say(f"no passthrough tool {name[:64]!r} here; {p}tool lists them")
            return
        try:
            arguments = _tool_arguments(rest)
        except ValueError as exc:
            await say(f"{p}tool {name}: {exc}")
            return
        for n in (tool.name, tool.spec.tool):
            if self.agent.approvals.rule_for(n, key) is not None:
                await say(f"{name} needs a person's approval: ask me for it in a message instead")
                return
        call = ToolCall(id=f"cmd_{uuid.uuid4().hex[:12]}", name=name,
                        arguments=json.dumps(arguments, ensure_ascii=False))  # fmt: skip
        call, block = await self.agent.hooks.before_tool_call(conv, call.id, call)
        if block is not None:
            await say(f"{name}: blocked: {block.reason}")
            return
        try:
            arguments = json.loads(call.arguments)
        except ValueError:
            await say(f"{name}: a plugin gave arguments that are not JSON")
            return
        context = ToolContext(
            conversation_id=conv.id, run_id=call.id, call_id=call.id,
            author=message.author_name, channel=key, author_id=_author_id(transport, message),
        )  # fmt: skip
        try:
            async with asyncio.timeout(policy.tool_timeout):
                result = await tool.call(arguments, context)
        except ToolError as exc:
            await say(f"⚙ {name} failed: {exc}")
            return
        except TimeoutError:
            await say(f"⚙ {name} failed: no result within {policy.tool_timeout:g}s")
            return
        except Exception:
            ref = uuid.uuid4().hex[:8]
            log.exception("!tool %s failed (ref %s)", name, ref)
            await say(f"⚙ {name} failed (internal error, ref {ref})")
            return
        text = result if isinstance(result, str) else result.text
        failed = not isinstance(result, str) and result.is_error
        await say(f"⚙ {name} failed: {text}" if failed else text or "(no result)")

    # -- budgets (issue 19) ----------------------------------------------------------------
    def _subject(self, message: IncomingMessage, transport: Transport) -> Subject:
        """Who ``message`` is counted for: its speaker (by role) and its channel."""
        key = message.channel_key
        return Subject(
            transport=transport.name, channel=key, identity=_author_id(transport, message),
            role=self.role_for(transport.name, message, key),
            name=message.author_name or message.author_id,
        )  # fmt: skip

    async def _cmd_budget(
        self, message: IncomingMessage, transport: Transport, say: Callable[[str], Awaitable[None]]
    ) -> None:
        if self.budgets is None or not self.budgets.enabled:
            await say("no budgets are set: usage is unlimited")
            return
        await say(await self.budgets.report(self._subject(message, transport)))

    async def _budget_turn_ended(self, event: TurnEnded, channel_key: str) -> None:
        """Count the tokens of a finished turn for whoever started it (else the channel)."""
        if self.budgets is not None and event.run_id:
            try:
                await self.budgets.turn_ended(
                    event.run_id, event.usage, event.text, channel=channel_key
                )
            except Exception:
                log.exception("could not count the tokens of run %s", event.run_id)

    # -- per-channel settings (issue 19) -------------------------------------------------
    async def _settings_actor(
        self, message: IncomingMessage, transport: Transport, say: Callable[[str], Awaitable[None]]
    ) -> str | None:
        """The qualified id of a speaker allowed to change settings here, else ``None`` (told)."""
        actor = _author_id(transport, message)
        if actor is None:
            await say(
                f"only a verified {self.settings_role} may change this channel's settings "
                "(your identity is not verified here)"
            )
            return None
        role = self.role_for(transport.name, message, message.channel_key)
        if not self.access.at_least(role, self.settings_role):
            await say(
                f"changing this channel's settings needs the {self.settings_role} role "
                f"(you are {role})"
            )
            return None
        return actor

    async def _cmd_set(
        self,
        message: IncomingMessage,
        transport: Transport,
        say: Callable[[str], Awaitable[None]],
        prefix: str,
    ) -> None:
        key = message.channel_key
        rest = message.text.strip()[len(prefix) :].split(maxsplit=1)
        args = (rest[1] if len(rest) > 1 else "").split(maxsplit=1)
        try:
            if len(args) == 2 and args[0].lower() == "persona" and args[1][0] not in "\"'":
                words = [args[0], args[1]]  # an unquoted persona: the rest of the line
            else:
                words = split_args(" ".join(args))
        except SettingError as exc:
            await say(f"{prefix}set: {exc}")
            return
        if not words:
            await say(
                f"usage: {prefix}set <key> <value>; keys: "
                + "; ".join(f"{k}: {d}" for k, d in SETTING_KEYS.items())
            )
            return
        actor = await self._settings_actor(message, transport, say)
        if actor is None:
            return
        name = words[0].lower()
        try:
            value = parse_setting(
                name,
                words[1:],
                profiles=self.settings.profiles,
                stream_profiles=self.agent.stream_profiles,
            )
        except SettingError as exc:
            await say(f"{prefix}set{' ' if name in SETTING_KEYS else ': '}{exc}")
            return
        await self.settings.set(settings_scope(transport, key), name, value, actor=actor)
        log.info("channel %s: %s set %s", key, actor, name)
        eff = await self.effective(key, transport)
        ch = self._channels.get(key)
        if ch is not None:
            self._apply(ch, eff)
        await say(f"{name} is now {_shown(eff, name)} in this channel")

    async def _cmd_unset(
        self,
        message: IncomingMessage,
        transport: Transport,
        say: Callable[[str], Awaitable[None]],
        prefix: str,
    ) -> None:
        key = message.channel_key
        try:
            words = split_args(message.text.strip()[len(prefix) :].split(maxsplit=1)[1])
        except IndexError:
            words = []
        except SettingError as exc:
            await say(f"{prefix}unset: {exc}")
            return
        if len(words) != 1 or words[0].lower() not in SETTING_KEYS:
            got = f"unknown setting {words[0]!r}; " if words else ""
            await say(f"{prefix}unset: {got}usage: {prefix}unset <key>; keys: "
                      + ", ".join(SETTING_KEYS))  # fmt: skip
            return
        name = words[0].lower()
        actor = await self._settings_actor(message, transport, say)
        if actor is None:
            return
        scope = settings_scope(transport, key)
        if name not in await self.settings.chat(scope):
            await say(f"{name} is not set in chat here; nothing to unset")
            return
        await self.settings.set(scope, name, None, actor=actor)
        log.info("channel %s: %s unset %s", key, actor, name)
        eff = await self.effective(key, transport)
        ch = self._channels.get(key)
        if ch is not None:
            self._apply(ch, eff)
        await say(f"{name} is now {_shown(eff, name)} ({eff.sources.get(name, 'default')})")

    # -- approvals (issue 19) ------------------------------------------------------------
    async def _cmd_decide(
        self,
        decision: Literal["approve", "deny"],
        message: IncomingMessage,
        transport: Transport,
        opts: ChannelOptions,
        say: Callable[[str], Awaitable[None]],
    ) -> None:
        key, p = message.channel_key, opts.command_prefix
        words = message.text.strip()[len(p) :].split(maxsplit=2)
        if len(words) < 2:
            await say(f"which one? {p}{decision} ID [reason] (see {p}approvals)")
            return
        approvals = self.agent.approvals
        role = self.role_for(transport.name, message, key)
        try:
            found = await approvals.find(words[1], scope=key)
            approver_id = _author_id(transport, message)
            if approver_id is None and (approver_id := _mask_id(transport, message, role)):
                # An unverified asker has no id to compare: compare the speaker.
                if (
                    decision == "approve" and not found.asker_id and not found.self_approve
                    and found.asker == message.author_name
                ):  # fmt: skip
                    raise ApprovalError(
                        "self", f"approval {found.id}: you asked for this call; someone else"
                        " must approve it",
                    )  # fmt: skip
            await approvals.decide(
                found,
                decision,
                approver=message.author_name or message.author_id,
                approver_id=approver_id,
                role=role,
                reason=words[2] if len(words) > 2 else None,
            )
        except ApprovalError as exc:
            await say(str(exc))
        # Done: the approval_resolved event says so in the channel.

    async def _cmd_approvals(
        self, key: str, opts: ChannelOptions, say: Callable[[str], Awaitable[None]]
    ) -> None:
        pending = await self.agent.approvals.pending(key)
        if not pending:
            await say("no tool call is waiting for approval here")
            return
        now = time.time()
        items = [
            f"{a.id}: {a.tool}({_short_args(a.arguments, 60)}) asked by {a.asker or 'someone'},"
            f" {a.approvers}s decide, expires in {_wait(a.expires_at - now)}"
            for a in pending
        ]
        p = opts.command_prefix
        await say(f"waiting for approval ({p}approve ID / {p}deny ID): " + "; ".join(items))

    # -- rendering -----------------------------------------------------------------------
    async def _send(
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
    ) -> int:
        """Send ``text``; returns how many pieces it took.

        With ``piece`` (the renderer's count of this run's pieces so far) on a
        transport with an outbox, each piece is persisted first.
        """
        pieces = [text]
        if kind in ("notice", "error", "command"):
            # Answers are split by the renderer; these short lines can still be
            # too long for a small channel (a command list): fit them too.
            caps = transport.caps
            pieces = split_text(text, max_bytes=caps.max_bytes, max_chars=caps.max_chars) or [text]
        ids: list[int | None] = [outbox_id] * len(pieces)
        if piece is not None and run_id and transport.outbox and kind not in ("delta", "end"):
            try:
                ids = list(await self.outbox.add(_rows(transport, key, run_id, piece, kind,
                                                       pieces, reply_to)))  # fmt: skip
            except Exception:
                # Still send it: only a restart's redelivery depends on the row.
                log.exception("could not persist an outgoing piece for %s", key)
        last = len(pieces) - 1
        for i, (text_piece, oid) in enumerate(zip(pieces, ids, strict=True)):
            final = i == last  # buttons and tags go with the last piece
            try:
                await transport.send(
                    OutgoingMessage(
                        channel_key=key, text=text_piece, kind=kind, run_id=run_id,
                        reply_to=reply_to, outbox_id=oid, actions=actions if final else (),
                        tag=tag if final else None, updates=updates if final else None,
                    )
                )  # fmt: skip
            except Exception:
                log.exception("transport %s could not send to %s", transport.name, key)
            else:
                if self.metrics is not None:
                    self.metrics.message_out(transport.name, kind)
        return len(pieces)

    async def _render(self, ch: _Channel) -> None:
        renderer = _Renderer(self, ch)
        assert ch.subscription is not None
        async for event in ch.subscription:
            ended = isinstance(event, TurnEnded) and event.parent_run_id is None
            if isinstance(event, TurnEnded) and ended:
                # Counted before the answer shows, so a message sent on seeing it
                # is checked against the turn's tokens, not its reservation.
                # (A child run's usage is its parent's business: the parent's turn
                # ends later and is what the channel's budget counts.)
                await self._budget_turn_ended(event, ch.key)
            try:
                await renderer.on_event(event)
            except Exception:
                log.exception("rendering %s in %s failed", event.kind, ch.key)
            if isinstance(event, TurnEnded) and ended:
                _log_answer(ch, event)
                ch.run_reply_to.pop(event.run_id or "", None)
                ch.run_asker.pop(event.run_id or "", None)
                async with ch.changed:
                    ch.pending.discard(event.run_id or "")
                    ch.changed.notify_all()


#: A child run's events the channel shows as its own, whatever the profile:
#: its tool calls that wait for a person (they are answered here).
_CHILD_KINDS = frozenset({"approval_requested", "approval_resolved"})

#: Tools that run a sub-agent (``agent__<name>``): their call shows as the child
#: run's one line (``→ researcher: …``), not as a tool line.
AGENT_TOOL_PREFIX = "agent__"

#: Longest task text shown on a child run's line.
_CHILD_TASK_CHARS = 100


@dataclass(slots=True)
class _ChildRun:
    """A child run seen in a channel: who, how deep, the root (channel) run, its text."""

    agent: str
    depth: int
    root: str | None
    buffer: str = ""


#: Turns that ended early get a short notice after what was said.
_STOP_NOTICES = {
    "length": "(answer cut: too long)",
    "tool_limit": "(stopped: tool call limit)",
    "token_budget": "(stopped: token budget used up)",
}


#: Ends already shown in the channel (an error line, ``(interrupted)``, a plugin's words).
_SHOWN_ENDS = frozenset({"error", "interrupted", "time_budget", "aborted"})

#: What a channel is told of a turn that ended without a visible answer.
_SILENT_END = "(no answer: the model ended its turn without writing one)"
_SILENT_ENDS = {"content_filter": "(no answer: the model's provider filtered it)"}


class _Renderer:
    """Turns one channel's events into outgoing messages."""

    def __init__(self, bridge: Bridge, ch: _Channel) -> None:
        self.bridge = bridge
        self.ch = ch
        self.buffer = ""
        self.lines_sent = 0
        self.had_text = False
        #: This answer's lines so far leave a code block open (a fence line).
        self.in_code = False
        #: Pieces of this run sent so far (the outbox key's last part).
        self.piece = 0
        #: Streamed answer (deltas) on an outbox transport: its row and text.
        self.stream_id: int | None = None
        self.stream_text: list[str] = []
        #: Questions shown (``ask_user``): id -> the text, to edit in the answer.
        self.questions: dict[int, str] = {}
        #: The tag of the checklist message posted (``todo``) on an editing transport.
        self.todo_tag: str | None = None
        #: Tool calls that showed progress: call id -> when (monotonic) last shown.
        self.progress: dict[str, float] = {}
        #: Arguments of this turn's tool calls, by call id (a child run's task).
        self.call_args: dict[str, tuple[str, str]] = {}
        #: Child runs seen, by run id.
        self.children: dict[str, _ChildRun] = {}

    @property
    def profile(self) -> StreamProfile:
        """The stream profile the channel is rendered from: its ``profile`` setting,
        else ``debug`` when ``events`` is ``debug``, else ``chat``."""
        named = self.ch.options.profile
        if named is not None:
            found = self.bridge.agent.stream_profiles.get(named)
            if found is not None:
                return found
        return BUILTIN_PROFILES["debug" if self.ch.options.events == "debug" else "chat"]

    @property
    def events(self) -> str:
        """The channel's ``events`` setting now (it may change while the channel is open)."""
        return self.ch.options.events

    @property
    def debug(self) -> bool:
        return self.ch.options.events == "debug" or self.ch.options.profile == "debug"

    @property
    def child_lines(self) -> bool:
        """Whether a child run gets its one line: unless the channel asked for
        ``answers`` only (``auto`` shows it, even in a shared channel)."""
        return self.events != "answers"

    @property
    def tool_lines(self) -> bool:
        """Whether tool calls get a line: not in a shared channel with ``answers``.

        ``auto`` decides per channel when the line is due: a direct
        conversation or a thread gets them, a shared channel does not.
        """
        if self.events == "auto":
            return self.ch.direct or self.ch.transport.in_thread(self.ch.key)
        return self.events != "answers"

    @property
    def caps(self) -> ChannelCaps:
        # Read each time: a transport may learn its limits after connecting.
        return self.ch.transport.caps

    def _reply_to(self, run_id: str | None) -> object:
        """Where the answer of ``run_id`` goes: the reply data of the message it answers."""
        return self.ch.run_reply_to.get(run_id or "", self.ch.reply_to)

    async def _approval(self, e: ApprovalRequested | ApprovalResolved) -> None:
        """An approval asked for (with buttons where the transport has them) or decided
        (the asking message is updated where the transport can edit)."""
        p = self.ch.options.command_prefix
        tag = f"approval:{e.conversation_id}:{e.approval_id}"
        if e.kind == "approval_requested":
            who = e.asker or "someone"
            again = "(asked again after a restart) " if e.resumed else ""
            text = (
                f"{again}approval {e.approval_id}: {who} asked me to run "
                f"{e.name}({_short_args(e.arguments, 160)}). "
                f"{_article(e.approvers)} may answer {p}approve {e.approval_id} [reason]"
                f" or {p}deny {e.approval_id} [reason] (expires in"
                f" {_wait(e.expires_at - time.time())})"
            )
            actions = (
                Action(label="Approve", command=f"{p}approve {e.approval_id}", style="primary"),
                Action(label="Deny", command=f"{p}deny {e.approval_id}", style="danger"),
            )
            self.piece += await self.bridge._send(
                self.ch.transport, self.ch.key, text, "command", self._reply_to(e.run_id),
                e.run_id, piece=self.piece, actions=actions, tag=tag,
            )  # fmt: skip
            return
        what = {
            "approved": f"approved by {e.approver or 'someone'}",
            "denied": f"denied by {e.approver or 'someone'}",
            "expired": "expired",
            "cancelled": "cancelled",
        }[e.decision]
        reason = f": {e.reason}" if e.reason else ""
        text = f"approval {e.approval_id} ({e.name}): {what}{reason}"
        self.piece += await self.bridge._send(
            self.ch.transport, self.ch.key, text, "command", self._reply_to(e.run_id),
            e.run_id, piece=self.piece, updates=tag,
        )  # fmt: skip

    async def _tagged(
        self, text: str, run_id: str | None, *, tag: str | None = None, updates: str | None = None
    ) -> None:
        """A short message of the run that may later be edited (``tag``) or edits one
        (``updates``); never more than one piece."""
        caps = self.caps
        text = _fit(text, caps.max_bytes, caps.max_chars)
        self.piece += await self.bridge._send(
            self.ch.transport, self.ch.key, text, "command", self._reply_to(run_id), run_id,
            piece=self.piece, tag=tag, updates=updates,
        )  # fmt: skip

    async def _question(self, e: QuestionAsked | QuestionAnswered) -> None:
        """The model's question (``ask_user``), and how it ended."""
        tag = f"question:{e.conversation_id}:{e.question_id}"
        if e.kind == "question_asked":
            again = "(asked again after a restart) " if e.resumed else ""
            who = f"@{e.to}: " if e.to else ""
            choices = f" ({' / '.join(e.choices)})" if e.choices else ""
            self.questions[e.question_id] = f"{who}{e.question}{choices}"
            await self._tagged(f"{again}{who}{e.question}{choices}", e.run_id, tag=tag)
            return
        asked = self.questions.pop(e.question_id, "")
        if e.outcome == "answered":
            if self.caps.can_edit and asked:
                # The question now shows its answer (nothing new to say on IRC:
                # the answer is in the channel, the bot's reply follows).
                by = e.answered_by or "someone"
                await self._tagged(f"{asked} — {by}: {e.answer}", e.run_id, updates=tag)
            return
        what = "nobody answered in time" if e.outcome == "expired" else "question cancelled"
        text = f"{asked} — ({what})" if asked else f"({what})"
        await self._tagged(text, e.run_id, updates=tag if self.caps.can_edit else None)

    async def _todo(self, e: TodoUpdated) -> None:
        """The model's checklist: posted once and edited where the transport can
        edit, else one short line per update that changed an item's status."""
        items = e.items
        done = sum(1 for it in items if it.get("status") == "done")
        head = f"todo {done}/{len(items)}"
        if self.caps.can_edit:
            lines = [f"{_TODO_MARK.get(it.get('status', ''), '○')} {it.get('text', '')}"
                     for it in items]  # fmt: skip
            text = "\n".join([head, *lines])
            tag = f"todo:{e.conversation_id}:{e.run_id}"
            if self.todo_tag == tag:
                await self.bridge._send(
                    self.ch.transport, self.ch.key, text, "command", self._reply_to(e.run_id),
                    e.run_id, updates=tag,
                )  # fmt: skip
            else:
                self.todo_tag = tag
                self.piece += await self.bridge._send(
                    self.ch.transport, self.ch.key, text, "command", self._reply_to(e.run_id),
                    e.run_id, piece=self.piece, tag=tag,
                )  # fmt: skip
            return
        if not e.changed:
            return  # nothing changed state: nothing to say
        changed = "; ".join(
            f"{_TODO_MARK.get(items[i].get('status', ''), '○')} {items[i].get('text', '')}"
            for i in e.changed
            if i < len(items)
        )
        await self._tagged(f"{head}: {changed}", e.run_id)

    async def _progress(self, e: ToolProgress) -> None:
        """A running tool call's progress: one updating line where the transport can
        edit, else a line at most every ``progress_interval`` seconds."""
        now = time.monotonic()
        last = self.progress.get(e.call_id)
        if last is not None and now - last < self.ch.options.progress_interval:
            return
        self.progress[e.call_id] = now
        text = f"⚙ {e.name}: {_progress_text(e.progress, e.total, e.message)}"
        tag = f"progress:{e.conversation_id}:{e.call_id}"
        if last is not None and self.caps.can_edit:
            await self.bridge._send(
                self.ch.transport, self.ch.key, text, "command", self._reply_to(e.run_id),
                e.run_id, updates=tag,
            )  # fmt: skip
            return
        await self._tagged(text, e.run_id, tag=tag)

    async def _progress_done(self, e: ToolCallEnded) -> None:
        """A call that showed progress ended: its line says so where it can be edited."""
        self.progress.pop(e.call_id, None)
        if self.caps.can_edit:
            verb = "failed" if e.is_error else "done"
            await self.bridge._send(
                self.ch.transport, self.ch.key, f"⚙ {e.name}: {verb} ({e.duration:.1f}s)",
                "command", self._reply_to(e.run_id), e.run_id,
                updates=f"progress:{e.conversation_id}:{e.call_id}",
            )  # fmt: skip
        elif e.is_error and self.tool_lines:
            result = e.result.replace("\n", " ")[:160]
            await self._out(f"⚙ {e.name} failed: {result}", "notice", e.run_id)

    async def _out(self, text: str, kind: OutgoingKind, run_id: str | None) -> None:
        reply_to = self._reply_to(run_id)
        if kind in ("delta", "end"):
            if kind == "delta" and self.ch.transport.outbox and run_id:
                await self._stream_row(text, run_id)
            await self.bridge._send(
                self.ch.transport, self.ch.key, text, kind, reply_to, run_id,
                outbox_id=self.stream_id,
            )  # fmt: skip
            return
        self.piece += await self.bridge._send(
            self.ch.transport, self.ch.key, text, kind, reply_to, run_id, piece=self.piece
        )

    async def _stream_row(self, text: str, run_id: str) -> None:
        """One outbox row per streamed answer: written at its first delta, completed at its end."""
        self.stream_text.append(text)
        if self.stream_id is not None:
            return
        try:
            [self.stream_id] = await self.bridge.outbox.add(
                _rows(self.ch.transport, self.ch.key, run_id, self.piece, "stream", [""],
                      self._reply_to(run_id), complete=False)
            )  # fmt: skip
        except Exception:
            log.exception("could not persist a streamed answer for %s", self.ch.key)
            return
        self.piece += 1

    async def _stream_done(self, run_id: str | None) -> None:
        if self.stream_id is None or not run_id:
            return
        try:
            await self.bridge.outbox.add(
                _rows(self.ch.transport, self.ch.key, run_id, self.piece - 1, "stream",
                      ["".join(self.stream_text)], self._reply_to(run_id))
            )  # fmt: skip
        except Exception:
            log.exception("could not persist a streamed answer for %s", self.ch.key)

    async def _line(self, line: str, run_id: str | None) -> None:
        cap = self.ch.options.max_answer_lines
        fence = _is_fence(line)
        if cap and self.lines_sent >= cap:
            if not self.ch.more:
                self.ch.more_in_code = self.in_code
            self.ch.more.append(line)
        else:
            self.lines_sent += 1
            await self._out(line, "answer", run_id)
        if fence:
            self.in_code = not self.in_code

    async def _lines(self, text: str, run_id: str | None) -> None:
        for line in split_lines(text, max_bytes=self.caps.max_bytes, max_chars=self.caps.max_chars):
            if line:
                await self._line(line, run_id)

    def _task_line(self, link: ChildRunLinked) -> str:
        """``→ researcher: looking up the release notes…`` (the task, one line, trimmed)."""
        name, arguments = self.call_args.get(link.call_id or "", ("", "{}"))
        agent = link.agent or name.removeprefix(AGENT_TOOL_PREFIX) or "sub-agent"
        task = _task_text(arguments)
        if len(task) > _CHILD_TASK_CHARS:
            task = task[: _CHILD_TASK_CHARS - 1].rstrip()
        return f"→ {agent}: {task}…" if task else f"→ {agent}…"

    def _link(self, e: ChildRunLinked) -> _ChildRun:
        parent = self.children.get(e.run_id or "")
        name, _ = self.call_args.get(e.call_id or "", ("", "{}"))
        child = _ChildRun(
            agent=e.agent or name.removeprefix(AGENT_TOOL_PREFIX) or "sub-agent",
            depth=parent.depth + 1 if parent else 1,
            root=parent.root if parent else e.run_id,
        )
        self.children[e.child_run_id] = child
        return child

    async def _child_event(self, e: Event) -> None:
        """An event of a child run, shown nested (only profiles with ``child_runs``
        bring them): prefixed lines, never part of the channel's answer."""
        child = self.children.get(e.run_id or "")
        if child is None:  # its link was not seen (joined late): one level down
            child = self.children[e.run_id or ""] = _ChildRun(
                agent="sub-agent", depth=1, root=e.parent_run_id
            )
        prefix = "  " * (child.depth - 1) + f"↳ {child.agent}: "
        root = child.root

        async def say(text: str) -> None:
            for line in split_lines(
                prefix + text, max_bytes=self.caps.max_bytes, max_chars=self.caps.max_chars
            ):
                if line:
                    await self._out(line, "notice", root)

        if e.kind == "text_delta":
            child.buffer += e.text
            while "\n" in child.buffer:
                line, child.buffer = child.buffer.split("\n", 1)
                if line.strip():
                    await say(line)
            return
        # Anything else ends the child's partial line first: a step's text shows
        # before the tool call that follows it, and never runs into the next step's.
        rest, child.buffer = child.buffer, ""
        if rest.strip():
            await say(rest)
        if e.kind == "tool_call_started":
            self.call_args[e.call_id] = (e.name, e.arguments)
            if not e.name.startswith(AGENT_TOOL_PREFIX):
                await say(f"⚙ {e.name}({_short_args(e.arguments)})")
        elif e.kind == "tool_call_ended":
            result = e.result.replace("\n", " ")[:160]
            verb = "failed" if e.is_error else f"→ ({e.duration:.2f}s)"
            await say(f"⚙ {e.name} {verb}: {result}")
        elif e.kind == "child_run_linked":
            self._link(e)
            await say(self._task_line(e))
        elif e.kind == "reasoning_delta":
            await say(f"(thinking) {e.text}")
        elif e.kind == "error":
            await say(" ".join(e.message.split())[:300])
        elif e.kind == "turn_ended":
            u = e.usage
            await say(
                f"done: {e.stop_reason}, {u.prompt_tokens}+{u.completion_tokens} tokens,"
                f" {e.tool_calls} tool calls"
            )
        elif e.kind == "interrupted":
            await say("(interrupted)")

    async def on_event(self, event: Event) -> None:
        if event.kind == "response_started" and (
            event.parent_run_id is None or self.profile.child_runs
        ):
            # Not shown, but it separates the answer's steps (text before a tool
            # call, text after it), whatever the profile carries — a child run's
            # too, when the profile brings child runs.
            admitted: Event | None = event
        elif event.parent_run_id is not None and event.kind in _CHILD_KINDS:
            # A child's tool call waiting for a person is asked (and answered) here.
            admitted = event
        else:
            admitted = self.profile.admit(event)
        if admitted is None:
            return  # what the channel's profile does not carry
        e = admitted
        if e.parent_run_id is not None and e.kind not in _CHILD_KINDS:
            # A child run's events never touch the channel's answer.
            await self._child_event(e)
            return
        mode = self.caps.streaming
        run = e.run_id
        if e.kind == "turn_started":
            self.buffer, self.lines_sent, self.had_text = "", 0, False
            self.in_code = False
            self.piece, self.stream_id, self.stream_text = 0, None, []
            self.call_args, self.children = {}, {}
        elif e.kind == "response_started":
            # A new model step: keep its text apart from the previous step's.
            if self.had_text:
                if mode == "deltas":
                    await self._out("\n", "delta", run)
                elif mode == "lines":
                    await self._lines(self.buffer, run)
                    self.buffer = ""
                else:
                    self.buffer += "\n"
        elif e.kind == "text_delta":
            self.had_text = True
            text = e.text
            if mode == "deltas":
                await self._out(text, "delta", run)
            elif mode == "lines":
                self.buffer += text
                while "\n" in self.buffer:
                    line, self.buffer = self.buffer.split("\n", 1)
                    await self._lines(line, run)
            else:
                self.buffer += text
        elif e.kind in ("approval_requested", "approval_resolved"):
            await self._flush(run)
            await self._approval(e)
        elif e.kind in ("question_asked", "question_answered"):
            await self._flush(run)
            await self._question(e)
        elif e.kind == "todo_updated":
            await self._flush(run)
            await self._todo(e)
        elif e.kind == "tool_progress":
            if self.tool_lines:
                await self._progress(e)
        elif e.kind == "reasoning_delta":
            await self._out(f"(thinking) {e.text}", "notice", run)
        elif e.kind == "tool_call_started":
            self.call_args[e.call_id] = (e.name, e.arguments)
            # ask_user and todo show themselves (the question, the checklist);
            # an agent's call shows as its child run's line.
            if (
                self.tool_lines
                and not e.name.startswith(AGENT_TOOL_PREFIX)
                and (self.debug or e.name not in _SELF_SHOWN)
            ):
                args = _short_args(e.arguments)
                await self._out(f"⚙ {e.name}({args})", "notice", run)
        elif e.kind == "child_run_linked":
            self._link(e)
            if self.child_lines:
                # Whatever the answer streamed so far stays above the line.
                await self._flush(run)
                await self._out(self._task_line(e), "notice", run)
        elif e.kind == "tool_call_ended" and e.call_id in self.progress:
            await self._progress_done(e)
        elif (
            e.kind == "tool_call_ended"
            and (e.is_error or self.debug)
            and self.tool_lines
            and (self.debug or e.name not in _SELF_SHOWN)
        ):
            result = e.result.replace("\n", " ")[:160]
            verb = "failed" if e.is_error else f"→ ({e.duration:.2f}s)"
            await self._out(f"⚙ {e.name} {verb}: {result}", "notice", run)
        elif e.kind == "compacted" and (self.debug or e.fallback):
            # Dropped messages are news to the people in the channel: the
            # model no longer sees them.  A summary only shows when debugging.
            how = "dropped" if e.fallback else "summarised"
            await self._out(
                f"(context compacted: {e.messages} older messages {how})",
                "notice",
                run,
            )
        elif e.kind == "error":
            await self._flush(run)
            await self._out(self._error(e), "error", run)
        elif e.kind == "interrupted":
            await self._flush(run)
            why = "time budget used up" if e.reason == "time_budget" else "interrupted"
            await self._out(f"({why})", "notice", run)
        elif e.kind == "turn_ended":
            await self._flush(run)
            if mode in ("deltas", "lines") and self.had_text:
                await self._stream_done(run)
                await self._out("", "end", run)
            self.stream_id, self.stream_text = None, []
            stopped = _STOP_NOTICES.get(e.stop_reason)
            if stopped:
                await self._out(stopped, "notice", run)
            elif (
                not self.had_text
                and e.stop_reason not in _SHOWN_ENDS
                and self.profile.carries("text_delta")  # else no answer ever shows here
            ):
                # Nothing visible came of it (no text after its tool calls, or a
                # hook or the provider filtered it): the asker is told, not left waiting.
                await self._out(_SILENT_ENDS.get(e.stop_reason, _SILENT_END), "notice", run)
            if self.ch.more:
                p = self.ch.options.command_prefix
                await self._out(f"… {len(self.ch.more)} more lines: {p}more", "notice", run)
            if self.debug:
                u = e.usage
                await self._out(
                    f"turn {run}: {e.stop_reason}, {e.duration:.2f}s, "
                    f"{u.prompt_tokens}+{u.completion_tokens} tokens, "
                    f"{e.tool_calls} tool calls",
                    "notice",
                    run,
                )

    def _error(self, e: Error) -> str:
        if e.error_type == "aborted":
            # A plugin's words (an ``after_response`` hook's Abort), shown as
            # they are, like a refused prompt; one line.
            return " ".join(e.message.split())[:300]
        return _error_line(
            e.error_type, e.message, where=self.ch.key, prefix=self.ch.options.command_prefix,
            retryable=e.retryable, run_id=e.run_id,
        )  # fmt: skip

    async def _flush(self, run: str | None) -> None:
        text, self.buffer = self.buffer, ""
        if not text.strip():
            return
        if self.caps.streaming == "lines":
            await self._lines(text, run)
            return
        cap = self.ch.options.max_answer_lines
        if cap:
            lines = text.split("\n")
            if len(lines) > cap:
                self.ch.more.extend(lines[cap:])
                text = "\n".join(lines[:cap])
        for piece in split_text(text, max_bytes=self.caps.max_bytes, max_chars=self.caps.max_chars):
            await self._out(piece, "answer", run)


def _is_fence(line: str) -> bool:
    """A Markdown code fence line (```` ``` ```` or ```` ```python ````)."""
    return line.strip().startswith("```")


def _log_answer(ch: _Channel, e: TurnEnded) -> None:
    """One INFO line per answered message, with fields; the answer's text at DEBUG only."""
    u = e.usage
    fields = {
        "transport": ch.transport.name,
        "channel": ch.key,
        "conversation_id": e.conversation_id,
        "run_id": e.run_id,
        "duration": round(e.duration, 3),
        "tokens": u.total_tokens or u.prompt_tokens + u.completion_tokens,
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "tool_calls": e.tool_calls,
        "stop_reason": e.stop_reason,
    }
    log_event(
        log, logging.INFO, "answer", "answered in %s (conversation %s, run %s): %s, %.2f s, "
        "%d tokens, %d tool calls", ch.key, e.conversation_id, e.run_id, e.stop_reason,
        e.duration, fields["tokens"], e.tool_calls, **fields,
    )  # fmt: skip
    if log.isEnabledFor(logging.DEBUG):
        log_event(log, logging.DEBUG, "answer_text", "answer of run %s: %s", e.run_id, e.text,
                  **fields)  # fmt: skip


#: Builtin tools whose events show them in the channel: no tool-call line.
_SELF_SHOWN = frozenset({"ask_user", "todo"})

#: How a checklist item shows its status.
_TODO_MARK = {"done": "✓", "in_progress": "▸", "pending": "○"}


def _progress_text(progress: float, total: float | None, message: str | None) -> str:
    if total:
        how = f"{progress / total:.0%}" if total > 0 else f"{progress:g}"
    else:
        how = f"{progress:g}"
    return f"{how} {message}".strip() if message else how


def _fit(text: str, max_bytes: int | None, max_chars: int | None) -> str:
    """``text`` on one line, cut to fit one message of the channel."""
    text = " ".join(text.split())
    if max_chars is not None and len(text) > max_chars:
        text = text[: max_chars - 1] + "…"
    if max_bytes is not None and len(text.encode()) > max_bytes:
        raw = text.encode()[: max_bytes - 3]
        text = raw.decode("utf-8", "ignore") + "…"
    return text


def _rows(
    transport: Transport,
    key: str,
    run_id: str,
    first: int,
    kind: str,
    texts: list[str],
    reply_to: object,
    *,
    complete: bool = True,
) -> list[OutboxEntry]:
    return [
        OutboxEntry(
            channel_key=key, run_id=run_id, piece=first + i, transport=transport.name, kind=kind,
            text=text, reply_to=reply_to, complete=complete,
        )
        for i, text in enumerate(texts)
    ]  # fmt: skip


def _resolved(transport: Transport, options: ChannelOptions | None) -> ChannelOptions:
    """``options`` (or the defaults) with what they leave unset taken from ``transport``."""
    opts = options or ChannelOptions(command_prefix=transport.default_command_prefix)
    if opts.max_answer_lines is None:
        opts = dataclasses.replace(opts, max_answer_lines=transport.default_max_answer_lines)
    return opts


#: What a channel is told of a failure, by error type (the details go to the log).
_PUBLIC_ERRORS: dict[str, str] = {
    "LLMConnectionError": "the model is unavailable right now",
    "LLMTimeout": "the model did not answer in time",
    "ContextTooLong": (
        "this conversation no longer fits the model's context; try {p}compact or {p}new"
    ),
    "LLMResponseError": "the model's answer could not be used",
    "LLMError": "the model failed",
    "StoreError": "the conversation could not be saved",
    "MigrationError": "the conversation could not be saved",
    "ClosedError": "the bot is shutting down",
    "internal": "internal error",
}


def _error_line(
    error_type: str,
    detail: str,
    *,
    where: str,
    prefix: str = "!",
    retryable: bool = False,
    run_id: str | None = None,
) -> str:
    """The one short line a channel gets for a failure; logs ``detail`` with its reference.

    The line never carries the failure's own text (an endpoint's URL, a
    backend's message, a path): it says what kind of thing failed and gives
    a reference, which the ERROR log line with the full ``detail`` repeats,
    so an operator can find it.
    """
    ref = secrets.token_hex(3)
    log.error(
        "error ref %s in %s%s: %s: %s",
        ref,
        where,
        f" (run {run_id})" if run_id else "",
        error_type or "error",
        detail,
    )
    if error_type == "LLMStatusError":
        # 429 and 5xx: try again later; other statuses: the request was refused.
        what = "the model is " + ("unavailable right now" if retryable else "refusing the request")
    else:
        what = _PUBLIC_ERRORS.get(error_type, "something went wrong").format(p=prefix)
    return f"error: {what} (ref {ref})"


def _shown(eff: Effective, key: str) -> str:
    """A setting's value in a reply: persona text quoted, lists space-separated."""
    value = eff.value(key)
    if key == "persona":
        if not value:
            return "none"
        return json.dumps(value if len(value) <= 200 else value[:199] + "…", ensure_ascii=False)
    if isinstance(value, tuple):
        return " ".join(value) if value else "none (no tools)"
    if isinstance(value, bool):
        return "on" if value else "off"
    return "none" if value is None else str(value)


def _data(m: Message) -> dict[str, Any]:
    return m.data if isinstance(m.data, dict) else {}


def _redact_label(m: Message) -> str:
    if m.kind == "tool_result":
        return f"answer of {_data(m).get('answered_by') or '?'}"
    return "bot" if m.kind == "assistant" else "?"


def _is_redacted(m: Message) -> bool:
    return "redacted" in _data(m)


def _ago(t: float) -> str:
    minutes = max(0, int((time.time() - t) // 60))
    if minutes < 60:
        return f"{minutes}m ago"
    if minutes < 48 * 60:
        return f"{minutes // 60}h ago"
    return f"{minutes // (24 * 60)}d ago"


def _author_id(transport: Transport, message: IncomingMessage) -> str | None:
    """The speaker's identity qualified by transport instance: ``libera:alice``.

    ``None`` for a speaker the transport could not verify: an unverified name
    keys no user-scoped data (their memory tools say so).
    """
    if not message.verified or not message.author_id:
        return None
    return f"{transport.name}:{message.author_id}"


def _mask_id(transport: Transport, message: IncomingMessage, role: str) -> str | None:
    """An unverified IRC speaker given a role by a configured ``mask:`` pattern (the
    one way to name admins on a network without services) decides as
    ``<instance>:mask:<nick!user@host>``: the operator vouched for that mask.  Any
    other unverified speaker stays ``None`` (refused)."""
    mask = (message.meta or {}).get("hostmask")
    if not mask or role in ("user", "ignored"):
        return None
    return f"{transport.name}:mask:{mask}"


def _no_tools(name: str) -> bool:
    return False


def _speaker(transport: Transport, message: IncomingMessage) -> str:
    """Who spoke, as a key: the qualified identity, or for an unverified speaker
    ``<instance>:~<hostmask or name>`` (never equal to a verified one)."""
    found = _author_id(transport, message)
    if found is not None:
        return found
    shown = (message.meta or {}).get("hostmask") or message.author_name or message.author_id
    return f"{transport.name}:~{shown}"


def _wait(seconds: float) -> str:
    """``10 min``, ``45 s``: how long until something expires."""
    seconds = max(0.0, seconds)
    if seconds >= 90:
        return f"{round(seconds / 60)} min"
    return f"{round(seconds)} s"


def _article(role: str) -> str:
    """``an admin``, ``a user``, ``a deployer`` — who may decide, in a sentence."""
    if role == "user":
        return "anyone here"
    return f"{'an' if role[:1].lower() in 'aeiou' else 'a'} {role}"


def _tool_arguments(words: list[str]) -> dict[str, Any]:
    """``!tool`` arguments: one JSON object, or ``key=value`` words (a value that
    reads as JSON — a number, true, a list — is that; anything else is text)."""
    if len(words) == 1 and words[0].lstrip().startswith("{"):
        try:
            value = json.loads(words[0])
        except ValueError:
            raise ValueError("the arguments are not a JSON object") from None
        if not isinstance(value, dict):
            raise ValueError("the arguments are not a JSON object")
        return value
    out: dict[str, Any] = {}
    for word in words:
        k, eq, v = word.partition("=")
        if not eq or not k:
            raise ValueError(f"write key=value, not {word[:40]!r}")
        try:
            out[k] = json.loads(v)
        except ValueError:
            out[k] = v
    return out


def _task_text(arguments: str) -> str:
    """A child run's task from its tool call's arguments (``task``, else the first
    text argument), on one line."""
    try:
        args = json.loads(arguments)
    except ValueError:
        return ""
    if not isinstance(args, dict):
        return ""
    task = args.get("task")
    if not isinstance(task, str):
        task = next((v for v in args.values() if isinstance(v, str)), "")
    return " ".join(task.split())


def _short_args(arguments: str, limit: int = 80) -> str:
    try:
        parsed = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        text = arguments
    else:
        if isinstance(parsed, dict):
            text = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in parsed.items())
        else:
            text = json.dumps(parsed, ensure_ascii=False)
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def options_from(section: object, transport: Transport) -> ChannelOptions:
    """Build :class:`ChannelOptions` from a ``[transports.<name>]`` section.

    The section's bridge keys are :class:`ChannelOptions`'s own fields (see
    :class:`agentik.bot.config.TransportSection`); a key it lacks keeps its
    default, and an unset ``command_prefix`` or ``max_answer_lines`` is the
    transport's default.
    """
    values = {
        name: getattr(section, name)
        for name in setting_fields(ChannelOptions)
        if hasattr(section, name)
    }
    if values.get("command_prefix") is None:
        values["command_prefix"] = transport.default_command_prefix
    return _resolved(transport, ChannelOptions(**values))


def _busy_mode(
    opts: ChannelOptions, message: IncomingMessage, transport: Transport
) -> Literal["queue", "steer", "interrupt"]:
    """The channel's ``busy`` setting; ``auto``: ``steer`` in direct conversations and
    threads (one person, or a few, on one topic), ``queue`` in shared channels."""
    if opts.busy != "auto":
        return opts.busy
    direct = message.direct or transport.in_thread(message.channel_key)
    return "steer" if direct else "queue"
