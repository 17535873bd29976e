"""A fake Slack (Web API + Socket Mode) on 127.0.0.1 that speaks Slack's real wire formats.

The real ``slack_sdk`` clients (and slack-bolt on top of them) run against it unchanged::

    async with FakeSlack() as slack:
        client = AsyncWebClient(token=slack.bot_token, base_url=slack.api_url)
        await client.chat_postMessage(channel="C1", text="hi")
        assert slack.calls_to("chat.postMessage")[0]["text"] == "hi"

        sm = SocketModeClient(app_token=slack.app_token, web_client=client)
        await sm.connect()
        envelope_id = await slack.push_event(slack.message_event("C1", "hello", user="U1"))
        await slack.wait_for_ack(envelope_id)

Web API: ``POST``/``GET`` ``{api_url}{method}``; parameters are merged from the query
string, a form body and a JSON body, the token comes from ``Authorization: Bearer`` (or a
``token`` parameter). Every call is recorded in ``calls`` (rate-limited and failed ones
too), in order. ``messages`` holds the channel state: messages posted by the bot, edited by
``chat.update`` and the streaming methods, plus the ``message``/``app_mention`` events pushed
through Socket Mode (so ``conversations.replies`` sees the user's side of a thread).
``api_connections`` holds the client end of each connection the Web API calls came over.

Socket Mode: ``apps.connections.open`` (app token only) hands out a one-time
``ws://127.0.0.1:PORT/socket?ticket=...`` URL; on connect the server sends ``hello``;
``push_event`` sends an ``events_api`` envelope on the newest connection and the client's
``{"envelope_id": ...}`` acks are recorded in ``acks``. With ``retry_after`` set, an event
whose envelope is not acked within that many seconds is sent again (a new envelope, the
same ``event_id``, ``retry_attempt`` 1, 2, 3 and ``retry_reason`` ``"timeout"``), on
whichever connection is live then, at most ``max_retries`` times: as Slack resends an
event a client did not acknowledge in time (Slack waits longer between attempts).
Each resend is recorded in ``retried``.

Message metadata (``metadata`` of ``chat.postMessage``) is kept with the message and
returned by ``conversations.replies``/``history`` only with ``include_all_metadata``, as
Slack does (their ``oldest`` is ignored: the fake's ts are not wall-clock times).
``hold(method)``: the next call of ``method`` takes effect at once but is answered only
after ``release()`` (a response lost in transit: the client cannot tell whether it
happened); ``held`` lists the held calls' methods.

Limits as Slack documents them: ``chat.postMessage``/``chat.update`` refuse a
``text`` over 40,000 characters (``msg_too_long``), more than 50 blocks or a
section block whose text is over 3,000 characters (``invalid_blocks``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import WSMsgType, web

__all__ = ["FakeSlack"]

_STREAM_METHODS = {"chat.startStream", "chat.appendStream", "chat.stopStream"}


def _chunks_text(params: dict[str, Any]) -> str:
    """``markdown_text`` plus the text of any ``markdown_text`` chunks in ``params``."""
    text = params.get("markdown_text") or ""
    chunks = params.get("chunks") or []
    if isinstance(chunks, str):  # form-encoded JSON
        try:
            chunks = json.loads(chunks)
        except ValueError:
            chunks = []
    for chunk in chunks:
        if isinstance(chunk, dict) and chunk.get("type") == "markdown_text":
            text += chunk.get("text") or ""
    return text


def _maybe_json(value: Any) -> Any:
    """Form-encoded ``blocks``/``metadata`` arrive as JSON strings; decode them."""
    if isinstance(value, str) and value[:1] in "[{":
        with contextlib.suppress(ValueError):
            return json.loads(value)
    return value


class FakeSlack:
    """Fake Slack workspace with one bot; see the module docstring."""

    def __init__(
        self,
        *,
        team_id: str = "T1",
        bot_user_id: str = "UBOT",
        bot_id: str = "B1",
        app_id: str = "A1",
        bot_token: str = "xoxb-test",
        app_token: str = "xapp-test",
        signing_secret: str = "s3cret",
        team_domain: str = "fake",
        port: int = 0,
    ) -> None:
        self.team_id = team_id
        self.bot_user_id = bot_user_id
        self.bot_id = bot_id
        self.app_id = app_id
        self.bot_token = bot_token
        self.app_token = app_token
        self.signing_secret = signing_secret
        self.team_domain = team_domain
        self.port = port
        self.supports_streaming = True
        #: The bot token's scopes (sent back in ``x-oauth-scopes`` as Slack does).  A
        #: ``chat.postMessage`` with ``username``, ``icon_url`` or ``icon_emoji`` needs
        #: ``chat:write.customize``: without it Slack answers ``missing_scope``.
        self.scopes: set[str] = set(BOT_SCOPES)
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.messages: dict[tuple[str, str], dict[str, Any]] = {}
        self.users: dict[str, dict[str, Any]] = {}
        self.channels: dict[str, dict[str, Any]] = {}
        self.acks: dict[str, dict[str, Any]] = {}  # envelope_id -> the client's ack message
        self.sent: list[dict[str, Any]] = []  # every frame sent over Socket Mode
        #: The client end (host, port) of each connection Web API calls came over.
        self.api_connections: set[tuple[Any, ...]] = set()
        self.socket_connections = 0
        #: Seconds an events_api envelope may wait for its ack before the event is sent
        #: again (None: never); at most ``max_retries`` resends of one event.
        self.retry_after: float | None = None
        self.max_retries = 3
        #: ``(event_id, retry_attempt)`` of every resend, in order.
        self.retried: list[tuple[str, int]] = []
        self._resends: set[asyncio.Task[None]] = set()
        #: Seconds ``push_event`` (and the other sends) wait for a live connection.
        self.send_timeout = 60.0
        self.add_user(bot_user_id, "bot", real_name="Fake Bot", is_bot=True)
        self._rate_limits: dict[str, list[int]] = {}  # method -> [times_left, retry_after]
        self._holds: dict[str, int] = {}  # method -> how many next calls to hold
        self._released = asyncio.Event()
        #: Methods of the calls held so far (see :meth:`hold`), in order.
        self.held: list[str] = []
        self._streaming: set[tuple[str, str]] = set()
        self._ts_counter = 0
        self._tickets: set[str] = set()
        self._ws: web.WebSocketResponse | None = None
        self._sockets: set[web.WebSocketResponse] = set()
        self._transports: dict[web.WebSocketResponse, asyncio.BaseTransport] = {}
        self._consumed: set[int] = set()  # indexes of calls returned by wait_for_call
        self._waiters: set[asyncio.Event] = set()
        self._runner: web.AppRunner | None = None
        #: Files served at ``url_private`` (``add_file``), by id: (bytes, mimetype).
        self.files: dict[str, tuple[bytes, str]] = {}
        #: The Authorization header of each file download, in order.
        self.file_downloads: list[str | None] = []

    # ----------------------------------------------------------------- lifecycle

    @property
    def api_url(self) -> str:
        """``http://127.0.0.1:PORT/api/`` (valid once started)."""
        return f"http://127.0.0.1:{self.port}/api/"

    @property
    def socket_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/socket"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._api)
        app.router.add_get("/socket", self._socket)
        app.router.add_get("/files-pri/{file_id}/{name}", self._file)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        self._released.set()  # held calls end with the server
        for task in list(self._resends):
            task.cancel()
        for ws in list(self._sockets):
            with contextlib.suppress(Exception):
                await ws.close(code=1001, message=b"server shutting down")
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeSlack:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ----------------------------------------------------------------- test helpers

    def new_ts(self) -> str:
        """A fresh, unique, increasing ``"1700000000.000100"``-style timestamp."""
        self._ts_counter += 1
        micros = self._ts_counter * 100
        return f"{1700000000 + micros // 1_000_000}.{micros % 1_000_000:06d}"

    def add_user(
        self,
        user_id: str,
        name: str,
        *,
        real_name: str | None = None,
        display_name: str | None = None,
        is_bot: bool = False,
    ) -> dict[str, Any]:
        """Register a user served by ``users.info`` (``users[user_id]`` may also be set)."""
        real = real_name or name
        user = {
            "id": user_id,
            "team_id": self.team_id,
            "name": name,
            "deleted": False,
            "real_name": real,
            "tz": "UTC",
            "is_bot": is_bot,
            "profile": {
                "display_name": display_name if display_name is not None else name,
                "real_name": real,
                "team": self.team_id,
                # (Slack serves a profile image in several sizes)
                **{
                    f"image_{n}": f"https://avatars.{self.team_domain}.example/{user_id}_{n}.png"
                    for n in (24, 32, 48, 72, 192, 512)
                },
            },
        }
        self.users[user_id] = user
        return user

    def calls_to(self, method: str) -> list[dict[str, Any]]:
        return [params for m, params in self.calls if m == method]

    def rate_limit(self, method: str, times: int = 1, retry_after: int = 1) -> None:
        """The next ``times`` calls of ``method`` get HTTP 429 + ``Retry-After``."""
        self._rate_limits[method] = [times, retry_after]

    def hold(self, method: str, times: int = 1) -> None:
        """The next ``times`` calls of ``method`` take effect but get no answer until
        :meth:`release` (as a response lost when the client's connection went away)."""
        self._holds[method] = self._holds.get(method, 0) + times

    def release(self) -> None:
        """Answer the held calls (and any held later)."""
        self._released.set()

    def sign(self, body: bytes | str, timestamp: int | None = None) -> dict[str, str]:
        """``X-Slack-Request-Timestamp``/``X-Slack-Signature`` headers (v0) for ``body``."""
        ts = str(int(time.time()) if timestamp is None else timestamp)
        raw = body.encode() if isinstance(body, str) else body
        base = b"v0:" + ts.encode() + b":" + raw
        digest = hmac.new(self.signing_secret.encode(), base, hashlib.sha256).hexdigest()
        return {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": f"v0={digest}"}

    @staticmethod
    def typed(text: str) -> str:
        """``text`` as a person typed it, in the form Slack sends it in ``text``.

        Slack encodes the three characters it uses for markup as entities:
        ``&`` → ``&amp;``, ``<`` → ``&lt;``, ``>`` → ``&gt;`` ("Escaping text"
        in Slack's formatting docs); pass ``<@U1>``-style markup around it as is.
        """
        return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

    def add_file(
        self,
        name: str,
        data: bytes,
        mimetype: str = "",
        *,
        user: str = "U1",
        size: int | None = None,
    ) -> dict[str, Any]:
        """A file object as a ``file_share`` message event carries it (Slack's
        ``files`` field), served by this fake at its ``url_private`` to requests with
        the bot token (``Authorization: Bearer``), as files.slack.com serves them.
        ``size``: the size the event declares (default: the real one)."""
        file_id = "F" + uuid.uuid4().hex[:10].upper()
        self.files[file_id] = (data, mimetype or "application/octet-stream")
        return {
            "id": file_id, "created": int(time.time()), "timestamp": int(time.time()),
            "name": name, "title": name, "mimetype": mimetype, "filetype": name.rsplit(".")[-1],
            "user": user, "mode": "hosted", "size": len(data) if size is None else size,
            "url_private": f"http://127.0.0.1:{self.port}/files-pri/{self.team_id}-{file_id}/{name}",
            "url_private_download": f"http://127.0.0.1:{self.port}/files-pri/"
            f"{self.team_id}-{file_id}/download/{name}",
            "permalink": f"https://{self.team_domain}.slack.com/files/{user}/{file_id}/{name}",
        }  # fmt: skip

    async def _file(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization")
        self.file_downloads.append(auth)
        file_id = request.match_info["file_id"].split("-", 1)[-1]
        if auth != f"Bearer {self.bot_token}" or file_id not in self.files:
            # Slack answers a request without the token with its login page (HTML).
            return web.Response(status=302, headers={"Location": "https://fake.slack.com/"})
        data, mimetype = self.files[file_id]
        return web.Response(body=data, content_type=mimetype.split(";")[0] or None)

    def message_event(
        self,
        channel: str,
        text: str,
        *,
        user: str = "U1",
        ts: str | None = None,
        thread_ts: str | None = None,
        channel_type: str | None = None,
        subtype: str | None = None,
        files: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """A user's ``message`` event as Slack sends it (``ts`` is fresh when not given).

        ``subtype="file_share"`` adds a ``files`` list (``files``, from :meth:`add_file`;
        default: one text file on files.slack.com, which is not reached) and ``upload``;
        ``subtype="thread_broadcast"`` (a thread reply also sent to the channel)
        needs ``thread_ts`` and adds the ``root`` message."""
        event: dict[str, Any] = {
            "type": "message",
            "user": user,
            "text": text,
            "ts": ts or self.new_ts(),
            "team": self.team_id,
            "channel": channel,
            "event_ts": "",
            "channel_type": channel_type or self._channel_type(channel),
            "blocks": [_rich_text(text)],
        }
        event["event_ts"] = event["ts"]
        if thread_ts:
            event["thread_ts"] = thread_ts
        if subtype is not None:
            event["subtype"] = subtype
        if subtype == "file_share" and files is not None:
            event["upload"] = False
            event["display_as_bot"] = False
            event["files"] = files
        elif subtype == "file_share":
            event["upload"] = False
            event["display_as_bot"] = False
            event["files"] = [self.add_file("notes.txt", b"hello world\n", "text/plain", user=user)]
        if subtype == "thread_broadcast":
            root = self.messages.get((channel, thread_ts or ""))
            event["root"] = dict(root or {"type": "message", "ts": thread_ts, "text": ""})
        return event

    def message_changed_event(
        self, original: dict[str, Any], text: str, *, by: str | None = None
    ) -> dict[str, Any]:
        """The ``message_changed`` event Slack sends when the ``original`` message event's
        author (or ``by``) edits it to ``text`` (the hidden subtype, with the message as
        it is now and as it was)."""
        ts = self.new_ts()
        now = {
            k: v for k, v in original.items() if k not in ("channel", "event_ts", "channel_type")
        }
        now.update(text=text, blocks=[_rich_text(text)],
                   edited={"user": by or original.get("user"), "ts": ts})  # fmt: skip
        before = {
            k: v for k, v in original.items() if k not in ("channel", "event_ts", "channel_type")
        }
        return {
            "type": "message", "subtype": "message_changed", "hidden": True,
            "channel": original["channel"], "ts": ts, "event_ts": ts,
            "channel_type": original.get("channel_type") or self._channel_type(original["channel"]),
            "message": now, "previous_message": before,
        }  # fmt: skip

    def message_deleted_event(self, original: dict[str, Any]) -> dict[str, Any]:
        """The ``message_deleted`` event Slack sends when the ``original`` message is deleted."""
        ts = self.new_ts()
        before = {
            k: v for k, v in original.items() if k not in ("channel", "event_ts", "channel_type")
        }
        return {
            "type": "message", "subtype": "message_deleted", "hidden": True,
            "channel": original["channel"], "ts": ts, "event_ts": ts,
            "channel_type": original.get("channel_type") or self._channel_type(original["channel"]),
            "deleted_ts": original["ts"], "previous_message": before,
        }  # fmt: skip

    def assistant_thread_started_event(
        self,
        channel: str = "D1",
        *,
        user: str = "U1",
        thread_ts: str | None = None,
        context: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """``assistant_thread_started``: ``user`` opened a new thread in the assistant
        view (a thread of the DM ``channel``); ``context`` is where they were
        (``{"channel_id", "team_id", "enterprise_id"}``; ``{}``: nowhere in particular)."""
        return {
            "type": "assistant_thread_started",
            "assistant_thread": {
                "user_id": user,
                "context": {} if context is None else context,
                "channel_id": channel,
                "thread_ts": thread_ts or self.new_ts(),
            },
            "event_ts": self.new_ts(),
        }

    def assistant_thread_context_changed_event(
        self, channel: str, thread_ts: str, context: dict[str, Any], *, user: str = "U1"
    ) -> dict[str, Any]:
        """``assistant_thread_context_changed``: the user of an open assistant thread
        switched to another channel (``context``)."""
        event = self.assistant_thread_started_event(
            channel, user=user, thread_ts=thread_ts, context=context
        )
        event["type"] = "assistant_thread_context_changed"
        return event

    def app_mention_event(
        self,
        channel: str,
        text: str,
        *,
        user: str = "U1",
        ts: str | None = None,
        thread_ts: str | None = None,
    ) -> dict[str, Any]:
        """An ``app_mention`` event; ``text`` should contain ``<@BOT_USER_ID>``."""
        event = self.message_event(channel, text, user=user, ts=ts, thread_ts=thread_ts)
        event["type"] = "app_mention"
        del event["channel_type"]
        return event

    def event_callback(
        self, event: dict[str, Any], *, event_id: str | None = None
    ) -> dict[str, Any]:
        """The Events API ``event_callback`` payload wrapping ``event`` (also the HTTP body)."""
        return {
            "token": "verification-token",
            "team_id": self.team_id,
            "context_team_id": self.team_id,
            "context_enterprise_id": None,
            "api_app_id": self.app_id,
            "event": event,
            "type": "event_callback",
            "event_id": event_id or "Ev" + uuid.uuid4().hex[:10].upper(),
            "event_time": int(time.time()),
            "authorizations": [
                {
                    "enterprise_id": None,
                    "team_id": self.team_id,
                    "user_id": self.bot_user_id,
                    "is_bot": True,
                    "is_enterprise_install": False,
                }
            ],
            "is_ext_shared_channel": False,
            "event_context": "4-" + uuid.uuid4().hex,
        }

    def block_actions_payload(
        self,
        channel: str,
        ts: str,
        action_id: str,
        *,
        user: str = "U1",
        inputs: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """The ``block_actions`` interactive payload Slack sends when ``user`` presses the
        button ``action_id`` of the bot's message ``(channel, ts)`` (as stored: its blocks,
        thread). Raises ``KeyError`` when the message has no such button.

        ``inputs``: what the user entered in the message's ``input`` blocks (block id
        -> text, or the chosen option's value for a ``static_select``; one that is not
        an option raises ``KeyError``).  Like Slack, ``state.values`` holds every input
        block of the message, ``null`` where nothing was entered."""
        msg = self.messages[(channel, ts)]
        values: dict[str, Any] = {}
        entered = dict(inputs or {})
        for b in msg.get("blocks") or []:
            if b.get("type") != "input":
                continue
            el = b.get("element") or {}
            given = entered.pop(b.get("block_id"), None)
            if el.get("type") == "static_select":
                chosen = None
                if given is not None:
                    chosen = next(o for o in el.get("options") or [] if o["value"] == given)
                state = {"type": "static_select", "selected_option": chosen}
            else:
                state = {"type": el.get("type"), "value": given}
            values[b["block_id"]] = {el.get("action_id"): state}
        if entered:
            raise KeyError(f"no input block {sorted(entered)}")
        block, element = next(
            (b, e)
            for b in msg.get("blocks") or []
            if b.get("type") == "actions"
            for e in b.get("elements") or []
            if e.get("action_id") == action_id
        )
        action_ts = f"{time.time():.6f}"
        info = self.users.get(user) or {"name": user}
        container: dict[str, Any] = {
            "type": "message", "message_ts": ts, "channel_id": channel, "is_ephemeral": False,
        }  # fmt: skip
        if msg.get("thread_ts"):
            container["thread_ts"] = msg["thread_ts"]
        action = {
            "action_id": action_id,
            "block_id": block.get("block_id") or uuid.uuid4().hex[:5],
            "text": {**element.get("text", {}), "emoji": True},
            "value": element.get("value"),
            "type": "button",
            "action_ts": action_ts,
        }
        if element.get("style"):
            action["style"] = element["style"]
        return {
            "type": "block_actions",
            "user": {"id": user, "username": info["name"], "name": info["name"],
                     "team_id": self.team_id},
            "api_app_id": self.app_id,
            "token": "verification-token",
            "container": container,
            "trigger_id": f"{int(time.time())}.{uuid.uuid4().int % 10**12}.{uuid.uuid4().hex}",
            "team": {"id": self.team_id, "domain": self.team_domain},
            "enterprise": None,
            "is_enterprise_install": False,
            "channel": {"id": channel, "name": self.channels.get(channel, {}).get("name", channel)},
            "message": dict(msg),
            "state": {"values": values},
            "response_url": f"https://hooks.slack.com/actions/{self.team_id}/1/{uuid.uuid4().hex}",
            "actions": [action],
        }  # fmt: skip

    async def push_interactive(self, payload: dict[str, Any]) -> str:
        """Send an interactive ``payload`` (a ``block_actions``) in Socket Mode's
        ``interactive`` envelope on the newest connection; returns the envelope id."""
        envelope_id = str(uuid.uuid4())
        await self._send(
            {
                "envelope_id": envelope_id,
                "payload": payload,
                "type": "interactive",
                "accepts_response_payload": False,
            }
        )
        return envelope_id

    # ----------------------------------------------------------------- waiting

    def _notify(self) -> None:
        for event in self._waiters:
            event.set()

    async def wait_until(self, check: Callable[[], Any], timeout: float, what: str) -> Any:  # noqa: ASYNC109
        """Wait until ``check()`` returns something other than ``None`` or ``False``
        (re-checked each time the fake's state changes) and return it; a
        :class:`TimeoutError` naming ``what`` after ``timeout`` seconds."""
        event = asyncio.Event()
        self._waiters.add(event)
        try:
            async with asyncio.timeout(timeout):
                while True:
                    event.clear()
                    result = check()
                    if result is not None and result is not False:
                        return result
                    await event.wait()
        except TimeoutError:
            raise TimeoutError(
                f"FakeSlack: timed out after {timeout}s waiting for {what}"
            ) from None
        finally:
            self._waiters.discard(event)

    async def wait_for_call(
        self,
        method: str,
        predicate: Callable[[dict[str, Any]], bool] | None = None,
        timeout: float = 60.0,  # noqa: ASYNC109
    ) -> dict[str, Any]:
        """The params of the earliest call to ``method`` matching ``predicate`` that no earlier
        ``wait_for_call`` returned (past calls count, so there is no race); waits if none."""

        def check() -> dict[str, Any] | None:
            for i, (m, params) in enumerate(self.calls):
                if m == method and i not in self._consumed and (not predicate or predicate(params)):
                    self._consumed.add(i)
                    return params
            return None

        return await self.wait_until(check, timeout, f"a call to {method}")

    async def wait_for_ack(self, envelope_id: str, timeout: float = 60.0) -> dict[str, Any]:  # noqa: ASYNC109
        """Wait for the client's ack of ``envelope_id``; returns the ack message."""
        return await self.wait_until(
            lambda: self.acks.get(envelope_id), timeout, f"the ack of {envelope_id}"
        )

    async def wait_for_socket(self, count: int = 1, timeout: float = 60.0) -> None:  # noqa: ASYNC109
        """Wait until ``count`` websocket sessions have been opened and one is live."""
        await self.wait_until(
            lambda: self.socket_connections >= count and self._live_ws() is not None,
            timeout,
            f"{count} socket connection(s)",
        )

    # ----------------------------------------------------------------- Socket Mode

    def _live_ws(self) -> web.WebSocketResponse | None:
        ws = self._ws
        return ws if ws is not None and not ws.closed else None

    async def _send(self, frame: dict[str, Any], timeout: float | None = None) -> None:  # noqa: ASYNC109
        wait = self.send_timeout if timeout is None else timeout
        ws = await self.wait_until(self._live_ws, wait, "a live socket connection")
        self.sent.append(frame)
        await ws.send_str(json.dumps(frame))

    async def push_event(
        self,
        event: dict[str, Any],
        *,
        event_id: str | None = None,
        retry_num: int | None = None,
        retry_reason: str | None = None,
    ) -> str:
        """Send ``event`` in an ``events_api`` envelope on the newest connection (waiting for
        one if needed); returns the envelope id. Message and app_mention events are also
        stored in ``messages``. With :attr:`retry_after` set, the event is sent again
        while unacknowledged (see the module docstring); ``retry_num`` sends a retry by
        hand (pass the first delivery's ``event_id``)."""
        if event.get("type") in ("message", "app_mention") and event.get("channel"):
            if event.get("ts") and event.get("subtype") in (None, "file_share", "thread_broadcast"):
                msg = {k: v for k, v in event.items() if k not in ("channel", "channel_type")}
                msg["type"] = "message"
                self.messages.setdefault((event["channel"], event["ts"]), msg)
        payload = self.event_callback(event, event_id=event_id)
        envelope_id = await self._send_event(payload, retry_num or 0, retry_reason or "")
        if self.retry_after is not None and not retry_num:
            task = asyncio.create_task(self._resend_unacked(payload, envelope_id))
            self._resends.add(task)
            task.add_done_callback(self._resends.discard)
        return envelope_id

    async def _send_event(self, payload: dict[str, Any], attempt: int, reason: str) -> str:
        envelope_id = str(uuid.uuid4())
        await self._send(
            {
                "envelope_id": envelope_id,
                "payload": payload,
                "type": "events_api",
                "accepts_response_payload": False,
                "retry_attempt": attempt,
                "retry_reason": reason,
            }
        )
        return envelope_id

    async def _resend_unacked(self, payload: dict[str, Any], envelope_id: str) -> None:
        """Send ``payload`` again while its latest envelope is not acked in time."""
        for attempt in range(1, self.max_retries + 1):
            try:
                await self.wait_for_ack(envelope_id, self.retry_after or 0.0)
                return
            except TimeoutError:
                pass
            self.retried.append((payload["event_id"], attempt))
            try:
                envelope_id = await self._send_event(payload, attempt, "timeout")
            except TimeoutError:  # no live connection for a minute: Slack gives up too
                return

    async def request_refresh(self) -> None:
        """Ask the client to reconnect, as Slack does periodically."""
        await self._send(
            {
                "type": "disconnect",
                "reason": "refresh_requested",
                "debug_info": {"host": "fakeslack"},
            }
        )

    async def drop_socket(self, *, abort: bool = True) -> None:
        """Kill the current websocket: ``abort`` resets the TCP connection (the client
        notices on its next ping, every ``ping_interval`` s); ``abort=False`` sends a close
        frame (1011) instead, which the client answers by reconnecting at once."""
        ws = self._live_ws()
        if ws is None:
            return
        transport = self._transports.get(ws)
        if abort and transport is not None:
            transport.abort()
        else:
            await ws.close(code=1011, message=b"fakeslack drop")
        self._notify()

    async def _socket(self, request: web.Request) -> web.StreamResponse:
        ticket = request.query.get("ticket", "")
        if ticket not in self._tickets:
            return web.Response(status=401, text="invalid ticket")
        self._tickets.discard(ticket)
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        self._sockets.add(ws)
        if request.transport is not None:
            self._transports[ws] = request.transport
        self._ws = ws
        self.socket_connections += 1
        hello = {
            "type": "hello",
            "num_connections": len([s for s in self._sockets if not s.closed]),
            "debug_info": {
                "host": "fakeslack",
                "build_number": 1,
                "approximate_connection_time": 18060,
            },
            "connection_info": {"app_id": self.app_id},
        }
        self.sent.append(hello)
        await ws.send_str(json.dumps(hello))
        self._notify()
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    continue
                try:
                    data = json.loads(msg.data)
                except ValueError:
                    continue
                if isinstance(data, dict) and data.get("envelope_id"):
                    self.acks[data["envelope_id"]] = data
                    self._notify()
        finally:
            self._sockets.discard(ws)
            self._transports.pop(ws, None)
            self._notify()
        return ws

    # ----------------------------------------------------------------- Web API

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        if request.transport is not None:
            self.api_connections.add(tuple(request.transport.get_extra_info("peername")))
        params: dict[str, Any] = dict(request.query)
        if request.method == "POST" and request.can_read_body:
            ctype = request.content_type
            if ctype == "application/json":
                try:
                    body = await request.json()
                except ValueError:
                    return self._error(method, params, "invalid_json")
                if isinstance(body, dict):
                    params.update(body)
            elif ctype in ("application/x-www-form-urlencoded", "multipart/form-data"):
                form = await request.post()
                params.update({k: v for k, v in form.items() if isinstance(v, str)})
        body_token = params.pop("token", None)
        auth = request.headers.get("Authorization", "")
        token = auth[7:].strip() if auth.startswith("Bearer ") else body_token
        self.calls.append((method, params))
        self._notify()

        limit = self._rate_limits.get(method)
        if limit and limit[0] > 0:
            limit[0] -= 1
            return web.json_response(
                {"ok": False, "error": "ratelimited"},
                status=429,
                headers={"Retry-After": str(limit[1])},
            )

        handler = getattr(self, "_m_" + method.replace(".", "_"), None)
        if handler is None or (method in _STREAM_METHODS and not self.supports_streaming):
            return self._error(method, params, "unknown_method", req_method=method)
        if method == "api.test":
            return web.json_response({"ok": True, "args": params})
        if not token:
            return self._error(method, params, "not_authed")
        if token not in (self.bot_token, self.app_token):
            return self._error(method, params, "invalid_auth")
        wants_app_token = method == "apps.connections.open"
        if (token == self.app_token) != wants_app_token:
            return self._error(method, params, "not_allowed_token_type")
        result = handler(params)
        if self._holds.get(method):
            self._holds[method] -= 1
            self.held.append(method)
            self._notify()
            await self._released.wait()
        if isinstance(result, str):
            if result == "missing_scope":
                needed = _NEEDS.get(method, "")
                return self._error(method, params, result, needed=needed,
                                   provided=",".join(sorted(self.scopes)))  # fmt: skip
            return self._error(method, params, result)
        return web.json_response({"ok": True, **result}, headers=self._scope_headers())

    def _scope_headers(self) -> dict[str, str]:
        return {"x-oauth-scopes": ",".join(sorted(self.scopes))}

    def _error(self, method: str, params: dict[str, Any], error: str, **extra: Any) -> web.Response:
        # Slack answers most errors with HTTP 200 and ok=false.
        return web.json_response(
            {"ok": False, "error": error, **extra}, headers=self._scope_headers()
        )

    def _channel_type(self, channel: str) -> str:
        info = self.channels.get(channel)
        if info is not None:
            if info.get("is_im"):
                return "im"
            if info.get("is_mpim"):
                return "mpim"
            return "group" if info.get("is_private") else "channel"
        return {"D": "im", "G": "group"}.get(channel[:1], "channel")

    def _bot_message(self, text: str, ts: str, **fields: Any) -> dict[str, Any]:
        msg = {
            "type": "message",
            "user": self.bot_user_id,
            "bot_id": self.bot_id,
            "app_id": self.app_id,
            "text": text,
            "ts": ts,
            "team": self.team_id,
            "bot_profile": {
                "id": self.bot_id,
                "app_id": self.app_id,
                "name": "bot",
                "deleted": False,
                "team_id": self.team_id,
            },
        }
        msg.update({k: v for k, v in fields.items() if v is not None})
        return msg

    # Handlers return the response fields (without "ok") or an error string.

    def _m_api_test(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"args": params}  # answered before the token checks

    def _m_auth_test(self, params: dict[str, Any]) -> dict[str, Any]:
        return {
            "url": f"https://{self.team_domain}.slack.com/",
            "team": "Fake Team",
            "user": "bot",
            "team_id": self.team_id,
            "user_id": self.bot_user_id,
            "bot_id": self.bot_id,
            "is_enterprise_install": False,
        }

    def _m_apps_connections_open(self, params: dict[str, Any]) -> dict[str, Any]:
        ticket = uuid.uuid4().hex
        self._tickets.add(ticket)
        return {"url": f"{self.socket_url}?ticket={ticket}&app_id={self.app_id}"}

    def _m_chat_postMessage(self, params: dict[str, Any]) -> dict[str, Any] | str:
        channel = params.get("channel")
        if not channel:
            return "channel_not_found"
        text = params.get("text") or params.get("markdown_text") or ""
        blocks = _maybe_json(params.get("blocks"))
        if (error := _check_limits(text, blocks)) is not None:
            return error
        if not text and not blocks and not params.get("attachments"):
            return "no_text"
        custom = {k: params[k] for k in ("username", "icon_url", "icon_emoji") if params.get(k)}
        if custom and "chat:write.customize" not in self.scopes:
            return "missing_scope"  # (as Slack: a customised author needs the scope)
        icons = None
        if custom.get("icon_emoji"):  # (icon_emoji overrides icon_url, as Slack documents)
            icons = {"emoji": custom["icon_emoji"]}
        elif custom.get("icon_url"):
            icons = {"image_48": custom["icon_url"]}
        ts = self.new_ts()
        msg = self._bot_message(text, ts, thread_ts=params.get("thread_ts"), blocks=blocks,
                                username=params.get("username"), icons=icons)  # fmt: skip
        if params.get("metadata"):
            msg["metadata"] = _maybe_json(params["metadata"])
        self.messages[(channel, ts)] = msg
        return {"channel": channel, "ts": ts, "message": msg}

    def _m_chat_update(self, params: dict[str, Any]) -> dict[str, Any] | str:
        channel, ts = params.get("channel"), params.get("ts")
        msg = self.messages.get((channel, ts))  # type: ignore[arg-type]
        if msg is None:
            return "message_not_found"
        if msg.get("user") != self.bot_user_id:
            return "cant_update_message"
        error = _check_limits(params.get("text") or "", _maybe_json(params.get("blocks")))
        if error is not None:
            return error
        if "text" in params or "markdown_text" in params:
            msg["text"] = params.get("text") or params.get("markdown_text") or ""
        if params.get("blocks") is not None:
            msg["blocks"] = _maybe_json(params["blocks"])
        msg["edited"] = {"user": self.bot_user_id, "ts": self.new_ts()}
        return {"channel": channel, "ts": ts, "text": msg["text"], "message": msg}

    def _m_chat_delete(self, params: dict[str, Any]) -> dict[str, Any] | str:
        channel, ts = params.get("channel"), params.get("ts")
        if self.messages.pop((channel, ts), None) is None:  # type: ignore[arg-type]
            return "message_not_found"
        return {"channel": channel, "ts": ts}

    def _m_chat_startStream(self, params: dict[str, Any]) -> dict[str, Any] | str:
        channel, thread_ts = params.get("channel"), params.get("thread_ts")
        if not channel:
            return "channel_not_found"
        if not thread_ts:
            return "invalid_arguments"
        ts = self.new_ts()
        self.messages[(channel, ts)] = self._bot_message(
            _chunks_text(params), ts, thread_ts=thread_ts
        )
        self._streaming.add((channel, ts))
        return {"channel": channel, "ts": ts}

    def _streamed(self, params: dict[str, Any]) -> tuple[str, str, dict[str, Any]] | str:
        channel, ts = params.get("channel") or "", params.get("ts") or ""
        msg = self.messages.get((channel, ts))
        if msg is None:
            return "message_not_found"
        if (channel, ts) not in self._streaming:
            return "message_not_in_streaming_state"
        msg["text"] += _chunks_text(params)
        return channel, ts, msg

    def _m_chat_appendStream(self, params: dict[str, Any]) -> dict[str, Any] | str:
        found = self._streamed(params)
        if isinstance(found, str):
            return found
        channel, ts, _ = found
        return {"channel": channel, "ts": ts}

    def _m_chat_stopStream(self, params: dict[str, Any]) -> dict[str, Any] | str:
        found = self._streamed(params)
        if isinstance(found, str):
            return found
        channel, ts, msg = found
        self._streaming.discard((channel, ts))
        if params.get("blocks") is not None:
            msg["blocks"] = _maybe_json(params["blocks"])
        if params.get("metadata") is not None:
            msg["metadata"] = _maybe_json(params["metadata"])
        return {"channel": channel, "ts": ts, "message": msg}

    # assistant.threads.*: channel_id and thread_ts name the thread (a thread of a DM).

    def _m_assistant_threads_setStatus(self, params: dict[str, Any]) -> dict[str, Any] | str:
        if not params.get("channel_id") or not params.get("thread_ts"):
            return "invalid_arguments"
        if "status" not in params:  # required; "" clears it
            return "invalid_arguments"
        return {}

    def _m_assistant_threads_setTitle(self, params: dict[str, Any]) -> dict[str, Any] | str:
        if not params.get("channel_id") or not params.get("thread_ts"):
            return "invalid_arguments"
        if not params.get("title"):
            return "invalid_arguments"
        return {}

    def _m_assistant_threads_setSuggestedPrompts(
        self, params: dict[str, Any]
    ) -> dict[str, Any] | str:
        if not params.get("channel_id") or not params.get("thread_ts"):
            return "invalid_arguments"
        prompts = _maybe_json(params.get("prompts"))
        if not isinstance(prompts, list) or not 1 <= len(prompts) <= 4:
            return "invalid_arguments"
        for prompt in prompts:
            if not isinstance(prompt, dict) or set(prompt) != {"title", "message"}:
                return "invalid_arguments"
            if not all(isinstance(v, str) and v for v in prompt.values()):
                return "invalid_arguments"
        params["prompts"] = prompts
        return {}

    def _m_users_info(self, params: dict[str, Any]) -> dict[str, Any] | str:
        user = self.users.get(params.get("user") or "")
        return {"user": user} if user is not None else "user_not_found"

    def _thread(self, channel: str, ts: str) -> list[dict[str, Any]]:
        found = [
            m
            for (ch, mts), m in self.messages.items()
            if ch == channel and (mts == ts or m.get("thread_ts") == ts)
        ]
        return sorted(found, key=lambda m: float(m["ts"]))

    @staticmethod
    def _listed(messages: list[dict[str, Any]], params: dict[str, Any]) -> list[dict[str, Any]]:
        """``messages`` as a history method returns them: their metadata only with
        ``include_all_metadata``."""
        if str(params.get("include_all_metadata", "")).lower() not in ("1", "true"):
            messages = [{k: v for k, v in m.items() if k != "metadata"} for m in messages]
        return messages

    def _m_conversations_replies(self, params: dict[str, Any]) -> dict[str, Any] | str:
        channel, ts = params.get("channel") or "", params.get("ts") or ""
        messages = self._thread(channel, ts)
        if not messages:
            return "thread_not_found"
        messages = self._listed(messages, params)
        limit = int(params.get("limit") or 1000)
        return {
            "messages": messages[:limit],
            "has_more": len(messages) > limit,
            "response_metadata": {"next_cursor": ""},
        }

    def _m_conversations_history(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = params.get("channel") or ""
        top = [
            m
            for (ch, mts), m in self.messages.items()
            if ch == channel and m.get("thread_ts") in (None, mts)
        ]
        top.sort(key=lambda m: float(m["ts"]), reverse=True)
        top = self._listed(top, params)
        limit = int(params.get("limit") or 100)
        return {
            "messages": top[:limit],
            "has_more": len(top) > limit,
            "response_metadata": {"next_cursor": ""},
        }

    def _m_conversations_info(self, params: dict[str, Any]) -> dict[str, Any] | str:
        channel = params.get("channel") or ""
        if not channel:
            return "channel_not_found"
        info = self.channels.get(channel)
        if info is None:
            kind = self._channel_type(channel)
            info = {
                "id": channel,
                "name": channel.lower(),
                "is_channel": kind == "channel",
                "is_group": kind == "group",
                "is_im": kind == "im",
                "is_mpim": kind == "mpim",
                "is_private": kind in ("group", "im", "mpim"),
                "is_member": True,
                "is_archived": False,
                "context_team_id": self.team_id,
            }
            if kind == "im":
                info["user"] = "U1"
        return {"channel": info}

    def _m_reactions_add(self, params: dict[str, Any]) -> dict[str, Any] | str:
        name = params.get("name") or ""
        msg = self.messages.get((params.get("channel") or "", params.get("timestamp") or ""))
        if not name:
            return "invalid_name"
        if msg is None:
            return "message_not_found"
        reactions = msg.setdefault("reactions", [])
        for reaction in reactions:
            if reaction["name"] == name:
                if self.bot_user_id in reaction["users"]:
                    return "already_reacted"
                reaction["users"].append(self.bot_user_id)
                reaction["count"] += 1
                return {}
        reactions.append({"name": name, "users": [self.bot_user_id], "count": 1})
        return {}

    def _m_reactions_remove(self, params: dict[str, Any]) -> dict[str, Any] | str:
        name = params.get("name") or ""
        msg = self.messages.get((params.get("channel") or "", params.get("timestamp") or ""))
        if msg is None:
            return "message_not_found"
        for reaction in msg.get("reactions", []):
            if reaction["name"] == name and self.bot_user_id in reaction["users"]:
                reaction["users"].remove(self.bot_user_id)
                reaction["count"] -= 1
                if not reaction["count"]:
                    msg["reactions"].remove(reaction)
                return {}
        return "no_reaction"


#: The scopes of the fake's bot token by default: those of agentik's app manifest.
BOT_SCOPES = (
    "app_mentions:read", "assistant:write", "channels:history", "groups:history",
    "im:history", "mpim:history", "chat:write", "chat:write.customize", "files:read",
    "reactions:read", "users:read",
)  # fmt: skip
#: The scope a method refused with ``missing_scope`` names as ``needed``.
_NEEDS = {"chat.postMessage": "chat:write.customize"}

#: Slack's documented limits: ``text`` of chat.postMessage/chat.update (longer is
#: refused with ``msg_too_long``), a message's blocks, a section block's text.
MAX_TEXT = 40_000
MAX_BLOCKS = 50
MAX_SECTION_TEXT = 3000


def _check_limits(text: str, blocks: Any) -> str | None:
    """The error Slack answers a message over its limits with, else ``None``."""
    if len(text) > MAX_TEXT:
        return "msg_too_long"
    if isinstance(blocks, list):
        if len(blocks) > MAX_BLOCKS:
            return "invalid_blocks"
        for block in blocks:
            if not isinstance(block, dict):
                return "invalid_blocks"
            if block.get("type") == "section":
                inner = block.get("text") or {}
                if len(inner.get("text") or "") > MAX_SECTION_TEXT:
                    return "invalid_blocks"
            if block.get("type") == "input" and not _input_ok(block):
                return "invalid_blocks"
    return None


def _input_ok(block: dict[str, Any]) -> bool:
    """An ``input`` block within Block Kit's documented limits: a ``plain_text``
    label of at most 2000 characters, a block id of at most 255; a
    ``plain_text_input`` with ``max_length`` at most 3000, a ``static_select`` of
    1 to 100 options, each ``plain_text`` of at most 75 characters with a value of
    at most 150."""
    label, el = block.get("label") or {}, block.get("element") or {}
    if label.get("type") != "plain_text" or not 0 < len(label.get("text") or "") <= 2000:
        return False
    if len(block.get("block_id") or "") > 255 or not el.get("action_id"):
        return False
    if el.get("type") == "plain_text_input":
        return int(el.get("max_length", 3000)) <= 3000
    if el.get("type") == "static_select":
        options = el.get("options") or []
        return 0 < len(options) <= 100 and all(
            o["text"]["type"] == "plain_text" and len(o["text"]["text"]) <= 75
            and len(o["value"]) <= 150 for o in options
        )  # fmt: skip
    return False


def _rich_text(text: str) -> dict[str, Any]:
    return {
        "type": "rich_text",
        "block_id": uuid.uuid4().hex[:5],
        "elements": [{"type": "rich_text_section", "elements": [{"type": "text", "text": text}]}],
    }
