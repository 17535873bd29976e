"""Prometheus metrics of one running bot.

:class:`Metrics` owns a :class:`prometheus_client.CollectorRegistry` of its
own (never the process-wide default one: several bots, or tests, in one
process do not share counters).  It is fed three ways:

- the agent's event stream (``Agent.events``): turns by stop reason and their
  duration, tool calls by tool and outcome and their latency, approvals,
  compactions and errors;
- the agent's request observers (:mod:`agentik.core.observe`): model
  requests, their latency and time to first token, and tokens, by backend
  and model;
- small calls from the bridge, the transports and the bot: messages in and
  out per transport (:meth:`message_in`, :meth:`message_out`), transport
  states and reconnects (:meth:`transport_state`), budget refusals
  (:meth:`budget_refused`).

What is true at any moment (conversations with a turn running or queued,
turns waiting, conversations loaded) is read from the agent when scraped.

:meth:`render` gives the exposition (``(body, content_type)``) for whatever
serves it: the HTTP transport's ``GET /metrics``, or a health listener.

Labels stay low-cardinality: transport instance names, backends, models,
tool names, outcomes.  Never a conversation id, a channel or a person.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agentik.core.observe import RequestStats

if TYPE_CHECKING:
    from agentik.core import Agent

__all__ = ["TRANSPORT_STATES", "Metrics"]

log = logging.getLogger(__name__)

#: States a transport reports (``agentik_transport_state``; wt-health's states).
TRANSPORT_STATES = ("starting", "connected", "degraded", "reconnecting", "failed", "stopped")

#: Event kinds the metrics read.
_KINDS = (
    "turn_ended",
    "tool_call_ended",
    "approval_requested",
    "approval_resolved",
    "compacted",
    "error",
)

_MODEL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_FIRST_TOKEN_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
_TOOL_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)
_TURN_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0)


def _version() -> str:
    try:
        return metadata.version("agentik")
    except metadata.PackageNotFoundError:
        return "unknown"


class _AgentState(Collector):
    """Read at scrape time from the agent: what is true now."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def collect(self) -> Iterator[Metric]:
        services = self.agent.services
        busy = list(services.busy.values())
        active = GaugeMetricFamily(
            "agentik_active_conversations",
            "Conversations with a turn running or queued.",
        )
        active.add_metric([], len(busy))
        yield active
        queued = GaugeMetricFamily(
            "agentik_queue_depth",
            "Turns waiting behind a running turn, over all conversations.",
        )
        queued.add_metric([], sum(c.queued for c in busy))
        yield queued
        loaded = GaugeMetricFamily(
            "agentik_loaded_conversations",
            "Conversations held in memory (idle ones reload from the database on demand).",
        )
        loaded.add_metric([], len(services.open))
        yield loaded


class Metrics:
    """The metrics of one bot (see the module docstring)."""

    def __init__(self, agent: Agent | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.agent = agent
        info = Gauge(
            "agentik_build_info", "The running agentik version (always 1).", ["version"],
            registry=r,
        )  # fmt: skip
        info.labels(version=_version()).set(1)
        self.turns = Counter(
            "agentik_turns", "Turns that ended, by stop reason (stop, length, interrupted, "
            "time_budget, error, aborted, tool_limit).", ["stop_reason"], registry=r,
        )  # fmt: skip
        self.turn_seconds = Histogram(
            "agentik_turn_duration_seconds", "Seconds from a turn's start to its end.",
            buckets=_TURN_BUCKETS, registry=r,
        )  # fmt: skip
        self.requests = Counter(
            "agentik_model_requests", "Requests to the model, by backend, model and outcome "
            "(ok, error, cancelled).", ["backend", "model", "outcome"], registry=r,
        )  # fmt: skip
        self.request_seconds = Histogram(
            "agentik_model_request_duration_seconds", "Seconds from sending a model request "
            "to the end of its response stream.", ["backend", "model"],
            buckets=_MODEL_BUCKETS, registry=r,
        )  # fmt: skip
        self.first_token = Histogram(
            "agentik_model_time_to_first_token_seconds", "Seconds from sending a model "
            "request to its first text, reasoning or tool call.", ["backend", "model"],
            buckets=_FIRST_TOKEN_BUCKETS, registry=r,
        )  # fmt: skip
        self.tokens = Counter(
            "agentik_model_tokens", "Tokens the model backend reported, by type "
            "(prompt, completion).", ["backend", "model", "type"], registry=r,
        )  # fmt: skip
        self.tool_calls = Counter(
            "agentik_tool_calls", "Tool calls that ended, by tool and outcome (ok, error).",
            ["tool", "outcome"], registry=r,
        )  # fmt: skip
        self.tool_seconds = Histogram(
            "agentik_tool_call_duration_seconds", "Seconds a tool call took, by tool.",
            ["tool"], buckets=_TOOL_BUCKETS, registry=r,
        )  # fmt: skip
        self.approvals_requested = Counter(
            "agentik_approvals_requested", "Tool calls that waited for a person's approval.",
            ["tool"], registry=r,
        )  # fmt: skip
        self.approvals_resolved = Counter(
            "agentik_approvals_resolved", "Approvals that ended, by decision (approved, "
            "denied, expired, cancelled).", ["decision"], registry=r,
        )  # fmt: skip
        self.budget_refusals = Counter(
            "agentik_budget_refusals", "Messages and tool calls refused by a usage budget, "
            "by scope (identity, unverified, channel) and kind (messages, tokens, tool_calls).",
            ["scope", "kind"], registry=r,
        )  # fmt: skip
        self.compactions = Counter(
            "agentik_compactions", "Working-memory compactions, by reason.", ["reason"],
            registry=r,
        )  # fmt: skip
        self.errors = Counter(
            "agentik_turn_errors", "Errors reported by turns, by error type.", ["type"],
            registry=r,
        )  # fmt: skip
        self.received = Counter(
            "agentik_messages_received", "Incoming chat messages handed to the bot, by "
            "transport instance.", ["transport"], registry=r,
        )  # fmt: skip
        self.sent = Counter(
            "agentik_messages_sent", "Outgoing messages sent, by transport instance and kind "
            "(answer, delta, end, notice, error, command).", ["transport", "kind"], registry=r,
        )  # fmt: skip
        self.transport_states = Gauge(
            "agentik_transport_state", "1 for each transport's current state, 0 for the others.",
            ["transport", "state"], registry=r,
        )  # fmt: skip
        self.reconnects = Counter(
            "agentik_transport_reconnects", "Times a transport was connected again after "
            "losing its connection.", ["transport"], registry=r,
        )  # fmt: skip
        self._state: dict[str, str] = {}
        self._was_connected: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        #: Set whenever an event was counted (see :meth:`wait_until`).
        self._counted = asyncio.Event()
        #: Names of the agent's tools (refreshed when an unknown name shows up).
        self._tools: set[str] = set()
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        if agent is not None:
            r.register(_AgentState(agent))

    # -- feeding ----------------------------------------------------------------------
    def start(self) -> None:
        """Follow the agent's events and model requests (call once the loop runs)."""
        agent = self.agent
        if agent is None or self._task is not None:
            return
        agent.request_observers.append(self.model_request)
        sub = agent.events(kinds=_KINDS, max_pending=100_000)
        self._task = asyncio.get_running_loop().create_task(
            self._follow(sub), name="agentik-metrics"
        )

    async def aclose(self) -> None:
        """Stop following the agent."""
        if self.agent is not None:
            with contextlib.suppress(ValueError):
                self.agent.request_observers.remove(self.model_request)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _follow(self, sub: Any) -> None:
        try:
            async for event in sub:
                try:
                    self.event(event)
                except Exception:
                    log.exception("metrics: could not count a %s event", event.kind)
                self._counted.set()
        finally:
            await sub.aclose()

    def _child(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, cached: ``labels()`` costs more than the count."""
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def event(self, e: Any) -> None:
        """Count one agent event."""
        kind = e.kind
        if kind == "tool_call_ended":
            tool = self._tool_label(e.name)
            self._child(self.tool_calls, tool, "error" if e.is_error else "ok").inc()
            self._child(self.tool_seconds, tool).observe(e.duration)
        elif kind == "turn_ended":
            self._child(self.turns, e.stop_reason).inc()
            self.turn_seconds.observe(e.duration)
        elif kind == "approval_requested":
            if not e.resumed:
                self.approvals_requested.labels(tool=e.name).inc()
        elif kind == "approval_resolved":
            self.approvals_resolved.labels(decision=e.decision).inc()
        elif kind == "compacted":
            self.compactions.labels(reason=e.reason).inc()
        elif kind == "error":
            self.errors.labels(type=e.error_type or "error").inc()

    def _tool_label(self, name: str) -> str:
        """``name`` if the agent has such a tool, else ``unknown``: a model inventing
        tool names must not invent label values."""
        if self.agent is None or name in self._tools:
            return name
        self._tools = {t.name for t in self.agent.tools}
        return name if name in self._tools else "unknown"

    async def wait_until(self, check: Callable[[], bool]) -> None:
        """Wait until ``check()`` is true, looking again after each event counted.

        Events are counted in a task of their own, a moment after they
        happen: tests (and anything else that needs the counts of what it
        just saw happen) wait with this.
        """
        while not check():
            self._counted.clear()
            await self._counted.wait()

    def model_request(self, stats: RequestStats) -> None:
        """Count one model request (an ``Agent.request_observers`` entry)."""
        backend, model = stats.backend, stats.model
        child = self._child
        child(self.requests, backend, model, stats.outcome).inc()
        child(self.request_seconds, backend, model).observe(stats.duration)
        if stats.first_token is not None:
            child(self.first_token, backend, model).observe(stats.first_token)
        u = stats.usage
        if u.prompt_tokens:
            child(self.tokens, backend, model, "prompt").inc(u.prompt_tokens)
        if u.completion_tokens:
            child(self.tokens, backend, model, "completion").inc(u.completion_tokens)

    def message_in(self, transport: str) -> None:
        """An incoming message reached the bot through ``transport`` (its instance name)."""
        self._child(self.received, transport).inc()

    def message_out(self, transport: str, kind: str, n: int = 1) -> None:
        """``n`` messages of ``kind`` were sent through ``transport``."""
        self._child(self.sent, transport, kind).inc(n)

    def budget_refused(self, scope: str, kind: str) -> None:
        """A usage budget refused a message or a tool call (``Budgets.on_refusal``)."""
        self.budget_refusals.labels(scope=scope, kind=kind).inc()

    def transport_state(self, transport: str, state: str) -> None:
        """``transport`` is now in ``state`` (one of :data:`TRANSPORT_STATES`).

        Coming back to ``connected`` after having been connected before
        counts as a reconnect.
        """
        if state not in TRANSPORT_STATES:
            raise ValueError(f"unknown transport state {state!r}")
        before = self._state.get(transport)
        if state == before:
            return
        self._state[transport] = state
        for s in TRANSPORT_STATES:
            self.transport_states.labels(transport=transport, state=s).set(1 if s == state else 0)
        if state == "connected":
            if transport in self._was_connected:
                self.reconnects.labels(transport=transport).inc()
            self._was_connected.add(transport)

    # -- exposition -------------------------------------------------------------------
    def render(self) -> tuple[bytes, str]:
        """The Prometheus text exposition and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
