"""A scripted model: a real :class:`LLMBackend` you enqueue answers into.

For our tests and for plugin authors' tests.  It records every request it
receives (``model.requests``) and streams enqueued replies word by word::

    model = ScriptedModel()
    model.enqueue("Hello there")                       # plain text
    model.enqueue(Reply(tool_calls=[call("add", {"a": 1, "b": 2})]))
    model.enqueue(Reply(text="slow", delay=0.05))      # a pause before each chunk
    model.enqueue(Reply(text="half", fail_after=1))    # raises LLMConnectionError
    model.enqueue(Reply(text="gated", gate=event))     # waits for event.set()
    model.enqueue(Reply(text="a b c", hold_after=1))   # "a " then waits for reply.release

With nothing queued it answers ``default(request)``; the default echoes the
last user message as ``"echo: <text>"``.  With ``context_window`` it acts
like a model with that many tokens of context: it reports the window (so
compaction fits requests to it) and refuses a larger request — by
:func:`~agentik.core.compaction.estimate_tokens` — with
:class:`~agentik.core.errors.ContextTooLong`, recording it in ``refused``.  Registered as backend
``scripted`` so a configuration can select it.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..compaction import estimate_tokens
from ..errors import ContextTooLong, LLMConnectionError, LLMError
from ..hookspecs import hookimpl
from ..llm.base import (
    FinishItem,
    LLMBackend,
    LLMRequest,
    ReasoningChunk,
    StreamItem,
    TextChunk,
    ToolCallItem,
    UsageItem,
)
from ..messages import ToolCall, Usage
from ..settings import SETTINGS, Blank

__all__ = ["Reply", "ScriptedModel", "ScriptedSettings", "call"]

_ids = itertools.count(1)


def call(
    name: str, arguments: dict[str, Any] | str | None = None, *, id: str | None = None
) -> ToolCall:
    """Build a :class:`ToolCall` (arguments as a dict or raw JSON text)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    return ToolCall(id=id or f"call_{next(_ids)}", name=name, arguments=args)


@dataclass(kw_only=True)
class Reply:
    """One scripted model response."""

    text: str = ""
    reasoning: str = ""
    tool_calls: Sequence[ToolCall] = ()
    usage: Usage | None = None
    #: seconds to sleep before each chunk
    delay: float = 0.0
    #: awaited before the first chunk
    gate: asyncio.Event | None = None
    #: raise ``error`` (default: a dropped connection) after this many text chunks
    fail_after: int | None = None
    error: LLMError | None = None
    finish_reason: str | None = None
    chunks: Sequence[str] | None = None
    #: set when this reply starts streaming (lets tests wait for "mid-stream")
    started: asyncio.Event = field(default_factory=asyncio.Event)
    #: after this many text chunks, wait for ``release`` before the rest
    #: (the answer is visibly mid-stream until the test says go on)
    hold_after: int | None = None
    release: asyncio.Event = field(default_factory=asyncio.Event)
    #: set once ``hold_after`` chunks have gone out and the reply waits
    held: asyncio.Event = field(default_factory=asyncio.Event)


def _echo(request: LLMRequest) -> Reply:
    last = next((m.content for m in reversed(request.messages) if m.role == "user"), "")
    return Reply(text=f"echo: {last}")


class ScriptedSettings(BaseModel):
    """The ``scripted`` backend's keys in ``[llm]`` (a test double: it echoes)."""

    model_config = SETTINGS | ConfigDict(frozen=True)

    #: The model name it reports (unset: ``scripted``).
    model: Blank = None
    supports_tools: bool = True
    #: Act like a model with this many tokens of context (unset: unlimited).
    context_window: int | None = Field(None, gt=0)


_DEFAULTS = ScriptedSettings()


class ScriptedModel(LLMBackend):
    """An LLM backend that plays back :class:`Reply` objects in order."""

    name = "scripted"
    settings_model = ScriptedSettings

    def __init__(
        self,
        replies: Sequence[Reply | str] = (),
        *,
        model: str | None = _DEFAULTS.model,
        default: Callable[[LLMRequest], Reply | str] | None = None,
        supports_tools: bool = _DEFAULTS.supports_tools,
        context_window: int | None = _DEFAULTS.context_window,
    ) -> None:
        self.model = model or self.name
        #: Prompt tokens a request may use (``None``: unlimited, unknown).
        self.context_window = context_window
        #: Requests refused as longer than ``context_window``.
        self.refused: list[LLMRequest] = []
        self.supports_tools = supports_tools
        self.default = default or _echo
        self.requests: list[LLMRequest] = []
        self._queue: collections.deque[Reply] = collections.deque()
        self.cancelled = 0
        self.closed = False
        for r in replies:
            self.enqueue(r)

    def enqueue(self, *replies: Reply | str) -> None:
        for reply in replies:
            self._queue.append(Reply(text=reply) if isinstance(reply, str) else reply)

    @property
    def pending(self) -> int:
        return len(self._queue)

    async def stream(self, request: LLMRequest) -> AsyncIterator[StreamItem]:
        if self.context_window is not None:
            size = estimate_tokens(request.messages, request.system, request.tools)
            if size > self.context_window:
                self.refused.append(request)
                raise ContextTooLong(
                    f"scripted: {size} tokens do not fit the context of {self.context_window}"
                )
        self.requests.append(request)
        if self._queue:
            reply = self._queue.popleft()
        else:
            made = self.default(request)
            reply = Reply(text=made) if isinstance(made, str) else made
        reply.started.set()
        try:
            if reply.gate is not None:
                await reply.gate.wait()
            if reply.reasoning:
                yield ReasoningChunk(reply.reasoning)
            pieces = list(reply.chunks) if reply.chunks is not None else _words(reply.text)
            for i, piece in enumerate(pieces):
                if reply.hold_after is not None and i == reply.hold_after:
                    reply.held.set()
                    await reply.release.wait()
                if reply.fail_after is not None and i >= reply.fail_after:
                    raise reply.error or LLMConnectionError(
                        "scripted: connection dropped mid-stream"
                    )
                if reply.delay:
                    await asyncio.sleep(reply.delay)
                yield TextChunk(piece)
            if reply.fail_after is not None and reply.fail_after >= len(pieces):
                raise reply.error or LLMConnectionError("scripted: connection dropped mid-stream")
            for tc in reply.tool_calls:
                yield ToolCallItem(tc)
            n = len(pieces)
            yield UsageItem(
                reply.usage
                or Usage(
                    prompt_tokens=len(request.messages),
                    completion_tokens=n,
                    total_tokens=len(request.messages) + n,
                )
            )
            yield FinishItem(reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop"))
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    async def aclose(self) -> None:
        self.closed = True


def _words(text: str) -> list[str]:
    """Split keeping whitespace attached, so the pieces join back to ``text``."""
    if not text:
        return []
    out: list[str] = []
    current = ""
    for ch in text:
        current += ch
        if ch == " ":
            out.append(current)
            current = ""
    if current:
        out.append(current)
    return out


@hookimpl
def register_llm_backends(register: Any) -> None:
    register("scripted", ScriptedModel)
