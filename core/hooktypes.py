"""The types the interception hooks exchange (see :mod:`agentik.core.hookspecs`).

What they return to change a turn (:class:`Refuse`, :class:`Abort`,
:class:`Block`, :class:`Retry`, :class:`UseBackend`: plugins return them,
:class:`~agentik.core.hooks.Hooks` acts on them) and what they receive
(:class:`ConversationLike`).  They live below both modules, so the hook
contracts and the code that calls the hooks name the same types without
importing each other or the conversation; import the results from
:mod:`agentik.core.hooks` as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Abort", "Block", "ConversationLike", "Refuse", "Retry", "UseBackend"]


class ConversationLike(Protocol):
    """A conversation as the hook machinery sees it.  Hook implementations
    receive the :class:`~agentik.core.conversation.Conversation` itself; this
    protocol names what :mod:`agentik.core.hooks` reads of it, so that the
    hooks, which the conversation is built on, do not import it."""

    @property
    def id(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Refuse:
    """``before_prompt``: refuse the message; ``message`` is shown in the channel."""

    message: str


@dataclass(frozen=True, slots=True)
class Abort:
    """``after_response``: end the turn without recording the response."""

    reason: str


@dataclass(frozen=True, slots=True)
class Block:
    """``before_tool_call``: do not run the call; the model gets ``blocked: <reason>``."""

    reason: str


@dataclass(frozen=True, slots=True)
class Retry:
    """``on_tool_error``: run the failed call again after ``delay`` seconds."""

    delay: float = 0.0


@dataclass(frozen=True, slots=True)
class UseBackend:
    """``before_llm_request``: send this request to ``backend`` (optionally a new ``request``)."""

    backend: Any
    request: Any = None
