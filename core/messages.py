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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "ChatMessage",
    "Content",
    "ContentPart",
    "FilePart",
    "ImagePart",
    "Message",
    "MessageKind",
    "MessageStatus",
    "NewMessage",
    "Role",
    "TextPart",
    "ToolCall",
    "Usage",
    "describe_part",
    "parts_from",
    "split_content",
    "user_chat_message",
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
class TextPart:
    """Text in a message made of parts."""

    kind: Literal["text"] = "text"
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "text", "text": self.text}


@dataclass(frozen=True, kw_only=True, slots=True)
class _Attached:
    """The fields of an attachment part.

    Given to ``send()`` with ``data`` (the bytes: the conversation stores them
    and keeps only their ``sha256``) or an ``url`` (an image the model fetches
    itself).  As stored (audit log, working memory) a part names its bytes by
    ``sha256``; ``data`` is never serialised.  ``media_type`` is the type
    sniffed from the bytes, never the one a sender claimed.
    """

    data: bytes | None = dataclasses.field(default=None, repr=False, compare=False)
    url: str | None = None
    sha256: str | None = None
    media_type: str = ""
    name: str = ""
    size: int = 0

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": getattr(self, "kind")}  # noqa: B009 - set by subclasses
        for key in ("url", "sha256"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        d.update(media_type=self.media_type, name=self.name, size=self.size)
        return d


@dataclass(frozen=True, kw_only=True, slots=True)
class ImagePart(_Attached):
    """An image (PNG, JPEG, GIF, WebP): its bytes, a stored attachment or an URL."""

    kind: Literal["image"] = "image"


@dataclass(frozen=True, kw_only=True, slots=True)
class FilePart(_Attached):
    """Any other file (PDF, UTF-8 text): a reference to a stored attachment."""

    kind: Literal["file"] = "file"


#: One part of a message's content (:func:`parts_from` reads them back).
ContentPart = TextPart | ImagePart | FilePart
#: What ``Conversation.send`` takes: text, or parts.
Content = str | Sequence[ContentPart]


def parts_from(items: Any) -> tuple[ImagePart | FilePart, ...]:
    """Attachment parts from their :meth:`to_dict` form (unknown kinds are skipped:
    a snapshot or a newer version may carry some)."""
    out: list[ImagePart | FilePart] = []
    for d in items if isinstance(items, list | tuple) else ():
        if not isinstance(d, dict) or d.get("kind") not in ("image", "file"):
            continue
        cls = ImagePart if d["kind"] == "image" else FilePart
        out.append(
            cls(
                url=d.get("url") if isinstance(d.get("url"), str) else None,
                sha256=d.get("sha256") if isinstance(d.get("sha256"), str) else None,
                media_type=str(d.get("media_type", "")),
                name=str(d.get("name", "")),
                size=int(d.get("size", 0) or 0),
            )
        )
    return tuple(out)


def split_content(content: Content) -> tuple[str, tuple[ImagePart | FilePart, ...]]:
    """``content`` as its text (the text parts, one per line) and its attachments."""
    if isinstance(content, str):
        return content, ()
    if isinstance(content, bytes | bytearray) or not isinstance(content, Sequence):
        raise TypeError("content must be a str or a sequence of content parts")
    texts: list[str] = []
    attached: list[ImagePart | FilePart] = []
    for part in content:
        if isinstance(part, TextPart):
            texts.append(part.text)
        elif isinstance(part, ImagePart | FilePart):
            attached.append(part)
        else:
            raise TypeError(f"not a content part: {type(part).__name__}")
    return "\n".join(texts), tuple(attached)


def _size(n: int) -> str:
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f} MB"
    if n >= 1000:
        return f"{n / 1000:.1f} KB"
    return f"{n} bytes"


def describe_part(part: ImagePart | FilePart) -> str:
    """The text a model without image input is given for ``part``:
    ``[image: name.png, 1.2 MB]``."""
    what = part.kind
    label = part.name or part.url or part.media_type or "unnamed"
    # Brackets and line breaks from a sender's file name cannot close the note.
    label = "".join(" " if c in "[]\r\n" else c for c in label)[:200]
    if part.size:
        return f"[{what}: {label}, {_size(part.size)}]"
    return f"[{what}: {label}]"


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
    #: Attachments of a ``user`` message (its text is ``content``).
    parts: tuple[ImagePart | FilePart, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.parts:
            d["parts"] = [p.to_dict() for p in self.parts]
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
            parts=parts_from(d.get("parts")),
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


def user_chat_message(m: Message) -> ChatMessage:
    """The working-memory entry of the audit log's user message ``m`` (its
    attachments are in ``data["parts"]``)."""
    data = m.data if isinstance(m.data, dict) else {}
    return ChatMessage(
        role="user", content=m.content, author=m.author, message_id=m.id,
        parts=parts_from(data.get("parts")),
    )  # fmt: skip
