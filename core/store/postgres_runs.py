"""The PostgreSQL engine's runs aggregate (:class:`~.repositories.RunsRepository`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .postgres_room import PostgresRoom, dumps
from .records import RunRecord

if TYPE_CHECKING:
    import asyncpg

__all__ = ["RUN_COLUMNS", "UPSERT_RUN", "PostgresRuns", "run_args"]

RUN_COLUMNS = (
    "run_id, conversation_id, parent_run_id, parent_conversation_id, parent_call_id, agent,"
    " depth, started, ended, stop_reason, usage"
)
#: A run recorded again replaces the row, and counts as written last (SQLite's
#: ``INSERT OR REPLACE`` gives it a new rowid: exports list runs in that order).
UPSERT_RUN = (
    f"INSERT INTO run ({RUN_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
    " ON CONFLICT (run_id) DO UPDATE SET conversation_id = excluded.conversation_id,"
    " parent_run_id = excluded.parent_run_id,"
    " parent_conversation_id = excluded.parent_conversation_id,"
    " parent_call_id = excluded.parent_call_id, agent = excluded.agent,"
    " depth = excluded.depth, started = excluded.started, ended = excluded.ended,"
    " stop_reason = excluded.stop_reason, usage = excluded.usage,"
    " written = nextval(pg_get_serial_sequence('run', 'written'))"
)


def run_args(run: RunRecord) -> tuple[Any, ...]:
    return (
        run.run_id, run.conversation_id, run.parent_run_id, run.parent_conversation_id,
        run.parent_call_id, run.agent, run.depth, run.started, run.ended, run.stop_reason,
        dumps(run.usage),
    )  # fmt: skip


class PostgresRuns(PostgresRoom):
    """The run tree."""

    async def run_add(self, run: RunRecord) -> None:
        async def fn(conn: asyncpg.Connection) -> None:
            await conn.execute(UPSERT_RUN, *run_args(run))

        await self._write(fn, single=True)

    async def runs(self, conversation_id: str) -> list[RunRecord]:
        rows = await self._read(
            f"SELECT {RUN_COLUMNS} FROM run WHERE conversation_id = $1"
            " OR parent_conversation_id = $1 ORDER BY started, run_id",
            conversation_id,
        )
        return [
            RunRecord(
                run_id=r[0], conversation_id=r[1], parent_run_id=r[2],
                parent_conversation_id=r[3], parent_call_id=r[4], agent=r[5], depth=int(r[6]),
                started=float(r[7]), ended=r[8], stop_reason=r[9],
                usage=None if r[10] is None else json.loads(r[10]),
            )
            for r in rows
        ]  # fmt: skip
