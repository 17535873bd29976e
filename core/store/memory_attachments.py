"""The memory engine's attachments (:class:`~.repositories.AttachmentRepository`)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

from .records import AttachmentRecord

__all__ = ["MemoryAttachments"]


class MemoryAttachments:
    """Bytes by SHA-256, and which conversations hold them, in dictionaries."""

    _conversations: Mapping[str, object]

    def _attachment_maps(
        self,
    ) -> tuple[dict[tuple[str, str], AttachmentRecord], dict[str, bytes]]:
        held: dict[tuple[str, str], AttachmentRecord] = self.__dict__.setdefault("_held", {})
        blobs: dict[str, bytes] = self.__dict__.setdefault("_blobs", {})
        return held, blobs

    def _attachment_sweep(self) -> None:
        held, blobs = self._attachment_maps()
        kept = {sha for _, sha in held}
        for sha in [s for s in blobs if s not in kept]:
            del blobs[sha]

    async def attachment_put(
        self, conversation_id: str, data: bytes, media_type: str, *, at: float
    ) -> AttachmentRecord:
        if conversation_id not in self._conversations:
            raise KeyError(f"no conversation {conversation_id}")
        held, blobs = self._attachment_maps()
        sha = hashlib.sha256(data).hexdigest()
        blobs.setdefault(sha, bytes(data))
        record = held.get((conversation_id, sha))
        if record is None:
            record = AttachmentRecord(
                conversation_id=conversation_id, sha256=sha, media_type=media_type,
                size=len(data), created_at=at,
            )  # fmt: skip
            held[(conversation_id, sha)] = record
        return record

    async def attachment_get(self, conversation_id: str, sha256: str) -> AttachmentRecord | None:
        return self._attachment_maps()[0].get((conversation_id, sha256))

    async def attachment_data(self, sha256: str) -> bytes | None:
        return self._attachment_maps()[1].get(sha256)

    async def attachments(self, conversation_id: str) -> list[AttachmentRecord]:
        found = [r for (c, _), r in self._attachment_maps()[0].items() if c == conversation_id]
        return sorted(found, key=lambda r: (r.created_at, r.sha256))

    async def attachment_drop(self, conversation_id: str, sha256s: Sequence[str]) -> int:
        held, _ = self._attachment_maps()
        dropped = sum(held.pop((conversation_id, s), None) is not None for s in set(sha256s))
        self._attachment_sweep()
        return dropped

    def _attachments_forget(self, conversation_id: str) -> None:
        """(Deleting a conversation.)"""
        held, _ = self._attachment_maps()
        for key in [k for k in held if k[0] == conversation_id]:
            del held[key]
        self._attachment_sweep()
