"""The webhook transport: messages arrive as HTTP POSTs, answers leave as HTTP POSTs.

Incoming: ``POST http://<host>:<port><path>`` with a JSON object::

    {"user": "alice", "text": "agentik: what time is it?", "channel": "ops",
     "thread": "42", "name": "Alice", "id": "msg-1001"}

``user`` and ``text`` are required.  Without ``channel`` it is a private
message (always answered); in a ``channel`` (optionally a ``thread`` in it)
the bot answers when addressed — the text starts with ``@agentik``,
``agentik:`` or ``agentik,`` (``bot_name``) — or for a chat command
(``!help``).  ``name`` is the speaker's display name (default: ``user``);
``id``, when given, makes retries safe: a repeated id is acknowledged and not
handled again.  The answer is ``202 Accepted`` once the message is stored;
``400`` names the bad field, ``401`` means a bad signature, ``413`` a body
over ``max_body_bytes``.  Send one message at a time (wait for the 202) and
they are answered in that order.

Outgoing: every answer, notice and command reply is ``POST``\\ ed to
``callback_url`` as::

    {"seq": 7, "kind": "answer", "text": "...", "channel": "ops", "thread": "42",
     "user": null, "direct": false, "run_id": "run_..."}

(``user`` is set for private messages).  ``seq`` counts up from 1 per start,
so the receiver can see the order and any gap.  One message at a time, in
order; a connection error, a 429 or a 5xx is retried ``retries`` times with
doubling delays, another 4xx gives up on that message (logged).  Long
answers are split to ``max_chars`` by the bridge.

With a ``secret``, both directions are signed (see :mod:`.signing`); an
unsigned or badly signed request is refused.

Channel keys: ``webhook:<instance>:#<channel>``,
``webhook:<instance>:#<channel>:<thread>`` and ``webhook:<instance>:@<user>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from agentik.transports.base import (
    ChannelCaps,
    IncomingMessage,
    MessageSink,
    OutgoingMessage,
    Transport,
)

from .signing import sign, verify

if TYPE_CHECKING:
    from aiohttp import ClientSession, web

# aiohttp is imported when a webhook transport starts, not with the plugin: agentik loads
# every installed plugin at start-up, and a bot that configures no webhook transport
# should not pay for a web framework (about 11 MB and 0.1 s).  A plugin's entry point is
# best kept this light.

__all__ = ["WebhookSettings", "WebhookTransport"]

log = logging.getLogger(__name__)

_FIELDS = ("user", "text", "channel", "thread", "name", "id")


class WebhookSettings(BaseModel):
    """Keys of a ``type = "webhook"`` transport table."""

    model_config = ConfigDict(extra="forbid")

    #: Where incoming messages are POSTed: ``http://host:port/path`` (port 0: any free port).
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    path: str = "/webhook"
    #: Where answers are POSTed.
    callback_url: str
    #: Shared secret: sign answers and require signed requests (HMAC-SHA256).
    secret: SecretStr | None = None
    #: How people address the bot in a channel (``@agentik``, ``agentik:``).
    bot_name: str = "agentik"
    #: Longest answer message the receiving side takes, in characters.
    max_chars: int = Field(4000, ge=100)
    #: Longest request body accepted, in bytes.
    max_body_bytes: int = Field(65_536, ge=1024)
    #: Seconds a signed request's timestamp may be away from now.
    max_skew: float = Field(300.0, gt=0)
    #: Seconds per callback POST; retries of a failed one, and the first delay (doubling).
    timeout: float = Field(10.0, gt=0)
    retries: int = Field(3, ge=0)
    retry_delay: float = Field(0.5, gt=0)

    @field_validator("callback_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not re.match(r"^https?://[^/\s]+", value):
            raise ValueError("must be an http:// or https:// URL")
        return value

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must start with '/'")
        return value


class _BadRequest(Exception):
    """A request we refuse; ``str(exc)`` says why (it goes back to the sender)."""


class WebhookTransport(Transport):
    """The webhook transport (see the module docstring)."""

    type = "webhook"
    default_command_prefix = "!"
    settings_model = WebhookSettings
    options: WebhookSettings

    def __init__(self, *, name: str, settings: dict[str, Any] | None = None) -> None:
        super().__init__(name=name, settings=settings)
        o = self.options
        # Webhooks cannot edit what they sent: whole messages, at the end of a turn.
        self.caps = ChannelCaps(max_chars=o.max_chars, formatting="markdown", streaming="message")
        self.port: int | None = None
        name_re = re.escape(o.bot_name)
        self._address = re.compile(rf"^\s*(?:@{name_re}\b[:,]?|{name_re}\s*[:,])\s*", re.I)
        self._sink: MessageSink | None = None
        self._runner: web.AppRunner | None = None
        self._session: ClientSession | None = None
        self._outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._seq = 0
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._closing = False

    @property
    def url(self) -> str:
        """Where to POST messages (once started)."""
        return f"http://{self.options.host}:{self.port}{self.options.path}"

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self, sink: MessageSink) -> None:
        self._sink = sink
        o = self.options
        from aiohttp import ClientSession, ClientTimeout, web

        self._session = ClientSession(timeout=ClientTimeout(total=o.timeout))
        app = web.Application(client_max_size=o.max_body_bytes)
        app.router.add_post(o.path, self._incoming)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, o.host, o.port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            await self._session.close()
            from agentik.core.errors import ConfigError

            raise ConfigError(
                f"transports.{self.name}.port: cannot listen on {o.host}:{o.port}: {exc}"
            ) from None
        self.port = self._runner.addresses[0][1]
        self.spawn(self._deliver(), name=f"agentik-webhook:{self.name}")
        # Only the callback's origin: its path may carry a token (chat webhook URLs do).
        origin = re.match(r"^https?://[^/?#]+", o.callback_url)
        log.info("webhook %s: listening on %s; answers go to %s/...", self.name, self.url,
                 origin.group(0) if origin else "?")  # fmt: skip

    async def aclose(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self._runner is not None:
            await self._runner.cleanup()  # no new messages
        # Answers already handed to us still go out, for up to one timeout.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.options.timeout):
                await self._outbox.join()
        await self.cancel_tasks()
        if self._session is not None:
            await self._session.close()
        self.closed.set()

    # -- incoming ------------------------------------------------------------------------
    async def _incoming(self, request: web.Request) -> web.Response:
        from aiohttp import web

        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"the body is over {self.options.max_body_bytes} bytes")
        secret = self.options.secret
        if secret is not None:
            why = verify(
                secret.get_secret_value(), body, request.headers, max_skew=self.options.max_skew
            )
            if why is not None:
                log.warning("webhook %s: refused a request: %s", self.name, why)
                return _error(401, why)
        try:
            message = self._parse(body)
        except _BadRequest as exc:
            return _error(400, str(exc))
        if message is None:
            return web.json_response({"ok": True, "duplicate": True})
        assert self._sink is not None
        # The bridge stores the message before it returns: a 202 means it is kept.
        await self._sink.handle(message, self)
        return web.json_response({"ok": True}, status=202)

    def _parse(self, body: bytes) -> IncomingMessage | None:
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise _BadRequest("the body is not JSON") from None
        if not isinstance(data, dict):
            raise _BadRequest("the body must be a JSON object")
        unknown = sorted(set(data) - set(_FIELDS))
        if unknown:
            raise _BadRequest(f"{unknown[0]}: unknown field")
        for key in _FIELDS:
            value = data.get(key)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise _BadRequest(f"{key}: must be a non-empty string")
        for key in ("user", "text"):
            if data.get(key) is None:
                raise _BadRequest(f"{key}: required")
        user, text = data["user"], data["text"]
        channel, thread = data.get("channel"), data.get("thread")
        if channel is not None and ":" in channel:
            raise _BadRequest("channel: must not contain ':'")
        if thread is not None and channel is None:
            raise _BadRequest("thread: needs a channel")
        if data.get("id") is not None and self._duplicate(f"{user}\0{data['id']}"):
            return None
        direct = channel is None
        addressed = direct
        match = self._address.match(text)
        if match and not direct:
            text, addressed = text[match.end() :], True
        if direct:
            key = f"webhook:{self.name}:@{user}"
        else:
            key = f"webhook:{self.name}:#{channel}" + (f":{thread}" if thread else "")
        return IncomingMessage(
            channel_key=key,
            text=text,
            author_id=user,
            author_name=data.get("name") or user,
            direct=direct,
            addressed=addressed,
            reply_to={"channel": channel, "thread": thread, "user": user if direct else None},
        )

    def _duplicate(self, key: str) -> bool:
        if key in self._seen:
            return True
        self._seen[key] = None
        while len(self._seen) > 10_000:
            self._seen.popitem(last=False)
        return False

    # -- outgoing ------------------------------------------------------------------------
    async def send(self, message: OutgoingMessage) -> None:
        if message.kind in ("delta", "end"):
            return  # we send whole messages (streaming = "message")
        if self.closed.is_set():
            log.warning("webhook %s: closed; a %s was not sent", self.name, message.kind)
            return
        where = message.reply_to if isinstance(message.reply_to, dict) else {}
        self._seq += 1
        self._outbox.put_nowait(
            {
                "seq": self._seq,
                "kind": message.kind,
                "text": message.text,
                "channel": where.get("channel"),
                "thread": where.get("thread"),
                "user": where.get("user"),
                "direct": where.get("channel") is None,
                "run_id": message.run_id,
            }
        )

    async def _deliver(self) -> None:
        """POST the outbox to the callback URL, one message at a time, in order."""
        while True:
            payload = await self._outbox.get()
            try:
                await self._post(payload)
            finally:
                self._outbox.task_done()

    async def _post(self, payload: dict[str, Any]) -> None:
        o = self.options
        assert self._session is not None
        body = json.dumps(payload, ensure_ascii=False).encode()
        headers = {"Content-Type": "application/json"}
        if o.secret is not None:
            headers.update(sign(o.secret.get_secret_value(), body))
        delay = o.retry_delay
        from aiohttp import ClientError

        for attempt in range(o.retries + 1):
            try:
                async with self._session.post(o.callback_url, data=body, headers=headers) as resp:
                    if resp.status < 300:
                        return
                    problem = f"HTTP {resp.status}"
                    if 400 <= resp.status < 500 and resp.status != 429:
                        break  # the receiver refuses it: retrying will not help
            except (ClientError, TimeoutError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            if attempt < o.retries:
                log.info("webhook %s: callback failed (%s); retrying in %.1fs", self.name,
                         problem, delay)  # fmt: skip
                await asyncio.sleep(delay)
                delay *= 2
        log.error(
            "webhook %s: could not deliver message %d (%s) to the callback URL: %s",
            self.name, payload["seq"], payload["kind"], problem,
        )  # fmt: skip


def _error(status: int, why: str) -> web.Response:
    from aiohttp import web

    return web.json_response({"ok": False, "error": why}, status=status)
