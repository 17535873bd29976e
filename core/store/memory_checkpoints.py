"""The memory engine's checkpoints (:class:`~.repositories.CheckpointRepository`)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from ..errors import CheckpointLimit, StoreError
from .records import CheckpointRecord

__all__ = ["MemoryCheckpoints"]


class MemoryCheckpoints:
    """Checkpoints (record and document) per conversation, oldest first."""

    _conversations: Mapping[str, object]

    def _checkpoint_map(self) -> dict[str, list[tuple[CheckpointRecord, str]]]:
        found: dict[str, list[tuple[CheckpointRecord, str]]] = self.__dict__.setdefault(
            "_checkpoints", {}
        )
        return found

    def _checkpoints_forget(self, conversation_id: str) -> None:
        self._checkpoint_map().pop(conversation_id, None)

    async def checkpoint_add(
        self,
        conversation_id: str,
        document: str,
        *,
        at: float,
        label: str = "",
        automatic: bool = False,
        keep: int | None = None,
        limit: int | None = None,
    ) -> CheckpointRecord:
        if conversation_id not in self._conversations:
            raise StoreError(f"no conversation {conversation_id!r}")
        held = self._checkpoint_map().setdefault(conversation_id, [])
        if not automatic and limit is not None:
            if sum(not r.automatic for r, _ in held) >= limit:
                raise CheckpointLimit(conversation_id, limit)
        ids = self.__dict__.setdefault("_checkpoint_ids", itertools.count(1))
        record = CheckpointRecord(
            id=next(ids), conversation_id=conversation_id, created_at=at, label=label,
            automatic=automatic, size=len(document.encode("utf-8")),
        )  # fmt: skip
        held.append((record, document))
        if automatic and keep is not None:
            auto = [r.id for r, _ in held if r.automatic]
            gone = set(auto[: max(0, len(auto) - max(0, keep))])
            held[:] = [(r, d) for r, d in held if r.id not in gone]
        return record

    async def checkpoints(self, conversation_id: str) -> list[CheckpointRecord]:
        return [r for r, _ in reversed(self._checkpoint_map().get(conversation_id, []))]

    async def checkpoint_get(self, conversation_id: str, checkpoint_id: int) -> str | None:
        for r, doc in self._checkpoint_map().get(conversation_id, []):
            if r.id == checkpoint_id:
                return doc
        return None

    async def checkpoint_delete(self, conversation_id: str, checkpoint_id: int) -> bool:
        held = self._checkpoint_map().get(conversation_id, [])
        kept = [(r, d) for r, d in held if r.id != checkpoint_id]
        if len(kept) == len(held):
            return False
        held[:] = kept
        return True
