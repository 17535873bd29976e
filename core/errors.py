"""The agentik exception tree.

Every error agentik raises on purpose derives from :class:`AgentikError`.
Third-party errors (``openai``, ``sqlite3``, ...) are translated at the
boundary with ``raise ... from`` so callers only ever catch our types::

    AgentikError
    ├── ConfigError             user/config mistakes: bad value, unknown backend
    │   └── PluginError         a plugin failed to load or registered nonsense
    ├── NotFound                no such conversation / message
    ├── ClosedError             the agent or conversation was closed
    ├── StoreError              the persistence layer failed (disk, schema)
    │   └── MigrationError      a schema migration could not be applied
    ├── LLMError                the model backend failed at run time
    │   ├── LLMConnectionError  the endpoint could not be reached / dropped mid-stream
    │   │   └── LLMTimeout      no answer (or no next chunk) within the timeout
    │   ├── LLMStatusError      the endpoint answered with an HTTP error status
    │   ├── ContextTooLong      the request does not fit the model's context window
    │   └── LLMResponseError    the endpoint answered something we cannot use
    ├── ToolError               a tool failed; the message goes back to the model
    ├── PromptRefused           a plugin refused a message (``before_prompt``)
    ├── RemoteError             another agentik's HTTP API refused a request or could
    │                           not be reached (:mod:`agentik.core.client`)
    ├── AttachmentRejected      an attachment too large, or of a type not taken
    ├── BranchError             regenerate / edit-and-resend cannot start a branch now
    └── CheckpointLimit         a conversation has all the checkpoints taken by hand
                                it may keep (``[checkpoints] keep_manual``)

:class:`StoreRefusal` marks an error a store's write raises on purpose, because of
what the rows say (:class:`CheckpointLimit`; a snapshot that cannot be imported,
``agentik.core.store.snapshot.SnapshotError``): the engines' writers hand it to the
caller as it is, not wrapped as a :class:`StoreError` (the database did not fail).

User/config errors (``ConfigError``) are meant to be shown to a person as one
line; run-time errors are reported as ``error`` events and logged.  No error
message ever contains a secret (API keys are never formatted into them).
"""

from __future__ import annotations

__all__ = [
    "AgentikError",
    "AttachmentRejected",
    "BranchError",
    "CheckpointLimit",
    "ClosedError",
    "ConfigError",
    "ContextTooLong",
    "LLMConnectionError",
    "LLMError",
    "LLMResponseError",
    "LLMStatusError",
    "LLMTimeout",
    "MigrationError",
    "NotFound",
    "PluginError",
    "PromptRefused",
    "RemoteError",
    "StoreError",
    "StoreRefusal",
    "ToolError",
]


class StoreRefusal(Exception):
    """Mark of an error a store write raises on purpose, because of what the rows say:
    the writer passes it to the caller unwrapped (a database failure is wrapped in a
    :class:`StoreError`)."""


class AgentikError(Exception):
    """Base class of every error agentik raises on purpose."""


class ConfigError(AgentikError):
    """A configuration or usage mistake a person must fix."""


class PluginError(ConfigError):
    """A plugin failed to load, or registered something invalid."""


class NotFound(AgentikError, LookupError):
    """The conversation (or other object) asked for does not exist."""


class ClosedError(AgentikError):
    """The agent or conversation was closed; no more work is accepted."""


class StoreError(AgentikError):
    """The persistence layer failed.

    ``retryable``: the database was busy (locked by another process), full,
    read-only or failing I/O — the same write may succeed once that clears.
    """

    retryable: bool = False


class MigrationError(StoreError):
    """A schema migration could not be applied."""


class LLMError(AgentikError):
    """The model backend failed.

    ``retryable`` tells whether the same request might succeed later.
    """

    retryable: bool = False


class LLMConnectionError(LLMError):
    """The endpoint could not be reached, or the stream broke off."""

    retryable = True


class LLMTimeout(LLMConnectionError):
    """The endpoint did not answer (or send the next chunk) in time."""


class LLMStatusError(LLMError):
    """The endpoint answered with an HTTP error status."""

    def __init__(self, message: str, *, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.retryable = status_code == 429 or status_code >= 500


class ContextTooLong(LLMError):
    """The request does not fit the model's context window.

    Raised by a backend when the model refuses a request as too large — an
    endpoint's HTTP 413 or OpenAI-style ``context_length_exceeded``, a local
    engine with no room left — and by compaction when even the latest message
    alone does not fit.  The turn answers a backend's refusal by compacting
    or trimming the context and retrying once.  ``status_code`` is the HTTP
    status when an endpoint answered one (else ``None``).
    """

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class LLMResponseError(LLMError):
    """The endpoint answered with something that cannot be used."""


class ToolError(AgentikError):
    """Raised by a tool to report a failure to the model as an error result."""


class PromptRefused(AgentikError):
    """A ``before_prompt`` hook refused the message; ``str(exc)`` is the reason
    to show in the channel.  Nothing was stored and no turn runs."""


class RemoteError(AgentikError):
    """A remote agent (another agentik's HTTP API, :mod:`agentik.core.client`) refused
    a request or could not be reached.

    ``status``: the HTTP status (``None``: no answer: the connection failed);
    ``code``: the API's stable error code (``budget_exceeded``, ``forbidden``, …;
    ``None`` when the answer carried none).  Never holds the token.
    """

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class AttachmentRejected(AgentikError, ValueError):
    """An attachment that is not taken: too large, or of a type (sniffed from its
    bytes) not accepted.  The message is one line meant for its sender; nothing
    of the attachment was stored."""


class BranchError(AgentikError):
    """Regenerating the last answer or editing the last question cannot start a new
    branch now: a turn is running or queued, or there is no question to go back to
    in the working memory (none yet, or summarised away).  Nothing was changed."""


class CheckpointLimit(AgentikError, StoreRefusal):
    """A conversation has as many checkpoints taken by hand as it may keep
    (``[checkpoints] keep_manual``, ``limit``): a new one is refused rather than an
    old one dropped (each was taken on purpose); deleting one makes room."""

    def __init__(self, conversation_id: str, limit: int) -> None:
        self.conversation_id = conversation_id
        self.limit = limit
        if limit <= 0:
            text = "checkpoints taken by hand are off here ([checkpoints] keep_manual = 0)"
        else:
            text = (
                f"this conversation has {limit} checkpoints taken by hand, the most it may"
                f" keep ([checkpoints] keep_manual); delete one to take another"
            )
        super().__init__(text)
