"""The store's repositories: one Protocol per aggregate, each the part of
:class:`~.base.Store` a feature needs.

:class:`~.base.Store` is their facade (every engine implements all of them);
code that needs one aggregate may ask for it by its Protocol, and
:data:`REPOSITORIES` lists them (the store contract suite checks an engine
declares each one).  Which optional groups an engine actually keeps is
:attr:`Store.capabilities <.base.Store.capabilities>`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..messages import ChatMessage, Message, MessageKind, NewMessage
from .records import (
    A2ATaskRecord,
    AccessChange,
    AccessGrant,
    Approval,
    ApprovalDecision,
    AttachmentRecord,
    ChannelSetting,
    ChannelSettingChange,
    Checklist,
    CheckpointRecord,
    ConversationRecord,
    JobRun,
    Lease,
    LinkMessage,
    LinkRecord,
    MemoryEntry,
    OutboxEntry,
    OutboxState,
    Question,
    QuestionOutcome,
    QueuedTurn,
    QueueStats,
    Redaction,
    RunRecord,
    TurnEnd,
    WebhookDelivery,
    WebhookOutcome,
    WebhookState,
    WorkerBeat,
    WorkerInfo,
)
from .search import SearchHit
from .snapshot import ImportResult, SnapshotParts

if TYPE_CHECKING:
    from .base import Store

__all__ = [
    "REPOSITORIES",
    "A2ATaskRepository",
    "AttachmentRepository",
    "CheckpointRepository",
    "GovernanceRepository",
    "JobsRepository",
    "LeaseRepository",
    "LifecycleRepository",
    "LinkRepository",
    "LogRepository",
    "OutboxRepository",
    "QueueRepository",
    "RunEventRepository",
    "RunsRepository",
    "SearchRepository",
    "SeenEventRepository",
    "WaitsRepository",
    "WebhookRepository",
    "WorkerRepository",
]


@runtime_checkable
class LogRepository(Protocol):
    """The log: conversations, channel bindings, the audit log, working memory, turn
    ends, redaction."""

    async def create_conversation(
        self, record: ConversationRecord, *, channel_key: str | None = None
    ) -> None: ...

    async def create_conversation_with(
        self,
        record: ConversationRecord,
        *,
        log: Sequence[NewMessage] = (),
        memory: Sequence[ChatMessage] = (),
        updated_at: float | None = None,
        defer: bool = False,
        channel_key: str | None = None,
    ) -> list[Message]: ...

    def set_internal(self, conversation_id: str, internal: bool) -> None: ...

    async def get_conversation(self, conversation_id: str) -> ConversationRecord | None: ...

    async def list_conversations(
        self, *, limit: int = 50, offset: int = 0
    ) -> list[ConversationRecord]: ...

    async def list_conversations_after(
        self, updated_at: float, conversation_id: str, *, limit: int = 50
    ) -> list[ConversationRecord]: ...

    async def update_conversation(
        self,
        conversation_id: str,
        *,
        title: str | None = None,
        updated_at: float | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None: ...

    async def delete_conversation(self, conversation_id: str) -> bool: ...

    async def get_binding(self, channel_key: str) -> str | None: ...

    async def set_binding(self, channel_key: str, conversation_id: str) -> None: ...

    async def append(
        self,
        conversation_id: str,
        *,
        log: Sequence[NewMessage] = (),
        memory: Sequence[ChatMessage] = (),
        updated_at: float | None = None,
        ended: TurnEnd | None = None,
        defer: bool = False,
    ) -> list[Message]: ...

    async def pending_turns(self, *, limit: int = 1000, after: int = 0) -> list[Message]: ...

    async def messages(
        self,
        conversation_id: str,
        *,
        after: int | None = None,
        before: int | None = None,
        offset: int | None = None,
        limit: int = 100,
        kinds: Sequence[MessageKind] | None = None,
    ) -> list[Message]: ...

    async def count_messages(self, conversation_id: str) -> int: ...

    async def load_memory(self, conversation_id: str) -> list[MemoryEntry]: ...

    async def compact(self, conversation_id: str, upto: int, summary: ChatMessage) -> None: ...

    async def rewind(self, conversation_id: str, from_pos: int) -> int: ...

    async def redact_message(
        self,
        conversation_id: str,
        message_id: int,
        *,
        content: str,
        by: str,
        reason: str,
        at: float,
    ) -> Redaction | None: ...

    async def redactions(
        self, conversation_id: str | None = None, *, limit: int = 100
    ) -> list[Redaction]: ...

    async def note_source_add(
        self, note_id: int, conversation_id: str, first_message_id: int, last_message_id: int
    ) -> None: ...

    async def message_span(self, conversation_id: str) -> tuple[int, int] | None: ...


@runtime_checkable
class OutboxRepository(Protocol):
    """The outbox: outgoing pieces and their delivery state."""

    async def outbox_add(
        self, entries: Sequence[OutboxEntry], *, defer: bool = False
    ) -> list[int]: ...

    async def outbox_mark(
        self, updates: Sequence[tuple[int, OutboxState, bool | None, str | None]]
    ) -> None: ...

    async def outbox_undelivered(self, *, limit: int = 10_000) -> list[OutboxEntry]: ...

    async def outbox_prune(self, before: float) -> int: ...


@runtime_checkable
class WaitsRepository(Protocol):
    """What a turn waits on: approvals and questions; and its checklist."""

    async def approval_add(self, approval: Approval) -> int | None: ...

    async def approval_resolve(
        self,
        serial: int,
        decision: ApprovalDecision,
        approver: str | None,
        approver_id: str | None,
        reason: str | None,
        at: float,
    ) -> bool: ...

    async def approval_rebind(self, serial: int, call_id: str) -> None: ...

    async def approval_get(self, serial: int) -> Approval | None: ...

    async def approvals(
        self,
        *,
        conversation_id: str | None = None,
        scope: str | None = None,
        state: str | None = None,
        short_id: str | None = None,
        limit: int = 1000,
        newest_first: bool = False,
    ) -> list[Approval]: ...

    async def approval_used(self, conversation_id: str, tool: str) -> bool: ...

    async def question_add(self, question: Question) -> int: ...

    async def question_settle(
        self,
        question_id: int,
        outcome: QuestionOutcome,
        answer: str | None,
        answered_by: str | None,
        at: float,
    ) -> bool: ...

    async def question_answer_part(
        self, question_id: int, answers: dict[str, str | None]
    ) -> dict[str, str | None] | None: ...

    async def question_rebind(self, question_id: int, call_id: str) -> None: ...

    async def question_get(self, question_id: int) -> Question | None: ...

    async def questions(
        self, *, conversation_id: str | None = None, state: str | None = None
    ) -> list[Question]: ...

    async def todo_get(self, conversation_id: str) -> Checklist | None: ...

    async def todo_set(self, conversation_id: str, checklist: Checklist | None) -> None: ...


@runtime_checkable
class GovernanceRepository(Protocol):
    """Roles granted in chat, channel settings, budget counters."""

    async def access_grants(self) -> list[AccessGrant]: ...

    async def access_set(
        self, identity: str, role: str | None, *, by: str, channel: str | None = None
    ) -> None: ...

    async def access_audit(self, *, limit: int = 100) -> list[AccessChange]: ...

    async def channel_settings(self, channel_key: str) -> list[ChannelSetting]: ...

    async def set_channel_setting(
        self, channel_key: str, key: str, value: str | None, *, actor: str, at: float
    ) -> str | None: ...

    async def channel_setting_changes(
        self, channel_key: str | None = None, *, limit: int = 100
    ) -> list[ChannelSettingChange]: ...

    async def budget_add(self, rows: Sequence[tuple[str, str, str, int, int]]) -> None: ...

    async def budget_take(
        self,
        checks: Sequence[tuple[str, str, str, int, int]],
        rows: Sequence[tuple[str, str, str, int, int]],
        *,
        held: tuple[str, str, int] | None = None,
    ) -> tuple[int, int] | None: ...

    async def budget_usage(
        self, keys: Sequence[tuple[str, str]], windows: Mapping[str, int]
    ) -> dict[tuple[str, str, str], int]: ...

    async def budget_prune(self, before: Mapping[str, int]) -> int: ...

    async def budget_rows(self, since: int) -> list[tuple[str, str, str, int, int]]: ...


@runtime_checkable
class RunsRepository(Protocol):
    """The run tree."""

    async def run_add(self, run: RunRecord) -> None: ...

    async def runs(self, conversation_id: str) -> list[RunRecord]: ...


@runtime_checkable
class LifecycleRepository(Protocol):
    """Snapshots and retention: export rows, import rows, prune."""

    async def export_rows(self, conversation_id: str) -> dict[str, list[dict[str, Any]]]: ...

    async def import_rows(
        self,
        doc: dict[str, Any],
        conversation_id: str,
        *,
        bind: str | None,
        now: float,
        parts: SnapshotParts | None = None,
    ) -> ImportResult: ...

    async def retention_conversations(self) -> list[tuple[str, list[str], str | None]]: ...

    async def log_outline(
        self, conversation_id: str
    ) -> list[tuple[int, str, float, str | None, str | None]]: ...

    async def turn_ended(self, conversation_id: str, run_id: str) -> bool: ...

    async def prune_log(
        self, conversation_id: str, upto: int, *, summary: str | None, count: int
    ) -> None: ...


@runtime_checkable
class JobsRepository(Protocol):
    """Scheduled jobs: one claim per (job, slot), so a firing runs on one worker."""

    async def job_claim(
        self, name: str, slot: str, worker: str, *, now: float, stale_after: float | None = None
    ) -> bool: ...

    async def job_finish(
        self, name: str, slot: str, worker: str, *, ok: bool, detail: str | None, now: float
    ) -> bool: ...

    async def job_history(self, name: str, *, limit: int = 20) -> list[JobRun]: ...

    async def job_prune(self, before: float) -> int: ...


@runtime_checkable
class LeaseRepository(Protocol):
    """Named leases with a fencing epoch: who owns a chat connection (issue 32)."""

    async def lease_acquire(self, name: str, owner: str, ttl: float) -> Lease | None: ...

    async def lease_renew(self, name: str, owner: str, epoch: int, ttl: float) -> bool: ...

    async def lease_release(self, name: str, owner: str, epoch: int) -> bool: ...

    async def lease_get(self, name: str) -> Lease | None: ...

    async def leases(self, prefix: str = "") -> list[Lease]: ...


@runtime_checkable
class WorkerRepository(Protocol):
    """The registry of worker processes and their heartbeats (issue 32)."""

    async def worker_beat(self, worker: str, info: WorkerInfo) -> None: ...

    async def workers(self) -> list[WorkerBeat]: ...

    async def workers_forget(self, older_than: float) -> int: ...


@runtime_checkable
class SeenEventRepository(Protocol):
    """Handled events (a transport's dedupe of redelivered events), shared by every
    process on the store: an atomic first-seen check, and pruning."""

    async def seen_first(self, keys: Sequence[str], *, now: float, window: float) -> list[str]: ...

    async def seen_prune(self, before: float) -> int: ...

    async def seen_known(self, keys: Sequence[str], *, since: float) -> list[str]: ...

    async def seen_claim(
        self,
        claims: Sequence[str],
        keys: Sequence[str],
        *,
        now: float,
        window: float,
        since: float,
    ) -> tuple[list[str], list[str]]: ...


@runtime_checkable
class RunEventRepository(Protocol):
    """What a conversation's turns emitted, in batches: an SSE client on any worker
    replays and follows them with the same ``seq`` (``(seq, event JSON)`` rows), and
    the agent-wide stream with the same position (``pos``) on every worker."""

    async def run_events_add(
        self,
        rows: Sequence[tuple[str, int, float, str]],
        *,
        replace: bool = False,
        wide: Sequence[bool] | None = None,
    ) -> None: ...

    async def run_events_after(
        self, conversation_id: str, after: int, *, limit: int = 500
    ) -> list[tuple[int, str]]: ...

    async def run_events_since(self, after: int, *, limit: int = 500) -> list[tuple[int, str]]: ...

    async def run_events_position(self) -> tuple[int, int]: ...

    async def run_events_last(self, conversation_id: str) -> int: ...

    async def run_events_prune(self, *, keep: int, before: float) -> int: ...


@runtime_checkable
class QueueRepository(Protocol):
    """The turn queue: turns submitted on one worker for a conversation another runs
    (issue 32), claimed by the holder of the conversation's lease."""

    async def queue_add(
        self,
        conversation_id: str,
        message: NewMessage,
        payload: Mapping[str, Any],
        *,
        claimed_by: str | None = None,
        updated_at: float | None = None,
    ) -> QueuedTurn: ...

    async def queue_claim(
        self, conversation_id: str, worker: str, *, limit: int = 100
    ) -> list[QueuedTurn]: ...

    async def queue_done(self, message_ids: Sequence[int]) -> int: ...

    async def queue_stats(self) -> QueueStats: ...

    async def queue_conversations(
        self, *, free_for: str | None = None, limit: int = 100
    ) -> list[str]: ...


@runtime_checkable
class LinkRepository(Protocol):
    """Linked channels made at run time, and the persistent message map (canonical
    message <-> each channel's id for it; no size cap) (issue 33)."""

    async def link_save(self, record: LinkRecord) -> None: ...

    async def link_delete(self, name: str) -> bool: ...

    async def links(self) -> list[LinkRecord]: ...

    async def link_map_add(self, rows: Sequence[LinkMessage]) -> None: ...

    async def link_map(self, canonical: str) -> list[LinkMessage]: ...

    async def link_map_find(self, channel_key: str, ref: str) -> str | None: ...


@runtime_checkable
class WebhookRepository(Protocol):
    """Outbound webhook deliveries (issue 35): an outbox for HTTP receivers, claimed
    under a lease by one worker at a time, retried with backoff, then kept as dead
    letters an operator lists and replays."""

    async def webhook_enqueue(self, rows: Sequence[WebhookDelivery]) -> int: ...

    async def webhook_claim(
        self, worker: str, *, now: float, lease: float, limit: int = 50
    ) -> list[WebhookDelivery]: ...

    async def webhook_settle(
        self, worker: str, outcomes: Sequence[WebhookOutcome], *, now: float
    ) -> int: ...

    async def webhook_release(self, worker: str) -> int: ...

    async def webhook_deliveries(
        self, *, state: WebhookState | None = None, webhook: str | None = None, limit: int = 100
    ) -> list[WebhookDelivery]: ...

    async def webhook_replay(self, ids: Sequence[str] | None, *, now: float) -> int: ...

    async def webhook_next_due(self) -> float | None: ...

    async def webhook_prune(self, before: float) -> int: ...


@runtime_checkable
class AttachmentRepository(Protocol):
    """Attachments (issue 34), content-addressed: the bytes once per SHA-256, and which
    conversations hold them.  Deleting a conversation drops what it holds; bytes no
    conversation holds any more are removed."""

    async def attachment_put(
        self, conversation_id: str, data: bytes, media_type: str, *, at: float
    ) -> AttachmentRecord: ...

    async def attachment_get(
        self, conversation_id: str, sha256: str
    ) -> AttachmentRecord | None: ...

    async def attachment_data(self, sha256: str) -> bytes | None: ...

    async def attachments(self, conversation_id: str) -> list[AttachmentRecord]: ...

    async def attachment_drop(self, conversation_id: str, sha256s: Sequence[str]) -> int: ...


@runtime_checkable
class SearchRepository(Protocol):
    """Full-text search over the audit log's ``user`` and ``assistant`` messages
    (:mod:`.search`: how a query is read; newest first) (issue 34)."""

    async def search_messages(
        self, query: str, *, limit: int = 20, offset: int = 0
    ) -> list[SearchHit]: ...


@runtime_checkable
class A2ATaskRepository(Protocol):
    """A2A task records (issue 35): what ``tasks/get``, ``tasks/list``, ``tasks/cancel``
    and resubscription read, on every worker and after a restart.  A task belongs to
    its owner (a token: another owner never sees it) and to its conversation
    (deleted with it).  The text of a task is the audit log's (see
    :class:`~.records.A2ATaskRecord`)."""

    async def a2a_task_put(self, record: A2ATaskRecord) -> bool: ...

    async def a2a_task_get(self, owner: str, task_id: str) -> A2ATaskRecord | None: ...

    async def a2a_tasks(
        self,
        owner: str,
        *,
        conversation_id: str | None = None,
        state: str | None = None,
        since: float | None = None,
        before: tuple[float, str] | None = None,
        limit: int = 50,
    ) -> list[A2ATaskRecord]: ...

    async def a2a_task_count(
        self,
        owner: str,
        *,
        conversation_id: str | None = None,
        state: str | None = None,
        since: float | None = None,
    ) -> int: ...

    async def a2a_task_delete(self, owner: str, task_id: str) -> bool: ...

    async def a2a_conversation_tasks(self, conversation_id: str) -> list[A2ATaskRecord]: ...


@runtime_checkable
class CheckpointRepository(Protocol):
    """Stored snapshots of a conversation (issue 35): listable per conversation,
    the automatic ones bounded to the last N; they go with their conversation."""

    async def checkpoint_add(
        self,
        conversation_id: str,
        document: str,
        *,
        at: float,
        label: str = "",
        automatic: bool = False,
        keep: int | None = None,
        limit: int | None = None,
    ) -> CheckpointRecord: ...

    async def checkpoints(self, conversation_id: str) -> list[CheckpointRecord]: ...

    async def checkpoint_get(self, conversation_id: str, checkpoint_id: int) -> str | None: ...

    async def checkpoint_delete(self, conversation_id: str, checkpoint_id: int) -> bool: ...


#: Every repository, in the order of the contract suite's aggregates.
REPOSITORIES: tuple[type, ...] = (
    LogRepository,
    OutboxRepository,
    WaitsRepository,
    GovernanceRepository,
    RunsRepository,
    LifecycleRepository,
    JobsRepository,
    LeaseRepository,
    WorkerRepository,
    SeenEventRepository,
    RunEventRepository,
    QueueRepository,
    LinkRepository,
    WebhookRepository,
    AttachmentRepository,
    SearchRepository,
    A2ATaskRepository,
    CheckpointRepository,
)


def _facade(
    store: Store,
) -> tuple[
    LogRepository,
    OutboxRepository,
    WaitsRepository,
    GovernanceRepository,
    RunsRepository,
    LifecycleRepository,
    JobsRepository,
    LeaseRepository,
    WorkerRepository,
    SeenEventRepository,
    RunEventRepository,
    QueueRepository,
    LinkRepository,
    WebhookRepository,
    AttachmentRepository,
    SearchRepository,
    A2ATaskRepository,
    CheckpointRepository,
]:
    """(For mypy: a :class:`Store` is every repository, signatures included.)"""
    return (store, store, store, store, store, store, store, store, store, store, store, store,
            store, store, store, store, store, store)  # fmt: skip
