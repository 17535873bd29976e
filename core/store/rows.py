"""Rows to records, written once for every engine: for each record, the columns a
``SELECT`` names and the function that turns one fetched row into the record
(:mod:`.records`); and a snapshot's rows as what an import writes.

The SQL stays with each engine (placeholders, types, locking); what a row means
is here.  A row is any sequence (an ``sqlite3`` tuple, an ``asyncpg.Record``)
holding its values in the order of its shape's ``columns``::

    rows = await read(f"SELECT {APPROVAL.columns} FROM approval WHERE serial = ?", ...)
    return [APPROVAL.record(r) for r in rows]
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..messages import ChatMessage, Message
from .records import (
    AccessChange,
    AccessGrant,
    Approval,
    ChannelSetting,
    ChannelSettingChange,
    Checklist,
    CheckpointRecord,
    Question,
    WebhookDelivery,
)
from .snapshot import IMPORTED, timestamp, untrusted_data

__all__ = [
    "ACCESS_CHANGE",
    "ACCESS_GRANT",
    "APPROVAL",
    "APPROVAL_COLUMNS",
    "BUDGET",
    "CHANNEL_SETTING",
    "CHANNEL_SETTING_CHANGE",
    "CHECKLIST",
    "CHECKPOINT",
    "OUTLINE",
    "QUESTION",
    "QUESTION_COLUMNS",
    "WEBHOOK_DELIVERY",
    "OutlineRow",
    "RowShape",
    "form_text",
    "partial_text",
    "relinker",
    "retention_rows",
    "snapshot_message",
    "snapshot_turn_ends",
    "snapshot_working_memory",
]

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class RowShape(Generic[R]):
    """One record's row: the ``columns`` a ``SELECT`` names (in order, comma-separated)
    and ``record``, which turns one row of them into the record."""

    columns: str
    record: Callable[[Sequence[Any]], R]


# -- waits: approvals, questions, the checklist ---------------------------------------------
APPROVAL_COLUMNS = (
    "serial, id, scope, conversation_id, channel_key, run_id, call_id, tool, arguments, digest,"
    " asker, asker_id, approvers, self_approve, created_at, expires_at, state, decision,"
    " approver, approver_id, reason, resolved_at"
)


def _approval(r: Sequence[Any]) -> Approval:
    # self_approve: 0/1 on SQLite, a boolean on PostgreSQL; a boolean either way.
    return Approval(
        serial=r[0], id=r[1], scope=r[2], conversation_id=r[3], channel_key=r[4], run_id=r[5],
        call_id=r[6], tool=r[7], arguments=r[8], digest=r[9], asker=r[10], asker_id=r[11],
        approvers=r[12], self_approve=bool(r[13]), created_at=r[14], expires_at=r[15],
        state=r[16], decision=r[17], approver=r[18], approver_id=r[19], reason=r[20],
        resolved_at=r[21],
    )  # fmt: skip


QUESTION_COLUMNS = (
    "id, conversation_id, channel_key, run_id, call_id, asker_target, answer_from, text,"
    " choices, digest, created_at, deadline, state, outcome, answer, answered_by, answered_at,"
    " form, partial"
)


def form_text(form: tuple[dict[str, Any], ...]) -> str | None:
    """A question's ``form`` column: JSON text, ``NULL`` for a single question."""
    return json.dumps(list(form), ensure_ascii=False) if form else None


def partial_text(partial: dict[str, str | None]) -> str | None:
    """A form's ``partial`` column: JSON text, ``NULL`` before any answer."""
    return json.dumps(partial, ensure_ascii=False) if partial else None


def _question(r: Sequence[Any]) -> Question:
    # choices: JSON text (a list).
    return Question(
        id=r[0], conversation_id=r[1], channel_key=r[2], run_id=r[3], call_id=r[4],
        asker_target=r[5], answer_from=r[6], text=r[7], choices=tuple(json.loads(r[8])),
        digest=r[9], created_at=r[10], deadline=r[11], state=r[12], outcome=r[13],
        answer=r[14], answered_by=r[15], answered_at=r[16],
        form=tuple(json.loads(r[17])) if r[17] else (),
        partial=json.loads(r[18]) if r[18] else {},
    )  # fmt: skip


def _checklist(r: Sequence[Any]) -> Checklist:
    # items: JSON text (a list of objects).
    items, run_id, updated_at = r
    return Checklist(
        items=tuple(dict(it) for it in json.loads(items)), run_id=run_id, updated_at=updated_at
    )


APPROVAL = RowShape(APPROVAL_COLUMNS, _approval)
QUESTION = RowShape(QUESTION_COLUMNS, _question)
CHECKLIST = RowShape("items, run_id, updated_at", _checklist)


# -- governance: budget counters, grants, channel settings ----------------------------------
def _budget(r: Sequence[Any]) -> tuple[str, str, str, int, int]:
    return (r[0], r[1], r[2], int(r[3]), int(r[4]))


def _access_grant(r: Sequence[Any]) -> AccessGrant:
    return AccessGrant(identity=r[0], role=r[1], granted_by=r[2], granted_at=r[3])


def _access_change(r: Sequence[Any]) -> AccessChange:
    return AccessChange(
        id=r[0], at=r[1], actor=r[2], identity=r[3], old_role=r[4], new_role=r[5], channel=r[6]
    )


def _channel_setting(r: Sequence[Any]) -> ChannelSetting:
    return ChannelSetting(channel_key=r[0], key=r[1], value=r[2], set_by=r[3], set_at=r[4])


def _channel_setting_change(r: Sequence[Any]) -> ChannelSettingChange:
    return ChannelSettingChange(
        id=r[0], channel_key=r[1], key=r[2], old_value=r[3], new_value=r[4], actor=r[5], at=r[6]
    )


#: A budget counter as ``(scope, subject, kind, period, amount)``.
BUDGET = RowShape("scope, subject, kind, period, amount", _budget)
ACCESS_GRANT = RowShape("identity, role, granted_by, granted_at", _access_grant)
ACCESS_CHANGE = RowShape("id, at, actor, identity, old_role, new_role, channel", _access_change)
CHANNEL_SETTING = RowShape("channel_key, key, value, set_by, set_at", _channel_setting)
CHANNEL_SETTING_CHANGE = RowShape(
    "id, channel_key, key, old_value, new_value, actor, at", _channel_setting_change
)


# -- outbound webhooks ------------------------------------------------------------------------
def _webhook_delivery(r: Sequence[Any]) -> WebhookDelivery:
    return WebhookDelivery(
        id=r[0], webhook=r[1], event_kind=r[2], conversation_id=r[3], body=r[4],
        created_at=float(r[5]), state=r[6], attempts=int(r[7]), next_at=float(r[8]),
        claimed_by=r[9], claimed_until=r[10], last_error=r[11], finished_at=r[12],
    )  # fmt: skip


WEBHOOK_DELIVERY = RowShape(
    "id, webhook, event_kind, conversation_id, body, created_at, state, attempts, next_at,"
    " claimed_by, claimed_until, last_error, finished_at",
    _webhook_delivery,
)


# -- checkpoints -------------------------------------------------------------------------------
def _checkpoint(r: Sequence[Any]) -> CheckpointRecord:
    return CheckpointRecord(
        id=int(r[0]), conversation_id=str(r[1]), created_at=float(r[2]), label=str(r[3]),
        automatic=bool(r[4]), size=int(r[5]),
    )  # fmt: skip


CHECKPOINT = RowShape("id, conversation_id, created_at, label, automatic, size", _checkpoint)


# -- lifecycle: retention's reads, a snapshot's rows ----------------------------------------
#: ``(id, kind, created_at, author, run_id)`` of an audit-log row.
OutlineRow = tuple[int, str, float, str | None, str | None]


def _outline(r: Sequence[Any]) -> OutlineRow:
    return (int(r[0]), r[1], float(r[2]), r[3], r[4])


OUTLINE = RowShape("id, kind, created_at, author, run_id", _outline)


def retention_rows(
    bindings: Iterable[Sequence[Any]], conversations: Iterable[Sequence[Any]]
) -> list[tuple[str, list[str], str | None]]:
    """``Store.retention_conversations`` from the rows of ``SELECT conversation_id,
    channel_key FROM channel_binding`` and ``SELECT id, meta FROM conversation ORDER BY
    created_at, id``: each conversation, its bound channels and the channel its meta
    claims (``None`` where the meta is not JSON or names none)."""
    keys: dict[str, list[str]] = {}
    for cid, key in bindings:
        keys.setdefault(cid, []).append(key)
    out: list[tuple[str, list[str], str | None]] = []
    for cid, meta in conversations:
        mk = None
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            found = json.loads(meta).get("channel_key")
            mk = found if isinstance(found, str) else None
        out.append((cid, keys.get(cid, []), mk))
    return out


def relinker(mapping: Mapping[int, int]) -> Callable[[int | None], int | None]:
    """A snapshot's message id to the id it was imported under (``mapping``: old to new).
    An id the snapshot no longer has (pruned, summarised) goes to the newest row before
    it, so "covers up to" stays true; ``None`` where there is none."""
    old_ids = sorted(mapping)

    def relink(mid: int | None) -> int | None:
        if mid is None:
            return None
        if mid in mapping:
            return mapping[mid]
        below = [o for o in old_ids if o < mid]
        return mapping[below[-1]] if below else None

    return relink


def snapshot_message(m: Mapping[str, Any], *, id: int, conversation_id: str) -> Message:
    """A snapshot's audit-log row as the message imported under ``id`` (its ``data``
    screened as untrusted input)."""
    return Message(
        id=id, conversation_id=conversation_id, kind=m["kind"], content=m["content"],
        author=m.get("author"), channel=m.get("channel"), run_id=m.get("run_id"),
        tool_call_id=m.get("tool_call_id"), tool_name=m.get("tool_name"),
        arguments=m.get("arguments"), is_error=bool(m.get("is_error")),
        status=m.get("status") or "complete", data=untrusted_data(m.get("data")),
        duration=m.get("duration"), created_at=m["created_at"],
    )  # fmt: skip


def snapshot_working_memory(
    doc: Mapping[str, Any], relink: Callable[[int | None], int | None]
) -> list[tuple[int, ChatMessage]]:
    """A snapshot's working memory as ``(pos, message)``: positions renumbered 1..n in
    their order, empty fields dropped, each message relinked to its imported row."""
    out: list[tuple[int, ChatMessage]] = []
    for pos, e in enumerate(sorted(doc["working_memory"], key=lambda e: e["pos"]), 1):
        body = {k: v for k, v in e["message"].items() if v is not None}
        body["tool_calls"] = [
            {k: v for k, v in c.items() if v is not None} for c in body.get("tool_calls", [])
        ]
        mid = relink(body.get("message_id"))
        out.append((pos, ChatMessage.from_dict({**body, "message_id": mid})))
    return out


def snapshot_turn_ends(doc: Mapping[str, Any], now: float) -> list[tuple[str, str, float]]:
    """A snapshot's ended turns as ``(run_id, outcome, created_at)``, the snapshot's own
    first; then every run of its log closed as imported, in run-id order: never resumable,
    so no restart runs a turn the snapshot left open (as its forged author, outside any
    budget) or keeps it pending.  A run listed twice: the first row counts."""
    ends = [
        (t["run_id"], t["outcome"], timestamp(t.get("created_at"), now))
        for t in doc.get("turn_ends") or []
    ]
    ends += [
        (run_id, IMPORTED, now)
        for run_id in sorted({m["run_id"] for m in doc["messages"] if m.get("run_id") is not None})
    ]
    return ends
