"""Budgets: how much each speaker and each channel may use.

Three limits, each set per role (``[budgets.user]``, ``[budgets.admin]``,
``[budgets.owner]``, named roles under ``[budgets.roles.<name>]``), for all
of a channel together (``[budgets.channel]``) and for a transport's
unverified speakers together (``[budgets.unverified]``):

* ``messages_per_minute`` — messages sent to the model, per fixed UTC minute;
* ``tokens_per_day`` — tokens the model used (prompt + completion, as the
  backend reports them; ``ceil(characters / 4)`` of the message and the
  answer when it reports none), per UTC day;
* ``tool_calls_per_day`` — tool calls run, per UTC day.

``0`` (the default) is unlimited, so a configuration without ``[budgets]``
changes nothing.  A role without its own table (and ``ignored``, and named
roles without one) takes the ``user`` limits, except ``admin`` and
``owner``, which are unlimited unless configured.

Concurrency: check-then-count is one atomic step of the store
(:meth:`~agentik.core.store.base.Store.budget_take`) over every counter of
the speaker (their identity or unverified bucket, and the channel), so
messages sent at once into many conversations, or to several workers sharing
one database, cannot slip past the speaker's shared limit.  A turn admitted
while others run *reserves* an estimate of its tokens (the larger of
``ceil(characters / 4)`` of its message and the mean tokens of the last turns
this process counted; ``[budgets] turn_tokens_estimate`` before any turn
ended), held in the store in the same atomic step (a counter of kind
:data:`HELD` whose window is the second it lapses, ``[budgets]
reservation_seconds`` on), and the check adds what every worker's running turns
hold to the counted tokens; the turn's end replaces its reservation with what it
used.  A turn running longer renews its reservation every third of
``reservation_seconds`` (the counter moves to a later lapse), so it counts as long
as the turn runs; a worker that died renews nothing and its reservations lapse.
A tool call is counted in the store when it is checked (so it counts for every
worker at once) and given back if it did not run (a denied or expired approval,
a plugin's block: when the turn ends), so the tool call budget counts the calls
that ran.

Who is counted: a verified speaker by their qualified identity
(``libera:alice``); a speaker the transport could not verify, all together
under their transport instance's *unverified* bucket (a nick can change; a
bucket cannot be escaped that way), limited by ``[budgets.unverified]`` or,
without that table, by their role's limits; and every message, token and
tool call also counts for the channel.

The counters live in the store (``budget_usage``, migration 7): one row per
(scope, subject, kind, window), so the check before a turn is two indexed
look-ups and survives restarts.  Windows are fixed UTC minutes and UTC days
(``00:00 UTC`` resets the daily limits).

:class:`Budgets` is transport-neutral; the bot's bridge calls
:meth:`Budgets.admit` before a turn, records tokens when the turn ends, and
registers :meth:`Budgets.hook` so a tool call past the daily limit is
refused (the model gets an error result saying so and can still answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from .hooks import Block
from .hookspecs import hookimpl
from .keyedlocks import KeyedLocks
from .settings import settings_dataclass

if TYPE_CHECKING:
    from .conversation import Conversation
    from .messages import ToolCall, Usage
    from .store.base import Store

__all__ = [
    "KINDS",
    "BudgetLimits",
    "BudgetSettings",
    "Budgets",
    "Refusal",
    "Subject",
    "UnverifiedLimits",
    "UsageKind",
    "UsageScope",
]

log = logging.getLogger(__name__)

UsageKind = Literal["messages", "tokens", "tool_calls"]
UsageScope = Literal["identity", "unverified", "channel"]
KINDS: tuple[UsageKind, ...] = ("messages", "tokens", "tool_calls")
#: What stops a turn before it starts (used-up tool calls only refuse each call).
_TURN_KINDS: tuple[UsageKind, ...] = ("messages", "tokens")

_MINUTE = 60
#: Seconds a turn's token reservation counts unless renewed (the default of
#: ``[budgets] reservation_seconds``): a worker that died keeps none for longer; a
#: running turn renews its reservation every third of it.
HOLD_SECONDS = 900.0
_DAY = 86_400
#: Daily counters older than this are pruned (kept a while for ``agentik access budgets``).
_KEEP_DAYS = 35


@settings_dataclass
class BudgetLimits:
    """One set of limits (``0``: unlimited)."""

    #: Messages sent to the model per fixed UTC minute.
    messages_per_minute: int = Field(0, ge=0)
    #: Model tokens (prompt + completion) per UTC day.
    tokens_per_day: int = Field(0, ge=0)
    #: Tool calls per UTC day.
    tool_calls_per_day: int = Field(0, ge=0)

    def limit(self, kind: UsageKind) -> int:
        if kind == "messages":
            return self.messages_per_minute
        if kind == "tokens":
            return self.tokens_per_day
        return self.tool_calls_per_day


_UNLIMITED = BudgetLimits()


@settings_dataclass
class UnverifiedLimits:
    """``[budgets.unverified]``: limits of a transport's unverified speakers together;
    a key left unset takes the speaker's role's limit (``0``: unlimited)."""

    #: Messages per fixed UTC minute, all unverified speakers of a transport together.
    messages_per_minute: int | None = Field(None, ge=0)
    #: Model tokens per UTC day, all unverified speakers of a transport together.
    tokens_per_day: int | None = Field(None, ge=0)
    #: Tool calls per UTC day, all unverified speakers of a transport together.
    tool_calls_per_day: int | None = Field(None, ge=0)

    def over(self, role: BudgetLimits) -> BudgetLimits:
        """These limits, with the unset ones taken from ``role``'s."""
        # (A pydantic dataclass: mypy does not see its fields as arguments.)
        return BudgetLimits(  # type: ignore[call-arg]
            messages_per_minute=_given(self.messages_per_minute, role.messages_per_minute),
            tokens_per_day=_given(self.tokens_per_day, role.tokens_per_day),
            tool_calls_per_day=_given(self.tool_calls_per_day, role.tool_calls_per_day),
        )

    @property
    def given(self) -> bool:
        return any(
            v for v in (self.messages_per_minute, self.tokens_per_day, self.tool_calls_per_day)
        )


def _given(value: int | None, default: int) -> int:
    return default if value is None else value


@settings_dataclass
class BudgetSettings:
    """``[budgets]``: limits per role, per channel and for unverified speakers."""

    #: Every speaker with the ``user`` role (the default role), and roles without their own table.
    user: BudgetLimits = field(default_factory=BudgetLimits)
    #: Speakers with the ``admin`` role (unlimited unless set).
    admin: BudgetLimits = field(default_factory=BudgetLimits)
    #: Speakers with the ``owner`` role (unlimited unless set).
    owner: BudgetLimits = field(default_factory=BudgetLimits)
    #: Named roles: ``[budgets.roles.<name>]``.
    roles: dict[str, BudgetLimits] = field(default_factory=dict)
    #: All speakers of one channel together.
    channel: BudgetLimits = field(default_factory=BudgetLimits)
    #: All unverified speakers of one transport instance together (unset keys: their role's).
    unverified: UnverifiedLimits = field(default_factory=UnverifiedLimits)
    #: Tokens a running turn is assumed to use (its reservation against ``tokens_per_day``)
    #: until turns have ended in this process; then the mean of the last ones is used.
    turn_tokens_estimate: int = Field(1000, ge=0)
    #: Seconds a turn's token reservation counts unless renewed: a running turn renews
    #: it every third of this; a worker that died (kill -9, a lost machine) renews
    #: nothing, and its turns' reservations stop counting this long after.
    reservation_seconds: float = Field(HOLD_SECONDS, ge=3.0)

    def for_role(self, role: str) -> BudgetLimits:
        if role == "owner":
            return self.owner
        if role == "admin":
            return self.admin
        return self.roles.get(role, self.user)

    @property
    def enabled(self) -> bool:
        tables = [self.user, self.admin, self.owner, self.channel, *self.roles.values()]
        return self.unverified.given or any(t != _UNLIMITED for t in tables)


@dataclass(frozen=True, slots=True)
class Subject:
    """Who a turn is counted for: the speaker (or the unverified bucket) and the channel."""

    #: The transport instance (``libera``).
    transport: str
    #: The channel key.
    channel: str
    #: The verified qualified identity (``libera:alice``); ``None``: unverified.
    identity: str | None = None
    #: The speaker's role (``user`` unless an access policy says otherwise).
    role: str = "user"
    #: The speaker's display name (for notices).
    name: str = ""
    #: ``False``: only the channel is counted (a run nobody is known to have started).
    speaker: bool = True

    @property
    def person(self) -> tuple[UsageScope, str]:
        """The speaker's counter: their identity, or their transport's unverified bucket."""
        if self.identity is not None:
            return "identity", self.identity
        return "unverified", self.transport


@dataclass(frozen=True, slots=True)
class Refusal:
    """A limit that is used up."""

    scope: UsageScope
    kind: UsageKind
    limit: int
    #: When the window ends (Unix time).
    resets_at: float
    #: What is used up, one line.
    text: str
    #: The first refusal of this counter in this window (chat shows only that one).
    first: bool
    #: Tokens reserved by running turns that made up the difference (0: used up for
    #: good until ``resets_at``; otherwise it may pass once those turns end).
    reserved: int = 0

    @property
    def notice(self) -> str | None:
        """The line to show in a chat, or ``None`` when this window's notice was given."""
        return self.text if self.first else None


#: The counter kind of the tokens reserved by running turns (migration 25).
HELD = "tokens_held"


class _Hold:
    """One turn's token reservation: its tokens and the window of its held counter
    (the second it lapses); :meth:`Budgets._renew` moves the window on."""

    __slots__ = ("amount", "until")

    def __init__(self, amount: int, until: int) -> None:
        self.amount = amount
        self.until = until


def window(kind: UsageKind, now: float) -> int:
    """The start (Unix seconds) of the fixed UTC window ``now`` falls in for ``kind``."""
    size = _MINUTE if kind == "messages" else _DAY
    return int(now // size) * size


def _window_end(kind: UsageKind, now: float) -> float:
    return window(kind, now) + (_MINUTE if kind == "messages" else _DAY)


def _hhmm(t: float) -> str:
    return time.strftime("%H:%M", time.gmtime(t))


_WHAT = {
    "messages": "message budget used up ({n} a minute)",
    "tokens": "daily token budget used up ({n})",
    "tool_calls": "daily tool call budget used up ({n})",
}


class Budgets:
    """Counts usage in ``store`` and checks it against ``settings``.

    ``clock`` gives the time (Unix seconds; tests pass one they control).
    """

    def __init__(
        self,
        settings: BudgetSettings,
        store: Store,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.store = store
        self.clock = clock
        #: Notices given, by (scope, subject, kind, window): one per window.
        self._noticed: set[tuple[str, str, str, int]] = set()
        #: Check-then-count is atomic per counter (see :meth:`_counting`).
        self._locks = KeyedLocks()
        #: Who each run is counted for (set by whoever sent its message).
        self._runs: dict[str, Subject] = {}
        self._chars: dict[str, int] = {}
        #: Tokens reserved by turns admitted and not ended, by counter.
        self._reserved: dict[tuple[str, str], int] = {}
        #: Reservations admitted but not yet bound to a run, by subject: (tokens, the
        #: window of their held counter).
        self._unbound: dict[Subject, list[_Hold]] = {}
        #: Each bound run's reservation.
        self._run_reserved: dict[str, tuple[Subject, _Hold]] = {}
        #: Renews the reservations of running turns (while there are any).
        self._renewer: asyncio.Task[None] | None = None
        #: Reservations being given back in the store.
        self._unholding: set[asyncio.Task[None]] = set()
        #: Tool calls counted when checked (in the store: every worker sees them) and
        #: not run yet, by run: call id -> (who pays, the window they were counted in).
        self._run_held: dict[str, dict[str, tuple[Subject, int]]] = {}
        #: Tokens of the last turns counted (the reservation estimate).
        self._recent: list[int] = []
        self._sending = KeyedLocks()
        self._pruned = 0.0
        self._watcher: asyncio.Task[None] | None = None
        #: Called with ``(scope, kind)`` on every refusal (metrics count them).
        self.on_refusal: Callable[[str, str], None] | None = None

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    # -- limits ------------------------------------------------------------------------
    def limits(self, subject: Subject) -> list[tuple[UsageScope, str, BudgetLimits]]:
        """The counters ``subject`` is checked against, with their limits."""
        channel: tuple[UsageScope, str, BudgetLimits] = (
            "channel",
            subject.channel,
            self.settings.channel,
        )
        if not subject.speaker:
            return [channel]
        scope, key = subject.person
        person = self.settings.for_role(subject.role)
        if scope == "unverified":
            person = self.settings.unverified.over(person)
        return [(scope, key, person), channel]

    async def used(
        self, subject: Subject, *, now: float | None = None
    ) -> dict[tuple[UsageScope, UsageKind], int]:
        """This window's usage of the speaker's and the channel's counters."""
        now = self.clock() if now is None else now
        windows: dict[str, int] = {k: window(k, now) for k in KINDS}
        keys = [(scope, key) for scope, key, _ in self.limits(subject)]
        rows = await self.store.budget_usage(keys, windows)
        out: dict[tuple[UsageScope, UsageKind], int] = {}
        for scope, _key, _lim in self.limits(subject):
            for kind in KINDS:
                out[(scope, kind)] = rows.get((scope, _key, kind), 0)
        return out

    def _notice(self, subject: Subject, scope: UsageScope, key: str, kind: UsageKind,
                limit: int, now: float, reserved: int = 0) -> Refusal:  # fmt: skip
        resets = _window_end(kind, now)
        mark = (scope, key, kind, window(kind, now))
        what = _WHAT[kind].format(n=f"{limit:,}")
        if reserved:
            # Used up only with what running turns are expected to use: say so.
            what = what[:-1] + f", counting {reserved:,} reserved by turns still running)"
        if scope == "channel":
            text = f"this channel's {what}"
        elif scope == "unverified":
            who = subject.name or "unverified speakers"
            text = f"{who}: {what} for unverified speakers on {subject.transport}"
        else:
            text = f"{subject.name or subject.identity}: {what}"
        text += f"; resets at {_hhmm(resets)} UTC"
        first = mark not in self._noticed
        if first and len(self._noticed) >= 10_000:
            # Forget the notices of windows that have ended.
            self._noticed = {m for m in self._noticed if m[3] >= window(m[2], now)}  # type: ignore[arg-type]
        self._noticed.add(mark)
        return Refusal(scope=scope, kind=kind, limit=limit, resets_at=resets, text=text,
                       first=first, reserved=reserved)  # fmt: skip

    async def admit(self, subject: Subject, *, chars: int = 0) -> Refusal | None:
        """Whether a message may start a turn; counts it if so.

        Refused when the speaker's or the channel's messages of this minute
        or tokens of this day (with the reservations of turns still running)
        are used up.  (Used-up tool calls do not stop a turn: each call is
        refused, and the model can still answer.)  Admitted, the turn
        reserves :meth:`estimate` tokens (``chars``: its message's length):
        :meth:`bind` hands the reservation to its run, whose end settles it;
        a message that starts no turn gives it back with :meth:`release`.
        """
        if not self.enabled:
            return None
        async with self._counting(subject):
            now = self.clock()
            # One atomic check-and-add in the store: workers sharing the database
            # cannot each pass the check at the edge of a limit.
            checks: list[tuple[str, str, str, int, int]] = []
            meta: list[tuple[UsageScope, str, UsageKind, int]] = []
            for scope, key, limits in self.limits(subject):
                for kind in _TURN_KINDS:
                    limit = limits.limit(kind)
                    if not limit:
                        continue
                    checks.append((scope, key, kind, window(kind, now), limit))
                    meta.append((scope, key, kind, limit))
            at = window("messages", now)
            rows = [(scope, key, "messages", at, 1) for scope, key, _ in self.limits(subject)]
            # The turn's estimate is held in the store with the count (every worker's
            # check counts it) until its end settles it, or it lapses (a worker died).
            amount, until = self.estimate(chars), self._held_until(now)
            rows += [(scope, key, HELD, until, amount) for scope, key, _ in self.limits(subject)]
            failed = await self.store.budget_take(checks, rows, held=("tokens", HELD, int(now)))
            if failed is not None:
                index, n = failed
                scope, key, kind, limit = meta[index]
                reserved = 0
                if kind == "tokens":
                    used = await self.store.budget_usage(
                        [(scope, key)], {"tokens": window("tokens", now)}
                    )
                    counted = used.get((scope, key, "tokens"), 0)
                    reserved = n - counted if counted < limit else 0  # else: used up anyway
                if self.on_refusal is not None:
                    self.on_refusal(scope, kind)
                return self._notice(subject, scope, key, kind, limit, now, reserved)
            await self._prune(now)
            self._reserve(subject, amount, until)
        return None

    @contextlib.asynccontextmanager
    async def _counting(self, subject: Subject) -> AsyncIterator[None]:
        """Hold the locks of every counter of ``subject`` (in one order: no deadlock)."""
        keys = sorted({f"{scope}\0{key}" for scope, key, _ in self.limits(subject)})
        async with contextlib.AsyncExitStack() as stack:
            for key in keys:
                await stack.enter_async_context(self._locks(key))
            yield

    def estimate(self, chars: int = 0) -> int:
        """The tokens a new turn reserves: the mean of the last turns counted (before
        any, ``turn_tokens_estimate``), at least ``ceil(chars / 4)`` of its message."""
        if self._recent:
            mean = -(-sum(self._recent) // len(self._recent))
        else:
            mean = self.settings.turn_tokens_estimate
        return max(mean, -(-chars // 4))

    def _held_until(self, now: float) -> int:
        """The window of a reservation made (or renewed) at ``now``: the second it lapses."""
        return int(now + self.settings.reservation_seconds)

    def _reserve(self, subject: Subject, amount: int, until: int) -> None:
        for scope, key, _ in self.limits(subject):
            self._reserved[(scope, key)] = self._reserved.get((scope, key), 0) + amount
        self._unbound.setdefault(subject, []).append(_Hold(amount, until))
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(
                self._renewing(), name="agentik-budget-reservations"
            )

    def _holds(self) -> list[tuple[Subject, _Hold]]:
        """Every reservation of a turn admitted here and not ended."""
        out = [(subject, hold) for subject, hold in self._run_reserved.values()]
        out += [(subject, hold) for subject, holds in self._unbound.items() for hold in holds]
        return out

    async def _renewing(self) -> None:
        """Renew the reservations every third of ``reservation_seconds`` while turns hold
        any (a turn longer than that keeps its reservation counted to its end)."""
        while self._holds():
            await asyncio.sleep(self.settings.reservation_seconds / 3)
            try:
                await self._renew()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the next round tries again, before the lapse
                log.warning("could not renew the token reservations of running turns: %s", exc)

    async def _renew(self, *, now: float | None = None) -> int:
        """Move every live reservation's held counter to the lapse ``now`` gives (one
        write); how many were renewed."""
        now = self.clock() if now is None else now
        until = self._held_until(now)
        rows: list[tuple[str, str, str, int, int]] = []
        moved: list[tuple[_Hold, int]] = []
        for subject, hold in self._holds():
            if hold.until >= until:
                continue
            for scope, key, _ in self.limits(subject):
                rows += [(scope, key, HELD, hold.until, -hold.amount),
                         (scope, key, HELD, until, hold.amount)]  # fmt: skip
            # Moved here first: a turn ending while the write is under way gives its
            # reservation back from the new window (the two writes add up either way).
            moved.append((hold, hold.until))
            hold.until = until
        if not rows:
            return 0
        try:
            await self.store.budget_add(rows)
        except BaseException:
            for hold, before in moved:
                if hold.until == until:
                    hold.until = before
            raise
        return len(moved)

    def _unreserve(self, subject: Subject, held: _Hold) -> None:
        """Give a reservation back: here, and (a task: the callers are not all
        coroutines) in the store."""
        amount, until = held.amount, held.until
        for scope, key, _ in self.limits(subject):
            left = self._reserved.get((scope, key), 0) - amount
            if left > 0:
                self._reserved[(scope, key)] = left
            else:
                self._reserved.pop((scope, key), None)
        rows = [(scope, key, HELD, until, -amount) for scope, key, _ in self.limits(subject)]
        task = asyncio.get_running_loop().create_task(self._unhold(rows))
        self._unholding.add(task)
        task.add_done_callback(self._unholding.discard)

    async def _unhold(self, rows: Sequence[tuple[str, str, str, int, int]]) -> None:
        try:
            await self.store.budget_add(rows)
        except Exception as exc:  # it lapses by itself (reservation_seconds)
            log.warning("could not give back a token reservation: %s", exc)

    def reserved(self, scope: UsageScope, key: str) -> int:
        """Tokens reserved now by running turns of counter ``(scope, key)``."""
        return self._reserved.get((scope, key), 0)

    def release(self, subject: Subject) -> None:
        """Give back the reservation of a message :meth:`admit` took that started no
        turn of its own (it joined a running turn, or sending it failed)."""
        amounts = self._unbound.get(subject)
        if amounts:
            self._unreserve(subject, amounts.pop())
            if not amounts:
                del self._unbound[subject]

    async def record(
        self, subject: Subject, kind: UsageKind, amount: int, *, now: float | None = None
    ) -> None:
        """Add ``amount`` of ``kind`` to the speaker's and the channel's counters."""
        if amount <= 0 or not self.enabled:
            return
        now = self.clock() if now is None else now
        at = window(kind, now)
        rows = [(scope, key, kind, at, amount) for scope, key, _ in self.limits(subject)]
        await self.store.budget_add(rows)
        await self._prune(now)

    async def _prune(self, now: float) -> None:
        """Drop ended windows' counters, at most once an hour."""
        if now - self._pruned >= 3600:
            self._pruned = now
            try:
                await self.store.budget_prune(
                    {"messages": window("messages", now - 3600),
                     HELD: window("messages", now - 3600),
                     "tokens": window("tokens", now - _KEEP_DAYS * _DAY),
                     "tool_calls": window("tool_calls", now - _KEEP_DAYS * _DAY)}
                )  # fmt: skip
            except Exception:
                log.exception("could not prune old budget counters")

    async def report(self, subject: Subject) -> str:
        """What is left for the speaker and the channel, one line (``!budget``)."""
        used = await self.used(subject)
        parts = []
        for scope, _key, limits in self.limits(subject):
            if scope == "channel":
                who = "this channel"
            elif scope == "unverified":
                who = f"{subject.name or 'you'} (unverified, shared on {subject.transport})"
            else:
                who = subject.name or subject.identity or "you"
            items = []
            for kind, label in (("tokens", "tokens today"), ("tool_calls", "tool calls today"),
                                ("messages", "messages this minute")):  # fmt: skip
                limit = limits.limit(kind)  # type: ignore[arg-type]
                n = used[(scope, kind)]  # type: ignore[index]
                if limit:
                    items.append(f"{max(0, limit - n):,} of {limit:,} {label} left")
                else:
                    items.append(f"{n:,} {label} (no limit)")
            parts.append(f"{who}: " + ", ".join(items))
        now = self.clock()
        return "; ".join(parts) + f" (days reset at 00:00 UTC, now {_hhmm(now)} UTC)"

    # -- runs and tool calls ------------------------------------------------------------
    def sending(self, conversation_id: str) -> asyncio.Lock:
        """Hold while sending a message and :meth:`bind`-ing its run, so a tool call
        of that run (checked by :meth:`hook`) waits to know who it is counted for."""
        return self._sending(conversation_id)

    def bind(self, run_id: str, subject: Subject, *, chars: int = 0) -> None:
        """Count run ``run_id`` (its tokens and tool calls) for ``subject``;
        ``chars``: the message's length, for the estimate when the model reports no usage."""
        self._runs[run_id] = subject
        self._chars[run_id] = chars
        amounts = self._unbound.get(subject)
        if amounts:
            self._run_reserved[run_id] = (subject, amounts.pop())
            if not amounts:
                del self._unbound[subject]
        while len(self._runs) > 10_000:
            old = next(iter(self._runs))
            del self._runs[old]
            self._chars.pop(old, None)
            # A run whose end never came: its held calls stay counted (they may have run).
            self._settle(old)

    async def turn_ended(
        self, run_id: str, usage: Usage, text: str = "", *, channel: str | None = None
    ) -> int:
        """Count the tokens of run ``run_id`` (then forget the run); how many were counted.

        The backend's reported usage (prompt + completion tokens over every
        model request of the turn); when it reported none, ``ceil(characters
        / 4)`` of the message and the answer.  A run nobody bound (a message
        resumed after a restart) counts for ``channel`` only, if given.
        """
        subject = self._runs.pop(run_id, None)
        chars = self._chars.pop(run_id, 0)
        if subject is None:
            await self._give_back(self._settle(run_id))
            if channel is None or not self.enabled:
                return 0
            subject = Subject(transport="", channel=channel, speaker=False)
        tokens = usage.total_tokens or (usage.prompt_tokens + usage.completion_tokens)
        if not tokens:
            tokens = -(-(chars + len(text)) // 4)
        self._recent = [*self._recent[-19:], tokens]
        async with self._counting(subject):
            try:
                await self.record(subject, "tokens", tokens)
            finally:
                # Counted: the reservation (and calls held but never run) go.
                await self._give_back(self._settle(run_id))
        return tokens

    def _settle(self, run_id: str) -> list[tuple[Subject, int]]:
        """Forget run ``run_id``'s token reservation; its tool calls held and not run
        (to :meth:`_give_back`)."""
        reserved = self._run_reserved.pop(run_id, None)
        if reserved is not None:
            self._unreserve(*reserved)
        return list(self._run_held.pop(run_id, {}).values())

    async def _give_back(self, held: list[tuple[Subject, int]]) -> None:
        """Uncount tool calls counted when checked that never ran."""
        rows = [
            (scope, key, "tool_calls", at, -1)
            for subject, at in held
            for scope, key, _ in self.limits(subject)
        ]
        if not rows:
            return
        try:
            await self.store.budget_add(rows)
        except Exception:
            log.exception("could not give back %d tool calls that did not run", len(held))

    async def subject_of(self, conversation: Conversation, run_id: str) -> Subject | None:
        subject = self._runs.get(run_id)
        if subject is None:
            lock = self._sending(conversation.id)
            if lock.locked():
                async with lock:
                    pass
                subject = self._runs.get(run_id)
        return subject

    async def tool_call(
        self, conversation: Conversation, run_id: str, name: str, call_id: str | None = None
    ) -> str | None:
        """Check one tool call of ``run_id``; the refusal reason when over the daily limit.

        The check and the count are one atomic step of the store, so workers
        sharing a database hold the limit between them.  Without ``call_id``
        the call is counted for good; with it, it is *held*: counted now (it
        counts against the limit for every other call, on any worker) and
        given back at the run's end unless :meth:`tool_call_ran` said it ran.
        """
        if not self.enabled:
            return None
        subject = await self.subject_of(conversation, run_id)
        if subject is None:
            # Not sent through the bridge (resumed after a restart): the channel pays.
            key = conversation.channel_key or f"conversation:{conversation.id}"
            subject = Subject(transport="", channel=key, speaker=False)
        async with self._counting(subject):
            now = self.clock()
            at = window("tool_calls", now)
            checks: list[tuple[str, str, str, int, int]] = []
            meta: list[tuple[UsageScope, int]] = []
            for scope, key, limits in self.limits(subject):
                limit = limits.tool_calls_per_day
                if limit:
                    checks.append((scope, key, "tool_calls", at, limit))
                    meta.append((scope, limit))
            rows = [(scope, key, "tool_calls", at, 1) for scope, key, _ in self.limits(subject)]
            failed = await self.store.budget_take(checks, rows)
            if failed is not None:
                scope, limit = meta[failed[0]]
                if self.on_refusal is not None:
                    self.on_refusal(scope, "tool_calls")
                who = {"channel": "this channel's", "unverified": "the unverified speakers'"}
                whose = who.get(scope, "your")
                return (
                    f"{whose} daily tool call budget is used up ({limit:,}); it resets at "
                    f"00:00 UTC. Answer without tools ({name} was not run)."
                )
            if call_id is not None:
                # Held: given back at the turn's end unless it has run.
                self._run_held.setdefault(run_id, {})[call_id] = (subject, at)
            await self._prune(now)
        return None

    async def tool_call_ran(self, run_id: str, call_id: str) -> None:
        """Tool call ``call_id`` of ``run_id``, held by :meth:`tool_call`, ran: it stays
        counted."""
        held = self._run_held.get(run_id)
        if held is not None and held.pop(call_id, None) is not None and not held:
            del self._run_held[run_id]

    # -- turns not rendered by the bridge (the HTTP API) ---------------------------------
    def watch(self, agent: Any) -> None:
        """Count the tokens of bound runs from ``agent``'s events (once; idempotent).

        For turns whose end no renderer reports (the HTTP API's); a run is
        counted once whichever reports its end first.
        """
        if self._watcher is not None and not self._watcher.done():
            return
        sub = agent.events(kinds=["turn_ended"], max_pending=100_000)
        self._watcher = asyncio.create_task(self._watch(sub), name="agentik-budgets")

    async def _watch(self, sub: Any) -> None:
        try:
            async for event in sub:
                run_id = event.run_id
                if event.kind == "turn_ended" and (
                    run_id in self._runs or run_id in self._run_held
                ):
                    try:
                        await self.turn_ended(event.run_id, event.usage, event.text)
                    except Exception:
                        log.exception("could not count the tokens of run %s", event.run_id)
        finally:
            await sub.aclose()

    async def aclose(self) -> None:
        """Stop watching events (the reservations being given back are written) and
        renewing reservations."""
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
            self._renewer = None
        if self._unholding:
            await asyncio.gather(*self._unholding, return_exceptions=True)
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None

    @property
    def hook(self) -> object:
        """A plugin object whose ``before_tool_call`` applies the tool call budgets."""
        return _ToolCallHook(self)


class _ToolCallHook:
    """The ``before_tool_call`` hook of :class:`Budgets` (register once per agent)."""

    def __init__(self, budgets: Budgets) -> None:
        self.budgets = budgets

    @hookimpl(tryfirst=True)
    async def before_tool_call(
        self, conversation: Conversation, run_id: str, call: ToolCall
    ) -> Any:
        reason = await self.budgets.tool_call(conversation, run_id, call.name, call.id)
        return Block(reason) if reason else None

    @hookimpl(trylast=True)
    async def after_tool_call(
        self, conversation: Conversation, run_id: str, call: ToolCall, result: Any
    ) -> None:
        # Only calls that ran get here (not denied or expired approvals, nor blocks).
        await self.budgets.tool_call_ran(run_id, call.id)
