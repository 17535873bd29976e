"""The SQLite engine's waits aggregate (:class:`~.repositories.WaitsRepository`):
approvals, questions, the todo checklist."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from .records import Approval, ApprovalDecision, Checklist, Question, QuestionOutcome
from .rows import APPROVAL, CHECKLIST, QUESTION, form_text, partial_text
from .sqlite_room import SQLiteRoom

__all__ = ["SQLiteWaits"]


def _equal(**columns: Any) -> tuple[str, tuple[Any, ...]]:
    """`` WHERE a = ? AND b = ?`` (or nothing) and its parameters: the columns given
    a value other than ``None`` (the approvals' and questions' filters)."""
    given = {column: value for column, value in columns.items() if value is not None}
    cond = " AND ".join(f"{column} = ?" for column in given)
    return (f" WHERE {cond}" if cond else ""), tuple(given.values())


class SQLiteWaits(SQLiteRoom):
    """Approvals, questions and the checklist."""

    # -- approvals (issue 19, migration 6) -----------------------------------------------------
    async def approval_add(self, approval: Approval) -> int | None:
        a = approval
        row = (
            a.id, a.scope, a.conversation_id, a.channel_key, a.run_id, a.call_id, a.tool,
            a.arguments, a.digest, a.asker, a.asker_id, a.approvers, int(a.self_approve),
            a.created_at, a.expires_at,
        )  # fmt: skip

        def fn(conn: sqlite3.Connection) -> int | None:
            try:
                cur = conn.execute(
                    "INSERT INTO approval (id, scope, conversation_id, channel_key, run_id,"
                    " call_id, tool, arguments, digest, asker, asker_id, approvers, self_approve,"
                    " created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    row,
                )
            except sqlite3.IntegrityError as exc:
                if "approval" in str(exc) and "UNIQUE" in str(exc).upper():
                    return None  # the short id is taken in this scope
                raise
            return cur.lastrowid

        result: int | None = await self._write(fn)
        return result

    async def approval_resolve(
        self,
        serial: int,
        decision: ApprovalDecision,
        approver: str | None,
        approver_id: str | None,
        reason: str | None,
        at: float,
    ) -> bool:
        def fn(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "UPDATE approval SET state = 'resolved', decision = ?, approver = ?,"
                " approver_id = ?, reason = ?, resolved_at = ?"
                " WHERE serial = ? AND state = 'pending'",
                (decision, approver, approver_id, reason, at, serial),
            )
            return cur.rowcount > 0

        return bool(await self._write(fn))

    async def approval_rebind(self, serial: int, call_id: str) -> None:
        def fn(conn: sqlite3.Connection) -> None:
            conn.execute("UPDATE approval SET call_id = ? WHERE serial = ?", (call_id, serial))

        await self._write(fn)

    async def approval_get(self, serial: int) -> Approval | None:
        rows = await self._read(
            f"SELECT {APPROVAL.columns} FROM approval WHERE serial = ?", (serial,)
        )
        return APPROVAL.record(rows[0]) if rows else None

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
        cond, params = _equal(
            conversation_id=conversation_id, scope=scope, state=state, id=short_id
        )
        order = "DESC" if newest_first else "ASC"
        rows = await self._read(
            f"SELECT {APPROVAL.columns} FROM approval{cond} ORDER BY serial {order} LIMIT ?",
            (*params, limit),
        )
        return [APPROVAL.record(r) for r in rows]

    async def approval_used(self, conversation_id: str, tool: str) -> bool:
        rows = await self._read(
            "SELECT 1 FROM approval WHERE conversation_id = ? AND tool = ?"
            # An imported approval is history, never a use (agentik.core.lifecycle).
            " AND decision = 'approved' AND substr(scope, 1, 9) != 'imported:' LIMIT 1",
            (conversation_id, tool),
        )
        return bool(rows)

    # -- questions (issue 20: ask_user, migration 10) -----------------------------------------
    async def question_add(self, question: Question) -> int:
        q = question
        row = (
            q.conversation_id, q.channel_key, q.run_id, q.call_id, q.asker_target, q.answer_from,
            q.text, json.dumps(list(q.choices), ensure_ascii=False), q.digest, q.created_at,
            q.deadline, form_text(q.form), partial_text(q.partial),
        )  # fmt: skip

        def fn(conn: sqlite3.Connection) -> int:
            cur = conn.execute(
                "INSERT INTO question (conversation_id, channel_key, run_id, call_id,"
                " asker_target, answer_from, text, choices, digest, created_at, deadline,"
                " form, partial) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                row,
            )
            return int(cur.lastrowid or 0)

        result: int = await self._write(fn)
        return result

    async def question_settle(
        self,
        question_id: int,
        outcome: QuestionOutcome,
        answer: str | None,
        answered_by: str | None,
        at: float,
    ) -> bool:
        def fn(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "UPDATE question SET state = 'resolved', outcome = ?, answer = ?,"
                " answered_by = ?, answered_at = ?, partial = NULL"
                " WHERE id = ? AND state = 'pending'",
                (outcome, answer, answered_by, at, question_id),
            )
            return cur.rowcount > 0

        return bool(await self._write(fn))

    async def question_answer_part(
        self, question_id: int, answers: dict[str, str | None]
    ) -> dict[str, str | None] | None:
        def fn(conn: sqlite3.Connection) -> dict[str, str | None] | None:
            # Read and write in the one transaction of the writer: parts given at
            # once by two people both stay.
            row = conn.execute(
                "SELECT partial FROM question WHERE id = ? AND state = 'pending'", (question_id,)
            ).fetchone()
            if row is None:
                return None
            merged: dict[str, str | None] = {**(json.loads(row[0]) if row[0] else {}), **answers}
            conn.execute(
                "UPDATE question SET partial = ? WHERE id = ?", (partial_text(merged), question_id)
            )
            return merged

        result: dict[str, str | None] | None = await self._write(fn)
        return result

    async def question_rebind(self, question_id: int, call_id: str) -> None:
        def fn(conn: sqlite3.Connection) -> None:
            conn.execute("UPDATE question SET call_id = ? WHERE id = ?", (call_id, question_id))

        await self._write(fn)

    async def question_get(self, question_id: int) -> Question | None:
        rows = await self._read(
            f"SELECT {QUESTION.columns} FROM question WHERE id = ?", (question_id,)
        )
        return QUESTION.record(rows[0]) if rows else None

    async def questions(
        self, *, conversation_id: str | None = None, state: str | None = None
    ) -> list[Question]:
        cond, params = _equal(conversation_id=conversation_id, state=state)
        rows = await self._read(
            f"SELECT {QUESTION.columns} FROM question{cond} ORDER BY id", params
        )
        return [QUESTION.record(r) for r in rows]

    # -- the todo checklist (issue 20, migration 13) --------------------------------------------
    async def todo_get(self, conversation_id: str) -> Checklist | None:
        rows = await self._read(
            f"SELECT {CHECKLIST.columns} FROM todo WHERE conversation_id = ?", (conversation_id,)
        )
        return CHECKLIST.record(rows[0]) if rows else None

    async def todo_set(self, conversation_id: str, checklist: Checklist | None) -> None:
        def fn(conn: sqlite3.Connection) -> None:
            if checklist is None or not checklist.items:
                conn.execute("DELETE FROM todo WHERE conversation_id = ?", (conversation_id,))
                return
            conn.execute(
                "INSERT INTO todo (conversation_id, items, run_id, updated_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (conversation_id) DO UPDATE SET items = excluded.items,"
                " run_id = excluded.run_id, updated_at = excluded.updated_at",
                (
                    conversation_id,
                    json.dumps(list(checklist.items), ensure_ascii=False),
                    checklist.run_id,
                    checklist.updated_at,
                ),
            )

        await self._write(fn)
