"""``agentik db copy FROM TO``: move a bot's database between engines (a single-box
SQLite bot to PostgreSQL and back), verified.

``FROM`` and ``TO`` are each a SQLite file, ``env:VAR`` (a PostgreSQL DSN read from
the environment variable ``VAR``) or ``postgres`` (the DSN in the configuration's
``[storage] dsn_env``).  A DSN is never taken from the command line (``ps`` and shell
histories show it) and never shown: messages name ``host:port/database`` only, and
any text that reaches the terminal has the DSN and its password removed.

Progress goes to stderr; the summary (rows, rows/s, conversations verified) to
stdout.  Exit status 0: copied and verified; 1: refused, failed or the verification
found a difference (the first one is named).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from agentik.core import ConfigError, SQLiteStore
from agentik.core.errors import AgentikError

from .config import Config

__all__ = ["Target", "copy_command", "parse_target"]


@dataclass(frozen=True, slots=True)
class Target:
    """One side of a copy: a SQLite file (``dsn`` None) or a PostgreSQL database."""

    shown: str  # safe to print
    path: str | None = None
    dsn: str | None = None

    def secrets(self) -> list[str]:
        """What must never be printed: the DSN and its password."""
        if self.dsn is None:
            return []
        out = [self.dsn]
        try:
            password = urlsplit(self.dsn).password
        except ValueError:
            password = None
        if password:
            out += [password, unquote(password)]
        for part in self.dsn.split():  # key=value DSNs
            if part.startswith("password="):
                out.append(part.removeprefix("password="))
        return [s for s in out if s]


def parse_target(text: str, config: Config, env: Any = None) -> Target:
    """``text`` (a command-line argument) as a :class:`Target`."""
    from agentik.core.store.postgres import describe_dsn

    env = os.environ if env is None else env
    if text.startswith(("postgres://", "postgresql://")) or (
        "=" in text and any(k in text for k in ("host=", "dbname=", "user=", "password="))
    ):
        raise ConfigError(
            "a PostgreSQL DSN on the command line would show its password (ps, shell"
            " history): put it in an environment variable and name it env:VAR"
        )
    if text == "postgres" or text.startswith("env:"):
        var = config.storage.dsn_env if text == "postgres" else text[4:]
        if not var:
            raise ConfigError(f"{text}: name the environment variable (env:AGENTIK_POSTGRES_DSN)")
        dsn = env.get(var, "").strip()
        if not dsn:
            raise ConfigError(
                f"{text}: environment variable {var} is not set (it holds the DSN,"
                " postgresql://agentik:PASSWORD@db.example.org/agentik)"
            )
        return Target(shown=f"PostgreSQL {describe_dsn(dsn)}", dsn=dsn)
    if text == ":memory:":
        raise ConfigError("an in-memory database has nothing to copy")
    return Target(shown=text, path=text)


def derived_columns(have: dict[str, list[str]], want: dict[str, list[str]]) -> dict[str, Any]:
    """What the destination's memory backend derives from a note that the source's
    does not keep: SQLite's ``scope_key`` (the scope as one full-text token), the
    PostgreSQL memory's ``tsv`` and ``words`` (the text's words and their count)."""
    mine, theirs = set(have.get("memory_note", ())), set(want.get("memory_note", ()))
    needed = [c for c in ("scope_key", "tsv", "words") if c in theirs and c not in mine]
    if not needed:
        return {}
    makers: dict[str, Any] = {}
    if "scope_key" in needed:
        from agentik.core.memory.sqlite import scope_key

        makers["scope_key"] = lambda row: scope_key(row["scope"])
    if "tsv" in needed or "words" in needed:
        # (The PostgreSQL memory backend's own tokenizer: its index, built as it builds it.)
        import importlib

        tsvector = importlib.import_module("agentik.core.memory.postgres").tsvector
        makers["tsv"] = lambda row: tsvector(row["text"])[0]
        makers["words"] = lambda row: tsvector(row["text"])[1]

    def fill(columns: list[str], rows: Any) -> tuple[list[str], list[tuple[Any, ...]]]:
        added = [c for c in needed if c in makers]
        out = []
        for r in rows:
            row = dict(zip(columns, r, strict=True))
            out.append((*r, *(makers[c](row) for c in added)))
        return [*columns, *added], out

    return {"memory_note": fill}


def _open(target: Target) -> Any:
    if target.dsn is not None:
        from agentik.core.store.postgres import PostgresStore

        return PostgresStore(target.dsn, pool_min=2, pool_max=4)
    assert target.path is not None
    return SQLiteStore(target.path, writer="thread")  # (imports are closures: the thread's)


def _clean(text: str, secrets: list[str]) -> str:
    for s in sorted(secrets, key=len, reverse=True):
        text = text.replace(s, "***")
    return text


def copy_command(
    source_text: str,
    target_text: str,
    config: Config,
    *,
    batch: int = 5000,
    skip_notes: bool = False,
    verify: bool = True,
) -> int:
    """Run ``agentik db copy``; the exit status."""
    source, target = parse_target(source_text, config), parse_target(target_text, config)
    if source.path is not None and not os.path.exists(source.path):
        raise ConfigError(f"{source.shown}: no such database")
    if source == target or (
        source.path is not None
        and target.path is not None
        and os.path.abspath(source.path) == os.path.abspath(target.path)
    ):
        raise ConfigError("FROM and TO are the same database")
    fresh = target.path is not None and not os.path.exists(target.path)
    copied: list[bool] = []
    try:
        return asyncio.run(
            _copy(source, target, batch=batch, skip_notes=skip_notes, verify=verify,
                  copied=copied)
        )  # fmt: skip
    finally:
        if fresh and not copied and target.path is not None:
            # A file this command created and could not fill: nothing half-made is left.
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(OSError):
                    os.remove(target.path + suffix)


async def _copy(
    source: Target,
    target: Target,
    *,
    batch: int,
    skip_notes: bool,
    verify: bool,
    copied: list[bool],
) -> int:
    from agentik.core.store.copy import CopyError, copy_store
    from agentik.core.store.copy import verify as verify_copy

    secrets = source.secrets() + target.secrets()

    def say(text: str) -> None:
        print(_clean(text, secrets), file=sys.stderr, flush=True)

    say(f"copying {source.shown} -> {target.shown}")
    src, dst = _open(source), _open(target)
    try:
        try:
            await src.start()
            await dst.start()
            derive = derived_columns(await src.copy_tables(), await dst.copy_tables())
            report = await copy_store(
                src, dst, batch=batch, skip_notes=skip_notes, derive=derive, progress=say
            )
            copied.append(True)
            rate = report.total / report.seconds if report.seconds > 0 else 0.0
            print(
                f"copied {report.total:,} rows in {report.seconds:.1f} s ({rate:,.0f} rows/s)"
                f" from {source.shown} to {target.shown}"
            )
            for t, n in report.left_out.items():
                print(f"left out: {n:,} rows of {t} (the destination does not keep them)")
            for t, n in report.unknown.items():
                print(f"not copied: {n:,} rows of {t} (a table db copy does not know)")
            if verify:
                say("verifying: every conversation exported from both sides and compared")
                started = time.monotonic()
                n = await verify_copy(src, dst, nul=(source.dsn or target.dsn) is not None,
                                      progress=say)  # fmt: skip
                print(
                    f"verified: {n:,} conversations and every table's row count alike"
                    f" ({time.monotonic() - started:.1f} s)"
                )
        except CopyError as exc:
            hint = ""
            if "not empty" in str(exc):
                hint = (
                    " (start fresh: a new SQLite path, or an empty PostgreSQL database:"
                    " createdb NAME, or DROP DATABASE and CREATE DATABASE)"
                )
            elif "verification failed" in str(exc):
                hint = " (was the bot still running on the source? stop it and copy again)"
            raise AgentikError(_clean(f"db copy: {exc}{hint}", secrets)) from None
        except AgentikError as exc:
            raise AgentikError(_clean(f"db copy: {exc}", secrets)) from None
        except Exception as exc:
            what = f"{type(exc).__name__}: {exc}"
            raise AgentikError(_clean(f"db copy failed: {what}", secrets)) from None
    finally:
        for store in (src, dst):
            try:
                await store.aclose()
            except Exception as exc:
                say(_clean(f"closing {type(store).__name__}: {exc}", secrets))
    return 0
