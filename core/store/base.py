"""The store interface: what the agent needs from a persistence engine.

The agent talks only to :class:`Store`; SQLite (:mod:`.sqlite`) is the
embedded default and :class:`~.memory.MemoryStore` keeps temporary
conversations in memory.  Another engine (PostgreSQL for several bot
processes) implements the same methods and nothing in the agent changes.

Contract every implementation keeps:

* ``append`` writes its audit-log rows and working-memory entries in one
  transaction, and returns only after they are durable (committed);
* the audit log (``message``) is append-only: rows are never updated, and
  are deleted only together with their conversation;
* ``compact`` replaces a prefix of working memory with a summary in one
  transaction and never touches the audit log;
* deleting a conversation removes every row that belongs to it (messages,
  working memory, channel bindings, turn ends);
* a turn's end (:class:`TurnEnd`) is recorded with the turn's last rows in
  the same ``append`` transaction, at most once per run id (a second one is
  ignored); :meth:`Store.pending_turns` lists the user messages that have
  none — what a crash left unanswered.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..cluster.notify import LocalNotifier, Notifier
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

__all__ = [
    "CAPABILITIES",
    "DEFER_MAX",
    "AccessChange",
    "AccessGrant",
    "ChannelSetting",
    "ChannelSettingChange",
    "ConversationRecord",
    "MemoryEntry",
    "OutboxEntry",
    "OutboxState",
    "RunRecord",
    "Store",
    "TurnEnd",
]

#: Seconds a deferred write (``Store.append(defer=True)``) waits at most for the
#: write that was to follow it before it commits on its own.
DEFER_MAX = 0.2

_RANK = {"queued": 0, "sent": 1, "confirmed": 2}


def link_stored(cm: ChatMessage, stored: Sequence[Message]) -> ChatMessage:
    """Resolve a working-memory entry's ``message_id = -(k + 1)``, "the k-th
    audit row of this append", to that row's id (what ``append`` stores)."""
    if cm.message_id is not None and cm.message_id < 0:
        return replace(cm, message_id=stored[-cm.message_id - 1].id)
    return cm


def outbox_advance(old: str, new: str) -> bool:
    """Delivery states only move forward (queued → sent → confirmed)."""
    return _RANK[new] > _RANK[old]


#: The optional groups of :class:`Store` methods, and the method whose override shows
#: an engine keeps that group (:attr:`Store.capabilities`).
CAPABILITIES: dict[str, str] = {
    "approvals": "approval_add",
    "questions": "question_add",
    "checklist": "todo_get",
    "redaction": "redact_message",
    "budgets": "budget_add",
    "export": "export_rows",
    "import": "import_rows",
    "retention": "prune_log",
    "jobs": "job_claim",
    "leases": "lease_acquire",
    "seen_events": "seen_first",
    "run_events": "run_events_add",
    "queue": "queue_add",
    "links": "link_save",
    "webhooks": "webhook_enqueue",
    "attachments": "attachment_put",
    "search": "search_messages",
    "branching": "rewind",
    "a2a_tasks": "a2a_task_put",
    "checkpoints": "checkpoint_add",
}


class Store(abc.ABC):
    """Persistence for conversations, channel bindings and the dual log.

    The facade of the per-aggregate repositories (:mod:`.repositories`); every
    engine proves it keeps the contract with :mod:`agentik.core.store.testing`.
    """

    @property
    def capabilities(self) -> frozenset[str]:
        """The optional groups this engine keeps (keys of :data:`CAPABILITIES`): the
        others raise ``NotImplementedError``."""
        cls = type(self)
        return frozenset(
            name
            for name, method in CAPABILITIES.items()
            if getattr(cls, method) is not getattr(Store, method)
        )

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Open connections and apply migrations; called once before use."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Flush pending writes and close; the store is unusable afterwards."""

    async def settle(self) -> None:  # noqa: B027 - optional hook
        """Return once every write submitted before the call is committed (a write
        held to share a transaction with the next one commits now): what another
        process reads from then on includes it.  A worker handing its connections
        over calls it before releasing their leases.  This default (an engine that
        commits each write before returning) has nothing to wait for."""

    def notifier(self) -> Notifier:
        """The :class:`~agentik.core.cluster.notify.Notifier` of this store's database:
        code that signals a change (ids only, after its write committed) or follows
        the changes of others uses it and never asks which engine it runs on.  This
        default delivers within the process (an engine other processes share, such
        as PostgreSQL, replaces it); one per store, made when first asked for."""
        found: Notifier | None = getattr(self, "_agentik_notifier", None)
        if found is None:
            found = LocalNotifier()
            self._agentik_notifier = found
        return found

    async def __aenter__(self) -> Store:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    #: Whether several processes (workers, :mod:`agentik.core.cluster`) may share this
    #: engine's data; ``False``: one process (SQLite, memory) keeps it.
    shared: bool = False

    # -- conversations ---------------------------------------------------
    @abc.abstractmethod
    async def create_conversation(
        self, record: ConversationRecord, *, channel_key: str | None = None
    ) -> None:
        """Create a conversation, bound to ``channel_key`` when given (atomically)."""

    async def create_conversation_with(
        self,
        record: ConversationRecord,
        *,
        log: Sequence[NewMessage] = (),
        memory: Sequence[ChatMessage] = (),
        updated_at: float | None = None,
        defer: bool = False,
        channel_key: str | None = None,
    ) -> list[Message]:
        """Create a conversation (bound to ``channel_key`` when given) and
        :meth:`append` its first rows, in one transaction: a crash leaves both or
        neither.  Returns the stored rows.  ``defer``: as in :meth:`append`.

        The default makes two writes (a store that cannot do better stays
        correct: the conversation alone, without its first rows, is valid).
        """
        await self.create_conversation(record, channel_key=channel_key)
        return await self.append(record.id, log=log, memory=memory, updated_at=updated_at)

    def set_internal(self, conversation_id: str, internal: bool) -> None:
        """Mark a conversation internal (a child run's) or not any more.

        An internal conversation's writes need not be durable at their own
        commit: they become durable with the next durable commit of this store
        (for :class:`SQLiteStore` with ``synchronous = "full"``: they commit
        without an fsync of their own).  A crash before that may lose them.
        The default ignores it (every write is as durable as any other).
        """
        return None

    @abc.abstractmethod
    async def get_conversation(self, conversation_id: str) -> ConversationRecord | None:
        """Return the record, or ``None`` if there is no such conversation."""

    @abc.abstractmethod
    async def list_conversations(
        self, *, limit: int = 50, offset: int = 0
    ) -> list[ConversationRecord]:
        """A page of conversations, most recently updated first."""

    async def list_conversations_after(
        self, updated_at: float, conversation_id: str, *, limit: int = 50
    ) -> list[ConversationRecord]:
        """The ``limit`` conversations that come after ``(updated_at, conversation_id)``
        in :meth:`list_conversations`' order (most recently updated first, ties by id):
        a keyset page. Pass the last record of a page for the next one; the key need not
        name a conversation that still exists.

        ``offset`` reads past every row it skips, so a page deep in a long list costs
        more than the first; a keyset page costs the same anywhere. This default pages
        through :meth:`list_conversations`; the engines answer it from their index."""
        key = (-updated_at, conversation_id)
        found: list[ConversationRecord] = []
        offset = 0
        while len(found) < limit:
            page = await self.list_conversations(limit=500, offset=offset)
            found += [r for r in page if (-r.updated_at, r.id) > key]
            if len(page) < 500:
                break
            offset += len(page)
        return found[:limit]

    @abc.abstractmethod
    async def update_conversation(
        self,
        conversation_id: str,
        *,
        title: str | None = None,
        updated_at: float | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        """Change a conversation's title, update time or metadata."""

    @abc.abstractmethod
    async def delete_conversation(self, conversation_id: str) -> bool:
        """Delete the conversation and every row that belongs to it.

        Returns ``False`` if it did not exist.
        """

    # -- channel bindings -------------------------------------------------
    @abc.abstractmethod
    async def get_binding(self, channel_key: str) -> str | None:
        """The conversation id bound to ``channel_key``, or ``None``."""

    @abc.abstractmethod
    async def set_binding(self, channel_key: str, conversation_id: str) -> None:
        """Bind (or re-bind) ``channel_key`` to an existing conversation."""

    # -- the dual log -------------------------------------------------------
    @abc.abstractmethod
    async def append(
        self,
        conversation_id: str,
        *,
        log: Sequence[NewMessage] = (),
        memory: Sequence[ChatMessage] = (),
        updated_at: float | None = None,
        ended: TurnEnd | None = None,
        defer: bool = False,
    ) -> list[Message]:
        """Append audit-log rows and working-memory entries in one transaction.

        A memory entry whose ``message_id`` is ``-(k + 1)`` is linked to the
        k-th ``log`` row of this same call (its id is not known before).
        ``ended`` records a turn's end in the same transaction (ignored if
        that run already has one).
        Returns the audit-log rows as stored (with their ids), after commit.

        ``defer`` is a hint: another write follows at once (a child run's last
        write, then its parent's tool result), and this one may wait for it to
        commit in the same transaction.  It still commits in order with every
        other write, and on its own after :data:`DEFER_MAX` seconds if nothing
        follows (or when the store closes).  A store may ignore it.
        """

    @abc.abstractmethod
    async def pending_turns(self, *, limit: int = 1000, after: int = 0) -> list[Message]:
        """User messages whose turn has no :class:`TurnEnd`, oldest first.

        Across all conversations; ambient notes (no run id) are not turns.
        ``after``: only messages with a higher id (the next page: a caller that
        cannot take some rows pages past them instead of seeing them again).
        """

    @abc.abstractmethod
    async def messages(
        self,
        conversation_id: str,
        *,
        after: int | None = None,
        before: int | None = None,
        offset: int | None = None,
        limit: int = 100,
        kinds: Sequence[MessageKind] | None = None,
    ) -> list[Message]:
        """A page of the audit log, oldest first.

        ``after``/``before`` are message ids (keyset paging: cost does not
        grow with history length).  ``after`` returns the first ``limit``
        rows after that id; otherwise the *last* ``limit`` rows (before
        ``before`` if given).  ``offset`` counts from the oldest row and costs
        O(offset).
        """

    @abc.abstractmethod
    async def count_messages(self, conversation_id: str) -> int:
        """Number of audit-log rows of the conversation."""

    @abc.abstractmethod
    async def load_memory(self, conversation_id: str) -> list[MemoryEntry]:
        """The working memory, in order."""

    @abc.abstractmethod
    async def compact(self, conversation_id: str, upto: int, summary: ChatMessage) -> None:
        """Replace every working-memory entry with ``pos <= upto`` by ``summary``.

        One transaction; the audit log is untouched.
        """

    # -- the outbox -------------------------------------------------------------
    @abc.abstractmethod
    async def outbox_add(self, entries: Sequence[OutboxEntry], *, defer: bool = False) -> list[int]:
        """Write outgoing pieces (state ``queued``) in one transaction; their ids.

        A piece already present (same channel, run and piece number) is not
        added again; if it was incomplete, its text and ``complete`` are updated.
        ``defer``: as in :meth:`append` (held for the write that follows: a
        streamed answer's row rides with its turn's last commit).
        """

    @abc.abstractmethod
    async def outbox_mark(
        self, updates: Sequence[tuple[int, OutboxState, bool | None, str | None]]
    ) -> None:
        """Record delivery progress ``(id, state, awaits_confirm, ref)`` in one transaction.

        States only move forward; ``None`` leaves ``awaits_confirm``/``ref`` as they are.
        """

    @abc.abstractmethod
    async def outbox_undelivered(self, *, limit: int = 10_000) -> list[OutboxEntry]:
        """Complete pieces not known to be delivered (see :attr:`OutboxEntry.undelivered`)
        and incomplete ones, oldest first."""

    @abc.abstractmethod
    async def outbox_prune(self, before: float) -> int:
        """Delete outbox rows created before ``before`` (a Unix time); how many."""

    # -- approvals (issue 19, migration 6) -----------------------------------------------------
    # Not abstract, so a store without them still works where no rule asks for approval.
    async def approval_add(self, approval: Approval) -> int | None:
        """Store a new pending approval; its serial, or ``None`` when its short id is
        already taken by a pending approval of the same scope (pick another)."""
        raise NotImplementedError(f"{type(self).__name__} does not store approvals")

    async def approval_resolve(
        self,
        serial: int,
        decision: ApprovalDecision,
        approver: str | None,
        approver_id: str | None,
        reason: str | None,
        at: float,
    ) -> bool:
        """Record how a pending approval ended; ``False`` if it was not pending any more."""
        raise NotImplementedError(f"{type(self).__name__} does not store approvals")

    async def approval_rebind(self, serial: int, call_id: str) -> None:
        """A resumed turn's new call (``call_id``) takes over a pending approval."""
        raise NotImplementedError(f"{type(self).__name__} does not store approvals")

    async def approval_get(self, serial: int) -> Approval | None:
        """One approval by its serial."""
        raise NotImplementedError(f"{type(self).__name__} does not store approvals")

    async def approvals(
        self,
        *,
        conversation_id: str | None = None,
        scope: str | None = None,
        state: str | None = None,
        short_id: str | None = None,
        limit: int = 1000,
        newest_first: bool = False,
    ) -> list[Approval]:
        """Approvals matching every filter given, oldest first (or newest first)."""
        raise NotImplementedError(f"{type(self).__name__} does not store approvals")

    async def approval_used(self, conversation_id: str, tool: str) -> bool:
        """Whether a call of ``tool`` was ever approved in this conversation (``first-use``)."""
        raise NotImplementedError(f"{type(self).__name__} does not store approvals")

    # -- questions (issue 20: ask_user, migration 10) -----------------------------------------
    # Not abstract, so a store without them still works where ask_user is not offered.
    async def question_add(self, question: Question) -> int:
        """Store a new pending question; its id."""
        raise NotImplementedError(f"{type(self).__name__} does not store questions")

    async def question_settle(
        self,
        question_id: int,
        outcome: QuestionOutcome,
        answer: str | None,
        answered_by: str | None,
        at: float,
    ) -> bool:
        """Record how a pending question ended; ``False`` if it was not pending any more.

        A form's answers so far (``partial``) are dropped: ``answer`` holds them."""
        raise NotImplementedError(f"{type(self).__name__} does not store questions")

    async def question_answer_part(
        self, question_id: int, answers: dict[str, str | None]
    ) -> dict[str, str | None] | None:
        """Add ``answers`` (field id -> answer) to a pending form's answers so far
        (later ones replace earlier ones of the same field), in one transaction;
        the answers so far, or ``None`` if it is not pending any more."""
        raise NotImplementedError(f"{type(self).__name__} does not store questions")

    async def question_rebind(self, question_id: int, call_id: str) -> None:
        """A resumed turn's new call (``call_id``) takes over a pending question."""
        raise NotImplementedError(f"{type(self).__name__} does not store questions")

    async def question_get(self, question_id: int) -> Question | None:
        """One question by its id."""
        raise NotImplementedError(f"{type(self).__name__} does not store questions")

    async def questions(
        self, *, conversation_id: str | None = None, state: str | None = None
    ) -> list[Question]:
        """Questions matching every filter given, oldest first."""
        raise NotImplementedError(f"{type(self).__name__} does not store questions")

    # -- the todo checklist (issue 20, migration 13) --------------------------------------------
    # Not abstract: without them the todo tool keeps nothing across a restart.
    async def todo_get(self, conversation_id: str) -> Checklist | None:
        """The conversation's checklist (the ``todo`` tool's last list); ``None``: none."""
        raise NotImplementedError(f"{type(self).__name__} does not store checklists")

    async def todo_set(self, conversation_id: str, checklist: Checklist | None) -> None:
        """Replace the conversation's checklist (``None`` or no items: remove it)."""
        raise NotImplementedError(f"{type(self).__name__} does not store checklists")

    # -- redaction (issue 22, migration 12) --------------------------------------------------
    # Not abstract: a store without them refuses redaction with a clear error.
    async def redact_message(
        self,
        conversation_id: str,
        message_id: int,
        *,
        content: str,
        by: str,
        reason: str,
        at: float,
    ) -> Redaction | None:
        """Replace audit-log row ``message_id`` of the conversation, and the
        working-memory entries linked to it, with ``content`` (a tombstone);
        delete the memory notes whose recorded source span covers it (every
        version); record the redaction; all in one transaction.

        Returns the audit row written, or ``None`` if the conversation has no
        such message.  A message already redacted raises ``ValueError``.  The
        old text must not survive in the storage (SQLite: ``secure_delete``
        and a WAL checkpoint).
        """
        raise NotImplementedError(f"{type(self).__name__} cannot redact messages")

    async def redactions(
        self, conversation_id: str | None = None, *, limit: int = 100
    ) -> list[Redaction]:
        """The audited redactions (of ``conversation_id``, or all), oldest first."""
        raise NotImplementedError(f"{type(self).__name__} cannot redact messages")

    async def note_source_add(  # noqa: B027 - optional: provenance is best effort
        self, note_id: int, conversation_id: str, first_message_id: int, last_message_id: int
    ) -> None:
        """Record that memory note ``note_id`` was derived from that span of the
        conversation's audit log (mining, reflection): redacting a message in
        the span deletes the note.  A store without provenance ignores it."""

    async def message_span(self, conversation_id: str) -> tuple[int, int] | None:
        """The lowest and highest audit-log id of the conversation (``None``: empty)."""
        return None

    # -- budgets (issue 19: agentik.core.budgets; migration 7) ----------------------------
    async def budget_add(self, rows: Sequence[tuple[str, str, str, int, int]]) -> None:
        """Add to budget counters in one transaction.

        Each row is ``(scope, subject, kind, window, amount)``: ``amount`` is
        added to that counter (created at 0).
        """
        raise NotImplementedError(f"{type(self).__name__} keeps no budget counters")

    async def budget_take(
        self,
        checks: Sequence[tuple[str, str, str, int, int]],
        rows: Sequence[tuple[str, str, str, int, int]],
        *,
        held: tuple[str, str, int] | None = None,
    ) -> tuple[int, int] | None:
        """Check budget counters and add to them as one atomic step.

        Each check is ``(scope, subject, kind, window, ceiling)``: it passes
        when that counter (0 when it does not exist) is below ``ceiling``.
        When every check passes, ``rows`` are added as by :meth:`budget_add`
        and the result is ``None``; otherwise nothing is added and the result
        is ``(index, amount)``: the first check that failed and its counter.

        ``held``: ``(kind, held kind, from window)`` — a check of ``kind`` also
        counts the same scope and subject's counters of ``held kind`` whose
        window is ``from window`` or later (the token reservations of running
        turns, kept as counters whose window is when they expire: a crashed
        worker's lapse by themselves).

        Atomic for every process sharing the database: of takes racing at the
        edge of a limit only as many pass as the limit has room for.  This
        default only reads, then adds (takes racing can each pass): every
        engine agentik ships overrides it, and so should an engine shared by
        several processes.
        """
        if held is not None:
            raise NotImplementedError(f"{type(self).__name__} keeps no held budget counters")
        for index, (scope, subject, kind, at, ceiling) in enumerate(checks):
            got = await self.budget_usage([(scope, subject)], {kind: at})
            amount = got.get((scope, subject, kind), 0)
            if amount >= ceiling:
                return index, amount
        await self.budget_add(rows)
        return None

    async def budget_usage(
        self, keys: Sequence[tuple[str, str]], windows: Mapping[str, int]
    ) -> dict[tuple[str, str, str], int]:
        """The counters of ``keys`` (``(scope, subject)``) in each kind's window.

        ``windows`` maps a kind to the start of its current window; the result
        maps ``(scope, subject, kind)`` to the amount (missing: 0).
        """
        raise NotImplementedError(f"{type(self).__name__} keeps no budget counters")

    async def budget_prune(self, before: Mapping[str, int]) -> int:
        """Delete counters of each kind whose window starts before ``before[kind]``; how many."""
        raise NotImplementedError(f"{type(self).__name__} keeps no budget counters")

    async def budget_rows(self, since: int) -> list[tuple[str, str, str, int, int]]:
        """Every counter whose window starts at or after ``since``:
        ``(scope, subject, kind, window, amount)``, by scope, subject, kind, window."""
        raise NotImplementedError(f"{type(self).__name__} keeps no budget counters")

    # -- lifecycle: the rows of a snapshot (agentik.core.lifecycle) ---------------------------
    async def export_rows(self, conversation_id: str) -> dict[str, list[dict[str, Any]]]:
        """What a snapshot holds of the conversation besides its record, audit log,
        working memory and checklist, engine-neutral (plain JSON values):

        * ``bindings``: ``{channel_key, created_at}``, by channel key;
        * ``turn_ends``: ``{run_id, outcome, created_at}``, oldest first;
        * ``approvals``, ``questions``, ``runs``: every stored field of the
          conversation's rows (the run tree's rows whose ``conversation_id`` is
          it), as the SQLite tables hold them: booleans as 0/1, ``choices`` and
          ``usage`` as JSON text; in the order written.

        The same conversation exports the same rows from every engine (the
        store contract suite checks it).
        """
        raise NotImplementedError(f"{type(self).__name__} cannot export snapshot rows")

    async def import_rows(
        self,
        doc: dict[str, Any],
        conversation_id: str,
        *,
        bind: str | None,
        now: float,
        parts: SnapshotParts | None = None,
    ) -> ImportResult:
        """Restore a validated snapshot (:func:`agentik.core.lifecycle.validate_snapshot`)
        as conversation ``conversation_id``, in one transaction with its ``parts``
        (:class:`~.snapshot.SnapshotParts`: attachments, checkpoints, A2A task
        records, checked by the caller); raises :class:`~.snapshot.SnapshotError`
        (naming the field or part, ``checkpoints[2]: cannot be restored: …``, never
        the values refused) if it cannot be, and writes nothing then.  A task
        record whose ``(owner, task_id)`` is taken keeps the stored one
        (``ImportResult.skipped_tasks`` counts them).

        A snapshot is untrusted: apply :mod:`.snapshot`'s rules (authors become a
        label, approvals move to the ``imported:`` scope, open turns end
        ``imported``, pending questions expire, open runs end, run-tree links
        become a label).  Audit-log ids are renumbered (working memory relinked to
        the new ids; an id the snapshot no longer has links to the newest row
        before it); working-memory positions become 1..n.  ``bind``: bind that
        channel to it (taking it over); without it, the snapshot's bindings are
        restored where the channel is free, and ``meta.channel_key`` names only a
        restored binding.  An id already present raises ``SnapshotError``.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot import snapshots")

    async def retention_conversations(self) -> list[tuple[str, list[str], str | None]]:
        """Every conversation, oldest first (by creation time, then id): its id, the
        channel keys bound to it, and the ``channel_key`` its metadata names (a
        string, or ``None``) — what retention picks a rule by."""
        raise NotImplementedError(f"{type(self).__name__} cannot plan retention")

    async def log_outline(
        self, conversation_id: str
    ) -> list[tuple[int, str, float, str | None, str | None]]:
        """``(id, kind, created_at, author, run_id)`` of every audit-log row of the
        conversation, oldest first (retention finds its cut in it)."""
        raise NotImplementedError(f"{type(self).__name__} cannot plan retention")

    async def turn_ended(self, conversation_id: str, run_id: str) -> bool:
        """Whether the turn ``run_id`` of the conversation has a :class:`TurnEnd`."""
        raise NotImplementedError(f"{type(self).__name__} cannot plan retention")

    async def prune_log(
        self, conversation_id: str, upto: int, *, summary: str | None, count: int
    ) -> None:
        """Retention, one transaction: delete the audit rows ``<= upto`` (their text
        must not survive in the storage), put ``summary`` (if any) in their place
        as an ``assistant`` row by :data:`~.snapshot.RETENTION_AUTHOR` with the id
        ``upto`` and the last pruned row's time, and replace the working-memory
        entries that covered them with one ``system`` entry (the summary, or
        :data:`~.snapshot.DELETED_NOTICE` for ``count`` rows) linked to ``upto``."""
        raise NotImplementedError(f"{type(self).__name__} cannot prune its log")

    # -- run trees (issue 20, agents as tools; migration 9) ---------------------------------
    @abc.abstractmethod
    async def run_add(self, run: RunRecord) -> None:
        """Record a run of a run tree (as it ended; a record of the same run id is replaced)."""

    @abc.abstractmethod
    async def runs(self, conversation_id: str) -> list[RunRecord]:
        """The runs of ``conversation_id`` and the child runs it started, oldest first."""

    # -- access: roles granted in chat (issue 19, access) ---------------------------------
    @abc.abstractmethod
    async def access_grants(self) -> list[AccessGrant]:
        """Every role granted in chat, by identity key."""

    @abc.abstractmethod
    async def access_set(
        self, identity: str, role: str | None, *, by: str, channel: str | None = None
    ) -> None:
        """Give ``identity`` ``role`` (``None``: remove its grant) and audit the change
        (``by``: who, ``channel``: where), in one transaction."""

    @abc.abstractmethod
    async def access_audit(self, *, limit: int = 100) -> list[AccessChange]:
        """The latest role changes, newest first."""

    # -- per-channel settings (issue 19, channel settings) ------------------------------
    @abc.abstractmethod
    async def channel_settings(self, channel_key: str) -> list[ChannelSetting]:
        """The settings set in chat for ``channel_key``, by key."""

    @abc.abstractmethod
    async def set_channel_setting(
        self, channel_key: str, key: str, value: str | None, *, actor: str, at: float
    ) -> str | None:
        """Set (``value``: JSON text) or unset (``None``) one setting; returns the old value.

        The change and its audit row (:class:`ChannelSettingChange`) are
        written in one transaction; unsetting what is not set changes nothing
        and records nothing.
        """

    @abc.abstractmethod
    async def channel_setting_changes(
        self, channel_key: str | None = None, *, limit: int = 100
    ) -> list[ChannelSettingChange]:
        """The last ``limit`` audited changes (of ``channel_key``, or all), oldest first."""

    # -- scheduled jobs (issue 32: agentik.core.cluster.jobs) --------------------------------
    async def job_claim(
        self, name: str, slot: str, worker: str, *, now: float, stale_after: float | None = None
    ) -> bool:
        """Claim the firing ``slot`` of job ``name`` for ``worker``: ``True`` for the one
        claim that wins (one atomic insert), ``False`` when the slot was claimed before.

        A firing that failed (finished not ok) may be claimed again; so may a claim
        left unfinished for longer than ``stale_after`` seconds (its worker died
        mid-job; ``None``: never).  ``attempts`` counts the claims of a slot.
        """
        raise NotImplementedError(f"{type(self).__name__} keeps no job claims")

    async def job_finish(
        self, name: str, slot: str, worker: str, *, ok: bool, detail: str | None, now: float
    ) -> bool:
        """Record how ``worker``'s claim of ``slot`` ended; ``False`` when the claim is
        no longer its own (taken over) or there is none."""
        raise NotImplementedError(f"{type(self).__name__} keeps no job claims")

    async def job_history(self, name: str, *, limit: int = 20) -> list[JobRun]:
        """The last ``limit`` claims of job ``name``, newest first."""
        raise NotImplementedError(f"{type(self).__name__} keeps no job claims")

    async def job_prune(self, before: float) -> int:
        """Delete the claims made before ``before`` (a time); how many."""
        raise NotImplementedError(f"{type(self).__name__} keeps no job claims")

    # -- leases and workers (issue 32: agentik.core.cluster) ----------------------------------
    # Not abstract: a bot on a store without them keeps its leases in its own process.
    async def lease_acquire(self, name: str, owner: str, ttl: float) -> Lease | None:
        """Take lease ``name`` for ``owner`` for ``ttl`` seconds, when it is free, expired
        or already ``owner``'s (then it is extended); ``None`` when another holds it.

        One atomic step, judged by the store's clock: of two owners asking at once
        exactly one gets it.  A change of owner increments the fencing
        :attr:`~.records.Lease.epoch` (the first owner's is 1); ``owner`` taking
        again what it holds (or held last) keeps the epoch.
        """
        raise NotImplementedError(f"{type(self).__name__} keeps no leases")

    async def lease_renew(self, name: str, owner: str, epoch: int, ttl: float) -> bool:
        """Extend ``owner``'s lease to ``ttl`` seconds from now; ``False`` (and nothing
        changes) when the lease is not ``owner``'s at ``epoch`` any more (lost).

        A lease that expired but that nobody took since is still ``owner``'s: its
        renewal succeeds.
        """
        raise NotImplementedError(f"{type(self).__name__} keeps no leases")

    async def lease_renew_many(
        self, leases: Sequence[tuple[str, int]], owner: str, ttl: float
    ) -> list[str]:
        """:meth:`lease_renew` of every ``(name, epoch)`` of ``owner``; the names renewed
        (those not returned are lost).  An engine may do it in one statement; this
        default renews them one by one."""
        return [name for name, epoch in leases if await self.lease_renew(name, owner, epoch, ttl)]

    async def lease_release(self, name: str, owner: str, epoch: int) -> bool:
        """Let go of ``owner``'s lease at once (anyone may take it now; the epoch is
        kept, so the next owner's is one more); ``False``, changing nothing, when it
        is not ``owner``'s at ``epoch``."""
        raise NotImplementedError(f"{type(self).__name__} keeps no leases")

    async def lease_get(self, name: str) -> Lease | None:
        """Lease ``name`` as it is now (expired or released ones included); ``None``:
        never taken."""
        raise NotImplementedError(f"{type(self).__name__} keeps no leases")

    async def leases(self, prefix: str = "") -> list[Lease]:
        """Every lease whose name starts with ``prefix``, by name."""
        raise NotImplementedError(f"{type(self).__name__} keeps no leases")

    async def worker_beat(self, worker: str, info: WorkerInfo) -> None:
        """Record a heartbeat of ``worker`` (created on its first), with what it says of
        itself; the time is the store's clock."""
        raise NotImplementedError(f"{type(self).__name__} keeps no worker registry")

    async def workers(self) -> list[WorkerBeat]:
        """Every worker of the registry, by id."""
        raise NotImplementedError(f"{type(self).__name__} keeps no worker registry")

    async def workers_forget(self, older_than: float) -> int:
        """Remove the workers whose last heartbeat is more than ``older_than`` seconds
        old; how many."""
        raise NotImplementedError(f"{type(self).__name__} keeps no worker registry")

    # -- handled events, shared by every worker (issue 32; SQLite 16, PostgreSQL 5) -------
    async def seen_first(self, keys: Sequence[str], *, now: float, window: float) -> list[str]:
        """Record ``keys`` as handled at ``now``; the keys this call saw first: those no
        call recorded within ``window`` seconds before ``now`` (a key older than that is
        seen first again, and its time moves to ``now``).

        Atomic per key across every process sharing the store: of two calls racing
        with the same key, exactly one gets it back.  A transport's dedupe of
        redelivered events (Slack's retries) on several workers.
        """
        raise NotImplementedError(f"{type(self).__name__} keeps no handled events")

    async def seen_prune(self, before: float) -> int:
        """Forget the keys last seen first before ``before``; how many."""
        raise NotImplementedError(f"{type(self).__name__} keeps no handled events")

    async def seen_known(self, keys: Sequence[str], *, since: float) -> list[str]:
        """Those of ``keys`` recorded (seen first) at ``since`` or later, in the order
        given; a read, nothing is recorded.  Whether another process handled an event
        whose redelivery reached this one."""
        raise NotImplementedError(f"{type(self).__name__} keeps no handled events")

    async def seen_claim(
        self,
        claims: Sequence[str],
        keys: Sequence[str],
        *,
        now: float,
        window: float,
        since: float,
    ) -> tuple[list[str], list[str]]:
        """``(seen_first(claims, now=now, window=window), seen_known(keys, since=since))``
        in one round trip where the engine can (PostgreSQL: one statement): a worker
        claims the events it received and learns which of them another worker handled
        already.  The read sees the table as it was before the claims (a claim key and
        a handled key never coincide: the transport prefixes its claims)."""
        known = await self.seen_known(keys, since=since)
        return await self.seen_first(claims, now=now, window=window), known

    # -- checkpoints: stored snapshots per conversation (issue 35; SQLite 28, PostgreSQL 17) -
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
    ) -> CheckpointRecord:
        """Store ``document`` (a snapshot, :func:`~agentik.core.lifecycle.export_conversation`,
        as JSON text) as a checkpoint of ``conversation_id``, taken at ``at``.

        ``automatic`` with ``keep``: in the same transaction, only the latest ``keep``
        automatic checkpoints of the conversation stay (this one counted); the others
        (asked-for ones) are never removed that way.  ``limit`` (a checkpoint taken by
        hand, not ``automatic``): if the conversation has that many taken by hand
        already, nothing is written and :class:`~agentik.core.errors.CheckpointLimit`
        is raised — checked in the same transaction, so racing adds never pass it.
        Raises ``StoreError`` (or the engine's) for a conversation that does not exist.
        """
        raise NotImplementedError(f"{type(self).__name__} keeps no checkpoints")

    async def checkpoints(self, conversation_id: str) -> list[CheckpointRecord]:
        """The checkpoints of ``conversation_id``, newest first (none: ``[]``)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no checkpoints")

    async def checkpoint_get(self, conversation_id: str, checkpoint_id: int) -> str | None:
        """The document of checkpoint ``checkpoint_id`` of ``conversation_id``, as
        stored; ``None`` when that conversation has no such checkpoint."""
        raise NotImplementedError(f"{type(self).__name__} keeps no checkpoints")

    async def checkpoint_delete(self, conversation_id: str, checkpoint_id: int) -> bool:
        """Remove one checkpoint of ``conversation_id``; whether it was there."""
        raise NotImplementedError(f"{type(self).__name__} keeps no checkpoints")

    # -- run events, for SSE clients on every worker (issue 32; SQLite 18, PostgreSQL 7) ---
    async def run_events_add(
        self,
        rows: Sequence[tuple[str, int, float, str]],
        *,
        replace: bool = False,
        wide: Sequence[bool] | None = None,
    ) -> None:
        """Record a batch of events: ``(conversation_id, seq, at, data)`` rows, ``data``
        the event as the SSE stream sends it (:func:`~agentik.core.events.event_to_json`).
        A ``(conversation_id, seq)`` recorded already is left as it is; with
        ``replace``, its ``data`` is replaced (a redaction rewrites what it said).

        ``wide`` (one flag per row; ``None``: every row) says which events are on the
        agent-wide stream: each new one gets the next position (``pos``) of that
        stream, in the batch's order, and every reader on any process finds a
        position only once every lower one is readable (see
        :meth:`run_events_since`).  A row recorded already keeps its position."""
        raise NotImplementedError(f"{type(self).__name__} keeps no run events")

    async def run_events_since(self, after: int, *, limit: int = 500) -> list[tuple[int, str]]:
        """The recorded agent-wide events with a position above ``after``, in position
        order, ``limit`` at most: ``(pos, data)``.  Positions only grow and may skip
        numbers; a row at a lower position than one returned never appears later."""
        raise NotImplementedError(f"{type(self).__name__} keeps no run events")

    async def run_events_position(self) -> tuple[int, int]:
        """``(last, pruned)``: the highest position recorded (0: none), and the highest
        one :meth:`run_events_prune` forgot (a reader resuming below it may have
        missed events)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no run events")

    async def run_events_after(
        self, conversation_id: str, after: int, *, limit: int = 500
    ) -> list[tuple[int, str]]:
        """The conversation's recorded events with a ``seq`` above ``after``, oldest
        first, ``limit`` at most: ``(seq, data)``."""
        raise NotImplementedError(f"{type(self).__name__} keeps no run events")

    async def run_events_last(self, conversation_id: str) -> int:
        """The highest ``seq`` recorded for the conversation (0: none)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no run events")

    async def run_events_prune(self, *, keep: int, before: float) -> int:
        """Forget the events recorded before ``before`` and all but the newest ``keep``
        of each conversation (the highest position forgotten raises ``pruned``, see
        :meth:`run_events_position`); how many."""
        raise NotImplementedError(f"{type(self).__name__} keeps no run events")

    # -- the turn queue (issue 32: agentik.core.cluster.conversations; SQLite 17, PG 6) ----
    # Not abstract: only a bot on a shared store (several workers) queues turns.
    async def queue_add(
        self,
        conversation_id: str,
        message: NewMessage,
        payload: Mapping[str, Any],
        *,
        claimed_by: str | None = None,
        updated_at: float | None = None,
    ) -> QueuedTurn:
        """Record the user ``message`` (a turn: it has a run id) in the audit log and
        queue its turn, in one transaction: a crash leaves both or neither.  The
        stored message's id is the queued turn's key (:meth:`queue_done`).
        ``payload``: what the turn's front end needs to run it (JSON values).
        ``claimed_by``: queued already claimed by that worker (it holds the
        conversation's lease and runs it now).  ``updated_at``: the conversation's.
        """
        raise NotImplementedError(f"{type(self).__name__} keeps no turn queue")

    async def queue_claim(
        self, conversation_id: str, worker: str, *, limit: int = 100
    ) -> list[QueuedTurn]:
        """Claim for ``worker`` the conversation's queued turns it has not claimed yet
        (unclaimed ones, and those another worker claimed: call it only while
        holding the conversation's lease, whose previous holder is gone), oldest
        first, at most ``limit``.  One atomic step: of two workers claiming at once
        each turn goes to one (PostgreSQL: ``FOR UPDATE SKIP LOCKED``).  Claiming
        again returns nothing new: a claim is idempotent."""
        raise NotImplementedError(f"{type(self).__name__} keeps no turn queue")

    async def queue_done(self, message_ids: Sequence[int]) -> int:
        """Remove these turns from the queue (they ended, or need no run); how many
        were there."""
        raise NotImplementedError(f"{type(self).__name__} keeps no turn queue")

    async def queue_stats(self) -> QueueStats:
        """How many turns are queued (claimed or not) and the oldest one's age."""
        raise NotImplementedError(f"{type(self).__name__} keeps no turn queue")

    async def queue_conversations(
        self, *, free_for: str | None = None, limit: int = 100
    ) -> list[str]:
        """Conversations with queued turns, the longest waiting first.  ``free_for``:
        only those whose lease (``conv:<id>``, :meth:`lease_acquire`) that worker
        could take now: never taken, free, expired, or its own."""
        raise NotImplementedError(f"{type(self).__name__} keeps no turn queue")

    # -- branching (issue 34) ----------------------------------------------------------
    async def rewind(self, conversation_id: str, from_pos: int) -> int:
        """Remove the working-memory entries at position ``from_pos`` and after, in one
        transaction: the context goes back to before them (regenerate, edit and resend
        start a new branch there).  The audit log keeps every row.  Returns how many
        entries were removed."""
        raise NotImplementedError(f"{type(self).__name__} cannot rewind working memory")

    # -- search (issue 34; SQLite 21, PostgreSQL 10) ----------------------------------
    async def search_messages(
        self, query: str, *, limit: int = 20, offset: int = 0
    ) -> list[SearchHit]:
        """The ``user`` and ``assistant`` messages of every conversation that hold all
        the words of ``query`` (each as a word or the start of one, any case;
        :func:`.search.search_terms`), newest first, ``limit`` of them from
        ``offset``; an empty query finds nothing.  Redacted text is not found, a
        deleted conversation's messages neither.  Who may see which conversation is
        the caller's to check."""
        raise NotImplementedError(f"{type(self).__name__} keeps no search index")

    # -- linked channels (issue 33; SQLite 19, PostgreSQL 8) -------------------------
    async def link_save(self, record: LinkRecord) -> None:
        """Create link ``record.name``, or replace the one of that name."""
        raise NotImplementedError(f"{type(self).__name__} keeps no links")

    async def link_delete(self, name: str) -> bool:
        """Remove link ``name`` (its message map stays: history); whether it existed."""
        raise NotImplementedError(f"{type(self).__name__} keeps no links")

    async def links(self) -> list[LinkRecord]:
        """Every link made at run time, by name."""
        raise NotImplementedError(f"{type(self).__name__} keeps no links")

    async def link_map_add(self, rows: Sequence[LinkMessage]) -> None:
        """Record copies of messages in the message map; a row for a
        ``(canonical, channel_key)`` already there is replaced (its ``ref`` learnt)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no links")

    async def link_map(self, canonical: str) -> list[LinkMessage]:
        """Every copy of message ``canonical``, the origin's first, then by channel key."""
        raise NotImplementedError(f"{type(self).__name__} keeps no links")

    async def link_map_find(self, channel_key: str, ref: str) -> str | None:
        """The canonical id of the message known as ``ref`` in ``channel_key``, if any."""
        raise NotImplementedError(f"{type(self).__name__} keeps no links")

    # -- outbound webhooks (issue 35; SQLite 22, PostgreSQL 11) -----------------------
    async def webhook_enqueue(self, rows: Sequence[WebhookDelivery]) -> int:
        """Add deliveries (``pending``); a row whose ``id`` is there already is left as
        it is.  How many were added."""
        raise NotImplementedError(f"{type(self).__name__} keeps no webhook deliveries")

    async def webhook_claim(
        self, worker: str, *, now: float, lease: float, limit: int = 50
    ) -> list[WebhookDelivery]:
        """Claim up to ``limit`` deliveries that are claimable at ``now``
        (:meth:`WebhookDelivery.claimable`) for ``worker`` until ``now + lease``, oldest
        first, in one write: two workers never claim the same row at once."""
        raise NotImplementedError(f"{type(self).__name__} keeps no webhook deliveries")

    async def webhook_settle(
        self, worker: str, outcomes: Sequence[WebhookOutcome], *, now: float
    ) -> int:
        """Record the attempts ``outcomes`` tell of, in one write: each counts an
        attempt and ends ``worker``'s claim (finished at ``now`` unless ``pending``).
        A delivery ``worker`` no longer holds is left as it is; how many were recorded."""
        raise NotImplementedError(f"{type(self).__name__} keeps no webhook deliveries")

    async def webhook_release(self, worker: str) -> int:
        """End every claim ``worker`` holds without counting an attempt (a clean
        shutdown): the deliveries are claimable again at once, by any worker; how many."""
        raise NotImplementedError(f"{type(self).__name__} keeps no webhook deliveries")

    async def webhook_deliveries(
        self, *, state: WebhookState | None = None, webhook: str | None = None, limit: int = 100
    ) -> list[WebhookDelivery]:
        """Deliveries (of ``state``, to ``webhook``), oldest first."""
        raise NotImplementedError(f"{type(self).__name__} keeps no webhook deliveries")

    async def webhook_replay(self, ids: Sequence[str] | None, *, now: float) -> int:
        """Dead letters (those of ``ids``; ``None``: all) become pending again, due at
        ``now`` with no attempt counted, under the same delivery id; how many."""
        raise NotImplementedError(f"{type(self).__name__} keeps no webhook deliveries")

    async def webhook_next_due(self) -> float | None:
        """When the earliest pending delivery may be claimed (its ``next_at``, or the
        end of its holder's lease), if any is pending."""
        raise NotImplementedError(f"{type(self).__name__} keeps no webhook deliveries")

    async def webhook_prune(self, before: float) -> int:
        """Forget deliveries delivered before ``before`` (dead letters stay); how many."""
        raise NotImplementedError(f"{type(self).__name__} keeps no webhook deliveries")

    # -- attachments (issue 34; SQLite 20, PostgreSQL 9) ------------------------------
    async def attachment_put(
        self, conversation_id: str, data: bytes, media_type: str, *, at: float
    ) -> AttachmentRecord:
        """Store ``data`` (checked by the caller: :func:`agentik.core.attachments.check`)
        under its SHA-256 and record that ``conversation_id`` holds it; durable on
        return.  Storing bytes already held (by any conversation) keeps one copy; the
        conversation's first record of them (its ``created_at``) stays."""
        raise NotImplementedError(f"{type(self).__name__} keeps no attachments")

    async def attachment_get(self, conversation_id: str, sha256: str) -> AttachmentRecord | None:
        """The attachment ``sha256`` if ``conversation_id`` holds it."""
        raise NotImplementedError(f"{type(self).__name__} keeps no attachments")

    async def attachment_data(self, sha256: str) -> bytes | None:
        """The bytes of attachment ``sha256`` (``None``: none are stored)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no attachments")

    async def attachments(self, conversation_id: str) -> list[AttachmentRecord]:
        """What ``conversation_id`` holds, oldest first."""
        raise NotImplementedError(f"{type(self).__name__} keeps no attachments")

    async def attachment_drop(self, conversation_id: str, sha256s: Sequence[str]) -> int:
        """``conversation_id`` no longer holds ``sha256s`` (redaction, retention): how
        many it held.  Bytes no conversation holds any more are removed."""
        raise NotImplementedError(f"{type(self).__name__} keeps no attachments")

    # -- A2A task records (issue 35; SQLite 24, PostgreSQL 13) ----------------------------
    async def a2a_task_put(self, record: A2ATaskRecord) -> bool:
        """Write ``record`` (by ``owner`` and ``task_id``; its ``question``/``answer``
        are not stored).  A stored record that is ``final`` is kept as it is:
        ``False`` then.  A ``run_id`` of ``None`` keeps the stored one.  The
        conversation must exist (``StoreError`` otherwise)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no A2A tasks")

    async def a2a_task_get(self, owner: str, task_id: str) -> A2ATaskRecord | None:
        """``owner``'s task ``task_id``, with its ``question`` (the run's user row) and
        ``answer`` (its assistant rows' text, in order) read from the audit log."""
        raise NotImplementedError(f"{type(self).__name__} keeps no A2A tasks")

    async def a2a_tasks(
        self,
        owner: str,
        *,
        conversation_id: str | None = None,
        state: str | None = None,
        since: float | None = None,
        before: tuple[float, str] | None = None,
        limit: int = 50,
    ) -> list[A2ATaskRecord]:
        """``owner``'s tasks, newest first (``updated_at``, then ``task_id``, both
        descending), texts as :meth:`a2a_task_get`: those of ``conversation_id``, in
        ``state``, updated at or after ``since``, and after the position ``before``
        (``(updated_at, task_id)`` of the last one of the previous page)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no A2A tasks")

    async def a2a_task_count(
        self,
        owner: str,
        *,
        conversation_id: str | None = None,
        state: str | None = None,
        since: float | None = None,
    ) -> int:
        """How many tasks :meth:`a2a_tasks` would list without paging."""
        raise NotImplementedError(f"{type(self).__name__} keeps no A2A tasks")

    async def a2a_task_delete(self, owner: str, task_id: str) -> bool:
        """Forget ``owner``'s task ``task_id``; whether there was one."""
        raise NotImplementedError(f"{type(self).__name__} keeps no A2A tasks")

    async def a2a_conversation_tasks(self, conversation_id: str) -> list[A2ATaskRecord]:
        """Every owner's tasks of ``conversation_id``, oldest first (``updated_at``,
        then ``owner`` and ``task_id``), without their texts (``question`` and
        ``answer`` ``None``): what a snapshot of the conversation carries."""
        raise NotImplementedError(f"{type(self).__name__} keeps no A2A tasks")
