"""The SQLite engine's runs aggregate (:class:`~.repositories.RunsRepository`)."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from .records import RunRecord
from .sqlite_room import SQLiteRoom
from .sqlite_writer import INSERT_RUN

__all__ = ["INSERT_RUN", "SQLiteRuns", "run_row"]


def run_row(run: RunRecord) -> tuple[Any, ...]:
    return (
        run.run_id,
        run.conversation_id,
        run.parent_run_id,
        run.parent_conversation_id,
        run.parent_call_id,
        run.agent,
        run.depth,
        run.started,
        run.ended,
        run.stop_reason,
        None if run.usage is None else json.dumps(run.usage),
    )


class SQLiteRuns(SQLiteRoom):
    """The run tree."""

    # -- run trees (issue 20; migration 9) -------------------------------------------------
    async def run_add(self, run: RunRecord) -> None:
        def fn(conn: sqlite3.Connection) -> None:
            conn.execute(INSERT_RUN, run_row(run))

        await self._write(fn)

    async def runs(self, conversation_id: str) -> list[RunRecord]:
        rows = await self._read(
            "SELECT run_id, conversation_id, parent_run_id, parent_conversation_id,"
            " parent_call_id, agent, depth, started, ended, stop_reason, usage FROM run"
            " WHERE conversation_id = ? OR parent_conversation_id = ? ORDER BY started, run_id",
            (conversation_id, conversation_id),
        )
        return [
            RunRecord(
                run_id=r[0],
                conversation_id=r[1],
                parent_run_id=r[2],
                parent_conversation_id=r[3],
                parent_call_id=r[4],
                agent=r[5],
                depth=int(r[6]),
                started=float(r[7]),
                ended=r[8],
                stop_reason=r[9],
                usage=None if r[10] is None else json.loads(r[10]),
            )
            for r in rows
        ]
