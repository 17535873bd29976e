"""The PostgreSQL engine's redaction (part of the log aggregate,
:class:`~.repositories.LogRepository`): a message replaced by its tombstone everywhere
its text was, in one transaction, then the tables vacuumed so the old row versions go.

Memory notes derived from a span of the log holding the message (mining, reflection:
``memory_source``, migration 4) are deleted with their versions and vectors, as on
SQLite.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from ..messages import ChatMessage
from .postgres_migrations import MEMORY_LOCK_KEY
from .postgres_room import PostgresRoom, dumps, nul_free, nul_free_json
from .records import Redaction, RedactionError, tombstoned

if TYPE_CHECKING:
    import asyncpg

__all__ = ["PostgresRedaction"]

#: The tables a redaction rewrites: vacuumed afterwards (dead row versions hold the text).
_REWRITTEN = ("message", "working_memory", "question", "outbox", "conversation")


class PostgresRedaction(PostgresRoom):
    """Redacting a message, the audit of redactions, the log's id span."""

    async def redact_message(
        self,
        conversation_id: str,
        message_id: int,
        *,
        content: str,
        by: str,
        reason: str,
        at: float,
    ) -> Redaction | None:
        content = nul_free(content) or ""

        async def fn(conn: asyncpg.Connection) -> Redaction | None:
            row = await conn.fetchrow(
                "SELECT redacted, data, kind, tool_call_id, content, run_id FROM message"
                " WHERE id = $1 AND conversation_id = $2 FOR UPDATE",
                message_id,
                conversation_id,
            )
            if row is None:
                return None
            if row[0]:
                raise RedactionError(f"message {message_id} is already redacted")
            old = json.loads(row[1]) if row[1] else None
            kind, call_id, old_text, run_id = row[2], row[3], row[4], row[5]
            data: dict[str, Any] = {"redacted": {"by": by, "at": at, "reason": reason}}
            if isinstance(old, dict) and "author_id" in old:
                data["author_id"] = old["author_id"]
            await conn.execute(
                "UPDATE message SET content = $1, arguments = CASE WHEN arguments IS NULL"
                " THEN NULL ELSE '{}' END, data = $2, redacted = true WHERE id = $3",
                content, dumps(data), message_id,
            )  # fmt: skip
            if kind == "tool_result" and call_id is not None:
                # An ``ask_user`` answer is stored with its question too, and in the
                # channel's copy of the question (Slack edits it to show the answer),
                # as written or escaped for Slack.
                answers = await conn.fetch(
                    "SELECT answer FROM question WHERE conversation_id = $1 AND call_id = $2"
                    " AND answer IS NOT NULL",
                    conversation_id,
                    call_id,
                )
                await conn.execute(
                    "UPDATE question SET answer = $1 WHERE conversation_id = $2 AND call_id = $3"
                    " AND answer IS NOT NULL",
                    content, conversation_id, call_id,
                )  # fmt: skip
                for (answer,) in answers:
                    slack = answer.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
                    for said in {answer, slack}:
                        if said and run_id is not None:
                            await conn.execute(
                                "UPDATE outbox SET text = replace(text, $1, $2)"
                                " WHERE run_id = $3 AND strpos(text, $1) > 0",
                                said, content, run_id,
                            )  # fmt: skip
            # User messages are linked to their audit row; answers and tool results
            # are recognised by their text and call id.
            for pos, body in await conn.fetch(
                "SELECT pos, body FROM working_memory WHERE conversation_id = $1",
                conversation_id,
            ):
                entry = ChatMessage.from_json(body)
                linked = entry.message_id == message_id or (
                    entry.message_id is None and entry.role == kind and entry.content == old_text
                )
                new = tombstoned(entry, content, kind, call_id, linked=linked)
                if new != entry:
                    await conn.execute(
                        "UPDATE working_memory SET body = $1"
                        " WHERE conversation_id = $2 AND pos = $3",
                        nul_free_json(new.to_json()), conversation_id, pos,
                    )  # fmt: skip
            notes = [
                int(r[0])
                for r in await conn.fetch(
                    "SELECT note_id FROM memory_source WHERE conversation_id = $1"
                    " AND first_message_id <= $2 AND last_message_id >= $2",
                    conversation_id,
                    message_id,
                )
            ]
            if notes:
                # As every memory write, under the memory lock first (its counts' rows are
                # then locked in one order).  Cascades to versions, vector, source.
                await conn.execute("SELECT pg_advisory_xact_lock($1)", MEMORY_LOCK_KEY)
                await conn.execute("DELETE FROM memory_note WHERE id = ANY($1::bigint[])", notes)
            if kind == "assistant" and run_id is not None:
                # The answer's pieces waiting for (or done with) delivery hold its text too.
                await conn.execute(
                    "UPDATE outbox SET text = $1 WHERE run_id = $2 AND text != ''",
                    content,
                    run_id,
                )
            # A title taken from the message (the HTTP API names a conversation after its
            # first message) goes too.
            await conn.execute(
                "UPDATE conversation SET title = '(redacted)' WHERE id = $1 AND title != ''"
                " AND strpos($2, title) > 0",
                conversation_id,
                old_text,
            )
            rid = await conn.fetchval(
                "INSERT INTO redaction (conversation_id, message_id, redacted_by, at, reason,"
                " notes_removed) VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
                conversation_id, message_id, by, at, reason, len(notes),
            )  # fmt: skip
            return Redaction(
                id=int(rid),
                conversation_id=conversation_id,
                message_id=message_id,
                by=by,
                at=at,
                reason=reason,
                notes_removed=len(notes),
            )

        try:
            done: Redaction | None = await self._write(
                fn, conversation_id=conversation_id, locks=(MEMORY_LOCK_KEY,)
            )
        except Exception as exc:
            # The writer reports a failed job as a StoreError: a redaction refused as
            # such is what the caller is told.
            if isinstance(exc.__cause__, RedactionError):
                raise exc.__cause__ from None
            raise
        if done is not None:
            # A removed note's words were in the note, its versions and the per-word
            # counts (a word's row at zero is deleted: its dead version is vacuumed).
            notes = (
                ("memory_note", "memory_version", "memory_vector", "memory_word")
                if done.notes_removed
                else ()
            )
            await self._vacuum(*_REWRITTEN, *notes)
        return done

    async def redactions(
        self, conversation_id: str | None = None, *, limit: int = 100
    ) -> list[Redaction]:
        where, args = ("WHERE conversation_id = $1", [conversation_id]) if conversation_id else (
            "", [],
        )  # fmt: skip
        rows = await self._read(
            "SELECT id, conversation_id, message_id, redacted_by, at, reason, notes_removed"
            f" FROM redaction {where} ORDER BY id LIMIT ${len(args) + 1}",
            *args,
            limit,
        )
        return [
            Redaction(id=r[0], conversation_id=r[1], message_id=r[2], by=r[3], at=r[4],
                      reason=r[5], notes_removed=r[6])
            for r in rows
        ]  # fmt: skip

    async def note_source_add(
        self, note_id: int, conversation_id: str, first_message_id: int, last_message_id: int
    ) -> None:
        async def fn(conn: asyncpg.Connection) -> None:
            await conn.execute(
                "INSERT INTO memory_source (note_id, conversation_id, first_message_id,"
                " last_message_id, created_at) VALUES ($1, $2, $3, $4, $5)"
                " ON CONFLICT (note_id) DO UPDATE SET conversation_id = excluded.conversation_id,"
                " first_message_id = excluded.first_message_id,"
                " last_message_id = excluded.last_message_id, created_at = excluded.created_at",
                note_id, conversation_id, first_message_id, last_message_id, time.time(),
            )  # fmt: skip

        await self._write(fn, single=True)

    async def message_span(self, conversation_id: str) -> tuple[int, int] | None:
        rows = await self._read(
            "SELECT MIN(id), MAX(id) FROM message WHERE conversation_id = $1", conversation_id
        )
        if not rows or rows[0][0] is None:
            return None
        return int(rows[0][0]), int(rows[0][1])
