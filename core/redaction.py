"""Redaction: tombstones for messages that must go, and scrubbing before anything is stored.

Two tools, both about text that must not stay in the database:

* **Redacting** a stored message (:meth:`agentik.core.agent.Agent.redact`,
  ``!redact``, ``agentik conversations redact``, the HTTP API) replaces its
  content in the audit log *and* in working memory with a tombstone that
  says who removed it, when and why (:func:`tombstone`); the memory notes
  mined or reflected from a span of the conversation that covers it are
  deleted with every version; the redaction itself is audited
  (:class:`Redaction`).  The SQLite store does it with ``secure_delete`` on
  and checkpoints the WAL afterwards, so the old text is gone from the
  database *file*, not only hidden.
* **Scrubbing** (the ``before_store`` hook): plugins may rewrite any text
  before it is written — user messages, assistant answers, tool calls and
  results, memory notes.  :class:`PatternScrubber` is the built-in one
  (``[redaction] scrub = true``): it replaces common API keys and tokens,
  and the configured ``[[redaction.patterns]]``, with ``[redacted:<kind>]``.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable
from typing import Any

from pydantic import Field, field_validator

from .events import (
    ApprovalRequested,
    Event,
    Interrupted,
    QuestionAnswered,
    QuestionAsked,
    ReasoningDelta,
    TextDelta,
    ToolCallEnded,
    ToolCallStarted,
    TurnEnded,
)
from .hookspecs import hookimpl
from .settings import empty_list, settings_dataclass
from .store.records import Redaction, RedactionError, tombstoned

__all__ = [
    "BUILTIN_PATTERNS",
    "PatternScrubber",
    "Redaction",
    "RedactionError",
    "RedactionPattern",
    "RedactionSettings",
    "replay_edit",
    "tombstone",
    "tombstoned",
]

#: The built-in patterns: ``(kind, regular expression)``.
BUILTIN_PATTERNS: tuple[tuple[str, str], ...] = (
    (
        "private-key",
        # A whole PEM block; an unterminated one to the end of the text.
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----"
        r"(?:[\s\S]*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----|[\s\S]*)",
    ),
    ("openai-key", r"\bsk-(?:proj-|ant-|live-|test-)?[A-Za-z0-9_\-]{20,}"),
    ("slack-token", r"\bxox[abposr]-[A-Za-z0-9\-]{10,}"),
    ("github-token", r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,}|\bgithub_pat_[A-Za-z0-9_]{40,}"),
    ("aws-key", r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    ("jwt", r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"),
)


@settings_dataclass
class RedactionPattern:
    """``[[redaction.patterns]]``: one more pattern the scrubber replaces."""

    #: Shown in the replacement: ``[redacted:<kind>]`` (letters, digits, ``-``, ``_``).
    kind: str = Field(pattern=r"^[A-Za-z0-9_\-]{1,40}$")
    #: A Python regular expression; every match is replaced.
    pattern: str = Field(min_length=1)

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from None
        return value


@settings_dataclass
class RedactionSettings:
    """``[redaction]``: scrubbing secrets before they are stored."""

    #: Replace API keys and tokens (``sk-…``, ``xox[bpa]-…``, ``ghp_…``,
    #: ``AKIA…``, JWTs, PEM private keys) and the ``patterns`` below with
    #: ``[redacted:<kind>]`` before anything is written or sent to the model.
    scrub: bool = False
    #: More patterns for the scrubber (``kind`` and ``pattern``).
    patterns: list[RedactionPattern] = Field(default_factory=empty_list)
    #: Leave out the built-in patterns (only ``patterns`` apply).
    builtin_patterns: bool = True


def replay_edit(
    kind: str, run_id: str | None, call_id: str | None, content: str
) -> Callable[[], Callable[[Event], Event | None]]:
    """What a redaction does to the events still held in the replay buffers
    (:meth:`agentik.core.services.AgentServices.scrub`).

    ``kind``, ``run_id`` and ``call_id`` are the redacted audit row's;
    ``content`` is its tombstone.  Events are rewritten in place (their
    numbers kept), never dropped, so a replaying client sees the tombstone
    where the text was:

    * an **answer** (``assistant``): every ``text_delta`` and
      ``reasoning_delta`` of its run — the first delta of each buffer
      carries the tombstone, the rest are empty — and ``turn_ended.text`` /
      ``interrupted.partial_text``.  Deltas do not say which of a run's
      answers they belong to, so a run with several answers loses the
      streamed text of all of them from the replay (the stored history,
      ``…/messages``, still has the others);
    * a **tool call**: the arguments of its ``tool_call_started`` and
      ``approval_requested`` events, the text of its ``question_asked``;
    * a **tool result**: the ``result`` of its ``tool_call_ended``, and the
      ``answer`` of its ``question_answered`` (an ``ask_user`` answer);
    * a **user message**: no event carries its text.

    Returns a maker of the edit for one buffer (the tombstone goes to the
    first delta of each buffer).
    """

    def editor() -> Callable[[Event], Event | None]:
        first: set[str] = set()
        return lambda event: _edit(event, first)

    def _edit(event: Event, first: set[str]) -> Event | None:
        if kind == "assistant" and run_id is not None and event.run_id == run_id:
            if isinstance(event, (TextDelta, ReasoningDelta)):
                if isinstance(event, ReasoningDelta) or event.conversation_id in first:
                    text = ""
                else:
                    text = content
                    first.add(event.conversation_id)
                return dataclasses.replace(event, text=text) if event.text != text else event
            if isinstance(event, TurnEnded) and event.text:
                return dataclasses.replace(event, text=content)
            if isinstance(event, Interrupted) and event.partial_text:
                return dataclasses.replace(event, partial_text=content)
            return None
        if call_id is None or getattr(event, "call_id", None) != call_id:
            return None
        if kind == "tool_call":
            if isinstance(event, (ToolCallStarted, ApprovalRequested)):
                return dataclasses.replace(event, arguments="{}")
            if isinstance(event, QuestionAsked):
                return dataclasses.replace(event, question=content, choices=())
        if kind == "tool_result":
            if isinstance(event, ToolCallEnded):
                return dataclasses.replace(event, result=content)
            if isinstance(event, QuestionAnswered) and event.answer:
                return dataclasses.replace(event, answer=content)
        return None

    return editor


def tombstone(by: str, at: float, reason: str = "") -> str:
    """The text that replaces a redacted message."""
    when = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(at))
    why = f": {reason}" if reason else ""
    return f"[message redacted by {by} at {when}{why}]"


class PatternScrubber:
    """The built-in ``before_store`` plugin: replaces secrets by ``[redacted:<kind>]``."""

    def __init__(self, settings: RedactionSettings | None = None) -> None:
        # Built, it scrubs: ``settings.scrub`` only decides whether the bot builds one.
        settings = settings or RedactionSettings()
        pairs: list[tuple[str, str]] = list(BUILTIN_PATTERNS) if settings.builtin_patterns else []
        pairs += [(p.kind, p.pattern) for p in settings.patterns]
        self.patterns = [(kind, re.compile(rx)) for kind, rx in pairs]

    def scrub(self, text: str) -> str:
        """``text`` with every match replaced."""
        for kind, rx in self.patterns:
            text = rx.sub(f"[redacted:{kind}]", text)
        return text

    @hookimpl(trylast=True)
    def before_store(self, text: str) -> str | None:
        out = self.scrub(text)
        return out if out != text else None


def scrubber_plugin(settings: Any) -> PatternScrubber | None:
    """The scrubber for ``[redaction]`` settings, or ``None`` when ``scrub`` is off."""
    if settings is None or not settings.scrub:
        return None
    return PatternScrubber(settings)
