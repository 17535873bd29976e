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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .events import Compacted
from .llm.base import LLMRequest, TextChunk, ToolSpec
from .messages import ChatMessage

if TYPE_CHECKING:
    from .conversation import Conversation

__all__ = ["SUMMARY_PROMPT", "CompactionPolicy", "Compactor", "ask", "estimate_tokens"]

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

#: Context budget used when neither the configuration nor the backend gives one.
DEFAULT_CONTEXT_TOKENS = 8192
SUMMARY_PREFIX = "Summary of the earlier conversation:\n"
DROPPED_NOTICE = (
    "[{n} earlier messages of this conversation were dropped to fit the model's context; "
    "they are still in the conversation's history.]"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class CompactionPolicy:
    """When and how to compact.

    ``context_tokens``: the model's context budget (``None``: the backend's
    ``context_window`` attribute if it has one, else 8192).  ``trigger``:
    compact when a request would use more than this share of it.
    ``keep_turns``: the most recent turns kept verbatim.  ``summary_tokens``:
    the summary's length limit.  ``timeout``: seconds for the summary call.
    """

    enabled: bool = True
    context_tokens: int | None = None
    trigger: float = 0.8
    keep_turns: int = 4
    summary_tokens: int = 512
    timeout: float = 120.0
    prompt: str = SUMMARY_PROMPT


def estimate_tokens(
    messages: Sequence[ChatMessage], system: str | None = None, tools: Sequence[ToolSpec] = ()
) -> int:
    """A tokenizer-free estimate of a request's size, in tokens.

    ``ceil(characters / 4)`` for text, plus 4 per message (role and
    framing) and the tool definitions' JSON.  English text runs about 4
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


def _transcript(messages: Sequence[ChatMessage], *, tool_chars: int = 600) -> str:
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


class Compactor:
    """Compacts the working memory of an agent's conversations."""

    def __init__(self, agent: Any, policy: CompactionPolicy | None = None) -> None:
        self.agent = agent
        self.policy = policy or CompactionPolicy()

    @property
    def budget(self) -> int:
        return int(
            self.policy.context_tokens
            or getattr(self.agent.llm, "context_window", None)
            or DEFAULT_CONTEXT_TOKENS
        )

    async def count(self, request: LLMRequest) -> int:
        """The request's size in tokens: the backend's tokenizer, else the estimate."""
        counter = getattr(self.agent.llm, "count_tokens", None)
        if counter is not None:
            try:
                return int(await counter(request))
            except Exception as exc:
                log.debug("count_tokens failed (%s); estimating", exc)
        return estimate_tokens(request.messages, request.system, request.tools)

    async def before_request(
        self,
        conv: Conversation,
        request: LLMRequest,
        *,
        run_id: str | None = None,
        settle: Callable[[], Awaitable[None]] | None = None,
    ) -> bool:
        """Compact ``conv`` if ``request`` would not fit; ``True`` if it compacted.

        ``settle`` is awaited before compacting: it waits for the caller's
        pending writes, since compaction works on the stored working memory.
        """
        if not self.policy.enabled:
            return False
        tokens = await self.count(request)
        if tokens <= self.budget * self.policy.trigger:
            return False
        if settle is not None:
            await settle()
        event = await self.compact(
            conv, reason="budget", run_id=run_id, tools=request.tools, tokens_before=tokens
        )
        return event is not None

    async def compact(
        self,
        conv: Conversation,
        *,
        reason: str = "budget",
        run_id: str | None = None,
        tools: Sequence[ToolSpec] = (),
        tokens_before: int | None = None,
    ) -> Compacted | None:
        """Summarise everything before the last ``keep_turns`` turns.

        Must run where no turn of ``conv`` runs concurrently (inside its
        turn, or through :meth:`Conversation.run_exclusive`).  Returns the
        published event, or ``None`` when there was nothing to compact.
        """
        entries = await conv._store.load_memory(conv.id)
        messages = [e.message for e in entries]
        cut = _cut_index(messages, self.policy.keep_turns)
        if cut <= 0 or (cut == 1 and messages[0].role == "system"):
            log.info("conversation %s: nothing old enough to compact", conv.id)
            return None
        system = self.agent.system_prompt
        if tokens_before is None:
            tokens_before = estimate_tokens(messages, system, tools)
        old = messages[:cut]
        hooks = getattr(self.agent, "hooks", None)
        if hooks is not None and hooks.implemented("before_compact"):
            await hooks.call("before_compact", conversation=conv, messages=list(old), reason=reason)
        summary, fallback = await self._summarise(conv, old)
        await conv._compact(entries, entries[cut - 1].pos, summary)
        await conv._ensure_memory(exclude_run=run_id)
        now_messages = conv._memory_cache or []
        tokens_after = estimate_tokens(now_messages, system, tools)
        event = conv._emit(
            Compacted,
            run_id,
            messages=len(old),
            tokens_before=tokens_before,
            tokens_after=tokens_after,
            summary=summary,
            reason=reason,
            fallback=fallback,
        )
        log.info(
            "conversation %s: compacted %d messages (%d → %d tokens, %s%s)",
            conv.id,
            len(old),
            tokens_before,
            tokens_after,
            reason,
            ", summary failed: dropped" if fallback else "",
        )
        return event

    async def _summarise(self, conv: Conversation, old: Sequence[ChatMessage]) -> tuple[str, bool]:
        p = self.policy
        system = p.prompt.format(words=max(50, int(p.summary_tokens * 0.7)))
        started = time.monotonic()
        try:
            async with asyncio.timeout(p.timeout):
                text = await ask(self.agent.llm, system, _transcript(old), p.summary_tokens)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning(
                "conversation %s: summarising %d messages failed (%s: %s); dropping them"
                " from the context instead (the audit log keeps them)",
                conv.id,
                len(old),
                type(exc).__name__,
                exc,
            )
            return DROPPED_NOTICE.format(n=len(old)), True
        if not text:
            log.warning(
                "conversation %s: the summary came back empty; dropping %d messages instead",
                conv.id,
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


def _cut_index(messages: Sequence[ChatMessage], keep_turns: int) -> int:
    """Index of the first message to keep: the start of the ``keep_turns``-th last turn.

    A turn starts at a user message that follows a non-user message (a
    block of several user messages — ambient notes, then the message — is
    one start).  Returns 0 when there are not more turns than that.
    """
    starts = [
        i
        for i, m in enumerate(messages)
        if m.role == "user" and (i == 0 or messages[i - 1].role != "user")
    ]
    keep = max(1, keep_turns)
    if len(starts) <= keep:
        return 0
    return starts[-keep]
