"""The PostgreSQL engine's leases and worker registry (:class:`~.repositories.LeaseRepository`,
:class:`~.repositories.WorkerRepository`; migration 2).

* Expiry is judged by the database server's clock (``clock_timestamp()``), never a
  worker's: workers whose clocks disagree still agree on who holds a lease.
* Taking a lease is one atomic statement (``INSERT ... ON CONFLICT ... DO UPDATE
  ... WHERE`` expired or already ours ``RETURNING``): of two workers asking at once,
  exactly one gets a row back.
* These statements run on the pool, each committed alone, not through the ordered
  writer: a renewal must not queue behind a batch of conversation writes.  Each is
  safe to repeat (taking what is ours again keeps the epoch; a renewal only moves
  the expiry), so one on a connection the server dropped is tried again.
"""

from __future__ import annotations

from typing import Any

from .postgres_room import PostgresRoom
from .records import Lease, WorkerBeat, WorkerInfo

__all__ = ["PostgresCluster"]

_NOW = "extract(epoch FROM clock_timestamp())::double precision"

_ACQUIRE = f"""
WITH now AS (SELECT {_NOW} AS t)
INSERT INTO lease AS l (name, owner, epoch, acquired_at, expires_at)
SELECT $1, $2, 1, now.t, now.t + $3::double precision FROM now
ON CONFLICT (name) DO UPDATE SET
    owner = excluded.owner,
    epoch = CASE WHEN l.owner = excluded.owner THEN l.epoch ELSE l.epoch + 1 END,
    acquired_at = CASE WHEN l.owner = excluded.owner THEN l.acquired_at
                       ELSE excluded.acquired_at END,
    expires_at = excluded.expires_at
WHERE l.owner = excluded.owner OR l.expires_at <= excluded.acquired_at
RETURNING name, owner, epoch, acquired_at, expires_at - (SELECT t FROM now)
"""
_LEASE = f"SELECT name, owner, epoch, acquired_at, expires_at - {_NOW} FROM lease"


def _lease(r: Any) -> Lease:
    return Lease(name=r[0], owner=r[1], epoch=int(r[2]), expires_in=float(r[4]),
                 acquired_at=float(r[3]))  # fmt: skip


class PostgresCluster(PostgresRoom):
    """Leases with a fencing epoch, and the workers' heartbeats."""

    async def lease_acquire(self, name: str, owner: str, ttl: float) -> Lease | None:
        rows = await self._read(_ACQUIRE, name, owner, float(ttl))
        return _lease(rows[0]) if rows else None

    async def lease_renew(self, name: str, owner: str, epoch: int, ttl: float) -> bool:
        rows = await self._read(
            f"UPDATE lease SET expires_at = {_NOW} + $4::double precision"
            " WHERE name = $1 AND owner = $2 AND epoch = $3 RETURNING 1",
            name, owner, epoch, float(ttl),
        )  # fmt: skip
        return bool(rows)

    async def lease_release(self, name: str, owner: str, epoch: int) -> bool:
        rows = await self._read(
            "UPDATE lease SET expires_at = 0 WHERE name = $1 AND owner = $2 AND epoch = $3"
            " RETURNING 1",
            name, owner, epoch,
        )  # fmt: skip
        return bool(rows)

    async def lease_get(self, name: str) -> Lease | None:
        rows = await self._read(_LEASE + " WHERE name = $1", name)
        return _lease(rows[0]) if rows else None

    async def leases(self, prefix: str = "") -> list[Lease]:
        rows = await self._read(_LEASE + " WHERE starts_with(name, $1) ORDER BY name", prefix)
        return [_lease(r) for r in rows]

    async def worker_beat(self, worker: str, info: WorkerInfo) -> None:
        await self._read(
            "INSERT INTO worker (id, host, pid, started_at, version, draining, last_beat)"
            f" VALUES ($1, $2, $3, $4, $5, $6, {_NOW}) ON CONFLICT (id) DO UPDATE SET"
            " host = excluded.host, pid = excluded.pid, started_at = excluded.started_at,"
            " version = excluded.version, draining = excluded.draining,"
            " last_beat = excluded.last_beat",
            worker, info.host, info.pid, info.started_at, info.version, info.draining,
        )  # fmt: skip

    async def workers(self) -> list[WorkerBeat]:
        rows = await self._read(
            "SELECT id, host, pid, started_at, version, draining, last_beat,"
            f" {_NOW} - last_beat FROM worker ORDER BY id"
        )
        return [
            WorkerBeat(
                worker=r[0],
                info=WorkerInfo(host=r[1], pid=int(r[2]), started_at=float(r[3]), version=r[4],
                                draining=bool(r[5])),
                last_beat=float(r[6]), age=float(r[7]),
            )
            for r in rows
        ]  # fmt: skip

    async def workers_forget(self, older_than: float) -> int:
        rows = await self._read(
            f"WITH d AS (DELETE FROM worker WHERE last_beat < {_NOW} - $1::double precision"
            " RETURNING 1) SELECT count(*) FROM d",
            float(older_than),
        )
        return int(rows[0][0])
