"""The ``agentik`` command line.

::

    agentik run -c FILE            start every configured transport
    agentik chat -c FILE           chat in this terminal (stdio transport only)
    agentik check -c FILE          validate the configuration, show what will run
    agentik conversations list     list stored conversations (-c FILE for the database)
    agentik conversations show ID  print a conversation's history
    agentik conversations export ID --format json|markdown
    agentik conversations import FILE [--new-ids|--keep-ids] [--bind CHANNEL]
    agentik conversations rm ID    delete a conversation and all its rows (--reflect:
                                   reflect on it first, with the configured model)
    agentik conversations redact ID MSG [--reason R]  replace a message by a tombstone
    agentik memory list            list long-term memory notes (--scope, --deleted)
    agentik memory show ID         print a note
    agentik memory history ID      every version of a note
    agentik memory rm ID           delete a note (restorable; --purge: for good)
    agentik memory restore ID VER  make an old version current again
    agentik memory add SCOPE TEXT  write a note (scope: global, channel:KEY, user:ID)
    agentik memory search WORDS    full-text search
    agentik memory reembed [--all] embed notes lacking a vector of the configured model
    agentik plugins                list loaded plugins and what they registered
    agentik mcp list               connect to each MCP server; show status and tools
    agentik status [--url URL]     ask a running bot: transports, conversations, uptime
    agentik access roles           roles: the configuration's and those given in chat
    agentik access audit           who changed which role, when (newest first)
    agentik access check ID        an identity's role and what it may do (--channel KEY)
    agentik access budgets         the configured budgets and a day's usage (--day)
    agentik access approvals       tool calls waiting for approval, and recent decisions
    agentik db backup [PATH]       a consistent copy of the database (safe while the bot runs)
    agentik db check               integrity, foreign keys, schema version (exit 1 on problems)
    agentik db vacuum              rebuild the file to reclaim free space
    agentik db migrate [--dry-run] apply (or list) pending schema migrations
    agentik db prune [--dry-run]   apply the [retention] rules now
    agentik db copy FROM TO        copy the whole database to another (SQLite file,
                                   env:VAR or postgres: a PostgreSQL DSN), verified
    agentik --version

``-c`` defaults to ``$AGENTIK_CONFIG``, else ``config.toml``.  Exit status:
0 success, 1 run-time failure, 2 configuration or usage error (one line on
stderr, no traceback).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import sqlite3
import sys
import time
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

from .gcpause import collector_paused

# Their objects live as long as the process: no collection while they load (see there);
# their dataclasses' methods are compiled once, not at every start (core.dataclasscode).
with collector_paused(freeze=True):
    from agentik.core.dataclasscode import dataclass_code_cached as _dataclass_code_cached

    with _dataclass_code_cached():
        from agentik.core import AgentikError, ConfigError, SQLiteStore, Store
        from agentik.core.errors import NotFound

        from .config import Config, MissingVar, load_config
        from .logs import setup_logging
        from .parts import access_policy, load_registry
        from .webhookscli import add_parser as webhooks_parser
        from .webhookscli import webhooks_command

__all__ = ["COMMANDS", "main"]

log = logging.getLogger("agentik.cli")

#: Every command and subcommand, documented in the manual, docs/ (a test checks).
CONVERSATION_REF = "a conversation id, a unique prefix of one, or a channel key (irc:libera:#ops)"

COMMANDS = (
    "run",
    "chat",
    "check",
    "conversations list",
    "conversations show",
    "conversations export",
    "conversations import",
    "conversations rm",
    "conversations redact",
    "memory list",
    "memory show",
    "memory history",
    "memory rm",
    "memory restore",
    "memory add",
    "memory search",
    "memory reembed",
    "plugins",
    "status",
    "mcp list",
    "access roles",
    "access audit",
    "access check",
    "access budgets",
    "access approvals",
    "db backup",
    "db check",
    "db vacuum",
    "db migrate",
    "db prune",
    "db copy",
    "webhooks dead-letters",
    "webhooks pending",
    "webhooks replay",
)


#: The sections each command reads.  A ``${VAR}`` that is not set in another
#: section (a Slack token for ``conversations list``) reads as empty instead
#: of stopping the command; ``check`` lists every missing one; ``run``, ``chat``,
#: ``plugins`` and ``mcp`` need them all (None).
_NEEDS: dict[str, frozenset[str] | None] = {
    "conversations": frozenset({"storage", "logging"}),
    "memory": frozenset({"storage", "memory", "logging"}),
    "db": frozenset({"storage", "logging", "retention", "memory"}),
    "access": frozenset(Config.model_fields) - {"transports", "llm", "mcp", "plugins"},
    "check": frozenset(),
    "webhooks": frozenset({"storage", "logging"}),
    # A running bot is asked where it listens; its secrets are not needed.
    "status": frozenset({"health", "logging"}),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agentik", description="Run an LLM agent as a chat bot.")
    p.add_argument("--version", action="version", version=f"agentik {version('agentik')}")
    p.add_argument(
        "-v", "--verbose", action="count", default=0, help="more logging (-v info, -vv debug)"
    )
    p.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="log level (overrides [logging] level)",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    def with_config(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sp.add_argument(
            "-c",
            "--config",
            default=os.environ.get("AGENTIK_CONFIG", "config.toml"),
            help="configuration file (default: $AGENTIK_CONFIG or config.toml)",
        )
        return sp

    with_config(sub.add_parser("run", help="start every configured transport"))
    with_config(sub.add_parser("chat", help="chat in this terminal"))
    chk = with_config(sub.add_parser("check", help="validate the configuration"))
    chk.add_argument(
        "--probe",
        action="store_true",
        help="also try each component: model endpoint, MCP servers, IRC hosts, Slack tokens",
    )
    chk.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="seconds each probe may take (default 10)",
    )
    conv = sub.add_parser("conversations", help="list, show, export or delete conversations")
    csub = conv.add_subparsers(dest="action", metavar="ACTION", required=True)
    lst = with_config(csub.add_parser("list", help="list conversations, most recent first"))
    lst.add_argument("--limit", type=int, default=50)
    lst.add_argument("--offset", type=int, default=0)
    with_config(csub.add_parser("show", help="print a conversation")).add_argument(
        "id", help=CONVERSATION_REF
    )
    exp = with_config(csub.add_parser("export", help="export a conversation"))
    exp.add_argument("id", help=CONVERSATION_REF)
    exp.add_argument("--format", choices=["json", "markdown"], default="json")
    rm = with_config(csub.add_parser("rm", help="delete a conversation"))
    rm.add_argument("id")
    rm.add_argument(
        "--reflect",
        action="store_true",
        help="first reflect on it with the configured model ([memory] reflection)",
    )
    red = with_config(
        csub.add_parser("redact", help="replace a message's text by a tombstone, everywhere")
    )
    red.add_argument("id", help=CONVERSATION_REF)
    red.add_argument("message", type=int, help="the message id (see conversations show)")
    red.add_argument("--reason", default="", help="why (kept in the tombstone and the audit)")
    red.add_argument("--by", default=None, help="who redacts (default: cli:$USER)")
    imp = with_config(
        csub.add_parser("import", help="restore a conversation from an export (JSON snapshot)")
    )
    imp.add_argument("file", help="the snapshot (agentik conversations export ID), - for stdin")
    ids = imp.add_mutually_exclusive_group()
    ids.add_argument("--new-ids", action="store_true", help="import under a fresh conversation id")
    ids.add_argument(
        "--keep-ids", action="store_true", help="keep the snapshot's conversation id (the default)"
    )
    imp.add_argument("--bind", metavar="CHANNEL", help="bind this channel key to it")
    mem = sub.add_parser("memory", help="inspect and edit long-term memory")
    memsub = mem.add_subparsers(dest="action", metavar="ACTION", required=True)
    ml = with_config(memsub.add_parser("list", help="list notes, most recently changed first"))
    ml.add_argument("--scope", action="append", help="only this scope (repeatable)")
    ml.add_argument("--deleted", action="store_true", help="include deleted notes")
    ml.add_argument("--limit", type=int, default=100)
    with_config(memsub.add_parser("show", help="print a note")).add_argument("id", type=int)
    with_config(memsub.add_parser("history", help="every version of a note")).add_argument(
        "id", type=int
    )
    mrm = with_config(memsub.add_parser("rm", help="delete a note (restorable)"))
    mrm.add_argument("id", type=int)
    mrm.add_argument("--purge", action="store_true", help="remove it and its history for good")
    mre = with_config(memsub.add_parser("restore", help="make an old version current again"))
    mre.add_argument("id", type=int)
    mre.add_argument("version", type=int)
    madd = with_config(memsub.add_parser("add", help="write a note"))
    madd.add_argument("scope", help="global, channel:<channel key> or user:<transport>:<id>")
    madd.add_argument("text")
    ms = with_config(
        memsub.add_parser("search", help="search notes ([memory] search: hybrid, fts or vector)")
    )
    ms.add_argument("query", nargs="+")
    ms.add_argument("--scope", action="append", help="only this scope (repeatable)")
    ms.add_argument("--limit", type=int, default=20)
    mreb = with_config(
        memsub.add_parser(
            "reembed",
            help="embed the notes whose vector is missing or from another model"
            " (after changing [memory] embeddings)",
        )
    )
    mreb.add_argument("--all", action="store_true", help="embed every note again")
    plugins = sub.add_parser("plugins", help="list plugins and what they registered")
    plugins.add_argument(
        "-c",
        "--config",
        default=None,
        help="configuration file, for [plugins] load (default: $AGENTIK_CONFIG, else"
        " config.toml if present, else none)",
    )
    st = sub.add_parser("status", help="ask a running bot how it is (health listener or HTTP API)")
    st.add_argument(
        "-c",
        "--config",
        default=None,
        help="configuration file: where the bot's health listener or HTTP API is"
        " (default: $AGENTIK_CONFIG or config.toml)",
    )
    st.add_argument(
        "--url",
        help="ask here instead: http://HOST:PORT (health listener), http://HOST:PORT/agentik"
        " (HTTP API) or unix:/path/to/health.sock",
    )
    st.add_argument("--json", action="store_true", help="print the answer as JSON")
    mcp = sub.add_parser("mcp", help="MCP servers")
    msub = mcp.add_subparsers(dest="action", metavar="ACTION", required=True)
    with_config(msub.add_parser("list", help="connect to each MCP server; show status and tools"))
    db = sub.add_parser("db", help="back up, check, vacuum or migrate the database")
    dsub = db.add_subparsers(dest="action", metavar="ACTION", required=True)
    with_config(
        dsub.add_parser("backup", help="a consistent copy (safe while the bot runs)")
    ).add_argument("path", nargs="?", help="where (default <db>.backup-<time>.db)")
    with_config(dsub.add_parser("check", help="integrity, foreign keys, schema version"))
    with_config(dsub.add_parser("vacuum", help="rebuild the file to reclaim free space"))
    dm = with_config(dsub.add_parser("migrate", help="apply pending schema migrations"))
    dm.add_argument("--dry-run", action="store_true", help="list them; change nothing")
    prune = with_config(
        dsub.add_parser("prune", help="apply the [retention] rules now (audit-log retention)")
    )
    prune.add_argument(
        "--dry-run",
        action="store_true",
        help="list what would go, per conversation; change nothing",
    )
    dc = with_config(
        dsub.add_parser(
            "copy",
            help="copy every row to another database (SQLite <-> PostgreSQL), then verify",
        )
    )
    for end, where in (("source", "copy from"), ("target", "copy into (must be empty)")):
        dc.add_argument(
            end,
            help=f"{where}: a SQLite file, env:VAR (a PostgreSQL DSN in that environment"
            " variable) or postgres (the DSN in [storage] dsn_env)",
        )
    dc.add_argument("--batch", type=int, default=5000, help="rows per transaction (5000)")
    dc.add_argument(
        "--skip-notes",
        action="store_true",
        help="leave memory notes behind when the destination keeps none",
    )
    dc.add_argument("--no-verify", action="store_true", help="skip the comparison afterwards")
    webhooks_parser(sub, with_config)
    acc = sub.add_parser("access", help="who may do what: roles, grants, audit, budgets, approvals")
    asub = acc.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, (helptext, arguments, _) in ACCESS_ACTIONS.items():
        arguments(with_config(asub.add_parser(name, help=helptext)))
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        if args.command == "plugins" and args.config is None:
            # Listing plugins needs no configuration file; it honours one if there is one.
            args.config = os.environ.get("AGENTIK_CONFIG") or (
                "config.toml" if os.path.exists("config.toml") else None
            )
        if args.command == "status" and args.config is None and args.url is None:
            args.config = os.environ.get("AGENTIK_CONFIG", "config.toml")
        if (
            args.command == "db"
            and args.action == "copy"
            and not os.path.exists(args.config)
            and "AGENTIK_CONFIG" not in os.environ
        ):
            # Two named databases need no configuration (``postgres`` reads its default).
            args.config = None
        missing: list[MissingVar] = []
        needs = _NEEDS.get(args.command)
        config = _load(args.config, needs, missing)
        level = args.log_level or (
            "debug" if args.verbose >= 2 else "info" if args.verbose == 1 else config.logging.level
        )
        setup_logging(level, config.logging.format, config.secrets())
        if args.command == "check":
            return _check(config, missing, probe=args.probe, timeout=args.timeout)
        return _dispatch(args, config)
    except ConfigError as exc:
        print(f"agentik: {exc}", file=sys.stderr)
        return 2
    except AgentikError as exc:
        print(f"agentik: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `agentik conversations list | head`: the reader has gone; no traceback, and
        # nothing more to write (stdout goes to /dev/null so the exit flush is quiet).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _load(path: str | None, needs: frozenset[str] | None, missing: list[MissingVar]) -> Config:
    if path is None:
        return Config()
    if not os.path.exists(path):
        # A first `agentik conversations list` after `make run` (which used
        # config.example.toml) lands here: say how to name the file.
        raise ConfigError(
            f"{path}: no such configuration file (name one with -c FILE or $AGENTIK_CONFIG;"
            " config.example.toml is a complete example to copy)"
        )
    try:
        return load_config(path, needs=needs, missing=missing)
    except ConfigError:
        if not missing:
            raise
        # An unset variable read as empty made another key invalid: the
        # variable is the problem to name.
        return load_config(path)


def _dispatch(args: argparse.Namespace, config: Config) -> int:
    if args.command == "db" and args.action == "copy":
        from .dbcopy import copy_command

        return copy_command(
            args.source, args.target, config, batch=max(1, args.batch),
            skip_notes=args.skip_notes, verify=not args.no_verify,
        )  # fmt: skip
    if args.command == "run":
        return asyncio.run(_run(config, only=None))
    if args.command == "chat":
        return asyncio.run(_run(config, only=["stdio"]))
    if args.command == "plugins":
        return _plugins(config)
    if args.command == "mcp":
        return asyncio.run(_mcp_list(config))
    if args.command == "status":
        return _status(args, config)
    if args.command == "db":
        return _db(args, config)
    if args.command == "access":
        return asyncio.run(ACCESS_ACTIONS[args.action][2](args, config))
    if args.command == "webhooks":
        _require_database(config)
        return asyncio.run(_webhooks(args, config))
    if args.command == "conversations" and args.action == "import":
        return asyncio.run(_import(args, config))
    if args.command == "memory":
        # Seeding notes before the first start is allowed: `memory add` creates the
        # database (migrated, as `agentik run` would) when it is not there yet; the
        # other memory commands only read or change what exists.
        if (
            config.memory.backend == "sqlite"
            and config.storage.backend == "sqlite"
            and args.action != "add"
            and not os.path.exists(config.database)
        ):
            raise ConfigError(
                f"{config.source}: storage.path: no database at {config.database}"
                " (nothing stored yet; `agentik memory add` or `agentik run` creates it)"
            )
        return asyncio.run(_memory(args, config))
    if not _postgres(config) and config.database != ":memory:":
        _require_database(config)
    return asyncio.run(_conversations(args, config))


async def _run(config: Config, *, only: list[str] | None) -> int:
    import contextlib
    import signal

    from .app import Bot

    if only is not None and not any(
        s.type in only and s.enabled for s in config.transports.values()
    ):
        from .config import TransportSection

        transports = dict(config.transports)
        transports["terminal"] = TransportSection(type="stdio")
        config = config.model_copy(update={"transports": transports})
    from .stopguard import StopGuard

    bot = Bot(config, only=only)
    # SIGTERM while the transports connect is a stop in order (serve() installs its
    # own handler for the same event), not the default "die at once, no IRC QUIT".
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, bot.stop_requested.set)
    # Whatever hangs, the process ends within stop_timeout (+ a grace): armed when the
    # stop begins, and left armed through the interpreter's exit (bot/stopguard.py).
    guard = StopGuard()

    def arm() -> None:
        guard.arm(config.supervision.stop_timeout, lambda: bot.closing_at or "stopping")

    async def arm_on_stop() -> None:
        await bot.stop_requested.wait()
        arm()

    watcher = asyncio.ensure_future(arm_on_stop())
    try:
        async with bot:
            try:
                await bot.serve()
            finally:
                arm()  # serve() ended (a stop, or every transport finished): the close follows
    finally:
        watcher.cancel()
    return 0


def _check(config: Config, missing: list[MissingVar], *, probe: bool, timeout: float) -> int:
    from .check import check

    return check(config, missing, probe=probe, timeout=timeout)


# -- agentik db -------------------------------------------------------------------------------


#: ``agentik db`` actions that are SQLite's own, and what does their work on PostgreSQL.
_POSTGRES_TOOLS = {
    "backup": "a backup there is pg_dump's: pg_dump --format=custom --file=agentik.dump"
    ' "$AGENTIK_POSTGRES_DSN" (pg_restore brings it back); or `agentik db copy postgres'
    " agentik-backup.db` for a SQLite file holding everything",
    "check": "PostgreSQL checks its own pages (initdb --data-checksums) and pg_amcheck checks"
    " tables and indexes: pg_amcheck --all; `agentik check --probe` shows the server and"
    " the schema version, `agentik db migrate --dry-run` what is pending",
    "vacuum": "PostgreSQL's autovacuum reclaims the space of deleted rows by itself; by hand:"
    " psql \"$AGENTIK_POSTGRES_DSN\" -c 'VACUUM (ANALYZE)' (VACUUM FULL gives the space back"
    " to the system, locking each table while it runs)",
}


def _db(args: argparse.Namespace, config: Config) -> int:
    from agentik.core.store import care
    from agentik.core.store.migrations import MIGRATIONS

    if _postgres(config):
        return _db_postgres(args, config)
    path = config.database
    if path == ":memory:":
        raise ConfigError(f"{config.source}: storage.path: is :memory:, there is no file")
    if not os.path.exists(path):
        raise ConfigError(f"{config.source}: storage.path: no database at {path}")
    if args.action == "prune":
        return asyncio.run(_db_prune(args, config, os.path.abspath(path)))
    if args.action == "backup":
        target = care.backup_database(path, args.path)
        print(f"backed up {path} to {target} ({os.path.getsize(target):,} bytes)")
        return 0
    if args.action == "check":
        report = care.check_database(path)
        print(f"database: {path}")
        print(f"schema version: {report.version} (this agentik knows {report.latest})")
        for note in report.notes:
            print(f"note: {note}")
        for problem in report.problems:
            print(f"problem: {problem}")
        if report.problems:
            n = len(report.problems)
            print(
                f"agentik: {path}: {n} problem{'s' if n > 1 else ''} found"
                " (restore a backup; docs/operations.md)",
                file=sys.stderr,
            )
            return 1
        print("ok: integrity check and foreign key check passed")
        return 0
    if args.action == "vacuum":
        before, after = care.vacuum_database(path)
        print(f"vacuumed {path}: {before:,} -> {after:,} bytes")
        return 0
    current, pending = care.pending_migrations(path)
    if not _migrations_to_apply(path, current, pending, MIGRATIONS, dry_run=args.dry_run):
        return 0

    async def migrate() -> None:
        async with SQLiteStore(path, synchronous=config.storage.synchronous, writer="thread"):
            pass

    asyncio.run(migrate())
    print(f"{path}: now at schema version {care.read_schema_version(path)}")
    return 0


def _migrations_to_apply(
    where: str, current: int, pending: Sequence[Any], known: Sequence[Any], *, dry_run: bool
) -> bool:
    """Say what ``agentik db migrate`` finds at ``where`` (schema ``current``, the
    ``pending`` migrations of the ``known`` ones); whether they are to be applied
    now (not when up to date or a dry run).  A schema newer than this agentik knows
    is an error."""
    latest = max((m.number for m in known), default=0)
    if current > latest:
        raise AgentikError(
            f"{where}: schema version {current} is newer than this agentik knows ({latest})"
        )
    if not pending:
        print(f"{where}: schema version {current}: up to date, nothing to migrate")
        return False
    verb = "would apply" if dry_run else "applying"
    print(f"{where}: schema version {current}; {verb} {len(pending)} migration(s):")
    for m in pending:
        print(f"  {m.number:>3} {m.name}")
    if dry_run:
        print("dry run: nothing was changed")
        return False
    return True


def _db_postgres(args: argparse.Namespace, config: Config) -> int:
    """``agentik db`` with ``[storage] backend = "postgres"``."""
    if args.action in _POSTGRES_TOOLS:
        raise ConfigError(
            f"`agentik db {args.action}` works on a SQLite file; the database is PostgreSQL"
            f" ({config.source}: storage.backend): {_POSTGRES_TOOLS[args.action]}"
        )
    if args.action == "prune":
        return asyncio.run(_db_prune(args, config, None))
    return asyncio.run(_db_migrate_postgres(args, config))


async def _db_migrate_postgres(args: argparse.Namespace, config: Config) -> int:
    from agentik.core.store.postgres import PostgresStore, pending_migrations
    from agentik.core.store.postgres_migrations import MIGRATIONS

    store = _store(config)
    assert isinstance(store, PostgresStore)
    where = store.where
    current, pending = await pending_migrations(store.dsn)
    if not _migrations_to_apply(where, current, pending, MIGRATIONS, dry_run=args.dry_run):
        return 0
    async with store:  # (migrations are applied as it starts, under an advisory lock)
        pass
    current, _ = await pending_migrations(store.dsn)
    print(f"{where}: now at schema version {current}")
    return 0


# -- agentik status ----------------------------------------------------------------------------


def _status_target(args: argparse.Namespace, config: Config) -> tuple[str, str | None]:
    """The ``/status`` URL to ask (``unix:PATH`` for a socket) and the token to send."""
    from .health import load_token

    token = os.environ.get("AGENTIK_TOKEN") or None
    if args.url:
        url = args.url.rstrip("/")
        return (url if url.startswith("unix:") else url + "/status"), token
    health = config.health
    if health.listen:
        listen = health.listen
        if token is None:
            token = load_token(health, resolve=config.resolve_path)
        if listen.startswith("unix:"):
            return "unix:" + config.resolve_path(listen[5:]), token
        host, _, port = listen.rpartition(":")
        host = host.strip("[]")
        if host in ("0.0.0.0", ""):
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/status", token
    for section in config.transports.values():
        if section.type == "http" and section.enabled:
            host = str(section.settings.get("host", "127.0.0.1"))
            if host in ("0.0.0.0", ""):
                host = "127.0.0.1"
            elif host == "::":
                host = "::1"
            port = os.environ.get("AGENTIK_PORT") or section.settings.get("port", 8080)
            prefix = section.settings.get("prefix", "/agentik")
            shown = f"[{host}]" if ":" in host else host
            return f"http://{shown}:{port}{prefix}/status", token
    raise ConfigError(
        f"{config.source}: health.listen: not set, and no http transport is enabled:"
        " nothing to ask (set [health] listen, or use --url)"
    )


def _status(args: argparse.Namespace, config: Config) -> int:
    # httpx2 is a declared dependency (the openai SDK and mcp speak HTTP through it);
    # httpx itself only comes with the dev extra, so a plain install has no httpx.
    import httpx2 as httpx

    url, token = _status_target(args, config)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    where = url
    try:
        if url.startswith("unix:"):
            path = url[5:]
            transport = httpx.HTTPTransport(uds=path)
            with httpx.Client(transport=transport, timeout=30) as client:
                response = client.get("http://agentik/status", headers=headers)
        else:
            with httpx.Client(timeout=30) as client:
                response = client.get(url, headers=headers)
    except httpx.HTTPError as exc:
        raise AgentikError(
            f"nothing answers at {where}: {exc or type(exc).__name__}"
            " (is the bot running, with [health] listen or the http transport?)"
        ) from None
    if response.status_code == 401:
        raise AgentikError(
            f"{where}: a token is needed (set AGENTIK_TOKEN, or [health] token_env/token_file)"
        )
    if response.status_code != 200:
        raise AgentikError(f"{where}: HTTP {response.status_code}: {response.text[:200]}")
    try:
        data = response.json()
    except ValueError:
        raise AgentikError(f"{where}: not an agentik status answer") from None
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(_status_text(data))
    return 0


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")]
    shown = [f"{n}{unit}" for n, unit in parts if n]
    return " ".join(shown[:2]) or "0s"


def _status_text(data: dict[str, Any]) -> str:
    ready = "ready" if data.get("ready") else "NOT READY"
    lines = [f"agentik {data.get('version', '?')}: {ready}, up {_duration(data.get('uptime', 0))}"]
    now = time.time()
    components = data.get("components") or {}
    for kind, title in (("transport", "transports"), ("mcp", "MCP servers"), ("model", "model")):
        found = {k: v for k, v in components.items() if k.startswith(kind + ":")}
        if not found:
            continue
        lines.append(f"{title}:")
        width = max(len(k.partition(":")[2]) for k in found)
        for key, entry in sorted(found.items()):
            name = key.partition(":")[2]
            since = _duration(now - float(entry.get("since") or now))
            kind_of = f"{entry['type']:<6} " if entry.get("type") else ""
            line = f"  {name:<{width}}  {kind_of}{entry.get('state', '?'):<12}  for {since}"
            if entry.get("reason"):
                line += f"  ({entry['reason']})"
            lines.append(line)
    conv = data.get("conversations") or {}
    lines.append(
        f"conversations: {conv.get('busy', 0)} busy, {conv.get('queued', 0)} queued messages"
    )
    for c in conv.get("active") or []:
        where = c.get("channel_key") or "-"
        state = "busy" if c.get("busy") else "idle"
        lines.append(f"  {c.get('id')}  {where}  {state}, {c.get('queued', 0)} queued")
    lines += _cluster_text(data.get("cluster") or {})
    return "\n".join(lines)


def _cluster_text(cluster: dict[str, Any]) -> list[str]:
    """The workers sharing a PostgreSQL database, and who owns which connection (one
    process on its own store shows none of it)."""
    if not cluster.get("shared"):
        return []
    owns = ", ".join(cluster.get("owns") or []) or "no connection"
    draining = " (draining)" if cluster.get("draining") else ""
    lines = [f"worker {cluster.get('worker')}{draining}: owns {owns}", "workers:"]
    for w in cluster.get("workers") or []:
        state = "alive" if w.get("alive") else "silent"
        if w.get("draining"):
            state += ", draining"
        lines.append(
            f"  {w.get('id')}  {state}, last heartbeat {w.get('last_beat_age', 0):.1f} s ago"
        )
    lines.append("connections:")
    for name, c in sorted((cluster.get("connections") or {}).items()):
        owner = c.get("owner") or f"none (last {c.get('last_owner')})"
        lines.append(f"  {name}  owner {owner}, epoch {c.get('epoch')},"
                     f" expires in {c.get('expires_in', 0):.1f} s")  # fmt: skip
    return lines


# -- agentik access ----------------------------------------------------------------------------
# Each action: (help, add its arguments, run it).  Add a line to extend the group.


def _no_arguments(sp: argparse.ArgumentParser) -> None:
    pass


def _audit_arguments(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--limit", type=int, default=50, help="how many changes (default 50)")


def _check_arguments(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("identity", help="an identity: libera:account:alice, slack:T1:U2, ...")
    sp.add_argument("--channel", default="", help="a channel key (rules depend on it)")


async def _access_policy(config: Config, *, need_db: bool) -> Any:
    """The configuration's access policy, with the grants of its database (if there is one)."""
    policy = access_policy(config)
    if _has_database(config):
        async with _store(config) as store:
            await policy.load(store)
        policy.forget_store()
    elif need_db:
        raise ConfigError(f"{config.source}: storage.path: no database at {config.database}")
    return policy


def _postgres(config: Config) -> bool:
    return config.storage.backend == "postgres"


def _has_database(config: Config) -> bool:
    """Whether there is a database to read: a SQLite file, or PostgreSQL (always: a
    database that is not there is an error when it is opened)."""
    if _postgres(config):
        return True
    return config.database != ":memory:" and os.path.exists(config.database)


def _require_database(config: Config) -> None:
    if not _has_database(config):
        raise ConfigError(f"{config.source}: storage.path: no database at {config.database}")


def _store(config: Config) -> Store:
    """The configuration's store (not started): the SQLite file, or PostgreSQL at the DSN
    in ``[storage] dsn_env`` (the builder reads it; never shown)."""
    if _postgres(config):
        from .builder import build_store

        return build_store(config)
    # A command writes a few rows: not worth starting a writer process.
    return SQLiteStore(config.database, synchronous=config.storage.synchronous, writer="thread")


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


async def _access_roles(args: argparse.Namespace, config: Config) -> int:
    policy = await _access_policy(config, need_db=False)
    out = [f"{role:<10} {pattern}  (configuration)" for pattern, role in policy.config_roles()]
    for g in sorted(policy.grants.values(), key=lambda g: g.identity):
        out.append(f"{g.role:<10} {g.identity}  (given by {g.granted_by}, {_when(g.granted_at)})")
    for name, role in policy.settings.roles.items():
        out.append(f"role {name}: ranks as {role.rank}")
    print("\n".join(out) if out else "no roles configured or given: everyone is a user")
    return 0


async def _access_audit(args: argparse.Namespace, config: Config) -> int:
    _require_database(config)
    async with _store(config) as store:
        changes = await store.access_audit(limit=args.limit)
    for c in changes:
        where = f" in {c.channel}" if c.channel else ""
        print(_printable(f"{_when(c.at)}  {c.actor}: {c.identity} {c.old_role or '-'} → "
                         f"{c.new_role or '-'}{where}"))  # fmt: skip
    if not changes:
        print("no role changes recorded")
    return 0


async def _access_check(args: argparse.Namespace, config: Config) -> int:
    policy = await _access_policy(config, need_db=False)
    try:
        who = policy.identity_from_key(args.identity)
    except ValueError as exc:
        raise ConfigError(f"identity: {exc}") from None
    role = policy.role_of(who)
    d = policy.decide(role, args.channel)
    section = config.transports.get(who.transport)
    bound = getattr(section, "allowed_tools", None) if section is not None else None
    outer = config.tools.allowed if bound is None else list(bound)
    commands = [n for n in (*_chat_commands(), "stop-others") if d.may_command(n)]
    if not (who.verified and policy.at_least(role, config.agent.settings_role)):
        # !set and !unset also need [agent] settings_role (and a verified identity).
        commands = [n for n in commands if n not in ("set", "unset")]
    print(f"identity: {args.identity} ({'verified' if who.verified else 'hostmask only'})")
    print(f"role: {role}" + (f" in {args.channel}" if args.channel else ""))
    print(f"answered: {'yes' if d.answer else 'no'}")
    mine = "all" if d.tools is None else ", ".join(d.tools.patterns) or "none"
    print(f"tools: {mine}" + (f" (within the transport's {', '.join(outer)})" if outer else ""))
    print(f"commands: {', '.join(commands) or 'none'}")
    return 0


def _chat_commands() -> tuple[str, ...]:
    from .bridge import COMMANDS as CHAT

    return tuple(CHAT)


async def _aclose(obj: Any) -> None:
    await obj.aclose()


async def _mcp_list(config: Config) -> int:
    from .builder import mcp_toolset

    toolset = mcp_toolset(config)
    if toolset is None:
        print("no MCP servers configured ([[mcp.servers]])")
        return 0
    await toolset.start()
    try:
        await toolset.refresh()  # lazy servers connect too
        failed = 0
        for server in toolset.status():
            state = server.get("state")
            failed += state == "failed"
            line = f"{server['name']}: {state}"
            if server.get("error"):
                line += f" ({server['error']})"
            print(line)
            for name in server.get("tools") or ():
                print(f"  {name}")
    finally:
        await toolset.aclose()
    return 1 if failed else 0


def _plugins(config: Config) -> int:
    registry = load_registry(config)
    for p in registry.plugins:
        where = f"{p.distribution} {p.version}" if p.distribution else "(not packaged)"
        kind = "built-in" if p.builtin else "plugin"
        print(f"{p.name:<16} {kind:<9} {where}")
    print("llm backends: " + ", ".join(sorted(registry.llm_backends)))
    print("transports:   " + ", ".join(sorted(registry.transports)))
    print("tools:        " + (", ".join(t.name for t in registry.tools) or "-"))
    return 0


async def _rm_reflecting(args: argparse.Namespace, config: Config) -> int:
    """``conversations rm --reflect``: delete through the agent, so the memory
    worker reflects on the conversation (within ``[memory] reflect_on_shutdown``)."""
    from .builder import AgentBuilder

    agent = AgentBuilder.from_config(config, load_registry(config)).build()
    await agent.start()
    try:
        await agent.delete_conversation(args.id)
        await agent.wind_down()
    finally:
        await agent.aclose()
    print(f"deleted {args.id}")
    return 0


async def _conversations(args: argparse.Namespace, config: Config) -> int:
    if args.action == "rm" and args.reflect:
        return await _rm_reflecting(args, config)
    async with _store(config) as store:
        if args.action == "list":
            records = await store.list_conversations(limit=args.limit, offset=args.offset)
            bound = await _bindings(store, [r.id for r in records])
            for r in records:
                n = await store.count_messages(r.id)
                when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.updated_at))
                # A child run's conversation (an agent called as a tool) is marked.
                parent = r.meta.get("parent_conversation_id")
                mark = f"  ↳ child of {parent} ({r.meta.get('agent')})" if parent else ""
                # The channel(s) whose messages go to this conversation now.
                mark += "".join(f"  ← {key}" for key in bound.get(r.id, ()))
                print(_printable(f"{r.id}  {when}  {n:>6} msgs  {r.title}{mark}"))
            return 0
        if args.action in ("show", "export", "redact"):
            args.id = await _resolve_conversation(store, args.id)
        record = await store.get_conversation(args.id)
        if record is None:
            raise NotFound(f"no conversation {args.id!r}")
        if args.action == "rm":
            await store.delete_conversation(args.id)
            print(f"deleted {args.id}")
            return 0
        if args.action == "redact":
            return await _redact(store, args)
        messages = []
        after = 0
        while True:
            page = await store.messages(args.id, after=after, limit=1000)
            if not page:
                break
            messages.extend(page)
            after = page[-1].id
        if args.action == "export" and args.format == "json":
            from agentik.core.lifecycle import export_conversation

            # The versioned snapshot that ``conversations import`` restores.
            doc = await export_conversation(store, args.id)
            print(json.dumps(doc, ensure_ascii=False, indent=2))
            return 0
        markdown = args.action == "export"
        if markdown:
            print(f"# {_printable(record.title or record.id)}\n")
        for m in messages:
            print(_render_message(m, markdown=markdown))
        if not markdown:
            tree = await _run_tree(store, args.id, messages)
            if tree:
                print("run tree:")
                print("\n".join(tree))
        return 0


async def _bindings(store: Store, ids: list[str]) -> dict[str, list[str]]:
    """The channel keys bound to each of ``ids`` (a channel is bound to one conversation)."""
    found: dict[str, list[str]] = {}
    for cid in ids:
        rows = (await store.export_rows(cid)).get("bindings") or []
        keys = sorted(r["channel_key"] for r in rows)
        if keys:
            found[cid] = keys
    return found


async def _conversations_with_prefix(store: Store, prefix: str) -> list[str]:
    """Up to 6 conversation ids starting with ``prefix``, in order."""
    if isinstance(store, SQLiteStore):  # (an index search, where the engine has one)
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = await store.run_read(
            "SELECT id FROM conversation WHERE id LIKE ? ESCAPE '\\' ORDER BY id LIMIT 6",
            (escaped + "%",),
        )
        return [str(r[0]) for r in rows]
    found: list[str] = []
    offset = 0
    while True:  # every conversation, a page at a time
        page = await store.list_conversations(limit=1000, offset=offset)
        found += [r.id for r in page if r.id.startswith(prefix)]
        if len(page) < 1000:
            return sorted(found)[:6]
        offset += len(page)


async def _resolve_conversation(store: Store, ref: str) -> str:
    """``ref`` as a conversation id: a whole id, a unique prefix of one (as git takes
    short hashes), or a channel key (``irc:libera:#ops``: the conversation that channel
    is bound to now).  An ambiguous prefix is an error listing the candidates; ``rm``
    does not come through here: deleting takes a whole id."""
    if not ref or await store.get_conversation(ref) is not None:
        return ref
    if ":" in ref:
        bound = await store.get_binding(ref)
        if bound is None:
            raise NotFound(f"no conversation is bound to channel {ref!r}")
        return bound
    rows = await _conversations_with_prefix(store, ref)
    if not rows:
        raise NotFound(f"no conversation {ref!r}")
    if len(rows) > 1:
        shown = ", ".join(rows[:5]) + (", …" if len(rows) > 5 else "")
        raise AgentikError(
            f"conversation prefix {ref!r} is ambiguous: it matches {shown}; give more characters"
        )
    return rows[0]


async def _redact(store: Store, args: argparse.Namespace) -> int:
    """``conversations redact``: on the database (a running bot's cached context of
    that conversation is not reached: redact through the bot while it runs)."""
    from agentik.core.attachments import hashes_of
    from agentik.core.redaction import tombstone

    by = args.by or f"cli:{os.environ.get('USER') or 'operator'}"
    at = time.time()
    rows = await store.messages(args.id, after=args.message - 1, limit=1)
    done = await store.redact_message(
        args.id, args.message, content=tombstone(by, at, args.reason), by=by,
        reason=args.reason, at=at,
    )  # fmt: skip
    if done is None:
        raise NotFound(f"conversation {args.id!r} has no message {args.message}")
    attached = hashes_of(rows[0].data) if rows and rows[0].id == args.message else []
    if attached:  # its images and files go with it
        await store.attachment_drop(args.id, attached)
    extra = f"; {done.notes_removed} derived memory note(s) removed" if done.notes_removed else ""
    print(f"redacted message {done.message_id} of {done.conversation_id}{extra}")
    return 0


def _tokens(usage: dict[str, int] | None) -> str:
    if not usage:
        return ""
    total = usage.get("total_tokens") or usage.get("prompt_tokens", 0) + usage.get(
        "completion_tokens", 0
    )
    return f" · {total} tokens"


async def _run_tree(store: Store, conversation_id: str, messages: list[Any]) -> list[str]:
    """The run tree of a conversation: its runs, their tool calls and, under each
    agent call, the child run it started (recursively), with stop reasons and usage."""
    runs = await store.runs(conversation_id)
    if not runs:
        return []
    lines: list[str] = []
    children: dict[str | None, list[Any]] = {}
    for r in runs:
        children.setdefault(r.parent_call_id if r.parent_run_id else None, []).append(r)

    def head(r: Any) -> str:
        who = r.agent or "main"
        return f"{r.run_id} {who}: {r.stop_reason or 'running'}{_tokens(r.usage)}"

    async def calls(run_id: str, msgs: list[Any], kids: dict[str | None, list[Any]],
                    indent: str) -> None:  # fmt: skip
        for m in msgs:
            if m.kind != "tool_call" or m.run_id != run_id:
                continue
            started = kids.get(m.tool_call_id, [])
            if not started:
                lines.append(f"{indent}· {m.tool_name} [{m.tool_call_id}]")
            for child in started:
                where = f" · conversation {child.conversation_id}" if child.conversation_id else ""
                lines.append(f"{indent}└ {m.tool_name} [{m.tool_call_id}] → {head(child)}{where}")
                if child.conversation_id:
                    await subtree(child, indent + "    ")

    async def subtree(run: Any, indent: str) -> None:
        sub = await store.runs(run.conversation_id)
        kids: dict[str | None, list[Any]] = {}
        for r in sub:
            if r.parent_run_id == run.run_id:
                kids.setdefault(r.parent_call_id, []).append(r)
        msgs = await store.messages(run.conversation_id, kinds=["tool_call"], limit=10_000)
        await calls(run.run_id, msgs, kids, indent)

    by_run = {r.run_id: r for r in runs}
    for r in runs:
        if r.conversation_id != conversation_id:
            continue
        if r.parent_run_id is None:
            lines.append(f"{r.run_id} (main): {r.stop_reason or 'running'}{_tokens(r.usage)}")
        else:
            parent = by_run.get(r.parent_run_id)
            up = f" (child of {r.parent_run_id} in {r.parent_conversation_id})"
            lines.append(head(r) + ("" if parent else up))
        kids: dict[str | None, list[Any]] = {
            call: [c for c in started if c.parent_run_id == r.run_id]
            for call, started in children.items()
            if call is not None
        }
        await calls(r.run_id, messages, kids, "  ")
    return lines


async def _import(args: argparse.Namespace, config: Config) -> int:
    from agentik.core.lifecycle import SnapshotError, import_conversation

    where = "standard input" if args.file == "-" else args.file
    try:
        if args.file == "-":
            text = sys.stdin.read()
        else:
            text = await asyncio.to_thread(Path(args.file).read_text, encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {where}: {exc}") from exc
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not JSON: {exc}") from exc
    async with _store(config) as store:
        try:
            result = await import_conversation(store, doc, new_ids=args.new_ids, bind=args.bind)
        except SnapshotError as exc:
            raise ConfigError(f"{where}: {exc}") from exc
    print(f"imported {result.conversation_id} ({result.messages} messages)")
    for key in result.bound:
        print(f"bound {key}")
    for key in result.skipped_bindings:
        print(f"not bound {key}: that channel is bound to another conversation here")
    return 0


async def _db_prune(args: argparse.Namespace, config: Config, path: str | None) -> int:
    """``agentik db prune``: on SQLite (``path``: its file) or, ``path`` None, PostgreSQL."""
    from agentik.core.lifecycle import (
        apply_retention,
        count_old_notes,
        note_scopes,
        plan_retention,
        purge_old_notes,
    )

    rules = config.retention.rules
    if not rules:
        print("no [retention] rules: nothing to prune")
        return 0
    if args.dry_run and path is None:
        async with _store(config) as reading:
            items = await plan_retention(reading, rules)
            notes = {}  # (memory notes are not kept in PostgreSQL)
    elif args.dry_run:
        assert path is not None
        # A read-only connection: the database file is not written at all.
        uri = "file:" + path + "?mode=ro"
        conn = sqlite3.connect(uri, uri=True)
        try:

            async def read(sql: str, params: Any = ()) -> list[Any]:
                return conn.execute(sql, tuple(params)).fetchall()

            items = await plan_retention(read, rules)
            notes = await count_old_notes(read, await note_scopes(read, rules))
        finally:
            conn.close()
    else:
        llm = None
        if any(r.action == "summarise" for r in rules):
            from .builder import resolve_backend

            llm = resolve_backend(config, load_registry(config))
        store = _store(config)
        async with store:
            items = await apply_retention(store, config.retention, llm=llm)
            notes = {}
            scopes = await note_scopes(store, rules)
            kept = config.memory.backend != "none" and not (
                _postgres(config) and config.memory.backend == "sqlite"
            )
            if scopes and kept:
                from agentik.core.memory.markdown import MarkdownMemory
                from agentik.core.memory.sqlite import SQLiteMemory

                memory: Any = (
                    SQLiteMemory(store)  # type: ignore[arg-type]
                    if config.memory.backend == "sqlite"
                    else MarkdownMemory(config.resolve_path(config.memory.path))
                )
                await memory.start()
                try:
                    notes = await purge_old_notes(memory, scopes)
                finally:
                    await memory.aclose()
    total = 0
    for item in items:
        total += item.messages
        verb = "would " + item.action if args.dry_run else item.action
        if item.error:
            verb = f"left as it was ({item.error}); wanted to {item.action}"
        keys = ", ".join(item.channel_keys) or "-"
        print(
            f"{item.conversation_id}  {keys}  {verb} {item.messages} messages"
            f" (older than {item.keep_days:g} days, rule {item.pattern!r})"
        )
    for scope, n in notes.items():
        print(f"{scope}  {'would purge' if args.dry_run else 'purged'} {n} memory notes")
    errors = sum(1 for i in items if i.error)
    pruned = total - sum(i.messages for i in items if i.error)
    verb = "would prune" if args.dry_run else "pruned"
    print(f"{verb} {pruned} messages in {len(items) - errors} conversations")
    return 1 if errors else 0


async def _memory(args: argparse.Namespace, config: Config) -> int:
    from agentik.core.memory import NoteError, valid_scope
    from agentik.core.memory.markdown import MarkdownMemory
    from agentik.core.memory.sqlite import SQLiteMemory

    backend = config.memory.backend
    if backend == "none":
        raise ConfigError(f'{config.source}: memory.backend: is "none": there is no memory')
    store: Any = None
    memory: Any
    if backend == "sqlite":  # the conversations' database: SQLite or PostgreSQL
        from agentik.core.memory.embeddings import EmbeddingError, embedder_for

        from .builder import build_store, database_memory

        try:
            embedder = embedder_for(config.memory)
        except EmbeddingError as exc:
            raise ConfigError(f"{config.source}: memory: {exc}") from None
        store = build_store(config)
        await store.start()
        memory = database_memory(store, embedder=embedder, search=config.memory.search)
    else:
        memory = MarkdownMemory(config.resolve_path(config.memory.path))
    try:
        await memory.start()
        who = f"cli:{os.environ.get('USER') or 'admin'}"
        a = args.action
        if a == "reembed":
            if not isinstance(memory, SQLiteMemory):
                raise ConfigError(
                    f"{config.source}: memory.backend: reembed needs the sqlite backend"
                )
            if memory.embedder is None:
                raise ConfigError(
                    f'{config.source}: memory.embeddings: is "none": nothing to embed'
                )
            from agentik.core.memory.embeddings import EmbeddingError

            try:
                done = await memory.reembed(everything=args.all)
            except EmbeddingError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
            print(f"embedded {done} notes with {memory.embedder.model}")
        elif a == "list":
            notes = await memory.list(args.scope, limit=args.limit, include_deleted=args.deleted)
            for n in notes:
                print(_note_line(n))
            if not notes:
                print("no notes")
        elif a == "search":
            for n in await memory.search(" ".join(args.query), args.scope, limit=args.limit):
                print(_note_line(n))
        elif a == "add":
            try:
                scope = valid_scope(args.scope)
            except NoteError as exc:
                raise ConfigError(str(exc)) from None
            note = await memory.save(scope, args.text, author=who)
            print(f"saved note #{note.id} in {note.scope}")
        elif a == "show":
            n = await memory.get(args.id, include_deleted=True)
            if n is None:
                raise NotFound(f"no note #{args.id}")
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(n.updated_at))
            state = " (deleted)" if n.deleted else ""
            print(
                _printable(
                    f"#{n.id} {n.scope} version {n.version}{state} · {when} · {n.author or '-'}"
                )
            )
            print(_printable(n.text))
        elif a == "history":
            versions = await memory.history(args.id)
            if not versions:
                raise NotFound(f"no note #{args.id}")
            for v in versions:
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(v.created_at))
                print(_printable(f"version {v.version} · {v.op} · {when} · {v.author or '-'}"))
                print("  " + _printable(v.text).replace("\n", "\n  "))
        elif a == "rm":
            ok = await (memory.purge(args.id) if args.purge else memory.delete(args.id, author=who))
            if not ok:
                raise NotFound(f"no note #{args.id} (or already deleted)")
            print(f"{'purged' if args.purge else 'deleted'} note #{args.id}")
        elif a == "restore":
            try:
                n = await memory.restore(args.id, args.version, author=who)
            except NoteError as exc:
                raise NotFound(str(exc)) from None
            print(f"note #{n.id} is now version {n.version} (text of version {args.version})")
    finally:
        await memory.aclose()
        if store is not None:
            await store.aclose()
    return 0


def _budgets_arguments(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--day", help="a UTC day, YYYY-MM-DD (default: today)")


async def _webhooks(args: argparse.Namespace, config: Config) -> int:
    async with _store(config) as store:
        return await webhooks_command(args, store)


async def _access_budgets_in_database(args: argparse.Namespace, config: Config) -> int:
    if not _has_database(config):
        raise ConfigError(f"{config.source}: storage.path: no database at {config.database}")
    return await _access_budgets(args, config)


def _approvals_arguments(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--pending", action="store_true", help="only those still waiting")
    sp.add_argument("--limit", type=int, default=20, help="recent decisions shown (default 20)")


async def _access_budgets(args: argparse.Namespace, config: Config) -> int:
    import calendar

    from agentik.core.budgets import KINDS, BudgetLimits, window

    b = config.budgets
    if args.day:
        try:
            day = calendar.timegm(time.strptime(args.day, "%Y-%m-%d"))
        except ValueError:
            raise ConfigError(f"--day: not a date (YYYY-MM-DD): {args.day!r}") from None
    else:
        day = window("tokens", time.time())

    def limits(lim: BudgetLimits) -> str:
        if lim == BudgetLimits():
            return "unlimited"
        return ", ".join(
            f"{n:,} {what}" if n else f"unlimited {what}"
            for n, what in ((lim.messages_per_minute, "messages/minute"),
                            (lim.tokens_per_day, "tokens/day"),
                            (lim.tool_calls_per_day, "tool calls/day"))
        )  # fmt: skip

    print("budgets ([budgets]; windows are UTC minutes and UTC days):")
    tables = [("owner", b.owner), ("admin", b.admin), ("user", b.user)]
    tables += [(f"role {name}", lim) for name, lim in sorted(b.roles.items())]
    tables += [("channel", b.channel)]
    u = b.unverified
    unverified = ", ".join(
        f"{what} as their role" if n is None else f"{n:,} {what}" if n else f"unlimited {what}"
        for n, what in ((u.messages_per_minute, "messages/minute"),
                        (u.tokens_per_day, "tokens/day"),
                        (u.tool_calls_per_day, "tool calls/day"))
    )  # fmt: skip
    for name, lim in tables:
        print(f"  {name}: {limits(lim)}")
    print(f"  unverified: {unverified}")
    async with _store(config) as store:
        rows = await store.budget_rows(day)
    usage: dict[tuple[str, str], dict[str, int]] = {}
    for scope, subject, kind, start, amount in rows:
        # Message counters are per minute (kept an hour): not a day's usage.
        if kind != "messages" and start == day:
            usage.setdefault((scope, subject), dict.fromkeys(KINDS, 0))[kind] += amount
    when = time.strftime("%Y-%m-%d", time.gmtime(day))
    if not usage:
        print(f"usage on {when} (UTC): none")
        return 0
    print(f"usage on {when} (UTC):")
    for (scope, subject), used in sorted(usage.items()):
        print(
            f"  {scope:<10} {subject}: {used['tokens']:,} tokens, {used['tool_calls']:,} tool calls"
        )
    return 0


async def _access_approvals(args: argparse.Namespace, config: Config) -> int:
    """``agentik access approvals``: the pending approvals, then the latest decisions."""
    async with _store(config) as store:
        pending = await store.approvals(state="pending")
        decided = (
            []
            if args.pending
            else await store.approvals(
                state="resolved", limit=max(0, args.limit), newest_first=True
            )
        )
    now = time.time()
    print(f"waiting for approval: {len(pending) or 'none'}")
    for a in pending:
        left = a.expires_at - now
        due = f"expires in {left / 60:.0f} min" if left > 0 else "expired (not yet recorded)"
        print(f"  {_approval_line(a)}  {due}")
    if not args.pending:
        print(f"recent decisions: {len(decided) or 'none'}")
        for a in decided:
            by = f" by {a.approver_id or a.approver}" if (a.approver_id or a.approver) else ""
            why = f": {a.reason}" if a.reason else ""
            print(f"  {_approval_line(a)}  {a.decision}{by}{why}")
    return 0


def _approval_line(a: Any) -> str:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(a.created_at))
    args = a.arguments if len(a.arguments) <= 80 else a.arguments[:79] + "…"
    where = a.channel_key or a.conversation_id
    return f"{a.id:<4} {when}  {where}  {a.tool}({args})  asked by {a.asker_id or a.asker or '-'}"


#: What chat or model text must not bring to the operator's terminal: C0 controls
#: but tab and line feed (ESC starts a command), DEL, C1, and the bidirectional
#: overrides that make a line read otherwise than it is.
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _printable(text: str | None) -> str:
    """``text`` (from a chat, a model, a snapshot) safe to print: its control
    characters shown as escapes (``\\x1b``), never sent to the terminal."""
    return _UNPRINTABLE.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                            else f"\\u{ord(m.group()):04x}", text or "")  # fmt: skip


def _note_line(n: Any) -> str:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(n.updated_at))
    text = " ".join(n.text.split())
    text = text if len(text) <= 100 else text[:99] + "…"
    state = " [deleted]" if n.deleted else ""
    return _printable(f"#{n.id:<5} {when}  {n.scope}  v{n.version}{state}  {text}")


def _render_message(m: Any, *, markdown: bool) -> str:
    who = {"user": m.author or "user", "assistant": "assistant"}.get(m.kind, m.kind)
    if m.kind == "tool_call":
        body = f"{m.tool_name}({m.arguments})"
    elif m.kind == "tool_result":
        body = f"{m.tool_name} → {m.content}"
    else:
        body = m.content
    if m.status != "complete":
        body += f" [{m.status}]"
    who, body = _printable(who), _printable(body)
    if markdown:
        return f"**{who}**: {body}\n"
    when = time.strftime("%H:%M:%S", time.localtime(m.created_at))
    return f"[{when}] {who}: {body}"


#: ``agentik access <action>``: help, its arguments, what it runs.
ACCESS_ACTIONS: dict[str, tuple[str, Any, Any]] = {
    "roles": ("roles from the configuration and given in chat", _no_arguments, _access_roles),
    "audit": ("who changed which role, when", _audit_arguments, _access_audit),
    "check": ("an identity's role and what it may do", _check_arguments, _access_check),
    "budgets": (
        "the configured budgets and a day's usage",
        _budgets_arguments,
        _access_budgets_in_database,
    ),
    "approvals": (
        "tool calls waiting for approval, and recent decisions",
        _approvals_arguments,
        _access_approvals,
    ),
}


if __name__ == "__main__":
    sys.exit(main())
