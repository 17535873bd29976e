"""The LLM backend interface.

A backend has one required method, :meth:`LLMBackend.stream`: given an
:class:`LLMRequest` (messages, tool definitions), it yields
:data:`StreamItem` values as the model produces them:

* :class:`TextChunk` / :class:`ReasoningChunk` — answer / reasoning text;
* :class:`ToolCallItem` — one complete tool call (arguments fully assembled);
* :class:`UsageItem` — token usage for this request;
* :class:`FinishItem` — the model's stop reason, last.

Cancellation: the agent cancels the task iterating the stream (or closes the
generator); a backend must then release its resources promptly — for an
HTTP backend, close the response so the server sees the client go away.
Errors are raised as :class:`~agentik.core.errors.LLMError` subclasses; a
request the model refuses as too large for its context raises
:class:`~agentik.core.errors.ContextTooLong` (the turn then shrinks the
context and retries once).

Fitting the context: a backend that knows its model's window reports it as
:attr:`LLMBackend.context_window` — the prompt tokens a request may use, the
room for the answer (and anything else the engine needs) already kept — and
may count a request with the model's own tokenizer in
:meth:`LLMBackend.count_tokens`.  Before every request the agent measures it
(``count_tokens``, else an estimate) and compacts or trims the working
memory until it fits ``context_window``.  A backend that knows neither (a
remote endpoint) leaves both at their defaults.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from ..messages import ChatMessage, ToolCall, Usage

__all__ = [
    "FinishItem",
    "LLMBackend",
    "LLMRequest",
    "ReasoningChunk",
    "StreamItem",
    "TextChunk",
    "ToolCallItem",
    "ToolSpec",
    "UsageItem",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolSpec:
    """A tool as offered to the model: name, description, JSON-Schema."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})


@dataclass(frozen=True, kw_only=True, slots=True)
class LLMRequest:
    """One chat-completion request.

    ``system`` is the system prompt (backends put it where the model wants
    it); ``messages`` the working memory; ``model`` overrides the backend's
    default model for this request; ``conversation_id`` lets stateful
    backends keep per-conversation state.
    """

    messages: Sequence[ChatMessage]
    system: str | None = None
    tools: Sequence[ToolSpec] = ()
    tool_choice: Literal["auto", "none", "required"] = "auto"
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    conversation_id: str | None = None


@dataclass(frozen=True, slots=True)
class TextChunk:
    text: str


@dataclass(frozen=True, slots=True)
class ReasoningChunk:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallItem:
    call: ToolCall


@dataclass(frozen=True, slots=True)
class UsageItem:
    usage: Usage


@dataclass(frozen=True, slots=True)
class FinishItem:
    #: ``stop``, ``tool_calls``, ``length``, ``content_filter`` or backend-specific.
    reason: str


StreamItem = TextChunk | ReasoningChunk | ToolCallItem | UsageItem | FinishItem


class LLMBackend(abc.ABC):
    """Base class of model backends. Subclasses implement :meth:`stream`.

    Optional features are declared here with their "not supported" defaults;
    a backend overrides the ones it has (a class attribute, an instance
    attribute or a property): :attr:`supports_tools`, :attr:`supports_image_in`,
    :attr:`supports_image_out`, :attr:`context_window` and :meth:`count_tokens`.
    The agent reads them directly; it never probes a backend with ``getattr``.
    """

    #: Registry name (``[llm] backend = "..."``).
    name: str = ""
    #: A pydantic model of the backend's configuration keys (flat in ``[llm]``),
    #: or ``None``.  The builder validates the ``[llm]`` table with it (errors
    #: name the key) and calls the registered factory with its fields as
    #: keyword arguments (secrets revealed, :class:`~agentik.core.settings.FilePath`
    #: fields resolved against the configuration file).
    settings_model: ClassVar[Any] = None
    #: The default model identifier.
    model: str = ""
    #: Whether the model accepts tool definitions.
    supports_tools: bool = True
    #: Whether the model accepts images in user messages (a conversation's
    #: ``capabilities.image_in``).
    supports_image_in: bool = False
    #: Whether the model can answer with images (``capabilities.image_out``).
    supports_image_out: bool = False
    #: Prompt tokens a request may use (room for the answer kept), or ``None``
    #: when unknown; every request is fitted to it (see the module docstring).
    context_window: int | None = None

    @classmethod
    def unavailable(cls, settings: Any) -> str | None:
        """Why this backend cannot run on this machine with ``settings`` (its
        ``settings_model`` instance), as one sentence; ``None``: it can.

        For what a user installs (a package, a model file).  When
        ``backend = "auto"`` picked this backend, the bot then runs without a
        model and says this sentence; a configuration naming the backend gets
        it as an error.
        """
        return None

    @abc.abstractmethod
    def stream(self, request: LLMRequest) -> AsyncIterator[StreamItem]:
        """Stream the completion for ``request`` (an async generator)."""

    async def count_tokens(self, request: LLMRequest) -> int | None:
        """The size of ``request``'s prompt in the model's tokens (``None``: the
        backend cannot count; the agent estimates instead)."""
        return None

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release clients and connections."""

    async def __aenter__(self) -> LLMBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
