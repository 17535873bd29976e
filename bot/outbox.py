"""The bridge's side of the persisted outbox.

Every outgoing piece of a run's output on a transport with
:attr:`~agentik.transports.base.Transport.outbox` set (IRC, Slack) is written
to the store's ``outbox`` table (state ``queued``) before the transport is
asked to send it.  The transport reports ``sent`` and ``confirmed`` through
:meth:`~agentik.transports.base.Transport.delivered`; :class:`Outbox` batches
those reports into one store write at a time, off the rendering path.  After
a restart :meth:`agentik.bot.bridge.Bridge.redeliver` sends again what the
outbox says was not delivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from agentik.core.store.base import OutboxEntry, Store

if TYPE_CHECKING:
    from agentik.transports.base import Transport

__all__ = ["Outbox", "outbox_rows"]

log = logging.getLogger(__name__)

#: Outbox rows older than this are pruned when the bot starts, and every
#: ``PRUNE_EVERY`` rows written while it runs.
KEEP_SECONDS = 7 * 24 * 3600.0
PRUNE_EVERY = 5000


class Outbox:
    """Writes outgoing pieces and batches their delivery reports."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._marks: list[tuple[int, Literal["sent", "confirmed"], bool | None, str | None]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._pruner: asyncio.Task[None] | None = None
        self._added = 0

    async def add(self, entries: Sequence[OutboxEntry], *, defer: bool = False) -> list[int]:
        """Persist pieces before they are handed to a transport; their row ids.
        ``defer``: committed with the store's next write (``Store.outbox_add``)."""
        ids = await self.store.outbox_add(entries, defer=defer)
        self._added += len(entries)
        if self._added >= PRUNE_EVERY and self._pruner is None:
            self._added = 0
            self._pruner = asyncio.get_running_loop().create_task(
                self.prune(), name="agentik-outbox-prune"
            )
        return ids

    async def prune(self) -> None:
        """Forget rows older than :data:`KEEP_SECONDS`."""
        try:
            await self.store.outbox_prune(time.time() - KEEP_SECONDS)
        except Exception:
            log.exception("could not prune the outbox")
        finally:
            self._pruner = None

    def mark(
        self,
        outbox_id: int,
        state: Literal["sent", "confirmed"],
        awaits_confirm: bool | None = None,
        ref: str | None = None,
    ) -> None:
        """Record delivery progress (a transport's report); written in the background."""
        self._marks.append((outbox_id, state, awaits_confirm, ref))
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(
                self._flush(), name="agentik-outbox"
            )

    async def _flush(self) -> None:
        # Not a held write (``defer=True``), though it would save a commit now and
        # then: a lost Slack mark costs nothing (a redelivery finds its post again by
        # its metadata), but an IRC line cannot be found again, so a mark held up to
        # DEFER_MAX would widen IRC's "sent twice" window from the instant before the
        # commit to a fifth of a second.  Marks ride in the writer's batches anyway
        # (0.3 writes an answer under bench_slack's load, each carrying the held
        # text of the answers delivered since).
        try:
            while self._marks:
                batch, self._marks = _coalesced(self._marks), []
                try:
                    await self.store.outbox_mark(batch)
                except Exception:
                    # The worst case is a piece sent again after a restart.
                    log.exception("could not record the delivery of %d pieces", len(batch))
        finally:
            self._flusher = None

    async def drain(self) -> None:
        """Wait until every report so far is written (and a running prune)."""
        while self._flusher is not None or self._pruner is not None:
            task = self._flusher or self._pruner
            assert task is not None
            with contextlib.suppress(Exception):
                await asyncio.shield(task)


_RANK = {"sent": 1, "confirmed": 2}


def _coalesced(
    marks: list[tuple[int, Literal["sent", "confirmed"], bool | None, str | None]],
) -> list[tuple[int, Literal["sent", "confirmed"], bool | None, str | None]]:
    """``marks`` with one per row, the same as applying them in order (a state only
    moves forward; a later ``awaits_confirm`` or ``ref`` given replaces an earlier one):
    a Slack answer's ``sent`` and ``confirmed``, reported together, are one update."""
    out: dict[int, tuple[int, Literal["sent", "confirmed"], bool | None, str | None]] = {}
    for mark in marks:
        was = out.get(mark[0])
        if was is not None:
            mark = (
                mark[0],
                mark[1] if _RANK[mark[1]] >= _RANK[was[1]] else was[1],
                was[2] if mark[2] is None else mark[2],
                was[3] if mark[3] is None else mark[3],
            )
        out[mark[0]] = mark
    return list(out.values())


def outbox_rows(
    transport: Transport,
    key: str,
    run_id: str,
    first: int,
    kind: str,
    texts: list[str],
    reply_to: object,
    *,
    complete: bool = True,
) -> list[OutboxEntry]:
    """The outbox rows of ``texts``, pieces ``first``, ``first + 1``, … of run ``run_id``."""
    return [
        OutboxEntry(
            channel_key=key, run_id=run_id, piece=first + i, transport=transport.name, kind=kind,
            text=text, reply_to=reply_to, complete=complete,
        )
        for i, text in enumerate(texts)
    ]  # fmt: skip
