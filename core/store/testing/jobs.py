"""The jobs aggregate: claims of scheduled-job firings (agentik.core.cluster.jobs)."""

from __future__ import annotations

import asyncio
from typing import Any

from .kit import ContractBase

__all__ = ["JobsContract"]


class JobsContract(ContractBase):
    """Each (job, slot) is claimed once; a claim records its worker and outcome."""

    async def test_a_slot_is_claimed_once(self, store: Any) -> None:
        assert await store.job_claim("retention", "s1", "w1", now=10.0) is True
        assert await store.job_claim("retention", "s1", "w2", now=11.0) is False
        assert await store.job_claim("retention", "s1", "w1", now=12.0) is False
        # Another slot, another job: claims of their own.
        assert await store.job_claim("retention", "s2", "w2", now=13.0) is True
        assert await store.job_claim("reflection", "s1", "w2", now=14.0) is True
        [second, first] = await store.job_history("retention")
        assert (first.slot, first.worker, first.claimed_at, first.attempts) == ("s1", "w1", 10.0, 1)
        assert (first.finished_at, first.ok, first.detail) == (None, None, None)
        assert (second.slot, second.worker) == ("s2", "w2")

    async def test_claims_made_at_once_have_one_winner(self, store: Any) -> None:
        won = await asyncio.gather(
            *(store.job_claim("j", "slot", f"w{i}", now=1.0) for i in range(20))
        )
        assert won.count(True) == 1
        [row] = await store.job_history("j")
        assert row.worker == f"w{won.index(True)}"

    async def test_a_finished_claim_keeps_its_outcome(self, store: Any) -> None:
        await store.job_claim("j", "a", "w1", now=1.0)
        await store.job_claim("j", "b", "w1", now=2.0)
        assert await store.job_finish("j", "a", "w1", ok=True, detail="3 pruned", now=5.0)
        assert await store.job_finish("j", "b", "w1", ok=False, detail="boom", now=6.0)
        # Finished once: a second outcome, or another worker's, is not recorded.
        assert not await store.job_finish("j", "a", "w1", ok=False, detail="again", now=7.0)
        assert not await store.job_finish("j", "x", "w1", ok=True, detail=None, now=7.0)
        b, a = await store.job_history("j")
        assert (a.finished_at, a.ok, a.detail) == (5.0, True, "3 pruned")
        assert (b.finished_at, b.ok, b.detail) == (6.0, False, "boom")
        assert [r.slot for r in await store.job_history("j", limit=1)] == ["b"]
        assert await store.job_history("other") == []

    async def test_an_unfinished_claim_is_taken_over_once_stale(self, store: Any) -> None:
        assert await store.job_claim("j", "s", "dead", now=100.0, stale_after=10.0)
        # Not stale yet; and without stale_after, never.
        assert not await store.job_claim("j", "s", "w2", now=105.0, stale_after=10.0)
        assert not await store.job_claim("j", "s", "w2", now=500.0)
        assert await store.job_claim("j", "s", "w2", now=111.0, stale_after=10.0)
        # Taken over: the first worker, back from the dead, records nothing.
        assert not await store.job_finish("j", "s", "dead", ok=True, detail=None, now=112.0)
        assert await store.job_finish("j", "s", "w2", ok=True, detail=None, now=113.0)
        [row] = await store.job_history("j")
        assert (row.worker, row.claimed_at, row.attempts, row.ok) == ("w2", 111.0, 2, True)
        # A finished firing is never run again, however old.
        assert not await store.job_claim("j", "s", "w3", now=9999.0, stale_after=10.0)

    async def test_a_failed_firing_may_be_claimed_again(self, store: Any) -> None:
        await store.job_claim("j", "s", "w1", now=1.0)
        await store.job_finish("j", "s", "w1", ok=False, detail="boom", now=2.0)
        assert await store.job_claim("j", "s", "w2", now=3.0)
        [row] = await store.job_history("j")
        assert (row.worker, row.attempts, row.finished_at, row.ok, row.detail) == (
            "w2",
            2,
            None,
            None,
            None,
        )
        assert not await store.job_claim("j", "s", "w3", now=4.0)

    async def test_old_claims_are_pruned(self, store: Any) -> None:
        for i, t in enumerate((1.0, 2.0, 3.0)):
            await store.job_claim("j", f"s{i}", "w", now=t)
        await store.job_finish("j", "s0", "w", ok=True, detail=None, now=1.5)
        assert await store.job_prune(2.5) == 2
        assert [r.slot for r in await store.job_history("j")] == ["s2"]
        assert await store.job_prune(2.5) == 0
