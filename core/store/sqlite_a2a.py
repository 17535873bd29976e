"""The SQLite engine's A2A task records (:class:`~.repositories.A2ATaskRepository`):
written through the one writer; read with the text of each task's run from the audit
log in the same statement."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from ..errors import StoreError
from .records import A2ATaskRecord
from .sqlite_room import SQLiteRoom

__all__ = ["SQLiteA2ATasks"]

#: A final record is never replaced; a NULL run id keeps the stored one.
_PUT = (
    "INSERT INTO a2a_task (owner, task_id, conversation_id, run_id, state, final, updated_at,"
    " body) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (owner, task_id) DO UPDATE SET"
    " conversation_id = excluded.conversation_id,"
    " run_id = COALESCE(excluded.run_id, a2a_task.run_id), state = excluded.state,"
    " final = excluded.final, updated_at = excluded.updated_at, body = excluded.body"
    " WHERE a2a_task.final = 0 RETURNING task_id"
)

#: The record and its run's text: the user row (found by the ``message_user_turn``
#: index) and the assistant rows after it in the conversation, in order.
_SELECT = (
    "SELECT t.owner, t.task_id, t.conversation_id, t.run_id, t.state, t.final, t.updated_at,"
    " t.body, q.id, q.content, (SELECT group_concat(content, '') FROM (SELECT m.content"
    " FROM message m WHERE m.conversation_id = t.conversation_id AND m.id > q.id"
    " AND m.run_id = t.run_id AND m.kind = 'assistant' ORDER BY m.id))"
    " FROM a2a_task t LEFT JOIN message q ON q.id = (SELECT MIN(u.id) FROM message u"
    " WHERE u.run_id = t.run_id AND u.kind = 'user' AND u.conversation_id = t.conversation_id)"
)


def _record(r: Sequence[Any]) -> A2ATaskRecord:
    return A2ATaskRecord(
        owner=r[0], task_id=r[1], conversation_id=r[2], run_id=r[3], state=r[4],
        final=bool(r[5]), updated_at=float(r[6]), body=r[7], question=r[9],
        answer=r[10],
    )  # fmt: skip


def _where(
    owner: str, conversation_id: str | None, state: str | None, since: float | None
) -> tuple[str, list[Any]]:
    sql = " WHERE t.owner = ?"
    params: list[Any] = [owner]
    if conversation_id is not None:
        sql += " AND t.conversation_id = ?"
        params.append(conversation_id)
    if state is not None:
        sql += " AND t.state = ?"
        params.append(state)
    if since is not None:
        sql += " AND t.updated_at >= ?"
        params.append(since)
    return sql, params


class SQLiteA2ATasks(SQLiteRoom):
    """Task records in the ``a2a_task`` table (migration 24), deleted with their
    conversation (a foreign key)."""

    async def a2a_task_put(self, record: A2ATaskRecord) -> bool:
        row = (
            record.owner, record.task_id, record.conversation_id, record.run_id,
            record.state, int(record.final), record.updated_at, record.body,
        )  # fmt: skip

        def fn(conn: sqlite3.Connection) -> bool:
            try:
                return conn.execute(_PUT, row).fetchone() is not None
            except sqlite3.IntegrityError as exc:
                raise StoreError(
                    f"no conversation {record.conversation_id!r} for A2A task: {exc}"
                ) from None

        written: bool = await self._write(fn)
        return written

    async def a2a_task_get(self, owner: str, task_id: str) -> A2ATaskRecord | None:
        rows = await self._read(_SELECT + " WHERE t.owner = ? AND t.task_id = ?", (owner, task_id))
        return _record(rows[0]) if rows else None

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
        where, params = _where(owner, conversation_id, state, since)
        if before is not None:
            where += " AND (t.updated_at, t.task_id) < (?, ?)"
            params.extend(before)
        rows = await self._read(
            _SELECT + where + " ORDER BY t.updated_at DESC, t.task_id DESC LIMIT ?",
            (*params, limit),
        )
        return [_record(r) for r in rows]

    async def a2a_task_count(
        self,
        owner: str,
        *,
        conversation_id: str | None = None,
        state: str | None = None,
        since: float | None = None,
    ) -> int:
        where, params = _where(owner, conversation_id, state, since)
        rows = await self._read("SELECT COUNT(*) FROM a2a_task t" + where, params)
        return int(rows[0][0])

    async def a2a_conversation_tasks(self, conversation_id: str) -> list[A2ATaskRecord]:
        rows = await self._read(
            "SELECT owner, task_id, conversation_id, run_id, state, final, updated_at, body"
            " FROM a2a_task WHERE conversation_id = ? ORDER BY updated_at, owner, task_id",
            (conversation_id,),
        )
        return [_record((*r, None, None, None)) for r in rows]

    async def a2a_task_delete(self, owner: str, task_id: str) -> bool:
        def fn(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "DELETE FROM a2a_task WHERE owner = ? AND task_id = ?", (owner, task_id)
            )
            return cur.rowcount > 0

        found: bool = await self._write(fn)
        return found
