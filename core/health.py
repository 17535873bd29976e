"""Health of the running parts: transports, MCP servers, the model backend.

Each part is a *component* (``transport:libera``, ``mcp:time``, ``model:openai``)
with a state, a reason and since when it is in that state:

``starting``      not up yet (first connection under way)
``connected``     working
``degraded``      working with a problem (a reason says which)
``reconnecting``  lost and trying again (a transport's backoff, a restart)
``failed``        given up; only a restart of the bot (or a reload) helps

Transports report with :meth:`agentik.transports.base.Transport.set_health`;
the bot puts their reports here.  MCP servers are read when asked (their
toolset keeps its own state); the model backend is followed from the agent's
events (:func:`watch_model`: a turn that ended is a request that worked, an
``error`` event of an ``LLM…`` error one that did not).

**Readiness** (:meth:`HealthRegistry.ready`) considers transports only: every
one is ``connected`` or ``degraded``, or has been ``starting``/``reconnecting``
for less than ``grace`` seconds.  A failed transport makes the bot not ready
(other transports keep working: it stays alive).  MCP servers and the model
show in the detail and turn the overall ``status`` into ``degraded``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from .services import AgentState

if TYPE_CHECKING:
    from .protocols import LiveConversation
    from .services import AgentLike

__all__ = ["Health", "HealthRegistry", "HealthState", "status_of", "watch_model", "without_reasons"]

log = logging.getLogger(__name__)

HealthState = Literal["starting", "connected", "degraded", "reconnecting", "failed"]
#: States in which a component does its work.
UP: frozenset[str] = frozenset({"connected", "degraded"})


@dataclass(frozen=True, slots=True)
class Health:
    """One component's state; ``since`` is a wall-clock time (``time.time()``)."""

    state: HealthState = "starting"
    reason: str | None = None
    since: float = field(default_factory=time.time)

    def as_dict(self) -> dict[str, Any]:
        return {"state": self.state, "reason": self.reason, "since": self.since}


#: Called with ``(component, health)`` after every change.
Listener = Callable[[str, Health], None]


class HealthRegistry:
    """The states of every component, and who wants to hear of changes."""

    def __init__(self, *, grace: float = 0.0) -> None:
        #: Seconds a transport may be ``starting``/``reconnecting`` and still count as ready.
        self.grace = grace
        self.started = time.time()
        self._components: dict[str, Health] = {}
        self._extra: dict[str, dict[str, Any]] = {}
        self._listeners: list[Listener] = []
        self._providers: list[Callable[[], Iterable[tuple[str, Health]]]] = []

    # -- reporting ---------------------------------------------------------------------
    def report(
        self,
        component: str,
        state: HealthState,
        reason: str | None = None,
        **extra: Any,
    ) -> Health:
        """Set ``component``'s state; ``since`` only moves when the state changes."""
        old = self._components.get(component)
        if old is not None and old.state == state:
            new = old if old.reason == reason else replace(old, reason=reason)
        else:
            new = Health(state, reason)
        self._components[component] = new
        if extra:
            self._extra.setdefault(component, {}).update(extra)
        if new is not old:
            for listener in list(self._listeners):
                try:
                    listener(component, new)
                except Exception:
                    log.exception("health listener %r failed", listener)
        return new

    def forget(self, component: str) -> None:
        self._components.pop(component, None)
        self._extra.pop(component, None)

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` on every change; returns the unsubscribe function."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def add_provider(self, provider: Callable[[], Iterable[tuple[str, Health]]]) -> None:
        """Components read when asked (MCP servers): ``provider()`` yields ``(name, health)``."""
        self._providers.append(provider)

    # -- reading -----------------------------------------------------------------------
    def get(self, component: str) -> Health | None:
        return self._components.get(component)

    def components(self) -> dict[str, Health]:
        out = dict(self._components)
        for provider in self._providers:
            try:
                out.update(provider())
            except Exception:
                log.exception("health provider %r failed", provider)
        return out

    def transports(self) -> dict[str, Health]:
        prefix = "transport:"
        return {k[len(prefix) :]: h for k, h in self._components.items() if k.startswith(prefix)}

    def transport_ready(self, health: Health, now: float | None = None) -> bool:
        if health.state in UP:
            return True
        if health.state in ("starting", "reconnecting") and self.grace > 0:
            return (now if now is not None else time.time()) - health.since < self.grace
        return False

    def ready(self) -> bool:
        """Every transport up, or within ``grace`` of starting/reconnecting."""
        now = time.time()
        return all(self.transport_ready(h, now) for h in self.transports().values())

    def all_failed(self) -> bool:
        found = self.transports()
        return bool(found) and all(h.state == "failed" for h in found.values())

    def detail(self) -> dict[str, Any]:
        """``ready``, the components not up (``degraded``) and every component's state."""
        now = time.time()
        components: dict[str, Any] = {}
        for name, h in sorted(self.components().items()):
            entry = h.as_dict()
            entry.update(self._extra.get(name, {}))
            if name.startswith("transport:"):
                entry["ready"] = self.transport_ready(h, now)
            components[name] = entry
        return {
            "ready": self.ready(),
            "degraded": [n for n, c in components.items() if c["state"] not in UP],
            "components": components,
        }


def without_reasons(detail: dict[str, Any]) -> dict[str, Any]:
    """``detail`` for an unauthenticated caller: states only (reasons name hosts and errors)."""
    components = {
        name: {k: v for k, v in entry.items() if k != "reason"}
        for name, entry in detail.get("components", {}).items()
    }
    return {**detail, "components": components}


def status_of(
    agent: AgentLike[Any],
    registry: HealthRegistry,
    visible: Callable[[str | None], bool] | None = None,
) -> dict[str, Any]:
    """What ``agentik status`` shows: version, uptime, components, busy conversations
    (only those whose channel key ``visible`` accepts, when given)."""
    from importlib.metadata import version

    busy = []
    conversations: list[LiveConversation] = agent.services.conversations()
    for conv in conversations:
        if visible is not None and not visible(conv.channel_key):
            continue
        if conv.busy or conv.queued:
            busy.append(
                {
                    "id": conv.id,
                    "channel_key": conv.channel_key,
                    "busy": conv.busy,
                    "queued": conv.queued,
                }
            )
    now = time.time()
    out: dict[str, Any] = {
        "agent_id": agent.id,
        "version": version("agentik"),
        "started": registry.started,
        "uptime": round(now - registry.started, 3),
    }
    out.update(registry.detail())
    out["conversations"] = {
        "busy": sum(1 for c in busy if c["busy"]),
        "queued": sum(c["queued"] for c in busy),
        "active": busy,
    }
    return out


async def watch_model(agent: AgentLike[Any], registry: HealthRegistry, name: str = "model") -> None:
    """Follow the agent's turns: the model's last request worked, or failed and why.

    Runs until the agent's event stream ends (the agent closes).
    """
    component = f"model:{name}"
    while agent.state in (AgentState.NEW, AgentState.RUNNING):
        events = agent.events(kinds=("turn_ended", "error"), max_pending=10_000)
        try:
            async for event in events:
                kind = getattr(event, "kind", "")
                if kind == "turn_ended" and getattr(event, "stop_reason", "") != "error":
                    registry.report(component, "connected", None)
                elif kind == "error":
                    error_type = getattr(event, "error_type", "") or ""
                    if error_type.startswith("LLM"):
                        registry.report(component, "degraded", str(getattr(event, "message", "")))
        finally:
            await events.aclose()
