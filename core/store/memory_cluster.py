"""Leases and the worker registry kept in process memory
(:class:`~.repositories.LeaseRepository`, :class:`~.repositories.WorkerRepository`).

The in-memory engine's (:class:`~.memory.MemoryStore`), and what a bot on a store
that one process keeps (SQLite) uses for its connections' leases: one worker,
every lease granted (:mod:`agentik.bot.ownership`).  The clock is this process's.
"""

from __future__ import annotations

import time

from .records import Lease, WorkerBeat, WorkerInfo

__all__ = ["MemoryCluster"]


class MemoryCluster:
    """Leases and workers in dictionaries; state is created on first use (a mixin)."""

    _lease_rows: dict[str, list[object]]
    _worker_rows: dict[str, tuple[WorkerInfo, float]]

    def _lease_table(self) -> dict[str, list[object]]:
        try:
            return self._lease_rows
        except AttributeError:
            self._lease_rows = {}
            return self._lease_rows

    def _worker_table(self) -> dict[str, tuple[WorkerInfo, float]]:
        try:
            return self._worker_rows
        except AttributeError:
            self._worker_rows = {}
            return self._worker_rows

    @staticmethod
    def _lease(name: str, row: list[object], now: float) -> Lease:
        owner, epoch, acquired_at, expires_at = row
        assert isinstance(owner, str) and isinstance(epoch, int)
        assert isinstance(acquired_at, float) and isinstance(expires_at, float)
        return Lease(name=name, owner=owner, epoch=epoch, expires_in=expires_at - now,
                     acquired_at=acquired_at)  # fmt: skip

    async def lease_acquire(self, name: str, owner: str, ttl: float) -> Lease | None:
        now = time.time()
        table = self._lease_table()
        row = table.get(name)
        if row is None:
            row = table[name] = [owner, 1, now, now + ttl]
        elif row[0] == owner:
            row[3] = now + ttl
        elif row[3] <= now:  # type: ignore[operator]
            row[:] = [owner, row[1] + 1, now, now + ttl]  # type: ignore[operator]
        else:
            return None
        return self._lease(name, row, now)

    async def lease_renew(self, name: str, owner: str, epoch: int, ttl: float) -> bool:
        row = self._lease_table().get(name)
        if row is None or row[0] != owner or row[1] != epoch:
            return False
        row[3] = time.time() + ttl
        return True

    async def lease_release(self, name: str, owner: str, epoch: int) -> bool:
        row = self._lease_table().get(name)
        if row is None or row[0] != owner or row[1] != epoch:
            return False
        row[3] = 0.0
        return True

    async def lease_get(self, name: str) -> Lease | None:
        row = self._lease_table().get(name)
        return None if row is None else self._lease(name, row, time.time())

    async def leases(self, prefix: str = "") -> list[Lease]:
        now = time.time()
        table = self._lease_table()
        return [self._lease(n, table[n], now) for n in sorted(table) if n.startswith(prefix)]

    async def worker_beat(self, worker: str, info: WorkerInfo) -> None:
        self._worker_table()[worker] = (info, time.time())

    async def workers(self) -> list[WorkerBeat]:
        now = time.time()
        table = self._worker_table()
        return [
            WorkerBeat(worker=w, info=table[w][0], last_beat=table[w][1], age=now - table[w][1])
            for w in sorted(table)
        ]

    async def workers_forget(self, older_than: float) -> int:
        table = self._worker_table()
        cut = time.time() - older_than
        gone = [w for w, (_, beat) in table.items() if beat < cut]
        for w in gone:
            del table[w]
        return len(gone)
