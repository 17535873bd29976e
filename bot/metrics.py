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

The counting is plain Python (:class:`_Series`: the same series, samples and
``_created`` times as ``prometheus_client``'s counters, gauges and histograms),
and ``prometheus_client`` is imported at the first scrape (or the first read of
:attr:`Metrics.registry`): a bot nobody scrapes does not load it (about 40
modules; docs/operations.md, "What a started bot imports").

Labels stay low-cardinality: transport instance names, backends, models,
tool names, outcomes.  Never a conversation id, a channel or a person.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import TYPE_CHECKING, Any

from agentik.core.observe import RequestStats

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import Metric

    from agentik.core import Agent
    from agentik.core.eventbus import Subscription

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


class _Child:
    """One labelled series of a :class:`_Series`: a value, or a histogram's buckets."""

    __slots__ = ("buckets", "created", "sum", "value")

    def __init__(self, n_buckets: int) -> None:
        self.value = 0.0
        self.sum = 0.0
        self.buckets = [0.0] * n_buckets
        self.created = time.time()

    def inc(self, amount: float = 1) -> None:
        if amount < 0:  # as prometheus_client's Counter (gauges here are only set)
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.value += amount

    def set(self, value: float) -> None:
        self.value = float(value)


class _HistogramChild(_Child):
    __slots__ = ("bounds",)

    def __init__(self, bounds: tuple[float, ...]) -> None:
        super().__init__(len(bounds))
        self.bounds = bounds

    def observe(self, amount: float) -> None:
        self.sum += amount
        for i, bound in enumerate(self.bounds):
            if amount <= bound:
                self.buckets[i] += 1.0
                break


class _Series:
    """A counter, gauge or histogram with its labelled children, counted in plain
    Python; :meth:`samples` gives what ``prometheus_client``'s own would expose."""

    def __init__(
        self,
        kind: str,
        name: str,
        doc: str,
        labelnames: tuple[str, ...] | list[str] = (),
        buckets: tuple[float, ...] = (),
    ) -> None:
        self.kind, self.name, self.doc = kind, name, doc
        self.labelnames = tuple(labelnames)
        self.bounds = (*buckets, math.inf) if kind == "histogram" else ()
        self.children: dict[tuple[str, ...], _Child] = {}
        if not self.labelnames:
            self.children[()] = self._new()

    def _new(self) -> _Child:
        return _HistogramChild(self.bounds) if self.kind == "histogram" else _Child(0)

    def labels(self, *values: str, **named: str) -> Any:
        if named:
            values = tuple(named[n] for n in self.labelnames)
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {values}")
        key = tuple(str(v) for v in values)
        child = self.children.get(key)
        if child is None:
            child = self.children[key] = self._new()
        return child

    def inc(self, amount: float = 1) -> None:
        self.children[()].inc(amount)

    def observe(self, amount: float) -> None:
        self.children[()].observe(amount)  # type: ignore[attr-defined]

    def samples(
        self, bound_text: Callable[[float], str]
    ) -> Iterator[tuple[str, dict[str, str], float]]:
        """(suffix, labels, value) of every sample; ``bound_text`` writes a bucket's
        ``le`` (``prometheus_client.utils.floatToGoString``)."""
        for key, child in list(self.children.items()):
            labels = dict(zip(self.labelnames, key, strict=True))
            if self.kind == "counter":
                yield "_total", labels, child.value
                yield "_created", labels, child.created
            elif self.kind == "gauge":
                yield "", labels, child.value
            else:
                acc = 0.0
                for bound, count in zip(self.bounds, child.buckets, strict=True):
                    acc += count
                    yield "_bucket", {**labels, "le": bound_text(bound)}, acc
                yield "_count", labels, acc
                yield "_sum", labels, child.sum
                yield "_created", labels, child.created


class _Counted:
    """The series of a :class:`Metrics`, as a collector of the Prometheus registry."""

    def __init__(self, series: list[_Series]) -> None:
        self.series = series

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import Metric
        from prometheus_client.metrics import _use_created
        from prometheus_client.utils import floatToGoString

        for s in self.series:
            metric = Metric(s.name, s.doc, s.kind)
            for suffix, labels, value in s.samples(floatToGoString):
                if suffix == "_created" and not _use_created:
                    continue
                metric.add_sample(s.name + suffix, labels, value)
            yield metric


class _AgentState:
    """Read at scrape time from the agent: what is true now."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

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
        trims = CounterMetricFamily(
            "agentik_memory_trims",
            "Times memory freed by conversations leaving memory was handed back to the "
            "system (glibc malloc_trim).",
        )
        trims.add_metric([], self.agent.memory_trims)
        yield trims


class Metrics:
    """The metrics of one bot (see the module docstring)."""

    def __init__(self, agent: Agent | None = None) -> None:
        self._registry: CollectorRegistry | None = None
        self._series: list[_Series] = []
        self.agent = agent
        info = self._gauge(
            "agentik_build_info", "The running agentik version (always 1).", ["version"]
        )  # fmt: skip
        info.labels(version=_version()).set(1)
        self.turns = self._counter(
            "agentik_turns", "Turns that ended, by stop reason (stop, length, interrupted, "
            "time_budget, error, aborted, tool_limit).", ["stop_reason"],
        )  # fmt: skip
        self.turn_seconds = self._histogram(
            "agentik_turn_duration_seconds", "Seconds from a turn's start to its end.",
            buckets=_TURN_BUCKETS,
        )  # fmt: skip
        self.requests = self._counter(
            "agentik_model_requests", "Requests to the model, by backend, model and outcome "
            "(ok, error, cancelled).", ["backend", "model", "outcome"],
        )  # fmt: skip
        self.request_seconds = self._histogram(
            "agentik_model_request_duration_seconds", "Seconds from sending a model request "
            "to the end of its response stream.", ["backend", "model"],
            buckets=_MODEL_BUCKETS,
        )  # fmt: skip
        self.first_token = self._histogram(
            "agentik_model_time_to_first_token_seconds", "Seconds from sending a model "
            "request to its first text, reasoning or tool call.", ["backend", "model"],
            buckets=_FIRST_TOKEN_BUCKETS,
        )  # fmt: skip
        self.tokens = self._counter(
            "agentik_model_tokens", "Tokens the model backend reported, by type "
            "(prompt, completion).", ["backend", "model", "type"],
        )  # fmt: skip
        self.tool_calls = self._counter(
            "agentik_tool_calls", "Tool calls that ended, by tool and outcome (ok, error).",
            ["tool", "outcome"],
        )  # fmt: skip
        self.tool_seconds = self._histogram(
            "agentik_tool_call_duration_seconds", "Seconds a tool call took, by tool.",
            ["tool"], buckets=_TOOL_BUCKETS,
        )  # fmt: skip
        self.approvals_requested = self._counter(
            "agentik_approvals_requested", "Tool calls that waited for a person's approval.",
            ["tool"],
        )  # fmt: skip
        self.approvals_resolved = self._counter(
            "agentik_approvals_resolved", "Approvals that ended, by decision (approved, "
            "denied, expired, cancelled).", ["decision"],
        )  # fmt: skip
        self.budget_refusals = self._counter(
            "agentik_budget_refusals", "Messages and tool calls refused by a usage budget, "
            "by scope (identity, unverified, channel) and kind (messages, tokens, tool_calls).",
            ["scope", "kind"],
        )  # fmt: skip
        self.compactions = self._counter(
            "agentik_compactions", "Working-memory compactions, by reason.", ["reason"]
        )  # fmt: skip
        self.errors = self._counter(
            "agentik_turn_errors", "Errors reported by turns, by error type.", ["type"]
        )  # fmt: skip
        self.received = self._counter(
            "agentik_messages_received", "Incoming chat messages handed to the bot, by "
            "transport instance.", ["transport"],
        )  # fmt: skip
        self.sent = self._counter(
            "agentik_messages_sent", "Outgoing messages sent, by transport instance and kind "
            "(answer, delta, end, notice, error, command).", ["transport", "kind"],
        )  # fmt: skip
        self.transport_states = self._gauge(
            "agentik_transport_state", "1 for each transport's current state, 0 for the others.",
            ["transport", "state"],
        )  # fmt: skip
        self.reconnects = self._counter(
            "agentik_transport_reconnects", "Times a transport was connected again after "
            "losing its connection.", ["transport"],
        )  # fmt: skip
        # Workers (issue 32): which process this is, and which connections it owns.
        # Every other series stays unlabelled by worker: each worker serves its own
        # /metrics, and Prometheus's `instance` label tells the scrape targets apart.
        self.worker_info = self._gauge(
            "agentik_worker_info", "This worker's id (always 1).", ["worker"]
        )  # fmt: skip
        self.connections_owned = self._gauge(
            "agentik_connection_owned", "1 when this worker owns the transport's connection "
            "(holds its lease), 0 when another does or none.", ["transport"],
        )  # fmt: skip
        # The turn queue (several workers: agentik.core.cluster.conversations), as this
        # worker last read it; 0 on a store one process keeps (nothing is queued there).
        self.turn_queue_depth = self._gauge(
            "agentik_turn_queue_depth", "Turns in the queue shared by the workers (claimed "
            "or not), as this worker last read it.",
        )  # fmt: skip
        self.conversation_leases = self._gauge(
            "agentik_conversation_leases", "Conversation leases this worker holds (the "
            "conversations whose turns it runs now).",
        )  # fmt: skip
        self._state: dict[str, str] = {}
        self._was_connected: set[str] = set()
        #: The subscription to the agent's events (counted as they are published).
        self._sub: Subscription | None = None
        #: Set whenever an event was counted (see :meth:`wait_until`).
        self._counted = asyncio.Event()
        #: Names of the agent's tools (refreshed when an unknown name shows up).
        self._tools: set[str] = set()
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    # -- the series, in the order they are exposed -------------------------------------
    def _add(self, kind: str, name: str, doc: str, labelnames: Any, buckets: Any) -> _Series:
        series = _Series(kind, name, doc, tuple(labelnames), tuple(buckets))
        self._series.append(series)
        return series

    def _counter(self, name: str, doc: str, labelnames: Any = ()) -> _Series:
        return self._add("counter", name, doc, labelnames, ())

    def _gauge(self, name: str, doc: str, labelnames: Any = ()) -> _Series:
        return self._add("gauge", name, doc, labelnames, ())

    def _histogram(self, name: str, doc: str, labelnames: Any = (), *, buckets: Any) -> _Series:
        return self._add("histogram", name, doc, labelnames, buckets)

    @property
    def registry(self) -> CollectorRegistry:
        """This bot's own ``prometheus_client`` registry (made, and the package imported,
        when first asked for): these counts, then the agent's state read when scraped."""
        if self._registry is None:
            from prometheus_client import CollectorRegistry

            registry = CollectorRegistry(auto_describe=True)
            registry.register(_Counted(self._series))
            if self.agent is not None:
                registry.register(_AgentState(self.agent))
            self._registry = registry
        return self._registry

    # -- feeding ----------------------------------------------------------------------
    def start(self) -> None:
        """Follow the agent's events and model requests (call once the loop runs)."""
        agent = self.agent
        if agent is None or self._sub is not None:
            return
        agent.request_observers.append(self.model_request)
        sub = self._sub = agent.events(kinds=_KINDS, max_pending=100_000)
        # Counted on the publisher's stack, as they happen: a task of its own woke
        # ~1.4 times an answer for a few dict lookups (issue 31).
        sub.notify = self._on_events

    async def aclose(self) -> None:
        """Stop following the agent."""
        if self.agent is not None:
            with contextlib.suppress(ValueError):
                self.agent.request_observers.remove(self.model_request)
        sub, self._sub = self._sub, None
        if sub is not None:
            sub.notify = None
            await sub.aclose()

    def _on_events(self, sub: Subscription) -> None:
        """Events are pending on ``sub``: count them (must not raise)."""
        while (event := sub.take()) is not None:
            try:
                self.event(event)
            except Exception:
                log.exception("metrics: could not count a %s event", event.kind)
        self._counted.set()

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

        Events are counted as they are published, model requests as they
        end, but what a caller saw happen may be counted a moment after it:
        tests (and anything else that needs the counts of what it just saw
        happen) wait with this.
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

    def worker(self, worker: str) -> None:
        """This process is worker ``worker`` (:mod:`agentik.bot.ownership`)."""
        self.worker_info.labels(worker=worker).set(1)

    def connection_owned(self, transport: str, owned: bool) -> None:
        """Whether this worker owns ``transport``'s connection now."""
        self.connections_owned.labels(transport=transport).set(1 if owned else 0)

    def turn_queue(self, depth: int, leases: int) -> None:
        """The shared turn queue's depth and the conversation leases held here."""
        self.turn_queue_depth.labels().set(depth)
        self.conversation_leases.labels().set(leases)

    # -- exposition -------------------------------------------------------------------
    def render(self) -> tuple[bytes, str]:
        """The Prometheus text exposition and its content type."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
