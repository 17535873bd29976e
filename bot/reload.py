"""Reloading the configuration of a running bot (SIGHUP, :meth:`Bot.reload`).

A reload happens in two steps.  :func:`prepare` reads what the new
configuration asks for and builds every new part (transports, access policy,
prompt, MCP servers) without touching the running bot: any error there — a
bad key, an unknown transport type, a soul file that is gone — refuses the
reload and the old configuration stays in force.  :meth:`Plan.apply` then
changes the running bot:

* transports: a new ``[transports.<name>]`` starts, a removed one stops, one
  whose own settings changed is restarted; one whose only change is in the
  bridge's keys (``command_prefix``, ``answer``, ...) keeps its connection and
  gets the new options; an unchanged one is not touched;
* the system prompt (prompt, soul, skills), the tool policy (``[tools]``),
  approval rules, budgets, ``[access]``, ``[channels]`` defaults and the
  ``[agent]`` resume and settings keys apply from the next turn;
* MCP servers added, removed or changed are started, stopped or restarted;
  unchanged ones keep their session;
* ``[[links]]`` added, removed or changed are put in force
  (:meth:`agentik.bot.links.Links.reconfigure`).

Every other top-level section (``[storage]``, ``[memory]``, ``[llm]``,
``[plugins]``, ``[retention]``, ``[compaction]``, ``[logging]``, ``[agents.*]``,
``[runs]``, ``[profiles.*]``, ``[[passthrough]]``, ``[health]``,
``[supervision]``, ``[redaction]``, and the ``[agent]`` keys not listed above)
needs a restart: a change there is named, by section, in a warning and in the
summary line ("restart needed for ..."), never silently ignored.  The list is
computed from the settings model (:data:`APPLIED_SECTIONS` are the ones put in
force), so a section added later is reported until a reload learns to apply it.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from agentik.core import AgentikError, ConfigError
from agentik.core.budgets import Budgets
from agentik.core.settings import setting_fields
from agentik.transports.base import Transport

from .bridge import Bridge, options_from
from .builder import AgentBuilder, mcp_servers
from .config import Config, TransportSection
from .logs import add_secrets
from .parts import access_policy, make_transport

if TYPE_CHECKING:
    from agentik.core import Agent
    from agentik.core.access import AccessPolicy
    from agentik.core.plugins import Registry

__all__ = ["Plan", "Reloadable", "prepare"]

log = logging.getLogger("agentik.bot.app")


#: Top-level sections a reload puts in force (``agent``: only :data:`RELOADED_AGENT_KEYS`).
APPLIED_SECTIONS = frozenset(
    {"agent", "tools", "approvals", "budgets", "access", "channels", "mcp", "transports", "links"}
)
#: Sections a running bot cannot change: a reload names them in a warning.
RESTART_SECTIONS = tuple(
    n for n, f in Config.model_fields.items() if not f.exclude and n not in APPLIED_SECTIONS
)
#: ``[agent]`` keys a reload puts in force (a change of any other one needs a restart).
RELOADED_AGENT_KEYS = frozenset(
    {"system_prompt", "soul", "skills", "resume", "resume_max_age", "settings_role"}
)


class Reloadable(Protocol):
    """What a reload reads and changes of the running bot
    (:class:`~agentik.bot.app.Bot` implements it; this module does not import the bot)."""

    config: Config
    agent: Agent
    bridge: Bridge
    registry: Registry
    only: list[str] | None
    transports: dict[str, Transport]
    sections: dict[str, TransportSection]

    async def start_transport(self, transport: Transport, options: Any = None) -> None: ...

    async def stop_transport(self, transport: Transport) -> None: ...

    def report_health(self, transport: Transport) -> None: ...


@dataclass
class Plan:
    """What a reload changes; made by :func:`prepare`, carried out by :meth:`apply`."""

    config: Config
    #: name -> new instance, for transports that start (added or restarted).
    start: dict[str, Transport] = field(default_factory=dict)
    #: Names of transports that stop for good.
    stop: list[str] = field(default_factory=list)
    #: Names of transports whose only change is in the bridge's keys.
    options: dict[str, TransportSection] = field(default_factory=dict)
    #: Sections of the transports made from the new configuration.
    sections: dict[str, TransportSection] = field(default_factory=dict)
    prompt: str | None = None
    access: AccessPolicy | None = None
    mcp: list[Any] = field(default_factory=list)
    #: What else changed (for the summary line).
    changed: list[str] = field(default_factory=list)
    #: Sections that changed but need a restart.
    restart: list[str] = field(default_factory=list)

    async def apply(self, bot: Reloadable) -> str:
        """Change the running ``bot``; returns the one-line summary that is logged."""
        new, old = self.config, bot.config
        agent, bridge = bot.agent, bot.bridge
        parts: list[str] = []
        # -- what the next turn reads ------------------------------------------------------
        agent.system_prompt = self.prompt
        if new.tools != old.tools:
            agent.policy = new.tools
            bridge.policy_changed()
        agent.approvals.rules = list(new.approvals)
        if new.budgets != old.budgets:
            if bridge.budgets is not None:
                bridge.budgets.settings = new.budgets
            elif new.budgets.enabled:
                bridge.budgets = Budgets(new.budgets, agent.store)
                if agent.hooks.pm is not None:
                    agent.hooks.pm.register(
                        bridge.budgets.hook, name=f"agentik-budgets-{id(bridge.budgets):x}"
                    )
        if self.access is not None:
            previous = bridge.access
            bridge.access = self.access
            if bridge.role_for == previous.role_for:
                bridge.role_for = self.access.role_for
            agent.approvals.at_least = self.access.at_least
        bridge.settings.configure(new.channels)
        bridge.resume = new.agent.resume
        bridge.resume_max_age = new.agent.resume_max_age
        bridge.settings_role = new.agent.settings_role
        # -- MCP servers -------------------------------------------------------------------
        # The client's module is loaded once a toolset was made (or is made here).
        mcp = sys.modules.get("agentik.core.tools.mcp")
        toolset = None
        if mcp is not None:
            toolset = next((t for t in agent.toolsets if isinstance(t, mcp.MCPToolset)), None)
        if toolset is not None:
            added, removed, restarted = await toolset.reconfigure(self.mcp)
        elif self.mcp:
            from agentik.core.tools.mcp import MCPToolset

            toolset = MCPToolset(self.mcp)
            agent.toolsets.append(toolset)
            await toolset.start()
            added, removed, restarted = [s.name for s in self.mcp], [], []
        else:
            added = removed = restarted = []
        for verb, names in (("added", added), ("removed", removed), ("restarted", restarted)):
            if names:
                parts.append(f"MCP servers {verb}: {', '.join(names)}")
        # -- transports --------------------------------------------------------------------
        stopped: list[str] = []
        for name in [*self.stop, *(n for n in self.start if n in bot.transports)]:
            transport = bot.transports.pop(name)
            await bot.stop_transport(transport)
            if name in self.stop:
                await bridge.detach(name)
                bot.sections.pop(name, None)
            stopped.append(name)
        started: list[str] = []
        for name, transport in self.start.items():
            restarting = name in stopped
            section = self.sections[name]
            try:
                await bot.start_transport(transport, _options(section, transport))
            except Exception as exc:
                why = str(exc) or type(exc).__name__
                log.error("reload: transport %s did not start: %s", name, why)
                await bridge.detach(name)
                if not restarting:
                    continue
                # Put the old settings back rather than leave the instance down.
                section = bot.sections[name]
                transport = make_transport(bot.registry, name, section, old.source)
                try:
                    await bot.start_transport(transport, _options(section, transport))
                except Exception as again:
                    log.error(
                        "reload: transport %s did not start again with its old settings: %s",
                        name,
                        str(again) or type(again).__name__,
                    )
                    await bridge.detach(name)
                    bot.sections.pop(name, None)
                    continue
            else:
                started.append(name)
            if restarting:
                bridge.rebind(name, transport)
            bot.transports[name] = transport
            bot.sections[name] = section
            # What it reported while starting (not yet the bot's then) is its state now.
            bot.report_health(transport)
        for name, section in self.options.items():
            bridge.attach(bot.transports[name], _options(section, bot.transports[name]))
            bot.sections[name] = section
        # -- linked channels (after the transports: a link's channels are theirs) ---------
        if new.links != old.links:
            moved = await bridge.links.reconfigure(new.links)
            for verb, names in moved.items():
                if names:
                    parts.append(f"links {verb}: {', '.join(names)}")
        added_t = [n for n in started if n not in stopped]
        restarted_t = [n for n in started if n in stopped]
        removed_t = [n for n in stopped if n in self.stop]
        for verb, names in (
            ("added", added_t),
            ("removed", removed_t),
            ("restarted", restarted_t),
            ("with new options", list(self.options)),
        ):
            if names:
                parts.insert(0, f"transports {verb}: {', '.join(names)}")
        parts.extend(self.changed)
        bot.config = new
        with contextlib.suppress(Exception):
            add_secrets(new.secrets())
        if self.restart:
            named = ", ".join(s if "." in s else f"[{s}]" for s in self.restart)
            log.warning(
                "reload: %s changed but take%s effect only after a restart",
                named, "s" if len(self.restart) == 1 else "",
            )  # fmt: skip
            parts.append(f"restart needed for {named}")
        summary = "; ".join(parts) if parts else "nothing changed"
        return f"configuration reloaded from {new.source}: {summary}"


def _options(section: TransportSection, transport: Transport) -> Any:
    return options_from(section, transport)


async def prepare(bot: Reloadable, new: Config) -> Plan:
    """Check ``new`` and build its parts; raises :class:`ConfigError` (naming the
    key) and changes nothing when the configuration cannot be used."""
    old = bot.config
    plan = Plan(config=new)
    try:
        # -- transports --------------------------------------------------------------------
        wanted = {
            n: s
            for n, s in new.transports.items()
            if s.enabled and (bot.only is None or s.type in bot.only)
        }
        fixed = [n for n in bot.transports if n not in bot.sections]  # given in code
        if not wanted and not fixed:
            raise ConfigError(f"{new.source}: transports: no transport is enabled")
        for name, section in wanted.items():
            if name in fixed:
                continue
            running = bot.sections.get(name)
            plan.sections[name] = section
            if running == section:
                continue
            if (
                running is not None
                and running.type == section.type
                and running.settings == section.settings
            ):
                plan.options[name] = section
                continue
            plan.start[name] = make_transport(bot.registry, name, section, new.source)
        plan.stop = [n for n in bot.sections if n not in wanted]
        # -- the agent ---------------------------------------------------------------------
        builder = AgentBuilder().persona(new)
        plan.prompt = await builder.prompt()
        if plan.prompt != bot.agent.system_prompt:
            plan.changed.append("system prompt")
        for label, a, b in (
            ("tool policy", old.tools, new.tools),
            ("approvals", old.approvals, new.approvals),
            ("budgets", old.budgets, new.budgets),
            ("channel settings", old.channels, new.channels),
        ):
            if a != b:
                plan.changed.append(label)
        if new.access != old.access or set(new.transports) != set(old.transports):
            plan.access = access_policy(new)
            # Instances given in code (not in the file) keep their type.
            for name, kind in bot.bridge.access.transports.items():
                plan.access.transports.setdefault(name, kind)
            await plan.access.load(bot.agent.store)
            if new.access != old.access:
                plan.changed.append("access rules")
        if (new.agent.resume, new.agent.resume_max_age, new.agent.settings_role) != (
            old.agent.resume,
            old.agent.resume_max_age,
            old.agent.settings_role,
        ):
            plan.changed.append("agent settings")
        plan.mcp = mcp_servers(new)
        names = [s.name for s in plan.mcp]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ConfigError(f"{new.source}: mcp.servers: duplicate names: {', '.join(dupes)}")
        plan.restart = [s for s in RESTART_SECTIONS if getattr(new, s) != getattr(old, s)]
        plan.restart += [
            f"agent.{k}"
            for k in setting_fields(type(new.agent))
            if k not in RELOADED_AGENT_KEYS and getattr(new.agent, k) != getattr(old.agent, k)
        ]
    except ConfigError:
        raise
    except (AgentikError, ValueError, OSError) as exc:
        raise ConfigError(f"{new.source}: {exc}") from None
    return plan
