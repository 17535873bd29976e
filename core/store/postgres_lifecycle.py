"""The PostgreSQL engine's lifecycle aggregate (:class:`~.repositories.LifecycleRepository`):
snapshot rows out and in, retention's reads and its prune, each write one transaction.

Exports hold the rows as SQLite's tables do (the contract: the same conversation
exports the same rows from every engine): booleans as 0/1, ``choices`` and
``usage`` as JSON text.  (``jsonb`` keeps no key order: a ``usage`` with several
keys may list them in another order than SQLite's text.)
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from ..messages import ChatMessage, Message
from .postgres_room import (
    PostgresRoom,
    dumps,
    insert_messages,
    next_ids,
    nul_free,
    nul_free_json,
)
from .postgres_runs import RUN_COLUMNS
from .rows import (
    APPROVAL_COLUMNS,
    OUTLINE,
    QUESTION_COLUMNS,
    relinker,
    retention_rows,
    snapshot_message,
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
    untrusted_meta,
    untrusted_row,
)

if TYPE_CHECKING:
    import asyncpg

__all__ = ["PostgresLifecycle"]

log = logging.getLogger(__name__)

#: The snapshot tables: their columns (as SQLite's), which are flags, which JSON text.
_TABLES: dict[str, tuple[str, str, str, frozenset[str], frozenset[str]]] = {
    # table: (snapshot key, columns, order, booleans, JSON)
    "approval": ("approvals", APPROVAL_COLUMNS, "serial", frozenset({"self_approve"}),
                 frozenset()),
    "question": ("questions", QUESTION_COLUMNS, "id", frozenset(), frozenset({"choices"})),
    "run": ("runs", RUN_COLUMNS, "written", frozenset(), frozenset({"usage"})),
}  # fmt: skip


def _columns(table: str) -> list[str]:
    return [c.strip() for c in _TABLES[table][1].split(",")]


def _exported(table: str, row: Any) -> dict[str, Any]:
    _, _, _, flags, texts = _TABLES[table]
    out: dict[str, Any] = {}
    for column, value in zip(_columns(table), row, strict=True):
        if column in flags:
            value = int(value)
        elif column in texts and value is not None:
            # As SQLite holds it: choices written with ensure_ascii=False, usage without.
            value = json.dumps(json.loads(value), ensure_ascii=column != "choices")
        out[column] = value
    return out


def _imported(table: str, column: str, value: Any) -> Any:
    """A snapshot's value for a PostgreSQL column (a flag from 0/1, JSON text to jsonb)."""
    _, _, _, flags, texts = _TABLES[table]
    if column in flags:
        return bool(value)
    if column in texts and value is not None:
        if not isinstance(value, str):
            raise TypeError(f"{column} is not JSON text")
        return nul_free_json(json.dumps(json.loads(value), ensure_ascii=False))
    return nul_free(value) if isinstance(value, str) else value


async def _import(
    conn: asyncpg.Connection,
    doc: dict[str, Any],
    cid: str,
    bind: str | None,
    now: float,
    parts: SnapshotParts | None = None,
) -> ImportResult:
    conv = doc["conversation"]
    if await conn.fetchval("SELECT 1 FROM conversation WHERE id = $1", cid):
        raise SnapshotError(
            f"conversation.id: {cid!r} already exists in this database (import with --new-ids)"
        )
    meta = untrusted_meta(conv["meta"])
    if bind is not None:
        meta["channel_key"] = bind  # the conversation now lives in that channel
    await conn.execute(
        "INSERT INTO conversation (id, title, created_at, updated_at, meta)"
        " VALUES ($1, $2, $3, $4, $5)",
        cid, nul_free(conv["title"]), conv["created_at"], conv["updated_at"], dumps(meta),
    )  # fmt: skip
    messages = sorted(doc["messages"], key=lambda m: m["id"])
    ids = await next_ids(conn, len(messages)) if messages else []
    mapping: dict[int, int] = {}
    rows: list[Message] = []
    redacted: list[int] = []
    for new_id, m in zip(ids, messages, strict=True):
        mapping.setdefault(m["id"], new_id)
        message = snapshot_message(m, id=new_id, conversation_id=cid)
        rows.append(message)
        # A redacted message (its tombstone's record in data) stays redacted.
        if isinstance(message.data, dict) and isinstance(message.data.get("redacted"), dict):
            redacted.append(new_id)
    if rows:
        await insert_messages(conn, rows)
    if redacted:
        await conn.execute(
            "UPDATE message SET redacted = true WHERE id = ANY($1::bigint[])", redacted
        )
    for pos, cm in snapshot_working_memory(doc, relinker(mapping)):
        await conn.execute(
            "INSERT INTO working_memory (conversation_id, pos, message_id, body)"
            " VALUES ($1, $2, $3, $4)",
            cid, pos, cm.message_id, nul_free_json(cm.to_json()),
        )  # fmt: skip
    # The snapshot's ended turns, then its open ones closed as imported (never resumed).
    ends = [(cid, *end) for end in snapshot_turn_ends(doc, now)]
    if ends:
        await conn.executemany(
            "INSERT INTO turn_end (conversation_id, run_id, outcome, created_at)"
            " VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
            ends,
        )
    skipped_runs = 0
    for table, (key, _, _, _, _) in _TABLES.items():
        cols = set(_columns(table))
        skip = {"serial"} if table == "approval" else {"id"} if table == "question" else set()
        for i, r in enumerate(doc.get(key) or []):
            r = untrusted_row(table, dict(r), now)
            if table == "run":
                # The run table is global: a run already here (the same snapshot imported
                # again with new ids) keeps its row; a parent conversation this database
                # does not have is left out of the link.
                if await conn.fetchval("SELECT 1 FROM run WHERE run_id = $1", r.get("run_id")):
                    skipped_runs += 1
                    continue
                parent = r.get("parent_conversation_id")
                if parent is not None and not await conn.fetchval(
                    "SELECT 1 FROM conversation WHERE id = $1", parent
                ):
                    r["parent_conversation_id"] = None
            use = [c for c in r if c in cols and c not in skip]
            try:
                values = [cid if c == "conversation_id" else _imported(table, c, r[c]) for c in use]
                # A savepoint: a row that cannot be restored fails alone, named, and the
                # whole import is rolled back by the caller.
                async with conn.transaction():
                    await conn.execute(
                        f"INSERT INTO {table} ({', '.join(use)}) VALUES"
                        f" ({', '.join(f'${n}' for n in range(1, len(use) + 1))})",
                        *values,
                    )
            except Exception as exc:
                raise SnapshotError(f"{key}[{i}]: cannot be restored: {_reason(exc)}") from exc
    if skipped_runs:
        log.warning("import: %d runs already in this database kept their rows", skipped_runs)
    todo = doc.get("todo")
    if todo and todo["items"]:
        await conn.execute(
            "INSERT INTO todo (conversation_id, items, run_id, updated_at) VALUES ($1, $2, $3, $4)",
            cid,
            dumps([{"text": it["text"], "status": it["status"]} for it in todo["items"]]),
            todo.get("run_id"),
            timestamp(todo.get("updated_at"), now),
        )
    result = ImportResult(conversation_id=cid, messages=len(rows))
    wanted = [bind] if bind is not None else [b["channel_key"] for b in doc.get("bindings") or []]
    for key in wanted:
        taken = await conn.fetchval("SELECT 1 FROM channel_binding WHERE channel_key = $1", key)
        if taken and bind is None:
            result.skipped_bindings.append(key)  # never take a channel from another conversation
            continue
        await conn.execute(
            "INSERT INTO channel_binding (channel_key, conversation_id, created_at)"
            " VALUES ($1, $2, $3) ON CONFLICT (channel_key) DO UPDATE SET"
            " conversation_id = excluded.conversation_id, created_at = excluded.created_at",
            key, cid, now,
        )  # fmt: skip
        result.bound.append(key)
    if bind is None:
        # The channel it claims is its own only where its binding was restored.
        if result.bound:
            meta["channel_key"] = result.bound[0]
        else:
            meta.pop("channel_key", None)
        await conn.execute("UPDATE conversation SET meta = $1 WHERE id = $2", dumps(meta), cid)
    if parts is not None:
        await _import_parts(conn, cid, parts, result)
    return result


async def _refused(what: str, write: Any) -> Any:
    """Run ``write()``: a part the database refuses is named (``what``) and the
    caller's transaction, the whole import, is rolled back.  The server's message
    names the table or constraint; its detail (the values) is not repeated.  A
    lost connection is not a refusal: it goes to the writer as it is."""
    import asyncpg

    try:
        return await write()
    except (asyncpg.PostgresError, OverflowError, TypeError, ValueError) as exc:
        if (getattr(exc, "sqlstate", None) or "").startswith(("08", "57P")):
            raise  # the connection, not the row: the writer replaces it
        raise SnapshotError(f"{what}: cannot be restored: {_reason(exc)}") from exc


def _reason(exc: BaseException) -> str:
    """Why the database refused a row, without the values: the server's primary
    message (its ``DETAIL`` may quote the row: ``Failing row contains (…)``), or the
    kind of a client-side error (asyncpg's may quote the argument)."""
    import asyncpg

    if isinstance(exc, asyncpg.PostgresError) and exc.args:
        return str(exc.args[0])
    return type(exc).__name__


async def _import_parts(
    conn: asyncpg.Connection, cid: str, parts: SnapshotParts, result: ImportResult
) -> None:
    """The snapshot's attachments, checkpoints and A2A task records, in the import's
    transaction."""
    for i, (data, media_type, at) in enumerate(parts.attachments):
        sha = hashlib.sha256(data).hexdigest()

        async def attach(sha: str = sha, data: bytes = data, media_type: str = media_type,
                         at: float = at) -> None:  # fmt: skip
            await conn.execute(
                "INSERT INTO attachment_blob (sha256, data) VALUES ($1, $2)"
                " ON CONFLICT (sha256) DO NOTHING",
                sha, bytes(data),
            )  # fmt: skip
            await conn.execute(
                "INSERT INTO attachment (conversation_id, sha256, media_type, size, created_at)"
                " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (conversation_id, sha256) DO NOTHING",
                cid, sha, media_type, len(data), at,
            )  # fmt: skip

        await _refused(f"attachments[{i}]", attach)
    for i, (document, at, label, automatic) in enumerate(parts.checkpoints):
        await _refused(
            f"checkpoints[{i}]",
            lambda document=document, at=at, label=label, automatic=automatic: conn.execute(
                "INSERT INTO checkpoint"
                " (conversation_id, created_at, label, automatic, size, document)"
                " VALUES ($1, $2, $3, $4, $5, $6)",
                cid, at, nul_free(label), automatic, len(document.encode("utf-8")),
                document,
            ),
        )  # fmt: skip
    for i, t in enumerate(parts.a2a_tasks):
        # A record the database has already (the same snapshot imported again) keeps
        # its first copy.
        status = await _refused(
            f"a2a_tasks[{i}]",
            lambda t=t: conn.execute(
                "INSERT INTO a2a_task (owner, task_id, conversation_id, run_id, state, final,"
                " updated_at, body) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
                " ON CONFLICT (owner, task_id) DO NOTHING",
                nul_free(t.owner), nul_free(t.task_id), cid, t.run_id, t.state, t.final,
                t.updated_at, nul_free(t.body),
            ),
        )  # fmt: skip
        if status == "INSERT 0 0":
            result.skipped_tasks += 1


async def _prune(
    conn: asyncpg.Connection, cid: str, upto: int, summary: str | None, count: int
) -> None:
    # The append-only trigger lets retention (this transaction only) delete.
    await conn.execute("SET LOCAL agentik.retention = 'on'")
    last = await conn.fetchval(
        "SELECT created_at FROM message WHERE id = $1 AND conversation_id = $2", upto, cid
    )
    await conn.execute("DELETE FROM message WHERE conversation_id = $1 AND id <= $2", cid, upto)
    if summary is not None:
        # The summary takes the last pruned id: it sorts where the span was.
        await conn.execute(
            "INSERT INTO message (id, conversation_id, kind, content, author, data, created_at)"
            " VALUES ($1, $2, 'assistant', $3, $4, $5, $6)",
            upto, cid, nul_free(summary), RETENTION_AUTHOR,
            json.dumps({"retention": {"summarised": count}}),
            last if last is not None else time.time(),
        )  # fmt: skip
    entries = await conn.fetch(
        "SELECT pos, message_id FROM working_memory WHERE conversation_id = $1 ORDER BY pos", cid
    )
    first_kept = next((p for p, mid in entries if mid is not None and mid > upto), None)
    covered = [p for p, _ in entries if first_kept is None or p < first_kept]
    if covered:
        cut = max(covered)
        await conn.execute(
            "DELETE FROM working_memory WHERE conversation_id = $1 AND pos <= $2", cid, cut
        )
        text = summary if summary is not None else DELETED_NOTICE.format(n=count)
        entry = ChatMessage(role="system", content=text, message_id=upto)
        await conn.execute(
            "INSERT INTO working_memory (conversation_id, pos, message_id, body)"
            " VALUES ($1, $2, $3, $4)",
            cid, cut, upto, nul_free_json(entry.to_json()),
        )  # fmt: skip


class PostgresLifecycle(PostgresRoom):
    """Export rows, import rows, retention's reads and prune."""

    async def export_rows(self, conversation_id: str) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        out["bindings"] = [
            {"channel_key": k, "created_at": t}
            for k, t in await self._read(
                "SELECT channel_key, created_at FROM channel_binding WHERE conversation_id = $1"
                " ORDER BY channel_key",
                conversation_id,
            )
        ]
        out["turn_ends"] = [
            {"run_id": r, "outcome": o, "created_at": t}
            for r, o, t in await self._read(
                "SELECT run_id, outcome, created_at FROM turn_end WHERE conversation_id = $1"
                " ORDER BY created_at, run_id",
                conversation_id,
            )
        ]
        for table, (key, columns, order, _, _) in _TABLES.items():
            rows = await self._read(
                f"SELECT {columns} FROM {table} WHERE conversation_id = $1 ORDER BY {order}",
                conversation_id,
            )
            out[key] = [_exported(table, r) for r in rows]
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
        # A SnapshotError (naming the field) reaches the caller as it is (a refusal).
        result: ImportResult = await self._write(
            lambda conn: _import(conn, doc, conversation_id, bind, now, parts),
            conversation_id=conversation_id,
        )
        return result

    async def retention_conversations(self) -> list[tuple[str, list[str], str | None]]:
        return retention_rows(
            await self._read("SELECT conversation_id, channel_key FROM channel_binding"),
            await self._read("SELECT id, meta FROM conversation ORDER BY created_at, id"),
        )

    async def log_outline(
        self, conversation_id: str
    ) -> list[tuple[int, str, float, str | None, str | None]]:
        rows = await self._read(
            f"SELECT {OUTLINE.columns} FROM message WHERE conversation_id = $1 ORDER BY id",
            conversation_id,
        )
        return [OUTLINE.record(r) for r in rows]

    async def turn_ended(self, conversation_id: str, run_id: str) -> bool:
        rows = await self._read(
            "SELECT 1 FROM turn_end WHERE conversation_id = $1 AND run_id = $2",
            conversation_id,
            run_id,
        )
        return bool(rows)

    async def prune_log(
        self, conversation_id: str, upto: int, *, summary: str | None, count: int
    ) -> None:
        await self._write(
            lambda conn: _prune(conn, conversation_id, upto, summary, count),
            conversation_id=conversation_id,
        )
        # The pruned rows' text must not survive in the tables: their dead versions go.
        await self._vacuum("message", "working_memory")
