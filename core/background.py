"""Background memory work, driven by the agent's events (no polling).

:class:`MemoryWorker` subscribes to the agent's event stream and reacts:

* ``compacted`` → **mining**: the model extracts durable facts from the
  new summary; each new fact becomes a note in the channel's memory scope;
* a conversation ending (:meth:`Agent.end_conversation
  <agentik.core.Agent.end_conversation>`: a channel's ``!new``, a deletion, no
  turn for ``reflect_after_idle`` seconds, ``Conversation.aclose()``, the bot's
  shutdown) → **reflection**: the model writes a short reflection on the part of
  the conversation not reflected on yet into the channel's memory; and
  **mining** of the turns no compaction summarised yet (a conversation that
  ends before its context fills is mined too, not only compacted ones);
* every ``jobs_interval`` seconds (0: never, the default), the same two jobs
  for each conversation with turns since its last job, so a channel that never
  goes quiet is still reflected on and mined (no ``conversation_ended``: it
  did not end).

What a reflection covers is read when the conversation ends (a deleted
conversation's rows are still there), and the highest audit-log id it covers
is kept in the conversation's metadata (``reflected_through``): the same span
is never reflected on twice; mining at an end keeps ``mined_through`` the same
way.  Mining after a compaction has a (trailing) debounce per
conversation: compactions arriving within ``mining_debounce`` seconds of each
other cause one job, for the latest; a span with fewer than
``mine_min_turns`` user messages is not mined.  Jobs run as their own tasks,
never inside a turn; a failing job is logged and forgotten.  Workers sharing a
database reflect on (and mine) a span once (:mod:`agentik.core.cluster.jobs`: the
slot is the conversation and the last audit-log id of the span); mining follows a
compaction, which only the worker running the conversation makes.  Notes written
here have author ``agentik:mining`` or ``agentik:reflection``; each job that
saved notes publishes a ``memory_noted`` event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from .cluster.jobs import next_interval, run_once
from .compaction import SUMMARY_PREFIX, ask, transcript
from .errors import NotFound
from .events import Compacted, ConversationEnded, EventBase, MemoryNoted
from .memory import BackgroundPolicy, NoMemory, channel_scope
from .messages import ChatMessage

__all__ = [
    "MINED",
    "MINING_PROMPT",
    "REFLECTED",
    "REFLECTION_PROMPT",
    "BackgroundPolicy",
    "MemoryWorker",
]

log = logging.getLogger(__name__)

MINING_PROMPT = (
    "From the conversation summary or transcript you are given, extract the durable facts worth "
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
#: A note quoted as recall and the memory tools show it (``#12 [scope] text``): a
#: fact mined from such a line is that note's text, already known.
_NOTE_REF = re.compile(r"^#\d+\s+\[[^\]\n]*\]\s+")

#: The conversation metadata key of the highest audit-log id reflected on.
REFLECTED = "reflected_through"
#: The conversation metadata key of the highest audit-log id mined at an end
#: (or an interval): mining of compaction summaries needs none, a summary is mined once.
MINED = "mined_through"
#: The metadata key each kind of end-of-span job keeps.
_MARKS = {"reflection": REFLECTED, "mining": MINED}


class _Ending:
    """What a reflection (or a mining, ``job``) covers, read when its conversation
    ended (or at an interval)."""

    __slots__ = ("channel_key", "conversation_id", "job", "messages", "reason", "through", "ts")

    def __init__(
        self,
        conversation_id: str,
        channel_key: str | None,
        reason: str,
        messages: list[ChatMessage],
        through: int,
        job: str = "reflection",
    ) -> None:
        self.job = job
        self.conversation_id = conversation_id
        self.channel_key = channel_key
        self.reason = reason
        self.messages = messages
        self.through = through
        self.ts = time.time()


class MemoryWorker:
    """An agent ``background`` coroutine: ``AgentBuilder().background(MemoryWorker())``."""

    def __init__(
        self,
        policy: BackgroundPolicy | None = None,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        keep_done: int = 1000,
    ) -> None:
        self.policy = policy or BackgroundPolicy()
        #: How a debounce waits (tests pass a clock they control).
        self._sleep = sleep
        self._timers: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._jobs: set[asyncio.Task[Any]] = set()
        #: Jobs of one kind run one at a time: mining reads the notes it has
        #: not to repeat, then writes; two at once would both miss the other's.
        self._serial: dict[str, asyncio.Lock] = {}
        #: Per job kind and conversation: the highest audit-log id a reflection (or
        #: mining) has taken (persisted as ``reflected_through``/``mined_through``).
        self._claimed: dict[tuple[str, str], int] = {}
        #: Conversations with a turn since this worker started (shutdown reflects on them).
        self._active: set[str] = set()
        #: Conversations with a turn since the last ``jobs_interval`` firing.
        self._touched: set[str] = set()
        #: How many ``jobs_interval`` firings ran here (tests, status).
        self.interval_runs = 0
        #: ``_mark`` reads, then writes the conversation's metadata: a reflection and
        #: a mining of one conversation ending together must not undo each other's.
        self._meta_lock = asyncio.Lock()
        #: Per conversation idle since its last turn: when its idle reflection is
        #: due (``time.monotonic()``).  One timer task serves them all (a task each
        #: would cost every conversation of the last ``reflect_after_idle`` ~2 KB).
        self._idle: dict[str, float] = {}
        self._idle_timer_task: asyncio.Task[None] | None = None
        #: When the timer task wakes (``None``: it is not sleeping).
        self._idle_wake: float | None = None
        #: The latest ``keep_done`` finished jobs, for status and tests: ``(kind,
        #: conversation_id, notes written)`` (every conversation gets jobs: a list of
        #: them all grew for as long as the bot ran).
        self.done: deque[tuple[str, str, int]] = deque(maxlen=max(1, keep_done))
        #: How many jobs of each kind have finished.
        self.finished: Counter[str] = Counter()
        self.changed = asyncio.Condition()

    def _jobs_at_end(self) -> list[str]:
        """The jobs a conversation's end (or an interval) runs, in order."""
        return [k for k in ("reflection", "mining") if getattr(self.policy, k)]

    def _kinds(self) -> set[str]:
        kinds = set()
        if self.policy.mining:
            kinds.add("compacted")
        if self._jobs_at_end():
            kinds |= {"turn_started", "turn_ended"}
        return kinds

    async def __call__(self, agent: Any) -> None:
        kinds = self._kinds()
        if not kinds or isinstance(agent.memory, NoMemory):
            return

        async def ended(conv: Any, reason: str, channel_key: str | None) -> None:
            await self._ended(agent, conv, reason, channel_key)

        async def closing() -> None:
            await self.shutdown(agent)

        interval: asyncio.Task[None] | None = None
        if self._jobs_at_end():
            agent.end_listeners.append(ended)
            agent.closing_listeners.append(closing)
            if self.policy.jobs_interval > 0:
                interval = asyncio.create_task(
                    self._interval_timer(agent), name="agentik-memory-interval"
                )
        try:
            async with contextlib.aclosing(agent.events(kinds=kinds)) as events:
                async for event in events:
                    if event.kind in ("turn_started", "turn_ended"):
                        self._activity(agent, event)
                    else:
                        self._schedule(agent, event)
        finally:
            with contextlib.suppress(ValueError):
                agent.end_listeners.remove(ended)
            with contextlib.suppress(ValueError):
                agent.closing_listeners.remove(closing)
            idle = [self._idle_timer_task] if self._idle_timer_task is not None else []
            idle += [interval] if interval is not None else []
            tasks = [*self._timers.values(), *self._jobs, *idle]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- reflection triggers ----------------------------------------------------------
    def _activity(self, agent: Any, event: EventBase) -> None:
        """A turn started (no idle timer while it runs) or ended (the timer restarts)."""
        cid = event.conversation_id
        self._active.add(cid)
        if event.kind == "turn_ended":
            self._touched.add(cid)
        self._idle.pop(cid, None)
        after = self.policy.reflect_after_idle
        if event.kind == "turn_ended" and after > 0:
            due = self._idle[cid] = time.monotonic() + after
            task, wake = self._idle_timer_task, self._idle_wake
            if task is not None and wake is not None and due < wake:
                task.cancel()  # asleep past the new deadline (the setting was shortened)
                task = None
            if task is None:
                self._idle_timer_task = asyncio.create_task(
                    self._idle_timer(agent), name="agentik-reflect-idle"
                )

    async def _idle_timer(self, agent: Any) -> None:
        """End each conversation idle for ``reflect_after_idle`` (reason ``idle``)."""
        try:
            while self._idle:
                now = time.monotonic()
                wake = min(self._idle.values())
                if wake > now:
                    self._idle_wake = wake
                    try:
                        await self._sleep(wake - now)
                    finally:
                        if self._idle_timer_task is asyncio.current_task():
                            self._idle_wake = None
                    continue
                due = [cid for cid, at in self._idle.items() if at <= now]
                for cid in due:
                    del self._idle[cid]
                for cid in due:
                    try:
                        await self._idle_end(agent, cid)
                    except Exception:
                        log.exception("ending idle conversation %s failed", cid)
        finally:
            if self._idle_timer_task is asyncio.current_task():
                self._idle_timer_task = None

    async def _idle_end(self, agent: Any, conversation_id: str) -> None:
        try:
            conv = await agent.get_conversation(conversation_id)
        except Exception:  # deleted meanwhile, or the agent is closing
            return
        if conv.busy:
            return  # a turn is running: its end starts the timer again
        await agent.end_conversation(conv, "idle")

    async def shutdown(self, agent: Any) -> None:
        """Reflect on the conversations with turns since their last reflection
        (``conversation_ended`` reason ``shutdown``) and finish the reflections
        already pending, within ``reflect_on_shutdown`` seconds: what is left
        then is cancelled, its span left for the next time."""
        if self._idle_timer_task is not None:
            self._idle_timer_task.cancel()
            self._idle_timer_task = None
        self._idle.clear()
        budget = self.policy.reflect_on_shutdown
        if budget <= 0:
            return
        jobs: list[asyncio.Task[Any]] = []
        try:
            async with asyncio.timeout(budget):
                for cid in sorted(self._active):
                    try:
                        conv = await agent.get_conversation(cid)
                    except Exception:
                        continue
                    key = conv.channel_key
                    endings = [
                        e
                        for job in self._jobs_at_end()
                        if (e := await self._capture(agent, conv, "shutdown", key, job))
                    ]
                    if not endings:
                        continue
                    if agent.services.claim_shutdown_end(conv):
                        conv.parts.events.emit(
                            ConversationEnded, None, reason="shutdown", channel_key=key
                        )
                    jobs += [asyncio.create_task(self._run_ending(agent, e)) for e in endings]
                self._active.clear()
                await asyncio.gather(*jobs, *self._jobs)
        except TimeoutError:
            log.warning("shutdown: reflection did not finish within %.0fs; left for later", budget)
        finally:
            for job in [*jobs, *self._jobs]:
                job.cancel()
            await asyncio.gather(*jobs, *self._jobs, return_exceptions=True)

    async def _ended(self, agent: Any, conv: Any, reason: str, channel_key: str | None) -> None:
        """A conversation ended: read what to reflect on now, reflect in the background."""
        self._idle.pop(conv.id, None)
        self._active.discard(conv.id)  # a shutdown reflects on it only after new turns
        self._touched.discard(conv.id)  # nor does an interval
        for kind in self._jobs_at_end():
            ending = await self._capture(agent, conv, reason, channel_key, kind)
            if ending is None:
                ending = _Ending(conv.id, channel_key, reason, [], 0, kind)
            job = asyncio.create_task(self._later_ending(agent, ending), name=f"agentik-{kind}")
            self._jobs.add(job)
            job.add_done_callback(self._jobs.discard)

    async def _capture(
        self,
        agent: Any,
        conv: Any,
        reason: str,
        channel_key: str | None,
        job: str = "reflection",
    ) -> _Ending | None:
        """The part of ``conv`` not reflected on (``job`` ``mining``: not mined) yet,
        claimed; ``None`` if nothing happened."""
        done = self._claimed.get((job, conv.id))
        if done is None:
            stored = await agent.store.get_conversation(conv.id)
            done = int((stored.meta if stored is not None else {}).get(_MARKS[job]) or 0)
        # Answers carry no audit id of their own: they belong with the message
        # before them (a user message, or a summary: the highest id it covers).
        span: list[ChatMessage] = []
        current = through = 0
        for m in await conv.working_memory():
            current = m.message_id or current
            if job == "mining" and m.role == "system":
                continue  # a compaction summary: mined when it was made
            if current > done:
                span.append(m)
                through = max(through, current)
        if not any(m.role == "assistant" for m in span):
            return None  # nothing happened worth reflecting on
        self._claimed[(job, conv.id)] = through
        return _Ending(conv.id, channel_key, reason, span, through, job)

    async def _later_ending(self, agent: Any, ending: _Ending) -> None:
        debounce = {"reflection": self.policy.reflection_debounce}
        await self._sleep(debounce.get(ending.job, 0.0))
        await self._run_ending(agent, ending)

    async def _run_ending(self, agent: Any, ending: _Ending) -> None:
        await self._run(agent, ending.job, ending.conversation_id, ending)

    # -- the interval fallback ----------------------------------------------------------
    async def _interval_timer(self, agent: Any) -> None:
        """Every ``jobs_interval`` seconds, on the wall clock's interval boundaries
        (the same on every worker): :meth:`run_interval`."""
        while True:
            delay, _ = next_interval(self.policy.jobs_interval)
            await self._sleep(delay)
            try:
                await self.run_interval(agent)
            except Exception:
                log.exception("the memory jobs' interval run failed")

    async def run_interval(self, agent: Any, conversation_ids: Iterable[str] = ()) -> int:
        """Reflect on and mine, now, what each conversation with turns since the
        last firing (and each of ``conversation_ids``) said since its last job (a
        conversation in a turn waits for the next firing); how many jobs started.
        Workers sharing a database run each span's job once (the same slots as at
        an end)."""
        touched, self._touched = self._touched | set(conversation_ids), set()
        started: list[asyncio.Task[Any]] = []
        for cid in sorted(touched):
            try:
                conv = await agent.get_conversation(cid)
            except Exception:  # deleted meanwhile, or the agent is closing
                continue
            if conv.busy:
                self._touched.add(cid)  # its turn ends later: the next firing takes it
                continue
            for kind in self._jobs_at_end():
                ending = await self._capture(agent, conv, "interval", conv.channel_key, kind)
                if ending is not None:
                    task = asyncio.create_task(self._run_ending(agent, ending))
                    self._jobs.add(task)
                    task.add_done_callback(self._jobs.discard)
                    started.append(task)
        async with self.changed:
            self.interval_runs += 1
            self.changed.notify_all()
        return len(started)

    # -- mining ---------------------------------------------------------------------
    def _schedule(self, agent: Any, event: EventBase) -> None:
        if isinstance(event, Compacted) and not event.fallback:
            kind, delay = "mining", self.policy.mining_debounce
        else:
            return
        key = (kind, event.conversation_id)
        old = self._timers.pop(key, None)
        if old is not None:
            old.cancel()  # debounce: the latest event wins
        task = asyncio.create_task(self._later(agent, kind, event, delay), name=f"agentik-{kind}")
        self._timers[key] = task

    async def _later(self, agent: Any, kind: str, event: Compacted, delay: float) -> None:
        key = (kind, event.conversation_id)
        try:
            await self._sleep(delay)
        finally:
            if self._timers.get(key) is asyncio.current_task():
                del self._timers[key]
        job = asyncio.create_task(
            self._run(agent, kind, event.conversation_id, event), name=f"agentik-{kind}-job"
        )
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)

    async def _run(
        self, agent: Any, kind: str, conversation_id: str, work: Compacted | _Ending
    ) -> None:
        started = time.monotonic()
        written = 0
        lock = self._serial.setdefault(kind, asyncio.Lock())
        try:
            async with lock, asyncio.timeout(self.policy.timeout):
                started = time.monotonic()
                if isinstance(work, Compacted):
                    written = await self._mine(agent, work)
                else:
                    written = await self._span_once(agent, work)
        except asyncio.CancelledError:
            if isinstance(work, _Ending):
                self._unclaim(work)
            raise
        except Exception as exc:
            if isinstance(work, _Ending):
                self._unclaim(work)
            log.warning(
                "background %s for conversation %s failed: %s: %s",
                kind,
                conversation_id,
                type(exc).__name__,
                exc,
            )
            written = -1
        else:
            log.info(
                "background %s for conversation %s: %d note(s) in %.2fs",
                kind,
                conversation_id,
                written,
                time.monotonic() - started,
            )
        async with self.changed:
            self.done.append((kind, conversation_id, written))
            self.finished[kind] += 1
            self.changed.notify_all()

    async def wait_for(self, kind: str, count: int = 1) -> None:
        """Wait until ``count`` jobs of ``kind`` have finished (tests, tools)."""
        async with self.changed:
            await self.changed.wait_for(lambda: self.finished[kind] >= count)

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

    def _unclaim(self, ending: _Ending) -> None:
        """A reflection (or mining) that did not happen: its span may be taken again."""
        key = (ending.job, ending.conversation_id)
        if self._claimed.get(key) == ending.through:
            del self._claimed[key]

    async def _announce(
        self, agent: Any, conversation_id: str, source: str, ids: list[int], key: str | None
    ) -> None:
        """Publish ``memory_noted`` on the conversation (if it still exists)."""
        if not ids:
            return
        try:
            conv = await agent.get_conversation(conversation_id)
        except Exception:
            return
        conv.parts.events.emit(
            MemoryNoted,
            None,
            count=len(ids),
            note_ids=tuple(ids),
            source=source,
            channel_key=key or conv.channel_key,
        )

    async def _mine(self, agent: Any, event: Compacted) -> int:
        summary = event.summary.removeprefix(SUMMARY_PREFIX).strip()
        if not summary or event.user_turns < self.policy.mine_min_turns:
            return 0
        return await self._extract(agent, event.conversation_id, summary, None)

    async def _mine_span(self, agent: Any, ending: _Ending) -> int:
        """Mine the turns of an ended conversation no compaction summarised."""
        users = sum(1 for m in ending.messages if m.role == "user")
        written = 0
        if ending.messages and users >= self.policy.mine_min_turns:
            text = transcript(ending.messages)
            written = await self._extract(agent, ending.conversation_id, text, ending.channel_key)
        await self._mark(agent, ending)
        return written

    async def _extract(
        self, agent: Any, conversation_id: str, text: str, channel_key: str | None
    ) -> int:
        """Ask for the durable facts of ``text``; save the new ones as notes."""
        answer = await self._ask(
            agent,
            MINING_PROMPT.format(max_facts=self.policy.max_facts),
            text,
            max_tokens=400,
        )
        if answer is None:
            return 0
        facts = [
            _NOTE_REF.sub("", m.group(1)) for line in answer.splitlines()
            if (m := _BULLET.match(line))
        ]  # fmt: skip
        scope = await self._scope(agent, conversation_id, channel_key)
        known = {
            " ".join(n.text.lower().split()) for n in await agent.memory.list([scope], limit=500)
        }
        ids: list[int] = []
        for fact in facts[: self.policy.max_facts]:
            norm = " ".join(fact.lower().split())
            if norm in known:
                continue
            known.add(norm)
            note = await agent.memory.save(scope, fact, author="agentik:mining")
            await _record_source(agent, note.id, conversation_id)
            ids.append(note.id)
        await self._announce(agent, conversation_id, "mining", ids, channel_key)
        return len(ids)

    async def _span_once(self, agent: Any, ending: _Ending) -> int:
        """Reflect on (or mine) ``ending``'s span unless another worker sharing the
        database does: the firing's slot is the conversation and the last audit-log
        id it covers, the same on every worker that saw that conversation end."""
        work = self._reflect if ending.job == "reflection" else self._mine_span
        if not ending.messages:
            return await work(agent, ending)
        written = 0

        async def job() -> str:
            nonlocal written
            written = await work(agent, ending)
            return f"{written} note(s)"

        slot = f"{ending.conversation_id}:{ending.through}"
        # A worker that died mid-job: another may take the span over.
        stale = self.policy.timeout + 60
        if not await run_once(agent.store, ending.job, slot, job, stale_after=stale):
            log.info("%s %s: done by another worker", ending.job, slot)
            self._unclaim(ending)
        return written

    async def _reflect(self, agent: Any, ending: _Ending) -> int:
        if not ending.messages:
            return 0
        answer = await self._ask(
            agent, REFLECTION_PROMPT, transcript(ending.messages), max_tokens=300
        )
        written = 0
        if answer is not None:
            scope = await self._scope(agent, ending.conversation_id, ending.channel_key)
            day = time.strftime("%Y-%m-%d", time.gmtime(ending.ts))
            note = await agent.memory.save(
                scope,
                f"Reflection ({day}, conversation {ending.conversation_id}): {answer}",
                author="agentik:reflection",
            )
            written = 1
            await _record_source(agent, note.id, ending.conversation_id)
            await self._announce(
                agent, ending.conversation_id, "reflection", [note.id], ending.channel_key
            )
        await self._mark(agent, ending)
        return written

    async def _mark(self, agent: Any, ending: _Ending) -> None:
        """Keep ``reflected_through`` (``mined_through``) in the conversation's
        metadata; once it is there (or the conversation is gone) the in-memory
        claim is dropped."""
        cid = ending.conversation_id
        async with self._meta_lock:
            record = await agent.store.get_conversation(cid)
            if record is None:
                try:
                    await agent.get_conversation(cid)
                except NotFound:
                    self._unclaim(ending)  # deleted: nothing left to reflect on twice
                return  # a temporary conversation: the claim is its only record
            mark = _MARKS[ending.job]
            if int(record.meta.get(mark) or 0) < ending.through:
                meta = {**record.meta, mark: ending.through}
                await agent.store.update_conversation(cid, meta=meta)
        self._unclaim(ending)


async def _record_source(agent: Any, note_id: int, conversation_id: str) -> None:
    """Record the note's provenance (the conversation's audit log so far), so
    redacting a message it may have been derived from deletes it.

    Coarse on purpose: a summary or reflection may draw on any earlier
    message, so the span is the whole log up to now.
    """
    if getattr(agent.memory, "name", "") not in ("sqlite", "postgres"):
        return  # provenance lives beside the notes, in the store's database
    span = await agent.store.message_span(conversation_id)
    if span is not None:
        await agent.store.note_source_add(note_id, conversation_id, *span)
