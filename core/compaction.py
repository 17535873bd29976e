"""Context compaction: keep long conversations inside the model's context.

Before every model request the turn asks :meth:`Compactor.before_request`
whether the request fits.  Its size is counted with the backend's tokenizer
when it offers one (an ``async count_tokens(request) -> int`` method) and
otherwise estimated (:func:`estimate_tokens`: about four characters a token,
plus a few tokens per message and per tool definition — deliberately on the
high side).  When it exceeds ``trigger`` times the context budget, the oldest
part of the working memory is summarised by the model and replaced by that
summary, in one transaction; the last ``keep_turns`` turns stay verbatim and
the audit log keeps every message.

Cuts fall only where a user message starts a turn, so a tool call is never
separated from its result.  If summarising fails (the model errs or times
out), the oldest turns are dropped instead, replaced by a one-line notice,
and a warning is logged: the turn still runs.  Each compaction publishes a
:class:`~agentik.core.events.Compacted` event; plugins see the messages
first through the ``before_compact`` hook.

Whatever compaction did (or if it is disabled), a request must then fit the
model's real window — the backend's ``context_window`` — or the oldest
whole turns are dropped until it does (:meth:`Compactor.trim`): the latest
user message always stays, a one-line notice replaces the dropped messages,
and a ``Compacted`` event with ``fallback`` set and reason ``window`` tells
the channel.  When even the latest message does not fit, the turn ends with
:class:`~agentik.core.errors.ContextTooLong`.  A request the model refuses
as too large is shrunk by :meth:`Compactor.after_refusal` for one retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import Field

from .errors import ContextTooLong, ToolError
from .events import Compacted
from .llm.base import LLMBackend, LLMRequest, TextChunk, ToolSpec
from .messages import ChatMessage
from .settings import settings_dataclass

if TYPE_CHECKING:
    from .hooks import Hooks
    from .protocols import PartsLike
    from .store.base import MemoryEntry

__all__ = [
    "SUMMARY_PROMPT",
    "CompactionPolicy",
    "Compactor",
    "CompactorHost",
    "ask",
    "estimate_tokens",
    "transcript",
]

log = logging.getLogger(__name__)

#: The instruction the summariser model gets (the transcript follows as the user message).
SUMMARY_PROMPT = (
    "You maintain the memory of a chat assistant. Summarise the conversation transcript you "
    "are given so the assistant can continue it without the original. Keep: the names of "
    "people and what each said or wants; decisions made and why; facts, numbers and "
    "identifiers that may matter later; open questions and promised follow-ups. Drop "
    "greetings and small talk. If the transcript starts with an earlier summary, merge it "
    "in. Write plain concise prose or bullet points, at most about {words} words."
)

#: Context budget used when neither the configuration nor the backend gives one:
#: a remote OpenAI-compatible model whose window is not known.  Current models
#: take at least this much; tool schemas alone (a few MCP servers) take several
#: thousand tokens, so a smaller guess compacted after a handful of short turns.
#: A model with a smaller window refuses a request that is too large, and the
#: context is then shrunk for a retry (:meth:`Compactor.after_refusal`).
DEFAULT_CONTEXT_TOKENS = 32768
SUMMARY_PREFIX = "Summary of the earlier conversation:\n"
DROPPED_NOTICE = (
    "[{n} earlier messages of this conversation were dropped to fit the model's context; "
    "they are still in the conversation's history.]"
)


@settings_dataclass
class CompactionPolicy:
    """When and how to compact.

    ``context_tokens``: the model's context budget (``None``: the backend's
    ``context_window`` attribute if it has one, else 32768).  ``trigger``:
    compact when a request would use more than this share of it.
    ``keep_turns``: the most recent turns kept verbatim.  ``summary_tokens``:
    the summary's length limit.  ``timeout``: seconds for the summary call.
    ``prompt``: the summariser's instruction (``{words}``: its word limit).

    ``tool`` offers the model the ``compact_context`` tool (off by default): the
    model may ask for its context to be compacted (after the current step,
    keeping the last ``keep_turns`` turns); ``tool_min_tokens``: a smaller
    context is not compacted (the model is told so); ``tool_min_interval``:
    seconds that must pass between two compactions a model asked for in one
    conversation (in this process).

    This class is also the ``[compaction]`` section of the configuration file.
    """

    enabled: bool = True
    context_tokens: int | None = Field(None, ge=256)
    trigger: float = Field(0.8, gt=0, le=1)
    keep_turns: int = Field(4, ge=1)
    summary_tokens: int = Field(512, ge=32)
    timeout: float = Field(120.0, gt=0)
    prompt: str = SUMMARY_PROMPT
    tool: bool = False
    tool_min_tokens: int = Field(2_000, ge=0)
    tool_min_interval: float = Field(600.0, ge=0)


def estimate_tokens(
    messages: Sequence[ChatMessage], system: str | None = None, tools: Sequence[ToolSpec] = ()
) -> int:
    """A tokenizer-free estimate of a request's size, in tokens.

    ``ceil(characters / 4)`` for text, plus 4 per message (role and
    framing) and the tool definitions' JSON — once per request, as a request
    carries them once however many messages it has.  English text runs about 4
    characters a token with common tokenizers; code and other scripts use
    more tokens, which the ``trigger`` margin absorbs.
    """
    chars = len(system or "")
    count = 0
    for m in messages:
        count += 1
        chars += len(m.content) + len(m.author or "")
        for c in m.tool_calls:
            chars += len(c.name) + len(c.arguments) + 8
    for t in tools:
        chars += len(t.name) + len(t.description) + _schema_chars(t.parameters)
    return -(-chars // 4) + 4 * count + 4 * len(tools)


#: JSON length of tool schemas seen, by ``id``; each entry keeps its schema
#: alive, so an id is never reused while it is cached.
_SCHEMA_CHARS: dict[int, tuple[Any, int]] = {}


def _schema_chars(parameters: Any) -> int:
    """``len(json.dumps(parameters))``, computed once per schema object.

    Tools hand the same schema dict to every request, and this runs before
    each one; serialising every schema every time was the measurable part.
    """
    hit = _SCHEMA_CHARS.get(id(parameters))
    if hit is not None and hit[0] is parameters:
        return hit[1]
    n = len(json.dumps(parameters))
    if len(_SCHEMA_CHARS) >= 4096:
        _SCHEMA_CHARS.clear()
    _SCHEMA_CHARS[id(parameters)] = (parameters, n)
    return n


def transcript(messages: Sequence[ChatMessage], *, tool_chars: int = 600) -> str:
    """``messages`` as the plain text a summariser model reads (compaction, reflection).

    Tool-call arguments and tool results are cut to ``tool_chars`` characters.
    """
    lines: list[str] = []
    for m in messages:
        if m.role == "system":
            lines.append(f"[earlier summary]\n{m.content.removeprefix(SUMMARY_PREFIX)}")
        elif m.role == "user":
            lines.append(f"{m.author or 'user'}: {m.content}")
        elif m.role == "assistant":
            if m.content:
                lines.append(f"assistant: {m.content}")
            for c in m.tool_calls:
                lines.append(f"assistant called tool {c.name} with {c.arguments[:tool_chars]}")
        elif m.role == "tool":
            text = m.content if len(m.content) <= tool_chars else m.content[:tool_chars] + " …"
            lines.append(f"tool {m.name or ''} returned: {text}")
    return "\n".join(lines)


class CompactorHost(Protocol):
    """What a :class:`Compactor` needs of its agent, read at each use (an
    :class:`~agentik.core.agent.Agent` or its
    :class:`~agentik.core.services.AgentServices`)."""

    @property
    def llm(self) -> LLMBackend: ...

    @property
    def system_prompt(self) -> str | None: ...

    @property
    def hooks(self) -> Hooks: ...


class Compactor:
    """Compacts the working memory of an agent's conversations.

    ``agent`` provides the model (which summarises and whose window and
    tokenizer are used), the system prompt and the ``before_compact`` hooks.
    Each method works on one conversation's
    :class:`~agentik.core.services.ConversationParts`: its working memory
    (read, compacted, reloaded) and its event stream (``Compacted``).
    """

    def __init__(self, agent: CompactorHost, policy: CompactionPolicy | None = None) -> None:
        self.agent = agent
        self.policy = policy or CompactionPolicy()
        #: When the model last had each conversation compacted (``compact_context``;
        #: monotonic seconds, this process): ``tool_min_interval`` is kept from it.
        self._asked: dict[str, float] = {}

    def tool_refusal(self, conversation_id: str, tokens: int) -> str | None:
        """Why the model may not have ``conversation_id`` (``tokens`` now) compacted
        now (``compact_context``), or ``None``: it may, and the time is noted."""
        policy = self.policy
        if tokens < policy.tool_min_tokens:
            return (
                f"not compacted: the context is about {tokens} tokens, under the"
                f" {policy.tool_min_tokens} the policy compacts at the earliest"
            )
        now = time.monotonic()
        last = self._asked.get(conversation_id)
        if last is not None and now - last < policy.tool_min_interval:
            wait = policy.tool_min_interval - (now - last)
            return (
                f"not compacted: it was compacted {now - last:.0f} s ago; the policy"
                f" allows it again in {wait:.0f} s"
            )
        self._asked[conversation_id] = now
        if len(self._asked) > 4096:  # forget the oldest conversations first
            for key in list(self._asked)[:1024]:
                del self._asked[key]
        return None

    @property
    def budget(self) -> int:
        """Tokens compaction keeps a request under (its ``trigger`` share starts it)."""
        return self.budget_for(None)

    def budget_for(self, llm: LLMBackend | None) -> int:
        """:attr:`budget` for backend ``llm`` (``None``: the agent's)."""
        return int(self.policy.context_tokens or self.window_of(llm) or DEFAULT_CONTEXT_TOKENS)

    @property
    def window(self) -> int | None:
        """The model's real window for a request — the backend's ``context_window``
        (prompt tokens it takes with room for the answer kept) — or ``None``
        when the backend does not know it (a remote endpoint: its refusal
        is handled by :meth:`after_refusal`)."""
        return self.window_of(None)

    def window_of(self, llm: LLMBackend | None) -> int | None:
        """:attr:`window` of backend ``llm`` (``None``: the agent's; a conversation's
        model profile brings its own)."""
        known = (llm or self.agent.llm).context_window
        return int(known) if known else None

    async def count(self, request: LLMRequest, llm: LLMBackend | None = None) -> int:
        """The request's size in tokens: the tokenizer of ``llm`` (default: the
        agent's backend), else the estimate."""
        try:
            counted = await (llm or self.agent.llm).count_tokens(request)
        except Exception as exc:
            log.debug("count_tokens failed (%s); estimating", exc)
        else:
            if counted is not None:
                return int(counted)
        return estimate_tokens(request.messages, request.system, request.tools)

    async def before_request(
        self,
        parts: PartsLike,
        request: LLMRequest,
        *,
        run_id: str | None = None,
        settle: Callable[[], Awaitable[None]] | None = None,
        llm: LLMBackend | None = None,
    ) -> bool:
        """Make ``request`` fit; ``True`` if the working memory changed (build it again).

        Past ``trigger`` of the budget the older part is summarised (when
        compaction is enabled); if the request still exceeds the model's real
        window (:attr:`window`) — or compaction is off — the oldest whole
        turns are dropped (:meth:`trim`).  Raises
        :class:`~agentik.core.errors.ContextTooLong` when even the latest
        turn alone does not fit.  ``settle`` is awaited before the working
        memory is rewritten: it waits for the caller's pending writes.
        ``llm`` is the backend the request goes to (default: the agent's): its
        window and tokenizer are used (the summary is still the agent's model's).
        """
        tokens = await self.count(request, llm)
        window = self.window_of(llm)
        compact = self.policy.enabled and tokens > self.budget_for(llm) * self.policy.trigger
        if not compact and (window is None or tokens <= window):
            return False
        if settle is not None:
            await settle()
        changed = False
        if compact:
            event = await self.compact(
                parts, reason="budget", run_id=run_id, tools=request.tools, tokens_before=tokens
            )
            if event is not None:
                changed = True
                request = dataclasses.replace(request, messages=parts.memory.messages)
                tokens = await self.count(request, llm)
        if window is not None and tokens > window:
            await self.trim(
                parts, request, window, run_id=run_id, reason="window", tokens=tokens, llm=llm
            )
            changed = True
        return changed

    async def after_refusal(
        self,
        parts: PartsLike,
        request: LLMRequest,
        error: ContextTooLong,
        *,
        run_id: str | None = None,
        settle: Callable[[], Awaitable[None]] | None = None,
        llm: LLMBackend | None = None,
    ) -> None:
        """The model refused ``request`` as too large: shrink the context for one retry.

        The context is compacted (when enabled) and then trimmed to at most
        half its measured size (or the known window, if smaller): the
        measurement said it fits, so the model's real limit is lower than
        we thought.  Re-raises ``error`` when nothing can be dropped.
        """
        if settle is not None:
            await settle()
        tokens = await self.count(request, llm)
        target = tokens // 2
        window = self.window_of(llm)
        if window is not None:
            target = min(target, window)
        log.info(
            "conversation %s: the model refused %d tokens as too large (%s); shrinking to %d",
            parts.id,
            tokens,
            error,
            target,
        )
        if self.policy.enabled:
            event = await self.compact(
                parts, reason="refused", run_id=run_id, tools=request.tools, tokens_before=tokens
            )
            if event is not None:
                request = dataclasses.replace(request, messages=parts.memory.messages)
                tokens = await self.count(request, llm)
                if tokens <= target:
                    return
        try:
            await self.trim(
                parts, request, target, run_id=run_id, reason="refused", tokens=tokens, llm=llm
            )
        except ContextTooLong:
            raise error from None

    async def trim(
        self,
        parts: PartsLike,
        request: LLMRequest,
        limit: int,
        *,
        run_id: str | None = None,
        reason: str = "window",
        tokens: int | None = None,
        llm: LLMBackend | None = None,
    ) -> Compacted:
        """Drop the oldest whole turns until ``request`` fits in ``limit`` tokens.

        Cuts fall only before a user message (a tool call keeps its result);
        the latest user message — and its turn so far — always stays, and
        the dropped messages become a one-line notice in the working memory
        (the audit log keeps them).  Publishes a
        :class:`~agentik.core.events.Compacted` event with ``fallback`` set.
        Raises :class:`~agentik.core.errors.ContextTooLong` when the latest
        user message alone does not fit.
        """
        entries = await parts.memory.entries()
        messages = [e.message for e in entries]
        if tokens is None:
            tokens = await self.count(dataclasses.replace(request, messages=tuple(messages)), llm)
        # A cut may fall before any user message (never between a tool call
        # and its result); the latest user message always stays.
        starts = [i for i, m in enumerate(messages) if m.role == "user"]
        cuts = [i for i in starts if i > 0]

        def candidate(cut: int) -> LLMRequest:
            notice = ChatMessage(role="system", content=DROPPED_NOTICE.format(n=cut))
            return dataclasses.replace(request, messages=(notice, *messages[cut:]))

        lo, hi, best, best_tokens = 0, len(cuts) - 1, None, 0
        while lo <= hi:  # the earliest cut that fits: each later one is shorter
            mid = (lo + hi) // 2
            size = await self.count(candidate(cuts[mid]), llm)
            if size <= limit:
                best, best_tokens, hi = cuts[mid], size, mid - 1
            else:
                lo = mid + 1
        if best is None:
            latest = await self.count(candidate(starts[-1]), llm) if starts else tokens
            raise ContextTooLong(
                f"the latest message is too long for the model's context: it needs about"
                f" {latest} tokens with the system prompt, and {limit} fit; send a shorter"
                f" message (the conversation itself is kept)"
            )
        notice = DROPPED_NOTICE.format(n=best)
        event = await self._replace(
            parts,
            entries,
            best,
            notice,
            reason=reason,
            run_id=run_id,
            tokens_before=tokens,
            tokens_after=lambda: best_tokens,
            fallback=True,
        )
        log.warning(
            "conversation %s: dropped the %d oldest messages from the context to fit the"
            " model's window (%d → %d tokens, limit %d; the audit log keeps them)",
            parts.id,
            best,
            tokens,
            best_tokens,
            limit,
        )
        return event

    async def compact(
        self,
        parts: PartsLike,
        *,
        reason: str = "budget",
        run_id: str | None = None,
        tools: Sequence[ToolSpec] = (),
        tokens_before: int | None = None,
    ) -> Compacted | None:
        """Summarise everything before the last ``keep_turns`` turns.

        Must run where no turn of the conversation runs concurrently (inside
        its turn, or through :meth:`Conversation.run_exclusive`).  Returns the
        published event, or ``None`` when there was nothing to compact.
        """
        entries = await parts.memory.entries()
        messages = [e.message for e in entries]
        cut = _cut_index(messages, self.policy.keep_turns)
        if cut <= 0 or (cut == 1 and messages[0].role == "system"):
            log.info("conversation %s: nothing old enough to compact", parts.id)
            return None
        system = self.agent.system_prompt
        if tokens_before is None:
            tokens_before = estimate_tokens(messages, system, tools)

        async def summarise() -> tuple[str, bool]:
            return await self._summarise(parts.id, messages[:cut])

        event = await self._replace(
            parts,
            entries,
            cut,
            summarise,
            reason=reason,
            run_id=run_id,
            tokens_before=tokens_before,
            tokens_after=lambda: estimate_tokens(parts.memory.messages, system, tools),
        )
        log.info(
            "conversation %s: compacted %d messages (%d → %d tokens, %s%s)",
            parts.id,
            cut,
            tokens_before,
            event.tokens_after,
            reason,
            ", summary failed: dropped" if event.fallback else "",
        )
        return event

    async def _replace(
        self,
        parts: PartsLike,
        entries: Sequence[MemoryEntry],
        cut: int,
        summary: str | Callable[[], Awaitable[tuple[str, bool]]],
        *,
        reason: str,
        run_id: str | None,
        tokens_before: int,
        tokens_after: Callable[[], int],
        fallback: bool = False,
    ) -> Compacted:
        """Replace the first ``cut`` working-memory ``entries`` with ``summary`` and
        publish the :class:`~agentik.core.events.Compacted` event.

        The ``before_compact`` hooks see the messages first; ``summary`` is
        text, or a coroutine function giving ``(text, fallback)`` (run after
        the hooks).  ``tokens_after`` is asked once the memory is reloaded.
        """
        old = [e.message for e in entries[:cut]]
        await self.agent.hooks.before_compact(parts.conversation, old, reason)
        if isinstance(summary, str):
            text = summary
        else:
            text, fallback = await summary()
        memory = parts.memory
        await memory.compact(entries, entries[cut - 1].pos, text)
        await memory.load(exclude_run=run_id)
        return parts.events.emit(
            Compacted,
            run_id,
            messages=len(old),
            tokens_before=tokens_before,
            tokens_after=tokens_after(),
            summary=text,
            reason=reason,
            fallback=fallback,
            user_turns=sum(
                m.role == "user" and not str(m.content or "").startswith(SUMMARY_PREFIX)
                for m in old
            ),
        )

    async def _summarise(
        self, conversation_id: str, old: Sequence[ChatMessage]
    ) -> tuple[str, bool]:
        p = self.policy
        system = p.prompt.format(words=max(50, int(p.summary_tokens * 0.7)))
        started = time.monotonic()
        try:
            async with asyncio.timeout(p.timeout):
                text = await ask(self.agent.llm, system, transcript(old), p.summary_tokens)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning(
                "conversation %s: summarising %d messages failed (%s: %s); dropping them"
                " from the context instead (the audit log keeps them)",
                conversation_id,
                len(old),
                type(exc).__name__,
                exc,
            )
            return DROPPED_NOTICE.format(n=len(old)), True
        if not text:
            log.warning(
                "conversation %s: the summary came back empty; dropping %d messages instead",
                conversation_id,
                len(old),
            )
            return DROPPED_NOTICE.format(n=len(old)), True
        log.debug("summary of %d messages took %.2fs", len(old), time.monotonic() - started)
        return SUMMARY_PREFIX + text, False


async def ask(llm: Any, system: str, content: str, max_tokens: int) -> str:
    """One tool-less request (``system`` + one user message); the answer text, stripped.

    For the agent's own bookkeeping: summaries, mining, reflections.
    """
    request = LLMRequest(
        system=system,
        messages=(ChatMessage(role="user", content=content),),
        tool_choice="none",
        max_tokens=max_tokens,
        temperature=0.2,
    )
    parts: list[str] = []
    gen = llm.stream(request)
    async with contextlib.aclosing(gen):
        async for item in gen:
            if isinstance(item, TextChunk):
                parts.append(item.text)
    return "".join(parts).strip()


def _turn_starts(messages: Sequence[ChatMessage]) -> list[int]:
    """Indexes where a turn starts: a user message that follows a non-user one
    (a block of several user messages — ambient notes, then the message — is
    one start)."""
    return [
        i
        for i, m in enumerate(messages)
        if m.role == "user" and (i == 0 or messages[i - 1].role != "user")
    ]


def _cut_index(messages: Sequence[ChatMessage], keep_turns: int) -> int:
    """Index of the first message to keep: the start of the ``keep_turns``-th last turn.

    Returns 0 when there are not more turns than that.
    """
    starts = _turn_starts(messages)
    keep = max(1, keep_turns)
    if len(starts) <= keep:
        return 0
    return starts[-keep]


class CompactContextTool:
    """``compact_context``: the model asks for its context to be compacted.

    Offered with ``[compaction] tool = true``.  The turn compacts after the
    current step (every result of the step written), keeping the last
    ``keep_turns`` turns; the policy's ``tool_min_tokens`` and
    ``tool_min_interval`` refuse it (the model is told why).
    """

    name = "compact_context"
    description = (
        "Compact this conversation's context: older messages are replaced by a summary"
        " (the full history stays in the log). Use it when the conversation has grown long"
        " and its early part no longer matters in detail."
    )
    parameters: dict[str, Any] = {"type": "object", "properties": {}}

    def __repr__(self) -> str:
        return "CompactContextTool()"

    async def call(self, arguments: dict[str, Any], context: Any) -> Any:
        compact = getattr(context, "compact", None)
        if compact is None:
            raise ToolError("this conversation cannot be compacted here")
        refusal = await compact()
        if refusal is not None:
            raise ToolError(refusal)
        return "compacting: older messages will be replaced by a summary after this step"
