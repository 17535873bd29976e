"""A store that keeps everything in process memory.

Used for temporary conversations (``temp=True``: never written to disk) and
handy in tests.  Same contract as :class:`~agentik.core.store.base.Store`.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import StoreError
from ..messages import ChatMessage, Message, MessageKind, NewMessage
from .base import (
    AccessChange,
    AccessGrant,
    ChannelSetting,
    ChannelSettingChange,
    ConversationRecord,
    MemoryEntry,
    OutboxEntry,
    OutboxState,
    RunRecord,
    Store,
    TurnEnd,
    link_stored,
    outbox_advance,
)
from .memory_a2a import MemoryA2ATasks
from .memory_attachments import MemoryAttachments
from .memory_checkpoints import MemoryCheckpoints
from .memory_cluster import MemoryCluster
from .memory_events import MemoryRunEvents
from .memory_jobs import MemoryJobs
from .memory_lifecycle import MemoryLifecycle
from .memory_queue import MemoryQueue
from .memory_webhooks import MemoryWebhooks
from .records import (
    Approval,
    ApprovalDecision,
    Checklist,
    LinkMessage,
    LinkRecord,
    Question,
    QuestionOutcome,
    Redaction,
    RedactionError,
    tombstoned,
)
from .search import SEARCHED_KINDS, SearchHit, hit, search_terms, words

__all__ = ["MemoryStore"]


class MemoryStore(
    MemoryQueue,
    MemoryCluster,
    MemoryLifecycle,
    MemoryJobs,
    MemoryRunEvents,
    MemoryWebhooks,
    MemoryAttachments,
    MemoryA2ATasks,
    MemoryCheckpoints,
    Store,
):
    """In-memory :class:`Store`; nothing survives the process."""

    def __init__(self) -> None:
        self._conversations: dict[str, ConversationRecord] = {}
        self._bindings: dict[str, str] = {}
        self._bound_at: dict[str, float] = {}
        self._log: dict[str, list[Message]] = {}
        self._memory: dict[str, list[MemoryEntry]] = {}
        self._ended: dict[str, dict[str, str]] = {}
        self._ended_at: dict[str, dict[str, float]] = {}
        self._ids = itertools.count(1)
        self._outbox: dict[tuple[str, str, int], OutboxEntry] = {}
        self._outbox_ids = itertools.count(1)
        self._approvals: dict[int, Approval] = {}
        self._approval_ids = itertools.count(1)
        self._questions: dict[int, Question] = {}
        self._question_ids = itertools.count(1)
        self._todos: dict[str, Checklist] = {}
        self._budget: dict[tuple[str, str, str, int], int] = {}
        self._grants: dict[str, AccessGrant] = {}
        self._access_audit: list[AccessChange] = []
        self._chan_settings: dict[tuple[str, str], ChannelSetting] = {}
        self._chan_changes: list[ChannelSettingChange] = []
        self._runs: dict[str, RunRecord] = {}
        self._redacted: set[int] = set()
        self._redactions: list[Redaction] = []
        self._seen: dict[str, float] = {}
        self._links: dict[str, LinkRecord] = {}
        self._link_map: dict[tuple[str, str], LinkMessage] = {}

    def _require(self, conversation_id: str) -> None:
        if conversation_id not in self._conversations:
            raise StoreError(f"no conversation {conversation_id!r}")

    async def create_conversation(
        self, record: ConversationRecord, *, channel_key: str | None = None
    ) -> None:
        if record.id in self._conversations:
            raise StoreError(f"conversation {record.id!r} exists")
        self._conversations[record.id] = record
        self._log[record.id] = []
        self._memory[record.id] = []
        self._ended[record.id] = {}
        self._ended_at[record.id] = {}
        if channel_key is not None:
            self._bindings[channel_key] = record.id
            self._bound_at[channel_key] = record.created_at

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
        # No await in between: nobody sees the conversation without its first rows.
        await self.create_conversation(record, channel_key=channel_key)
        return await self.append(record.id, log=log, memory=memory, updated_at=updated_at)

    async def get_conversation(self, conversation_id: str) -> ConversationRecord | None:
        return self._conversations.get(conversation_id)

    async def list_conversations(
        self, *, limit: int = 50, offset: int = 0
    ) -> list[ConversationRecord]:
        ordered = sorted(self._conversations.values(), key=lambda r: (-r.updated_at, r.id))
        return ordered[offset : offset + limit]

    async def list_conversations_after(
        self, updated_at: float, conversation_id: str, *, limit: int = 50
    ) -> list[ConversationRecord]:
        key = (-updated_at, conversation_id)
        ordered = sorted(self._conversations.values(), key=lambda r: (-r.updated_at, r.id))
        return [r for r in ordered if (-r.updated_at, r.id) > key][:limit]

    async def update_conversation(
        self,
        conversation_id: str,
        *,
        title: str | None = None,
        updated_at: float | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        rec = self._conversations.get(conversation_id)
        if rec is None:
            return
        changes: dict[str, Any] = {}
        if title is not None:
            changes["title"] = title
        if updated_at is not None:
            changes["updated_at"] = updated_at
        if meta is not None:
            changes["meta"] = dict(meta)
        self._conversations[conversation_id] = dataclasses.replace(rec, **changes)

    async def delete_conversation(self, conversation_id: str) -> bool:
        if self._conversations.pop(conversation_id, None) is None:
            return False
        self._log.pop(conversation_id, None)
        self._memory.pop(conversation_id, None)
        self._ended.pop(conversation_id, None)
        self._ended_at.pop(conversation_id, None)
        self._todos.pop(conversation_id, None)
        self.__dict__.get("_run_events", {}).pop(conversation_id, None)
        self._redactions = [r for r in self._redactions if r.conversation_id != conversation_id]
        for run_id, r in list(self._runs.items()):
            if conversation_id in (r.conversation_id, r.parent_conversation_id):
                del self._runs[run_id]
        for key in [k for k, v in self._bindings.items() if v == conversation_id]:
            del self._bindings[key]
        self._attachments_forget(conversation_id)
        self._a2a_forget(conversation_id)
        self._checkpoints_forget(conversation_id)
        return True

    async def get_binding(self, channel_key: str) -> str | None:
        return self._bindings.get(channel_key)

    async def set_binding(self, channel_key: str, conversation_id: str) -> None:
        self._require(conversation_id)
        self._bindings[channel_key] = conversation_id
        self._bound_at[channel_key] = time.time()

    async def append(
        self,
        conversation_id: str,
        *,
        log: Sequence[NewMessage] = (),
        memory: Sequence[ChatMessage] = (),
        updated_at: float | None = None,
        ended: TurnEnd | None = None,
        defer: bool = False,  # every write here is immediate
    ) -> list[Message]:
        self._require(conversation_id)
        now = time.time()
        out = [m.stored(id=next(self._ids), conversation_id=conversation_id, now=now) for m in log]
        self._log[conversation_id].extend(out)
        entries = self._memory[conversation_id]
        for cm in memory:
            cm = link_stored(cm, out)
            entries.append(MemoryEntry(pos=(entries[-1].pos + 1) if entries else 1, message=cm))
        if ended is not None:
            if ended.run_id not in self._ended[conversation_id]:
                self._ended[conversation_id][ended.run_id] = ended.outcome
                self._ended_at[conversation_id][ended.run_id] = now
            if ended.run is not None:
                self._runs.pop(ended.run.run_id, None)  # replaced: written last
                self._runs[ended.run.run_id] = ended.run
        if updated_at is not None:
            rec = self._conversations[conversation_id]
            if updated_at > rec.updated_at:
                self._conversations[conversation_id] = dataclasses.replace(
                    rec, updated_at=updated_at
                )
        return out

    async def pending_turns(self, *, limit: int = 1000, after: int = 0) -> list[Message]:
        rows = [
            m
            for cid, log in self._log.items()
            for m in log
            if m.id > after
            and m.kind == "user"
            and m.run_id
            and m.run_id not in self._ended[cid]
            # A child run is not taken up again: its parent's turn is.
            and not self._conversations[cid].meta.get("parent_run_id")
        ]
        return sorted(rows, key=lambda m: m.id)[:limit]

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
        rows = [
            m
            for m in self._log.get(conversation_id, ())
            if (not kinds or m.kind in kinds)
            and (after is None or m.id > after)
            and (before is None or m.id < before)
        ]
        if after is not None or offset is not None:
            start = offset or 0
            return rows[start : start + limit]
        return rows[-limit:] if limit else []

    async def count_messages(self, conversation_id: str) -> int:
        return len(self._log.get(conversation_id, ()))

    async def load_memory(self, conversation_id: str) -> list[MemoryEntry]:
        return list(self._memory.get(conversation_id, ()))

    async def rewind(self, conversation_id: str, from_pos: int) -> int:
        kept = [e for e in self._memory.get(conversation_id, ()) if e.pos < from_pos]
        removed = len(self._memory.get(conversation_id, ())) - len(kept)
        if conversation_id in self._memory:
            self._memory[conversation_id] = kept
        return removed

    async def compact(self, conversation_id: str, upto: int, summary: ChatMessage) -> None:
        self._require(conversation_id)
        kept = [e for e in self._memory[conversation_id] if e.pos > upto]
        self._memory[conversation_id] = [MemoryEntry(pos=upto, message=summary), *kept]

    async def outbox_add(self, entries: Sequence[OutboxEntry], *, defer: bool = False) -> list[int]:
        ids = []
        for e in entries:
            key = (e.channel_key, e.run_id, e.piece)
            old = self._outbox.get(key)
            if old is None:
                old = self._outbox[key] = dataclasses.replace(
                    e, id=next(self._outbox_ids), state="queued", awaits_confirm=False,
                    ref=None, created_at=time.time(),
                )  # fmt: skip
            elif not old.complete:
                old = self._outbox[key] = dataclasses.replace(old, text=e.text, complete=e.complete)
            ids.append(old.id)
        return ids

    async def outbox_mark(
        self, updates: Sequence[tuple[int, OutboxState, bool | None, str | None]]
    ) -> None:
        by_id = {e.id: k for k, e in self._outbox.items()}
        for id_, state, awaits, ref in updates:
            key = by_id.get(id_)
            if key is None:
                continue
            e = self._outbox[key]
            changes: dict[str, Any] = {}
            if outbox_advance(e.state, state):
                changes["state"] = state
            if awaits is not None:
                changes["awaits_confirm"] = awaits
            if ref is not None:
                changes["ref"] = ref
            self._outbox[key] = dataclasses.replace(e, **changes)

    async def outbox_undelivered(self, *, limit: int = 10_000) -> list[OutboxEntry]:
        rows = [e for e in self._outbox.values() if e.undelivered or not e.complete]
        return sorted(rows, key=lambda e: e.id)[:limit]

    async def outbox_prune(self, before: float) -> int:
        old = [k for k, e in self._outbox.items() if e.created_at < before]
        for k in old:
            del self._outbox[k]
        return len(old)

    # -- handled events ---------------------------------------------------------------------
    async def seen_first(self, keys: Sequence[str], *, now: float, window: float) -> list[str]:
        first = []
        for key in dict.fromkeys(keys):
            at = self._seen.get(key)
            if at is None or at < now - window:
                self._seen[key] = now
                first.append(key)
        return first

    async def seen_prune(self, before: float) -> int:
        old = [k for k, at in self._seen.items() if at < before]
        for k in old:
            del self._seen[k]
        return len(old)

    async def seen_known(self, keys: Sequence[str], *, since: float) -> list[str]:
        return [k for k in dict.fromkeys(keys) if self._seen.get(k, since - 1.0) >= since]

    # -- linked channels ----------------------------------------------------------------
    async def search_messages(
        self, query: str, *, limit: int = 20, offset: int = 0
    ) -> list[SearchHit]:
        terms = search_terms(query)
        if not terms:
            return []
        found: list[Message] = []
        for log in self._log.values():
            for m in log:
                if m.kind not in SEARCHED_KINDS:
                    continue
                have = words(m.content)
                if all(any(w.startswith(t) for w in have) for t in terms):
                    found.append(m)
        found.sort(key=lambda m: (-m.created_at, -m.id))
        return [
            hit(
                (m.conversation_id, m.id, m.kind, m.author, m.run_id, m.created_at, m.content),
                terms,
            )
            for m in found[offset : offset + limit]
        ]

    async def link_save(self, record: LinkRecord) -> None:
        self._links[record.name] = record

    async def link_delete(self, name: str) -> bool:
        return self._links.pop(name, None) is not None

    async def links(self) -> list[LinkRecord]:
        return [self._links[n] for n in sorted(self._links)]

    async def link_map_add(self, rows: Sequence[LinkMessage]) -> None:
        for m in rows:
            old = self._link_map.get((m.canonical, m.channel_key))
            if old is not None:
                m = dataclasses.replace(old, ref=m.ref if m.ref is not None else old.ref)
            self._link_map[(m.canonical, m.channel_key)] = m

    async def link_map(self, canonical: str) -> list[LinkMessage]:
        found = [m for (c, _), m in self._link_map.items() if c == canonical]
        return sorted(found, key=lambda m: (not m.origin, m.channel_key))

    async def link_map_find(self, channel_key: str, ref: str) -> str | None:
        return next(
            (m.canonical for m in self._link_map.values()
             if m.channel_key == channel_key and m.ref == ref),
            None,
        )  # fmt: skip

    # -- approvals (issue 19, migration 6) -----------------------------------------------------
    async def approval_add(self, approval: Approval) -> int | None:
        self._require(approval.conversation_id)
        for a in self._approvals.values():
            if a.state == "pending" and a.scope == approval.scope and a.id == approval.id:
                return None
        serial = next(self._approval_ids)
        self._approvals[serial] = dataclasses.replace(approval, serial=serial)
        return serial

    async def approval_resolve(
        self,
        serial: int,
        decision: ApprovalDecision,
        approver: str | None,
        approver_id: str | None,
        reason: str | None,
        at: float,
    ) -> bool:
        a = self._approvals.get(serial)
        if a is None or a.state != "pending":
            return False
        self._approvals[serial] = dataclasses.replace(
            a, state="resolved", decision=decision, approver=approver,
            approver_id=approver_id, reason=reason, resolved_at=at,
        )  # fmt: skip
        return True

    async def approval_rebind(self, serial: int, call_id: str) -> None:
        a = self._approvals.get(serial)
        if a is not None:
            self._approvals[serial] = dataclasses.replace(a, call_id=call_id)

    async def approval_get(self, serial: int) -> Approval | None:
        a = self._approvals.get(serial)
        return a if a is not None and a.conversation_id in self._conversations else None

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
        rows = [
            a
            for _, a in sorted(self._approvals.items(), reverse=newest_first)
            if a.conversation_id in self._conversations
            and (conversation_id is None or a.conversation_id == conversation_id)
            and (scope is None or a.scope == scope)
            and (state is None or a.state == state)
            and (short_id is None or a.id == short_id)
        ]
        return rows[:limit]

    async def approval_used(self, conversation_id: str, tool: str) -> bool:
        return any(
            a.conversation_id == conversation_id
            and a.tool == tool
            and a.decision == "approved"
            and not a.scope.startswith("imported:")  # history, never a use
            for a in self._approvals.values()
        )

    # -- questions (issue 20: ask_user, migration 10) -----------------------------------------
    async def question_add(self, question: Question) -> int:
        self._require(question.conversation_id)
        qid = next(self._question_ids)
        self._questions[qid] = dataclasses.replace(question, id=qid)
        return qid

    async def question_settle(
        self,
        question_id: int,
        outcome: QuestionOutcome,
        answer: str | None,
        answered_by: str | None,
        at: float,
    ) -> bool:
        q = self._questions.get(question_id)
        if q is None or q.state != "pending":
            return False
        self._questions[question_id] = dataclasses.replace(
            q, state="resolved", outcome=outcome, answer=answer, answered_by=answered_by,
            answered_at=at, partial={},
        )  # fmt: skip
        return True

    async def question_answer_part(
        self, question_id: int, answers: dict[str, str | None]
    ) -> dict[str, str | None] | None:
        q = self._questions.get(question_id)
        if q is None or q.state != "pending":
            return None
        merged = {**q.partial, **answers}
        self._questions[question_id] = dataclasses.replace(q, partial=merged)
        return dict(merged)

    async def question_rebind(self, question_id: int, call_id: str) -> None:
        q = self._questions.get(question_id)
        if q is not None:
            self._questions[question_id] = dataclasses.replace(q, call_id=call_id)

    async def question_get(self, question_id: int) -> Question | None:
        q = self._questions.get(question_id)
        return q if q is not None and q.conversation_id in self._conversations else None

    async def questions(
        self, *, conversation_id: str | None = None, state: str | None = None
    ) -> list[Question]:
        return [
            q
            for _, q in sorted(self._questions.items())
            if q.conversation_id in self._conversations
            and (conversation_id is None or q.conversation_id == conversation_id)
            and (state is None or q.state == state)
        ]

    # -- the todo checklist (issue 20, migration 13) --------------------------------------------
    async def todo_get(self, conversation_id: str) -> Checklist | None:
        return self._todos.get(conversation_id)

    async def todo_set(self, conversation_id: str, checklist: Checklist | None) -> None:
        self._require(conversation_id)
        if checklist is None or not checklist.items:
            self._todos.pop(conversation_id, None)
        else:
            self._todos[conversation_id] = checklist

    # -- redaction (issue 22) ------------------------------------------------------------
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
        # What SQLiteStore.redact_message does, on the same rows (no memory notes here).
        log = self._log.get(conversation_id, [])
        i = next((i for i, m in enumerate(log) if m.id == message_id), None)
        if i is None:
            return None
        if message_id in self._redacted:
            raise RedactionError(f"message {message_id} is already redacted")
        row = log[i]
        kind, call_id, old_text = row.kind, row.tool_call_id, row.content
        data: dict[str, Any] = {"redacted": {"by": by, "at": at, "reason": reason}}
        if isinstance(row.data, dict) and "author_id" in row.data:
            data["author_id"] = row.data["author_id"]
        log[i] = dataclasses.replace(
            row,
            content=content,
            arguments=None if row.arguments is None else "{}",
            data=data,
        )
        self._redacted.add(message_id)
        if kind == "tool_result" and call_id is not None:
            for qid, q in self._questions.items():
                if q.conversation_id != conversation_id or q.call_id != call_id:
                    continue
                if q.answer is None:
                    continue
                answer = q.answer
                self._questions[qid] = dataclasses.replace(q, answer=content)
                slack = answer.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
                for said in {answer, slack}:
                    if said and row.run_id is not None:
                        for k, e in self._outbox.items():
                            if e.run_id == row.run_id and said in e.text:
                                self._outbox[k] = dataclasses.replace(
                                    e, text=e.text.replace(said, content)
                                )
        entries = self._memory[conversation_id]
        for j, entry in enumerate(entries):
            cm = entry.message
            linked = cm.message_id == message_id or (
                cm.message_id is None and cm.role == kind and cm.content == old_text
            )
            new = tombstoned(cm, content, kind, call_id, linked=linked)
            if new != cm:
                entries[j] = MemoryEntry(pos=entry.pos, message=new)
        if kind == "assistant" and row.run_id is not None:
            for k, e in self._outbox.items():
                if e.run_id == row.run_id and e.text != "":
                    self._outbox[k] = dataclasses.replace(e, text=content)
        rec = self._conversations[conversation_id]
        if rec.title and rec.title in old_text:
            self._conversations[conversation_id] = dataclasses.replace(rec, title="(redacted)")
        done = Redaction(
            id=len(self._redactions) + 1, conversation_id=conversation_id,
            message_id=message_id, by=by, at=at, reason=reason, notes_removed=0,
        )  # fmt: skip
        self._redactions.append(done)
        return done

    async def redactions(
        self, conversation_id: str | None = None, *, limit: int = 100
    ) -> list[Redaction]:
        rows = [r for r in self._redactions if conversation_id in (None, r.conversation_id)]
        return rows[:limit]

    async def message_span(self, conversation_id: str) -> tuple[int, int] | None:
        log = self._log.get(conversation_id)
        if not log:
            return None
        return log[0].id, log[-1].id

    # -- budgets (issue 19: agentik.core.budgets; migration 7) ----------------------------
    async def budget_add(self, rows: Sequence[tuple[str, str, str, int, int]]) -> None:
        counters = self._budget
        for scope, subject, kind, window, amount in rows:
            key = (scope, subject, kind, window)
            counters[key] = counters.get(key, 0) + amount

    async def budget_take(
        self,
        checks: Sequence[tuple[str, str, str, int, int]],
        rows: Sequence[tuple[str, str, str, int, int]],
        *,
        held: tuple[str, str, int] | None = None,
    ) -> tuple[int, int] | None:
        # No await between the check and the add: atomic on the event loop.
        counters = self._budget
        for index, (scope, subject, kind, window, ceiling) in enumerate(checks):
            amount = counters.get((scope, subject, kind, window), 0)
            if held is not None and kind == held[0]:
                amount += sum(
                    n for (s, j, k, w), n in counters.items()
                    if s == scope and j == subject and k == held[1] and w >= held[2]
                )  # fmt: skip
            if amount >= ceiling:
                return index, amount
        for scope, subject, kind, window, n in rows:
            key = (scope, subject, kind, window)
            counters[key] = counters.get(key, 0) + n
        return None

    async def budget_usage(
        self, keys: Sequence[tuple[str, str]], windows: Mapping[str, int]
    ) -> dict[tuple[str, str, str], int]:
        counters = self._budget
        out: dict[tuple[str, str, str], int] = {}
        for scope, subject in keys:
            for kind, window in windows.items():
                amount = counters.get((scope, subject, kind, window))
                if amount is not None:
                    out[(scope, subject, kind)] = amount
        return out

    async def budget_prune(self, before: Mapping[str, int]) -> int:
        counters = self._budget
        old = [k for k in counters if k[2] in before and k[3] < before[k[2]]]
        for k in old:
            del counters[k]
        return len(old)

    async def budget_rows(self, since: int) -> list[tuple[str, str, str, int, int]]:
        counters = self._budget
        return sorted((*k, v) for k, v in counters.items() if k[3] >= since)

    # -- run trees (issue 20; migration 9) -------------------------------------------------
    async def run_add(self, run: RunRecord) -> None:
        self._runs.pop(run.run_id, None)  # replaced: written last
        self._runs[run.run_id] = run

    async def runs(self, conversation_id: str) -> list[RunRecord]:
        found = [
            r
            for r in self._runs.values()
            if conversation_id in (r.conversation_id, r.parent_conversation_id)
        ]
        return sorted(found, key=lambda r: (r.started, r.run_id))

    # -- access: roles granted in chat (issue 19, access) ---------------------------------
    async def access_grants(self) -> list[AccessGrant]:
        return [self._grants[k] for k in sorted(self._grants)]

    async def access_set(
        self, identity: str, role: str | None, *, by: str, channel: str | None = None
    ) -> None:
        now = time.time()
        old = self._grants.get(identity)
        if role is None:
            self._grants.pop(identity, None)
        else:
            self._grants[identity] = AccessGrant(
                identity=identity, role=role, granted_by=by, granted_at=now
            )
        self._access_audit.append(
            AccessChange(id=len(self._access_audit) + 1, at=now, actor=by, identity=identity,
                         old_role=old.role if old else None, new_role=role, channel=channel)
        )  # fmt: skip

    async def access_audit(self, *, limit: int = 100) -> list[AccessChange]:
        return list(reversed(self._access_audit[-limit:])) if limit > 0 else []

    # -- per-channel settings (issue 19, channel settings) ------------------------------
    async def channel_settings(self, channel_key: str) -> list[ChannelSetting]:
        return sorted(
            (s for (ck, _), s in self._chan_settings.items() if ck == channel_key),
            key=lambda s: s.key,
        )

    async def set_channel_setting(
        self, channel_key: str, key: str, value: str | None, *, actor: str, at: float
    ) -> str | None:
        found = self._chan_settings.get((channel_key, key))
        old = None if found is None else found.value
        if value is None and old is None:
            return None
        if value is None:
            del self._chan_settings[(channel_key, key)]
        else:
            self._chan_settings[(channel_key, key)] = ChannelSetting(
                channel_key=channel_key, key=key, value=value, set_by=actor, set_at=at
            )
        self._chan_changes.append(
            ChannelSettingChange(
                id=len(self._chan_changes) + 1, channel_key=channel_key, key=key,
                old_value=old, new_value=value, actor=actor, at=at,
            )
        )  # fmt: skip
        return old

    async def channel_setting_changes(
        self, channel_key: str | None = None, *, limit: int = 100
    ) -> list[ChannelSettingChange]:
        rows = [c for c in self._chan_changes if channel_key in (None, c.channel_key)]
        return rows[-limit:] if limit > 0 else []
