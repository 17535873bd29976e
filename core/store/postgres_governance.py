"""The PostgreSQL engine's governance aggregate (:class:`~.repositories.GovernanceRepository`):
roles granted in chat, channel settings, budget counters."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import StoreError
from .postgres_room import PostgresRoom, nul_free
from .records import AccessChange, AccessGrant, ChannelSetting, ChannelSettingChange
from .rows import ACCESS_CHANGE, ACCESS_GRANT, BUDGET, CHANNEL_SETTING, CHANNEL_SETTING_CHANGE

if TYPE_CHECKING:
    import asyncpg

__all__ = ["PostgresGovernance"]

#: SQLSTATE deadlock_detected, and how often a take runs before its error is raised.
_DEADLOCK = "40P01"
_TAKE_ATTEMPTS = 5

_ADD = (
    "INSERT INTO budget_usage (scope, subject, kind, period, amount)"
    " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (scope, subject, kind, period)"
    " DO UPDATE SET amount = budget_usage.amount + excluded.amount"
)


def _summed(rows: Sequence[tuple[str, str, str, int, int]]) -> list[tuple[Any, ...]]:
    """Rows of one call may hit one counter twice: summed first (one upsert per counter)."""
    summed: dict[tuple[str, str, str, int], int] = {}
    for scope, subject, kind, period, amount in rows:
        key = (scope, subject, kind, period)
        summed[key] = summed.get(key, 0) + amount
    return [(*key, amount) for key, amount in summed.items()]


def _lock_key(scope: str, subject: str, kind: str, period: int) -> int:
    """A budget counter's advisory lock key: a signed 64-bit hash of the counter."""
    digest = hashlib.blake2b(
        f"budget\0{scope}\0{subject}\0{kind}\0{period}".encode(), digest_size=8
    ).digest()
    return int.from_bytes(digest, "big", signed=True)


class PostgresGovernance(PostgresRoom):
    """Grants and their audit, channel settings and their audit, budget counters."""

    # -- budgets ----------------------------------------------------------------------------
    async def budget_add(self, rows: Sequence[tuple[str, str, str, int, int]]) -> None:
        args = _summed(rows)
        if not args:
            return

        async def fn(conn: asyncpg.Connection) -> None:
            await conn.executemany(_ADD, args)

        await self._write(fn)

    async def budget_take(
        self,
        checks: Sequence[tuple[str, str, str, int, int]],
        rows: Sequence[tuple[str, str, str, int, int]],
        *,
        held: tuple[str, str, int] | None = None,
    ) -> tuple[int, int] | None:
        if not checks:
            await self.budget_add(rows)
            return None
        args = _summed(rows)
        # Every counter this take reads or writes, locked to the commit (an advisory
        # lock, so a counter not created yet is locked too), in one order: takes of
        # the same counters on any worker queue here, and the read below sees what
        # the one before committed.
        locks = sorted({_lock_key(*key[:4]) for key in checks} | {_lock_key(*a[:4]) for a in args})

        async def fn(conn: asyncpg.Connection) -> tuple[int, int] | None:
            # (The locks are held already: the writer takes them first.)
            got = await conn.fetch(
                "SELECT c.n, b.amount FROM unnest($1::text[], $2::text[], $3::text[],"
                " $4::bigint[]) WITH ORDINALITY AS c(scope, subject, kind, period, n)"
                " JOIN budget_usage b ON b.scope = c.scope AND b.subject = c.subject"
                "  AND b.kind = c.kind AND b.period = c.period",
                [c[0] for c in checks], [c[1] for c in checks],
                [c[2] for c in checks], [c[3] for c in checks],
            )  # fmt: skip
            amounts = {int(n) - 1: int(amount) for n, amount in got}
            if held is not None:
                # The held counters (running turns' reservations, on any worker) of
                # the checked ones: their takes hold the same counters' locks above.
                pending = [i for i, c in enumerate(checks) if c[2] == held[0]]
                if pending:
                    sums = await conn.fetch(
                        "SELECT c.n, COALESCE(SUM(b.amount), 0) FROM unnest($1::text[],"
                        " $2::text[]) WITH ORDINALITY AS c(scope, subject, n)"
                        " JOIN budget_usage b ON b.scope = c.scope AND b.subject = c.subject"
                        "  AND b.kind = $3 AND b.period >= $4 GROUP BY c.n",
                        [checks[i][0] for i in pending], [checks[i][1] for i in pending],
                        held[1], held[2],
                    )  # fmt: skip
                    for n, amount in sums:
                        i = pending[int(n) - 1]
                        amounts[i] = amounts.get(i, 0) + int(amount)
            for index, check in enumerate(checks):
                amount = amounts.get(index, 0)
                if amount >= check[4]:
                    return index, amount
            if args:
                await conn.executemany(_ADD, args)
            return None

        # The writer commits several jobs in one transaction and takes all their
        # declared locks first, in one order, so batches do not deadlock on them; a
        # deadlock some other way (PostgreSQL rolls one back after its
        # deadlock_timeout) is survived: the take, which changed nothing outside its
        # transaction, is simply run again.
        for attempt in range(_TAKE_ATTEMPTS):
            try:
                result: tuple[int, int] | None = await self._write(fn, locks=tuple(locks))
            except StoreError as exc:
                state = getattr(exc.__cause__, "sqlstate", None) or ""
                if state != _DEADLOCK or attempt == _TAKE_ATTEMPTS - 1:
                    raise
                continue
            return result
        raise AssertionError("unreachable")

    async def budget_usage(
        self, keys: Sequence[tuple[str, str]], windows: Mapping[str, int]
    ) -> dict[tuple[str, str, str], int]:
        out: dict[tuple[str, str, str], int] = {}
        if not keys or not windows:
            return out
        pairs = list(dict.fromkeys(keys))
        kinds = list(windows)
        # One query: the counters of every (scope, subject) in each kind's window.
        rows = await self._read(
            "SELECT b.scope, b.subject, b.kind, b.amount FROM budget_usage b"
            " JOIN unnest($1::text[], $2::text[]) AS k(scope, subject)"
            "  ON b.scope = k.scope AND b.subject = k.subject"
            " JOIN unnest($3::text[], $4::bigint[]) AS w(kind, period)"
            "  ON b.kind = w.kind AND b.period = w.period",
            [p[0] for p in pairs],
            [p[1] for p in pairs],
            kinds,
            [windows[k] for k in kinds],
        )
        for scope, subject, kind, amount in rows:
            out[(scope, subject, kind)] = int(amount)
        return out

    async def budget_prune(self, before: Mapping[str, int]) -> int:
        async def fn(conn: asyncpg.Connection) -> int:
            n = 0
            for kind, start in before.items():
                status = await conn.execute(
                    "DELETE FROM budget_usage WHERE period < $1 AND kind = $2", start, kind
                )
                n += int(status.split()[-1])
            return n

        return int(await self._write(fn))

    async def budget_rows(self, since: int) -> list[tuple[str, str, str, int, int]]:
        rows = await self._read(
            f"SELECT {BUDGET.columns} FROM budget_usage WHERE period >= $1"
            " ORDER BY scope, subject, kind, period",
            since,
        )
        return [BUDGET.record(r) for r in rows]

    # -- access: roles granted in chat ------------------------------------------------------
    async def access_grants(self) -> list[AccessGrant]:
        rows = await self._read(
            f"SELECT {ACCESS_GRANT.columns} FROM access_grant ORDER BY identity"
        )
        return [ACCESS_GRANT.record(r) for r in rows]

    async def access_set(
        self, identity: str, role: str | None, *, by: str, channel: str | None = None
    ) -> None:
        now = time.time()

        async def fn(conn: asyncpg.Connection) -> None:
            # The row is locked for the rest of the transaction: the audited old role is
            # the one replaced, whatever another process does at the same time.
            old = await conn.fetchval(
                "SELECT role FROM access_grant WHERE identity = $1 FOR UPDATE", identity
            )
            if role is None:
                await conn.execute("DELETE FROM access_grant WHERE identity = $1", identity)
            else:
                await conn.execute(
                    "INSERT INTO access_grant (identity, role, granted_by, granted_at)"
                    " VALUES ($1, $2, $3, $4) ON CONFLICT (identity) DO UPDATE SET"
                    " role = excluded.role, granted_by = excluded.granted_by,"
                    " granted_at = excluded.granted_at",
                    identity, role, by, now,
                )  # fmt: skip
            await conn.execute(
                "INSERT INTO access_audit (at, actor, identity, old_role, new_role, channel)"
                " VALUES ($1, $2, $3, $4, $5, $6)",
                now, by, identity, old, role, channel,
            )  # fmt: skip

        await self._write(fn)

    async def access_audit(self, *, limit: int = 100) -> list[AccessChange]:
        rows = await self._read(
            f"SELECT {ACCESS_CHANGE.columns} FROM access_audit ORDER BY id DESC LIMIT $1",
            limit,
        )
        return [ACCESS_CHANGE.record(r) for r in rows]

    # -- per-channel settings ---------------------------------------------------------------
    async def channel_settings(self, channel_key: str) -> list[ChannelSetting]:
        rows = await self._read(
            f"SELECT {CHANNEL_SETTING.columns} FROM channel_setting"
            " WHERE channel_key = $1 ORDER BY key",
            channel_key,
        )
        return [CHANNEL_SETTING.record(r) for r in rows]

    async def set_channel_setting(
        self, channel_key: str, key: str, value: str | None, *, actor: str, at: float
    ) -> str | None:
        value = nul_free(value)

        async def fn(conn: asyncpg.Connection) -> str | None:
            row = await conn.fetchrow(
                "SELECT value FROM channel_setting WHERE channel_key = $1 AND key = $2 FOR UPDATE",
                channel_key,
                key,
            )
            old = None if row is None else str(row[0])
            if value is None and old is None:
                return None
            if value is None:
                await conn.execute(
                    "DELETE FROM channel_setting WHERE channel_key = $1 AND key = $2",
                    channel_key,
                    key,
                )
            else:
                await conn.execute(
                    "INSERT INTO channel_setting (channel_key, key, value, set_by, set_at)"
                    " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (channel_key, key) DO UPDATE SET"
                    " value = excluded.value, set_by = excluded.set_by,"
                    " set_at = excluded.set_at",
                    channel_key, key, value, actor, at,
                )  # fmt: skip
            await conn.execute(
                "INSERT INTO channel_setting_audit (channel_key, key, old_value, new_value,"
                " actor, at) VALUES ($1, $2, $3, $4, $5, $6)",
                channel_key, key, old, value, actor, at,
            )  # fmt: skip
            return old

        result: str | None = await self._write(fn)
        return result

    async def channel_setting_changes(
        self, channel_key: str | None = None, *, limit: int = 100
    ) -> list[ChannelSettingChange]:
        where, args = ("WHERE channel_key = $1", [channel_key]) if channel_key else ("", [])
        rows = await self._read(
            f"SELECT {CHANNEL_SETTING_CHANGE.columns}"
            f" FROM channel_setting_audit {where} ORDER BY id DESC LIMIT ${len(args) + 1}",
            *args,
            limit,
        )
        return [CHANNEL_SETTING_CHANGE.record(r) for r in reversed(rows)]
