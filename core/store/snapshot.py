"""The lifecycle aggregate's engine-neutral parts: how an engine restores a snapshot
(``Store.import_rows``) and prunes a log (``Store.prune_log``).

A snapshot is untrusted input, whoever imports it: every engine applies the
same rules (:func:`untrusted_row`, :func:`untrusted_meta`, :func:`untrusted_data`)
so nothing in it grants anything.  :mod:`agentik.core.lifecycle` validates the
document first and re-exports these names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import StoreRefusal
from .records import A2ATaskRecord

__all__ = [
    "DELETED_NOTICE",
    "IMPORTED",
    "IMPORTED_SCOPE",
    "RETENTION_AUTHOR",
    "ImportResult",
    "SnapshotError",
    "SnapshotParts",
    "timestamp",
    "untrusted_data",
    "untrusted_meta",
    "untrusted_row",
]

#: What replaces pruned messages in working memory in ``delete`` mode.
DELETED_NOTICE = "[{n} earlier messages were deleted by the retention policy.]"
RETENTION_AUTHOR = "agentik:retention"


class SnapshotError(StoreRefusal, ValueError):
    """A snapshot that cannot be imported; the message names the field."""


def timestamp(value: Any, default: float) -> float:
    """``value`` as a REAL SQLite takes; ``default`` for none (or a number too large)."""
    try:
        return float(value) if value else default
    except OverflowError:
        return default


#: The outcome recorded for the turns a snapshot brought in still open.
IMPORTED = "imported"
#: The prefix of an imported approval's ``scope``: history that never counts as a
#: use of a ``first-use`` rule (``approval_used`` skips it).
IMPORTED_SCOPE = "imported:"
#: Conversation metadata that links it to a run tree (and so to a parent's channel).
LINKS = ("parent_run_id", "parent_conversation_id", "parent_channel_key", "parent_call_id")


def untrusted_data(data: Any) -> Any:
    """A message's ``data`` from a snapshot: the author's identity (``author_id``,
    which makes a speaker, the asker of an approval, the owner of user-scoped
    memory) is kept only as the label ``imported_author_id``."""
    if not isinstance(data, dict) or "author_id" not in data:
        return data
    data = dict(data)
    data["imported_author_id"] = data.pop("author_id")
    return data


def untrusted_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    """A conversation's metadata from a snapshot: the links to a run tree (a child
    run's conversation is seen through its parent's channel) are kept only as a label."""
    out = dict(meta)
    links = {k: out.pop(k) for k in LINKS if k in out}
    if links:
        out["imported_links"] = links
    return out


def untrusted_row(table: str, r: dict[str, Any], now: float) -> dict[str, Any]:
    """An approval, question or run row from a snapshot, as history that grants nothing:
    approvals move to their own scope (never a use of a ``first-use`` rule, never
    pending), open questions are closed as expired, open runs as ended."""
    if table == "approval":
        raw = r.get("scope")
        scope = raw if isinstance(raw, str) else ""
        # (A snapshot of an imported conversation keeps one prefix.)
        r["scope"] = scope if scope.startswith(IMPORTED_SCOPE) else IMPORTED_SCOPE + scope
        if r.get("state") != "resolved" or r.get("decision") is None:
            r.update(state="resolved", decision="expired", resolved_at=now,
                     reason="imported while pending")  # fmt: skip
    elif table == "question":
        if r.get("state") != "resolved" or r.get("outcome") is None:
            r.update(state="resolved", outcome="expired", answered_at=None)
        if r.get("partial"):
            # A form closed here keeps what it got as its answer (as one that
            # expires does), never as answers still being collected.
            if r.get("answer") is None:
                r["answer"] = r["partial"]
            r["partial"] = None
    elif table == "run" and r.get("ended") is None:
        r.update(ended=now, stop_reason=r.get("stop_reason") or IMPORTED)
    return r


@dataclass(slots=True)
class ImportResult:
    conversation_id: str
    messages: int
    bound: list[str] = field(default_factory=list)
    skipped_bindings: list[str] = field(default_factory=list)
    #: A2A task records the database had already (the same snapshot imported again):
    #: they kept their first copy.
    skipped_tasks: int = 0


@dataclass(slots=True, frozen=True)
class SnapshotParts:
    """What a snapshot brings besides its rows, already checked and made harmless by
    :func:`agentik.core.lifecycle.import_conversation`: ``Store.import_rows`` writes
    them in the import's one transaction, after the rows, so a part the database
    refuses leaves nothing of the snapshot behind.

    ``attachments``: ``(data, media_type, created_at)``, as ``attachment_put`` takes
    them.  ``checkpoints``: ``(document as JSON text, created_at, label,
    automatic)``, as ``checkpoint_add`` takes them (none trimmed).  ``a2a_tasks``:
    final records of the imported conversation; one whose ``(owner, task_id)`` the
    database has already keeps that first copy.
    """

    attachments: Sequence[tuple[bytes, str, float]] = ()
    checkpoints: Sequence[tuple[str, float, str, bool]] = ()
    a2a_tasks: Sequence[A2ATaskRecord] = ()
