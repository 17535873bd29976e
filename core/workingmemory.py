"""A conversation's working memory: the LLM context, cached, and the notes waiting for a turn.

The working memory is the mutable half of the dual log (see
:mod:`agentik.core.store.base`): the system-side summaries and the recent
history the model sees.  :class:`WorkingMemory` is owned by one
:class:`~agentik.core.conversation.Conversation`; the turn engine
(:class:`~agentik.core.turn.TurnRunner`,
:class:`~agentik.core.compaction.Compactor`) reads and changes it only
through these methods:

* :attr:`messages` — the cached context (loaded by :meth:`load`);
* :meth:`append` — a write to both logs, the cache updated at once;
* :meth:`invalidate` / :meth:`load` — drop the cache, reload it from the store
  (folding in user messages a crash left out of working memory);
* :meth:`entries` / :meth:`compact` — replace a prefix with a summary;
* :meth:`add_note` / :meth:`take_notes` — ambient messages that reach the
  model with the next turn.

:class:`Transcripts` bounds how many idle conversations keep their cache:
the least recently active beyond the bound drop theirs, and their next turn
loads it from the store again (it is all there: every write goes to the store
first), so a bot holds transcripts for its busy conversations, not for every
conversation it has seen.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from .messages import ChatMessage, Message, NewMessage, user_chat_message
from .redaction import tombstoned
from .store.base import MemoryEntry, RunRecord, Store, TurnEnd

__all__ = ["Queued", "Transcripts", "WorkingMemory"]

log = logging.getLogger(__name__)


#: The ``before_store`` kind of a working-memory entry's role.
_KINDS = {"user": "user", "assistant": "assistant", "tool": "tool_result"}


class Queued(Protocol):
    """An item of a conversation's turn queue: ``run_id`` is the turn whose
    user message it answers (``None``: other work)."""

    @property
    def run_id(self) -> str | None: ...

    @property
    def message_run_id(self) -> str | None:
        """The run the message's audit-log row names, when not ``run_id``."""


class WorkingMemory:
    """The working memory of conversation ``conversation_id`` in ``store``.

    ``queue`` is the conversation's turn queue, read (never changed) by
    :meth:`load`: the user messages of queued turns are not orphans.
    ``fresh`` marks a conversation just created, whose memory is known to be
    empty.  ``scrub(kind, text)`` rewrites every text before it is written
    (the ``before_store`` hook).
    """

    __slots__ = ("__weakref__", "_cache", "_notes", "_queue", "conversation_id", "scrub", "store")

    def __init__(
        self,
        store: Store,
        conversation_id: str,
        *,
        queue: Iterable[Queued] = (),
        fresh: bool = False,
        scrub: Callable[[str, str], str] | None = None,
    ) -> None:
        self.store = store
        self.scrub = scrub
        self.conversation_id = conversation_id
        self._queue = queue
        self._cache: list[ChatMessage] | None = [] if fresh else None
        # Ambient notes waiting for the next turn (``None``: none, the usual case).
        self._notes: list[ChatMessage] | None = None

    # -- the cached context ----------------------------------------------------------
    @property
    def loaded(self) -> bool:
        """Whether the cache holds the current context (else :meth:`load` it)."""
        return self._cache is not None

    @property
    def messages(self) -> tuple[ChatMessage, ...]:
        """The cached context, oldest first (empty when not loaded)."""
        return tuple(self._cache or ())

    def extend(self, memory: Sequence[ChatMessage]) -> None:
        """Add ``memory`` to the cache (if loaded) after writing it to the store."""
        if self._cache is not None:
            self._cache.extend(memory)

    def invalidate(self) -> None:
        """Forget the cache: the next :meth:`load` reads the store."""
        self._cache = None

    def invalidate_on_failure(self, fut: asyncio.Future[Any]) -> None:
        """A done-callback for a write: a failed one leaves the cache unknown."""
        if fut.cancelled() or fut.exception() is not None:
            self._cache = None

    async def load(self, *, exclude_run: str | None = None) -> None:
        """Load the working memory, folding in user messages a crash left out.

        A user message whose turn never started (the process died first) is in
        the audit log but not in working memory; it is added as context so
        nothing the user said is lost to the model.  Messages of queued turns
        (and of ``exclude_run``) are not orphans: their turn adds them.
        """
        if self._cache is not None:
            return
        store, cid = self.store, self.conversation_id
        cache = [e.message for e in await store.load_memory(cid)]
        last = max((m.message_id or 0 for m in cache), default=0)
        pending = {q.run_id for q in self._queue if q.run_id is not None} | {exclude_run}
        pending |= {q.message_run_id for q in self._queue if q.message_run_id is not None}
        orphans = [
            m
            for m in await store.messages(cid, after=last, kinds=["user"], limit=1000)
            if m.run_id not in pending
            # Ambient notes are no turns; a queued turn's message (several workers)
            # is added by its turn, which the turn queue runs.
            and not (isinstance(m.data, dict) and (m.data.get("ambient") or m.data.get("queued")))
        ]
        if orphans:
            log.warning(
                "conversation %s: %d user message(s) from an interrupted process added to context",
                cid,
                len(orphans),
            )
            extra = [user_chat_message(m) for m in orphans]
            await store.append(cid, memory=extra)
            cache.extend(extra)
        self._cache = cache

    # -- writes ----------------------------------------------------------------------
    def append(
        self,
        *,
        log: Sequence[NewMessage] = (),
        memory: Sequence[ChatMessage] = (),
        run_id: str = "",
        ended: str | None = None,
        run: RunRecord | None = None,
        defer: bool = False,
    ) -> asyncio.Future[list[Message]]:
        """Write to both logs in one transaction; the cache is extended at once.

        The write runs in its own task (it lands even if the caller is
        cancelled while waiting); ``ended`` records the end of turn
        ``run_id`` (its outcome) in the same transaction, with ``run``, its
        row of a run tree.  Texts go through :attr:`scrub` first (the cache
        gets the scrubbed ones too).  ``defer``: see :meth:`Store.append`.
        """
        if self.scrub is not None:
            log, memory = self._scrubbed(log, memory)
        self.extend(memory)
        return asyncio.ensure_future(
            self.store.append(
                self.conversation_id,
                log=log,
                memory=memory,
                updated_at=time.time(),
                ended=TurnEnd(run_id, ended, run) if ended else None,
                defer=defer,
            )
        )

    def _scrubbed(
        self, log: Sequence[NewMessage], memory: Sequence[ChatMessage]
    ) -> tuple[Sequence[NewMessage], Sequence[ChatMessage]]:
        """``log`` and ``memory`` with their texts scrubbed (the same objects when
        nothing changed: no copies on the hot path when no plugin scrubs)."""
        scrub = self.scrub
        assert scrub is not None
        rows: list[NewMessage] | None = None
        for i, m in enumerate(log):
            content = scrub(m.kind, m.content)
            arguments = scrub("tool_call", m.arguments) if m.arguments else m.arguments
            if content != m.content or arguments != m.arguments:
                rows = rows or list(log)
                rows[i] = dataclasses.replace(m, content=content, arguments=arguments)
        entries: list[ChatMessage] | None = None
        for i, cm in enumerate(memory):
            content = scrub(_KINDS.get(cm.role, cm.role), cm.content)
            calls = tuple(
                dataclasses.replace(c, arguments=a) if (a := scrub("tool_call", c.arguments))
                != c.arguments else c
                for c in cm.tool_calls
            )  # fmt: skip
            if content != cm.content or calls != cm.tool_calls:
                entries = entries or list(memory)
                entries[i] = dataclasses.replace(cm, content=content, tool_calls=calls)
        return (log if rows is None else rows), (memory if entries is None else entries)

    # -- redaction -----------------------------------------------------------------------
    def redact(
        self, message_id: int, content: str, kind: str, call_id: str | None, old: str
    ) -> None:
        """Put a redaction's tombstone (``content``) into the cache and the waiting notes
        (the store already has it): ``old`` is the redacted row's text."""

        def fix(cm: ChatMessage) -> ChatMessage:
            # Entries added by a turn may not know their audit row's id yet.
            linked = cm.message_id == message_id or (
                cm.message_id is None and cm.role == kind and cm.content == old
            )
            return tombstoned(cm, content, kind, call_id, linked=linked)

        if self._cache is not None:
            self._cache[:] = [fix(cm) for cm in self._cache]
        if self._notes:
            self._notes[:] = [fix(cm) for cm in self._notes]

    # -- compaction ----------------------------------------------------------------------
    async def entries(self) -> list[MemoryEntry]:
        """The stored working memory with its positions (what :meth:`compact` cuts)."""
        return await self.store.load_memory(self.conversation_id)

    async def compact(self, entries: Sequence[MemoryEntry], upto: int, summary: str) -> None:
        """Replace ``entries`` up to position ``upto`` (just loaded) with ``summary``.

        The summary keeps the highest audit-log id it covers, so messages it
        replaced are never mistaken for ones a crash left out.  The cache is
        dropped (:meth:`load` it again).
        """
        covered = max((e.message.message_id or 0 for e in entries if e.pos <= upto), default=0)
        await self.store.compact(
            self.conversation_id,
            upto,
            ChatMessage(role="system", content=summary, message_id=covered or None),
        )
        self._cache = None

    # -- branches ------------------------------------------------------------------------
    async def last_question(self) -> tuple[MemoryEntry, Message] | None:
        """The last question of a turn still in the working memory: its entry and its
        audit-log row (``None``: none, or summarised away)."""
        await self.load()
        entries = await self.entries()
        asked = {
            m.id: m
            for m in await self.store.messages(self.conversation_id, kinds=["user"], limit=200)
            if m.run_id
            and not (isinstance(m.data, dict) and (m.data.get("ambient") or m.data.get("steered")))
        }
        for e in reversed(entries):
            if e.message.role == "user" and e.message.message_id in asked:
                return e, asked[e.message.message_id]
        return None

    async def rewind(self, entry: MemoryEntry) -> None:
        """Take ``entry`` and what follows it out of the working memory: the next
        message starts a new branch there.  The cache is set from what is left, not
        reloaded: a reload would take the question just removed for one a crash
        left out, and put it back."""
        entries = await self.entries()
        await self.store.rewind(self.conversation_id, entry.pos)
        self._cache = [e.message for e in entries if e.pos < entry.pos]

    # -- ambient notes -------------------------------------------------------------------
    def add_note(self, note: ChatMessage, *, keep: int) -> None:
        """Hold ``note`` for the next turn; at most the last ``keep`` notes wait."""
        notes = self._notes
        if notes is None:
            notes = self._notes = []
        notes.append(note)
        del notes[:-keep]

    def take_notes(self) -> list[ChatMessage]:
        """The notes waiting for a turn, oldest first; none wait afterwards."""
        notes, self._notes = self._notes, None
        return notes if notes is not None else []


class Transcripts:
    """The transcripts (working-memory caches) idle conversations keep, at most ``limit``.

    A conversation's :class:`WorkingMemory` is :meth:`taken <take>` while it has
    turns to run and handed back (:meth:`idle`) when it has none: it keeps its
    cache for its next turn until ``limit`` conversations went idle after it;
    then the cache is dropped (:meth:`WorkingMemory.invalidate`), and that
    next turn loads the context from the store, the same as it was.  Holds
    no conversation alive (its references are weak).
    """

    __slots__ = ("_idle", "limit")

    def __init__(self, limit: int) -> None:
        #: How many idle conversations keep their transcript (0: none).
        self.limit = limit
        # Least recently active first.
        self._idle: OrderedDict[str, weakref.ref[WorkingMemory]] = OrderedDict()

    def take(self, memory: WorkingMemory) -> None:
        """``memory``'s conversation has turns to run: its cache is in use."""
        self._idle.pop(memory.conversation_id, None)

    def idle(self, memory: WorkingMemory) -> None:
        """``memory``'s conversation has no turn left to run: it keeps its cache
        while fewer than :attr:`limit` conversations went idle after it."""
        if not memory.loaded:
            return
        self._idle[memory.conversation_id] = weakref.ref(memory)
        self._idle.move_to_end(memory.conversation_id)
        while len(self._idle) > self.limit:
            _, ref = self._idle.popitem(last=False)
            released = ref()
            if released is not None:
                released.invalidate()

    def __len__(self) -> int:
        """Idle conversations holding their transcript now."""
        return sum(1 for ref in self._idle.values() if (m := ref()) is not None and m.loaded)
