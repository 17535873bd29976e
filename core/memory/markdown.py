"""Long-term memory as plain Markdown files: one file per scope, in a folder.

Layout of ``<folder>``::

    global.md
    channel/<scope name>.md     e.g. channel/irc%3Alibera%3A%23agentik.md
    user/<scope name>.md        e.g. user/libera%3Aalice.md
    history.jsonl               every version of every note, one JSON line each

Each scope file is readable and editable by people::

    # Memory: channel:irc:libera:#agentik

    ## Note 3
    alice prefers answers in French.

Edits made by hand to a note's text are picked up at the next start (and
recorded as a version).  ``history.jsonl`` is append-only; deleted notes
disappear from the scope file but stay there, so they can be restored.

Search scores notes by how many of the query's words they contain (rarer
words weigh more); it reads an in-memory index, so it is fast for the few
thousand notes a folder like this is meant for.  For more, use the SQLite
backend.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import math
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from . import MemoryBackend, Note, NoteError, NoteVersion, VersionOp, valid_scope

__all__ = ["MarkdownMemory"]

_HEADING = re.compile(r"^## Note (\d+)\s*$")
_WORD = re.compile(r"\w+", re.UNICODE)


def _words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text)}


class MarkdownMemory(MemoryBackend):
    """Notes as Markdown files in ``folder`` (created if missing)."""

    name = "markdown"

    def __init__(
        self, folder: str | os.PathLike[str], *, allow_global_writes: bool = False
    ) -> None:
        super().__init__(allow_global_writes=allow_global_writes)
        self.folder = Path(folder)
        self._notes: dict[int, Note] = {}
        self._versions: dict[int, list[NoteVersion]] = {}
        self._lock = asyncio.Lock()
        self._next_id = 1

    # -- files ------------------------------------------------------------------------
    def _file(self, scope: str) -> Path:
        if scope == "global":
            return self.folder / "global.md"
        kind, _, rest = scope.partition(":")
        return self.folder / kind / f"{quote(rest, safe='')}.md"

    def _scope_of(self, path: Path) -> str | None:
        rel = path.relative_to(self.folder)
        if rel.parts == ("global.md",):
            return "global"
        if len(rel.parts) == 2 and rel.parts[0] in ("channel", "user") and rel.suffix == ".md":
            return f"{rel.parts[0]}:{unquote(rel.stem)}"
        return None

    @property
    def _history_file(self) -> Path:
        return self.folder / "history.jsonl"

    async def start(self) -> None:
        try:
            await asyncio.to_thread(self._load)
        except OSError as exc:
            raise NoteError(f"memory folder {str(self.folder)!r}: {exc}") from None

    def _load(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        if self._history_file.exists():
            with self._history_file.open(encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        d = json.loads(line)
                        v = NoteVersion(
                            note_id=int(d["id"]),
                            version=int(d["version"]),
                            text=d["text"],
                            op=d["op"],
                            author=d.get("author"),
                            created_at=float(d.get("ts", 0.0)),
                        )
                    except (ValueError, KeyError, TypeError) as exc:
                        raise NoteError(
                            f"{self._history_file}: line {n} is not a memory version: {exc}"
                        ) from None
                    self._versions.setdefault(v.note_id, []).append(v)
                    first = self._versions[v.note_id][0]
                    self._notes[v.note_id] = Note(
                        id=v.note_id,
                        scope=d.get("scope", "global"),
                        text=v.text,
                        author=v.author,
                        version=v.version,
                        deleted=v.op == "delete",
                        created_at=first.created_at,
                        updated_at=v.created_at,
                    )
        self._next_id = max(self._notes, default=0) + 1
        # Hand edits: the files are the truth for the current text.
        edited: list[tuple[Note, str]] = []
        for path in sorted(self.folder.rglob("*.md")):
            scope = self._scope_of(path)
            if scope is None:
                continue
            for nid, text in _parse(path.read_text(encoding="utf-8")):
                note = self._notes.get(nid)
                if note is None or note.deleted or note.scope != scope:
                    continue
                if text != note.text:
                    edited.append((note, text))
        for note, text in edited:
            self._record(note.id, note.scope, text, "edit", "(edited by hand)")

    def _record(self, nid: int, scope: str, text: str, op: VersionOp, author: str | None) -> Note:
        """Add a version in memory and on disk (runs in a thread)."""
        now = time.time()
        versions = self._versions.setdefault(nid, [])
        version = versions[-1].version + 1 if versions else 1
        v = NoteVersion(
            note_id=nid, version=version, text=text, op=op, author=author, created_at=now
        )
        with self._history_file.open("a", encoding="utf-8") as f:
            f.write(_history_line(v, scope) + "\n")
            f.flush()
            os.fsync(f.fileno())
        versions.append(v)
        note = Note(
            id=nid,
            scope=scope,
            text=text,
            author=author,
            version=version,
            deleted=op == "delete",
            created_at=versions[0].created_at,
            updated_at=now,
        )
        self._notes[nid] = note
        self._write_scope(scope)
        return note

    def _write_scope(self, scope: str) -> None:
        path = self._file(scope)
        notes = sorted(
            (n for n in self._notes.values() if n.scope == scope and not n.deleted),
            key=lambda n: n.id,
        )
        if not notes:
            path.unlink(missing_ok=True)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        body = [f"# Memory: {scope}", ""]
        for n in notes:
            body += [f"## Note {n.id}", n.text.rstrip(), ""]
        tmp = path.with_suffix(".md.tmp")
        tmp.write_text("\n".join(body), encoding="utf-8")
        os.replace(tmp, path)

    async def _change(self, fn: Any, *args: Any) -> Any:
        async with self._lock:
            try:
                return await asyncio.to_thread(fn, *args)
            except OSError as exc:
                raise NoteError(f"memory folder {str(self.folder)!r}: {exc}") from None

    # -- storage ----------------------------------------------------------------------
    async def save(
        self, scope: str, text: str, *, author: str | None = None, note_id: int | None = None
    ) -> Note:
        valid_scope(scope)
        text = self.scrub(text).strip()
        if "\n## Note " in f"\n{text}":
            # Would split the note when the file is read back.
            text = text.replace("## Note ", "\\## Note ")
        if note_id is None:
            nid = self._next_id
            self._next_id += 1
            return await self._change(self._record, nid, scope, text, "save", author)
        old = self._notes.get(note_id)
        if old is None:
            raise NoteError(f"no note #{note_id}")
        return await self._change(self._record, note_id, old.scope, text, "edit", author)

    async def delete(self, note_id: int, *, author: str | None = None) -> bool:
        note = self._notes.get(note_id)
        if note is None or note.deleted:
            return False
        await self._change(self._record, note_id, note.scope, note.text, "delete", author)
        return True

    async def restore(self, note_id: int, version: int, *, author: str | None = None) -> Note:
        note = self._notes.get(note_id)
        old = next((v for v in self._versions.get(note_id, ()) if v.version == version), None)
        if note is None or old is None:
            raise NoteError(f"note #{note_id} has no version {version}")
        return await self._change(self._record, note_id, note.scope, old.text, "restore", author)

    async def purge(self, note_id: int) -> bool:
        note = self._notes.pop(note_id, None)
        if note is None:
            return False
        self._versions.pop(note_id, None)

        def rewrite() -> None:
            lines = []
            for versions in self._versions.values():
                for v in versions:
                    lines.append(_history_line(v, self._notes[v.note_id].scope))
            tmp = self._history_file.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
            os.replace(tmp, self._history_file)
            self._write_scope(note.scope)

        await self._change(rewrite)
        return True

    async def get(self, note_id: int, *, include_deleted: bool = False) -> Note | None:
        note = self._notes.get(note_id)
        if note is None or (note.deleted and not include_deleted):
            return None
        return note

    async def list(
        self,
        scopes: Sequence[str] | None = None,
        *,
        limit: int = 50,
        offset: int = 0,
        include_deleted: bool = False,
    ) -> builtins.list[Note]:
        wanted = set(scopes) if scopes is not None else None
        notes = [
            n
            for n in self._notes.values()
            if (wanted is None or n.scope in wanted) and (include_deleted or not n.deleted)
        ]
        notes.sort(key=lambda n: (-n.updated_at, -n.id))
        return notes[offset : offset + limit]

    async def search(
        self, query: str, scopes: Sequence[str] | None = None, *, limit: int = 10
    ) -> builtins.list[Note]:
        terms = _words(query)
        if not terms:
            return []
        candidates = await self.list(scopes, limit=len(self._notes) or 1)
        indexed = [(n, _words(n.text)) for n in candidates]
        total = len(indexed) or 1
        df = {t: sum(1 for _, ws in indexed if t in ws) for t in terms}
        scored = []
        for note, ws in indexed:
            score = sum(math.log(1 + total / df[t]) for t in terms if t in ws)
            if score > 0:
                scored.append((score, note))
        scored.sort(key=lambda p: (-p[0], -p[1].id))
        return [n for _, n in scored[:limit]]

    async def history(self, note_id: int) -> builtins.list[NoteVersion]:
        return list(self._versions.get(note_id, ()))


def _history_line(v: NoteVersion, scope: str) -> str:
    """One ``history.jsonl`` line (what :meth:`MarkdownMemory._load` reads back)."""
    return json.dumps(
        {"id": v.note_id, "scope": scope, "version": v.version, "text": v.text, "op": v.op,
         "author": v.author, "ts": v.created_at},
        ensure_ascii=False,
    )  # fmt: skip


def _parse(text: str) -> list[tuple[int, str]]:
    """``(id, text)`` of each ``## Note N`` section of a scope file."""
    out: list[tuple[int, str]] = []
    current: int | None = None
    lines: list[str] = []
    for line in text.splitlines():
        m = _HEADING.match(line)
        if m:
            if current is not None:
                out.append((current, "\n".join(lines).strip()))
            current, lines = int(m.group(1)), []
        elif current is not None:
            lines.append(line)
    if current is not None:
        out.append((current, "\n".join(lines).strip()))
    return out
