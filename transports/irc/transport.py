"""The IRC transport: one connection to one IRC network, on irc3.

irc3 provides the asyncio protocol, the bot object that writes lines and
the event dispatch (our handler is an ``irc3.event``).  Everything that
decides how a serious bot behaves on a real network is here:

* registration with IRCv3 ``CAP LS 302`` (``sasl``, ``message-tags``,
  ``server-time``, ``account-tag``, ``echo-message``, ``batch`` when
  offered), our own SASL PLAIN/EXTERNAL (AUTHENTICATE split at 400 bytes,
  903-907 handled, a rejected login stops the transport with a clear error),
  NickServ IDENTIFY as a fallback, alternate nicks on 433/432/437 and
  regaining the nick when its holder leaves, user mode from ISUPPORT ``BOT``;
* when to answer: always in private messages; in channels when addressed
  (``nick:``/``nick,`` or, in ``mention`` mode, the nick anywhere) or for a
  command; never a NOTICE, our own echo, or a sender tagged ``bot``; CTCP
  VERSION and PING answered by NOTICE, ACTION taken as text; a per-user
  incoming rate limit answered once with a notice;
* output: Markdown turned into IRC formatting, lines split on UTF-8 and word
  boundaries to fit 512 bytes once the server adds our ``:nick!user@host``
  prefix (learnt from our JOIN echo; ISUPPORT ``LINELEN`` honoured), a token
  bucket per connection (longer lines cost more), nothing dropped silently;
* reconnect with exponential backoff and jitter after a ping timeout or a
  lost connection, rejoin, and deliver what was queued meanwhile in order;
* shutdown: QUIT, no reconnect, no task left.

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
from dataclasses import dataclass
from typing import Any

from agentik.core.errors import ConfigError
from agentik.transports.base import (
    ChannelCaps,
    IncomingMessage,
    MessageSink,
    OutgoingMessage,
    Transport,
)

from .settings import IRCSettings
from .wire import (
    Line,
    ctcp,
    ctcp_parse,
    format_line,
    markdown_to_irc,
    parse_line,
    payload_budget,
    split_message,
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
    "multi-prefix",
)
#: Longest line we accept from a server before dropping it (tags + 512).
MAX_INCOMING = 8191 + 512
_SASL_CHUNK = 400


@dataclass(slots=True)
class _Out:
    target: str
    line: str
    cost: float
    #: Outbox rows completed by writing this line (its last piece).
    outbox_ids: tuple[int, ...] = ()
    #: ``(target, text)`` of a PRIVMSG/NOTICE the server echoes (echo-message).
    echo: tuple[str, str] | None = None


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

    options: IRCSettings

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
        self.caps_enabled: set[str] = set()
        self.joined: set[str] = set()
        self._sink: MessageSink | None = None
        self._bot: Any = None
        self._protocol: Any = None
        self._closing = False
        self._connected_at = 0.0
        self._attempt = 0
        self._lost = asyncio.Event()
        self._queue: deque[_Out] = deque()
        self._queue_changed = asyncio.Event()
        self._tokens = float(self.options.flood_burst)
        self._refilled = time.monotonic()
        self._ping_timer: asyncio.TimerHandle | None = None
        self._last_seen = time.monotonic()
        self._caps_offered: dict[str, str] = {}
        self._cap_pending = False
        self._sasl_state: str | None = None
        self._nick_candidates: list[str] = []
        self._user_hits: dict[str, deque[float]] = {}
        self._user_warned: dict[str, float] = {}
        self._in_code: dict[str, bool] = {}
        self._batches: dict[str, tuple[str, list[str]]] = {}
        self._batch_seq = 0
        self._batch_ids: dict[str, list[int]] = {}
        #: Lines written and not echoed yet (echo-message): ``(target, text, outbox ids)``.
        self._unechoed: deque[tuple[str, str, tuple[int, ...]]] = deque(maxlen=2000)

    # -- lifecycle -----------------------------------------------------------------
    async def start(self, sink: MessageSink) -> None:
        self._sink = sink
        irc3, connection, bot_cls = _irc3()
        o = self.options
        self._bot = bot_cls(
            nick=o.nick, username=o.username, realname=o.realname, host=o.host,
            port=o.effective_port, ssl=o.tls, asynchronous=False,
            loop=asyncio.get_running_loop(), connection=connection,
        )  # fmt: skip
        self._bot.owner = self
        self._connection_cls = connection
        self._bot.attach_events(irc3.event(r"^(?P<raw>.*)$", self._on_line))
        self.spawn(self._run(), name=f"agentik-irc:{self.name}")
        self.spawn(self._send_loop(), name=f"agentik-irc-send:{self.name}")

    async def serve(self) -> None:
        await self.closed.wait()

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
        await self.cancel_tasks()
        self.closed.set()

    # -- connecting ------------------------------------------------------------------
    def _ssl_context(self) -> ssl.SSLContext | None:
        o = self.options
        if not o.tls:
            return None
        try:
            ctx = ssl.create_default_context(cafile=o.ssl_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"transports.{self.name}.ssl_ca_file: {exc}") from None
        if not o.ssl_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if o.client_cert:
            try:
                ctx.load_cert_chain(o.client_cert, o.client_key)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"transports.{self.name}.client_cert: {exc}") from None
        return ctx

    async def _run(self) -> None:
        """Connect, and reconnect with backoff, until closed or failed."""
        o = self.options
        while not self._closing and self.failed is None:
            try:
                await self._connect()
            except ConfigError as exc:
                self._fail(str(exc))
                break
            except (OSError, ssl.SSLError, TimeoutError) as exc:
                log.warning(
                    "irc %s: cannot connect to %s:%s: %s", self.name, o.host, o.effective_port, exc
                )
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
        loop = asyncio.get_running_loop()
        bot = self._bot
        ctx = self._ssl_context()

        def make_protocol() -> Any:
            protocol = self._connection_cls()
            protocol.factory = bot
            protocol.encoding = "utf-8"
            return protocol

        async with asyncio.timeout(30):
            _, protocol = await loop.create_connection(
                make_protocol, host=o.host, port=o.effective_port, ssl=ctx,
                server_hostname=o.host if ctx is not None else None,
            )  # fmt: skip
        bot.protocol = protocol
        self._protocol = protocol
        self._lost.clear()
        self.registered.clear()
        self.joined.clear()
        self.caps_enabled.clear()
        self._caps_offered.clear()
        self._sasl_state = None
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

    def _on_lost(self, protocol: Any, exc: BaseException | None) -> None:
        if protocol is not self._protocol:
            return
        level = logging.DEBUG if self._closing else logging.WARNING
        log.log(level, "irc %s: connection lost (%s)", self.name, exc or "closed")
        self.registered.clear()
        self.joined.clear()
        self._unechoed.clear()  # never confirmed: a restart sends them again
        if self._ping_timer is not None:
            self._ping_timer.cancel()
        self._lost.set()
        self._queue_changed.set()

    def _fail(self, why: str) -> None:
        log.error("irc %s: %s", self.name, why)
        self.failed = why
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
            log.warning("irc %s: no answer for %.0fs: reconnecting", self.name, idle)
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
        elif cmd in ("900", "903"):
            if cmd == "903":
                self._sasl_state = "done"
                self._cap_end()
        elif cmd in ("902", "904", "905", "906", "907", "908"):
            self._on_sasl_failure(line)
        elif cmd == "001":
            self.nick = p[0] if p else self.nick
            self._cap_pending = False
        elif cmd == "005":
            for token in p[1:-1]:
                key, _, value = token.partition("=")
                self.isupport[key.upper()] = value
            if self.isupport.get("LINELEN", "").isdigit():
                self.linelen = max(512, int(self.isupport["LINELEN"]))
                # Let the bridge's rough split use the room too (we re-split exactly).
                self.caps = dataclasses.replace(self.caps, max_bytes=self.linelen - 112)
        elif cmd in ("376", "422"):
            self._on_registered()
        elif cmd in ("433", "432", "437") and not self.registered.is_set():
            self._next_nick()
        elif cmd == "JOIN":
            self._on_join(line)
        elif cmd in ("PART", "KICK"):
            self._on_part(line)
        elif cmd in ("QUIT", "NICK"):
            self._on_nick_change(line)
        elif cmd in ("PRIVMSG", "NOTICE"):
            self._on_message(line)
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
        if sub == "LS":
            more = len(p) >= 4 and p[2] == "*"
            for item in p[-1].split():
                key, _, value = item.partition("=")
                self._caps_offered[key] = value
            if more:
                return
            want = [c for c in WANTED_CAPS if c in self._caps_offered]
            if "sasl" in want and self.options.sasl_mechanism == "none":
                want.remove("sasl")
            if want:
                self._write(format_line("CAP", "REQ", " ".join(want)))
            else:
                self._cap_end()
        elif sub == "ACK":
            self.caps_enabled.update(c.lstrip("-=~") for c in p[-1].split())
            mech = self.options.sasl_mechanism
            if "sasl" in self.caps_enabled and mech != "none" and self._sasl_state is None:
                self._sasl_state = "started"
                self._write(format_line("AUTHENTICATE", mech.upper()))
            else:
                self._cap_end()
        elif sub == "NAK":
            self._cap_end()
        elif sub == "NEW" and "batch" not in self.caps_enabled:
            pass  # cap-notify: nothing we need mid-session

    def _cap_end(self) -> None:
        if self._cap_pending:
            self._cap_pending = False
            self._write("CAP END")

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
        if self.registered.is_set():
            return
        self.registered.set()
        log.info("irc %s: registered as %s", self.name, self.nick)
        bot_mode = self.isupport.get("BOT")
        if bot_mode:
            self._write(format_line("MODE", self.nick, f"+{bot_mode}"))
        o = self.options
        if o.nickserv_password is not None and self._sasl_state != "done":
            self._write(
                format_line(
                    "PRIVMSG", "NickServ", f"IDENTIFY {o.nickserv_password.get_secret_value()}"
                )
            )
        for entry in o.channels:
            chan, _, key = entry.partition(" ")
            self._write(format_line("JOIN", chan, key) if key else format_line("JOIN", chan))
        self._queue_changed.set()

    def _is_me(self, nick: str | None) -> bool:
        return bool(nick) and nick.lower() == self.nick.lower()  # type: ignore[union-attr]

    def _on_join(self, line: Line) -> None:
        nick, user, host = line.hostmask
        if not self._is_me(nick) or not line.params:
            return
        if user and host:
            self.user, self.host = user, host
        self.joined.add(line.params[0].lower())
        self._queue_changed.set()

    def _on_part(self, line: Line) -> None:
        if not line.params:
            return
        kicked = line.command == "KICK" and len(line.params) > 1 and self._is_me(line.params[1])
        if kicked or (line.command == "PART" and self._is_me(line.nick)):
            self.joined.discard(line.params[0].lower())

    def _on_nick_change(self, line: Line) -> None:
        old = line.nick or ""
        if line.command == "NICK" and self._is_me(old) and line.params:
            self.nick = line.params[0]
            return
        # The holder of our preferred nick left or changed: take it back.
        wanted = self.options.nick
        if old.lower() == wanted.lower() and not self._is_me(wanted):
            self._write(format_line("NICK", wanted))

    # -- incoming messages ------------------------------------------------------------------
    def _on_message(self, line: Line) -> None:
        if len(line.params) < 2 or line.nick is None:
            return
        sender = line.nick
        if self._is_me(sender):
            self._on_echo(line)
            return  # our own echo
        if "bot" in line.tags:
            return  # another bot
        target, text = line.params[0], line.params[-1]
        special = ctcp_parse(text)
        if line.command == "NOTICE":
            return  # never answer a notice
        if special is not None:
            command, arg = special
            if command == "ACTION":
                text = f"* {sender} {arg}"
            else:
                self._on_ctcp(sender, command, arg)
                return
        prefixes = self.isupport.get("CHANTYPES", "#&")
        direct = not target or target[0] not in prefixes
        if not self._allow(sender):
            return
        account = line.tags.get("account")
        if direct:
            key = f"irc:{self.network}:{(account or sender).lower()}"
            reply_to = sender
            addressed = True
        else:
            key = f"irc:{self.network}:{target.lower()}"
            reply_to = target
            text, addressed = self._addressed(text)
        message = IncomingMessage(
            channel_key=key, text=text, author_id=account or sender, author_name=sender,
            direct=direct, addressed=addressed, reply_to=reply_to,
            meta={"network": self.network, "account": account},
        )  # fmt: skip
        assert self._sink is not None
        self.spawn(self._sink.handle(message, self))

    def _on_echo(self, line: Line) -> None:
        """echo-message: the server relayed a line we wrote; its outbox rows are confirmed."""
        if "batch" in line.tags or len(line.params) < 2:
            return
        # Servers may drop trailing blanks from what they relay.
        want = (line.params[0].lower(), line.params[-1].rstrip())
        for i, (target, text, ids) in enumerate(self._unechoed):
            if (target, text.rstrip()) == want:
                del self._unechoed[i]
                for oid in ids:
                    self.delivered(oid, "confirmed")
                return

    def _addressed(self, text: str) -> tuple[str, bool]:
        nick = re.escape(self.nick)
        m = re.match(rf"^\s*{nick}\s*[:,]\s*(.*)$", text, re.I | re.S)
        if m:
            return m.group(1), True
        if self.options.address_mode == "mention":
            if re.search(rf"(?<![\w\-\[\]\\`^{{}}|]){nick}(?![\w\-\[\]\\`^{{}}|])", text, re.I):
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

    def _allow(self, sender: str) -> bool:
        """The per-user incoming rate limit (a sliding minute)."""
        now = time.monotonic()
        hits = self._user_hits.setdefault(sender.lower(), deque())
        while hits and now - hits[0] > 60:
            hits.popleft()
        if len(hits) >= self.options.user_rate_limit:
            if now - self._user_warned.get(sender.lower(), -1e9) > 60:
                self._user_warned[sender.lower()] = now
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
        if len(self._user_hits) > 10_000:  # forget idle users
            for nick in [n for n, h in self._user_hits.items() if not h][:5_000]:
                del self._user_hits[nick]
        return True

    # -- outgoing ------------------------------------------------------------------------------
    def _budget(self, target: str, command: str) -> int:
        return payload_budget(
            target, nick=self.nick, user=self.user, host=self.host, linelen=self.linelen,
            command=command,
        )  # fmt: skip

    def owns(self, channel_key: str) -> bool:
        return channel_key.startswith(f"irc:{self.network}:")

    async def send(self, message: OutgoingMessage) -> None:
        target = message.reply_to or message.channel_key.rsplit(":", 1)[-1]
        state_key = f"{target}\0{message.run_id}"
        if message.kind == "delta":
            return  # we stream by lines; the bridge sends complete ones
        if message.kind == "end":
            self._in_code.pop(state_key, None)
            self._flush_batch(state_key)
            return
        text: str | None = message.text
        oid = message.outbox_id
        if message.kind == "answer":
            text = self._format_answer_line(state_key, message.text)
        if text is None:
            self.delivered(oid, "confirmed")  # a code fence: nothing to send
            return
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
        self._enqueue(target, "\r\n".join(lines), cost=1.0 + len(pieces) / 4, outbox_ids=ids)

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
        self._queue.append(_Out(target, line, cost, outbox_ids, echo))
        if len(self._queue) > self.options.queue_limit:
            dropped = self._queue.popleft()
            log.warning(
                "irc %s: outgoing queue full (%d lines): dropped the oldest line to %s",
                self.name, self.options.queue_limit, dropped.target,
            )  # fmt: skip
        self._queue_changed.set()

    def _ready_for(self, target: str) -> bool:
        if self._protocol is None or getattr(self._protocol, "closed", True):
            return False
        if not self.registered.is_set():
            return False
        prefixes = self.isupport.get("CHANTYPES", "#&")
        if target and target[0] in prefixes:
            wanted = {c.partition(" ")[0].lower() for c in self.options.channels}
            # A configured channel: wait until we are (re)joined.
            return target.lower() in self.joined or target.lower() not in wanted
        return True

    async def _send_loop(self) -> None:
        """Drain the queue in order, under the token bucket, when connected."""
        o = self.options
        while True:
            while not self._queue or not self._ready_for(self._queue[0].target):
                self._queue_changed.clear()
                await self._queue_changed.wait()
            now = time.monotonic()
            self._tokens = min(
                float(o.flood_burst), self._tokens + (now - self._refilled) * o.flood_rate
            )
            self._refilled = now
            head = self._queue[0]
            need = min(head.cost, float(o.flood_burst))
            if self._tokens < need:
                await asyncio.sleep((need - self._tokens) / o.flood_rate)
                continue
            self._tokens -= need
            self._queue.popleft()
            self._write(head.line)
            self._written(head)

    def _written(self, out: _Out) -> None:
        """Report a written line: sent, and awaiting its echo where the server echoes."""
        echoes = "echo-message" in self.caps_enabled and out.echo is not None
        if echoes:
            assert out.echo is not None
            self._unechoed.append((out.echo[0].lower(), out.echo[1], out.outbox_ids))
        for oid in out.outbox_ids:
            self.delivered(oid, "sent", awaits_confirm=echoes)

    @property
    def queued(self) -> int:
        """Lines waiting to be sent."""
        return len(self._queue)


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
