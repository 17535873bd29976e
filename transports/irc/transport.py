"""The IRC transport: one connection to one IRC network, on irc3.

irc3 provides the asyncio protocol, the bot object that writes lines and
the event dispatch (our handler is an ``irc3.event``).  Everything that
decides how a serious bot behaves on a real network is here:

* registration with IRCv3 ``CAP LS 302`` (``sasl``, ``message-tags``,
  ``server-time``, ``account-tag``, ``echo-message``, ``batch`` when
  offered), our own SASL PLAIN/EXTERNAL (AUTHENTICATE split at 400 bytes,
  903-907 handled, a rejected login stops the transport with a clear error;
  configured SASL the server does not offer holds registration until
  ``CAP NEW sasl`` or ``sasl_wait``, then reconnects), NickServ IDENTIFY as
  a fallback (again once the nick is ours), alternate nicks on 433/432/437,
  services recovery of a taken nick (``nickserv_recover``: ``GHOST``,
  ``REGAIN``, ``RECOVER`` in turn, the password only when not logged in, never
  logged) and regaining the nick when its holder leaves, user mode from
  ISUPPORT ``BOT``;
* when to answer: always in private messages (a PRIVMSG to our own nick);
  in channels we are in when addressed (``nick:``/``nick,`` or, in
  ``mention`` mode, the nick anywhere) or for a command; never a NOTICE, our
  own echo, a sender tagged ``bot``, a server (a source that is not
  ``nick!user@host``), a server or host mask (``$*``), a STATUSMSG target
  (``@#chan``: meant for the channel's operators only) or a nick we could not
  write back to; CTCP VERSION and PING answered by NOTICE, ACTION taken as
  text (CTCP replies within the sender's rate limit and 10 a minute in all);
  a per-user incoming rate limit (a user: their account, else ``ident@host``)
  answered once with a notice (10 such notices a minute in all);
* identity: the IRCv3 ``account`` tag (``account-tag``) is a verified
  identity; without account-tag, the account tracked for users sharing a
  channel (``extended-join``, ``account-notify``, WHOX on join; only with
  account-notify, which reports logouts) is one too; a nick without either
  is not (``unverified_identity``); nicks,
  channels and accounts are compared casefolded per ISUPPORT ``CASEMAPPING``;
* output: control characters other than formatting codes (``\x01``: CTCP)
  never leave from message text; in channels each answer starts with the
  asker's nick (``address_asker``); Markdown turned into IRC formatting,
  lines split on UTF-8 and word boundaries to fit 512 bytes once the server
  adds our ``:nick!user@host`` prefix (learnt from our JOIN echo, followed
  through a cloak's 396 and ``CHGHOST``; ISUPPORT
  ``LINELEN`` honoured), a token bucket per connection (longer lines cost
  more) shared round robin between targets (a queue per channel or nick,
  capped), nothing dropped silently;
* reconnect with exponential backoff and jitter after a ping timeout or a
  lost connection, rejoin, and deliver what was queued meanwhile in order;
* connecting: each attempt, its outcome and the reason of a failure logged
  (a TLS handshake against a plain-text port suggests ``tls = false``);
* shutdown: QUIT, no reconnect, no task left, nothing logged as critical.

irc3 patches ``asyncio.sleep``/``asyncio.wait`` when imported, so it is only
imported when an IRC transport starts; its logging setup is neutralised.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import logging
import random
import re
import ssl
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentik.core.canonical import Canonical
from agentik.core.errors import ConfigError
from agentik.transports.base import (
    AgentHost,
    ChannelCaps,
    IncomingMessage,
    MessageSink,
    OutgoingMessage,
    Transport,
    TransportFailed,
    host_of,
)

from .settings import IRCSettings
from .wire import (
    KNOWN_MAPPINGS,
    Line,
    casefold,
    clean_outgoing,
    ctcp,
    ctcp_parse,
    format_line,
    markdown_to_irc,
    parse_line,
    payload_budget,
    split_message,
    strip_formatting,
    valid_target,
)

__all__ = ["IRCTransport"]

log = logging.getLogger(__name__)

WANTED_CAPS = (
    "sasl",
    "message-tags",
    "server-time",
    "account-tag",
    "echo-message",
    "batch",
    "draft/multiline",
    "draft/relaymsg",
    "multi-prefix",
    "cap-notify",
    "extended-join",
    "account-notify",
    "chghost",
)
#: The WHOX token of our ``WHO #chan %tcna,<token>`` queries (up to 3 digits).
_WHOX_TOKEN = "616"
#: OpenSSL's reasons for a handshake that got something other than TLS back.
_PLAINTEXT_REASONS = frozenset(
    {"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG",
     "UNKNOWN_PROTOCOL", "HTTP_REQUEST", "WRONG_SSL_VERSION"}
)  # fmt: skip
_PLAINTEXT_HINT = (
    "; the server answers in plain text on this port: set tls = false"
    " (or use its TLS port, usually 6697)"
)
#: draft/relaymsg: what a relayed nick may not hold (the spec's reserved characters,
#: blanks and control codes).
_RELAY_RESERVED = re.compile(r"[!+%@&#$:'\"?*,.\s\x00-\x1f\x7f]")
#: Bytes left for the ident@host the server gives a relayed nick (its own choice).
_RELAY_HOST_SLACK = 40

#: Longest line we accept from a server before dropping it (tags + 512).
MAX_INCOMING = 8191 + 512
_SASL_CHUNK = 400
#: Seconds NickServ gets to answer one recovery command before we stop asking.
_RECOVER_WAIT = 30.0
#: Services' answers to a command they do not offer (Atheme, Anope, others): try the next.
_UNKNOWN_COMMAND = ("unknown command", "invalid command", "no such command",
                    "not a valid command", "isn't a valid command", "is disabled")  # fmt: skip
#: Services' answers refusing the recovery (a wrong password, no such account): stop asking.
_REFUSED = ("password", "not registered", "not a registered", "isn't registered", "denied",
            "not allowed", "frozen", "you cannot", "you may not", "not logged in",
            "must identify", "must be identified", "not online", "not in use",
            "isn't currently in use")  # fmt: skip
#: Channel members one answer may name (highlight); later ones are defused.
_HIGHLIGHT_LIMIT = 5
#: A word that could be a nick (RFC 2812 letters, digits and specials).
_NICK_WORD_RE = re.compile(r"(?<![\w\[\]\\`^{}|-])[A-Za-z\[\]\\`_^{|}][\w\[\]\\`^{|}-]*")
#: CTCP replies (VERSION, PING, TIME) sent per minute at most, all senders together.
_CTCP_PER_MINUTE = 10


def _within(times: deque[float], per_minute: int) -> bool:
    """Whether one more event fits ``per_minute`` (a sliding minute); if so, count it."""
    now = time.monotonic()
    while times and now - times[0] > 60:
        times.popleft()
    if len(times) >= per_minute:
        return False
    times.append(now)
    return True


class _CannotConnect(Exception):
    """A connection attempt failed; the message says why, for the log."""


def _describe(exc: BaseException) -> str:
    """``Type: message`` (just ``Type`` when the message is empty)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass(slots=True)
class _Out:
    target: str
    line: str
    cost: float
    #: Outbox rows completed by writing this line (its last piece).
    outbox_ids: tuple[int, ...] = ()
    #: ``(target, text)`` of a PRIVMSG/NOTICE the server echoes (echo-message); for
    #: a draft/multiline batch, its lines joined by ``\n``.
    echo: tuple[str, str] | None = None
    #: Order of queueing, over all targets.
    seq: int = 0


def _irc3() -> tuple[Any, type, type]:
    """Import irc3 lazily and build our subclasses of its bot and protocol."""
    import irc3

    class Connection(irc3.IrcConnection):
        """Bytes-level line splitting: tolerant of bare LF, invalid UTF-8 and garbage."""

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self.pending = b""

        def data_received(self, data: bytes) -> None:
            buf = self.pending + data
            *lines, self.pending = buf.split(b"\n")
            if len(self.pending) > MAX_INCOMING:
                self.pending = b""  # an endless line: drop it rather than grow
            for raw in lines:
                self.factory.owner._on_bytes(raw[:MAX_INCOMING])

        def connection_lost(self, exc: BaseException | None) -> None:
            self.closed = True
            self.factory.owner._on_lost(self, exc)

        def close(self) -> None:
            # irc3's close() logs every hang-up at CRITICAL ("closing old
            # transport"), a normal shutdown included; ours are ordinary.
            if not self.closed:
                self.closed = True
                self.transport.close()

    class Bot(irc3.IrcBot):
        # irc3 reconfigures logging in every IrcBot(); keep ours.
        logging_config = {"version": 1, "incremental": True}

    return irc3, Connection, Bot


class IRCTransport(Transport):
    """One IRC network (see the module docstring)."""

    type = "irc"
    default_command_prefix = "!"
    # Long answers flood a channel line by line: cap them, the rest via !more.
    default_max_answer_lines = 4
    settings_model = IRCSettings
    outbox = True
    relays = True
    # connecting / registered / lost, reported as they happen.
    reports_health = True
    options: IRCSettings

    @property
    def exclusive(self) -> bool:
        """One connection to the network: one worker at a time owns it."""
        return True

    def __init__(self, *, name: str, settings: dict[str, Any] | None = None) -> None:
        super().__init__(name=name, settings=settings)
        self.network = self.options.network or name
        # The bridge splits roughly; we re-split each line to the exact budget.
        self.caps = ChannelCaps(max_bytes=512 - 112, formatting="irc", streaming="lines")
        self.nick = self.options.nick
        self.user: str | None = None
        self.host: str | None = None
        self.linelen = 512
        self.registered = asyncio.Event()
        self.failed: str | None = None
        self.isupport: dict[str, str] = {}
        #: The server's name (the source of its 001): its PRIVMSGs are never answered.
        self.caps_enabled: set[str] = set()
        #: The channels this transport is in, casefolded (see :meth:`wait_joined`).
        self.joined: set[str] = set()
        self._sink: MessageSink | None = None
        self._host: AgentHost | None = None
        #: Per channel key, the hand-over of its last message still on its way (its
        #: image links being fetched): the next one waits for it, so that the bridge
        #: takes a channel's messages in the order they were said.
        self._handing: dict[str, asyncio.Future[None]] = {}
        self._bot: Any = None
        self._protocol: Any = None
        self._closing = False
        self._connected_at = 0.0
        self._attempt = 0
        #: The connection and send loops (``serve`` raises what breaks one of them).
        self._main: list[asyncio.Future[Any]] = []
        self._lost = asyncio.Event()
        #: Lines waiting, one FIFO per target (casefolded); the dict's order is the
        #: round robin: a target that just sent goes to the back.
        self._queues: dict[str, deque[_Out]] = {}
        self._queued = 0
        self._seq = 0
        #: Per target: when a dropped line was last logged, and drops since then.
        self._drop_log: dict[str, tuple[float, int]] = {}
        self._queue_changed = asyncio.Event()
        self._tokens = float(self.options.flood_burst)
        self._refilled = time.monotonic()
        self._ping_timer: asyncio.TimerHandle | None = None
        self._last_seen = time.monotonic()
        self._caps_offered: dict[str, str] = {}
        self._cap_pending = False
        self._sasl_state: str | None = None
        #: Registration held open (no CAP END) until the server offers SASL.
        self._sasl_waiting = False
        self._sasl_timer: asyncio.TimerHandle | None = None
        #: Bounds one SASL exchange (services that hang never answer 903/904).
        self._sasl_exchange_timer: asyncio.TimerHandle | None = None
        #: Registered without the login (sasl_required = false): ask again for SASL
        #: every ``sasl_wait`` seconds (not every server sends CAP NEW when it returns).
        self._sasl_retry_timer: asyncio.TimerHandle | None = None
        #: Why we hung up ourselves (for the "connection lost" line).
        self._hangup_reason: str | None = None
        #: When the last connection was lost or an attempt failed (None: all well).
        self._down_since: float | None = None
        self.server_name: str | None = None
        self._nick_candidates: list[str] = []
        #: Services recovery of our nick: the commands left to try (None: not asking).
        self._recovering: list[str] | None = None
        self._recover_timer: asyncio.TimerHandle | None = None
        self._user_hits: dict[str, deque[float]] = {}
        self._user_warned: dict[str, float] = {}
        #: When the CTCP replies of the last minute were queued.
        self._ctcp_replies: deque[float] = deque()
        #: When the "too fast" notices of the last minute were queued.
        self._rate_notices: deque[float] = deque()
        self._in_code: dict[str, bool] = {}
        #: The regexes that find our nick in a message, for the nick and CASEMAPPING
        #: they were built for (every channel message is matched against them).
        self._address_res: tuple[tuple[str, str | None], re.Pattern[str], re.Pattern[str]] | None
        self._address_res = None
        #: The configured channels casefolded, for the CASEMAPPING and list they came from.
        self._wanted: tuple[str | None, tuple[str, ...], frozenset[str]] | None = None
        #: Answers (``target\0run id``) whose first line already named the asker.
        self._addressed_runs: dict[str, None] = {}
        #: Channel members each answer (``target\0run id``) has named (highlighted).
        self._highlighted: dict[str, set[str]] = {}
        self._batches: dict[str, tuple[str, list[str]]] = {}
        self._batch_seq = 0
        self._batch_ids: dict[str, list[int]] = {}
        #: Our draft/multiline batches being echoed back: server ref -> the lines so far.
        self._echo_batches: dict[str, list[str]] = {}
        #: Lines written and not echoed yet (echo-message): ``(target, text, outbox ids)``.
        self._unechoed: deque[tuple[str, str, tuple[int, ...]]] = deque(maxlen=2000)
        #: Casefolded nick → how often its holder changed as we saw it (QUIT, NICK):
        #: a private answer goes to the person who asked, not to a later holder.
        self._nick_epoch: dict[str, int] = {}
        #: ``(casefolded nick, epoch)`` → ``(nick, epoch)`` its holder renamed to.
        self._renamed: dict[tuple[str, int], tuple[str, int]] = {}
        #: Tells this process's epochs from those in outbox rows of an earlier one.
        self._epoch_session = f"{random.getrandbits(48):012x}"
        #: The strings open channels keep of their last message (see ``_on_message``).
        self._shared: Canonical[str] = Canonical()
        #: Our own services account (900 RPL_LOGGEDIN), None when not logged in.
        self.account: str | None = None
        #: Who shares each channel with us: casefolded channel → casefolded nicks.
        self._members: dict[str, set[str]] = {}
        #: Casefolded nick → casefolded services account (None: known to be logged
        #: out) of users sharing a channel with us, from extended-join,
        #: account-notify and WHOX; absent: not known.
        self._accounts: dict[str, str | None] = {}

    # -- lifecycle -----------------------------------------------------------------
    async def start(self, sink: MessageSink) -> None:
        self._sink = sink
        self._host = host_of(sink)
        if self.options.unverified_identity == "hostmask":
            log.warning(
                'irc %s: unverified_identity = "hostmask": a speaker without a services '
                "account gets user notes keyed on nick!user@host, which anyone who can take "
                "the nick from the same user@host (no cloak, no ident) can read",
                self.name,
            )
        irc3, connection, bot_cls = _irc3()
        o = self.options
        channels = [entry.partition(" ")[0] for entry in o.channels]  # never a channel key
        log.info(
            "irc %s: server %s (%s), nick %s, channels %s", self.name, self._where,
            "TLS" if o.tls else "plain text", o.nick, ", ".join(channels) or "none",
            extra={"event": "startup", "transport": self.name, "host": o.host,
                   "port": o.effective_port, "tls": o.tls, "nick": o.nick, "channels": channels},
        )  # fmt: skip
        self._bot = bot_cls(
            nick=o.nick, username=o.username, realname=o.realname, host=o.host,
            port=o.effective_port, ssl=o.tls, asynchronous=False,
            loop=asyncio.get_running_loop(), connection=connection,
        )  # fmt: skip
        self._bot.owner = self
        self._connection_cls = connection
        self._bot.attach_events(irc3.event(r"^(?P<raw>.*)$", self._on_line))
        self._main = [
            self.spawn(self._run(), name=f"agentik-irc:{self.name}"),
            self.spawn(self._send_loop(), name=f"agentik-irc-send:{self.name}"),
        ]

    async def aclose(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self._protocol is not None and not getattr(self._protocol, "closed", True):
            with contextlib.suppress(Exception):
                self._write(format_line("QUIT", "agentik shutting down"))
            # Give the server a moment to take the QUIT before we hang up.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2):
                    await self._lost.wait()
            with contextlib.suppress(Exception):
                self._protocol.close()
        if self._ping_timer is not None:
            self._ping_timer.cancel()
        if self._sasl_timer is not None:
            self._sasl_timer.cancel()
        self._stop_sasl_timers()
        self._stop_recovery()
        await self.cancel_tasks()
        self.closed.set()

    async def serve(self) -> None:
        """Until closed; raises :class:`TransportFailed` when the network failed for good,
        and what broke the connection or send loop if one of them crashed (the bot
        restarts the transport then)."""
        closed = asyncio.ensure_future(self.closed.wait())
        try:
            await asyncio.wait({closed, *self._main}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
        for task in self._main:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        await self.closed.wait()
        if self.failed is not None:
            raise TransportFailed(f"irc {self.name}: {self.failed}")

    # -- connecting ------------------------------------------------------------------
    def _ssl_context(self) -> ssl.SSLContext | None:
        o = self.options
        if not o.tls:
            return None
        try:
            ctx = ssl.create_default_context(cafile=o.ssl_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"transports.{self.name}.ssl_ca_file: {o.ssl_ca_file}: {exc.strerror or exc}"
            ) from None
        if not o.ssl_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if o.client_cert:
            try:
                ctx.load_cert_chain(o.client_cert, o.client_key)
            except (OSError, ssl.SSLError) as exc:
                files = ", ".join(f for f in (o.client_cert, o.client_key) if f)
                raise ConfigError(
                    f"transports.{self.name}.client_cert: {files}: {exc.strerror or exc}"
                ) from None
        return ctx

    @property
    def _where(self) -> str:
        return f"{self.options.host}:{self.options.effective_port}"

    def _fields(self, event: str, **more: Any) -> dict[str, Any]:
        """Structured log fields (``extra=``) of a connection line."""
        o = self.options
        return {"event": event, "transport": self.name, "host": o.host,
                "port": o.effective_port, "tls": o.tls, **more}  # fmt: skip

    async def _run(self) -> None:
        """Connect, and reconnect with backoff, until closed or failed."""
        o = self.options
        while not self._closing and self.failed is None:
            try:
                await self._connect()
            except ConfigError as exc:
                self._fail(str(exc))
                break
            except _CannotConnect as exc:
                log.warning(
                    "irc %s: cannot connect to %s: %s", self.name, self._where, exc,
                    extra=self._fields("connection_failed", reason=str(exc)),
                )  # fmt: skip
                self.set_health("reconnecting", f"cannot connect to {self._where}: {exc}")
                if self._down_since is None:
                    self._down_since = time.monotonic()
            else:
                await self._lost.wait()
                if time.monotonic() - self._connected_at >= o.reconnect_stable:
                    self._attempt = 0
            if self._closing or self.failed is not None:
                break
            delay = min(o.reconnect_max, o.reconnect_min * 2**self._attempt)
            delay *= random.uniform(0.5, 1.0)
            self._attempt += 1
            log.info("irc %s: reconnecting in %.1fs", self.name, delay)
            await asyncio.sleep(delay)
        if self.failed is not None:
            self.closed.set()

    async def _connect(self) -> None:
        o = self.options
        bot = self._bot
        ctx = self._ssl_context()
        log.info(
            "irc %s: connecting to %s (%s)", self.name, self._where, "TLS" if ctx else "plain text"
        )
        if self.health.state in ("starting", "connected"):
            self.set_health(self.health.state if self.health.state == "starting" else
                            "reconnecting", f"connecting to {self._where}")  # fmt: skip
        transport, protocol = await self._open(ctx)
        tls = transport.get_extra_info("ssl_object")
        log.info(
            "irc %s: connected to %s (%s)", self.name, self._where,
            tls.version() if tls is not None else "plain text",
        )  # fmt: skip
        bot.protocol = protocol
        self._protocol = protocol
        self._lost.clear()
        self.registered.clear()
        self.joined.clear()
        self._forget_members()
        self.account = None
        self.caps_enabled.clear()
        self._caps_offered.clear()
        self._sasl_state = None
        self._sasl_waiting = False
        self._hangup_reason = None
        self._connected_at = time.monotonic()
        self.nick = o.nick
        self._nick_candidates = [*o.alt_nicks, f"{o.nick}_", f"{o.nick}__"]
        self._touch()
        self._cap_pending = True
        self._write("CAP LS 302")
        if o.password is not None:
            self._write(format_line("PASS", o.password.get_secret_value()))
        self._write(format_line("NICK", o.nick))
        self._write(format_line("USER", o.username, "0", "*", o.realname))

    async def _open(self, ctx: ssl.SSLContext | None) -> tuple[Any, Any]:
        """TCP, then the TLS handshake; failures become :class:`_CannotConnect` with the reason."""
        o = self.options
        loop = asyncio.get_running_loop()
        limit = o.connect_timeout

        def make_protocol() -> Any:
            protocol = self._connection_cls()
            protocol.factory = self._bot
            protocol.encoding = "utf-8"
            return protocol

        try:
            async with asyncio.timeout(limit):
                transport, protocol = await loop.create_connection(
                    make_protocol, host=o.host, port=o.effective_port
                )
        except TimeoutError:
            raise _CannotConnect(f"timed out after {limit:g} s") from None
        except OSError as exc:
            raise _CannotConnect(_describe(exc)) from None
        if ctx is None:
            return transport, protocol
        try:
            async with asyncio.timeout(limit):
                tls = await loop.start_tls(
                    transport, protocol, ctx, server_hostname=o.host,
                    ssl_handshake_timeout=limit + 5,
                )  # fmt: skip
        except TimeoutError:
            why = f"TLS handshake timed out after {limit:g} s"
            raise _CannotConnect(
                why + (_PLAINTEXT_HINT if await self._answers_plain_irc() else "")
            ) from None
        except ssl.SSLCertVerificationError as exc:
            raise _CannotConnect(
                f"TLS certificate not trusted: {_describe(exc)} (ssl_ca_file names a"
                " private network's CA)"
            ) from None
        except (ssl.SSLError, OSError) as exc:
            transport.close()
            why = f"TLS handshake failed: {_describe(exc)}"
            plain = getattr(exc, "reason", None) in _PLAINTEXT_REASONS
            if plain or await self._answers_plain_irc():
                why += _PLAINTEXT_HINT
            raise _CannotConnect(why) from None
        protocol.transport = tls
        return tls, protocol

    async def _answers_plain_irc(self) -> bool:
        """Whether the server speaks plain-text IRC on our port (after a failed handshake).

        One short probe: ``CAP LS 302`` without TLS; an IRC line back means yes.
        """
        o = self.options
        writer = None
        try:
            async with asyncio.timeout(min(o.connect_timeout, 10.0)):
                reader, writer = await asyncio.open_connection(o.host, o.effective_port)
                writer.write(b"CAP LS 302\r\n")
                raw = await reader.readline()
        except (OSError, TimeoutError, ValueError, EOFError):
            return False
        finally:
            if writer is not None:
                with contextlib.suppress(Exception):
                    writer.write(b"QUIT\r\n")
                    writer.close()
        line = parse_line(raw) if raw.endswith(b"\n") else None
        return line is not None and (
            line.command.isdigit() or line.command in {"CAP", "NOTICE", "ERROR", "PING"}
        )

    def _on_lost(self, protocol: Any, exc: BaseException | None) -> None:
        if protocol is not self._protocol:
            return
        # Shutting down, or giving up (already logged at ERROR): nothing to warn about.
        level = logging.DEBUG if self._closing or self.failed else logging.WARNING
        why = self._hangup_reason or (_describe(exc) if exc else "closed")
        log.log(
            level, "irc %s: connection to %s lost (%s)", self.name, self._where, why,
            extra=self._fields("connection_lost", reason=why),
        )  # fmt: skip
        if not self._closing and self._down_since is None:
            self._down_since = time.monotonic()
        if not self._closing and not self.failed:
            self.set_health("reconnecting", f"connection to {self._where} lost ({why})")
        self._sasl_waiting = False
        if self._sasl_timer is not None:
            self._sasl_timer.cancel()
            self._sasl_timer = None
        self._stop_sasl_timers()
        self._stop_recovery()
        self.registered.clear()
        self.joined.clear()
        self._forget_members()
        self._unechoed.clear()  # never confirmed: a restart sends them again
        self._echo_batches.clear()
        if self._ping_timer is not None:
            self._ping_timer.cancel()
        self._lost.set()
        self._queue_changed.set()

    def _hang_up(self, why: str) -> None:
        """Leave this server now (QUIT) and reconnect with backoff."""
        log.warning("irc %s: %s", self.name, why)
        self._hangup_reason = why
        self._write(format_line("QUIT", "reconnecting"))
        if self._protocol is not None:
            self._protocol.close()

    def _fail(self, why: str) -> None:
        log.error("irc %s: %s", self.name, why)
        self.failed = why
        self.set_health("failed", why)
        self._lost.set()
        if self._protocol is not None:
            with contextlib.suppress(Exception):
                self._protocol.close()

    # -- the wire --------------------------------------------------------------------
    def _write(self, line: str) -> None:
        """Write one line now (registration, PONG, QUIT: not flood-controlled)."""
        if self._protocol is None or getattr(self._protocol, "closed", True):
            return
        self._bot.send(line)

    def _touch(self) -> None:
        self._last_seen = time.monotonic()
        if self._ping_timer is not None:
            self._ping_timer.cancel()
        loop = asyncio.get_running_loop()
        self._ping_timer = loop.call_later(self.options.ping_interval, self._ping_due)

    def _ping_due(self) -> None:
        idle = time.monotonic() - self._last_seen
        if idle >= self.options.ping_timeout:
            self._hangup_reason = f"no answer for {idle:.0f} s"
            log.warning("irc %s: no answer for %.0f s: reconnecting", self.name, idle)
            if self._protocol is not None:
                self._protocol.close()
            return
        self._write(format_line("PING", f"agentik-{int(time.time())}"))
        remaining = self.options.ping_timeout - idle
        self._ping_timer = asyncio.get_running_loop().call_later(remaining, self._ping_due)

    def _on_bytes(self, raw: bytes) -> None:
        line = raw.rstrip(b"\r").replace(b"\x00", b"").decode("utf-8", errors="replace")
        if line:
            self._bot.dispatch(line)

    def _on_line(self, raw: str, **_: Any) -> None:
        line = parse_line(raw)
        if line is None:
            return
        self._touch()
        try:
            self._handle(line)
        except Exception:
            log.exception("irc %s: could not handle %r", self.name, raw[:200])

    # -- protocol handling --------------------------------------------------------------
    def _handle(self, line: Line) -> None:
        cmd = line.command
        p = line.params
        if cmd == "PING":
            self._write(format_line("PONG", *(p[-1:] or ["agentik"])))
        elif cmd == "CAP":
            self._on_cap(line)
        elif cmd == "AUTHENTICATE":
            self._on_authenticate(line)
        elif cmd == "900":
            account = p[2] if len(p) > 3 else None
            self.account = self._valid_account(account)
            log.info("irc %s: logged in as %s (SASL)", self.name, account or "?")
        elif cmd == "901":
            self.account = None
            log.info("irc %s: logged out of the services account", self.name)
        elif cmd == "903":
            self._sasl_state = "done"
            self._sasl_waiting = False
            self._stop_sasl_timers()
            if self._sasl_timer is not None:
                self._sasl_timer.cancel()
                self._sasl_timer = None
            self._cap_end()
        elif cmd in ("902", "904", "905", "906", "907", "908"):
            self._on_sasl_failure(line)
        elif cmd == "001":
            self.nick = p[0] if p else self.nick
            self.server_name = line.source
            self._cap_pending = False
            if self.options.sasl_mechanism != "none" and self._sasl_state != "done":
                self._registered_without_sasl()
                if not self.options.sasl_required:
                    self._arm_sasl_retry()
        elif cmd == "005":
            for token in p[1:-1]:
                key, _, value = token.partition("=")
                self.isupport[key.upper()] = value
                if key.upper() == "CASEMAPPING":
                    self._rekey_queues()
                if key.upper() == "CASEMAPPING" and value.lower() not in KNOWN_MAPPINGS:
                    log.warning(
                        "irc %s: the server announces CASEMAPPING=%s, which agentik does not"
                        " know: names are compared folding A-Z only (as 'ascii'), so two"
                        " names the server treats as one may be told apart",
                        self.name, value,
                    )  # fmt: skip
            if self.isupport.get("LINELEN", "").isdigit():
                self.linelen = max(512, int(self.isupport["LINELEN"]))
                # Let the bridge's rough split use the room too (we re-split exactly).
                self.caps = dataclasses.replace(self.caps, max_bytes=self.linelen - 112)
        elif cmd in ("376", "422"):
            self._on_registered()
        elif cmd in ("433", "432", "437") and not self.registered.is_set():
            self._next_nick()
        elif cmd == "396" and len(p) >= 3:
            # RPL_HOSTHIDDEN/RPL_VISIBLEHOST: a cloak (after a login, MODE +x).
            self._own_host(p[1])
        elif cmd == "CHGHOST" and len(p) >= 2 and self._is_me(line.nick):
            self._own_host(f"{p[0]}@{p[1]}")
        elif cmd == "JOIN":
            self._on_join(line)
        elif cmd in ("PART", "KICK"):
            self._on_part(line)
        elif cmd in ("QUIT", "NICK"):
            self._on_nick_change(line)
            self._track_nick(line)
        elif cmd == "ACCOUNT":
            self._on_account(line)
        elif cmd == "353":
            self._on_names(line)
        elif cmd == "354":
            self._on_whox(line)
        elif cmd in ("PRIVMSG", "NOTICE"):
            if self._recovering is not None and self._from_nickserv(line):
                self._on_services_reply(line)
            else:
                self._on_message(line)
        elif cmd == "401" and self._recovering is not None and len(p) > 1:
            if self._fold(p[1]) == self._fold("NickServ"):
                self._recovery_over("there is no NickServ on this network")
        elif cmd == "440" and self._recovering is not None:
            self._recovery_over("the services are down (440)")
        elif cmd == "BATCH" and p:
            self._on_batch(line)
        elif cmd == "ERROR":
            level = logging.DEBUG if self._closing else logging.WARNING
            log.log(level, "irc %s: server closes the link: %s", self.name, p[-1] if p else "")
        elif cmd in ("464", "465"):
            self._fail(f"the server refused us ({cmd}): {p[-1] if p else ''}")

    def _on_cap(self, line: Line) -> None:
        p = line.params
        if len(p) < 3:
            return
        sub = p[1].upper()
        mech = self.options.sasl_mechanism
        if sub == "LS":
            more = len(p) >= 4 and p[2] == "*"
            for item in p[-1].split():
                key, _, value = item.partition("=")
                self._caps_offered[key] = value
            if more:
                return
            if not self._cap_pending:  # our own later CAP LS (see _sasl_retry)
                if (
                    mech != "none" and "sasl" in self._caps_offered
                    and self._sasl_state is None and self.registered.is_set()
                ):  # fmt: skip
                    log.info("irc %s: the server offers SASL now: logging in", self.name)
                    self._write(format_line("CAP", "REQ", "sasl"))
                return
            want = [c for c in WANTED_CAPS if c in self._caps_offered]
            if "sasl" in want and mech == "none":
                want.remove("sasl")
            if mech != "none" and "sasl" not in self._caps_offered:
                self._sasl_unavailable("does not offer SASL")
            if want:
                self._write(format_line("CAP", "REQ", " ".join(want)))
            else:
                self._cap_end()
        elif sub == "ACK":
            acked = {cap.lstrip("=~") for cap in p[-1].split()}
            for cap in acked:
                if cap.startswith("-"):
                    self.caps_enabled.discard(cap[1:])
                else:
                    self.caps_enabled.add(cap)
            if "sasl" in acked and mech != "none" and self._sasl_state is None:
                self._sasl_state = "started"
                self._write(format_line("AUTHENTICATE", mech.upper()))
                self._arm_sasl_exchange()
            else:
                self._cap_end()
        elif sub == "NAK":
            refused = p[-1].split()
            if "sasl" in refused and mech != "none" and self._sasl_state is None:
                if len(refused) > 1:  # a REQ is all or nothing: ask for sasl alone
                    self._write(format_line("CAP", "REQ", "sasl"))
                    return
                self._sasl_unavailable("refused the sasl capability")
            self._cap_end()
        elif sub == "NEW":
            # cap-notify (implied by CAP LS 302): SASL may come back with the services.
            new = set()
            for item in p[-1].split():
                key, _, value = item.partition("=")
                self._caps_offered[key] = value
                new.add(key)
            if "sasl" in new and mech != "none" and self._sasl_state is None:
                log.info("irc %s: the server offers SASL now: logging in", self.name)
                if self._sasl_waiting:  # a fresh bound for the login itself
                    self._arm_sasl_timer()
                self._write(format_line("CAP", "REQ", "sasl"))
        elif sub == "DEL":
            for item in p[-1].split():
                self._caps_offered.pop(item.partition("=")[0], None)
                self.caps_enabled.discard(item.partition("=")[0])

    def _cap_end(self) -> None:
        if self._cap_pending and not self._sasl_waiting:
            self._cap_pending = False
            self._write("CAP END")

    def _sasl_unavailable(self, why: str) -> None:
        """SASL is configured but the server does not offer it (yet)."""
        o = self.options
        if self._sasl_waiting or self.registered.is_set():
            return
        if not o.sasl_required:
            log.warning(
                "irc %s: the server %s: registering WITHOUT logging in (sasl_required = false);"
                " will log in if it offers SASL later", self.name, why,
            )  # fmt: skip
            return
        log.warning(
            "irc %s: the server %s (are its services down?): not registering without"
            " logging in; waiting up to %g s for it to offer SASL, then reconnecting"
            " (sasl_required = false would register without it)", self.name, why, o.sasl_wait,
        )  # fmt: skip
        self._sasl_waiting = True
        self._arm_sasl_timer()

    def _arm_sasl_timer(self) -> None:
        if self._sasl_timer is not None:
            self._sasl_timer.cancel()
        loop = asyncio.get_running_loop()
        self._sasl_timer = loop.call_later(self.options.sasl_wait, self._sasl_wait_over)

    def _sasl_wait_over(self) -> None:
        self._sasl_timer = None
        if not self._sasl_waiting:
            return
        self._sasl_waiting = False
        self._hang_up(
            f"no SASL login within {self.options.sasl_wait:g} s (sasl_wait):"
            " disconnecting, will retry"
        )

    def _stop_sasl_timers(self) -> None:
        for name in ("_sasl_exchange_timer", "_sasl_retry_timer"):
            timer = getattr(self, name)
            if timer is not None:
                timer.cancel()
                setattr(self, name, None)

    def _arm_sasl_exchange(self) -> None:
        """Our own bound on a SASL exchange: services that hang would otherwise keep
        registration waiting for the server's own timeout, silently."""
        if self._sasl_exchange_timer is not None:
            self._sasl_exchange_timer.cancel()
        loop = asyncio.get_running_loop()
        self._sasl_exchange_timer = loop.call_later(
            self.options.sasl_wait, self._sasl_exchange_over
        )

    def _sasl_exchange_over(self) -> None:
        self._sasl_exchange_timer = None
        if self._sasl_state not in ("started", "sent"):
            return
        o = self.options
        why = f"the SASL login got no answer within {o.sasl_wait:g} s (sasl_wait; services hung?)"
        if o.sasl_required and not self.registered.is_set():
            self._hang_up(f"{why}: disconnecting, will retry")
            return
        log.warning(
            "irc %s: %s: going on WITHOUT logging in; will try again", self.name, why,
            extra=self._fields("sasl_timeout"),
        )  # fmt: skip
        self._write(format_line("AUTHENTICATE", "*"))  # abort the exchange
        self._sasl_state = None
        if self.registered.is_set():
            self._arm_sasl_retry()
        else:
            self._sasl_waiting = False
            self._cap_end()

    def _arm_sasl_retry(self) -> None:
        if self._sasl_retry_timer is not None:
            self._sasl_retry_timer.cancel()
        loop = asyncio.get_running_loop()
        self._sasl_retry_timer = loop.call_later(self.options.sasl_wait, self._sasl_retry)

    def _sasl_retry(self) -> None:
        """Registered without the login: ask the server again whether it offers SASL.

        Servers with cap-notify announce returning services with ``CAP NEW sasl``;
        InspIRCd 3 after a services-only restart does not, so every ``sasl_wait``
        seconds a ``CAP LS 302`` asks (its answer logs in, see ``_on_cap``)."""
        self._sasl_retry_timer = None
        if self._sasl_state == "done" or not self.registered.is_set() or self._closing:
            return
        if self._sasl_state is None:
            self._write("CAP LS 302")
        self._arm_sasl_retry()

    def _registered_without_sasl(self) -> None:
        """The server registered us before we logged in (it has no CAP support)."""
        if self.options.sasl_required:
            self._hang_up(
                "the server registered us without SASL (no IRCv3 capability negotiation):"
                " disconnecting, will retry (sasl_required = false would stay connected)"
            )
        elif not self._caps_offered:
            log.warning(
                "irc %s: the server does not negotiate capabilities: registered WITHOUT"
                " logging in (sasl_required = false)", self.name,
            )  # fmt: skip

    def _on_authenticate(self, line: Line) -> None:
        if not line.params or line.params[0] != "+" or self._sasl_state != "started":
            return
        o = self.options
        if o.sasl_mechanism == "external":
            payload = b""
        else:
            assert o.sasl_username and o.sasl_password
            user = o.sasl_username.encode()
            payload = user + b"\0" + user + b"\0" + o.sasl_password.get_secret_value().encode()
        self._sasl_state = "sent"
        for chunk in sasl_chunks(payload):
            self._write(format_line("AUTHENTICATE", chunk))

    def _on_sasl_failure(self, line: Line) -> None:
        reason = line.params[-1] if line.params else ""
        if line.command == "907" and self._sasl_state == "done":
            return  # "already authenticated"
        if line.command == "906" and self._sasl_exchange_timer is None:
            return  # our own abort (AUTHENTICATE *) after the exchange timed out
        self._stop_sasl_timers()
        self._fail(
            f"SASL {self.options.sasl_mechanism.upper()} login rejected ({line.command}): "
            f"{reason}; check sasl_username/sasl_password (not reconnecting)"
        )

    def _next_nick(self) -> None:
        if self._nick_candidates:
            self.nick = self._nick_candidates.pop(0)
        else:
            self.nick = f"{self.options.nick[:12]}{random.randint(100, 999)}"
        self._write(format_line("NICK", self.nick))

    def _on_registered(self) -> None:
        if self.registered.is_set() or getattr(self._protocol, "closed", True):
            return
        self.registered.set()
        network = self.isupport.get("NETWORK") or self.server_name or self._where
        self.set_health("connected", None)
        if self._down_since is not None:
            # Restored: logged at the level the loss was.
            down = time.monotonic() - self._down_since
            log.warning(
                "irc %s: registered as %s on %s: connection restored after %.0f s",
                self.name, self.nick, network, down,
                extra=self._fields("connection_restored", network=network, down_for=round(down, 1)),
            )  # fmt: skip
            self._down_since = None
        else:
            log.info(
                "irc %s: registered as %s on %s", self.name, self.nick, network,
                extra=self._fields("connected", network=network, nick=self.nick),
            )  # fmt: skip
        bot_mode = self.isupport.get("BOT")
        if bot_mode:
            self._write(format_line("MODE", self.nick, f"+{bot_mode}"))
        o = self.options
        # On another nick, asking NickServ for ours comes first (an IDENTIFY's answer
        # would read as the recovery's); IDENTIFY follows once the nick is ours.
        if self._is_me(o.nick) or not self._start_recovery():
            self._identify()
        for entry in o.channels:
            chan, _, key = entry.partition(" ")
            self._write(format_line("JOIN", chan, key) if key else format_line("JOIN", chan))
        self._queue_changed.set()

    def _identify(self) -> None:
        """NickServ IDENTIFY with ``nickserv_password``, when SASL did not log us in."""
        o = self.options
        if o.nickserv_password is not None and self._sasl_state != "done":
            self._write(
                format_line(
                    "PRIVMSG", "NickServ", f"IDENTIFY {o.nickserv_password.get_secret_value()}"
                )
            )

    # -- services recovery of a taken nick ----------------------------------------------------
    def _start_recovery(self) -> bool:
        """Registered under another nick: ask NickServ to free ours (``nickserv_recover``);
        whether we asked.

        The old holder is most often our own session that outlived its process
        (a crash, a failover to another worker) until the server's ping timeout.
        """
        o = self.options
        if not o.nickserv_recover:
            return False
        if self._sasl_state != "done" and o.nickserv_password is None:
            log.info(
                "irc %s: the nick %s is taken: registered as %s; no services login"
                " (SASL or nickserv_password) to free it with, so it is taken back when"
                " its holder leaves", self.name, o.nick, self.nick,
            )  # fmt: skip
            return False
        self._recovering = list(o.nickserv_recover)
        self._recover_next()
        return True

    def _recover_next(self) -> None:
        assert self._recovering
        o = self.options
        command = self._recovering.pop(0)
        log.info(
            "irc %s: the nick %s is taken (an old session of ours?): registered as %s,"
            " asking NickServ to free it (%s)", self.name, o.nick, self.nick, command,
            extra=self._fields("nick_recovery", nick=o.nick, command=command),
        )  # fmt: skip
        text = f"{command} {o.nick}"
        if self._sasl_state != "done" and o.nickserv_password is not None:
            # Logged in by SASL, the services need no password: it is never sent then.
            text += f" {o.nickserv_password.get_secret_value()}"
        self._write(format_line("PRIVMSG", "NickServ", text))
        if self._recover_timer is not None:
            self._recover_timer.cancel()
        loop = asyncio.get_running_loop()
        self._recover_timer = loop.call_later(
            _RECOVER_WAIT, self._recovery_over, f"NickServ did not answer {command}"
        )

    def _from_nickserv(self, line: Line) -> bool:
        return line.command == "NOTICE" and self._fold(line.nick or "") == self._fold("NickServ")

    def _on_services_reply(self, line: Line) -> None:
        """NickServ answered a recovery command: next command, give up, or take the nick."""
        text = strip_formatting(line.params[-1] if line.params else "")
        said = text.lower()
        if any(phrase in said for phrase in _UNKNOWN_COMMAND):
            if self._recovering:
                self._recover_next()
            else:
                self._recovery_over(f"NickServ offers none of {self.options.nickserv_recover}")
            return
        if any(phrase in said for phrase in _REFUSED):
            self._recovery_over(f"NickServ refused: {self._scrub(text)}")
            return
        # Freed ("... has been ghosted/regained/recovered"): take it now.  (REGAIN and
        # RECOVER may rename us themselves: our NICK then finds it ours already.)
        self._stop_recovery()
        log.info("irc %s: NickServ: %s", self.name, self._scrub(text))
        if not self._is_me(self.options.nick):
            self._write(format_line("NICK", self.options.nick))

    def _scrub(self, text: str) -> str:
        """``text`` (a services reply, for the log) without our password in it."""
        secret = self.options.nickserv_password
        if secret is not None and secret.get_secret_value():
            text = text.replace(secret.get_secret_value(), "********")
        return text[:300]

    def _recovery_over(self, why: str) -> None:
        """Stop asking the services; the nick is taken back when its holder leaves."""
        if self._recovering is None:
            return
        self._stop_recovery()
        log.warning(
            "irc %s: could not free the nick %s (%s): staying %s until it is free",
            self.name, self.options.nick, why, self.nick,
            extra=self._fields("nick_recovery_failed", nick=self.options.nick, reason=why),
        )  # fmt: skip
        # As without recovery: IDENTIFY under this nick (it may be grouped with the account).
        self._identify()

    def _stop_recovery(self) -> None:
        self._recovering = None
        if self._recover_timer is not None:
            self._recover_timer.cancel()
            self._recover_timer = None

    def _own_host(self, value: str) -> None:
        """Our displayed ``[user@]host`` changed: later lines are cut to the new prefix."""
        user, at, host = value.rpartition("@")
        if host and " " not in value:
            self.host = host
            if at and user:
                self.user = user
            log.info("irc %s: our displayed host is now %s", self.name, host)

    def _fold(self, name: str) -> str:
        """``name`` casefolded as the server compares names (ISUPPORT ``CASEMAPPING``)."""
        return casefold(name, self.isupport.get("CASEMAPPING"))

    @property
    def _chantypes(self) -> str:
        return self.isupport.get("CHANTYPES", "#&")

    def _is_me(self, nick: str | None) -> bool:
        return bool(nick) and self._fold(nick) == self._fold(self.nick)  # type: ignore[arg-type]

    def _on_join(self, line: Line) -> None:
        nick, user, host = line.hostmask
        if not nick or not line.params:
            return
        chan = self._fold(line.params[0])
        if not self._is_me(nick):
            members = self._members.get(chan)
            if members is None:
                return  # not a channel of ours
            who = self._fold(nick)
            members.add(who)
            if "extended-join" in self.caps_enabled and len(line.params) >= 2:
                # extended-join: JOIN #chan <account> :<realname>, "*" = not logged in.
                self._accounts[who] = self._valid_account(line.params[1])
            return
        if user and host:
            self.user, self.host = user, host
        self.joined.add(chan)
        self._members[chan] = set()
        log.info(
            "irc %s: joined %s", self.name, line.params[0],
            extra=self._fields("joined", channel=line.params[0]),
        )  # fmt: skip
        if "WHOX" in self.isupport:
            # Who is already there, with their accounts (354 replies).
            self._enqueue(line.params[0], format_line("WHO", line.params[0],
                                                      f"%tcna,{_WHOX_TOKEN}"))  # fmt: skip
        self._queue_changed.set()

    def _on_part(self, line: Line) -> None:
        if not line.params:
            return
        if line.command == "KICK":
            gone = line.params[1] if len(line.params) > 1 else None
        else:
            gone = line.nick
        if not gone:
            return
        chan = self._fold(line.params[0])
        if self._is_me(gone):
            self.joined.discard(chan)
            for who in self._members.pop(chan, set()):
                self._forget_if_gone(who)
            return
        members = self._members.get(chan)
        if members is not None:
            members.discard(self._fold(gone))
            self._forget_if_gone(self._fold(gone))

    # -- who is logged in as whom (extended-join, account-notify, WHOX) ----------------------------
    def _forget_members(self) -> None:
        self._members.clear()
        self._accounts.clear()

    def _shares_channel(self, who: str) -> bool:
        """Whether the casefolded nick ``who`` is in a channel with us."""
        return any(who in members for members in self._members.values())

    def _forget_if_gone(self, who: str) -> None:
        if not self._shares_channel(who):
            self._accounts.pop(who, None)

    def _track_nick(self, line: Line) -> None:
        """QUIT: forget the user; NICK: their channels and account follow them."""
        if not line.nick:
            return
        old = self._fold(line.nick)
        self._follow_holder(line)
        if line.command == "QUIT":
            for members in self._members.values():
                members.discard(old)
            self._accounts.pop(old, None)
            return
        if not line.params or self._is_me(line.params[0]):
            return
        new = self._fold(line.params[0])
        if new == old:
            return
        for members in self._members.values():
            if old in members:
                members.discard(old)
                members.add(new)
        self._accounts.pop(new, None)  # whatever we knew of a former holder of the nick
        if old in self._accounts:
            self._accounts[new] = self._accounts.pop(old)

    def _follow_holder(self, line: Line) -> None:
        """Count the changes of a nick's holder (QUIT, NICK away from it or onto it)."""
        old = self._fold(line.nick or "")
        if self._is_me(line.nick):
            return
        if line.command == "QUIT":
            self._nick_epoch[old] = self._nick_epoch.get(old, 0) + 1
        elif line.params and not self._is_me(line.params[0]):
            new = self._fold(line.params[0])
            if new == old:
                return  # a change of case: the same nick
            before = (old, self._nick_epoch.get(old, 0))
            self._nick_epoch[old] = before[1] + 1
            self._nick_epoch[new] = self._nick_epoch.get(new, 0) + 1
            self._renamed[before] = (line.params[0], self._nick_epoch[new])
        while len(self._renamed) > 20_000:
            del self._renamed[next(iter(self._renamed))]
        while len(self._nick_epoch) > 20_000:
            del self._nick_epoch[next(iter(self._nick_epoch))]

    def _holder(self, reply: Any, target: str) -> str | None:
        """The nick the person who asked has now; None when they left.

        ``reply`` is the ``reply_to`` of their message (see :meth:`_on_message`):
        it holds the epoch of their nick (``target``) then.  Followed through
        the renames we saw; a QUIT (or a rename we did not see the end of)
        means they are gone, and whoever holds the nick now is someone else.
        Without an epoch of this process (older rows, a restart) ``target``.
        """
        if not isinstance(reply, dict) or not isinstance(reply.get("epoch"), str):
            return target
        session, _, number = reply["epoch"].partition(":")
        if session != self._epoch_session or not number.isdigit():
            return target
        nick, epoch = target, int(number)
        for _ in range(100):
            folded = self._fold(nick)
            if self._nick_epoch.get(folded, 0) == epoch:
                return nick
            moved = self._renamed.get((folded, epoch))
            if moved is None:
                return None
            nick, epoch = moved
        return None

    def _on_account(self, line: Line) -> None:
        """account-notify: ``:nick!u@h ACCOUNT <account>`` (``*``: logged out)."""
        if not line.nick or not line.params or "account-notify" not in self.caps_enabled:
            return
        if self._is_me(line.nick):
            self.account = self._valid_account(line.params[0])
            log.info("irc %s: services account now %s", self.name, self.account or "none")
            return
        who = self._fold(line.nick)
        if self._shares_channel(who):
            self._accounts[who] = self._valid_account(line.params[0])

    def _on_names(self, line: Line) -> None:
        """353 RPL_NAMREPLY: ``<me> <type> <#chan> :[prefixes]nick ...``."""
        if len(line.params) < 4:
            return
        members = self._members.get(self._fold(line.params[2]))
        if members is None:
            return
        prefix = self.isupport.get("PREFIX", "(ov)@+")
        symbols = prefix.partition(")")[2] or "@+"
        for item in line.params[-1].split():
            nick = item.lstrip(symbols).partition("!")[0]
            if nick and not self._is_me(nick):
                members.add(self._fold(nick))

    def _on_whox(self, line: Line) -> None:
        """354 (our ``WHO #chan %tcna,<token>``): ``<me> <token> <#chan> <nick> <account>``."""
        p = line.params
        if len(p) < 5 or p[1] != _WHOX_TOKEN:
            return
        members = self._members.get(self._fold(p[2]))
        if members is None or self._is_me(p[3]):
            return
        who = self._fold(p[3])
        members.add(who)
        self._accounts[who] = None if p[4] == "0" else self._valid_account(p[4])

    def _tracked_account(self, nick: str) -> str | None:
        """``nick``'s account as tracked, when we share a channel and see logouts."""
        if "account-notify" not in self.caps_enabled:
            return None  # without it a logout would go unnoticed
        who = self._fold(nick)
        if not self._shares_channel(who):
            return None
        return self._accounts.get(who)

    def account_of(self, channel_key: str, name: str) -> str | None:
        """The services account of the nick ``name`` on this network, when tracked."""
        if (
            not self.owns(channel_key)
            or not name
            or not valid_target(name, chantypes=self._chantypes)
        ):
            return None
        return self._tracked_account(name)

    def _on_nick_change(self, line: Line) -> None:
        old = line.nick or ""
        if line.command == "NICK" and self._is_me(old) and line.params:
            self.nick = line.params[0]
            if self._is_me(self.options.nick) and self.registered.is_set():
                # Our nick again (freed by the services, or its holder left).
                self._stop_recovery()
                log.info("irc %s: the nick %s is ours again", self.name, self.nick)
                if self._fold(old) != self._fold(self.nick):
                    self._identify()  # the login under the other nick was not this one's
            return
        # The holder of our preferred nick left or changed: take it back.
        wanted = self.options.nick
        if self._fold(old) == self._fold(wanted) and not self._is_me(wanted):
            self._write(format_line("NICK", wanted))

    # -- incoming messages ------------------------------------------------------------------
    def _user_source(self, line: Line) -> str | None:
        """The sender's nick when ``line`` comes from a user (``nick!user@host``), else None.

        A server (``irc.example.org``, the name of our server's 001, a bare
        name) is not a user: what it sends is never answered.
        """
        nick, user, host = line.hostmask
        if not nick or user is None or host is None or "." in nick:
            return None
        if self.server_name is not None and line.source == self.server_name:
            return None
        return nick

    def _account(self, line: Line) -> str | None:
        """The sender's services account from the IRCv3 ``account`` tag, casefolded."""
        if "account-tag" not in self.caps_enabled:
            return None  # only a server that negotiated account-tag vouches for the tag
        return self._valid_account(line.tags.get("account"))

    def _valid_account(self, account: str | None) -> str | None:
        """A services account as the server sent it, casefolded; None for none or ``*``."""
        if not account or account == "*" or len(account) > 200:
            return None
        if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in account):
            log.debug("irc %s: ignored a malformed account name %r", self.name, account[:50])
            return None
        return self._fold(account)

    def _on_message(self, line: Line) -> None:
        if len(line.params) < 2:
            return
        sender = self._user_source(line)
        if sender is None:
            log.debug("irc %s: ignored %s from a server (%r)", self.name, line.command,
                      line.source)  # fmt: skip
            return
        relayer = line.tags.get("draft/relaymsg") or line.tags.get("relaymsg")
        if self._is_me(sender) or (relayer and self._is_me(relayer)):
            # (a line we sent with RELAYMSG comes back under the relayed nick, the tag
            # naming us: never taken in again)
            self._on_echo(line)
            return  # our own echo
        if line.command == "NOTICE":
            return  # never answer a notice (RFC 2812)
        if "bot" in line.tags:
            return  # another bot
        chantypes = self._chantypes
        if not valid_target(sender, chantypes=chantypes) or sender[0] in chantypes:
            log.debug("irc %s: ignored a message from the unusable nick %r", self.name, sender)
            return
        target, text = line.params[0], line.params[-1]
        direct = self._is_me(target)
        target_folded = self._fold(target)
        if not direct and target_folded not in self.joined:
            # A server or host mask ($*, #*.tld), a STATUSMSG target (@#chan: for
            # the channel's operators only), a channel we are not in: not for us.
            log.debug("irc %s: ignored a message from %s to %r", self.name, sender, target)
            return
        special = ctcp_parse(text)
        if special is not None and special[0] != "ACTION":
            # A CTCP request counts against its sender's rate like any message,
            # and all CTCP replies together have a budget of their own: a flood
            # of them (one nick or many) never fills the queue ahead of answers.
            if self._allow(sender, line) and self._allow_ctcp():
                self._on_ctcp(sender, *special)
            return
        if not self._allow(sender, line):
            return
        if special is not None:
            text = f"* {sender} {special[1]}"
        account = self._account(line)
        via = "tag" if account is not None else None
        folded = self._fold(sender)  # (once: the nick as the server compares it)
        if "account-tag" in self.caps_enabled:
            # The tag is on every message of a logged-in user: no tag, no account.
            if self._shares_channel(folded):
                self._accounts[folded] = account
        else:
            account = self._tracked_account(sender)
            via = "tracked" if account is not None else None
        _, user, host = line.hostmask
        # What an open channel and its conversation keep of a message (its key,
        # who spoke, where answers go) is shared: each message made copies of its
        # own, and the same speaker in many channels had one in each.
        shared = self._shared
        sender = shared(sender)
        if account is not None:
            author_id, verified = shared(account), True
        elif self.options.unverified_identity == "hostmask":
            # The nick as the server compares it; the ident as it is; the host in ASCII lower case.
            author_id = shared(f"{folded}!{user}@{(host or '').lower()}")
            verified = True
        else:
            author_id, verified = shared(folded), False
        reply_to: Any
        epoch = self._nick_epoch.get(folded, 0)
        epoch_of = shared(f"{self._epoch_session}:{epoch}")
        if direct:
            # An unverified nick never shares a conversation with the account of that name.
            who = author_id if verified else f"{author_id}!*@*"
            key = shared(f"irc:{self.network}:{who}")
            reply_to = {"target": sender, "epoch": epoch_of}
            addressed = True
        else:
            key = shared(f"irc:{self.network}:{target_folded}")
            reply_to = {"target": shared(target), "asker": sender, "epoch": epoch_of}
            text, addressed = self._addressed(text)
        message = IncomingMessage(
            channel_key=key, text=text, author_id=author_id, author_name=sender,
            direct=direct, addressed=addressed, reply_to=reply_to, verified=verified,
            meta={"network": self.network, "account": account, "account_via": via,
                  "hostmask": f"{sender}!{user or ''}@{host or ''}",
                  "casemapping": self.isupport.get("CASEMAPPING"),
                  # message-tags: the server's id for it, and the one it answers
                  "msgid": line.tags.get("msgid") or None,
                  "reply": line.tags.get("+draft/reply") or None},
        )  # fmt: skip
        self._hand_over(message)

    # -- image links (issue 34) ----------------------------------------------------------
    def _hand_over(self, message: IncomingMessage) -> None:
        """Give ``message`` to the bridge (a task of its own); one with links goes
        after its image links are fetched (:meth:`_with_images`), and the messages
        of its channel after it wait their turn."""
        assert self._sink is not None
        key = message.channel_key
        before = self._handing.get(key)
        if before is None and "://" not in message.text:
            self.spawn(self._sink.handle(message, self))
            return
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._handing[key] = mine
        self.spawn(self._hand_over_after(message, before, mine))

    async def _hand_over_after(
        self,
        message: IncomingMessage,
        before: asyncio.Future[None] | None,
        mine: asyncio.Future[None],
    ) -> None:
        assert self._sink is not None
        try:
            if before is not None:
                await before
            message = await self._with_images(message)
        finally:
            # Released in the same step as the hand-over below: the next message of
            # the channel reaches the bridge after this one.
            if not mine.done():
                mine.set_result(None)
            if self._handing.get(message.channel_key) is mine:
                del self._handing[message.channel_key]
        await self._sink.handle(message, self)

    async def _with_images(self, message: IncomingMessage) -> IncomingMessage:
        """``message`` with the images its links show, when its channel fetches them
        (``image_urls``), it is for the bot and the channel's model takes images;
        what was refused is said to the person in one line each and named for the
        model.  Never fails: the words go on whatever happens to the links."""
        from agentik.transports.imagefetch import fetch_images, links_in

        host = self._host
        agent = host.agent if host is not None else None
        links = links_in(message.text)
        if host is None or agent is None or not links:
            return message
        try:
            effective = await host.effective(message.channel_key, self)
            options = effective.options
            if not options.image_urls:
                return message
            if options.command_prefix and message.text.startswith(options.command_prefix):
                return message  # a command
            if not (message.direct or message.addressed or options.answer == "all"):
                return message  # not for the bot
            if not agent.llm_for(effective.model).supports_image_in:
                return message  # its model takes text only: the links stay words
            found = await fetch_images(links, agent.attachments)
        except Exception:
            log.exception("irc %s: image links of a message not fetched", self.name)
            return message
        for line in found.notices:
            await self.send(OutgoingMessage(channel_key=message.channel_key, text=line,
                                            kind="notice", reply_to=message.reply_to))  # fmt: skip
        if not found.images and not found.notes:
            return message
        text = "\n".join([message.text, *found.notes])
        return dataclasses.replace(
            message, text=text, attachments=(*message.attachments, *found.images)
        )

    def _on_echo(self, line: Line) -> None:
        """echo-message: the server relayed a line we wrote; its outbox rows are confirmed."""
        if len(line.params) < 2:
            return
        if "batch" in line.tags:
            # A line of our draft/multiline batch: confirmed with the batch's end.
            lines = self._echo_batches.get(line.tags["batch"])
            if lines is not None and len(lines) < 1000:
                lines.append(line.params[-1])
            return
        self._confirm_echo(line.params[0], line.params[-1], line.tags.get("msgid"))

    def _confirm_echo(self, target: str, relayed: str, msgid: str | None = None) -> None:
        # Servers may drop trailing blanks from what they relay, and a channel
        # with +c (Solanum) or +S (InspIRCd) strips the formatting codes.
        want = (self._fold(target), _plain(relayed))
        for i, (t, text, ids) in enumerate(self._unechoed):
            if (t, _plain(text)) == want:
                del self._unechoed[i]
                for oid in ids:
                    # (the server's msgid for it: a reply to it names it, +draft/reply)
                    self.delivered(oid, "confirmed", ref=msgid or None)
                return

    def _on_batch(self, line: Line) -> None:
        """``BATCH +ref draft/multiline <target>`` ... ``BATCH -ref``: with echo-message,
        the server relays our multiline answers as batches; one confirms the answer."""
        ref = line.params[0]
        if ref.startswith("+") and len(line.params) >= 3:
            # Any multiline batch: only our own echoed lines are collected in it
            # (others' never reach _on_echo), whatever source the server gives it.
            if line.params[1] == "draft/multiline":
                if len(self._echo_batches) >= 100:  # never ended: forget the oldest
                    del self._echo_batches[next(iter(self._echo_batches))]
                self._echo_batches[ref[1:]] = [line.params[2]]
        elif ref.startswith("-"):
            lines = self._echo_batches.pop(ref[1:], None)
            if lines is not None and len(lines) > 1:
                self._confirm_echo(lines[0], "\n".join(lines[1:]))

    def _nick_pattern(self) -> str:
        """A regex matching our nick in any case the server's CASEMAPPING equates."""
        parts = []
        for ch in self.nick:
            folded = self._fold(ch)
            variants = {ch, ch.lower(), ch.upper(), *"[]\\~{}|^"}
            same = sorted(v for v in variants if len(v) == 1 and self._fold(v) == folded)
            parts.append("[" + "".join(re.escape(v) for v in same) + "]")
        return "".join(parts)

    def _addressed(self, text: str) -> tuple[str, bool]:
        key = (self.nick, self.isupport.get("CASEMAPPING"))
        cached = self._address_res
        if cached is None or cached[0] != key:
            nick = self._nick_pattern()
            cached = self._address_res = (
                key,
                re.compile(rf"^\s*{nick}\s*[:,]\s*(.*)$", re.S),
                re.compile(rf"(?<![\w\-\[\]\\`^{{}}|]){nick}(?![\w\-\[\]\\`^{{}}|])"),
            )
        _, prefix, mention = cached
        m = prefix.match(text)
        if m:
            return m.group(1), True
        if self.options.address_mode == "mention":
            if mention.search(text):
                return text, True
        return text, False

    def _on_ctcp(self, sender: str, command: str, arg: str) -> None:
        if command == "VERSION":
            reply = ctcp("VERSION", self.options.version)
        elif command == "PING":
            reply = ctcp("PING", arg)
        elif command == "TIME":
            reply = ctcp("TIME", time.strftime("%a %b %d %H:%M:%S %Y"))
        else:
            return
        self._enqueue(sender, format_line("NOTICE", sender, reply))

    def _allow_ctcp(self) -> bool:
        """Whether another CTCP reply may go out (at most ``_CTCP_PER_MINUTE`` a minute)."""
        if not _within(self._ctcp_replies, _CTCP_PER_MINUTE):
            log.debug("irc %s: CTCP flood: request left unanswered", self.name)
            return False
        return True

    def _rate_key(self, sender: str, line: Line) -> str:
        """Whom the per-user rate limit counts ``line`` against.

        The services account when known; else ``ident@host``, so that changing
        nick (or taking turns between nicks) does not reset the count and a
        flood costs no more model requests than one user's limit; the nick
        only when the server sent no ident and host.
        """
        account = self._account(line)
        if account is None and "account-tag" not in self.caps_enabled:
            account = self._tracked_account(sender)
        if account is not None:
            return f"account:{account}"
        _, user, host = line.hostmask
        if user and host:
            return f"mask:{user.lower()}@{host.lower()}"
        return f"nick:{self._fold(sender)}"

    def _allow(self, sender: str, line: Line) -> bool:
        """The per-user incoming rate limit (a sliding minute)."""
        now = time.monotonic()
        who = self._rate_key(sender, line)
        hits = self._user_hits.setdefault(who, deque())
        while hits and now - hits[0] > 60:
            hits.popleft()
        if len(hits) >= self.options.user_rate_limit:
            # Told once a minute; and all these notices together have a budget of
            # their own, so many flooders never queue ahead of answers.
            if now - self._user_warned.get(who, -1e9) > 60 and _within(
                self._rate_notices, _CTCP_PER_MINUTE
            ):
                self._user_warned[who] = now
                self._enqueue(
                    sender,
                    format_line(
                        "NOTICE", sender,
                        f"You are sending messages too fast (limit "
                        f"{self.options.user_rate_limit}/minute); some were ignored.",
                    ),
                )  # fmt: skip
            return False
        hits.append(now)
        if len(self._user_hits) > 10_000:  # forget users quiet for a minute
            for key in [k for k, h in self._user_hits.items() if not h or now - h[-1] > 60]:
                del self._user_hits[key]
                self._user_warned.pop(key, None)
        return True

    # -- outgoing ------------------------------------------------------------------------------
    def _budget(self, target: str, command: str) -> int:
        return payload_budget(
            target, nick=self.nick, user=self.user, host=self.host, linelen=self.linelen,
            command=command,
        )  # fmt: skip

    def owns(self, channel_key: str) -> bool:
        return channel_key.startswith(f"irc:{self.network}:")

    def unreachable(self, channel_key: str) -> str | None:
        target = channel_key[len(f"irc:{self.network}:") :]
        if not self.owns(channel_key) or target[:1] not in self._chantypes:
            return None
        return None if self._fold(target) in self.joined else f"not joined to {target}"

    def _destination(self, message: OutgoingMessage) -> tuple[str, str | None]:
        """``(target, asker)`` of an outgoing message, from its ``reply_to`` or its key.

        ``reply_to`` is what :meth:`_on_message` made: the sender's nick (a
        private message) or ``{"target": "#chan", "asker": nick}``; older
        outbox rows hold the target alone.  Without one (an answer resumed
        after a restart, a message posted over HTTP) the key names the target.
        """
        reply = message.reply_to
        target: Any = reply.get("target") if isinstance(reply, dict) else reply
        asker = reply.get("asker") if isinstance(reply, dict) else None
        if not isinstance(target, str) or not target:
            prefix = f"irc:{self.network}:"
            key = message.channel_key
            rest = key[len(prefix) :] if key.startswith(prefix) else key.rsplit(":", 1)[-1]
            target = rest.partition("!")[0]  # an unverified nick's key: nick!*@*
        return target, asker if isinstance(asker, str) else None

    def _address(self, state_key: str, target: str, asker: str | None, text: str) -> str:
        """The first line of an answer in a channel, starting with the asker's nick."""
        if (
            not self.options.address_asker
            or asker is None
            or not target
            or target[0] not in self._chantypes
            or state_key in self._addressed_runs
            or not valid_target(asker, chantypes=self._chantypes)
        ):
            return text
        self._addressed_runs[state_key] = None
        while len(self._addressed_runs) > 1000:
            del self._addressed_runs[next(iter(self._addressed_runs))]
        plain = self._fold(strip_formatting(text).lstrip())
        named = self._fold(asker)
        if plain.startswith(named) and plain[len(named) : len(named) + 1] in (":", ","):
            return text  # the model already addressed them
        return f"{asker}: {text}"

    async def send(self, message: OutgoingMessage) -> None:
        target, asker = self._destination(message)
        state_key = f"{target}\0{message.run_id}"
        if message.kind == "delta":
            return  # we stream by lines; the bridge sends complete ones
        if message.kind == "end":
            self._in_code.pop(state_key, None)
            self._addressed_runs.pop(state_key, None)
            self._highlighted.pop(state_key, None)
            self._flush_batch(state_key)
            return
        oid = message.outbox_id
        if target[:1] in self._chantypes:
            # The asker is named under the nick they have now; not at all if they left.
            if asker is not None:
                asker = self._holder(message.reply_to, asker)
            holder: str | None = target
        else:
            holder = self._holder(message.reply_to, target)
        if holder is None:
            log.info(
                "irc %s: %s left before the answer to them was sent: not sending it to"
                " whoever has the nick now", self.name, target,
            )  # fmt: skip
            self.delivered(oid, "confirmed")  # nobody to send it to
            return
        target = holder
        if not valid_target(target, chantypes=self._chantypes):
            log.debug("irc %s: not sending to the unusable target %r", self.name, target)
            self.delivered(oid, "confirmed")  # nothing to retry: it can never be sent
            return
        if message.kind == "relay":
            self._relay(target, message)
            return
        # No CTCP (\x01) or other stray control character from message text.
        text: str | None = clean_outgoing(message.text)
        if message.kind == "answer" and text is not None:
            text = self._format_answer_line(state_key, text)
            if text is not None and message.run_id is not None:
                text = self._address(state_key, target, asker, text)
        if text is None:
            self.delivered(oid, "confirmed")  # a code fence: nothing to send
            return
        run_key = state_key if message.run_id is not None else None
        text = self._defuse_highlights(run_key, target, asker, text)
        command = "NOTICE" if message.kind == "notice" else "PRIVMSG"
        pieces = split_message(text, self._budget(target, command))
        if not pieces:
            self.delivered(oid, "confirmed")
            return
        limits = self._multiline_limits()
        if message.kind == "answer" and limits is not None:
            # draft/multiline: collect the answer and send it as one batch.
            batch = self._batches.setdefault(state_key, (target, []))[1]
            batch.extend(pieces)
            if oid is not None:
                self._batch_ids.setdefault(state_key, []).append(oid)
            max_bytes, max_lines = limits
            if len(batch) >= max_lines or sum(len(p.encode()) for p in batch) >= max_bytes:
                self._flush_batch(state_key)
            return
        self._flush_batch(state_key)
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            self._enqueue(
                target, format_line(command, target, piece),
                outbox_ids=(oid,) if last and oid is not None else (), echo=(target, piece),
            )  # fmt: skip

    def _relay(self, target: str, message: OutgoingMessage) -> None:
        """A person's message from a linked channel: ``<bob (Slack)> text`` lines, the
        name with a zero-width space (no client highlights whoever has that nick, and
        a relay bot reading us never takes it for its own), no formatting or control
        codes, each line split at the byte limit with the name on every piece."""
        author = strip_formatting(clean_outgoing(message.author or "?")).replace("\n", " ")
        spoof = self._relay_nick(author) if target[:1] in self._chantypes else None
        if spoof is not None:
            # draft/relaymsg: the line comes from ``bob/Slack`` itself, no name in the text.
            prefix, command = "", "RELAYMSG"
            budget = payload_budget(
                target, nick=spoof, user=self.user, host=self.host, linelen=self.linelen,
                command="PRIVMSG",
            ) - _RELAY_HOST_SLACK  # fmt: skip
        else:
            name = f"{author[:1]}\u200b{author[1:]}" if author else "?"
            prefix, command = f"<{name}> ", "PRIVMSG"
            budget = self._budget(target, "PRIVMSG") - len(prefix.encode())
        text = strip_formatting(clean_outgoing(message.text))
        text = self._defuse_highlights(None, target, None, text)
        pieces = [p for line in text.splitlines() for p in split_message(line, budget)]
        oid = message.outbox_id
        if not pieces:
            self.delivered(oid, "confirmed")
            return
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            line = (
                format_line("RELAYMSG", target, spoof, piece) if spoof is not None
                else format_line(command, target, prefix + piece)
            )  # fmt: skip
            self._enqueue(
                target, line, outbox_ids=(oid,) if last and oid is not None else (),
                echo=(target, prefix + piece),
            )  # fmt: skip

    def _relay_nick(self, author: str) -> str | None:
        """The nick a relayed line is sent under with ``draft/relaymsg`` (``bob/Slack``,
        ``alice/libera``: the name and its network joined by the server's separator),
        or ``None`` when the server does not offer it.  Characters the spec reserves
        (``!+%@&#$:'"?*,.``, blanks) are left out."""
        if "draft/relaymsg" not in self.caps_enabled:
            return None
        separators = self._caps_offered.get("draft/relaymsg") or "/"
        m = re.fullmatch(r"(.*) \((.+)\)", author) or re.fullmatch(r"(.*)@([^@]+)", author)
        name, network = (m.group(1), m.group(2)) if m else (author, "")
        name, network = _RELAY_RESERVED.sub("", name)[:24], _RELAY_RESERVED.sub("", network)[:16]
        sep = separators[0]
        name = name.replace(sep, "") or "someone"
        return f"{name}{sep}{network.replace(sep, '') or 'relay'}"

    def _defuse_highlights(
        self, state_key: str | None, target: str, asker: str | None, text: str
    ) -> str:
        """``text`` with the nicks of channel members past the first few defused.

        One answer (or message) may name ``_HIGHLIGHT_LIMIT`` members of the
        channel; every other member's nick gets a zero-width space after its
        first character, so it reads the same but notifies nobody (a mass
        highlight, asked for by anyone who pastes the nick list, gets a bot
        kicked).  The asker is never counted.
        """
        members = self._members.get(self._fold(target))
        if not members:
            return text
        skip = {self._fold(self.nick)} | ({self._fold(asker)} if asker else set())
        if state_key is None:
            named: set[str] = set()  # not part of an answer: this message alone
        else:
            named = self._highlighted.setdefault(state_key, set())
            while len(self._highlighted) > 1000:
                del self._highlighted[next(iter(self._highlighted))]

        def nick(m: re.Match[str]) -> str:
            word = m.group(0)
            who = self._fold(word)
            if who not in members or who in skip or who in named:
                return word
            if len(named) < _HIGHLIGHT_LIMIT:
                named.add(who)
                return word
            return word[0] + "\u200b" + word[1:]

        return _NICK_WORD_RE.sub(nick, text)

    def _multiline_limits(self) -> tuple[int, int] | None:
        """``(max-bytes, max-lines)`` when draft/multiline is enabled, else None."""
        if "draft/multiline" not in self.caps_enabled or "batch" not in self.caps_enabled:
            return None
        values = dict(
            item.partition("=")[::2]
            for item in self._caps_offered.get("draft/multiline", "").split(",")
            if item
        )
        try:
            max_bytes = int(values.get("max-bytes", "4096"))
            max_lines = int(values.get("max-lines", "100"))
        except ValueError:
            return None
        return max(1, max_bytes), max(1, max_lines)

    def _flush_batch(self, state_key: str) -> None:
        entry = self._batches.pop(state_key, None)
        ids = tuple(self._batch_ids.pop(state_key, ()))
        if entry is None or not entry[1]:
            return
        target, pieces = entry
        if len(pieces) == 1:
            self._enqueue(
                target, format_line("PRIVMSG", target, pieces[0]), outbox_ids=ids,
                echo=(target, pieces[0]),
            )  # fmt: skip
            return
        self._batch_seq += 1
        ref = f"ml{self._batch_seq}"
        lines = [format_line("BATCH", f"+{ref}", "draft/multiline", target)]
        lines += [format_line("PRIVMSG", target, piece, tags={"batch": ref}) for piece in pieces]
        lines.append(format_line("BATCH", f"-{ref}"))
        # One queue item: a batch is never cut in half by flood control.
        self._enqueue(
            target, "\r\n".join(lines), cost=1.0 + len(pieces) / 4, outbox_ids=ids,
            echo=(target, "\n".join(pieces)),
        )  # fmt: skip

    def _format_answer_line(self, state_key: str, line: str) -> str | None:
        """Markdown to IRC, one line at a time, keeping track of code fences."""
        if line.strip().startswith("```"):
            self._in_code[state_key] = not self._in_code.get(state_key, False)
            if not self._in_code[state_key]:
                self._in_code.pop(state_key, None)
            return None
        if self._in_code.get(state_key):
            return f"\x11{line}\x11" if line.strip() else None
        return markdown_to_irc(line)

    def _enqueue(
        self,
        target: str,
        line: str,
        cost: float | None = None,
        *,
        outbox_ids: tuple[int, ...] = (),
        echo: tuple[str, str] | None = None,
    ) -> None:
        if cost is None:
            cost = 1.0 + len(line.encode()) / 256
        key = self._fold(target)
        self._seq += 1
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = deque()
        queue.append(_Out(target, line, cost, outbox_ids, echo, self._seq))
        self._queued += 1
        o = self.options
        if len(queue) > o.target_queue_limit:
            self._drop(key, f"{o.target_queue_limit} lines wait for it")
        elif self._queued > o.queue_limit:
            # The target with the most lines waiting pays (this one on a tie), never the others.
            longest = max(self._queues, key=lambda k: (len(self._queues[k]), k == key))
            self._drop(longest, f"{o.queue_limit} lines wait in all, the most for it")
        self._queue_changed.set()

    def _drop(self, key: str, why: str) -> None:
        """Drop the oldest line waiting for ``key`` (logged, at most once a minute per target)."""
        queue = self._queues[key]
        dropped = queue.popleft()
        self._queued -= 1
        if not queue:
            del self._queues[key]
        now = time.monotonic()
        last, count = self._drop_log.get(key, (-1e9, 0))
        if now - last < 60:
            self._drop_log[key] = (last, count + 1)
            return
        self._drop_log[key] = (now, 0)
        log.warning(
            "irc %s: outgoing queue full for %s (%s): dropped its oldest line%s",
            self.name, dropped.target, why,
            f" ({count} more since the last warning)" if count else "",
        )  # fmt: skip
        if len(self._drop_log) > 1000:
            for k in [k for k, (t, _) in self._drop_log.items() if now - t >= 60]:
                del self._drop_log[k]

    def _rekey_queues(self) -> None:
        """Re-file waiting lines under the names the server's CASEMAPPING gives them."""
        lines = sorted((out for q in self._queues.values() for out in q), key=lambda o: o.seq)
        self._queues = {}
        for out in lines:
            self._queues.setdefault(self._fold(out.target), deque()).append(out)

    def _ready_for(self, target: str) -> bool:
        if self._protocol is None or getattr(self._protocol, "closed", True):
            return False
        if not self.registered.is_set():
            return False
        prefixes = self.isupport.get("CHANTYPES", "#&")
        if target and target[0] in prefixes:
            wanted = self._wanted_channels()
            # A configured channel: wait until we are (re)joined.
            return self._fold(target) in self.joined or self._fold(target) not in wanted
        return True

    def _wanted_channels(self) -> frozenset[str]:
        """The configured channels, casefolded (computed again when the server's
        CASEMAPPING or the list changes, not for every line sent)."""
        mapping, channels = self.isupport.get("CASEMAPPING"), tuple(self.options.channels)
        cached = self._wanted
        if cached is None or cached[0] != mapping or cached[1] != channels:
            folded = frozenset(self._fold(c.partition(" ")[0]) for c in channels)
            cached = self._wanted = (mapping, channels, folded)
        return cached[2]

    async def _send_loop(self) -> None:
        """Send what waits, under the token bucket, when connected: round robin.

        Each target (channel or nick) with lines waiting sends one line (or
        one batch) in turn, so a flooded channel gets its share of the flood
        budget and every other channel and private answer gets the same: an
        answer waits for at most one line per other busy target, never for a
        whole queue.
        """
        o = self.options
        while True:
            while (key := self._next_ready()) is None:
                self._queue_changed.clear()
                await self._queue_changed.wait()
            now = time.monotonic()
            self._tokens = min(
                float(o.flood_burst), self._tokens + (now - self._refilled) * o.flood_rate
            )
            self._refilled = now
            queue = self._queues[key]
            head = queue[0]
            need = min(head.cost, float(o.flood_burst))
            if self._tokens < need:
                await asyncio.sleep((need - self._tokens) / o.flood_rate)
                continue
            self._tokens -= need
            queue.popleft()
            self._queued -= 1
            del self._queues[key]  # to the back of the round
            if queue:
                self._queues[key] = queue
            self._write(head.line)
            self._written(head)

    def _next_ready(self) -> str | None:
        """The target whose turn it is (the first in the round that may send now), or None.

        Lines go in order for each target; a target that is not ready (a
        configured channel we were kicked from, or cannot join) holds back its
        own lines only, never the private answers and other channels.
        """
        if self._protocol is None or getattr(self._protocol, "closed", True):
            return None
        if not self.registered.is_set():
            return None
        for key, queue in self._queues.items():
            if self._ready_for(queue[0].target):
                return key
        return None

    def _written(self, out: _Out) -> None:
        """Report a written line: sent, and awaiting its echo where the server echoes."""
        echoes = "echo-message" in self.caps_enabled and out.echo is not None
        if echoes:
            assert out.echo is not None
            self._unechoed.append((self._fold(out.echo[0]), out.echo[1], out.outbox_ids))
        for oid in out.outbox_ids:
            self.delivered(oid, "sent", awaits_confirm=echoes)

    @property
    def _queue(self) -> list[_Out]:
        """Every line waiting, in the order queued (all targets together)."""
        return sorted((out for q in self._queues.values() for out in q), key=lambda o: o.seq)

    @property
    def queued(self) -> int:
        """Lines waiting to be sent."""
        return self._queued

    # -- public waits (for tests, health checks and plugins) -----------------------
    async def wait_until(
        self,
        condition: Callable[[], bool],
        timeout: float | None = None,  # noqa: ASYNC109 (a wait's API, as the test servers')
    ) -> None:
        """Wait until ``condition()`` is true, checking it again each time this transport's
        state changes (registered, a channel joined, a line queued, the connection lost).

        Raises :class:`TimeoutError` after ``timeout`` seconds (``None``: no limit).
        """
        async with asyncio.timeout(timeout):
            while not condition():
                await self._queue_changed.wait()
                await asyncio.sleep(0)

    async def wait_joined(self, channel: str, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Wait until this transport is in ``channel`` (compared casefolded, as
        :attr:`joined` holds it); :class:`TimeoutError` after ``timeout`` seconds."""
        await self.wait_until(lambda: self._fold(channel) in self.joined, timeout)


def _plain(text: str) -> str:
    """What an echo is compared by: each line without formatting or trailing blanks."""
    return "\n".join(strip_formatting(part).rstrip() for part in text.split("\n"))


def sasl_chunks(payload: bytes) -> list[str]:
    """AUTHENTICATE arguments for ``payload``: base64 in 400-byte pieces.

    An empty payload is ``+``; a payload whose encoding is a multiple of 400
    bytes ends with a lone ``+`` so the server knows it is complete.
    """
    encoded = base64.b64encode(payload).decode()
    if not encoded:
        return ["+"]
    chunks = [encoded[i : i + _SASL_CHUNK] for i in range(0, len(encoded), _SASL_CHUNK)]
    if len(chunks[-1]) == _SASL_CHUNK:
        chunks.append("+")
    return chunks
