"""The turn queue kept in process memory (:class:`~.repositories.QueueRepository`):
the in-memory engine's (:class:`~.memory.MemoryStore`).  One process, so nothing of
it runs in a bot (:mod:`agentik.core.cluster.conversations` runs on shared stores
only); it keeps the store contract whole."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..messages import ChatMessage, Message, NewMessage
from .records import Lease, QueuedTurn, QueueStats, TurnEnd

__all__ = ["MemoryQueue"]


class MemoryQueue:
    """Queued turns in a dictionary by message id; made on first use (a mixin)."""

    _queue_rows: dict[int, QueuedTurn]
    _conversations: dict[str, Any]

    if TYPE_CHECKING:  # (the engine's: this is a mixin)

        async def append(
            self,
            conversation_id: str,
            *,
            log: Sequence[NewMessage] = (),
            memory: Sequence[ChatMessage] = (),
            updated_at: float | None = None,
            ended: TurnEnd | None = None,
            defer: bool = False,
        ) -> list[Message]: ...

        async def lease_get(self, name: str) -> Lease | None: ...

    def _queue(self) -> dict[int, QueuedTurn]:
        try:
            rows = self._queue_rows
        except AttributeError:
            rows = self._queue_rows = {}
        # A deleted conversation's turns go with it.
        for mid in [m for m, t in rows.items() if t.conversation_id not in self._conversations]:
            del rows[mid]
        return rows

    async def queue_add(
        self,
        conversation_id: str,
        message: NewMessage,
        payload: Mapping[str, Any],
        *,
        claimed_by: str | None = None,
        updated_at: float | None = None,
    ) -> QueuedTurn:
        if message.kind != "user" or not message.run_id:
            raise ValueError("a queued turn's message is a user message with a run id")
        body = json.loads(json.dumps(dict(payload)))  # JSON values only, as the engines keep
        [m] = await self.append(conversation_id, log=[message], updated_at=updated_at)
        turn = QueuedTurn(conversation_id=conversation_id, message_id=m.id,
                          run_id=m.run_id or "", payload=body, enqueued_at=time.time(),
                          claimed_by=claimed_by, attempts=1 if claimed_by else 0)  # fmt: skip
        self._queue()[m.id] = turn
        return turn

    async def queue_claim(
        self, conversation_id: str, worker: str, *, limit: int = 100
    ) -> list[QueuedTurn]:
        rows = self._queue()
        ours = sorted(m for m, t in rows.items() if t.conversation_id == conversation_id)
        taken = 0
        for mid in ours:
            turn = rows[mid]
            if turn.claimed_by != worker and taken < limit:
                rows[mid] = dataclasses.replace(turn, claimed_by=worker, attempts=turn.attempts + 1)
                taken += 1
        return [rows[m] for m in ours if rows[m].claimed_by == worker]

    async def queue_done(self, message_ids: Sequence[int]) -> int:
        rows = self._queue()
        return sum(rows.pop(int(m), None) is not None for m in set(message_ids))

    async def queue_stats(self) -> QueueStats:
        rows = list(self._queue().values())
        oldest = min((t.enqueued_at for t in rows), default=None)
        return QueueStats(
            depth=len(rows),
            waiting=sum(t.claimed_by is None for t in rows),
            oldest_age=max(0.0, time.time() - oldest) if oldest is not None else 0.0,
        )

    async def queue_conversations(
        self, *, free_for: str | None = None, limit: int = 100
    ) -> list[str]:
        first: dict[str, int] = {}
        for mid, t in self._queue().items():
            first[t.conversation_id] = min(mid, first.get(t.conversation_id, mid))
        out: list[str] = []
        for cid in sorted(first, key=first.__getitem__):
            if free_for is not None:
                lease = await self.lease_get(f"conv:{cid}")
                if lease is not None and lease.held and lease.owner != free_for:
                    continue
            out.append(cid)
            if len(out) >= limit:
                break
        return out
