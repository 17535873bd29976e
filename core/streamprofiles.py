"""Stream profiles: which events a subscriber gets, as data.

A :class:`StreamProfile` is a small value — the event kinds it carries
(``None``: every kind, including kinds added later), whether it carries the
events of child runs (sub-agents, events with a ``parent_run_id``) and
whether it carries usage numbers.  Three are built in
(:data:`BUILTIN_PROFILES`):

``chat``
    text, short tool notices, approvals and lifecycle; no child-run events
    (a child run shows as its ``child_run_linked`` event only);
``debug``
    everything, child runs included;
``metrics``
    usage and lifecycle (tool calls ended, child runs linked), child runs
    included, no text.

More are declared in the configuration (``[profiles.<name>]``, each a
:class:`StreamProfileSettings`) and resolved with :func:`resolve_profiles`.
Subscribers name one: ``Conversation.events(profile="quiet")``,
``Agent.events(...)``, the HTTP API's ``?profile=quiet``, a channel's
``profile`` setting.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, cast

from pydantic import Field

from .errors import ConfigError
from .events import EVENT_TYPES, PLUGIN_KIND, Event, plugin_event_kinds
from .messages import Usage
from .settings import empty_list, settings_dataclass

__all__ = [
    "BUILTIN_PROFILES",
    "PROFILES",
    "PROFILE_NAME",
    "StreamProfile",
    "StreamProfileSettings",
    "UnknownProfileError",
    "known_kinds",
    "lookup",
    "resolve_profiles",
]

#: What a profile's name may be (``[profiles.<name>]``, ``?profile=<name>``).
PROFILE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")


class UnknownProfileError(ValueError):
    """A subscriber named a profile nobody declared."""


def known_kinds() -> frozenset[str]:
    """Every event kind there is: each class of :data:`~.events.Event`'s ``kind``,
    and the kinds plugins declared (:func:`~agentik.core.events.declare_event`)."""
    builtin = (cast(str, cls.__dataclass_fields__["kind"].default) for cls in EVENT_TYPES)
    return frozenset(builtin) | plugin_event_kinds()


@dataclass(frozen=True, kw_only=True, slots=True)
class StreamProfile:
    """Which events a subscriber receives (see the module docstring)."""

    name: str
    #: The event kinds carried; ``None``: all of them.
    kinds: frozenset[str] | None = None
    #: Whether events of child runs (``parent_run_id`` set) are carried.
    child_runs: bool = True
    #: Whether usage numbers are carried: without, ``usage`` events are left out
    #: and ``turn_ended`` arrives with its usage zeroed.
    usage: bool = True
    description: str = ""

    def carries(self, kind: str) -> bool:
        """Whether events of ``kind`` pass (child runs and usage aside)."""
        if kind == "usage" and not self.usage:
            return False
        return self.kinds is None or kind in self.kinds

    def admit(self, event: Event) -> Event | None:
        """``event`` as this profile's subscriber sees it, or ``None`` if it does not."""
        kind: str = event.kind
        if self.kinds is not None and kind not in self.kinds:
            return None
        if not self.child_runs and event.parent_run_id is not None:
            return None
        if not self.usage:
            if kind == "usage":
                return None
            if event.kind == "turn_ended":
                return dataclasses.replace(event, usage=Usage())
        return event

    @property
    def passes_everything(self) -> bool:
        """Whether :meth:`admit` is the identity (a subscriber needs no filter)."""
        return self.kinds is None and self.child_runs and self.usage


_LIFECYCLE = frozenset(
    {
        "turn_started",
        "turn_ended",
        "interrupted",
        "error",
        "events_lost",
        "compacted",
        "conversation_ended",
        "conversation_started",
        "run_stream_end",
    }
)

#: The built-in profiles.  Kinds that other parts add later reach ``debug``
#: by themselves (its kinds are "all").
BUILTIN_PROFILES: dict[str, StreamProfile] = {
    "debug": StreamProfile(name="debug", description="every event, child runs included"),
    "chat": StreamProfile(
        name="chat",
        kinds=_LIFECYCLE
        | {
            "text_delta",
            "tool_call_started",
            "tool_call_ended",
            "child_run_linked",
            "approval_requested",
            "approval_resolved",
            "question_asked",
            "question_answered",
            "question_progress",
            "todo_updated",
            "tool_progress",
        },
        child_runs=False,
        description="text, tool notices, approvals and lifecycle; child runs as one event",
    ),
    "metrics": StreamProfile(
        name="metrics",
        kinds=_LIFECYCLE
        | {"tool_call_ended", "child_run_linked", "approval_resolved", "usage", "status_changed"},
        description="usage and lifecycle, child runs included",
    ),
}

#: The built-in profiles' kinds, by name (``debug``: every kind).  Profiles as
#: values — child runs and usage included or not, custom ones from the
#: configuration — are :class:`StreamProfile`.  (Was ``agentik.core.events.PROFILES``.)
PROFILES: dict[str, frozenset[str]] = {
    name: known_kinds() if p.kinds is None else p.kinds for name, p in BUILTIN_PROFILES.items()
}


ProfileName = Annotated[str, Field(pattern=f"^{PROFILE_NAME.pattern}$")]


@settings_dataclass
class StreamProfileSettings:
    """``[profiles.<name>]``: a stream profile of your own.

    Its kinds are those of ``extends`` (a built-in or another declared
    profile; none: no kinds), plus ``kinds``, minus ``exclude``;
    ``child_runs`` and ``usage`` are inherited from ``extends`` unless given
    (without ``extends``: both true).
    """

    #: The profile this one starts from: ``chat``, ``debug``, ``metrics`` or another
    #: ``[profiles.<name>]``.
    extends: ProfileName | None = None
    #: Event kinds added (``text_delta``, ``tool_call_started``, ``turn_ended``, …).
    kinds: list[str] = Field(default_factory=empty_list)
    #: Event kinds left out (of what ``extends`` gives).
    exclude: list[str] = Field(default_factory=empty_list)
    #: Whether events of child runs (sub-agents) are carried; unset: as ``extends``.
    child_runs: bool | None = None
    #: Whether usage numbers are carried; unset: as ``extends``.
    usage: bool | None = None
    #: What the profile is for (shown by the HTTP API's OpenAPI document and docs).
    description: str = ""


def resolve_profiles(
    declared: Mapping[str, StreamProfileSettings] | None,
    *,
    where: str = "profiles",
    kinds: Iterable[str] | None = None,
    plugins_loaded: bool = True,
) -> dict[str, StreamProfile]:
    """The built-in profiles plus ``declared`` ones, resolved.

    Raises :class:`~agentik.core.errors.ConfigError` naming the key
    (``profiles.quiet.kinds``) for an unknown kind, an unknown or circular
    ``extends``, a bad name or a built-in's name.  ``plugins_loaded=False``
    (reading the file, before plugins are loaded): a kind that looks like a
    plugin's (``acme.flagged``) passes; the bot checks it again once they are.
    """
    known = frozenset(kinds) if kinds is not None else known_kinds()
    if not plugins_loaded:
        known |= {
            k
            for spec in (declared or {}).values()
            for k in (*spec.kinds, *spec.exclude)
            if PLUGIN_KIND.fullmatch(k)
        }
    declared = dict(declared or {})
    out: dict[str, StreamProfile] = dict(BUILTIN_PROFILES)
    for name in declared:
        if name in BUILTIN_PROFILES:
            raise ConfigError(
                f"{where}.{name}: {name!r} is a built-in profile; choose another name"
            )
        if not PROFILE_NAME.fullmatch(name):
            raise ConfigError(
                f"{where}.{name}: not a usable profile name (a letter, then letters, digits, _ . -)"
            )
        for key in ("kinds", "exclude"):
            for kind in getattr(declared[name], key):
                if kind not in known:
                    raise ConfigError(
                        f"{where}.{name}.{key}: unknown event kind {kind!r}"
                        f" (known: {', '.join(sorted(known))})"
                    )

    def resolve(name: str, chain: tuple[str, ...]) -> StreamProfile:
        if name in out:
            return out[name]
        spec = declared[name]
        base: StreamProfile | None = None
        if spec.extends is not None:
            if spec.extends in chain or spec.extends == name:
                loop = " -> ".join((*chain, name, spec.extends))
                raise ConfigError(f"{where}.{name}.extends: profiles extend each other ({loop})")
            if spec.extends not in out and spec.extends not in declared:
                raise ConfigError(
                    f"{where}.{name}.extends: no profile {spec.extends!r}"
                    f" (profiles: {', '.join([*out, *(n for n in declared if n not in out)])})"
                )
            base = resolve(spec.extends, (*chain, name))
        kinds_set: frozenset[str] | None
        if base is not None and base.kinds is None:
            kinds_set = None if not spec.exclude else known
        else:
            kinds_set = base.kinds if base is not None else frozenset()
        if kinds_set is not None:
            kinds_set = (kinds_set | frozenset(spec.kinds)) - frozenset(spec.exclude)
        profile = StreamProfile(
            name=name,
            kinds=kinds_set,
            child_runs=spec.child_runs
            if spec.child_runs is not None
            else (base.child_runs if base else True),
            usage=spec.usage if spec.usage is not None else (base.usage if base else True),
            description=spec.description,
        )
        out[name] = profile
        return profile

    for name in declared:
        resolve(name, ())
    return out


def lookup(profiles: Mapping[str, StreamProfile], profile: str | StreamProfile) -> StreamProfile:
    """The profile named ``profile`` (a :class:`StreamProfile` is returned as is)."""
    if isinstance(profile, StreamProfile):
        return profile
    found = profiles.get(profile)
    if found is None:
        raise UnknownProfileError(
            f"unknown event profile {profile!r} (known: {', '.join(profiles)})"
        )
    return found
