"""The Agent: owns every conversation, their persistence and the event stream."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import Field

from .agents import (
    AGENT_NAME,
    AgentSpec,
    AgentTool,
    AgentUses,
    RunNode,
    RunPolicy,
    Runs,
    new_run_id,
)
from .approvals import ApprovalRule, Approvals
from .attachments import AttachmentSettings, hashes_of
from .checkpoints import CheckpointSettings
from .compaction import CompactContextTool, CompactionPolicy, Compactor
from .conversation import Conversation, ConversationState
from .errors import ConfigError, NotFound
from .eventbus import Subscription
from .events import ConversationEnded, ConversationStarted
from .health import HealthRegistry
from .hooks import Hooks
from .keyedlocks import KeyedLocks
from .llm.base import LLMBackend
from .memory import MemoryBackend, NoMemory
from .memtrim import DEFAULT_INTERVAL as DEFAULT_TRIM_INTERVAL
from .memtrim import MemoryTrim
from .messages import Message
from .observe import RequestStats
from .questions import Checklists, Questions, builtin_tools
from .redaction import Redaction, RedactionError, replay_edit, tombstone
from .services import AgentServices, AgentState, profile_of
from .settings import settings_dataclass
from .soul import read_soul
from .store.base import ConversationRecord, RunRecord, Store
from .store.sqlite import SQLiteStore
from .streamprofiles import BUILTIN_PROFILES, StreamProfile
from .tools.base import Tool, TurnPolicy

if TYPE_CHECKING:
    from .cluster.conversations import TurnQueue
    from .cluster.events import ClusterEvents
    from .store.memory import MemoryStore

__all__ = ["Agent", "AgentSettings", "AgentState"]

log = logging.getLogger(__name__)


@settings_dataclass
class AgentSettings(AgentUses):
    """The agent's own settings (the core part of the ``[agent]`` section).

    ``event_buffer``: how many recent events each conversation keeps for
    reconnecting subscribers.  ``transcript_cache``: how many idle
    conversations keep their transcript (working memory) in memory for their
    next turn; the least recently active beyond it reload theirs from the
    store when they next run (0: every turn does).  ``uses``: the named agents
    (``[agents.<name>]``) the main agent may call, each as the tool
    ``agent__<name>``.  ``prompt_events``: emit a ``prompt_rendered`` event
    before every model request (what went to the model, known secrets
    scrubbed; carried by the ``debug`` profile, not by ``chat``).
    """

    event_buffer: int = Field(1024, ge=16)
    transcript_cache: int = Field(64, ge=0)
    #: Emit ``prompt_rendered`` before every model request (what went to the model).
    prompt_events: bool = False


_DEFAULTS = AgentSettings()


class Agent:
    """An LLM agent serving many conversations.

    ``llm`` is the model backend; ``store`` the persistence engine (default: SQLite in memory);
    ``tools`` what the model may call; ``system_prompt`` is put in front of every request (so
    changing it takes effect at once, in every conversation); ``policy`` the default
    :class:`TurnPolicy`; ``event_buffer`` how many recent events each conversation keeps for
    reconnecting subscribers, and ``event_budget`` how many all of them keep together,
    ``event_bytes`` about how many bytes (answers and tool outputs travel in events; memory
    stays bounded with many channels and large outputs); ``transcript_cache`` how many idle
    conversations keep their transcript cached for their next turn (the least recently active
    beyond it reload it from the store: :class:`~agentik.core.workingmemory.Transcripts`);
    ``memory`` the long-term memory backend (its tools are merged with ``tools``); ``toolsets``
    provide tools that may change while the agent runs (MCP servers: ``tools()`` is asked at
    every turn, ``start()``/``aclose()`` follow the agent's); ``background`` coroutine functions
    run as tasks while the agent runs (each receives the agent; they react to :meth:`events`,
    they do not poll), cancelled by :meth:`aclose`; ``compaction`` when and how working memory
    is compacted (:class:`~agentik.core.compaction.CompactionPolicy`); ``hooks`` the plugins
    whose interception hooks run (a pluggy ``PluginManager``, a
    :class:`~agentik.core.hooks.Hooks`, or a list of plugin objects); ``on_start`` coroutine
    functions awaited (in order) by :meth:`start` once the store and memory are open — a failure
    stops start-up;
    ``approvals`` the rules of tool calls that wait for a person's approval
    (:class:`~agentik.core.approvals.ApprovalRule` values or an
    :class:`~agentik.core.approvals.Approvals`); ``prompt_events`` emit a
    ``prompt_rendered`` event before every model request (what went to the model,
    known secrets scrubbed); ``memory_trim`` at most how often (seconds)
    memory freed by conversations leaving memory is handed back to the system (glibc's
    ``malloc_trim``, in a worker thread: :mod:`~agentik.core.memtrim`; ``None`` or 0: never).

    Use as an async context manager, or call :meth:`start` and
    :meth:`aclose`.  What the agent hands its conversations (event numbering
    and publishing, the replay-buffer budget, the registry of open and busy
    conversations, their lifecycle) is :attr:`services`
    (:class:`~agentik.core.services.AgentServices`).
    """

    def __init__(
        self,
        *,
        llm: LLMBackend,
        id: str | None = None,
        store: Store | None = None,
        tools: Iterable[Tool] = (),
        system_prompt: str | None = None,
        policy: TurnPolicy | None = None,
        event_buffer: int = _DEFAULTS.event_buffer,
        event_budget: int = 50_000,
        event_bytes: int = 16 * 2**20,
        transcript_cache: int = _DEFAULTS.transcript_cache,
        memory: MemoryBackend | None = None,
        background: Iterable[Callable[[Agent], Awaitable[None]]] = (),
        toolsets: Iterable[Any] = (),
        compaction: CompactionPolicy | None = None,
        hooks: Any = None,
        on_start: Iterable[Callable[[Agent], Awaitable[None]]] = (),
        approvals: Approvals | Iterable[ApprovalRule] | None = None,
        profiles: Mapping[str, LLMBackend] | None = None,
        agents: Mapping[str, AgentSpec] | None = None,
        uses: Iterable[str] = (),
        run_policy: RunPolicy | None = None,
        stream_profiles: Mapping[str, StreamProfile] | None = None,
        memory_trim: float | None = DEFAULT_TRIM_INTERVAL,
        prompt_events: bool = False,
        attachments: AttachmentSettings | None = None,
        checkpoints: CheckpointSettings | None = None,
    ) -> None:
        #: Names this agent (the standalone seed's ``agent.id``): ``id`` if given
        #: (the bot gives ``[agent] name``), else a fresh random hex id.  Shown by
        #: ``GET /agentik/status`` (``agent_id``).
        self.id: str = id or uuid.uuid4().hex
        self.llm = llm
        #: Emit ``prompt_rendered`` before every model request (``[agent] prompt_events``).
        self.prompt_events = prompt_events
        #: Event stream profiles subscribers may name (``chat``, ``debug``,
        #: ``metrics`` and ``[profiles.<name>]``; see :mod:`agentik.core.streamprofiles`).
        self.stream_profiles: dict[str, StreamProfile] = {
            **BUILTIN_PROFILES,
            **(stream_profiles or {}),
        }
        #: Named model profiles (``[llm.profiles.<name>]``): more backends a
        #: conversation can use instead of :attr:`llm` (see :meth:`llm_for`).
        self.profiles: dict[str, LLMBackend] = dict(profiles or {})
        self.store: Store = store if store is not None else SQLiteStore(":memory:")
        self.system_prompt = system_prompt
        self.policy = policy or TurnPolicy()
        self.event_buffer = event_buffer
        #: How many idle conversations keep their transcript cached (read at start-up).
        self.transcript_cache = transcript_cache
        self.state = AgentState.NEW
        self.memory: MemoryBackend = memory if memory is not None else NoMemory()
        self.memory.before_store = self._scrub_note
        self.hooks = Hooks.of(hooks)
        self.compactor = Compactor(self, compaction)
        #: Which tool calls wait for a person's approval, and the pending ones
        #: (:mod:`agentik.core.approvals`).
        self.approvals = (
            approvals if isinstance(approvals, Approvals) else Approvals(approvals or ())
        )
        self.approvals.store = self.store
        #: The questions turns wait for (``ask_user``; :mod:`agentik.core.questions`).
        self.questions = Questions(store=self.store)
        #: Each conversation's checklist (the ``todo`` tool), kept in its store;
        #: item texts pass the ``before_store`` hooks as tool-call text.
        self.todos = Checklists(
            self._run_store, scrub=lambda text, cid: self.hooks.before_store("tool_call", text, cid)
        )
        #: Most events kept in all conversations' replay buffers together; the
        #: least recently active conversations lose theirs first.
        self.event_budget = event_budget
        #: About how many bytes of events all conversations' replay buffers keep
        #: together (:func:`~agentik.core.services.event_weight`); the least recently
        #: active conversations lose theirs first.
        self.event_bytes = event_bytes
        #: Called once per model request with its :class:`~agentik.core.observe.RequestStats`
        #: (backend, model, latency, time to first token, tokens): metrics hang here.
        self.request_observers: list[Callable[[RequestStats], None]] = []
        self._tools: dict[str, Tool] = {}
        for t in (*tools, *self.memory.tools(), *builtin_tools(self.policy, checklists=self.todos)):
            self.add_tool(t)
        if self.compactor.policy.tool:
            self.add_tool(CompactContextTool())
        #: Named agents (``[agents.<name>]``), each offered as the tool ``agent__<name>``
        #: to the agents that use it (:mod:`agentik.core.agents`).
        self.agents: dict[str, AgentSpec] = dict(agents or {})
        #: The agents the main agent may call.
        self.uses: tuple[str, ...] = tuple(uses)
        #: Limits of run trees (depth, concurrent children, token budgets).
        self.run_policy = run_policy or RunPolicy()
        #: Limits of images and files sent with messages (``[attachments]``).
        self.attachments: AttachmentSettings = attachments or AttachmentSettings()
        #: Checkpoints (``[checkpoints]``): how many taken by hand a conversation keeps
        #: (``keep_manual``; the automatic ones are the ``CheckpointWorker``'s).
        self.checkpoints: CheckpointSettings = checkpoints or CheckpointSettings()
        #: The runs going on now, as a tree (:class:`~agentik.core.agents.Runs`).
        self.runs = Runs(self)
        #: Each named agent's system prompt (its ``system_prompt`` and ``soul``).
        self.agent_prompts: dict[str, str | None] = {}
        self._add_agents()
        self.toolsets = list(toolsets)
        self._background_fns = list(background)
        self._on_start = list(on_start)
        self._background: list[asyncio.Task[None]] = []
        # Made with the first temporary conversation: a bot without one never loads
        # the in-memory store's modules (0.4 MB).
        self._temp_store: MemoryStore | None = None
        #: What the agent hands each conversation (see :mod:`agentik.core.services`).
        self.services = AgentServices(self)
        # Conversations that leave memory give it back to the system (glibc).
        self._trim = self.services.trim = MemoryTrim(memory_trim)
        self.memory.on_release = self._trim.released
        # One lock per channel key, kept only while in use.
        self._channel_lock = KeyedLocks()
        #: New channels' conversations not stored yet (their binding is written with
        #: their first message), by channel key: until then the store knows nothing.
        self._unbound: dict[str, Conversation] = {}
        #: States of transports, MCP servers and the model (:mod:`agentik.core.health`).
        self.health = HealthRegistry()
        #: Awaited by :meth:`end_conversation` (``(conversation, reason, channel_key)``),
        #: before a deleted conversation's rows go: the memory worker reads what
        #: it will reflect on here.
        self.end_listeners: list[Callable[[Conversation, str, str | None], Awaitable[None]]] = []
        #: Awaited by :meth:`wind_down` (a bot's orderly shutdown), before anything closes.
        self.closing_listeners: list[Callable[[], Awaitable[None]]] = []
        #: Awaited by :meth:`aclose` once every conversation open in memory stopped
        #: (running turns ended, their partial answers stored) and before the store
        #: closes, with those conversations: the checkpoint worker keeps what changed.
        self.shutdown_listeners: list[Callable[[list[Conversation]], Awaitable[None]]] = []
        self._wound_down = False
        #: On a store several workers share: this worker's part in events and waits
        #: across workers (:mod:`agentik.core.cluster.events`); ``None`` on one process.
        self.cluster_events: ClusterEvents | None = None
        #: Several workers on a shared store: the conversation leases and the turn queue
        #: front ends submit through (:mod:`agentik.core.cluster.conversations`; the bot
        #: sets it); ``None``: turns are submitted to the conversation directly.
        self.turn_queue: TurnQueue | None = None

    def __repr__(self) -> str:
        return f"<Agent {self.id} {self.state.value} llm={self.llm!r}>"

    def llm_for(self, profile: str | None) -> LLMBackend:
        """The backend of model profile ``profile``; :attr:`llm` for ``None``,
        ``"default"`` or a name no profile has."""
        if profile is None:
            return self.llm
        return self.profiles.get(profile, self.llm)

    # -- lifecycle ---------------------------------------------------------------
    async def start(self) -> Agent:
        if self.state is AgentState.NEW:
            await self.store.start()
            try:
                await self.memory.start()
            except BaseException:
                await self.store.aclose()
                raise
            try:
                for fn in self._on_start:
                    await fn(self)
            except BaseException:
                with contextlib.suppress(Exception):
                    await self.memory.aclose()
                await self.store.aclose()
                raise
            # A toolset that fails to start is logged; the agent runs without it.
            starters = [ts for ts in self.toolsets if hasattr(ts, "start")]
            results = await asyncio.gather(*(ts.start() for ts in starters), return_exceptions=True)
            for toolset, result in zip(starters, results, strict=True):
                if isinstance(result, BaseException):
                    log.error("toolset %r failed to start: %s", toolset, result)
            if self.store.shared:
                # Workers: events and waits across processes (agentik.core.cluster.events).
                from .cluster.events import ClusterEvents

                self.cluster_events = ClusterEvents(self)
                self.cluster_events.start()
            self.state = AgentState.RUNNING
            for i, fn in enumerate(self._background_fns):
                task = asyncio.create_task(self._run_background(fn), name=f"agentik-background:{i}")
                self._background.append(task)
            # Let each background coroutine reach its first wait: what it sets up
            # before (the memory worker's end listeners) is in place on return.
            await asyncio.sleep(0)
        return self

    @property
    def background(self) -> tuple[Callable[[Agent], Awaitable[None]], ...]:
        """The background coroutine functions given at construction (the memory and
        retention workers, plugins'), each run as a task while the agent is started."""
        return tuple(self._background_fns)

    @property
    def temp_store(self) -> MemoryStore:
        """The in-memory store of temporary conversations (never written to disk)."""
        if self._temp_store is None:
            from .store.memory import MemoryStore

            self._temp_store = MemoryStore()
        return self._temp_store

    @property
    def memory_trims(self) -> int:
        """How many times memory freed by conversations leaving memory was handed
        back to the system (glibc's ``malloc_trim``, at most once per
        ``memory_trim`` seconds; always 0 with another C library or
        ``AGENTIK_MALLOC_TRIM=0``)."""
        return self._trim.count

    @property
    def cached_transcripts(self) -> int:
        """Idle conversations holding their transcript in memory now (at most
        ``transcript_cache``; busy ones hold theirs besides)."""
        return len(self.services.transcripts)

    @property
    def channel_locks(self) -> int:
        """Per-channel binding locks held now (each is kept only while in use)."""
        return len(self._channel_lock)

    async def _run_background(self, fn: Callable[[Agent], Awaitable[None]]) -> None:
        try:
            await fn(self)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("background task %r failed", fn)

    async def aclose(self, *, drain: bool = False) -> None:
        """Stop every conversation (interrupting running turns unless ``drain``),
        close the model backend and the store.  Nothing is left running.

        A running agent first winds down (:meth:`wind_down`, unless the caller did:
        the memory worker reflects on and mines what is new, within its budget);
        then each conversation open in memory publishes ``conversation_ended``
        (reason ``shutdown``) before its event streams end, unless it ended
        already (``closed``, ``reset``, ``deleted``, or the wind-down's); then the
        :attr:`shutdown_listeners` run, before the store closes."""
        if self.state in (AgentState.CLOSING, AgentState.CLOSED):
            return
        if self.state is AgentState.RUNNING:
            await self.wind_down()
        self.state = AgentState.CLOSING
        closing = self.services.conversations()
        await asyncio.gather(*(c.aclose(drain=drain) for c in closing), return_exceptions=True)
        for listener in list(self.shutdown_listeners):
            try:
                await listener(closing)
            except Exception:
                log.exception("shutdown listener %r failed", listener)
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self.cluster_events is not None:
            await self.cluster_events.aclose()
        self.services.close()
        self._trim.close()
        with contextlib.suppress(Exception):
            await self.llm.aclose()
        for backend in self.profiles.values():
            with contextlib.suppress(Exception):
                await backend.aclose()
        with contextlib.suppress(Exception):
            await self.memory.aclose()
        for toolset in self.toolsets:
            if hasattr(toolset, "aclose"):
                try:
                    await toolset.aclose()
                except Exception:
                    log.exception("closing toolset %r failed", toolset)
        await self.store.aclose()
        self.state = AgentState.CLOSED

    async def wind_down(self) -> None:
        """An orderly shutdown's first step: run the :attr:`closing_listeners`
        (the memory worker reflects on conversations with turns not yet
        reflected on, within its time budget).  :meth:`aclose` follows."""
        if self.state is not AgentState.RUNNING or self._wound_down:
            return
        self._wound_down = True  # once: aclose() calls it too (a bot calls it before)
        for listener in list(self.closing_listeners):
            try:
                await listener()
            except Exception:
                log.exception("closing listener %r failed", listener)

    async def end_conversation(
        self, conv: Conversation, reason: str, *, channel_key: str | None = None
    ) -> None:
        """Publish that ``conv`` ended (``reset``, ``deleted``, ``idle``,
        ``shutdown``) and await the :attr:`end_listeners` (failures are logged)."""
        key = channel_key or getattr(conv, "channel_key", None)
        conv.parts.events.emit(ConversationEnded, None, reason=reason, channel_key=key)
        for listener in list(self.end_listeners):
            try:
                await listener(conv, reason, key)
            except Exception:
                log.exception("conversation end listener %r failed", listener)

    async def __aenter__(self) -> Agent:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _check_running(self) -> None:
        self.services.check_running()

    # -- tools -------------------------------------------------------------------
    @property
    def tools(self) -> list[Tool]:
        """Every tool the model may be offered now: fixed ones, then each toolset's."""
        tools = list(self._tools.values())
        seen = set(self._tools)
        for toolset in self.toolsets:
            for t in toolset.tools():
                if t.name not in seen:
                    seen.add(t.name)
                    tools.append(t)
        return tools

    def _add_agents(self) -> None:
        known = self.agents
        for name, spec in known.items():
            if not AGENT_NAME.fullmatch(name):
                raise ConfigError(
                    f"agents.{name}: not a usable agent name (a letter, then letters,"
                    " digits, _ or -; at most 48)"
                )
            for used in spec.uses:
                if used not in known:
                    raise ConfigError(f"agents.{name}.uses: no agent {used!r}{_known(known)}")
            try:
                soul = read_soul(spec.soul) if spec.soul else None
            except ConfigError as exc:
                raise ConfigError(
                    str(exc).replace("agent.soul", f"agents.{name}.soul", 1)
                ) from None
            prompt = "\n\n".join(p for p in (spec.system_prompt, soul) if p)
            self.agent_prompts[name] = prompt or None
            self.add_tool(_agent_tool(self, name, spec))
        for used in self.uses:
            if used not in known:
                raise ConfigError(f"agent.uses: no agent {used!r}{_known(known)}")

    def add_tool(self, tool: Tool) -> None:
        """Offer ``tool`` to the model; names must be unique."""
        if tool.name in self._tools:
            raise ConfigError(f"two tools are named {tool.name!r}")
        self._tools[tool.name] = tool

    def store_for(self, conversation: Conversation) -> Store:
        """The store that holds ``conversation``: the in-memory one of temp conversations
        (never written to disk), else :attr:`store`."""
        return self.temp_store if conversation.temp else self.store

    # -- the run tree (agentik.core.agents) ---------------------------------------------
    def _run_store(self, conversation_id: str) -> Store:
        conv = self.services.find(conversation_id)
        return self.temp_store if conv is not None and conv.temp else self.store

    def run_started(self, node: RunNode) -> None:
        """A child run started: it and its parent are recorded in the run tree when
        they end (one write each; a child's conversation says whose child it is)."""
        node.stored = True
        if node.parent is not None:
            node.parent.stored = True

    async def store_run_ended(self, node: RunNode, stop_reason: str) -> None:
        """Record a run of a run tree, ended (``stop_reason``)."""
        await self._run_store(node.conversation_id).run_add(
            self.run_record(node, stop_reason=stop_reason)
        )

    async def store_run_refused(
        self, parent: RunNode, agent: str, call_id: str | None, stop_reason: str
    ) -> None:
        """Record a child run that was not started (``stop_reason`` says why)."""
        refused = RunNode(
            new_run_id(), "", agent=agent, parent=parent, depth=parent.depth + 1, call_id=call_id
        )
        self.run_started(refused)
        await self._run_store(parent.conversation_id).run_add(
            self.run_record(refused, stop_reason=stop_reason)
        )

    def run_record(self, node: RunNode, *, stop_reason: str) -> RunRecord:
        """``node``'s row of the run tree, as it ended."""
        parent = node.parent
        return RunRecord(
            run_id=node.run_id,
            conversation_id=node.conversation_id or None,
            parent_run_id=parent.run_id if parent else None,
            parent_conversation_id=parent.conversation_id if parent else None,
            parent_call_id=node.call_id,
            agent=node.agent,
            depth=node.depth,
            started=node.started,
            ended=time.time(),
            stop_reason=stop_reason,
            usage=node.usage.to_dict(),
        )

    # -- conversations ---------------------------------------------------------------
    def _wrap(
        self,
        record: ConversationRecord,
        *,
        temp: bool,
        channel_key: str | None = None,
        new: bool = False,
    ) -> Conversation:
        conv = self.services.find(record.id)
        if conv is None:
            store = self.temp_store if temp else self.store
            conv = Conversation(
                self.services, record, store=store, temp=temp, channel_key=channel_key, fresh=new
            )
            self.services.remember(conv)
        elif channel_key is not None and conv.channel_key is None:
            conv.channel_key = channel_key
        return conv

    async def create_conversation(
        self,
        *,
        title: str = "",
        temp: bool = False,
        conversation_id: str | None = None,
        meta: dict[str, Any] | None = None,
        channel_key: str | None = None,
    ) -> Conversation:
        """Create a conversation; ``temp=True`` keeps it in memory only.

        ``channel_key`` binds it to a channel, as :meth:`conversation_for_channel`
        would (for a temporary conversation, only until the process ends).
        """
        self._check_running()
        now = time.time()
        record = ConversationRecord(
            id=conversation_id or uuid.uuid4().hex,
            title=title,
            created_at=now,
            updated_at=now,
            meta={**(meta or {}), **({"channel_key": channel_key} if channel_key else {})},
        )
        store = self.temp_store if temp else self.store
        await store.create_conversation(record, channel_key=channel_key)
        return await self._started(record, temp=temp, channel_key=channel_key)

    async def _started(
        self, record: ConversationRecord, *, temp: bool, channel_key: str | None = None
    ) -> Conversation:
        conv = self._wrap(record, temp=temp, channel_key=channel_key, new=True)
        conv.parts.events.emit_agent_wide(ConversationStarted, channel_key=channel_key)
        await self.services.session_start(conv)
        return conv

    async def create_child_conversation(
        self, *, title: str, temp: bool, meta: dict[str, Any]
    ) -> Conversation:
        """Create a child run's conversation (agentik.core.agents).

        It is marked internal in the store (:meth:`Store.set_internal`) until
        :meth:`child_run_done`.  Its row is written with its first message, in one transaction (see
        :meth:`Store.create_conversation_with`), when no plugin could write to
        it before that message (no ``session_start`` or ``before_prompt``
        hook); otherwise at once, as :meth:`create_conversation` does.
        """
        self._check_running()
        now = time.time()
        record = ConversationRecord(
            id=uuid.uuid4().hex, title=title, created_at=now, updated_at=now, meta=meta
        )
        store = self.temp_store if temp else self.store
        # Until its run ends, its writes need no fsync of their own (see agents).
        store.set_internal(record.id, True)
        hooks = self.services.hooks
        if hooks.implemented("session_start") or hooks.implemented("before_prompt"):
            await store.create_conversation(record)
            return await self._started(record, temp=temp)
        conv = await self._started(record, temp=temp)
        conv.store_with_first_message(record)
        return conv

    def child_run_done(self, child: Conversation) -> None:
        """A child run ended: its conversation's writes are ordinary ones again."""
        (self.temp_store if child.temp else self.store).set_internal(child.id, False)

    async def get_conversation(self, conversation_id: str) -> Conversation:
        """The conversation with this id; raises :class:`NotFound`."""
        self._check_running()
        conv = self.services.find(conversation_id)
        if conv is not None:
            return conv
        temps = self._temp_store
        record = None if temps is None else await temps.get_conversation(conversation_id)
        temp = record is not None
        if record is None:
            record = await self.store.get_conversation(conversation_id)
        if record is None:
            raise NotFound(f"no conversation {conversation_id!r}")
        return self._wrap(record, temp=temp, channel_key=record.meta.get("channel_key"))

    async def delete_conversation(self, conversation_id: str) -> None:
        """Delete a conversation and everything stored about it."""
        self._check_running()
        try:
            ending = await self.get_conversation(conversation_id)
        except NotFound:
            ending = None
        if ending is not None:
            # Before the rows go: the listeners read what they need (reflection).
            await self.end_conversation(ending, "deleted")
        conv = self.services.find(conversation_id)
        if conv is not None:
            await self.services.session_end(conv, "deleted")
            await conv.aclose()
        if self.cluster_events is not None:
            # Its last events may still wait for their batch (50 ms): written after the
            # delete, they would outlive the conversation.
            await self.cluster_events.flushed()
        temps = self._temp_store
        if temps is None or not await temps.delete_conversation(conversation_id):
            if not await self.store.delete_conversation(conversation_id):
                raise NotFound(f"no conversation {conversation_id!r}")

    async def redact(
        self, conversation_id: str, message_id: int, *, by: str, reason: str = ""
    ) -> Redaction:
        """Replace a stored message's content with a tombstone (who, when, why).

        The audit-log row and its working-memory entries get the tombstone
        (the next request carries it, not the text), memory notes derived
        from a span that covers the message are deleted with their versions,
        the events still held for replay (``events(after=…)``) are rewritten
        (:func:`~agentik.core.redaction.replay_edit`), a redacted ``ask_user``
        result takes the stored question's answer with it, and the redaction
        is audited (:meth:`Store.redactions
        <agentik.core.store.base.Store.redactions>`).  Raises
        :class:`NotFound` (no such conversation or message) or
        :class:`~agentik.core.redaction.RedactionError` (already redacted).
        """
        self._check_running()
        if await self.store.get_conversation(conversation_id) is None:
            temps = self._temp_store
            if temps is not None and await temps.get_conversation(conversation_id) is not None:
                raise RedactionError("temporary conversations are never stored: nothing to redact")
            raise NotFound(f"no conversation {conversation_id!r}")
        rows = await self.store.messages(conversation_id, after=message_id - 1, limit=1)
        if not rows or rows[0].id != message_id:
            raise NotFound(f"conversation {conversation_id!r} has no message {message_id}")
        row = rows[0]
        at = time.time()
        content = tombstone(by, at, reason)
        done = await self.store.redact_message(
            conversation_id, message_id, content=content, by=by, reason=reason, at=at
        )
        if done is None:
            raise NotFound(f"conversation {conversation_id!r} has no message {message_id}")
        attached = hashes_of(row.data)
        if attached:
            # Its images and files go with it (bytes nobody else holds are removed).
            await self.store.attachment_drop(conversation_id, attached)
        if row.kind == "tool_call" and row.tool_name == "todo":
            # The checklist's text came from such a call: it goes with it.
            await self.todos.clear(conversation_id)
        # The replay buffers (``events?after=…``) hold copies of what it said.
        edit = replay_edit(row.kind, row.run_id, row.tool_call_id, content)
        self.services.scrub(edit)
        if self.cluster_events is not None:  # workers: the stored events, the others' buffers
            await self.cluster_events.redacted(conversation_id, message_id, edit)
        conv = self.services.find(conversation_id)
        if conv is not None:
            conv.redacted(message_id, content, row.kind, row.tool_call_id, row.content)
            if conv.title and conv.title in row.content:
                conv.title = "(redacted)"
        log.info(
            "conversation %s: message %d redacted by %s (%d derived note(s) removed)",
            conversation_id,
            message_id,
            by,
            done.notes_removed,
        )
        return done

    async def scrub_redacted(self, conversation_id: str, message_id: int) -> None:
        """Another worker redacted message ``message_id``: scrub this worker's replay
        buffers of what it said (read again from the store: its tombstone)."""
        rows = await self.store.messages(conversation_id, after=message_id - 1, limit=1)
        if rows and rows[0].id == message_id:
            row = rows[0]
            self.services.scrub(replay_edit(row.kind, row.run_id, row.tool_call_id, row.content))

    def _scrub_note(self, text: str) -> str:
        return self.hooks.before_store("note", text, None)

    async def list_conversations(
        self,
        *,
        limit: int = 50,
        offset: int = 0,
    ) -> list[ConversationRecord]:
        """A page of conversations (temporary ones included), most recent first."""
        self._check_running()
        stored = await self.store.list_conversations(limit=limit + offset, offset=0)
        temps = self._temp_store
        temp = (
            [] if temps is None else await temps.list_conversations(limit=limit + offset, offset=0)
        )
        merged = sorted([*stored, *temp], key=lambda r: (-r.updated_at, r.id))
        return merged[offset : offset + limit]

    async def pending_turns(self, *, limit: int = 1000, after: int = 0) -> list[Message]:
        """Committed user messages that were never answered, oldest first.

        A turn that a crash or a shutdown cut off has no recorded end (a
        ``!stop``, an error or a finished answer has one).  Hand each to its
        conversation's :meth:`Conversation.resume` (``agentik.bot`` does this
        at start-up, by the ``resume`` setting).  ``after``: the next page, past
        the message id given (the bridge pages past rows no transport takes).
        """
        self._check_running()
        return await self.store.pending_turns(limit=limit, after=after)

    async def conversation_for_channel(
        self,
        channel_key: str,
        *,
        title: str | None = None,
        lazy: bool = False,
        unbound: bool = False,
    ) -> Conversation:
        """Get or create the conversation bound to ``channel_key`` (persistently).

        Keys look like ``irc:<network>:<#channel>``,
        ``slack:<team>:<channel>[:<thread_ts>]``, ``stdio:<name>``.

        ``lazy`` (a bridge opening a channel for a message it received): a new
        conversation and its binding are written with its first message, in one
        transaction (a new Slack thread per question made two writes of it), or
        with whatever else is written to it first — unless a plugin could write
        to it before that (a ``session_start`` or ``before_prompt`` hook).  A
        caller without ``lazy`` gets it stored.

        ``unbound``: the caller knows no conversation was ever bound to ``channel_key``
        (a Slack thread's first message: the key names that message), so the store is
        not asked (a read, and two thread hand-offs, a new thread's first answer).
        """
        self._check_running()
        lock = self._channel_lock(channel_key)
        async with lock:
            pending = self._unbound.get(channel_key)
            if pending is not None and pending.state is ConversationState.CLOSED:
                # Closed before its first write landed (that write failed): forgotten.
                del self._unbound[channel_key]
                pending = None
            if pending is not None:
                if not lazy:
                    await pending.stored()
                return pending
            conv_id = None if unbound else await self.store.get_binding(channel_key)
            if conv_id is not None:
                conv = self.services.find(conv_id)
                if conv is not None:
                    return conv
                record = await self.store.get_conversation(conv_id)
                if record is not None:
                    return self._wrap(record, temp=False, channel_key=channel_key)
            return await self._bind_new(channel_key, title, lazy=lazy)

    async def new_conversation_for_channel(
        self,
        channel_key: str,
        *,
        title: str | None = None,
    ) -> Conversation:
        """Bind ``channel_key`` to a fresh conversation; the old one stays in history."""
        self._check_running()
        lock = self._channel_lock(channel_key)
        async with lock:
            pending = self._unbound.get(channel_key)
            if pending is not None:
                await pending.stored()  # what it had is history too
            old_id = await self.store.get_binding(channel_key)
            conv = await self._bind_new(channel_key, title)
        if old_id is not None:
            try:
                old = await self.get_conversation(old_id)
            except NotFound:
                pass
            else:
                await self.end_conversation(old, "reset", channel_key=channel_key)
                await self.services.session_end(old, "reset")
        return conv

    async def _bind_new(
        self, channel_key: str, title: str | None, *, lazy: bool = False
    ) -> Conversation:
        now = time.time()
        record = ConversationRecord(
            id=uuid.uuid4().hex,
            title=title if title is not None else channel_key,
            created_at=now,
            updated_at=now,
            meta={"channel_key": channel_key},
        )
        hooks = self.services.hooks
        # Not with workers (their messages are committed by the turn queue, not by
        # the conversation), nor when a plugin could write to it before its message.
        lazy = (
            lazy
            and self.turn_queue is None
            and not (hooks.implemented("session_start") or hooks.implemented("before_prompt"))
        )
        if not lazy:
            await self.store.create_conversation(record, channel_key=channel_key)
        conv = self._wrap(record, temp=False, channel_key=channel_key, new=True)
        if lazy:
            self._unbound[channel_key] = conv

            def stored(c: Conversation, key: str = channel_key) -> None:
                if self._unbound.get(key) is c:
                    del self._unbound[key]

            conv.store_with_first_message(record, channel_key=channel_key, stored=stored)
        conv.parts.events.emit_agent_wide(ConversationStarted, channel_key=channel_key)
        await self.services.session_start(conv)
        return conv

    # -- events --------------------------------------------------------------------------
    def events(
        self,
        *,
        after: int | None = None,
        profile: str | StreamProfile = "debug",
        kinds: Iterable[str] | None = None,
        max_pending: int | None = None,
    ) -> Subscription:
        """One live stream of the events of every conversation.

        ``after`` is a ``stream_seq``; otherwise as :meth:`Conversation.events`.
        """
        return self.services.subscribe(
            after=after,
            profile=profile_of(self.stream_profiles, profile, kinds),
            max_pending=max_pending,
        )


def _agent_tool(agent: Agent, name: str, spec: AgentSpec) -> AgentTool:
    """The tool of agent ``name``: a child run here, or — ``url`` set — a turn of the
    agentik serving there (its token from the environment variable ``token_env``)."""
    if spec.url and spec.a2a_url:
        raise ConfigError(
            f"agents.{name}: give url (another agentik's API) or a2a_url (an A2A agent), not both"
        )
    url = spec.url or spec.a2a_url
    if not url:
        return AgentTool(agent, name, spec)
    key = "url" if spec.url else "a2a_url"
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"agents.{name}.{key}: not an http:// or https:// URL: {url!r}")
    token = None
    if spec.token_env:
        token = os.environ.get(spec.token_env, "").strip()
        if not token:
            raise ConfigError(
                f"agents.{name}.token_env: environment variable {spec.token_env} is not set"
            )
    if spec.a2a_url:
        try:  # the a2a extra's SDK, imported when an A2A agent is configured
            from .client.a2a import A2AAgentTool
        except ImportError as exc:
            raise ConfigError(
                f"agents.{name}.a2a_url: A2A needs the a2a extra"
                f" (pip install -e '.[a2a]' in the checkout): {exc}"
            ) from None
        return A2AAgentTool(agent, name, spec, url=spec.a2a_url, token=token)
    # Imported when a remote agent is configured: its HTTP client is not needed before.
    from .client.tool import RemoteAgentTool

    assert spec.url is not None
    return RemoteAgentTool(agent, name, spec, url=spec.url, token=token, prefix=spec.url_prefix)


def _known(agents: Mapping[str, AgentSpec]) -> str:
    return f" (agents: {', '.join(agents)})" if agents else " (no [agents.<name>] is defined)"
