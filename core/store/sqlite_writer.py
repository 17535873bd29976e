"""The SQLite writer's side: what runs where the writing connection is.

A batch of writes (:class:`~.sqlite.SQLiteStore`'s group commit) runs here as one
transaction, in one of two places:

* **a process of its own** (``[storage] writer = "process"``, the default for a
  database file): the store starts ``python -I -S`` on this module (:func:`main`),
  hands it batches over a pipe and reads the results back on the event loop.
  Nothing here then needs the bot's GIL.  A writer thread in the bot's process
  has to take the GIL back after every ``sqlite3_step``, and gets it mostly when
  the event loop idles, while the loop's turns wait for its commits: on the
  Slack benchmark the loop idled 5-10% of the load and each batch took 6-10 ms
  of wall time for 1 ms of CPU (docs/development.md, issue 31, twelfth pass);
* **the writer thread** (``writer = "thread"``, ``:memory:``, and any batch
  holding a job that is a closure, which cannot cross a process boundary).

So the process only takes batches whose every item is plain data: an *append*
(the rows :func:`write_appends` writes: the dual log's hot path) or a *named
operation* (a function of :data:`OPS` with plain arguments).  Batches never
overlap (one is in flight at a time), so the two connections never write at
once and the order of writes is the order they were handed in.

This module imports nothing but the standard library: the process imports it
from its own folder (``sys.path`` last, after the standard library's), without
``agentik``'s package, so it starts in about 10 ms.
"""

from __future__ import annotations

import marshal
import os
import signal
import sqlite3
import sys
import time

# typing.TYPE_CHECKING without importing typing and collections.abc: in the writer
# process they were 0.8 MB of its 4.8 MB (issue 31, fifteenth pass).  The names are
# only annotations (postponed: ``from __future__ import annotations``).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any, BinaryIO

__all__ = [
    "INSERT_RUN",
    "OPS",
    "Failed",
    "main",
    "open_connection",
    "run_batch",
    "write_appends",
]

_INSERT_CONVERSATION = (
    "INSERT INTO conversation (id, title, created_at, updated_at, meta) VALUES (?, ?, ?, ?, ?)"
)
_INSERT_BINDING = (
    "INSERT OR REPLACE INTO channel_binding (channel_key, conversation_id, created_at)"
    " VALUES (?, ?, ?)"
)
_MESSAGE_COLUMNS = (
    "id, conversation_id, kind, content, author, channel, run_id, tool_call_id, tool_name,"
    " arguments, is_error, status, data, duration, created_at"
)
_INSERT_MESSAGE = f"INSERT INTO message ({_MESSAGE_COLUMNS}) VALUES "
_MESSAGE_ROW = f"({', '.join('?' * 15)})"
#: Audit-log rows per INSERT: 64 rows of 15 values stay under 999, the lowest
#: ``SQLITE_MAX_VARIABLE_NUMBER`` a build of SQLite may have.
_MESSAGE_CHUNK = 64
_INSERT_MEMORY = (
    "INSERT INTO working_memory (conversation_id, pos, message_id, body) VALUES"
    " (?, (SELECT COALESCE(MAX(pos), 0) + 1 FROM working_memory WHERE conversation_id = ?), ?, ?)"
)
_INSERT_TURN_END = (
    "INSERT OR IGNORE INTO turn_end (conversation_id, run_id, outcome, created_at)"
    " VALUES (?, ?, ?, ?)"
)
_TOUCH = "UPDATE conversation SET updated_at = MAX(updated_at, ?) WHERE id = ?"
INSERT_RUN = (
    "INSERT OR REPLACE INTO run (run_id, conversation_id, parent_run_id,"
    " parent_conversation_id, parent_call_id, agent, depth, started, ended,"
    " stop_reason, usage) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_OUTBOX_UPSERT = (
    "INSERT INTO outbox (channel_key, run_id, piece, transport, kind, text, reply_to, complete,"
    " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (channel_key, run_id, piece) DO UPDATE SET text = excluded.text,"
    " complete = excluded.complete WHERE outbox.complete = 0"
)
#: States only move forward: queued (0) → sent (1) → confirmed (2).
_OUTBOX_RANK = "(CASE {} WHEN 'queued' THEN 0 WHEN 'sent' THEN 1 ELSE 2 END)"
_OUTBOX_MARK = (
    "UPDATE outbox SET"
    f" state = CASE WHEN {_OUTBOX_RANK.format('?1')} > {_OUTBOX_RANK.format('state')}"
    " THEN ?1 ELSE state END,"
    " awaits_confirm = COALESCE(?2, awaits_confirm), ref = COALESCE(?3, ref) WHERE id = ?4"
)


class Failed:
    """A job of a batch that failed (the others committed)."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


# -- appends: the dual log's rows ----------------------------------------------------------
#
# An append, as the store hands it over (plain data, so it can cross to the process):
#   (conversation_id, conversation_row | None, binding_row | None,
#    messages: [(kind, content, author, channel, run_id, tool_call_id, tool_name,
#                arguments, is_error, status, data (JSON), duration, created_at)],
#    memory: [(ref | None, message_id | None, body (JSON))],
#    touch: updated_at | None, end: (run_id, outcome, created_at) | None, run_row | None)
# A working-memory entry with a ``ref`` k names the k-th message of this append: its
# ``body`` is its JSON up to its last key, ``"message_id":``, whose value (the row's
# id) the writer adds.  The append's result is the id of its first message (the
# others follow it), or None.


def _insert_messages(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    """Audit-log rows written with a few INSERTs of many rows, not one INSERT each.

    The search index's trigger (migration 21) adds each row to FTS5's pending
    terms; FTS5 writes them out as a new segment when the next statement of the
    transaction begins (or at commit), so a statement for many rows writes one
    segment, where one statement per row wrote one per row (and merged them
    later): a message row costs about half the writer's CPU it did
    (docs/development.md, issue 31).
    """
    start = 0
    while start < len(rows):
        # Chunks of a power of two rows (13 rows: 8, 4, 1), so the statement has
        # seven texts at most, not one per row count: seven prepared statements in the
        # connection's cache, not 64 (each holding its own memory).
        size = min(_MESSAGE_CHUNK, 1 << ((len(rows) - start).bit_length() - 1))
        chunk = rows[start : start + size]
        conn.execute(
            _INSERT_MESSAGE + ", ".join([_MESSAGE_ROW] * size),
            [value for row in chunk for value in row],
        )
        start += size


def write_appends(conn: sqlite3.Connection, appends: Sequence[tuple[Any, ...]]) -> list[Any]:
    """Write consecutive appends with one statement per table; each one's first id.

    New conversations among them (``create_conversation_with``) are written
    first, so a new Slack thread's conversation, binding and first message
    share the run's statements (and its one read of the next message id)
    with the other appends of the batch instead of making a run of their own.
    """
    conversations = [a[1] for a in appends if a[1] is not None]
    bindings = [a[2] for a in appends if a[2] is not None]
    if conversations:
        conn.executemany(_INSERT_CONVERSATION, conversations)
    if bindings:
        conn.executemany(_INSERT_BINDING, bindings)
    row = conn.execute("SELECT COALESCE(MAX(id), 0) FROM message").fetchone()
    next_id = int(row[0]) + 1
    message_rows: list[tuple[Any, ...]] = []
    memory_rows: list[tuple[Any, ...]] = []
    touches: list[tuple[float, str]] = []
    ends: list[tuple[Any, ...]] = []
    runs: list[tuple[Any, ...]] = []
    firsts: list[Any] = []
    for cid, _conv, _bind, messages, memory, touch, end, run in appends:
        first = next_id
        firsts.append(first if messages else None)
        for m in messages:
            message_rows.append((next_id, cid, *m))
            next_id += 1
        for ref, message_id, body in memory:
            if ref is not None:
                if ref >= len(messages):
                    raise IndexError(f"working memory names row {ref} of {len(messages)}")
                message_id = first + ref
                body = f"{body}{message_id}}}"
            memory_rows.append((cid, cid, message_id, body))
        if touch is not None:
            touches.append((touch, cid))
        if end is not None:
            ends.append((cid, *end))
        if run is not None:
            runs.append(run)
    if message_rows:
        _insert_messages(conn, message_rows)
    if memory_rows:
        conn.executemany(_INSERT_MEMORY, memory_rows)
    if touches:
        conn.executemany(_TOUCH, touches)
    if ends:
        conn.executemany(_INSERT_TURN_END, ends)
    if runs:
        conn.executemany(INSERT_RUN, runs)
    return firsts


# -- named operations: jobs that can run in the process ------------------------------------


def _outbox_add(conn: sqlite3.Connection, rows: Sequence[tuple[Any, ...]]) -> list[int]:
    ids = []
    for row in rows:
        # The row's id comes back with the write (one statement, not two) …
        found = conn.execute(_OUTBOX_UPSERT + " RETURNING id", row).fetchone()
        if found is None:  # … but not when a complete row was kept as it was
            found = conn.execute(
                "SELECT id FROM outbox WHERE channel_key = ? AND run_id = ? AND piece = ?",
                row[:3],
            ).fetchone()
        ids.append(int(found[0]))
    return ids


def _outbox_mark(conn: sqlite3.Connection, rows: Sequence[tuple[Any, ...]]) -> None:
    conn.executemany(_OUTBOX_MARK, rows)


#: Statements a traced connection ran (:func:`trace`), by connection.
_TRACES: dict[int, list[tuple[int, str]]] = {}


def trace(conn: sqlite3.Connection, on: bool) -> list[tuple[int, str]]:
    """Start (``on``) or stop recording the statements ``conn`` runs; returns what
    it recorded until now, as (``time.monotonic_ns()``, statement): the clock is the
    machine's, so the thread's and the process's records interleave by it."""
    got = _TRACES.pop(id(conn), [])
    if on:
        record = _TRACES[id(conn)] = []
        conn.set_trace_callback(lambda st: record.append((time.monotonic_ns(), st)))
    else:
        conn.set_trace_callback(None)
    return got


#: The jobs a batch may name: ``("op", name, args)`` runs ``OPS[name](conn, *args)``.
OPS: dict[str, Callable[..., Any]] = {
    "outbox_add": _outbox_add,
    "outbox_mark": _outbox_mark,
    "trace": trace,
}

# -- a batch ---------------------------------------------------------------------------
#
# A batch is a list of items: ("append", append) | ("op", name, args) | ("fn", callable);
# only the writer thread takes "fn" items.


def _apply(conn: sqlite3.Connection, batch: Sequence[tuple[Any, ...]]) -> list[Any]:
    results: list[Any] = []
    run: list[tuple[Any, ...]] = []
    for item in batch:
        kind = item[0]
        if kind == "append":
            run.append(item[1])
            continue
        if run:
            results.extend(write_appends(conn, run))
            run = []
        if kind == "op":
            results.append(OPS[item[1]](conn, *item[2]))
        else:
            results.append(item[1](conn))
    if run:
        results.extend(write_appends(conn, run))
    return results


class _Orphaned(BaseException):
    """The bot that handed the batch over died (the process's check before COMMIT)."""


#: In the process: the bot's pid.  A batch commits only while the bot lives: a write
#: it handed over and never saw committed must not commit after its death (as with
#: the thread, which dies with it), also when it waited out another's lock meanwhile.
_PARENT: int | None = None


def transaction(conn: sqlite3.Connection, batch: Sequence[tuple[Any, ...]]) -> list[Any]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        results = _apply(conn, batch)
        if _PARENT is not None and os.getppid() != _PARENT:
            raise _Orphaned
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return results


def _commit(conn: sqlite3.Connection, batch: Sequence[tuple[Any, ...]]) -> list[Any]:
    try:
        return transaction(conn, batch)
    except Exception as exc:
        if len(batch) == 1:
            return [Failed(exc)]
    # Isolate the failing job: every other job still commits.
    out: list[Any] = []
    for item in batch:
        try:
            out.extend(transaction(conn, [item]))
        except Exception as exc:
            out.append(Failed(exc))
    return out


def run_batch(
    conn: sqlite3.Connection, batch: Sequence[tuple[Any, ...]], restore: str | None = None
) -> list[Any]:
    """The batch as one transaction, or job by job (a failing job fails alone).

    ``restore``: the batch commits with ``synchronous = NORMAL`` (no fsync of
    its own), then the connection's mode (``restore``) is set back.
    """
    if restore is None:
        return _commit(conn, batch)
    conn.execute("PRAGMA synchronous = NORMAL")
    try:
        return _commit(conn, batch)
    finally:
        conn.execute(f"PRAGMA synchronous = {restore}")


def open_connection(
    path: str, *, busy_ms: int, synchronous: str, wal_pages: int, cache_kb: int | None = None
) -> sqlite3.Connection:
    """The writing connection's settings (the thread's also migrates; the process's not).
    ``cache_kb``: the page cache's bound (SQLite's default: 2000 KB)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        if cache_kb is not None:
            conn.execute(f"PRAGMA cache_size = {-int(cache_kb)}")
        conn.execute(f"PRAGMA busy_timeout = {int(busy_ms)}")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous.upper()}")
        # The WAL is copied into the database (and both fsynced) every ``wal_pages``
        # pages written, not SQLite's 1000: a page written by many commits (the log's
        # last leaf, the search index's structure, the outbox's) is copied once
        # per checkpoint, so fewer checkpoints copy fewer pages.  Durability is the
        # commit's fsync of the WAL, unchanged.
        conn.execute(f"PRAGMA wal_autocheckpoint = {int(wal_pages)}")
    except BaseException:
        conn.close()
        raise
    return conn


# -- the process --------------------------------------------------------------------------
#
# Frames both ways: a 4-byte big-endian length, then a :mod:`marshal` dump (plain
# data only: it loads nothing but values, and needs no import).  The store sends its
# settings first (a dict: parent (its pid), open_connection's arguments) and
# gets ``None`` or the error opening the database; then each batch as
# ``(items, restore)``, and gets ``(results, failures)`` back: ``failures`` maps an
# item's index to its error (``results[index]`` is then None), or is the error of the
# whole batch.  An error crosses as ``("error", type name, message, SQLite's error
# code, its name)``.

#: Bytes of a frame's length (big-endian), before its marshal dump: both ends use it.
HEADER = 4


def read_frame(stream: BinaryIO) -> tuple[Any, int]:
    """One frame from a blocking stream, and its size; ``EOFError`` at its end."""
    head = stream.read(HEADER)
    if len(head) < HEADER:
        raise EOFError
    size = int.from_bytes(head, "big")
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return marshal.loads(data), size


def frame(value: Any) -> bytes:
    """``value`` as a frame; ``ValueError`` if it is not plain data."""
    data = marshal.dumps(value)
    return len(data).to_bytes(HEADER, "big") + data


def error_out(exc: BaseException) -> tuple[Any, ...]:
    return (
        "error",
        type(exc).__name__,
        str(exc),
        getattr(exc, "sqlite_errorcode", None),
        getattr(exc, "sqlite_errorname", None),
    )


def error_in(value: tuple[Any, ...]) -> BaseException:
    """An error as :func:`error_out` sent it: SQLite's own class when it was one."""
    _, name, message, code, code_name = value
    cls = getattr(sqlite3, name, None)
    if isinstance(cls, type) and issubclass(cls, sqlite3.Error):
        exc: BaseException = cls(message)
        if code is not None:
            exc.sqlite_errorcode = code  # type: ignore[attr-defined]
            exc.sqlite_errorname = code_name  # type: ignore[attr-defined]
        return exc
    return RuntimeError(f"{name}: {message}")


def _reply(results: list[Any]) -> tuple[list[Any], dict[int, Any]]:
    failures = {i: error_out(r.error) for i, r in enumerate(results) if isinstance(r, Failed)}
    for i in failures:
        results[i] = None
    return results, failures


def serve(inp: BinaryIO, out: BinaryIO) -> None:
    """The process's loop: settings, then batches until the store closes the pipe."""
    try:
        settings, _ = read_frame(inp)
    except EOFError:
        return
    global _PARENT
    _PARENT = settings.pop("parent")
    try:
        conn = open_connection(**settings)
    except Exception as exc:
        out.write(frame(error_out(exc)))
        out.flush()
        return
    out.write(frame(None))
    out.flush()
    while True:
        try:
            (items, restore), size = read_frame(inp)
        except EOFError:
            break
        try:
            reply: Any = _reply(run_batch(conn, items, restore))
            data = frame(reply)
        except _Orphaned:  # (rolled back)
            break
        except Exception as exc:
            data = frame((None, error_out(exc)))
        try:
            out.write(data)
            out.flush()
        except OSError:  # the bot is gone
            break
        del items, data
        if size > _TRIM_AFTER:
            _trim()
    conn.close()


#: A batch this large (bytes) is followed by ``malloc_trim``: its rows were freed,
#: and glibc would otherwise keep their pages (a burst of 20 KB tool outputs left
#: the process at 37 MB; 19 MB with the malloc settings of ``sqlite_process``).
_TRIM_AFTER = 1 << 20


def _trim() -> None:
    """Give the heap's free pages back to the system (glibc; elsewhere nothing)."""
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except Exception:
        return


def main() -> None:
    # The bot's shutdown (Ctrl-C in its terminal, a service manager's SIGTERM to
    # the whole group) must not end this process before the bot's last writes:
    # it ends when the store closes the pipe (or the bot dies: the same, and a batch
    # it is writing then rolls back: see ``_PARENT``).
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    serve(sys.stdin.buffer, sys.stdout.buffer)
    # What exit flushes goes nowhere: the bot may be gone (Python's docs, "Note on SIGPIPE").
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
