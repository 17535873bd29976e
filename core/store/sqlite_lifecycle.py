"""The SQLite engine's lifecycle aggregate: restoring a snapshot and pruning a log,
each one transaction in the writer thread (:meth:`SQLiteStore.import_rows`,
:meth:`SQLiteStore.prune_log`), and the read-only queries retention plans with."""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from ..messages import ChatMessage
from .rows import (
    OUTLINE,
    OutlineRow,
    relinker,
    retention_rows,
    snapshot_turn_ends,
    snapshot_working_memory,
)
from .snapshot import (
    DELETED_NOTICE,
    RETENTION_AUTHOR,
    ImportResult,
    SnapshotError,
    SnapshotParts,
    timestamp,
    untrusted_data,
    untrusted_meta,
    untrusted_row,
)
from .sqlite_room import SQLiteRoom

__all__ = ["Reader", "SQLiteLifecycle", "import_rows", "prune_log"]

log = logging.getLogger(__name__)

Read = Callable[[str, Sequence[Any]], Awaitable[list[Any]]]


class Reader:
    """Retention's read-only queries (``Store.retention_conversations``, ``log_outline``,
    ``turn_ended``) over ``read(sql, params)``: :meth:`SQLiteStore.run_read`, or a
    read-only connection for a dry run (``agentik db prune --dry-run``)."""

    def __init__(self, read: Read) -> None:
        self.read = read

    async def retention_conversations(self) -> list[tuple[str, list[str], str | None]]:
        return retention_rows(
            await self.read("SELECT conversation_id, channel_key FROM channel_binding", ()),
            await self.read("SELECT id, meta FROM conversation ORDER BY created_at, id", ()),
        )

    async def log_outline(self, conversation_id: str) -> list[OutlineRow]:
        rows = await self.read(
            f"SELECT {OUTLINE.columns} FROM message WHERE conversation_id = ? ORDER BY id",
            (conversation_id,),
        )
        return [OUTLINE.record(r) for r in rows]

    async def count_old_notes(self, scopes: Mapping[str, float]) -> dict[str, int]:
        """Memory notes (the SQLite memory backend's ``memory_note``) of each scope
        changed before its cut-off; ``{}`` when the database has no notes table."""
        if not await self.read(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", ("memory_note",)
        ):
            return {}
        out = {}
        for scope, cutoff in scopes.items():
            (n,) = (await self.read(
                "SELECT COUNT(*) FROM memory_note WHERE scope = ? AND updated_at < ?",
                (scope, cutoff),
            ))[0]  # fmt: skip
            if n:
                out[scope] = int(n)
        return out

    async def turn_ended(self, conversation_id: str, run_id: str) -> bool:
        rows = await self.read(
            "SELECT 1 FROM turn_end WHERE conversation_id = ? AND run_id = ?",
            (conversation_id, run_id),
        )
        return bool(rows)


def prune_log(
    conn: sqlite3.Connection, cid: str, upto: int, summary: str | None, count: int
) -> None:
    """In the writer thread, one transaction: delete audit rows ``<= upto`` (with
    ``secure_delete``), put the summary (or nothing) in their place, and replace
    the working memory that covered them."""
    (secure,) = conn.execute("PRAGMA secure_delete").fetchone()
    conn.execute("PRAGMA secure_delete = ON")
    try:
        last = conn.execute(
            "SELECT created_at FROM message WHERE id = ? AND conversation_id = ?", (upto, cid)
        ).fetchone()
        conn.execute("DELETE FROM message WHERE conversation_id = ? AND id <= ?", (cid, upto))
        if summary is not None:
            # The summary takes the last pruned id: it sorts where the span was.
            conn.execute(
                "INSERT INTO message (id, conversation_id, kind, content, author, data,"
                " created_at) VALUES (?, ?, 'assistant', ?, ?, ?, ?)",
                (
                    upto, cid, summary, RETENTION_AUTHOR,
                    json.dumps({"retention": {"summarised": count}}),
                    last[0] if last else time.time(),
                ),
            )  # fmt: skip
        entries = conn.execute(
            "SELECT pos, message_id FROM working_memory WHERE conversation_id = ? ORDER BY pos",
            (cid,),
        ).fetchall()
        first_kept = next((p for p, mid in entries if mid is not None and mid > upto), None)
        covered = [p for p, _ in entries if first_kept is None or p < first_kept]
        if covered:
            cut = max(covered)
            conn.execute(
                "DELETE FROM working_memory WHERE conversation_id = ? AND pos <= ?", (cid, cut)
            )
            text = summary if summary is not None else DELETED_NOTICE.format(n=count)
            entry = ChatMessage(role="system", content=text, message_id=upto)
            conn.execute(
                "INSERT INTO working_memory (conversation_id, pos, message_id, body)"
                " VALUES (?, ?, ?, ?)",
                (cid, cut, upto, entry.to_json()),
            )
    finally:
        conn.execute(f"PRAGMA secure_delete = {int(secure)}")


def import_rows(
    conn: sqlite3.Connection,
    doc: dict[str, Any],
    cid: str,
    bind: str | None,
    now: float,
    parts: SnapshotParts | None = None,
) -> ImportResult:
    conv = doc["conversation"]
    if conn.execute("SELECT 1 FROM conversation WHERE id = ?", (cid,)).fetchone():
        raise SnapshotError(
            f"conversation.id: {cid!r} already exists in this database (import with --new-ids)"
        )
    meta = untrusted_meta(conv["meta"])
    if bind is not None:
        meta["channel_key"] = bind  # the conversation now lives in that channel
    conn.execute(
        "INSERT INTO conversation (id, title, created_at, updated_at, meta) VALUES (?, ?, ?, ?, ?)",
        (cid, conv["title"], conv["created_at"], conv["updated_at"], json.dumps(meta)),
    )
    (next_id,) = conn.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM message").fetchone()
    mapping: dict[int, int] = {}
    rows = []
    for m in sorted(doc["messages"], key=lambda m: m["id"]):
        mapping.setdefault(m["id"], next_id)
        data = untrusted_data(m.get("data"))
        rows.append(
            (
                next_id, cid, m["kind"], m["content"], m.get("author"), m.get("channel"),
                m.get("run_id"), m.get("tool_call_id"), m.get("tool_name"), m.get("arguments"),
                int(bool(m.get("is_error"))), m.get("status") or "complete",
                json.dumps(data, ensure_ascii=False) if data is not None else None,
                m.get("duration"), m["created_at"],
                # A redacted message (its tombstone's record in data) stays redacted.
                int(isinstance(data, dict) and isinstance(data.get("redacted"), dict)),
            )
        )  # fmt: skip
        next_id += 1
    conn.executemany(
        "INSERT INTO message (id, conversation_id, kind, content, author, channel, run_id,"
        " tool_call_id, tool_name, arguments, is_error, status, data, duration, created_at,"
        " redacted) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    conn.executemany(
        "INSERT INTO working_memory (conversation_id, pos, message_id, body) VALUES (?, ?, ?, ?)",
        [
            (cid, pos, cm.message_id, cm.to_json())
            for pos, cm in snapshot_working_memory(doc, relinker(mapping))
        ],
    )
    # The snapshot's ended turns, then its open ones closed as imported (never resumed).
    conn.executemany(
        "INSERT OR IGNORE INTO turn_end (conversation_id, run_id, outcome, created_at)"
        " VALUES (?, ?, ?, ?)",
        [(cid, *end) for end in snapshot_turn_ends(doc, now)],
    )
    skipped_runs = 0
    for table, key, skip in (
        ("approval", "approvals", {"serial"}),
        ("question", "questions", {"id"}),
        ("run", "runs", set()),
    ):
        rows_in = doc.get(key) or []
        if not rows_in:
            continue
        cols = {r[1] for r in conn.execute(f"PRAGMA table_info({table})").fetchall()}
        if not cols:
            log.warning(
                "import: this database has no %s table; %d rows left out", table, len(rows_in)
            )
            continue
        for i, r in enumerate(rows_in):
            r = untrusted_row(table, dict(r), now)
            if table == "run":
                # The run table is global: a run already here (the same snapshot
                # imported again with new ids) keeps its row; a parent conversation
                # this database does not have is left out of the link.
                if conn.execute(
                    "SELECT 1 FROM run WHERE run_id = ?", (r.get("run_id"),)
                ).fetchone():
                    skipped_runs += 1
                    continue
                parent = r.get("parent_conversation_id")
                if (
                    parent is not None
                    and not conn.execute(
                        "SELECT 1 FROM conversation WHERE id = ?", (parent,)
                    ).fetchone()
                ):
                    r["parent_conversation_id"] = None
            use = [c for c in r if c in cols and c not in skip]
            values = [cid if c == "conversation_id" else r[c] for c in use]
            try:
                conn.execute(
                    f"INSERT INTO {table} ({', '.join(use)}) VALUES ({', '.join('?' * len(use))})",
                    values,
                )
            except (sqlite3.Error, OverflowError, TypeError, ValueError) as exc:
                raise SnapshotError(f"{key}[{i}]: cannot be restored: {exc}") from exc
    if skipped_runs:
        log.warning("import: %d runs already in this database kept their rows", skipped_runs)
    todo = doc.get("todo")
    if todo and todo["items"]:
        if conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'todo'"
        ).fetchone():
            conn.execute(
                "INSERT INTO todo (conversation_id, items, run_id, updated_at) VALUES (?, ?, ?, ?)",
                (
                    cid,
                    json.dumps(
                        [{"text": it["text"], "status": it["status"]} for it in todo["items"]],
                        ensure_ascii=False,
                    ),
                    todo.get("run_id"),
                    timestamp(todo.get("updated_at"), now),
                ),
            )
        else:
            log.warning("import: this database has no todo table; the checklist is left out")
    result = ImportResult(conversation_id=cid, messages=len(rows))
    wanted = [bind] if bind is not None else [b["channel_key"] for b in doc.get("bindings") or []]
    for key in wanted:
        taken = conn.execute(
            "SELECT 1 FROM channel_binding WHERE channel_key = ?", (key,)
        ).fetchone()
        if taken and bind is None:
            result.skipped_bindings.append(key)  # never take a channel from another conversation
            continue
        conn.execute(
            "INSERT OR REPLACE INTO channel_binding (channel_key, conversation_id, created_at)"
            " VALUES (?, ?, ?)",
            (key, cid, now),
        )
        result.bound.append(key)
    if bind is None:
        # The channel it claims is its own only where its binding was restored.
        if result.bound:
            meta["channel_key"] = result.bound[0]
        else:
            meta.pop("channel_key", None)
        conn.execute("UPDATE conversation SET meta = ? WHERE id = ?", (json.dumps(meta), cid))
    if parts is not None:
        _import_parts(conn, cid, parts, result)
    return result


#: A refusal is named by the part and its index; the database's own words say why
#: (SQLite's messages name tables and constraints, never the values refused).
_REFUSED = (sqlite3.Error, OverflowError, TypeError, ValueError)


def _import_parts(
    conn: sqlite3.Connection, cid: str, parts: SnapshotParts, result: ImportResult
) -> None:
    """The snapshot's attachments (their rows: the bytes were saved before the
    transaction), checkpoints and A2A task records, in the import's transaction."""
    for i, (data, media_type, at) in enumerate(parts.attachments):
        try:
            conn.execute(
                "INSERT INTO attachment (conversation_id, sha256, media_type, size, created_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (conversation_id, sha256) DO NOTHING",
                (cid, hashlib.sha256(data).hexdigest(), media_type, len(data), at),
            )
        except _REFUSED as exc:
            raise SnapshotError(f"attachments[{i}]: cannot be restored: {exc}") from exc
    for i, (document, at, label, automatic) in enumerate(parts.checkpoints):
        try:
            conn.execute(
                "INSERT INTO checkpoint"
                " (conversation_id, created_at, label, automatic, size, document)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (cid, at, label, int(automatic), len(document.encode("utf-8")), document),
            )
        except _REFUSED as exc:
            raise SnapshotError(f"checkpoints[{i}]: cannot be restored: {exc}") from exc
    for i, t in enumerate(parts.a2a_tasks):
        try:
            # A record the database has already (the same snapshot imported again)
            # keeps its first copy.
            cur = conn.execute(
                "INSERT INTO a2a_task (owner, task_id, conversation_id, run_id, state, final,"
                " updated_at, body) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (owner, task_id) DO NOTHING",
                (t.owner, t.task_id, cid, t.run_id, t.state, int(t.final), t.updated_at, t.body),
            )
        except _REFUSED as exc:
            raise SnapshotError(f"a2a_tasks[{i}]: cannot be restored: {exc}") from exc
        if cur.rowcount == 0:
            result.skipped_tasks += 1


class SQLiteLifecycle(SQLiteRoom):
    """The lifecycle aggregate (:class:`~.repositories.LifecycleRepository`)."""

    # -- lifecycle: the rows of a snapshot ----------------------------------------------------
    async def export_rows(self, conversation_id: str) -> dict[str, list[dict[str, Any]]]:
        read = self._read
        out: dict[str, list[dict[str, Any]]] = {}
        out["bindings"] = [
            {"channel_key": k, "created_at": t}
            for k, t in await read(
                "SELECT channel_key, created_at FROM channel_binding WHERE conversation_id = ?"
                " ORDER BY channel_key",
                (conversation_id,),
            )
        ]
        out["turn_ends"] = [
            {"run_id": r, "outcome": o, "created_at": t}
            for r, o, t in await read(
                "SELECT run_id, outcome, created_at FROM turn_end WHERE conversation_id = ?"
                " ORDER BY created_at, run_id",
                (conversation_id,),
            )
        ]
        for table, key in (("approval", "approvals"), ("question", "questions"), ("run", "runs")):
            cols = [r[1] for r in await read(f"PRAGMA table_info({table})", ())]
            if "conversation_id" not in cols:
                continue  # (a database from before that table)
            rows = await read(
                f"SELECT {', '.join(cols)} FROM {table} WHERE conversation_id = ? ORDER BY rowid",
                (conversation_id,),
            )
            out[key] = [dict(zip(cols, r, strict=True)) for r in rows]
        return out

    async def import_rows(
        self,
        doc: dict[str, Any],
        conversation_id: str,
        *,
        bind: str | None,
        now: float,
        parts: SnapshotParts | None = None,
    ) -> ImportResult:
        async def write() -> ImportResult:
            # A SnapshotError (naming the field) reaches the caller as it is (a refusal).
            result: ImportResult = await self.run_write(
                lambda conn: import_rows(conn, doc, conversation_id, bind, now, parts)
            )
            return result

        if parts is None or not parts.attachments:
            return await write()
        # The bytes first, then the rows naming them (as attachment_put does); bytes
        # no row names after a refused import are swept at once
        # (SQLiteStore's attachments: SQLiteAttachments.with_import_blobs).
        return await self.with_import_blobs([data for data, _, _ in parts.attachments], write)

    async def retention_conversations(self) -> list[tuple[str, list[str], str | None]]:
        return await Reader(self._read).retention_conversations()

    async def log_outline(
        self, conversation_id: str
    ) -> list[tuple[int, str, float, str | None, str | None]]:
        return await Reader(self._read).log_outline(conversation_id)

    async def turn_ended(self, conversation_id: str, run_id: str) -> bool:
        return await Reader(self._read).turn_ended(conversation_id, run_id)

    async def prune_log(
        self, conversation_id: str, upto: int, *, summary: str | None, count: int
    ) -> None:
        await self.run_write(lambda conn: prune_log(conn, conversation_id, upto, summary, count))
