"""Signed outbound webhooks for run events (issue 35): ``[[webhooks]]``.

Each configured receiver gets the agent's events it asked for (a stream profile
and a list of event kinds) as HTTP ``POST`` requests of JSON, signed as Slack
signs its requests: HMAC-SHA256 with the webhook's secret over
``v0:{timestamp}:{body}``, sent as ``X-Agentik-Signature: v0=<hex>`` beside
``X-Agentik-Request-Timestamp``.  A receiver checks both (:func:`verify`, or the
recipe in ``docs/webhooks.md``) and refuses a request whose timestamp is too old: a
captured request replayed later is refused.

**Delivery is an outbox.**  An event first becomes a row of the store
(:class:`~agentik.core.store.records.WebhookDelivery`, through the store's
:class:`~agentik.core.store.repositories.WebhookRepository`); a sender claims due
rows under a lease (on PostgreSQL ``FOR UPDATE SKIP LOCKED``: on several workers
each row is sent by one at a time), POSTs them, and records the outcome: delivered
on a 2xx answer; otherwise retried with exponential backoff until
``max_attempts``, then kept as a dead letter (``agentik webhooks dead-letters``,
``agentik webhooks replay``).  Rows outlive a restart, so delivery is at least once:
a request may arrive twice (a process killed between the receiver's answer and
the record of it), always under the same ``X-Agentik-Delivery`` id, which the
receiver dedupes on.

The secret is read from the environment (``secret_env``) or a file
(``secret_file``) when the bot starts; it is never stored, logged, or part of an
error.  Errors kept with a delivery name a status or an exception type, never the
URL (it may carry a token).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import os
import random
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentik.core.errors import ConfigError
from agentik.core.events import Event, event_to_dict
from agentik.core.settings import Blank, PathSetting
from agentik.core.store.records import WebhookDelivery, WebhookOutcome
from agentik.core.streamprofiles import StreamProfile, known_kinds

if TYPE_CHECKING:
    import aiohttp

    from agentik.core.agent import Agent
    from agentik.core.store.base import Store

__all__ = [
    "DELIVERY_HEADER",
    "EVENT_HEADER",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "WebhookSettings",
    "Webhooks",
    "sign",
    "verify",
]

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Agentik-Signature"
TIMESTAMP_HEADER = "X-Agentik-Request-Timestamp"
#: The delivery id: the same on every attempt and replay of one delivery.
DELIVERY_HEADER = "X-Agentik-Delivery"
EVENT_HEADER = "X-Agentik-Event"
#: How long delivered rows are kept (dead letters stay until replayed).
KEEP_DELIVERED = 7 * 86400.0

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"


class WebhookSettings(BaseModel):
    """One ``[[webhooks]]`` table: a receiver of run events, POSTed as signed JSON."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The webhook's name (in dead letters and logs; letters, digits, ``_`` and ``-``).
    name: str = Field(pattern=_NAME)
    #: Where deliveries are POSTed (``http://`` or ``https://``).
    url: str
    #: The event kinds sent (``turn_ended``, ``tool_call_ended``, …); ``["*"]``: every
    #: kind the profile carries.
    events: list[str] = Field(
        default_factory=lambda: ["turn_ended", "interrupted", "error"], min_length=1
    )
    #: The stream profile events pass first (``chat``, ``debug``, ``metrics`` or a
    #: ``[profiles.<name>]``): which child-run events and usage numbers are sent.
    profile: str = "debug"
    #: The environment variable holding the signing secret.
    secret_env: Blank = None
    #: A file holding the signing secret (its first line; relative to the configuration
    #: file).
    secret_file: PathSetting = None
    #: Seconds an attempt may take (connecting, sending, the answer).
    timeout: float = Field(10.0, gt=0, le=300)
    #: Attempts before a delivery becomes a dead letter.
    max_attempts: int = Field(8, ge=1, le=100)
    #: Seconds before the first retry; each next one waits twice as long (±10 %).
    backoff: float = Field(2.0, gt=0, le=3600)
    #: The longest wait between two attempts, in seconds.
    backoff_max: float = Field(600.0, gt=0, le=86400)
    #: Send this webhook's deliveries (false: events are not recorded for it).
    enabled: bool = True

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host")
        return url

    @field_validator("events")
    @classmethod
    def _known_kinds(cls, events: list[str]) -> list[str]:
        if events == ["*"]:
            return events
        unknown = sorted(set(events) - known_kinds())
        if unknown:
            raise ValueError(
                f"unknown event kind(s) {', '.join(unknown)}"
                f' (known: {", ".join(sorted(known_kinds()))}; or ["*"])'
            )
        return events

    @model_validator(mode="after")
    def _one_secret(self) -> WebhookSettings:
        if (self.secret_env is None) == (self.secret_file is None):
            raise ValueError("give exactly one of secret_env and secret_file (the signing secret)")
        return self


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    """The ``X-Agentik-Signature`` value of ``body`` sent at ``timestamp``."""
    base = b"v0:" + str(timestamp).encode() + b":" + body
    return "v0=" + hmac.new(secret, base, hashlib.sha256).hexdigest()


def verify(
    secret: bytes,
    headers: Mapping[str, str],
    body: bytes,
    *,
    tolerance: float = 300.0,
    now: float | None = None,
) -> bool:
    """Whether ``body`` with ``headers`` was signed with ``secret`` less than
    ``tolerance`` seconds ago (the recipe of ``docs/webhooks.md``).  ``headers``
    should look names up case-insensitively (aiohttp's, starlette's, ``email.message``
    do)."""
    try:
        timestamp = int(headers[TIMESTAMP_HEADER])
        given = headers[SIGNATURE_HEADER]
    except (KeyError, ValueError):
        return False
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance:
        return False
    return hmac.compare_digest(given, sign(secret, timestamp, body))


def read_secret(hook: WebhookSettings, *, where: str, resolve: Any = None) -> bytes:
    """``hook``'s signing secret, from its environment variable or file; a
    :class:`ConfigError` naming the key (never the value) if there is none."""
    if hook.secret_env is not None:
        value = os.environ.get(hook.secret_env, "")
        if not value:
            raise ConfigError(
                f"{where}.secret_env: the environment variable {hook.secret_env} is not set"
                " (it holds the webhook's signing secret)"
            )
        return value.encode()
    path = hook.secret_file or ""
    if resolve is not None:
        path = resolve(path)
    try:
        with open(path, encoding="utf-8") as f:
            value = f.readline().strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise ConfigError(f"{where}.secret_file: {path}: cannot read it ({why})") from None
    if not value:
        raise ConfigError(f"{where}.secret_file: {path}: the file's first line is empty")
    return value.encode()


@dataclass(frozen=True, slots=True)
class _Hook:
    settings: WebhookSettings
    secret: bytes
    profile: StreamProfile
    kinds: frozenset[str] | None

    def wants(self, event: Event) -> Event | None:
        if self.kinds is not None and event.kind not in self.kinds:
            return None
        return self.profile.admit(event)


def _describe(exc: BaseException) -> str:
    """What went wrong in an attempt, without the URL (it may carry a token)."""
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return "timed out"
    err = getattr(exc, "os_error", exc)
    if isinstance(err, OSError) and err.errno:
        return f"{type(exc).__name__}: {os.strerror(err.errno)}"
    return type(exc).__name__


class Webhooks:
    """The webhook outbox of one bot process: records events as deliveries and sends
    the due ones.  ``start()`` once the agent runs; ``aclose()`` before it closes."""

    def __init__(
        self,
        agent: Agent,
        settings: Sequence[WebhookSettings],
        *,
        worker: str | None = None,
        resolve: Any = None,
        poll: float = 5.0,
        batch: int = 50,
        concurrency: int = 8,
    ) -> None:
        self.agent = agent
        self.store: Store = agent.store
        #: This process's name in claims (another worker's lease is left alone).
        self.worker = worker or f"webhooks:{uuid.uuid4().hex[:12]}"
        self.poll = poll
        self.batch = batch
        self._limit = asyncio.Semaphore(concurrency)
        self.hooks: dict[str, _Hook] = {}
        for i, s in enumerate(settings):
            if s.name in self.hooks:
                raise ConfigError(f"webhooks[{i}].name: {s.name!r} is used twice")
            where = f"webhooks[{i}]"
            try:
                profile = agent.stream_profiles[s.profile]
            except KeyError:
                raise ConfigError(
                    f"{where}.profile: no profile {s.profile!r}"
                    f" (known: {', '.join(sorted(agent.stream_profiles))})"
                ) from None
            secret = read_secret(s, where=where, resolve=resolve)
            kinds = None if s.events == ["*"] else frozenset(s.events)
            self.hooks[s.name] = _Hook(s, secret, profile, kinds)
        self._wake = asyncio.Event()
        #: Deliveries made from events, not yet written: the recorder writes all that
        #: gathered while its last write ran in one ``webhook_enqueue``.
        self._unwritten: list[WebhookDelivery] = []
        self._written = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        self._sending: set[asyncio.Task[WebhookOutcome]] = set()
        #: Set by ``aclose``: the loops end at their next turn even if a cancel was lost.
        self._closing = False

    @property
    def active(self) -> bool:
        """Whether any webhook is configured (and enabled)."""
        return any(h.settings.enabled for h in self.hooks.values())

    # -- lifecycle ------------------------------------------------------------------
    async def start(self) -> None:
        """Follow the agent's events and send deliveries (pending ones from an earlier
        run included)."""
        if self._tasks or not self.hooks:
            return
        self._closing = False
        if "webhooks" not in self.store.capabilities:
            raise ConfigError(
                f"webhooks: the store ({type(self.store).__name__}) keeps no webhook deliveries"
            )
        import aiohttp

        self._session = aiohttp.ClientSession(headers={"User-Agent": "agentik-webhooks"})
        with contextlib.suppress(Exception):
            await self.store.webhook_prune(time.time() - KEEP_DELIVERED)
        loop = asyncio.get_running_loop()
        enabled = [h for h in self.hooks.values() if h.settings.enabled]
        if enabled:
            kinds: set[str] | None = set()
            for h in enabled:
                if h.kinds is None or kinds is None:
                    kinds = None
                else:
                    kinds |= h.kinds
            sub = self.agent.events(profile="debug", kinds=kinds, max_pending=100_000)
            self._tasks.append(loop.create_task(self._follow(sub), name="agentik-webhooks:events"))
            self._tasks.append(loop.create_task(self._record(), name="agentik-webhooks:record"))
        self._tasks.append(loop.create_task(self._send_loop(), name="agentik-webhooks:send"))

    async def aclose(self) -> None:
        """Stop following and sending.  Events already taken are recorded; attempts
        under way are cut, what finished is recorded, and the claims this worker still
        holds are released, so another worker (or the next start) sends them at once
        rather than after the lease: at least once."""
        self._closing = True
        tasks, self._tasks = self._tasks, []
        for task in [*tasks, *self._sending]:
            task.cancel()
        await asyncio.gather(*tasks, *self._sending, return_exceptions=True)
        self._sending.clear()
        if tasks:
            try:
                await self._write_unwritten()
                released = await self.store.webhook_release(self.worker)
            except Exception:
                log.exception("webhooks: could not hand back this worker's claims at stop")
            else:
                if released:
                    log.info("webhooks: handed back %d claimed delivery(ies) at stop", released)
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> Webhooks:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- recording --------------------------------------------------------------------
    def deliveries_for(self, event: Event) -> list[WebhookDelivery]:
        """The deliveries ``event`` makes: one per webhook that wants it."""
        rows: list[WebhookDelivery] = []
        now = time.time()
        for name, hook in self.hooks.items():
            if not hook.settings.enabled:
                continue
            seen = hook.wants(event)
            if seen is None:
                continue
            delivery_id = uuid.uuid4().hex
            body = json.dumps(
                {"delivery_id": delivery_id, "webhook": name, "created_at": now,
                 "event": event_to_dict(seen)},
                ensure_ascii=False, separators=(",", ":"),
            )  # fmt: skip
            rows.append(
                WebhookDelivery(
                    id=delivery_id,
                    webhook=name,
                    event_kind=seen.kind,
                    conversation_id=seen.conversation_id,
                    body=body,
                    created_at=now,
                    next_at=now,
                )
            )
        return rows

    async def _follow(self, sub: Any) -> None:
        try:
            async for event in sub:
                rows = self.deliveries_for(event)
                if rows:
                    self._unwritten.extend(rows)
                    self._written.set()
        finally:
            await sub.aclose()

    async def _record(self) -> None:
        """Write what the events made, in one write for all that gathered meanwhile (a
        busy bot's turns share a write instead of paying one each)."""
        while not self._closing:
            await self._written.wait()
            self._written.clear()
            await self._write_unwritten()

    async def _write_unwritten(self) -> None:
        rows, self._unwritten = self._unwritten, []
        if not rows:
            return
        try:
            await self.store.webhook_enqueue(rows)
        except asyncio.CancelledError:
            # Cut at stop: aclose writes them (an id written twice is kept once).
            self._unwritten[:0] = rows
            raise
        except Exception:
            kinds = ", ".join(sorted({r.event_kind for r in rows}))
            log.exception("webhooks: could not record %d delivery(ies) (%s)", len(rows), kinds)
            return
        self._wake.set()

    # -- sending ----------------------------------------------------------------------
    def _lease(self) -> float:
        longest = max((h.settings.timeout for h in self.hooks.values()), default=10.0)
        return 2 * longest + 30.0

    async def _send_loop(self) -> None:
        while not self._closing:
            # Cleared before the round: a delivery recorded during it wakes the next.
            self._wake.clear()
            try:
                await self.send_due()
                due = await self.store.webhook_next_due()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("webhooks: the delivery round failed (retrying)")
                due = None
            wait = self.poll if due is None else min(self.poll, max(0.05, due - time.time()))
            # (``asyncio.timeout``, not ``wait_for``: on Python 3.11 ``wait_for`` loses a
            # cancel that comes as the wake-up does, and ``aclose`` then waits forever.)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()

    async def send_due(self) -> int:
        """Claim and send what is due now, until nothing is; how many attempts.  A batch
        costs two writes (its claim, then its outcomes), whatever its size."""
        made = 0
        while True:
            rows = await self.store.webhook_claim(
                self.worker, now=time.time(), lease=self._lease(), limit=self.batch
            )
            if not rows:
                return made
            attempts = [asyncio.ensure_future(self._attempt(d)) for d in rows]
            self._sending.update(attempts)
            try:
                await asyncio.gather(*attempts)
            finally:
                self._sending.difference_update(attempts)
                # Even when cut at stop: what finished is recorded (the rest is
                # released by aclose).
                outcomes = [
                    t.result() for t in attempts if t.done() and not t.cancelled()
                    and t.exception() is None
                ]  # fmt: skip
                if outcomes:
                    await self.store.webhook_settle(self.worker, outcomes, now=time.time())
            made += len(rows)
            if len(rows) < self.batch:
                return made  # all that was due; what comes next wakes the loop

    async def _attempt(self, d: WebhookDelivery) -> WebhookOutcome:
        hook = self.hooks.get(d.webhook)
        if hook is None:
            gone = f"no [[webhooks]] named {d.webhook!r} any more"
            return WebhookOutcome(id=d.id, state="dead", error=gone)
        async with self._limit:
            error = await self._post(hook, d)
        if error is None:
            return WebhookOutcome(id=d.id, state="delivered")
        attempts = d.attempts + 1
        s = hook.settings
        if attempts >= s.max_attempts:
            log.warning(
                "webhook %s: delivery %s (%s) failed %d times (%s): kept as a dead letter"
                " (agentik webhooks dead-letters)",
                d.webhook, d.id, d.event_kind, attempts, error,
            )  # fmt: skip
            return WebhookOutcome(id=d.id, state="dead", error=error)
        wait = min(s.backoff_max, s.backoff * 2 ** (attempts - 1)) * random.uniform(0.9, 1.1)
        log.info(
            "webhook %s: delivery %s failed (%s); attempt %d of %d in %.1fs",
            d.webhook, d.id, error, attempts + 1, s.max_attempts, wait,
        )  # fmt: skip
        return WebhookOutcome(id=d.id, state="pending", next_at=time.time() + wait, error=error)

    async def _post(self, hook: _Hook, d: WebhookDelivery) -> str | None:
        """One attempt: ``None`` if the receiver took it (2xx), else why not."""
        import aiohttp

        assert self._session is not None
        body = d.body.encode()
        timestamp = int(time.time())
        headers = {
            "Content-Type": "application/json",
            TIMESTAMP_HEADER: str(timestamp),
            SIGNATURE_HEADER: sign(hook.secret, timestamp, body),
            DELIVERY_HEADER: d.id,
            EVENT_HEADER: d.event_kind,
        }
        try:
            async with self._session.post(
                hook.settings.url, data=body, headers=headers, allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=hook.settings.timeout),
            ) as response:  # fmt: skip
                await response.read()
                if 200 <= response.status < 300:
                    return None
                return f"HTTP {response.status}"
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return _describe(exc)


_SAFE = re.compile(r"[^\x20-\x7e]")


def printable(text: str) -> str:
    """``text`` with control characters shown as ``?`` (for a terminal)."""
    return _SAFE.sub("?", text)
