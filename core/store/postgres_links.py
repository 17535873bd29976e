"""The PostgreSQL engine's linked channels (:class:`~.repositories.LinkRepository`), as
SQLite's (:mod:`.sqlite_links`): links made at run time and the persistent message map."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .postgres_room import PostgresRoom, dumps, nul_free
from .records import LinkMessage, LinkRecord

if TYPE_CHECKING:
    import asyncpg

__all__ = ["PostgresLinks"]

_MAP_COLUMNS = "link, canonical, channel_key, ref, origin, run_id, piece, created_at"


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


class PostgresLinks(PostgresRoom):
    """Links in the ``link`` table, the message map in ``link_message`` (migration 8)."""

    async def link_save(self, record: LinkRecord) -> None:
        async def fn(conn: asyncpg.Connection) -> None:
            await conn.execute(
                "INSERT INTO link (name, channels, options, created_by, created_at)"
                " VALUES ($1, $2::jsonb, $3::jsonb, $4, $5) ON CONFLICT (name) DO UPDATE SET"
                " channels = excluded.channels, options = excluded.options,"
                " created_by = excluded.created_by, created_at = excluded.created_at",
                nul_free(record.name), dumps(list(record.channels)), dumps(record.options),
                nul_free(record.created_by), record.created_at,
            )  # fmt: skip

        await self._write(fn, single=True)

    async def link_delete(self, name: str) -> bool:
        async def fn(conn: asyncpg.Connection) -> bool:
            status = await conn.execute("DELETE FROM link WHERE name = $1", nul_free(name))
            return int(status.split()[-1]) > 0

        found: bool = await self._write(fn, single=True)
        return found

    async def links(self) -> list[LinkRecord]:
        rows = await self._read(
            "SELECT name, channels, options, created_by, created_at FROM link ORDER BY name"
        )
        return [
            LinkRecord(
                name=r[0],
                channels=tuple(_json(r[1])),
                options=_json(r[2]),
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
                nul_free(m.link),
                nul_free(m.canonical),
                nul_free(m.channel_key),
                nul_free(m.ref),
                m.origin,
                m.run_id,
                m.piece,
                m.created_at,
            )
            for m in rows
        ]

        async def fn(conn: asyncpg.Connection) -> None:
            await conn.executemany(
                f"INSERT INTO link_message ({_MAP_COLUMNS})"
                " VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
                " ON CONFLICT (canonical, channel_key) DO UPDATE SET"
                " ref = COALESCE(excluded.ref, link_message.ref)",
                values,
            )

        await self._write(fn)

    async def link_map(self, canonical: str) -> list[LinkMessage]:
        rows = await self._read(
            f"SELECT {_MAP_COLUMNS} FROM link_message WHERE canonical = $1"
            " ORDER BY origin DESC, channel_key",
            nul_free(canonical),
        )
        return [
            LinkMessage(
                link=r[0],
                canonical=r[1],
                channel_key=r[2],
                ref=r[3],
                origin=r[4],
                run_id=r[5],
                piece=r[6],
                created_at=r[7],
            )
            for r in rows
        ]

    async def link_map_find(self, channel_key: str, ref: str) -> str | None:
        rows = await self._read(
            "SELECT canonical FROM link_message WHERE channel_key = $1 AND ref = $2 LIMIT 1",
            nul_free(channel_key), nul_free(ref),
        )  # fmt: skip
        return str(rows[0][0]) if rows else None
