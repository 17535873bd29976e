"""Checkpoints: snapshots of a conversation kept in its database, listable per
conversation.

A checkpoint is the document :func:`~agentik.core.lifecycle.export_conversation`
makes (``format: "agentik.conversation"``), stored by the store's
:class:`~agentik.core.store.repositories.CheckpointRepository` with a label and
the time it was taken.  They are taken on request
(:meth:`Conversation.checkpoint <agentik.core.conversation.Conversation.checkpoint>`,
``!checkpoint``, ``POST …/checkpoints``) or, with ``[checkpoints] keep_automatic``
set, by :class:`CheckpointWorker` each time a conversation ends in this process
(``!new``, idle, ``Conversation.aclose()``, and at shutdown for each conversation
with turns since its last checkpoint), keeping the latest ``keep_automatic``
automatic ones; none when nothing changed since the newest checkpoint, nor for an
empty or deleted conversation; asked-for checkpoints are never trimmed.  A
checkpoint's document restores like any snapshot (``agentik conversations
import``, ``POST …/conversations/import``): as a new conversation, the original
left as it is.  Checkpoints go with their
conversation.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from typing import Any

from pydantic import Field

from .lifecycle import MAX_CHECKPOINT_LABEL, export_conversation
from .settings import settings_dataclass
from .store.records import CheckpointRecord

__all__ = [
    "MAX_LABEL",
    "CheckpointSettings",
    "CheckpointWorker",
    "changed_since_checkpoint",
    "checkpoint_document",
    "take_checkpoint",
]

log = logging.getLogger(__name__)

#: The longest label kept (characters); a longer one is cut.
MAX_LABEL = MAX_CHECKPOINT_LABEL

#: The ends that take an automatic checkpoint (``deleted``: the user asked it gone,
#: its checkpoints go with it; a shutdown is taken by the agent's shutdown listener).
_ENDS = frozenset({"reset", "idle", "closed"})


@settings_dataclass
class CheckpointSettings:
    """``[checkpoints]``: the cap on checkpoints taken by hand, and automatic ones (see
    :mod:`agentik.core.checkpoints`).

    ``keep_manual``: how many checkpoints taken by hand each conversation keeps
    (default 20); past it a new one is refused
    (:class:`~agentik.core.errors.CheckpointLimit`).  ``keep_automatic``: take one
    each time a conversation ends in this process
    (``!new``, idle, closed, and at shutdown for each conversation with turns since
    its last checkpoint; none when unchanged since its newest checkpoint, none for
    a deleted one) and keep this many of each conversation's latest automatic ones;
    0 (the default): take none automatically (asked-for checkpoints work either
    way).
    """

    keep_automatic: int = Field(0, ge=0, le=1000)
    #: The most checkpoints taken by hand (``!checkpoint``, ``POST …/checkpoints``,
    #: ``Conversation.checkpoint()``) one conversation keeps; at the cap a new one is
    #: refused, saying how to delete one (each was taken on purpose: none is dropped
    #: to make room).  0: taking them by hand is off.  An import brings its own.
    keep_manual: int = Field(20, ge=0, le=1000)


def _label(label: str) -> str:
    text = " ".join(label.split())  # one line: it is shown in chat lists
    return text[:MAX_LABEL]


async def take_checkpoint(
    store: Any,
    conversation_id: str,
    *,
    label: str = "",
    automatic: bool = False,
    keep: int | None = None,
    limit: int | None = None,
    now: float | None = None,
) -> CheckpointRecord | None:
    """Snapshot ``conversation_id`` into a checkpoint of ``store``; ``None`` when
    there is no such conversation.  ``keep``: with ``automatic``, how many of the
    conversation's automatic checkpoints stay (this one included).  ``limit``: one
    taken by hand is refused (:class:`~agentik.core.errors.CheckpointLimit`) when the
    conversation has that many taken by hand already."""
    # (Without the earlier checkpoints: each would otherwise hold all the ones before.)
    doc = await export_conversation(store, conversation_id, checkpoints=False)
    if doc is None:
        return None
    text = json.dumps(doc, ensure_ascii=False, allow_nan=False)
    record: CheckpointRecord = await store.checkpoint_add(
        conversation_id,
        text,
        at=time.time() if now is None else now,
        label=_label(label),
        automatic=automatic,
        keep=keep,
        limit=limit,
    )
    return record


async def checkpoint_document(
    store: Any, conversation_id: str, checkpoint_id: int
) -> dict[str, Any] | None:
    """The snapshot document of one checkpoint of ``conversation_id`` (``None``: it
    has no such checkpoint)."""
    text = await store.checkpoint_get(conversation_id, checkpoint_id)
    if text is None:
        return None
    doc: dict[str, Any] = json.loads(text)
    return doc


async def changed_since_checkpoint(store: Any, conversation_id: str) -> bool:
    """Whether ``conversation_id`` is stored, has something in it and changed since
    its newest checkpoint (asked-for or automatic): three small reads, no export."""
    record = await store.get_conversation(conversation_id)
    if record is None or await store.count_messages(conversation_id) == 0:
        return False
    taken = await store.checkpoints(conversation_id)
    return not taken or record.updated_at > taken[0].created_at


class CheckpointWorker:
    """An agent ``background`` coroutine taking the automatic checkpoints:
    ``AgentBuilder().background(CheckpointWorker(settings))``.

    It takes one when a conversation ends in this process (``!new``, idle,
    ``Conversation.aclose()``) and, at :meth:`Agent.aclose
    <agentik.core.agent.Agent.aclose>`, one of each conversation with turns since
    its last checkpoint (label ``shutdown``) — never for an empty conversation nor
    one unchanged since its newest checkpoint.  A deleted conversation gets none:
    its rows (checkpoints included) go, as asked."""

    def __init__(self, settings: CheckpointSettings) -> None:
        self.settings = settings
        #: How many automatic checkpoints were taken (tests, status).
        self.taken = 0
        #: Conversations with a turn ended since their last automatic checkpoint here.
        self._changed: set[str] = set()

    async def _take(self, agent: Any, store: Any, conversation_id: str, reason: str) -> None:
        self._changed.discard(conversation_id)
        try:
            if not await changed_since_checkpoint(store, conversation_id):
                return
            record = await take_checkpoint(
                store, conversation_id, label=reason, automatic=True,
                keep=self.settings.keep_automatic,
            )  # fmt: skip
        except Exception:
            log.exception("automatic checkpoint of conversation %s failed", conversation_id)
            return
        if record is not None:
            self.taken += 1

    async def __call__(self, agent: Any) -> None:
        if self.settings.keep_automatic <= 0:
            return

        async def ended(conv: Any, reason: str, channel_key: str | None) -> None:
            if reason not in _ENDS or getattr(conv, "temp", False):
                return  # a temporary conversation is never written down
            await self._take(agent, agent.store_for(conv), conv.id, reason)

        async def shutdown(closing: list[Any]) -> None:
            # The ones open now (their last turn may not have reached the event
            # stream yet) and the ones that left memory after a turn.
            ids = {c.id for c in closing if not getattr(c, "temp", False)} | self._changed
            for cid in sorted(ids):
                await self._take(agent, agent.store, cid, "shutdown")

        agent.end_listeners.append(ended)
        agent.shutdown_listeners.append(shutdown)
        try:
            events = agent.events(kinds={"turn_ended"})
            async with contextlib.aclosing(events):
                async for event in events:
                    if event.kind == "turn_ended":
                        self._changed.add(event.conversation_id)
        finally:
            with contextlib.suppress(ValueError):
                agent.end_listeners.remove(ended)
            with contextlib.suppress(ValueError):
                agent.shutdown_listeners.remove(shutdown)
