"""The turn queue: a turn submitted on one worker, run by the holder of its
conversation's lease (issue 32)."""

from __future__ import annotations

import asyncio
from typing import Any

from .kit import ContractBase, rec, user

__all__ = ["QueueContract"]


class QueueContract(ContractBase):
    """``queue_add`` records the message and queues its turn; ``queue_claim`` hands the
    turns to one worker, oldest first; ``queue_done`` removes them."""

    async def test_a_queued_turn_is_its_message_and_a_claim(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        turn = await store.queue_add(
            "c", user("hello", run_id="r1", author="bob"), {"via": "http:api", "n": [1]},
            updated_at=5.0,
        )  # fmt: skip
        assert turn.run_id == "r1" and turn.claimed_by is None and turn.attempts == 0
        # The message is in the audit log, committed with its queue row.
        [m] = await store.messages("c")
        assert (m.id, m.content, m.author, m.run_id) == (turn.message_id, "hello", "bob", "r1")
        assert (await store.get_conversation("c")).updated_at == 5.0
        [claimed] = await store.queue_claim("c", "w1")
        assert claimed.message_id == m.id and claimed.claimed_by == "w1"
        assert claimed.payload == {"via": "http:api", "n": [1]} and claimed.attempts == 1
        stats = await store.queue_stats()
        assert (stats.depth, stats.waiting) == (1, 0) and stats.oldest_age >= 0
        assert await store.queue_done([m.id]) == 1
        assert await store.queue_done([m.id]) == 0
        assert await store.queue_claim("c", "w1") == []
        assert (await store.queue_stats()).depth == 0

    async def test_turns_are_claimed_oldest_first_and_a_claim_is_idempotent(
        self, store: Any
    ) -> None:
        await store.create_conversation(rec("c"))
        await store.create_conversation(rec("d"))
        ids = [(await store.queue_add("c", user(f"m{i}", run_id=f"r{i}"), {})).message_id
               for i in range(3)]  # fmt: skip
        await store.queue_add("d", user("other", run_id="rd"), {})
        first = await store.queue_claim("c", "w1", limit=2)
        assert [t.message_id for t in first] == ids[:2]
        # Again: what it holds already, and the rest; nothing is claimed twice.
        again = await store.queue_claim("c", "w1")
        assert [t.message_id for t in again] == ids
        assert [t.attempts for t in again] == [1, 1, 1]
        assert (await store.queue_stats()).waiting == 1  # d's

    async def test_a_turn_queued_claimed_belongs_to_that_worker(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        turn = await store.queue_add("c", user("hi", run_id="r1"), {}, claimed_by="w1")
        assert turn.claimed_by == "w1" and turn.attempts == 1
        assert (await store.queue_stats()).waiting == 0
        assert [t.message_id for t in await store.queue_claim("c", "w1")] == [turn.message_id]

    async def test_a_dead_workers_turns_are_claimed_again(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        turn = await store.queue_add("c", user("hi", run_id="r1"), {})
        await store.queue_claim("c", "dead")
        # The new holder of the conversation's lease takes it over.
        [taken] = await store.queue_claim("c", "w2")
        assert taken.message_id == turn.message_id
        assert taken.claimed_by == "w2" and taken.attempts == 2
        assert await store.queue_claim("c", "dead") != []  # (only a lease holder should ask)

    async def test_racing_claims_give_each_turn_to_one_worker(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        ids = {(await store.queue_add("c", user(f"m{i}", run_id=f"r{i}"), {})).message_id
               for i in range(6)}  # fmt: skip
        results = await asyncio.gather(*(store.queue_claim("c", f"w{i}") for i in range(4)))
        # Whoever claimed first holds all; a later claimant takes them over, never
        # two at the same instant: every turn has one claimant at the end.
        last = await store.queue_claim("c", "w9")
        assert {t.message_id for t in last} == ids
        assert all(len({t.claimed_by for t in r}) <= 1 for r in results)

    async def test_conversations_with_queued_turns_and_their_leases(self, store: Any) -> None:
        for cid in ("a", "b", "c"):
            await store.create_conversation(rec(cid))
        await store.queue_add("b", user("1", run_id="r1"), {})
        await store.queue_add("a", user("2", run_id="r2"), {})
        await store.queue_add("b", user("3", run_id="r3"), {})
        assert await store.queue_conversations() == ["b", "a"]
        assert await store.queue_conversations(limit=1) == ["b"]
        # "b" is held by another worker: not free for w1; its own holder sees it.
        assert await store.lease_acquire("conv:b", "w2", 60.0) is not None
        assert await store.queue_conversations(free_for="w1") == ["a"]
        assert await store.queue_conversations(free_for="w2") == ["b", "a"]
        # Released (or expired): free again.
        lease = await store.lease_get("conv:b")
        assert await store.lease_release("conv:b", "w2", lease.epoch)
        assert await store.queue_conversations(free_for="w1") == ["b", "a"]

    async def test_deleting_a_conversation_removes_its_queued_turns(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        await store.queue_add("c", user("hi", run_id="r1"), {})
        assert await store.delete_conversation("c")
        assert (await store.queue_stats()).depth == 0
        assert await store.queue_conversations() == []

    async def test_a_queued_turn_needs_a_user_message_with_a_run(self, store: Any) -> None:
        import pytest

        await store.create_conversation(rec("c"))
        with pytest.raises(ValueError):
            await store.queue_add("c", user("no run"), {})
        assert await store.messages("c") == []

    async def test_leases_are_renewed_in_one_call(self, store: Any) -> None:
        a = await store.lease_acquire("conv:a", "w1", 60.0)
        b = await store.lease_acquire("conv:b", "w1", 60.0)
        c = await store.lease_acquire("conv:c", "w2", 60.0)
        renewed = await store.lease_renew_many(
            [("conv:a", a.epoch), ("conv:b", b.epoch + 1), ("conv:c", c.epoch)], "w1", 60.0
        )
        assert renewed == ["conv:a"]
        assert await store.lease_renew_many([], "w1", 60.0) == []
