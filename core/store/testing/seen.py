"""Handled events: a transport's dedupe of redelivered events, shared by every worker."""

from __future__ import annotations

import asyncio
from typing import Any

from .kit import ContractBase

__all__ = ["SeenEventsContract"]


class SeenEventsContract(ContractBase):
    """``seen_first`` records keys and says which were new; ``seen_prune`` forgets;
    ``seen_claim`` claims and reads at once."""

    async def test_a_key_is_seen_first_once(self, store: Any) -> None:
        assert await store.seen_first(["event:E1", "msg:C:1"], now=100.0, window=60.0) == [
            "event:E1",
            "msg:C:1",
        ]
        # Slack's retry of the same event: nothing is new.
        assert await store.seen_first(["event:E1", "msg:C:1"], now=110.0, window=60.0) == []
        # The same message as another event (app_mention and message): only the new id.
        assert await store.seen_first(["event:E2", "msg:C:1"], now=111.0, window=60.0) == [
            "event:E2"
        ]
        assert await store.seen_first([], now=112.0, window=60.0) == []

    async def test_a_key_repeated_in_one_call_is_new_once(self, store: Any) -> None:
        assert await store.seen_first(["k", "k", "j"], now=1.0, window=60.0) == ["k", "j"]

    async def test_a_key_older_than_the_window_is_new_again(self, store: Any) -> None:
        await store.seen_first(["k"], now=100.0, window=60.0)
        assert await store.seen_first(["k"], now=159.0, window=60.0) == []
        assert await store.seen_first(["k"], now=161.0, window=60.0) == ["k"]
        # Its time moved: within the window of its new sighting it is old.
        assert await store.seen_first(["k"], now=200.0, window=60.0) == []

    async def test_racing_calls_with_one_key_see_it_first_once(self, store: Any) -> None:
        results = await asyncio.gather(
            *(store.seen_first([f"w{i}", "shared"], now=5.0, window=60.0) for i in range(8))
        )
        assert sum("shared" in r for r in results) == 1
        assert all(f"w{i}" in r for i, r in enumerate(results))

    async def test_pruning_forgets_old_keys_only(self, store: Any) -> None:
        await store.seen_first(["old"], now=10.0, window=60.0)
        await store.seen_first(["new"], now=100.0, window=60.0)
        assert await store.seen_prune(50.0) == 1
        assert await store.seen_prune(50.0) == 0
        # Forgotten: the old key is new again (even within its window); the kept one is not.
        assert await store.seen_first(["old", "new"], now=101.0, window=1000.0) == ["old"]

    async def test_known_reads_which_keys_were_recorded_since(self, store: Any) -> None:
        await store.seen_first(["a", "b"], now=100.0, window=60.0)
        # A read: asking about a key records nothing.
        assert await store.seen_known(["c", "b", "a", "b"], since=50.0) == ["b", "a"]
        assert await store.seen_known(["c"], since=0.0) == []
        assert await store.seen_first(["c"], now=101.0, window=60.0) == ["c"]
        # Recorded before ``since``: not known.
        assert await store.seen_known(["a", "c"], since=100.5) == ["c"]
        assert await store.seen_known([], since=0.0) == []

    async def test_a_claim_and_a_read_in_one_call(self, store: Any) -> None:
        await store.seen_first(["event:E1"], now=100.0, window=60.0)
        got, known = await store.seen_claim(
            ["claim:event:E1", "claim:event:E2", "claim:event:E2"],
            ["event:E2", "event:E1"],
            now=101.0, window=3.0, since=50.0,
        )  # fmt: skip
        assert (got, known) == (["claim:event:E1", "claim:event:E2"], ["event:E1"])
        # Claimed within the window: nobody gets the claim again; after it, one does.
        again = await store.seen_claim(["claim:event:E2"], [], now=103.0, window=3.0, since=0.0)
        assert again == ([], [])
        assert await store.seen_claim(
            ["claim:event:E2"], ["event:E2"], now=105.0, window=3.0, since=0.0
        ) == (["claim:event:E2"], [])
        # The read sees the table as it was before the call's claims.
        assert await store.seen_claim(["x"], ["x"], now=106.0, window=3.0, since=0.0) == (
            ["x"], [],
        )  # fmt: skip
        assert await store.seen_claim([], ["x", "y"], now=107.0, window=3.0, since=0.0) == (
            [], ["x"],
        )  # fmt: skip
        assert await store.seen_claim([], [], now=108.0, window=3.0, since=0.0) == ([], [])

    async def test_racing_claims_of_one_key_get_it_once(self, store: Any) -> None:
        results = await asyncio.gather(
            *(
                store.seen_claim(
                    [f"claim:w{i}", "claim:shared"], ["done"], now=5.0, window=3.0, since=0.0
                )
                for i in range(8)
            )
        )
        assert sum("claim:shared" in got for got, _ in results) == 1
        assert all(f"claim:w{i}" in got for i, (got, _) in enumerate(results))
