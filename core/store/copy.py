"""Copying a whole store to another engine (``agentik db copy``), and proving the copy.

Every row a bot keeps goes across as it is: ids, order, flags and times kept
(conversations with their bindings, the audit log with its redaction flags,
working memory, turn ends, the outbox, approvals, questions, checklists, roles
and their audit, channel settings and their audit, budget counters, runs,
redactions, handled events, and memory notes when both sides keep them).  Not
an import: a snapshot import (:mod:`agentik.core.lifecycle`) treats its rows as
untrusted and renumbers them; a copy is the operator moving their own database.

Engine-neutral: each engine gives a consistent read of its tables
(:meth:`CopyEngine.copy_reader`: one snapshot for the whole copy, rows streamed
in batches, so memory stays flat however long the log) and writes batches with
their ids (:meth:`CopyEngine.copy_write`); the SQL is the engine's own
(:mod:`.sqlite_copy`, :mod:`.postgres_copy`).

:func:`verify` then exports every conversation from both sides (the lifecycle
export) and compares them, and counts every table's rows on both sides.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, aclosing
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..errors import AgentikError

__all__ = [
    "NOTE_TABLES",
    "TABLES",
    "CopyEngine",
    "CopyError",
    "CopyReader",
    "CopyReport",
    "copy_store",
    "first_difference",
    "verify",
]

#: Every table a bot keeps, parents before children (foreign keys hold as rows arrive).
TABLES: tuple[str, ...] = (
    "conversation",
    "channel_binding",
    "message",
    "working_memory",
    "turn_end",
    "outbox",
    "access_grant",
    "access_audit",
    "approval",
    "budget_usage",
    "channel_setting",
    "channel_setting_audit",
    "run",
    "question",
    "redaction",
    "todo",
    "memory_note",
    "memory_version",
    "memory_vector",
    "memory_source",
    "seen_event",
    "link",
    "link_message",
    "webhook_delivery",
    "a2a_task",
    "checkpoint",
)
#: Tables that are not data of their own: migrations' records, indexes kept by triggers
#: (SQLite's full-text indexes, the PostgreSQL memory's word counts).  The destination
#: makes its own.
DERIVED_TABLES = frozenset({"schema_migrations", "memory_totals", "memory_word"})
#: Attachments (issue 34): copied through the store's attachment repository, not as
#: rows (the bytes are files beside a SQLite database, a table in PostgreSQL).
ATTACHMENT_TABLES = frozenset({"attachment", "attachment_blob"})
DERIVED_PREFIXES = ("sqlite_", "memory_fts", "message_fts")
#: Tables of the running processes, not of the bot's data: connection leases, the
#: worker registry, scheduled jobs' claims, the turn queue and the run events kept for
#: other workers' event streams (agentik.core.cluster).  They describe the source's
#: workers; the destination's workers write their own.
PROCESS_TABLES = frozenset(
    {"lease", "worker", "job_run", "turn_queue", "run_event", "run_event_position"}
)
#: The memory notes' tables (the SQLite memory backend's; an engine without notes lacks them).
NOTE_TABLES = frozenset({"memory_note", "memory_version", "memory_vector", "memory_source"})
#: Columns one engine keeps for itself, rebuilt by the other (PostgreSQL's ``run.written``
#: is the order runs were written, SQLite's rowid; rows are copied in that order), or
#: derived from a row's other columns by the engine's memory backend (SQLite's
#: ``memory_note.scope_key``, PostgreSQL's ``tsv`` and ``words``: see ``derive``).
ENGINE_COLUMNS = frozenset(
    {("run", "written"), ("memory_note", "scope_key"), ("memory_note", "tsv"),
     ("memory_note", "words")}
)  # fmt: skip

#: ``derive[table](columns, rows)``: the rows with the destination's own derived
#: columns added (``(columns, rows)`` as written).
Derive = Callable[[list[str], Sequence[tuple[Any, ...]]], tuple[list[str], list[tuple[Any, ...]]]]


class CopyError(AgentikError):
    """The copy cannot start or failed; the message says what to do (never a DSN)."""


class CopyReader(Protocol):
    """A consistent read of an engine's tables (one snapshot for every table)."""

    async def count(self, table: str) -> int:
        """Rows of ``table`` in the snapshot."""
        ...

    def rows(
        self, table: str, columns: Sequence[str], batch: int
    ) -> AsyncGenerator[list[tuple[Any, ...]], None]:
        """``table``'s rows (those ``columns``), in the order they were written, in
        lists of at most ``batch``."""
        ...


@runtime_checkable
class CopyEngine(Protocol):
    """What an engine provides for :func:`copy_store`."""

    async def copy_tables(self) -> dict[str, list[str]]:
        """The tables of :data:`TABLES` this engine keeps, with their columns."""
        ...

    async def copy_all_tables(self) -> list[str]:
        """Every table of the database (:data:`TABLES` and any other)."""
        ...

    def copy_reader(self) -> AbstractAsyncContextManager[CopyReader]:
        """A consistent read of every table (the engine's snapshot)."""
        ...

    async def copy_write(
        self, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]
    ) -> None:
        """Write rows (ids included) in one transaction."""
        ...

    async def copy_finish(self) -> None:
        """After the last row: what makes new rows follow the copied ones (sequences)."""
        ...


@dataclass(slots=True)
class CopyReport:
    """What :func:`copy_store` did."""

    rows: dict[str, int] = field(default_factory=dict)
    #: Tables the source has rows in that the destination does not keep (left out).
    left_out: dict[str, int] = field(default_factory=dict)
    #: Tables of the source with rows that are not a bot's data this copy knows (a
    #: newer agentik's, a plugin's): not copied, said.
    unknown: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.rows.values())


Progress = Callable[[str], None]


async def _counts(engine: CopyEngine, tables: Sequence[str]) -> dict[str, int]:
    async with engine.copy_reader() as reader:
        return {t: await reader.count(t) for t in tables}


async def copy_store(
    source: CopyEngine,
    target: CopyEngine,
    *,
    batch: int = 5000,
    skip_notes: bool = False,
    derive: dict[str, Derive] | None = None,
    progress: Progress | None = None,
) -> CopyReport:
    """Copy every row of ``source`` into ``target`` (both started).

    Refuses a ``target`` holding any row (a copy never merges); refuses to leave memory
    notes behind unless ``skip_notes``.  Rows go table by table in :data:`TABLES`'
    order, ``batch`` rows per transaction, read from one snapshot of ``source``.
    ``derive`` adds what the destination derives from a row itself (a memory
    backend's index columns) to the rows of a table.
    """
    say = progress or (lambda _: None)
    have, want = await source.copy_tables(), await target.copy_tables()
    tables = [t for t in TABLES if t in have and t in want]
    held = {t: n for t, n in (await _counts(target, list(want))).items() if n}
    if held:
        shown = ", ".join(f"{n:,} {t}" for t, n in list(held.items())[:4])
        raise CopyError(
            f"the destination is not empty ({shown} rows): a copy only fills an empty database"
        )
    for t in tables:
        missing = [c for c in have[t] if c not in want[t] and (t, c) not in ENGINE_COLUMNS]
        if missing:
            raise CopyError(
                f"the destination's {t} table lacks {', '.join(missing)}: its schema is older"
                " than the source's (run the newer agentik on both)"
            )
    report = CopyReport()
    started = time.monotonic()
    async with source.copy_reader() as reader:
        for t in TABLES:
            if t in have and t not in want:
                n = await reader.count(t)
                if n:
                    report.left_out[t] = n
        for t in await source.copy_all_tables():
            if (
                t in TABLES
                or t in DERIVED_TABLES
                or t in PROCESS_TABLES
                or t in ATTACHMENT_TABLES
                or t.startswith(DERIVED_PREFIXES)
            ):
                continue
            n = await reader.count(t)
            if n:
                report.unknown[t] = n
        notes = {t: n for t, n in report.left_out.items() if t in NOTE_TABLES}
        if notes and not skip_notes:
            raise CopyError(
                f"the source holds memory notes ({notes.get('memory_note', 0):,} notes) and"
                " the destination keeps none: copy with --skip-notes to leave them behind"
                ' (keep them with [memory] backend = "markdown" by hand, or wait for notes'
                " on that engine)"
            )
        for t in tables:
            columns = [c for c in have[t] if c in want[t]]
            total = await reader.count(t)
            done = 0
            last = time.monotonic()
            fill = (derive or {}).get(t)
            async with aclosing(reader.rows(t, columns, batch)) as batches:
                async for rows in batches:
                    if fill is not None:
                        written, out = fill(columns, rows)
                        await target.copy_write(t, written, out)
                    else:
                        await target.copy_write(t, columns, rows)
                    done += len(rows)
                    if time.monotonic() - last >= 2.0:
                        last = time.monotonic()
                        say(f"  {t}: {done:,}/{total:,} rows")
            report.rows[t] = done
            if done:
                say(f"  {t}: {done:,} rows")
        if "attachment" in await source.copy_all_tables() and hasattr(target, "attachment_put"):
            report.rows["attachment"] = await _copy_attachments(source, target, reader, batch)
    await target.copy_finish()
    report.seconds = time.monotonic() - started
    return report


async def _copy_attachments(source: Any, target: Any, reader: CopyReader, batch: int) -> int:
    """Who holds which attachment, and the bytes, through the repositories."""
    done = 0
    async with aclosing(reader.rows("conversation", ("id",), batch)) as batches:
        async for rows in batches:
            for (cid,) in rows:
                for held in await source.attachments(cid):
                    data = await source.attachment_data(held.sha256)
                    if data is None:
                        continue  # (bytes a crash lost: nothing to copy)
                    await target.attachment_put(cid, data, held.media_type, at=held.created_at)
                    done += 1
    return done


# -- verification ------------------------------------------------------------------------
#: Snapshot fields that are JSON text in a row (their key order is the engine's own).
_JSON_TEXT = {"runs": ("usage",), "questions": ("choices", "form", "partial")}


def _normal(doc: dict[str, Any], *, nul: bool) -> Any:
    """An export as compared: without its export time, JSON text parsed, and (``nul``:
    one side is PostgreSQL, whose text cannot hold NUL) NUL read as U+FFFD."""
    doc = dict(doc)
    doc.pop("exported_at", None)
    for key, fields in _JSON_TEXT.items():
        rows = []
        for row in doc.get(key) or []:
            row = dict(row)
            for f in fields:
                if isinstance(row.get(f), str):
                    row[f] = json.loads(row[f])
            rows.append(row)
        if key in doc:
            doc[key] = rows
    if nul:
        doc = json.loads(json.dumps(doc).replace("\\u0000", "\\ufffd"))
    return doc


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """Where ``a`` and ``b`` first differ (``messages[3].content``), ``None`` if alike."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if k not in a or k not in b:
                return f"{path}.{k}".lstrip(".")
            found = first_difference(a[k], b[k], f"{path}.{k}")
            if found is not None:
                return found.lstrip(".")
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            found = first_difference(x, y, f"{path}[{i}]")
            if found is not None:
                return found
        return None if len(a) == len(b) else f"{path} (length {len(a)} vs {len(b)})"
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return None
    return None if a == b else path


def _at(doc: Any, path: str) -> Any:
    """The value at ``path`` in ``doc`` (best effort, for the message)."""
    import re

    value = doc
    for name, index in re.findall(r"([^.\[\]]+)|\[(\d+)\]", path.split(" (")[0]):
        try:
            value = value[int(index)] if index else value[name]
        except (KeyError, IndexError, TypeError):
            return None
    return value


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= 80 else text[:77] + "..."


async def _compare(source: Any, target: Any, cid: str, *, nul: bool) -> int:
    """Compare one conversation's exports; 1 (0: it went from the source meanwhile)."""
    from ..lifecycle import export_conversation

    # (Both sides at once: each export is several queries, most of its time waiting.)
    mine, theirs = await asyncio.gather(
        export_conversation(source, cid), export_conversation(target, cid)
    )
    if mine is None:
        return 0  # deleted meanwhile (the bot runs?)
    if theirs is None:
        raise CopyError(f"verification failed: conversation {cid} is missing")
    a, b = _normal(mine, nul=nul), _normal(theirs, nul=nul)
    # (Equal documents compare at C speed; only a difference is walked to name it.)
    where = None if a == b else first_difference(a, b)
    if where is not None:
        raise CopyError(
            f"verification failed: conversation {cid}: {where} differs"
            f" (source {_shown(_at(a, where))}, destination {_shown(_at(b, where))})"
        )
    return 1


async def verify(
    source: Any,
    target: Any,
    *,
    nul: bool = False,
    together: int = 8,
    progress: Progress | None = None,
) -> int:
    """Export every conversation of ``source`` and of ``target`` and compare them, then
    count every copied table on both sides; the number of conversations compared.

    Raises :class:`CopyError` naming the first difference.  ``source`` and ``target``
    are started stores that are :class:`CopyEngine` too; ``together`` conversations
    are compared at once.
    """
    say = progress or (lambda _: None)
    have, want = await source.copy_tables(), await target.copy_tables()
    tables = [t for t in TABLES if t in have and t in want]
    compared = 0
    async with source.copy_reader() as reader:
        async with aclosing(reader.rows("conversation", ["id"], 1000)) as batches:
            async for rows in batches:
                # A few conversations at once (each export waits on queries), in order:
                # the first difference reported is the first in the source's order.
                for i in range(0, len(rows), together):
                    chunk = [cid for (cid,) in rows[i : i + together]]
                    done = await asyncio.gather(
                        *(_compare(source, target, cid, nul=nul) for cid in chunk),
                        return_exceptions=True,
                    )
                    before = compared
                    for outcome in done:
                        if isinstance(outcome, BaseException):
                            raise outcome
                        compared += outcome
                    if compared // 1000 != before // 1000:
                        say(f"  verified {compared:,} conversations")
    mine_n, theirs_n = await _counts(source, tables), await _counts(target, tables)
    for t in tables:
        if mine_n[t] != theirs_n[t]:
            raise CopyError(
                f"verification failed: {t} has {mine_n[t]:,} rows in the source and"
                f" {theirs_n[t]:,} in the destination"
            )
    return compared
