"""Tools: a name, a description, a JSON-Schema and an async call.

Anything with those four attributes is a :class:`Tool` (a Protocol), so MCP
servers, memory backends, sub-agents and plugins each bring their own
classes.  :class:`FunctionTool` wraps an async function::

    @tool(description="Add two numbers", parameters={
        "type": "object",
        "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        "required": ["a", "b"],
    })
    async def add(a: float, b: float) -> str:
        return str(a + b)

A tool returns text (``str``) or a :class:`ToolResult` (text plus optional
structured ``data``, or ``is_error``, and ``effects`` on the turn:
:class:`EndTurn` ends it after this batch of tool calls, without asking the
model again; :class:`AskUser` asks the people in the conversation a question
and hands their answer back to the model with the result).  Raising
:class:`~agentik.core.errors.ToolError` reports an error to the model with
its message; any other exception reports ``tool <name> failed (internal
error, ref <ref>)`` and logs the traceback under that reference, so paths and
library internals never reach the model.  Either way the turn goes on.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import Field

from ..llm.base import ToolSpec
from ..settings import knobs_dataclass, settings_dataclass

__all__ = [
    "AskUser",
    "Effect",
    "EndTurn",
    "FunctionTool",
    "Tool",
    "ToolContext",
    "ToolResult",
    "TurnLimits",
    "TurnPolicy",
    "tool",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class EndTurn:
    """A tool's effect: the turn ends once this batch of tool calls has finished,
    without another model request.  ``answer`` (if any) is the turn's answer, as
    if the model had written it; without one, the channel sees the tool calls only."""

    kind: Literal["end_turn"] = field(default="end_turn", init=False)
    answer: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class AskUser:
    """A tool's effect: ask the people in the conversation ``question`` (offering
    ``choices``) and wait, as ``ask_user`` does; the answer is added to the tool's
    result (``<result>`` then ``alice answered: …``) before the model sees it.
    Where nobody can be asked (a temporary conversation), the result says so."""

    kind: Literal["ask_user"] = field(default="ask_user", init=False)
    question: str
    choices: tuple[str, ...] = ()


#: What a tool's result may ask of the turn (:attr:`ToolResult.effects`).
Effect = EndTurn | AskUser


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolResult:
    """What a tool gives back: ``text`` for the model, ``data`` for the log, and
    ``effects`` on the turn (:class:`EndTurn`, :class:`AskUser`; an error result's
    effects are ignored)."""

    text: str
    data: Any = None
    is_error: bool = False
    effects: tuple[Effect, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolContext:
    """Who is calling: passed to tools that accept a ``context`` argument."""

    conversation_id: str
    run_id: str
    call_id: str
    author: str | None = None
    channel: str | None = None
    #: The speaker's identity, qualified by transport instance
    #: (``libera:alice``); ``None`` when unknown (library use).
    author_id: str | None = None
    #: Everyone who spoke recently in this conversation (``author_id`` values),
    #: the current speaker included.
    speakers: tuple[str, ...] = ()
    #: Ask the people in the conversation and wait (``ask_user``); ``None`` where
    #: nobody can answer (a temporary conversation, library use without a turn).
    human: Any = None
    #: Emit an event of this turn: ``emit(EventClass, **fields)`` (builtin tools).
    emit: Callable[..., None] | None = None
    #: Report progress of this call: ``await progress(progress, total, message)``
    #: becomes a ``tool_progress`` event (MCP ``notifications/progress``).
    progress: Callable[[float, float | None, str | None], Awaitable[None]] | None = None
    #: Ask for the context to be compacted after this step (``compact_context``):
    #: ``await compact()`` is ``None`` (it will be) or why the policy refuses.
    compact: Callable[[], Awaitable[str | None]] | None = None


@runtime_checkable
class Tool(Protocol):
    """The tool protocol."""

    name: str
    description: str
    parameters: dict[str, Any]

    async def call(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult | str:
        """Run the tool with the model's (parsed) ``arguments``."""
        ...


def spec_of(t: Tool) -> ToolSpec:
    return ToolSpec(name=t.name, description=t.description, parameters=t.parameters)


class FunctionTool:
    """A :class:`Tool` around an async function taking the arguments as keywords.

    If the function has a ``context`` parameter, it receives the
    :class:`ToolContext`.
    """

    def __init__(
        self,
        fn: Callable[..., Awaitable[ToolResult | str]],
        *,
        name: str | None = None,
        description: str | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"tool {fn.__name__!r} must be an async function")
        self.fn = fn
        self.name = name or fn.__name__
        self.description = description or inspect.getdoc(fn) or ""
        self.parameters = parameters or {"type": "object", "properties": {}}
        self._wants_context = "context" in inspect.signature(fn).parameters

    def __repr__(self) -> str:
        return f"FunctionTool({self.name!r})"

    async def call(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult | str:
        if self._wants_context:
            return await self.fn(**arguments, context=context)
        return await self.fn(**arguments)


def tool(
    fn: Callable[..., Awaitable[ToolResult | str]] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: dict[str, Any] | None = None,
) -> Any:
    """Decorator form of :class:`FunctionTool` (with or without arguments)."""

    def wrap(f: Callable[..., Awaitable[ToolResult | str]]) -> FunctionTool:
        return FunctionTool(f, name=name, description=description, parameters=parameters)

    return wrap(fn) if fn is not None else wrap


# A knobs class (settings a narrower scope may override; see agentik.core.settings).
# Not spelled out: TurnPolicy is no dataclass to type checkers (its dataclasses.replace
# calls are not checked against its fields), so the class it inherits is none either.
@knobs_dataclass
class TurnLimits:
    """The limits of one turn that a named agent may set for its own runs
    (``[agents.<name>]``; :class:`TurnPolicy` explains them)."""

    max_tool_calls: int = Field(16, ge=0)
    time_budget: float = Field(300.0, gt=0)


@settings_dataclass
class TurnPolicy(TurnLimits):
    """Limits of one turn.

    ``max_tool_calls``: tool calls allowed in one turn; calls past the cap get
    an error result and the model is then asked to answer without tools.
    ``time_budget``: seconds for the whole turn (model requests and tools);
    when it runs out the turn stops, keeping the partial answer.
    ``tool_timeout``: seconds for one tool call.
    ``allowed_tools``: glob patterns of tool names the model may see and
    call (``None``: all); a tool not allowed is not even offered.
    ``max_tool_retries``: how often one failed call may be retried when an
    ``on_tool_error`` plugin hook asks for it.

    Size limits keep one bad exchange from wedging a conversation (every later
    request carries the working memory back to the model).  The audit log
    always keeps everything whole; only the working memory is cut:
    ``max_tool_argument_chars``: a tool call whose arguments are longer is
    refused (not run); in the working memory its arguments become a small
    JSON object with a marker.
    ``max_tool_result_chars``: a longer tool result reaches the model cut,
    with a marker.
    ``max_answer_chars``: the model's answer is streamed up to this many
    characters; past it the stream is stopped and the turn ends with
    ``stop_reason = "length"``.

    Builtin tools (issue 20): ``ask_user`` offers the model the ``ask_user``
    tool (ask the people in the conversation and wait for the answer; never
    offered in a temporary conversation); ``ask_user_timeout``: seconds to
    wait when the model gives no timeout (and ``ask_user_max_timeout`` caps
    the model's); ``ask_user_max_questions``: the most questions of one form
    (several questions answered at once; at most 10); ``answer_from``: who
    answers a question, ``asked`` (the
    person asked; without ``to``, the person whose message started the turn)
    or ``anyone`` in the conversation.  ``todo`` offers the ``todo`` tool
    (a checklist shown in the channel).

    This class is also the ``[tools]`` section of the configuration file
    (where ``allowed_tools`` is written ``allowed``).
    """

    tool_timeout: float = Field(60.0, gt=0)
    allowed_tools: tuple[str, ...] | None = Field(None, validation_alias="allowed")
    max_tool_retries: int = Field(2, ge=0)
    max_tool_argument_chars: int = Field(64_000, ge=1)
    max_tool_result_chars: int = Field(64_000, ge=1)
    max_answer_chars: int = Field(100_000, ge=1)
    ask_user: bool = False
    ask_user_timeout: float = Field(300.0, gt=0)
    ask_user_max_timeout: float = Field(3600.0, gt=0)
    ask_user_max_questions: int = Field(10, ge=1, le=10)
    answer_from: Literal["asked", "anyone"] = "asked"
    todo: bool = False
    _cache: dict[str, bool] = field(default_factory=dict, init=False, compare=False, repr=False)

    @property
    def allowed(self) -> list[str] | None:
        """``allowed_tools`` as the configuration file writes it (a list)."""
        return None if self.allowed_tools is None else list(self.allowed_tools)

    def allows(self, tool_name: str) -> bool:
        if self.allowed_tools is None:
            return True
        hit = self._cache.get(tool_name)
        if hit is None:
            hit = any(fnmatchcase(tool_name, pat) for pat in self.allowed_tools)
            self._cache[tool_name] = hit
        return hit

    def visible(self, tools: Iterable[Tool]) -> list[Tool]:
        return [t for t in tools if self.allows(t.name)]
