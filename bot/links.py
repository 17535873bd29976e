"""Linked channels (issue 33): channels on different transports that are one
conversation, with the people relayed and the agent answering in each.

A link names channel keys (``irc:libera:#team``, ``slack:T123:C456``,
``http:web:team``): every key is bound to one conversation (the store's channel
bindings), so a turn asked in any of them is rendered by every linked channel's
own renderer, in its transport's manners (IRC lines and ``!more``, Slack
streaming, the HTTP API's event stream).  :class:`Links` is plugged into the
bridge's seams:

- :meth:`Links.arriving`: a message in a linked channel is taken under the link's
  key (a Slack thread of a linked Slack channel is that channel) with its author
  qualified by network (``alice@libera``, ``Bob (Slack)``), which the model sees;
  every other linked channel is held open, so it renders the answer.
- :meth:`Links.relay`: a person's message is copied to the other linked channels
  (``relay = true``), persisted in the outbox first and sent by one queue per
  target, in order (:class:`_Target`); each copy is a row of the message map.
- :meth:`Links.settings`: what a turn runs with by the link's ``settings`` rule.
- :class:`LinkedRenderer`: ``answer = "asked"`` renders a run where it was asked
  and a one-line pointer in the other linked channels.
- :meth:`Links.follow`: several workers: a linked channel whose connection this
  worker owns follows its conversation's stored events, so a turn another worker
  runs streams into it through its own renderer (:meth:`Links.served` holds them open).

Links come from ``[[links]]`` (:class:`LinkSettings`) and from ``!link`` (stored,
:mod:`agentik.bot.commands.links`).  Several workers on one database: a link made or
undone on one is announced on the ``links`` topic (its name, after the write) and
every other worker reads the stored links again (also at each resync of the
notifier), so the worker that takes a connection over later relays as its last
owner did.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentik.core.events import Event, TurnEnded, TurnStarted
from agentik.core.health import Health, HealthState
from agentik.core.store.base import OutboxEntry
from agentik.core.store.records import LinkMessage, LinkRecord
from agentik.core.turnsettings import TurnSettings
from agentik.transports.base import IncomingMessage, OutgoingMessage
from agentik.transports.text import split_text

from .logs import STATUS_LOGGER, log_event
from .outbox import outbox_rows
from .render import Renderer

if TYPE_CHECKING:
    from agentik.core import Agent, Conversation
    from agentik.core.cluster.events import ClusterSubscription
    from agentik.transports.base import OutgoingKind, Transport

    from .channel import ChannelOptions, OpenChannel
    from .chansettings import Effective
    from .outbox import Outbox

__all__ = [
    "Link",
    "LinkSettings",
    "LinkedRenderer",
    "Links",
    "LinksHost",
    "describe",
    "late",
    "qualified",
]

log = logging.getLogger(__name__)
status_log = logging.getLogger(STATUS_LOGGER)

#: The notification topic of links made or undone in chat (ids: link names).
LINKS_TOPIC = "links"
#: The notification topic of relayed copies (and changes to them) written to the outbox
#: for a connection another worker owns (ids: outbox row ids).
RELAY_TOPIC = "relay"

#: Relayed messages waiting for one target before the next arrival waits (never dropped).
QUEUE_SIZE = 200
#: Seconds after which a copy shows it is late (``(late: 14:02 UTC) ...``).
LATE_AFTER = 60.0
#: Seconds a copy (or an answer handed over) waits at most for the instances in standby
#: to learn which channels are theirs (several Slack apps each asking ``auth.test``).
KNOWN_WAIT = 5.0

_NAME = r"^[A-Za-z0-9_-]{1,64}$"


class LinkSettings(BaseModel):
    """One ``[[links]]`` table: channels on several transports that are one conversation."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The link's name (``!unlink <name>``; letters, digits, ``_`` and ``-``).
    name: str = Field(pattern=_NAME)
    #: The linked channels' keys: ``irc:<network>:#chan``, ``slack:<team>:<channel>``
    #: (its threads too) or ``slack:<team>:<channel>:<thread_ts>``, ``http:<instance>:<name>``.
    channels: list[str] = Field(min_length=2)
    #: Copy people's messages to the other linked channels.
    relay: bool = True
    #: ``everywhere``: the answer shows in every linked channel; ``asked``: where it was
    #: asked, with a one-line pointer in the others.
    answer: Literal["everywhere", "asked"] = "everywhere"
    #: Lines of the conversation shown to a channel joining the link with ``!link`` (0: none).
    history: int = Field(0, ge=0, le=50)
    #: Relay only people whose identity the transport vouches for (an IRC account, a
    #: Slack user).
    verified_only: bool = False
    #: A message starting with this is not relayed (unset: every message is).
    opt_out_prefix: str | None = Field(None, min_length=1, max_length=16)
    #: Whose per-channel settings (persona, tools, model) a turn runs with: ``asking``,
    #: the channel it was asked in; ``link``, the link's first channel's, wherever asked.
    settings: Literal["asking", "link"] = "asking"
    #: How a channel that cannot edit (IRC) shows an edit or a deletion of a relayed
    #: message: ``line``, one more line (``(edit) the new text``, ``(deleted their
    #: message of 14:02 UTC)``); ``none``, nothing.  Channels that can edit (Slack)
    #: always update or delete their copy.
    edits: Literal["line", "none"] = "line"
    #: The icon of relayed copies in Slack by the network they were said on (a transport
    #: instance's name): a Slack emoji (``":speech_balloon:"``) or an ``https`` image URL,
    #: e.g. ``{ libera = ":irc:", web = "https://example.org/web.png" }``.  A Slack
    #: person keeps their profile image; a network not named here shows the app's icon.
    #: Copies under a name and icon need the ``chat:write.customize`` scope.
    icons: dict[str, str] = Field(default_factory=dict)

    @field_validator("icons")
    @classmethod
    def _icons(cls, icons: dict[str, str]) -> dict[str, str]:
        for network, icon in icons.items():
            emoji = re.fullmatch(r":[a-z0-9_+'-]{1,80}:", icon)
            url = icon.startswith("https://") and len(icon) <= 2000 and " " not in icon
            if not (emoji or url):
                raise ValueError(
                    f"icons.{network}: {icon!r} is neither a Slack emoji (like"
                    ' ":speech_balloon:") nor an https:// image URL'
                )
        return icons

    @field_validator("channels")
    @classmethod
    def _keys(cls, channels: list[str]) -> list[str]:
        for i, key in enumerate(channels):
            kind, _, rest = key.partition(":")
            instance, _, place = rest.partition(":")
            if not kind or not instance or not place or any(c.isspace() for c in key):
                raise ValueError(
                    f"channels.{i}: {key!r} is not a channel key (like irc:libera:#team,"
                    " slack:T123:C456 or http:web:team)"
                )
            if key in channels[:i]:
                raise ValueError(f"channels.{i}: {key!r} is listed twice")
        return channels


def check_links(links: Sequence[LinkSettings]) -> None:
    """Names unique and each channel in one link at most; ValueError naming the key."""
    names: dict[str, int] = {}
    owner: dict[str, str] = {}
    for i, link in enumerate(links):
        if link.name in names:
            raise ValueError(f"links.{i}.name: two links are named {link.name!r}")
        names[link.name] = i
        for j, key in enumerate(link.channels):
            if key in owner:
                raise ValueError(
                    f"links.{i}.channels.{j}: {key!r} is already in link {owner[key]!r}"
                )
            owner[key] = link.name


@dataclass(frozen=True, slots=True)
class Link:
    """A link in force: its settings, and where it came from."""

    settings: LinkSettings
    #: ``config`` (``[[links]]``) or ``chat`` (``!link``, stored).
    source: Literal["config", "chat"] = "config"
    created_by: str = ""

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def channels(self) -> tuple[str, ...]:
        return tuple(self.settings.channels)

    def record(self) -> LinkRecord:
        """As the store keeps it."""
        options = self.settings.model_dump(exclude={"name", "channels"}, exclude_defaults=True)
        return LinkRecord(
            name=self.name, channels=self.channels, options=options,
            created_by=self.created_by, created_at=time.time(),
        )  # fmt: skip

    @classmethod
    def of(cls, record: LinkRecord) -> Link:
        settings = LinkSettings(name=record.name, channels=list(record.channels), **record.options)
        return cls(settings=settings, source="chat", created_by=record.created_by)


def _same(link: Link, record: LinkRecord) -> bool:
    """Whether ``record`` (stored) is ``link`` as in force here."""
    mine = link.record()
    return mine.channels == tuple(record.channels) and mine.options == record.options


def qualified(name: str, transport: Transport) -> str:
    """A person's name as the other networks see it: ``alice@libera`` on IRC,
    ``Bob (Slack)`` elsewhere (the transport type, or the instance name)."""
    if transport.type == "irc":
        return f"{name}@{transport.name}"
    label = "Slack" if transport.type == "slack" else transport.name
    return f"{name} ({label})"


class LinksHost(Protocol):
    """What the links use of the bridge (the bridge implements it)."""

    agent: Agent
    outbox: Outbox

    def transport_for(self, key: str) -> Transport | None: ...

    def options_for(self, transport: Transport) -> ChannelOptions: ...

    def open_channel(self, key: str) -> OpenChannel | None: ...

    def serves(self, transport: Transport) -> bool: ...

    def standby_for(self, key: str) -> Transport | None: ...

    def waiting(self, kind: str) -> list[Transport]: ...

    async def channel(
        self, key: str, transport: Transport, opts: ChannelOptions
    ) -> OpenChannel: ...

    async def effective(self, channel_key: str, transport: Transport) -> Effective: ...

    async def release(self, key: str) -> None: ...

    async def send(
        self,
        transport: Transport,
        key: str,
        text: str,
        kind: OutgoingKind,
        reply_to: object,
        run_id: str | None = None,
        *,
        piece: int | None = None,
        outbox_id: int | None = None,
        author: str | None = None,
    ) -> int: ...


@dataclass(slots=True)
class _Relay:
    """One relayed copy waiting for its target: its outbox row and the message map row.
    With ``change`` set, an edit or a deletion of the copy ``row`` names instead."""

    text: str
    author: str
    outbox_id: int | None
    row: LinkMessage
    change: Literal["edit", "delete"] | None = None
    #: A change's own outbox run (``relay:<canonical>:<edit|delete>:<change id>``).
    run: str | None = None
    #: The thread it goes into (a Slack ``thread_ts``), or ``None``.
    thread: str | None = None
    #: Sent as it is (an outbox row a restart's redelivery could not send: :meth:`Links.later`).
    out: OutgoingMessage | None = None
    #: The author's icon where the target shows one (Slack): :meth:`Links.icon`.
    icon: str | None = None


@dataclass(slots=True)
class _Target:
    """The queue of copies for one linked channel and the task sending them, in order."""

    queue: asyncio.Queue[_Relay] = field(default_factory=lambda: asyncio.Queue(QUEUE_SIZE))
    task: asyncio.Task[None] | None = None


class Links:
    """The links in force and what they do to messages (see the module docstring)."""

    def __init__(self, host: LinksHost, configured: Iterable[LinkSettings] = ()) -> None:
        self.host = host
        self.configured = [Link(settings=s) for s in configured]
        #: The links in force, by name (the configuration's, then the stored ones).
        self.links: dict[str, Link] = {link.name: link for link in self.configured}
        self._by_key: dict[str, Link] = {}
        self._targets: dict[str, _Target] = {}
        self._loaded = False
        #: Channels whose wait for the instances in standby was logged (once each).
        self._told: set[str] = set()
        #: The channels the last :meth:`_bind` moved onto a link's conversation.
        self._joined: list[str] = []
        #: Copies handed to their transport so far (metrics, benchmarks).
        self.relayed = 0
        #: Edits and deletions handed to their transport so far.
        self.changed = 0
        #: A copy delivered more than this many seconds after it was said is marked
        #: late, with the time it was said.
        self.late_after = LATE_AFTER
        #: Message-map rows waiting for their write, and the task writing them.
        self._map_rows: list[LinkMessage] = []
        self._mapper: asyncio.Task[None] | None = None
        #: Following the ``links`` topic (other workers' !link/!unlink), once loaded.
        self._follow: Any = None
        self._reloading: asyncio.Task[None] | None = None
        self._reload_again = False
        #: Copies handed to a transport whose protocol id (a Slack ``ts``) is still to
        #: come, by outbox row: the id goes into their message-map row.
        self._copies: dict[int, LinkMessage] = {}
        #: Per channel without threads (IRC): the people of threaded channels (Slack)
        #: who spoke last, by folded name -> (their channel's key, the thread_ts).
        self._recent: dict[str, dict[str, tuple[str, str]]] = {}
        #: A threaded channel's relayed messages -> their thread (a reply's root).
        self._thread_of: dict[tuple[str, str], str] = {}
        #: Following the ``relay`` topic (copies other workers wrote for connections this
        #: one owns), on a store several workers share.
        self._follow_relays: Any = None
        #: Outbox rows of copies and changes this worker took to send (queued or sent,
        #: not yet delivered): a resync of the ``relay`` topic leaves them alone.
        self._taken: dict[int, None] = {}
        self._taking: asyncio.Task[None] | None = None
        self._take_again: tuple[str, ...] | None = None
        #: Following this worker's turns (a store several workers share): the answers
        #: of a link's conversation for its channels another worker owns.
        self._answering: asyncio.Task[None] | None = None
        #: Runs of linked conversations started here: their link, where they were asked,
        #: and the channels this worker serves that were not open to render them.
        self._runs: dict[str, tuple[Link, Mapping[str, Any], tuple[str, ...]]] = {}
        #: Answers (and ``answer = "asked"`` pointers) handed to a channel's transport
        #: for a turn another worker ran.
        self.answers_handed = 0
        #: Queued turns run here that were asked in a channel another worker owns: where
        #: in that channel the answer goes (its ``reply_to``: a Slack thread), by run.
        self._reply_where: dict[str, dict[str, Any]] = {}
        self._index()

    def _index(self) -> None:
        self._by_key = {key: link for link in self.links.values() for key in link.channels}

    @property
    def store(self) -> Any:
        return self.host.agent.store

    async def load(self) -> None:
        """Add the links made in chat (stored) and bind every link's channels to its
        conversation.  Called once the agent has started; again does nothing."""
        if self._loaded:
            return
        self._loaded = True
        self.host.agent.health.add_provider(self.health)
        if "links" in self.store.capabilities:
            self._follow = self.store.notifier().subscribe(LINKS_TOPIC, self._noticed)
            for record in await self.store.links():
                if record.name in self.links:
                    log.warning("link %r is in the configuration and in chat: the configuration's"
                                " is used", record.name)  # fmt: skip
                    continue
                try:
                    link = Link.of(record)
                except ValueError as exc:
                    log.warning("stored link %r is not valid any more: %s", record.name, exc)
                    continue
                if any(key in self._by_key for key in link.channels):
                    log.warning("stored link %r names a channel of another link: not used",
                                record.name)  # fmt: skip
                    continue
                self.links[link.name] = link
                self._index()
        if getattr(self.store, "shared", False):
            # Copies other workers write for the connections this one owns.
            self._follow_relays = self.store.notifier().subscribe(RELAY_TOPIC, self._relays_noticed)
            # The answers of the turns run here, for the channels other workers own.
            self._answering = asyncio.get_running_loop().create_task(
                self._follow_turns(), name="agentik-link-answers"
            )
        for link in list(self.links.values()):
            await self._bind(link)
        await self.served()

    # -- a configuration reload ----------------------------------------------------------------
    async def reconfigure(self, configured: Sequence[LinkSettings]) -> dict[str, list[str]]:
        """Put the ``[[links]]`` of a reloaded configuration in force (``agentik reload``,
        SIGHUP): a link added binds its channels to one conversation; a link removed
        lets its channels go (the first keeps the conversation, the others start new
        ones, as ``!unlink`` does); a link whose keys changed is put in force as it is
        now (a channel that left it starts a new conversation, one that joined is
        bound).  Every channel of a changed link is let go, so it reopens in its new
        manners (``answer``).  Links made in chat are not touched, except one whose name
        or channel a link of the configuration takes now: the configuration's is used
        (as at start-up), and it comes back when the configuration frees them.
        Returns the names ``added``, ``removed`` and ``changed``."""
        check_links(configured)
        if not self._loaded:
            self.configured = [Link(settings=s) for s in configured]
            self.links = {link.name: link for link in self.configured}
            self._index()
            return {"added": [s.name for s in configured], "removed": [], "changed": []}
        before = {link.name: link for link in self.configured}
        after = {s.name: Link(settings=s) for s in configured}
        added = [n for n in after if n not in before]
        removed = [n for n in before if n not in after]
        changed = [n for n in after if n in before and after[n].settings != before[n].settings]
        if not (added or removed or changed):
            return {"added": [], "removed": [], "changed": []}
        self.configured = list(after.values())
        agent = self.host.agent
        let_go: list[str] = []
        for name in removed + changed:
            old = before[name]
            del self.links[name]
            keep = set(after[name].channels) if name in after else {old.channels[0]}
            for key in old.channels:
                if key not in keep:  # out of the link: a conversation of its own again
                    fresh = await agent.create_conversation(title=key, channel_key=key)
                    await self.store.set_binding(key, fresh.id)
                let_go.append(key)
        # The configuration's links win over the ones made in chat (as at start-up).
        taken = {k for link in after.values() for k in link.channels}
        for name, link in list(self.links.items()):
            if link.source != "config" and (name in after or taken & set(link.channels)):
                log.warning("link %r made in chat clashes with the configuration's: the"
                            " configuration's is used", name)  # fmt: skip
                del self.links[name]
                let_go += link.channels
        for name in added + changed:
            self.links[name] = after[name]
        self._index()
        for name in added + changed:
            await self._bind(self.links[name])
        for key in dict.fromkeys(let_go):
            await self.host.release(key)
        if "links" in self.store.capabilities:
            # A stored link the configuration no longer shadows is in force again.
            await self._sync(await self.store.links())
        await self.served()
        for verb, names in (("added", added), ("removed", removed), ("changed", changed)):
            if names:
                log.info("reload: links %s: %s", verb, ", ".join(names))
        return {"added": added, "removed": removed, "changed": changed}

    # -- other workers' links ------------------------------------------------------------------
    def _noticed(self, notice: Any) -> None:
        """A link was made or undone on another worker (or a resync): read them again."""
        if notice.local and not notice.resync:
            return  # this worker's own !link/!unlink: in force here already
        if self._reloading is not None:
            self._reload_again = True
            return
        self._reloading = asyncio.ensure_future(self._reload())

    async def _reload(self) -> None:
        try:
            while True:
                self._reload_again = False
                try:
                    await self._sync(await self.store.links())
                except Exception:
                    log.exception("could not read the links again")
                if not self._reload_again:
                    return
        finally:
            self._reloading = None

    async def _sync(self, records: Sequence[LinkRecord]) -> None:
        """Put the stored links in force here: the ones made elsewhere added, the ones
        undone elsewhere removed (their channels' bindings were changed there; an open
        channel is let go, so it reopens on its conversation now)."""
        stored = {r.name: r for r in records}
        moved: list[str] = []
        for name, link in list(self.links.items()):
            if link.source != "config" and name not in stored:
                del self.links[name]
                self._index()
                moved += link.channels
                log.info("link %r was undone on another worker", name)
        for name, record in stored.items():
            had = self.links.get(name)
            if had is not None and (had.source == "config" or _same(had, record)):
                continue
            try:
                link = Link.of(record)
            except ValueError as exc:
                log.warning("stored link %r is not valid any more: %s", name, exc)
                continue
            if any(self._by_key.get(key, link).name != name for key in link.channels):
                continue  # names a channel of another link (warned at load)
            self.links[name] = link
            self._index()
            if had is not None:  # changed there (!link on its name): reopen in its manners
                moved += had.channels
            moved += link.channels
            log.info("link %r was %s on another worker", name, "changed" if had else "made")
        moved = list(dict.fromkeys(moved))
        for key in moved:
            await self.host.release(key)
        if moved:
            await self.served()

    # -- what a link is made of -------------------------------------------------------------
    def find(self, key: str) -> tuple[Link, str] | None:
        """The link ``key`` is in and the link's key for it (a Slack thread of a linked
        Slack channel is that channel), or ``None``."""
        if not self._by_key:
            return None  # no links: what every message of most bots asks
        link = self._by_key.get(key)
        if link is not None:
            return link, key
        if key.startswith("slack:") and key.count(":") >= 3:
            channel = key.rsplit(":", 1)[0]
            link = self._by_key.get(channel)
            if link is not None:
                return link, channel
        return None

    def across(self, key: str, transport: Transport) -> bool:
        """Whether channel ``key`` (as :meth:`arriving` made it) is linked with a channel
        another transport instance serves: its conversation's questions may then arrive
        on another worker too (several workers: each connection has its owner), so they
        go through the shared turn queue (:meth:`agentik.bot.chatqueue.ChatQueue.queues`).
        A channel whose transport is not known here (a Slack app still learning its
        team) counts as another's.  Memory only: no store read."""
        found = self.find(key)
        if found is None:
            return False
        for other in found[0].channels:
            serving = self.host.transport_for(other)
            if serving is None or serving.name != transport.name:
                return True
        return False

    def health(self) -> list[tuple[str, Health]]:
        """``link:<name>``: ``connected`` when every channel of the link is served here,
        else ``degraded`` with why not (no transport for it, or not joined)."""
        out = []
        for link in self.links.values():
            problems = []
            for key in link.channels:
                transport = self.host.transport_for(key)
                why = "no transport serves it" if transport is None else transport.unreachable(key)
                if why:
                    problems.append(f"{key}: {why}")
            state: HealthState = "degraded" if problems else "connected"
            out.append((f"link:{link.name}", Health(state, "; ".join(problems) or None)))
        return out

    def hears(self, key: str) -> bool:
        """Whether the bridge wants every message of ``key`` (a transport that hands
        over only messages addressed to the bot asks): those of linked channels."""
        return self.find(key) is not None

    async def _bind(self, link: Link) -> str:
        """Bind every channel of ``link`` to one conversation; its id.  The first channel
        already bound gives it (its history goes on); else the first channel's new one."""
        store, agent = self.store, self.host.agent
        conv_id = None
        for key in link.channels:
            conv_id = await store.get_binding(key)
            if conv_id is not None:
                break
        if conv_id is None:
            conv_id = (await agent.conversation_for_channel(link.channels[0])).id
        joined = []
        for key in link.channels:
            if await store.get_binding(key) != conv_id:
                await store.set_binding(key, conv_id)
                await self.host.release(key)  # it reopens on the link's conversation
                joined.append(key)
        self._joined = joined
        return conv_id

    async def add(self, link: Link) -> str:
        """Make ``link`` (``!link``): stored, its channels bound; the conversation's id.
        ValueError when its name or a channel is taken."""
        if "links" not in self.store.capabilities:
            raise ValueError("this bot's store keeps no links: add them to [[links]]")
        if link.name in self.links:
            raise ValueError(f"a link named {link.name!r} exists")
        for key in link.channels:
            found = self.find(key)
            if found is not None:
                raise ValueError(f"{key} is already in link {found[0].name!r}")
        await self.store.link_save(link.record())
        self.links[link.name] = link
        self._index()
        conv_id = await self._bind(link)
        await self._announce(link.name)
        await self.served()
        if link.settings.history:
            await self._history(link, conv_id, self._joined)
        return conv_id

    async def amend(self, link: Link) -> str:
        """Put ``link`` in force in place of the link of that name made in chat (``!link``
        on an existing name: options changed, channels added or taken out): stored,
        announced, its channels bound; the conversation's id.  A channel that left starts
        a conversation of its own; every channel of it reopens in its new manners (as a
        configuration reload does).  KeyError when there is no such link; ValueError for
        a link of the configuration or a channel another link has."""
        old = self.links[link.name]
        if old.source == "config":
            raise ValueError(f"link {link.name!r} is in the configuration: change it there")
        for key in link.channels:
            found = self.find(key)
            if found is not None and found[0].name != link.name:
                raise ValueError(f"{key} is already in link {found[0].name!r}")
        await self.store.link_save(link.record())
        self.links[link.name] = link
        self._index()
        agent = self.host.agent
        for key in old.channels:
            if key not in link.channels:  # out of the link: a conversation of its own again
                fresh = await agent.create_conversation(title=key, channel_key=key)
                await self.store.set_binding(key, fresh.id)
        conv_id = await self._bind(link)
        joined = self._joined
        for key in dict.fromkeys(old.channels):
            if key not in joined:
                await self.host.release(key)
        await self._announce(link.name)
        await self.served()
        if link.settings.history and joined:
            await self._history(link, conv_id, joined)
        return conv_id

    async def _history(self, link: Link, conv_id: str, keys: Sequence[str]) -> None:
        """Show the channels that joined ``link`` its conversation's last lines."""
        conv = await self.host.agent.get_conversation(conv_id)
        recent = await conv.messages(kinds=["user", "assistant"], limit=link.settings.history)
        lines = [
            f"{m.author or ('agent' if m.kind == 'assistant' else 'someone')}: "
            f"{' '.join(m.content.split())[:200]}"
            for m in recent
            if m.content
        ]
        if not lines:
            return
        text = "earlier in this conversation: " + " | ".join(lines)
        for key in keys:
            transport = self.host.transport_for(key)
            if transport is not None and transport.relays:
                await self.host.send(transport, key, text, "notice", None)

    async def remove(self, name: str) -> Link:
        """Undo link ``name`` (``!unlink``): its first channel keeps the conversation,
        the others start new ones.  KeyError when there is none; ValueError for a
        link of the configuration."""
        link = self.links[name]
        if link.source == "config":
            raise ValueError(f"link {name!r} is in the configuration: remove it there")
        await self.store.link_delete(name)
        del self.links[name]
        self._index()
        agent = self.host.agent
        for key in link.channels[1:]:
            fresh = await agent.create_conversation(title=key, channel_key=key)
            await self.store.set_binding(key, fresh.id)
            await self.host.release(key)
        ch = self.host.open_channel(link.channels[0])
        if ch is not None and ch.follows:
            await self.host.release(link.channels[0])  # not linked: this process's turns
        await self._announce(name)
        return link

    async def _announce(self, name: str) -> None:
        """Tell the other workers (after the writes): they read the links again."""
        try:
            await self.store.notifier().publish(LINKS_TOPIC, name)
        except Exception as exc:  # they read them at their next resync anyway
            log.warning("could not announce link %r to the other workers: %s", name, exc)

    # -- the bridge's seams ---------------------------------------------------------------
    def arriving(self, message: IncomingMessage, transport: Transport) -> IncomingMessage:
        """``message`` as the bridge takes it: in a linked channel, under the link's key
        with its author qualified by network.  A direct message is never part of a link.
        (Nothing awaits here: the channel's arrivals keep their order.)"""
        found = None if message.direct else self.find(message.channel_key)
        if found is None:
            return message
        key = found[1]
        name = message.author_name or message.author_id
        return dataclasses.replace(
            message, channel_key=key, author_name=qualified(name, transport),
            meta={**message.meta, "name": name},
        )  # fmt: skip

    # -- other workers' turns, streamed here --------------------------------------------------
    async def follow(
        self, key: str, transport: Transport, conv: Conversation
    ) -> ClusterSubscription | None:
        """What channel ``key`` is rendered from as it opens: on a store several workers
        share, a channel linked across transports follows its conversation's stored
        events too (the turns another worker runs stream here, in this transport's
        manners, as they are written); ``None``: this process's events (no link across
        transports, one process)."""
        hub = self.host.agent.cluster_events
        if hub is None or conv.temp or not self.across(key, transport):
            return None
        return await hub.subscribe(conv, after=None, profile="debug", max_pending=100_000)

    async def served(self) -> None:
        """Hold open, following (:meth:`follow`), every channel linked across transports
        whose connection this worker serves (several workers; called at start, when a
        connection is taken over and when links change): a turn another worker runs
        streams into it from its start.  A channel open before it was linked across
        reopens, following."""
        if self.host.agent.cluster_events is None:
            return
        for link in list(self.links.values()):
            served = []
            for key in link.channels:
                transport = self.host.transport_for(key)
                if transport is None or not self.host.serves(transport):
                    continue
                if not self.across(key, transport):
                    break  # (one transport instance: no other worker's turns)
                served.append(key)
            else:
                for key in served:
                    ch = self.host.open_channel(key)
                    if ch is not None and not ch.follows:
                        await self.host.release(key)
                if served:
                    await self._hold_open(link)

    async def _hold_open(self, link: Link) -> None:
        """Open every channel of ``link`` the bot serves (so each renders the answer),
        each with the renderer the link's ``answer`` asks for."""
        now = time.monotonic()
        for key in link.channels:
            ch = self.host.open_channel(key)
            if ch is None:
                transport = self.host.transport_for(key)
                if transport is None or not self.host.serves(transport):
                    continue  # not served by this bot (or another worker owns it)
                ch = await self.host.channel(key, transport, self.host.options_for(transport))
            ch.last_used = now
            ch.linked = True
            if link.settings.answer == "asked" and not isinstance(ch.renderer, LinkedRenderer):
                ch.renderer = LinkedRenderer(self.host, ch)

    def asker(self, key: str, run_id: str) -> str | None:
        """Who asked for run ``run_id`` in any channel of ``key``'s link (a speaker key),
        so ``!stop`` in one linked channel needs the same rights as where it was asked."""
        found = self.find(key)
        if found is None:
            return None
        for other in found[0].channels:
            ch = self.host.open_channel(other)
            if ch is not None and run_id in ch.run_asker:
                return ch.run_asker[run_id]
        return None

    def settings(self, ch: OpenChannel) -> TurnSettings:
        """What a turn asked in ``ch`` runs with: its own settings, or with the link's
        ``settings = "link"`` rule its first channel's (wherever it was asked)."""
        found = self.find(ch.key)
        if found is None or found[0].settings.settings != "link":
            return ch.settings
        home = self.host.open_channel(found[0].channels[0])
        return home.settings if home is not None else ch.settings

    async def relay(
        self, message: IncomingMessage, transport: Transport, prefix: str | None
    ) -> int:
        """Hold the link's channels open and copy a person's message to the other
        channels of its link (``message`` as :meth:`arriving` made it); how many copies.
        Called in the channel's arrival order.  Not relayed: direct messages,
        commands (``prefix``), messages starting with the link's ``opt_out_prefix``,
        and with ``verified_only`` people the transport does not vouch for."""
        found = None if message.direct else self.find(message.channel_key)
        if found is None:
            return 0
        link, key = found
        if not self._loaded:
            await self.load()  # a bridge built without the bot (a library user's)
        # Every linked channel open (and kept so) before the message can start a turn.
        await self._hold_open(link)
        text = message.text.strip()
        s = link.settings
        if (
            not s.relay
            or not text
            or (prefix and text.startswith(prefix))
            or (s.opt_out_prefix and text.startswith(s.opt_out_prefix))
            or (s.verified_only and not message.verified)
        ):
            return 0
        if message.addressed and transport.type == "irc":
            # Addressed as ``agentik: ...``: the others see to whom it was said.
            text = f"{_own_nick(transport)}: {text}"
        canonical = uuid.uuid4().hex
        now = time.time()
        ref = message.meta.get("ts") or message.meta.get("msgid")
        rows = [
            LinkMessage(link=link.name, canonical=canonical, channel_key=key,
                        ref=str(ref) if ref else None, origin=True, created_at=now)
        ]  # fmt: skip
        copies: list[tuple[Transport, str, LinkMessage]] = []
        await self._known(k for k in link.channels if k != key)
        for target_key in link.channels:
            if target_key == key:
                continue
            # (a connection another worker owns: the copy goes through the outbox to it)
            target = self.host.transport_for(target_key) or self.host.standby_for(target_key)
            if target is None or not target.relays:
                continue  # not served here, or it shows the conversation itself (HTTP)
            row = LinkMessage(
                link=link.name, canonical=canonical, channel_key=target_key,
                run_id=f"relay:{canonical}", piece=0, created_at=now,
            )  # fmt: skip
            copies.append((target, target_key, row))
        if not copies:
            return 0
        author = message.author_name
        icon = self.icon(message, transport, link)
        # Threads: where each copy goes (a Slack thread) and what it says.
        threads = await self._threads(message, transport, key, text, [k for _, k, _ in copies])
        said = {k: threads.get(k, (text, None)) for _, k, _ in copies}
        self._remember(message, transport, key, link)
        entries = [
            OutboxEntry(
                channel_key=target_key, run_id=row.run_id or "", piece=0, transport=target.name,
                kind="relay", text=said[target_key][0],
                reply_to=_reply_to(author, said[target_key][1], icon),
            )
            for target, target_key, row in copies
            if target.outbox
        ]  # fmt: skip
        ids: list[int] = []
        if entries:
            # Persisted before anything is sent: a crash resends them (the outbox).
            ids = list(await self.host.outbox.add(entries))
        self._map([*rows, *(row for _, _, row in copies)])
        it = iter(ids)
        elsewhere: list[int] = []
        for target, target_key, row in copies:
            oid = next(it, None) if target.outbox else None
            if oid is not None and not self.host.serves(target):
                elsewhere.append(oid)  # another worker owns that connection: it sends it
                continue
            words, thread = said[target_key]
            item = _Relay(words, author, oid, row, thread=thread, icon=icon)
            self._take(oid)
            await self._target(target_key).queue.put(item)
        await self._hand_over(elsewhere)
        return len(copies)

    # -- copies for connections other workers own ---------------------------------------------
    def _take(self, outbox_id: int | None) -> None:
        """This worker sends the outbox row ``outbox_id`` (a resync leaves it alone)."""
        if outbox_id is None:
            return
        self._taken[outbox_id] = None
        while len(self._taken) > 20_000:  # (delivery reports that never came)
            del self._taken[next(iter(self._taken))]

    async def _hand_over(self, ids: Sequence[int]) -> None:
        """Tell the workers that the outbox rows ``ids`` (copies written for connections
        another worker owns, committed) wait for them: ids only; the owner reads the
        rows and sends them in order (:meth:`_relays_noticed`).  A lost notice only
        delays: the owner looks again at each resync."""
        if not ids:
            return
        try:
            await self.store.notifier().publish(RELAY_TOPIC, *(str(i) for i in ids))
        except Exception as exc:
            log.warning("could not announce %d relayed copies to their owner: %s", len(ids), exc)

    def _relays_noticed(self, notice: Any) -> None:
        """Copies for connections another worker owned when they were written (or a
        resync: any undelivered one): the ones for connections this worker serves now
        are sent, in the order they were written."""
        if notice.local and not notice.resync:
            return  # written here for another worker
        ids = () if notice.resync else tuple(notice.ids)
        if self._taking is not None:
            # One read at a time (in order); a resync while one runs reads them all.
            self._take_again = () if not ids or self._take_again == () else (
                (*(self._take_again or ()), *ids)
            )  # fmt: skip
            return
        self._taking = asyncio.ensure_future(self._take_relays(ids))

    async def _take_relays(self, ids: tuple[str, ...]) -> None:
        try:
            while True:
                try:
                    await self._take_rows({int(i) for i in ids if i.isdigit()} if ids else None)
                except Exception:
                    log.exception("could not read the relayed copies of other workers")
                if self._take_again is None:
                    return
                ids, self._take_again = self._take_again, None
        finally:
            self._taking = None

    async def _take_rows(self, wanted: set[int] | None) -> None:
        """Queue the undelivered outbox rows of copies and changes (``wanted``: these
        only; ``None``: every one) whose connection this worker serves, unless taken."""
        if (wanted is not None and not wanted) or not self._by_key:
            return
        for row in await self.store.outbox_undelivered():
            # (an answer's row a following channel's renderer wrote first, then announced
            # by the worker that ran the turn when it wrote the whole answer under the same
            # key: the stream's words completed, for a channel that was not following it)
            handed = _handed(row) or (
                wanted is not None and row.kind == "stream" and row.complete and row.id in wanted
            )
            if (row.kind not in ("relay", "unrelay") and not handed) or row.id is None:
                continue
            if (wanted is not None and row.id not in wanted) or row.id in self._taken:
                continue
            transport = self.host.transport_for(row.channel_key)
            if transport is None or transport.name != row.transport:
                continue
            if not self.host.serves(transport):
                continue  # still another worker's (it sends it, or its next owner does)
            if handed:
                self._take(row.id)
                self._answer_arrived(row)
                continue
            await self.requeue(row)

    # -- answers of turns run here, for channels other workers own -------------------------
    async def _follow_turns(self) -> None:
        """Follow the turns this worker runs: the answer of one in a linked conversation
        goes to every channel of the link this worker does not render (:meth:`_answered_here`)."""
        kinds = {"turn_started", "turn_ended"}
        async with contextlib.aclosing(
            self.host.agent.events(kinds=kinds, max_pending=100_000)
        ) as events:
            async for event in events:
                if not self._by_key or event.parent_run_id is not None or not event.run_id:
                    continue
                try:
                    if isinstance(event, TurnStarted):
                        await self._turn_started(event)
                    elif isinstance(event, TurnEnded):
                        await self._answered_here(event)
                except Exception:
                    log.exception("could not hand the answer of %s to the linked channels",
                                  event.run_id)  # fmt: skip

    async def _turn_started(self, event: TurnStarted) -> None:
        """Note a run of a linked conversation whose answer some channel of the link
        would miss here: one another worker owns, or one served here but not open."""
        for link in self.links.values():
            await self._known(k for k in link.channels if self.host.open_channel(k) is None)
            missed = [
                k for k in link.channels
                if self.host.open_channel(k) is None and self._transport_to_hand(k) is not None
            ]  # fmt: skip
            if not missed:
                continue
            if await self.store.get_binding(link.channels[0]) != event.conversation_id:
                continue
            self._runs[event.run_id or ""] = (link, event.origin or {}, tuple(missed))
            while len(self._runs) > 1_000:  # (turns whose end never came)
                del self._runs[next(iter(self._runs))]
            return

    def asked_elsewhere(self, run_id: str, reply_to: object) -> None:
        """Queued turn ``run_id``, run here, was asked in a channel whose connection
        another worker owns, the answer going where ``reply_to`` says (a Slack thread):
        the answer handed over at its end goes there too (:meth:`_answered_here`)."""
        if isinstance(reply_to, dict) and reply_to:
            self._reply_where[run_id] = reply_to
            while len(self._reply_where) > 1_000:  # (turns whose end never came)
                del self._reply_where[next(iter(self._reply_where))]

    async def _known(self, keys: Iterable[str]) -> None:
        """Wait, at most ``KNOWN_WAIT`` s, until this worker can tell which attached
        instance each of ``keys`` is for.  Only while several instances of a key's type
        wait in standby and none has claimed it (Slack apps another worker owns, still
        asking which team they are in, just after a start or a lost lease): a copy for
        it written before then would have no instance to go to, and be lost."""
        unknown = [
            k for k in keys
            if self.host.transport_for(k) is None and len(self.host.waiting(_kind(k))) > 1
        ]  # fmt: skip
        if not unknown:
            return
        asking = {t.name: t for k in unknown for t in self.host.waiting(_kind(k))}
        new = [k for k in unknown if k not in self._told]
        self._told.update(new)
        if new:
            status_log.info("links: copies for %s wait until %s in standby know their"
                            " channels", ", ".join(new), ", ".join(sorted(asking)))  # fmt: skip
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(KNOWN_WAIT):
                await asyncio.gather(*(t.identify() for t in asking.values()),
                                     return_exceptions=True)  # fmt: skip
        lost = [k for k in new if self.host.transport_for(k) is None]
        if lost:
            log.warning("links: nothing goes to %s for now: %s in standby could not learn"
                        " which channels are theirs", ", ".join(lost),
                        ", ".join(sorted(asking)))  # fmt: skip

    def _transport_to_hand(self, key: str) -> Transport | None:
        """The transport an answer for ``key`` is written to the outbox for when no
        channel renders it here (another worker's connection, or one served here)."""
        transport = self.host.transport_for(key)
        if transport is None or not self.host.serves(transport):
            transport = self.host.standby_for(key) or transport
        if transport is None or not transport.outbox or not transport.relays:
            return None  # not served by this bot, or it shows the conversation (HTTP)
        return transport

    async def _answered_here(self, event: TurnEnded) -> None:
        """A turn of a linked conversation ran here: its answer (with ``answer =
        "asked"``, the pointer where it was not asked) is written to the outbox for
        each channel of the link no channel rendered here, and handed to the worker
        owning that channel's connection (the ``relay`` topic, ids only) or queued
        here.  The owner sends it in the channel's manners, after the copies before it.

        The rows are keyed as the owner's renderer keys the pieces it streams (channel,
        run, piece: a line each on IRC, one message on Slack): where that channel
        followed the turn (:meth:`follow`) they are the streamed pieces, and the owner
        sends none of them again (:meth:`_answer_arrived`); where it did not (taken
        over mid-turn), only the pieces not delivered yet go out."""
        noted = self._runs.pop(event.run_id or "", None)
        where = self._reply_where.pop(event.run_id or "", None)
        if noted is None:
            return
        link, origin, missed = noted
        asked_in = origin.get("channel_key")
        entries: list[OutboxEntry] = []
        run = event.run_id or ""
        for key in missed:
            transport = self._transport_to_hand(key)
            ch = self.host.open_channel(key)
            if transport is None or (ch is not None and (not ch.follows or ch.streamed(run))):
                continue  # opened during the turn: its renderer showed the answer
            if link.settings.answer == "asked" and asked_in and asked_in != key:
                who = origin.get("display_name") or "someone"
                kind, texts = "notice", [f"(answered in {asked_in}, asked by {who})"]
            else:
                kind, texts = "answer", _pieces(event.text, transport)
            if not texts:
                continue
            reply: dict[str, Any] = {"linked": link.name}
            if where is not None and key == asked_in:
                # The asking channel: where its asker's answer goes (their Slack thread).
                reply = {**where, "linked": link.name}
            # The channel's settings in force (its ``!set``, its ``[channels]`` table),
            # as its own answers are capped: read from the store, on any worker.
            opts = (await self.host.effective(key, transport)).options
            cap = opts.max_answer_lines or 0
            rest, texts = (texts[cap:], texts[:cap]) if cap else ([], texts)
            entries += outbox_rows(transport, key, event.run_id or "", 0, kind, texts, reply)
            if rest:
                # Capped as the channel caps an answer: the rest waits for ``more`` there
                # (the owner keeps it in the channel when it sends this line).
                note = f"… {len(rest)} more lines: {opts.command_prefix}more"
                more = {**reply, "more": rest}
                entries += outbox_rows(transport, key, event.run_id or "", len(texts), "notice",
                                       [note], more)  # fmt: skip
        if not entries:
            return
        ids = list(await self.host.outbox.add(entries))
        elsewhere: list[int] = []
        mine: set[int] = set()
        for entry, oid in zip(entries, ids, strict=True):
            transport = self.host.transport_for(entry.channel_key)
            if transport is None or not self.host.serves(transport):
                elsewhere.append(oid)
            else:
                mine.add(oid)
        if mine:
            # Served here: the pieces not delivered yet (a row may be one a renderer
            # wrote and sent: this worker's before it took the connection over, or its
            # last owner's), as the owner of another worker's connection takes them.
            await self._take_rows(mine)
        await self._hand_over(elsewhere)

    def _answer_arrived(self, row: OutboxEntry) -> None:
        """An answer piece of a turn another worker ran, handed over at its end, for a
        channel this worker serves: sent, unless the channel follows that worker's turns
        and its renderer showed this one streamed (the row is then confirmed, once the
        renderer has shown the turn's end: :meth:`OpenChannel.handed_over`)."""
        ch = self.host.open_channel(row.channel_key)
        how = "send"
        if ch is not None and ch.follows and row.id is not None:
            how = ch.handed_over(row.run_id, row.id)
        if how == "send":
            self._queue_answer(row)
        elif how == "confirm" and row.id is not None:
            self.host.outbox.mark(row.id, "confirmed")

    def _queue_answer(self, row: OutboxEntry) -> None:
        """Send ``row`` (an answer piece handed over) through its channel's queue."""
        kind: OutgoingKind = "notice" if row.kind == "notice" else "answer"
        out = OutgoingMessage(
            channel_key=row.channel_key, text=row.text, kind=kind, run_id=row.run_id,
            reply_to=row.reply_to, outbox_id=row.id, written_at=row.created_at or None,
            # (a streamed answer's message, cut short by its last owner: completed)
            replaces=row.ref if row.kind == "stream" else None,
        )  # fmt: skip
        placeholder = LinkMessage(link="", canonical="", channel_key=row.channel_key)
        item = _Relay(row.text, "", row.id, placeholder, out=out)
        self._target(row.channel_key).queue.put_nowait(item)

    @staticmethod
    def icon(message: IncomingMessage, transport: Transport, link: Link) -> str | None:
        """The icon a copy of ``message`` shows for its author where copies can have one
        (Slack): a Slack person's profile image (the source transport read it), else the
        link's ``icons`` entry for the network it was said on, else none (the app's)."""
        image = message.meta.get("icon")
        if isinstance(image, str) and image and transport.type == "slack":
            return image
        return link.settings.icons.get(transport.name)

    async def _threads(
        self, message: IncomingMessage, transport: Transport, key: str, text: str,
        targets: Sequence[str],
    ) -> dict[str, tuple[str, str | None]]:  # fmt: skip
        """Per target, what a copy of ``message`` says and the thread it goes into, where
        that differs from ``(text, None)``:

        - a reply in a Slack thread goes into the copy of the thread's first message
          where the target has threads and the message map knows that copy; elsewhere
          (IRC: the whole channel is one thread) it is quoted: ``(re bob: lunch at…) text``;
        - a line from a network without threads that answers a relayed line (the
          ``+draft/reply`` tag naming its copy, or ``bob: ...`` naming its author) goes
          into that line's thread in the channel it was said in."""
        out: dict[str, tuple[str, str | None]] = {}
        thread = message.meta.get("thread_ts")
        if thread:
            where: dict[str, str] = {}
            await self._settle_map()  # (a copy's id is written as it is sent)
            canonical = await self.store.link_map_find(key, str(thread))
            if canonical is not None:
                for row in await self.store.link_map(canonical):
                    if row.ref and row.channel_key in targets:
                        where[row.channel_key] = row.ref
            root = message.meta.get("thread_root") or {}
            quote = _quote(str(root.get("author") or ""), str(root.get("text") or ""))
            for target_key in targets:
                target = self.host.transport_for(target_key)
                if target_key in where and target is not None and target.caps.threads:
                    out[target_key] = (text, where[target_key])
                elif quote:
                    out[target_key] = (f"{quote} {text}", None)
            return out
        if transport.caps.threads:
            return out
        answered = await self._answered(message, key)
        if answered is not None:
            slack_key, ts = answered
            if slack_key in targets:
                out[slack_key] = (text, ts)
        return out

    async def _answered(self, message: IncomingMessage, key: str) -> tuple[str, str] | None:
        """The thread (channel key, thread ts) of the relayed line ``message`` answers."""
        reply = message.meta.get("reply")
        if reply:
            canonical = await self.store.link_map_find(key, str(reply))
            if canonical is not None:
                rows = await self.store.link_map(canonical)
                for row in rows:  # the origin first: said in a channel with threads?
                    target = self.host.transport_for(row.channel_key)
                    if row.ref and row.channel_key != key and target and target.caps.threads:
                        ts = row.ref
                        return row.channel_key, self._thread_of.get((row.channel_key, ts), ts)
        m = _ADDRESSED.match(message.text.strip())
        if m is None:
            return None
        recent = self._recent.get(key)
        return None if recent is None else recent.get(m.group(1).casefold())

    def _remember(
        self, message: IncomingMessage, transport: Transport, key: str, link: Link
    ) -> None:
        """A line from a channel with threads (Slack): the channels of the link without
        threads remember its author, so ``bob: ...`` there answers in its thread."""
        if not transport.caps.threads:
            return
        ts = message.meta.get("ts")
        name = message.meta.get("name")
        if not ts or not name:
            return
        thread = str(message.meta.get("thread_ts") or ts)
        self._thread_of[(key, str(ts))] = thread
        while len(self._thread_of) > 10_000:
            del self._thread_of[next(iter(self._thread_of))]
        for other in link.channels:
            target = self.host.transport_for(other)
            if other == key or target is None or target.caps.threads:
                continue
            recent = self._recent.setdefault(other, {})
            recent.pop(str(name).casefold(), None)
            recent[str(name).casefold()] = (key, thread)
            while len(recent) > 200:
                del recent[next(iter(recent))]

    async def _posted_into(self, conversation_id: str, instance: str) -> tuple[Link, str] | None:
        """The link whose ``http:<instance>:…`` channel is bound to ``conversation_id``,
        and that channel's key."""
        if not self._by_key:
            return None
        if not self._loaded:
            await self.load()
        prefix = f"http:{instance}:"
        for link in self.links.values():
            key = next((k for k in link.channels if k.startswith(prefix)), None)
            if key is not None and await self.store.get_binding(key) == conversation_id:
                return link, key
        return None

    async def posting(self, conversation_id: str, instance: str) -> None:
        """A message is about to be posted over the HTTP API into ``conversation_id``:
        if it is a link's, every linked channel is opened now, before the turn it asks
        for starts.  (Opened only once the turn ran, a channel's renderer saw the turn
        end without its text and said "(no answer: …)" where the answer was due.)"""
        found = await self._posted_into(conversation_id, instance)
        if found is not None:
            await self._hold_open(found[0])

    async def posted(self, conversation_id: str, instance: str, author: str, text: str) -> int:
        """A message posted over the HTTP API (instance ``instance``) into a linked
        conversation: relayed like a person's message in the link's ``http:<instance>:…``
        channel, the author shown as ``carol (web)``.  How many copies."""
        found = await self._posted_into(conversation_id, instance)
        if found is None:
            return 0
        key = found[1]
        transport = self.host.transport_for(key)
        if transport is None:
            return 0
        message = IncomingMessage(
            channel_key=key, text=text, author_id=author,
            author_name=qualified(author, transport), meta={"name": author},
        )  # fmt: skip
        return await self.relay(message, transport, None)

    def on_delivery(
        self,
        outbox_id: int,
        state: Literal["sent", "confirmed"],
        awaits_confirm: bool | None = None,
        ref: str | None = None,
    ) -> None:
        """A transport's delivery report (it goes on to the outbox): a relayed copy's
        protocol id (its Slack ``ts``) is written into its message-map row, so an edit
        or a deletion of any age finds the copy to change."""
        if self._taken and (state == "confirmed" or not awaits_confirm):
            self._taken.pop(outbox_id, None)
        row = self._copies.get(outbox_id) if self._copies else None
        if row is not None and (ref or state == "confirmed" or not awaits_confirm):
            del self._copies[outbox_id]
            if ref:
                self._map([dataclasses.replace(row, ref=ref)])
        self.host.outbox.mark(outbox_id, state, awaits_confirm, ref)

    async def change(self, message: IncomingMessage, transport: Transport) -> int:
        """A person edited or deleted a message in a linked channel (``message.meta``:
        ``change`` is ``edit`` or ``delete``, ``ts``/``msgid`` the message's protocol
        id; ``message`` as :meth:`arriving` made it): the change goes to every copy the
        message map knows, of any age, behind the copies queued before it.  How many
        targets it goes to (0: the message was never relayed)."""
        found = None if message.direct else self.find(message.channel_key)
        ref = message.meta.get("ts") or message.meta.get("msgid")
        kind: Literal["edit", "delete"] = (
            "delete" if message.meta.get("change") == "delete" else "edit"
        )
        if found is None or not ref or message.meta.get("change") not in ("edit", "delete"):
            return 0
        link, key = found
        if not self._loaded:
            await self.load()
        await self._settle_map()  # the original's rows may still be on their way
        canonical = await self.store.link_map_find(key, str(ref))
        if canonical is None:
            return 0  # never relayed (a command, opted out, before the link)
        rows = await self.store.link_map(canonical)
        said_at = next((r.created_at for r in rows if r.origin), 0.0)
        text = message.text.strip()
        s = link.settings
        if kind == "edit" and (
            not text or (s.opt_out_prefix and text.startswith(s.opt_out_prefix))
        ):
            kind = "delete"  # edited into the opt-out: taken back from the others
        # Each change is a piece of its own in the outbox (keyed by the change, so the
        # same change handed over twice is one row), written before it is queued: a
        # change made while the target is down, or cut by a restart, is applied when
        # it can be (redelivered after a restart, see :meth:`resending`).
        stamp = str(message.meta.get("change_id") or uuid.uuid4().hex)
        author = message.author_name
        items: list[tuple[Transport, _Relay, OutboxEntry]] = []
        await self._known(r.channel_key for r in rows if not r.origin and r.channel_key != key)
        for row in rows:
            if row.origin or row.channel_key == key:
                continue
            target = self.host.transport_for(row.channel_key) or self.host.standby_for(
                row.channel_key
            )
            if target is None or not target.relays:
                continue
            copy_run = row.run_id or f"relay:{canonical}"
            if target.caps.can_edit:
                words = text if kind == "edit" else ""
                out_kind = "relay" if kind == "edit" else "unrelay"
                reply: dict[str, str] = {"author": author, "change": kind, "copy": copy_run}
            elif s.edits == "line":
                words, out_kind, reply = (
                    _change_line(kind, text, said_at),
                    "relay",
                    {"author": author},
                )
            else:
                continue  # the link shows changes nowhere that cannot edit
            entry = OutboxEntry(
                channel_key=row.channel_key, run_id=f"{copy_run}:{kind}:{stamp}", piece=0,
                transport=target.name, kind=out_kind, text=words, reply_to=reply,
            )  # fmt: skip
            items.append((target, _Relay(words, author, None, row, kind, run=entry.run_id), entry))
        entries = [e for t, _, e in items if t.outbox]
        ids = iter(list(await self.host.outbox.add(entries)) if entries else [])
        elsewhere: list[int] = []
        for target, item, _ in items:
            if target.outbox:
                item.outbox_id = next(ids, None)
            if item.outbox_id is not None and not self.host.serves(target):
                elsewhere.append(item.outbox_id)  # its connection's owner applies it
                continue
            self._take(item.outbox_id)
            await self._target(item.row.channel_key).queue.put(item)
        await self._hand_over(elsewhere)
        return len(items)

    async def resending(self, row: OutboxEntry, *, taken: bool = False) -> OutgoingMessage | None:
        """What the outbox row ``row`` of a relayed copy or of a change to one, left
        undelivered by a previous process, is sent as now (:class:`Delivery` asks
        after a restart); ``None``: not now (a change to a copy whose id is not known:
        it stays in the outbox).  A copy's protocol id goes into the message map as
        it is reported, as for a copy sent live.  A row this worker has queued already
        (a copy it relayed, or took from another worker: ``taken``) is ``None`` here:
        its queue sends it, once."""
        if not taken and row.id is not None and row.id in self._taken:
            return None
        self._take(row.id)  # (sent by this worker now: a resync leaves it alone)
        reply = row.reply_to if isinstance(row.reply_to, dict) else {}
        author = reply.get("author")
        kind: OutgoingKind = "unrelay" if row.kind == "unrelay" else "relay"
        change = reply.get("change")
        if change in ("edit", "delete"):
            ref = await self._copy_ref(row.channel_key, str(reply.get("copy") or ""))
            if ref is None:
                log.info("the copy in %s of a changed message has no id: not changed yet",
                         row.channel_key)  # fmt: skip
                return None
            return OutgoingMessage(
                channel_key=row.channel_key, text=row.text, kind=kind, run_id=row.run_id,
                reply_to=reply, outbox_id=row.id, replaces=ref, author=author,
            )  # fmt: skip
        found = self.find(row.channel_key)
        if found is not None and row.id is not None and row.run_id.startswith("relay:"):
            # (not a change line: those are not in the message map)
            if row.run_id.count(":") == 1:
                self._copies[row.id] = LinkMessage(
                    link=found[0].name, canonical=row.run_id.removeprefix("relay:"),
                    channel_key=row.channel_key, run_id=row.run_id, piece=0,
                    created_at=row.created_at,
                )  # fmt: skip
        return OutgoingMessage(
            channel_key=row.channel_key, text=late(row.text, row.created_at, self.late_after),
            kind=kind, run_id=row.run_id, reply_to=reply or row.reply_to, outbox_id=row.id,
            written_at=row.created_at, author=author,
        )  # fmt: skip

    def later(self, out: OutgoingMessage) -> None:
        """Send ``out`` (:meth:`resending` made it) through its target's queue: a
        restart's redelivery found the target still refusing it, so it is tried again
        as a live copy is, until the target is back (the copies and changes behind it
        wait, so the order holds)."""
        row = LinkMessage(link="", canonical="", channel_key=out.channel_key)
        change: Literal["edit", "delete"] | None = None
        if out.replaces is not None:
            change = "delete" if out.kind == "unrelay" else "edit"
        item = _Relay(out.text, out.author or "", out.outbox_id, row, change, out=out)
        self._target(out.channel_key).queue.put_nowait(item)

    async def requeue(self, row: OutboxEntry) -> None:
        """Send the outbox row ``row`` of a relayed copy or a change through its
        target's queue (a restart's redelivery found the target refusing an earlier
        one, or another worker wrote it for a connection this one owns now): a change
        waits there for the copy it changes, its id found as it goes."""
        self._take(row.id)
        reply = row.reply_to if isinstance(row.reply_to, dict) else {}
        change = reply.get("change")
        if change in ("edit", "delete"):
            copy_run = str(reply.get("copy") or "")
            copy = LinkMessage(link="", canonical=copy_run.removeprefix("relay:"),
                               channel_key=row.channel_key, run_id=copy_run)  # fmt: skip
            kind: Literal["edit", "delete"] = "delete" if change == "delete" else "edit"
            item = _Relay(row.text, str(reply.get("author") or ""), row.id, copy, kind,
                          run=row.run_id)  # fmt: skip
            self._target(row.channel_key).queue.put_nowait(item)
            return
        out = await self.resending(row, taken=True)
        if out is not None:
            self.later(out)

    async def _copy_ref(self, key: str, copy_run: str) -> str | None:
        """The protocol id (a Slack ``ts``) of the copy ``copy_run`` in ``key``, from the
        message map."""
        if not copy_run.startswith("relay:"):
            return None
        await self._settle_map()  # the copy's id, reported as it was sent
        rows = await self.store.link_map(copy_run.removeprefix("relay:"))
        return next((r.ref for r in rows if r.channel_key == key and r.ref), None)

    def _map(self, rows: list[LinkMessage]) -> None:
        """Record message-map rows, batched in the background (one store write for
        a burst, off the arrival path)."""
        self._map_rows.extend(rows)
        if self._mapper is None:
            self._mapper = asyncio.get_running_loop().create_task(
                self._write_map(), name="agentik-link-map"
            )

    async def _settle_map(self) -> None:
        """Wait until the message-map rows recorded so far are written."""
        while self._mapper is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._mapper)

    async def _write_map(self) -> None:
        try:
            while self._map_rows:
                batch, self._map_rows = self._map_rows, []
                try:
                    await self.store.link_map_add(batch)
                except Exception:
                    log.exception("could not record %d rows of the link message map", len(batch))
        finally:
            self._mapper = None

    def _target(self, key: str) -> _Target:
        """The queue for ``key``, its sender started."""
        t = self._targets.get(key)
        if t is None:
            t = self._targets[key] = _Target()
        if t.task is None or t.task.done():
            t.task = asyncio.get_running_loop().create_task(
                self._send(key, t), name=f"agentik-relay:{key}"
            )
        return t

    async def _send(self, key: str, t: _Target) -> None:
        """Send ``key``'s copies one at a time, in the order they were relayed; a
        transport holds each until its flood control or rate limit lets it go."""
        while True:
            item = await t.queue.get()
            try:
                await self._deliver(key, item)
            finally:
                t.queue.task_done()

    async def _deliver(self, key: str, item: _Relay) -> None:
        """Hand one copy (or a change to one) to its transport; while the target
        refuses it (down, rate limited past the transport's own retries) try again,
        waiting longer each time (up to a minute): the copies behind it wait, so the
        order holds."""
        delay = 1.0
        while True:
            transport = self.host.transport_for(key)
            if transport is None:
                return  # gone (a reload): the outbox row waits for a restart
            if item.out is not None:
                out = item.out
                more = out.reply_to.get("more") if isinstance(out.reply_to, dict) else None
                if isinstance(more, list) and more:
                    # An answer handed over, capped: its rest for ``more`` in this channel.
                    opts = self.host.options_for(transport)
                    ch = self.host.open_channel(key) or await self.host.channel(
                        key, transport, opts
                    )
                    ch.more = [str(line) for line in more]
                    ch.more_in_code = False
            elif item.change is not None:
                changed = await self._changed(transport, key, item)
                if changed is None:
                    return
                out = changed
            else:
                out = OutgoingMessage(
                    channel_key=key, text=late(item.text, item.row.created_at, self.late_after),
                    kind="relay", run_id=item.row.run_id,
                    reply_to=_reply_to(item.author, item.thread, item.icon),
                    outbox_id=item.outbox_id, author=item.author,
                )  # fmt: skip
                if item.outbox_id is not None:
                    self._copies[item.outbox_id] = item.row
                    while len(self._copies) > 10_000:  # reports that never came
                        del self._copies[next(iter(self._copies))]
            try:
                await transport.send(out)
            except Exception as exc:
                log.warning("relaying to %s failed (%s): again in %.0f s", key, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 60.0)
                continue
            if out.kind in ("answer", "notice"):
                # An answer handed over (a turn another worker ran): its end, as a
                # renderer ends a run (IRC's pending lines, Slack's status).
                with contextlib.suppress(Exception):
                    await transport.send(dataclasses.replace(
                        out, text="", kind="end", outbox_id=None, written_at=None
                    ))  # fmt: skip
                self.answers_handed += 1
            elif item.change is None:
                self.relayed += 1
            else:
                self.changed += 1
            return

    async def _changed(
        self, transport: Transport, key: str, item: _Relay
    ) -> OutgoingMessage | None:
        """What ``transport`` is sent for an edit or a deletion of a copy: an update or a
        deletion of the copy where it can edit (its id from the message map), else the
        line :meth:`change` wrote (the link's ``edits = "line"``)."""
        if transport.caps.can_edit:
            ref = await self._copy_ref(key, item.row.run_id or "")
            if ref is None:
                # Its outbox row waits: a restart tries again (see resending).
                log.info("the copy in %s of a changed message has no id: not changed", key)
                return None
            return OutgoingMessage(
                channel_key=key, text=item.text, run_id=item.run or item.row.run_id,
                author=item.author, kind="relay" if item.change == "edit" else "unrelay",
                replaces=ref, outbox_id=item.outbox_id, reply_to={"author": item.author},
            )  # fmt: skip
        return OutgoingMessage(
            channel_key=key, text=item.text, kind="relay", run_id=item.run or item.row.run_id,
            reply_to={"author": item.author}, outbox_id=item.outbox_id, author=item.author,
        )  # fmt: skip

    async def drain(self) -> None:
        """Wait until every copy relayed so far was handed to its transport and the
        message map recorded."""
        for t in list(self._targets.values()):
            await t.queue.join()
        await self._settle_map()

    async def aclose(self) -> None:
        """Stop the senders (what they had not sent waits in the outbox); the message
        map's pending rows are written."""
        if self._follow is not None:
            self._follow.close()
            self._follow = None
        if self._follow_relays is not None:
            self._follow_relays.close()
            self._follow_relays = None
        if self._taking is not None:
            self._taking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._taking
        if self._answering is not None:
            self._answering.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._answering
            self._answering = None
        if self._reloading is not None:
            self._reloading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reloading
        while self._mapper is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._mapper)
        for t in self._targets.values():
            if t.task is not None:
                t.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t.task
        self._targets.clear()

    def describe(self) -> list[str]:
        """One line per link (``!links``)."""
        return [
            f"{link.name}: {describe(link)}"
            for link in sorted(self.links.values(), key=lambda x: x.name)
        ]


def describe(link: Link) -> str:
    """A link's channels and what it does, on one line (``!links``, ``!link``'s answer):
    ``irc:libera:#team slack:T1:C1 (answer everywhere, relay, icons libera=:irc:)``."""
    s = link.settings
    flags = [f"answer {s.answer}", "relay" if s.relay else "no relay"]
    if s.verified_only:
        flags.append("verified only")
    if s.opt_out_prefix:
        flags.append(f"opt-out {_typed(s.opt_out_prefix)}")
    if s.settings != "asking":
        flags.append(f"settings {s.settings}")
    if s.edits != "line":
        flags.append(f"edits {s.edits}")
    if s.history:
        flags.append(f"history {s.history}")
    if s.icons:
        flags.append("icons " + " ".join(f"{n}={i}" for n, i in sorted(s.icons.items())))
    if link.source == "config":
        flags.append("configured")
    return f"{' '.join(link.channels)} ({', '.join(flags)})"


def _typed(value: str) -> str:
    """``value`` as ``!link`` takes it back: in quotes when it holds a blank or a quote
    (``"no relay"``; ``'say "hi"'``)."""
    if not any(c.isspace() or c in "\"'" for c in value):
        return value
    return f"'{value}'" if '"' in value else f'"{value}"'


def audit(action: str, link: Link, actor: str, where: str) -> None:
    """The audit line of a link made or undone in chat."""
    log_event(
        log, logging.WARNING, "link_changed", "link %s %s by %s in %s: %s", link.name, action,
        actor, where, " ".join(link.channels), link=link.name, action=action, actor=actor,
        channel=where, channels=list(link.channels),
    )  # fmt: skip


def late(text: str, said_at: float, after: float = LATE_AFTER) -> str:
    """``text`` marked with the time it was said when it is delivered more than
    ``after`` seconds later (a network was down, the bot restarted)."""
    if not said_at or time.time() - said_at <= after:
        return text
    return f"(late: {time.strftime('%H:%M', time.gmtime(said_at))} UTC) {text}"


#: ``bob: ...`` / ``bob, ...``: a line addressed to someone by name.
_ADDRESSED = re.compile(r"^([^\s:,]{1,64})[:,]\s")
#: Characters of a thread's first message quoted on a network without threads.
QUOTE_CHARS = 40


def _change_line(kind: str, text: str, said_at: float) -> str:
    """How a network that cannot edit (IRC) shows a change of a relayed message, with
    the link's ``edits = "line"``: ``(edit) the new text``, or ``(deleted their message
    of 14:02 UTC)`` (the time it was said tells which; its words are not repeated)."""
    if kind == "edit":
        return f"(edit) {text}"
    at = time.strftime("%H:%M", time.gmtime(said_at or time.time()))
    return f"(deleted their message of {at} UTC)"


def _quote(author: str, text: str) -> str:
    """``(re bob: lunch at the usual…)``; empty without an author."""
    if not author:
        return ""
    words = " ".join(text.split())
    if len(words) > QUOTE_CHARS:
        words = words[:QUOTE_CHARS].rstrip() + "…"
    return f"(re {author}: {words})" if words else f"(re {author})"


def _reply_to(author: str, thread: str | None, icon: str | None = None) -> dict[str, str]:
    """A relayed copy's reply data: its author, the thread it goes into, and the icon
    shown for its author where a copy can have one (Slack)."""
    out = {"author": author}
    if thread:
        out["thread"] = thread
    if icon:
        out["icon"] = icon
    return out


def _handed(row: OutboxEntry) -> bool:
    """Whether ``row`` is an answer (or a pointer) of a linked conversation written for
    a channel whose renderer was elsewhere (:meth:`Links._answered_here`)."""
    return (
        row.kind in ("answer", "notice")
        and isinstance(row.reply_to, dict)
        and bool(row.reply_to.get("linked"))
    )


def _pieces(text: str, transport: Transport) -> list[str]:
    """An answer as ``transport`` takes it whole: one message where it has no line
    limit to speak of (Slack), else a piece per line, split at its byte limit (IRC)."""
    text = text.strip()
    if not text:
        return []
    caps = transport.caps
    if not caps.max_bytes or caps.max_bytes >= 4000:
        return [text]
    out: list[str] = []
    for line in text.splitlines():
        if line.strip():
            out += split_text(line, max_bytes=caps.max_bytes, max_chars=caps.max_chars) or [line]
    return out


def _own_nick(transport: Transport) -> str:
    return str(getattr(transport, "nick", "") or transport.name)


class LinkedRenderer(Renderer):
    """A linked channel with ``answer = "asked"``: a run asked in another channel of the
    link shows here as one line (``(answered in slack:T1:C1, asked by Bob (Slack))``)."""

    __slots__ = ("elsewhere",)

    def __init__(self, host: Any, ch: OpenChannel) -> None:
        super().__init__(host, ch)
        #: Runs asked elsewhere, and the line each gets here.
        self.elsewhere: dict[str, str] = {}

    async def on_event(self, event: Event) -> None:
        run = event.run_id or ""
        if isinstance(event, TurnStarted) and event.parent_run_id is None:
            origin: Mapping[str, Any] = event.origin or {}
            where = origin.get("channel_key")
            if where and where != self.ch.key:
                who = origin.get("display_name") or event.author or "someone"
                self.elsewhere[run] = f"(answered in {where}, asked by {who})"
                return
        if run in self.elsewhere:
            if isinstance(event, TurnEnded) and event.parent_run_id is None:
                line = self.elsewhere.pop(run)
                await self._out(line, "notice", run)
            return
        await super().on_event(event)


def _kind(key: str) -> str:
    """The transport type a channel key names (``slack`` of ``slack:T1:C1``)."""
    return key.partition(":")[0]
