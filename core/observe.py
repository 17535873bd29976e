"""What the agent reports of each model request, for metrics and logs.

The event stream says what a *turn* did; it does not say how long each
request to the model took or which backend and model served it.
:attr:`Agent.request_observers <agentik.core.Agent.request_observers>` are
plain callables the turn calls once per model request, synchronously, with a
:class:`RequestStats`: keep them cheap (count, then return).  An observer
that raises is logged and otherwise ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .messages import Usage

__all__ = ["RequestStats"]


@dataclass(frozen=True, kw_only=True, slots=True)
class RequestStats:
    """One model request: who served it, how long it took, what it used."""

    #: The backend's registry name (``openai``, ``litert``, ``llamacpp``, …).
    backend: str
    #: The model asked for (the request's, else the backend's default).
    model: str
    #: Seconds from sending the request to the end of its stream.
    duration: float
    #: Seconds until the first text, reasoning or tool call arrived (``None``: none did).
    first_token: float | None
    #: Tokens the backend reported for this request.
    usage: Usage = field(default_factory=Usage)
    #: ``ok``; ``error`` (the backend raised); ``cancelled`` (the turn was stopped).
    outcome: Literal["ok", "error", "cancelled"] = "ok"
    conversation_id: str | None = None
    run_id: str | None = None
