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
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from agentik.core import Agent, Conversation
from agentik.core.access import AccessPolicy, Decision
from agentik.core.budgets import Budgets, Subject
from agentik.core.conversation import ResumeMode
from agentik.core.errors import AgentikError, PromptRefused
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
from agentik.core.keyedlocks import KeyedLocks
from agentik.core.messages import Message
from agentik.core.settings import setting_fields
from agentik.core.store.base import OutboxEntry
from agentik.core.streamprofiles import BUILTIN_PROFILES, StreamProfile
from agentik.transports.base import (
    Action,
    AgentAccess,
    ChannelCaps,
    IncomingMessage,
    OutgoingKind,
    OutgoingMessage,
    Transport,
    restrict_tools,
)
from agentik.transports.text import split_lines, split_text

from .channel import ChannelOptions, OpenChannel
from .chansettings import (
    ChannelSettings,
    ChannelSettingsBook,
    Effective,
    RoleFor,
    allowed_tool_names,
    default_role_for,
    persona_block,
    recall_override,
    settings_scope,
)
from .chat import article as _article
from .chat import author_id as _author_id
from .chat import error_line as _error_line
from .chat import is_fence as _is_fence
from .chat import short_args as _short_args
from .chat import speaker_key as _speaker
from .chat import wait_text as _wait
from .commands import CommandContext, CommandRegistry, builtin_commands, load_commands
from .config import AgentSection
from .logs import log_event
from .outbox import Outbox

if TYPE_CHECKING:
    from .metrics import Metrics

__all__ = ["COMMANDS", "Bridge", "ChannelOptions", "RoleFor", "default_role_for"]

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
        #: The chat commands: the built-ins, then the plugins' (``register_commands``).
        self.commands: CommandRegistry = load_commands(agent.hooks.pm)

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
        """Queue ``message`` in its conversation, or return the command it starts."""
        decision = self.access.check(transport.name, message, message.channel_key)
        if decision.role == "ignored":
            return None  # no answer, no command, not even recorded
        self.access.seen(transport.name, message)
        opts = (await self.effective(message.channel_key, transport)).options
        command = self._parse_command(text, opts)
        if command is not None:
            # Unknown "commands" in a shared channel are just chatter: ignore.
            if command in self.commands or message.direct or message.addressed:
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
        subject = None
        if self.budgets is not None and self.budgets.enabled:
            subject = self._subject(message, transport)
            refused = await self.budgets.admit(subject, chars=len(text))
            if refused is not None:
                # One notice per window; later messages get nothing, and no model call.
                if refused.notice:
                    await self._send(transport, message.channel_key, refused.notice, "notice",
                                     message.reply_to)  # fmt: skip
                return None
        bound = False
        try:
            ch = await self._channel(message.channel_key, transport, opts)
            ch.reply_to = message.reply_to
            ch.direct = message.direct
            ch.more.clear()
            ch.more_in_code = False
            async with contextlib.AsyncExitStack() as stack:
                if subject is not None:
                    assert self.budgets is not None
                    await stack.enter_async_context(self.budgets.sending(ch.conversation.id))
                sent = await ch.conversation.submit(
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
                if subject is not None:
                    assert self.budgets is not None
                    self.budgets.bind(run_id, subject, chars=len(text))
                    bound = True
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
        finally:
            if subject is not None and not bound:
                # No turn of its own: its token reservation goes back (issue 28).
                assert self.budgets is not None
                self.budgets.release(subject)
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
        role = self.access.role_for(transport.name, asked, key)
        decision = self.access.decide(role, key)
        if role == "ignored" or not decision.answer:
            log.info("resumed message %d in %s: its asker (%s) is not answered there", m.id,
                     key, role)  # fmt: skip
            return None
        subject: Subject | None = None
        if self.budgets is not None and self.budgets.enabled:
            subject = Subject(
                transport=transport.name, channel=key,
                identity=_author_id(transport, asked), role=role, name=m.author or "",
            )  # fmt: skip
            refused = await self.budgets.admit(subject)
            if refused is not None:
                if refused.notice:
                    await self._send(transport, key, refused.notice, "notice", None)
                return None
        return decision.tools, subject

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
        old = self._channels.get(key)
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
        return old, len(moved)

    # What the commands use of the bridge (:class:`~agentik.bot.commands.CommandHost`).
    async def channel(self, key: str, transport: Transport, opts: ChannelOptions) -> _Channel:
        """The channel ``key``, opened (with its conversation) if it is not."""
        return await self._channel(key, transport, opts)

    def open_channel(self, key: str) -> _Channel | None:
        """The channel ``key`` if it is open now, else ``None``."""
        return self._channels.get(key)

    async def settings_changed(self, channel_key: str, transport: Transport) -> Effective:
        """A channel's settings changed (``!set``): in force from its next turn."""
        eff = await self.effective(channel_key, transport)
        ch = self._channels.get(channel_key)
        if ch is not None:
            self._apply(ch, eff)
        return eff

    def subject(self, message: IncomingMessage, transport: Transport) -> Subject:
        """Who ``message`` is counted for by the budgets (``!budget``)."""
        return self._subject(message, transport)

    async def send(
        self, transport: Transport, key: str, text: str, kind: OutgoingKind, reply_to: object
    ) -> int:
        """Send a line (a command's answer, a page of ``!more``) to channel ``key``."""
        return await self._send(transport, key, text, kind, reply_to)

    # -- budgets (issue 19) ----------------------------------------------------------------
    def _subject(self, message: IncomingMessage, transport: Transport) -> Subject:
        """Who ``message`` is counted for: its speaker (by role) and its channel."""
        key = message.channel_key
        return Subject(
            transport=transport.name, channel=key, identity=_author_id(transport, message),
            role=self.role_for(transport.name, message, key),
            name=message.author_name or message.author_id,
        )  # fmt: skip

    async def _budget_turn_ended(self, event: TurnEnded, channel_key: str) -> None:
        """Count the tokens of a finished turn for whoever started it (else the channel)."""
        if self.budgets is not None and event.run_id:
            try:
                await self.budgets.turn_ended(
                    event.run_id, event.usage, event.text, channel=channel_key
                )
            except Exception:
                log.exception("could not count the tokens of run %s", event.run_id)

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


def _no_tools(name: str) -> bool:
    return False


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
