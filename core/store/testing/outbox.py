"""The outbox aggregate: outgoing pieces and their delivery state."""

from __future__ import annotations

import time
from typing import Any

from .kit import ContractBase, outbox

__all__ = ["OutboxContract"]


class OutboxContract(ContractBase):
    """Outgoing pieces: written once, delivery state moving forward only."""

    async def test_added_pieces_are_undelivered_in_order(self, store: Any) -> None:
        ids = await store.outbox_add([outbox(0), outbox(1), outbox(2)])
        assert ids == sorted(ids) and len(set(ids)) == 3
        got = await store.outbox_undelivered()
        assert [(e.id, e.piece, e.state) for e in got] == [
            (ids[0], 0, "queued"),
            (ids[1], 1, "queued"),
            (ids[2], 2, "queued"),
        ]

    async def test_a_piece_reads_back_as_written(self, store: Any) -> None:
        before = time.time()
        [i] = await store.outbox_add(
            [outbox(3, "hé", reply_to={"thread_ts": "1.2", "n": [1]}, kind="notice",
                    transport="slack", awaits_confirm=True, ref="ignored")]
        )  # fmt: skip
        [e] = await store.outbox_undelivered()
        assert (e.id, e.channel_key, e.run_id, e.piece, e.transport, e.kind, e.text) == (
            i, "irc:net:#c", "r1", 3, "slack", "notice", "hé",
        )  # fmt: skip
        assert e.reply_to == {"thread_ts": "1.2", "n": [1]} and e.complete is True
        assert (e.state, e.awaits_confirm, e.ref) == ("queued", False, None)
        assert before - 1 <= e.created_at <= time.time() + 1

    async def test_the_same_piece_is_not_added_twice(self, store: Any) -> None:
        [a] = await store.outbox_add([outbox(0, "first")])
        [b] = await store.outbox_add([outbox(0, "second")])
        assert a == b
        assert [e.text for e in await store.outbox_undelivered()] == ["first"]

    async def test_an_incomplete_piece_is_completed_by_writing_it_again(self, store: Any) -> None:
        [a] = await store.outbox_add([outbox(0, "", complete=False)])
        [b] = await store.outbox_add([outbox(0, "the whole answer")])
        assert a == b
        [e] = await store.outbox_undelivered()
        assert (e.text, e.complete) == ("the whole answer", True)

    async def test_pieces_differ_by_channel_run_and_number(self, store: Any) -> None:
        ids = await store.outbox_add(
            [outbox(0), outbox(0, channel_key="irc:net:#d"), outbox(0, run_id="r2"), outbox(1)]
        )
        assert len(set(ids)) == 4

    async def test_delivery_state_moves_forward_only(self, store: Any) -> None:
        [i] = await store.outbox_add([outbox(0)])
        await store.outbox_mark([(i, "confirmed", None, None)])
        await store.outbox_mark([(i, "sent", None, None), (i, "queued", None, None)])
        assert await store.outbox_undelivered() == []

    async def test_sent_is_delivered_unless_a_confirmation_is_awaited(self, store: Any) -> None:
        a, b = await store.outbox_add([outbox(0), outbox(1)])
        await store.outbox_mark([(a, "sent", False, None), (b, "sent", True, "ts-1")])
        [e] = await store.outbox_undelivered()
        assert (e.id, e.state, e.awaits_confirm, e.ref) == (b, "sent", True, "ts-1")
        await store.outbox_mark([(b, "confirmed", None, None)])
        assert await store.outbox_undelivered() == []

    async def test_marking_with_none_keeps_flag_and_ref(self, store: Any) -> None:
        [i] = await store.outbox_add([outbox(0)])
        await store.outbox_mark([(i, "sent", True, "ref-1")])
        await store.outbox_mark([(i, "sent", None, None)])
        [e] = await store.outbox_undelivered()
        assert (e.awaits_confirm, e.ref) == (True, "ref-1")

    async def test_an_incomplete_piece_is_listed_whatever_its_state(self, store: Any) -> None:
        [i] = await store.outbox_add([outbox(0, "", complete=False)])
        await store.outbox_mark([(i, "confirmed", False, None)])
        [e] = await store.outbox_undelivered()
        assert (e.id, e.complete, e.state) == (i, False, "confirmed")

    async def test_marking_an_unknown_piece_changes_nothing(self, store: Any) -> None:
        [i] = await store.outbox_add([outbox(0)])
        await store.outbox_mark([(i + 1000, "confirmed", True, "x")])
        [e] = await store.outbox_undelivered()
        assert (e.id, e.state) == (i, "queued")

    async def test_undelivered_is_limited_oldest_first(self, store: Any) -> None:
        ids = await store.outbox_add([outbox(n) for n in range(5)])
        assert [e.id for e in await store.outbox_undelivered(limit=2)] == ids[:2]

    async def test_prune_deletes_rows_written_before_a_time(self, store: Any) -> None:
        await store.outbox_add([outbox(0), outbox(1)])
        assert await store.outbox_prune(time.time() - 3600) == 0
        assert await store.outbox_prune(time.time() + 3600) == 2
        assert await store.outbox_undelivered() == []

    async def test_a_pruned_piece_may_be_written_again(self, store: Any) -> None:
        await store.outbox_add([outbox(0, "old")])
        await store.outbox_prune(time.time() + 3600)
        await store.outbox_add([outbox(0, "new")])
        assert [e.text for e in await store.outbox_undelivered()] == ["new"]

    async def test_an_empty_outbox(self, store: Any) -> None:
        assert await store.outbox_add([]) == []
        await store.outbox_mark([])
        assert await store.outbox_undelivered() == []
        assert await store.outbox_prune(time.time() + 3600) == 0
