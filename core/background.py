"""Background memory work, driven by the agent's events (no polling).

:class:`MemoryWorker` subscribes to the agent's event stream and reacts:

* ``compacted`` → **mining**: the model extracts durable facts from the
  new summary; each new fact becomes a note in the channel's memory scope;
* ``conversation_ended`` (a channel's ``!new``) → **reflection**: the model
  writes a short reflection on the finished conversation into the channel's
  memory.

Each trigger has a (trailing) debounce per conversation: events arriving
within ``debounce`` seconds of each other cause one job, for the latest
event.  Jobs run as their own tasks, never inside a turn; a failing job is
logged and forgotten.  Notes written here have author ``agentik:mining`` or
``agentik:reflection``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .compaction import SUMMARY_PREFIX, _transcript, ask
from .errors import NotFound
from .events import Compacted, ConversationEnded, EventBase
from .memory import BackgroundPolicy, NoMemory, channel_scope

__all__ = ["MINING_PROMPT", "REFLECTION_PROMPT", "BackgroundPolicy", "MemoryWorker"]

log = logging.getLogger(__name__)

MINING_PROMPT = (
    "From the conversation summary you are given, extract the durable facts worth "
    "remembering for future conversations in this channel: people's preferences, "
    "decisions, commitments, names, stable facts about projects. Skip anything "
    "transient or already obvious. Answer with one fact per line, each line starting "
    "with '- ', at most {max_facts} lines; answer 'NONE' if there is nothing durable."
)
REFLECTION_PROMPT = (
    "The conversation transcript you are given has just ended. Write a short "
    "reflection (at most 5 sentences) for your future self: what was discussed, what "
    "you learned about the people and their preferences, what was decided and what "
    "remains open. Answer 'NONE' if nothing in it is worth remembering."
)
_BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+(.*\S)\s*$")


class MemoryWorker:
    """An agent ``background`` coroutine: ``AgentBuilder().background(MemoryWorker())``."""

    def __init__(
        self,
        policy: BackgroundPolicy | None = None,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.policy = policy or BackgroundPolicy()
        #: How a debounce waits (tests pass a clock they control).
        self._sleep = sleep
        self._timers: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._jobs: set[asyncio.Task[Any]] = set()
        #: Jobs of one kind run one at a time: mining reads the notes it has
        #: not to repeat, then writes; two at once would both miss the other's.
        self._serial: dict[str, asyncio.Lock] = {}
        #: Finished jobs, for status and tests: ``(kind, conversation_id, notes written)``.
        self.done: list[tuple[str, str, int]] = []
        self.changed = asyncio.Condition()

    def _kinds(self) -> set[str]:
        kinds = set()
        if self.policy.mining:
            kinds.add("compacted")
        if self.policy.reflection:
            kinds.add("conversation_ended")
        return kinds

    async def __call__(self, agent: Any) -> None:
        kinds = self._kinds()
        if not kinds or isinstance(agent.memory, NoMemory):
            return
        try:
            async with contextlib.aclosing(agent.events(kinds=kinds)) as events:
                async for event in events:
                    self._schedule(agent, event)
        finally:
            for task in [*self._timers.values(), *self._jobs]:
                task.cancel()
            await asyncio.gather(*self._timers.values(), *self._jobs, return_exceptions=True)

    def _schedule(self, agent: Any, event: EventBase) -> None:
        if isinstance(event, Compacted) and not event.fallback:
            kind, delay = "mining", self.policy.mining_debounce
        elif isinstance(event, ConversationEnded):
            kind, delay = "reflection", self.policy.reflection_debounce
        else:
            return
        key = (kind, event.conversation_id)
        old = self._timers.pop(key, None)
        if old is not None:
            old.cancel()  # debounce: the latest event wins
        task = asyncio.create_task(self._later(agent, kind, event, delay), name=f"agentik-{kind}")
        self._timers[key] = task

    async def _later(self, agent: Any, kind: str, event: EventBase, delay: float) -> None:
        key = (kind, event.conversation_id)
        try:
            await self._sleep(delay)
        finally:
            if self._timers.get(key) is asyncio.current_task():
                del self._timers[key]
        job = asyncio.create_task(self._run(agent, kind, event), name=f"agentik-{kind}-job")
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)

    async def _run(self, agent: Any, kind: str, event: EventBase) -> None:
        started = time.monotonic()
        written = 0
        lock = self._serial.setdefault(kind, asyncio.Lock())
        try:
            async with lock, asyncio.timeout(self.policy.timeout):
                started = time.monotonic()
                if isinstance(event, Compacted):
                    written = await self._mine(agent, event)
                elif isinstance(event, ConversationEnded):
                    written = await self._reflect(agent, event)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning(
                "background %s for conversation %s failed: %s: %s",
                kind,
                event.conversation_id,
                type(exc).__name__,
                exc,
            )
            written = -1
        else:
            log.info(
                "background %s for conversation %s: %d note(s) in %.2fs",
                kind,
                event.conversation_id,
                written,
                time.monotonic() - started,
            )
        async with self.changed:
            self.done.append((kind, event.conversation_id, written))
            self.changed.notify_all()

    async def wait_for(self, kind: str, count: int = 1) -> None:
        """Wait until ``count`` jobs of ``kind`` have finished (tests, tools)."""
        async with self.changed:
            await self.changed.wait_for(lambda: sum(d[0] == kind for d in self.done) >= count)

    @staticmethod
    async def _scope(agent: Any, conversation_id: str, channel_key: str | None) -> str:
        if channel_key:
            return channel_scope(channel_key)
        try:
            conv = await agent.get_conversation(conversation_id)
        except NotFound:
            return channel_scope(f"conversation:{conversation_id}")
        return channel_scope(conv.channel_key or f"conversation:{conversation_id}")

    async def _ask(self, agent: Any, system: str, content: str, max_tokens: int) -> str | None:
        text = await ask(agent.llm, system, content, max_tokens)
        if not text or text.upper().rstrip(".") == "NONE":
            return None
        return text

    async def _mine(self, agent: Any, event: Compacted) -> int:
        summary = event.summary.removeprefix(SUMMARY_PREFIX).strip()
        if not summary:
            return 0
        answer = await self._ask(
            agent,
            MINING_PROMPT.format(max_facts=self.policy.max_facts),
            summary,
            max_tokens=400,
        )
        if answer is None:
            return 0
        facts = [m.group(1) for line in answer.splitlines() if (m := _BULLET.match(line))]
        scope = await self._scope(agent, event.conversation_id, None)
        known = {
            " ".join(n.text.lower().split()) for n in await agent.memory.list([scope], limit=500)
        }
        written = 0
        for fact in facts[: self.policy.max_facts]:
            norm = " ".join(fact.lower().split())
            if norm in known:
                continue
            known.add(norm)
            note = await agent.memory.save(scope, fact, author="agentik:mining")
            await _record_source(agent, note.id, event.conversation_id)
            written += 1
        return written

    async def _reflect(self, agent: Any, event: ConversationEnded) -> int:
        try:
            conv = await agent.get_conversation(event.conversation_id)
        except NotFound:
            return 0
        messages = await conv.working_memory()
        if not any(m.role == "assistant" for m in messages):
            return 0  # nothing happened worth reflecting on
        answer = await self._ask(agent, REFLECTION_PROMPT, _transcript(messages), max_tokens=300)
        if answer is None:
            return 0
        scope = await self._scope(agent, event.conversation_id, event.channel_key)
        day = time.strftime("%Y-%m-%d", time.gmtime(event.ts or time.time()))
        note = await agent.memory.save(
            scope,
            f"Reflection ({day}, conversation {conv.id}): {answer}",
            author="agentik:reflection",
        )
        await _record_source(agent, note.id, event.conversation_id)
        return 1


async def _record_source(agent: Any, note_id: int, conversation_id: str) -> None:
    """Record the note's provenance (the conversation's audit log so far), so
    redacting a message it may have been derived from deletes it.

    Coarse on purpose: a summary or reflection may draw on any earlier
    message, so the span is the whole log up to now.
    """
    if getattr(agent.memory, "name", "") != "sqlite":
        return  # provenance lives beside the notes, in the store's database
    span = await agent.store.message_span(conversation_id)
    if span is not None:
        await agent.store.note_source_add(note_id, conversation_id, *span)
