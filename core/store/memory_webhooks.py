"""The in-memory engine's webhook deliveries (:class:`~.repositories.WebhookRepository`):
one process, so a claim is a field of a dictionary entry; the same rules as the SQL
engines."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from .records import WebhookDelivery, WebhookOutcome, WebhookState

__all__ = ["MemoryWebhooks"]


class MemoryWebhooks:
    """Webhook deliveries kept in a dictionary, by delivery id (in insertion order)."""

    _webhook_rows: dict[str, WebhookDelivery] | None = None

    @property
    def _webhooks(self) -> dict[str, WebhookDelivery]:
        if self._webhook_rows is None:
            self._webhook_rows = {}
        return self._webhook_rows

    def _webhooks_by_age(self) -> list[WebhookDelivery]:
        return sorted(self._webhooks.values(), key=lambda d: (d.created_at, d.id))

    async def webhook_enqueue(self, rows: Sequence[WebhookDelivery]) -> int:
        added = 0
        for row in rows:
            if row.id not in self._webhooks:
                self._webhooks[row.id] = dataclasses.replace(
                    row, state="pending", claimed_by=None, claimed_until=None, finished_at=None
                )
                added += 1
        return added

    async def webhook_claim(
        self, worker: str, *, now: float, lease: float, limit: int = 50
    ) -> list[WebhookDelivery]:
        claimed: list[WebhookDelivery] = []
        for d in self._webhooks_by_age():
            if len(claimed) >= limit:
                break
            if d.claimable(now):
                d = dataclasses.replace(d, claimed_by=worker, claimed_until=now + lease)
                self._webhooks[d.id] = d
                claimed.append(d)
        return claimed

    async def webhook_settle(
        self, worker: str, outcomes: Sequence[WebhookOutcome], *, now: float
    ) -> int:
        settled = 0
        for o in outcomes:
            d = self._webhooks.get(o.id)
            if d is None or d.state != "pending" or d.claimed_by != worker:
                continue
            self._webhooks[o.id] = dataclasses.replace(
                d,
                state=o.state,
                attempts=d.attempts + 1,
                next_at=d.next_at if o.next_at is None else o.next_at,
                claimed_by=None,
                claimed_until=None,
                last_error=o.error if o.error is not None else d.last_error,
                finished_at=None if o.state == "pending" else now,
            )
            settled += 1
        return settled

    async def webhook_release(self, worker: str) -> int:
        mine = [
            d for d in self._webhooks.values() if d.state == "pending" and d.claimed_by == worker
        ]
        for d in mine:
            self._webhooks[d.id] = dataclasses.replace(d, claimed_by=None, claimed_until=None)
        return len(mine)

    async def webhook_deliveries(
        self, *, state: WebhookState | None = None, webhook: str | None = None, limit: int = 100
    ) -> list[WebhookDelivery]:
        found = [
            d
            for d in self._webhooks_by_age()
            if (state is None or d.state == state) and (webhook is None or d.webhook == webhook)
        ]
        return found[:limit]

    async def webhook_replay(self, ids: Sequence[str] | None, *, now: float) -> int:
        wanted = None if ids is None else set(ids)
        count = 0
        for d in self._webhooks_by_age():
            if d.state == "dead" and (wanted is None or d.id in wanted):
                self._webhooks[d.id] = dataclasses.replace(
                    d, state="pending", attempts=0, next_at=now, claimed_by=None,
                    claimed_until=None, finished_at=None,
                )  # fmt: skip
                count += 1
        return count

    async def webhook_next_due(self) -> float | None:
        due = [
            max(d.next_at, d.claimed_until or 0.0)
            for d in self._webhooks.values()
            if d.state == "pending"
        ]
        return min(due) if due else None

    async def webhook_prune(self, before: float) -> int:
        old = [
            d.id
            for d in self._webhooks.values()
            if d.state == "delivered" and (d.finished_at or 0.0) < before
        ]
        for key in old:
            del self._webhooks[key]
        return len(old)
