"""Leases and the worker registry: who owns a chat connection, and who is alive
(issue 32; :mod:`agentik.core.cluster`)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ..records import Lease, WorkerInfo
from .kit import ContractBase

__all__ = ["ClusterContract"]

#: How long a case waits at most for a tiny lease to expire (a loaded machine is slow).
_PATIENCE = 30.0


async def _expired(store: Any, name: str) -> Lease:
    """Poll ``name`` until it has expired (never a fixed sleep)."""
    deadline = time.monotonic() + _PATIENCE
    while True:
        lease = await store.lease_get(name)
        assert lease is not None
        if not lease.held:
            return lease
        assert time.monotonic() < deadline, f"{name} did not expire: {lease}"
        await asyncio.sleep(0.01)


class ClusterContract(ContractBase):
    """Leases: one owner at a time, a fencing epoch that grows with each new owner,
    expiry by the store's clock; workers: heartbeats upserted, listed, forgotten."""

    async def test_a_free_lease_is_taken_with_the_first_epoch(self, store: Any) -> None:
        assert await store.lease_get("conn:irc") is None
        lease = await store.lease_acquire("conn:irc", "w1", 30.0)
        assert lease is not None
        assert (lease.name, lease.owner, lease.epoch) == ("conn:irc", "w1", 1)
        assert 0 < lease.expires_in <= 30.0 and lease.held
        got = await store.lease_get("conn:irc")
        assert got is not None and (got.owner, got.epoch) == ("w1", 1) and got.held

    async def test_two_owners_racing_for_one_lease_exactly_one_wins(self, store: Any) -> None:
        for i in range(10):
            name = f"conn:race{i}"
            owners = [f"w{k}" for k in range(4)]
            got = await asyncio.gather(*(store.lease_acquire(name, o, 30.0) for o in owners))
            winners = [g for g in got if g is not None]
            assert len(winners) == 1, got
            held = await store.lease_get(name)
            assert held is not None and held.owner == winners[0].owner and held.epoch == 1

    async def test_a_held_lease_is_refused_to_another_owner(self, store: Any) -> None:
        assert await store.lease_acquire("conn:irc", "w1", 30.0) is not None
        assert await store.lease_acquire("conn:irc", "w2", 30.0) is None
        got = await store.lease_get("conn:irc")
        assert got is not None and got.owner == "w1"

    async def test_ours_taken_again_keeps_the_epoch_and_extends_it(self, store: Any) -> None:
        first = await store.lease_acquire("conn:irc", "w1", 1.0)
        again = await store.lease_acquire("conn:irc", "w1", 60.0)
        assert first is not None and again is not None
        assert again.epoch == first.epoch == 1 and again.owner == "w1"
        assert again.expires_in > 30.0

    async def test_an_expired_lease_is_taken_over_with_a_new_epoch(self, store: Any) -> None:
        assert await store.lease_acquire("conn:irc", "w1", 0.05) is not None
        await _expired(store, "conn:irc")
        taken = await store.lease_acquire("conn:irc", "w2", 30.0)
        assert taken is not None and (taken.owner, taken.epoch) == ("w2", 2)
        # The old owner's renewal and release are refused: its epoch is stale.
        assert await store.lease_renew("conn:irc", "w1", 1, 30.0) is False
        assert await store.lease_release("conn:irc", "w1", 1) is False
        got = await store.lease_get("conn:irc")
        assert got is not None and (got.owner, got.epoch) == ("w2", 2) and got.held

    async def test_renewal_extends_only_the_owner_at_its_epoch(self, store: Any) -> None:
        lease = await store.lease_acquire("conn:irc", "w1", 1.0)
        assert lease is not None
        assert await store.lease_renew("conn:irc", "w1", lease.epoch, 60.0) is True
        got = await store.lease_get("conn:irc")
        assert got is not None and got.expires_in > 30.0
        assert await store.lease_renew("conn:irc", "w2", lease.epoch, 60.0) is False
        assert await store.lease_renew("conn:irc", "w1", lease.epoch + 1, 60.0) is False
        assert await store.lease_renew("conn:none", "w1", 1, 60.0) is False

    async def test_an_expired_lease_nobody_took_is_still_renewable(self, store: Any) -> None:
        lease = await store.lease_acquire("conn:irc", "w1", 0.05)
        assert lease is not None
        await _expired(store, "conn:irc")
        assert await store.lease_renew("conn:irc", "w1", lease.epoch, 30.0) is True
        got = await store.lease_get("conn:irc")
        assert got is not None and got.held and got.epoch == lease.epoch

    async def test_a_released_lease_is_free_at_once_and_the_epoch_grows(self, store: Any) -> None:
        lease = await store.lease_acquire("conn:irc", "w1", 60.0)
        assert lease is not None
        assert await store.lease_release("conn:irc", "w2", lease.epoch) is False
        assert await store.lease_acquire("conn:irc", "w2", 60.0) is None
        assert await store.lease_release("conn:irc", "w1", lease.epoch) is True
        got = await store.lease_get("conn:irc")
        assert got is not None and not got.held
        taken = await store.lease_acquire("conn:irc", "w2", 60.0)
        assert taken is not None and (taken.owner, taken.epoch) == ("w2", 2)
        # A stale release changes nothing.
        assert await store.lease_release("conn:irc", "w1", lease.epoch) is False
        got = await store.lease_get("conn:irc")
        assert got is not None and got.held and got.owner == "w2"

    async def test_leases_are_listed_by_prefix_and_name(self, store: Any) -> None:
        for name in ("conn:slack", "conn:irc", "job:retention", "conn_x", "co%n:y"):
            assert await store.lease_acquire(name, "w1", 60.0) is not None
        assert [x.name for x in await store.leases("conn:")] == ["conn:irc", "conn:slack"]
        assert [x.name for x in await store.leases("co%")] == ["co%n:y"]
        assert [x.name for x in await store.leases()] == sorted(
            ["conn:slack", "conn:irc", "job:retention", "conn_x", "co%n:y"]
        )
        assert await store.leases("nothing:") == []

    async def test_a_worker_beat_is_upserted_and_listed(self, store: Any) -> None:
        assert await store.workers() == []
        info = WorkerInfo(host="h1", pid=42, started_at=100.0, version="1.2")
        await store.worker_beat("h1:42:ab", info)
        await store.worker_beat("h2:7:cd", WorkerInfo(host="h2", pid=7))
        first = {w.worker: w for w in await store.workers()}
        assert list(first) == ["h1:42:ab", "h2:7:cd"]
        assert first["h1:42:ab"].info == info
        assert 0 <= first["h1:42:ab"].age < 60
        draining = WorkerInfo(host="h1", pid=42, started_at=100.0, version="1.2", draining=True)
        await store.worker_beat("h1:42:ab", draining)
        again = {w.worker: w for w in await store.workers()}
        assert len(again) == 2
        assert again["h1:42:ab"].info.draining is True
        assert again["h1:42:ab"].last_beat >= first["h1:42:ab"].last_beat

    async def test_silent_workers_are_forgotten(self, store: Any) -> None:
        await store.worker_beat("old", WorkerInfo())
        deadline = time.monotonic() + _PATIENCE
        while (await store.workers())[0].age <= 0.05:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        await store.worker_beat("new", WorkerInfo())
        assert await store.workers_forget(0.05) == 1
        assert [w.worker for w in await store.workers()] == ["new"]
        assert await store.workers_forget(3600.0) == 0
