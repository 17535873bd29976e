"""The TOML configuration: loading, ``${VAR}`` interpolation, validation.

A configuration is one TOML file (see ``config.example.toml``, which
documents every key).  Loading goes:

1. parse with :mod:`tomllib`;
2. replace ``${VAR}`` / ``${VAR:-default}`` in every string from the
   environment (``$$`` is a literal ``$``);
3. apply the environment overrides in :data:`ENV_OVERRIDES`;
4. validate into :class:`Config` (pydantic): unknown keys are errors, and an
   error names the file, the key path and what was expected.

Secrets (API keys, passwords, tokens) are :class:`pydantic.SecretStr`: they
print as ``**********`` and only :func:`reveal` gives the value.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import tomllib
from collections.abc import Collection, Mapping, Sequence
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    SerializeAsAny,
    ValidationError,
    create_model,
    model_validator,
)

from agentik.core.access import AccessPolicy, AccessSettings
from agentik.core.agent import AgentSettings
from agentik.core.agents import AgentPrompt, AgentSpec, RunPolicy
from agentik.core.approvals import ApprovalRule
from agentik.core.attachments import AttachmentSettings
from agentik.core.budgets import BudgetSettings
from agentik.core.checkpoints import CheckpointSettings
from agentik.core.cluster import ClusterSettings
from agentik.core.compaction import CompactionPolicy
from agentik.core.conversation import ResumeMode
from agentik.core.errors import ConfigError
from agentik.core.lifecycle import RetentionSettings
from agentik.core.memory import MemorySettings
from agentik.core.redaction import RedactionSettings
from agentik.core.settings import (
    Blank,
    describe_error,
    empty_list,
    known_keys,
    model_with_knobs,
    setting_fields,
    settings_dataclass,
)
from agentik.core.store.postgres_settings import PostgresSettings
from agentik.core.store.sqlite import SQLiteSettings
from agentik.core.streamprofiles import StreamProfileSettings, resolve_profiles
from agentik.core.tools.base import TurnPolicy
from agentik.core.tools.mcp_config import MCPServerConfig
from agentik.core.tools.passthrough import PassthroughSpec
from agentik.core.tools.workspace import WorkspaceSettings

from .channel import ChannelKnobs, ChannelOptions
from .chansettings import ChannelSettings
from .health import HealthSettings, SupervisionSettings
from .links import LinkSettings, check_links
from .webhooks import WebhookSettings

__all__ = [
    "BACKEND_ALIASES",
    "ENV_OVERRIDES",
    "LITERT_ENV",
    "AccessSection",
    "AgentSection",
    "AgentSpec",
    "ApprovalRule",
    "ChannelSettings",
    "CompactionSection",
    "Config",
    "LLMSection",
    "LoggingSection",
    "MCPSection",
    "MCPServerSection",
    "MemorySection",
    "MissingVar",
    "PluginsSection",
    "StorageSection",
    "ToolsSection",
    "TransportSection",
    "auto_backend",
    "builtin_llm_settings",
    "llm_section",
    "load_config",
    "parse_config",
    "reveal",
]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


@settings_dataclass
class AgentSection(AgentSettings, AgentPrompt):
    """``[agent]``: who the bot is (plus the core's :class:`AgentSettings`)."""

    name: str = "agentik"
    #: A persona appended to the system prompt: a file path (relative to the
    #: configuration file) or an http(s) URL fetched at start-up.
    soul: Blank = None
    #: A folder of skills (``<name>/SKILL.md`` with front matter).
    skills: Blank = None
    #: At start-up, a committed message a crash left unanswered is answered
    #: (``answer``), gets a short "please ask again" notice (``note``) or is
    #: recorded as dropped (``drop``).
    resume: ResumeMode = "answer"
    #: Seconds after which a pending message only gets the notice (0: no limit).
    resume_max_age: float = Field(3600.0, ge=0)
    #: The role a speaker needs to change a channel's settings in chat
    #: (``!set``/``!unset``): ``owner``, ``admin``, ``user`` or a named role.
    settings_role: str = "admin"


#: The core's settings classes are the configuration's sections (one declaration each).
AccessSection = AccessSettings
MemorySection = MemorySettings
CompactionSection = CompactionPolicy
ToolsSection = TurnPolicy


class LLMSection(_Section):
    """``[llm]``: ``backend`` and the backends' own keys, flat.

    Each backend declares its keys in its ``settings_model`` (a pydantic
    model).  The table is validated with the models of the built-in backends
    when the file is read (the chosen backend's model first, so its defaults
    show): a key no backend declares is an error naming it; a key of a
    backend other than the chosen one is accepted and ignored, so a file can
    switch backends by changing ``backend``.  A backend that only a plugin
    provides has its keys validated by its model when the agent is built
    (:func:`agentik.bot.builder.resolve_backend`).

    ``backend = "auto"`` picks ``openai`` when an endpoint or key is given
    (here or through ``OPENAI_BASE_URL``/``OPENAI_API_KEY``), ``litert`` when
    ``AGENTIK_GOOGLE_MODEL_PATH`` is set, otherwise the local ``llamacpp``
    backend with its default model (:func:`auto_backend`).  ``options`` is the
    old place of backend keys: they are read as if written in ``[llm]``.
    """

    backend: str = "auto"
    #: Deprecated: keys here are read as if written directly in ``[llm]``.
    options: dict[str, Any] = Field(default_factory=dict)
    #: Named model profiles: ``[llm.profiles.<name>]``, each a table like ``[llm]``
    #: (its own ``backend``, ``model``, ``base_url``, ``api_key`` …), validated the
    #: same way; a channel uses one with ``model = "<name>"`` (``!set model <name>``).
    profiles: dict[str, SerializeAsAny[LLMSection]] = Field(default_factory=dict)

    def given(self) -> dict[str, Any]:
        """The backend keys the file sets (``options`` merged in), validated where known."""
        out = {
            name: getattr(self, name)
            for name in self.model_fields_set
            if name not in ("backend", "options", "profiles")
        }
        out.update(self.model_extra or {})
        return out


class _OpenLLMSection(LLMSection):
    # A backend a plugin provides: its keys are checked once plugins are loaded.
    model_config = ConfigDict(extra="allow", frozen=True)


#: Setting this environment variable makes ``backend = "auto"`` pick LiteRT-LM.
LITERT_ENV = "AGENTIK_GOOGLE_MODEL_PATH"

#: Other names of built-in backends, read as the backend they name: ``google`` is
#: what the standalone seed (and its ``AGENTIK_GOOGLE_*`` variables) calls LiteRT-LM.
BACKEND_ALIASES: dict[str, str] = {"google": "litert"}


def auto_backend(base_url: Any, api_key: Any, env: Mapping[str, str]) -> str:
    """What ``backend = "auto"`` picks: ``openai`` with an endpoint or key,
    ``litert`` when :data:`LITERT_ENV` is set, else ``llamacpp``."""
    if base_url or reveal(api_key):
        return "openai"
    if env.get(LITERT_ENV):
        return "litert"
    return "llamacpp"


@functools.cache
def builtin_llm_settings() -> dict[str, type[BaseModel]]:
    """The settings models of the LLM backends that come with agentik, by name."""
    from agentik.core.plugins import load_plugins

    backends = load_plugins(env={"AGENTIK_PLUGINS": ""}, entry_points=False).llm_backends
    return {
        name: factory.settings_model  # type: ignore[attr-defined]
        for name, factory in backends.items()
        if getattr(factory, "settings_model", None) is not None
    }


@functools.cache
def _llm_section_class(
    chosen: str, models: tuple[tuple[str, type[BaseModel]], ...]
) -> type[LLMSection]:
    known = dict(models)
    fields: dict[str, Any] = {}
    for name in [chosen, *known]:
        if name not in known:
            continue
        for key, info in setting_fields(known[name]).items():
            if key not in LLMSection.model_fields:
                fields.setdefault(key, (info.annotation, info))
    base = LLMSection if chosen in known else _OpenLLMSection
    return create_model(f"LLMSection[{chosen}]", __base__=base, **fields)


def llm_section(
    table: Mapping[str, Any],
    *,
    env: Mapping[str, str],
    models: Mapping[str, type[BaseModel]] | None = None,
) -> LLMSection:
    """Validate an ``[llm]`` table against backend settings ``models`` (default: the built-ins).

    Keys under ``options`` are read as keys of the table (the table's own
    win).  Raises :class:`pydantic.ValidationError`.
    """
    models = builtin_llm_settings() if models is None else models
    options = table.get("options", {})
    merged = {**options, **table} if isinstance(options, dict) else dict(table)
    chosen = merged.get("backend", "auto")
    if isinstance(chosen, str) and chosen.strip() in BACKEND_ALIASES:
        chosen = merged["backend"] = BACKEND_ALIASES[chosen.strip()]
    if chosen == "auto":
        chosen = auto_backend(merged.get("base_url"), merged.get("api_key"), env)
    cls = _llm_section_class(str(chosen), tuple(models.items()))
    return cls.model_validate(merged)


def _llm_errors(exc: ValidationError, table: Mapping[str, Any]) -> list[Any]:
    """``exc``'s errors located in the file: ``llm.<key>``, or ``llm.options.<key>``."""
    options = table.get("options")
    errors = []
    for e in exc.errors():
        loc = e["loc"]
        if isinstance(options, dict) and loc and loc[0] in options and loc[0] not in table:
            loc = ("options", *loc)
        errors.append({**e, "loc": ("llm", *loc)})
    return errors


def _default_llm() -> LLMSection:
    return llm_section({}, env={})


#: A profile's name: what ``!set model <name>`` takes.
PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
#: Profile names with a meaning of their own.
RESERVED_PROFILES = ("default",)


def _llm_with_profiles(
    table: Mapping[str, Any], env: Mapping[str, str], errors: list[Any]
) -> LLMSection:
    """``[llm]`` and its ``[llm.profiles.<name>]`` tables, each validated against the
    backends' settings models; problems go to ``errors``, located in the file."""
    table = dict(table)
    raw_profiles = table.pop("profiles", {})
    profiles: dict[str, LLMSection] = {}
    if not isinstance(raw_profiles, dict):
        errors.append(_error(("llm", "profiles"), "expected a table of named profiles"))
        raw_profiles = {}
    for name, sub in raw_profiles.items():
        where = ("llm", "profiles", name)
        if not PROFILE_NAME.fullmatch(name) or name in RESERVED_PROFILES:
            errors.append(_error(where, "not a usable profile name (letters, digits, _ . -;"
                                 " not 'default')"))  # fmt: skip
            continue
        if not isinstance(sub, dict):
            errors.append(_error(where, "expected a table like [llm]"))
            continue
        if "profiles" in sub:
            errors.append(_error((*where, "profiles"), "a profile cannot have profiles"))
            continue
        if "backend" not in sub:
            # No backend of its own: [llm] with some keys changed (its keys are
            # inherited, the profile's win).  With one, the table stands alone (an
            # api_key is never sent to an endpoint it was not written for).
            sub = {**table, **sub}
        try:
            profiles[name] = llm_section(sub, env=env)
        except ValidationError as exc:
            errors += [{**e, "loc": ("llm", "profiles", name, *e["loc"][1:])}
                       for e in _llm_errors(exc, sub)]  # fmt: skip
    try:
        main = llm_section(table, env=env)
    except ValidationError as exc:
        errors += _llm_errors(exc, table)
        main = _default_llm()
    return main.model_copy(update={"profiles": profiles}) if profiles else main


def _error(loc: tuple[Any, ...], msg: str) -> dict[str, Any]:
    """A problem in the shape of a pydantic error (``msg`` shown as is)."""
    return {"type": "value_error", "loc": loc, "msg": msg, "input": None, "ctx": {"error": msg}}


@settings_dataclass
class StorageSection(SQLiteSettings, PostgresSettings):
    """``[storage]``: where conversations live.

    The engines' own settings are theirs: ``synchronous`` is SQLite's
    (:class:`SQLiteSettings`); ``dsn_env``, ``pool_min`` and ``pool_max`` are
    PostgreSQL's (:class:`PostgresSettings`).
    """

    #: The SQLite database file (``backend = "sqlite"``).
    path: str = "agentik.db"
    #: ``sqlite`` (one file, the embedded default) or ``postgres`` (a server several
    #: bot processes can share; its DSN in the environment variable ``dsn_env``).
    backend: Literal["sqlite", "postgres"] = "sqlite"


class _TransportBase(BaseModel):
    """``[transports.<name>]``: one transport instance.

    ``type`` selects the transport plugin; the bridge's keys (the fields of
    :class:`~agentik.bot.channel.ChannelOptions`) are handled by the bridge
    for every transport; any other key is the transport's own setting and is
    validated by the transport.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    type: str
    enabled: bool = True

    @property
    def settings(self) -> dict[str, Any]:
        """The transport-specific keys."""
        return dict(self.model_extra or {})


#: Fields of :class:`ChannelOptions` that are not keys of the file.
BRIDGE_NOT_KEYS = frozenset({"max_input_chars"})


def _bridge_keys() -> dict[str, Any]:
    """The bridge keys of a transport table that are :class:`ChannelOptions`'s own
    fields (its :class:`ChannelKnobs` are inherited: a base of the table).

    ``command_prefix`` may be left unset: the transport's default (``/`` in a
    terminal, ``!`` on chat networks) is used.
    """
    fields: dict[str, Any] = {}
    for name, info in setting_fields(ChannelOptions).items():
        if name in BRIDGE_NOT_KEYS or name in setting_fields(ChannelKnobs):
            continue
        if name == "command_prefix":
            annotation: Any = info.annotation
            fields[name] = (annotation | None, Field(None))
        else:
            fields[name] = (info.annotation, info)
    return fields


if TYPE_CHECKING:
    TransportSection = _TransportBase
else:
    TransportSection = model_with_knobs(
        create_model(
            "TransportSection",
            __base__=(_TransportBase, ChannelKnobs),
            __doc__=_TransportBase.__doc__,
            __module__=__name__,
            **_bridge_keys(),
        ),
        ChannelOptions,
        order=["type", "enabled", *setting_fields(ChannelOptions)],
    )


#: ``[[mcp.servers]]`` is the core's :class:`MCPServerConfig` (one declaration of each key).
MCPServerSection = MCPServerConfig


class MCPSection(_Section):
    """``[mcp]``: tools from MCP servers."""

    #: ``eager``: connect every server at start-up; ``lazy``: on first use.
    startup: Literal["eager", "lazy"] = "eager"
    #: Seconds the bot waits at start-up for the eager servers before its
    #: transports start; a slower server keeps connecting in the background
    #: and its tools are offered once it is up.
    start_wait: float = Field(10.0, ge=0, le=600)
    #: A server without its own ``startup`` takes this one.
    servers: list[MCPServerConfig] = Field(default_factory=empty_list)

    @model_validator(mode="after")
    def _unique(self) -> MCPSection:
        names = [s.name for s in self.servers]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"two MCP servers are named {name!r}")
        return self


class PluginsSection(_Section):
    """``[plugins]``: which third-party plugins load."""

    load: list[str] | None = None


class LoggingSection(_Section):
    """``[logging]``: diagnostics on stderr."""

    level: Literal["debug", "info", "warning", "error"] = "warning"
    format: Literal["text", "json"] = "text"


class Config(_Section):
    """The whole configuration file."""

    agent: AgentSection = Field(default_factory=AgentSection)
    llm: SerializeAsAny[LLMSection] = Field(default_factory=_default_llm)
    storage: StorageSection = Field(default_factory=StorageSection)
    tools: TurnPolicy = Field(default_factory=TurnPolicy)
    memory: MemorySettings = Field(default_factory=MemorySettings)
    compaction: CompactionPolicy = Field(default_factory=CompactionPolicy)
    transports: dict[str, TransportSection] = Field(default_factory=dict)
    #: Per-channel settings by channel-key pattern (``[channels."irc:libera:#ops"]``).
    channels: dict[str, ChannelSettings] = Field(default_factory=dict)
    mcp: MCPSection = Field(default_factory=MCPSection)
    #: ``[[approvals]]``: tool calls that wait for a person's approval (first match wins).
    approvals: list[ApprovalRule] = Field(default_factory=empty_list)
    plugins: PluginsSection = Field(default_factory=PluginsSection)
    logging: LoggingSection = Field(default_factory=LoggingSection)
    #: Named agents, called as tools (``[agents.<name>]``; ``[agent] uses`` lists
    #: the ones the main agent may call).
    agents: dict[str, AgentSpec] = Field(default_factory=dict)
    #: Limits of run trees: depth, concurrent child runs, token budgets.
    runs: RunPolicy = Field(default_factory=RunPolicy)
    #: Usage limits per role, channel and unverified speakers (issue 19).
    budgets: BudgetSettings = Field(default_factory=BudgetSettings)
    access: AccessSettings = Field(default_factory=AccessSettings)
    #: Health listener and readiness (issue 21).
    health: HealthSettings = Field(default_factory=HealthSettings)
    #: Restarting transports whose task failed (issue 21).
    supervision: SupervisionSettings = Field(default_factory=SupervisionSettings)
    #: ``[cluster]``: workers sharing one PostgreSQL database (leases, heartbeats).
    cluster: ClusterSettings = Field(default_factory=ClusterSettings)
    #: Event stream profiles of your own (``[profiles.<name>]``), beside the built-in
    #: ``chat``, ``debug`` and ``metrics``.
    profiles: dict[str, StreamProfileSettings] = Field(default_factory=dict)
    #: ``[[passthrough]]``: tools that call another tool directly, with fixed arguments.
    passthrough: list[PassthroughSpec] = Field(default_factory=empty_list)
    #: ``[[links]]``: channels on several transports that are one conversation.
    links: list[LinkSettings] = Field(default_factory=empty_list)
    #: ``[[webhooks]]``: receivers of run events, POSTed as signed JSON (issue 35).
    webhooks: list[WebhookSettings] = Field(default_factory=empty_list)
    #: ``[workspace]``: folders the read-only tools ``read_file``, ``list_dir``, ``glob``
    #: and ``grep`` may read (issue 35; none: the tools are not offered).
    workspace: WorkspaceSettings = Field(default_factory=WorkspaceSettings)
    #: Images and files sent with messages (issue 34).
    attachments: AttachmentSettings = Field(default_factory=AttachmentSettings)
    #: Audit-log retention by channel pattern (issue 22).
    retention: RetentionSettings = Field(default_factory=RetentionSettings)
    #: Automatic checkpoints of conversations (issue 35).
    checkpoints: CheckpointSettings = Field(default_factory=CheckpointSettings)
    #: Scrubbing secrets before they are stored (issue 22).
    redaction: RedactionSettings = Field(default_factory=RedactionSettings)
    #: The file this came from (not a key).
    source: str = Field("<string>", exclude=True)

    def resolve_path(self, path: str) -> str:
        """A path from this file, relative to the file's folder (``:memory:`` stays)."""
        if path == ":memory:" or os.path.isabs(path) or self.source == "<string>":
            return path
        return os.path.join(os.path.dirname(os.path.abspath(self.source)), path)

    @property
    def database(self) -> str:
        """``storage.path``, resolved against the configuration file's folder."""
        return self.resolve_path(self.storage.path)

    def secrets(self) -> list[str]:
        """Every secret value, so logging can redact them."""
        found: list[str] = []

        def walk(obj: Any) -> None:
            if isinstance(obj, SecretStr):
                if obj.get_secret_value():
                    found.append(obj.get_secret_value())
            elif isinstance(obj, BaseModel):
                for name in type(obj).model_fields:
                    walk(getattr(obj, name))
                for key, value in (obj.model_extra or {}).items():
                    # A transport's own keys are plain values: mask the ones
                    # whose names say they are secret.
                    if isinstance(value, str) and value and _SECRETISH.search(key):
                        found.append(value)
                    walk(value)
            elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
                for name in setting_fields(type(obj)):
                    walk(getattr(obj, name))
            elif isinstance(obj, dict):
                for key, value in obj.items():
                    # MCP server env/headers: values under secret-looking names.
                    if isinstance(value, str) and value and _SECRETISH.search(str(key)):
                        found.append(value)
                    walk(value)
            elif isinstance(obj, list):
                for value in obj:
                    walk(value)

        walk(self)
        if self.storage.backend == "postgres":
            # The DSN comes from the environment, never from the file: it and its
            # password are secrets all the same.
            dsn = os.environ.get(self.storage.dsn_env, "")
            found += [s for s in (dsn, _dsn_password(dsn)) if s]
        # Remote agents' API tokens come from the environment as well.
        found += [
            token
            for spec in self.agents.values()
            if spec.token_env and (token := os.environ.get(spec.token_env, "").strip())
        ]
        return found


def _dsn_password(dsn: str) -> str | None:
    """The password in a ``postgresql://user:password@host/db`` or ``password=...`` DSN."""
    from urllib.parse import unquote, urlsplit

    if "://" in dsn:
        try:
            password = urlsplit(dsn).password
        except ValueError:
            return None
        return unquote(password) if password else None
    m = re.search(r"(?:^|\s)password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", dsn)
    return m.group(1).strip("'") if m else None


def reveal(secret: SecretStr | str | None) -> str | None:
    """The plain value of a secret (``None`` stays ``None``)."""
    if isinstance(secret, SecretStr):
        return secret.get_secret_value()
    return secret


#: Environment variables that override a key, whatever the file says.
ENV_OVERRIDES: dict[str, tuple[str, ...]] = {
    "AGENTIK_DB_PATH": ("storage", "path"),
    "AGENTIK_LLM_BACKEND": ("llm", "backend"),
    "AGENTIK_SYSTEM_PROMPT": ("agent", "system_prompt"),
    "OPENAI_BASE_URL": ("llm", "base_url"),
    "OPENAI_API_KEY": ("llm", "api_key"),
    "OPENAI_MODEL": ("llm", "model"),
    "AGENTIK_GOOGLE_MODEL_PATH": ("llm", "model_path"),
    "AGENTIK_GOOGLE_CACHE_DIR": ("llm", "cache_dir"),
    "AGENTIK_GOOGLE_THREADS": ("llm", "threads"),
    "AGENTIK_GOOGLE_FOLD_SYSTEM_INTO_FIRST_USER": ("llm", "fold_system_prompt"),
}

_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclasses.dataclass(frozen=True, slots=True)
class MissingVar:
    """A ``${VAR}`` that was not set, where it is used (``transports.slack.bot_token``)."""

    name: str
    key: str


def _interpolate(
    value: Any,
    env: Mapping[str, str],
    path: str,
    source: str,
    needs: Collection[str] | None = None,
    missing: list[MissingVar] | None = None,
) -> Any:
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            if m.group(0) == "$$":
                return "$"
            name, default = m.group(1), m.group(2)
            if name in env:
                return env[name]
            if default is not None:
                return default
            section = re.split(r"[.\[]", path, maxsplit=1)[0]
            if needs is not None and section not in needs:
                # A section this command does not use: its unset variable reads as empty.
                if missing is not None:
                    missing.append(MissingVar(name, path))
                return ""
            raise ConfigError(
                f"{source}: {path}: environment variable {name} is not set"
                f" (write ${{{name}:-default}} to make it optional)"
            )

        return _VAR.sub(sub, value)
    if isinstance(value, dict):
        return {
            k: _interpolate(v, env, f"{path}.{k}" if path else k, source, needs, missing)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [
            _interpolate(v, env, f"{path}[{i}]", source, needs, missing)
            for i, v in enumerate(value)
        ]
    return value


_SECRETISH = re.compile(r"(key|token|secret|password|passwd|credential|authorization)", re.I)


def _echo_safe(loc: tuple[Any, ...], data: Mapping[str, Any]) -> bool:
    """Whether an error may quote the value: never for secret-looking keys,
    nor for values that came from the environment (they may be secrets)."""
    if any(_SECRETISH.search(str(p)) for p in loc):
        return False
    original: Any = data
    for part in loc:
        if isinstance(original, Mapping) and part in original:
            original = original[part]
        elif isinstance(original, list) and isinstance(part, int) and part < len(original):
            original = original[part]
        else:
            return False  # set by an environment override
    return not (isinstance(original, str) and "$" in original)


def parse_config(
    data: Mapping[str, Any],
    *,
    source: str = "<string>",
    env: Mapping[str, str] | None = None,
    needs: Collection[str] | None = None,
    missing: list[MissingVar] | None = None,
) -> Config:
    """Validate already-parsed TOML data (interpolation and overrides applied here).

    ``needs``: the top-level sections the caller uses (``None``: all).  A
    ``${VAR}`` that is not set is an error inside them; elsewhere it reads as
    an empty string and is appended to ``missing`` (so ``agentik
    conversations list`` runs without a Slack token in the environment).
    """
    env = os.environ if env is None else env
    raw = _interpolate(dict(data), env, "", source, needs, missing)
    if "source" in raw:  # a field of Config, but not a key: never silently ignore it
        raise ConfigError(f"{source}: source: unknown key")
    for var, (section, key) in ENV_OVERRIDES.items():
        if env.get(var):
            table = raw.setdefault(section, {})
            if isinstance(table, dict):
                table[key] = env[var]
    _implied_http(raw, env)
    errors: list[Any] = []
    table = raw.get("llm", {})
    if isinstance(table, dict):
        # [llm] (and each profile) is validated against the backends' own settings models.
        raw["llm"] = _llm_with_profiles(table, env, errors)
    try:
        config = Config.model_validate({**raw, "source": source})
    except ValidationError as exc:
        errors += exc.errors()
    if not errors:
        known = ("default", *config.llm.profiles)
        for name, spec in config.agents.items():
            if spec.model is not None and spec.model not in known:
                raise ConfigError(
                    f"{source}: agents.{name}.model: no profile {spec.model!r}; "
                    f"profiles: {', '.join(known)} (define [llm.profiles.{spec.model}])"
                )
        for pattern, chan in config.channels.items():
            if chan.model is not None and chan.model not in known:
                raise ConfigError(
                    f'{source}: channels."{pattern}".model: no profile {chan.model!r}; '
                    f"profiles: {', '.join(known)} (define [llm.profiles.{chan.model}])"
                )
        try:
            known_profiles = resolve_profiles(config.profiles, plugins_loaded=False)
            listed = ", ".join(known_profiles)
            names = [p.name for p in config.passthrough]
            for i, name in enumerate(names):
                if name in names[:i]:
                    raise ConfigError(
                        f"passthrough.{i}.name: two passthrough tools are named {name!r}"
                    )
            _check_passthrough_approvals(config)
            try:
                check_links(config.links)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            for pattern, chan in config.channels.items():
                if chan.profile is not None and chan.profile not in known_profiles:
                    raise ConfigError(
                        f'channels."{pattern}".profile: no profile {chan.profile!r}'
                        f" (profiles: {listed})"
                    )
            for tname, tsec in config.transports.items():
                tprofile = getattr(tsec, "profile", None)
                if tprofile is not None and tprofile not in known_profiles:
                    raise ConfigError(
                        f"transports.{tname}.profile: no profile {tprofile!r} (profiles: {listed})"
                    )
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        try:
            # Identity patterns name transport instances: checked against this file's.
            AccessPolicy(config.access, {n: t.type for n, t in config.transports.items()})
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        return config
    order = list(Config.model_fields)

    def section_of(e: Any) -> int:
        head = e["loc"][0] if e["loc"] else None
        return order.index(head) if head in order else len(order)

    errors.sort(key=section_of)
    first = errors[0]
    where = ".".join(str(p) for p in first["loc"]) or "(top level)"
    first_desc = describe_error(
        first, show_input=_echo_safe(tuple(first["loc"]), data), known=_known_at(first["loc"])
    )
    more = len(errors) - 1
    tail = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    via = next(
        (
            f" (set by {var}, which overrides the file)"
            for var, path in ENV_OVERRIDES.items()
            if env.get(var) and tuple(first["loc"]) == path
        ),
        "",
    )
    raise ConfigError(f"{source}: {where}: {first_desc}{via}{tail}") from None


#: The name of the ``http`` transport ``AGENTIK_PORT`` opens when the file has none.
IMPLIED_HTTP = "http"


def _implied_http(raw: dict[str, Any], env: Mapping[str, str]) -> None:
    """``AGENTIK_PORT`` set and no ``type = "http"`` table in the file: add
    ``[transports.http]`` with its defaults (loopback only, no tokens), so the
    standalone seed's ``AGENTIK_PORT=8080 agentik run`` opens the HTTP API as it
    says.  A file with an ``http`` table (even a disabled one) is left as it is:
    ``AGENTIK_PORT`` only sets that table's port."""
    if not env.get("AGENTIK_PORT", "").strip():
        return
    transports = raw.get("transports", {})
    if not isinstance(transports, dict):
        return  # the validation error names it
    if any(isinstance(t, dict) and t.get("type") == "http" for t in transports.values()):
        return
    name, n = IMPLIED_HTTP, 1
    while name in transports:
        n += 1
        name = f"{IMPLIED_HTTP}{n}"
    raw["transports"] = {**transports, name: {"type": "http"}}


def _first_rule(rules: list[ApprovalRule], tool: str) -> ApprovalRule | None:
    """The first approval rule naming ``tool`` (any channel)."""
    return next((r for r in rules if any(fnmatchcase(tool, p) for p in r.tools)), None)


def _check_passthrough_approvals(config: Config) -> None:
    """A passthrough must not be a way around an approval its target needs: when the
    first ``[[approvals]]`` rule naming the target asks for approval, one must name
    the passthrough too."""
    for i, spec in enumerate(config.passthrough):
        target = _first_rule(config.approvals, spec.tool)
        if target is None or target.approve == "never":
            continue
        own = _first_rule(config.approvals, spec.name)
        if own is None or own.approve == "never":
            raise ConfigError(
                f"passthrough.{i}.tool: {spec.tool} needs approval ([[approvals]] tools ="
                f" {list(target.tools)}), so {spec.name!r} must too: add it to an"
                f" [[approvals]] rule"
            )


def _known_at(loc: Sequence[Any]) -> list[str]:
    """The keys valid where an error's key is (for "did you mean")."""
    loc = tuple(loc)[:-1]
    if loc[:1] == ("llm",):
        # [llm] and its profiles take every backend's keys.
        inner = loc[3:] if loc[1:2] == ("profiles",) else loc[1:]
        if inner:
            return []
        keys = set(LLMSection.model_fields)
        for model in builtin_llm_settings().values():
            keys.update(setting_fields(model))
        return sorted(keys)
    if loc[:1] == ("transports",) and len(loc) == 2:
        return [*_bridge_keys(), "type", "enabled"]
    return known_keys(Config, loc)


def load_config(
    path: str | os.PathLike[str],
    *,
    env: Mapping[str, str] | None = None,
    needs: Collection[str] | None = None,
    missing: list[MissingVar] | None = None,
) -> Config:
    """Read, interpolate, override and validate the TOML file at ``path``.

    ``needs`` and ``missing``: as for :func:`parse_config`.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such configuration file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    return parse_config(data, source=str(p), env=env, needs=needs, missing=missing)
