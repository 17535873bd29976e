"""The channel contract: what a transport adapter and the bridge agree on.

A transport adapter only speaks its protocol.  It turns what arrives into an
:class:`IncomingMessage` and hands it to a :class:`MessageSink` (the bot's
bridge); it sends the :class:`OutgoingMessage` values the bridge gives it;
and it declares what its channels can do in :class:`ChannelCaps`.  Nothing
here knows IRC, Slack or terminals: those are the sibling modules of
``agentik.transports``.  The agent core does not use this module; it lives
with the transports, and ``agentik.core.transport`` is a deprecated alias.

Transports are registered with the ``register_transports`` hook as
``register(type_name, TransportClass)``; the bot constructs them as
``TransportClass(name=<instance name>, settings=<dict of its own keys>)``.

A transport that serves the agent itself rather than through incoming
messages (the HTTP API) gets it from a sink that is an :class:`AgentAccess`
(the bot's bridge is one), and passes its tool bound with each message as
the turn's :class:`~agentik.core.turnsettings.TurnSettings`
(``TurnSettings().allowing(bound, default=agent.policy)``), as the bridge
does; :func:`restrict_tools` (which changed a shared conversation) is
deprecated.

**What a transport may use of its host.**  :class:`AgentHost` declares all of
it: the agent, the admission :class:`~agentik.core.gate.Gate` (access,
budgets, roles, rights), a channel's command prefix, whether a turn runs,
waiting for answers, interrupting, metrics, the database's location.  The
bot's bridge implements it (mypy checks); :func:`host_of` gives a transport
its sink as an :class:`AgentHost`, wrapping any other sink in a
:class:`BasicHost` with documented defaults.  A transport uses nothing else of
its sink.
"""

from __future__ import annotations

import abc
import asyncio
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, runtime_checkable

from agentik.core.errors import AgentikError, ConfigError
from agentik.core.gate import Gate
from agentik.core.health import Health, HealthState
from agentik.core.messages import FilePart, ImagePart
from agentik.core.store.sqlite import SQLiteStore

if TYPE_CHECKING:
    from agentik.core import Agent, Conversation, TurnPolicy

__all__ = [
    "NEW_CHANNEL",
    "Action",
    "AgentAccess",
    "AgentHost",
    "BasicHost",
    "ChannelCaps",
    "DeliveryCallback",
    "Form",
    "FormField",
    "FormStyle",
    "Health",
    "HealthState",
    "HostMetrics",
    "IncomingMessage",
    "MessageSink",
    "OutgoingKind",
    "OutgoingMessage",
    "Transport",
    "TransportFailed",
    "database_file",
    "host_of",
    "parse_settings",
    "restrict_tools",
]

#: How the bridge should stream answers into this channel:
#: ``deltas`` as they come (a terminal), complete ``lines`` (IRC: no edits),
#: whole ``message`` at the end of the turn, or ``edit`` one message in place.
StreamMode = Literal["deltas", "lines", "message", "edit"]
Formatting = Literal["plain", "markdown", "irc", "mrkdwn"]
#: How a form (a multi-question ``ask_user``) is shown: numbered ``lines`` all at
#: once (answered by ``!answer <n> <text>`` or a line each, in order), ``prompts``
#: one after another (a terminal), or ``native`` (the transport draws
#: :attr:`OutgoingMessage.form` itself: Slack's Block Kit inputs).
FormStyle = Literal["lines", "prompts", "native"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ChannelCaps:
    """What a transport's channels can do."""

    #: Longest message in bytes (UTF-8) / characters; ``None`` = no limit.
    max_bytes: int | None = None
    max_chars: int | None = None
    can_edit: bool = False
    threads: bool = False
    typing: bool = False
    formatting: Formatting = "plain"
    streaming: StreamMode = "message"
    forms: FormStyle = "lines"


@dataclass(frozen=True, kw_only=True, slots=True)
class IncomingMessage:
    """Something a person said, in protocol-neutral form.

    ``channel_key`` names the conversation's channel (``irc:net:#chan``);
    ``direct`` is a private message; ``addressed`` means the bot was
    addressed (mention, ``nick:``), with the address already stripped from
    ``text``.  ``reply_to`` is transport data to answer in the right place
    (a thread), passed back untouched in :class:`OutgoingMessage`.

    ``verified`` says whether ``author_id`` is an identity the transport
    vouches for: authenticated (an IRC services account, a Slack user id, an
    HTTP token, the local terminal user) or trusted by the operator's own
    setting.  A transport sets it to ``False`` when ``author_id`` is only a
    name anyone may claim (an IRC nick without an account); the bridge then
    gives the speaker no identity: no user-scoped memory, not counted among
    the conversation's speakers, no per-user data or rights.
    """

    channel_key: str
    text: str
    author_id: str
    author_name: str
    direct: bool = False
    addressed: bool = False
    reply_to: Any = None
    meta: dict[str, Any] = field(default_factory=dict)
    verified: bool = True
    #: Images and files that came with it, their bytes fetched (Slack file shares):
    #: checked (size, type from the bytes) and stored when the message is.
    attachments: tuple[ImagePart | FilePart, ...] = ()


#: The :attr:`IncomingMessage.meta` key a transport sets to the message's ``channel_key``
#: when it knows no message of that channel was handled before (a Slack thread's first
#: message: its key names the message itself): no conversation can be bound to it yet,
#: and the bridge does not ask the store for one.  A key rewritten since (a linked
#: channel's) no longer matches it, and is looked up as any other.
NEW_CHANNEL = "new_channel"

OutgoingKind = Literal["answer", "delta", "end", "notice", "error", "command", "relay", "unrelay"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Action:
    """A button offered with an outgoing message (Slack Block Kit buttons).

    Pressing it is the same as the presser sending ``command`` in that place
    (``!approve 3f2``): the transport hands it to the bridge as their
    message.  A transport without buttons ignores actions; the message text
    always says how to answer without them.
    """

    label: str
    command: str
    style: Literal["primary", "danger"] | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class FormField:
    """One question of a :class:`Form`: its ``id`` (the key of its answer), the
    question (``label``, text from the model: escape it for the destination),
    the answers offered (``choices``; empty: free text) and whether it may be
    left empty."""

    id: str
    label: str
    choices: tuple[str, ...] = ()
    required: bool = True


@dataclass(frozen=True, kw_only=True, slots=True)
class Form:
    """Several questions answered at once, offered with an outgoing message to a
    transport whose :attr:`ChannelCaps.forms` is ``native``.

    Submitting it is the submitter sending ``submit`` followed by one space and
    the answers as a JSON object (field id -> text; empty: not answered) in that
    place (``!answer #12 {"region": "eu"}``): the transport hands that to the
    bridge as their message, checked like typed text.  The message text always
    says how to answer without the form.
    """

    question_id: int
    fields: tuple[FormField, ...]
    submit: str
    #: Fields answered already (after a restart): shown as answered.
    answered: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class OutgoingMessage:
    """Something the bridge asks a transport to send.

    ``kind``: ``answer`` (a complete message or line of the answer),
    ``delta`` (a piece of a streamed answer), ``end`` (the answer of this
    ``run_id`` is complete; sent after ``delta`` or ``lines`` streaming, with
    empty text), ``notice`` (a short status line: tool call, interruption),
    ``error`` (a short error line), ``command`` (a command's reply), ``relay``
    (a person's message copied from a linked channel, from :attr:`author`: each
    transport shows it in its manners, escaped so it can never mention or
    command anyone; with :attr:`replaces`, the person edited it: update that
    copy), ``unrelay`` (the person deleted it: delete the copy :attr:`replaces`
    names).  A relay with ``replaces`` and ``unrelay`` go only to transports
    whose channels can edit (:attr:`ChannelCaps.can_edit`).
    """

    channel_key: str
    text: str
    kind: OutgoingKind = "answer"
    run_id: str | None = None
    reply_to: Any = None
    #: The outbox row of this piece (``None``: not persisted).  A transport
    #: whose :attr:`Transport.outbox` is true reports its delivery with
    #: :meth:`Transport.delivered`.
    outbox_id: int | None = None
    #: Redelivery after a restart: the protocol id (Slack ``ts``) of the
    #: message this answer already started; update it instead of posting anew.
    replaces: str | None = None
    #: Redelivery after a restart: when the piece was first written (Unix time).  A
    #: send whose delivery was never recorded may have reached the peer all the same
    #: (the process stopped before the peer's answer came back); a transport that can
    #: find such a message (Slack: by the piece's message metadata) updates it rather
    #: than posting it again.
    written_at: float | None = None
    #: Buttons offered with this message (see :class:`Action`).
    actions: tuple[Action, ...] = ()
    #: A form offered with this message (see :class:`Form`).
    form: Form | None = None
    #: A name for this message (``approval:<conversation>:<id>``), so a later
    #: message can update it.
    tag: str | None = None
    #: The ``tag`` of an earlier message this one replaces where the transport
    #: can edit (its buttons go); elsewhere it is posted as a new message.
    updates: str | None = None
    #: ``relay``: who said it, qualified by network (``bob (Slack)``, ``alice@libera``).
    author: str | None = None


#: Reports delivery progress of an outbox row: ``(id, state, awaits_confirm, ref)``.
DeliveryCallback = Callable[[int, Literal["sent", "confirmed"], bool | None, str | None], None]


class MessageSink(Protocol):
    """Where transports deliver incoming messages (the bridge)."""

    async def handle(self, message: IncomingMessage, transport: Transport) -> None:
        """Take one incoming message; returns quickly (turns run elsewhere)."""
        ...


@runtime_checkable
class AgentAccess(Protocol):
    """A sink that also hands transports the agent and their channels' tool policy.

    The bot's :class:`~agentik.bot.bridge.Bridge` is one.  A transport whose
    clients talk to the agent directly instead of sending incoming messages
    (the HTTP API) checks ``isinstance(sink, AgentAccess)`` in :meth:`Transport.start`
    and takes what it needs from here.
    """

    #: The agent the sink's conversations belong to.
    agent: Agent

    def allowed_tools(self, transport: Transport) -> tuple[str, ...] | None:
        """The tools the conversations of ``transport``'s channels may use.

        ``None``: no restriction (the agent's own policy applies).  Pass it with
        each message as the turn's settings
        (:meth:`TurnSettings.allowing <agentik.core.turnsettings.TurnSettings.allowing>`).
        """
        ...


class ChannelView(Protocol):
    """What a transport reads of a channel's options (the bridge's ``ChannelOptions``)."""

    @property
    def command_prefix(self) -> str:
        """The prefix of chat commands (``!``; empty: commands are off)."""
        ...

    @property
    def answer(self) -> str:
        """Which lines the bot answers in shared channels: ``addressed``, ``all``, ``direct``."""
        ...

    @property
    def image_urls(self) -> bool:
        """Fetch the image links of messages for the bot
        (:mod:`agentik.transports.imagefetch`)."""
        ...


class EffectiveView(Protocol):
    """What a transport reads of a channel's settings in force (the bridge's ``Effective``)."""

    @property
    def options(self) -> ChannelView: ...

    @property
    def model(self) -> str | None:
        """The channel's model profile (``None``: ``[llm]``)."""
        ...


class HostMetrics(Protocol):
    """The bot's metrics as a transport uses them (``/metrics``, messages counted)."""

    def render(self) -> tuple[bytes, str]:
        """The Prometheus exposition: ``(body, content type)``."""
        ...

    def message_in(self, transport: str) -> None:
        """Count one message that came in on instance ``transport``."""
        ...


@runtime_checkable
class AgentHost(MessageSink, Protocol):
    """Everything a transport may use of its host (the bot's bridge), and nothing else.

    A transport gets it with :func:`host_of` in :meth:`Transport.start`.  The
    bridge implements every member; :class:`BasicHost` implements them with
    defaults for any other sink (the conformance kit's recorder, a plugin's own).
    """

    @property
    def agent(self) -> Agent | None:
        """The agent the host's conversations belong to (``None``: a host without one,
        e.g. a sink that only records messages)."""
        ...

    @property
    def gate(self) -> Gate:
        """The admission gate in force now: access decisions, budgets, roles and the
        rights over messages, answers, notes and approvals (:mod:`agentik.core.gate`)."""
        ...

    @property
    def metrics(self) -> HostMetrics | None:
        """The bot's metrics, when it keeps them."""
        ...

    @property
    def database(self) -> str | None:
        """The agent's database file (``None``: in memory, or not a file): where a
        transport keeps state of its own next to it."""
        ...

    def allowed_tools(self, transport: Transport) -> tuple[str, ...] | None:
        """The ``allowed_tools`` of ``transport``'s instance (see :class:`AgentAccess`)."""
        ...

    def options_for(self, transport: Transport) -> ChannelView:
        """The options ``transport``'s instance was attached with."""
        ...

    async def effective(self, channel_key: str, transport: Transport) -> EffectiveView:
        """The settings in force in ``channel_key`` (``!set`` values included)."""
        ...

    def busy(self, channel_key: str) -> bool:
        """Whether a turn runs in ``channel_key``."""
        ...

    async def flush(self, channel_key: str) -> None:
        """Wait until every answer asked for in ``channel_key`` has been sent."""
        ...

    async def interrupt(self, channel_key: str) -> bool:
        """Stop the turn running in ``channel_key``; ``False`` if none."""
        ...

    async def posting(self, conversation_id: str, instance: str) -> None:
        """A post over an API (transport instance ``instance``) into conversation
        ``conversation_id`` is about to be submitted: the chat channels linked with it
        (issue 33) are opened now, so they render its answer from the start."""
        ...

    async def posted(self, conversation_id: str, instance: str, author: str, text: str) -> int:
        """A person posted ``text`` over an API (transport instance ``instance``) into
        conversation ``conversation_id``: copied to the chat channels linked with it
        (issue 33), after it was admitted.  How many copies (0: not linked)."""
        ...


@dataclass(frozen=True, slots=True)
class _Defaults:
    command_prefix: str
    answer: str = "addressed"
    image_urls: bool = False
    model: str | None = None

    @property
    def options(self) -> _Defaults:
        return self


class BasicHost:
    """The :class:`AgentHost` of a sink that is not one: the minimal host.

    Its defaults: the agent and ``allowed_tools`` of an :class:`AgentAccess` sink
    (else ``agent``, for a plain :class:`~agentik.core.Agent` served without the
    bot, or none; no restriction); a gate with no rules and no budgets
    (everyone is a ``user``); the transport's ``default_command_prefix``
    everywhere; never busy; :meth:`flush` and :meth:`interrupt` do nothing; no
    metrics; the database of the agent's store when it is a file.
    """

    def __init__(self, sink: MessageSink, *, agent: Agent | None = None) -> None:
        self.sink = sink
        self._access = sink if isinstance(sink, AgentAccess) else None
        self._agent = agent
        self.gate = Gate()
        self.metrics: HostMetrics | None = None

    @property
    def agent(self) -> Agent | None:
        return self._access.agent if self._access is not None else self._agent

    @property
    def database(self) -> str | None:
        return database_file(self.agent)

    async def handle(self, message: IncomingMessage, transport: Transport) -> None:
        await self.sink.handle(message, transport)

    def allowed_tools(self, transport: Transport) -> tuple[str, ...] | None:
        return self._access.allowed_tools(transport) if self._access is not None else None

    def options_for(self, transport: Transport) -> ChannelView:
        return _Defaults(transport.default_command_prefix)

    async def effective(self, channel_key: str, transport: Transport) -> EffectiveView:
        return _Defaults(transport.default_command_prefix)

    def busy(self, channel_key: str) -> bool:
        return False

    async def flush(self, channel_key: str) -> None:
        return None

    async def interrupt(self, channel_key: str) -> bool:
        return False

    async def posting(self, conversation_id: str, instance: str) -> None:
        return None

    async def posted(self, conversation_id: str, instance: str, author: str, text: str) -> int:
        return 0


def host_of(sink: MessageSink) -> AgentHost:
    """``sink`` as an :class:`AgentHost`: itself (the bot's bridge), else a :class:`BasicHost`."""
    if isinstance(sink, AgentHost):
        return sink
    return BasicHost(sink)


def database_file(agent: Agent | None) -> str | None:
    """The file of ``agent``'s SQLite database (``None``: no agent, in memory, another engine)."""
    if agent is None:
        return None
    store = agent.store
    if not isinstance(store, SQLiteStore) or store.path in ("", ":memory:"):
        return None
    return store.path


def restrict_tools(
    conversation: Conversation, allowed_tools: Iterable[str] | None, *, default: TurnPolicy
) -> None:
    """Deprecated: let ``conversation``'s turns submitted without settings use only
    ``allowed_tools``.

    It changes the conversation's default settings (:attr:`Conversation.settings
    <agentik.core.conversation.Conversation.settings>`), which another front end
    sharing the conversation would see too; pass the bound with each message
    instead: ``settings=TurnSettings().allowing(allowed_tools, default=...)``.
    Replaces ``allowed_tools`` in the default settings' policy, or in ``default``
    (the agent's policy) when they have none; the other limits are kept.
    ``None`` leaves the conversation as it is.
    """
    warnings.warn(
        "restrict_tools is deprecated: pass settings=TurnSettings().allowing(...) with "
        "each message (agentik.core.turnsettings)",
        DeprecationWarning,
        stacklevel=2,
    )
    conversation.settings = conversation.settings.allowing(allowed_tools, default=default)


class TransportFailed(AgentikError):
    """Raised by :meth:`Transport.serve` when the transport stopped for good on an
    error (e.g. a rejected login): a run-time failure, not a normal end."""


class Transport(abc.ABC):
    """Base class of transport adapters.

    Lifecycle: ``await start(sink)`` connects and begins delivering messages
    to ``sink``; ``await serve()`` returns when the transport is finished on
    its own (a terminal at end of input) and otherwise runs until
    ``aclose()``; it raises :class:`TransportFailed` when the transport gave
    up on an error it cannot recover from; ``aclose()`` disconnects cleanly
    and leaves no task behind.
    """

    #: The registered type name (``type = "..."`` in the configuration).
    type: ClassVar[str] = ""
    #: Command prefix when the configuration sets none.
    default_command_prefix: ClassVar[str] = "!"
    #: ``max_answer_lines`` when the configuration sets none: lines of one
    #: answer before the rest waits for ``more`` (0: no cap).  A protocol
    #: whose long answers flood a shared channel line by line (IRC) sets a
    #: small number.
    default_max_answer_lines: ClassVar[int] = 0
    caps: ChannelCaps = ChannelCaps()
    #: A pydantic model of the transport's own keys; when set, ``__init__``
    #: validates ``settings`` into :attr:`options` (errors name the key).
    settings_model: ClassVar[Any] = None
    #: Outgoing pieces go through the bridge's persisted outbox and the
    #: transport reports their delivery (:meth:`delivered`), so a restart
    #: delivers what a killed process left undelivered.  Off for transports
    #: whose output has no meaning after a restart (a terminal, an SSE stream).
    outbox: ClassVar[bool] = False
    #: Set by the bridge: where :meth:`delivered` reports.
    on_delivery: DeliveryCallback | None = None
    #: Shows ``relay`` messages (people copied from linked channels) in its channels.
    #: Off for transports that show the conversation itself (the HTTP API).
    relays: ClassVar[bool] = False
    #: Set by the bridge: whether it wants every message of a channel key, addressed
    #: to the bot or not (a linked channel's chatter is relayed).  A transport that
    #: hands over only messages for the bot asks it before dropping the others.
    hears: Callable[[str], bool] | None = None
    #: The transport reports its own connection state with :meth:`set_health`
    #: (an IRC or Slack connection that can be lost).  When false the bot
    #: reports ``connected`` once :meth:`start` returned (a listening socket,
    #: a terminal) and ``failed`` when :meth:`serve` raised.
    reports_health: ClassVar[bool] = False
    #: Set by the bot: called with ``(transport, health)`` on every change.
    on_health: Callable[[Transport, Health], None] | None = None

    def __init__(self, *, name: str, settings: dict[str, Any] | None = None) -> None:
        self.name = name
        self.settings = dict(settings or {})
        #: Set once the transport has shut down.
        self.closed = asyncio.Event()
        self._tasks: set[asyncio.Future[Any]] = set()
        #: The connection state (see :mod:`agentik.core.health`); ``starting`` until reported.
        self.health = Health("starting")
        if self.settings_model is not None:
            self.options = parse_settings(
                self.settings_model, self.settings, where=f"transports.{name}"
            )

    @property
    def exclusive(self) -> bool:
        """One connection per bot, whatever the number of its processes (an IRC
        network's, a Slack Socket Mode app's): several workers sharing a database
        (``agentik.bot.ownership``) start it only on the one holding its lease; the
        others serve what is not exclusive (the HTTP API)."""
        return False

    @property
    def served_anywhere(self) -> bool:
        """Every worker receives this transport's messages and may send its answers
        (Slack's HTTP mode behind a load balancer: any worker gets an event, and any
        can call the Web API).  Several workers sharing a database then queue its
        turns (``agentik.bot.chatqueue``): one worker at a time runs a conversation's
        turns, whichever received them.  ``False`` (the default): a connection one
        worker owns (IRC, Socket Mode), or a place of one process (the terminal)."""
        return False

    def set_health(self, state: HealthState, reason: str | None = None) -> None:
        """Report the connection state: ``starting``, ``connected``, ``degraded``,
        ``reconnecting`` or ``failed``, with a short reason (no secrets).

        ``since`` moves only when the state changes.  Cheap and synchronous.
        """
        old = self.health
        if old.state == state and old.reason == reason:
            return
        self.health = (
            Health(state, reason) if old.state != state else Health(state, reason, since=old.since)
        )
        if self.on_health is not None:
            self.on_health(self, self.health)

    def spawn(self, coro: Any, *, name: str | None = None) -> asyncio.Future[Any]:
        """Run ``coro`` as a task the transport keeps until it ends or :meth:`cancel_tasks`."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def cancel_tasks(self) -> None:
        """Cancel every task started with :meth:`spawn` and wait for them."""
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def owns(self, channel_key: str) -> bool:
        """Whether ``channel_key`` names one of this instance's channels.

        Used after a restart to deliver answers to channels no message has
        come from yet.  The default matches ``<type>:<name>:…``; a transport
        whose keys are built otherwise overrides it.
        """
        return channel_key.startswith(f"{self.type}:{self.name}:")

    async def identify(self) -> None:
        """Learn, without connecting, what :meth:`owns` needs to know of this instance
        while another worker holds its connection (several workers on one database):
        called once each time the instance waits in standby, best effort (a failure is
        logged).  The default does nothing: most transports' keys follow from their
        settings; a Slack app asks Slack which team it is in."""
        return None

    def unreachable(self, channel_key: str) -> str | None:
        """Why this instance cannot speak in ``channel_key`` now (``not joined to
        #team``), or ``None`` when it can or cannot tell.  Health shows it for a
        linked channel."""
        return None

    def holds_answer(self, channel_key: str, reply_to: object) -> int:
        """How many characters of a streamed answer (its ``delta`` messages) to
        ``channel_key`` this transport holds before it sends anything of it: a
        shorter answer goes out whole at its ``end``.  The bridge writes such an
        answer's outbox row with the turn's own last commit, not on its own.
        The default, 0: a delta may go out at once."""
        return 0

    def in_thread(self, channel_key: str) -> bool:
        """Whether ``channel_key`` names a thread rather than a whole channel.

        A thread is a side conversation under one message (a Slack thread):
        the bridge shows tool lines there as in a direct conversation when
        ``events = "auto"``.  The default: this transport has no threads.
        """
        return False

    def account_of(self, channel_key: str, name: str) -> str | None:
        """The verified account of the user called ``name`` here, when the protocol knows it.

        For chat commands naming someone by display name (``!role bob admin``):
        IRC answers from the services accounts it tracks for users sharing a
        channel with the bot.  ``channel_key`` is where the command was
        given.  The default: nothing known.
        """
        return None

    def delivered(
        self,
        outbox_id: int | None,
        state: Literal["sent", "confirmed"],
        *,
        awaits_confirm: bool | None = None,
        ref: str | None = None,
    ) -> None:
        """Report that the outbox piece ``outbox_id`` was sent or confirmed.

        ``sent``: written to the socket / the API call returned; with
        ``awaits_confirm`` the protocol will confirm it later (and a restart
        before that sends it again).  ``confirmed``: the peer confirmed it.
        ``ref`` is the protocol's id of the message (a Slack ``ts``).  Cheap
        and synchronous: the bridge batches the writes.
        """
        if outbox_id is not None and self.on_delivery is not None:
            self.on_delivery(outbox_id, state, awaits_confirm, ref)

    @abc.abstractmethod
    async def start(self, sink: MessageSink) -> None:
        """Connect and start delivering incoming messages to ``sink``."""

    @abc.abstractmethod
    async def send(self, message: OutgoingMessage) -> None:
        """Send one outgoing message (in order; may wait for flood control)."""

    async def serve(self) -> None:
        """Wait until the transport finishes (default: until closed)."""
        await self.closed.wait()

    async def aclose(self) -> None:
        """Disconnect; ``serve`` returns."""
        self.closed.set()


def parse_settings(model: Any, settings: dict[str, Any], *, where: str) -> Any:
    """Validate a transport's own keys with a pydantic ``model``.

    Errors become one :class:`~agentik.core.errors.ConfigError` line naming
    the key, e.g. ``transports.libera.port: unknown key``.
    """
    from pydantic import ValidationError

    try:
        return model.model_validate(settings)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            from agentik.core.settings import did_you_mean, known_keys

            what = "unknown key" + did_you_mean(
                str(err["loc"][-1]), known_keys(model, err["loc"][:-1])
            )
        else:
            what = err["msg"]
        # Never echo the value of a secret (a token of the wrong kind is still a token).
        field = model.model_fields.get(str(err["loc"][0])) if err["loc"] else None
        secret = field is not None and "Secret" in str(field.annotation)
        if (
            not secret
            and err["type"] not in ("extra_forbidden", "missing")
            and isinstance(err.get("input"), str | int | float | bool)
        ):
            what += f", got {err['input']!r}"
        # A check of the whole table (a model validator) has no key of its own.
        raise ConfigError(f"{where}.{key}: {what}" if key else f"{where}: {what}") from None
