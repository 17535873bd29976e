"""The bot's parts built from a configuration: plugins, transports, the access policy.

Below :mod:`.app` (which runs them), :mod:`.reload` (which replaces them on
SIGHUP), :mod:`.check` and :mod:`.cli` (which inspect them), so none of those
imports another just for these.  :mod:`.app` re-exports each name.
"""

from __future__ import annotations

import os
from importlib.metadata import entry_points

from agentik.core import ConfigError
from agentik.core.access import AccessPolicy
from agentik.core.plugins import BUILTIN_DISTRIBUTION, ENTRY_POINT_GROUP, Registry, load_plugins
from agentik.core.settings import did_you_mean, is_file_path, setting_fields
from agentik.transports.base import Transport

from .config import Config, TransportSection

__all__ = ["access_policy", "load_registry", "make_transport"]


def load_registry(config: Config, extra: tuple[object, ...] = ()) -> Registry:
    """Load plugins, honouring ``[plugins] load`` unless ``AGENTIK_PLUGINS`` is set.

    A name there that no installed plugin has is an error naming the key (or the
    variable): a plugin left out by a typo must not go unnoticed.
    """
    env = dict(os.environ)
    if "AGENTIK_PLUGINS" in env:
        where = "AGENTIK_PLUGINS"
        wanted = [p.strip() for p in env["AGENTIK_PLUGINS"].split(",") if p.strip()]
    else:
        where = f"{config.source}: plugins.load"
        wanted = list(config.plugins.load or ())
        if config.plugins.load is not None:
            env["AGENTIK_PLUGINS"] = ",".join(config.plugins.load)
    if wanted:
        _check_plugin_names(wanted, where)
    return load_plugins(extra, env=env)


def _check_plugin_names(wanted: list[str], where: str) -> None:
    """Each of ``wanted`` is the name of an installed plugin (its entry point's)."""
    points = list(entry_points(group=ENTRY_POINT_GROUP))
    names = {ep.name for ep in points}
    for name in wanted:
        if name in names:
            continue
        by_dist = [ep.name for ep in points if ep.dist is not None and ep.dist.name == name]
        hint = (
            f" ({name!r} is the distribution; its plugin is named {by_dist[0]!r})"
            if by_dist
            else did_you_mean(name, names)
        )
        third = sorted(
            ep.name for ep in points if ep.dist is None or ep.dist.name != BUILTIN_DISTRIBUTION
        )
        raise ConfigError(
            f"{where}: no installed plugin is named {name!r}{hint}"
            f" (installed plugins: {', '.join(third) or 'none'})"
        )


def make_transport(
    registry: Registry, name: str, section: TransportSection, source: str
) -> Transport:
    """Instantiate ``[transports.<name>]``; settings errors name the key."""
    factory = registry.transports.get(section.type)
    if factory is None:
        known = ", ".join(sorted(registry.transports)) or "none"
        raise ConfigError(
            f"{source}: transports.{name}.type: unknown transport {section.type!r}"
            f" (installed: {known})"
        )
    settings = dict(section.settings)
    model = getattr(factory, "settings_model", None)
    if model is not None and source != "<string>":
        # Path keys are relative to the configuration file, as elsewhere.
        base = os.path.dirname(os.path.abspath(source))
        for key, field in setting_fields(model).items():
            value = settings.get(key)
            if isinstance(value, str) and value and is_file_path(field):
                settings[key] = os.path.join(base, os.path.expanduser(value))
    try:
        return factory(name=name, settings=settings)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def _irc_casefold(name: str, casemapping: str | None = None) -> str:
    """:func:`agentik.transports.irc.wire.casefold`, imported when an IRC name is first
    folded: a bot that has none (no IRC rule, no IRC message) does not import the IRC
    wire module (its tables and patterns) at start-up."""
    from agentik.transports.irc.wire import casefold

    return casefold(name, casemapping)


def access_policy(config: Config) -> AccessPolicy:
    """The ``[access]`` policy of ``config``, for its transport instances."""
    types = {name: section.type for name, section in config.transports.items()}
    return AccessPolicy(config.access, types, irc_casefold=_irc_casefold)
