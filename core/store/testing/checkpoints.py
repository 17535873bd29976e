"""Checkpoints: stored snapshots listable per conversation, the automatic ones bounded
(issue 35)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from ...errors import CheckpointLimit
from .kit import ContractBase, rec

__all__ = ["CheckpointsContract"]


def doc(n: int) -> str:
    return json.dumps({"format": "agentik.conversation", "n": n, "text": "héllo ✓"})


class CheckpointsContract(ContractBase):
    """``checkpoint_add`` stores a document; ``checkpoints`` lists a conversation's,
    newest first; ``keep`` trims only automatic ones; they go with the conversation."""

    async def test_checkpoints_are_listed_per_conversation_newest_first(self, store: Any) -> None:
        await store.create_conversation(rec("a", 1.0))
        await store.create_conversation(rec("b", 2.0))
        first = await store.checkpoint_add("a", doc(1), at=10.0, label="before the deploy")
        second = await store.checkpoint_add("a", doc(2), at=11.0, automatic=True)
        await store.checkpoint_add("b", doc(3), at=12.0)
        listed = await store.checkpoints("a")
        assert [c.id for c in listed] == [second.id, first.id]
        assert (first.conversation_id, first.created_at, first.label, first.automatic) == (
            "a", 10.0, "before the deploy", False,
        )  # fmt: skip
        assert second.automatic and second.label == ""
        assert first.size == len(doc(1).encode("utf-8"))
        assert listed[1] == first
        # The document comes back exactly as stored, only through its conversation.
        assert await store.checkpoint_get("a", first.id) == doc(1)
        assert await store.checkpoint_get("b", first.id) is None
        assert await store.checkpoint_get("a", 10_000) is None
        assert await store.checkpoints("nobody") == []

    async def test_keep_trims_the_oldest_automatic_checkpoints_only(self, store: Any) -> None:
        await store.create_conversation(rec("a", 1.0))
        await store.create_conversation(rec("b", 1.0))
        asked = await store.checkpoint_add("a", doc(0), at=1.0, label="mine")
        other = await store.checkpoint_add("b", doc(0), at=1.0, automatic=True)
        autos = [
            await store.checkpoint_add("a", doc(i), at=2.0 + i, automatic=True, keep=2)
            for i in range(4)
        ]
        ids = [c.id for c in await store.checkpoints("a")]
        assert ids == [autos[3].id, autos[2].id, asked.id]
        assert await store.checkpoint_get("a", autos[0].id) is None
        # Another conversation's automatic checkpoint is not counted nor trimmed.
        assert [c.id for c in await store.checkpoints("b")] == [other.id]
        # keep=0: an automatic checkpoint replaces none it could keep, itself included.
        await store.checkpoint_add("a", doc(9), at=9.0, automatic=True, keep=0)
        assert [c.id for c in await store.checkpoints("a")] == [asked.id]

    async def test_racing_automatic_checkpoints_keep_the_bound(self, store: Any) -> None:
        await store.create_conversation(rec("a", 1.0))
        await asyncio.gather(
            *(store.checkpoint_add("a", doc(i), at=float(i), automatic=True, keep=3)
              for i in range(10))
        )  # fmt: skip
        assert len(await store.checkpoints("a")) == 3

    async def test_deleting_a_checkpoint_or_its_conversation(self, store: Any) -> None:
        await store.create_conversation(rec("a", 1.0))
        one = await store.checkpoint_add("a", doc(1), at=1.0)
        two = await store.checkpoint_add("a", doc(2), at=2.0)
        assert await store.checkpoint_delete("b", one.id) is False
        assert await store.checkpoint_delete("a", one.id) is True
        assert await store.checkpoint_delete("a", one.id) is False
        assert [c.id for c in await store.checkpoints("a")] == [two.id]
        assert await store.delete_conversation("a")
        assert await store.checkpoints("a") == []
        assert await store.checkpoint_get("a", two.id) is None

    async def test_a_conversation_that_does_not_exist_gets_none(self, store: Any) -> None:
        with pytest.raises(Exception, match="no conversation"):
            await store.checkpoint_add("ghost", doc(1), at=1.0)
        assert await store.checkpoints("ghost") == []

    async def test_limit_refuses_a_checkpoint_taken_by_hand_past_it(self, store: Any) -> None:
        """``limit``: a conversation keeps at most that many taken by hand; the next
        is refused (nothing written), automatic ones neither count nor are refused,
        another conversation has its own count, and deleting one makes room."""
        await store.create_conversation(rec("a", 1.0))
        await store.create_conversation(rec("b", 1.0))
        mine = [await store.checkpoint_add("a", doc(i), at=float(i), limit=2) for i in range(2)]
        auto = await store.checkpoint_add("a", doc(5), at=5.0, automatic=True, keep=3, limit=2)
        with pytest.raises(CheckpointLimit) as caught:
            await store.checkpoint_add("a", doc(6), at=6.0, label="third", limit=2)
        assert (caught.value.conversation_id, caught.value.limit) == ("a", 2)
        assert [c.id for c in await store.checkpoints("a")] == [auto.id, mine[1].id, mine[0].id]
        await store.checkpoint_add("b", doc(7), at=7.0, limit=2)
        with pytest.raises(CheckpointLimit):
            await store.checkpoint_add("a", doc(8), at=8.0, limit=0)  # none allowed
        assert await store.checkpoint_delete("a", mine[0].id)
        again = await store.checkpoint_add("a", doc(9), at=9.0, label="room", limit=2)
        assert [c.id for c in await store.checkpoints("a")] == [again.id, auto.id, mine[1].id]
        # Without a limit (an import's, the library's own call) nothing is refused.
        await store.checkpoint_add("a", doc(10), at=10.0)
        assert len(await store.checkpoints("a")) == 4

    async def test_racing_checkpoints_taken_by_hand_keep_the_limit(self, store: Any) -> None:
        await store.create_conversation(rec("a", 1.0))
        got = await asyncio.gather(
            *(store.checkpoint_add("a", doc(i), at=float(i), limit=3) for i in range(10)),
            return_exceptions=True,
        )
        assert sum(isinstance(g, CheckpointLimit) for g in got) == 7, got
        assert not [g for g in got if isinstance(g, BaseException)
                    and not isinstance(g, CheckpointLimit)]  # fmt: skip
        assert len(await store.checkpoints("a")) == 3
