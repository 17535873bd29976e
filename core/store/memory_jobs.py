"""The in-memory engine's scheduled-job claims (:class:`~.repositories.JobsRepository`):
one process, so a claim is a dictionary entry; the same rules as the SQL engines."""

from __future__ import annotations

import dataclasses

from .records import JobRun

__all__ = ["MemoryJobs"]


class MemoryJobs:
    """Claims of scheduled-job firings, kept in a dictionary."""

    _job_rows: dict[tuple[str, str], JobRun] | None = None

    @property
    def _job_runs(self) -> dict[tuple[str, str], JobRun]:
        if self._job_rows is None:
            self._job_rows = {}
        return self._job_rows

    async def job_claim(
        self, name: str, slot: str, worker: str, *, now: float, stale_after: float | None = None
    ) -> bool:
        runs = self._job_runs
        old = runs.get((name, slot))
        if old is None:
            runs[(name, slot)] = JobRun(name=name, slot=slot, worker=worker, claimed_at=now)
            return True
        failed = old.ok is False
        stale = (
            old.finished_at is None
            and stale_after is not None
            and old.claimed_at < now - stale_after
        )
        if not (failed or stale):
            return False
        runs[(name, slot)] = dataclasses.replace(
            old, worker=worker, claimed_at=now, attempts=old.attempts + 1,
            finished_at=None, ok=None, detail=None,
        )  # fmt: skip
        return True

    async def job_finish(
        self, name: str, slot: str, worker: str, *, ok: bool, detail: str | None, now: float
    ) -> bool:
        old = self._job_runs.get((name, slot))
        if old is None or old.worker != worker or old.finished_at is not None:
            return False
        self._job_runs[(name, slot)] = dataclasses.replace(
            old, finished_at=now, ok=ok, detail=detail
        )
        return True

    async def job_history(self, name: str, *, limit: int = 20) -> list[JobRun]:
        mine = [r for r in self._job_runs.values() if r.name == name]
        mine.sort(key=lambda r: (r.claimed_at, r.slot), reverse=True)
        return mine[:limit]

    async def job_prune(self, before: float) -> int:
        old = [k for k, r in self._job_runs.items() if r.claimed_at < before]
        for k in old:
            del self._job_runs[k]
        return len(old)
