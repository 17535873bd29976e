"""Delivery: outgoing messages sent through their transport, persisted first on
a transport with an outbox, and sent again after a restart.

:meth:`Delivery.send` fits a short line (a notice, an error, a command's
answer) to the channel's size limits, writes each piece of a run's output to
the outbox (:mod:`agentik.bot.outbox`) when the transport keeps one (IRC,
Slack), sends it, and counts it.  :meth:`Delivery.redeliver`, once the
transports have started, sends what a previous process left undelivered.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Protocol

from agentik.core.store.base import OutboxEntry, Store
from agentik.transports.base import Action, Form, OutgoingKind, OutgoingMessage, Transport
from agentik.transports.text import split_text

from .outbox import Outbox, outbox_rows

if TYPE_CHECKING:
    from .metrics import Metrics

__all__ = ["Delivery"]

# Delivery failures keep the bridge's logger: operators' log filters name it.
log = logging.getLogger("agentik.bot.bridge")


class Resender(Protocol):
    """Who says what a relayed copy, or a change to one, is sent as again, and tries
    again those a target still refuses (the links)."""

    async def resending(self, row: OutboxEntry) -> OutgoingMessage | None: ...

    def later(self, out: OutgoingMessage) -> None: ...

    async def requeue(self, row: OutboxEntry) -> None: ...


class Delivery:
    """Sends a bridge's outgoing messages (see the module docstring)."""

    def __init__(self, store: Store, outbox: Outbox, transports: Mapping[str, Transport]) -> None:
        self.store = store
        #: Outgoing pieces and their delivery state, persisted.
        self.outbox = outbox
        #: The transport instances by name (the bridge's, kept up to date by it).
        self._transports = transports
        #: Where messages out are counted (the bot's :class:`~agentik.bot.metrics.Metrics`).
        self.metrics: Metrics | None = None
        #: What relayed copies and changes to them are sent as again (the bridge's links).
        self.relays: Resender | None = None

    async def send(
        self,
        transport: Transport,
        key: str,
        text: str,
        kind: OutgoingKind,
        reply_to: object,
        run_id: str | None = None,
        *,
        piece: int | None = None,
        outbox_id: int | None = None,
        actions: tuple[Action, ...] = (),
        form: Form | None = None,
        tag: str | None = None,
        updates: str | None = None,
        author: str | None = None,
    ) -> int:
        """Send ``text``; returns how many pieces it took.

        With ``piece`` (the renderer's count of this run's pieces so far) on a
        transport with an outbox, each piece is persisted first.
        """
        pieces = [text]
        if kind in ("notice", "error", "command"):
            # Answers are split by the renderer; these short lines can still be
            # too long for a small channel (a command list): fit them too.
            caps = transport.caps
            pieces = split_text(text, max_bytes=caps.max_bytes, max_chars=caps.max_chars) or [text]
        ids: list[int | None] = [outbox_id] * len(pieces)
        if piece is not None and run_id and transport.outbox and kind not in ("delta", "end"):
            try:
                ids = list(await self.outbox.add(outbox_rows(transport, key, run_id, piece, kind,
                                                       pieces, reply_to)))  # fmt: skip
            except Exception:
                # Still send it: only a restart's redelivery depends on the row.
                log.exception("could not persist an outgoing piece for %s", key)
        last = len(pieces) - 1
        for i, (text_piece, oid) in enumerate(zip(pieces, ids, strict=True)):
            final = i == last  # buttons and tags go with the last piece
            try:
                await transport.send(
                    OutgoingMessage(
                        channel_key=key, text=text_piece, kind=kind, run_id=run_id,
                        reply_to=reply_to, outbox_id=oid, actions=actions if final else (),
                        form=form if final else None,
                        tag=tag if final else None, updates=updates if final else None,
                        author=author,
                    )
                )  # fmt: skip
            except Exception:
                log.exception("transport %s could not send to %s", transport.name, key)
            else:
                if self.metrics is not None:
                    self.metrics.message_out(transport.name, kind)
        return len(pieces)

    async def redeliver(self, *, transports: Collection[str] | None = None) -> int:
        """Send what the outbox says a previous process left undelivered; how many pieces.

        Called once the transports have started.  Pieces still ``queued``
        (an IRC line waiting for flood control, a Slack answer not posted)
        are sent; so are pieces ``sent`` but awaiting a confirmation that
        never came (IRC with echo-message; a Slack answer whose final text was
        not in its message yet: that message is updated, not posted again).
        A streamed answer whose turn never reached the renderer's end is
        completed from the audit log when the turn did finish there.  Rows
        older than a week are pruned first.  ``transports``: only the pieces of
        these transport instances (a worker that took one over).
        """
        store = self.store
        await self.outbox.prune()
        rows = await store.outbox_undelivered()
        sent = 0
        ends: dict[tuple[str, str], OutboxEntry] = {}
        #: Linked channels that refused a copy: theirs are tried again by the links.
        refused: set[str] = set()
        for row in rows:
            if transports is not None and row.transport not in transports:
                continue  # another worker's
            transport = self._transports.get(row.transport)
            if transport is None or not transport.outbox:
                continue  # that transport is not configured any more
            text = row.text
            if not row.complete:
                found = await self._answer_from_log(row)
                if found is None:
                    continue  # the turn did not finish: resuming it is not ours
                text = found
                await self.outbox.add([dataclasses.replace(row, text=text, complete=True)])
            kind: OutgoingKind = "answer" if row.kind == "stream" else row.kind  # type: ignore[assignment]
            if kind in ("relay", "unrelay"):
                # A relayed copy (linked channels), or an edit or a deletion of one: the
                # links say what it is sent as (its author, late, the copy it changes).
                if self.relays is None:  # (no links: sent as it was written)
                    author = row.reply_to.get("author") if isinstance(row.reply_to, dict) else None
                    out = OutgoingMessage(
                        channel_key=row.channel_key, text=text, kind=kind, run_id=row.run_id,
                        reply_to=row.reply_to, outbox_id=row.id, written_at=row.created_at,
                        author=author,
                    )  # fmt: skip
                elif row.channel_key in refused:
                    await self.relays.requeue(row)  # behind the one refused, in order
                    continue
                else:
                    resent = await self.relays.resending(row)
                    if resent is None:
                        continue
                    out = resent
            else:
                out = OutgoingMessage(
                    channel_key=row.channel_key, text=text, kind=kind, run_id=row.run_id,
                    reply_to=row.reply_to, outbox_id=row.id, replaces=row.ref,
                    written_at=row.created_at,
                )  # fmt: skip
            try:
                await transport.send(out)
            except Exception:
                if out.kind in ("relay", "unrelay") and self.relays is not None:
                    # The target is still down: tried again, in order, until it is back.
                    log.warning("transport %s could not redeliver to %s: trying again",
                                row.transport, row.channel_key)  # fmt: skip
                    refused.add(row.channel_key)
                    self.relays.later(out)
                    continue
                log.exception("transport %s could not redeliver to %s", row.transport,
                              row.channel_key)  # fmt: skip
                continue
            sent += 1
            ends[(row.channel_key, row.run_id)] = row
        for row in ends.values():
            transport = self._transports[row.transport]
            with contextlib.suppress(Exception):
                await transport.send(
                    OutgoingMessage(
                        channel_key=row.channel_key, text="", kind="end", run_id=row.run_id,
                        reply_to=row.reply_to,
                    )
                )  # fmt: skip
        if sent:
            log.info("redelivered %d outgoing pieces left undelivered by the last run", sent)
        return sent

    async def _answer_from_log(self, row: OutboxEntry) -> str | None:
        """The answer text of ``row``'s run if its turn completed in the audit log."""
        store = self.store
        conv_id = await store.get_binding(row.channel_key)
        if conv_id is None:
            return None
        recent = await store.messages(conv_id, limit=200)
        run = [m for m in recent if m.run_id == row.run_id]
        if not run or run[-1].kind != "assistant" or run[-1].status != "complete":
            return None
        texts = [m.content for m in run if m.kind == "assistant" and m.content]
        return "\n".join(texts) or None
