"""A bot killed mid-turn (SIGKILL) loses no committed user message."""

from __future__ import annotations

import sqlite3

from agentik.core import SQLiteStore
from agentik.core.store.migrations import MIGRATIONS
from helpers import back_after_the_kill, kill_mid_turn


async def test_sigkill_mid_turn_loses_no_committed_message(openai_server, db_path):
    conv_id, sent = await kill_mid_turn(openai_server, "sqlite", db_path)

    con = sqlite3.connect(db_path)
    assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    latest = max(m.number for m in MIGRATIONS)  # numbers may have gaps until issue 19 merges
    assert con.execute("SELECT MAX(number) FROM schema_migrations").fetchone() == (latest,)
    stored = dict(con.execute("SELECT run_id, content FROM message WHERE kind = 'user'").fetchall())
    con.close()
    for i, run_id in sent:
        assert stored.get(run_id) == f"message {i}"

    # The bot comes back: same conversation, and every message reaches the model.
    await back_after_the_kill(openai_server, SQLiteStore(db_path), conv_id, sent)
