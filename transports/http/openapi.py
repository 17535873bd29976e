"""The OpenAPI 3.1 document of the HTTP API, served at ``<prefix>/openapi.json``.

Written by hand to say exactly what the server does; the test suite runs
schemathesis against it (every documented status, body and content type
is checked against real responses).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "AUTHOR_CHARS",
    "AUTHOR_PATTERN",
    "ERROR_CODES",
    "SNAPSHOT_ID_PATTERN",
    "TITLE_PATTERN",
    "UNPRINTABLE",
    "openapi_document",
]

#: Longest ``author`` a client may give.
AUTHOR_CHARS = 64
#: What an ``author`` may contain: no control characters (line breaks, escapes,
#: C1 controls), no invisible format characters (zero-width, bidi overrides),
#: no line/paragraph separators; at least one visible character.  The same
#: regular expression in the document (ECMA-262) and in the server (Python).
_BAD = (
    "\\x00-\\x1f\\x7f-\\x9f\\u00ad\\u061c\\u180e\\u200b-\\u200f"
    "\\u2028-\\u202e\\u2060-\\u206f\\ufeff\\ufff9-\\ufffb"
)
AUTHOR_PATTERN = f"^[^{_BAD}]*[^\\s{_BAD}][^{_BAD}]*$"
#: What a conversation's ``title`` may contain: the same characters, or none.
#: (Titles are printed by ``agentik conversations list``: an escape sequence in
#: one would drive the operator's terminal.)
TITLE_PATTERN = f"^[^{_BAD}]*$"
#: A conversation id a snapshot may bring: one the API's paths can address (no
#: ``/``, not ``.`` or ``..``) and without control characters.
SNAPSHOT_ID_PATTERN = "^(?!\\.\\.?$)[^/\\x00-\\x1f\\x7f-\\x9f]+$"
#: The characters neither may contain, as a regular-expression class.
UNPRINTABLE = f"[{_BAD}]"

#: Every ``error.code`` the API answers with.
ERROR_CODES = (
    "unauthorized",
    "forbidden",
    "host_not_allowed",
    "origin_not_allowed",
    "not_found",
    "conversation_not_found",
    "method_not_allowed",
    "no_turn_running",
    "turn_already_interrupted",
    "run_not_running",
    "approval_not_found",
    "approval_not_pending",
    "message_not_found",
    "question_not_found",
    "invalid_answer",
    "already_redacted",
    "body_too_large",
    "attachment_too_large",
    "attachment_rejected",
    "attachment_not_found",
    "checkpoint_not_found",
    "checkpoint_limit",
    "conversation_exists",
    "invalid_snapshot",
    "unsupported_media_type",
    "invalid_body",
    "invalid_parameter",
    "prompt_refused",
    "cannot_branch",
    "budget_exceeded",
    "not_supported",
    "unavailable",
    "internal_error",
)

_NULLABLE_STR = {"type": ["string", "null"]}
#: An A2A task record's owner, id or state in a snapshot: no control characters.
_TASK_FIELD = "^[^\\x00-\\x1f\\x7f-\\x9f]{1,%d}$"
#: ``GET /conversations?children=``: child-run conversations listed with the others
#: (the default, as ``agentik conversations list`` does), left out, or listed alone.
CHILDREN = ("include", "exclude", "only")
#: Largest integer a snapshot may hold (agentik.core.lifecycle.MAX_INT).
_MAX_INT = 2**62

_SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {
                    "code": {"type": "string", "enum": list(ERROR_CODES)},
                    "message": {"type": "string"},
                },
            }
        },
    },
    "Health": {
        "type": "object",
        "required": ["status"],
        "properties": {
            "status": {"type": "string", "enum": ["ok", "unavailable"]},
            "ready": {"type": "boolean"},
            "degraded": {"type": "array", "items": {"type": "string"}},
            "components": {"$ref": "#/components/schemas/Components"},
        },
    },
    "Ready": {
        "type": "object",
        "required": ["status", "ready", "components"],
        "properties": {
            "status": {"type": "string", "enum": ["ready", "not ready"]},
            "ready": {"type": "boolean"},
            "degraded": {"type": "array", "items": {"type": "string"}},
            "components": {"$ref": "#/components/schemas/Components"},
        },
    },
    "Components": {
        "type": "object",
        "description": "transport:<name>, mcp:<server>, model:<backend>: each one's state",
        "additionalProperties": {
            "type": "object",
            "required": ["state", "since"],
            "properties": {
                "state": {
                    "type": "string",
                    "enum": ["starting", "connected", "degraded", "reconnecting", "failed"],
                },
                "reason": {"type": ["string", "null"]},
                "since": {"type": "number"},
                "ready": {"type": "boolean"},
            },
        },
    },
    "Status": {
        "type": "object",
        "required": ["agent_id", "version", "uptime", "ready", "components", "conversations"],
        "properties": {
            "agent_id": {
                "type": "string",
                "description": "the agent's id (the bot's [agent] name)",
            },
            "version": {"type": "string"},
            "started": {"type": "number"},
            "uptime": {"type": "number"},
            "ready": {"type": "boolean"},
            "degraded": {"type": "array", "items": {"type": "string"}},
            "components": {"$ref": "#/components/schemas/Components"},
            "conversations": {
                "type": "object",
                "properties": {
                    "busy": {"type": "integer"},
                    "queued": {"type": "integer"},
                    "active": {"type": "array", "items": {"type": "object"}},
                },
            },
        },
    },
    "Conversation": {
        "type": "object",
        "required": [
            "id",
            "title",
            "temp",
            "channel_key",
            "created_at",
            "updated_at",
            "busy",
            "running_run_id",
            "queued",
            "parent",
            "capabilities",
        ],
        "properties": {
            "id": {"type": "string"},
            "title": {"type": "string"},
            "temp": {"type": "boolean", "description": "kept in memory only, never on disk"},
            "channel_key": {
                **_NULLABLE_STR,
                "description": "e.g. http:<instance>:<token name>:<id>, irc:<net>:<#chan>",
            },
            "created_at": {"type": "number", "description": "Unix time"},
            "updated_at": {"type": "number", "description": "Unix time"},
            "busy": {"type": "boolean", "description": "a turn is running or queued"},
            "running_run_id": _NULLABLE_STR,
            "queued": {"type": "integer", "minimum": 0},
            "parent": {
                "oneOf": [{"$ref": "#/components/schemas/ParentLink"}, {"type": "null"}],
                "description": "a child run's conversation (an [agents.*] agent called as a"
                " tool): where it comes from; null for a top-level conversation",
            },
            "capabilities": {
                "type": "object",
                "required": ["image_in", "image_out"],
                "description": "what its model takes and gives: image_in, images as images"
                " (else as a one-line description); image_out, images in answers",
                "properties": {
                    "image_in": {"type": "boolean"},
                    "image_out": {"type": "boolean"},
                },
            },
        },
    },
    "Attachment": {
        "type": "object",
        "required": ["sha256", "media_type", "size", "name", "kind", "url"],
        "properties": {
            "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
            "media_type": {
                "type": "string",
                "description": "sniffed from the bytes (PNG, JPEG, GIF, WebP, PDF, UTF-8 text)",
            },
            "size": {"type": "integer", "minimum": 1},
            "name": {"type": "string"},
            "kind": {"type": "string", "enum": ["image", "file"]},
            "url": {"type": "string", "description": "where it is served back"},
        },
    },
    "Upload": {
        "type": "object",
        "additionalProperties": False,
        "required": ["file"],
        "properties": {"file": {"type": "string", "format": "binary"}},
    },
    "ParentLink": {
        "type": "object",
        "description": "the fields of the parent's child_run_linked event",
        "required": ["conversation_id", "run_id", "call_id", "child_run_id", "agent"],
        "properties": {
            "conversation_id": {"type": "string", "description": "the parent conversation"},
            "run_id": {**_NULLABLE_STR, "description": "the parent run that called the agent"},
            "call_id": {**_NULLABLE_STR, "description": "the parent's tool call"},
            "child_run_id": {**_NULLABLE_STR, "description": "this conversation's run"},
            "agent": {**_NULLABLE_STR, "description": "the agent called"},
        },
    },
    "ConversationPage": {
        "type": "object",
        "required": ["items", "offset", "limit", "next_offset"],
        "properties": {
            "items": {"type": "array", "items": {"$ref": "#/components/schemas/Conversation"}},
            "offset": {"type": "integer", "minimum": 0},
            "limit": {"type": "integer", "minimum": 1},
            "next_offset": {"type": ["integer", "null"]},
        },
    },
    "SearchHit": {
        "type": "object",
        "required": [
            "conversation_id",
            "conversation_title",
            "message_id",
            "kind",
            "author",
            "run_id",
            "created_at",
            "snippet",
        ],
        "properties": {
            "conversation_id": {"type": "string"},
            "conversation_title": {"type": "string"},
            "message_id": {"type": "integer", "description": "the audit-log row"},
            "kind": {"type": "string", "enum": ["user", "assistant"]},
            "author": {"type": ["string", "null"]},
            "run_id": {"type": ["string", "null"]},
            "created_at": {"type": "number"},
            "snippet": {
                "type": "string",
                "description": "plain text around the first word found (about 160 characters)",
            },
        },
    },
    "SearchPage": {
        "type": "object",
        "required": ["items", "offset", "limit", "next_offset"],
        "properties": {
            "items": {"type": "array", "items": {"$ref": "#/components/schemas/SearchHit"}},
            "offset": {"type": "integer", "minimum": 0},
            "limit": {"type": "integer", "minimum": 1},
            "next_offset": {"type": ["integer", "null"]},
        },
    },
    "NewConversation": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "temp": {"type": "boolean", "default": False},
            "title": {
                "type": "string",
                "maxLength": 200,
                "pattern": TITLE_PATTERN,
                "default": "",
                "description": "one line, no control characters",
            },
        },
    },
    "CheckpointRequest": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "label": {
                "type": "string",
                "maxLength": 200,
                "pattern": TITLE_PATTERN,
                "default": "",
                "description": "one line, no control characters",
            }
        },
    },
    "Checkpoint": {
        "type": "object",
        "description": "A stored snapshot of the conversation (docs/lifecycle.md#checkpoints)",
        "required": ["id", "conversation_id", "created_at", "label", "automatic", "size"],
        "properties": {
            "id": {"type": "integer"},
            "conversation_id": {"type": "string"},
            "created_at": {"type": "number"},
            "label": {"type": "string"},
            "automatic": {
                "type": "boolean",
                "description": "taken when the conversation ended ([checkpoints] keep_automatic)",
            },
            "size": {"type": "integer", "description": "the snapshot's length in bytes"},
        },
    },
    "CheckpointList": {
        "type": "object",
        "required": ["items"],
        "properties": {
            "items": {
                "type": "array",
                "description": "newest first",
                "items": {"$ref": "#/components/schemas/Checkpoint"},
            }
        },
    },
    "Rename": {
        "type": "object",
        "additionalProperties": False,
        "required": ["title"],
        "properties": {
            "title": {
                "type": ["string", "null"],
                "maxLength": 200,
                "pattern": TITLE_PATTERN,
                "description": "one line, no control characters; null or empty clears it."
                " Renaming moves updated_at to now",
            }
        },
    },
    "NewMessage": {
        "type": "object",
        "additionalProperties": False,
        # Words, or attachments, or both: an image on its own is a message.
        "anyOf": [
            {
                "required": ["content"],
                "properties": {"content": {"minLength": 1, "pattern": "\\S"}},
            },
            {"required": ["attachments"], "properties": {"attachments": {"minItems": 1}}},
        ],
        "properties": {
            "content": {
                "type": "string",
                "default": "",
                "description": "the words; may be left out or blank when attachments are given",
            },
            "author": {
                "type": ["string", "null"],
                "minLength": 1,
                "maxLength": AUTHOR_CHARS,
                "pattern": AUTHOR_PATTERN,
                "description": "the speaker's name for the model (default: the token's name):"
                " one line, no control characters; a label, not an identity",
            },
            "busy": {
                "type": "string",
                "enum": ["queue", "steer", "interrupt"],
                "default": "queue",
                "description": "when a turn is running: queue a turn (queue), join the running"
                " turn at its next model request (steer; queued when it cannot take it), or"
                " stop it and start a new turn (interrupt)",
            },
            "attachments": {
                "type": "array",
                "maxItems": 10,
                "description": "images and files uploaded to the conversation before"
                " (POST .../attachments), by hash",
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["sha256"],
                    "properties": {
                        "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                        "name": {"type": "string", "maxLength": 200},
                    },
                },
            },
        },
    },
    "MessageAccepted": {
        "type": "object",
        "required": ["conversation_id", "run_id", "queued", "title"],
        "properties": {
            "conversation_id": {"type": "string"},
            "run_id": {"type": "string"},
            "title": {
                "type": "string",
                "description": "the conversation's title (an untitled one of this API is "
                "named by its first message)",
            },
            "queued": {
                "type": "integer",
                "minimum": 0,
                "description": "turns waiting behind the running one",
            },
            "steered": {
                "type": "boolean",
                "description": "the message joined the running turn (run_id is that turn's)",
            },
            "branch_of": {
                "type": "integer",
                "description": "regenerate and edit only: the audit-log id of the question"
                " this one replaces in the model's context (it stays in the audit log)",
            },
        },
    },
    "Regenerate": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "author": {
                "type": ["string", "null"],
                "minLength": 1,
                "maxLength": AUTHOR_CHARS,
                "pattern": AUTHOR_PATTERN,
                "description": "who asks again (default: who asked)",
            },
        },
    },
    "Edit": {
        "type": "object",
        "additionalProperties": False,
        "required": ["content"],
        "properties": {
            "content": {"type": "string", "minLength": 1, "pattern": "\\S"},
            "author": {
                "type": ["string", "null"],
                "minLength": 1,
                "maxLength": AUTHOR_CHARS,
                "pattern": AUTHOR_PATTERN,
                "description": "the speaker's name for the model (default: the token's name)",
            },
        },
    },
    "ConversationStatus": {
        "type": "object",
        "required": ["conversation_id", "state", "run_id", "tools", "queued", "usage"],
        "properties": {
            "conversation_id": {"type": "string"},
            "state": {
                "type": "string",
                "enum": ["idle", "running", "streaming", "executing_tools", "awaiting_human"],
            },
            "run_id": {**_NULLABLE_STR, "description": "the running turn"},
            "tools": {
                "type": "array",
                "items": {"type": "string"},
                "description": "the tool calls running now",
            },
            "queued": {"type": "integer", "minimum": 0},
            "usage": {
                "type": "object",
                "description": "tokens of the running turn so far",
                "properties": {
                    "prompt_tokens": {"type": "integer"},
                    "completion_tokens": {"type": "integer"},
                    "total_tokens": {"type": "integer"},
                },
            },
            "requests": {"type": "integer", "minimum": 0, "description": "model requests so far"},
            "todo": {
                "anyOf": [{"type": "null"}, {"$ref": "#/components/schemas/Checklist"}],
                "description": "the conversation's checklist (the todo tool), null if none",
            },
        },
    },
    "Checklist": {
        "type": "object",
        "description": "A conversation's checklist: the todo tool's last list (docs/asking.md)",
        "required": ["items"],
        "properties": {
            "items": {
                "type": "array",
                "maxItems": 30,
                "items": {
                    "type": "object",
                    "required": ["text", "status"],
                    "properties": {
                        "text": {"type": "string", "minLength": 1, "maxLength": 200},
                        "status": {"type": "string", "enum": ["pending", "in_progress", "done"]},
                    },
                },
            },
            "done": {"type": "integer", "minimum": 0, "description": "items done"},
            "total": {"type": "integer", "minimum": 0, "description": "items in all"},
            "run_id": {**_NULLABLE_STR, "description": "the run that wrote it"},
            "updated_at": {"type": ["number", "null"]},
        },
    },
    "Interrupt": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "run_id": {
                "type": ["string", "null"],
                "description": "only stop this run; a run still queued behind the running"
                " one is withdrawn (it never runs); 409 otherwise",
            }
        },
    },
    "InterruptAccepted": {
        "type": "object",
        "required": ["conversation_id", "run_id"],
        "properties": {
            "conversation_id": {"type": "string"},
            "run_id": {"type": "string"},
            "withdrawn": {
                "type": "boolean",
                "description": "true: the run was still queued and was taken back (it never runs)",
            },
        },
    },
    "Message": {
        "type": "object",
        "description": "One row of the append-only audit log.",
        "required": ["id", "conversation_id", "kind", "content", "status", "created_at"],
        "properties": {
            "id": {"type": "integer"},
            "conversation_id": {"type": "string"},
            "kind": {"type": "string", "enum": ["user", "assistant", "tool_call", "tool_result"]},
            "content": {"type": "string"},
            "author": _NULLABLE_STR,
            "channel": _NULLABLE_STR,
            "run_id": _NULLABLE_STR,
            "tool_call_id": _NULLABLE_STR,
            "tool_name": _NULLABLE_STR,
            "arguments": _NULLABLE_STR,
            "is_error": {"type": "boolean"},
            "status": {"type": "string", "enum": ["complete", "interrupted", "error"]},
            "data": {},
            "duration": {"type": ["number", "null"]},
            "created_at": {"type": "number"},
        },
    },
    "MessagePage": {
        "type": "object",
        "required": ["items", "next_after", "prev_before"],
        "properties": {
            "items": {"type": "array", "items": {"$ref": "#/components/schemas/Message"}},
            "next_after": {
                "type": ["integer", "null"],
                "description": "paging forward (after= or offset= given): pass as after="
                " (null: no more)",
            },
            "next_offset": {
                "type": ["integer", "null"],
                "description": "paging with offset=: pass as offset= (null: no more)",
            },
            "prev_before": {
                "type": ["integer", "null"],
                "description": "the latest page (no after=): pass as before= for older ones",
            },
        },
    },
    "Approval": {
        "type": "object",
        "description": "A tool call waiting for a person's approval, or how it ended.",
        "required": [
            "id",
            "conversation_id",
            "run_id",
            "call_id",
            "tool",
            "arguments",
            "approvers",
            "created_at",
            "expires_at",
            "state",
            "decision",
        ],
        "properties": {
            "id": {"type": "string", "description": "the short id people answer with"},
            "conversation_id": {"type": "string"},
            "channel_key": _NULLABLE_STR,
            "run_id": {"type": "string"},
            "call_id": {"type": "string"},
            "tool": {"type": "string"},
            "arguments": {"type": "string", "description": "JSON, secrets masked, cut"},
            "asker": _NULLABLE_STR,
            "asker_id": _NULLABLE_STR,
            "approvers": {"type": "string", "description": "the role that may decide"},
            "created_at": {"type": "number"},
            "expires_at": {"type": "number"},
            "state": {"type": "string", "enum": ["pending", "resolved"]},
            "decision": {
                "type": ["string", "null"],
                "enum": ["approved", "denied", "expired", "cancelled", None],
            },
            "approver": _NULLABLE_STR,
            "approver_id": _NULLABLE_STR,
            "reason": _NULLABLE_STR,
            "resolved_at": {"type": ["number", "null"]},
            "may_approve": {
                "type": "boolean",
                "description": "(in lists) whether the caller may approve it now",
            },
            "may_deny": {
                "type": "boolean",
                "description": "(in lists) whether the caller may deny it now",
            },
        },
    },
    "ApprovalList": {
        "type": "object",
        "required": ["items"],
        "properties": {
            "items": {"type": "array", "items": {"$ref": "#/components/schemas/Approval"}}
        },
    },
    "RedactRequest": {
        "type": "object",
        "additionalProperties": False,
        "properties": {"reason": {"type": "string", "maxLength": 300}},
    },
    "Redaction": {
        "type": "object",
        "required": ["conversation_id", "message_id", "by", "at", "reason", "notes_removed"],
        "properties": {
            "id": {"type": "integer"},
            "conversation_id": {"type": "string"},
            "message_id": {"type": "integer"},
            "by": {"type": "string"},
            "at": {"type": "number"},
            "reason": {"type": "string"},
            "notes_removed": {"type": "integer"},
        },
    },
    "FormAnswer": {
        "type": "object",
        "additionalProperties": False,
        "required": ["answers"],
        "description": (
            "A form's answers (a multi-question ask_user): question id -> text (null or"
            " empty: not answered). submit (default true) sends the whole form: empty"
            " optional questions are skipped, empty required ones refused; false keeps"
            " these answers and the form waits for the rest."
        ),
        "properties": {
            "answers": {
                "type": "object",
                "maxProperties": 10,
                "additionalProperties": {"type": ["string", "null"]},
            },
            "submit": {"type": "boolean"},
        },
    },
    "FormProgress": {
        "type": "object",
        "required": ["question_id", "done", "answered", "missing"],
        "properties": {
            "question_id": {"type": "integer"},
            "done": {"type": "boolean"},
            "answered": {"type": "array", "items": {"type": "string"}},
            "missing": {"type": "array", "items": {"type": "string"}},
        },
    },
    "Decision": {
        "type": "object",
        "additionalProperties": False,
        "required": ["decision"],
        "properties": {
            "decision": {"type": "string", "enum": ["approve", "deny"]},
            "reason": {"type": ["string", "null"], "maxLength": 300},
        },
    },
    "Snapshot": {
        "type": "object",
        "description": (
            "A conversation snapshot (agentik conversations export; docs/lifecycle.md). "
            "An export also carries approvals, questions and runs (arrays of rows)"
            " and the checklist (todo, optional), the conversation's checkpoints and its"
            " A2A task records (optional; imported tasks belong to imported:<token>)."
        ),
        "required": ["format", "version", "conversation", "messages", "working_memory"],
        "properties": {
            "format": {"const": "agentik.conversation"},
            "version": {"const": 1},
            "conversation": {"$ref": "#/components/schemas/SnapshotConversation"},
            "messages": {
                "type": "array",
                "items": {"$ref": "#/components/schemas/SnapshotMessage"},
            },
            "working_memory": {
                "type": "array",
                "items": {"$ref": "#/components/schemas/SnapshotEntry"},
            },
            "bindings": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["channel_key"],
                    "properties": {"channel_key": {"type": "string", "minLength": 1}},
                },
            },
            "turn_ends": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["run_id", "outcome"],
                    "properties": {
                        "run_id": {"type": "string"},
                        "outcome": {"type": "string"},
                        "created_at": {"type": ["number", "null"]},
                    },
                },
            },
            "todo": {"anyOf": [{"type": "null"}, {"$ref": "#/components/schemas/Checklist"}]},
            "checkpoints": {
                "type": ["array", "null"],
                "maxItems": 1000,
                "description": "oldest first; each document is a snapshot without checkpoints",
                "items": {
                    "type": "object",
                    "required": ["created_at", "document"],
                    "properties": {
                        "created_at": {"type": "number"},
                        "label": {
                            "type": ["string", "null"],
                            "maxLength": 200,
                            "description": "made one line (runs of white space: one space)",
                        },
                        "automatic": {"type": ["boolean", "null"]},
                        "document": {"$ref": "#/components/schemas/CheckpointDocument"},
                    },
                },
            },
            "a2a_tasks": {
                "type": ["array", "null"],
                "maxItems": 10000,
                "items": {
                    "type": "object",
                    "required": ["owner", "task_id", "state", "updated_at", "body"],
                    "properties": {
                        "owner": {"type": "string", "pattern": _TASK_FIELD % 200},
                        "task_id": {"type": "string", "pattern": _TASK_FIELD % 200},
                        "run_id": {"type": ["string", "null"], "maxLength": 200},
                        "state": {"type": "string", "pattern": _TASK_FIELD % 64},
                        "final": {"type": ["boolean", "null"]},
                        "updated_at": {"type": "number"},
                        "body": {"type": "object", "description": "the SDK's task (at most 1 MiB)"},
                    },
                },
            },
        },
    },
    "SnapshotConversation": {
        "type": "object",
        "required": ["id", "title", "created_at", "updated_at", "meta"],
        "properties": {
            "id": {
                "type": "string",
                "minLength": 1,
                "maxLength": 200,
                "pattern": SNAPSHOT_ID_PATTERN,
                "description": "no /, not . or .., no control characters",
            },
            "title": {"type": "string"},
            "created_at": {"type": "number"},
            "updated_at": {"type": "number"},
            "meta": {"type": "object"},
        },
    },
    "SnapshotMessage": {
        "type": "object",
        "required": ["id", "kind", "content", "created_at"],
        "properties": {
            "id": {"type": "integer", "minimum": 1, "maximum": _MAX_INT},
            "kind": {"type": "string", "enum": ["user", "assistant", "tool_call", "tool_result"]},
            "content": {"type": "string"},
            "created_at": {"type": "number"},
            "author": _NULLABLE_STR,
            "channel": _NULLABLE_STR,
            "run_id": _NULLABLE_STR,
            "tool_call_id": _NULLABLE_STR,
            "tool_name": _NULLABLE_STR,
            "arguments": _NULLABLE_STR,
            "is_error": {"type": ["boolean", "null"]},
            "status": {
                "anyOf": [
                    {"type": "null"},
                    {"type": "string", "enum": ["complete", "interrupted", "error"]},
                ]
            },
            "duration": {"type": ["number", "null"]},
        },
    },
    "SnapshotEntry": {
        "type": "object",
        "required": ["pos", "message"],
        "properties": {
            "pos": {"type": "integer", "minimum": -_MAX_INT, "maximum": _MAX_INT},
            "message": {"$ref": "#/components/schemas/ChatMessage"},
        },
    },
    "ChatMessage": {
        "type": "object",
        "required": ["role"],
        "properties": {
            "role": {"type": "string", "enum": ["system", "user", "assistant", "tool"]},
            "content": _NULLABLE_STR,
            "author": _NULLABLE_STR,
            "tool_call_id": _NULLABLE_STR,
            "name": _NULLABLE_STR,
            "is_error": {"type": ["boolean", "null"]},
            "message_id": {"type": ["integer", "null"], "minimum": -_MAX_INT, "maximum": _MAX_INT},
            "tool_calls": {
                "type": ["array", "null"],
                "items": {
                    "type": "object",
                    "required": ["id", "name"],
                    "properties": {
                        "id": {"type": "string"},
                        "name": {"type": "string"},
                        "arguments": _NULLABLE_STR,
                    },
                },
            },
        },
    },
    "Event": {
        "type": "object",
        "description": (
            "One agent event (the data of an SSE message). Kinds: turn_started, "
            "reasoning_started, reasoning_delta, response_started, text_delta, "
            "tool_call_started, tool_call_ended, child_run_linked, turn_ended, "
            "run_stream_end, interrupted, error, events_lost, compacted, conversation_started, "
            "conversation_ended, memory_noted, approval_requested, approval_resolved, "
            "question_asked, question_progress, question_answered, todo_updated, tool_progress, "
            "status_changed, "
            "usage. A child run's events (an agent called as a tool) carry its run_id and "
            "parent_run_id and are relayed into the caller's conversation stream."
        ),
        "required": ["kind", "conversation_id", "seq", "stream_seq", "ts"],
        "properties": {
            "kind": {"type": "string"},
            "conversation_id": {"type": "string"},
            "run_id": _NULLABLE_STR,
            "parent_run_id": _NULLABLE_STR,
            "seq": {"type": "integer"},
            "stream_seq": {"type": "integer"},
            "ts": {"type": "number"},
        },
    },
}

# A checkpoint's document: a snapshot that holds no checkpoints (its own A2A task
# records, if any, are checked when it is imported as a conversation).
_SCHEMAS["CheckpointDocument"] = {
    **_SCHEMAS["Snapshot"],
    "description": "A checkpoint's snapshot (as Snapshot, without checkpoints)",
    "properties": {
        k: v for k, v in _SCHEMAS["Snapshot"]["properties"].items()
        if k not in ("checkpoints", "a2a_tasks")
    },
    "not": {"required": ["checkpoints"]},
}  # fmt: skip


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def _json(ref: str, description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}},
    }


def _with_plain(response: dict[str, Any], word: str) -> dict[str, Any]:
    """``response`` also as ``text/plain``: ``word`` and a newline."""
    plain = {"text/plain": {"schema": {"type": "string", "enum": [word + "\n"]}}}
    return {**response, "content": {**response["content"], **plain}}


def _body(ref: str, *, required: bool) -> dict[str, Any]:
    return {
        "required": required,
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}},
    }


_CONV_ID = {
    "name": "conversation_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
}
_PROFILE = {
    "name": "profile",
    "in": "query",
    "description": "the stream profile: chat (text and tool notices, child runs as one event), "
    "debug (everything), metrics (usage and lifecycle) or one the configuration declares "
    "([profiles.<name>]); an unknown one is 422",
    "schema": {"type": "string", "enum": ["chat", "debug", "metrics"], "default": "debug"},
}


def _profile_param(profiles: Mapping[str, str] | None) -> dict[str, Any]:
    """The ``profile`` parameter, listing the built-in and configured profiles."""
    if not profiles:
        return _PROFILE
    names = sorted({"chat", "debug", "metrics", *profiles})
    described = "; ".join(f"{n}: {d}" for n, d in sorted(profiles.items()) if d)
    return {
        **_PROFILE,
        "description": str(_PROFILE["description"])
        + (f". Declared: {described}" if described else ""),
        "schema": {"type": "string", "enum": names, "default": "debug"},
    }


_LAST_EVENT_ID = {
    "name": "Last-Event-ID",
    "in": "header",
    "description": "replay the events after this id (sent by EventSource when it reconnects)",
    "schema": {"type": "string", "pattern": "^[0-9]{1,18}$"},
}
_REPLAY_TURN = {
    "name": "replay",
    "in": "query",
    "description": "turn: with neither after nor Last-Event-ID, the stream starts with the"
    " events of the turn running in the conversation, from its turn_started (whichever"
    " worker runs it; events_lost first if they are no longer kept); ignored when resuming",
    "schema": {"type": "string", "enum": ["turn"]},
}

_AFTER_EVENT = {
    "name": "after",
    "in": "query",
    "description": "as Last-Event-ID, for clients that cannot set headers",
    "schema": {"type": "integer", "minimum": 0, "maximum": 999_999_999_999_999_999},
}


def _sse(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {
            "text/event-stream": {
                "schema": {"type": "string"},
                "x-event-schema": {"$ref": "#/components/schemas/Event"},
            }
        },
    }


_GUARD_403 = (
    "a Host this server does not answer to (host_not_allowed), or a web page of"
    " another origin (origin_not_allowed)"
)


def openapi_document(
    prefix: str,
    *,
    auth: bool,
    guarded: bool = False,
    profiles: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The document for an API under ``prefix``; ``auth``: tokens are required;
    ``guarded``: requests are refused for their Host or Origin (403); ``profiles``:
    the configured stream profiles (name: description) besides the built-in ones."""
    p = prefix
    profile = _profile_param(profiles)
    conv = p + "/conversations/{conversation_id}"
    unauthorized = {"401": _error("no valid bearer token")} if auth else {}
    common = {
        **unauthorized,
        "503": _error("the agent is shutting down"),
    }
    refused = {"403": _error(_GUARD_403)} if guarded else {}
    with_body = {
        "413": _error("the body is larger than the server's max_body_bytes"),
        "415": _error("a body that is not Content-Type: application/json"),
        "422": _error("the body is not a JSON object of the documented shape"),
    }
    not_found = {"404": _error("no such conversation, or one this token may not see")}
    security: list[dict[str, list[str]]] = [{"bearer": []}] if auth else []

    def op(op_id: str, summary: str, responses: dict[str, Any], **more: Any) -> dict[str, Any]:
        merged = {**responses, **common}
        if refused:
            own = responses.get("403")
            merged["403"] = (
                _error(f"{own['description']}; or {_GUARD_403}") if own else refused["403"]
            )
        return {
            "operationId": op_id,
            "summary": summary,
            "security": security,
            "responses": merged,
            **more,
        }

    paths: dict[str, Any] = {
        "/health": {
            "get": {
                "operationId": "health",
                "summary": "Liveness: 200 while the agent runs",
                "security": [],
                "description": "JSON; with Accept: text/plain (and not JSON) the bare"
                " word ok or unavailable, for the standalone seed's probes",
                "responses": {
                    "200": _with_plain(_json("Health", "the agent is running"), "ok"),
                    "503": _with_plain(
                        _json("Health", "the agent is shutting down"), "unavailable"
                    ),
                },
            }
        },
        "/ready": {
            "get": {
                "operationId": "ready",
                "summary": "Readiness: 200 when every transport is connected, else 503",
                "security": [],
                "responses": {
                    "200": _json("Ready", "ready"),
                    "503": _json("Ready", "a transport is not connected, or shutting down"),
                },
            }
        },
        p + "/status": {
            "get": op(
                "status",
                "Version, uptime, components and busy conversations (agentik status)",
                {"200": _json("Status", "the bot's status")},
            )
        },
        p + "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document",
                "security": [],
                "responses": {
                    "200": {
                        "description": "OpenAPI 3.1",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    },
                    **refused,
                },
            }
        },
        p + "/search": {
            "get": op(
                "search",
                "Full-text search over the messages of the conversations this caller may see,"
                " newest first",
                {
                    "200": _json("SearchPage", "a page of messages found"),
                    "422": _error("a bad query parameter"),
                    "501": _error("the bot's store keeps no search index"),
                },
                parameters=[
                    {
                        "name": "q",
                        "in": "query",
                        "required": True,
                        "description": "words (letters and digits); a message holds every"
                        " one, as a word or the start of one, in any case (no word: no"
                        " message found)",
                        "schema": {"type": "string"},
                    },
                    {
                        "name": "offset",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 0, "maximum": 10_000},
                    },
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20},
                    },
                ],
            )
        },
        p + "/conversations": {
            "post": op(
                "createConversation",
                "Create a conversation",
                {
                    "201": {
                        **_json("Conversation", "created"),
                        "links": {
                            op_id: {
                                "operationId": op_id,
                                "parameters": {"conversation_id": "$response.body#/id"},
                            }
                            for op_id in (
                                "getConversation",
                                "renameConversation",
                                "deleteConversation",
                                "postMessage",
                                "regenerate",
                                "editLast",
                                "listMessages",
                                "interrupt",
                                "conversationEvents",
                                "listApprovals",
                            )
                        },
                    },
                    "403": _error("this caller may not create conversations"),
                    **with_body,
                },
                requestBody=_body("NewConversation", required=False),
            ),
            "get": op(
                "listConversations",
                "A page of conversations, most recently active first",
                {
                    "200": _json("ConversationPage", "a page"),
                    "422": _error("a bad query parameter"),
                },
                parameters=[
                    {
                        "name": "offset",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 0, "maximum": 1_000_000},
                    },
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 200, "default": 50},
                    },
                    {
                        "name": "children",
                        "in": "query",
                        "description": "child-run conversations (parent set): listed with the"
                        " others, left out, or listed alone",
                        "schema": {
                            "type": "string",
                            "enum": list(CHILDREN),
                            "default": CHILDREN[0],
                        },
                    },
                ],
            ),
        },
        p + "/conversations/import": {
            "post": op(
                "importConversation",
                "Restore a conversation from a snapshot, bound to this token's channels"
                " (an admin-level right; what the snapshot holds grants nothing)",
                {
                    "201": _json("Conversation", "imported"),
                    "403": _error(
                        "this caller may not create conversations, or may not import: a role"
                        " ranking as admin, or a token without a channels limit, may"
                    ),
                    "409": _error("ids=keep and the database has that conversation id"),
                    "413": _error("the body is larger than the server's max_import_bytes"),
                    "415": with_body["415"],
                    "422": _error("not a valid snapshot (the message names the field)"),
                },
                parameters=[
                    {
                        "name": "ids",
                        "in": "query",
                        "description": "new: a fresh conversation id; keep: the snapshot's",
                        "schema": {"type": "string", "enum": ["new", "keep"], "default": "new"},
                    }
                ],
                requestBody=_body("Snapshot", required=True),
            )
        },
        conv + "/export": {
            "parameters": [_CONV_ID],
            "get": op(
                "exportConversation",
                "A versioned, self-contained snapshot of the conversation",
                {"200": _json("Snapshot", "the snapshot"), **not_found},
            ),
        },
        conv: {
            "parameters": [_CONV_ID],
            "get": op(
                "getConversation",
                "One conversation",
                {"200": _json("Conversation", "the conversation"), **not_found},
            ),
            "patch": op(
                "renameConversation",
                "Rename a conversation",
                {"200": _json("Conversation", "renamed"), **not_found, **with_body},
                requestBody=_body("Rename", required=True),
            ),
            "delete": op(
                "deleteConversation",
                "Delete a conversation and everything stored about it",
                {"204": {"description": "deleted"}, **not_found},
            ),
        },
        conv + "/regenerate": {
            "parameters": [_CONV_ID],
            "post": op(
                "regenerate",
                "Ask the last question again in a new branch: its earlier answer leaves the"
                " model's context and stays in the audit log",
                {
                    "202": _json("MessageAccepted", "the question stored again; its turn runs"),
                    "403": _error("the [access] rules do not let this token ask the bot here"),
                    **not_found,
                    **with_body,
                    "409": _error(
                        "cannot_branch: a turn is running or queued, or there is no question"
                        " in the working memory (none yet, or summarised)"
                    ),
                    "422": _error("the body is not of the documented shape, or prompt_refused"),
                    "429": _error("a budget is used up (budget_exceeded; Retry-After)"),
                },
                requestBody=_body("Regenerate", required=False),
            ),
        },
        conv + "/edit": {
            "parameters": [_CONV_ID],
            "post": op(
                "editLast",
                "Replace the last question and ask it, in a new branch: the old question and"
                " its answer leave the model's context and stay in the audit log",
                {
                    "202": _json("MessageAccepted", "the new question stored; its turn runs"),
                    "403": _error("the [access] rules do not let this token ask the bot here"),
                    **not_found,
                    **with_body,
                    "409": _error(
                        "cannot_branch: a turn is running or queued, or there is no question"
                        " in the working memory (none yet, or summarised)"
                    ),
                    "422": _error("the body is not of the documented shape, or prompt_refused"),
                    "429": _error("a budget is used up (budget_exceeded; Retry-After)"),
                },
                requestBody=_body("Edit", required=True),
            ),
        },
        conv + "/messages": {
            "parameters": [_CONV_ID],
            "post": op(
                "postMessage",
                "Send a message: stored, and its turn queued (answers arrive as events)",
                {
                    "202": _json("MessageAccepted", "stored; the turn runs after those queued"),
                    "403": _error(
                        "the [access] rules do not let this token ask the bot here"
                        " (forbidden: nothing was stored)"
                    ),
                    **not_found,
                    **with_body,
                    "422": _error(
                        "the body is not of the documented shape (invalid_body), or a"
                        " plugin refused the message (prompt_refused: nothing was stored)"
                    ),
                    "409": _error(
                        "it names an attachment the conversation does not hold"
                        " (attachment_not_found: nothing was stored)"
                    ),
                    "429": _error(
                        "the token's or the conversation's budget is used up (budget_exceeded:"
                        " nothing was stored; Retry-After says when it resets)"
                    ),
                },
                requestBody=_body("NewMessage", required=True),
            ),
            "get": op(
                "listMessages",
                "A page of the audit log, oldest first: the latest messages, or those after=",
                {
                    "200": _json("MessagePage", "a page"),
                    **not_found,
                    "422": _error("a bad query parameter"),
                },
                parameters=[
                    {
                        "name": name,
                        "in": "query",
                        "description": desc,
                        "schema": {"type": "integer", "minimum": 0, "maximum": 2**62},
                    }
                    for name, desc in (
                        ("after", "the page of messages after this id (page forward)"),
                        ("before", "only messages before this id (scroll back)"),
                    )
                ]
                + [
                    {
                        "name": "offset",
                        "in": "query",
                        "description": "skip this many of the oldest messages and page forward"
                        " (the standalone seed's paging; after= costs less on long histories)",
                        "schema": {"type": "integer", "minimum": 0, "maximum": 1_000_000},
                    },
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": 1000,
                            "default": 100,
                        },
                    },
                ],
            ),
        },
        conv + "/attachments": {
            "parameters": [_CONV_ID],
            "post": op(
                "uploadAttachment",
                "Upload an image or file (multipart, field file) for a message to name",
                {
                    "201": _json("Attachment", "stored (once per content, by its SHA-256)"),
                    "403": _error("the [access] rules do not let this token send here"),
                    **not_found,
                    "413": _error("over [attachments] max_bytes (attachment_too_large)"),
                    "415": _error(
                        "not multipart/form-data, or bytes of no type taken"
                        " (attachment_rejected: PNG, JPEG, GIF, WebP, PDF, UTF-8 text)"
                    ),
                    "422": _error("a multipart body without a file field named file"),
                },
                requestBody={
                    "required": True,
                    "content": {
                        "multipart/form-data": {"schema": {"$ref": "#/components/schemas/Upload"}}
                    },
                },
            ),
        },
        conv + "/attachments/{sha256}": {
            "parameters": [
                _CONV_ID,
                {"name": "sha256", "in": "path", "required": True, "schema": {"type": "string"}},
            ],
            "get": op(
                "getAttachment",
                "An attachment's bytes (its sniffed type, nosniff, sandboxed; only images inline)",
                {
                    "200": {
                        "description": "the bytes",
                        "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}},
                    },
                    "404": _error("no such conversation, or no such attachment in it"),
                },
            ),
        },
        conv + "/status": {
            "parameters": [_CONV_ID],
            "get": op(
                "getStatus",
                "What the conversation does now: its state, running turn, tools, queue, usage",
                {"200": _json("ConversationStatus", "the status"), **not_found},
            ),
        },
        conv + "/interrupt": {
            "parameters": [_CONV_ID],
            "post": op(
                "interrupt",
                "Stop the running turn (its partial answer is kept, marked interrupted)",
                {
                    "202": _json("InterruptAccepted", "the turn was stopped, or withdrawn"),
                    **not_found,
                    "409": _error("no turn running, another run, or already being stopped"),
                    **with_body,
                },
                requestBody=_body("Interrupt", required=False),
            ),
        },
        conv + "/approvals": {
            "parameters": [_CONV_ID],
            "get": op(
                "listApprovals",
                "Tool calls of this conversation waiting for approval (state=all: recent ones too)",
                {
                    "200": _json("ApprovalList", "the approvals, oldest first"),
                    **not_found,
                    "422": _error("a bad query parameter"),
                },
                parameters=[
                    {
                        "name": "state",
                        "in": "query",
                        "schema": {
                            "type": "string",
                            "enum": ["pending", "all"],
                            "default": "pending",
                        },
                    }
                ],
            ),
        },
        conv + "/approvals/{approval_id}": {
            "parameters": [
                _CONV_ID,
                {
                    "name": "approval_id",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string"},
                },
            ],
            "post": op(
                "decideApproval",
                "Approve or deny a tool call waiting for approval",
                {
                    "200": _json("Approval", "decided; the turn goes on"),
                    "403": _error("this token's role may not decide, or it asked for the call"),
                    "404": _error("no such conversation or approval"),
                    "409": _error("already decided, expired, or no turn waits for it"),
                    **with_body,
                },
                requestBody=_body("Decision", required=True),
            ),
        },
        conv + "/questions/{question_id}": {
            "parameters": [
                _CONV_ID,
                {
                    "name": "question_id",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "integer"},
                },
            ],
            "post": op(
                "answerForm",
                "Answer a form (several questions the running turn asked at once)",
                {
                    "200": _json("FormProgress", "taken; done: the turn goes on"),
                    "403": _error("the form asks someone else"),
                    "404": _error("no such conversation, or no form by that id waits"),
                    "422": _error("an unknown question, a required one empty, or refused"),
                    **with_body,
                },
                requestBody=_body("FormAnswer", required=True),
            ),
        },
        conv + "/checkpoints": {
            "parameters": [_CONV_ID],
            "get": op(
                "listCheckpoints",
                "The conversation's checkpoints (stored snapshots), newest first",
                {"200": _json("CheckpointList", "the checkpoints"), **not_found},
            ),
            "post": op(
                "takeCheckpoint",
                "Keep a snapshot of the conversation as it is now",
                {
                    "201": _json("Checkpoint", "the checkpoint taken"),
                    **not_found,
                    "409": _error(
                        "the conversation has all the checkpoints taken by hand it may keep"
                        " ([checkpoints] keep_manual): delete one first"
                    ),
                    **with_body,
                },
                requestBody=_body("CheckpointRequest", required=False),
            ),
        },
        conv + "/checkpoints/{checkpoint_id}": {
            "parameters": [
                _CONV_ID,
                {
                    "name": "checkpoint_id",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "integer", "minimum": 1},
                },
            ],
            "get": op(
                "getCheckpoint",
                "One checkpoint's snapshot (imports like an export)",
                {
                    "200": _json("Snapshot", "the snapshot"),
                    "404": _error("no such conversation, or no such checkpoint in it"),
                    "422": _error("checkpoint_id is not an integer"),
                },
            ),
            "delete": op(
                "deleteCheckpoint",
                "Delete one checkpoint (one taken by hand makes room for another)",
                {
                    "204": {"description": "deleted"},
                    "404": _error("no such conversation, or no such checkpoint in it"),
                    "422": _error("checkpoint_id is not an integer"),
                },
            ),
        },
        conv + "/messages/{message_id}/redact": {
            "parameters": [
                _CONV_ID,
                {
                    "name": "message_id",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "integer", "minimum": 1},
                },
            ],
            "post": op(
                "redactMessage",
                "Replace a message's content with a tombstone everywhere it is stored",
                {
                    "200": _json("Redaction", "redacted; the audit row"),
                    "403": _error("only the message's author or an admin may redact it"),
                    "404": _error("no such conversation or message"),
                    "409": _error("the message is already redacted"),
                    **with_body,
                },
                requestBody=_body("RedactRequest", required=False),
            ),
        },
        conv + "/events": {
            "parameters": [_CONV_ID],
            "get": op(
                "conversationEvents",
                "Live events of one conversation (Server-Sent Events; id = the event's seq)",
                {
                    "200": _sse("an endless event stream with heartbeat comments"),
                    **not_found,
                    "422": _error("a bad profile, replay, after or Last-Event-ID"),
                },
                parameters=[profile, _REPLAY_TURN, _AFTER_EVENT, _LAST_EVENT_ID],
            ),
        },
        p + "/events": {
            "get": op(
                "allEvents",
                "Live events of every conversation this token may see (id = stream_seq: on"
                " workers sharing PostgreSQL, the stored event's position, the same on every"
                " worker, so Last-Event-ID resumes on any of them; a temporary conversation's"
                " events carry no id)",
                {
                    "200": _sse("an endless event stream with heartbeat comments"),
                    "422": _error("a bad profile, after or Last-Event-ID"),
                },
                parameters=[profile, _AFTER_EVENT, _LAST_EVENT_ID],
            ),
        },
    }
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "agentik HTTP API",
            "version": "1",
            "description": (
                "Conversations with an agentik agent: create them, send messages, "
                "follow the answers as Server-Sent Events, interrupt a turn, "
                "approve or deny tool calls that wait for approval."
            ),
        },
        "paths": paths,
        "components": {"schemas": _SCHEMAS},
    }
    if auth:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return doc
