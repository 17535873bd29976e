"""Numbered, named SQLite schema migrations, recorded in ``schema_migrations``.

Each migration is a plain SQL script applied in its own transaction together
with its ``schema_migrations`` row, so a crash mid-migration leaves the
database at the previous version.  Never edit a released migration: add the
next number.  ``tests/test_store_migrations.py`` applies them from a blank
database and from every earlier version.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass

from ..errors import MigrationError

__all__ = ["MIGRATIONS", "Migration", "apply_migrations", "schema_version"]


@dataclass(frozen=True, slots=True)
class Migration:
    number: int
    name: str
    sql: str


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "initial",
        """
        CREATE TABLE conversation (
            id          TEXT PRIMARY KEY,
            title       TEXT NOT NULL DEFAULT '',
            created_at  REAL NOT NULL,
            updated_at  REAL NOT NULL,
            meta        TEXT NOT NULL DEFAULT '{}'
        );
        CREATE INDEX conversation_by_update ON conversation (updated_at DESC, id);

        CREATE TABLE channel_binding (
            channel_key      TEXT PRIMARY KEY,
            conversation_id  TEXT NOT NULL REFERENCES conversation (id) ON DELETE CASCADE,
            created_at       REAL NOT NULL
        );
        CREATE INDEX channel_binding_by_conversation ON channel_binding (conversation_id);

        -- The audit log: append-only.
        CREATE TABLE message (
            id               INTEGER PRIMARY KEY,
            conversation_id  TEXT NOT NULL REFERENCES conversation (id) ON DELETE CASCADE,
            kind             TEXT NOT NULL
                CHECK (kind IN ('user', 'assistant', 'tool_call', 'tool_result')),
            content          TEXT NOT NULL DEFAULT '',
            author           TEXT,
            channel          TEXT,
            run_id           TEXT,
            tool_call_id     TEXT,
            tool_name        TEXT,
            arguments        TEXT,
            is_error         INTEGER NOT NULL DEFAULT 0,
            status           TEXT NOT NULL DEFAULT 'complete',
            data             TEXT,
            duration         REAL,
            created_at       REAL NOT NULL
        );
        CREATE INDEX message_by_conversation ON message (conversation_id, id);
        CREATE TRIGGER message_append_only BEFORE UPDATE ON message
        BEGIN
            SELECT RAISE(ABORT, 'the message audit log is append-only');
        END;

        -- The LLM context: mutable (compaction replaces a prefix).
        CREATE TABLE working_memory (
            conversation_id  TEXT NOT NULL REFERENCES conversation (id) ON DELETE CASCADE,
            pos              INTEGER NOT NULL,
            message_id       INTEGER,
            body             TEXT NOT NULL,
            PRIMARY KEY (conversation_id, pos)
        ) WITHOUT ROWID;
        """,
    ),
    Migration(
        2,
        "long_term_memory",
        """
        -- Long-term memory notes (agentik.core.memory.sqlite): the current text.
        CREATE TABLE memory_note (
            id          INTEGER PRIMARY KEY,
            scope       TEXT NOT NULL,
            -- One FTS token standing for the scope ('s' + hash), so a search
            -- intersects the words with the visible scopes inside the index.
            scope_key   TEXT NOT NULL,
            text        TEXT NOT NULL,
            author      TEXT,
            version     INTEGER NOT NULL DEFAULT 1,
            deleted     INTEGER NOT NULL DEFAULT 0,
            created_at  REAL NOT NULL,
            updated_at  REAL NOT NULL
        );
        CREATE INDEX memory_note_by_scope ON memory_note (scope, deleted, updated_at DESC);
        CREATE INDEX memory_note_by_update ON memory_note (updated_at DESC, id);

        -- Every version of every note (the text after each change).
        CREATE TABLE memory_version (
            note_id     INTEGER NOT NULL REFERENCES memory_note (id) ON DELETE CASCADE,
            version     INTEGER NOT NULL,
            text        TEXT NOT NULL,
            op          TEXT NOT NULL CHECK (op IN ('save', 'edit', 'delete', 'restore')),
            author      TEXT,
            created_at  REAL NOT NULL,
            PRIMARY KEY (note_id, version)
        ) WITHOUT ROWID;

        -- Full-text index over the current text and the scope token.
        CREATE VIRTUAL TABLE memory_fts USING fts5 (
            text, scope_key, tokenize = 'unicode61 remove_diacritics 2'
        );
        CREATE TRIGGER memory_note_ai AFTER INSERT ON memory_note BEGIN
            INSERT INTO memory_fts (rowid, text, scope_key)
            VALUES (new.id, new.text, new.scope_key);
        END;
        CREATE TRIGGER memory_note_ad AFTER DELETE ON memory_note BEGIN
            DELETE FROM memory_fts WHERE rowid = old.id;
        END;
        CREATE TRIGGER memory_note_au AFTER UPDATE OF text ON memory_note BEGIN
            DELETE FROM memory_fts WHERE rowid = old.id;
            INSERT INTO memory_fts (rowid, text, scope_key)
            VALUES (new.id, new.text, new.scope_key);
        END;
        """,
    ),
    Migration(
        3,
        "turn_end",
        """
        -- One row per finished turn, keyed by the run id of the user message it
        -- answers: written in the same transaction as the turn's last audit-log
        -- rows.  A committed user message without one was never answered (the
        -- process died first) and is resumed at start-up.  Append-only.
        CREATE TABLE turn_end (
            conversation_id  TEXT NOT NULL REFERENCES conversation (id) ON DELETE CASCADE,
            run_id           TEXT NOT NULL,
            outcome          TEXT NOT NULL,
            created_at       REAL NOT NULL,
            PRIMARY KEY (conversation_id, run_id)
        ) WITHOUT ROWID;
        CREATE TRIGGER turn_end_append_only BEFORE UPDATE ON turn_end
        BEGIN
            SELECT RAISE(ABORT, 'turn_end is append-only');
        END;
        -- The user messages that start turns (ambient notes have no run id).
        CREATE INDEX message_user_turn ON message (run_id)
            WHERE kind = 'user' AND run_id IS NOT NULL;
        -- History from before this migration is not resumed: every existing
        -- turn counts as ended.
        INSERT OR IGNORE INTO turn_end (conversation_id, run_id, outcome, created_at)
            SELECT conversation_id, run_id, 'before_resume', created_at
            FROM message WHERE kind = 'user' AND run_id IS NOT NULL;
        """,
    ),
    Migration(
        4,
        "outbox",
        """
        -- Outgoing channel messages and their delivery state (agentik.bot's
        -- bridge): written before a transport is asked to send, so a restart
        -- delivers what a killed process left queued.  One row per piece of a
        -- run's output (an IRC line, a Slack answer), keyed so a re-render
        -- can tell what was already enqueued.
        CREATE TABLE outbox (
            id          INTEGER PRIMARY KEY,
            channel_key TEXT NOT NULL,
            run_id      TEXT NOT NULL,
            piece       INTEGER NOT NULL,
            transport   TEXT NOT NULL,
            kind        TEXT NOT NULL,
            text        TEXT NOT NULL,
            reply_to    TEXT,
            -- 0: more text may follow (a streamed answer still being written).
            complete    INTEGER NOT NULL DEFAULT 1,
            state       TEXT NOT NULL DEFAULT 'queued'
                        CHECK (state IN ('queued', 'sent', 'confirmed')),
            -- 1: the protocol will confirm this piece (IRC echo-message).
            awaits_confirm INTEGER NOT NULL DEFAULT 0,
            -- The protocol's id of the delivered message (Slack ts).
            ref         TEXT,
            created_at  REAL NOT NULL,
            UNIQUE (channel_key, run_id, piece)
        );
        CREATE INDEX outbox_open ON outbox (state, id) WHERE state != 'confirmed';
        """,
    ),
    Migration(
        5,
        "access_grants",
        """
        -- Roles given in chat (!role, !ignore), one per identity key.
        CREATE TABLE access_grant (
            identity    TEXT PRIMARY KEY,
            role        TEXT NOT NULL,
            granted_by  TEXT NOT NULL,
            granted_at  REAL NOT NULL
        );
        -- Every change of a grant: who, whose, from what to what, when, where.
        CREATE TABLE access_audit (
            id          INTEGER PRIMARY KEY,
            at          REAL NOT NULL,
            actor       TEXT NOT NULL,
            identity    TEXT NOT NULL,
            old_role    TEXT,
            new_role    TEXT,
            channel     TEXT
        );
        CREATE INDEX access_audit_by_identity ON access_audit (identity, id);
        """,
    ),
    Migration(
        6,
        "approvals",
        """
        -- Tool calls waiting for a person's approval (agentik.core.approvals),
        -- and how each ended.  ``id`` is the short id people type: unique among
        -- the pending approvals of one scope (a channel key, or the conversation
        -- id).  ``arguments`` are stored masked and cut; ``digest`` hashes the
        -- raw ones, to recognise the same call when a resumed turn asks again.
        CREATE TABLE approval (
            serial          INTEGER PRIMARY KEY,
            id              TEXT NOT NULL,
            scope           TEXT NOT NULL,
            conversation_id TEXT NOT NULL REFERENCES conversation (id) ON DELETE CASCADE,
            channel_key     TEXT,
            run_id          TEXT NOT NULL,
            call_id         TEXT NOT NULL,
            tool            TEXT NOT NULL,
            arguments       TEXT NOT NULL DEFAULT '{}',
            digest          TEXT NOT NULL DEFAULT '',
            asker           TEXT,
            asker_id        TEXT,
            approvers       TEXT NOT NULL,
            self_approve    INTEGER NOT NULL DEFAULT 0,
            created_at      REAL NOT NULL,
            expires_at      REAL NOT NULL,
            state           TEXT NOT NULL DEFAULT 'pending'
                            CHECK (state IN ('pending', 'resolved')),
            decision        TEXT
                            CHECK (decision IN ('approved', 'denied', 'expired', 'cancelled')),
            approver        TEXT,
            approver_id     TEXT,
            reason          TEXT,
            resolved_at     REAL
        );
        CREATE UNIQUE INDEX approval_pending_id ON approval (scope, id) WHERE state = 'pending';
        CREATE INDEX approval_by_conversation ON approval (conversation_id, serial);
        CREATE INDEX approval_by_state ON approval (state, serial);
        """,
    ),
    Migration(
        7,
        "budget_usage",
        """
        -- Budget counters (agentik.core.budgets): how much a speaker
        -- (scope 'identity': a qualified id; 'unverified': a transport
        -- instance's unverified speakers together) or a channel (scope
        -- 'channel': its key) used of one kind ('messages', 'tokens',
        -- 'tool_calls') in one fixed UTC window (its start, Unix seconds: a
        -- minute for messages, a day for the others).  The check before a
        -- turn is a primary-key look-up per counter.
        CREATE TABLE budget_usage (
            scope    TEXT NOT NULL CHECK (scope IN ('identity', 'unverified', 'channel')),
            subject  TEXT NOT NULL,
            kind     TEXT NOT NULL CHECK (kind IN ('messages', 'tokens', 'tool_calls')),
            period   INTEGER NOT NULL,
            amount   INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (scope, subject, kind, period)
        ) WITHOUT ROWID;
        CREATE INDEX budget_usage_by_period ON budget_usage (period);
        """,
    ),
    Migration(
        8,
        "channel_settings",
        """
        -- Per-channel settings set in chat (agentik.bot's bridge: !set/!unset):
        -- one row per channel key and setting key; the value is JSON.
        CREATE TABLE channel_setting (
            channel_key TEXT NOT NULL,
            key         TEXT NOT NULL,
            value       TEXT NOT NULL,
            set_by      TEXT NOT NULL,
            set_at      REAL NOT NULL,
            PRIMARY KEY (channel_key, key)
        );
        -- Who changed what, when: append-only (a NULL value is an unset).
        CREATE TABLE channel_setting_audit (
            id          INTEGER PRIMARY KEY,
            channel_key TEXT NOT NULL,
            key         TEXT NOT NULL,
            old_value   TEXT,
            new_value   TEXT,
            actor       TEXT NOT NULL,
            at          REAL NOT NULL
        );
        CREATE INDEX channel_setting_audit_by_channel ON channel_setting_audit (channel_key, id);
        CREATE TRIGGER channel_setting_audit_no_update BEFORE UPDATE ON channel_setting_audit
        BEGIN
            SELECT RAISE(ABORT, 'channel_setting_audit is append-only');
        END;
        """,
    ),
    Migration(
        9,
        "run_tree",
        """
        -- Run trees (agentik.core.agents): a child run (an agent called as a
        -- tool) runs in a conversation of its own, linked to the parent run,
        -- the parent conversation and the parent's tool call; a top-level run
        -- that started children has a row too.  A run is written when it ends
        -- (stop_reason; usage: JSON token counts, its children's included).  A
        -- child refused at the depth limit has no conversation.
        CREATE TABLE run (
            run_id                  TEXT PRIMARY KEY,
            conversation_id         TEXT REFERENCES conversation (id) ON DELETE CASCADE,
            parent_run_id           TEXT,
            parent_conversation_id  TEXT REFERENCES conversation (id) ON DELETE CASCADE,
            parent_call_id          TEXT,
            agent                   TEXT,
            depth                   INTEGER NOT NULL DEFAULT 0,
            started                 REAL NOT NULL,
            ended                   REAL,
            stop_reason             TEXT,
            usage                   TEXT
        );
        CREATE INDEX run_by_conversation ON run (conversation_id);
        CREATE INDEX run_by_parent_conversation ON run (parent_conversation_id);
        CREATE INDEX run_by_parent ON run (parent_run_id);
        """,
    ),
    Migration(
        10,
        "questions",
        """
        -- Questions the model asked the channel (agentik.core.questions:
        -- the builtin ask_user tool), pending until answered, expired or
        -- cancelled.  ``asker_target`` is the person asked (NULL: anyone);
        -- ``digest`` hashes the question, to recognise it when a resumed
        -- turn asks again after a restart.
        CREATE TABLE question (
            id              INTEGER PRIMARY KEY,
            conversation_id TEXT NOT NULL REFERENCES conversation (id) ON DELETE CASCADE,
            channel_key     TEXT,
            run_id          TEXT NOT NULL,
            call_id         TEXT NOT NULL,
            asker_target    TEXT,
            answer_from     TEXT NOT NULL DEFAULT 'asked'
                            CHECK (answer_from IN ('asked', 'anyone')),
            text            TEXT NOT NULL,
            choices         TEXT NOT NULL DEFAULT '[]',
            digest          TEXT NOT NULL DEFAULT '',
            created_at      REAL NOT NULL,
            deadline        REAL NOT NULL,
            state           TEXT NOT NULL DEFAULT 'pending'
                            CHECK (state IN ('pending', 'resolved')),
            outcome         TEXT CHECK (outcome IN ('answered', 'expired', 'cancelled')),
            answer          TEXT,
            answered_by     TEXT,
            answered_at     REAL
        );
        CREATE INDEX question_by_conversation ON question (conversation_id, id);
        CREATE INDEX question_pending ON question (state, id) WHERE state = 'pending';
        """,
    ),
    Migration(
        11,
        "memory_vectors",
        """
        -- Semantic memory (agentik.core.memory.sqlite): one embedding per
        -- note, from the model named in ``model`` (``wordllama:l2_supercat:256``,
        -- ``openai:<name>``) with ``dim`` dimensions, as little-endian float32
        -- in ``vector``.  ``seq`` grows with every (re)write, so a process
        -- catches up with vectors written by another one.  A deleted note's
        -- row is removed; a purged note's goes with it (cascade).
        CREATE TABLE memory_vector (
            seq         INTEGER PRIMARY KEY AUTOINCREMENT,
            note_id     INTEGER NOT NULL UNIQUE REFERENCES memory_note (id) ON DELETE CASCADE,
            model       TEXT NOT NULL,
            dim         INTEGER NOT NULL,
            vector      BLOB NOT NULL
        );
        CREATE INDEX memory_vector_by_model ON memory_vector (model, dim);
        """,
    ),
    Migration(
        12,
        "redaction",
        """
        -- Redaction (agentik.core.redaction): a message's content may be
        -- replaced, once, by a tombstone.  The audit log stays append-only
        -- otherwise: the trigger lets through exactly an UPDATE that sets
        -- ``redacted`` from 0 to 1 and changes nothing but the content, the
        -- arguments and the data.
        ALTER TABLE message ADD COLUMN redacted INTEGER NOT NULL DEFAULT 0;
        DROP TRIGGER message_append_only;
        CREATE TRIGGER message_append_only BEFORE UPDATE ON message
        WHEN NOT (
            old.redacted = 0 AND new.redacted = 1
            AND new.id = old.id
            AND new.conversation_id IS old.conversation_id
            AND new.kind IS old.kind
            AND new.author IS old.author
            AND new.channel IS old.channel
            AND new.run_id IS old.run_id
            AND new.tool_call_id IS old.tool_call_id
            AND new.tool_name IS old.tool_name
            AND new.is_error IS old.is_error
            AND new.status IS old.status
            AND new.duration IS old.duration
            AND new.created_at IS old.created_at
        )
        BEGIN
            SELECT RAISE(ABORT, 'the message audit log is append-only');
        END;

        -- Every redaction: which message, by whom, when, why.  Append-only.
        CREATE TABLE redaction (
            id              INTEGER PRIMARY KEY,
            conversation_id TEXT NOT NULL REFERENCES conversation (id) ON DELETE CASCADE,
            message_id      INTEGER NOT NULL,
            redacted_by     TEXT NOT NULL,
            at              REAL NOT NULL,
            reason          TEXT NOT NULL DEFAULT '',
            notes_removed   INTEGER NOT NULL DEFAULT 0
        );
        CREATE INDEX redaction_by_conversation ON redaction (conversation_id, id);
        CREATE TRIGGER redaction_append_only BEFORE UPDATE ON redaction
        BEGIN
            SELECT RAISE(ABORT, 'redaction is append-only');
        END;

        -- Provenance of memory notes written by mining and reflection: the
        -- span of the conversation's audit log they were derived from.  A
        -- redaction of a message inside a span deletes the note (and its
        -- versions).
        CREATE TABLE memory_source (
            note_id          INTEGER PRIMARY KEY REFERENCES memory_note (id) ON DELETE CASCADE,
            conversation_id  TEXT NOT NULL,
            first_message_id INTEGER NOT NULL,
            last_message_id  INTEGER NOT NULL,
            created_at       REAL NOT NULL
        );
        CREATE INDEX memory_source_by_conversation
            ON memory_source (conversation_id, first_message_id);
        """,
    ),
    Migration(
        13,
        "todo",
        """
        -- Each conversation's checklist (agentik.core.questions: the builtin
        -- todo tool's last list), so it survives a restart: ``items`` is a
        -- JSON array of {text, status}; ``run_id`` the run that wrote it.
        -- It goes with its conversation (cascade).
        CREATE TABLE todo (
            conversation_id TEXT PRIMARY KEY REFERENCES conversation (id) ON DELETE CASCADE,
            items           TEXT NOT NULL DEFAULT '[]',
            run_id          TEXT,
            updated_at      REAL NOT NULL
        );
        """,
    ),
    Migration(
        14,
        "job_runs",
        """
        -- Scheduled jobs (agentik.core.cluster.jobs): one row per firing of a job,
        -- claimed by one worker with an INSERT that only one can win (the primary
        -- key), then finished with its outcome.  ``slot`` names the firing the way
        -- every worker computes it alike.  Old rows are pruned.
        CREATE TABLE job_run (
            name         TEXT NOT NULL,
            slot         TEXT NOT NULL,
            worker       TEXT NOT NULL,
            claimed_at   REAL NOT NULL,
            finished_at  REAL,
            ok           INTEGER,
            detail       TEXT,
            attempts     INTEGER NOT NULL DEFAULT 1,
            PRIMARY KEY (name, slot)
        ) WITHOUT ROWID;
        """,
    ),
    Migration(
        15,
        "cluster",
        """
        -- Named leases with a fencing epoch (agentik.core.cluster: who owns a
        -- chat connection) and the registry of worker processes.  SQLite is
        -- one process's store: a bot on it keeps its leases in memory; these
        -- tables keep the store contract whole (and PostgreSQL's twins).
        CREATE TABLE lease (
            name        TEXT PRIMARY KEY,
            owner       TEXT NOT NULL,
            epoch       INTEGER NOT NULL,
            acquired_at REAL NOT NULL,
            expires_at  REAL NOT NULL
        );
        CREATE TABLE worker (
            id          TEXT PRIMARY KEY,
            host        TEXT NOT NULL DEFAULT '',
            pid         INTEGER NOT NULL DEFAULT 0,
            started_at  REAL NOT NULL DEFAULT 0,
            version     TEXT NOT NULL DEFAULT '',
            draining    INTEGER NOT NULL DEFAULT 0,
            last_beat   REAL NOT NULL
        );
        """,
    ),
    Migration(
        16,
        "seen_event",
        """
        -- Events a transport has handled (agentik.core.store: seen_first), shared by
        -- every process of the bot: Slack redelivers an event it thinks was not
        -- acknowledged, possibly to another worker.  ``at``: when the key was (last)
        -- first seen; rows older than the transport's window are pruned (rarely, a
        -- scan of a small table: no index on ``at``).
        CREATE TABLE seen_event (
            key  TEXT PRIMARY KEY,
            at   REAL NOT NULL
        ) WITHOUT ROWID;
        """,
    ),
    Migration(
        17,
        "turn_queue",
        """
        -- The turn queue (agentik.core.cluster.conversations: PostgreSQL's migration 6).
        -- A bot on SQLite (one process) never queues a turn here; the table keeps the
        -- store contract whole.
        CREATE TABLE turn_queue (
            message_id       INTEGER PRIMARY KEY,
            conversation_id  TEXT NOT NULL REFERENCES conversation (id) ON DELETE CASCADE,
            run_id           TEXT NOT NULL,
            payload          TEXT NOT NULL,
            enqueued_at      REAL NOT NULL,
            claimed_by       TEXT,
            claimed_at       REAL,
            attempts         INTEGER NOT NULL DEFAULT 0
        );
        CREATE INDEX turn_queue_by_conversation ON turn_queue (conversation_id, message_id);
        """,
    ),
    Migration(
        18,
        "run_event",
        """
        -- What a conversation's turns emitted (seq, the event's JSON as the SSE
        -- stream sends it), for SSE clients on another worker (PostgreSQL's twin,
        -- migration 7).  A bot on SQLite is one process and writes nothing here.
        CREATE TABLE run_event (
            conversation_id  TEXT NOT NULL,
            seq              INTEGER NOT NULL,
            at               REAL NOT NULL,
            data             TEXT NOT NULL,
            PRIMARY KEY (conversation_id, seq)
        ) WITHOUT ROWID;
        """,
    ),
    Migration(
        19,
        "links",
        """
        -- Linked channels (issue 33): links made at run time (``!link``; the
        -- ``[[links]]`` of the configuration are not stored), and the persistent
        -- message map: every copy of a relayed message, by its canonical id, with
        -- its id in that channel once known (edits and deletes of any age find
        -- their copies; no size cap, kept across restarts).
        CREATE TABLE link (
            name        TEXT PRIMARY KEY,
            channels    TEXT NOT NULL,
            options     TEXT NOT NULL DEFAULT '{}',
            created_by  TEXT NOT NULL DEFAULT '',
            created_at  REAL NOT NULL
        );
        CREATE TABLE link_message (
            link        TEXT NOT NULL,
            canonical   TEXT NOT NULL,
            channel_key TEXT NOT NULL,
            ref         TEXT,
            origin      INTEGER NOT NULL DEFAULT 0,
            run_id      TEXT,
            piece       INTEGER,
            created_at  REAL NOT NULL,
            PRIMARY KEY (canonical, channel_key)
        ) WITHOUT ROWID;
        CREATE INDEX link_message_by_ref ON link_message (channel_key, ref);
        """,
    ),
    Migration(
        20,
        "attachments",
        """
        -- Attachments (issue 34): which conversation holds which bytes.  The bytes
        -- are files named by their SHA-256 in the folder beside the database
        -- (``<database>.attachments/``), one copy whoever holds them.
        CREATE TABLE attachment (
            conversation_id TEXT NOT NULL REFERENCES conversation (id) ON DELETE CASCADE,
            sha256          TEXT NOT NULL,
            media_type      TEXT NOT NULL,
            size            INTEGER NOT NULL,
            created_at      REAL NOT NULL,
            PRIMARY KEY (conversation_id, sha256)
        ) WITHOUT ROWID;
        CREATE INDEX attachment_by_hash ON attachment (sha256);
        """,
    ),
    Migration(
        21,
        "message_search",
        """
        -- Full-text search over the audit log (issue 34): what people and the model
        -- said (user and assistant rows), indexed by FTS5 without a second copy of
        -- the text (external content), kept by triggers: an insert adds a row, a
        -- delete (a conversation's, retention's) removes it, a redaction replaces it.
        CREATE VIRTUAL TABLE message_fts USING fts5 (
            content, content = 'message', content_rowid = 'id',
            tokenize = 'unicode61 remove_diacritics 2'
        );
        INSERT INTO message_fts (rowid, content)
            SELECT id, content FROM message WHERE kind IN ('user', 'assistant');
        CREATE TRIGGER message_fts_ai AFTER INSERT ON message
        WHEN new.kind IN ('user', 'assistant') BEGIN
            INSERT INTO message_fts (rowid, content) VALUES (new.id, new.content);
        END;
        CREATE TRIGGER message_fts_ad AFTER DELETE ON message
        WHEN old.kind IN ('user', 'assistant') BEGIN
            INSERT INTO message_fts (message_fts, rowid, content)
            VALUES ('delete', old.id, old.content);
        END;
        CREATE TRIGGER message_fts_au AFTER UPDATE OF content ON message
        WHEN old.kind IN ('user', 'assistant') BEGIN
            INSERT INTO message_fts (message_fts, rowid, content)
            VALUES ('delete', old.id, old.content);
            INSERT INTO message_fts (rowid, content) VALUES (new.id, new.content);
        END;
        """,
    ),
    Migration(
        22,
        "webhook_delivery",
        """
        -- Outbound webhooks (issue 35): each event on its way to a ``[[webhooks]]``
        -- receiver, an outbox for HTTP.  ``id`` is the delivery id the receiver
        -- dedupes on; ``body`` the JSON sent (signed afresh at each attempt); a
        -- worker sends the rows it claimed (``claimed_by`` until ``claimed_until``);
        -- ``dead`` rows are dead letters until an operator replays them.
        CREATE TABLE webhook_delivery (
            id               TEXT PRIMARY KEY,
            webhook          TEXT NOT NULL,
            event_kind       TEXT NOT NULL,
            conversation_id  TEXT NOT NULL,
            body             TEXT NOT NULL,
            created_at       REAL NOT NULL,
            state            TEXT NOT NULL DEFAULT 'pending',
            attempts         INTEGER NOT NULL DEFAULT 0,
            next_at          REAL NOT NULL DEFAULT 0,
            claimed_by       TEXT,
            claimed_until    REAL,
            last_error       TEXT,
            finished_at      REAL
        ) WITHOUT ROWID;
        CREATE INDEX webhook_delivery_due ON webhook_delivery (state, next_at);
        CREATE INDEX webhook_delivery_by_age ON webhook_delivery (created_at, id);
        """,
    ),
    Migration(
        23,
        "question_form",
        """
        -- Multi-question ask_user (issue 35): a form is one question row; ``form``
        -- holds its fields (JSON: id, text, choices, required), ``partial`` the
        -- answers given so far (JSON: field id -> answer), so a restart while it
        -- waits keeps both.  NULL on a single question.
        ALTER TABLE question ADD COLUMN form TEXT;
        ALTER TABLE question ADD COLUMN partial TEXT;
        """,
    ),
    Migration(
        24,
        "a2a_task",
        """
        -- A2A task records (issue 35): what tasks/get, tasks/list and tasks/cancel
        -- read after a restart and on every worker.  ``body`` is the SDK's task as
        -- JSON without what people and the model said (that text is the audit
        -- log's: the rows of ``run_id``); ``final``: terminal, never replaced.
        CREATE TABLE a2a_task (
            owner            TEXT NOT NULL,
            task_id          TEXT NOT NULL,
            conversation_id  TEXT NOT NULL REFERENCES conversation (id) ON DELETE CASCADE,
            run_id           TEXT,
            state            TEXT NOT NULL,
            final            INTEGER NOT NULL DEFAULT 0,
            updated_at       REAL NOT NULL,
            body             TEXT NOT NULL,
            PRIMARY KEY (owner, task_id)
        ) WITHOUT ROWID;
        CREATE INDEX a2a_task_by_age ON a2a_task (owner, updated_at, task_id);
        CREATE INDEX a2a_task_by_conversation ON a2a_task (conversation_id);
        """,
    ),
    Migration(
        25,
        "budget_held",
        """
        -- Token reservations in the database (issue 32): a running turn's estimate is
        -- a counter of kind ``tokens_held`` whose period is the minute it lapses (a
        -- crashed worker's reservations end by themselves); the token check counts
        -- them with the tokens used.  SQLite cannot change a CHECK: the table is
        -- made again with the new kind allowed.
        CREATE TABLE budget_usage_new (
            scope    TEXT NOT NULL CHECK (scope IN ('identity', 'unverified', 'channel')),
            subject  TEXT NOT NULL,
            kind     TEXT NOT NULL
                     CHECK (kind IN ('messages', 'tokens', 'tool_calls', 'tokens_held')),
            period   INTEGER NOT NULL,
            amount   INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (scope, subject, kind, period)
        ) WITHOUT ROWID;
        INSERT INTO budget_usage_new (scope, subject, kind, period, amount)
            SELECT scope, subject, kind, period, amount FROM budget_usage;
        DROP TABLE budget_usage;
        ALTER TABLE budget_usage_new RENAME TO budget_usage;
        CREATE INDEX budget_usage_by_period ON budget_usage (period);
        """,
    ),
    Migration(
        26,
        "checkpoint",
        """
        -- Checkpoints (issue 35): stored snapshots of a conversation (the export
        -- document, JSON text), listable per conversation; ``automatic`` ones
        -- (taken when the conversation ends) are trimmed to the last N.
        CREATE TABLE checkpoint (
            id              INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id TEXT NOT NULL REFERENCES conversation (id) ON DELETE CASCADE,
            created_at      REAL NOT NULL,
            label           TEXT NOT NULL DEFAULT '',
            automatic       INTEGER NOT NULL DEFAULT 0,
            size            INTEGER NOT NULL,
            document        TEXT NOT NULL
        );
        CREATE INDEX checkpoint_by_conversation ON checkpoint (conversation_id, id);
        """,
    ),
    Migration(
        27,
        "run_event_position",
        """
        -- The agent-wide event stream's position of each stored event (PostgreSQL's
        -- twin, migration 16): ``pos`` (NULL: a child run's event relayed into its
        -- parent's stream, or a row from before), ``run_event_position``: the last
        -- ``pos`` given and the highest one the retention pruned.
        ALTER TABLE run_event ADD COLUMN pos INTEGER;
        CREATE UNIQUE INDEX run_event_by_pos ON run_event (pos);
        CREATE TABLE run_event_position (
            id      INTEGER PRIMARY KEY CHECK (id = 1),
            last    INTEGER NOT NULL DEFAULT 0,
            pruned  INTEGER NOT NULL DEFAULT 0
        );
        INSERT INTO run_event_position (id, last, pruned) VALUES (1, 0, 0);
        """,
    ),
)


def schema_version(conn: sqlite3.Connection) -> int:
    """The highest applied migration number (0 for a blank database)."""
    row = conn.execute(
        "SELECT name FROM sqlite_master WHERE type='table' AND name='schema_migrations'"
    ).fetchone()
    if row is None:
        return 0
    row = conn.execute("SELECT COALESCE(MAX(number), 0) FROM schema_migrations").fetchone()
    return int(row[0]) if row else 0


def missing_migrations(
    conn: sqlite3.Connection, migrations: tuple[Migration, ...] = MIGRATIONS
) -> list[Migration]:
    """The known migrations this database has not applied, in order.

    Not only those newer than its version: a database made by a build whose
    migrations were merged out of order (say 1-4 and 8) lacks 5-7 too.
    """
    row = conn.execute(
        "SELECT name FROM sqlite_master WHERE type='table' AND name='schema_migrations'"
    ).fetchone()
    done = (
        {int(r[0]) for r in conn.execute("SELECT number FROM schema_migrations")}
        if row is not None
        else set()
    )
    return sorted((m for m in migrations if m.number not in done), key=lambda m: m.number)


def apply_migrations(
    conn: sqlite3.Connection,
    migrations: tuple[Migration, ...] = MIGRATIONS,
    *,
    target: int | None = None,
) -> list[int]:
    """Apply every migration the database lacks, up to ``target``.

    ``conn`` must be in autocommit mode (``isolation_level=None``).  Returns
    the numbers applied.  Refuses a database whose schema is newer than this
    code knows.
    """
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations ("
        " number INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
    )
    current = schema_version(conn)
    known = max((m.number for m in migrations), default=0)
    if current > known:
        raise MigrationError(
            f"database schema version {current} is newer than this agentik knows ({known})"
        )
    applied: list[int] = []
    for m in missing_migrations(conn, migrations):
        if target is not None and m.number > target:
            continue
        script = (
            "BEGIN IMMEDIATE;\n"
            f"{m.sql}\n"
            f"INSERT INTO schema_migrations (number, name, applied_at)"
            f" VALUES ({m.number}, '{m.name}', {time.time()!r});\n"
            f"PRAGMA user_version = {m.number};\n"
            "COMMIT;"
        )
        try:
            conn.executescript(script)
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise MigrationError(f"migration {m.number} ({m.name}) failed: {exc}") from exc
        applied.append(m.number)
    return applied
