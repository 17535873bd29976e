"""The SQLite engine's scheduled-job claims (:class:`~.repositories.JobsRepository`;
migration 14)."""

from __future__ import annotations

import sqlite3

from .records import JobRun
from .sqlite_room import SQLiteRoom

__all__ = ["SQLiteJobs"]

#: The claim: the insert wins, or takes over a failed firing or a claim left
#: unfinished since before ``stale`` (NULL: never); RETURNING says whether a row
#: was written.
_CLAIM = (
    "INSERT INTO job_run (name, slot, worker, claimed_at) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (name, slot) DO UPDATE SET worker = excluded.worker,"
    " claimed_at = excluded.claimed_at, attempts = job_run.attempts + 1,"
    " finished_at = NULL, ok = NULL, detail = NULL"
    " WHERE job_run.ok = 0 OR (job_run.finished_at IS NULL AND job_run.claimed_at < ?)"
    " RETURNING 1"
)


class SQLiteJobs(SQLiteRoom):
    """Claims of scheduled-job firings."""

    async def job_claim(
        self, name: str, slot: str, worker: str, *, now: float, stale_after: float | None = None
    ) -> bool:
        stale = None if stale_after is None else now - stale_after

        def fn(conn: sqlite3.Connection) -> bool:
            return conn.execute(_CLAIM, (name, slot, worker, now, stale)).fetchone() is not None

        return bool(await self._write(fn))

    async def job_finish(
        self, name: str, slot: str, worker: str, *, ok: bool, detail: str | None, now: float
    ) -> bool:
        def fn(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "UPDATE job_run SET finished_at = ?, ok = ?, detail = ?"
                " WHERE name = ? AND slot = ? AND worker = ? AND finished_at IS NULL",
                (now, ok, detail, name, slot, worker),
            )
            return cur.rowcount > 0

        return bool(await self._write(fn))

    async def job_history(self, name: str, *, limit: int = 20) -> list[JobRun]:
        rows = await self._read(
            "SELECT name, slot, worker, claimed_at, finished_at, ok, detail, attempts"
            " FROM job_run WHERE name = ? ORDER BY claimed_at DESC, slot DESC LIMIT ?",
            (name, limit),
        )
        return [
            JobRun(
                name=r[0], slot=r[1], worker=r[2], claimed_at=float(r[3]), finished_at=r[4],
                ok=None if r[5] is None else bool(r[5]), detail=r[6], attempts=int(r[7]),
            )
            for r in rows
        ]  # fmt: skip

    async def job_prune(self, before: float) -> int:
        def fn(conn: sqlite3.Connection) -> int:
            return conn.execute("DELETE FROM job_run WHERE claimed_at < ?", (before,)).rowcount

        return int(await self._write(fn))
