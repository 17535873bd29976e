"""``agentik check``: the whole resolved setup, and with ``--probe`` a try of each part.

The setup shows what will run: the model backend and endpoint, storage,
memory, each transport's host, port, TLS and channels, MCP servers, the
named agents (``[agents.<name>]``: what each may use and its limits), access
rules, approvals, budgets and channel settings.  The files the bot reads at
start-up (soul, skills, the health token, TLS files) are read as ``run`` reads
them; one that cannot be read is an error naming its key.  Secrets are never shown:
a secret key reads ``set`` or ``missing``.  A ``${VAR}`` that is not set is
one error line naming every such variable and its key (exit status 2).

``--probe`` tries each part for real, each with a time limit: the model
endpoint answers ``GET /models`` and knows the model (a local model: the
file is there), each MCP server's command resolves and the server starts and
lists its tools, each IRC host resolves and accepts a TCP (TLS) connection
(closed at once: no registration), each Slack bot token passes
``auth.test``.  A failure names the component, what was tried and why it
failed; the exit status is 1 when any probe fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
import socket
import ssl
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from pydantic import BaseModel, SecretStr

from agentik.core.agents import agent_tool_name
from agentik.core.budgets import BudgetLimits
from agentik.core.errors import AgentikError, ConfigError
from agentik.core.memory import MEMORY_TOOLS
from agentik.core.questions import builtin_tools
from agentik.core.settings import setting_fields
from agentik.core.skills import load_skills
from agentik.core.soul import is_url, read_soul
from agentik.core.tools.mcp import CommandNotFound, resolve_command

from .builder import (
    NoModelBackend,
    backend_choice,
    backend_settings,
    ignored_settings,
    mcp_toolset,
    resolve_agents,
    resolve_backend,
    resolve_profiles,
    storage_problems,
)
from .config import Config, MissingVar, reveal
from .health import load_token
from .parts import load_registry, make_transport

__all__ = ["Probe", "check"]

MASK = "**********"


@dataclass
class Probe:
    """One probe's outcome: ``component`` (``model``, ``mcp git``, ``irc libera`` …)."""

    component: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"probe {self.component}: {'ok' if self.ok else 'FAILED'}: {self.detail}"


def check(config: Config, missing: list[MissingVar], *, probe: bool, timeout: float) -> int:
    """Print the setup (and probe it); the exit status."""
    if missing:
        # As for `agentik run`: one line naming every unset variable and its key.
        unset = ", ".join(f"{v.name} ({v.key})" for v in missing)
        first = missing[0]
        print(
            f"agentik: {config.source}: {first.key}: environment variable {first.name} is not"
            f" set; every unset one: {unset} (write ${{VAR:-default}} to make one optional)",
            file=sys.stderr,
        )
        return 2
    registry = load_registry(config)
    backend = resolve_backend(config, registry)
    profiles = resolve_profiles(config, registry)
    transports = {
        name: make_transport(registry, name, section, config.source)
        for name, section in config.transports.items()
    }
    closed = False
    try:
        problems = _file_problems(config, transports)
        if problems:
            # What `agentik run` would stop on at start-up: a configuration error.
            more = len(problems) - 1
            tail = f" (and {more} more: {'; '.join(problems[1:])})" if more else ""
            print(f"agentik: {config.source}: {problems[0]}{tail}", file=sys.stderr)
            return 2
        out = [f"configuration: {config.source} is valid"]
        out += _model_lines(config, registry, backend, profiles)
        out += _storage_lines(config)
        out += _transport_lines(config, transports)
        out += _mcp_lines(config)
        out += _agent_lines(config, registry)
        out += _policy_lines(config)
        print("\n".join(out), flush=True)
        if not probe:
            return 0
        closed = True  # the probes use the model clients: closed in their event loop

        async def probe_and_close() -> list[Probe]:
            try:
                return await _probe_all(config, backend, profiles, transports, timeout)
            finally:
                for obj in (*profiles.values(), backend):
                    with contextlib.suppress(Exception):
                        await obj.aclose()

        results = asyncio.run(probe_and_close())
        for r in results:
            print(r.line(), flush=True)
        failed = [r for r in results if not r.ok]
        if not results:
            print("probe: nothing to probe")
        if failed:
            print(
                f"agentik: {len(failed)} of {len(results)} probe(s) failed: "
                + ", ".join(r.component for r in failed),
                file=sys.stderr,
            )
            return 1
        return 0
    finally:
        if not closed:
            for obj in (*profiles.values(), backend):
                asyncio.run(_aclose(obj))


async def _aclose(obj: Any) -> None:
    await obj.aclose()


# -- the setup ---------------------------------------------------------------------------------


def _file_problems(config: Config, transports: dict[str, Any]) -> list[str]:
    """The files the bot reads when it starts, read now the same way: the database's
    folder, the markdown memory folder, the soul, the skills folder, the health
    listener's token, each enabled transport's TLS files.  Each problem names its key
    (``agent.soul: cannot read …``); a soul URL is not fetched here."""
    problems: list[str] = []
    folder = os.path.dirname(os.path.abspath(config.database))
    if config.storage.backend != "sqlite":
        problems += storage_problems(config)
    elif config.database != ":memory:" and not os.path.isdir(folder):
        # SQLite creates the file, not its folder: run stops with "cannot open database".
        problems.append(f"storage.path: the folder {folder} does not exist")
    if config.memory.backend == "markdown":
        # The bot creates the notes folder (and its parents) at start-up.
        notes = config.resolve_path(config.memory.path)
        there = notes
        while not os.path.exists(there) and os.path.dirname(there) != there:
            there = os.path.dirname(there)
        if not os.path.isdir(there):
            problems.append(f"memory.path: cannot make the folder {notes}: {there} is not a folder")
        elif not os.access(there, os.W_OK) and there != notes:
            problems.append(f"memory.path: cannot make the folder {notes}: {there} is not writable")
    soul = config.agent.soul
    if soul and not is_url(soul):
        try:
            read_soul(config.resolve_path(soul))
        except ConfigError as exc:
            problems.append(str(exc))
    if config.agent.skills:
        try:
            load_skills(config.resolve_path(config.agent.skills))
        except ConfigError as exc:
            problems.append(f"agent.skills: {exc}")
    if config.health.listen:
        try:
            load_token(config.health, resolve=config.resolve_path)
        except ConfigError as exc:
            problems.append(str(exc))
    for name, section in config.transports.items():
        # The TLS context a transport builds when it connects (CA file, client
        # certificate and key): its errors name the key.
        make_tls = getattr(transports[name], "_ssl_context", None)
        if section.enabled and callable(make_tls):
            try:
                make_tls()
            except ConfigError as exc:
                problems.append(str(exc))
    return problems


def _model_lines(
    config: Config, registry: Any, backend: Any, profiles: dict[str, Any]
) -> list[str]:
    llm = config.llm
    chosen = "none" if isinstance(backend, NoModelBackend) else backend_choice(config)
    out = [
        f"agent: {config.agent.name}",
        f"llm: backend {chosen!r} (configured {llm.backend!r}),"
        f" model {getattr(backend, 'model', None) or '-'!r}",
    ]
    settings = None if chosen == "none" else backend_settings(config, registry, chosen)
    if settings is not None:  # the backend's own keys, as it validated them
        shown = ", ".join(
            f"{key}={MASK if isinstance(value, SecretStr) else value!r}"
            for key, value in ((k, getattr(settings, k)) for k in setting_fields(type(settings)))
            if value is not None and value != {}
        )
        out.append(f"llm.{chosen} settings: {shown}")
        ignored = ignored_settings(config, registry, chosen)
        if ignored:
            out.append(f"llm: ignored (not keys of {chosen!r}): {', '.join(ignored)}")
    model_path = getattr(backend, "model_path", None)
    if model_path:  # a local model file
        out.append(f"llm.model_path: {model_path}")
        local = [
            f"{key}: {getattr(backend, key)}"
            for key in ("n_ctx", "n_threads", "tool_choice")
            if getattr(backend, key, None) is not None
        ]
        if local:
            out.append("llm." + ", ".join(local))
    # Only the chosen backend's keys: a local model has no endpoint nor API key, so
    # "llm.api_key: (not set)" would send its operator after a key nothing uses.
    own = setting_fields(type(settings)) if settings is not None else {}
    base_url = getattr(llm, "base_url", None)
    if base_url and "base_url" in own:
        out.append(f"llm.base_url: {base_url}")
    if "api_key" in own:
        api_key = getattr(llm, "api_key", None)
        out.append(f"llm.api_key: {MASK if reveal(api_key) else '(not set)'}")
    if isinstance(backend, NoModelBackend):
        why = backend.reason or "no model configured"
        out.append(f"  note: {why}; until then the bot answers with setup instructions")
    for name, profile in profiles.items():
        where = getattr(profile, "base_url", None)
        out.append(
            f"llm.profiles.{name}: {profile.name}, model {getattr(profile, 'model', None) or '-'!r}"
            + (f" at {where}" if where else "")
        )
    return out


def _storage_lines(config: Config) -> list[str]:
    st = config.storage
    if st.backend == "postgres":
        from agentik.core.store.postgres import describe_dsn

        where = describe_dsn(os.environ.get(st.dsn_env, ""))
        out = [f"storage: postgres {where} (DSN from ${st.dsn_env};"
               f" pool {st.pool_min}-{st.pool_max} connections)"]  # fmt: skip
    else:
        out = [f"storage: {config.database} (synchronous={st.synchronous})"]
    m = config.memory
    if m.backend == "sqlite":
        engine = "PostgreSQL" if st.backend == "postgres" else "SQLite"
        out.append(f"memory: backend 'sqlite' (notes in the database: {engine})")
    elif m.backend == "markdown":
        out.append(f"memory: backend 'markdown', folder {config.resolve_path(m.path)}")
    else:
        out.append("memory: none")
    t = config.tools
    out.append(
        f"tools: at most {t.max_tool_calls} calls and {t.time_budget:g}s per turn;"
        f" allowed {', '.join(t.allowed) if t.allowed is not None else 'all'}"
    )
    return out


#: Transport keys shown by ``check`` when the transport's settings have them.
_SHOWN = (
    "network", "host", "port", "tls", "ssl_verify", "nick", "sasl_mechanism", "channels",
    "mode", "api_url", "http_host", "http_port", "http_path", "conversation_per", "prefix",
    "web_ui",
)  # fmt: skip


def _is_secret(annotation: Any) -> bool:
    return "SecretStr" in str(annotation)


def _secret_state(value: Any) -> str:
    """``set`` or ``missing`` (never the value)."""
    return "set" if reveal(value) else "missing"


def _transport_lines(config: Config, transports: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for name, section in config.transports.items():
        state = "" if section.enabled else " (disabled)"
        out.append(f"transport {name}: {section.type}{state}")
        options = getattr(transports[name], "options", None)
        if not isinstance(options, BaseModel):
            continue
        fields = setting_fields(type(options))
        parts = []
        for key in _SHOWN:
            if key not in fields:
                continue
            value = getattr(options, key)
            if key == "port" and hasattr(options, "effective_port"):
                value = options.effective_port
            elif key == "port" and isinstance(getattr(transports[name], "port", None), int):
                value = transports[name].port  # the http transport's, after AGENTIK_PORT
            if key == "host" and getattr(transports[name], "loopback_only", False):
                value = f"127.0.0.1 (not {value}: without tokens the API is loopback only)"
            if key == "channels" and isinstance(value, list):
                value = ", ".join(value) or "(none)"
            if value is None:
                continue
            parts.append(f"{key} {value}")
        if parts:
            out.append("  " + ", ".join(parts))
        # A secret is listed when it is set, required, or given (empty: `missing`);
        # an optional one left out (Socket Mode's signing_secret, an IRC password
        # the network does not need) is not "missing".
        secrets = []
        for key, field in fields.items():
            if _is_secret(field.annotation):
                value = getattr(options, key)
                if reveal(value) or field.is_required() or key in options.model_fields_set:
                    secrets.append(f"{key} {_secret_state(value)}")
        for i, token in enumerate(getattr(options, "tokens", None) or ()):
            env = getattr(token, "env", None)
            if env:
                secrets.append(
                    f"token {token.name} (${env}) {'set' if os.environ.get(env) else 'missing'}"
                )
            elif getattr(token, "file", None):
                path = config.resolve_path(token.file)
                there = "present" if os.path.exists(path) else "missing"
                secrets.append(f"token {token.name} (file {path}) {there}")
            else:
                secrets.append(f"token {getattr(token, 'name', i)}")
        if secrets:
            out.append("  secrets: " + ", ".join(secrets))
        # The bridge's keys only (declared fields): the transport's own keys,
        # secrets among them, are in model_extra and shown above.
        declared = type(section).model_fields
        bridge = sorted(
            k for k in section.model_fields_set if k in declared and k not in ("type", "enabled")
        )
        if bridge:
            shown_bridge = ", ".join(f"{k}={getattr(section, k)!r}" for k in bridge)
            out.append(f"  channel options: {shown_bridge}")
    if not config.transports:
        out.append(
            "transports: none configured: agentik run refuses to start (agentik chat adds"
            " a terminal)"
        )
    elif not any(s.enabled for s in config.transports.values()):
        out.append(
            "transports: none enabled: agentik run refuses to start (agentik chat adds a terminal)"
        )
    return out


def _where(server: Any) -> tuple[str | None, str]:
    """Where an MCP server's command is (the bot's venv ``bin/``, then ``PATH``:
    :func:`agentik.core.tools.mcp.resolve_command`), or why it was not found."""
    try:
        return resolve_command(server), ""
    except CommandNotFound as exc:
        return None, str(exc)


def _mcp_lines(config: Config) -> list[str]:
    out = []
    for s in config.mcp.servers:
        startup = s.startup or config.mcp.startup
        if s.command is not None:
            found, why = _where(s)
            where = found or why
            line = f"mcp {s.name}: command {' '.join([s.command, *s.args])} ({where}), {startup}"
        else:
            line = f"mcp {s.name}: url {s.url}, {startup}"
        keys = [*(s.env or {}), *(s.headers or {})]
        if keys:
            line += "; env/headers: " + ", ".join(sorted(keys))
        if s.url is not None:
            line += f"; bearer token {_secret_state(s.bearer_token)}"
        out.append(line)
    return out


def _known_tools(config: Config, registry: Any, agents: Mapping[str, Any]) -> list[str]:
    """The names of the tools the bot will have, as far as known without starting
    anything: plugins', memory's, the builtin ones ``[tools]`` switches on, skills
    and passthrough tools.  MCP servers' tools are not among them."""
    names = [t.name for t in registry.tools]
    if config.memory.backend != "none":
        names += [cls.name for cls in MEMORY_TOOLS]
    names += [t.name for t in builtin_tools(config.tools)]
    if config.agent.skills:
        with contextlib.suppress(ConfigError):  # `agentik run` names a bad folder
            names += [t.name for t in load_skills(config.resolve_path(config.agent.skills)).tools()]
    names += [p.name for p in config.passthrough]
    # The agents' tools (agent__<name>) are governed by `uses`, not by `tools`.
    agent_tools = {agent_tool_name(n) for n in agents}
    return [n for n in dict.fromkeys(names) if n not in agent_tools]


def _mcp_servers_matching(pattern: str, servers: Sequence[str]) -> list[str]:
    """The MCP servers whose tools (``<server>__<tool>``) ``pattern`` may match."""
    tail = pattern.rsplit("__", 1)[-1] if "__" in pattern else ""
    tail = re.sub(r"\[[^]]*\]", "x", tail).replace("*", "").replace("?", "x")
    return [
        s
        for s in servers
        if any(fnmatchcase(f"{s}__{t}", pattern) for t in {tail, "x", tail + "x"})
    ]


def _cycles(agents: Mapping[str, Any]) -> list[list[str]]:
    """Each cycle of ``uses`` among the agents, once (from its first agent in order)."""
    order = list(agents)
    found: list[list[str]] = []
    seen: set[tuple[str, ...]] = set()

    def walk(path: list[str]) -> None:
        for used in agents[path[-1]].uses:
            if used not in agents:
                continue
            if used in path:
                cycle = path[path.index(used) :]
                first = min(cycle, key=order.index)
                i = cycle.index(first)
                key = tuple(cycle[i:] + cycle[:i])
                if key not in seen:
                    seen.add(key)
                    found.append([*key, first])
            elif len(path) < len(agents):
                walk([*path, used])

    for name in order:
        walk([name])
    return found


def _agent_lines(config: Config, registry: Any) -> list[str]:
    """``[agent] uses`` and each named agent: description, model profile, tools (their
    globs resolved), ``uses`` and limits; warnings for a tools glob that matches no
    tool, a cycle of ``uses``, an agent the depth limit never lets run."""
    agents = resolve_agents(config, registry)  # refuses a `uses` naming no agent
    runs = config.runs
    main_uses = ", ".join(config.agent.uses) or "(none)"
    if not agents:
        return ["agents: none ([agents.<name>] declares one)"]
    out = [
        f"agents: {len(agents)}; the main agent uses {main_uses}",
        f"  runs: max_depth {runs.max_depth}, max_concurrent_children"
        f" {runs.max_concurrent_children}, token_budget {runs.token_budget or 'none'},"
        f" tree_token_budget {runs.tree_token_budget or 'none'}",
    ]
    known = _known_tools(config, registry, agents)
    memory_tools = {cls.name for cls in MEMORY_TOOLS}
    servers = [s.name for s in config.mcp.servers]
    # The depth at which each agent can first run (the main agent's turn is depth 0).
    depth: dict[str, int] = {}
    frontier, level = list(config.agent.uses), 1
    while frontier:
        nxt: list[str] = []
        for name in frontier:
            if name not in depth:
                depth[name] = level
                nxt += agents[name].uses
        frontier, level = nxt, level + 1
    for name, spec in agents.items():
        source = "" if name in config.agents else " (from a plugin)"
        description = spec.description or "(no description)"
        out.append(f"agent {name}{source}: {description}")
        if spec.url or spec.a2a_url:
            # It runs in another agentik (or A2A agent): its model, tools and limits are its own.
            token = f"token from ${spec.token_env}" if spec.token_env else "no token"
            where = (
                f"remote: {spec.url.rstrip('/')}{spec.url_prefix}"
                if spec.url
                else f"A2A: {spec.a2a_url.rstrip('/')}"  # type: ignore[union-attr]
            )
            out.append(
                f"  {where} ({token}), token_budget {spec.token_budget or 'none of its own'}"
            )
            if spec.token_env and not os.environ.get(spec.token_env, "").strip():
                out.append(
                    f"  warning: agents.{name}.token_env: environment variable"
                    f" {spec.token_env} is not set"
                )
            if name not in depth:
                out.append(f"  note: not reachable from [agent] uses: {name} never runs")
            continue
        model = spec.model or "the caller's"
        schema = "custom" if spec.input_schema is not None else '{"task": string}'
        result = "JSON (result_schema)" if spec.result_schema is not None else "text"
        out.append(
            f"  model {model}, memory {spec.memory}, uses {', '.join(spec.uses) or '(none)'},"
            f" input {schema}, answers in {result}"
        )
        resolved, warnings = [], []
        # memory = "none": its run gets no memory tools, whatever `tools` says.
        offered = [t for t in known if spec.memory != "none" or t not in memory_tools]
        for pattern in spec.tools:
            hits = [t for t in offered if fnmatchcase(t, pattern)]
            mcp = _mcp_servers_matching(pattern, servers)
            said = ", ".join(hits)
            if mcp:
                said += ("; " if said else "") + "tools of MCP server " + ", ".join(mcp)
            if not said:
                said = "nothing"
                warnings.append(
                    f"  warning: agents.{name}.tools: {pattern!r} matches no tool"
                    f" (tools: {', '.join(offered) or 'none'}"
                    + (f"; MCP servers: {', '.join(servers)}" if servers else "")
                    + ")"
                )
            resolved.append(f"{pattern} → {said}")
        out.append("  tools: " + ("; ".join(resolved) if resolved else "(none)"))
        limits = [
            "max_tool_calls "
            + (str(spec.max_tool_calls) if spec.max_tool_calls is not None else "the caller's"),
            "time_budget "
            + (f"{spec.time_budget:g}s" if spec.time_budget is not None else "the caller's"),
            f"token_budget {spec.token_budget or 'none of its own'}",
            "max_concurrent_children "
            + str(spec.max_concurrent_children or runs.max_concurrent_children),
        ]
        out.append("  limits: " + ", ".join(limits))
        out += warnings
        if name not in depth:
            out.append(f"  note: not reachable from [agent] uses: {name} never runs")
        elif depth[name] > runs.max_depth:
            out.append(
                f"  warning: {name} runs at depth {depth[name]} at the earliest, past"
                f" [runs] max_depth {runs.max_depth}: it never runs"
            )
    for cycle in _cycles(agents):
        out.append(
            f"warning: agents call each other in a cycle: {' → '.join(cycle)}"
            f" (bounded by [runs] max_depth {runs.max_depth})"
        )
    return out


def _access_summary(config: Config) -> str:
    """One line of ``agentik check`` on ``[access]``."""
    a = config.access
    if not (a.owners or a.admins or a.ignored or a.roles or a.rules):
        return "access: no [access] rules: everyone is a user (agentik access roles)"
    counts = [
        f"{len(a.owners)} owner pattern(s)", f"{len(a.admins)} admin pattern(s)",
        f"{len(a.ignored)} ignored pattern(s)", f"{len(a.roles)} named role(s)",
        f"{len(a.rules)} rule(s)",
    ]  # fmt: skip
    return "access: " + ", ".join(counts) + " (agentik access roles)"


def _policy_lines(config: Config) -> list[str]:
    out = [_access_summary(config)]
    a = config.access
    for label, patterns in (("owners", a.owners), ("admins", a.admins), ("ignored", a.ignored)):
        if patterns:
            out.append(f"  {label}: {', '.join(patterns)}")
    for name, role in a.roles.items():
        out.append(f"  role {name}: ranks as {role.rank}")
    for access_rule in a.rules:
        said = [
            f"channels {', '.join(access_rule.channels)}",
            f"roles {', '.join(access_rule.roles)}",
        ]
        if access_rule.tools is not None:
            said.append(f"tools {', '.join(access_rule.tools) or '(none)'}")
        if access_rule.commands is not None:
            said.append(f"commands {', '.join(access_rule.commands) or '(none)'}")
        if access_rule.answer is not None:
            said.append(f"answer {'yes' if access_rule.answer else 'no'}")
        out.append("  rule: " + "; ".join(said))
    if config.approvals:
        out.append(f"approvals: {len(config.approvals)} rule(s) (first match wins)")
        for rule in config.approvals:
            where = f" in {', '.join(rule.channels)}" if rule.channels else ""
            out.append(
                f"  {', '.join(rule.tools)}: {rule.approve}, by {rule.approvers}"
                f", {rule.timeout:g}s{where}"
            )
    else:
        out.append("approvals: none (no tool call waits for a person)")
    out.append(_budget_line(config))
    if config.channels:
        out.append(f"channels: {len(config.channels)} pattern(s)")
        for pattern, chan in config.channels.items():
            keys = {
                k: getattr(chan, k)
                for k in setting_fields(type(chan))
                if getattr(chan, k) is not None
            }
            shown = ", ".join(
                f"{k}={'(text)' if k == 'persona' else repr(v)}" for k, v in keys.items()
            )
            out.append(f'  "{pattern}": {shown or "(nothing set)"}')
    else:
        out.append("channels: no per-channel settings")
    return out


def _budget_line(config: Config) -> str:
    b = config.budgets
    tables = [("owner", b.owner), ("admin", b.admin), ("user", b.user), ("channel", b.channel)]
    tables += [(f"role {n}", lim) for n, lim in sorted(b.roles.items())]
    limited = [name for name, lim in tables if lim != BudgetLimits()]
    if not limited:
        return "budgets: none (unlimited)"
    return f"budgets: limits for {', '.join(limited)} (agentik access budgets)"


# -- probes ------------------------------------------------------------------------------------


async def _probe_all(
    config: Config,
    backend: Any,
    profiles: dict[str, Any],
    transports: dict[str, Any],
    seconds: float,
) -> list[Probe]:
    jobs: list[tuple[str, Callable[[], Awaitable[Probe | list[Probe]]]]] = []
    jobs.append(("model", lambda: _probe_model("model", backend, seconds)))
    if config.storage.backend == "postgres":
        jobs.append(("storage", lambda: _probe_postgres(config, seconds)))
    for name, profile in profiles.items():
        jobs.append((f"model profile {name}", _bind(_probe_model, f"model profile {name}",
                                                    profile, seconds)))  # fmt: skip
    if config.mcp.servers:
        jobs.append(("mcp", lambda: _probe_mcp(config, seconds)))
    for name, section in config.transports.items():
        if not section.enabled:
            continue
        t = transports[name]
        if section.type == "irc":
            jobs.append((f"irc {name}", _bind(_probe_irc, f"irc {name}", t.options, seconds, t)))
        elif section.type == "slack":
            jobs.append((f"slack {name}", _bind(_probe_slack, f"slack {name}", t.options,
                                                seconds)))  # fmt: skip
    results = await asyncio.gather(*(_guarded(c, job, seconds) for c, job in jobs))
    flat: list[Probe] = []
    for r in results:
        flat.extend(r if isinstance(r, list) else [r])
    return flat


def _bind(fn: Callable[..., Awaitable[Any]], *args: Any) -> Callable[[], Awaitable[Any]]:
    return lambda: fn(*args)


async def _guarded(
    component: str, job: Callable[[], Awaitable[Probe | list[Probe]]], seconds: float
) -> Probe | list[Probe]:
    """A probe that hangs or raises still gives a named failure."""
    try:
        # The probes bound their own steps; this only guards against a hang.
        return await asyncio.wait_for(job(), seconds * 3 + 5)
    except TimeoutError:
        return Probe(component, False, f"no answer within {seconds * 3 + 5:g}s")
    except Exception as exc:  # a probe's own bug must not hide the others' results
        return Probe(component, False, f"{type(exc).__name__}: {exc}")


async def _probe_postgres(config: Config, seconds: float) -> Probe:
    """Connect to the PostgreSQL server (no migration): its version, the schema
    version of this agentik's tables there, its extensions, pgvector or not."""
    from agentik.core.store.postgres import describe_dsn, probe_server

    dsn = os.environ.get(config.storage.dsn_env, "")
    where = describe_dsn(dsn)
    try:
        info = await probe_server(dsn, connect_timeout=seconds)
    except AgentikError as exc:
        return Probe("storage", False, str(exc))
    extensions = ", ".join(f"{k} {v}" for k, v in info["extensions"].items()) or "none"
    if "vector" in info["extensions"]:
        vector = f"pgvector {info['extensions']['vector']} installed"
    elif info["pgvector"]:
        vector = f"pgvector {info['pgvector']} available, not installed"
    else:
        vector = "pgvector not available"
    if config.memory.backend == "sqlite":
        # Notes' vectors are bytea, ranked in the process, pgvector or not (docs/memory.md).
        vector += " (memory vectors: ranked in the process)"
    schema = info["schema_version"]
    return Probe(
        "storage",
        True,
        f"PostgreSQL {info['version']} at {where}; schema version"
        f" {schema if schema else 'none yet (agentik run creates it)'};"
        f" extensions: {extensions}; {vector}",
    )


async def _probe_model(component: str, backend: Any, seconds: float) -> Probe:
    if isinstance(backend, NoModelBackend):
        return Probe(component, False, backend.reason or "no model configured")
    model_path = getattr(backend, "model_path", None)
    client = getattr(backend, "_client", None)
    if client is None and model_path is not None:
        return _model_file(component, model_path)
    if client is None:
        return Probe(component, True, f"{type(backend).__name__}: nothing to reach")
    import openai

    where = getattr(backend, "base_url", None) or str(client.base_url)
    model = getattr(backend, "model", None)
    try:
        listing = await client.with_options(max_retries=0, timeout=seconds).models.list()
        ids = [m.id async for m in listing]
    except openai.APIConnectionError as exc:
        cause = exc.__cause__ or exc
        return Probe(component, False, f"GET {where}/models: endpoint unreachable ({cause})")
    except openai.AuthenticationError as exc:
        return Probe(
            component, False, f"GET {where}/models: the API key was refused ({exc.status_code})"
        )
    except openai.APIStatusError as exc:
        return Probe(
            component, False, f"GET {where}/models: HTTP {exc.status_code}: cannot list models"
        )
    if model not in ids:
        served = ", ".join(ids[:10]) + (" …" if len(ids) > 10 else "") or "none"
        return Probe(
            component, False, f"model {model!r} is not known to {where} (it serves: {served})"
        )
    return Probe(component, True, f"{where} serves model {model!r}")


def _model_file(component: str, model_path: str) -> Probe:
    if os.path.isfile(model_path):
        size = os.path.getsize(model_path)
        return Probe(component, True, f"model file {model_path} ({size:,} bytes)")
    return Probe(component, False, f"model file {model_path}: not found")


async def _probe_mcp(config: Config, seconds: float) -> list[Probe]:
    results: dict[str, Probe] = {}
    runnable = []
    for s in config.mcp.servers:
        if s.command is not None and _where(s)[0] is None:
            results[s.name] = Probe(f"mcp {s.name}", False, _where(s)[1])
        else:
            runnable.append(s.name)
    if runnable:
        # Every server started now (lazy ones too), as `agentik run` would.
        servers = [
            dataclasses.replace(s, startup="eager")
            for s in config.mcp.servers
            if s.name in runnable
        ]
        only = config.model_copy(
            update={"mcp": config.mcp.model_copy(update={"servers": servers, "startup": "eager"})}
        )
        toolset = mcp_toolset(only)
        try:
            try:
                await asyncio.wait_for(toolset.start(), seconds)
            except TimeoutError:
                pass
            for st in toolset.status():
                name, state = st["name"], st.get("state")
                if state == "connected":
                    n = len(st.get("tools") or ())
                    results[name] = Probe(f"mcp {name}", True, f"started, {n} tool(s)")
                else:
                    why = st.get("error") or f"still {state} after {seconds:g}s"
                    results[name] = Probe(f"mcp {name}", False, f"server did not start: {why}")
        finally:
            with contextlib.suppress(Exception):
                await toolset.aclose()
    return [results[s.name] for s in config.mcp.servers if s.name in results]


async def _plain_text_hint(transport: Any, exc: BaseException | None) -> str:
    """The run-time hint for TLS to a plain-text port (``set tls = false``): from
    OpenSSL's reason, else from the transport's own plain-text probe."""
    from agentik.transports.irc import transport as irc

    hint = str(getattr(irc, "_PLAINTEXT_HINT", ""))
    if getattr(exc, "reason", None) in getattr(irc, "_PLAINTEXT_REASONS", ()):
        return hint
    answers = getattr(transport, "_answers_plain_irc", None)
    if callable(answers):
        with contextlib.suppress(Exception):
            if await answers():
                return hint
    return ""


async def _probe_irc(component: str, options: Any, seconds: float, transport: Any = None) -> Probe:
    host = options.host
    port = options.effective_port if hasattr(options, "effective_port") else options.port
    tls = bool(options.tls)
    what = f"{host}:{port}{' with TLS' if tls else ''}"
    loop = asyncio.get_running_loop()
    try:
        await asyncio.wait_for(loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), seconds)
    except (OSError, TimeoutError) as exc:
        return Probe(component, False, f"host {host!r} does not resolve ({exc or 'timed out'})")
    context: ssl.SSLContext | None = None
    if tls:
        context = ssl.create_default_context(cafile=getattr(options, "ssl_ca_file", None))
        if not getattr(options, "ssl_verify", True):
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=context, server_hostname=host if tls else None),
            seconds,
        )
    except TimeoutError:
        hint = await _plain_text_hint(transport, None) if tls else ""
        return Probe(component, False, f"connect to {what}: no answer within {seconds:g}s{hint}")
    except ssl.SSLError as exc:
        hint = await _plain_text_hint(transport, exc)
        return Probe(component, False, f"connect to {what}: TLS handshake failed ({exc}){hint}")
    except OSError as exc:
        why = os.strerror(exc.errno) if exc.errno else str(exc)
        return Probe(component, False, f"connect to {what}: {why}")
    writer.close()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(writer.wait_closed(), seconds)
    return Probe(component, True, f"{what} accepts connections (not registered)")


async def _probe_slack(component: str, options: Any, seconds: float) -> Probe:
    from slack_sdk.errors import SlackApiError
    from slack_sdk.web.async_client import AsyncWebClient

    token = reveal(options.bot_token)
    if not token:
        return Probe(component, False, "bot_token is not set")
    kwargs: dict[str, Any] = {"token": token, "timeout": int(max(1, seconds))}
    if options.api_url:
        kwargs["base_url"] = (
            options.api_url if options.api_url.endswith("/") else options.api_url + "/"
        )
    client = AsyncWebClient(**kwargs)
    where = kwargs.get("base_url", client.base_url)
    try:
        auth = await client.auth_test()
    except SlackApiError as exc:
        error = exc.response.get("error") if exc.response is not None else None
        return Probe(
            component, False, f"auth.test at {where} refused the bot_token: {error or exc}"
        )
    except Exception as exc:  # connection problems come as aiohttp/OS errors
        return Probe(
            component,
            False,
            f"auth.test at {where}: cannot reach Slack ({type(exc).__name__}: {exc})",
        )
    finally:
        session = getattr(client, "session", None)
        if session is not None:
            with contextlib.suppress(Exception):
                await session.close()
    team = auth.get("team") or auth.get("team_id")
    return Probe(component, True, f"bot_token valid: team {team!r}, bot user {auth.get('user_id')}")
