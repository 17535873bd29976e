"""The Slack transport: slack-bolt's ``AsyncApp`` over Socket Mode or HTTP.

* Events: ``app_mention`` in channels, DMs (``message.im``), and replies in
  threads the bot takes part in.  Each thread is a conversation
  (``slack:<team>:<channel>:<thread_ts>``) and the bot answers in the thread,
  or, with ``conversation_per = "channel"``, each channel is one.
* Every message is handled once: by ``event_id`` (Slack retries slow
  deliveries) and by ``(channel, ts)`` (a mention arrives both as
  ``app_mention`` and ``message``), remembered in a small SQLite file so a
  restart does not answer again (on PostgreSQL: in the store, shared by every
  worker, :meth:`SlackTransport.share_seen_events`).
* **Acknowledged after the commit.**  Slack sends an event again when it is not
  acknowledged within 3 seconds (Socket Mode: the envelope's ack; HTTP mode: a 2xx
  answer), at once, after a minute and after five (``retry_num``/
  ``X-Slack-Retry-Num``), and never once it is.  So an event is recorded as handled,
  and acknowledged, only once the bridge has its message committed (or has decided
  it needs none): bolt runs our listeners before it answers
  (``process_before_response``), and a listener waits for that up to
  :data:`ACK_WAIT` seconds.  A worker killed before the commit acknowledged nothing
  and recorded nothing: Slack's redelivery, to whichever worker or the restarted
  process, is taken as new.  A commit slower than that, or a failure, answers a
  503 (Socket Mode: no ack): Slack sends the event again, and a redelivery that
  finds it in flight here waits for it (:meth:`SlackTransport._acknowledge`).
  With several workers (the shared store) an event is first *claimed* (for
  ``[cluster] lease_seconds``): a redelivery reaching another worker while the
  first still commits waits for it and is acknowledged without a second turn; one
  whose claim expired (its worker died) is taken.  Delivery is at-least-once in
  one place only: a process killed between its commit and the write recording the
  event (the store's write; on one process, the acknowledgement, the file being
  written within :data:`SEEN_FLUSH` after it) answers Slack's redelivery again.
* Streaming: Slack's native ``chat.startStream``/``appendStream``/
  ``stopStream`` (slack-sdk's ``chat_stream`` helper) where the workspace
  supports it, else post then ``chat.update``, no more often than
  ``edit_interval`` either way (a native append carries what was written
  meanwhile).  An answer complete before its first ``stream_buffer``
  characters, or within ``edit_interval`` of its first ones, is posted whole:
  one ``chat.postMessage`` (``markdown_text``) instead of a stream's three calls.
  The assistant status shows when no answer has shown ``status_delay``
  seconds after the message (Slack clears it when the answer is posted; we
  clear it at the end only if it was set).  Long answers continue in a new
  message.  429s are retried after ``Retry-After`` by slack-sdk's retry
  handler.
* ``!stop`` (any command prefix, handled by the bridge) and a
  ``:octagonal_sign:`` reaction on the bot's message stop the answer (the
  reaction is its reactor's ``!stop``, with the same rights).
* Display names, not ids, reach the model (``users.info``, cached), and
  message text as its author typed it (Slack's ``&lt;`` entities and link
  markup decoded, :func:`.mrkdwn.incoming`).
* Model text is escaped for Slack (:mod:`.mrkdwn`): no ``<!channel>``,
  ``<@U…>`` or fake link label the model writes ever goes out.
* Assistant threads (Slack's AI app view): a greeting and suggested prompts
  when one opens, its title from the first message, its context (the
  channel the user is looking at) kept for the thread (bolt's
  ``AsyncAssistant`` middleware).
* ``file_share`` (the text of a message with files) and ``thread_broadcast``
  messages are answered like plain ones; other subtypes are not messages
  from people and are ignored, as are the bot's own messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import os
import queue
import re
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentik.core.attachments import AttachmentSettings
from agentik.core.errors import ConfigError
from agentik.core.messages import FilePart
from agentik.core.threads import yield_to_loop
from agentik.transports.base import (
    NEW_CHANNEL,
    AgentHost,
    ChannelCaps,
    Form,
    IncomingMessage,
    MessageSink,
    OutgoingMessage,
    Transport,
    TransportFailed,
    host_of,
)

from .mrkdwn import clean, escape, incoming, markdown_safe, markdown_to_mrkdwn, stream_cut
from .settings import SlackSettings

__all__ = ["SeenEvents", "SlackTransport", "markdown_to_mrkdwn"]

log = logging.getLogger(__name__)

#: Seconds a closing transport lets the Web API calls under way finish before it
#: closes its HTTP session.
SEND_GRACE = 5.0

#: The ``event_type`` of the metadata on every message carrying an outbox piece (its
#: payload: the row id and the run): a redelivery finds a post whose answer never came
#: back by it (:meth:`SlackTransport._posted`).
PIECE_EVENT = "agentik_piece"
#: Seconds before a piece was written that its copy is looked for (the writer's clock
#: against Slack's).
_CLOCK_SLACK = 120.0
#: Pages of 200 messages a redelivery reads in one place for its earlier posts.
_PIECE_PAGES = 5

#: Seconds an event's acknowledgement waits for its message to be committed: Slack
#: counts an event not acknowledged within 3 seconds as failed and sends it again.
ACK_WAIT = 2.5
#: The prefix of a worker's claim on an event key in the shared store (see _claim).
_CLAIM = "claim:"
#: How long one ``auth.test`` asking a standby app's team may take, and how long after a
#: failed one Slack is not asked again (see :meth:`SlackTransport.identify`).
_IDENTIFY_TIMEOUT = 10.0
_IDENTIFY_RETRY = 15.0

_MENTION = re.compile(r"<@([A-Z0-9]+)(?:\|[^>]*)?>")
#: The most files of one file share that are fetched.
MAX_FILES = 10
#: Message subtypes that are a person's message (answered like plain ones).
_ANSWERED_SUBTYPES = frozenset({"file_share", "thread_broadcast"})
#: Our buttons' ``action_id``s (``agentik_action_0`` …): see :meth:`SlackTransport._on_action`.
_ACTION_ID = re.compile(r"^agentik_action_[0-9]+$")
#: A form's Submit button (:meth:`SlackTransport._on_form_submit`) and its inputs'
#: ``block_id`` prefix (the field id follows).
_FORM_SUBMIT = "agentik_form_submit"
_FIELD_BLOCK = "agentik_field_"
#: Longest command a form's Submit sends (the JSON of its answers).
_FORM_COMMAND_MAX = 40_000
#: Events about an assistant thread (Slack's AI app view): each names its thread.
_ASSISTANT_THREAD_EVENTS = frozenset(
    {"assistant_thread_started", "assistant_thread_context_changed"}
)
#: Slack API errors that mean a token is refused: retrying will not help.
_REJECTED = frozenset({
    "invalid_auth", "not_authed", "account_inactive", "token_revoked", "token_expired",
    "not_allowed_token_type", "team_access_not_granted", "ekm_access_denied",
    "org_login_required", "no_permission", "missing_scope",
})  # fmt: skip


class _OneLine(logging.Filter):
    """slack-sdk's Socket Mode client logs every failed reconnect with a traceback
    (every few seconds while Slack is unreachable): keep its one-line message."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.exc_info = None
        record.exc_text = None
        return True


_socket_log = logging.getLogger("agentik.transports.slack.socket_mode")
_socket_log.addFilter(_OneLine())


class SeenEvents(Protocol):
    """Handled events kept by the bot's store, shared by every worker of the bot (on
    PostgreSQL); given with :meth:`SlackTransport.share_seen_events` instead of the file."""

    async def first_seen(self, keys: Sequence[str]) -> Collection[str]:
        """Record ``keys`` as handled; those no worker had handled (atomically: of two
        workers given one key at once, one gets it back)."""
        ...

    async def known(self, keys: Sequence[str]) -> Collection[str]:
        """Those of ``keys`` recorded as handled (:meth:`first_seen`); a read."""
        ...

    async def claim_known(
        self, claims: Sequence[str], keys: Sequence[str]
    ) -> tuple[Collection[str], Collection[str]]:
        """Claim ``claims`` for this worker and read which of ``keys`` are :meth:`known`,
        in one round trip (the read sees the store as it was before the claims); the
        claims it got: those no worker claimed within the last ``claim_seconds``
        (atomically, as :meth:`first_seen`)."""
        ...


#: Keys written by one statement of the handled-events file (two parameters each: well
#: under SQLite's oldest limit of 999 a statement).
_SEEN_ROWS = 400
#: Seconds the keys of handled events gather before the file's next write (_Seen.later).
SEEN_FLUSH = 0.05


class _Seen:
    """Handled event keys, in memory and in a SQLite file (so restarts remember).

    The file keeps the newest ``keep`` keys (those a restart reads back); the older
    ones are deleted once a tenth of ``keep`` more has been written, not on every
    write: finding the newest ``keep`` sorts the whole table.

    It is a WAL file with ``synchronous = NORMAL``: a write is an append to the WAL,
    not the rollback journal's create, two fsyncs and delete (5-30 ms of waiting per
    write on a busy disk, and every message waits for its write).  A killed process
    loses nothing written; only a power cut can forget the last events, which matters
    only if Slack redelivers one of them after the machine is back.

    Writes (:meth:`write`) run in a thread of the file's own, from :meth:`open` to
    :meth:`close`: a bare thread and queue, not the loop's default executor, whose
    round trip costs about as much CPU again as the write (each message makes one).
    """

    def __init__(self, path: str, keep: int) -> None:
        self.path = path
        self.keep = keep
        self.keys: OrderedDict[str, None] = OrderedDict()
        self.rows = 0  # rows in the file, at most (a replaced key counts again)
        self.conn: sqlite3.Connection | None = None
        # Calls come from worker threads: one at a time, and never after close.
        self.lock = threading.Lock()
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        #: Keys for the file's next write, gathered by :meth:`later` (on the loop).
        self._later: list[str] = []
        self._later_timer: asyncio.TimerHandle | None = None

    def open(self) -> None:
        with self.lock:
            self._open()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="agentik-slack-seen", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        """Write what is queued, in batches: the writes queued while one is written go
        in the next one statement together, and their waiters are woken with one call
        into their loop (each message after its commit queues one write: a write a
        message woke this thread and the loop 8.8 times an answer in
        benchmarks/bench_slack.py, against 2.9 batched)."""
        yield_to_loop()  # its wake-ups wait for the loop thread's CPU (core/threads.py)
        stop = False
        while not stop and (job := self._jobs.get()) is not None:
            jobs = [job]
            while True:
                try:
                    more = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                jobs.append(more)
            error: BaseException | None = None
            try:
                self.persist(*(key for _, _, keys in jobs for key in keys))
            except BaseException as exc:
                error = exc
            by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
            for loop, done, _ in jobs:
                if loop is not None:  # None: a write nobody waits for (later)
                    by_loop.setdefault(loop, []).append(done)
            if error is not None and not by_loop:
                log.warning("could not record handled Slack events in %s: %s", self.path, error)
            for loop, waiting in by_loop.items():
                with contextlib.suppress(RuntimeError):  # that loop is closed
                    loop.call_soon_threadsafe(_settle_all, waiting, error)

    def later(self, keys: Sequence[str]) -> None:
        """Write ``keys`` to the file with those of the next :data:`SEEN_FLUSH` seconds,
        in one statement, nobody waiting for it: a handled event is acknowledged at its
        message's commit and remembered in memory at once; the file is what a *restart*
        reads back, for a redelivery of an event whose acknowledgement never reached
        Slack.  Written and waited for message by message, it cost 5.5-11.8 context
        switches of its thread (and wake-ups of the loop) an answer in
        benchmarks/bench_slack.py and 0.15-0.17 ms of CPU; gathered, under one."""
        if self._thread is None:
            return  # closed (or never opened): nothing to write to
        self._later.extend(keys)
        if self._later_timer is None:
            self._later_timer = asyncio.get_running_loop().call_later(SEEN_FLUSH, self.flush_later)

    def flush_later(self) -> None:
        """Hand what :meth:`later` gathered to the file's thread now (and on closing)."""
        if self._later_timer is not None:
            self._later_timer.cancel()
            self._later_timer = None
        keys, self._later = self._later, []
        if keys and self._thread is not None:
            self._jobs.put((None, None, keys))

    def write(self, keys: Sequence[str]) -> asyncio.Future[None]:
        """:meth:`persist` ``keys`` in the file's thread (done at once when closed)."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        if self._thread is None:
            done.set_result(None)  # closed (or never opened): nothing to write to
        else:
            self._jobs.put((loop, done, keys))
        return done

    def _open(self) -> None:
        self.conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("PRAGMA synchronous = NORMAL")
        self.conn.execute("CREATE TABLE IF NOT EXISTS seen (key TEXT PRIMARY KEY, at REAL)")
        rows = self.conn.execute(
            "SELECT key FROM seen ORDER BY at DESC LIMIT ?", (self.keep,)
        ).fetchall()
        for (key,) in reversed(rows):
            self.keys[key] = None
        (self.rows,) = self.conn.execute("SELECT COUNT(*) FROM seen").fetchone()

    def check_and_add(self, *keys: str) -> bool:
        """True if any key was seen before; records them all either way."""
        dup = self.known(keys)
        self.add(keys)
        return dup

    def known(self, keys: Sequence[str]) -> bool:
        """Whether any of ``keys`` was recorded (in memory: the newest ``keep``)."""
        return any(k in self.keys for k in keys)

    def add(self, keys: Sequence[str]) -> None:
        """Record ``keys`` in memory (:meth:`write` puts them in the file)."""
        for k in keys:
            self.keys[k] = None
            self.keys.move_to_end(k)
        while len(self.keys) > self.keep:
            self.keys.popitem(last=False)

    def persist(self, *keys: str) -> None:
        """Write ``keys`` to the file in one transaction.

        One statement for up to :data:`_SEEN_ROWS` keys (each message has two): the
        connection commits every statement itself, so ``executemany`` made each key a
        transaction of its own, and each step of a statement hands the GIL to the event
        loop and waits to take it back (7.5 context switches of this thread an answer
        in benchmarks/bench_slack.py, with two keys a message)."""
        with self.lock:
            if self.conn is None or not keys:
                return
            now = time.time()
            rows = [(k, now + i * 1e-6) for i, k in enumerate(keys)]  # in order, no ties
            chunks = [rows[i : i + _SEEN_ROWS] for i in range(0, len(rows), _SEEN_ROWS)]
            if len(chunks) > 1:
                self.conn.execute("BEGIN IMMEDIATE")
            try:
                for chunk in chunks:
                    self.conn.execute(
                        "INSERT OR REPLACE INTO seen (key, at) VALUES"
                        + ", ".join(["(?, ?)"] * len(chunk)),
                        [v for row in chunk for v in row],
                    )
                if len(chunks) > 1:
                    self.conn.execute("COMMIT")
            except BaseException:
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
                raise
            self.rows += len(keys)
            if self.rows > self.keep + self.keep // 10:
                self.conn.execute(
                    "DELETE FROM seen WHERE at < (SELECT MIN(at) FROM (SELECT at FROM seen"
                    " ORDER BY at DESC LIMIT ?))",
                    (self.keep,),
                )
                (self.rows,) = self.conn.execute("SELECT COUNT(*) FROM seen").fetchone()

    def close(self) -> None:
        """Finish the writes queued, end the thread, close the file (blocks: call it
        from a worker thread)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._jobs.put(None)
            thread.join()
        with self.lock:
            if self.conn is not None:
                self.conn.close()
                self.conn = None


def _settle_all(waiting: Sequence[asyncio.Future[None]], exc: BaseException | None) -> None:
    for done in waiting:
        if done.cancelled():
            continue
        if exc is not None:
            done.set_exception(exc)
        else:
            done.set_result(None)


class _ThreadContexts:
    """Assistant thread contexts (the channel a user looks at), in memory.

    Bolt's ``AsyncAssistantThreadContextStore`` protocol; its default store
    would rewrite the bot's first message in the thread to hold them.
    """

    def __init__(self) -> None:
        self.contexts: OrderedDict[tuple[str, str], dict[str, Any]] = OrderedDict()

    async def save(self, *, channel_id: str, thread_ts: str, context: dict[str, Any]) -> None:
        self.contexts[(channel_id, thread_ts)] = dict(context or {})
        self.contexts.move_to_end((channel_id, thread_ts))
        while len(self.contexts) > 5000:
            self.contexts.popitem(last=False)

    async def find(self, *, channel_id: str, thread_ts: str) -> Any:
        from slack_bolt.context.assistant.thread_context import AssistantThreadContext

        found = self.contexts.get((channel_id, thread_ts))
        return AssistantThreadContext(found) if found else None


def _file_links(files: Any) -> list[str]:
    """A message's files as ``[name: permalink]`` (Slack's page of the file: it asks
    whoever opens it to sign in to the workspace)."""
    out = []
    for f in files if isinstance(files, list) else ():
        link = f.get("permalink") if isinstance(f, dict) else None
        if isinstance(link, str) and link.startswith("https://"):
            name = " ".join(str(f.get("name") or f.get("title") or "file").split())[:80]
            out.append(f"[{clean(name)}: {link}]")
    return out[:10]


@dataclass(frozen=True, slots=True)
class _Incoming:
    """An event accepted by ``_on_event``, waiting for ``_deliver`` (``key`` None: not for us)."""

    seen: tuple[str, ...]
    key: str | None = None
    text: str = ""
    user: str = ""
    channel: str = ""
    thread_ts: str | None = None
    ts: str = ""
    direct: bool = False
    title: bool = False  # the first message of an assistant thread: it names the thread
    #: For the bot (a DM, a mention, a thread of its own); else a linked channel's chatter.
    addressed: bool = True
    #: ``edit``/``delete``: the person changed their message ``ts`` (a linked channel's).
    change: str | None = None
    #: The change event's own ts: the same change handed over twice is one change.
    change_id: str = ""
    #: The ``files`` of a file share (fetched when it is handed over).
    files: tuple[dict[str, Any], ...] = ()
    #: A reply in a thread this process does not know the bot takes part in: for the
    #: bot if the thread has a conversation (another worker, or a process before a
    #: restart, answered there), looked up when it is handed over.
    maybe_ours: bool = False
    #: Settled once the event is handled (True: its message committed, or it was not
    #: for the bot; Slack is acknowledged) or not (False: Slack is not, and sends it
    #: again); see :meth:`SlackTransport._acknowledge`.
    outcome: asyncio.Future[bool] | None = None


@dataclass
class _Status:
    """The assistant status of a thread whose message waits for its answer."""

    timer: asyncio.TimerHandle | None = None  # due: sets the status (None once fired)
    call: asyncio.Future[Any] | None = None  # the latest setStatus call, once started


@dataclass
class _Answer:
    """One answer being streamed into a thread."""

    channel: str
    thread_ts: str | None
    user: str | None
    text: str = ""
    ts: str | None = None  # edit mode: the message being edited
    shown: int = 0  # characters of ``text`` already in the current message
    offset: int = 0  # where the current message starts in ``text``
    last_edit: float = 0.0
    flush: asyncio.TimerHandle | None = None
    streamer: Any = None
    native: bool = False  # a native stream is open (streamer)
    streamed: int = 0  # native: characters in the current streamed message
    pending: str = ""  # native: text not streamed yet (all of it before the first append)
    first: float = 0.0  # native: when its first piece came (time.monotonic())
    appended: float = 0.0  # native: when its latest append went out
    done: bool = False  # ended: a flush still due sends nothing
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    outbox_id: int | None = None  # the bridge's outbox row of this answer
    reported: bool = False  # its first message's ts is in the outbox
    run: str = ""  # the run it answers (with outbox_id, its messages' metadata)

    @property
    def metadata(self) -> dict[str, Any] | None:
        return _piece_metadata(self.outbox_id, self.run)


class SlackTransport(Transport):
    """One Slack app (see the module docstring)."""

    type = "slack"
    default_command_prefix = "!"
    settings_model = SlackSettings
    outbox = True
    relays = True
    # Socket Mode connected / lost, reported as they happen.
    reports_health = True

    options: SlackSettings

    @property
    def exclusive(self) -> bool:
        """A Socket Mode app is one connection (one worker owns it); HTTP mode is
        served by every worker behind a load balancer."""
        return self.options.mode == "socket"

    @property
    def served_anywhere(self) -> bool:
        """HTTP mode: any worker behind the load balancer receives an event and may
        answer it (the Web API); several workers queue its turns."""
        return self.options.mode == "http"

    def __init__(self, *, name: str, settings: dict[str, Any] | None = None) -> None:
        super().__init__(name=name, settings=settings)
        o = self.options
        self.caps = ChannelCaps(
            max_chars=o.max_message_chars, can_edit=True, threads=True, typing=True,
            formatting="mrkdwn", streaming="deltas", forms="native",
        )  # fmt: skip
        self.team_id = ""
        #: The ``auth.test`` of :meth:`identify` under way (every caller awaits this one),
        #: and when the last one failed (not asked again for ``_IDENTIFY_RETRY`` s).
        self._asking_team: asyncio.Future[None] | None = None
        self._team_failed_at = -_IDENTIFY_RETRY
        self.bot_user_id = ""
        self._bot_id = ""  # the app's bot id (auth.test): its messages carry it
        self.client: Any = None
        self.app: Any = None
        self._handler: Any = None
        self._runner: Any = None
        #: The host (:class:`~agentik.transports.base.AgentHost`) given at :meth:`start`.
        self._sink: AgentHost | None = None
        self._seen = _Seen(o.state_file or ":memory:", o.dedupe_keep)
        #: Handled events shared with the bot's other workers (see share_seen_events).
        self._shared_seen: SeenEvents | None = None
        self._contexts = _ThreadContexts()
        self._untitled: set[tuple[str, str]] = set()  # assistant threads without a title yet
        self._mentions = "users" in o.allow_mentions
        self._connections = 0  # Socket Mode connections opened (hello frames seen)
        self._in_flight = 0  # send() calls under way (aclose waits for them)
        self._sending = True  # False once closing: send() sends nothing more
        self._sends_done: asyncio.Event | None = None
        self.where = ""  # what start() connected to, for the logs
        #: People by user id: (display name, profile image URL or ""), the most recent
        #: last, at most ``PEOPLE_KEPT`` (users.info is asked once per person).
        self._people: OrderedDict[str, tuple[str, str]] = OrderedDict()
        #: Whether Slack lets relayed copies carry their author's name and icon (the
        #: ``chat:write.customize`` scope); ``False`` once it refused (``missing_scope``):
        #: copies then say who wrote them in their text (``*alice@libera*: …``).
        self.customize = True
        #: Thread roots of linked channels, by (channel, thread_ts): who wrote it, its words.
        self._roots: OrderedDict[tuple[str, str], dict[str, str] | None] = OrderedDict()
        #: Our pieces found in a channel or thread by a redelivery (:meth:`_posted`):
        #: (channel, thread_ts) -> (when looked, from what time, (outbox id, run) -> ts).
        self._pieces_seen: OrderedDict[
            tuple[str, str | None], tuple[float, float, dict[tuple[int, str], str]]
        ] = OrderedDict()
        self._threads: set[str] = set()  # thread keys the bot takes part in
        self._answers: dict[str, _Answer] = {}
        self._bot_messages: OrderedDict[str, str] = OrderedDict()  # ts -> channel key
        self._native_ok: bool | None = None if o.streaming == "auto" else o.streaming == "native"
        self._incoming: asyncio.Queue[_Incoming] = asyncio.Queue()
        #: Events in flight here (received, not yet handled or given up), by key: their
        #: outcome, which a redelivery arriving meanwhile is acknowledged on.
        self._pending: dict[str, asyncio.Future[bool]] = {}
        #: Messages taken from ``_incoming`` and not handed to the bridge yet, and the
        #: hand-overs under way (see :meth:`_hand_over_received`).
        self._taken = 0
        self._handing: set[asyncio.Future[Any]] = set()
        #: Messages posted with a ``tag`` (approval requests): tag -> (channel, ts).
        self._tagged: OrderedDict[str, tuple[str, str]] = OrderedDict()
        #: Threads whose message waits for its answer: (channel, thread_ts) -> its status.
        self._statuses: dict[tuple[str, str | None], _Status] = {}

    # -- lifecycle --------------------------------------------------------------------
    async def start(self, sink: MessageSink) -> None:
        from slack_bolt.async_app import AsyncApp, AsyncAssistant
        from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler

        o = self.options
        for key in ("bot_token", "app_token" if o.mode == "socket" else "signing_secret"):
            secret = getattr(o, key)
            if secret is None or not secret.get_secret_value():
                raise ConfigError(f"transports.{self.name}.{key} is empty")
        self._sink = host_of(sink)
        if self._shared_seen is None:
            self._seen.path = self.state_path(sink)
            await asyncio.to_thread(self._seen.open)
        # Bolt is given the token itself, never a client next to it: given a
        # client, bolt still reads SLACK_BOT_TOKEN from the environment and
        # warns that it "will be unused" (the README exports it).  It builds
        # the client; the API URL and 429 retries are set on it before any call.
        self.app = AsyncApp(
            token=o.bot_token.get_secret_value(),
            signing_secret=o.signing_secret.get_secret_value() if o.signing_secret else None,
            request_verification_enabled=o.mode == "http",
            # Listeners run before bolt answers Slack: an event is acknowledged once its
            # message is committed (_acknowledge), never before (see the module doc).
            process_before_response=True,
            assistant_thread_context_store=self._contexts,  # type: ignore[arg-type]
        )
        self.client = self.app.client
        if o.api_url:
            self.client.base_url = o.api_url if o.api_url.endswith("/") else o.api_url + "/"
        # One HTTP session for every Web API call: without it slack-sdk opens a new
        # session, so a new connection (a TCP and TLS handshake), for each call, and an
        # answer makes four (status, stream start and stop, status cleared).  The
        # timeout is the one slack-sdk gives each of its own sessions.
        import aiohttp

        self.client.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.client.timeout)
        )
        self.client.retry_handlers.append(
            AsyncRateLimitErrorRetryHandler(max_retry_count=o.rate_limit_retries)
        )
        auth = await self._call("bot_token", self.client.auth_test())
        _seed_authorization(self.app, auth)
        self.bot_user_id = auth["user_id"]
        self._bot_id = auth.get("bot_id") or ""
        self.team_id = auth.get("team_id") or ""
        self.where = (
            f"team {auth.get('team') or '?'} ({self.team_id}) as @{auth.get('user') or '?'}"
            f" ({self.bot_user_id})"
        )
        # Before bolt's own: an assistant event without its thread is dropped here.
        self.app.use(self._drop_threadless_assistant_events)
        assistant = AsyncAssistant(thread_context_store=self._contexts)  # type: ignore[arg-type]
        assistant.thread_started(self._on_thread_started)
        self.app.assistant(assistant)
        self.app.event("app_mention")(self._on_event)
        self.app.event("message")(self._on_event)
        self.app.event("reaction_added")(self._on_reaction)
        self.app.action(_ACTION_ID)(self._on_action)
        self.app.action(_FORM_SUBMIT)(self._on_form_submit)
        self.spawn(self._deliver(), name=f"agentik-slack:{self.name}")
        if o.mode == "socket":
            from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler

            assert o.app_token is not None
            self._handler = AsyncSocketModeHandler(
                self.app, o.app_token.get_secret_value(), web_client=self.client,
                logger=_socket_log,
            )  # fmt: skip
            socket = self._handler.client
            socket.message_listeners.append(self._on_socket_message)
            socket.on_close_listeners.append(self._on_socket_close)
            # The app token is checked here, once: slack-sdk would retry a refused
            # one for ever.  Its reconnections go through _socket_url too.
            socket.wss_uri = await self._socket_url(starting=True)
            socket.issue_new_wss_url = self._socket_url
            await self._handler.connect_async()
            self.set_health("connected", None)
            log.info(
                "slack %s: connected to %s, Socket Mode", self.name, self.where,
                extra={"event": "startup", "transport": self.name, "url": self.where,
                       "mode": "socket"},
            )  # fmt: skip
        else:
            await self._serve_http()
            self.set_health("connected", None)
            log.info(
                "slack %s: connected to %s, HTTP mode: Events API at http://%s:%s%s",
                self.name, self.where, o.http_host, self.http_port, o.http_path,
                extra={"event": "startup", "transport": self.name, "url": self.where,
                       "mode": "http", "listen": f"{o.http_host}:{self.http_port}{o.http_path}"},
            )  # fmt: skip

    async def _call(self, token: str, call: Any) -> Any:
        """Await the Web API ``call``: a refused ``token`` is :class:`TransportFailed`
        (one line naming the key), an unreachable Slack a :class:`ConnectionError`
        (the bot retries with backoff)."""
        import aiohttp
        from slack_sdk.errors import SlackApiError

        try:
            return await call
        except SlackApiError as exc:
            error = str(exc.response.get("error") or "") if exc.response is not None else ""
            if error in _REJECTED:
                raise TransportFailed(
                    f"Slack refused the {token.replace('_', ' ')} ({error}):"
                    f" check transports.{self.name}.{token}"
                ) from None
            raise ConnectionError(f"Slack answered {error or 'an error'}") from None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            url = getattr(self.client, "base_url", "") or "Slack"
            why = " ".join(str(exc).split()) or type(exc).__name__
            raise ConnectionError(f"cannot reach {url}: {why}") from None

    async def _socket_url(self, *, starting: bool = False) -> str:
        """A Socket Mode URL (``apps.connections.open`` with the app token).

        A refused app token while running (revoked) marks the transport ``failed``
        and stops it: Slack will not take it back, and a socket retried for ever
        would look alive.  An unreachable Slack stays ``reconnecting`` (slack-sdk
        retries).
        """
        app_token = self.options.app_token
        assert app_token is not None
        try:
            opened = self.client.apps_connections_open(app_token=app_token.get_secret_value())
            response = await self._call("app_token", opened)
        except TransportFailed as exc:
            if not starting:
                self._give_up(str(exc))
            raise
        except ConnectionError as exc:
            if not starting:
                self.set_health("reconnecting", f"Socket Mode: {exc}")
            raise
        return str(response["url"])

    def _give_up(self, reason: str) -> None:
        """Stop for good: ``failed`` with ``reason``; :meth:`serve` returns (the bot
        sees ``failed`` and does not restart it)."""
        handler = self._handler
        if handler is not None:
            # slack-sdk's loops end when its client is closed; aclose() closes the rest.
            handler.client.closed = True
            handler.client.auto_reconnect_enabled = False
        log.error(
            "slack %s: %s; the transport has stopped", self.name, reason,
            extra={"event": "transport_failed", "transport": self.name},
        )  # fmt: skip
        self.set_health("failed", reason)
        self.closed.set()

    def state_path(self, sink: MessageSink) -> str:
        """Where handled events are remembered: ``state_file``, else
        ``slack-<name>-seen.sqlite3`` next to the agent's database (in memory
        when the database is, or is not a file: the host's
        :attr:`~agentik.transports.base.AgentHost.database`)."""
        if self.options.state_file:
            return self.options.state_file
        database = host_of(sink).database
        if database is None:
            return ":memory:"
        folder = os.path.dirname(os.path.abspath(database))
        return os.path.join(folder, f"slack-{self.name}-seen.sqlite3")

    async def _on_socket_message(self, client: Any, message: dict[str, Any], raw: str) -> None:
        """Socket Mode frames: a ``hello`` opens every connection; log reconnections."""
        # (slack-sdk handles Slack's "disconnect" request, a routine refresh,
        # before listeners see it; the next hello shows the new connection.)
        if message.get("type") == "hello":
            self._connections += 1
            self.set_health("connected", None)
            if self._connections > 1:
                log.info(
                    "slack %s: Socket Mode reconnected to %s", self.name, self.where,
                    extra={"event": "connection_restored", "transport": self.name},
                )  # fmt: skip

    async def _on_socket_close(self, message: Any) -> None:
        if self._handler is not None and not self._handler.client.closed:
            code = getattr(message, "data", None)
            self.set_health("reconnecting", f"Socket Mode connection lost (close code {code})")
            log.info(
                "slack %s: Socket Mode connection lost (close code %s); reconnecting",
                self.name, getattr(message, "data", None),
                extra={"event": "connection_lost", "transport": self.name},
            )  # fmt: skip

    async def _serve_http(self) -> None:
        from aiohttp import web
        from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request

        async def events(request: web.Request) -> web.Response:
            response = await self.app.async_dispatch(await to_bolt_request(request))
            return await to_aiohttp_response(response)

        webapp = web.Application()
        webapp.router.add_post(self.options.http_path, events)
        self._runner = web.AppRunner(webapp, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.options.http_host, self.options.http_port)
        await site.start()
        self.http_port = self.options.http_port
        # The address the site listens on (the real port when ``http_port = 0``).
        addresses = self._runner.addresses
        if addresses:
            self.http_port = addresses[0][1]

    def share_seen_events(self, seen: SeenEvents) -> None:
        """Check handled events with ``seen`` (the bot's store, shared by every worker)
        rather than the handled-events file, which only this process reads: on
        PostgreSQL, Slack's retry of an event one worker handled may reach another.
        Called by the bot before :meth:`start`."""
        self._shared_seen = seen
        self._seen.path = ":memory:"

    @property
    def seen_path(self) -> str:
        """Where the ids of handled events are kept: a SQLite file (by default next to the
        database, see :meth:`state_path`) or ``:memory:``."""
        return self._seen.path

    async def aclose(self) -> None:
        if self._asking_team is not None:
            self._asking_team.cancel()
        for answer in list(self._answers.values()):
            if answer.flush is not None:
                answer.flush.cancel()
        for state in self._statuses.values():
            if state.timer is not None:
                state.timer.cancel()
        if self._handler is not None:
            with contextlib.suppress(Exception):
                await self._handler.close_async()
            self._handler = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self._hand_over_received()
        # From now on nothing is sent (slack-sdk would open a new HTTP session for a
        # call after ours is closed): what the turns still write stays in the outbox for
        # the next owner (or the next start), which sends it once. Sent from here, it
        # could reach Slack after the connection was handed over, while the next owner
        # redelivered it: an answer posted twice (tests/test_cluster_scale.py).
        self._sending = False
        if self._in_flight:  # posts under way finish (and are recorded) first, ≤ 5 s
            self._sends_done = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SEND_GRACE):
                    await self._sends_done.wait()
            self._sends_done = None
        await self.cancel_tasks()
        session = getattr(self.client, "session", None)
        if session is not None:
            await session.close()
        self._seen.flush_later()
        await asyncio.to_thread(self._seen.close)
        self.closed.set()

    # -- incoming ---------------------------------------------------------------------
    async def _name(self, user: str) -> str:
        return (await self._person(user))[0]

    async def _person(self, user: str) -> tuple[str, str]:
        """``user``'s display name and profile image (an ``https`` URL, or ``""``), from
        users.info once per person (the last ``PEOPLE_KEPT`` people are kept)."""
        found = self._people.get(user)
        if found is not None:
            self._people.move_to_end(user)
            return found
        try:
            info = (await self.client.users_info(user=user))["user"]
            profile = info.get("profile") or {}
            name = (
                profile.get("display_name") or info.get("real_name") or info.get("name")
                or user
            )  # fmt: skip
            image = next(
                (
                    str(profile[k]) for k in ("image_72", "image_48", "image_192")
                    if isinstance(profile.get(k), str) and profile[k].startswith("https://")
                ),
                "",
            )  # fmt: skip
        except Exception as exc:  # the name is a nicety: never lose the message
            log.info("slack %s: users.info %s failed: %s", self.name, user, exc)
            name, image = user, ""
        found = self._people[user] = (str(name), image)
        while len(self._people) > PEOPLE_KEPT:
            self._people.popitem(last=False)
        return found

    def _key(self, channel: str, thread_ts: str | None) -> str:
        if self.options.conversation_per == "thread" and thread_ts:
            return f"slack:{self.team_id}:{channel}:{thread_ts}"
        return f"slack:{self.team_id}:{channel}"

    async def _on_event(self, body: dict[str, Any], event: dict[str, Any]) -> Any:
        """A ``message`` or ``app_mention`` event: queued for :meth:`_deliver`, and
        acknowledged once its message is committed (:meth:`_acknowledge`)."""
        # Bolt runs each listener as its own task.  Nothing in _take awaits, so
        # messages reach the queue (and the bridge) in the order they arrived; the
        # I/O happens in _deliver.
        outcome = self._take(body, event)
        return None if outcome is None else await self._acknowledge(outcome)

    def _take(self, body: dict[str, Any], event: dict[str, Any]) -> asyncio.Future[bool] | None:
        """Queue ``event`` (a person's message, or a change of one) for :meth:`_deliver`;
        the outcome it is acknowledged on (``None``: nothing to wait for)."""
        subtype = event.get("subtype")
        if subtype in ("message_changed", "message_deleted"):
            return self._on_change(body, event)
        if event.get("bot_id") or (subtype and subtype not in _ANSWERED_SUBTYPES):
            return None  # bots (ourselves too), edits, deletions, joins …: not a person's
        user, channel, ts = event.get("user"), event.get("channel"), event.get("ts")
        if not all(isinstance(v, str) and v for v in (user, channel, ts)):
            return None
        assert isinstance(user, str) and isinstance(channel, str) and isinstance(ts, str)
        if user == self.bot_user_id:
            return None
        event_id = body.get("event_id") or f"{channel}:{ts}:{event.get('type')}"
        keys = (f"event:{event_id}", f"msg:{channel}:{ts}")
        new, outcome = self._arrive(keys)
        if not new:
            return outcome  # a redelivery, or the mention's twin: acknowledged as it was
        text = event.get("text")
        text = clean(text) if isinstance(text, str) else ""
        links = _file_links(event.get("files"))
        shared = event.get("files") if subtype == "file_share" else None
        files = (
            tuple(f for f in shared[:MAX_FILES] if isinstance(f, dict))
            if isinstance(shared, list)
            else ()
        )
        if not text.strip() and not files and not links:  # nothing to answer
            self._incoming.put_nowait(_Incoming(keys, outcome=outcome))
            return outcome
        is_dm = event.get("channel_type") == "im"
        mentioned = f"<@{self.bot_user_id}>" in text
        thread_ts = event.get("thread_ts")
        if not isinstance(thread_ts, str) or not thread_ts:
            thread_ts = None
        if not is_dm and self.options.conversation_per == "thread":
            thread_ts = thread_ts or ts
        key = self._key(channel, thread_ts)
        if links and not is_dm and self.hears is not None and self.hears(key):
            # A linked channel's attachments: relayed (and seen) as links to them.
            text = f"{text} {' '.join(links)}".strip()
        if not text.strip() and not files:  # nothing to answer
            self._incoming.put_nowait(_Incoming(keys, outcome=outcome))
            return outcome
        addressed = is_dm or mentioned or key in self._threads
        maybe_ours = False
        if event.get("type") == "message" and not addressed:
            if self.hears is None or not self.hears(key):
                if not self._thread_reply(event):
                    # Chatter outside our threads.
                    self._incoming.put_nowait(_Incoming(keys, outcome=outcome))
                    return outcome
                # Maybe a thread the bot answers in elsewhere (_deliver looks it up).
                maybe_ours = True
            # A linked channel's chatter: the bridge relays it (it is not for the bot).
        else:
            self._threads.add(key)
        text = _MENTION.sub(lambda m: "" if m.group(1) == self.bot_user_id else m.group(0), text)
        text = incoming(text)  # what the person typed: no &lt; entities, no link markup
        title = False
        if thread_ts and (channel, thread_ts) in self._untitled:
            self._untitled.discard((channel, thread_ts))
            title = True
        self._incoming.put_nowait(
            _Incoming(keys, key, text.strip(), user, channel, thread_ts, ts, is_dm, title,
                      addressed, files=files if addressed or maybe_ours else (),
                      maybe_ours=maybe_ours, outcome=outcome)
        )  # fmt: skip
        return outcome

    def _thread_reply(self, event: dict[str, Any]) -> bool:
        """A reply in a thread (not its first message), each thread a conversation: the
        bot may take part in it without this process knowing (see :meth:`_ours`)."""
        thread_ts = event.get("thread_ts")
        return (
            self.options.conversation_per == "thread"
            and isinstance(thread_ts, str) and bool(thread_ts) and thread_ts != event.get("ts")
        )  # fmt: skip

    async def _ours(self, item: _Incoming) -> bool | None:
        """Whether the thread of ``item`` (a reply nobody addressed to the bot, in a
        thread this process does not know) is one the bot takes part in: its channel
        key is bound to a conversation.  With several workers, the thread's first
        message may have reached another worker (Slack's HTTP mode behind a load
        balancer), and after a restart this process knows no thread.  ``None``: the
        store could not say (the event is not acknowledged, and comes again)."""
        agent = self._sink.agent if self._sink is not None else None
        if agent is None or item.key is None:
            return False
        try:
            bound = await agent.store.get_binding(item.key)
        except Exception as exc:
            log.warning("slack %s: could not tell whether the bot is in %s: %s", self.name,
                        item.key, exc)  # fmt: skip
            return None
        if bound is None:
            return False
        self._threads.add(item.key)
        return True

    def _on_change(
        self, body: dict[str, Any], event: dict[str, Any]
    ) -> asyncio.Future[bool] | None:
        """A ``message_changed``/``message_deleted`` event: a person edited or deleted a
        message.  Only a linked channel's matter (the bridge carries the change to the
        message's relayed copies); ours (any bot's) and changes that leave the words
        as they were (an unfurl, a reply count) are not."""
        channel, event_ts = event.get("channel"), event.get("ts")
        before = event.get("previous_message") or {}
        if event.get("subtype") == "message_changed":
            now = event.get("message") or {}
            change, ts, text = "edit", now.get("ts"), now.get("text")
            if not isinstance(text, str) or text == before.get("text"):
                return None
        else:
            now, change, ts, text = before, "delete", event.get("deleted_ts"), ""
        user = now.get("user") or before.get("user")
        if (
            not all(isinstance(v, str) and v for v in (channel, ts, user, event_ts))
            or now.get("bot_id") or before.get("bot_id") or user == self.bot_user_id
            or event.get("channel_type") == "im"
        ):  # fmt: skip
            return None
        assert isinstance(channel, str) and isinstance(ts, str) and isinstance(user, str)
        thread_ts = now.get("thread_ts") or before.get("thread_ts")
        if not isinstance(thread_ts, str) or not thread_ts:
            thread_ts = None
        if self.options.conversation_per == "thread":
            thread_ts = thread_ts or ts
        key = self._key(channel, thread_ts)
        if self.hears is None or not self.hears(key):
            return None
        keys = (f"event:{body.get('event_id') or f'{channel}:{event_ts}:change'}",)
        new, outcome = self._arrive(keys)
        if not new:
            return outcome
        text = _MENTION.sub(
            lambda m: "" if m.group(1) == self.bot_user_id else m.group(0), clean(text)
        )
        self._incoming.put_nowait(
            _Incoming(keys, key, incoming(text).strip(), user, channel, thread_ts, ts,
                      addressed=False, change=change, change_id=str(event_ts), outcome=outcome)
        )  # fmt: skip
        return outcome

    async def _on_action(self, ack: Any, body: dict[str, Any]) -> None:
        """A button of ours was pressed (a ``block_actions`` payload, Socket Mode or HTTP).

        Pressing it is the presser sending the button's command (``!approve
        3f2``) where the message is: it goes to the bridge as their message,
        checked like typed text (their identity is the verified Slack user id).
        """
        await ack()
        user = (body.get("user") or {}).get("id")
        actions = body.get("actions") or []
        container = body.get("container") or {}
        message = body.get("message") or {}
        channel = (body.get("channel") or {}).get("id") or container.get("channel_id")
        if not actions or not isinstance(user, str) or not user or not isinstance(channel, str):
            return
        if user == self.bot_user_id:
            return
        command = actions[0].get("value")
        if not isinstance(command, str) or not command.strip() or len(command) > 500:
            return
        ts = message.get("ts") or container.get("message_ts") or ""
        thread_ts = message.get("thread_ts") or container.get("thread_ts")
        action_ts = actions[0].get("action_ts") or ""
        keys = (f"action:{channel}:{ts}:{user}:{action_ts}",)
        new, outcome = self._arrive(keys)
        if not new:
            return
        is_dm = channel.startswith("D")
        key = self._bot_messages.get(ts) or self._key(channel, thread_ts)
        self._incoming.put_nowait(
            _Incoming(keys, key, clean(command).strip(), user, channel, thread_ts, action_ts,
                      is_dm, outcome=outcome)
        )  # fmt: skip

    async def _on_form_submit(self, ack: Any, body: dict[str, Any]) -> None:
        """A form's Submit was pressed (``block_actions``): the presser sends the
        form's command with what they entered (``state.values`` of its inputs) as a
        JSON object, checked like typed text; their identity is the verified user id."""
        await ack()
        user = (body.get("user") or {}).get("id")
        actions = body.get("actions") or []
        container = body.get("container") or {}
        message = body.get("message") or {}
        channel = (body.get("channel") or {}).get("id") or container.get("channel_id")
        if not actions or not isinstance(user, str) or not user or not isinstance(channel, str):
            return
        if user == self.bot_user_id:
            return
        command = actions[0].get("value")
        if not isinstance(command, str) or not command.strip() or len(command) > 200:
            return
        values = ((body.get("state") or {}).get("values")) or {}
        answers: dict[str, str] = {}
        for block_id, by_action in values.items() if isinstance(values, dict) else ():
            if not isinstance(block_id, str) or not block_id.startswith(_FIELD_BLOCK):
                continue
            state = by_action.get("answer") if isinstance(by_action, dict) else None
            if not isinstance(state, dict):
                continue
            value = state.get("value")
            if state.get("type") == "static_select":
                value = (state.get("selected_option") or {}).get("value")
            if isinstance(value, str):
                answers[block_id[len(_FIELD_BLOCK) :]] = value
        text = f"{command} {json.dumps(answers, ensure_ascii=False)}"
        if len(text) > _FORM_COMMAND_MAX:
            return
        ts = message.get("ts") or container.get("message_ts") or ""
        thread_ts = message.get("thread_ts") or container.get("thread_ts")
        action_ts = actions[0].get("action_ts") or ""
        keys = (f"action:{channel}:{ts}:{user}:{action_ts}",)
        new, outcome = self._arrive(keys)
        if not new:
            return
        key = self._bot_messages.get(ts) or self._key(channel, thread_ts)
        self._incoming.put_nowait(
            _Incoming(keys, key, clean(text).strip(), user, channel, thread_ts, action_ts,
                      channel.startswith("D"), outcome=outcome)
        )  # fmt: skip

    async def _drop_threadless_assistant_events(
        self, body: dict[str, Any], next: Callable[[], Awaitable[Any]]
    ) -> Any:
        """Bolt global middleware: an ``assistant_thread_*`` event whose
        ``assistant_thread`` lacks its channel or ts cannot be answered (bolt's
        assistant helpers raise and log an error on it).  Slack always sends both;
        one without them is acknowledged, logged as a warning and dropped."""
        event = body.get("event") if isinstance(body, dict) else None
        if isinstance(event, dict) and event.get("type") in _ASSISTANT_THREAD_EVENTS:
            thread = event.get("assistant_thread")
            if not isinstance(thread, dict) or not all(
                isinstance(thread.get(k), str) and thread.get(k)
                for k in ("channel_id", "thread_ts")
            ):
                log.warning(
                    "slack %s: dropped an %s event without its thread's channel_id and thread_ts",
                    self.name, event.get("type"),
                )  # fmt: skip
                from slack_bolt.response import BoltResponse

                return BoltResponse(status=200, body="")  # acknowledged, nothing more to do
        return await next()

    async def _on_thread_started(
        self, body: dict[str, Any], event: dict[str, Any], say: Any, set_suggested_prompts: Any
    ) -> None:
        """A user opened a new assistant thread: greet, offer the prompts."""
        thread = event.get("assistant_thread") or {}
        channel, thread_ts = thread.get("channel_id"), thread.get("thread_ts")
        if not channel or not thread_ts:
            return
        if self._seen.check_and_add(f"event:{body.get('event_id') or channel + ':' + thread_ts}"):
            return
        if len(self._untitled) >= 5000:  # threads whose first message never came
            self._untitled.pop()
        self._untitled.add((channel, thread_ts))
        context = thread.get("context") or {}
        await self._contexts.save(channel_id=channel, thread_ts=thread_ts, context=context)
        o = self.options
        try:
            if o.assistant_greeting.strip():
                response = await say(
                    text=markdown_to_mrkdwn(o.assistant_greeting),
                    metadata={"event_type": "assistant_thread_context", "event_payload": context},
                )
                self._remember(response.get("ts"), self._key(channel, thread_ts))
            prompts = [p.model_dump() for p in o.assistant_prompts]
            if prompts:
                await set_suggested_prompts(prompts=prompts)
        except Exception as exc:  # a greeting is a nicety: log it, the thread still works
            log.warning("slack %s: could not greet an assistant thread: %s", self.name, exc)

    def _arrive(self, keys: tuple[str, ...]) -> tuple[bool, asyncio.Future[bool]]:
        """An event with ``keys`` arrived: ``(True, outcome)`` when it is new (now in
        flight here, settled by :meth:`_finished`), else ``(False, outcome)`` of the
        event it repeats (Slack's redelivery, or a mention's ``message`` twin): handled
        already, or still in flight."""
        loop = asyncio.get_running_loop()
        if self._seen.known(keys):
            done = loop.create_future()
            done.set_result(True)
            return False, done
        for k in keys:
            earlier = self._pending.get(k)
            if earlier is not None:
                return False, earlier
        outcome = loop.create_future()
        for k in keys:
            self._pending[k] = outcome
        return True, outcome

    def _finished(self, item: _Incoming, *, handled: bool) -> None:
        """``item`` is out of flight: ``handled`` (remembered here: a redelivery is
        acknowledged and dropped) or not (a redelivery is taken as new)."""
        outcome = item.outcome
        for k in item.seen:
            if outcome is None or self._pending.get(k) is outcome:
                self._pending.pop(k, None)
        if handled:
            self._seen.add(item.seen)
        if outcome is not None and not outcome.done():
            outcome.set_result(handled)

    async def _acknowledge(self, outcome: asyncio.Future[bool]) -> Any:
        """What bolt answers Slack for an event: ``None`` (bolt acknowledges it) once
        ``outcome`` says it was handled, within :data:`ACK_WAIT`; else a 503, which is
        no acknowledgement (HTTP mode: an error status; Socket Mode: bolt sends no ack)
        so Slack sends the event again (see the module docstring)."""
        try:
            async with asyncio.timeout(ACK_WAIT):
                handled = await asyncio.shield(outcome)
        except TimeoutError:
            handled = False
        if handled:
            return None
        from slack_bolt.response import BoltResponse

        return BoltResponse(status=503, body="")

    async def _deliver(self) -> None:
        """Hand incoming messages to the bridge in arrival order.

        Each message goes to the bridge as its own task, started in arrival order
        (the bridge takes a channel's messages in the order their calls began, as
        IRC's): one message's turn being set up (its conversation written) does not
        hold up the next thread's.  An event is recorded as handled once the bridge
        has its message (committed), not before (:meth:`_handle`); those with nothing
        for the bot are recorded together, in one write.  With the shared store,
        each event is first claimed for this worker (:meth:`_claim`).
        """
        while True:
            items = [await self._incoming.get()]
            while not self._incoming.empty():
                items.append(self._incoming.get_nowait())
            self._taken = len(items)
            if self._shared_seen is not None:
                items = await self._claim(items)
            quiet: list[_Incoming] = []  # nothing for the bot: handled once recorded
            for item in items:
                if item.key is None:
                    quiet.append(item)
                    continue
                if item.maybe_ours:
                    ours = await self._ours(item)
                    if ours is None:  # could not tell: Slack sends it again
                        self._finished(item, handled=False)
                        continue
                    if not ours:
                        quiet.append(item)  # chatter in a thread the bot is not in
                        continue
                    item = dataclasses.replace(item, addressed=True, maybe_ours=False)
                try:
                    await self._hand_over(item)
                except Exception:
                    log.exception("slack %s: could not deliver a message", self.name)
                    self._finished(item, handled=False)
            if quiet:
                await self._record(quiet)
            self._taken = 0

    async def _hand_over_received(self, limit: float = 5.0) -> None:
        """Once nothing more arrives (the socket or HTTP listener closed): let what was
        received reach the bridge (at most ``limit`` seconds) before the tasks are
        cancelled.  What is cut here was not acknowledged (nor recorded): Slack sends
        it again, to the next owner or worker."""
        deadline = asyncio.get_running_loop().time() + limit
        while not self._incoming.empty() or self._taken or self._handing:
            if asyncio.get_running_loop().time() > deadline:
                log.warning("slack %s: stopped with %d message(s) not handed over", self.name,
                            self._incoming.qsize() + self._taken)  # fmt: skip
                return
            if self._handing:
                await asyncio.wait(set(self._handing), timeout=0.05)
            else:
                await asyncio.sleep(0.01)

    async def _claim(self, items: list[_Incoming]) -> list[_Incoming]:
        """The items this worker takes: those whose every key it claimed in the shared
        store (for :attr:`SeenEvents.claim_seconds`) and no worker has handled.  The
        others are settled: handled elsewhere (acknowledged), or in flight elsewhere
        (:meth:`_elsewhere` waits for it a little)."""
        assert self._shared_seen is not None
        keys = [k for i in items for k in i.seen]
        try:
            # One round trip (it was two: the claim, then the read).
            got, handled = await self._shared_seen.claim_known([_CLAIM + k for k in keys], keys)
            won, done = set(got), set(handled)
        except Exception:
            log.exception("slack %s: could not check %d events (Slack sends them again)",
                          self.name, len(items))  # fmt: skip
            for i in items:
                self._finished(i, handled=False)
            return []
        mine: list[_Incoming] = []
        busy: list[_Incoming] = []
        for i in items:
            if any(k in done for k in i.seen):
                self._finished(i, handled=True)  # another worker handled it
            elif all(_CLAIM + k in won for k in i.seen):
                mine.append(i)
            else:
                busy.append(i)
        if busy:
            log.debug("slack %s: %d events in hand elsewhere", self.name, len(busy))
            self.spawn(self._elsewhere(busy), name=f"agentik-slack-elsewhere:{self.name}")
        return mine

    async def _elsewhere(self, items: list[_Incoming]) -> None:
        """Events another worker claimed: acknowledged once it has handled them (most
        take milliseconds); not, if it has not within most of :data:`ACK_WAIT` (it may
        have died before its commit): Slack sends them again, and once the claim expires the
        worker that gets one takes it."""
        assert self._shared_seen is not None
        loop = asyncio.get_running_loop()
        # Given up before the acknowledgement's own wait ends: the 503 then goes out
        # with the event out of flight here, so Slack's next attempt claims it afresh
        # rather than waiting on this one.
        deadline = loop.time() + ACK_WAIT * 0.8
        pause = 0.05
        try:
            while items and loop.time() < deadline:
                await asyncio.sleep(pause)  # (a poll: the wait is short and rare)
                pause = min(pause * 2, 0.4)
                try:
                    done = set(await self._shared_seen.known([k for i in items for k in i.seen]))
                except Exception as exc:
                    log.info("slack %s: could not read handled events: %s", self.name, exc)
                    break
                for i in [i for i in items if any(k in done for k in i.seen)]:
                    self._finished(i, handled=True)
                    items.remove(i)
        finally:
            for i in items:
                self._finished(i, handled=False)

    async def _record(self, items: Sequence[_Incoming]) -> None:
        """Record ``items`` as handled (the file, or the shared store), in one write, and
        settle them: acknowledged.  A write that fails is logged: the events are
        handled all the same (a redelivery of one would be taken again)."""
        keys = [k for i in items for k in i.seen]
        if self._shared_seen is None:
            # Acknowledged now (the message is committed); the file, written within
            # SEEN_FLUSH, serves a restart (_Seen.later).
            self._seen.later(keys)
            for i in items:
                self._finished(i, handled=True)
            return
        try:
            await self._shared_seen.first_seen(keys)
        except Exception as exc:
            log.warning("slack %s: could not record %d handled events: %s", self.name,
                        len(items), exc)  # fmt: skip
        for i in items:
            self._finished(i, handled=True)

    async def _hand_over(self, item: _Incoming) -> None:
        """``item`` to the bridge (a task of its own), its assistant status due in
        ``status_delay`` (:meth:`_status_soon`)."""
        meta: dict[str, Any] = {"team": self.team_id, "ts": item.ts}
        if item.change:
            meta["change"] = item.change
            meta["change_id"] = item.change_id
        if item.thread_ts == item.ts and not item.direct and not item.change:
            # A top-level message, its own thread: no conversation is bound to its key.
            meta[NEW_CHANNEL] = item.key
        if item.thread_ts and item.thread_ts != item.ts and not item.direct:
            meta["thread_ts"] = item.thread_ts  # a reply in a thread
            if not item.change and self.hears is not None and self.hears(item.key or ""):
                # A linked channel's: the networks without threads quote what it answers.
                root = await self._root(item.channel, item.thread_ts)
                if root is not None:
                    meta["thread_root"] = root
        if item.thread_ts:
            found = self._contexts.contexts.get((item.channel, item.thread_ts))
            if found:
                meta["assistant_context"] = dict(found)
        assert item.key is not None
        text = item.text
        attachments: tuple[FilePart, ...] = ()
        if item.files:
            attachments, missing = await self._fetch_files(item.files)
            # A file that could not be fetched is named, so the model knows it was sent.
            text = "\n".join([text, *(f"[file {n!r}: could not be fetched]" for n in missing)])
            text = text.strip()
        name, image = await self._person(item.user)
        if image and not item.direct:
            meta["icon"] = image  # (a linked channel's copies in Slack show it)
        message = IncomingMessage(
            channel_key=item.key, text=text, author_id=item.user,
            author_name=name, direct=item.direct,
            addressed=item.addressed,
            reply_to={"channel": item.channel, "thread_ts": item.thread_ts, "user": item.user},
            meta=meta, attachments=attachments,
        )  # fmt: skip
        if item.title and item.thread_ts:
            await self._title(item.channel, item.thread_ts, item.text)
        if item.thread_ts and self.options.status_text and not item.change:
            self._status_soon(item.channel, item.thread_ts)
        task = self.spawn(self._handle(message, item), name=f"agentik-slack-handle:{self.name}")
        self._handing.add(task)
        task.add_done_callback(self._handing.discard)

    async def _root(self, channel: str, thread_ts: str) -> dict[str, str] | None:
        """The first message of a thread: ``{"author": name, "text": words}`` (a copy
        relayed by us: the name it was posted under), ``None`` when Slack will not say."""
        where = (channel, thread_ts)
        if where in self._roots:
            self._roots.move_to_end(where)
            return self._roots[where]
        found: dict[str, str] | None = None
        try:
            reply = await self.client.conversations_replies(
                channel=channel, ts=thread_ts, limit=1, inclusive=True
            )
            first = (reply.get("messages") or [None])[0]
            if isinstance(first, dict) and first.get("ts") == thread_ts:
                user = first.get("user")
                author = first.get("username") or (
                    await self._name(user) if isinstance(user, str) and user else "someone"
                )
                text = first.get("text") if isinstance(first.get("text"), str) else ""
                found = {"author": str(author), "text": incoming(clean(text or "")).strip()}
        except Exception as exc:  # the quote is a nicety: never lose the message
            log.info("slack %s: conversations.replies %s failed: %s", self.name, thread_ts, exc)
        self._roots[where] = found
        while len(self._roots) > 1000:
            self._roots.popitem(last=False)
        return found

    async def _fetch_files(
        self, files: Sequence[dict[str, Any]]
    ) -> tuple[tuple[FilePart, ...], list[str]]:
        """The bytes of a file share's files (``url_private``, with the bot token), as
        parts the conversation checks and stores; the names of those that could not be
        fetched.  A file larger than ``[attachments] max_bytes`` (as declared, or as
        read: reading stops one byte past the cap) comes with no more than that, and
        its declared size, so that the conversation refuses it with one line."""
        agent = self._sink.agent if self._sink is not None else None
        limit = agent.attachments.max_bytes if agent is not None else AttachmentSettings().max_bytes
        parts: list[FilePart] = []
        missing: list[str] = []
        for f in files:
            name = str(f.get("name") or f.get("title") or "file")[:200]
            size = f.get("size")
            declared = size if isinstance(size, int) else 0
            url = f.get("url_private")
            if declared > limit:
                parts.append(FilePart(data=b"", name=name, size=declared))
                continue
            if not isinstance(url, str) or not url.startswith(("https://", "http://")):
                missing.append(name)
                continue
            try:
                data = await self._download(url, limit)
            except Exception as exc:
                log.warning("slack %s: could not fetch file %r: %s", self.name, name, exc)
                missing.append(name)
                continue
            parts.append(FilePart(data=data, name=name, size=max(declared, len(data))))
        return tuple(parts), missing

    async def _download(self, url: str, limit: int) -> bytes:
        """GET ``url`` with the bot token, at most ``limit + 1`` bytes.  Redirects are
        followed by hand (at most 3): the token goes only to the host the file's URL
        names, never to another one a redirect points at."""
        import aiohttp
        from yarl import URL

        token = self.options.bot_token.get_secret_value()
        origin = URL(url)
        target = origin
        session = self.client.session
        assert session is not None
        for _ in range(4):
            same = (target.scheme, target.host, target.port) == (
                origin.scheme, origin.host, origin.port,
            )  # fmt: skip
            headers = {"Authorization": f"Bearer {token}"} if same else {}
            async with session.get(
                target, headers=headers, allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=self.client.timeout),
            ) as r:  # fmt: skip
                if r.status in (301, 302, 303, 307, 308) and "location" in r.headers:
                    target = target.join(URL(r.headers["location"]))
                    continue
                if r.status != 200:
                    raise RuntimeError(f"HTTP {r.status}")
                data = bytearray()
                async for chunk in r.content.iter_chunked(65536):
                    data += chunk
                    if len(data) > limit:
                        break  # enough to know it is too large
                return bytes(data[: limit + 1])
        raise RuntimeError("too many redirects")

    def _status_soon(self, channel: str, thread_ts: str) -> None:
        """Set the assistant status in ``status_delay`` seconds, unless something shows
        in the thread first (:meth:`_before_post`): an answer that shows at once needs
        no status (two calls and a flicker saved).  Each message asks for it, as a
        message that comes while an answer is being written (Slack cleared the status
        when it was posted) waits too."""
        where = (channel, thread_ts)
        state = self._statuses.get(where)
        if state is not None and state.timer is not None:
            return  # due already
        if state is None:
            state = self._statuses[where] = _Status()
            while len(self._statuses) > 5000:  # threads whose answer never ended
                oldest = self._statuses.pop(next(iter(self._statuses)))
                if oldest.timer is not None:
                    oldest.timer.cancel()
        if self.options.status_delay > 0:
            loop = asyncio.get_running_loop()
            state.timer = loop.call_later(self.options.status_delay, self._status_due, where)
        else:
            self._status_due(where)

    def _status_due(self, where: tuple[str, str | None]) -> None:
        """Nothing has shown in the thread yet: set the status (the next message does
        not wait for Slack's answer; what is sent in the thread does)."""
        state = self._statuses.get(where)
        if state is None:
            return
        state.timer = None
        state.call = self.spawn(self._status(where[0], where[1], self.options.status_text))

    async def _before_post(self, channel: str, thread_ts: str | None) -> None:
        """Something is about to show in the thread: a status not set yet is not
        needed any more; one being set is set first, so it never lands after it."""
        where = (channel, thread_ts)
        state = self._statuses.get(where)
        if state is None:
            return
        if state.timer is not None:
            state.timer.cancel()
            state.timer = None
            if state.call is None:
                del self._statuses[where]  # never set: nothing to clear
                return
        if state.call is not None and not state.call.done():
            await asyncio.wait([state.call])  # a cancelled send leaves the call running

    async def _status_done(self, channel: str, thread_ts: str | None) -> None:
        """The answer has ended: clear the status if it was set."""
        state = self._statuses.pop((channel, thread_ts), None)
        if state is None:
            return
        if state.timer is not None:
            state.timer.cancel()  # the turn ended before the status was due
        if state.call is None:
            return  # never set
        if not state.call.done():
            await asyncio.wait([state.call])
        await self._status(channel, thread_ts, "")

    async def _handle(self, message: IncomingMessage, item: _Incoming) -> None:
        """``message`` to the bridge; once it returns (the message is committed, or it
        was decided there is nothing to commit), ``item`` is recorded as handled and
        Slack acknowledged.  A failure (or a cut at close) leaves it unacknowledged."""
        assert self._sink is not None
        try:
            await self._sink.handle(message, self)
        except Exception:
            log.exception("slack %s: could not deliver a message (Slack sends it again)",
                          self.name)  # fmt: skip
            self._finished(item, handled=False)
            return
        except BaseException:
            self._finished(item, handled=False)  # cancelled (closing): not handled
            raise
        await self._record([item])

    async def _title(self, channel: str, thread_ts: str, text: str) -> None:
        """Name an assistant thread after its first message (its first line, shortened)."""
        title = (text.strip().splitlines() or [""])[0].strip()
        if len(title) > 60:
            title = title[:59].rstrip() + "…"
        if not title:
            return
        try:
            await self.client.assistant_threads_setTitle(
                channel_id=channel, thread_ts=thread_ts, title=title
            )
        except Exception as exc:
            log.info("slack %s: setTitle: %s", self.name, exc)

    async def _on_reaction(self, body: dict[str, Any], event: dict[str, Any]) -> Any:
        """The stop reaction on one of our messages: its reactor sending ``!stop``.

        Like a button press, it goes to the bridge as the reactor's message, so
        the rules of ``!stop`` apply (someone else's answer needs the
        ``stop-others`` right; an ignored user is ignored).
        """
        if event.get("reaction") != self.options.stop_reaction:
            return
        item = event.get("item") or {}
        key = self._bot_messages.get(item.get("ts", ""))
        user, channel = event.get("user"), item.get("channel")
        if key is None or not isinstance(user, str) or not user or user == self.bot_user_id:
            return
        if not isinstance(channel, str) or not channel:
            return
        ts = event.get("event_ts") or item.get("ts") or ""
        keys = (f"event:{body.get('event_id') or f'{channel}:{ts}:reaction:{user}'}",)
        new, outcome = self._arrive(keys)
        if not new:
            return await self._acknowledge(outcome)
        prefix = self.default_command_prefix
        if self._sink is not None:
            try:
                prefix = (await self._sink.effective(key, self)).options.command_prefix
            except BaseException:
                self._finished(_Incoming(keys, outcome=outcome), handled=False)
                raise
        if not prefix:
            # Commands are off here: so is stopping by reaction (recorded, nothing more).
            self._incoming.put_nowait(_Incoming(keys, outcome=outcome))
        else:
            parts = key.split(":")  # slack:<team>:<channel>[:<thread_ts>]
            thread_ts = parts[3] if len(parts) > 3 else None
            self._incoming.put_nowait(
                _Incoming(keys, key, f"{prefix}stop", user, channel, thread_ts, ts,
                          channel.startswith("D"), outcome=outcome)
            )  # fmt: skip
        return await self._acknowledge(outcome)

    async def _status(self, channel: str, thread_ts: str | None, status: str) -> None:
        if not thread_ts or not self.options.status_text:
            return
        try:
            await self.client.assistant_threads_setStatus(
                channel_id=channel, thread_ts=thread_ts, status=status
            )
        except Exception as exc:  # only assistant threads have a status
            log.debug("slack %s: setStatus: %s", self.name, exc)

    # -- outgoing ------------------------------------------------------------------------
    def _remember(self, ts: str | None, key: str) -> None:
        if ts:
            self._bot_messages[ts] = key
            while len(self._bot_messages) > 5000:
                self._bot_messages.popitem(last=False)

    def owns(self, channel_key: str) -> bool:
        return bool(self.team_id) and channel_key.startswith(f"slack:{self.team_id}:")

    async def identify(self) -> None:
        """The app's team (its keys name it), from one ``auth.test`` with the bot token,
        no socket opened: a worker holding this app in standby can then tell its
        channels from another Slack app's (copies and answers it writes for them).

        Callers at the same time share one call (the standby start and each copy that
        waits for it); one takes at most ``_IDENTIFY_TIMEOUT`` s, and after a failure
        Slack is not asked again for ``_IDENTIFY_RETRY`` s (the failure is raised at
        once: copies do not each wait for an unreachable Slack)."""
        if self.team_id:
            return
        asking = self._asking_team
        if asking is None or asking.done():
            if time.monotonic() - self._team_failed_at < _IDENTIFY_RETRY:
                raise ConnectionError("Slack could not be asked for the app's team just now")
            asking = self._asking_team = asyncio.ensure_future(self._ask_team())
            # (read here too: every caller may have stopped waiting before it failed)
            asking.add_done_callback(lambda f: f.cancelled() or f.exception())
        # (shielded: a caller that stops waiting leaves the call to the others)
        await asyncio.shield(asking)

    async def _ask_team(self) -> None:
        try:
            async with asyncio.timeout(_IDENTIFY_TIMEOUT):
                await self._auth_team()
        except BaseException:
            self._team_failed_at = time.monotonic()
            raise

    async def _auth_team(self) -> None:
        from slack_sdk.web.async_client import AsyncWebClient

        o = self.options
        client = AsyncWebClient(token=o.bot_token.get_secret_value())
        if o.api_url:
            client.base_url = o.api_url if o.api_url.endswith("/") else o.api_url + "/"
        auth = await self._call("bot_token", client.auth_test())
        self.team_id = self.team_id or auth.get("team_id") or ""

    def in_thread(self, channel_key: str) -> bool:
        # slack:<team>:<channel>:<thread_ts> (see _key)
        return self.owns(channel_key) and channel_key.count(":") >= 3

    async def send(self, message: OutgoingMessage) -> None:
        if not self._sending:
            # Closing (see aclose): an outbox piece stays queued, delivered once by the
            # next owner; anything else was not for keeping.
            log.debug("slack %s: closing; not sent to %s (%s)", self.name,
                      message.channel_key, message.kind)  # fmt: skip
            return
        # Counted while in flight: aclose() lets them finish before it closes the HTTP
        # session (a post cut there may have reached Slack unrecorded: sent again by
        # whoever redelivers the outbox).
        with self._counted():
            await self._send(message)

    @contextlib.contextmanager
    def _counted(self) -> Iterator[None]:
        """Count a send (or a flush due) while it is in flight (see :meth:`aclose`)."""
        self._in_flight += 1
        try:
            yield
        finally:
            self._in_flight -= 1
            if not self._in_flight and self._sends_done is not None:
                self._sends_done.set()

    async def _send(self, message: OutgoingMessage) -> None:
        where = message.reply_to or {}
        parts = message.channel_key.split(":")
        channel = where.get("channel") or parts[2]
        # Without reply_to (an answer resumed after a restart) the key names the thread.
        thread_ts = where.get("thread_ts") if where else (parts[3] if len(parts) > 3 else None)
        run = message.run_id or ""
        if message.kind == "delta":
            answer = self._answers.get(run)
            if answer is None:
                answer = self._answers[run] = _Answer(channel, thread_ts, where.get("user"),
                                                      run=run)  # fmt: skip
            answer.outbox_id = answer.outbox_id or message.outbox_id
            async with answer.lock:
                await self._delta(message.channel_key, answer, message.text)
            return
        if message.kind == "end":
            answer = self._answers.pop(run, None)
            if answer is not None:
                # An answer held whole (holds_answer) got its outbox row at its end.
                answer.outbox_id = answer.outbox_id or message.outbox_id
                async with answer.lock:
                    await self._finish(message.channel_key, answer)
                self.delivered(answer.outbox_id, "confirmed")
            await self._status_done(channel, thread_ts)
            return
        if message.kind in ("relay", "unrelay"):
            # A relayed copy's reply data is its author: the key names the place, and a
            # copy into a thread (a reply relayed from a network without threads, see
            # _relay) names its thread.
            channel, thread_ts = parts[2], parts[3] if len(parts) > 3 else None
            thread = where.get("thread") if isinstance(where, dict) else None
            if thread_ts is None and isinstance(thread, str) and thread:
                thread_ts = thread
        if message.written_at is not None and message.replaces is None:
            # Sent again (a restart, a handover): the last process may have posted it
            # just before it stopped, before it wrote that down.  One lookup for answers,
            # notices and relayed copies alike, in the channel or the thread: the piece
            # metadata every post of an outbox piece carries.
            found = await self._posted(channel, thread_ts, message)
            if found is not None and message.kind != "answer":
                self._remember(found, message.channel_key)
                self.delivered(message.outbox_id, "confirmed", ref=found)
                return  # it is there already, as it was written
            message = dataclasses.replace(message, replaces=found)
        await self._before_post(channel, thread_ts)
        if message.kind == "answer" and message.outbox_id is not None:
            await self._redeliver(message, channel, thread_ts, where.get("user"))
            return
        if message.kind in ("relay", "unrelay"):
            await self._relay(channel, thread_ts, message)
            return
        if message.kind == "answer":
            text = markdown_to_mrkdwn(message.text, user_mentions=self._mentions)
        else:  # notices, errors, command replies: plain text, shown as written
            text = escape(message.text)
        if message.kind == "notice":
            text = f"_{text}_"
        sections = _sections(text)
        earlier = self._tagged.get(message.updates) if message.updates else None
        if earlier is not None:
            # The message that asked (its buttons) now says how it ended.
            await self.client.chat_update(
                channel=earlier[0], ts=earlier[1], text=text, blocks=sections
            )
            self.delivered(message.outbox_id, "confirmed", ref=earlier[1])
            return
        blocks = None
        if message.actions:
            buttons = [
                {
                    "type": "button",
                    "action_id": f"agentik_action_{i}",
                    "text": {"type": "plain_text", "text": a.label[:75]},
                    "value": a.command,
                    **({"style": a.style} if a.style else {}),
                }
                for i, a in enumerate(message.actions[:5])
            ]
            blocks = [*sections, {"type": "actions", "elements": buttons}]
        if message.form is not None:
            blocks = [*sections, *_form_blocks(message.form)]
        response = await self.client.chat_postMessage(
            channel=channel, thread_ts=thread_ts, text=text, blocks=blocks,
            metadata=_piece_metadata(message.outbox_id, run),
        )  # fmt: skip
        self._remember(response.get("ts"), message.channel_key)
        if message.tag and response.get("ts"):
            self._tagged[message.tag] = (channel, response["ts"])
            while len(self._tagged) > 5000:
                self._tagged.popitem(last=False)
        self.delivered(message.outbox_id, "confirmed", ref=response.get("ts"))

    async def _relay(self, channel: str, thread_ts: str | None, message: OutgoingMessage) -> None:
        """A person's message from a linked channel, posted under their name (the
        ``username`` override; ``chat:write.customize``): its text escaped, so no
        ``<!channel>``, mention or link markup can come of relaying.  With ``replaces``
        (the copy's ts), an edit or (``unrelay``) a deletion of that copy: a copy that is
        not there any more (deleted in Slack, or by this change before a restart) is
        nothing to change, and the change is done."""
        from slack_sdk.errors import SlackApiError

        if message.replaces:
            try:
                if message.kind == "unrelay":
                    # The person deleted their message: so goes its copy.
                    await self.client.chat_delete(channel=channel, ts=message.replaces)
                else:
                    # The person edited their message: its copy says what it says now
                    # (the name it was posted under stays).
                    author = " ".join(clean(message.author or "").split())[:80] or "someone"
                    words = (
                        escape(message.text) if self.customize
                        else _signed(author, message.text)
                    )  # fmt: skip
                    await self.client.chat_update(channel=channel, ts=message.replaces, text=words)
            except SlackApiError as exc:
                if exc.response.get("error") != "message_not_found":
                    raise
                log.info("slack %s: the copy %s in %s is gone: not changed", self.name,
                         message.replaces, channel)  # fmt: skip
            self.delivered(message.outbox_id, "confirmed", ref=message.replaces)
            return
        author = " ".join(clean(message.author or "").split())[:80] or "someone"
        where = message.reply_to if isinstance(message.reply_to, dict) else {}
        post = functools.partial(
            self.client.chat_postMessage, channel=channel, thread_ts=thread_ts,
            unfurl_links=False, unfurl_media=False,
            # (which piece it is: found again after a restart, see _posted)
            metadata=_piece_metadata(message.outbox_id, message.run_id or ""),
        )  # fmt: skip
        response = None
        if self.customize:
            try:
                response = await post(
                    text=escape(message.text), username=author, **_icon(where.get("icon"))
                )
            except SlackApiError as exc:
                if exc.response.get("error") != "missing_scope":
                    raise
                # The app lacks chat:write.customize (made from an older manifest):
                # the copies say who wrote them in their text from now on.
                self.customize = False
                log.warning(
                    "slack %s: Slack refuses relayed copies under their author's name"
                    " (missing_scope, needs chat:write.customize): they are posted as"
                    " '*name*: text' until the app has the scope and the bot restarts",
                    self.name,
                )  # fmt: skip
        if response is None:
            response = await post(text=_signed(author, message.text))
        self._remember(response.get("ts"), message.channel_key)
        self.delivered(message.outbox_id, "confirmed", ref=response.get("ts"))

    async def _redeliver(
        self, message: OutgoingMessage, channel: str, thread_ts: str | None, user: str | None
    ) -> None:
        """A whole answer from the outbox after a restart: update the message it
        started (``replaces``, its ts) or post it; never a second post of it."""
        answer = _Answer(channel, thread_ts, user, text=message.text, ts=message.replaces,
                         run=message.run_id or "")  # fmt: skip
        answer.outbox_id, answer.reported = message.outbox_id, message.replaces is not None
        if answer.ts is not None:
            self._remember(answer.ts, message.channel_key)
        async with answer.lock:
            await self._edit(message.channel_key, answer, final=True)
        self.delivered(answer.outbox_id, "confirmed")

    async def _posted(
        self, channel: str, thread_ts: str | None, message: OutgoingMessage
    ) -> str | None:
        """The ts of our message carrying ``message``'s piece (by its metadata), if one
        was posted since the piece was written: a post that reached Slack while the
        process that sent it stopped (its answer, the ts, never came back, so the outbox
        does not know it).  The same for every piece: an answer, a notice, a relayed copy,
        in a channel or a thread.  A call that fails means none (the piece is posted: at
        worst twice, as before)."""
        if message.outbox_id is None or message.written_at is None:
            return None
        since = max(0.0, message.written_at - _CLOCK_SLACK)
        found = await self._pieces_in(channel, thread_ts, since)
        ts = found.get((message.outbox_id, message.run_id or ""))
        if ts is not None:
            log.info("slack %s: piece %d was posted already (%s): not posted again", self.name,
                     message.outbox_id, ts)  # fmt: skip
        return ts

    async def _pieces_in(
        self, channel: str, thread_ts: str | None, since: float
    ) -> dict[tuple[int, str], str]:
        """Our pieces posted in ``channel`` (or its thread ``thread_ts``) since ``since``,
        by (outbox id, run): a long answer's first message (the one it updates).  Looked
        up once a minute per place at most (``conversations.history``, or
        ``conversations.replies`` in a thread, a few pages): a restart's redelivery asks
        about many pieces of one place at once, and what the last process posted is all
        there by the first look."""
        now = time.monotonic()
        place = (channel, thread_ts)
        cached = self._pieces_seen.get(place)
        if cached is not None and now - cached[0] <= 60 and cached[1] <= since:
            return cached[2]
        found: dict[tuple[int, str], str] = {}
        cursor: str | None = None
        try:
            for _ in range(_PIECE_PAGES):
                args: dict[str, Any] = {"channel": channel, "oldest": f"{since:.6f}",
                                        "limit": 200, "include_all_metadata": True}  # fmt: skip
                if cursor:
                    args["cursor"] = cursor
                if thread_ts:
                    response = await self.client.conversations_replies(ts=thread_ts, **args)
                else:
                    response = await self.client.conversations_history(**args)
                for m in response.get("messages") or []:
                    key = self._piece_of(m)
                    if key is not None and (key not in found or float(m["ts"]) < float(found[key])):
                        found[key] = m["ts"]
                cursor = (response.get("response_metadata") or {}).get("next_cursor") or None
                if not response.get("has_more") or not cursor:
                    break
        except Exception as exc:
            log.info("slack %s: could not look for earlier posts of pieces in %s: %s",
                     self.name, channel, exc)  # fmt: skip
            return {}
        self._pieces_seen[place] = (now, since, found)
        while len(self._pieces_seen) > 200:
            self._pieces_seen.popitem(last=False)
        return found

    def _piece_of(self, m: dict[str, Any]) -> tuple[int, str] | None:
        """(outbox id, run) of message ``m`` if it is ours and carries a piece."""
        meta = m.get("metadata")
        if not isinstance(meta, dict) or meta.get("event_type") != PIECE_EVENT:
            return None
        if not (
            m.get("user") == self.bot_user_id or (self._bot_id and m.get("bot_id") == self._bot_id)
        ):
            return None
        payload = meta.get("event_payload") or {}
        oid, run = payload.get("outbox"), payload.get("run")
        if not isinstance(oid, int) or not isinstance(run, str):
            return None
        if not isinstance(m.get("ts"), str) or not m["ts"]:
            return None
        return oid, run

    def holds_answer(self, channel_key: str, reply_to: object) -> int:
        # A reply in a thread goes by native streaming, held until stream_buffer
        # characters: a shorter answer is posted whole (_finish), as _streams says.
        where = reply_to if isinstance(reply_to, dict) else {}
        parts = channel_key.split(":")
        thread_ts = where.get("thread_ts") if where else (parts[3] if len(parts) > 3 else None)
        if thread_ts is None or self._native_ok is False:
            return 0
        return self.options.stream_buffer

    def _streams(self, answer: _Answer) -> bool:
        """Whether ``answer`` goes by native streaming (or will, once it is long enough)."""
        return answer.native or (
            answer.ts is None and answer.thread_ts is not None and self._native_ok is not False
        )

    async def _delta(self, key: str, answer: _Answer, text: str) -> None:
        answer.text += text
        if self._streams(answer):
            answer.pending += text
            answer.first = answer.first or time.monotonic()
            if not answer.native and len(answer.pending) < self.options.stream_buffer:
                return  # nothing to send yet (a short answer is posted whole: _finish)
            if self._append_later(key, answer) or await self._append(key, answer):
                return
        await self._edit(key, answer, final=False)

    def _append_later(self, key: str, answer: _Answer) -> bool:
        """Whether the native stream's next append waits (a flush is then due): appends
        go out ``edit_interval`` apart, each with what was written meanwhile, and the
        first one ``edit_interval`` after the answer's first piece, so an answer written
        sooner than that is posted whole (one call instead of the stream's three)."""
        due = (answer.appended or answer.first) + self.options.edit_interval
        now = time.monotonic()
        if now >= due:
            return False
        if answer.flush is None:
            loop = asyncio.get_running_loop()
            answer.flush = loop.call_later(due - now, lambda: self.spawn(self._flush(key, answer)))
        return True

    async def _append(self, key: str, answer: _Answer) -> bool:
        """Append the whole words pending to the native stream (started first if need
        be); ``False`` if native streaming failed here (edit instead, from now on)."""
        try:
            if answer.streamer is None:
                await self._start_native(key, answer)
            # Whole words only, so a message never ends inside a word.
            text = answer.pending
            cut = max(text.rfind(" "), text.rfind("\n")) + 1
            cut = stream_cut(text[:cut])  # a link still arriving waits, to be checked whole
            answer.pending = text[cut:]
            if cut:
                answer.appended = time.monotonic()
            await self._stream(key, answer, self._safe(text[:cut]))
            self._native_ok = True
            return True
        except Exception as exc:
            self._native_failed(answer, exc)
            return False

    async def _stream(self, key: str, answer: _Answer, text: str, *, last: bool = False) -> None:
        """Append to the native stream (``last``: and stop it); a full message is stopped
        and a new one started."""
        limit = self.options.max_message_chars
        while len(text) > limit - answer.streamed:
            room = limit - answer.streamed
            cut = max(text.rfind(" ", 0, room + 1), text.rfind("\n", 0, room + 1))
            if cut > 0:
                head, text = text[:cut], text[cut + 1 :]
            elif answer.streamed:
                head = ""  # the next word starts the next message
            else:  # one word longer than a message (never cut inside an entity)
                room = _entity_safe(text, room)
                head, text = text[:room], text[room:]
            response = await answer.streamer.stop(markdown_text=head or None)
            self._streamed(key, answer, response)
            answer.streamer, answer.streamed = None, 0
            await self._start_native(key, answer)
        if last:
            self._streamed(key, answer, await answer.streamer.stop(markdown_text=text or None))
        elif text:
            await answer.streamer.append(markdown_text=text)
            answer.streamed += len(text)
            self._streamed(key, answer, None)

    def _streamed(self, key: str, answer: _Answer, stopped: Any) -> None:
        """Note the stream's message: remembered once ``stopped`` (its ``stop()``
        response), in the outbox once it exists (a restart updates it, never reposts)."""
        if stopped is not None:
            self._remember(stopped.get("ts"), key)
        ts = getattr(answer.streamer, "ts", None)
        if ts and not answer.reported:
            answer.reported = True
            self.delivered(answer.outbox_id, "sent", awaits_confirm=True, ref=ts)

    def _safe(self, text: str) -> str:
        """Model Markdown for ``markdown_text`` (native streaming), made safe."""
        return markdown_safe(text, user_mentions=self._mentions)

    def _native_failed(self, answer: _Answer, exc: Exception) -> None:
        """Native streaming is not available here: edit messages instead, from now on."""
        if self.options.streaming == "native":
            raise exc
        log.info("slack %s: native streaming unavailable (%s): posting and editing", self.name,
                 getattr(exc, "response", {}).get("error", exc) if hasattr(exc, "response")
                 else exc)  # fmt: skip
        self._native_ok = False
        answer.native = False
        answer.streamer = None

    async def _start_native(self, key: str, answer: _Answer) -> None:
        await self._before_post(answer.channel, answer.thread_ts)
        # The helper calls chat.startStream with the first append (we buffer the text
        # ourselves: its buffer is one character); a workspace without streaming fails
        # there and we fall back to edits.
        assert answer.thread_ts is not None  # native streams are replies in a thread
        answer.streamer = await self.client.chat_stream(
            channel=answer.channel, thread_ts=answer.thread_ts,
            recipient_team_id=self.team_id, recipient_user_id=answer.user, buffer_size=1,
        )  # fmt: skip
        answer.native = True

    async def _post_whole(self, key: str, answer: _Answer, text: str) -> None:
        """``text`` (safe Markdown), the whole answer, as one message: complete before
        its first append, it needs no stream (two calls fewer, and no flicker)."""
        await self._before_post(answer.channel, answer.thread_ts)
        response = await self.client.chat_postMessage(
            channel=answer.channel,
            thread_ts=answer.thread_ts,
            markdown_text=text if text.strip() else "…",
            metadata=answer.metadata,
        )
        answer.ts = response.get("ts")
        self._remember(answer.ts, key)
        if not answer.reported:
            answer.reported = True
            self.delivered(answer.outbox_id, "sent", awaits_confirm=True, ref=answer.ts)

    async def _edit(self, key: str, answer: _Answer, *, final: bool) -> None:
        """Post, then update the message at most every ``edit_interval`` seconds."""
        limit = self.options.max_message_chars
        while len(answer.text) - answer.offset > limit:
            # This message is full: finish it at a line or word break and continue
            # in a new one (a word longer than a message is cut).
            start, end = answer.offset, answer.offset + limit
            cut = answer.text.rfind("\n", start, end + 1)
            if cut <= start:
                cut = answer.text.rfind(" ", start, end + 1)
            head, rest = (cut, cut + 1) if cut > start else (end, end)
            await self._write(key, answer, answer.text[start:head])
            answer.ts, answer.offset, answer.shown = None, rest, 0
        now = time.monotonic()
        due = answer.last_edit + self.options.edit_interval
        if answer.ts is not None and not final and now < due:
            if answer.flush is None:
                loop = asyncio.get_running_loop()
                answer.flush = loop.call_later(
                    due - now, lambda: self.spawn(self._flush(key, answer))
                )
            return
        await self._write(key, answer, answer.text[answer.offset :])

    async def _flush(self, key: str, answer: _Answer) -> None:
        """An update due (:meth:`_edit`, :meth:`_append_later`): what was written since
        the last one goes out, unless the answer has ended (its end sent it all)."""
        with self._counted():
            async with answer.lock:
                answer.flush = None
                if answer.done or not self._sending:
                    return
                if self._streams(answer):
                    if answer.pending:
                        if await self._append(key, answer):
                            return
                        await self._edit(key, answer, final=False)
                elif answer.shown < len(answer.text) - answer.offset:
                    await self._write(key, answer, answer.text[answer.offset :])

    async def _write(self, key: str, answer: _Answer, text: str) -> None:
        body = markdown_to_mrkdwn(text, user_mentions=self._mentions) or "…"
        if answer.ts is None:
            await self._before_post(answer.channel, answer.thread_ts)
            response = await self.client.chat_postMessage(
                channel=answer.channel, thread_ts=answer.thread_ts, text=body,
                metadata=answer.metadata,
            )  # fmt: skip
            answer.ts = response.get("ts")
            self._remember(answer.ts, key)
            if not answer.reported:
                # The answer's first message exists: a restart updates it, never reposts.
                answer.reported = True
                self.delivered(answer.outbox_id, "sent", awaits_confirm=True, ref=answer.ts)
        elif answer.shown != len(text):
            await self.client.chat_update(channel=answer.channel, ts=answer.ts, text=body)
        answer.shown = len(text)
        answer.last_edit = time.monotonic()

    async def _finish(self, key: str, answer: _Answer) -> None:
        answer.done = True
        if answer.flush is not None:
            answer.flush.cancel()
            answer.flush = None
        if answer.native:
            try:
                await self._stream(key, answer, self._safe(answer.pending), last=True)
                answer.pending = ""
                self._native_ok = True
                return
            except Exception as exc:
                self._native_failed(answer, exc)
        elif self._streams(answer):
            text = self._safe(answer.pending)
            if len(text) <= self.options.max_message_chars:
                await self._post_whole(key, answer, text)
                return
            try:  # (a stream_buffer longer than a message)
                await self._start_native(key, answer)
                await self._stream(key, answer, text, last=True)
                self._native_ok = True
                return
            except Exception as exc:
                self._native_failed(answer, exc)
        await self._edit(key, answer, final=True)


#: People whose name and profile image are kept (users.info is asked once per person).
PEOPLE_KEPT = 5000

#: A Slack emoji name as ``icon_emoji`` takes it.
_EMOJI = re.compile(r"^:[a-z0-9_+'-]{1,80}:$")


def _icon(icon: object) -> dict[str, str]:
    """The ``chat.postMessage`` arguments showing ``icon`` as a relayed copy's avatar: an
    emoji (``:speech_balloon:``) as ``icon_emoji``, an ``https`` URL as ``icon_url``;
    anything else, none (the app's own icon)."""
    if not isinstance(icon, str) or not icon:
        return {}
    if _EMOJI.match(icon):
        return {"icon_emoji": icon}
    if icon.startswith("https://") and len(icon) <= 2000 and not any(c.isspace() for c in icon):
        return {"icon_url": icon}
    return {}


def _signed(author: str, text: str) -> str:
    """A relayed copy that cannot be posted under its author's name says it in its text,
    ``*alice@libera*: text`` (both escaped; the name's own emphasis marks left out)."""
    name = escape(author.translate(str.maketrans("", "", "*_~`"))) or "someone"
    return f"*{name}*: {escape(text)}"


def _piece_metadata(outbox_id: int | None, run: str) -> dict[str, Any] | None:
    """The message metadata of outbox piece ``outbox_id`` of ``run`` (``None``: a message
    not in the outbox)."""
    if outbox_id is None:
        return None
    return {"event_type": PIECE_EVENT, "event_payload": {"outbox": outbox_id, "run": run}}


def _plain(text: str, limit: int) -> dict[str, Any]:
    """A ``plain_text`` object: Slack shows it as written (no mrkdwn, no mentions,
    no links), so the model's words need no escaping; cut to ``limit``."""
    return {"type": "plain_text", "text": text if len(text) <= limit else text[: limit - 1] + "…"}


def _form_blocks(form: Form) -> list[dict[str, Any]]:
    """A form as Block Kit: an ``input`` block per question still open (a
    ``static_select`` of its choices, else a ``plain_text_input``) and a Submit
    button (:data:`_FORM_SUBMIT`, its value the form's command)."""
    blocks: list[dict[str, Any]] = []
    for n, f in enumerate(form.fields, 1):
        if f.id in form.answered:
            continue
        element: dict[str, Any]
        if f.choices:
            element = {
                "type": "static_select", "action_id": "answer",
                "placeholder": _plain("choose", 150),
                "options": [
                    {"text": _plain(c, 75), "value": c[:150]} for c in f.choices[:100]
                ],
            }  # fmt: skip
        else:
            element = {"type": "plain_text_input", "action_id": "answer", "max_length": 3000}
        blocks.append({
            "type": "input", "block_id": f"{_FIELD_BLOCK}{f.id}", "optional": not f.required,
            "label": _plain(f"{n}. {f.label}", 2000), "element": element,
        })  # fmt: skip
    blocks.append({
        "type": "actions", "block_id": "agentik_form",
        "elements": [{
            "type": "button", "action_id": _FORM_SUBMIT, "text": _plain("Submit", 75),
            "value": form.submit, "style": "primary",
        }],
    })  # fmt: skip
    return blocks


#: Longest text of a section block (Slack refuses more with ``invalid_blocks``).
_SECTION_MAX = 3000


def _sections(text: str) -> list[dict[str, Any]]:
    """``text`` (mrkdwn) as section blocks of at most 3000 characters each.

    Cut at a line break, else a space, never inside an ``&lt;``-style entity
    or a ``<…>`` link sequence; a message takes up to 50 blocks, far more
    than ``max_message_chars`` can fill.
    """
    pieces: list[str] = []
    while len(text) > _SECTION_MAX:
        cut = text.rfind("\n", 0, _SECTION_MAX + 1)
        if cut <= 0:
            cut = text.rfind(" ", 0, _SECTION_MAX + 1)
        if cut <= 0:
            cut = _entity_safe(text, _SECTION_MAX)
        opened = text.rfind("<", 0, cut)
        if opened > 0 and text.rfind(">", 0, cut) < opened:
            cut = opened  # a link sequence stays whole
        pieces.append(text[:cut])
        text = text[cut:].lstrip("\n ") if text[cut : cut + 1] in ("\n", " ") else text[cut:]
    pieces.append(text)
    return [{"type": "section", "text": {"type": "mrkdwn", "text": p}} for p in pieces if p]


def _entity_safe(text: str, cut: int) -> int:
    """``cut``, moved back when it would split an ``&lt;``-style entity in two."""
    amp = text.rfind("&", max(0, cut - 5), cut)
    if amp > 0 and ";" not in text[amp:cut]:
        return amp
    return cut


def _seed_authorization(app: Any, auth: Any) -> None:
    """Give bolt's single-workspace authorization the ``auth.test`` answer we have.

    Bolt calls ``auth.test`` on the first event and caches the answer; every event
    arriving while that call is in flight makes a call of its own, and those come
    back in any order: a burst of messages at start-up reached the bridge out of
    order (a thread's second message before its first; tests/test_cluster_scale.py).
    Seeded, no event waits on the network before our listener, which queues it."""
    from slack_bolt.middleware.authorization.async_single_team_authorization import (
        AsyncSingleTeamAuthorization,
    )

    for middleware in getattr(app, "_async_middleware_list", ()):
        if isinstance(middleware, AsyncSingleTeamAuthorization):
            if middleware.auth_test_result is None:
                middleware.auth_test_result = auth
