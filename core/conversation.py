"""A conversation: ordered turns over a persistent dual log, and its events.

``send`` is fire-and-forget: it commits the user message to the audit log,
queues a turn and returns the turn's run id.  One worker task per busy
conversation runs the queued turns strictly one at a time, in arrival order;
it exits when the queue is empty (idle conversations cost no task).

A conversation owns its parts — its
:class:`~agentik.core.workingmemory.WorkingMemory` and its
:class:`~agentik.core.services.ConversationEvents` — and gets the agent's
:class:`~agentik.core.services.AgentServices`; it hands them to each turn
and compaction as :class:`~agentik.core.services.ConversationParts`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import functools
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .errors import ClosedError, PromptRefused
from .eventbus import Subscription
from .events import Compacted, TextDelta, TurnEnded, TurnStarted
from .hooks import Refuse
from .messages import ChatMessage, Message, MessageKind, NewMessage
from .services import AgentServices, ConversationEvents, ConversationParts, kinds_of
from .store.base import ConversationRecord, Store, TurnEnd
from .tools.base import TurnPolicy
from .turn import TurnRunner
from .workingmemory import WorkingMemory

if TYPE_CHECKING:
    from .agent import Agent
    from .questions import Question

__all__ = ["RESUME_MODES", "Capabilities", "Conversation", "ConversationState", "ResumeMode"]

log = logging.getLogger(__name__)


class ConversationState(enum.Enum):
    """Lifecycle of a :class:`Conversation`."""

    OPEN = "open"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What this conversation's model can take and give besides text."""

    image_in: bool = False
    image_out: bool = False


@dataclass(slots=True)
class _Pending:
    run_id: str
    content: str
    author: str | None
    committed: asyncio.Future[list[Message]]
    in_memory: bool = False
    #: A turn resumed after a restart, for a message committed before it.
    resumed: bool = False
    #: Which tools this turn may offer, within the policy (``None``: all it allows).
    allow_tool: Callable[[str], bool] | None = None


@dataclass(slots=True)
class _Job:
    """Work that must not overlap a turn (compaction), run in queue order."""

    fn: Callable[[], Awaitable[Any]]
    done: asyncio.Future[Any]
    #: A job answers no user message itself.
    run_id: None = None


#: What to do with a message a crash left unanswered (see :meth:`Conversation.resume`).
ResumeMode = Literal["answer", "note", "drop"]
RESUME_MODES: tuple[str, ...] = ("answer", "note", "drop")

#: How many recent speakers a conversation remembers (their memory is visible).
MAX_SPEAKERS = 32


def _new_run_id() -> str:
    return f"run_{uuid.uuid4().hex[:20]}"


class Conversation:
    """One persistent conversation.  Obtain it from :class:`~agentik.core.agent.Agent`.

    ``fresh``: just created, so its working memory is known to be empty.
    """

    def __init__(
        self,
        services: AgentServices,
        record: ConversationRecord,
        *,
        store: Store,
        temp: bool = False,
        channel_key: str | None = None,
        fresh: bool = False,
    ) -> None:
        self._services = services
        self.agent: Agent = services.agent
        self.id = record.id
        self.title = record.title
        self.created_at = record.created_at
        self.updated_at = record.updated_at
        self.temp = temp
        self.channel_key = channel_key
        #: Per-conversation override of the agent's :class:`TurnPolicy`.
        self.policy: TurnPolicy | None = None
        #: Text added after the agent's system prompt in this conversation's
        #: requests (a channel's persona, set by the bridge); read at each request.
        self.system_addition: str | None = None
        #: The model profile (``[llm.profiles.<name>]``) this conversation's turns
        #: use; ``None``: the agent's main backend.  Read at each request.
        self.llm_profile: str | None = None
        self.state = ConversationState.OPEN
        self._store = store
        self._queue: deque[_Pending | _Job] = deque()
        # The memory sees the turn queue (whose messages are not orphans).
        self._memory = WorkingMemory(
            store, record.id, queue=self._queue, fresh=fresh, scrub=self._scrub
        )
        self._events: ConversationEvents | None = None  # created on first use
        self._worker: asyncio.Task[None] | None = None
        self._runner: TurnRunner | None = None
        self._current: asyncio.Task[None] | None = None
        # Recent speakers' author ids, in order (a dict as an ordered set).
        self._speakers: dict[str, None] = {}
        self._speakers_loaded = False
        #: Run ids resumed by this process (each is resumed at most once).
        self._resumed: set[str] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    def __repr__(self) -> str:
        return f"<Conversation {self.id} {self.title!r}{' temp' if self.temp else ''}>"

    @property
    def parts(self) -> ConversationParts:
        """This conversation's engine parts (working memory, event stream, the
        agent's services), as the turn engine gets them."""
        return ConversationParts(self, self._memory, self._event_stream(), self._services)

    @property
    def capabilities(self) -> Capabilities:
        llm = self.agent.llm_for(self.llm_profile)  # the model this conversation's turns use
        return Capabilities(
            image_in=bool(llm.supports_image_in),
            image_out=bool(llm.supports_image_out),
        )

    @property
    def busy(self) -> bool:
        """Whether a turn is running or queued."""
        return not self._idle.is_set()

    @property
    def queued(self) -> int:
        """Turns waiting behind the running one."""
        return max(0, len(self._queue) - (1 if self._current is not None else 0))

    @property
    def running_run_id(self) -> str | None:
        return self._runner.run_id if self._runner is not None else None

    @property
    def interrupting(self) -> bool:
        """Whether the running turn has already been asked to stop."""
        return self._runner is not None and self._runner.interrupt_requested

    @property
    def awaiting_human(self) -> bool:
        """Whether the running turn waits for a person: a question (``ask_user``)
        or an approval (the ``awaiting_human`` state)."""
        return self._services.questions.waiting(self.id) or (
            self._runner is not None and self._runner.waiting_for_human()
        )

    def pending_questions(self) -> list[Question]:
        """The questions (``ask_user``) this conversation's turn waits for, oldest first."""
        return self._services.questions.pending(self.id)

    async def answer(
        self, content: str, *, author: str | None = None, author_id: str | None = None
    ) -> Question | None:
        """Answer the oldest waiting question ``author`` may answer with ``content``.

        ``None``: no question waits for this author (``content`` is an ordinary
        message).  The ``before_prompt`` hooks see the answer first; a refusal
        raises :class:`~agentik.core.errors.PromptRefused` (the question still
        waits).  :meth:`send` does this first, so a message to a conversation
        whose turn asked a question answers it instead of queueing a turn.
        """
        self._check_open()
        questions = self._services.questions
        if questions.answerable(self.id, author, author_id) is None:
            return None
        # An answer is a prompt too: plugins' before_prompt hooks see (and may refuse) it.
        outcome = await self._services.hooks.before_prompt(self, content, author, author_id)
        if isinstance(outcome, Refuse):
            raise PromptRefused(outcome.message)
        return await questions.answer(self.id, outcome, author=author, author_id=author_id)

    def _check_open(self) -> None:
        if self.state is ConversationState.CLOSED:
            raise ClosedError(f"conversation {self.id} is closed")
        self._services.check_running()

    # -- sending ----------------------------------------------------------------
    async def send(
        self,
        content: str,
        *,
        author: str | None = None,
        author_id: str | None = None,
        channel: str | None = None,
        allow_tool: Callable[[str], bool] | None = None,
    ) -> str:
        """Record ``content`` as a user message and queue a turn; return its run id.

        Returns once the message is committed to the audit log (it survives a
        crash from then on).  The turn runs after every turn queued before it.
        ``author`` is the speaker's display name, ``author_id`` their identity
        qualified by transport (``libera:alice``; it selects their long-term
        memory scope); ``channel`` defaults to the conversation's channel key.
        ``allow_tool`` narrows the tools this turn offers the model, within the
        conversation's policy (the speaker's rights: :mod:`agentik.core.access`).

        When the running turn waits for an answer (``ask_user``) that this
        author may give, ``content`` answers it instead (see :meth:`answer`) and
        the waiting turn's run id is returned.
        """
        self._check_open()
        if not isinstance(content, str):
            raise TypeError("content must be a str")
        if self._services.questions.waiting(self.id):
            # The turn asked (ask_user): the asked person's message is the answer.
            answered = await self.answer(content, author=author, author_id=author_id)
            if answered is not None:
                return answered.run_id
        outcome = await self._services.hooks.before_prompt(self, content, author, author_id)
        if isinstance(outcome, Refuse):
            raise PromptRefused(outcome.message)
        content = self._scrub("user", outcome)
        run_id = _new_run_id()
        now = time.time()
        entry = NewMessage(
            kind="user",
            content=content,
            author=author,
            channel=channel or self.channel_key,
            run_id=run_id,
            data={"author_id": author_id} if author_id else None,
            created_at=now,
        )
        self._add_speaker(author_id)
        # When nothing is queued (and the working memory is loaded, so
        # messages a crash left out are already folded in) this message's turn
        # is next: it joins the working memory in the same transaction.
        memory = self._memory
        idle = not self._queue and memory.loaded
        notes = memory.take_notes() if idle else []
        stored = (
            [*notes, ChatMessage(role="user", content=content, author=author, message_id=-1)]
            if idle
            else []
        )
        # The write runs in its own task, queued now, so the order of the audit
        # log matches the order of the turn queue even under concurrent sends.
        committed = asyncio.ensure_future(
            self._store.append(self.id, log=[entry], memory=stored, updated_at=now)
        )
        if idle:
            memory.extend([*notes, ChatMessage(role="user", content=content, author=author)])
            committed.add_done_callback(memory.invalidate_on_failure)
        self._enqueue(_Pending(run_id, content, author, committed, idle, allow_tool=allow_tool))
        await asyncio.shield(committed)
        self.updated_at = now
        return run_id

    # -- resuming after a restart -------------------------------------------------
    def resume(
        self,
        messages: Sequence[Message],
        *,
        mode: ResumeMode = "answer",
        outcome: str | None = None,
        allow_tool: Callable[[str], bool] | None = None,
    ) -> list[str]:
        """Take up committed user messages whose turn a crash or shutdown cut off.

        ``messages`` come from :meth:`Agent.pending_turns` (rows of this
        conversation's audit log; nothing is recorded again).  ``answer``
        queues each one's turn, with the message's own run id, in order and
        before anything sent later; a turn that was mid-stream restarts from
        what was committed (its partial answer stays in the audit log, marked
        interrupted).  ``note`` posts a short notice instead ("I was
        restarted and did not answer …") as that run's answer; ``drop``
        records the turn as dropped and says nothing.  Either way the turn's
        end is recorded, so no message is taken up twice, and this process
        never takes the same run id up twice (a second call is a no-op).
        Returns the run ids whose events (a turn or a notice) will follow.
        ``allow_tool`` narrows the tools of the resumed turns, as in :meth:`send`.
        """
        self._check_open()
        if mode not in RESUME_MODES:
            raise ValueError(f"unknown resume mode {mode!r} (known: {', '.join(RESUME_MODES)})")
        queued: list[str] = []
        for m in messages:
            if m.conversation_id != self.id or m.kind != "user" or not m.run_id:
                raise ValueError(f"message {m.id} is not a user turn of conversation {self.id}")
            if m.run_id in self._resumed:
                continue
            self._resumed.add(m.run_id)
            if mode == "answer":
                done = asyncio.get_running_loop().create_future()
                done.set_result([m])
                self._enqueue(_Pending(m.run_id, m.content, m.author, done, resumed=True,
                                       allow_tool=allow_tool))  # fmt: skip
                queued.append(m.run_id)
            elif mode == "note":
                self._enqueue(
                    self._job(functools.partial(self._resume_note, m, outcome or "noted"))
                )
                queued.append(m.run_id)
            else:
                self._enqueue(
                    self._job(functools.partial(self._resume_drop, m, outcome or "dropped"))
                )
        return queued

    def _job(self, fn: Callable[[], Awaitable[Any]]) -> _Job:
        done = asyncio.get_running_loop().create_future()
        # Nobody awaits it: its outcome is logged, never raised.
        done.add_done_callback(_log_job_failure)
        return _Job(fn, done)

    async def _resume_note(self, m: Message, outcome: str) -> None:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(m.created_at))
        who = f"{m.author}'s" if m.author else "a"
        text = f"I was restarted and did not answer {who} message from {when}; please ask again."
        emit = self._event_stream().emit
        emit(TurnStarted, m.run_id, message_id=m.id, author=m.author)
        now = time.time()
        try:
            await self._store.append(
                self.id,
                log=[
                    NewMessage(
                        kind="assistant",
                        content=text,
                        channel=self.channel_key,
                        run_id=m.run_id,
                        data={"resume": outcome},
                        created_at=now,
                    )
                ],
                updated_at=now,
                ended=TurnEnd(m.run_id or "", outcome),
            )
        except Exception:
            emit(TurnEnded, m.run_id, stop_reason="error")
            raise
        emit(TextDelta, m.run_id, text=text)
        await self._services.approvals.run_ended(self.parts, m.run_id or "")
        await self._services.questions.run_ended(self.parts, m.run_id or "")
        emit(TurnEnded, m.run_id, stop_reason="stop", text=text)

    async def _resume_drop(self, m: Message, outcome: str) -> None:
        await self._store.append(self.id, ended=TurnEnd(m.run_id or "", outcome))
        await self._services.approvals.run_ended(self.parts, m.run_id or "")
        await self._services.questions.run_ended(self.parts, m.run_id or "")
        log.info("conversation %s: unanswered message %d %s", self.id, m.id, outcome)

    async def note(
        self,
        content: str,
        *,
        author: str | None = None,
        author_id: str | None = None,
        channel: str | None = None,
        keep: int = 50,
    ) -> None:
        """Record something said in the channel without answering it (ambient context).

        It goes to the audit log at once and reaches the model with the next
        turn, before that turn's message; at most the last ``keep`` notes
        wait for a turn (older ones stay in the audit log only).
        """
        self._check_open()
        now = time.time()
        content = self._scrub("user", content)
        rows = await self._store.append(
            self.id,
            log=[
                NewMessage(
                    kind="user",
                    content=content,
                    author=author,
                    channel=channel or self.channel_key,
                    data={"ambient": True, **({"author_id": author_id} if author_id else {})},
                    created_at=now,
                )
            ],
            updated_at=now,
        )
        self._memory.add_note(
            ChatMessage(role="user", content=content, author=author, message_id=rows[0].id),
            keep=keep,
        )
        self._add_speaker(author_id)

    def _scrub(self, kind: str, text: str) -> str:
        """``text`` as the ``before_store`` hooks leave it."""
        return self._services.hooks.before_store(kind, text, self.id)

    def redacted(
        self, message_id: int, content: str, kind: str, call_id: str | None, old: str
    ) -> None:
        """The store redacted audit row ``message_id`` (see :meth:`Agent.redact
        <agentik.core.agent.Agent.redact>`): the cached context gets the tombstone."""
        self._memory.redact(message_id, content, kind, call_id, old)
        # A queued turn's message, not in working memory yet: its turn adds it.
        for item in self._queue:
            if not isinstance(item, _Pending):
                continue
            if item.committed.done() and not item.committed.cancelled():
                if item.committed.exception() is None:
                    rows = item.committed.result()
                    for i, row in enumerate(rows):
                        if row.id == message_id:
                            rows[i] = dataclasses.replace(row, content=content)

    # -- speakers -------------------------------------------------------------
    def _add_speaker(self, author_id: str | None) -> None:
        if not author_id:
            return
        self._speakers.pop(author_id, None)
        self._speakers[author_id] = None
        while len(self._speakers) > MAX_SPEAKERS:
            del self._speakers[next(iter(self._speakers))]

    async def speakers(self) -> tuple[str, ...]:
        """Who spoke here recently (``author_id`` values), most recent last.

        Loaded from the audit log on first use, so it survives restarts.
        """
        if not self._speakers_loaded:
            recent = await self._store.messages(self.id, kinds=["user"], limit=200)
            known, self._speakers = self._speakers, {}
            for m in recent:
                if isinstance(m.data, dict) and m.data.get("author_id"):
                    self._add_speaker(str(m.data["author_id"]))
            for who in known:  # said since: more recent than the log's
                self._add_speaker(who)
            self._speakers_loaded = True
        return tuple(self._speakers)

    def _enqueue(self, item: _Pending | _Job) -> None:
        """Queue a turn or a job; start the worker if none runs."""
        self._queue.append(item)
        self._idle.clear()
        if self._worker is None:
            # Busy conversations stay referenced even if no caller holds them.
            self._services.mark_busy(self)
            self._worker = asyncio.create_task(self._work(), name=f"agentik-conversation:{self.id}")

    async def _work(self) -> None:
        parts = self.parts
        try:
            while self._queue:
                pending = self._queue[0]
                if isinstance(pending, _Job):
                    await self._run_job(pending)
                    continue
                try:
                    stored = await pending.committed
                except Exception:
                    self._queue.popleft()  # send() already raised to its caller
                    continue
                runner = TurnRunner(
                    parts,
                    run_id=pending.run_id,
                    message=stored[0],
                    policy=self.policy or self._services.policy,
                    tools=self._services.tools,
                    in_memory=pending.in_memory,
                    resumed=pending.resumed,
                    allow_tool=pending.allow_tool,
                )
                self._runner = runner
                self._current = asyncio.create_task(
                    runner.run(), name=f"agentik-turn:{pending.run_id}"
                )
                try:
                    await self._current
                finally:
                    self._queue.popleft()
                    self._runner = self._current = None
        finally:
            self._worker = None
            self._services.mark_idle(self)
            if not self._queue:
                self._idle.set()

    async def _run_job(self, job: _Job) -> None:
        try:
            result = await job.fn()
        except asyncio.CancelledError:
            if not job.done.done():
                job.done.cancel()
            raise
        except Exception as exc:
            if not job.done.done():
                job.done.set_exception(exc)
        else:
            if not job.done.done():
                job.done.set_result(result)
        finally:
            self._queue.popleft()

    async def run_exclusive(self, fn: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``fn()`` in the turn queue: after the turns queued before, before later ones.

        For work that must not overlap a turn (forced compaction).
        """
        self._check_open()
        job = _Job(fn, asyncio.get_running_loop().create_future())
        self._enqueue(job)
        return await job.done

    async def compact_now(self) -> Compacted | None:
        """Compact the working memory now, whatever its size (``!compact``).

        Returns the :class:`~agentik.core.events.Compacted` event, or ``None``
        when there was nothing old enough to compact.
        """
        compactor = self._services.compactor
        event: Compacted | None = await self.run_exclusive(
            lambda: compactor.compact(self.parts, reason="forced")
        )
        return event

    async def interrupt(self) -> bool:
        """Stop the running turn; return once it has stopped.

        The model's stream is closed and running tool calls are cancelled;
        the partial answer is kept, marked interrupted.  Queued turns still
        run.  Returns ``False`` if no turn was running.
        """
        task, runner = self._current, self._runner
        if task is None or runner is None or task.done():
            return False
        runner.interrupt_requested = True
        task.cancel()
        await asyncio.wait([task])
        return True

    async def wait_idle(self) -> None:
        """Wait until no turn is running or queued."""
        await self._idle.wait()

    # -- events ---------------------------------------------------------------
    def _event_stream(self) -> ConversationEvents:
        if self._events is None:
            # It holds this conversation: while subscribed to, it stays in memory.
            self._events = ConversationEvents(
                self.id,
                self._services,
                owner=self,
                closed=self.state is ConversationState.CLOSED,
            )
        return self._events

    def events(
        self,
        *,
        after: int | None = None,
        profile: str = "debug",
        kinds: Iterable[str] | None = None,
        max_pending: int | None = None,
    ) -> Subscription:
        """Live events of this conversation (an async iterator).

        With ``after=seq`` a reconnecting subscriber first receives the
        buffered events it missed, or an ``events_lost`` notice if the buffer
        no longer reaches back that far.  ``profile`` picks a kind set from
        :data:`~agentik.core.events.PROFILES` (``chat``, ``debug``,
        ``metrics``); ``kinds`` overrides it.  ``max_pending`` bounds how far
        this subscriber may fall behind before it is told and cut off.
        """
        return self._event_stream().subscribe(
            after=after, kinds=kinds_of(profile, kinds), max_pending=max_pending
        )

    # -- history and working memory ------------------------------------------------
    async def messages(
        self,
        *,
        after: int | None = None,
        before: int | None = None,
        offset: int | None = None,
        limit: int = 100,
        kinds: Sequence[MessageKind] | None = None,
    ) -> list[Message]:
        """A page of the audit log, oldest first (see :meth:`Store.messages`)."""
        return await self._store.messages(
            self.id, after=after, before=before, offset=offset, limit=limit, kinds=kinds
        )

    async def count_messages(self) -> int:
        """Number of audit-log rows."""
        return await self._store.count_messages(self.id)

    async def working_memory(self) -> list[ChatMessage]:
        """The current LLM context (without the system prompt)."""
        return [e.message for e in await self._store.load_memory(self.id)]

    async def compact(self, upto: int, summary: str) -> None:
        """Replace working-memory entries up to position ``upto`` with ``summary``.

        The summary keeps the highest audit-log id it covers, so messages it
        replaced are never mistaken for ones a crash left out.
        """
        memory = self._memory
        await memory.compact(await memory.entries(), upto, summary)

    # -- metadata and lifecycle ----------------------------------------------------
    async def rename(self, title: str) -> None:
        self._check_open()
        title = self._scrub("title", title)
        await self._store.update_conversation(self.id, title=title)
        self.title = title

    async def aclose(self, *, drain: bool = False) -> None:
        """Close: with ``drain``, let queued turns finish; else interrupt them.

        Queued user messages stay in the audit log either way (and reach the
        model as context next time).  Subscribers' streams end.
        """
        if self.state is ConversationState.CLOSED:
            return
        if drain:
            await self.wait_idle()
        self.state = ConversationState.CLOSED
        await self._services.session_end(self, "closed")
        worker = self._worker
        if worker is not None:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
        for item in self._queue:
            if isinstance(item, _Job) and not item.done.done():
                item.done.cancel()
        self._queue.clear()
        self._idle.set()
        if self._events is not None:
            self._events.close()
        self._services.forget(self)

    async def __aenter__(self) -> Conversation:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _log_job_failure(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.error("resuming an unanswered message failed: %s", fut.exception())
