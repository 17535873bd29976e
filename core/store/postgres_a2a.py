"""The PostgreSQL engine's A2A task records (:class:`~.repositories.A2ATaskRepository`):
one statement per write (a final record is kept whichever worker writes after it);
read with the text of each task's run from the audit log in the same statement."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import StoreError
from .postgres_room import PostgresRoom, nul_free
from .records import A2ATaskRecord

if TYPE_CHECKING:
    import asyncpg

__all__ = ["PostgresA2ATasks"]

_PUT = (
    "INSERT INTO a2a_task (owner, task_id, conversation_id, run_id, state, final, updated_at,"
    " body) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (owner, task_id) DO UPDATE SET"
    " conversation_id = excluded.conversation_id,"
    " run_id = COALESCE(excluded.run_id, a2a_task.run_id), state = excluded.state,"
    " final = excluded.final, updated_at = excluded.updated_at, body = excluded.body"
    " WHERE NOT a2a_task.final RETURNING task_id"
)

#: The record and its run's text: the first user row of the run (the
#: ``message_user_turn`` index) and the assistant rows after it, in order.
_SELECT = (
    "SELECT t.owner, t.task_id, t.conversation_id, t.run_id, t.state, t.final, t.updated_at,"
    " t.body, q.content, (SELECT string_agg(m.content, '' ORDER BY m.id) FROM message m"
    " WHERE m.conversation_id = t.conversation_id AND m.id > q.id AND m.run_id = t.run_id"
    " AND m.kind = 'assistant')"
    " FROM a2a_task t LEFT JOIN message q ON q.id = (SELECT min(u.id) FROM message u"
    " WHERE u.run_id = t.run_id AND u.kind = 'user' AND u.conversation_id = t.conversation_id)"
)


def _record(r: Sequence[Any]) -> A2ATaskRecord:
    return A2ATaskRecord(
        owner=r[0], task_id=r[1], conversation_id=r[2], run_id=r[3], state=r[4],
        final=bool(r[5]), updated_at=float(r[6]), body=r[7], question=r[8], answer=r[9],
    )  # fmt: skip


def _where(
    owner: str, conversation_id: str | None, state: str | None, since: float | None
) -> tuple[str, list[Any]]:
    sql = " WHERE t.owner = $1"
    params: list[Any] = [owner]
    if conversation_id is not None:
        params.append(conversation_id)
        sql += f" AND t.conversation_id = ${len(params)}"
    if state is not None:
        params.append(state)
        sql += f" AND t.state = ${len(params)}"
    if since is not None:
        params.append(since)
        sql += f" AND t.updated_at >= ${len(params)}"
    return sql, params


class PostgresA2ATasks(PostgresRoom):
    """Task records in the ``a2a_task`` table (migration 13), deleted with their
    conversation (a foreign key)."""

    async def a2a_task_put(self, record: A2ATaskRecord) -> bool:
        import asyncpg

        async def fn(conn: asyncpg.Connection) -> bool:
            try:
                row = await conn.fetchrow(
                    _PUT, nul_free(record.owner), nul_free(record.task_id),
                    record.conversation_id, record.run_id, record.state, record.final,
                    record.updated_at, nul_free(record.body),
                )  # fmt: skip
            except asyncpg.ForeignKeyViolationError:
                raise StoreError(
                    f"no conversation {record.conversation_id!r} for A2A task"
                ) from None
            return row is not None

        written: bool = await self._write(fn, single=True)
        return written

    async def a2a_task_get(self, owner: str, task_id: str) -> A2ATaskRecord | None:
        rows = await self._read(_SELECT + " WHERE t.owner = $1 AND t.task_id = $2", owner, task_id)
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
            params.extend(before)
            where += f" AND (t.updated_at, t.task_id) < (${len(params) - 1}, ${len(params)})"
        params.append(limit)
        rows = await self._read(
            _SELECT + where + f" ORDER BY t.updated_at DESC, t.task_id DESC LIMIT ${len(params)}",
            *params,
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
        rows = await self._read("SELECT count(*) FROM a2a_task t" + where, *params)
        return int(rows[0][0])

    async def a2a_conversation_tasks(self, conversation_id: str) -> list[A2ATaskRecord]:
        rows = await self._read(
            "SELECT owner, task_id, conversation_id, run_id, state, final, updated_at, body,"
            " NULL, NULL FROM a2a_task WHERE conversation_id = $1"
            ' ORDER BY updated_at, owner COLLATE "C", task_id COLLATE "C"',
            conversation_id,
        )
        return [_record(r) for r in rows]

    async def a2a_task_delete(self, owner: str, task_id: str) -> bool:
        async def fn(conn: asyncpg.Connection) -> bool:
            status = await conn.execute(
                "DELETE FROM a2a_task WHERE owner = $1 AND task_id = $2", owner, task_id
            )
            return bool(status != "DELETE 0")

        found: bool = await self._write(fn, single=True)
        return found
