"""Recovery: what a crash left unanswered, taken up after a restart.

:meth:`Recovery.resume_pending` finds every committed message without a
finished turn and, per the bridge's ``resume`` setting, answers it (through
the same admission a new message passes), notes it, or drops it; approvals a
restart left pending expire unless a resumed turn waits on them.  It works
through a :class:`RecoveryHost` (the bridge), never importing it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from agentik.core.approvals import RESTARTED
from agentik.transports.base import IncomingMessage

if TYPE_CHECKING:
    from agentik.core import Agent
    from agentik.core.budgets import Budgets, Subject
    from agentik.core.conversation import ResumeMode
    from agentik.core.messages import Message
    from agentik.transports.base import Transport

    from .channel import ChannelOptions, OpenChannel

__all__ = ["Recovery", "RecoveryHost", "resumed_asker"]

# Resume lines keep the bridge's logger: operators' log filters name it.
log = logging.getLogger("agentik.bot.bridge")


class RecoveryHost(Protocol):
    """What recovery uses of the bridge (the bridge implements it)."""

    agent: Agent
    budgets: Budgets | None
    #: What is done with a message a crash left unanswered.
    resume: ResumeMode
    #: Older pending messages (seconds) only get a notice; 0: no limit.
    resume_max_age: float

    def transport_for(self, key: str) -> Transport | None:
        """The attached transport instance that owns channel ``key``, if any."""
        ...

    def options_for(self, transport: Transport) -> ChannelOptions:
        """The options a transport instance was attached with."""
        ...

    async def channel(self, key: str, transport: Transport, opts: ChannelOptions) -> OpenChannel:
        """The channel ``key``, opened if it is not."""
        ...

    async def admit_resumed(
        self, key: str, transport: Transport, m: Message
    ) -> tuple[Callable[[str], bool] | None, Subject | None] | None:
        """The front door for a resumed turn: the tools it may offer and its budget
        subject, or ``None`` (refused)."""
        ...


class Recovery:
    """Takes up a bridge's unanswered messages after a restart (see the module docstring)."""

    def __init__(self, host: RecoveryHost) -> None:
        self.host = host

    async def resume_pending(
        self, *, only: Callable[[str], bool] | None = None, before: float | None = None
    ) -> dict[str, int]:
        """Take up every message a crash left unanswered; call once transports are started.

        For each conversation with committed user messages that have no
        finished turn, the channel is opened on the attached transport that
        owns its key and the conversation resumes them by the bridge's
        ``resume``: ``answer`` runs the turn (rendered to the channel as usual),
        ``note`` posts a short notice instead, ``drop`` records it as dropped.
        A message older than ``resume_max_age`` only gets ``note`` (when the
        policy is ``answer``).  A conversation whose channel has no attached
        transport stays pending (logged) for a later start, and the search
        pages past it, so any number of such rows never hide a message a
        transport can take; one whose channel has since been bound to another
        conversation (``!new``) is recorded as superseded.  A turn taken up
        passes the gate a new message passes (``admit_resumed``: its asker's
        role, then budgets).  ``only``: take up only the conversations whose
        channel key it accepts (a worker that took over one connection: its
        channels); the others are not touched, nor are approvals then.
        ``before``: only messages written before this time (``time.time()``
        taken before the transports started): a message that arrives while the
        start-up is still under way is this process's own, its turn already
        queued, and taking it up too would answer it twice.
        Returns how many messages went each way.
        """
        counts = {"answer": 0, "note": 0, "drop": 0, "superseded": 0, "left": 0, "refused": 0}
        answered: set[str] = set()
        after = 0
        now = time.time()
        while pending := await self.host.agent.pending_turns(after=after):
            after = pending[-1].id
            by_conv: dict[str, list[Message]] = {}
            for m in pending:
                if isinstance(m.data, dict) and m.data.get("queued"):
                    continue  # the turn queue runs it (agentik.core.cluster.conversations)
                if before is not None and m.created_at >= before:
                    continue  # said since this start began: its turn is ours already
                by_conv.setdefault(m.conversation_id, []).append(m)
            for cid, messages in by_conv.items():
                if only is not None and not only(messages[-1].channel or ""):
                    continue
                await self._resume_conversation(cid, messages, now, counts, answered)
        if only is None:
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
        transport = self.host.transport_for(key)
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
        ch = await self.host.channel(key, transport, self.host.options_for(transport))
        conv = ch.conversation
        if conv.id != cid:
            old = await self.host.agent.get_conversation(cid)
            old.resume(messages, mode="drop", outcome="superseded")
            counts["superseded"] += len(messages)
            return
        for m in messages:
            mode: ResumeMode = self.host.resume
            max_age = self.host.resume_max_age
            if mode == "answer" and max_age and now - m.created_at > max_age:
                mode = "note"
            allow_tool: Callable[[str], bool] | None = None
            subject: Subject | None = None
            if mode == "answer":
                admitted = await self.host.admit_resumed(key, transport, m)
                if admitted is None:
                    conv.resume([m], mode="drop", outcome="refused")
                    counts["refused"] += 1
                    continue
                allow_tool, subject = admitted
            # The channel's settings as they are now (not stored with the turn).
            got = conv.resume([m], mode=mode, allow_tool=allow_tool, settings=ch.settings)
            # At once (no await in between): the admission of the next one awaits, and
            # this turn may end meanwhile.
            ch.add_pending(got)
            if subject is not None and got:
                assert self.host.budgets is not None
                self.host.budgets.bind(m.run_id or "", subject, chars=len(m.content))
            if mode == "answer":
                answered.update(got)
            counts[mode] += 1
        log.info("resumed %d unanswered message(s) in %s", len(messages), key)

    async def _expire_left_approvals(self, answered: set[str]) -> int:
        """Approvals a restart left pending (issue 19): those of a turn being resumed wait
        for it (it takes one over when it calls the same tool again, or it expires when
        the turn ends); the others expire now, with a notice in their channel."""
        approvals = self.host.agent.approvals
        try:
            left = await approvals.leftovers()
        except NotImplementedError:
            return 0
        expired = 0
        for a in left:
            if a.run_id in answered:
                continue
            key = a.channel_key or ""
            transport = self.host.transport_for(key)
            try:
                conv = await self.host.agent.get_conversation(a.conversation_id)
                if transport is not None and conv.channel_key == key:
                    # Open the channel first, so its renderer shows the notice.
                    await self.host.channel(key, transport, self.host.options_for(transport))
                await approvals.expire(conv.parts, a, RESTARTED)
                expired += 1
            except Exception:
                log.exception("could not expire approval %s", a.id)
        return expired


def resumed_asker(
    key: str, transport: Transport, m: Message, kinds: Mapping[str, str]
) -> IncomingMessage:
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
    kind = kinds.get(instance)
    meta: dict[str, object] = {}
    if kind == "irc":
        meta = {"account": aid}
    elif kind == "slack":
        meta = {"team": key.split(":")[1] if key.count(":") >= 2 else None}
    return IncomingMessage(channel_key=key, text=m.content, author_id=aid,
                           author_name=m.author or aid, meta=meta)  # fmt: skip
