"""Message shapes shared by the agent, the store and the LLM backends.

Two families, matching the two halves of the dual log:

* :class:`ChatMessage` — one entry of a conversation's *working memory*, the
  LLM context (``system``/``user``/``assistant``/``tool`` roles, OpenAI-like).
  Backends translate these to their wire format.
* :class:`Message` — one row of the append-only *audit log*: what was said or
  done, by whom, in which run.  ``kind`` is ``user``, ``assistant``,
  ``tool_call`` or ``tool_result``.

All are frozen dataclasses that round-trip through ``to_dict``/``from_dict``
(plain JSON types), so the same shapes go to transports, the HTTP API and the
database.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "ChatMessage",
    "Message",
    "MessageKind",
    "MessageStatus",
    "NewMessage",
    "Role",
    "ToolCall",
    "Usage",
]

Role = Literal["system", "user", "assistant", "tool"]
MessageKind = Literal["user", "assistant", "tool_call", "tool_result"]
#: ``complete`` normally; ``interrupted`` when a turn was stopped while this was
#: being produced; ``error`` when the model failed part-way.
MessageStatus = Literal["complete", "interrupted", "error"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolCall:
    """A tool call requested by the model; ``arguments`` is the raw JSON text."""

    id: str
    name: str
    arguments: str = "{}"

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ToolCall:
        return cls(id=d["id"], name=d["name"], arguments=d.get("arguments", "{}"))


@dataclass(frozen=True, kw_only=True, slots=True)
class Usage:
    """Token usage reported by a backend (summed over the requests of a turn)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
        )

    def to_dict(self) -> dict[str, int]:
        # Spelled out: dataclasses.asdict costs several times more (a child run
        # records usage three times).
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Usage:
        return cls(
            **{k: int(d.get(k, 0)) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class ChatMessage:
    """One message of the LLM context (working memory).

    ``author`` is the display name of the person who wrote a ``user`` message
    (several people can share one channel).  ``tool_calls`` is set on
    ``assistant`` messages that request tools; ``tool_call_id``/``name`` on
    ``tool`` results.  ``message_id`` links back to the audit-log row.
    """

    role: Role
    content: str = ""
    author: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    is_error: bool = False
    message_id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.author is not None:
            d["author"] = self.author
        if self.tool_calls:
            d["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            d["name"] = self.name
        if self.is_error:
            d["is_error"] = True
        if self.message_id is not None:
            d["message_id"] = self.message_id
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ChatMessage:
        return cls(
            role=d["role"],
            content=d.get("content", ""),
            author=d.get("author"),
            tool_calls=tuple(ToolCall.from_dict(c) for c in d.get("tool_calls", ())),
            tool_call_id=d.get("tool_call_id"),
            name=d.get("name"),
            is_error=bool(d.get("is_error", False)),
            message_id=d.get("message_id"),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, s: str) -> ChatMessage:
        return cls.from_dict(json.loads(s))


@dataclass(frozen=True, kw_only=True, slots=True)
class _AuditRow:
    """The fields of an audit-log row its writer gives: shared by
    :class:`NewMessage` (to be written) and :class:`Message` (as stored)."""

    kind: MessageKind
    content: str = ""
    author: str | None = None
    channel: str | None = None
    run_id: str | None = None
    tool_call_id: str | None = None
    tool_name: str | None = None
    arguments: str | None = None
    is_error: bool = False
    status: MessageStatus = "complete"
    data: Any = None
    duration: float | None = None
    created_at: float = 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class NewMessage(_AuditRow):
    """An audit-log row about to be written (the store assigns ``id``)."""

    def stored(self, *, id: int, conversation_id: str, now: float) -> Message:
        """This row as a store writes it: with its ``id``, its conversation, and
        ``created_at`` set to ``now`` unless the writer gave one."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(_AuditRow)}
        fields["created_at"] = self.created_at or now
        return Message(id=id, conversation_id=conversation_id, **fields)


@dataclass(frozen=True, kw_only=True, slots=True)
class Message(_AuditRow):
    """One row of the append-only audit log, as read back from the store."""

    id: int
    conversation_id: str

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        # ``id`` and ``conversation_id`` first, as they always were.
        return {"id": d.pop("id"), "conversation_id": d.pop("conversation_id"), **d}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Message:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})
