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
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from .approvals import RESTARTED
from .attachments import check, part_for
from .checkpoints import checkpoint_document, take_checkpoint
from .errors import AttachmentRejected, BranchError, ClosedError, NotFound, PromptRefused
from .eventbus import Subscription
from .events import (
    Compacted,
    ConversationEnded,
    RunStreamEnd,
    StatusChanged,
    StatusState,
    TextDelta,
    TurnEnded,
    TurnStarted,
)
from .hooks import Refuse
from .memory import RecallPolicy
from .messages import (
    ChatMessage,
    Content,
    FilePart,
    ImagePart,
    Message,
    MessageKind,
    NewMessage,
    Usage,
    split_content,
)
from .questions import may_answer
from .runs import new_run_id
from .services import AgentServices, ConversationEvents, ConversationParts, profile_of
from .store.base import ConversationRecord, Store, TurnEnd
from .store.records import CheckpointRecord
from .streamprofiles import StreamProfile
from .tools.base import TurnPolicy
from .turn import Steered, TurnRunner
from .turnsettings import DEFAULT_SETTINGS, DeprecatedSetting, TurnSettings
from .workingmemory import WorkingMemory

if TYPE_CHECKING:
    from .questions import Checklist, FormProgress, Question
    from .services import AgentLike

__all__ = [
    "BUSY_MODES",
    "RESUME_MODES",
    "BusyMode",
    "Capabilities",
    "Conversation",
    "ConversationState",
    "ConversationStatus",
    "ResumeMode",
    "Sent",
    "new_run_id",
]

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


#: What a message that arrives while a turn runs does (:meth:`Conversation.submit`):
#: ``queue`` waits for its own turn, ``steer`` joins the running turn at its next
#: model request (else it queues), ``interrupt`` stops the running turn and gets a
#: new one.
BusyMode = Literal["queue", "steer", "interrupt"]
BUSY_MODES: tuple[str, ...] = ("queue", "steer", "interrupt")


@dataclass(frozen=True, slots=True)
class Sent:
    """What :meth:`Conversation.submit` did with a message: the run that answers it,
    whether it joined the running turn (``steered``), whether it stopped one."""

    run_id: str
    steered: bool = False
    interrupted: bool = False


@dataclass(frozen=True, slots=True)
class ConversationStatus:
    """What a conversation is doing now (:meth:`Conversation.status`)."""

    conversation_id: str
    state: StatusState
    #: The running turn (``None`` when idle).
    run_id: str | None = None
    #: The tool calls running (by name).
    tools: tuple[str, ...] = ()
    #: Turns waiting behind the running one.
    queued: int = 0
    #: Tokens the running turn used so far (every model request of it).
    usage: Usage = field(default_factory=Usage)
    #: Model requests the running turn made so far.
    requests: int = 0
    #: The conversation's checklist (the ``todo`` tool), when asked for and it has one.
    todo: Checklist | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "conversation_id": self.conversation_id,
            "state": self.state,
            "run_id": self.run_id,
            "tools": list(self.tools),
            "queued": self.queued,
            "usage": self.usage.to_dict(),
            "requests": self.requests,
            "todo": self.todo.to_dict() if self.todo is not None else None,
        }

    def line(self) -> str:
        """One line for a chat channel."""
        state = self.state.replace("_", " ")
        if self.tools:
            state += f" ({', '.join(self.tools)})"
        parts = [state]
        if self.run_id:
            u = self.usage
            parts.append(
                f"run {self.run_id}, {self.requests} model requests, "
                f"{u.prompt_tokens}+{u.completion_tokens} tokens"
            )
        if self.queued:
            parts.append(f"{self.queued} queued")
        if self.todo is not None and self.todo.items:
            parts.append(self.todo.line())
        return " · ".join(parts)


class _Scrubber:
    """The ``before_store`` hooks for one conversation's writes.

    Holds the services, not the conversation: the working memory must not
    hold its conversation (the agent's registry of open conversations is
    weak, and a cycle would keep a dropped one alive).  Slotted: 48 bytes
    per conversation where a closure and its cells took 160.
    """

    __slots__ = ("conversation_id", "services")

    def __init__(self, services: Any, conversation_id: str) -> None:
        self.services = services
        self.conversation_id = conversation_id

    def __call__(self, kind: str, text: str) -> str:
        return str(self.services.hooks.before_store(kind, text, self.conversation_id))


#: The metadata of a conversation whose record has none (most): one shared view.
_NO_META: Mapping[str, Any] = MappingProxyType({})


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
    #: What the turn runs with (its front end's, or the conversation's default).
    settings: TurnSettings = DEFAULT_SETTINGS
    #: The run the message's audit-log row is linked to, when not ``run_id``: a
    #: steering message the turn it was sent into did not reach (so it is not
    #: taken for a message a crash left out).
    message_run_id: str | None = None
    #: The message as it will be stored (id 0), when it joined the working memory with
    #: its own write: the turn may start before that write commits (see
    #: :class:`~agentik.core.turn.TurnRunner`'s ``question``).
    early: Message | None = None


@dataclass(slots=True)
class _Job:
    """Work that must not overlap a turn (compaction), run in queue order."""

    fn: Callable[[], Awaitable[Any]]
    done: asyncio.Future[Any]
    #: A job answers no user message itself.
    run_id: None = None
    message_run_id: None = None


#: What to do with a message a crash left unanswered (see :meth:`Conversation.resume`).
ResumeMode = Literal["answer", "note", "drop"]
RESUME_MODES: tuple[str, ...] = ("answer", "note", "drop")

#: How many recent speakers a conversation remembers (their memory is visible).
MAX_SPEAKERS = 32


class Conversation:
    """One persistent conversation.  Obtain it from :class:`~agentik.core.agent.Agent`.

    ``fresh``: just created, so its working memory is known to be empty.
    """

    # Deprecated views of the default :attr:`settings` (setting one warns and changes them).
    policy: DeprecatedSetting[TurnPolicy | None] = DeprecatedSetting()
    system_addition: DeprecatedSetting[str | None] = DeprecatedSetting()
    llm_profile: DeprecatedSetting[str | None] = DeprecatedSetting()
    system_prompt: DeprecatedSetting[str | None] = DeprecatedSetting()
    recall: DeprecatedSetting[RecallPolicy | None] = DeprecatedSetting()

    def __init__(
        self,
        services: AgentServices[Conversation],
        record: ConversationRecord,
        *,
        store: Store,
        temp: bool = False,
        channel_key: str | None = None,
        fresh: bool = False,
    ) -> None:
        self._services = services
        self.agent: AgentLike[Conversation] = services.agent
        self.id = record.id
        self.title = record.title
        self.created_at = record.created_at
        self.updated_at = record.updated_at
        #: The stored record's metadata (read-only; a child run's conversation
        #: names its parent: ``parent_conversation_id``, ``parent_run_id``, …).
        self.meta: Mapping[str, Any] = (
            MappingProxyType(dict(record.meta)) if record.meta else _NO_META
        )
        self.temp = temp
        self.channel_key = channel_key
        # The settings of a turn submitted without any (see :attr:`settings`).
        self._settings: TurnSettings = DEFAULT_SETTINGS
        self.state = ConversationState.OPEN
        self._store = store
        # A list, not a deque: an idle conversation's is empty, and an empty deque
        # costs 760 bytes (a list 56); a queue of turns is short.
        self._queue: list[_Pending | _Job] = []
        # The memory sees the turn queue (whose messages are not orphans).
        self._memory = WorkingMemory(
            store, record.id, queue=self._queue, fresh=fresh, scrub=_Scrubber(services, record.id)
        )
        self._events: ConversationEvents | None = None  # created on first use
        self._worker: asyncio.Task[None] | None = None
        self._runner: TurnRunner | None = None
        self._current: asyncio.Task[None] | None = None
        # Recent speakers' author ids, in order (a dict as an ordered set).
        self._speakers: dict[str, None] = {}
        # A conversation created here has no earlier speakers to read (a Slack
        # thread's first turn was one more read of the audit log).
        self._speakers_loaded = fresh
        #: Run ids resumed by this process (each is resumed at most once).
        self._resumed: set[str] | None = None  # made by the first resume (216 bytes empty)
        # Whether turns are running or queued; who waits for the end of that waits on
        # ``_idle`` (made by the first wait: an idle conversation holds no event).
        self._busy = False
        self._idle: asyncio.Event | None = None
        #: The last state reported by a ``status_changed`` event.
        self._state: StatusState = "idle"
        #: Not stored yet: the first message's write creates it (a child run's, or a
        #: new channel's: then bound to ``_unstored_key`` in the same write).
        self._unstored: ConversationRecord | None = None
        self._unstored_key: str | None = None
        #: Called once it is stored, or closed without ever being stored (the agent
        #: forgets its pending binding).
        self._on_stored: Callable[[Conversation], None] | None = None

    def __repr__(self) -> str:
        return f"<Conversation {self.id} {self.title!r}{' temp' if self.temp else ''}>"

    @property
    def parts(self) -> ConversationParts[Conversation]:
        """This conversation's engine parts (working memory, event stream, the
        agent's services), as the turn engine gets them."""
        return ConversationParts(self, self._memory, self._event_stream(), self._services)

    @property
    def settings(self) -> TurnSettings:
        """The settings of a turn submitted without any (``settings=None``): all the
        agent's unless set here (front ends pass their own with each message)."""
        return self._settings

    @settings.setter
    def settings(self, value: TurnSettings) -> None:
        if not isinstance(value, TurnSettings):
            raise TypeError("settings must be a TurnSettings")
        self._settings = value

    @property
    def capabilities(self) -> Capabilities:
        """What the model of a turn with the default :attr:`settings` takes and gives
        (:meth:`capabilities_for` another turn's)."""
        return self.capabilities_for(self._settings)

    def capabilities_for(self, settings: TurnSettings | None) -> Capabilities:
        """What the model of a turn with ``settings`` takes and gives."""
        profile = (settings or self._settings).llm_profile
        llm = self.agent.llm_for(profile)  # the model such a turn uses
        return Capabilities(
            image_in=bool(llm.supports_image_in),
            image_out=bool(llm.supports_image_out),
        )

    @property
    def busy(self) -> bool:
        """Whether a turn is running or queued."""
        return self._busy

    @property
    def queued(self) -> int:
        """Turns waiting behind the running one."""
        return max(0, len(self._queue) - (1 if self._current is not None else 0))

    @property
    def running_run_id(self) -> str | None:
        return self._runner.run_id if self._runner is not None else None

    @property
    def running_since(self) -> int | None:
        """The ``seq`` of the ``turn_started`` of the turn running here (``None``: no
        turn runs in this process, or it has not announced its start yet)."""
        run, stream = self.running_run_id, self._events
        started = stream.turn_started if stream is not None else None
        return started[1] if started is not None and run is not None and started[0] == run else None

    @property
    def interrupting(self) -> bool:
        """Whether the running turn has already been asked to stop."""
        return self._runner is not None and self._runner.interrupt_requested

    @property
    def awaiting_human(self) -> bool:
        """Whether the running turn waits for a person: a question (``ask_user``)
        or an approval (the ``awaiting_human`` state)."""
        return self._services.questions.waiting(self.id) or (
            self._runner is not None and self._runner.is_awaiting_human()
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
        elsewhere = None
        if questions.answerable(self.id, author, author_id) is None:
            # Workers: the turn asking may run on another one.
            elsewhere = await questions.answerable_elsewhere(self.id, author, author_id)
            if elsewhere is None:
                return None
        # An answer is a prompt too: plugins' before_prompt hooks see (and may refuse) it.
        outcome = await self._services.hooks.before_prompt(self, content, author, author_id)
        if isinstance(outcome, Refuse):
            raise PromptRefused(outcome.message)
        return await questions.answer(
            self.id, outcome, author=author, author_id=author_id, question=elsewhere
        )

    async def answer_form(
        self,
        answers: dict[str, Any],
        *,
        question_id: int | None = None,
        author: str | None = None,
        author_id: str | None = None,
        field: int | str | None = None,
    ) -> FormProgress | None:
        """Answer a form (a multi-question ``ask_user``) the turn waits for:
        ``question_id`` (``None``: the oldest this author may answer).

        ``field`` given: one chat line answers that field (``answers`` is
        ``{"": text}``); else ``answers`` is the whole form sent at once (field
        id -> text; empty optional fields are skipped).  ``None``: no such form
        waits for this author.  Each answer goes through the ``before_prompt``
        hooks (a refusal raises :class:`~agentik.core.errors.PromptRefused`,
        nothing is kept); a bad answer raises
        :class:`~agentik.core.questions.FormError`.
        """
        self._check_open()
        questions = self._services.questions
        if question_id is None:
            q = questions.answerable(self.id, author, author_id)
            if q is None:
                q = await questions.answerable_elsewhere(self.id, author, author_id)
        else:
            q = await questions.find_anywhere(self.id, question_id)
            if q is not None and not may_answer(q, author, author_id):
                q = None
        if q is None or not q.form:
            return None
        checked: dict[str, Any] = {}
        for key, value in answers.items():
            if isinstance(value, str) and value.strip():
                outcome = await self._services.hooks.before_prompt(self, value, author, author_id)
                if isinstance(outcome, Refuse):
                    raise PromptRefused(outcome.message)
                value = outcome
            checked[key] = value
        if field is not None:
            text = next(iter(checked.values()), "") or ""
            return await questions.answer_line(
                q, text, author=author, author_id=author_id, field=field
            )
        return await questions.answer_form(q, checked, author=author, author_id=author_id)

    # -- status ---------------------------------------------------------------------
    def status(self, *, todo: Checklist | None = None) -> ConversationStatus:
        """What this conversation is doing now: its state, running turn, tools, queue
        length and the running turn's usage so far; with ``todo`` (its checklist,
        from :meth:`todo`) in it."""
        runner = self._runner
        if runner is None or self._state == "idle":
            return ConversationStatus(self.id, "idle", queued=self.queued, todo=todo)
        return ConversationStatus(
            self.id,
            self._state,
            run_id=runner.run_id,
            tools=tuple(runner.running_tools),
            queued=self.queued,
            usage=runner.state.usage,
            requests=runner.requests,
            todo=todo,
        )

    async def todo(self) -> Checklist | None:
        """The conversation's checklist (the ``todo`` tool's last list), as stored."""
        return await self._services.agent.todos.get(self.id)

    def _report(self, runner: TurnRunner) -> None:
        """A turn changed what it does: publish ``status_changed`` if the state moved."""
        if runner.finished:
            if self.queued:
                return  # the next turn says ``running``
            state: StatusState = "idle"
        else:
            state = runner.status_state
        if state == self._state:
            return
        previous, self._state = self._state, state
        self._event_stream().emit(
            StatusChanged, runner.run_id, state=state, previous=previous,
            tools=tuple(runner.running_tools), queued=self.queued,
        )  # fmt: skip

    @contextlib.contextmanager
    def waiting_for_human(self) -> Iterator[None]:
        """Mark the running turn as waiting for a person while inside (state
        ``awaiting_human``; its time budget is paused).  Tools that ask someone
        (an approval, a question) wrap the wait in it; no-op when no turn runs."""
        runner = self._runner
        if runner is None:
            yield
            return
        with runner.waiting_for_human():
            yield

    def _check_open(self) -> None:
        if self.state is ConversationState.CLOSED:
            raise ClosedError(f"conversation {self.id} is closed")
        self._services.check_running()

    # -- sending ----------------------------------------------------------------
    async def send(
        self,
        content: Content,
        *,
        author: str | None = None,
        author_id: str | None = None,
        channel: str | None = None,
        allow_tool: Callable[[str], bool] | None = None,
        run_id: str | None = None,
        busy: BusyMode = "queue",
        settings: TurnSettings | None = None,
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
        ``run_id``: the turn's run id, when the caller picked it (a child run's).
        ``busy`` says what happens when a turn is running (see :meth:`submit`;
        a steered message returns the running turn's run id).
        ``settings``: what the turn runs with (persona, tools, model, recall,
        its origin; :class:`~agentik.core.turnsettings.TurnSettings`); ``None``:
        the conversation's default :attr:`settings`.
        """
        sent = await self.submit(
            content, author=author, author_id=author_id, channel=channel,
            allow_tool=allow_tool, busy=busy, run_id=run_id, settings=settings,
        )  # fmt: skip
        return sent.run_id

    async def steer(
        self,
        content: Content,
        *,
        author: str | None = None,
        author_id: str | None = None,
        channel: str | None = None,
        allow_tool: Callable[[str], bool] | None = None,
        settings: TurnSettings | None = None,
    ) -> str | None:
        """Send ``content`` into the running turn; its run id, or ``None`` (nothing
        recorded) when no turn can take it (see :meth:`submit`, ``busy="steer"``)."""
        sent = await self._submit(
            content, author=author, author_id=author_id, channel=channel,
            allow_tool=allow_tool, busy="steer", fallback=False, settings=settings,
        )  # fmt: skip
        return sent.run_id if sent is not None else None

    async def submit(
        self,
        content: Content,
        *,
        author: str | None = None,
        author_id: str | None = None,
        channel: str | None = None,
        allow_tool: Callable[[str], bool] | None = None,
        busy: BusyMode = "queue",
        run_id: str | None = None,
        settings: TurnSettings | None = None,
        branch: bool = False,
    ) -> Sent:
        """Like :meth:`send`, saying what became of the message (:class:`Sent`).

        ``busy`` applies when a turn is running: ``queue`` (the default) queues
        a turn; ``steer`` records the message at once, linked to the running
        run, and adds it to the working memory before that turn's next model
        request (after the tool calls running now) — when the turn can no
        longer make one (it is streaming what may be its final answer, others
        are queued behind it, the speaker's tool rights differ from the
        turn's asker's, or its ``settings`` differ from the running turn's —
        another persona, tools, model, prompt or recall; the origin is not
        compared), the message is queued as its own turn instead, and
        one the turn did not reach (it was stopped or failed first) becomes
        the next turn, with the settings of the turn it was sent into;
        ``interrupt`` queues the turn and stops the running one
        (its partial answer kept, marked interrupted).

        ``settings`` (:class:`~agentik.core.turnsettings.TurnSettings`) is what
        the turn runs with, carried by the queued turn: the turn engine reads
        nothing else, so two front ends sharing this conversation each get
        their own persona, tools and model.  ``None``: the conversation's
        default :attr:`settings`, as they are now.  The settings' ``origin``
        is recorded in the message's ``data["origin"]``.

        ``branch``: regenerate or edit and resend — ``content`` replaces the last
        question of the working memory (:meth:`last_question`), which goes out of
        it with everything after it (its answer, tool calls), so the model sees
        the new branch only; the audit log keeps both, the new question's
        ``data["branch_of"]`` naming the old one's row.  Only when nothing runs
        or waits (else :class:`~agentik.core.errors.BranchError`, nothing changed).
        """
        sent = await self._submit(
            content, author=author, author_id=author_id, channel=channel,
            allow_tool=allow_tool, busy=busy, fallback=True, run_id=run_id,
            settings=settings, branch=branch,
        )  # fmt: skip
        assert sent is not None
        return sent

    def _steerable(
        self,
        author_id: str | None,
        allow_tool: Callable[[str], bool] | None,
        settings: TurnSettings,
    ) -> bool:
        runner = self._runner
        if runner is None or not runner.steer_open or self.queued:
            return False
        if settings != runner.settings:
            return False  # another persona, tools or model: a turn of its own
        data = runner.message.data if isinstance(runner.message.data, dict) else {}
        # Tools run with the turn's asker's rights: another speaker steers only
        # when nobody's tools are narrowed.
        same = author_id is not None and data.get("author_id") == author_id
        return same or (allow_tool is None and runner.allow_tool is None)

    async def _submit(
        self,
        content: Content,
        *,
        author: str | None,
        author_id: str | None,
        channel: str | None,
        allow_tool: Callable[[str], bool] | None,
        busy: BusyMode,
        fallback: bool,
        run_id: str | None = None,
        settings: TurnSettings | None = None,
        branch: bool = False,
    ) -> Sent | None:
        self._check_open()
        if branch:
            self._check_branchable()
        if settings is None:
            settings = self._settings
        elif not isinstance(settings, TurnSettings):
            raise TypeError("settings must be a TurnSettings")
        content, attached = split_content(content)
        if busy not in BUSY_MODES:
            raise ValueError(f"unknown busy mode {busy!r} (known: {', '.join(BUSY_MODES)})")
        questions = self._services.questions
        if questions.waiting(self.id) or (
            questions.shared and await questions.waits_elsewhere(self.id)
        ):
            # The turn asked (ask_user): the asked person's message is the answer.
            answered = await self.answer(content, author=author, author_id=author_id)
            if answered is not None:
                return Sent(answered.run_id)
        outcome = await self._services.hooks.before_prompt(self, content, author, author_id)
        if isinstance(outcome, Refuse):
            raise PromptRefused(outcome.message)
        content = self._scrub("user", outcome)
        parts = await self.attach(attached) if attached else ()
        branch_of: int | None = None
        if branch:
            # Refused prompts change nothing; from here on, the branch is made.
            self._check_branchable()
            found = await self._memory.last_question()
            if found is None:
                raise BranchError(
                    "there is no question to regenerate or edit in this conversation's"
                    " working memory (none yet, or summarised)"
                )
            self._check_branchable()
            await self._memory.rewind(found[0])
            branch_of = found[1].id
        runner = self._runner
        if (
            busy == "steer"
            and runner is not None
            and self._steerable(author_id, allow_tool, settings)
        ):
            now = time.time()
            data: dict[str, Any] = {"steered": True}
            if author_id:
                data["author_id"] = author_id
            if parts:
                data["parts"] = [p.to_dict() for p in parts]
            if settings.origin is not None:
                data["origin"] = settings.origin.to_dict()
            entry = NewMessage(
                kind="user", content=content, author=author,
                channel=channel or self.channel_key, run_id=runner.run_id, data=data,
                created_at=now,
            )  # fmt: skip
            self._add_speaker(author_id)
            committed = asyncio.ensure_future(
                self._store.append(self.id, log=[entry], updated_at=now)
            )
            taken = runner.steer(Steered(content, author, committed))
            assert taken  # checked just above, with no await in between
            await asyncio.shield(committed)
            self.updated_at = now
            return Sent(runner.run_id, steered=True)
        if not fallback:
            return None
        run_id = await self._queue_message(
            content,
            author,
            author_id,
            channel,
            allow_tool,
            run_id,
            settings,
            parts,
            branch_of,
        )
        stopped = False
        if busy == "interrupt" and runner is not None and self._runner is runner:
            stopped = await self.interrupt()
        return Sent(run_id, interrupted=stopped)

    async def attach(
        self, attached: Sequence[ImagePart | FilePart]
    ) -> tuple[ImagePart | FilePart, ...]:
        """Store the bytes of ``attached`` (checked: size, type from the bytes) and
        return the parts that name them; a part naming stored bytes by hash must
        name bytes this conversation holds.  :class:`AttachmentRejected` (nothing of
        the message recorded) for one that is refused.  What :meth:`submit` does
        with the parts of its content; the turn queue of several workers calls it
        before it queues a message with attachments."""
        max_bytes = self.agent.attachments.max_bytes
        checked: list[tuple[ImagePart | FilePart, bytes | None, str]] = []
        for part in attached:
            if part.data is not None:
                given = bytes(part.data)
                media_type = check(given, max_bytes, name=part.name, size=part.size)
                checked.append((part, given, media_type))
            elif part.url is not None:
                if not isinstance(part, ImagePart) or not part.url.startswith(
                    ("https://", "http://")
                ):
                    raise AttachmentRejected("only images can be given by URL, an http(s) one")
                checked.append((part, None, ""))
            elif part.sha256 is None:
                raise AttachmentRejected("an attachment part needs its bytes, an URL or a hash")
            else:
                checked.append((part, None, ""))
        out: list[ImagePart | FilePart] = []
        now = time.time()
        for part, data, media_type in checked:
            if data is not None:
                await self.stored()
                await self._store.attachment_put(self.id, data, media_type, at=now)
                out.append(part_for(data, media_type, name=part.name))
            elif part.url is not None:
                out.append(dataclasses.replace(part, data=None, sha256=None))
            else:
                assert part.sha256 is not None
                held = await self._store.attachment_get(self.id, part.sha256)
                if held is None:
                    raise AttachmentRejected(f"no attachment {part.sha256[:12]}… here")
                # What the store sniffed, not what the caller says.
                cls = ImagePart if held.media_type.startswith("image/") else FilePart
                out.append(
                    cls(sha256=held.sha256, media_type=held.media_type, size=held.size,
                        name=part.name)
                )  # fmt: skip
        return tuple(out)

    async def _queue_message(
        self,
        content: str,
        author: str | None,
        author_id: str | None,
        channel: str | None,
        allow_tool: Callable[[str], bool] | None,
        run_id: str | None = None,
        settings: TurnSettings | None = None,
        parts: tuple[ImagePart | FilePart, ...] = (),
        branch_of: int | None = None,
    ) -> str:
        run_id = run_id or new_run_id()
        settings = self._settings if settings is None else settings
        now = time.time()
        data: dict[str, Any] = {"author_id": author_id} if author_id else {}
        if parts:
            data["parts"] = [p.to_dict() for p in parts]
        if branch_of is not None:
            data["branch_of"] = branch_of
        if settings.origin is not None:
            data["origin"] = settings.origin.to_dict()
        entry = NewMessage(
            kind="user",
            content=content,
            author=author,
            channel=channel or self.channel_key,
            run_id=run_id,
            data=data or None,
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
            [
                *notes,
                ChatMessage(
                    role="user", content=content, author=author, message_id=-1, parts=parts
                ),
            ]
            if idle
            else []
        )
        # The write runs in its own task, queued now, so the order of the audit
        # log matches the order of the turn queue even under concurrent sends.
        unstored, self._unstored = self._unstored, None
        committed: asyncio.Future[list[Message]]
        if unstored is None:
            committed = asyncio.ensure_future(
                self._store.append(self.id, log=[entry], memory=stored, updated_at=now)
            )
            write = committed
        elif self._unstored_key is not None:
            # A new channel's conversation: it, its binding and this message are one
            # durable write (a new Slack thread was two), awaited like any message.
            committed = write = asyncio.ensure_future(
                self._store.create_conversation_with(
                    unstored, log=[entry], memory=stored, updated_at=now,
                    channel_key=self._unstored_key,
                )
            )  # fmt: skip
            write.add_done_callback(functools.partial(self._bound_write_done, unstored))
        else:
            # A child run's conversation and task: written deferred (they commit
            # with the child's next write, or its parent's tool result; see
            # agentik.core.agents, "Durability"), so the turn starts at once
            # from the row as it will be stored (its id is not known yet: 0).
            write = asyncio.ensure_future(
                self._store.create_conversation_with(
                    unstored, log=[entry], memory=stored, updated_at=now, defer=True
                )
            )
            write.add_done_callback(self._first_write_done)
            committed = asyncio.get_running_loop().create_future()
            committed.set_result([entry.stored(id=0, conversation_id=self.id, now=now)])
        if idle:
            memory.extend(
                [*notes, ChatMessage(role="user", content=content, author=author, parts=parts)]
            )
            write.add_done_callback(memory.invalidate_on_failure)
        early = entry.stored(id=0, conversation_id=self.id, now=now) if idle else None
        self._enqueue(
            _Pending(
                run_id, content, author, committed, idle, allow_tool=allow_tool,
                settings=settings, early=early,
            )
        )  # fmt: skip
        await asyncio.shield(committed)
        self.updated_at = now
        return run_id

    def _first_write_done(self, write: asyncio.Future[Any]) -> None:
        error = None if write.cancelled() else write.exception()
        if error is not None:
            log.error("conversation %s: could not store it and its first message: %s",
                      self.id, error)  # fmt: skip

    def store_with_first_message(
        self,
        record: ConversationRecord,
        *,
        channel_key: str | None = None,
        stored: Callable[[Conversation], None] | None = None,
    ) -> None:
        """This new conversation's ``record`` is not stored yet: the first
        message sent writes it, in the same transaction (a child run's
        conversation, whose first act is that message).  That write is
        deferred (``Store.append(defer=True)``): the turn does not wait for it.

        With ``channel_key`` (a new channel's conversation, see
        :meth:`Agent.conversation_for_channel`) the binding goes in the same
        write, which is as durable as any message's; anything else written
        first (a note, a rename, an attachment) writes the conversation and its
        binding before it (:meth:`stored`).  ``stored`` is called once it is
        stored, or when it closes without ever being stored."""
        self._unstored, self._unstored_key, self._on_stored = record, channel_key, stored

    @property
    def unstored(self) -> bool:
        """Not in the store yet (see :meth:`store_with_first_message`)."""
        return self._unstored is not None

    async def stored(self) -> None:
        """Write this conversation (and its binding) now if it is not stored yet."""
        record = self._unstored
        if record is None or self._unstored_key is None:
            return  # stored (or a child run's: its first message is its first write)
        self._unstored = None
        try:
            await self._store.create_conversation(record, channel_key=self._unstored_key)
        except BaseException:
            self._unstored = record  # the next write tries again
            raise
        self._stored_now()

    def _bound_write_done(self, record: ConversationRecord, write: asyncio.Future[Any]) -> None:
        if write.cancelled() or write.exception() is not None:
            # Nothing of it was written: the next message (or note) writes it.
            if self._unstored is None:
                self._unstored = record
            return
        self._stored_now()

    def _stored_now(self) -> None:
        callback, self._on_stored = self._on_stored, None
        if callback is not None:
            callback(self)

    # -- resuming after a restart -------------------------------------------------
    def resume(
        self,
        messages: Sequence[Message],
        *,
        mode: ResumeMode = "answer",
        outcome: str | None = None,
        allow_tool: Callable[[str], bool] | None = None,
        settings: TurnSettings | None = None,
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
        ``settings``: what the resumed turns run with, as their front end gives
        them now (the bridge recomputes the channel's; ``None``: the
        conversation's default) — not what they had before the restart, which
        is not stored; the message's recorded ``data["origin"]`` stays as it was.
        """
        settings = self._settings if settings is None else settings
        self._check_open()
        if mode not in RESUME_MODES:
            raise ValueError(f"unknown resume mode {mode!r} (known: {', '.join(RESUME_MODES)})")
        queued: list[str] = []
        for m in messages:
            if m.conversation_id != self.id or m.kind != "user" or not m.run_id:
                raise ValueError(f"message {m.id} is not a user turn of conversation {self.id}")
            if self._resumed is None:
                self._resumed = set()
            if m.run_id in self._resumed:
                continue
            self._resumed.add(m.run_id)
            if mode == "answer":
                done = asyncio.get_running_loop().create_future()
                done.set_result([m])
                self._enqueue(_Pending(m.run_id, m.content, m.author, done, resumed=True,
                                       allow_tool=allow_tool, settings=settings))  # fmt: skip
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

    def run_committed(
        self,
        message: Message,
        *,
        allow_tool: Callable[[str], bool] | None = None,
        settings: TurnSettings | None = None,
    ) -> bool:
        """Queue the turn of ``message``, a user message of this conversation committed
        already (by the turn queue of several workers, maybe on another worker) whose
        turn never started: it runs as a message sent here would (it joins the
        working memory when its turn starts).  ``False`` (nothing queued) when this
        process queued or resumed that run before.  A turn that may have started
        elsewhere is resumed instead (:meth:`resume`)."""
        self._check_open()
        if self._resumed is None:
            self._resumed = set()
        if message.run_id is None or message.run_id in self._resumed:
            return False
        self._resumed.add(message.run_id)
        done = asyncio.get_running_loop().create_future()
        done.set_result([message])
        settings = self._settings if settings is None else settings
        self._enqueue(_Pending(message.run_id, message.content, message.author, done,
                               allow_tool=allow_tool, settings=settings))  # fmt: skip
        return True

    def steer_committed(
        self,
        message: Message,
        *,
        run_id: str,
        allow_tool: Callable[[str], bool] | None = None,
        settings: TurnSettings | None = None,
    ) -> Steered | None:
        """Send ``message``, a user message committed already with a queued turn of its
        own (the turn queue of several workers: it arrived through another worker with
        ``busy = "steer"``), into the running turn ``run_id``, as :meth:`submit`'s
        ``steer`` would.  The item taken (its :attr:`~Steered.taken` says, once the
        turn ended, whether it joined the working memory), or ``None`` when that turn
        does not run here or cannot take it.  A message the turn does not reach is not
        queued here: its queued turn runs it."""
        self._check_open()
        runner = self._runner
        settings = self._settings if settings is None else settings
        data = message.data if isinstance(message.data, dict) else {}
        author_id = data.get("author_id")
        author_id = str(author_id) if author_id else None
        if runner is None or runner.run_id != run_id:
            return None
        if not self._steerable(author_id, allow_tool, settings):
            return None
        done: asyncio.Future[list[Message]] = asyncio.get_running_loop().create_future()
        done.set_result([message])
        item = Steered(message.content, message.author, done, queued=True)
        if not runner.steer(item):
            return None
        self._add_speaker(author_id)
        return item

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
            emit(RunStreamEnd, m.run_id)
            raise
        emit(TextDelta, m.run_id, text=text)
        # Not taken up again after a restart: its approvals expire saying so.
        await self._services.approvals.run_ended(self.parts, m.run_id or "", reason=RESTARTED)
        await self._services.questions.run_ended(self.parts, m.run_id or "")
        emit(TurnEnded, m.run_id, stop_reason="stop", text=text)
        emit(RunStreamEnd, m.run_id)

    async def _resume_drop(self, m: Message, outcome: str) -> None:
        await self._store.append(self.id, ended=TurnEnd(m.run_id or "", outcome))
        # Not taken up again after a restart: its approvals expire saying so.
        await self._services.approvals.run_ended(self.parts, m.run_id or "", reason=RESTARTED)
        await self._services.questions.run_ended(self.parts, m.run_id or "")
        log.info("conversation %s: unanswered message %d %s", self.id, m.id, outcome)

    async def move_queued(self, other: Conversation) -> list[str]:
        """Move the user messages queued here (not started yet) to ``other``, in order.

        For a channel started over (``!new``): each queued message is recorded
        in ``other`` with its author and run id and queued there (plugins'
        ``before_prompt`` hooks are not run again: the text is as they left
        it); here its turn is then recorded as ``moved``.  The running turn,
        if any, stays.  A crash in between loses nothing: the copy in ``other``
        is answered, the original is superseded by the channel's new binding.
        Returns the moved run ids.
        """
        self._check_open()
        other._check_open()
        busy = self._worker is not None
        taken = [
            item
            for i, item in enumerate(self._queue)
            if isinstance(item, _Pending) and not (busy and i == 0)
        ]
        for item in taken:
            self._queue.remove(item)
        moved: list[Message] = []
        for item in taken:
            try:
                [m] = await item.committed
            except Exception:
                continue  # never stored: its sender was told
            data = m.data if isinstance(m.data, dict) else {}
            who = data.get("author_id")
            await other._queue_message(
                m.content, m.author, who if isinstance(who, str) else None, None,
                item.allow_tool, m.run_id, item.settings,
            )  # fmt: skip
            moved.append(m)
        if moved:
            self.resume(moved, mode="drop", outcome="moved")
        return [m.run_id or "" for m in moved]

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
        await self.stored()
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
        self._busy = True
        if self._worker is None:
            # Busy conversations stay referenced even if no caller holds them.
            self._services.mark_busy(self)
            self._services.transcripts.take(self._memory)
            self._worker = asyncio.create_task(self._work(), name=f"agentik-conversation:{self.id}")

    async def _work(self) -> None:
        parts = self.parts
        try:
            while self._queue:
                pending = self._queue[0]
                sink = self._services.event_sink
                if sink is not None:  # workers: continue after every worker's events
                    with contextlib.suppress(Exception):
                        await sink.resume(parts.events)
                if isinstance(pending, _Job):
                    await self._run_job(pending)
                    if sink is not None:  # (a job may emit: a compaction, a resume note)
                        with contextlib.suppress(Exception):
                            await sink.flushed()
                    continue
                question: asyncio.Future[list[Message]] | None = None
                if pending.early is not None and not pending.committed.done():
                    # Its write is under way: the turn prepares and asks the model
                    # meanwhile, and shows nothing before the write commits.
                    message, question = pending.early, pending.committed
                else:
                    try:
                        stored = await pending.committed
                    except Exception:
                        self._queue.pop(0)  # send() already raised to its caller
                        continue
                    message = stored[0]
                runner = TurnRunner(
                    parts,
                    run_id=pending.run_id,
                    message=message,
                    question=question,
                    settings=pending.settings,
                    tools=self._services.tools,
                    in_memory=pending.in_memory,
                    resumed=pending.resumed,
                    allow_tool=pending.allow_tool,
                    on_status=self._report,
                )
                self._runner = runner
                self._current = asyncio.create_task(
                    runner.run(), name=f"agentik-turn:{pending.run_id}"
                )
                try:
                    await self._current
                finally:
                    self._queue.pop(0)
                    self._runner = self._current = None
                    if sink is not None:  # the turn's events are stored before the next
                        with contextlib.suppress(Exception):
                            await sink.flushed()
                    # Steering messages the turn ended before reaching: the next turns.
                    for item in reversed(runner.take_steered()):
                        if item.queued:
                            continue  # (its queued turn runs it: the turn queue's)
                        self._queue.insert(
                            0,
                            _Pending(
                                new_run_id(), item.content, item.author, item.committed,
                                allow_tool=pending.allow_tool, settings=pending.settings,
                                message_run_id=runner.run_id,
                            )
                        )  # fmt: skip
        finally:
            if self._state != "idle" and not self._queue:
                self._state = "idle"  # the turn never reported its end (cancelled early)
            self._worker = None
            self._services.mark_idle(self)
            if not self._queue:
                self._set_idle()
                # Kept for the next turn, while few others went idle since.
                self._services.transcripts.idle(self._memory)
                # Its turns' events are kept packed for a reconnecting subscriber.
                if self._events is not None:
                    self._events.seal()

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
            self._queue.pop(0)

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

    def queued_run_ids(self) -> list[str]:
        """The run ids of the turns waiting their turn here (not the running one), in order."""
        busy = self._worker is not None
        return [
            item.run_id
            for i, item in enumerate(self._queue)
            if isinstance(item, _Pending) and not (busy and i == 0)
        ]

    async def withdraw(self, run_id: str) -> bool:
        """Take back the queued turn ``run_id`` before it starts.

        It never runs: its user message stays in the audit log (it never reached
        the model: a queued message joins the working memory when its turn
        starts), its end is recorded as ``cancelled``, and its ``turn_ended``
        (``interrupted``, with no ``turn_started`` before it) and
        ``run_stream_end`` events follow, so whoever waits for that run sees it
        end.  Returns ``False`` when no such turn waits here (it is running,
        over, or was never queued in this process).
        """
        busy = self._worker is not None
        for i, item in enumerate(self._queue):
            if isinstance(item, _Pending) and item.run_id == run_id and not (busy and i == 0):
                self._queue.remove(item)
                break
        else:
            return False
        try:
            await item.committed
        except Exception:
            return True  # never stored: its sender was told
        try:
            await self._store.append(self.id, ended=TurnEnd(run_id, "cancelled"))
        finally:
            self.announce_withdrawn(run_id)
            if not self._queue and self._worker is None:
                self._set_idle()
        log.info("conversation %s: queued turn %s withdrawn", self.id, run_id)
        return True

    def announce_withdrawn(self, run_id: str) -> None:
        """Say that the turn ``run_id``, taken back before it started, is over: its
        ``turn_ended`` (``interrupted``, with no ``turn_started`` before it) and
        ``run_stream_end`` events (its end is recorded by whoever took it back: here
        :meth:`withdraw`; with several workers, :meth:`TurnQueue.withdraw
        <agentik.core.cluster.conversations.TurnQueue.withdraw>`)."""
        emit = self._event_stream().emit
        emit(TurnEnded, run_id, stop_reason="interrupted")
        emit(RunStreamEnd, run_id)

    async def wait_idle(self) -> None:
        """Wait until no turn is running or queued."""
        if not self._busy:
            return
        if self._idle is None:
            self._idle = asyncio.Event()
        await self._idle.wait()

    def _set_idle(self) -> None:
        """No turn is running or queued: wake whoever waits for it."""
        self._busy = False
        idle, self._idle = self._idle, None
        if idle is not None:
            idle.set()

    # -- events ---------------------------------------------------------------
    def link(self, *, parent_run_id: str, relay_to: ConversationEvents) -> None:
        """Make this a child run's conversation: its events name ``parent_run_id``
        as their parent and are relayed into ``relay_to`` (the parent's stream)."""
        events = self._event_stream()
        events.parent_run_id = parent_run_id
        events.relay_to = relay_to

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
        profile: str | StreamProfile = "debug",
        kinds: Iterable[str] | None = None,
        max_pending: int | None = None,
        from_turn: bool = False,
    ) -> Subscription:
        """Live events of this conversation (an async iterator).

        With ``after=seq`` a reconnecting subscriber first receives the
        buffered events it missed, or an ``events_lost`` notice if the buffer
        no longer reaches back that far.  Without it, ``from_turn=True`` starts
        with the running turn's events from its ``turn_started`` (a reader
        opening the conversation mid-answer sees the whole answer so far; as far
        as the buffer reaches, else ``events_lost`` first); no turn running: from
        now on.  ``profile`` names a stream profile
        of the agent (``chat``, ``debug``, ``metrics`` or a ``[profiles.<name>]``;
        :mod:`~agentik.core.streamprofiles`) or is a
        :class:`~agentik.core.streamprofiles.StreamProfile`; an unknown name
        raises ``UnknownProfileError`` (a ``ValueError``); ``kinds`` overrides
        it.  ``max_pending`` bounds how far this subscriber may fall behind
        before it is told and cut off.
        """
        if after is None and from_turn and (since := self.running_since) is not None:
            after = since - 1
        return self._event_stream().subscribe(
            after=after,
            profile=profile_of(self.agent.stream_profiles, profile, kinds),
            max_pending=max_pending,
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

    def _check_branchable(self) -> None:
        if self._runner is not None or self._queue:
            raise BranchError(
                "a turn is running or queued: stop it, or wait for it, before regenerating"
                " or editing the last question"
            )

    async def last_question(self) -> Message | None:
        """The audit-log row of the last question still in the working memory: what
        regenerate sends again, edit-and-resend replaces (``submit(branch=True)``);
        ``None`` when there is none (none yet, or summarised)."""
        found = await self._memory.last_question()
        return found[1] if found is not None else None

    async def branch_at(self, message_id: int) -> bool:
        """Start the branch of a queued question that replaces the row ``message_id``
        (the turn queue of several workers: the worker that runs the turn makes the
        branch, as :meth:`submit` with ``branch=True`` does in one process): when
        that row is still the last question of the working memory and nothing runs
        or waits here, it and everything after it leave the working memory.
        ``False`` (nothing changed) otherwise: the question is then asked after
        what is there, and nothing of the context is lost."""
        if self._runner is not None or self._queue:
            return False
        found = await self._memory.last_question()
        if found is None or found[1].id != message_id:
            return False
        if self._runner is not None or self._queue:
            return False  # (something started meanwhile)
        await self._memory.rewind(found[0])
        return True

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
    async def rename(self, title: str | None) -> None:
        """Set the title (``None`` or ``""``: clear it, the conversation is untitled).

        A rename is a change of the conversation: ``updated_at`` moves to now,
        so lists ordered by activity show it first.
        """
        self._check_open()
        title = self._scrub("title", title or "")
        now = time.time()
        await self.stored()
        await self._store.update_conversation(self.id, title=title, updated_at=now)
        self.title = title
        self.updated_at = now

    async def checkpoint(self, label: str = "") -> CheckpointRecord:
        """Take a checkpoint now: the conversation's snapshot kept in its database
        (:mod:`agentik.core.checkpoints`), with ``label`` (one line, at most 200
        characters).  A temporary conversation keeps it in memory, as the rest.
        Refused (:class:`~agentik.core.errors.CheckpointLimit`) when the conversation
        has as many taken by hand as the agent's ``checkpoints.keep_manual``."""
        self._check_open()
        limit = self.agent.checkpoints.keep_manual
        record = await take_checkpoint(self._store, self.id, label=label, limit=limit)
        if record is None:
            raise NotFound(f"no conversation {self.id!r}")
        return record

    async def checkpoints(self) -> list[CheckpointRecord]:
        """This conversation's checkpoints, newest first (their documents:
        :meth:`checkpoint_document`)."""
        found: list[CheckpointRecord] = await self._store.checkpoints(self.id)
        return found

    async def delete_checkpoint(self, checkpoint_id: int) -> bool:
        """Delete one of this conversation's checkpoints (one taken by hand makes
        room for another under ``checkpoints.keep_manual``); whether it was there."""
        return bool(await self._store.checkpoint_delete(self.id, checkpoint_id))

    async def checkpoint_document(self, checkpoint_id: int) -> dict[str, Any] | None:
        """The snapshot of one of this conversation's checkpoints (``None``: it has
        no such checkpoint); it imports like any export."""
        return await checkpoint_document(self._store, self.id, checkpoint_id)

    async def aclose(self, *, drain: bool = False) -> None:
        """Close: with ``drain``, let queued turns finish; else interrupt them.

        Queued user messages stay in the audit log either way (and reach the
        model as context next time).  A conversation closed while the agent
        runs has ended: ``conversation_ended`` (reason ``closed``) is published
        and the agent's end listeners run (the memory worker reflects on it),
        as for a channel's ``!new`` — unless it already ended (reset, deleted).
        Closing the agent closes its conversations as a shutdown instead: each
        publishes ``conversation_ended`` (reason ``shutdown``), once (the memory
        worker's ``wind_down`` may have, for those it reflected on).
        Subscribers' streams end after that event.
        """
        if self.state is ConversationState.CLOSED:
            return
        if drain:
            await self.wait_idle()
        announce = self._services.end_unannounced(self)
        down = not announce and self._services.claim_shutdown_end(self)
        self.state = ConversationState.CLOSED
        await self._services.session_end(self, "closed")
        worker = self._worker
        if worker is not None:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
        if announce:
            # After the turn stopped: its partial answer is part of what ended.
            await self.agent.end_conversation(self, "closed")
        elif down:  # the agent is closing (Agent.aclose): the conversation ends with it
            self.parts.events.emit(
                ConversationEnded, None, reason="shutdown", channel_key=self.channel_key
            )
        for item in self._queue:
            if isinstance(item, _Job) and not item.done.done():
                item.done.cancel()
        self._queue.clear()
        self._set_idle()
        if self._events is not None:
            self._events.close()
        self._services.transcripts.take(self._memory)
        self._services.forget(self)
        if self._unstored is not None:
            self._stored_now()  # never stored: its pending binding goes with it

    async def __aenter__(self) -> Conversation:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _log_job_failure(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.error("resuming an unanswered message failed: %s", fut.exception())
