"""The memory engine's lifecycle aggregate (:class:`~.repositories.LifecycleRepository`):
snapshot rows out and in, retention's reads and prune, as the SQLite engine does them."""

from __future__ import annotations

import dataclasses
import itertools
import json
import time
from typing import Any

from ..messages import ChatMessage, Message
from .records import (
    Approval,
    Checklist,
    ConversationRecord,
    MemoryEntry,
    Question,
    RunRecord,
)
from .rows import (
    form_text,
    partial_text,
    relinker,
    snapshot_message,
    snapshot_turn_ends,
    snapshot_working_memory,
)
from .snapshot import (
    DELETED_NOTICE,
    RETENTION_AUTHOR,
    ImportResult,
    SnapshotError,
    SnapshotParts,
    timestamp,
    untrusted_meta,
    untrusted_row,
)

__all__ = ["MemoryLifecycle"]


class MemoryLifecycle:
    """Over :class:`~.memory.MemoryStore`'s state (declared here for the type checker)."""

    _conversations: dict[str, ConversationRecord]
    _bindings: dict[str, str]
    _bound_at: dict[str, float]
    _log: dict[str, list[Message]]
    _memory: dict[str, list[MemoryEntry]]
    _ended: dict[str, dict[str, str]]
    _ended_at: dict[str, dict[str, float]]
    _ids: itertools.count[int]
    _approvals: dict[int, Approval]
    _approval_ids: itertools.count[int]
    _questions: dict[int, Question]
    _question_ids: itertools.count[int]
    _todos: dict[str, Checklist]
    _runs: dict[str, RunRecord]
    _redacted: set[int]

    def _require(self, conversation_id: str) -> None:
        raise NotImplementedError

    # -- lifecycle: the rows of a snapshot ----------------------------------------------------
    async def export_rows(self, conversation_id: str) -> dict[str, list[dict[str, Any]]]:
        ends = self._ended.get(conversation_id, {})
        at = self._ended_at.get(conversation_id, {})
        return {
            "bindings": [
                {"channel_key": k, "created_at": self._bound_at.get(k, 0.0)}
                for k in sorted(self._bindings)
                if self._bindings[k] == conversation_id
            ],
            "turn_ends": [
                {"run_id": r, "outcome": ends[r], "created_at": at.get(r, 0.0)}
                for r in sorted(ends, key=lambda r: (at.get(r, 0.0), r))
            ],
            "approvals": [
                _approval_row(a)
                for _, a in sorted(self._approvals.items())
                if a.conversation_id == conversation_id
            ],
            "questions": [
                _question_row(q)
                for _, q in sorted(self._questions.items())
                if q.conversation_id == conversation_id
            ],
            "runs": [
                _run_row(r) for r in self._runs.values() if r.conversation_id == conversation_id
            ],
        }

    async def import_rows(
        self,
        doc: dict[str, Any],
        conversation_id: str,
        *,
        bind: str | None,
        now: float,
        parts: SnapshotParts | None = None,
    ) -> ImportResult:
        # What sqlite_lifecycle.import_rows does; every record is built before
        # anything is kept, so a snapshot that cannot be restored leaves nothing.
        cid = conversation_id
        conv = doc["conversation"]
        if cid in self._conversations:
            raise SnapshotError(
                f"conversation.id: {cid!r} already exists in this database (import with --new-ids)"
            )
        meta = untrusted_meta(conv["meta"])
        if bind is not None:
            meta["channel_key"] = bind
        mapping: dict[int, int] = {}
        log: list[Message] = []
        redacted: set[int] = set()
        for m in sorted(doc["messages"], key=lambda m: m["id"]):
            new_id = next(self._ids)
            mapping.setdefault(m["id"], new_id)
            message = snapshot_message(m, id=new_id, conversation_id=cid)
            log.append(message)
            if isinstance(message.data, dict) and isinstance(message.data.get("redacted"), dict):
                redacted.add(new_id)
        memory = [
            MemoryEntry(pos=pos, message=cm)
            for pos, cm in snapshot_working_memory(doc, relinker(mapping))
        ]
        ended: dict[str, str] = {}
        ended_at: dict[str, float] = {}
        for run_id, outcome, at in snapshot_turn_ends(doc, now):
            if run_id not in ended:  # the first row of a run counts (SQLite's OR IGNORE)
                ended[run_id], ended_at[run_id] = outcome, at
        approvals: list[Approval] = []
        questions: list[Question] = []
        runs: list[RunRecord] = []
        skipped_runs = 0
        for key, kind in (("approvals", Approval), ("questions", Question), ("runs", RunRecord)):
            names = {f.name for f in dataclasses.fields(kind)} - {"serial", "answered_by_id"}
            if kind is Question:
                names.discard("id")
            for i, r in enumerate(doc.get(key) or []):
                table = {"approvals": "approval", "questions": "question"}.get(key, "run")
                r = untrusted_row(table, dict(r), now)
                if kind is RunRecord:
                    if r.get("run_id") in self._runs or any(
                        x.run_id == r.get("run_id") for x in runs
                    ):
                        skipped_runs += 1
                        continue
                    if r.get("parent_conversation_id") not in (None, *self._conversations):
                        r["parent_conversation_id"] = None
                fields = {c: r[c] for c in r if c in names}
                fields["conversation_id"] = cid
                try:
                    if kind is Approval:
                        fields["self_approve"] = bool(fields.get("self_approve"))
                        approvals.append(Approval(**fields))
                    elif kind is Question:
                        raw = fields.get("choices")
                        fields["choices"] = tuple(
                            json.loads(raw) if isinstance(raw, str) else raw or ()
                        )
                        raw = fields.get("form")
                        fields["form"] = tuple(json.loads(raw)) if isinstance(raw, str) else ()
                        raw = fields.get("partial")
                        fields["partial"] = json.loads(raw) if isinstance(raw, str) else {}
                        questions.append(Question(**fields))
                    else:
                        raw = fields.get("usage")
                        fields["usage"] = json.loads(raw) if isinstance(raw, str) else raw
                        runs.append(RunRecord(**fields))
                except (TypeError, ValueError) as exc:
                    raise SnapshotError(f"{key}[{i}]: cannot be restored: {exc}") from exc
        todo = doc.get("todo")
        checklist = None
        if todo and todo["items"]:
            checklist = Checklist(
                items=tuple({"text": it["text"], "status": it["status"]} for it in todo["items"]),
                run_id=todo.get("run_id"),
                updated_at=timestamp(todo.get("updated_at"), now),
            )
        # Nothing failed: keep it all.
        self._conversations[cid] = ConversationRecord(
            id=cid, title=conv["title"], created_at=conv["created_at"],
            updated_at=conv["updated_at"], meta=meta,
        )  # fmt: skip
        self._log[cid] = log
        self._memory[cid] = memory
        self._ended[cid] = ended
        self._ended_at[cid] = ended_at
        self._redacted |= redacted
        for a in approvals:
            serial = next(self._approval_ids)
            self._approvals[serial] = dataclasses.replace(a, serial=serial)
        for q in questions:
            qid = next(self._question_ids)
            self._questions[qid] = dataclasses.replace(q, id=qid)
        for run in runs:
            self._runs[run.run_id] = run
        if checklist is not None:
            self._todos[cid] = checklist
        result = ImportResult(conversation_id=cid, messages=len(log))
        wanted = (
            [bind] if bind is not None else [b["channel_key"] for b in doc.get("bindings") or []]
        )
        for key in wanted:
            if key in self._bindings and bind is None:
                result.skipped_bindings.append(key)
                continue
            self._bindings[key] = cid
            self._bound_at[key] = now
            result.bound.append(key)
        if bind is None:
            if result.bound:
                meta["channel_key"] = result.bound[0]
            else:
                meta.pop("channel_key", None)
        if parts is not None:
            # (The conversation is here now, so none of these can fail; no await
            # in them yields, so nobody sees the import half done.  MemoryStore's
            # attachment, checkpoint and A2A repositories keep them.)
            store: Any = self
            for data, media_type, at in parts.attachments:
                await store.attachment_put(cid, data, media_type, at=at)
            for document, at, label, automatic in parts.checkpoints:
                await store.checkpoint_add(cid, document, at=at, label=label, automatic=automatic)
            for t in parts.a2a_tasks:
                if await store.a2a_task_get(t.owner, t.task_id) is not None:
                    result.skipped_tasks += 1  # the first copy stays
                    continue
                await store.a2a_task_put(dataclasses.replace(t, conversation_id=cid))
        return result

    async def retention_conversations(self) -> list[tuple[str, list[str], str | None]]:
        keys: dict[str, list[str]] = {}
        for key, cid in self._bindings.items():
            keys.setdefault(cid, []).append(key)
        out: list[tuple[str, list[str], str | None]] = []
        for r in sorted(self._conversations.values(), key=lambda r: (r.created_at, r.id)):
            mk = r.meta.get("channel_key") if isinstance(r.meta, dict) else None
            out.append((r.id, keys.get(r.id, []), mk if isinstance(mk, str) else None))
        return out

    async def log_outline(
        self, conversation_id: str
    ) -> list[tuple[int, str, float, str | None, str | None]]:
        return [
            (m.id, m.kind, m.created_at, m.author, m.run_id)
            for m in self._log.get(conversation_id, ())
        ]

    async def turn_ended(self, conversation_id: str, run_id: str) -> bool:
        return run_id in self._ended.get(conversation_id, {})

    async def prune_log(
        self, conversation_id: str, upto: int, *, summary: str | None, count: int
    ) -> None:
        # What sqlite_lifecycle.prune_log does (nothing to overwrite in memory).
        self._require(conversation_id)
        log = self._log[conversation_id]
        last = next((m for m in log if m.id == upto), None)
        kept = [m for m in log if m.id > upto]
        if summary is not None:
            kept.insert(
                0,
                Message(
                    id=upto, conversation_id=conversation_id, kind="assistant", content=summary,
                    author=RETENTION_AUTHOR, data={"retention": {"summarised": count}},
                    created_at=last.created_at if last else time.time(),
                ),
            )  # fmt: skip
        self._log[conversation_id] = kept
        entries = self._memory[conversation_id]
        first_kept = next(
            (
                e.pos
                for e in entries
                if e.message.message_id is not None and e.message.message_id > upto
            ),
            None,
        )
        covered = [e.pos for e in entries if first_kept is None or e.pos < first_kept]
        if covered:
            cut = max(covered)
            text = summary if summary is not None else DELETED_NOTICE.format(n=count)
            entry = ChatMessage(role="system", content=text, message_id=upto)
            self._memory[conversation_id] = [
                MemoryEntry(pos=cut, message=entry),
                *(e for e in entries if e.pos > cut),
            ]


# -- snapshot rows: the fields as the SQLite tables hold them (Store.export_rows) ---------------
def _approval_row(a: Approval) -> dict[str, Any]:
    return {
        "serial": a.serial, "id": a.id, "scope": a.scope, "conversation_id": a.conversation_id,
        "channel_key": a.channel_key, "run_id": a.run_id, "call_id": a.call_id, "tool": a.tool,
        "arguments": a.arguments, "digest": a.digest, "asker": a.asker, "asker_id": a.asker_id,
        "approvers": a.approvers, "self_approve": int(a.self_approve),
        "created_at": a.created_at, "expires_at": a.expires_at, "state": a.state,
        "decision": a.decision, "approver": a.approver, "approver_id": a.approver_id,
        "reason": a.reason, "resolved_at": a.resolved_at,
    }  # fmt: skip


def _question_row(q: Question) -> dict[str, Any]:
    return {
        "id": q.id, "conversation_id": q.conversation_id, "channel_key": q.channel_key,
        "run_id": q.run_id, "call_id": q.call_id, "asker_target": q.asker_target,
        "answer_from": q.answer_from, "text": q.text,
        "choices": json.dumps(list(q.choices), ensure_ascii=False), "digest": q.digest,
        "created_at": q.created_at, "deadline": q.deadline, "state": q.state,
        "outcome": q.outcome, "answer": q.answer, "answered_by": q.answered_by,
        "answered_at": q.answered_at, "form": form_text(q.form),
        "partial": partial_text(q.partial),
    }  # fmt: skip


def _run_row(r: RunRecord) -> dict[str, Any]:
    return {
        "run_id": r.run_id, "conversation_id": r.conversation_id,
        "parent_run_id": r.parent_run_id, "parent_conversation_id": r.parent_conversation_id,
        "parent_call_id": r.parent_call_id, "agent": r.agent, "depth": r.depth,
        "started": r.started, "ended": r.ended, "stop_reason": r.stop_reason,
        "usage": None if r.usage is None else json.dumps(r.usage),
    }  # fmt: skip
