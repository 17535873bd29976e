"""Per-turn settings as a value: what one turn runs with, and where it came from.

A :class:`TurnSettings` is frozen: the tool policy, the persona block added to
the system prompt, the model profile, a replacement system prompt and the
automatic-recall policy of one turn.  A front end builds one and hands it to
:meth:`Conversation.submit <agentik.core.conversation.Conversation.submit>`
(``send``, ``steer`` and ``resume`` too); the queued turn carries it and the
turn engine reads nothing else, so the same conversation reached from two
front ends (an IRC channel with a persona, the HTTP API posting into it) gives
each turn its own persona, tools and model, whatever the order.

A field left ``None`` means the agent's own (its policy, system prompt, main
model, the memory backend's recall policy), read when the turn starts, so a
configuration reload is seen by the next turn.  ``submit(settings=None)``
takes the conversation's default settings (:attr:`Conversation.settings
<agentik.core.conversation.Conversation.settings>`; all ``None`` unless a
library user set the deprecated per-conversation attributes).

:class:`TurnOrigin` says where a turn came from (transport instance, channel
key, speaker); it rides on the settings but is not part of their equality:
two turns with equal settings from different speakers are alike (a steering
message joins a running turn only when its settings equal the turn's).  The
origin is recorded in the user message's ``data["origin"]`` (read it back with
:meth:`TurnOrigin.of`), on the run tree's node and on the ``turn_started``
event, so linked channels and plugins can tell which front end a run served.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, overload

from .memory import RecallPolicy
from .messages import Message
from .tools.base import TurnPolicy

__all__ = ["DEFAULT_SETTINGS", "DeprecatedSetting", "TurnOrigin", "TurnSettings"]

T = TypeVar("T")


class _Speaker(Protocol):
    """What :meth:`TurnOrigin.of_speaker` reads of a :class:`~agentik.core.gate.Speaker`."""

    @property
    def transport(self) -> str: ...
    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def verified(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class TurnOrigin:
    """Where a turn came from: the front end, the channel and the speaker."""

    #: The transport instance (``libera``, ``web``, ``stdio``); ``None``: a library call.
    transport: str | None = None
    #: The channel key the message was recorded under (``libera:#chan``, ``http:web:alice``).
    channel_key: str | None = None
    #: The id the transport gives the speaker (an IRC account or nick, an HTTP token name).
    speaker_id: str | None = None
    #: The name shown for the speaker.
    display_name: str | None = None
    #: Whether the transport vouches for :attr:`speaker_id`.
    verified: bool = False

    @classmethod
    def of_speaker(cls, speaker: _Speaker, channel_key: str | None) -> TurnOrigin:
        """The origin of a message from ``speaker`` (:class:`~agentik.core.gate.Speaker`)
        recorded under ``channel_key``."""
        return cls(
            transport=speaker.transport,
            channel_key=channel_key,
            speaker_id=speaker.id or None,
            display_name=speaker.name or None,
            verified=bool(speaker.verified),
        )

    def to_dict(self) -> dict[str, Any]:
        """As plain JSON types (what the user message's ``data["origin"]`` holds)."""
        # Its fields are strings, None and a bool: no ``dataclasses.asdict``, whose
        # recursive deep copy cost ~15 us of each message on the event loop (twice).
        return {name: getattr(self, name) for name in _ORIGIN_FIELDS}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TurnOrigin:
        """Rebuild an origin from :meth:`to_dict` output (unknown keys ignored)."""
        return cls(**{k: v for k, v in data.items() if k in _ORIGIN_FIELDS})

    @classmethod
    def of(cls, message: Message) -> TurnOrigin | None:
        """The origin recorded on a stored user message, ``None`` when it has none."""
        data = message.data
        found = data.get("origin") if isinstance(data, dict) else None
        return cls.from_dict(found) if isinstance(found, dict) else None


#: :class:`TurnOrigin`'s field names, in order.
_ORIGIN_FIELDS = tuple(f.name for f in dataclasses.fields(TurnOrigin))


@dataclass(frozen=True, slots=True)
class TurnSettings:
    """What one turn runs with (see the module docstring); ``None``: the agent's."""

    #: The turn's limits and tool filter (``None``: the agent's :class:`TurnPolicy`).
    policy: TurnPolicy | None = None
    #: Text added after the system prompt (a channel's persona block).
    system_addition: str | None = None
    #: The model profile (``[llm.profiles.<name>]``; ``None``: the main backend).
    llm_profile: str | None = None
    #: Replaces the agent's system prompt (a named agent's own, for a child run).
    system_prompt: str | None = None
    #: Automatic recall (``None``: the memory backend's ``recall_policy``).
    recall: RecallPolicy | None = None
    #: Where the turn came from; not compared (see the module docstring).
    origin: TurnOrigin | None = field(default=None, compare=False)

    def replace(self, **changes: Any) -> TurnSettings:
        """A copy with ``changes`` (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)

    def with_origin(self, origin: TurnOrigin | None) -> TurnSettings:
        """A copy coming from ``origin``."""
        return dataclasses.replace(self, origin=origin)

    def allowing(self, allowed_tools: Iterable[str] | None, *, default: TurnPolicy) -> TurnSettings:
        """A copy whose turns use only ``allowed_tools`` (a transport's tool bound).

        Replaces ``allowed_tools`` in :attr:`policy`, or in ``default`` (the
        agent's policy) when there is none; the other limits are kept.
        ``None`` changes nothing.
        """
        if allowed_tools is None:
            return self
        allowed = allowed_tools if isinstance(allowed_tools, tuple) else tuple(allowed_tools)
        # TurnPolicy is a pydantic dataclass, which mypy does not see as a dataclass.
        policy = dataclasses.replace(  # type: ignore[type-var]
            self.policy or default, allowed_tools=allowed
        )
        return dataclasses.replace(self, policy=policy)


#: The settings of a turn nobody configured: everything the agent's.
DEFAULT_SETTINGS = TurnSettings()


class _HasSettings(Protocol):
    settings: TurnSettings


class DeprecatedSetting(Generic[T]):
    """A deprecated attribute that is a view of one field of its owner's default
    ``settings`` (``Conversation.policy`` …): reading it gives that field; setting
    it warns (:class:`DeprecationWarning`) and replaces the owner's settings with
    a copy changed in that field."""

    name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        self.owner = owner.__name__

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> DeprecatedSetting[T]: ...
    @overload
    def __get__(self, obj: _HasSettings, objtype: type | None = None) -> T: ...
    def __get__(self, obj: _HasSettings | None, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(obj.settings, self.name)

    def __set__(self, obj: _HasSettings, value: T) -> None:
        warnings.warn(
            f"{self.owner}.{self.name} is deprecated: pass settings=TurnSettings(...) to "
            f"submit()/send(), or set {self.owner}.settings",
            DeprecationWarning,
            stacklevel=2,
        )
        changes: dict[str, Any] = {self.name: value}
        obj.settings = dataclasses.replace(obj.settings, **changes)
