"""The PostgreSQL engine's scheduled-job claims (:class:`~.repositories.JobsRepository`;
migration 3)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .postgres_room import PostgresRoom
from .records import JobRun

if TYPE_CHECKING:
    import asyncpg

__all__ = ["PostgresJobs"]

#: The claim, as SQLite's: one statement, atomic on its own.  Several workers
#: inserting the same key at once: one wins, the others wait for its commit and
#: find the row (ON CONFLICT), so none runs the firing a second time.
_CLAIM = (
    "INSERT INTO job_run (name, slot, worker, claimed_at) VALUES ($1, $2, $3, $4)"
    " ON CONFLICT (name, slot) DO UPDATE SET worker = excluded.worker,"
    " claimed_at = excluded.claimed_at, attempts = job_run.attempts + 1,"
    " finished_at = NULL, ok = NULL, detail = NULL"
    " WHERE NOT job_run.ok"
    " OR (job_run.finished_at IS NULL AND job_run.claimed_at < $5::double precision)"
    " RETURNING 1"
)


class PostgresJobs(PostgresRoom):
    """Claims of scheduled-job firings."""

    async def job_claim(
        self, name: str, slot: str, worker: str, *, now: float, stale_after: float | None = None
    ) -> bool:
        stale = None if stale_after is None else now - stale_after

        async def fn(conn: asyncpg.Connection) -> bool:
            return await conn.fetchval(_CLAIM, name, slot, worker, now, stale) is not None

        return bool(await self._write(fn, single=True))

    async def job_finish(
        self, name: str, slot: str, worker: str, *, ok: bool, detail: str | None, now: float
    ) -> bool:
        async def fn(conn: asyncpg.Connection) -> bool:
            status = await conn.execute(
                "UPDATE job_run SET finished_at = $1, ok = $2, detail = $3"
                " WHERE name = $4 AND slot = $5 AND worker = $6 AND finished_at IS NULL",
                now, ok, detail, name, slot, worker,
            )  # fmt: skip
            return bool(status != "UPDATE 0")

        return bool(await self._write(fn, single=True))

    async def job_history(self, name: str, *, limit: int = 20) -> list[JobRun]:
        rows = await self._read(
            "SELECT name, slot, worker, claimed_at, finished_at, ok, detail, attempts"
            " FROM job_run WHERE name = $1 ORDER BY claimed_at DESC, slot DESC LIMIT $2",
            name,
            limit,
        )
        return [
            JobRun(
                name=r[0], slot=r[1], worker=r[2], claimed_at=float(r[3]), finished_at=r[4],
                ok=r[5], detail=r[6], attempts=int(r[7]),
            )
            for r in rows
        ]  # fmt: skip

    async def job_prune(self, before: float) -> int:
        async def fn(conn: asyncpg.Connection) -> int:
            status = await conn.execute("DELETE FROM job_run WHERE claimed_at < $1", before)
            return int(status.split()[-1])

        return int(await self._write(fn, single=True))
