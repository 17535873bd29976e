"""Attachments: content-addressed bytes and the conversations that hold them (issue 34)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from .kit import ContractBase, rec

__all__ = ["AttachmentsContract"]

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
TEXT = "notes ✓\n".encode()


class AttachmentsContract(ContractBase):
    """``attachment_put`` stores bytes once per SHA-256; a conversation sees only what
    it holds; dropping, or deleting the conversation, removes bytes nobody holds."""

    async def test_bytes_are_stored_once_and_read_back_by_hash(self, store: Any) -> None:
        await store.create_conversation(rec("a", 1.0))
        await store.create_conversation(rec("b", 2.0))
        first = await store.attachment_put("a", PNG, "image/png", at=10.0)
        sha = hashlib.sha256(PNG).hexdigest()
        assert (first.sha256, first.media_type, first.size, first.created_at) == (
            sha, "image/png", len(PNG), 10.0,
        )  # fmt: skip
        # Again, by the same or another conversation: one copy of the bytes.
        again = await store.attachment_put("a", PNG, "image/png", at=11.0)
        assert again == first
        await store.attachment_put("b", PNG, "image/png", at=12.0)
        assert await store.attachment_data(sha) == PNG
        assert await store.attachment_get("a", sha) == first
        assert await store.attachment_get("a", "0" * 64) is None
        await store.attachment_put("a", TEXT, "text/plain", at=13.0)
        assert [r.media_type for r in await store.attachments("a")] == ["image/png", "text/plain"]
        assert [r.sha256 for r in await store.attachments("b")] == [sha]
        assert await store.attachments("nobody") == []
        assert await store.attachment_data("f" * 64) is None

    async def test_a_conversation_that_does_not_exist_holds_nothing(self, store: Any) -> None:
        with pytest.raises(KeyError):
            await store.attachment_put("missing", PNG, "image/png", at=1.0)
        assert await store.attachment_data(hashlib.sha256(PNG).hexdigest()) is None

    async def test_bytes_go_when_nobody_holds_them(self, store: Any) -> None:
        sha = hashlib.sha256(PNG).hexdigest()
        tsha = hashlib.sha256(TEXT).hexdigest()
        for cid in ("a", "b"):
            await store.create_conversation(rec(cid, 1.0))
            await store.attachment_put(cid, PNG, "image/png", at=1.0)
        await store.attachment_put("a", TEXT, "text/plain", at=1.0)
        assert await store.attachment_drop("a", [sha, sha]) == 1
        assert await store.attachment_get("a", sha) is None
        assert await store.attachment_data(sha) == PNG  # b still holds it
        assert await store.attachment_drop("a", [sha]) == 0
        assert await store.delete_conversation("b") is True
        assert await store.attachment_data(sha) is None
        assert await store.attachment_data(tsha) == TEXT
        assert await store.delete_conversation("a") is True
        assert await store.attachment_data(tsha) is None
