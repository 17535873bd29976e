"""The ``agentik`` commands on a bot whose store is PostgreSQL (``[storage] backend =
"postgres"``): conversations, access and db work through the store; the SQLite file
tools say what does their work on PostgreSQL.  The installed command, a real server
(tests/pgserver.py), the database filled through the store API."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from test_db_copy import BIG, seed

from agentik.core.store.postgres import PostgresStore, describe_dsn
from helpers import agentik

pytest_plugins = ["pgserver"]

PASSWORD = "pg-pa55word-never-shown"


def write_config(tmp_path: Path, extra: str = "") -> str:
    path = tmp_path / "bot.toml"
    path.write_text(
        '[storage]\nbackend = "postgres"\ndsn_env = "BOT_DSN"\n[memory]\nbackend = "none"\n'
        + extra,
        encoding="utf-8",
    )
    return str(path)


@pytest.fixture
def bot(tmp_path, postgres_dsn) -> Any:
    """``run(*args)``: the command against a seeded PostgreSQL bot; its DSN holds a
    password (the test server trusts, so it is not checked) that must never show."""
    asyncio.run(_seed(postgres_dsn))
    dsn = postgres_dsn.replace("://agentik@", f"://agentik:{PASSWORD}@")
    config = write_config(tmp_path)

    def run(*args: str, config: str = config) -> Any:
        result = agentik(*args, "-c", config, cwd=tmp_path, env={"BOT_DSN": dsn})
        assert PASSWORD not in result.stdout + result.stderr
        assert "Traceback" not in result.stderr
        return result

    run.dsn = postgres_dsn  # type: ignore[attr-defined]
    return run


async def _seed(dsn: str) -> None:
    async with PostgresStore(dsn) as store:
        await seed(store)


def test_conversations_list_show_and_export(bot):
    listed = bot("conversations", "list")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["c-main", "c-big", "c-child"]
    assert "← irc:libera:#ops  ← slack:T1:C1" in lines[0]
    assert f"{BIG:>6} msgs" in lines[1]
    assert "↳ child of c-main (researcher)" in lines[2]
    # By a unique prefix, and by a channel key.
    shown = bot("conversations", "show", "c-m")
    assert shown.returncode == 0, shown.stderr
    assert "still there?" in shown.stdout and "[redacted by ops]" in shown.stdout
    assert "r1 (main): interrupted" in shown.stdout  # the run tree
    by_channel = bot("conversations", "show", "slack:T1:C1")
    assert by_channel.stdout == shown.stdout
    ambiguous = bot("conversations", "show", "c-")
    assert ambiguous.returncode == 1 and "is ambiguous: it matches c-big, c-child, c-main" in (
        ambiguous.stderr
    )
    assert bot("conversations", "show", "nope").returncode == 1
    exported = bot("conversations", "export", "c-main")
    doc = json.loads(exported.stdout)
    assert doc["conversation"]["id"] == "c-main"
    assert [b["channel_key"] for b in doc["bindings"]] == ["irc:libera:#ops", "slack:T1:C1"]
    markdown = bot("conversations", "export", "c-main", "--format", "markdown")
    assert markdown.stdout.startswith("# Ops ✓ naïve\n")


def test_conversations_import_redact_and_rm(bot, tmp_path):
    exported = bot("conversations", "export", "c-main")
    (tmp_path / "snap.json").write_text(exported.stdout, encoding="utf-8")
    imported = bot("conversations", "import", str(tmp_path / "snap.json"), "--new-ids")
    assert imported.returncode == 0, imported.stderr
    new_id = imported.stdout.split()[1]
    assert "not bound irc:libera:#ops" in imported.stdout  # the channel stays where it is
    messages = asyncio.run(_messages(bot.dsn, new_id))
    assert [m.content for m in messages][-1] == "still there?"
    redacted = bot("conversations", "redact", new_id, str(messages[-1].id), "--reason", "pii")
    assert redacted.returncode == 0, redacted.stderr
    assert f"redacted message {messages[-1].id} of {new_id}" in redacted.stdout
    assert "still there?" not in bot("conversations", "show", new_id).stdout
    assert bot("conversations", "rm", new_id).stdout.strip() == f"deleted {new_id}"
    assert new_id not in bot("conversations", "list").stdout


async def _messages(dsn: str, cid: str) -> list[Any]:
    async with PostgresStore(dsn) as store:
        return await store.messages(cid)


def test_access_commands(bot):
    audit = bot("access", "audit")
    assert audit.returncode == 0, audit.stderr
    assert "owner: libera:account:bob - → admin in #ops" in audit.stdout
    assert "owner: slack:T1:U2 user → -" in audit.stdout
    roles = bot("access", "roles")
    assert "admin      libera:account:bob  (given by owner" in roles.stdout
    approvals = bot("access", "approvals")
    assert approvals.returncode == 0, approvals.stderr
    assert "waiting for approval: 1" in approvals.stdout
    assert "approved by libera:account:bob: ok" in approvals.stdout
    budgets = bot("access", "budgets", "--day", "1970-01-02")
    assert "identity   libera:account:bob: 120 tokens, 0 tool calls" in budgets.stdout


def test_db_prune_and_migrate(bot, tmp_path):
    config = write_config(
        tmp_path,
        '[[retention.rules]]\nchannels = ["irc:*"]\nkeep_days = 1\naction = "delete"\n',
    )
    planned = bot("db", "prune", "--dry-run", config=config)
    assert planned.returncode == 0, planned.stderr
    assert "c-main  irc:libera:#ops, slack:T1:C1  would delete 4 messages" in planned.stdout
    assert len(asyncio.run(_messages(bot.dsn, "c-main"))) == 5  # a dry run changes nothing
    pruned = bot("db", "prune", config=config)
    assert pruned.returncode == 0, pruned.stderr
    assert "pruned 4 messages in 1 conversations" in pruned.stdout
    assert [m.content for m in asyncio.run(_messages(bot.dsn, "c-main"))] == ["still there?"]
    where = describe_dsn(bot.dsn)
    migrate = bot("db", "migrate", "--dry-run")
    assert migrate.returncode == 0, migrate.stderr
    assert migrate.stdout.startswith(f"{where}: schema version ")
    assert "up to date, nothing to migrate" in migrate.stdout


async def _forget_last_migration(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        number = int(await conn.fetchval("SELECT MAX(number) FROM schema_migrations"))
        await conn.execute("DELETE FROM schema_migrations WHERE number = $1", number)
        # (the last: run_event_position)
        await conn.execute(
            "DROP TABLE run_event_position; DROP INDEX run_event_by_pos;"
            " ALTER TABLE run_event DROP COLUMN pos; DROP SEQUENCE run_event_pos_seq"
        )
        return number
    finally:
        await conn.close()


def test_db_migrate_applies_what_is_pending(bot):
    number = asyncio.run(_forget_last_migration(bot.dsn))
    planned = bot("db", "migrate", "--dry-run")
    wanted = f"would apply 1 migration(s):\n  {number:>3} run_event_position\ndry run"
    assert wanted in planned.stdout
    done = bot("db", "migrate")
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith(f"now at schema version {number}")


@pytest.mark.parametrize(
    ("action", "names"),
    [("backup", "pg_dump"), ("check", "pg_amcheck"), ("vacuum", "VACUUM (ANALYZE)")],
)
def test_the_sqlite_file_tools_name_their_postgres_equivalent(bot, action, names):
    result = bot("db", action)
    assert result.returncode == 2
    assert f"`agentik db {action}` works on a SQLite file; the database is PostgreSQL" in (
        result.stderr
    )
    assert names in result.stderr


def test_db_copy_reads_the_dsn_the_configuration_names(bot, tmp_path):
    """``postgres`` stands for the database of ``[storage] dsn_env``: the bot's own."""
    copied = bot("db", "copy", "postgres", str(tmp_path / "backup.db"))
    assert copied.returncode == 0, copied.stderr
    assert f"to {tmp_path / 'backup.db'}" in copied.stdout
    assert "verified: 3 conversations" in copied.stdout
    assert f"copying PostgreSQL {describe_dsn(bot.dsn)} ->" in copied.stderr
    same = bot("db", "copy", "postgres", "postgres")
    assert same.returncode == 2 and "FROM and TO are the same database" in same.stderr
