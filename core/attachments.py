"""Attachments: images and files that arrive with a message.

An attachment is taken only when its bytes say what it is (:func:`sniff`:
PNG, JPEG, GIF, WebP, PDF, or UTF-8 text) and it is at most
:attr:`AttachmentSettings.max_bytes` long.  The name a sender gave is kept
for display only; the type never comes from it.  Taken bytes are stored
content-addressed (by their SHA-256) through the store's attachment
repository (:class:`~agentik.core.store.repositories.AttachmentRepository`);
messages keep only the hash (:class:`~agentik.core.messages.ImagePart`,
:class:`~agentik.core.messages.FilePart`).

What reaches the model (:func:`for_model`): a backend that declares image
input (``supports_image_in``) gets images as image parts with their bytes;
any other gets a one-line description (``[image: cat.png, 1.2 MB]``).  UTF-8
text files are given to every model as their text (cut at
:data:`TEXT_FILE_CHARS`), after the description.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pydantic import Field

from .errors import AttachmentRejected
from .messages import ChatMessage, FilePart, ImagePart, describe_part, parts_from
from .settings import settings_dataclass

__all__ = [
    "IMAGE_TYPES",
    "TEXT_FILE_CHARS",
    "AttachmentSettings",
    "check",
    "drop_unreferenced",
    "for_model",
    "hashes_of",
    "part_for",
    "sha256_of",
    "sniff",
]

#: The image types a model may be given as images.
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
#: How much of a text file a model is given (characters).
TEXT_FILE_CHARS = 20_000


@settings_dataclass
class AttachmentSettings:
    """``[attachments]``: images and files sent with messages.

    ``max_bytes``: the largest attachment taken (larger ones are refused with
    a one-line answer and nothing is stored).  The ``url_`` keys bound the image
    links fetched in channels with ``image_urls`` on
    (:mod:`agentik.transports.imagefetch`).
    """

    max_bytes: int = Field(10 * 2**20, ge=1)
    #: Images fetched from the links of one message, at most (the rest are not
    #: fetched; the person is told).
    url_max_images: int = Field(3, ge=1, le=10)
    #: Seconds one link may take, all its redirects and its bytes included.
    url_timeout: float = Field(10.0, gt=0, le=300)
    #: Also fetch from loopback and private (LAN) addresses: for tests and LAN
    #: setups only.  Link-local, multicast and unspecified addresses are refused
    #: whatever this says.
    url_allow_private: bool = False


def sniff(data: bytes) -> str | None:
    """The media type ``data`` is, from its first bytes (magic numbers); ``None``
    for anything but PNG, JPEG, GIF, WebP, PDF and UTF-8 text."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data.startswith(b"%PDF-"):
        return "application/pdf"
    if not data:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    # Control characters other than whitespace mark a binary file that happens
    # to decode (and NUL never appears in text).
    if any(ord(c) < 32 and c not in "\t\n\r\f" for c in text):
        return None
    return "text/plain"


def sha256_of(data: bytes) -> str:
    """The hex SHA-256 of ``data``: an attachment's name in the store."""
    return hashlib.sha256(data).hexdigest()


def check(data: bytes, max_bytes: int, *, name: str = "", size: int = 0) -> str:
    """The sniffed media type of ``data``, or :class:`AttachmentRejected` with a
    one-line reason (too large, or not a type that is taken).  ``size``: its size as
    its sender declared it, when the bytes were not all read (over the cap)."""
    label = f"{name!r} " if name else ""
    n = max(len(data), size)
    if n > max_bytes:
        raise AttachmentRejected(
            f"attachment {label}not taken: {n} bytes, the limit is {max_bytes}"
        )
    media_type = sniff(data)
    if media_type is None:
        raise AttachmentRejected(
            f"attachment {label}not taken: only PNG, JPEG, GIF, WebP, PDF and UTF-8 text are"
        )
    return media_type


def part_for(data: bytes, media_type: str, *, name: str = "") -> ImagePart | FilePart:
    """The part naming stored bytes ``data`` of (sniffed) ``media_type``."""
    cls = ImagePart if media_type in IMAGE_TYPES else FilePart
    return cls(sha256=sha256_of(data), media_type=media_type, name=name, size=len(data))


Load = Callable[[str], Awaitable[bytes | None]]


async def for_model(
    messages: Sequence[ChatMessage], *, image_in: bool, load: Load
) -> list[ChatMessage]:
    """``messages`` as the model is given them: images with their bytes (``load``
    reads them by hash) when it takes ``image_in``, descriptions otherwise; text
    files as their text; an attachment whose bytes are gone (redacted) as its
    description."""
    out: list[ChatMessage] = []
    for m in messages:
        if not m.parts:
            out.append(m)
            continue
        notes: list[str] = []
        images: list[ImagePart | FilePart] = []
        for part in m.parts:
            if isinstance(part, ImagePart) and image_in:
                if part.url is not None and part.sha256 is None:
                    images.append(part)
                    continue
                data = await load(part.sha256) if part.sha256 else None
                if data is not None:
                    images.append(dataclasses.replace(part, data=data))
                    continue
            notes.append(describe_part(part))
            if part.media_type == "text/plain" and part.sha256:
                data = await load(part.sha256)
                if data is not None:
                    notes.append(data.decode("utf-8", "replace")[:TEXT_FILE_CHARS])
        content = "\n".join([m.content, *notes]) if m.content else "\n".join(notes)
        out.append(dataclasses.replace(m, content=content, parts=tuple(images)))
    return out


def hashes_of(data: object) -> list[str]:
    """The attachment hashes an audit-log row's ``data`` names."""
    if not isinstance(data, dict):
        return []
    return [p.sha256 for p in parts_from(data.get("parts")) if p.sha256]


async def drop_unreferenced(store: Any, conversation_id: str, *, before: float) -> int:
    """Drop the attachments ``conversation_id`` holds that no message of its audit
    log names any more (retention pruned them), stored before ``before`` (a later
    one may be an upload whose message is on its way)."""
    try:
        held = await store.attachments(conversation_id)
    except NotImplementedError:
        return 0
    old = {a.sha256 for a in held if a.created_at < before}
    if not old:
        return 0
    named: set[str] = set()
    after = 0
    while True:
        page = await store.messages(conversation_id, after=after, limit=1000)
        if not page:
            break
        for m in page:
            named.update(hashes_of(m.data))
        after = page[-1].id
    gone = sorted(old - named)
    return int(await store.attachment_drop(conversation_id, gone)) if gone else 0
