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

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from agentik.core.errors import ConfigError

__all__ = [
    "ENV_OVERRIDES",
    "AgentSection",
    "CompactionSection",
    "Config",
    "LLMSection",
    "LoggingSection",
    "MCPSection",
    "MCPServerSection",
    "MemorySection",
    "PluginsSection",
    "StorageSection",
    "ToolsSection",
    "TransportSection",
    "load_config",
    "parse_config",
    "reveal",
]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AgentSection(_Section):
    """``[agent]``: who the bot is."""

    name: str = "agentik"
    system_prompt: str = "You are a helpful assistant in a chat. Answer briefly and plainly."
    #: A persona appended to the system prompt: a file path (relative to the
    #: configuration file) or an http(s) URL fetched at start-up.
    soul: str | None = None
    #: A folder of skills (``<name>/SKILL.md`` with front matter).
    skills: str | None = None
    event_buffer: int = Field(1024, ge=16)
    #: At start-up, a committed message a crash left unanswered is answered
    #: (``answer``), gets a short "please ask again" notice (``note``) or is
    #: recorded as dropped (``drop``).
    resume: Literal["answer", "note", "drop"] = "answer"
    #: Seconds after which a pending message only gets the notice (0: no limit).
    resume_max_age: float = Field(3600.0, ge=0)

    @field_validator("soul", "skills", mode="before")
    @classmethod
    def _blank_is_none(cls, v: Any) -> Any:
        return None if v == "" else v


class MemorySection(_Section):
    """``[memory]``: long-term memory, and the background work that fills it."""

    backend: Literal["sqlite", "markdown", "none"] = "sqlite"
    #: The folder of the markdown backend (relative to the configuration file).
    path: str = "memory"
    allow_global_writes: bool = True
    mining: bool = True
    mining_debounce: float = Field(30.0, ge=0)
    max_facts: int = Field(8, ge=1, le=50)
    reflection: bool = True
    reflection_debounce: float = Field(5.0, ge=0)


class CompactionSection(_Section):
    """``[compaction]``: keeping long conversations inside the model's context."""

    enabled: bool = True
    context_tokens: int | None = Field(None, ge=256)
    trigger: float = Field(0.8, gt=0, le=1)
    keep_turns: int = Field(4, ge=1)
    summary_tokens: int = Field(512, ge=32)
    timeout: float = Field(120.0, gt=0)


class LLMSection(_Section):
    """``[llm]``: the model backend.

    ``backend = "auto"`` picks ``openai`` when an endpoint or key is given
    (here or through ``OPENAI_BASE_URL``/``OPENAI_API_KEY``), ``litert`` when
    ``AGENTIK_GOOGLE_MODEL_PATH`` is set, otherwise the local ``llamacpp``
    backend with its default model (see ``agentik.bot.builder.backend_choice``).
    Keys other than ``backend`` go to the backend; ``options`` holds any
    extra backend-specific settings.
    """

    backend: str = "auto"
    model: str | None = None
    base_url: str | None = None
    api_key: SecretStr | None = None
    timeout: float = Field(60.0, gt=0)
    max_retries: int = Field(2, ge=0)
    temperature: float | None = Field(None, ge=0, le=2)
    max_tokens: int | None = Field(None, gt=0)
    author_mode: Literal["prefix", "name", "none"] = "prefix"
    options: dict[str, Any] = Field(default_factory=dict)
    # -- local models: "llamacpp" (GGUF) and "litert" (.litertlm) --
    #: The model file (llamacpp: unset = SmolLM2-135M-Instruct; litert: required).
    model_path: str | None = None
    # -- backend = "llamacpp" --
    n_ctx: int = Field(2048, ge=64)
    n_threads: int | None = Field(None, ge=1)
    tool_choice: Literal["auto", "required"] = "auto"
    # -- backend = "litert" (on-device LiteRT-LM) --
    cache_dir: str | None = None
    threads: int | None = Field(None, ge=1)
    context_tokens: int | None = Field(None, gt=0)
    top_k: int | None = Field(None, gt=0)
    top_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = None
    fold_system_prompt: bool = True
    idle_release_seconds: float = Field(600.0, gt=0)
    max_conversations: int = Field(4, ge=1)

    @field_validator("model", "base_url", "model_path", "cache_dir", "threads", mode="before")
    @classmethod
    def _blank_is_none(cls, v: Any) -> Any:
        return None if v == "" else v

    @field_validator("api_key", mode="before")
    @classmethod
    def _blank_key_is_none(cls, v: Any) -> Any:
        return None if v == "" else v


class StorageSection(_Section):
    """``[storage]``: where conversations live."""

    path: str = "agentik.db"
    synchronous: Literal["off", "normal", "full", "extra"] = "full"


class ToolsSection(_Section):
    """``[tools]``: the per-turn tool policy."""

    max_tool_calls: int = Field(16, ge=0)
    time_budget: float = Field(300.0, gt=0)
    tool_timeout: float = Field(60.0, gt=0)
    allowed: list[str] | None = None
    max_tool_retries: int = Field(2, ge=0)
    max_tool_argument_chars: int = Field(64_000, ge=1)
    max_tool_result_chars: int = Field(64_000, ge=1)
    max_answer_chars: int = Field(100_000, ge=1)


class TransportSection(BaseModel):
    """``[transports.<name>]``: one transport instance.

    ``type`` selects the transport plugin; the keys below are handled by the
    bridge for every transport; any other key is the transport's own setting
    and is validated by the transport.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    type: str
    enabled: bool = True
    command_prefix: str | None = None
    answer: Literal["addressed", "all", "direct"] = "addressed"
    events: Literal["chat", "debug"] = "chat"
    max_answer_lines: int = Field(0, ge=0)
    allowed_tools: list[str] | None = None
    ambient: bool = False
    ambient_lines: int = Field(50, ge=1)

    @property
    def settings(self) -> dict[str, Any]:
        """The transport-specific keys."""
        return dict(self.model_extra or {})


class MCPServerSection(_Section):
    """``[[mcp.servers]]``: one MCP server; its tools become ``<name>__<tool>``."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,40}$")
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    bearer_token: SecretStr | None = None
    allow: list[str] | None = None
    deny: list[str] = Field(default_factory=list)
    timeout: float = Field(60.0, gt=0)
    startup: Literal["eager", "lazy"] | None = None
    restart_min: float = Field(0.5, gt=0)
    restart_max: float = Field(30.0, gt=0)

    @model_validator(mode="after")
    def _one_transport(self) -> MCPServerSection:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either command (stdio) or url (streamable HTTP)")
        return self


class MCPSection(_Section):
    """``[mcp]``: tools from MCP servers."""

    #: ``eager``: connect every server at start-up; ``lazy``: on first use.
    startup: Literal["eager", "lazy"] = "eager"
    servers: list[MCPServerSection] = Field(default_factory=list)

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
    llm: LLMSection = Field(default_factory=LLMSection)
    storage: StorageSection = Field(default_factory=StorageSection)
    tools: ToolsSection = Field(default_factory=ToolsSection)
    memory: MemorySection = Field(default_factory=MemorySection)
    compaction: CompactionSection = Field(default_factory=CompactionSection)
    transports: dict[str, TransportSection] = Field(default_factory=dict)
    mcp: MCPSection = Field(default_factory=MCPSection)
    plugins: PluginsSection = Field(default_factory=PluginsSection)
    logging: LoggingSection = Field(default_factory=LoggingSection)
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
        return found


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
}

_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _interpolate(value: Any, env: Mapping[str, str], path: str, source: str) -> Any:
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            if m.group(0) == "$$":
                return "$"
            name, default = m.group(1), m.group(2)
            if name in env:
                return env[name]
            if default is not None:
                return default
            raise ConfigError(
                f"{source}: {path}: environment variable {name} is not set"
                f" (write ${{{name}:-default}} to make it optional)"
            )

        return _VAR.sub(sub, value)
    if isinstance(value, dict):
        return {
            k: _interpolate(v, env, f"{path}.{k}" if path else k, source) for k, v in value.items()
        }
    if isinstance(value, list):
        return [_interpolate(v, env, f"{path}[{i}]", source) for i, v in enumerate(value)]
    return value


_SECRETISH = re.compile(r"(key|token|secret|password|passwd|credential|authorization)", re.I)


def _describe(error: Any, *, show_input: bool = True) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    msg = error["msg"]
    if show_input and "input" in error:
        shown = error["input"]
        if isinstance(shown, str | int | float | bool):
            return f"{msg}, got {shown!r}"
    return msg


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
    data: Mapping[str, Any], *, source: str = "<string>", env: Mapping[str, str] | None = None
) -> Config:
    """Validate already-parsed TOML data (interpolation and overrides applied here)."""
    env = os.environ if env is None else env
    raw = _interpolate(dict(data), env, "", source)
    if "source" in raw:  # a field of Config, but not a key: never silently ignore it
        raise ConfigError(f"{source}: source: unknown key")
    for var, (section, key) in ENV_OVERRIDES.items():
        if env.get(var):
            table = raw.setdefault(section, {})
            if isinstance(table, dict):
                table[key] = env[var]
    try:
        return Config.model_validate({**raw, "source": source})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        first_desc = _describe(first, show_input=_echo_safe(tuple(first["loc"]), data))
        more = len(exc.errors()) - 1
        tail = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
        raise ConfigError(f"{source}: {where}: {first_desc}{tail}") from None


def load_config(path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None) -> Config:
    """Read, interpolate, override and validate the TOML file at ``path``."""
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
    return parse_config(data, source=str(p), env=env)
