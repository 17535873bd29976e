"""The SQLite engine's leases and worker registry (:class:`~.repositories.LeaseRepository`,
:class:`~.repositories.WorkerRepository`; migration 15).

Each change runs in the single writer, in one transaction (``BEGIN IMMEDIATE``), so
reading a lease and taking it is one atomic step, also against another process on
the same file.  The clock is this machine's (one machine shares a SQLite file).
A bot on SQLite keeps its connections' leases in memory
(:mod:`agentik.bot.ownership`); these keep the store contract whole.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from .records import Lease, WorkerBeat, WorkerInfo
from .sqlite_room import SQLiteRoom

__all__ = ["SQLiteCluster"]

_LEASE = "SELECT name, owner, epoch, acquired_at, expires_at FROM lease"


def _lease(r: Any, now: float) -> Lease:
    return Lease(name=r[0], owner=r[1], epoch=int(r[2]), expires_in=float(r[4]) - now,
                 acquired_at=float(r[3]))  # fmt: skip


class SQLiteCluster(SQLiteRoom):
    """Leases with a fencing epoch, and the workers' heartbeats."""

    async def lease_acquire(self, name: str, owner: str, ttl: float) -> Lease | None:
        def fn(conn: sqlite3.Connection) -> Lease | None:
            now = time.time()
            row = conn.execute(_LEASE + " WHERE name = ?", (name,)).fetchone()
            if row is None:
                row = (name, owner, 1, now, now + ttl)
                conn.execute("INSERT INTO lease VALUES (?, ?, ?, ?, ?)", row)
            elif row[1] == owner:
                row = (*row[:4], now + ttl)
                conn.execute("UPDATE lease SET expires_at = ? WHERE name = ?", (now + ttl, name))
            elif row[4] <= now:
                row = (name, owner, int(row[2]) + 1, now, now + ttl)
                conn.execute(
                    "UPDATE lease SET owner = ?, epoch = ?, acquired_at = ?, expires_at = ?"
                    " WHERE name = ?",
                    (*row[1:], name),
                )
            else:
                return None
            return _lease(row, now)

        result: Lease | None = await self._write(fn)
        return result

    async def lease_renew(self, name: str, owner: str, epoch: int, ttl: float) -> bool:
        def fn(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "UPDATE lease SET expires_at = ? WHERE name = ? AND owner = ? AND epoch = ?",
                (time.time() + ttl, name, owner, epoch),
            )
            return cur.rowcount == 1

        return bool(await self._write(fn))

    async def lease_release(self, name: str, owner: str, epoch: int) -> bool:
        def fn(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "UPDATE lease SET expires_at = 0 WHERE name = ? AND owner = ? AND epoch = ?",
                (name, owner, epoch),
            )
            return cur.rowcount == 1

        return bool(await self._write(fn))

    async def lease_get(self, name: str) -> Lease | None:
        rows = await self._read(_LEASE + " WHERE name = ?", (name,))
        return _lease(rows[0], time.time()) if rows else None

    async def leases(self, prefix: str = "") -> list[Lease]:
        # substr, not LIKE: a prefix may hold '%' or '_'.
        rows = await self._read(
            _LEASE + " WHERE substr(name, 1, ?) = ? ORDER BY name", (len(prefix), prefix)
        )
        now = time.time()
        return [_lease(r, now) for r in rows]

    async def worker_beat(self, worker: str, info: WorkerInfo) -> None:
        def fn(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO worker (id, host, pid, started_at, version, draining, last_beat)"
                " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET"
                " host = excluded.host, pid = excluded.pid, started_at = excluded.started_at,"
                " version = excluded.version, draining = excluded.draining,"
                " last_beat = excluded.last_beat",
                (worker, info.host, info.pid, info.started_at, info.version, int(info.draining),
                 time.time()),
            )  # fmt: skip

        await self._write(fn)

    async def workers(self) -> list[WorkerBeat]:
        rows = await self._read(
            "SELECT id, host, pid, started_at, version, draining, last_beat FROM worker ORDER BY id"
        )
        now = time.time()
        return [
            WorkerBeat(
                worker=r[0],
                info=WorkerInfo(host=r[1], pid=int(r[2]), started_at=float(r[3]), version=r[4],
                                draining=bool(r[5])),
                last_beat=float(r[6]), age=now - float(r[6]),
            )
            for r in rows
        ]  # fmt: skip

    async def workers_forget(self, older_than: float) -> int:
        def fn(conn: sqlite3.Connection) -> int:
            cut = time.time() - older_than
            return conn.execute("DELETE FROM worker WHERE last_beat < ?", (cut,)).rowcount

        return int(await self._write(fn))
