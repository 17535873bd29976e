"""Outbound webhook deliveries: an outbox for HTTP receivers, claimed under a lease,
retried, kept as dead letters and replayed (issue 35)."""

from __future__ import annotations

import asyncio
from typing import Any

from ..records import WebhookDelivery, WebhookOutcome, WebhookState
from .kit import ContractBase

__all__ = ["WebhooksContract"]


def delivery(n: int, **kw: Any) -> WebhookDelivery:
    fields: dict[str, Any] = {
        "id": f"d{n}", "webhook": "ops", "event_kind": "turn_ended", "conversation_id": "c1",
        "body": f'{{"n": {n}, "text": "hé"}}', "created_at": 100.0 + n, "next_at": 0.0,
    }  # fmt: skip
    fields.update(kw)
    return WebhookDelivery(**fields)


def done(delivery_id: str, state: WebhookState = "delivered") -> WebhookOutcome:
    return WebhookOutcome(id=delivery_id, state=state)


class WebhooksContract(ContractBase):
    """``webhook_enqueue`` once per id; ``webhook_claim`` gives a row to one worker until
    its lease ends; ``webhook_settle`` (a batch in one write) by the holder only;
    ``webhook_release`` hands a worker's claims back; dead letters are listed,
    replayed under the same id, and outlive pruning."""

    async def test_a_delivery_reads_back_as_written_and_is_added_once(self, store: Any) -> None:
        assert await store.webhook_enqueue([delivery(1), delivery(2)]) == 2
        assert await store.webhook_enqueue([delivery(1, body="other"), delivery(3)]) == 1
        assert await store.webhook_enqueue([]) == 0
        got = await store.webhook_deliveries()
        assert [d.id for d in got] == ["d1", "d2", "d3"]
        assert got[0] == delivery(1)
        assert await store.webhook_next_due() == 0.0

    async def test_a_claim_goes_to_one_worker_until_its_lease_ends(self, store: Any) -> None:
        await store.webhook_enqueue([delivery(1), delivery(2), delivery(3, next_at=500.0)])
        mine = await store.webhook_claim("w1", now=200.0, lease=30.0, limit=1)
        assert [(d.id, d.claimed_by, d.claimed_until) for d in mine] == [("d1", "w1", 230.0)]
        theirs = await store.webhook_claim("w2", now=201.0, lease=30.0)
        assert [d.id for d in theirs] == ["d2"]  # d1 is held, d3 is not due
        assert await store.webhook_claim("w3", now=229.0, lease=30.0) == []
        # w1 died: its lease runs out and another worker takes the row.
        again = await store.webhook_claim("w3", now=232.0, lease=30.0)
        assert [d.id for d in again] == ["d1", "d2"]
        assert await store.webhook_settle("w1", [done("d1")], now=232.0) == 0
        assert await store.webhook_settle("w3", [done("d1")], now=232.0) == 1
        [d1] = await store.webhook_deliveries(state="delivered")
        assert (d1.id, d1.attempts, d1.finished_at, d1.claimed_by) == ("d1", 1, 232.0, None)
        assert await store.webhook_settle("w3", [done("d1", "dead")], now=233.0) == 0
        assert await store.webhook_settle("w3", [], now=233.0) == 0

    async def test_workers_claiming_at_once_get_other_rows(self, store: Any) -> None:
        await store.webhook_enqueue([delivery(n) for n in range(40)])
        got = await asyncio.gather(
            *(store.webhook_claim(f"w{i}", now=10.0, lease=30.0, limit=7) for i in range(6))
        )
        ids = [d.id for claimed in got for d in claimed]
        assert len(ids) == len(set(ids)) == 40

    async def test_a_retry_waits_for_its_time_then_a_dead_letter_is_kept(self, store: Any) -> None:
        await store.webhook_enqueue([delivery(1)])
        await store.webhook_claim("w1", now=10.0, lease=30.0)
        retry = WebhookOutcome(id="d1", state="pending", next_at=20.0, error="HTTP 503")
        assert await store.webhook_settle("w1", [retry], now=11.0) == 1
        assert await store.webhook_next_due() == 20.0
        assert await store.webhook_claim("w1", now=19.0, lease=30.0) == []
        [d] = await store.webhook_claim("w1", now=20.0, lease=30.0)
        assert (d.attempts, d.last_error, d.state) == (1, "HTTP 503", "pending")
        assert await store.webhook_next_due() == 50.0  # held until its lease ends
        await store.webhook_settle(
            "w1", [WebhookOutcome(id="d1", state="dead", error="connection refused")], now=21.0
        )
        assert await store.webhook_next_due() is None
        [dead] = await store.webhook_deliveries(state="dead")
        assert (dead.attempts, dead.last_error, dead.finished_at) == (2, "connection refused", 21.0)
        assert await store.webhook_deliveries(state="pending") == []
        assert await store.webhook_claim("w1", now=99.0, lease=30.0) == []

    async def test_dead_letters_are_replayed_under_the_same_id(self, store: Any) -> None:
        await store.webhook_enqueue([delivery(1), delivery(2), delivery(3, webhook="audit")])
        claimed = await store.webhook_claim("w1", now=10.0, lease=30.0)
        dead = [WebhookOutcome(id=d.id, state="dead", error="HTTP 500") for d in claimed]
        assert await store.webhook_settle("w1", dead, now=11.0) == 3
        assert [d.id for d in await store.webhook_deliveries(state="dead", webhook="ops")] == [
            "d1", "d2",
        ]  # fmt: skip
        assert await store.webhook_replay(["d2", "nope"], now=50.0) == 1
        assert await store.webhook_replay(["d2"], now=50.0) == 0  # pending now, not dead
        [d2] = await store.webhook_deliveries(state="pending")
        assert (d2.id, d2.attempts, d2.next_at, d2.finished_at, d2.body) == (
            "d2", 0, 50.0, None, delivery(2).body,
        )  # fmt: skip
        assert await store.webhook_replay(None, now=60.0) == 2
        assert [d.id for d in await store.webhook_claim("w2", now=60.0, lease=5.0)] == [
            "d1", "d2", "d3",
        ]  # fmt: skip

    async def test_pruning_forgets_delivered_rows_only(self, store: Any) -> None:
        await store.webhook_enqueue([delivery(1), delivery(2), delivery(3)])
        await store.webhook_claim("w1", now=10.0, lease=30.0)
        await store.webhook_settle("w1", [done("d1"), done("d2", "dead")], now=11.0)
        assert await store.webhook_prune(11.0) == 0
        assert await store.webhook_prune(12.0) == 1
        assert {d.id: d.state for d in await store.webhook_deliveries()} == {
            "d2": "dead", "d3": "pending",
        }  # fmt: skip

    async def test_a_settled_batch_keeps_each_outcome_and_skips_rows_held_by_others(
        self, store: Any
    ) -> None:
        await store.webhook_enqueue([delivery(n) for n in range(1, 5)])
        await store.webhook_claim("w1", now=10.0, lease=30.0, limit=3)
        await store.webhook_claim("w2", now=10.0, lease=30.0)
        outcomes = [
            done("d1"),
            WebhookOutcome(id="d2", state="pending", next_at=70.0, error="HTTP 502"),
            WebhookOutcome(id="d3", state="dead", error="timed out"),
            done("d4"),  # w2 holds it: left as it is
        ]
        assert await store.webhook_settle("w1", outcomes, now=12.0) == 3
        got = {d.id: d for d in await store.webhook_deliveries()}
        assert {k: (d.state, d.attempts, d.last_error, d.finished_at) for k, d in got.items()} == {
            "d1": ("delivered", 1, None, 12.0),
            "d2": ("pending", 1, "HTTP 502", None),
            "d3": ("dead", 1, "timed out", 12.0),
            "d4": ("pending", 0, None, None),
        }
        assert (got["d2"].next_at, got["d2"].claimed_by) == (70.0, None)
        assert got["d4"].claimed_by == "w2"

    async def test_a_released_claim_is_claimable_at_once_with_no_attempt_counted(
        self, store: Any
    ) -> None:
        await store.webhook_enqueue([delivery(1), delivery(2), delivery(3)])
        assert len(await store.webhook_claim("w1", now=10.0, lease=600.0, limit=2)) == 2
        [d3] = await store.webhook_claim("w2", now=10.0, lease=600.0)
        await store.webhook_settle("w1", [done("d1")], now=11.0)
        # w1 stops cleanly: d2 (still held) goes back; d1 (delivered) and w2's row stay.
        assert await store.webhook_release("w1") == 1
        assert await store.webhook_release("w1") == 0
        [again] = await store.webhook_claim("w3", now=12.0, lease=600.0)
        assert (again.id, again.attempts, again.claimed_by) == ("d2", 0, "w3")
        assert d3.id == "d3"
        rows = {d.id: (d.state, d.claimed_by) for d in await store.webhook_deliveries()}
        assert rows == {"d1": ("delivered", None), "d2": ("pending", "w3"), "d3": ("pending", "w2")}
