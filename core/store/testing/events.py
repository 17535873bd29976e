"""Run events: what a conversation's turns emitted, for SSE clients on every worker."""

from __future__ import annotations

from typing import Any

from .kit import ContractBase, rec

__all__ = ["RunEventsContract"]


def _rows(cid: str, seqs: range, at: float = 100.0) -> list[tuple[str, int, float, str]]:
    return [(cid, s, at, f'{{"kind":"text_delta","seq":{s},"text":"é{s}"}}') for s in seqs]


class RunEventsContract(ContractBase):
    """``run_events_add`` records batches; ``run_events_after`` pages them by ``seq``;
    ``run_events_last`` is the highest; ``run_events_prune`` bounds them;
    ``run_events_since`` reads the agent-wide stream by position."""

    async def test_a_batch_reads_back_in_seq_order_after_a_seq(self, store: Any) -> None:
        assert await store.run_events_last("c1") == 0
        assert await store.run_events_after("c1", 0) == []
        await store.run_events_add(list(reversed(_rows("c1", range(1, 6)))))
        await store.run_events_add(_rows("c2", range(1, 3)))
        got = await store.run_events_after("c1", 2)
        assert [s for s, _ in got] == [3, 4, 5]
        assert got[0][1] == '{"kind":"text_delta","seq":3,"text":"é3"}'  # as written
        assert await store.run_events_last("c1") == 5
        assert await store.run_events_last("c2") == 2
        await store.run_events_add([])

    async def test_pages_are_bounded(self, store: Any) -> None:
        await store.run_events_add(_rows("c1", range(1, 11)))
        first = await store.run_events_after("c1", 0, limit=4)
        assert [s for s, _ in first] == [1, 2, 3, 4]
        rest = await store.run_events_after("c1", first[-1][0], limit=100)
        assert [s for s, _ in rest] == list(range(5, 11))

    async def test_a_seq_written_twice_keeps_the_first(self, store: Any) -> None:
        await store.run_events_add(_rows("c1", range(1, 3)))
        await store.run_events_add([("c1", 2, 100.0, '{"again":true}'), *_rows("c1", range(3, 4))])
        got = dict(await store.run_events_after("c1", 0))
        assert got[2] == '{"kind":"text_delta","seq":2,"text":"é2"}'
        assert sorted(got) == [1, 2, 3]

    async def test_a_batch_with_replace_rewrites_what_is_there(self, store: Any) -> None:
        await store.run_events_add(_rows("c1", range(1, 3)))
        await store.run_events_add([("c1", 2, 999.0, '{"redacted":true}')], replace=True)
        assert await store.run_events_after("c1", 0) == [
            (1, '{"kind":"text_delta","seq":1,"text":"é1"}'),
            (2, '{"redacted":true}'),
        ]
        # Its time is kept: a rewrite does not make an old event young.
        assert await store.run_events_prune(keep=10, before=150.0) == 2

    async def test_deleting_a_conversation_forgets_its_events(self, store: Any) -> None:
        await store.create_conversation(rec("gone"))
        await store.create_conversation(rec("kept"))
        await store.run_events_add(_rows("gone", range(1, 3)) + _rows("kept", range(1, 2)))
        assert await store.delete_conversation("gone")
        assert await store.run_events_after("gone", 0) == []
        assert await store.run_events_last("gone") == 0
        assert [s for s, _ in await store.run_events_after("kept", 0)] == [1]

    async def test_pruning_bounds_each_conversation_and_drops_old_ones(self, store: Any) -> None:
        await store.run_events_add(_rows("old", range(1, 4), at=10.0))
        await store.run_events_add(_rows("big", range(1, 8), at=100.0))
        await store.run_events_add(_rows("small", range(1, 3), at=100.0))
        removed = await store.run_events_prune(keep=5, before=50.0)
        assert removed == 3 + 2
        assert await store.run_events_after("old", 0) == []
        assert [s for s, _ in await store.run_events_after("big", 0)] == [3, 4, 5, 6, 7]
        assert [s for s, _ in await store.run_events_after("small", 0)] == [1, 2]
        assert await store.run_events_prune(keep=5, before=50.0) == 0

    async def test_agent_wide_positions_follow_the_batches_order(self, store: Any) -> None:
        assert await store.run_events_position() == (0, 0)
        assert await store.run_events_since(0) == []
        await store.run_events_add(_rows("c1", range(1, 3)) + _rows("c2", range(1, 2)))
        # A child run's event relayed into its parent's stream: not on the agent-wide one.
        relayed = _rows("c2", range(2, 4))
        await store.run_events_add(relayed, wide=[False, True])
        got = await store.run_events_since(0)
        positions = [p for p, _ in got]
        assert positions == sorted(set(positions)) and len(positions) == 4
        assert [d for _, d in got] == [
            '{"kind":"text_delta","seq":1,"text":"é1"}',
            '{"kind":"text_delta","seq":2,"text":"é2"}',
            '{"kind":"text_delta","seq":1,"text":"é1"}',
            '{"kind":"text_delta","seq":3,"text":"é3"}',
        ]
        # Still the conversation's own: the relayed one reads back by ``seq``.
        assert [s for s, _ in await store.run_events_after("c2", 0)] == [1, 2, 3]
        assert await store.run_events_since(positions[1]) == got[2:]
        assert await store.run_events_since(positions[0], limit=2) == got[1:3]
        assert await store.run_events_position() == (positions[-1], 0)

    async def test_a_row_written_again_or_rewritten_keeps_its_position(self, store: Any) -> None:
        await store.run_events_add(_rows("c1", range(1, 3)))
        before = await store.run_events_since(0)
        await store.run_events_add(_rows("c1", range(2, 4)))
        await store.run_events_add([("c1", 1, 100.0, '{"redacted":true}')], replace=True)
        after = await store.run_events_since(0)
        assert after[0] == (before[0][0], '{"redacted":true}')
        assert after[1] == before[1]
        assert len(after) == 3 and after[2][0] > before[1][0]

    async def test_pruning_raises_the_pruned_position(self, store: Any) -> None:
        await store.run_events_add(_rows("old", range(1, 3), at=10.0))
        await store.run_events_add(_rows("new", range(1, 4), at=100.0))
        positions = [p for p, _ in await store.run_events_since(0)]
        assert await store.run_events_prune(keep=2, before=50.0) == 3
        last, pruned = await store.run_events_position()
        # "old" went by age, "new"'s first by count: the highest of them is its first.
        assert (last, pruned) == (positions[-1], positions[2]), (last, pruned, positions)
        assert [p for p, _ in await store.run_events_since(0)] == positions[3:]
        # Nothing pruned: it stays.
        assert await store.run_events_prune(keep=2, before=50.0) == 0
        assert await store.run_events_position() == (last, pruned)
