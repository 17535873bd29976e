"""The records the store keeps and returns: plain frozen dataclasses.

They live here, below every feature, so that :mod:`agentik.core.store` imports
no feature module (approvals, questions, redaction, access, ...): the features
import their records from here (and re-export them under their old names).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import AgentikError
from ..messages import ChatMessage

__all__ = [
    "A2ATaskRecord",
    "AccessChange",
    "AccessGrant",
    "AnswerFrom",
    "Approval",
    "ApprovalDecision",
    "AttachmentRecord",
    "ChannelSetting",
    "ChannelSettingChange",
    "Checklist",
    "CheckpointRecord",
    "ConversationRecord",
    "JobRun",
    "Lease",
    "LinkMessage",
    "LinkRecord",
    "MemoryEntry",
    "OutboxEntry",
    "OutboxState",
    "Question",
    "QuestionOutcome",
    "QueueStats",
    "QueuedTurn",
    "Redaction",
    "RedactionError",
    "RunRecord",
    "TurnEnd",
    "WebhookDelivery",
    "WebhookOutcome",
    "WebhookState",
    "WorkerBeat",
    "WorkerInfo",
    "tombstoned",
]

#: Delivery state of an outbox row: written, handed to the peer, confirmed by it.
OutboxState = Literal["queued", "sent", "confirmed"]


@dataclass(frozen=True, kw_only=True, slots=True)
class AccessGrant:
    """A role given in chat (``!role``, ``!ignore``) to one identity key."""

    identity: str
    role: str
    granted_by: str
    granted_at: float


@dataclass(frozen=True, kw_only=True, slots=True)
class AccessChange:
    """One row of the access audit: who changed whose role, when, where."""

    id: int
    at: float
    actor: str
    identity: str
    old_role: str | None
    new_role: str | None
    channel: str | None


@dataclass(frozen=True, kw_only=True, slots=True)
class ConversationRecord:
    """A stored conversation's metadata."""

    id: str
    title: str = ""
    created_at: float = 0.0
    updated_at: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryEntry:
    """One working-memory entry and its position (ascending, gaps allowed)."""

    pos: int
    message: ChatMessage


@dataclass(frozen=True, slots=True)
class TurnEnd:
    """The end of the turn that answers the user message with this ``run_id``.

    ``outcome``: the turn's stop reason (``stop``, ``length``, ``content_filter``, ``error``,
    ``interrupted`` by a user, ``aborted``, ``time_budget``) or, for a turn
    resumed after a crash, ``noted`` / ``dropped`` / ``superseded``; ``cancelled``: a
    queued turn withdrawn before it started (:meth:`Conversation.withdraw`).  A turn
    cut short by a shutdown or a crash has no end: it is resumed.
    """

    run_id: str
    outcome: str
    #: The run's row of its run tree, written in the same transaction (a run that
    #: started child runs, or a child run: :mod:`agentik.core.agents`).
    run: RunRecord | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class JobRun:
    """One firing of a scheduled job (:mod:`agentik.core.cluster.jobs`): the worker
    that claimed its ``slot``, when, and how it ended (``finished_at`` ``None``:
    running, or its worker died).  ``attempts`` counts claims: more than one when a
    claim left unfinished for too long was taken over."""

    name: str
    slot: str
    worker: str
    claimed_at: float
    finished_at: float | None = None
    ok: bool | None = None
    detail: str | None = None
    attempts: int = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class RunRecord:
    """One run of a run tree (:mod:`agentik.core.agents`; migration 9).

    A child run has a ``parent_run_id``, the ``parent_call_id`` of the tool
    call that started it and the ``agent`` it ran; its ``conversation_id``
    is its own (child) conversation.  A top-level run is recorded once it
    starts a child (``agent`` ``None``: the main agent).  A run is recorded
    when it ends, with its ``stop_reason`` and ``usage`` (the run's tokens,
    its children's included); a child refused at the depth limit has no
    conversation and ``stop_reason = "depth_limit"``.
    """

    run_id: str
    conversation_id: str | None
    parent_run_id: str | None = None
    parent_conversation_id: str | None = None
    parent_call_id: str | None = None
    agent: str | None = None
    depth: int = 0
    started: float = 0.0
    ended: float | None = None
    stop_reason: str | None = None
    usage: dict[str, int] | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class OutboxEntry:
    """One outgoing piece (an IRC line, a Slack answer) and its delivery state.

    ``(channel_key, run_id, piece)`` is unique: writing the same piece again
    does not enqueue it twice.  ``complete`` is false while a streamed answer
    is still being written (its ``text`` is filled in when it ends).
    ``awaits_confirm``: the protocol will confirm it (IRC echo-message; a
    Slack answer whose final text is not in its message yet).  ``ref`` is the
    protocol's id of the delivered message (a Slack ``ts``).
    """

    id: int = 0
    channel_key: str
    run_id: str
    piece: int
    transport: str
    kind: str
    text: str
    reply_to: Any = None
    complete: bool = True
    state: OutboxState = "queued"
    awaits_confirm: bool = False
    ref: str | None = None
    created_at: float = 0.0

    @property
    def undelivered(self) -> bool:
        """Not known to have reached the peer: send it (again) after a restart."""
        return self.state == "queued" or (self.state == "sent" and self.awaits_confirm)


@dataclass(frozen=True, kw_only=True, slots=True)
class ChannelSetting:
    """One per-channel setting set in chat: its value is JSON text."""

    channel_key: str
    key: str
    value: str
    set_by: str
    set_at: float


@dataclass(frozen=True, kw_only=True, slots=True)
class ChannelSettingChange:
    """One audited change of a channel setting (``None``: unset before/after)."""

    id: int
    channel_key: str
    key: str
    old_value: str | None
    new_value: str | None
    actor: str
    at: float


# -- waits: approvals (issue 19), questions and checklists (issue 20) -----------------

#: How a pending approval ended.
ApprovalDecision = Literal["approved", "denied", "expired", "cancelled"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Approval:
    """A request for approval, as stored (``approval`` table, migration 6)."""

    #: Row number (unique for ever).
    serial: int = 0
    #: Short id people type (``3f2``): unique among the pending ones of its ``scope``.
    id: str
    #: The channel key, or the conversation id for a conversation without one.
    scope: str
    conversation_id: str
    channel_key: str | None = None
    run_id: str
    call_id: str
    tool: str
    #: The arguments as shown: secrets masked, long values cut.
    arguments: str = "{}"
    #: A digest of the raw arguments (to recognise the same call after a restart).
    digest: str = ""
    asker: str | None = None
    asker_id: str | None = None
    approvers: str = "admin"
    self_approve: bool = False
    created_at: float = 0.0
    expires_at: float = 0.0
    state: Literal["pending", "resolved"] = "pending"
    decision: ApprovalDecision | None = None
    approver: str | None = None
    approver_id: str | None = None
    reason: str | None = None
    resolved_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "conversation_id": self.conversation_id,
            "channel_key": self.channel_key,
            "run_id": self.run_id,
            "call_id": self.call_id,
            "tool": self.tool,
            "arguments": self.arguments,
            "asker": self.asker,
            "asker_id": self.asker_id,
            "approvers": self.approvers,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "state": self.state,
            "decision": self.decision,
            "approver": self.approver,
            "approver_id": self.approver_id,
            "reason": self.reason,
            "resolved_at": self.resolved_at,
        }


QuestionOutcome = Literal["answered", "expired", "cancelled"]
AnswerFrom = Literal["asked", "anyone"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Question:
    """A question to the channel, as stored (``question`` table, migration 10)."""

    id: int = 0
    conversation_id: str
    channel_key: str | None = None
    run_id: str
    call_id: str
    #: Who is asked (a name as the channel shows it); ``None``: anyone.
    asker_target: str | None = None
    #: Who may answer: ``asked`` (only ``asker_target``) or ``anyone``.
    answer_from: AnswerFrom = "asked"
    text: str
    choices: tuple[str, ...] = ()
    #: A digest of the question (to recognise it when a resumed turn asks again).
    digest: str = ""
    created_at: float = 0.0
    deadline: float = 0.0
    state: Literal["pending", "resolved"] = "pending"
    outcome: QuestionOutcome | None = None
    answer: str | None = None
    answered_by: str | None = None
    answered_at: float | None = None
    #: The answerer's verified identity, when it had one (not stored in the
    #: ``question`` table: the tool result's ``author_id`` keeps it, so the
    #: person who answered may redact their answer like their own message).
    answered_by_id: str | None = None
    #: A form (several questions answered at once, migration 23): each field as
    #: ``{"id", "text", "choices", "required"}``, in order; empty: one question.
    form: tuple[dict[str, Any], ...] = ()
    #: A form's answers so far, field id -> answer (``None``: an optional field
    #: skipped); kept while it is pending, so a restart loses none.
    partial: dict[str, str | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "conversation_id": self.conversation_id,
            "channel_key": self.channel_key,
            "run_id": self.run_id,
            "call_id": self.call_id,
            "to": self.asker_target,
            "answer_from": self.answer_from,
            "question": self.text,
            "choices": list(self.choices),
            "created_at": self.created_at,
            "deadline": self.deadline,
            "state": self.state,
            "outcome": self.outcome,
            "answer": self.answer,
            "answered_by": self.answered_by,
            "answered_at": self.answered_at,
            **({"form": [dict(f) for f in self.form], "partial": dict(self.partial)}
               if self.form else {}),
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class Checklist:
    """A conversation's checklist (the ``todo`` tool's last list), as stored
    (``todo`` table, migration 13)."""

    #: ``{"text": ..., "status": "pending" | "in_progress" | "done"}``, in order.
    items: tuple[dict[str, str], ...] = ()
    #: The run whose call wrote it.
    run_id: str | None = None
    updated_at: float = 0.0

    @property
    def done(self) -> int:
        return sum(1 for it in self.items if it.get("status") == "done")

    def line(self) -> str:
        """``todo 2/5`` (items done of all)."""
        return f"todo {self.done}/{len(self.items)}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "items": [dict(it) for it in self.items],
            "done": self.done,
            "total": len(self.items),
            "run_id": self.run_id,
            "updated_at": self.updated_at,
        }


# -- redaction (issue 22) ---------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Redaction:
    """One audited redaction: which message, by whom, when, why, and what else went."""

    id: int = 0
    conversation_id: str
    message_id: int
    by: str
    at: float
    reason: str = ""
    #: Memory notes derived from the message that were deleted with it.
    notes_removed: int = 0


class RedactionError(AgentikError, ValueError):
    """A redaction that cannot be done (the message is already redacted)."""


def tombstoned(
    entry: ChatMessage, content: str, kind: str, call_id: str | None, *, linked: bool
) -> ChatMessage:
    """A working-memory entry with a redacted audit row's text replaced by ``content``.

    ``kind``/``call_id`` are the redacted row's; ``linked``: the entry stands
    for that row.  A redacted tool call keeps its place (the results that
    answer it need it) with empty arguments; a tool result keeps its call id.
    """
    if kind == "tool_call":
        calls = tuple(
            dataclasses.replace(c, arguments="{}") if c.id == call_id else c
            for c in entry.tool_calls
        )
        return dataclasses.replace(entry, tool_calls=calls)
    if kind == "tool_result":
        if entry.role == "tool" and (linked or entry.tool_call_id == call_id):
            return dataclasses.replace(entry, content=content)
        return entry
    if linked:
        # Its attachments go too (the bytes are dropped: Agent.redact).
        return dataclasses.replace(entry, content=content, parts=())
    return entry


# -- the cluster: leases and workers (issue 32) ------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Lease:
    """A named lease (``conn:<transport>``: who holds a chat connection) as the store
    sees it.  Times are the store's clock (PostgreSQL: the database server's), so
    workers whose clocks disagree still agree on who holds what."""

    name: str
    #: The worker holding it (or that held it last: see :attr:`expires_in`).
    owner: str
    #: The fencing number: grows by one each time the lease changes owner, never
    #: goes back.  A renewal or release naming an older epoch is refused.
    epoch: int
    #: Seconds until it expires, when it was read (zero or less: expired or
    #: released, free for anyone to take).
    expires_in: float
    #: When its owner took it (a Unix time, the store's clock).
    acquired_at: float = 0.0

    @property
    def held(self) -> bool:
        """Whether it was still held when read."""
        return self.expires_in > 0


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerInfo:
    """What a worker says about itself with each heartbeat."""

    host: str = ""
    pid: int = 0
    #: When the worker started (a Unix time, its own clock).
    started_at: float = 0.0
    #: agentik's version.
    version: str = ""
    #: Stopping: it hands its connections over and takes no new ones.
    draining: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerBeat:
    """A worker of the registry and its last heartbeat."""

    worker: str
    info: WorkerInfo
    #: Its last heartbeat (a Unix time, the store's clock).
    last_beat: float
    #: Seconds since then, when read (the store's clock).
    age: float


# -- the turn queue (issue 32: a conversation served by any worker) -------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class QueuedTurn:
    """A submitted turn waiting in the turn queue (or claimed and running): its user
    message is already in the audit log (:attr:`message_id`, the queue's idempotence
    key); :attr:`payload` is what its front end needs to run it (JSON values)."""

    conversation_id: str
    message_id: int
    run_id: str
    #: The front end's own description of the turn (who asked, through what).
    payload: dict[str, Any] = field(default_factory=dict)
    #: When it was queued (a Unix time).
    enqueued_at: float = 0.0
    #: The worker that claimed it last (``None``: not claimed yet).
    claimed_by: str | None = None
    #: How many times it was claimed (more than one: a worker died or lost it).
    attempts: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class QueueStats:
    """How full the turn queue is: every turn not done (claimed or not)."""

    depth: int = 0
    #: Of them, not claimed by any worker yet.
    waiting: int = 0
    #: Seconds since the oldest of them was queued (0: none).
    oldest_age: float = 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkRecord:
    """A link made at run time (``!link``): channels on several transports that are one
    conversation (issue 33).  ``options`` holds the ``[[links]]`` keys set for it
    (``relay``, ``answer``, ...); ``created_by`` is the admin's verified identity."""

    name: str
    #: Channel keys (or patterns) of the link, in the order given.
    channels: tuple[str, ...]
    options: dict[str, Any] = field(default_factory=dict)
    created_by: str = ""
    created_at: float = 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkMessage:
    """One row of a link's persistent message map: a message as it exists in one
    channel.  Every copy of a relayed message shares its ``canonical`` id; the row of
    the message where it was written has ``origin`` set.  ``ref`` is that channel's
    protocol id for it (a Slack ``ts``, an IRC msgid; ``None`` when the protocol has
    none); ``outbox`` names the copy's outbox row (``(run_id, piece)``) until then."""

    link: str
    canonical: str
    channel_key: str
    ref: str | None = None
    origin: bool = False
    run_id: str | None = None
    piece: int | None = None
    created_at: float = 0.0


#: A webhook delivery's state: ``pending`` (to send, or to send again at ``next_at``),
#: ``delivered`` (a receiver answered 2xx), ``dead`` (retries exhausted: a dead letter,
#: until an operator replays it).
WebhookState = Literal["pending", "delivered", "dead"]


@dataclass(frozen=True, kw_only=True, slots=True)
class WebhookDelivery:
    """One event on its way to one ``[[webhooks]]`` receiver (issue 35): an outbox row
    for HTTP.  ``id`` is the delivery id the receiver dedupes on (the same on every
    attempt and replay); ``body`` is the JSON sent, signed afresh at each attempt (a
    new timestamp).  A worker sends only the rows it claimed (``claimed_by`` until
    ``claimed_until``), so on several workers each delivery is sent by one at a time."""

    id: str
    #: The ``[[webhooks]]`` entry's name.
    webhook: str
    event_kind: str
    conversation_id: str
    body: str
    created_at: float
    state: WebhookState = "pending"
    #: Attempts made so far.
    attempts: int = 0
    #: When it is due (a retry's backoff), seconds since the epoch.
    next_at: float = 0.0
    claimed_by: str | None = None
    claimed_until: float | None = None
    #: Why the last attempt failed (a status or a connection error; never a secret).
    last_error: str | None = None
    #: When it was delivered or given up.
    finished_at: float | None = None

    def claimable(self, now: float) -> bool:
        """Whether a worker may claim it at ``now``: pending, due (``next_at``), and
        nobody holds it (or its holder's lease ran out).  Every engine's
        ``webhook_claim`` keeps to this rule."""
        free = self.claimed_until is None or self.claimed_until < now
        return self.state == "pending" and self.next_at <= now and free


@dataclass(frozen=True, kw_only=True, slots=True)
class WebhookOutcome:
    """How one attempt at a claimed delivery ended, for ``webhook_settle``:
    ``delivered``; ``pending`` again at ``next_at`` (a retry); or ``dead`` (a dead
    letter).  ``error`` says why the attempt failed (never a secret or the URL)."""

    id: str
    state: WebhookState
    next_at: float | None = None
    error: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class AttachmentRecord:
    """An attachment a conversation holds (its bytes are stored once per ``sha256``,
    whichever conversations hold them).  ``media_type`` was sniffed from the bytes."""

    conversation_id: str
    sha256: str
    media_type: str
    size: int
    created_at: float = 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class A2ATaskRecord:
    """An A2A task (:mod:`agentik.transports.http.a2a`): one message to a served agent,
    answered by one turn of conversation ``conversation_id``, seen only by ``owner``
    (the caller's token name).

    ``body`` is the SDK's task as JSON *without* what people and the model said: the
    text of the question and of the answer is the audit log's (the user row and the
    assistant rows of ``run_id``), so redaction, retention and deletion act on it as
    on any message.  Read back, ``question`` and ``answer`` carry that text
    (``None``: no such row, e.g. pruned or not written yet); they are ignored when
    writing.  ``final``: the task reached a terminal state, which a later write
    never replaces (a cancel recorded by one worker stays).  ``updated_at``: the
    time of its status (what ``tasks/list`` orders by, newest first).
    """

    owner: str
    task_id: str
    conversation_id: str
    state: str
    updated_at: float
    body: str
    run_id: str | None = None
    final: bool = False
    question: str | None = None
    answer: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointRecord:
    """A stored snapshot of a conversation (its document is read apart:
    ``checkpoint_get``).  ``automatic``: taken by the agent when the conversation
    ended (the last ``[checkpoints] keep_automatic`` of them are kept), else asked
    for (``!checkpoint``, the HTTP API, the library).  ``size``: the document's
    length in bytes (UTF-8 JSON)."""

    id: int
    conversation_id: str
    created_at: float
    label: str = ""
    automatic: bool = False
    size: int = 0

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "conversation_id": self.conversation_id,
            "created_at": self.created_at,
            "label": self.label,
            "automatic": self.automatic,
            "size": self.size,
        }
