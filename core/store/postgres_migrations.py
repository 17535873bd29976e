"""Numbered, named PostgreSQL schema migrations, recorded in ``schema_migrations``.

The PostgreSQL engine's own list (:data:`MIGRATIONS`), kept like SQLite's
(:mod:`.migrations`): each migration is applied in its own transaction together
with its ``schema_migrations`` row, so a failure leaves the database at the
previous version; never edit a released migration, add the next number.  Several
processes starting at once take an advisory lock first, so one of them migrates
and the others find it done.

Migration 1 is the schema SQLite reaches at its migration 13, in PostgreSQL's
types (JSON as ``jsonb``, times as ``double precision``, flags as ``boolean``,
ids from sequences), without the memory-note tables: migration 4 adds them
(:mod:`agentik.core.memory.postgres`).  Keys that are
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

__all__ = [
    "LOCK_KEY",
    "MEMORY_LOCK_KEY",
    "MIGRATIONS",
    "RUN_EVENT_LOCK_KEY",
    "apply_migrations",
    "schema_version",
]

#: The advisory lock key migrations run under (any constant; "agentik" in ASCII).
LOCK_KEY = 0x6167656E74696B
#: The advisory lock every write of memory notes takes first, held to its commit
#: ("agentikm"; see :mod:`agentik.core.memory.postgres`).
MEMORY_LOCK_KEY = 0x6167656E74696B6D
#: The advisory lock a batch of run events takes before numbering its ``pos``, held
#: to its commit, so positions become visible in order ("agentike"; see
#: :mod:`agentik.core.store.postgres_events`).
RUN_EVENT_LOCK_KEY = 0x6167656E74696B65

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
        2,
        "cluster",
        """
        -- Named leases with a fencing epoch (agentik.core.cluster: who owns a
        -- chat connection) and the registry of worker processes.  Times are
        -- the database server's clock (seconds since the epoch), never a
        -- worker's: workers whose clocks disagree still agree on expiry.
        CREATE TABLE lease (
            name        text COLLATE "C" PRIMARY KEY,
            owner       text NOT NULL,
            epoch       bigint NOT NULL,
            acquired_at double precision NOT NULL,
            expires_at  double precision NOT NULL
        );
        CREATE TABLE worker (
            id          text COLLATE "C" PRIMARY KEY,
            host        text NOT NULL DEFAULT '',
            pid         integer NOT NULL DEFAULT 0,
            started_at  double precision NOT NULL DEFAULT 0,
            version     text NOT NULL DEFAULT '',
            draining    boolean NOT NULL DEFAULT false,
            last_beat   double precision NOT NULL
        );
        """,
    ),
    Migration(
        3,
        "job_runs",
        """
        -- Scheduled jobs (agentik.core.cluster.jobs), as SQLite's migration 14: one
        -- row per firing, claimed by the one INSERT that wins the primary key.
        CREATE TABLE job_run (
            name         text COLLATE "C" NOT NULL,
            slot         text COLLATE "C" NOT NULL,
            worker       text NOT NULL,
            claimed_at   double precision NOT NULL,
            finished_at  double precision,
            ok           boolean,
            detail       text,
            attempts     integer NOT NULL DEFAULT 1,
            PRIMARY KEY (name, slot)
        );
        """,
    ),
    Migration(
        4,
        "memory_notes",
        """
        -- Long-term memory notes ([memory] backend = "database" on PostgreSQL:
        -- agentik.core.memory.postgres), SQLite's migrations 2, 11 and 12 in one.
        -- ``tsv`` and ``words`` are written by agentik with the text: its words
        -- as SQLite's FTS5 tokenizer sees them (folded case and accents), each with
        -- its positions, and how many there are (for the bm25 ranking).  Made in
        -- Python, not by to_tsvector(), so no text search configuration nor the
        -- database's locale decides what a word is.
        CREATE TABLE memory_note (
            id          bigserial PRIMARY KEY,
            scope       text COLLATE "C" NOT NULL,
            text        text NOT NULL,
            author      text,
            version     integer NOT NULL DEFAULT 1,
            deleted     boolean NOT NULL DEFAULT false,
            created_at  double precision NOT NULL,
            updated_at  double precision NOT NULL,
            tsv         tsvector NOT NULL DEFAULT ''::tsvector,
            words       integer NOT NULL DEFAULT 0
        );
        CREATE INDEX memory_note_by_scope ON memory_note (scope, deleted, updated_at DESC);
        CREATE INDEX memory_note_by_update ON memory_note (updated_at DESC, id);
        CREATE INDEX memory_note_words ON memory_note USING gin (tsv);

        -- What bm25 needs besides the matching notes, kept as FTS5 keeps it: how
        -- many notes there are and their words in all (one row), and in how many
        -- notes each word is.  Deleted notes count until purged, as in FTS5's index.
        -- Kept by the triggers below (every memory write takes agentik's memory lock
        -- first, so the rows are locked in one order).  Rows at zero are removed.
        CREATE TABLE memory_totals (
            one    boolean PRIMARY KEY DEFAULT true CHECK (one),
            notes  bigint NOT NULL,
            words  bigint NOT NULL
        );
        CREATE TABLE memory_word (
            lexeme text PRIMARY KEY,
            notes  bigint NOT NULL
        );
        -- The rows a write brought to zero (removed at once: the index stays tiny).
        CREATE INDEX memory_word_unused ON memory_word (lexeme) WHERE notes <= 0;
        -- Per statement (a bulk insert or purge updates each word's row once).
        CREATE FUNCTION agentik_memory_counts() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'INSERT' THEN
                INSERT INTO memory_totals (one, notes, words)
                    SELECT true, count(*), COALESCE(sum(words), 0) FROM new_rows
                    HAVING count(*) > 0
                    ON CONFLICT (one) DO UPDATE SET notes = memory_totals.notes + excluded.notes,
                                                    words = memory_totals.words + excluded.words;
                INSERT INTO memory_word (lexeme, notes)
                    SELECT l, count(*) FROM new_rows, unnest(tsvector_to_array(tsv)) AS l
                    GROUP BY l ORDER BY l
                    ON CONFLICT (lexeme) DO UPDATE SET notes = memory_word.notes + excluded.notes;
            ELSIF TG_OP = 'DELETE' THEN
                UPDATE memory_totals SET notes = notes - d.n, words = words - d.w
                    FROM (SELECT count(*) AS n, COALESCE(sum(words), 0) AS w FROM old_rows) d
                    WHERE d.n > 0;
                DELETE FROM memory_totals WHERE notes <= 0;
                UPDATE memory_word SET notes = memory_word.notes - d.n
                    FROM (SELECT l, count(*) AS n FROM old_rows,
                          unnest(tsvector_to_array(tsv)) AS l GROUP BY l) d
                    WHERE memory_word.lexeme = d.l;
                DELETE FROM memory_word WHERE notes <= 0;
            ELSE
                UPDATE memory_totals SET words = words + d.w
                    FROM (SELECT (SELECT COALESCE(sum(words), 0) FROM new_rows)
                                 - (SELECT COALESCE(sum(words), 0) FROM old_rows) AS w) d
                    WHERE d.w != 0;
                INSERT INTO memory_word (lexeme, notes)
                    SELECT l, sum(s) FROM (
                        SELECT 1 AS s, tsv FROM new_rows
                        UNION ALL SELECT -1, tsv FROM old_rows
                    ) x, unnest(tsvector_to_array(x.tsv)) AS l
                    GROUP BY l HAVING sum(s) != 0 ORDER BY l
                    ON CONFLICT (lexeme) DO UPDATE SET notes = memory_word.notes + excluded.notes;
                DELETE FROM memory_word WHERE notes <= 0;
            END IF;
            RETURN NULL;
        END $$;
        CREATE TRIGGER memory_note_counted AFTER INSERT ON memory_note
            REFERENCING NEW TABLE AS new_rows
            FOR EACH STATEMENT EXECUTE FUNCTION agentik_memory_counts();
        CREATE TRIGGER memory_note_uncounted AFTER DELETE ON memory_note
            REFERENCING OLD TABLE AS old_rows
            FOR EACH STATEMENT EXECUTE FUNCTION agentik_memory_counts();
        CREATE TRIGGER memory_note_recounted AFTER UPDATE ON memory_note
            REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
            FOR EACH STATEMENT EXECUTE FUNCTION agentik_memory_counts();

        -- Every version of every note (the text after each change).
        CREATE TABLE memory_version (
            note_id     bigint NOT NULL REFERENCES memory_note (id) ON DELETE CASCADE,
            version     integer NOT NULL,
            text        text NOT NULL,
            op          text NOT NULL CHECK (op IN ('save', 'edit', 'delete', 'restore')),
            author      text,
            created_at  double precision NOT NULL,
            PRIMARY KEY (note_id, version)
        );

        -- One embedding per live note (little-endian float32 in ``vector``: no
        -- pgvector needed; the process ranks them).  ``seq`` is taken anew at every
        -- (re)write, under an advisory lock held to the commit, so the rows commit
        -- in ``seq`` order and a process catching up by ``seq`` misses none.
        CREATE SEQUENCE memory_vector_seq;
        CREATE TABLE memory_vector (
            note_id     bigint PRIMARY KEY REFERENCES memory_note (id) ON DELETE CASCADE,
            seq         bigint NOT NULL,
            model       text NOT NULL,
            dim         integer NOT NULL,
            vector      bytea NOT NULL
        );
        CREATE INDEX memory_vector_by_seq ON memory_vector (seq);

        -- Provenance of notes written by mining and reflection (SQLite's
        -- migration 12): redacting a message of the span deletes the note.
        CREATE TABLE memory_source (
            note_id          bigint PRIMARY KEY REFERENCES memory_note (id) ON DELETE CASCADE,
            conversation_id  text COLLATE "C" NOT NULL,
            first_message_id bigint NOT NULL,
            last_message_id  bigint NOT NULL,
            created_at       double precision NOT NULL
        );
        CREATE INDEX memory_source_by_conversation
            ON memory_source (conversation_id, first_message_id);
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
    Migration(
        6,
        "turn_queue",
        """
        -- The turn queue (agentik.core.cluster.conversations): a turn submitted on one
        -- worker for a conversation another runs.  Its user message is in ``message``
        -- (written in the same transaction); ``message_id`` is the idempotence key.
        -- A row lives until its turn ended; ``claimed_by`` is the worker that holds
        -- the conversation's lease (``conv:<id>``) and runs it.
        CREATE TABLE turn_queue (
            message_id       bigint PRIMARY KEY,
            conversation_id  text COLLATE "C" NOT NULL
                             REFERENCES conversation (id) ON DELETE CASCADE,
            run_id           text NOT NULL,
            payload          jsonb NOT NULL,
            enqueued_at      double precision NOT NULL,
            claimed_by       text,
            claimed_at       double precision,
            attempts         integer NOT NULL DEFAULT 0
        );
        CREATE INDEX turn_queue_by_conversation ON turn_queue (conversation_id, message_id);
        """,
    ),
    Migration(
        7,
        "run_event",
        """
        -- What a conversation's turns emitted: ``seq`` (unique per conversation across
        -- workers and restarts) and the event's JSON as the SSE stream sends it.  The
        -- worker running a turn writes them in batches; an SSE client on another
        -- worker replays and follows them (agentik.core.cluster.events).
        CREATE TABLE run_event (
            conversation_id  text COLLATE "C" NOT NULL,
            seq              bigint NOT NULL,
            at               double precision NOT NULL,
            data             text NOT NULL,
            PRIMARY KEY (conversation_id, seq)
        );
        CREATE INDEX run_event_by_time ON run_event (at);
        """,
    ),
    Migration(
        8,
        "links",
        """
        -- Linked channels (SQLite's migration 19): links made at run time and the
        -- persistent message map (canonical message <-> each channel's id for it).
        CREATE TABLE link (
            name        text COLLATE "C" PRIMARY KEY,
            channels    jsonb NOT NULL,
            options     jsonb NOT NULL DEFAULT '{}',
            created_by  text NOT NULL DEFAULT '',
            created_at  double precision NOT NULL
        );
        CREATE TABLE link_message (
            link        text COLLATE "C" NOT NULL,
            canonical   text COLLATE "C" NOT NULL,
            channel_key text COLLATE "C" NOT NULL,
            ref         text COLLATE "C",
            origin      boolean NOT NULL DEFAULT false,
            run_id      text,
            piece       integer,
            created_at  double precision NOT NULL,
            PRIMARY KEY (canonical, channel_key)
        );
        CREATE INDEX link_message_by_ref ON link_message (channel_key, ref);
        """,
    ),
    Migration(
        9,
        "attachments",
        """
        -- Attachments (SQLite's migration 20).  The bytes are in the database
        -- (``attachment_blob``, one row per SHA-256): every worker of a cluster
        -- reads them, wherever it runs.
        CREATE TABLE attachment_blob (
            sha256  text COLLATE "C" PRIMARY KEY,
            data    bytea NOT NULL
        );
        CREATE TABLE attachment (
            conversation_id text COLLATE "C" NOT NULL
                REFERENCES conversation (id) ON DELETE CASCADE,
            sha256          text COLLATE "C" NOT NULL,
            media_type      text NOT NULL,
            size            bigint NOT NULL,
            created_at      double precision NOT NULL,
            PRIMARY KEY (conversation_id, sha256)
        );
        CREATE INDEX attachment_by_hash ON attachment (sha256);
        """,
    ),
    Migration(
        10,
        "message_search",
        """
        -- Full-text search over the audit log (SQLite's migration 21): what people
        -- and the model said, as words ('simple': no stemming, any language), the
        -- first 100,000 characters of a message (a tsvector is at most 1 MB).
        CREATE INDEX message_search ON message
            USING gin (to_tsvector('simple', left(content, 100000)))
            WHERE kind IN ('user', 'assistant');
        """,
    ),
    Migration(
        11,
        "webhook_delivery",
        """
        -- Outbound webhooks (SQLite's migration 22): each event on its way to a
        -- ``[[webhooks]]`` receiver; workers claim rows (FOR UPDATE SKIP LOCKED)
        -- under a lease, so each delivery is sent by one worker at a time.
        CREATE TABLE webhook_delivery (
            id               text COLLATE "C" PRIMARY KEY,
            webhook          text COLLATE "C" NOT NULL,
            event_kind       text NOT NULL,
            conversation_id  text COLLATE "C" NOT NULL,
            body             text NOT NULL,
            created_at       double precision NOT NULL,
            state            text NOT NULL DEFAULT 'pending',
            attempts         integer NOT NULL DEFAULT 0,
            next_at          double precision NOT NULL DEFAULT 0,
            claimed_by       text,
            claimed_until    double precision,
            last_error       text,
            finished_at      double precision
        );
        CREATE INDEX webhook_delivery_due ON webhook_delivery (state, next_at);
        CREATE INDEX webhook_delivery_by_age ON webhook_delivery (created_at, id);
        """,
    ),
    Migration(
        12,
        "question_form",
        """
        -- Multi-question ask_user (SQLite's migration 23): a form's fields and the
        -- answers given so far, as JSON text (``text``, not ``jsonb``: the
        -- snapshot keeps them as written); NULL on a single question.
        ALTER TABLE question ADD COLUMN form text;
        ALTER TABLE question ADD COLUMN partial text;
        """,
    ),
    Migration(
        13,
        "a2a_task",
        """
        -- A2A task records (SQLite's migration 24): read by every worker; the text
        -- of a task is the audit log's (the rows of ``run_id``).
        CREATE TABLE a2a_task (
            owner            text COLLATE "C" NOT NULL,
            task_id          text COLLATE "C" NOT NULL,
            conversation_id  text COLLATE "C" NOT NULL
                REFERENCES conversation (id) ON DELETE CASCADE,
            run_id           text COLLATE "C",
            state            text NOT NULL,
            final            boolean NOT NULL DEFAULT false,
            updated_at       double precision NOT NULL,
            body             text NOT NULL,
            PRIMARY KEY (owner, task_id)
        );
        CREATE INDEX a2a_task_by_age ON a2a_task (owner, updated_at, task_id);
        CREATE INDEX a2a_task_by_conversation ON a2a_task (conversation_id);
        """,
    ),
    Migration(
        14,
        "budget_held",
        """
        -- Token reservations in the database (SQLite's migration 25): a running
        -- turn's estimate is a counter of kind ``tokens_held`` whose period is the
        -- minute it lapses; every worker's token check counts them.
        ALTER TABLE budget_usage DROP CONSTRAINT IF EXISTS budget_usage_kind_check;
        ALTER TABLE budget_usage ADD CONSTRAINT budget_usage_kind_check
            CHECK (kind IN ('messages', 'tokens', 'tool_calls', 'tokens_held'));
        """,
    ),
    Migration(
        15,
        "checkpoint",
        """
        -- Checkpoints (SQLite's migration 26): stored snapshots of a conversation,
        -- the document as JSON text (``text``: kept exactly as exported).
        CREATE TABLE checkpoint (
            id              bigserial PRIMARY KEY,
            conversation_id text NOT NULL REFERENCES conversation (id) ON DELETE CASCADE,
            created_at      double precision NOT NULL,
            label           text NOT NULL DEFAULT '',
            automatic       boolean NOT NULL DEFAULT false,
            size            bigint NOT NULL,
            document        text NOT NULL
        );
        CREATE INDEX checkpoint_by_conversation ON checkpoint (conversation_id, id);
        """,
    ),
    Migration(
        16,
        "run_event_position",
        """
        -- The agent-wide event stream's ids, the same on every worker (SQLite's
        -- migration 27): ``pos`` numbers each stored event that is on the agent-wide
        -- stream (NULL: a child run's event relayed into its parent's stream), in the
        -- order the batches commit (a batch takes the advisory lock
        -- RUN_EVENT_LOCK_KEY before numbering); ``run_event_position.pruned`` is the
        -- highest ``pos`` the retention pruned (a resumption from before it may have
        -- missed events).  Older rows keep NULL: they were never on a shared stream.
        ALTER TABLE run_event ADD COLUMN pos bigint;
        CREATE SEQUENCE run_event_pos_seq;
        CREATE UNIQUE INDEX run_event_by_pos ON run_event (pos);
        CREATE TABLE run_event_position (
            id      boolean PRIMARY KEY DEFAULT true CHECK (id),
            pruned  bigint NOT NULL DEFAULT 0
        );
        INSERT INTO run_event_position (id, pruned) VALUES (true, 0);
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
