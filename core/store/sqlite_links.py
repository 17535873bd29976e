"""The SQLite engine's linked channels (:class:`~.repositories.LinkRepository`): links
made at run time and the persistent message map, written through the one writer."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from .records import LinkMessage, LinkRecord
from .sqlite_room import SQLiteRoom

__all__ = ["SQLiteLinks"]

_MAP_COLUMNS = "link, canonical, channel_key, ref, origin, run_id, piece, created_at"


def _map_row(r: Sequence[object]) -> LinkMessage:
    return LinkMessage(
        link=str(r[0]), canonical=str(r[1]), channel_key=str(r[2]),
        ref=None if r[3] is None else str(r[3]), origin=bool(r[4]),
        run_id=None if r[5] is None else str(r[5]),
        piece=None if r[6] is None else int(r[6]),  # type: ignore[call-overload]
        created_at=float(r[7]),  # type: ignore[arg-type]
    )  # fmt: skip


class SQLiteLinks(SQLiteRoom):
    """Links in the ``link`` table, the message map in ``link_message`` (migration 19)."""

    async def link_save(self, record: LinkRecord) -> None:
        def fn(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO link (name, channels, options, created_by, created_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET"
                " channels = excluded.channels, options = excluded.options,"
                " created_by = excluded.created_by, created_at = excluded.created_at",
                (record.name, json.dumps(list(record.channels)), json.dumps(record.options),
                 record.created_by, record.created_at),
            )  # fmt: skip

        await self._write(fn)

    async def link_delete(self, name: str) -> bool:
        def fn(conn: sqlite3.Connection) -> bool:
            return conn.execute("DELETE FROM link WHERE name = ?", (name,)).rowcount > 0

        found: bool = await self._write(fn)
        return found

    async def links(self) -> list[LinkRecord]:
        rows = await self._read(
            "SELECT name, channels, options, created_by, created_at FROM link ORDER BY name"
        )
        return [
            LinkRecord(
                name=r[0],
                channels=tuple(json.loads(r[1])),
                options=json.loads(r[2]),
                created_by=r[3],
                created_at=r[4],
            )
            for r in rows
        ]

    async def link_map_add(self, rows: Sequence[LinkMessage]) -> None:
        if not rows:
            return
        values = [
            (
                m.link,
                m.canonical,
                m.channel_key,
                m.ref,
                int(m.origin),
                m.run_id,
                m.piece,
                m.created_at,
            )
            for m in rows
        ]

        def fn(conn: sqlite3.Connection) -> None:
            conn.executemany(
                f"INSERT INTO link_message ({_MAP_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (canonical, channel_key) DO UPDATE SET"
                " ref = COALESCE(excluded.ref, link_message.ref)",
                values,
            )

        await self._write(fn)

    async def link_map(self, canonical: str) -> list[LinkMessage]:
        rows = await self._read(
            f"SELECT {_MAP_COLUMNS} FROM link_message WHERE canonical = ?"
            " ORDER BY origin DESC, channel_key",
            (canonical,),
        )
        return [_map_row(r) for r in rows]

    async def link_map_find(self, channel_key: str, ref: str) -> str | None:
        rows = await self._read(
            "SELECT canonical FROM link_message WHERE channel_key = ? AND ref = ? LIMIT 1",
            (channel_key, ref),
        )
        return str(rows[0][0]) if rows else None
