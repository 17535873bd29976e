"""The SQLite engine's redaction (part of the log aggregate,
:class:`~.repositories.LogRepository`): a message replaced by its tombstone
everywhere its text was, in one transaction with ``secure_delete``."""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any, cast

from ..errors import StoreError
from ..messages import ChatMessage
from .records import Redaction, RedactionError, tombstoned
from .sqlite_room import SQLiteRoom

__all__ = ["SQLiteRedaction"]


class SQLiteRedaction(SQLiteRoom):
    """Redacting a message, the audit of redactions, note provenance."""

    # -- redaction (migration 12) ------------------------------------------------------
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
        def fn(conn: sqlite3.Connection) -> Redaction | None:
            row = conn.execute(
                "SELECT redacted, data, kind, tool_call_id, content FROM message"
                " WHERE id = ? AND conversation_id = ?",
                (message_id, conversation_id),
            ).fetchone()
            if row is None:
                return None
            if row[0]:
                raise RedactionError(f"message {message_id} is already redacted")
            old = json.loads(row[1]) if row[1] else None
            kind, call_id, old_text = row[2], row[3], row[4]
            data: dict[str, Any] = {"redacted": {"by": by, "at": at, "reason": reason}}
            if isinstance(old, dict) and "author_id" in old:
                data["author_id"] = old["author_id"]
            conn.execute(
                "UPDATE message SET content = ?, arguments = CASE WHEN arguments IS NULL"
                " THEN NULL ELSE '{}' END, data = ?, redacted = 1 WHERE id = ?",
                (content, json.dumps(data, ensure_ascii=False), message_id),
            )
            if kind in ("user", "assistant"):
                # The search index's trigger replaced the text; its older segments
                # keep the words until merged: rewrite it so they are gone.
                conn.execute("INSERT INTO message_fts (message_fts) VALUES ('optimize')")
            if kind == "tool_result" and call_id is not None:
                # An ``ask_user`` answer is stored with its question too, and
                # in the channel's copy of the question (Slack edits it to
                # show the answer: agentik.bot's outbox), as written or
                # escaped for Slack.
                asked = conn.execute(
                    "SELECT q.answer, m.run_id FROM question q JOIN message m ON m.id = ?"
                    " WHERE q.conversation_id = ? AND q.call_id = ? AND q.answer IS NOT NULL",
                    (message_id, conversation_id, call_id),
                ).fetchall()
                conn.execute(
                    "UPDATE question SET answer = ? WHERE conversation_id = ? AND call_id = ?"
                    " AND answer IS NOT NULL",
                    (content, conversation_id, call_id),
                )
                for answer, run_id in asked:
                    slack = answer.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
                    for said in {answer, slack}:
                        if said and run_id is not None:
                            conn.execute(
                                "UPDATE outbox SET text = replace(text, ?, ?) WHERE run_id = ?"
                                " AND instr(text, ?) > 0",
                                (said, content, run_id, said),
                            )
            # User messages are linked to their audit row; answers and tool
            # results are recognised by their text and call id.
            for pos, body in conn.execute(
                "SELECT pos, body FROM working_memory WHERE conversation_id = ?",
                (conversation_id,),
            ).fetchall():
                entry = ChatMessage.from_json(body)
                linked = entry.message_id == message_id or (
                    entry.message_id is None and entry.role == kind and entry.content == old_text
                )
                new = tombstoned(entry, content, kind, call_id, linked=linked)
                if new != entry:
                    conn.execute(
                        "UPDATE working_memory SET body = ? WHERE conversation_id = ? AND pos = ?",
                        (new.to_json(), conversation_id, pos),
                    )
            notes = [
                r[0]
                for r in conn.execute(
                    "SELECT note_id FROM memory_source WHERE conversation_id = ?"
                    " AND first_message_id <= ? AND last_message_id >= ?",
                    (conversation_id, message_id, message_id),
                )
            ]
            for note_id in notes:
                # Cascades to memory_version, memory_source; the trigger
                # removes it from memory_fts.
                conn.execute("DELETE FROM memory_note WHERE id = ?", (note_id,))
            if notes:
                # FTS5 keeps deleted terms in its older segments until they
                # are merged: rewrite the index so the words are gone.
                conn.execute("INSERT INTO memory_fts (memory_fts) VALUES ('optimize')")
            if kind == "assistant":
                # The answer's pieces waiting for (or done with) delivery to
                # the channel (agentik.bot's outbox) hold its text too.
                run = conn.execute("SELECT run_id FROM message WHERE id = ?", (message_id,))
                run_id = run.fetchone()[0]
                if run_id is not None:
                    conn.execute(
                        "UPDATE outbox SET text = ? WHERE run_id = ? AND text != ''",
                        (content, run_id),
                    )
            # A title taken from the message (the HTTP API names a conversation
            # after its first message) goes too.
            conn.execute(
                "UPDATE conversation SET title = '(redacted)' WHERE id = ? AND title != ''"
                " AND instr(?, title) > 0",
                (conversation_id, old_text),
            )
            cur = conn.execute(
                "INSERT INTO redaction (conversation_id, message_id, redacted_by, at, reason,"
                " notes_removed) VALUES (?, ?, ?, ?, ?, ?)",
                (conversation_id, message_id, by, at, reason, len(notes)),
            )
            return Redaction(
                id=int(cur.lastrowid or 0),
                conversation_id=conversation_id,
                message_id=message_id,
                by=by,
                at=at,
                reason=reason,
                notes_removed=len(notes),
            )

        done = await self._in_writer(self._redact_securely, fn)
        if isinstance(done, BaseException):
            if isinstance(done, RedactionError | StoreError):
                raise done
            raise StoreError(f"redaction failed: {done}") from done
        return cast("Redaction | None", done)

    async def redactions(
        self, conversation_id: str | None = None, *, limit: int = 100
    ) -> list[Redaction]:
        where, params = (
            ("WHERE conversation_id = ?", (conversation_id,))
            if conversation_id
            else (
                "",
                (),
            )
        )
        rows = await self._read(
            "SELECT id, conversation_id, message_id, redacted_by, at, reason, notes_removed"
            f" FROM redaction {where} ORDER BY id LIMIT ?",
            (*params, limit),
        )
        return [
            Redaction(
                id=r[0],
                conversation_id=r[1],
                message_id=r[2],
                by=r[3],
                at=r[4],
                reason=r[5],
                notes_removed=r[6],
            )
            for r in rows
        ]

    async def note_source_add(
        self, note_id: int, conversation_id: str, first_message_id: int, last_message_id: int
    ) -> None:
        def fn(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT OR REPLACE INTO memory_source (note_id, conversation_id, first_message_id,"
                " last_message_id, created_at) VALUES (?, ?, ?, ?, ?)",
                (note_id, conversation_id, first_message_id, last_message_id, time.time()),
            )

        await self._write(fn)

    async def message_span(self, conversation_id: str) -> tuple[int, int] | None:
        rows = await self._read(
            "SELECT MIN(id), MAX(id) FROM message WHERE conversation_id = ?", (conversation_id,)
        )
        if not rows or rows[0][0] is None:
            return None
        return int(rows[0][0]), int(rows[0][1])
