"""Shared pieces of the store contract suite: the base class and record builders."""

from __future__ import annotations

import time
from typing import Any, ClassVar

import pytest

from ...messages import ChatMessage, NewMessage
from ..base import CAPABILITIES
from ..records import Approval, ConversationRecord, OutboxEntry, Question
from ..repositories import REPOSITORIES

__all__ = ["ContractBase", "approval", "chat", "outbox", "question", "rec", "user"]


class ContractBase:
    """What every contract mixin shares: the ``store`` fixture it needs and skips."""

    pytestmark = pytest.mark.asyncio
    #: ``{"test_name": "why"}``: cases this engine legitimately cannot pass.
    unsupported: ClassVar[dict[str, str]] = {}

    @pytest.fixture
    def store(self) -> Any:
        raise NotImplementedError("a store contract subclass must define a 'store' fixture")

    async def test_the_engine_is_every_repository(self, store: Any) -> None:
        missing = [p.__name__ for p in REPOSITORIES if not isinstance(store, p)]
        assert missing == []
        assert store.capabilities <= set(CAPABILITIES)

    @pytest.fixture(autouse=True)
    def _skip_unsupported(self, request: pytest.FixtureRequest) -> None:
        why = self.unsupported.get(request.node.originalname)
        if why:
            pytest.skip(why)


def rec(cid: str, t: float = 1.0, title: str = "", meta: dict[str, Any] | None = None) -> Any:
    return ConversationRecord(id=cid, title=title, created_at=t, updated_at=t, meta=meta or {})


def user(text: str, **kw: Any) -> NewMessage:
    kw.setdefault("created_at", time.time())
    return NewMessage(kind="user", content=text, **kw)


def chat(text: str, role: str = "user", **kw: Any) -> ChatMessage:
    return ChatMessage(role=role, content=text, **kw)  # type: ignore[arg-type]


def approval(cid: str, short: str = "a1", **kw: Any) -> Approval:
    fields: dict[str, Any] = {
        "id": short, "scope": cid, "conversation_id": cid, "run_id": "r1", "call_id": "c1",
        "tool": "shell", "arguments": '{"cmd": "ls"}', "digest": "d1", "asker": "bob",
        "asker_id": "irc:bob", "approvers": "admin", "created_at": 10.0, "expires_at": 70.0,
    }  # fmt: skip
    fields.update(kw)
    return Approval(**fields)


def question(cid: str, text: str = "which one?", **kw: Any) -> Question:
    fields: dict[str, Any] = {
        "conversation_id": cid, "run_id": "r1", "call_id": "q1", "text": text,
        "choices": ("red", "blue"), "asker_target": "bob", "digest": "dq", "created_at": 10.0,
        "deadline": 70.0,
    }  # fmt: skip
    fields.update(kw)
    return Question(**fields)


def outbox(piece: int, text: str = "", **kw: Any) -> OutboxEntry:
    fields: dict[str, Any] = {
        "channel_key": "irc:net:#c", "run_id": "r1", "piece": piece, "transport": "irc",
        "kind": "answer", "text": text or f"piece {piece}",
    }  # fmt: skip
    fields.update(kw)
    return OutboxEntry(**fields)
