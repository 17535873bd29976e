"""Open channels: the channels a bridge holds open, and their lifecycle.

:class:`Channels` opens a channel (its conversation, and a renderer task
following its events), puts the channel's settings in force for its next turn
(options, and the :class:`~agentik.core.turnsettings.TurnSettings` its turns
run with: persona, model profile, recall, tools), releases a channel left idle,
starts a channel over (``!new``) and tells channels when background memory work
saved notes from them.  It works through a :class:`ChannelsHost` (the bridge),
never importing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Protocol

from agentik.core.errors import PromptRefused
from agentik.core.events import Event, MemoryNoted, TurnEnded, TurnStarted
from agentik.core.keyedlocks import KeyedLocks
from agentik.core.questions import FormError
from agentik.core.turnsettings import DEFAULT_SETTINGS, TurnSettings

from .channel import OpenChannel
from .chansettings import allowed_tool_names, persona_block, recall_override
from .chat import article, author_id, wait_text
from .logs import log_event
from .render import Renderer, RenderHost

if TYPE_CHECKING:
    from agentik.core import Conversation
    from agentik.core.budgets import Budgets
    from agentik.core.cluster.events import ClusterSubscription
    from agentik.core.eventbus import Subscription
    from agentik.core.tools.base import TurnPolicy
    from agentik.transports.base import IncomingMessage, Transport

    from .channel import ChannelOptions
    from .chat import article, author_id, wait_text
from .chansettings import Effective

__all__ = ["Channels", "ChannelsHost"]

# Channel lines keep the bridge's logger: operators' log filters name it.
log = logging.getLogger("agentik.bot.bridge")

_Channel = OpenChannel


class ChannelsHost(RenderHost, Protocol):
    """What the open channels use of the bridge (the bridge implements it)."""

    #: Usage limits (``None``: unlimited); a finished turn's tokens are counted here.
    budgets: Budgets | None
    #: Tell channels when background memory work saved notes from them.
    announce: bool
    #: Seconds without a message or a running turn before a channel is released (0: never).
    idle_seconds: float

    def options_for(self, transport: Transport) -> ChannelOptions:
        """The options a transport instance was attached with."""
        ...

    async def effective(self, channel_key: str, transport: Transport) -> Effective:
        """The settings in force in a channel."""
        ...

    def transport_for(self, key: str) -> Transport | None:
        """The attached transport instance that owns channel ``key``, if any."""
        ...

    def serves(self, transport: Transport) -> bool:
        """Whether this worker serves ``transport``'s connection now."""
        ...

    async def follow(
        self, key: str, transport: Transport, conv: Conversation
    ) -> ClusterSubscription | None:
        """The events channel ``key`` is rendered from when it should follow the turns
        other workers run too (a linked channel on a store several workers share:
        :meth:`agentik.bot.links.Links.follow`); ``None``: this process's."""
        ...


class Channels:
    """The channels a bridge holds open (see the module docstring)."""

    def __init__(self, host: ChannelsHost) -> None:
        self.host = host
        #: The open channels, by channel key.
        self.open: dict[str, _Channel] = {}
        #: Per channel key: held while a channel is opened, started over or released.
        self.lock = KeyedLocks()
        #: The task releasing idle channels (``None`` when no channel is open).
        self.reaper: asyncio.Task[None] | None = None
        self.announcer: asyncio.Task[None] | None = None
        #: How many idle channels have been released so far.
        self.released = 0
        # Told when a channel has events to render: one bound method for all of them.
        self._ready = self._on_ready

    async def detach(self, name: str) -> None:
        """Release the open channels of transport instance ``name``."""
        for key, ch in list(self.open.items()):
            if ch.transport.name != name:
                continue
            async with self.lock(key):
                if self.open.get(key) is ch:
                    del self.open[key]
                    await self.close(ch)

    def rebind(self, name: str, transport: Transport) -> None:
        """Instance ``name`` was restarted as ``transport`` (new settings): its open
        channels, and the answers they are rendering, carry on through it."""
        for ch in self.open.values():
            if ch.transport.name == name:
                ch.transport = transport

    def policy_changed(self) -> None:
        """The agent's tool policy changed: open channels take it for their next turn
        (each channel's own ``tools`` setting is applied again on its next message)."""
        for ch in self.open.values():
            ch.settings = dataclasses.replace(ch.settings, policy=self._bound(ch))

    async def channel(
        self, key: str, transport: Transport, opts: ChannelOptions, *, unbound: bool = False
    ) -> _Channel:
        """The channel ``key``, opened (with its conversation) if it is not.
        ``unbound``: no conversation was ever bound to it (see :func:`unbound`)."""
        eff = await self.host.effective(key, transport)
        ch = self.open.get(key)
        if ch is not None and ch.conversation.state.value == "open":
            ch.last_used = time.monotonic()
            self.apply(ch, eff)
            return ch
        lock = self.lock(key)
        async with lock:
            ch = self.open.get(key)
            if ch is not None and ch.conversation.state.value == "open":
                ch.last_used = time.monotonic()
                self.apply(ch, eff)
                return ch
            # A new channel's binding is written with its first message (lazy).
            conv = await self.host.agent.conversation_for_channel(key, lazy=True, unbound=unbound)
            feed = await self.host.follow(key, transport, conv)
            ch = self.open_new(key, transport, eff.options, conv, feed=feed)
            self.apply(ch, eff)
            return ch

    async def unopened(self, key: str, transport: Transport, conv: Conversation) -> _Channel:
        """Channel ``key`` of ``conv`` with its settings in force, not opened: no renderer
        follows it and it is not held (a queued turn asked in a channel whose connection
        another worker owns, run here: :meth:`agentik.bot.chatqueue.ChatQueue.admit`)."""
        eff = await self.host.effective(key, transport)
        ch = _Channel(key=key, transport=transport, options=eff.options, conversation=conv)
        self.apply(ch, eff)
        return ch

    async def settings_changed(self, channel_key: str, transport: Transport) -> Effective:
        """A channel's settings changed (``!set``): in force from its next turn."""
        eff = await self.host.effective(channel_key, transport)
        ch = self.open.get(channel_key)
        if ch is not None:
            self.apply(ch, eff)
        return eff

    def apply(self, ch: _Channel, eff: Effective) -> None:
        """Put a channel's settings in force for its next turn: its options, and the
        :class:`~agentik.core.turnsettings.TurnSettings` its messages are submitted
        with (persona, model profile, recall, tools)."""
        agent = self.host.agent
        ch.options = eff.options
        ch.tools = eff.tools
        settings = TurnSettings(
            policy=self._bound(ch),
            system_addition=persona_block(ch.key, eff.persona) if eff.persona else None,
            llm_profile=eff.model,
            recall=recall_override(agent.memory.recall_policy, eff.recall),
        )
        # A channel that overrides nothing shares the one default (85 bytes a channel).
        ch.settings = DEFAULT_SETTINGS if settings == DEFAULT_SETTINGS else settings

    def _bound(self, ch: _Channel) -> TurnPolicy | None:
        """The tool policy of a channel's turns: the agent's, bounded by the
        transport's ``allowed_tools`` and narrowed by the channel's ``tools``
        setting (``None``: the agent's as it is when the turn starts)."""
        agent = self.host.agent
        outer = self.host.options_for(ch.transport).allowed_tools
        if ch.tools is None:
            allowed = outer
        else:
            # Exact names: a tool must match the transport's bound and the channel's list.
            bound = agent.policy.allowed_tools if outer is None else outer
            allowed = allowed_tool_names((t.name for t in agent.tools), bound, ch.tools)
        if allowed is None:
            return None
        # TurnPolicy is a pydantic dataclass, which mypy does not see as a dataclass.
        return dataclasses.replace(  # type: ignore[type-var]
            agent.policy, allowed_tools=tuple(allowed)
        )

    def open_new(
        self,
        key: str,
        transport: Transport,
        opts: ChannelOptions,
        conv: Conversation,
        *,
        feed: ClusterSubscription | None = None,
    ) -> _Channel:
        """Open channel ``key`` on ``conv``: its renderer follows the conversation (its
        events here, or ``feed``: merged with the turns other workers run)."""
        ch = _Channel(key=key, transport=transport, options=opts, conversation=conv)
        ch.settings = TurnSettings(policy=self._bound(ch))
        # Everything is followed: a channel's ``events`` setting may change while it
        # is open; the renderer leaves out what the chat profile would not carry.
        sub: Subscription | ClusterSubscription
        if feed is not None:
            sub = ch.subscription = feed
            ch.follows = True
        else:
            sub = ch.subscription = conv.events(profile="debug")
        # A render task runs only while the channel has events to show (a task per
        # idle channel held ~1 KB); each channel has its own, so one held up by its
        # transport (flood control, rate limits) never holds up the others.
        sub.tag, sub.notify = ch, self._ready
        self._kick(ch)
        self.open[key] = ch
        if self.reaper is None and self.host.idle_seconds > 0:
            self.reaper = asyncio.create_task(self._reap(), name="agentik-bridge-reaper")
        if self.announcer is None:
            self.announcer = asyncio.create_task(self._announce(), name="agentik-announcer")
        return ch

    async def start_over(self, key: str, transport: Transport) -> tuple[_Channel | None, int]:
        """``!new``: a new conversation for channel ``key``; nothing queued is lost.

        Messages queued behind the running answer (not started yet) move to the
        new conversation, in order, with their authors, and are answered there
        to whoever asked; the running answer is stopped.  Returns the channel
        held before (``None`` if none was open) and how many messages moved.
        The caller holds the channel's arrivals meanwhile.
        """
        old = self.open.get(key)
        moved: list[str] = []
        lock = self.lock(key)
        async with lock:
            conv = await self.host.agent.new_conversation_for_channel(key)
            eff = await self.host.effective(key, transport)
            # The new channel follows its conversation before anything is queued there.
            new = self.open_new(key, transport, eff.options, conv)
            self.apply(new, eff)
            if old is not None:
                new.direct = old.direct
                new.reply_to = old.reply_to
                running = old.conversation.running_run_id
                waiting = [r for r in old.pending if r != running]
                # Who asked, and where the answer goes, before the moved turns run.
                for run_id in waiting:
                    if run_id in old.run_reply_to:
                        new.asked(run_id, old.run_reply_to[run_id], old.run_asker.get(run_id))
                new.add_pending(waiting)
                # First the queue (so the next turn does not start in the old
                # conversation when the running one stops), then the running turn.
                if old.conversation.state.value == "open":  # not closed under it
                    moved = await old.conversation.move_queued(conv)
                new.discard_pending(set(waiting) - set(moved))
                await old.conversation.interrupt()
                old.discard_pending(list(old.pending))
                await self.close(old)
        return old, len(moved)

    async def tell_approval_wait(
        self, ch: _Channel, transport: Transport, message: IncomingMessage, opts: ChannelOptions
    ) -> None:
        """A message queued behind a turn that waits on an approval: the channel is
        told once per approval what it waits for and where (``!approvals``).

        Other askers' turns do not run meanwhile: a conversation's turns run one
        at a time, in order (each sees the answers before it), so they wait
        until the approval is decided, expires, or its turn is stopped.
        """
        conv = ch.conversation
        if not conv.awaiting_human or self.host.agent.questions.waiting(conv.id):
            return
        waiting = [
            a
            for a in await self.host.agent.approvals.pending(ch.key)
            if a.conversation_id == conv.id
        ]
        fresh = [a for a in waiting if str(a.id) not in ch.approvals_told]
        if not fresh:
            return
        told = set(ch.approvals_told)
        told.update(str(a.id) for a in waiting)
        while len(told) > 100:
            told.pop()
        ch.approvals_told = frozenset(told)
        a = fresh[0]
        p = opts.command_prefix
        await self.host.send(
            transport, ch.key,
            f"this channel waits on approval {a.id} ({a.tool}, asked by {a.asker or 'someone'};"
            f" expires in {wait_text(a.expires_at - time.time())}): new messages are queued and"
            f" answered after it — {p}approvals shows it; {article(a.approvers)} may decide",
            "notice", message.reply_to,
        )  # fmt: skip

    async def answers_question(
        self, message: IncomingMessage, transport: Transport, text: str
    ) -> bool:
        """Whether ``message`` answered a question the channel's turn waits for
        (``ask_user``): then it is the answer, addressed to the bot or not."""
        ch = self.open.get(message.channel_key)
        if ch is None or not self.host.agent.questions.waiting(ch.conversation.id):
            return False
        author = message.author_name or message.author_id
        try:
            answered = await ch.conversation.answer(
                text, author=author, author_id=author_id(transport, message)
            )
        except (PromptRefused, FormError) as exc:
            # A plugin's words, shown as they are, or what is wrong with an answer to
            # a form (``-`` on a required question); the question still waits.
            await self.host.send(
                transport, message.channel_key, str(exc), "error", message.reply_to
            )
            return True
        if answered is None:
            return False
        ch.last_used = time.monotonic()
        return True

    async def _reap(self) -> None:
        """Release channels idle for ``idle_seconds``; sleeps until the next may be."""
        try:
            while self.open:
                idle_seconds = self.host.idle_seconds
                now = time.monotonic()
                oldest = min(ch.last_used for ch in self.open.values())
                await asyncio.sleep(max(0.0, oldest + idle_seconds - now) + 0.01)
                now = time.monotonic()
                for key, ch in list(self.open.items()):
                    if now - ch.last_used < idle_seconds:
                        continue
                    if not ch.idle(now, idle_seconds):
                        ch.last_used = now  # a long turn: look again later
                        continue
                    async with self.lock(key):
                        if self.open.get(key) is ch and ch.idle(now, idle_seconds):
                            del self.open[key]
                            await self.close(ch)
                            self.released += 1
                            log.debug("released idle channel %s", key)
        finally:
            self.reaper = None

    async def release(self, key: str) -> None:
        """Release channel ``key`` if it is open (its conversation binding changed:
        it reopens on the new one with its next message)."""
        async with self.lock(key):
            ch = self.open.pop(key, None)
            if ch is not None:
                await self.close(ch)

    async def close(self, ch: _Channel) -> None:
        """Stop a channel's renderer (the channel is no longer in :attr:`open`)."""
        if ch.subscription is not None:
            await ch.subscription.aclose()
        if ch.task is not None:
            ch.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ch.task

    async def aclose(self) -> None:
        """Stop the announcer, the reaper and every renderer."""
        if self.announcer is not None:
            self.announcer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.announcer
            self.announcer = None
        if self.reaper is not None:
            self.reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.reaper
        for ch in list(self.open.values()):
            await self.close(ch)
        self.open.clear()

    # -- memory notes (issue 22) -------------------------------------------------------
    async def _announce(self) -> None:
        """Tell each channel, once per job, that reflection or mining saved notes
        from it (when its ``announce`` is on); runs while the bridge does."""
        kinds = {"memory_noted"}
        async with contextlib.aclosing(self.host.agent.events(kinds=kinds)) as events:
            async for e in events:
                if not isinstance(e, MemoryNoted) or not e.channel_key or not e.count:
                    continue
                try:
                    await self._announce_one(e, e.channel_key)
                except Exception:
                    log.exception("announcing saved notes in %s failed", e.channel_key)

    async def _announce_one(self, e: MemoryNoted, key: str) -> None:
        transport = self.host.transport_for(key)
        if transport is None:
            return
        eff = await self.host.effective(key, transport)
        if not (self.host.announce if eff.announce is None else eff.announce):
            return
        what = "fact" if e.source == "mining" else "reflection"
        noun = what if e.count == 1 else f"{what}s"
        p = eff.options.command_prefix
        await self.host.send(
            transport, key, f"noted {e.count} {noun} — {p}memory to review", "notice", None
        )

    # -- rendering -----------------------------------------------------------------------
    async def _budget_turn_ended(self, event: TurnEnded, channel_key: str) -> None:
        """Count the tokens of a finished turn for whoever started it (else the channel)."""
        budgets = self.host.budgets
        if budgets is not None and event.run_id:
            try:
                await budgets.turn_ended(event.run_id, event.usage, event.text, channel=channel_key)
            except Exception:
                log.exception("could not count the tokens of run %s", event.run_id)

    def _on_ready(self, sub: Subscription | ClusterSubscription) -> None:
        """A channel's subscription has events pending (its tag is the channel)."""
        if isinstance(sub.tag, OpenChannel):
            self._kick(sub.tag)

    def _kick(self, ch: _Channel) -> None:
        """``ch`` has events to render: start its render task unless it runs."""
        sub = ch.subscription
        if ch.task is None and sub is not None and sub.ready:
            ch.task = asyncio.get_running_loop().create_task(
                self._render(ch), name=f"agentik-render:{ch.key}"
            )

    async def _render(self, ch: _Channel) -> None:
        """Render what ``ch``'s subscription has pending, then end (a new task
        starts with its next event)."""
        try:
            await self._render_pending(ch)
        finally:
            if ch.task is asyncio.current_task():
                ch.task = None

    async def _render_pending(self, ch: _Channel) -> None:
        renderer = ch.renderer
        if not isinstance(renderer, Renderer):
            renderer = ch.renderer = Renderer(self.host, ch)
        sub = ch.subscription
        assert sub is not None
        while (event := sub.take()) is not None:
            if ch.follows and not self._shown(ch, event):
                continue
            ended = isinstance(event, TurnEnded) and event.parent_run_id is None
            # A linked channel renders turns asked in the others: counted once, where asked.
            counted = not ch.linked or (event.run_id or "") in ch.pending
            if isinstance(event, TurnEnded) and ended and counted:
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
                ch.answered(event.run_id or "")
                ch.discard_pending((event.run_id or "",))
                if ch.follows:
                    # Its words went out streamed: the copy of the answer the worker
                    # that ran it handed over meanwhile is not sent again.
                    for oid in ch.shown_to_end(event.run_id or ""):
                        self.host.outbox.mark(oid, "confirmed")

    def _shown(self, ch: _Channel, event: Event) -> bool:
        """Whether ``event`` of a following channel (:attr:`OpenChannel.follows`) is
        rendered: a turn another worker runs is shown streamed when this channel saw it
        start, else its answer comes whole at its end (the handover, :mod:`.links`); a
        channel whose connection this worker no longer serves shows no other worker's
        turn (its new owner does)."""
        run = event.run_id
        if not run:
            return True
        if event.parent_run_id is not None:
            # A child run's event shows as its turn does (a grandchild's parent is a
            # child run, not noted: shown).
            seen = ch.remote.get(event.parent_run_id)
            return seen is None or seen.streamed
        here = ch.conversation.running_run_id == run
        if not here and not self.host.serves(ch.transport):
            return False
        if ch.last_used < (now := time.monotonic()) - 1.0:
            ch.last_used = now
        return ch.shows(run, started=isinstance(event, TurnStarted))


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
