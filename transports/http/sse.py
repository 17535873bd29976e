"""Server-Sent Events: one event subscription streamed to one HTTP client.

Each event becomes one SSE message::

    id: <seq>            (the conversation's seq; stream_seq on the all-conversations stream)
    data: <event JSON>   (agentik.core.events.event_to_json: the same shape everywhere)

On the all-conversations stream of workers sharing PostgreSQL, an event that is
not stored (a temporary conversation's) has no position: its message has no
``id`` line, so the client's ``Last-Event-ID`` stays the last stored event's.

A client that reconnects sends the last ``id`` it saw as ``Last-Event-ID``
and is replayed what it missed.  A comment line (``: ping``) goes out every
``heartbeat`` seconds so proxies keep the connection open.

A slow client never slows the agent: the subscription's queue is bounded;
when the client falls that far behind it receives an ``events_lost`` event
(whose ``id`` is the last event it did receive, so an automatic reconnect
resumes exactly there) and the stream ends.  Frames are serialised once per
event however many clients receive it (:class:`FrameCache`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from agentik.core.cluster.events import AgentStream, ClusterSubscription
from agentik.core.eventbus import Subscription
from agentik.core.events import EventBase, event_to_json

__all__ = ["EventStream", "FrameCache"]

log = logging.getLogger(__name__)

_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    # nginx and friends buffer responses unless told not to.
    (b"x-accel-buffering", b"no"),
]


def _chunk(body: bytes) -> dict[str, Any]:
    return {"type": "http.response.body", "body": body, "more_body": True}


def _encode(event: EventBase, event_id: int | None) -> bytes:
    data = event_to_json(event).encode("utf-8")
    if event_id is None:
        return b"data: %s\n\n" % data
    return b"id: %d\ndata: %s\n\n" % (event_id, data)


class FrameCache:
    """Encoded SSE frames of recent events, shared by every stream.

    Keyed by the event's agent-wide ``stream_seq`` and which id the stream
    uses; ``events_lost`` notices are per subscriber and never cached.  A
    frame is reused only for the very event object it was made from: a
    profile may hand its subscribers a trimmed copy (no usage numbers) under
    the same ``stream_seq``.

    It keeps at most ``size`` frames and about ``max_bytes`` (each frame
    counted twice: the event it keeps is about as large).  A frame is shared
    while its event is being sent to the streams, so the last few megabytes
    are plenty; a count alone kept 4,096 frames of 20-64 KB tool outputs (and
    their events) for good: 80-500 MB.
    """

    def __init__(self, size: int = 4096, max_bytes: int = 4 * 2**20) -> None:
        self.size = size
        self.max_bytes = max_bytes
        #: What the kept frames weigh (twice their bytes, see above).
        self.bytes = 0
        self._frames: dict[tuple[int, bool], tuple[EventBase, bytes]] = {}

    def frame(self, event: EventBase, *, global_ids: bool) -> bytes:
        event_id: int | None = event.stream_seq if global_ids else event.seq
        if event.kind == "events_lost":
            return _encode(event, event_id)
        if not event.stream_seq:
            # (On the all-conversations stream: not stored, no position to resume from.)
            return _encode(event, None if global_ids else event_id)
        key = (event.stream_seq, global_ids)
        cached = self._frames.get(key)
        if cached is not None:
            if cached[0] is event:
                return cached[1]
            return _encode(event, event_id)
        frame = _encode(event, event_id)
        self._frames[key] = (event, frame)
        self.bytes += 2 * len(frame)
        while len(self._frames) > self.size or (
            self.bytes > self.max_bytes and len(self._frames) > 1
        ):
            _, old = self._frames.pop(next(iter(self._frames)))
            self.bytes -= 2 * len(old)
        return frame


class EventStream:
    """An ASGI response that streams ``subscription`` as ``text/event-stream``.

    ``accept`` (optional) filters events (e.g. to the conversations a token
    may see).  The stream ends when the subscription ends (the conversation
    was deleted, the client fell behind, the server is closing) or when the
    client goes away; the subscription is closed either way.
    """

    def __init__(
        self,
        subscription: Subscription | ClusterSubscription | AgentStream,
        *,
        cache: FrameCache,
        heartbeat: float,
        global_ids: bool = False,
        accept: Callable[[EventBase], Awaitable[bool]] | None = None,
        on_close: Callable[[EventStream], None] | None = None,
    ) -> None:
        self.subscription = subscription
        self.cache = cache
        self.heartbeat = heartbeat
        self.global_ids = global_ids
        self.accept = accept
        self.on_close = on_close
        self._lock = asyncio.Lock()

    async def discard(self) -> None:
        """Close without streaming (a HEAD request)."""
        await self.subscription.aclose()
        if self.on_close is not None:
            self.on_close(self)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
            await send(_chunk(b"retry: 2000\n\n"))
            pump = asyncio.ensure_future(self._pump(send))
            watch = asyncio.ensure_future(self._watch(receive, send))
            try:
                await asyncio.wait({pump, watch}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (pump, watch):
                    task.cancel()
                await asyncio.gather(pump, watch, return_exceptions=True)
            failed = pump.done() and not pump.cancelled() and pump.exception()
            if failed:
                log.warning("event stream failed: %s", failed)
            if pump.done() and not pump.cancelled():
                # The stream ended on our side: finish the response properly.
                with contextlib.suppress(Exception):
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await self.subscription.aclose()
            if self.on_close is not None:
                self.on_close(self)

    async def _pump(self, send: Any) -> None:
        cache, global_ids, accept = self.cache, self.global_ids, self.accept
        async for event in self.subscription:
            if accept is not None and not await accept(event):
                continue
            frame = cache.frame(event, global_ids=global_ids)
            async with self._lock:
                await send(_chunk(frame))

    async def _watch(self, receive: Any, send: Any) -> None:
        """Return when the client disconnects; send a heartbeat when it is quiet."""
        while True:
            try:
                message = await asyncio.wait_for(receive(), self.heartbeat)
            except TimeoutError:
                async with self._lock:
                    await send(_chunk(b": ping\n\n"))
                continue
            if message["type"] == "http.disconnect":
                return
