"""The PostgreSQL engine's waits aggregate (:class:`~.repositories.WaitsRepository`):
approvals, questions, the todo checklist."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .postgres_room import PostgresRoom, dumps, nul_free
from .records import Approval, ApprovalDecision, Checklist, Question, QuestionOutcome
from .rows import (
    APPROVAL,
    APPROVAL_COLUMNS,
    CHECKLIST,
    QUESTION,
    QUESTION_COLUMNS,
    form_text,
    partial_text,
)

if TYPE_CHECKING:
    import asyncpg

__all__ = ["APPROVAL_COLUMNS", "QUESTION_COLUMNS", "PostgresWaits"]


def _equal(**columns: Any) -> tuple[str, list[Any]]:
    """`` WHERE a = $1 AND b = $2`` (or nothing) and its arguments: the columns given a
    value other than ``None`` (the approvals' and questions' filters)."""
    given = {column: value for column, value in columns.items() if value is not None}
    cond = " AND ".join(f"{column} = ${i}" for i, column in enumerate(given, 1))
    return (f" WHERE {cond}" if cond else ""), list(given.values())


class PostgresWaits(PostgresRoom):
    """Approvals, questions and the checklist."""

    # -- approvals --------------------------------------------------------------------------
    async def approval_add(self, approval: Approval) -> int | None:
        a = approval
        args = (
            a.id, a.scope, a.conversation_id, a.channel_key, a.run_id, a.call_id, a.tool,
            nul_free(a.arguments), a.digest, a.asker, a.asker_id, a.approvers, a.self_approve,
            a.created_at, a.expires_at,
        )  # fmt: skip

        async def fn(conn: asyncpg.Connection) -> int | None:
            # The short id is taken in this scope: None (the caller picks another).
            serial = await conn.fetchval(
                "INSERT INTO approval (id, scope, conversation_id, channel_key, run_id, call_id,"
                " tool, arguments, digest, asker, asker_id, approvers, self_approve, created_at,"
                " expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13,"
                " $14, $15) ON CONFLICT (scope, id) WHERE state = 'pending' DO NOTHING"
                " RETURNING serial",
                *args,
            )
            return None if serial is None else int(serial)

        result: int | None = await self._write(fn, single=True)
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
        async def fn(conn: asyncpg.Connection) -> bool:
            status = await conn.execute(
                "UPDATE approval SET state = 'resolved', decision = $1, approver = $2,"
                " approver_id = $3, reason = $4, resolved_at = $5"
                " WHERE serial = $6 AND state = 'pending'",
                decision, approver, approver_id, nul_free(reason), at, serial,
            )  # fmt: skip
            return bool(status != "UPDATE 0")

        return bool(await self._write(fn, single=True))

    async def approval_rebind(self, serial: int, call_id: str) -> None:
        async def fn(conn: asyncpg.Connection) -> None:
            await conn.execute(
                "UPDATE approval SET call_id = $1 WHERE serial = $2", call_id, serial
            )

        await self._write(fn)

    async def approval_get(self, serial: int) -> Approval | None:
        rows = await self._read(
            f"SELECT {APPROVAL.columns} FROM approval WHERE serial = $1", serial
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
        cond, args = _equal(conversation_id=conversation_id, scope=scope, state=state, id=short_id)
        order = "DESC" if newest_first else "ASC"
        rows = await self._read(
            f"SELECT {APPROVAL.columns} FROM approval{cond} ORDER BY serial {order}"
            f" LIMIT ${len(args) + 1}",
            *args,
            limit,
        )
        return [APPROVAL.record(r) for r in rows]

    async def approval_used(self, conversation_id: str, tool: str) -> bool:
        rows = await self._read(
            "SELECT 1 FROM approval WHERE conversation_id = $1 AND tool = $2"
            # An imported approval is history, never a use (agentik.core.lifecycle).
            " AND decision = 'approved' AND left(scope, 9) != 'imported:' LIMIT 1",
            conversation_id,
            tool,
        )
        return bool(rows)

    # -- questions --------------------------------------------------------------------------
    async def question_add(self, question: Question) -> int:
        q = question
        args = (
            q.conversation_id, q.channel_key, q.run_id, q.call_id, q.asker_target, q.answer_from,
            nul_free(q.text), dumps(list(q.choices)), q.digest, q.created_at, q.deadline,
            form_text(q.form), partial_text(q.partial),
        )  # fmt: skip

        async def fn(conn: asyncpg.Connection) -> int:
            return int(
                await conn.fetchval(
                    "INSERT INTO question (conversation_id, channel_key, run_id, call_id,"
                    " asker_target, answer_from, text, choices, digest, created_at, deadline,"
                    " form, partial)"
                    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"
                    " RETURNING id",
                    *args,
                )
            )

        result: int = await self._write(fn, single=True)
        return result

    async def question_settle(
        self,
        question_id: int,
        outcome: QuestionOutcome,
        answer: str | None,
        answered_by: str | None,
        at: float,
    ) -> bool:
        async def fn(conn: asyncpg.Connection) -> bool:
            status = await conn.execute(
                "UPDATE question SET state = 'resolved', outcome = $1, answer = $2,"
                " answered_by = $3, answered_at = $4, partial = NULL"
                " WHERE id = $5 AND state = 'pending'",
                outcome, nul_free(answer), answered_by, at, question_id,
            )  # fmt: skip
            return bool(status != "UPDATE 0")

        return bool(await self._write(fn, single=True))

    async def question_answer_part(
        self, question_id: int, answers: dict[str, str | None]
    ) -> dict[str, str | None] | None:
        async def fn(conn: asyncpg.Connection) -> dict[str, str | None] | None:
            # The row locked: parts given at once through two workers both stay.
            rows = await conn.fetch(
                "SELECT partial FROM question WHERE id = $1 AND state = 'pending' FOR UPDATE",
                question_id,
            )
            if not rows:
                return None
            old = rows[0][0]
            merged: dict[str, str | None] = {**(json.loads(old) if old else {}), **answers}
            await conn.execute(
                "UPDATE question SET partial = $1 WHERE id = $2", partial_text(merged), question_id
            )
            return merged

        result: dict[str, str | None] | None = await self._write(fn, single=True)
        return result

    async def question_rebind(self, question_id: int, call_id: str) -> None:
        async def fn(conn: asyncpg.Connection) -> None:
            await conn.execute(
                "UPDATE question SET call_id = $1 WHERE id = $2", call_id, question_id
            )

        await self._write(fn)

    async def question_get(self, question_id: int) -> Question | None:
        rows = await self._read(
            f"SELECT {QUESTION.columns} FROM question WHERE id = $1", question_id
        )
        return QUESTION.record(rows[0]) if rows else None

    async def questions(
        self, *, conversation_id: str | None = None, state: str | None = None
    ) -> list[Question]:
        cond, args = _equal(conversation_id=conversation_id, state=state)
        rows = await self._read(f"SELECT {QUESTION.columns} FROM question{cond} ORDER BY id", *args)
        return [QUESTION.record(r) for r in rows]

    # -- the todo checklist -----------------------------------------------------------------
    async def todo_get(self, conversation_id: str) -> Checklist | None:
        rows = await self._read(
            f"SELECT {CHECKLIST.columns} FROM todo WHERE conversation_id = $1", conversation_id
        )
        return CHECKLIST.record(rows[0]) if rows else None

    async def todo_set(self, conversation_id: str, checklist: Checklist | None) -> None:
        async def fn(conn: asyncpg.Connection) -> None:
            if checklist is None or not checklist.items:
                await conn.execute("DELETE FROM todo WHERE conversation_id = $1", conversation_id)
                return
            await conn.execute(
                "INSERT INTO todo (conversation_id, items, run_id, updated_at)"
                " VALUES ($1, $2, $3, $4) ON CONFLICT (conversation_id) DO UPDATE SET"
                " items = excluded.items, run_id = excluded.run_id,"
                " updated_at = excluded.updated_at",
                conversation_id,
                dumps(list(checklist.items)),
                checklist.run_id,
                checklist.updated_at,
            )

        await self._write(fn, conversation_id=conversation_id, single=True)
