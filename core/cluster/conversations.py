"""Conversations served by any worker: conversation leases and the turn queue.

Several workers on one PostgreSQL database (:attr:`Store.shared
<agentik.core.store.base.Store.shared>`) may each receive a message for the same
conversation (the HTTP API behind a load balancer, no sticky routing).  Two
workers must never run turns of one conversation at once, and its turns run in
the order their messages were committed.  So (issue 32, docs/operations.md,
"Running several workers"):

* **A conversation lease** ``conv:<id>`` (the store's
  :class:`~agentik.core.store.repositories.LeaseRepository`, owner: this worker's
  id) says which worker runs the conversation's turns now.  It is taken when a
  turn is to run here, renewed by **one keeper task** per worker (every
  ``heartbeat_seconds``, all held leases in one statement), and released once
  the conversation has been idle for :attr:`TurnQueue.idle_release` seconds.
* **Every submitted turn is queued** (:meth:`TurnQueue.submit`): its user message
  and its queue row are written in one transaction
  (:meth:`~agentik.core.store.base.Store.queue_add`), the message id being the
  turn's key.  The worker that received it runs it when it holds or can take the
  lease (claimed at once: no other worker sees it free); otherwise it announces
  the conversation id on the ``turns`` topic (ids only, after the commit) and the
  lease holder claims and runs it, in order.
* **Fencing.**  Before it starts each turn the runner checks the lease is still
  this worker's (renewed within ``lease_seconds - heartbeat_seconds``): a worker
  that lost it (a renewal refused, or a database silent for too long) starts no
  new turn of that conversation.  The turn it is running goes on to its end (its
  answer is in the audit log, where the HTTP API's reader finds it; a new holder
  that claims the same turn finds its end recorded, or runs it again: see "where
  delivery is at-least-once" in the docs).
* **A dead worker's turns**: its leases expire; every worker looks for queued
  turns of conversations whose lease is free at each heartbeat, on each
  ``turns`` notification and at the notifier's resync, takes the lease and
  claims them (a claim takes over the rows the dead worker had claimed).  A
  turn the dead worker had started runs again from what it committed
  (:meth:`Conversation.resume <agentik.core.conversation.Conversation.resume>`):
  one whose end was recorded is not run again.

A turn is run through its **front end** (:meth:`TurnQueue.front_end`): the part
that queued it (the HTTP API, by its ``via`` name in the payload) decides again,
on the worker running it, what the turn may do (the asker's tools, the turn's
settings), as recovery does for a turn resumed after a restart.

**Stopping a turn another worker runs** (the HTTP API's interrupt reaching a
worker that does not run it): :meth:`TurnQueue.running_elsewhere` finds the turn
running in the conversation from its stored events (the last turn started whose
end is not recorded), and :meth:`TurnQueue.stop_elsewhere` announces
``<run id>:<conversation id>`` on the ``stops`` topic (ids only; nothing is
written); the worker whose process runs that turn interrupts it.  A lost
notification only delays: the asking worker announces it again every
``heartbeat_seconds`` until the turn's end is recorded (at most
:data:`STOP_PATIENCE` seconds).

**Steering a turn another worker runs** (``busy = "steer"`` through a worker that
does not hold the conversation): the turn is queued as any other, its payload naming
the run running elsewhere (``steer``).  The holder, claiming it, sends it into that
turn when it runs here and can take it (:meth:`Conversation.steer_committed
<agentik.core.conversation.Conversation.steer_committed>`); its queue row is done
when the turn ends, or — not taken in — it runs as an ordinary turn after it.

Nothing of this runs on a store one process keeps (SQLite, the in-memory store):
the bot makes no :class:`TurnQueue` there, and turns are submitted as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..messages import Content, Message, NewMessage, split_content
from ..runs import new_run_id
from ..store.records import TurnEnd
from . import CONVERSATION_PREFIX, ClusterSettings, conversation_lease
from .events import running_turn
from .notify import Notice

if TYPE_CHECKING:
    from ..conversation import Conversation
    from ..hooks import Hooks
    from ..services import AgentServices
    from ..store.base import Store
    from ..store.records import Lease, QueuedTurn, QueueStats
    from ..turn import Steered
    from ..turnsettings import TurnSettings

__all__ = ["STOPS_TOPIC", "TOPIC", "Admission", "FrontEnd", "TurnQueue"]

log = logging.getLogger(__name__)

#: The notification topic of queued turns: ids are conversation ids.
TOPIC = "turns"
#: The topic asking the worker running a turn to stop it: ids ``<run id>:<conversation id>``.
STOPS_TOPIC = "stops"
#: Seconds a stop asked of another worker is announced again, until the turn ends.
STOP_PATIENCE = 120.0
#: How many turns run here are remembered as done (a claim that read the queue before
#: one left it returns it once more).
_DONE_KEPT = 10_000
#: User messages looked through for the last question (:meth:`TurnQueue.turn_pending`).
_LAST_ASKED = 50
#: Claims of a turn that could not start (its set-up failed) before it is dropped.
_ATTEMPTS = 3

#: What a front end answers for a claimed turn: the tools it may offer (``None``:
#: all its settings allow) and its settings; ``None``: refused (not run).
Admission = tuple[Callable[[str], bool] | None, "TurnSettings"] | None
#: ``admit(conversation, turn, message)``: a front end's decision for a claimed turn.
FrontEnd = Callable[["Conversation", "QueuedTurn", Message], Awaitable[Admission]]


class AgentLike(Protocol):
    """What the turn queue uses of its :class:`~agentik.core.agent.Agent`."""

    store: Store
    hooks: Hooks
    services: AgentServices[Conversation]

    async def get_conversation(self, conversation_id: str) -> Conversation: ...


@dataclass(eq=False)
class _Slot:
    """A conversation this worker runs: its claimed turns, in order, and their runner."""

    turns: deque[QueuedTurn] = field(default_factory=deque)
    known: set[int] = field(default_factory=set)
    task: asyncio.Task[None] | None = None
    #: When its last turn ended (monotonic), for the idle release.
    idle_since: float = 0.0


class TurnQueue:
    """This worker's conversation leases and its share of the turn queue (see the
    module's doc).  ``start()`` once the front ends are registered, ``aclose()`` at
    the end."""

    def __init__(
        self,
        agent: AgentLike,
        worker: str,
        settings: ClusterSettings,
        *,
        idle_release: float | None = None,
        on_round: Callable[[int, int], None] | None = None,
    ) -> None:
        self.agent = agent
        self.store = agent.store
        self.worker = worker
        self.settings = settings
        #: Seconds a conversation stays leased here after its last turn ended.
        self.idle_release = (
            idle_release if idle_release is not None else max(1.0, 2 * settings.heartbeat_seconds)
        )
        self._front_ends: dict[str, FrontEnd] = {}
        self._held: dict[str, Lease] = {}
        #: When each held lease was last renewed (monotonic, when the renewal was sent).
        self._renewed: dict[str, float] = {}
        self._slots: dict[str, _Slot] = {}
        self._keeper: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._sub: Any = None
        self._stops: Any = None
        self._closing = False
        self._considering: set[str] = set()
        #: Conversations a turn is being queued for here now (not released meanwhile).
        self._submitting: dict[str, int] = {}
        #: The messages of the turns queued here and run here (read from the store
        #: for the others).
        self._messages: dict[int, Message] = {}
        #: The last turns run here (a claim read before one left the queue returns it).
        self._done: set[int] = set()
        self._done_order: deque[int] = deque()
        #: Turns queued with ``busy = "steer"`` being sent into the turn running here
        #: (by message id): what became of each (``None``: not taken, it runs).
        self._steering: dict[int, asyncio.Task[Steered | None]] = {}
        #: How many times each turn's set-up failed here.
        self._failed: dict[int, int] = {}
        self._stats: QueueStats | None = None
        #: Called after each keeper round with the queue's depth and the leases held
        #: here (the bot's metrics).
        self.on_round = on_round
        #: Turns run here from the queue, and how many of them were claimed from
        #: another worker (a takeover), since the start.
        self.ran = 0
        self.taken_over = 0

    # -- what a front end uses ----------------------------------------------------------
    def front_end(self, via: str, admit: FrontEnd) -> None:
        """Run the turns queued with ``payload["via"] == via`` through ``admit``."""
        self._front_ends[via] = admit

    def holds(self, conversation_id: str) -> bool:
        """Whether this worker holds the conversation's lease, renewed recently enough
        to start a turn under it (fencing)."""
        if conversation_id not in self._held:
            return False
        renewed = self._renewed.get(conversation_id, 0.0)
        margin = self.settings.lease_seconds - self.settings.heartbeat_seconds
        return time.monotonic() - renewed < margin

    async def take(self, conversation_id: str) -> bool:
        """Whether this worker holds the conversation's lease, taking it when it is free
        (never while closing)."""
        if self.holds(conversation_id):
            return True
        if self._closing:
            return False
        sent = time.monotonic()
        try:
            got = await self.store.lease_acquire(
                conversation_lease(conversation_id), self.worker, self.settings.lease_seconds
            )
        except Exception as exc:
            log.warning("cluster: taking the lease of conversation %s failed: %s",
                        conversation_id, exc)  # fmt: skip
            return False
        if got is None or self._closing:
            return False
        self._held[conversation_id] = got
        self._renewed[conversation_id] = sent
        # Another worker may have run turns since this one held it: what this process
        # keeps of the conversation's context is read again from the store.
        conv = self.agent.services.find(conversation_id)
        if conv is not None:
            conv.parts.memory.invalidate()
        return True

    async def submit(
        self,
        conv: Conversation,
        content: Content,
        *,
        author: str | None,
        author_id: str | None,
        channel: str | None,
        settings: TurnSettings,
        payload: dict[str, Any],
        branch_of: int | None = None,
    ) -> tuple[str, bool]:
        """Queue a turn of ``conv`` (``payload``: its front end's, with ``via``); its run
        id, and whether it runs on this worker.  Returns once the message is
        committed.  The ``before_prompt`` hooks run here (a refusal raises
        :class:`~agentik.core.errors.PromptRefused`), as for a local submit.

        ``content`` may hold attachments (image and file parts): they are checked
        and stored here as for a local submit
        (:meth:`Conversation.attach <agentik.core.conversation.Conversation.attach>`),
        and the queued message names them by hash in ``data["parts"]``; the worker
        that runs the turn reads their bytes from the store (nothing of them in the
        queue row or a notification).  ``branch_of``: the row of the question this
        one replaces (regenerate, edit): recorded in ``data["branch_of"]``, the
        branch made by the worker that runs it (:meth:`_run_turn`)."""
        from ..errors import PromptRefused
        from ..hooks import Refuse

        text, attached = split_content(content)
        outcome = await self.agent.hooks.before_prompt(conv, text, author, author_id)
        if isinstance(outcome, Refuse):
            raise PromptRefused(outcome.message)
        text = self.agent.hooks.before_store("user", outcome, conv.id)
        parts = await conv.attach(attached) if attached else ()
        extra: dict[str, Any] = {}
        if parts:
            extra["parts"] = [p.to_dict() for p in parts]
        if branch_of is not None:
            extra["branch_of"] = branch_of
        self._submitting[conv.id] = self._submitting.get(conv.id, 0) + 1
        try:
            return await self._submit(
                conv, text, author, author_id, channel, settings, payload, extra
            )
        finally:
            left = self._submitting.pop(conv.id) - 1
            if left:
                self._submitting[conv.id] = left

    async def _submit(
        self,
        conv: Conversation,
        text: str,
        author: str | None,
        author_id: str | None,
        channel: str | None,
        settings: TurnSettings,
        payload: dict[str, Any],
        extra: dict[str, Any],
    ) -> tuple[str, bool]:
        await conv.stored()  # (a channel's new conversation is in the store first)
        here = await self.take(conv.id)
        now = time.time()
        data: dict[str, Any] = {"author_id": author_id} if author_id else {}
        data.update(extra)
        if settings.origin is not None:
            data["origin"] = settings.origin.to_dict()
        # Its turn comes from the queue: not an orphan for a working memory loading
        # meanwhile (agentik.core.workingmemory), not a pending turn for recovery.
        data["queued"] = True
        entry = NewMessage(kind="user", content=text, author=author,
                           channel=channel or conv.channel_key, run_id=new_run_id(), data=data,
                           created_at=now)  # fmt: skip
        turn = await self.store.queue_add(
            conv.id, entry, payload, claimed_by=self.worker if here else None, updated_at=now
        )
        if here:
            # Its message as stored: the runner needs no read of it.
            self._messages[turn.message_id] = entry.stored(
                id=turn.message_id, conversation_id=conv.id, now=now
            )
            # With the turns queued before it (by workers that do not hold the lease,
            # announced but maybe not claimed yet; or left by a worker gone): they run
            # first, in order.
            if not await self._claim(conv.id):
                self._add(conv.id, [turn])
        else:
            await self.store.notifier().publish(TOPIC, conv.id)
        return turn.run_id, here

    async def turn_pending(self, conversation_id: str) -> bool:
        """Whether a turn of the conversation is queued or running, on any worker: the
        last question's turn has no recorded end (turns run in order, so the ones
        before it ended)."""
        rows = await self.store.messages(conversation_id, kinds=["user"], limit=_LAST_ASKED)
        for m in reversed(rows):
            data = m.data if isinstance(m.data, dict) else {}
            if not m.run_id or data.get("ambient") or data.get("steered"):
                continue
            return not await self.store.turn_ended(conversation_id, m.run_id)
        return False

    def refresh(self, conv: Conversation) -> None:
        """Let ``conv`` read its working memory from the store again unless this worker
        runs its turns (holds its lease) or runs one of it now: another worker may have
        changed it (what regenerate and edit read before they queue a branch)."""
        if not self.holds(conv.id) and not conv.busy:
            conv.parts.memory.invalidate()

    async def settled(self, conversation_id: str) -> None:
        """Wait until this worker runs no queued turn of the conversation (its claimed
        turns ran, or were left to another worker)."""
        while (slot := self._slots.get(conversation_id)) is not None and slot.task is not None:
            await asyncio.wait([slot.task])

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        """Follow the ``turns`` topic, start the keeper, and take up what is queued."""
        self._sub = self.store.notifier().subscribe(TOPIC, self._noticed)
        self._stops = self.store.notifier().subscribe(STOPS_TOPIC, self._stop_noticed)
        self._keeper = asyncio.create_task(self._keep(), name="agentik-conversation-leases")

    async def drain(self) -> None:
        """Take no more leases and start no new turn (a stop: the running turns go on,
        their queued successors wait for another worker)."""
        self._closing = True
        if self._sub is not None:
            self._sub.close()
            self._sub = None

    async def aclose(self) -> None:
        """Stop the keeper and the runners; release every lease held (the turns still
        queued here are claimed by the next holder)."""
        await self.drain()
        if self._stops is not None:
            self._stops.close()
            self._stops = None
        tasks = [t for t in (self._keeper, *(s.task for s in self._slots.values())) if t]
        tasks += list(self._tasks) + list(self._steering.values())
        self._steering.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._keeper = None
        for cid in list(self._held):
            await self._release(cid)

    # -- stopping a turn another worker runs ----------------------------------------------
    async def running_elsewhere(self, conversation_id: str) -> str | None:
        """The run id of the turn running in the conversation as its stored events say
        (the last top-level turn started whose end is not recorded): a turn another
        worker runs; ``None`` when none runs."""
        found = await running_turn(self.store, conversation_id)
        return found[0] if found is not None else None

    async def withdraw(self, conversation_id: str, run_id: str) -> bool:
        """Take back the queued turn ``run_id`` (a run of this conversation whose user
        message the turn queue holds) wherever it waits: if it has not started, its
        end is recorded now (``cancelled``) and the worker that claims it skips it
        (:meth:`_run_turn`: it announces the end to the turn's followers).  One that
        runs already (here or elsewhere) is asked to stop instead.  ``False`` when
        it is over already or running.  The caller vouches that ``run_id`` is a turn
        of this conversation (an A2A task's recorded run)."""
        store = self.store
        if await store.turn_ended(conversation_id, run_id):
            return False
        local = self.agent.services.find(conversation_id)
        if local is not None and local.running_run_id == run_id:
            if not local.interrupting:
                await local.interrupt()
            return False
        if await self.running_elsewhere(conversation_id) == run_id:
            await self.stop_elsewhere(conversation_id, run_id)
            return False
        await store.append(conversation_id, ended=TurnEnd(run_id, "cancelled"))
        # (If a worker started it between the look and the record, it is stopped.)
        await self.store.notifier().publish(STOPS_TOPIC, f"{run_id}:{conversation_id}")
        log.info("cluster: conversation %s: queued turn %s withdrawn", conversation_id, run_id)
        return True

    async def stop_elsewhere(self, conversation_id: str, run_id: str) -> None:
        """Ask the worker running ``run_id`` of the conversation to stop it: announced
        now, and again every heartbeat until its end is recorded (see the module doc)."""
        await self.store.notifier().publish(STOPS_TOPIC, f"{run_id}:{conversation_id}")
        self._spawn(self._stop_until_ended(conversation_id, run_id))

    async def _stop_until_ended(self, conversation_id: str, run_id: str) -> None:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + STOP_PATIENCE
        while loop.time() < give_up:
            await asyncio.sleep(self.settings.heartbeat_seconds)
            try:
                if await self.store.turn_ended(conversation_id, run_id):
                    return
                await self.store.notifier().publish(STOPS_TOPIC, f"{run_id}:{conversation_id}")
            except Exception as exc:
                log.warning("cluster: asking to stop run %s failed: %s", run_id, exc)
        log.warning("cluster: run %s of conversation %s did not stop in %g s", run_id,
                    conversation_id, STOP_PATIENCE)  # fmt: skip

    def _stop_noticed(self, notice: Notice) -> None:
        """A worker asks to stop a turn: interrupted if it runs in this process."""
        for one in notice.ids:
            run_id, _, cid = one.partition(":")
            conv = self.agent.services.find(cid)
            if conv is None or conv.running_run_id != run_id or conv.interrupting:
                continue
            log.info("cluster: conversation %s: run %s stopped, as another worker asked",
                     cid, run_id)  # fmt: skip
            self._spawn(conv.interrupt())

    # -- claiming -------------------------------------------------------------------------
    def _noticed(self, notice: Notice) -> None:
        if self._closing or (notice.local and not notice.resync):
            return  # (this worker queued it because another holds the conversation)
        if notice.resync:
            self._spawn(self._scan())
            return
        for cid in notice.ids:
            self._spawn(self._consider(cid))

    def _spawn(self, aw: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(aw)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _scan(self) -> None:
        """Take up the conversations with queued turns whose lease is free (a dead
        worker's, or nobody's) or this worker's."""
        try:
            found = await self.store.queue_conversations(free_for=self.worker)
        except Exception as exc:
            log.warning("cluster: reading the turn queue failed: %s", exc)
            return
        for cid in found:
            await self._consider(cid)

    async def _consider(self, conversation_id: str) -> None:
        """Claim the conversation's queued turns if this worker holds or can take its
        lease."""
        if self._closing or conversation_id in self._considering:
            return
        self._considering.add(conversation_id)
        try:
            if await self.take(conversation_id):
                await self._claim(conversation_id)
        finally:
            self._considering.discard(conversation_id)

    async def _claim(self, conversation_id: str) -> bool:
        try:
            turns = await self.store.queue_claim(conversation_id, self.worker)
        except Exception as exc:
            log.warning("cluster: claiming turns of conversation %s failed: %s",
                        conversation_id, exc)  # fmt: skip
            return False
        self._add(conversation_id, turns)
        return True

    def _add(self, conversation_id: str, turns: list[QueuedTurn]) -> None:
        slot = self._slots.setdefault(conversation_id, _Slot())
        added: list[QueuedTurn] = []
        for turn in turns:
            if turn.message_id in slot.known or turn.message_id in self._done:
                continue  # claimed again (a repeated claim): it runs once here
            slot.known.add(turn.message_id)
            slot.turns.append(turn)
            added.append(turn)
            if turn.attempts > 1:
                self.taken_over += 1
        ordered = sorted(slot.turns, key=lambda t: t.message_id)
        slot.turns = deque(ordered)
        for turn in added:
            steer = turn.payload.get("steer")
            if isinstance(steer, str) and steer and turn.attempts <= 1:
                # Sent with busy = "steer" through another worker: into the turn
                # running here, at once (its queued turn waits behind that turn).
                self._steering[turn.message_id] = asyncio.ensure_future(
                    self._steer_in(conversation_id, slot, turn, steer)
                )
        if slot.turns and slot.task is None and not self._closing:
            slot.task = asyncio.create_task(
                self._run(conversation_id, slot), name=f"agentik-queued:{conversation_id}"
            )

    # -- steering across workers ------------------------------------------------------
    async def _steer_in(
        self, conversation_id: str, slot: _Slot, turn: QueuedTurn, run_id: str
    ) -> Steered | None:
        """Send a turn queued with ``busy = "steer"`` into the turn ``run_id`` when it
        runs here and nothing else waits before it; ``None``: it runs as a turn."""
        conv = self.agent.services.find(conversation_id)
        if conv is None or conv.running_run_id != run_id:
            return None
        if any(t.message_id < turn.message_id and t.run_id != run_id for t in slot.turns):
            return None  # turns wait before it: its own turn, in order (as on one process)
        admit = self._front_ends.get(str(turn.payload.get("via", "")))
        if admit is None:
            return None
        message = await self._message(conversation_id, turn)
        if message is None:
            return None
        admitted = await admit(conv, turn, message)
        if admitted is None or conv.running_run_id != run_id:
            return None
        allow_tool, settings = admitted
        item = conv.steer_committed(message, run_id=run_id, allow_tool=allow_tool,
                                    settings=settings)  # fmt: skip
        if item is not None:
            self._messages.pop(turn.message_id, None)
            log.info("cluster: conversation %s: a message sent through another worker"
                     " steers run %s", conversation_id, run_id)  # fmt: skip
        return item

    async def _message(self, conversation_id: str, turn: QueuedTurn) -> Message | None:
        """The user message of a queued turn (kept here when it was queued here)."""
        message = self._messages.get(turn.message_id)
        if message is not None:
            return message
        rows = await self.store.messages(conversation_id, after=turn.message_id - 1, limit=1)
        if not rows or rows[0].id != turn.message_id:
            return None  # its message is gone (the conversation was deleted)
        self._messages[turn.message_id] = rows[0]
        return rows[0]

    async def _steered(self, conversation_id: str, turn: QueuedTurn) -> bool:
        """Whether a turn queued with ``busy = "steer"`` was taken in by the running turn
        (so it is not run): waits for that turn's end here; a turn claimed again (its
        worker died) was taken in when its message is in the working memory."""
        steering = self._steering.pop(turn.message_id, None)
        item: Steered | None = None
        if steering is not None:
            try:
                item = await steering
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("cluster: conversation %s: steering run %s failed",
                              conversation_id, turn.payload.get("steer"))  # fmt: skip
        if item is not None:
            conv = await self.agent.get_conversation(conversation_id)
            await conv.wait_idle()
            return item.taken
        if turn.attempts > 1:
            conv = await self.agent.get_conversation(conversation_id)
            memory = conv.parts.memory
            memory.invalidate()
            await memory.load()
            return any(cm.message_id == turn.message_id for cm in memory.messages)
        return False

    # -- running ------------------------------------------------------------------------
    async def _run(self, conversation_id: str, slot: _Slot) -> None:
        try:
            while slot.turns and not self._closing:
                if not self.holds(conversation_id):
                    # Fenced: another worker may hold it now; it claims these turns.
                    log.warning("cluster: conversation %s: lease lost; %d queued turn(s)"
                                " left to its next holder", conversation_id,
                                len(slot.turns))  # fmt: skip
                    for left in slot.turns:
                        self._messages.pop(left.message_id, None)
                        self._steering.pop(left.message_id, None)  # (the next holder sees)
                    slot.turns.clear()
                    slot.known.clear()
                    break
                turn = slot.turns[0]
                try:
                    ran = await self._run_turn(conversation_id, turn)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    # (The turn's own failures end it, recorded: this is its set-up, the
                    # store mostly.)  Left queued for the next holder, a few times.
                    tries = self._failed[turn.message_id] = self._failed.get(turn.message_id, 0) + 1
                    given_up = tries >= _ATTEMPTS
                    log.exception("cluster: conversation %s: queued turn %s could not start%s",
                                  conversation_id, turn.run_id,
                                  "; dropped" if given_up else "; tried again later")  # fmt: skip
                    ran = given_up
                slot.turns.popleft()
                if not ran:
                    # No front end here for it, or it could not start: let another
                    # worker (or this one, later) take the conversation and claim it.
                    for left in slot.turns:
                        self._messages.pop(left.message_id, None)
                        self._steering.pop(left.message_id, None)  # (the next holder sees)
                    slot.turns.clear()
                    slot.known.clear()
                    await self._release(conversation_id)
                    break
                self._failed.pop(turn.message_id, None)
                self._done.add(turn.message_id)
                self._done_order.append(turn.message_id)
                if len(self._done_order) > _DONE_KEPT:
                    self._done.discard(self._done_order.popleft())
                with contextlib.suppress(Exception):
                    await self.store.queue_done([turn.message_id])
                slot.known.discard(turn.message_id)
        finally:
            slot.task = None
            slot.idle_since = time.monotonic()

    async def _run_turn(self, conversation_id: str, turn: QueuedTurn) -> bool:
        """Run one claimed turn to its end; ``False`` when no front end here runs it."""
        store = self.store
        # A turn claimed before (its worker died or lost the lease) may have run, or
        # started: its end is looked up, and it runs again from what it committed.
        again = turn.attempts > 1
        if await store.turn_ended(conversation_id, turn.run_id):
            if not again:
                # Withdrawn before it started (:meth:`withdraw`): it never runs, and
                # whoever follows its run hears that it ended.
                self._messages.pop(turn.message_id, None)
                conv = await self.agent.get_conversation(conversation_id)
                conv.announce_withdrawn(turn.run_id)
                log.info("cluster: conversation %s: queued turn %s was withdrawn",
                         conversation_id, turn.run_id)  # fmt: skip
            return True  # it ran to its end (or was withdrawn): once is enough
        if turn.payload.get("steer") and await self._steered(conversation_id, turn):
            self._messages.pop(turn.message_id, None)
            return True  # it joined the running turn: answered there
        message = await self._message(conversation_id, turn)
        self._messages.pop(turn.message_id, None)
        if message is None:
            return True  # its message is gone (the conversation was deleted)
        via = str(turn.payload.get("via", ""))
        admit = self._front_ends.get(via)
        if admit is None:
            log.warning("cluster: no front end %r on this worker for a queued turn of %s",
                        via, conversation_id)  # fmt: skip
            return False
        conv = await self.agent.get_conversation(conversation_id)
        admitted = await admit(conv, turn, message)
        branch_of = message.data.get("branch_of") if isinstance(message.data, dict) else None
        if admitted is not None and isinstance(branch_of, int):
            # Regenerate or edit, queued: the branch is made here, where the turns
            # run, just before its turn (the worker that took the request checked
            # that nothing ran or waited; another message queued meanwhile makes it
            # a plain question: see Conversation.branch_at).
            if not await conv.branch_at(branch_of):
                log.warning("cluster: conversation %s: run %s asked for a branch at row %d,"
                            " no longer the last question: asked after what is there",
                            conversation_id, turn.run_id, branch_of)  # fmt: skip
        if admitted is None:
            conv.resume([message], mode="drop", outcome="refused")
        elif again:
            allow_tool, settings = admitted
            if conv.resume([message], mode="answer", allow_tool=allow_tool, settings=settings):
                self.ran += 1
        else:
            allow_tool, settings = admitted
            if conv.run_committed(message, allow_tool=allow_tool, settings=settings):
                self.ran += 1
        await conv.wait_idle()
        return True

    # -- the keeper -----------------------------------------------------------------------
    async def _keep(self) -> None:
        loop = asyncio.get_running_loop()
        await self._scan()  # what was queued before this worker started
        while True:
            started = loop.time()
            try:
                await self._round()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("cluster: a round of the conversation leases failed")
            await asyncio.sleep(max(0.0, self.settings.heartbeat_seconds - (loop.time() - started)))

    async def _round(self) -> None:
        """Renew what is held (one statement), let go of idle conversations, take up
        queued turns of conversations whose lease is free."""
        now = time.monotonic()
        for cid in list(self._held):
            slot = self._slots.get(cid)
            busy = slot is not None and (slot.task is not None or bool(slot.turns))
            conv = self.agent.services.find(cid)
            busy = busy or (conv is not None and conv.busy)  # a turn submitted here directly
            busy = busy or cid in self._submitting  # a turn being queued here now
            idle_since = slot.idle_since if slot is not None else self._renewed.get(cid, now)
            if not busy and now - idle_since >= self.idle_release:
                await self._release(cid)
        held = [(conversation_lease(cid), lease.epoch) for cid, lease in self._held.items()]
        if held:
            sent = time.monotonic()
            try:
                # As long as the fencing margin allows: a slow database (a loaded
                # machine) delays a renewal without losing the lease.
                beat, ttl = self.settings.heartbeat_seconds, self.settings.lease_seconds
                async with asyncio.timeout(max(beat, ttl - 2 * beat, 0.5)):
                    renewed = set(
                        await self.store.lease_renew_many(
                            held, self.worker, self.settings.lease_seconds
                        )
                    )
            except Exception as exc:
                log.warning("cluster: renewing the conversation leases failed: %s", exc)
            else:
                for name, _ in held:
                    cid = name[len(CONVERSATION_PREFIX) :]
                    if name in renewed:
                        self._renewed[cid] = sent
                    elif cid in self._held:
                        log.warning("cluster: conversation %s: lease lost", cid)
                        self._forget(cid)
        if not self._closing:
            await self._scan()
        try:
            self._stats = await self.store.queue_stats()
        except Exception:
            self._stats = None
        if self.on_round is not None and self._stats is not None:
            self.on_round(self._stats.depth, len(self._held))

    def _forget(self, conversation_id: str) -> None:
        self._held.pop(conversation_id, None)
        self._renewed.pop(conversation_id, None)
        slot = self._slots.get(conversation_id)
        if slot is not None and slot.task is None:
            del self._slots[conversation_id]

    async def _release(self, conversation_id: str) -> None:
        lease = self._held.get(conversation_id)
        self._forget(conversation_id)
        if lease is None:
            return
        with contextlib.suppress(Exception):
            await self.store.lease_release(
                conversation_lease(conversation_id), self.worker, lease.epoch
            )

    # -- what /health shows ---------------------------------------------------------------
    @property
    def held(self) -> int:
        """Conversation leases this worker holds now."""
        return len(self._held)

    def view(self) -> dict[str, Any]:
        """The turn queue part of ``/health``'s ``cluster`` section (as last read)."""
        stats = self._stats
        return {
            "conversations_held": len(self._held),
            "queue_depth": stats.depth if stats is not None else None,
            "queue_waiting": stats.waiting if stats is not None else None,
            "queue_oldest_age": round(stats.oldest_age, 3) if stats is not None else None,
            "queued_turns_run": self.ran,
            "queued_turns_taken_over": self.taken_over,
        }
