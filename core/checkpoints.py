"""Checkpoints: snapshots of a conversation kept in its database, listable per
conversation.

A checkpoint is the document :func:`~agentik.core.lifecycle.export_conversation`
makes (``format: "agentik.conversation"``), stored by the store's
:class:`~agentik.core.store.repositories.CheckpointRepository` with a label and
the time it was taken.  They are taken on request
(:meth:`Conversation.checkpoint <agentik.core.conversation.Conversation.checkpoint>`,
``!checkpoint``, ``POST …/checkpoints``) or, with ``[checkpoints] keep_automatic``
set, by :class:`CheckpointWorker` each time a conversation ends (``!new``, idle,
``Conversation.aclose()``), keeping the latest ``keep_automatic`` automatic ones;
asked-for checkpoints are never trimmed.  A checkpoint's document restores like
any snapshot (``agentik conversations import``, ``POST …/conversations/import``):
as a new conversation, the original left as it is.  Checkpoints go with their
conversation.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from pydantic import Field

from .lifecycle import export_conversation
from .settings import settings_dataclass
from .store.records import CheckpointRecord

__all__ = [
    "MAX_LABEL",
    "CheckpointSettings",
    "CheckpointWorker",
    "checkpoint_document",
    "take_checkpoint",
]

log = logging.getLogger(__name__)

#: The longest label kept (characters); a longer one is cut.
MAX_LABEL = 200

#: The ends that take an automatic checkpoint (``deleted``: its rows go anyway;
#: ``shutdown``: the database keeps everything for the next start).
_ENDS = frozenset({"reset", "idle", "closed"})


@settings_dataclass
class CheckpointSettings:
    """``[checkpoints]``: automatic checkpoints (see :mod:`agentik.core.checkpoints`).

    ``keep_automatic``: take one each time a conversation ends (``!new``, idle,
    closed) and keep this many of each conversation's latest; 0 (the default):
    take none automatically (asked-for checkpoints work either way).
    """

    keep_automatic: int = Field(0, ge=0, le=1000)


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
    now: float | None = None,
) -> CheckpointRecord | None:
    """Snapshot ``conversation_id`` into a checkpoint of ``store``; ``None`` when
    there is no such conversation.  ``keep``: with ``automatic``, how many of the
    conversation's automatic checkpoints stay (this one included)."""
    doc = await export_conversation(store, conversation_id)
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


class CheckpointWorker:
    """An agent ``background`` coroutine taking the automatic checkpoints:
    ``AgentBuilder().background(CheckpointWorker(settings))``."""

    def __init__(self, settings: CheckpointSettings) -> None:
        self.settings = settings
        #: How many automatic checkpoints were taken (tests, status).
        self.taken = 0

    async def __call__(self, agent: Any) -> None:
        if self.settings.keep_automatic <= 0:
            return

        async def ended(conv: Any, reason: str, channel_key: str | None) -> None:
            if reason not in _ENDS or getattr(conv, "temp", False):
                return  # a temporary conversation is never written down
            try:
                record = await take_checkpoint(
                    agent.store_for(conv), conv.id, label=reason, automatic=True,
                    keep=self.settings.keep_automatic,
                )  # fmt: skip
            except Exception:
                log.exception("automatic checkpoint of conversation %s failed", conv.id)
                return
            if record is not None:
                self.taken += 1

        agent.end_listeners.append(ended)
        try:
            await asyncio.Event().wait()  # until the agent closes (cancelled)
        finally:
            agent.end_listeners.remove(ended)
