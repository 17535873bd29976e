"""Full-text search over the audit log (:class:`~.repositories.SearchRepository`):
what a hit is, how a query is read, and the snippet shown around a hit, the same for
every engine.

A query is words (letters and digits; anything else separates them, at most
:data:`MAX_TERMS`); a message matches when it holds every word, each as a whole
word or as the start of one, whatever the case.  Only what people and the model
said is searched: ``user`` and ``assistant`` rows (a tool's arguments and results
are not).  Hits come newest first.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAX_TERMS",
    "SEARCHED_KINDS",
    "SearchHit",
    "hit",
    "search_terms",
    "snippet",
    "words",
]

#: The audit-log kinds a search looks in.
SEARCHED_KINDS: tuple[str, ...] = ("user", "assistant")
#: Words of a query past this many are ignored.
MAX_TERMS = 8
#: The longest word of a query (a longer one is cut: no engine indexes more).
MAX_TERM_CHARS = 64

_WORD = re.compile(r"[^\W_]+")


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One audit-log message that matched: where it is, who said it, and a snippet."""

    conversation_id: str
    message_id: int
    kind: str
    author: str | None
    run_id: str | None
    created_at: float
    #: The text around the first matching word (the whole text when short).
    snippet: str


def words(text: str) -> list[str]:
    """The words of ``text``, lower-cased (how the memory engine indexes it)."""
    return _WORD.findall(text.lower())


def search_terms(query: str) -> list[str]:
    """The words of a query (empty: it matches nothing), without repeats."""
    seen: list[str] = []
    for w in words(query):
        w = w[:MAX_TERM_CHARS]
        if w not in seen:
            seen.append(w)
        if len(seen) == MAX_TERMS:
            break
    return seen


def snippet(content: str, terms: list[str], width: int = 160) -> str:
    """About ``width`` characters of ``content`` around the first word that starts
    with one of ``terms``, on one line, with ``…`` where it was cut."""
    flat = " ".join(content.split())
    if len(flat) <= width:
        return flat
    at = 0
    for m in _WORD.finditer(flat):
        low = m.group().lower()
        if any(low.startswith(t) for t in terms):
            at = m.start()
            break
    start = max(0, min(at - width // 3, len(flat) - width))
    end = start + width
    return ("…" if start else "") + flat[start:end].strip() + ("…" if end < len(flat) else "")


def hit(row: Sequence[Any], terms: list[str]) -> SearchHit:
    """A hit from an engine's row: conversation id, message id, kind, author, run id,
    time, content."""
    cid, mid, kind, author, run_id, at, content = row
    return SearchHit(
        conversation_id=str(cid),
        message_id=int(mid),
        kind=str(kind),
        author=author,
        run_id=run_id,
        created_at=float(at),
        snippet=snippet(str(content), terms),
    )
