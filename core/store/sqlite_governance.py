"""The SQLite engine's governance aggregate (:class:`~.repositories.GovernanceRepository`):
roles granted in chat, channel settings, budget counters."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping, Sequence

from .records import AccessChange, AccessGrant, ChannelSetting, ChannelSettingChange
from .rows import ACCESS_CHANGE, ACCESS_GRANT, BUDGET, CHANNEL_SETTING, CHANNEL_SETTING_CHANGE
from .sqlite_room import SQLiteRoom

__all__ = ["SQLiteGovernance"]

_ADD = (
    "INSERT INTO budget_usage (scope, subject, kind, period, amount)"
    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (scope, subject, kind, period)"
    " DO UPDATE SET amount = amount + excluded.amount"
)


class SQLiteGovernance(SQLiteRoom):
    """Grants and their audit, channel settings and their audit, budget counters."""

    # -- budgets (issue 19: agentik.core.budgets; migration 7) ----------------------------
    async def budget_add(self, rows: Sequence[tuple[str, str, str, int, int]]) -> None:
        def fn(conn: sqlite3.Connection) -> None:
            conn.executemany(_ADD, list(rows))

        await self._write(fn)

    async def budget_take(
        self,
        checks: Sequence[tuple[str, str, str, int, int]],
        rows: Sequence[tuple[str, str, str, int, int]],
        *,
        held: tuple[str, str, int] | None = None,
    ) -> tuple[int, int] | None:
        # Read and add in the writer's transaction (BEGIN IMMEDIATE): no other
        # connection, in this process or another, writes between the two.
        def fn(conn: sqlite3.Connection) -> tuple[int, int] | None:
            for index, (scope, subject, kind, period, ceiling) in enumerate(checks):
                row = conn.execute(
                    "SELECT amount FROM budget_usage"
                    " WHERE scope = ? AND subject = ? AND kind = ? AND period = ?",
                    (scope, subject, kind, period),
                ).fetchone()
                amount = int(row[0]) if row else 0
                if held is not None and kind == held[0]:
                    row = conn.execute(
                        "SELECT COALESCE(SUM(amount), 0) FROM budget_usage"
                        " WHERE scope = ? AND subject = ? AND kind = ? AND period >= ?",
                        (scope, subject, held[1], held[2]),
                    ).fetchone()
                    amount += int(row[0])
                if amount >= ceiling:
                    return index, amount
            conn.executemany(_ADD, list(rows))
            return None

        result: tuple[int, int] | None = await self._write(fn)
        return result

    async def budget_usage(
        self, keys: Sequence[tuple[str, str]], windows: Mapping[str, int]
    ) -> dict[tuple[str, str, str], int]:
        out: dict[tuple[str, str, str], int] = {}
        if not keys or not windows:
            return out
        # One primary-key look-up per (counter, kind): a handful of rows.
        pairs = " OR ".join("(kind = ? AND period = ?)" for _ in windows)
        wparams = [v for kind, start in windows.items() for v in (kind, start)]
        for scope, subject in dict.fromkeys(keys):
            rows = await self._read(
                "SELECT kind, amount FROM budget_usage WHERE scope = ? AND subject = ?"
                f" AND ({pairs})",
                (scope, subject, *wparams),
            )
            for kind, amount in rows:
                out[(scope, subject, kind)] = int(amount)
        return out

    async def budget_prune(self, before: Mapping[str, int]) -> int:
        def fn(conn: sqlite3.Connection) -> int:
            n = 0
            for kind, start in before.items():
                n += conn.execute(
                    "DELETE FROM budget_usage WHERE period < ? AND kind = ?", (start, kind)
                ).rowcount
            return n

        return int(await self._write(fn))

    async def budget_rows(self, since: int) -> list[tuple[str, str, str, int, int]]:
        rows = await self._read(
            f"SELECT {BUDGET.columns} FROM budget_usage WHERE period >= ?"
            " ORDER BY scope, subject, kind, period",
            (since,),
        )
        return [BUDGET.record(r) for r in rows]

    # -- access: roles granted in chat (issue 19, access) ---------------------------------
    async def access_grants(self) -> list[AccessGrant]:
        rows = await self._read(
            f"SELECT {ACCESS_GRANT.columns} FROM access_grant ORDER BY identity"
        )
        return [ACCESS_GRANT.record(r) for r in rows]

    async def access_set(
        self, identity: str, role: str | None, *, by: str, channel: str | None = None
    ) -> None:
        now = time.time()

        def fn(conn: sqlite3.Connection) -> None:
            found = conn.execute(
                "SELECT role FROM access_grant WHERE identity = ?", (identity,)
            ).fetchone()
            old = found[0] if found else None
            if role is None:
                conn.execute("DELETE FROM access_grant WHERE identity = ?", (identity,))
            else:
                conn.execute(
                    "INSERT INTO access_grant (identity, role, granted_by, granted_at)"
                    " VALUES (?, ?, ?, ?) ON CONFLICT (identity) DO UPDATE SET"
                    " role = excluded.role, granted_by = excluded.granted_by,"
                    " granted_at = excluded.granted_at",
                    (identity, role, by, now),
                )
            conn.execute(
                "INSERT INTO access_audit (at, actor, identity, old_role, new_role, channel)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (now, by, identity, old, role, channel),
            )

        await self._write(fn)

    async def access_audit(self, *, limit: int = 100) -> list[AccessChange]:
        rows = await self._read(
            f"SELECT {ACCESS_CHANGE.columns} FROM access_audit ORDER BY id DESC LIMIT ?",
            (limit,),
        )
        return [ACCESS_CHANGE.record(r) for r in rows]

    # -- per-channel settings (issue 19, channel settings) ------------------------------
    async def channel_settings(self, channel_key: str) -> list[ChannelSetting]:
        rows = await self._read(
            f"SELECT {CHANNEL_SETTING.columns} FROM channel_setting"
            " WHERE channel_key = ? ORDER BY key",
            (channel_key,),
        )
        return [CHANNEL_SETTING.record(r) for r in rows]

    async def set_channel_setting(
        self, channel_key: str, key: str, value: str | None, *, actor: str, at: float
    ) -> str | None:
        def fn(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(
                "SELECT value FROM channel_setting WHERE channel_key = ? AND key = ?",
                (channel_key, key),
            ).fetchone()
            old = None if row is None else str(row[0])
            if value is None and old is None:
                return None
            if value is None:
                conn.execute(
                    "DELETE FROM channel_setting WHERE channel_key = ? AND key = ?",
                    (channel_key, key),
                )
            else:
                conn.execute(
                    "INSERT INTO channel_setting (channel_key, key, value, set_by, set_at)"
                    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (channel_key, key) DO UPDATE SET"
                    " value = excluded.value, set_by = excluded.set_by, set_at = excluded.set_at",
                    (channel_key, key, value, actor, at),
                )
            conn.execute(
                "INSERT INTO channel_setting_audit (channel_key, key, old_value, new_value,"
                " actor, at) VALUES (?, ?, ?, ?, ?, ?)",
                (channel_key, key, old, value, actor, at),
            )
            return old

        result: str | None = await self._write(fn)
        return result

    async def channel_setting_changes(
        self, channel_key: str | None = None, *, limit: int = 100
    ) -> list[ChannelSettingChange]:
        where, params = ("WHERE channel_key = ?", (channel_key,)) if channel_key else ("", ())
        rows = await self._read(
            f"SELECT {CHANNEL_SETTING_CHANGE.columns}"
            f" FROM channel_setting_audit {where} ORDER BY id DESC LIMIT ?",
            (*params, limit),
        )
        return [CHANNEL_SETTING_CHANGE.record(r) for r in reversed(rows)]
