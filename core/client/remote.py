"""The remote agent client: the library's Agent/Conversation shape over HTTP+SSE.

What goes over the wire is docs/http-api.md; this module only speaks it (with
``httpx2``, a declared dependency).  Where the in-process object and the remote
one differ, it is because a network is in between:

* ``events()`` opens its SSE stream at once (a task), and ``send()`` of the
  same conversation (or of any conversation, for an agent-wide stream) first
  waits until the streams opened before it are connected: the server
  subscribes before it answers, so ``events = conv.events(); await
  conv.send(...)`` misses nothing, as in process;
* a stream that breaks (a network error) reconnects with ``Last-Event-ID``
  and replays what it missed (or yields ``events_lost`` when the server's
  buffer no longer reaches back); it ends, as in process, when the server
  ends it (the conversation deleted, a shutdown, ``events_lost``);
* what a remote sends is capped, since it may be hostile: an event at
  :data:`MAX_EVENT_BYTES` (a line that never ends counts as it grows), any
  other answer at :data:`MAX_ANSWER_BYTES`.  Past a cap the stream or the
  request ends with a :class:`~agentik.core.errors.RemoteError` saying so (a
  stream is not reconnected: the remote would send the same again), and the
  connection is closed without reading the rest;
* errors are :class:`~agentik.core.errors.NotFound` (404) or
  :class:`~agentik.core.errors.RemoteError` (any other refusal, or no answer),
  with the API's error code; the token never appears in one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json as jsonlib
import logging
import weakref
from collections.abc import AsyncIterator, Iterable
from typing import Any
from urllib.parse import quote

import httpx2

from ..conversation import BusyMode, Sent
from ..errors import ClosedError, NotFound, RemoteError
from ..events import Event, EventsLost, event_from_json
from ..messages import Message
from ..store.records import CheckpointRecord, ConversationRecord

__all__ = ["RemoteAgent", "RemoteConversation", "RemoteSubscription"]

log = logging.getLogger(__name__)

#: Reconnection attempts of a broken event stream before it gives up (with backoff).
RECONNECTS = 5
#: Seconds to connect and to wait for an answer that is not an event stream.
DEFAULT_TIMEOUT = 60.0
#: The largest event a remote may send (its SSE lines, in bytes): as large as an
#: agent's whole replay buffer by default (``Agent(event_bytes=...)``), so no event a
#: bot can replay is refused.
MAX_EVENT_BYTES = 16 * 2**20
#: The largest answer to a request that is not an event stream (a history page, …).
MAX_ANSWER_BYTES = 64 * 2**20


def _checkpoint_of(data: Any, what: str) -> CheckpointRecord:
    """A checkpoint record from the remote's JSON (checked: the remote may be hostile)."""
    try:
        return CheckpointRecord(
            id=int(data["id"]), conversation_id=str(data["conversation_id"]),
            created_at=float(data["created_at"]), label=str(data.get("label") or ""),
            automatic=bool(data.get("automatic")), size=int(data.get("size") or 0),
        )  # fmt: skip
    except (KeyError, TypeError, ValueError) as exc:
        raise RemoteError(f"{what}: the answer is not a checkpoint: {exc}") from None


def _error_of(response: httpx2.Response, what: str, content: bytes) -> Exception:
    """The error a refusal (its body: ``content``) stands for: NotFound for 404, else
    RemoteError."""
    code: str | None = None
    message = ""
    try:
        body = jsonlib.loads(content)
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict):
            code = error.get("code") if isinstance(error.get("code"), str) else None
            message = str(error.get("message") or "")
    except ValueError:
        pass
    text = f"{what}: HTTP {response.status_code}" + (f" {code}" if code else "")
    if message:
        text += f": {message[:300]}"
    if response.status_code == 404:
        return NotFound(text)
    return RemoteError(text, status=response.status_code, code=code)


class RemoteAgent:
    """Another agentik, driven over its HTTP API (``url``: where it serves, e.g.
    ``http://127.0.0.1:8080``; ``prefix``: its API prefix, ``/agentik`` by default).

    ``token``: the API token (sent as ``Authorization: Bearer``; never logged).
    ``transport``: an ``httpx2`` transport (tests, proxies).  Use it as an async
    context manager, or call :meth:`start` and :meth:`aclose`.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        prefix: str = "/agentik",
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx2.AsyncBaseTransport | None = None,
        max_event_bytes: int = MAX_EVENT_BYTES,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
    ) -> None:
        self.url = url.rstrip("/")
        self.max_event_bytes = max_event_bytes
        self.max_answer_bytes = max_answer_bytes
        self.prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx2.AsyncClient(
            base_url=self.url + self.prefix,
            headers=headers,
            timeout=httpx2.Timeout(timeout),
            transport=transport,
        )
        #: The remote agent's id (``GET /status``: its ``[agent] name``), once started.
        self.id = ""
        self._streams: weakref.WeakSet[RemoteSubscription] = weakref.WeakSet()
        self._closed = False

    def __repr__(self) -> str:
        return f"<RemoteAgent {self.url}{self.prefix}>"

    async def start(self) -> RemoteAgent:
        """Check that the remote answers (and that the token is good): read its id."""
        status = await self.request("GET", "/status", what="status")
        self.id = str(status.get("agent_id") or "")
        return self

    async def aclose(self) -> None:
        """End the open event streams and the HTTP connections."""
        if self._closed:
            return
        self._closed = True
        for sub in list(self._streams):
            await sub.aclose()
        await self._client.aclose()

    async def __aenter__(self) -> RemoteAgent:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- the wire ---------------------------------------------------------------------
    async def request(
        self,
        method: str,
        path: str,
        *,
        what: str,
        json: Any = None,
        params: dict[str, Any] | None = None,
    ) -> Any:
        """Make one API request; its JSON answer (``None`` for 204). Raises NotFound
        (404) or RemoteError."""
        if self._closed:
            raise ClosedError("the remote agent client is closed")
        request = self._client.build_request(method, path, json=json, params=params)
        try:
            response = await self._client.send(request, stream=True)
        except httpx2.HTTPError as exc:
            raise RemoteError(f"{what}: {self.url} did not answer: {exc}") from exc
        try:
            content = bytearray()
            async for chunk in response.aiter_bytes():
                content += chunk
                if len(content) > self.max_answer_bytes:
                    raise RemoteError(
                        f"{what}: the answer is larger than {self.max_answer_bytes} bytes"
                        " (max_answer_bytes): not read",
                        status=response.status_code,
                    )
        except httpx2.HTTPError as exc:
            raise RemoteError(f"{what}: {self.url} broke off its answer: {exc}") from exc
        finally:
            await response.aclose()
        if response.status_code >= 400:
            raise _error_of(response, what, bytes(content))
        if response.status_code == 204 or not content:
            return None
        try:
            return jsonlib.loads(content)
        except ValueError as exc:
            raise RemoteError(
                f"{what}: the answer is not JSON", status=response.status_code
            ) from exc

    def _stream(
        self, path: str, *, after: int | None, profile: str, from_turn: bool = False
    ) -> RemoteSubscription:
        sub = RemoteSubscription(
            self._client, path, after=after, profile=profile, max_bytes=self.max_event_bytes,
            from_turn=from_turn,
        )  # fmt: skip
        self._streams.add(sub)
        return sub

    async def _connected(self, streams: Iterable[RemoteSubscription]) -> None:
        """Wait until the streams opened so far are connected (a failed one is its
        reader's to report)."""
        for sub in list(streams):
            await sub.wait_connected()

    # -- conversations ----------------------------------------------------------------
    def _wrap(self, data: dict[str, Any]) -> RemoteConversation:
        return RemoteConversation(self, data)

    async def create_conversation(
        self, *, title: str = "", temp: bool = False
    ) -> RemoteConversation:
        """Create a conversation (``temp``: the remote keeps it in memory only)."""
        body: dict[str, Any] = {"temp": temp}
        if title:
            body["title"] = title
        data = await self.request("POST", "/conversations", json=body, what="create a conversation")
        return self._wrap(data)

    async def get_conversation(self, conversation_id: str) -> RemoteConversation:
        """The conversation with this id; raises :class:`NotFound`."""
        data = await self.request(
            "GET", f"/conversations/{_segment(conversation_id)}", what="get a conversation"
        )
        return self._wrap(data)

    async def delete_conversation(self, conversation_id: str) -> None:
        """Delete a conversation and its whole history (its event streams end)."""
        await self.request(
            "DELETE", f"/conversations/{_segment(conversation_id)}", what="delete a conversation"
        )

    async def list_conversations(
        self, *, limit: int = 50, offset: int = 0
    ) -> list[ConversationRecord]:
        """A page of conversations, most recently active first."""
        page = await self.request(
            "GET",
            "/conversations",
            params={"limit": limit, "offset": offset},
            what="list conversations",
        )
        return [
            ConversationRecord(
                id=c["id"],
                title=c.get("title") or "",
                created_at=float(c.get("created_at") or 0.0),
                updated_at=float(c.get("updated_at") or 0.0),
                meta=_meta_of(c),
            )
            for c in page.get("items", [])
        ]

    def events(self, *, after: int | None = None, profile: str = "debug") -> RemoteSubscription:
        """One live stream of the events of every conversation the token may see
        (``after``: a ``stream_seq``)."""
        return self._stream("/events", after=after, profile=profile)


class RemoteConversation:
    """One conversation of a :class:`RemoteAgent` (get it from the agent)."""

    def __init__(self, agent: RemoteAgent, data: dict[str, Any]) -> None:
        self.agent = agent
        self.id: str = data["id"]
        self._streams: weakref.WeakSet[RemoteSubscription] = weakref.WeakSet()
        self._update(data)

    def _update(self, data: dict[str, Any]) -> None:
        self.title: str = data.get("title") or ""
        self.temp = bool(data.get("temp"))
        self.channel_key: str | None = data.get("channel_key")
        self.created_at = float(data.get("created_at") or 0.0)
        self.updated_at = float(data.get("updated_at") or 0.0)
        #: As last read (:meth:`refresh`): a turn runs or is queued.
        self.busy = bool(data.get("busy"))
        self.running_run_id: str | None = data.get("running_run_id")
        self.queued = int(data.get("queued") or 0)
        #: ``None``, or where a child run's conversation comes from (docs/http-api.md).
        self.parent: dict[str, Any] | None = data.get("parent")
        self.meta: dict[str, Any] = _meta_of(data)

    def __repr__(self) -> str:
        return f"<RemoteConversation {self.id} {self.title!r}{' temp' if self.temp else ''}>"

    @property
    def _path(self) -> str:
        return f"/conversations/{_segment(self.id)}"

    async def refresh(self) -> RemoteConversation:
        """Read the conversation again (``busy``, ``queued``, ``title``, …)."""
        self._update(await self.agent.request("GET", self._path, what="get a conversation"))
        return self

    # -- sending ----------------------------------------------------------------------
    async def send(
        self, content: str, *, author: str | None = None, busy: BusyMode = "queue"
    ) -> str:
        """Record ``content`` as a user message and queue a turn; its run id.

        Returns once the remote committed the message (HTTP 202).  ``author``:
        the name its model sees (default: the token's name); ``busy``: as
        :meth:`Conversation.submit <agentik.core.conversation.Conversation.submit>`.
        """
        return (await self.submit(content, author=author, busy=busy)).run_id

    async def submit(
        self, content: str, *, author: str | None = None, busy: BusyMode = "queue"
    ) -> Sent:
        """Like :meth:`send`, saying what became of the message."""
        # Streams opened before this message must see its turn from the start.
        await self.agent._connected([*self._streams, *self.agent._streams])
        body: dict[str, Any] = {"content": content, "busy": busy}
        if author is not None:
            body["author"] = author
        data = await self.agent.request(
            "POST", self._path + "/messages", json=body, what="send a message"
        )
        if data.get("title"):
            self.title = data["title"]
        return Sent(
            run_id=data["run_id"],
            steered=bool(data.get("steered")),
            interrupted=busy == "interrupt" and not data.get("steered"),
        )

    async def interrupt(self, run_id: str | None = None) -> bool:
        """Stop the running turn (``run_id``: only that run); return once it stopped.
        ``False`` when no turn was running (or it is already stopping)."""
        try:
            await self.agent.request(
                "POST",
                self._path + "/interrupt",
                json={"run_id": run_id} if run_id else {},
                what="interrupt",
            )
        except RemoteError as exc:
            if exc.code in ("no_turn_running", "run_not_running", "turn_already_interrupted"):
                return False
            raise
        return True

    async def status(self) -> dict[str, Any]:
        """What it does now (``state``, ``run_id``, ``tools``, ``queued``, ``usage``, …)."""
        data: dict[str, Any] = await self.agent.request(
            "GET", self._path + "/status", what="status"
        )
        return data

    async def wait_idle(self) -> None:
        """Wait until no turn is running or queued."""
        events = self.events(profile="debug")
        try:
            status = await self.status()
            if status.get("state") == "idle" and not status.get("queued"):
                return
            async for event in events:
                if event.kind == "status_changed" and event.state == "idle" and not event.queued:
                    return
                if event.kind == "events_lost" and (await self.status()).get("state") == "idle":
                    return
        finally:
            await events.aclose()

    # -- events and history -----------------------------------------------------------
    def events(
        self, *, after: int | None = None, profile: str = "debug", from_turn: bool = False
    ) -> RemoteSubscription:
        """Live events of this conversation (an async iterator of
        :data:`~agentik.core.events.Event`); ``after=seq`` first replays what was
        missed; without it, ``from_turn=True`` starts with the running turn's events
        from its start (as :meth:`Conversation.events`).  ``profile`` names one of the
        remote's stream profiles."""
        sub = self.agent._stream(
            self._path + "/events", after=after, profile=profile, from_turn=from_turn
        )
        self._streams.add(sub)
        return sub

    async def messages(
        self,
        *,
        after: int | None = None,
        before: int | None = None,
        offset: int | None = None,
        limit: int = 100,
    ) -> list[Message]:
        """A page of the audit log, oldest first (as :meth:`Conversation.messages
        <agentik.core.conversation.Conversation.messages>`)."""
        params: dict[str, Any] = {"limit": limit}
        for key, value in (("after", after), ("before", before), ("offset", offset)):
            if value is not None:
                params[key] = value
        page = await self.agent.request(
            "GET", self._path + "/messages", params=params, what="read the history"
        )
        return [Message.from_dict(m) for m in page.get("items", [])]

    async def rename(self, title: str | None) -> None:
        """Set the title (``None`` or ``""``: clear it)."""
        data = await self.agent.request(
            "PATCH", self._path, json={"title": title or None}, what="rename"
        )
        if isinstance(data, dict):
            self._update(data)
        else:
            self.title = title or ""

    # -- checkpoints -------------------------------------------------------------------
    async def checkpoint(self, label: str = "") -> CheckpointRecord:
        """Keep a snapshot of the remote conversation now (as :meth:`Conversation.checkpoint
        <agentik.core.conversation.Conversation.checkpoint>`)."""
        data = await self.agent.request(
            "POST", self._path + "/checkpoints", json={"label": label}, what="take a checkpoint"
        )
        return _checkpoint_of(data, "take a checkpoint")

    async def checkpoints(self) -> list[CheckpointRecord]:
        """The remote conversation's checkpoints, newest first."""
        data = await self.agent.request(
            "GET", self._path + "/checkpoints", what="list the checkpoints"
        )
        items = data.get("items") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise RemoteError("list the checkpoints: the answer has no items list")
        return [_checkpoint_of(c, "list the checkpoints") for c in items]

    async def checkpoint_document(self, checkpoint_id: int) -> dict[str, Any] | None:
        """The snapshot of one checkpoint (``None``: the conversation has no such one)."""
        try:
            doc: dict[str, Any] = await self.agent.request(
                "GET", f"{self._path}/checkpoints/{int(checkpoint_id)}", what="read a checkpoint"
            )
        except NotFound as exc:
            if "checkpoint_not_found" in str(exc):
                return None
            raise
        return doc

    async def delete_checkpoint(self, checkpoint_id: int) -> bool:
        """Delete one checkpoint of the remote conversation; whether it was there."""
        try:
            await self.agent.request(
                "DELETE",
                f"{self._path}/checkpoints/{int(checkpoint_id)}",
                what="delete a checkpoint",
            )
        except NotFound as exc:
            if "checkpoint_not_found" in str(exc):
                return False
            raise
        return True

    async def aclose(self) -> None:
        """Leave: end this object's event streams (the remote conversation stays)."""
        for sub in list(self._streams):
            await sub.aclose()

    async def __aenter__(self) -> RemoteConversation:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class RemoteSubscription(AsyncIterator[Event]):
    """An SSE event stream of a remote agent, as an async iterator of events.

    It connects at once (a task; :meth:`wait_connected`), reconnects with
    ``Last-Event-ID`` after a network error, and ends when the server ends the
    stream.  ``aclose()`` to leave.  A stream that cannot connect again raises
    :class:`RemoteError` from the iteration.
    """

    def __init__(
        self,
        client: httpx2.AsyncClient,
        path: str,
        *,
        after: int | None,
        profile: str,
        max_bytes: int = MAX_EVENT_BYTES,
        from_turn: bool = False,
    ) -> None:
        self._client = client
        self._params = {"profile": profile, **({"replay": "turn"} if from_turn else {})}
        self._max_bytes = max_bytes
        self._path = path
        #: The id of the last event received (what a reconnect resumes after).
        self.last_id = after
        self._response: httpx2.Response | None = None
        self._lines: AsyncIterator[Any] | None = None
        self._closed = False
        self._ended = False
        self._broken = False
        self._connect: asyncio.Task[None] = asyncio.get_running_loop().create_task(
            self._open(), name=f"sse {path}"
        )

    async def _open(self) -> None:
        headers = {"Accept": "text/event-stream"}
        if self.last_id is not None:
            headers["Last-Event-ID"] = str(self.last_id)
        request = self._client.build_request(
            "GET",
            self._path,
            # (``replay`` is ignored when resuming after ``Last-Event-ID``.)
            params=self._params,
            headers=headers,
            # Events may be minutes apart (the server pings every ``heartbeat``).
            timeout=httpx2.Timeout(DEFAULT_TIMEOUT, read=None),
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx2.HTTPError as exc:
            raise RemoteError(f"events: {request.url.host} did not answer: {exc}") from exc
        if response.status_code >= 400:
            content = b""
            with contextlib.suppress(httpx2.HTTPError):
                async for chunk in response.aiter_bytes():
                    content += chunk
                    if len(content) > self._max_bytes:
                        break  # a refusal's reason is short: the rest is not read
            await response.aclose()
            raise _error_of(response, "events", content)
        self._response = response
        self._lines = aiter(httpx2.EventSource(response, max_event_size=self._max_bytes))

    async def wait_connected(self) -> None:
        """Wait until the stream is connected (the server has subscribed): a failure
        is not raised here, but by the iteration."""
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.shield(self._connect)

    def __aiter__(self) -> RemoteSubscription:
        return self

    async def __anext__(self) -> Event:
        attempt = 0
        while True:
            if self._closed or self._ended:
                raise StopAsyncIteration
            if self._broken:
                # A read was cancelled: that response is done for; resume after last_id.
                self._broken = False
                await self._drop()
                self._connect = asyncio.get_running_loop().create_task(self._open())
            try:
                await self._connect
                assert self._lines is not None
                sse = await anext(self._lines)
            except asyncio.CancelledError:
                self._broken = True
                raise
            except StopAsyncIteration:
                # The server ended the stream: the conversation ended, or a shutdown.
                await self._drop()
                self._ended = True
                raise
            except httpx2.SSEError as exc:
                # An event over the cap, or no event stream at all: the remote would do
                # the same again, so no reconnect; the rest is not read.
                await self._drop()
                self._ended = True
                if "byte limit" in str(exc):
                    raise RemoteError(
                        f"events: the remote sent an event larger than {self._max_bytes} bytes"
                        " (max_event_bytes): the stream is closed"
                    ) from None
                raise RemoteError(f"events: the answer is not an event stream: {exc}") from None
            except (httpx2.TransportError, RemoteError) as exc:
                if self._closed:
                    raise StopAsyncIteration from None
                if isinstance(exc, RemoteError) and exc.status is not None:
                    self._ended = True
                    raise  # refused (404 after a delete, 401): reconnecting will not help
                attempt += 1
                if attempt > RECONNECTS:
                    self._ended = True
                    raise RemoteError(
                        f"events: the stream broke and did not come back: {exc}"
                    ) from exc
                await self._drop()
                log.info("event stream %s broke (%s); reconnecting", self._path, exc)
                await asyncio.sleep(
                    min(2.0, 0.1 * 2**attempt)
                )  # backoff, not a wait on a condition
                self._connect = asyncio.get_running_loop().create_task(self._open())
                continue
            if not sse.data:
                continue
            event = event_from_json(sse.data)
            if sse.id:
                with contextlib.suppress(ValueError):
                    self.last_id = int(sse.id)
            if isinstance(event, EventsLost):
                self._ended = True  # the server ends the stream after it
            return event

    async def _drop(self) -> None:
        response, self._response, self._lines = self._response, None, None
        if response is not None:
            await response.aclose()

    async def aclose(self) -> None:
        """Leave the stream."""
        self._closed = True
        if not self._connect.done():
            self._connect.cancel()
        with contextlib.suppress(BaseException):
            await self._connect
        await self._drop()


def _segment(conversation_id: str) -> str:
    """A conversation id as one path segment (escaped: an id cannot reach another path)."""
    if not conversation_id or conversation_id in (".", ".."):
        raise NotFound(f"no conversation {conversation_id!r}")
    return quote(conversation_id, safe="")


def _meta_of(data: dict[str, Any]) -> dict[str, Any]:
    """The record metadata a local conversation would carry (its channel key, and a
    child run's parent), from the API's fields."""
    meta: dict[str, Any] = {}
    if data.get("channel_key"):
        meta["channel_key"] = data["channel_key"]
    parent = data.get("parent")
    if isinstance(parent, dict):
        meta.update(
            parent_conversation_id=parent.get("conversation_id"),
            parent_run_id=parent.get("run_id"),
            parent_call_id=parent.get("call_id"),
            run_id=parent.get("child_run_id"),
            agent=parent.get("agent"),
        )
    return meta
