"""Numbered, named PostgreSQL schema migrations, recorded in ``schema_migrations``.

The PostgreSQL engine's own list (:data:`MIGRATIONS`), kept like SQLite's
(:mod:`.migrations`): each migration is applied in its own transaction together
with its ``schema_migrations`` row, so a failure leaves the database at the
previous version; never edit a released migration, add the next number.  Several
processes starting at once take an advisory lock first, so one of them migrates
and the others find it done.

Migration 1 is the schema SQLite reaches at its migration 13, in PostgreSQL's
types (JSON as ``jsonb``, times as ``double precision``, flags as ``boolean``,
ids from sequences), without the memory-note tables: memory notes are a
separate backend (``[memory]``), not kept in PostgreSQL yet.  Keys that are
sorted (ids, channel keys, identities) are ``COLLATE "C"``: listings sort by
bytes, as SQLite does, whatever the database's locale.

The audit log's append-only rule is enforced by triggers, as in SQLite, and
more strictly: a row of ``message`` is never updated except by a redaction
(``redacted`` false to true, changing only ``content``, ``arguments`` and
``data``), and never deleted except with its conversation (a cascade) or by
retention (a transaction that set ``agentik.retention`` on).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..errors import MigrationError
from .migrations import Migration

if TYPE_CHECKING:
    import asyncpg

__all__ = ["LOCK_KEY", "MIGRATIONS", "apply_migrations", "schema_version"]

#: The advisory lock key migrations run under (any constant; "agentik" in ASCII).
LOCK_KEY = 0x6167656E74696B

MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "initial",
        """
        CREATE TABLE conversation (
            id          text COLLATE "C" PRIMARY KEY,
            title       text NOT NULL DEFAULT '',
            created_at  double precision NOT NULL,
            updated_at  double precision NOT NULL,
            meta        jsonb NOT NULL DEFAULT '{}'
        );
        CREATE INDEX conversation_by_update ON conversation (updated_at DESC, id);

        CREATE TABLE channel_binding (
            channel_key      text COLLATE "C" PRIMARY KEY,
            conversation_id  text COLLATE "C" NOT NULL
                             REFERENCES conversation (id) ON DELETE CASCADE,
            created_at       double precision NOT NULL
        );
        CREATE INDEX channel_binding_by_conversation ON channel_binding (conversation_id);

        -- The audit log: append-only (the triggers below).  Ids come from the
        -- sequence, so several processes may append at once.
        CREATE SEQUENCE message_id_seq;
        CREATE TABLE message (
            id               bigint PRIMARY KEY DEFAULT nextval('message_id_seq'),
            conversation_id  text COLLATE "C" NOT NULL
                             REFERENCES conversation (id) ON DELETE CASCADE,
            kind             text NOT NULL
                CHECK (kind IN ('user', 'assistant', 'tool_call', 'tool_result')),
            content          text NOT NULL DEFAULT '',
            author           text,
            channel          text,
            run_id           text COLLATE "C",
            tool_call_id     text,
            tool_name        text,
            arguments        text,
            is_error         boolean NOT NULL DEFAULT false,
            status           text NOT NULL DEFAULT 'complete',
            data             jsonb,
            duration         double precision,
            created_at       double precision NOT NULL,
            redacted         boolean NOT NULL DEFAULT false
        );
        ALTER SEQUENCE message_id_seq OWNED BY message.id;
        CREATE INDEX message_by_conversation ON message (conversation_id, id);
        -- The user messages that start turns (ambient notes have no run id).
        CREATE INDEX message_user_turn ON message (run_id)
            WHERE kind = 'user' AND run_id IS NOT NULL;

        CREATE FUNCTION agentik_message_append_only() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'DELETE' THEN
                -- With its conversation (the cascade runs inside the foreign key's
                -- own trigger), or by retention.
                IF pg_trigger_depth() > 1
                   OR current_setting('agentik.retention', true) = 'on' THEN
                    RETURN OLD;
                END IF;
                RAISE EXCEPTION 'the message audit log is append-only'
                    USING ERRCODE = 'restrict_violation';
            END IF;
            -- A redaction: once, and nothing but the text changes.
            IF NOT OLD.redacted AND NEW.redacted
               AND NEW.id = OLD.id
               AND NEW.conversation_id IS NOT DISTINCT FROM OLD.conversation_id
               AND NEW.kind IS NOT DISTINCT FROM OLD.kind
               AND NEW.author IS NOT DISTINCT FROM OLD.author
               AND NEW.channel IS NOT DISTINCT FROM OLD.channel
               AND NEW.run_id IS NOT DISTINCT FROM OLD.run_id
               AND NEW.tool_call_id IS NOT DISTINCT FROM OLD.tool_call_id
               AND NEW.tool_name IS NOT DISTINCT FROM OLD.tool_name
               AND NEW.is_error IS NOT DISTINCT FROM OLD.is_error
               AND NEW.status IS NOT DISTINCT FROM OLD.status
               AND NEW.duration IS NOT DISTINCT FROM OLD.duration
               AND NEW.created_at IS NOT DISTINCT FROM OLD.created_at THEN
                RETURN NEW;
            END IF;
            RAISE EXCEPTION 'the message audit log is append-only'
                USING ERRCODE = 'restrict_violation';
        END $$;
        CREATE TRIGGER message_append_only BEFORE UPDATE OR DELETE ON message
            FOR EACH ROW EXECUTE FUNCTION agentik_message_append_only();

        CREATE FUNCTION agentik_append_only() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION '% is append-only', TG_TABLE_NAME
                USING ERRCODE = 'restrict_violation';
        END $$;

        -- The LLM context: mutable (compaction replaces a prefix).
        CREATE TABLE working_memory (
            conversation_id  text COLLATE "C" NOT NULL
                             REFERENCES conversation (id) ON DELETE CASCADE,
            pos              bigint NOT NULL,
            message_id       bigint,
            body             jsonb NOT NULL,
            PRIMARY KEY (conversation_id, pos)
        );

        -- One row per finished turn (see SQLite's migration 3).  Append-only.
        CREATE TABLE turn_end (
            conversation_id  text COLLATE "C" NOT NULL
                             REFERENCES conversation (id) ON DELETE CASCADE,
            run_id           text COLLATE "C" NOT NULL,
            outcome          text NOT NULL,
            created_at       double precision NOT NULL,
            PRIMARY KEY (conversation_id, run_id)
        );
        CREATE TRIGGER turn_end_append_only BEFORE UPDATE ON turn_end
            FOR EACH ROW EXECUTE FUNCTION agentik_append_only();

        -- Outgoing channel messages and their delivery state (SQLite's migration 4).
        CREATE TABLE outbox (
            id             bigserial PRIMARY KEY,
            channel_key    text COLLATE "C" NOT NULL,
            run_id         text COLLATE "C" NOT NULL,
            piece          integer NOT NULL,
            transport      text NOT NULL,
            kind           text NOT NULL,
            text           text NOT NULL,
            reply_to       jsonb,
            complete       boolean NOT NULL DEFAULT true,
            state          text NOT NULL DEFAULT 'queued'
                           CHECK (state IN ('queued', 'sent', 'confirmed')),
            awaits_confirm boolean NOT NULL DEFAULT false,
            ref            text,
            created_at     double precision NOT NULL,
            UNIQUE (channel_key, run_id, piece)
        );
        CREATE INDEX outbox_open ON outbox (id) WHERE state != 'confirmed' OR NOT complete;
        CREATE INDEX outbox_by_run ON outbox (run_id);
        CREATE INDEX outbox_by_time ON outbox (created_at);

        -- Roles given in chat and their audit (SQLite's migration 5).
        CREATE TABLE access_grant (
            identity    text COLLATE "C" PRIMARY KEY,
            role        text NOT NULL,
            granted_by  text NOT NULL,
            granted_at  double precision NOT NULL
        );
        CREATE TABLE access_audit (
            id          bigserial PRIMARY KEY,
            at          double precision NOT NULL,
            actor       text NOT NULL,
            identity    text COLLATE "C" NOT NULL,
            old_role    text,
            new_role    text,
            channel     text
        );
        CREATE INDEX access_audit_by_identity ON access_audit (identity, id);

        -- Tool calls waiting for approval (SQLite's migration 6).
        CREATE TABLE approval (
            serial          bigserial PRIMARY KEY,
            id              text COLLATE "C" NOT NULL,
            scope           text COLLATE "C" NOT NULL,
            conversation_id text COLLATE "C" NOT NULL
                            REFERENCES conversation (id) ON DELETE CASCADE,
            channel_key     text,
            run_id          text NOT NULL,
            call_id         text NOT NULL,
            tool            text NOT NULL,
            arguments       text NOT NULL DEFAULT '{}',
            digest          text NOT NULL DEFAULT '',
            asker           text,
            asker_id        text,
            approvers       text NOT NULL,
            self_approve    boolean NOT NULL DEFAULT false,
            created_at      double precision NOT NULL,
            expires_at      double precision NOT NULL,
            state           text NOT NULL DEFAULT 'pending'
                            CHECK (state IN ('pending', 'resolved')),
            decision        text
                            CHECK (decision IN ('approved', 'denied', 'expired', 'cancelled')),
            approver        text,
            approver_id     text,
            reason          text,
            resolved_at     double precision
        );
        CREATE UNIQUE INDEX approval_pending_id ON approval (scope, id) WHERE state = 'pending';
        CREATE INDEX approval_by_conversation ON approval (conversation_id, serial);
        CREATE INDEX approval_by_state ON approval (state, serial);

        -- Budget counters (SQLite's migration 7).
        CREATE TABLE budget_usage (
            scope    text COLLATE "C" NOT NULL
                     CHECK (scope IN ('identity', 'unverified', 'channel')),
            subject  text COLLATE "C" NOT NULL,
            kind     text COLLATE "C" NOT NULL
                     CHECK (kind IN ('messages', 'tokens', 'tool_calls')),
            period   bigint NOT NULL,
            amount   bigint NOT NULL DEFAULT 0,
            PRIMARY KEY (scope, subject, kind, period)
        );
        CREATE INDEX budget_usage_by_period ON budget_usage (period);

        -- Per-channel settings and their audit (SQLite's migration 8).  The
        -- values are JSON text, kept as written.
        CREATE TABLE channel_setting (
            channel_key text COLLATE "C" NOT NULL,
            key         text COLLATE "C" NOT NULL,
            value       text NOT NULL,
            set_by      text NOT NULL,
            set_at      double precision NOT NULL,
            PRIMARY KEY (channel_key, key)
        );
        CREATE TABLE channel_setting_audit (
            id          bigserial PRIMARY KEY,
            channel_key text COLLATE "C" NOT NULL,
            key         text NOT NULL,
            old_value   text,
            new_value   text,
            actor       text NOT NULL,
            at          double precision NOT NULL
        );
        CREATE INDEX channel_setting_audit_by_channel ON channel_setting_audit (channel_key, id);
        CREATE TRIGGER channel_setting_audit_no_update BEFORE UPDATE ON channel_setting_audit
            FOR EACH ROW EXECUTE FUNCTION agentik_append_only();

        -- Run trees (SQLite's migration 9).
        CREATE TABLE run (
            run_id                  text COLLATE "C" PRIMARY KEY,
            conversation_id         text COLLATE "C"
                                    REFERENCES conversation (id) ON DELETE CASCADE,
            parent_run_id           text,
            parent_conversation_id  text COLLATE "C"
                                    REFERENCES conversation (id) ON DELETE CASCADE,
            parent_call_id          text,
            agent                   text,
            depth                   integer NOT NULL DEFAULT 0,
            started                 double precision NOT NULL,
            ended                   double precision,
            stop_reason             text,
            usage                   jsonb,
            -- The order rows were written in (exports list them so, as SQLite's rowid).
            written                 bigserial
        );
        CREATE INDEX run_by_conversation ON run (conversation_id);
        CREATE INDEX run_by_parent_conversation ON run (parent_conversation_id);
        CREATE INDEX run_by_parent ON run (parent_run_id);

        -- Questions the model asked the channel (SQLite's migration 10).
        CREATE TABLE question (
            id              bigserial PRIMARY KEY,
            conversation_id text COLLATE "C" NOT NULL
                            REFERENCES conversation (id) ON DELETE CASCADE,
            channel_key     text,
            run_id          text NOT NULL,
            call_id         text NOT NULL,
            asker_target    text,
            answer_from     text NOT NULL DEFAULT 'asked'
                            CHECK (answer_from IN ('asked', 'anyone')),
            text            text NOT NULL,
            choices         jsonb NOT NULL DEFAULT '[]',
            digest          text NOT NULL DEFAULT '',
            created_at      double precision NOT NULL,
            deadline        double precision NOT NULL,
            state           text NOT NULL DEFAULT 'pending'
                            CHECK (state IN ('pending', 'resolved')),
            outcome         text CHECK (outcome IN ('answered', 'expired', 'cancelled')),
            answer          text,
            answered_by     text,
            answered_at     double precision
        );
        CREATE INDEX question_by_conversation ON question (conversation_id, id);
        CREATE INDEX question_pending ON question (id) WHERE state = 'pending';

        -- Every redaction (SQLite's migration 12).  Append-only.
        CREATE TABLE redaction (
            id              bigserial PRIMARY KEY,
            conversation_id text COLLATE "C" NOT NULL
                            REFERENCES conversation (id) ON DELETE CASCADE,
            message_id      bigint NOT NULL,
            redacted_by     text NOT NULL,
            at              double precision NOT NULL,
            reason          text NOT NULL DEFAULT '',
            notes_removed   integer NOT NULL DEFAULT 0
        );
        CREATE INDEX redaction_by_conversation ON redaction (conversation_id, id);
        CREATE TRIGGER redaction_append_only BEFORE UPDATE ON redaction
            FOR EACH ROW EXECUTE FUNCTION agentik_append_only();

        -- Each conversation's checklist (SQLite's migration 13).
        CREATE TABLE todo (
            conversation_id text COLLATE "C" PRIMARY KEY
                            REFERENCES conversation (id) ON DELETE CASCADE,
            items           jsonb NOT NULL DEFAULT '[]',
            run_id          text,
            updated_at      double precision NOT NULL
        );
        """,
    ),
    Migration(
        5,
        "seen_event",
        """
        -- Events a transport has handled (SQLite's seen_event): every worker checks
        -- and records a key in one statement, so a redelivered event is answered once.
        CREATE TABLE seen_event (
            key  text COLLATE "C" PRIMARY KEY,
            at   double precision NOT NULL
        );
        CREATE INDEX seen_event_by_time ON seen_event (at);
        """,
    ),
)

_RECORDS = (
    "CREATE TABLE IF NOT EXISTS schema_migrations ("
    " number integer PRIMARY KEY, name text NOT NULL, applied_at double precision NOT NULL)"
)


async def schema_version(conn: asyncpg.Connection) -> int:
    """The highest applied migration number (0 for a blank database)."""
    exists = await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL")
    if not exists:
        return 0
    return int(await conn.fetchval("SELECT COALESCE(MAX(number), 0) FROM schema_migrations"))


async def apply_migrations(
    conn: asyncpg.Connection,
    migrations: tuple[Migration, ...] = MIGRATIONS,
    *,
    target: int | None = None,
) -> list[int]:
    """Apply every migration the database lacks (up to ``target``); the numbers applied.

    Each in its own transaction, under the advisory lock :data:`LOCK_KEY` (another
    process migrating at the same time waits, then finds the work done).  Refuses a
    database whose schema is newer than this code knows.
    """
    known = max((m.number for m in migrations), default=0)
    applied: list[int] = []
    for m in sorted(migrations, key=lambda m: m.number):
        if target is not None and m.number > target:
            break
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", LOCK_KEY)
            await conn.execute(_RECORDS)
            done = {r[0] for r in await conn.fetch("SELECT number FROM schema_migrations")}
            current = max(done, default=0)
            if current > known:
                raise MigrationError(
                    f"database schema version {current} is newer than this agentik knows ({known})"
                )
            if m.number in done:
                continue
            try:
                await conn.execute(m.sql)
            except Exception as exc:
                raise MigrationError(f"migration {m.number} ({m.name}) failed: {exc}") from exc
            await conn.execute(
                "INSERT INTO schema_migrations (number, name, applied_at) VALUES ($1, $2, $3)",
                m.number,
                m.name,
                time.time(),
            )
        applied.append(m.number)
    return applied
