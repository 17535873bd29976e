"""Long-term memory: notes that outlive a conversation, in scopes.

A memory backend stores short notes, each in one *scope*:

``global``
    seen by every conversation;
``channel:<channel key>``
    seen only by the conversation(s) of that channel
    (``channel:irc:libera:#agentik``);
``user:<transport>:<user id>``
    about or for one person, as their transport identifies them
    (``user:libera:alice`` — the IRC services account, ``user:work:U024BE7LH``
    — the Slack user id), seen wherever that person speaks.  Only verified
    identities have one: a speaker whose transport could not verify them (an
    IRC nick without an account) has no ``author_id`` in the tool context, so
    no user scope, and the tools say so (:data:`NO_IDENTITY`).

A conversation sees ``global``, its own channel, and the users who spoke in
it recently (:func:`visible_scopes`); memory saved in one channel never
reaches another channel's context.

Every change is versioned: saving over a note, deleting it or restoring an
old version adds a version and keeps the earlier text, so a bad edit can be
undone (``agentik memory history`` / ``restore``).

A backend implements the storage methods of :class:`MemoryBackend`; the
model-facing tools (``memory_save``, ``memory_read``, ``memory_list``,
``memory_delete``, ``memory_search``) are built on them by
:meth:`MemoryBackend.tools`, which the agent merges with its other tools.
Backends: :class:`~.sqlite.SQLiteMemory` (same database as the
conversations, FTS5 search), :class:`~.postgres.PostgresMemory` (the same on
PostgreSQL, when the conversations are there) and
:class:`~.markdown.MarkdownMemory` (one Markdown file per scope in a folder).
:class:`NoMemory` remembers nothing.
"""

from __future__ import annotations

import abc
import builtins
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field
from pydantic.dataclasses import dataclass as pydantic_dataclass

from ..errors import AgentikError
from ..settings import SETTINGS, Blank, BlankSecret, settings_dataclass
from ..tools.base import Tool, ToolContext, ToolResult

__all__ = [
    "MEMORY_TOOLS",
    "NO_IDENTITY",
    "AnnounceKnob",
    "BackgroundPolicy",
    "MemoryBackend",
    "MemorySettings",
    "NoMemory",
    "Note",
    "NoteError",
    "NoteVersion",
    "RecallKnobs",
    "RecallPolicy",
    "channel_scope",
    "scopes_for",
    "user_scope",
    "valid_scope",
    "visible_scopes",
]

#: What a version records: the first save, an edit, a deletion, a restore.
VersionOp = Literal["save", "edit", "delete", "restore"]

#: Longest note the tools accept (characters); longer text is refused.
MAX_NOTE_CHARS = 8_000


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def seconds(value: Any) -> Any:
    """A duration: a number of seconds or text like ``"90s"``, ``"30m"``, ``"2h"``, ``"1d"``."""
    if isinstance(value, str):
        text = value.strip().lower()
        unit = _UNITS.get(text[-1:]) if text else None
        try:
            return float(text[:-1]) * unit if unit else float(text)
        except ValueError:
            raise ValueError(
                f"{value!r} is not a duration (seconds, or a number with s, m, h or d)"
            ) from None
    return value


def _database_is_sqlite(value: Any) -> Any:
    """``[memory] backend = "database"`` is ``"sqlite"``: both name the conversations'
    database (the engine is ``[storage]``'s)."""
    return "sqlite" if value == "database" else value


# Knobs (settings a channel may set for itself, ``[channels."<pattern>"]``): pydantic
# dataclasses without slots, spelled out so type checkers see the constructor.
@pydantic_dataclass(frozen=True, kw_only=True, config=SETTINGS)
class AnnounceKnob:
    """Whether to tell a channel that background work saved notes from it
    (a ``[memory]`` key a channel may set for itself)."""

    #: Tell the channel when background work saved notes ("noted 3 facts —
    #: !memory to review"); a channel's ``announce`` setting overrides it.
    announce: bool = False


@pydantic_dataclass(frozen=True, kw_only=True, config=SETTINGS)
class RecallKnobs:
    """Automatic recall: the ``[memory]`` keys a channel may set for itself."""

    #: Automatic recall: put the notes most relevant to each message in the
    #: model's context for that turn (needs embeddings).
    recall: bool = True
    #: At most this many notes per turn.
    recall_k: int = Field(default=3, ge=1, le=20)
    #: Only notes at least this similar (cosine, -1..1) to the message.
    recall_min_score: float = Field(default=0.3, ge=-1.0, le=1.0)
    #: At most about this many tokens of notes per turn.
    recall_tokens: int = Field(default=400, ge=50, le=8000)


@settings_dataclass
class BackgroundPolicy(AnnounceKnob):
    """Switches and debounce times (seconds) of the background memory work.

    :class:`~agentik.core.background.MemoryWorker` follows it: ``mining``
    extracts at most ``max_facts`` facts from each compaction summary and, when
    a conversation ends, from its turns no summary covered; ``reflection``
    writes a note when a conversation ends (``!new``, deleted, closed, idle for
    ``reflect_after_idle`` seconds, the bot's shutdown); mining waits for
    ``mining_debounce`` seconds of quiet after a compaction and skips spans with
    fewer than ``mine_min_turns`` user messages; ``timeout`` bounds one job's
    model call; ``jobs_interval`` runs both jobs for busy conversations too.
    """

    mining: bool = True
    mining_debounce: float = Field(30.0, ge=0)
    max_facts: int = Field(8, ge=1, le=50)
    reflection: bool = True
    reflection_debounce: float = Field(5.0, ge=0)
    timeout: float = Field(120.0, gt=0)
    #: A compacted span with fewer user messages than this is not mined.
    mine_min_turns: int = Field(1, ge=0)
    #: Seconds without a turn after which a conversation is reflected on
    #: (``conversation_ended`` reason ``idle``); 0: never for idleness.
    reflect_after_idle: Annotated[float, BeforeValidator(seconds)] = Field(7200.0, ge=0)
    #: Seconds a bot's shutdown may spend reflecting on conversations with
    #: turns not yet reflected on (reason ``shutdown``); 0: none at shutdown.
    reflect_on_shutdown: Annotated[float, BeforeValidator(seconds)] = Field(30.0, ge=0)
    #: Seconds between runs of the end-of-conversation jobs (reflection, mining)
    #: for every conversation with turns since its last job, so one that never
    #: goes idle is covered too (workers sharing a database run each once);
    #: 0 (the default): only at ends.  Off by default: each run costs model calls
    #: per busy channel, and compaction already mines the busiest ones.
    jobs_interval: Annotated[float, BeforeValidator(seconds)] = Field(0.0, ge=0)


@settings_dataclass
class MemorySettings(RecallKnobs, BackgroundPolicy):
    """Long-term memory: which backend, and the background work that fills it.

    ``backend``: ``sqlite`` or ``database`` (the conversations' database, SQLite
    or PostgreSQL), ``markdown`` (a folder of files at ``path``) or ``none``.
    ``allow_global_writes``: see :class:`MemoryBackend`.  The other fields are
    :class:`BackgroundPolicy`'s.  The ``recall*`` keys are :class:`RecallKnobs`'
    (a channel may set them).  This class is also the ``[memory]`` section of the
    configuration file.
    """

    #: ``sqlite`` (also spelled ``database``, the clearer name): the notes live in
    #: the conversations' database, whichever ``[storage]`` engine holds it (SQLite
    #: or PostgreSQL).
    backend: Annotated[
        Literal["sqlite", "markdown", "none"], BeforeValidator(_database_is_sqlite)
    ] = "sqlite"
    #: The folder of the markdown backend (relative to the configuration file).
    path: str = "memory"
    #: Whether the model may write ``global`` notes (recalled in every channel):
    #: off by default, since anyone the bot answers could plant one (people still
    #: can, with the CLI).
    allow_global_writes: bool = False
    #: What ``memory_search`` uses (sqlite backend): ``hybrid`` (full-text and
    #: embeddings fused), ``fts`` (words only) or ``vector`` (embeddings only).
    search: Literal["hybrid", "fts", "vector"] = "hybrid"
    #: The embedding model: ``builtin`` (shipped, offline), ``openai`` (an
    #: OpenAI-compatible ``/v1/embeddings`` endpoint) or ``none`` (FTS only).
    embeddings: Literal["builtin", "openai", "none"] = "builtin"
    #: Dimensions of the builtin model's vectors: 64, 128 or 256.
    embedding_dim: Literal[64, 128, 256] = 256
    #: ``openai`` embeddings: the model name (e.g. ``text-embedding-3-small``).
    embedding_model: Blank = None
    #: ``openai`` embeddings: the endpoint; unset: ``$OPENAI_BASE_URL``, else the SDK's default.
    embedding_base_url: Blank = None
    #: Seconds a scope's vectors (a channel's notes, a user's) stay in memory
    #: after the last search or note in it; then they leave it, and the next
    #: search there reads them back from the database.  0: all stay in memory.
    release_vectors_after_idle: Annotated[float, BeforeValidator(seconds)] = Field(900.0, ge=0)
    #: ``openai`` embeddings: the key; unset: ``$OPENAI_API_KEY``.
    embedding_api_key: BlankSecret = None

    def recall_policy(self) -> RecallPolicy:
        return RecallPolicy(
            enabled=self.recall,
            k=self.recall_k,
            min_score=self.recall_min_score,
            tokens=self.recall_tokens,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class RecallPolicy:
    """Automatic recall for a conversation (see :mod:`agentik.core.recall`)."""

    enabled: bool = False
    k: int = 3
    min_score: float = 0.3
    tokens: int = 400


_DEFAULTS = MemorySettings()


class NoteError(AgentikError):
    """A memory operation failed (unknown note, bad scope, storage failure)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Note:
    """One note as it is now."""

    id: int
    scope: str
    text: str
    author: str | None = None
    version: int = 1
    deleted: bool = False
    created_at: float = 0.0
    updated_at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "scope": self.scope,
            "text": self.text,
            "author": self.author,
            "version": self.version,
            "deleted": self.deleted,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class NoteVersion:
    """One version of a note: its text after ``op``."""

    note_id: int
    version: int
    text: str
    op: VersionOp
    author: str | None = None
    created_at: float = 0.0


#: What the tools tell the model when the speaker has no verified identity.
NO_IDENTITY = (
    "this user has no verified identity, so user notes are unavailable (use scope 'channel')"
)


def channel_scope(channel_key: str) -> str:
    return f"channel:{channel_key}"


def user_scope(author_id: str) -> str:
    return f"user:{author_id}"


def valid_scope(scope: str) -> str:
    """``scope`` if well-formed, else :class:`NoteError` naming it."""
    if scope == "global":
        return scope
    kind, sep, rest = scope.partition(":")
    if kind in ("channel", "user") and sep and rest.strip() and "\n" not in rest:
        return scope
    raise NoteError(f"invalid memory scope {scope!r}: use 'global', 'channel:<key>' or 'user:<id>'")


def context_channel(context: ToolContext) -> str:
    """The channel scope of a tool call (a conversation without channel is its own)."""
    return channel_scope(context.channel or f"conversation:{context.conversation_id}")


def visible_scopes(context: ToolContext) -> list[str]:
    """The scopes a tool call may read: global, its channel, its speakers.

    Speakers are verified identities only: the bridge passes no ``author_id``
    for an unverified speaker, so they add no scope.
    """
    return scopes_for(
        channel=context.channel,
        conversation_id=context.conversation_id,
        author_id=context.author_id,
        speakers=context.speakers,
    )


def scopes_for(
    *,
    channel: str | None,
    conversation_id: str,
    author_id: str | None,
    speakers: Sequence[str] = (),
) -> list[str]:
    """What :func:`visible_scopes` says, from the parts of a tool context."""
    scopes = ["global", channel_scope(channel or f"conversation:{conversation_id}")]
    for who in (author_id, *speakers):
        if who and user_scope(who) not in scopes:
            scopes.append(user_scope(who))
    return scopes


class MemoryBackend(abc.ABC):
    """Base class of long-term memory backends.

    Subclasses implement the storage methods (all ``async``); the tools come
    from here.  ``allow_global_writes=False`` keeps the model from writing
    ``global`` notes (people still can, with the CLI).
    """

    #: Registry / configuration name.
    name: str = ""
    #: Automatic recall where a turn's settings do not say (``TurnSettings.recall``);
    #: off unless the backend can rank by meaning (:meth:`recall`).
    recall_policy: RecallPolicy = RecallPolicy()

    def __init__(self, *, allow_global_writes: bool = _DEFAULTS.allow_global_writes) -> None:
        self.allow_global_writes = allow_global_writes
        #: Rewrites a note's text before it is stored (the agent sets it to
        #: the ``before_store`` hooks, kind ``note``); backends call :meth:`scrub`.
        self.before_store: Callable[[str], str] | None = None
        #: Called when the backend freed memory it held (the agent sets it to
        #: its ``malloc_trim``, so the freed pages go back to the system).
        self.on_release: Callable[[], None] | None = None

    def scrub(self, text: str) -> str:
        """``text`` as :attr:`before_store` leaves it (unchanged when unset)."""
        hook = getattr(self, "before_store", None)
        return hook(text) if hook is not None else text

    # -- lifecycle ----------------------------------------------------------------
    async def start(self) -> None:  # noqa: B027 - optional hook
        """Open resources; called once by the agent's ``start``."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release resources; called by the agent's ``aclose``."""

    # -- storage (implemented by backends) ---------------------------------------------
    @abc.abstractmethod
    async def save(
        self, scope: str, text: str, *, author: str | None = None, note_id: int | None = None
    ) -> Note:
        """Add a note to ``scope``, or with ``note_id`` replace its text (a new version)."""

    @abc.abstractmethod
    async def get(self, note_id: int, *, include_deleted: bool = False) -> Note | None:
        """The note, or ``None`` (also for a deleted note unless ``include_deleted``)."""

    @abc.abstractmethod
    async def list(
        self,
        scopes: Sequence[str] | None = None,
        *,
        limit: int = 50,
        offset: int = 0,
        include_deleted: bool = False,
    ) -> builtins.list[Note]:
        """Notes in ``scopes`` (all when ``None``), most recently changed first."""

    @abc.abstractmethod
    async def search(
        self, query: str, scopes: Sequence[str] | None = None, *, limit: int = 10
    ) -> builtins.list[Note]:
        """Notes in ``scopes`` matching ``query``'s words, best match first."""

    async def recall(
        self, query: str, scopes: Sequence[str], *, k: int = 3, min_score: float = 0.0
    ) -> builtins.list[tuple[Note, float]]:
        """Notes relevant to ``query`` for automatic recall, each with its
        similarity (at least ``min_score``), best first, at most ``k``.

        The default recalls nothing: a backend without embeddings has no
        similarity to hold a threshold against.
        """
        return []

    @abc.abstractmethod
    async def delete(self, note_id: int, *, author: str | None = None) -> bool:
        """Mark the note deleted (a version; restorable).  ``False`` if unknown."""

    @abc.abstractmethod
    async def history(self, note_id: int) -> builtins.list[NoteVersion]:
        """Every version of the note, oldest first (empty if unknown)."""

    @abc.abstractmethod
    async def restore(self, note_id: int, version: int, *, author: str | None = None) -> Note:
        """Make ``version``'s text current again (a new version; undeletes)."""

    @abc.abstractmethod
    async def purge(self, note_id: int) -> bool:
        """Remove the note and its history for good.  ``False`` if unknown."""

    # -- tools ----------------------------------------------------------------------
    def tools(self) -> builtins.list[Tool]:
        """The tools this backend offers the model."""
        return [cls(self) for cls in MEMORY_TOOLS]


class NoMemory(MemoryBackend):
    """Remembers nothing and offers no tools (``[memory] backend = "none"``)."""

    name = "none"

    def tools(self) -> builtins.list[Tool]:
        return []

    async def save(
        self, scope: str, text: str, *, author: str | None = None, note_id: int | None = None
    ) -> Note:
        raise NoteError('memory is switched off ([memory] backend = "none")')

    async def get(self, note_id: int, *, include_deleted: bool = False) -> Note | None:
        return None

    async def list(
        self,
        scopes: Sequence[str] | None = None,
        *,
        limit: int = 50,
        offset: int = 0,
        include_deleted: bool = False,
    ) -> builtins.list[Note]:
        return []

    async def search(
        self, query: str, scopes: Sequence[str] | None = None, *, limit: int = 10
    ) -> builtins.list[Note]:
        return []

    async def delete(self, note_id: int, *, author: str | None = None) -> bool:
        return False

    async def history(self, note_id: int) -> builtins.list[NoteVersion]:
        return []

    async def restore(self, note_id: int, version: int, *, author: str | None = None) -> Note:
        raise NoteError(f"no note {note_id}")

    async def purge(self, note_id: int) -> bool:
        return False


# -- the model-facing tools -------------------------------------------------------------
#: Largest note id (SQLite's INTEGER).
_MAX_ID = 2**63 - 1


def _whole(value: Any, what: str, low: int, high: int, *, default: int | None = None) -> int:
    """``value`` as a whole number in ``low..high``, or a :class:`NoteError` saying so.

    The model's arguments are checked here, so a bad one (``1e400``, ``"ten"``,
    a number past what the store can hold) gets a plain sentence back rather
    than an exception's text.  ``5.0`` and ``"5"`` are 5; ``None`` is
    ``default`` (or missing).
    """
    if value is None and default is not None:
        return default
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and 0 < len(value.strip()) <= 20:
        digits = value.strip()
        if digits.lstrip("+-").isdigit():
            number = int(digits)
    if value is None:
        raise NoteError(f"{what} is missing")
    if number is None or not low <= number <= high:
        if what == "note id":
            raise NoteError("note id must be the number of a note, like 12")
        raise NoteError(f"{what} must be a whole number between {low} and {high}")
    return number


def _line(note: Note, width: int = 160) -> str:
    text = " ".join(note.text.split())
    if len(text) > width:
        text = text[: width - 1] + "…"
    return f"#{note.id} [{note.scope}] {text}"


class _MemoryTool:
    name = ""
    description = ""
    parameters: dict[str, Any] = {}

    def __init__(self, memory: MemoryBackend) -> None:
        self.memory = memory

    def __repr__(self) -> str:
        return f"<{self.name} tool of {type(self.memory).__name__}>"

    async def _visible(self, note_id: Any, context: ToolContext) -> Note:
        nid = _whole(note_id, "note id", 1, _MAX_ID)
        note = await self.memory.get(nid)
        if note is None or note.scope not in visible_scopes(context):
            # Notes of other channels are not even admitted to exist.
            raise NoteError(f"no note #{nid} in this conversation's memory")
        return note

    async def call(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult | str:
        try:
            return await self.run(arguments, context)
        except NoteError as exc:
            return ToolResult(text=f"error: {exc}", is_error=True)

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult | str:
        raise NotImplementedError


class _Save(_MemoryTool):
    name = "memory_save"
    description = (
        "Save a durable note to long-term memory: a fact, preference, decision or to-do worth "
        "remembering in later conversations. scope 'channel' (default) is seen only in this "
        "channel, 'user' only where the current speaker talks, 'global' everywhere. Pass id to "
        "replace an existing note's text (the old text is kept as a version)."
    )
    parameters = {
        "type": "object",
        "properties": {
            "text": {"type": "string", "description": "The note, self-contained and short."},
            "scope": {
                "type": "string",
                "enum": ["channel", "user", "global"],
                "description": "Who may see it (default: channel).",
            },
            "id": {"type": "integer", "description": "Replace this note instead of adding one."},
        },
        "required": ["text"],
    }

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult | str:
        text = str(arguments.get("text") or "").strip()
        if not text:
            raise NoteError("text is empty")
        if len(text) > MAX_NOTE_CHARS:
            raise NoteError(f"note too long ({len(text)} characters; limit {MAX_NOTE_CHARS})")
        author = context.author_id or context.author
        if arguments.get("id") is not None:
            old = await self._visible(arguments["id"], context)
            note = await self.memory.save(old.scope, text, author=author, note_id=old.id)
            return ToolResult(
                text=f"updated note #{note.id} (version {note.version})", data=note.to_dict()
            )
        which = arguments.get("scope") or "channel"
        if which == "channel":
            scope = context_channel(context)
        elif which == "user":
            if not context.author_id:
                raise NoteError(NO_IDENTITY)
            scope = user_scope(context.author_id)
        elif which == "global":
            if not self.memory.allow_global_writes:
                raise NoteError("global notes are not allowed here; use 'channel' or 'user'")
            scope = "global"
        else:
            raise NoteError(f"scope must be channel, user or global, not {str(which)[:40]!r}")
        note = await self.memory.save(scope, text, author=author)
        return ToolResult(text=f"saved note #{note.id} ({which})", data=note.to_dict())


class _Read(_MemoryTool):
    name = "memory_read"
    description = "Read one long-term memory note in full, by id."
    parameters = {
        "type": "object",
        "properties": {"id": {"type": "integer", "description": "The note's id."}},
        "required": ["id"],
    }

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult | str:
        note = await self._visible(arguments.get("id"), context)
        return ToolResult(
            text=f"#{note.id} [{note.scope}] (version {note.version})\n{note.text}",
            data=note.to_dict(),
        )


class _List(_MemoryTool):
    name = "memory_list"
    description = (
        "List the long-term memory notes this conversation can see (newest first), "
        "optionally only one scope."
    )
    parameters = {
        "type": "object",
        "properties": {
            "scope": {"type": "string", "enum": ["all", "channel", "user", "global"]},
            "limit": {"type": "integer", "minimum": 1, "maximum": 100},
        },
    }

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult | str:
        scopes = visible_scopes(context)
        which = arguments.get("scope") or "all"
        if which == "global":
            scopes = ["global"]
        elif which == "channel":
            scopes = [context_channel(context)]
        elif which == "user":
            if not context.author_id:
                return NO_IDENTITY
            scopes = [user_scope(context.author_id)]
        limit = _whole(arguments.get("limit"), "limit", 1, 100, default=30)
        notes = await self.memory.list(scopes, limit=limit) if scopes else []
        if not notes:
            return "no notes"
        return "\n".join(_line(n) for n in notes)


class _Search(_MemoryTool):
    name = "memory_search"
    description = (
        "Search long-term memory for notes about something (by meaning and by words, best "
        "match first). Use it before answering questions about people, past decisions or "
        "preferences."
    )
    parameters = {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "Words to look for."},
            "limit": {"type": "integer", "minimum": 1, "maximum": 50},
        },
        "required": ["query"],
    }

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult | str:
        query = str(arguments.get("query") or "").strip()
        if not query:
            raise NoteError("query is empty")
        limit = _whole(arguments.get("limit"), "limit", 1, 50, default=10)
        notes = await self.memory.search(query, visible_scopes(context), limit=limit)
        if not notes:
            return f"nothing found for {query!r}"
        return "\n".join(_line(n, 400) for n in notes)


class _Delete(_MemoryTool):
    name = "memory_delete"
    description = (
        "Delete a long-term memory note that is wrong or no longer true "
        "(people can restore it from its history)."
    )
    parameters = {
        "type": "object",
        "properties": {"id": {"type": "integer", "description": "The note's id."}},
        "required": ["id"],
    }

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult | str:
        note = await self._visible(arguments.get("id"), context)
        if note.scope == "global" and not self.memory.allow_global_writes:
            raise NoteError("global notes cannot be deleted from here")
        await self.memory.delete(note.id, author=context.author_id or context.author)
        return f"deleted note #{note.id}"


#: The tools every memory backend offers (``agentik check`` lists their names).
MEMORY_TOOLS: tuple[type[_MemoryTool], ...] = (_Save, _Read, _List, _Search, _Delete)
