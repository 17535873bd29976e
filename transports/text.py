"""Splitting text to a channel's limits.

:func:`split_text` cuts text into pieces that each fit ``max_bytes`` (UTF-8)
and ``max_chars``, preferring line breaks, then spaces, and never cutting
inside a character.  Pieces reassemble to the original apart from the
whitespace at the cuts.  The bridge fits answers to a channel's
:class:`~agentik.transports.base.ChannelCaps` with these; ``agentik.core.text``
is a deprecated alias of this module.
"""

from __future__ import annotations

__all__ = ["fit_prefix", "split_lines", "split_text"]


def fit_prefix(text: str, *, max_bytes: int | None, max_chars: int | None) -> int:
    """Length (in characters) of the longest prefix of ``text`` within the limits."""
    limit = len(text) if max_chars is None else min(len(text), max_chars)
    if max_bytes is None:
        return limit
    if limit >= 0 and max_bytes >= 0:
        # Most lines fit whole, or are ASCII (a byte per character): no loop over them.
        head = text[:limit] if limit < len(text) else text
        if head.isascii():
            return min(limit, max_bytes)
        if len(head.encode("utf-8", "surrogatepass")) <= max_bytes:
            return limit
    used = 0
    for i, ch in enumerate(text[:limit]):
        used += len(ch.encode("utf-8", "surrogatepass"))
        if used > max_bytes:
            return i
    return limit


def _split_line(line: str, max_bytes: int | None, max_chars: int | None) -> list[str]:
    out: list[str] = []
    rest = line
    while rest:
        n = fit_prefix(rest, max_bytes=max_bytes, max_chars=max_chars)
        if n >= len(rest):
            out.append(rest)
            break
        n = max(n, 1)  # always progress, even with absurd limits
        cut = rest.rfind(" ", 0, n + 1)
        if cut > n // 3:
            out.append(rest[:cut].rstrip())
            rest = rest[cut + 1 :].lstrip(" ")
        else:
            out.append(rest[:n])
            rest = rest[n:]
    return out


def split_lines(
    text: str, *, max_bytes: int | None = None, max_chars: int | None = None
) -> list[str]:
    """Each line of ``text`` on its own, long lines split to the limits."""
    out: list[str] = []
    for line in text.split("\n"):
        line = line.rstrip("\r")
        if not line.strip():
            out.append("")
            continue
        out.extend(_split_line(line, max_bytes, max_chars))
    return out


def split_text(
    text: str, *, max_bytes: int | None = None, max_chars: int | None = None
) -> list[str]:
    """Pack ``text`` into as few messages as the limits allow, cutting at lines."""
    if max_bytes is None and max_chars is None:
        return [text] if text else []
    pieces: list[str] = []
    current = ""
    for line in split_lines(text, max_bytes=max_bytes, max_chars=max_chars):
        candidate = f"{current}\n{line}" if current else line
        if fit_prefix(candidate, max_bytes=max_bytes, max_chars=max_chars) == len(candidate):
            current = candidate
        else:
            if current:
                pieces.append(current)
            current = line
    if current.strip():
        pieces.append(current)
    return pieces
