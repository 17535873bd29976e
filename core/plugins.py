"""Finding and loading plugins; the registry of what they provide.

Plugins are modules (or objects) with :data:`~agentik.core.hookspecs.hookimpl`
functions, advertised in the entry-point group ``agentik``::

    [project.entry-points.agentik]
    mybackend = "my_package.plugin"

The built-in backends are entry points of the ``agentik`` distribution and
load the same way.  Environment switches:

``AGENTIK_PLUGINS``
    comma-separated entry-point names of third-party plugins to load; unset
    loads all, empty loads none.  Built-in plugins always load.
``AGENTIK_TRACE_HOOKS``
    ``1`` logs every hook call and result at DEBUG on logger
    ``agentik.hooks``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pluggy

from . import hookspecs
from .errors import PluginError

__all__ = ["ENTRY_POINT_GROUP", "LazyFactory", "PluginInfo", "Registry", "load_plugins"]

log = logging.getLogger(__name__)
ENTRY_POINT_GROUP = "agentik"
BUILTIN_DISTRIBUTION = "agentik"
_BUILTIN_MODULES = (
    "agentik.core.llm.openai_backend",
    "agentik.core.llm.litert",
    "agentik.core.llm.llamacpp",
    "agentik.core.testing.scripted",
)


@dataclass(frozen=True, slots=True)
class PluginInfo:
    """A loaded plugin: its name, and the distribution it came from."""

    name: str
    distribution: str | None = None
    version: str | None = None
    builtin: bool = False


class LazyFactory:
    """A factory named by its import path (``"package.module:Name"``), imported when
    first used: called, or an attribute read (``settings_model``).

    A plugin registers one where importing the real factory costs start-up time that a
    configuration without it should not pay (the built-in IRC and Slack transports:
    their modules, and irc3 or slack-bolt after them, are imported when a
    ``[transports.*]`` table of that type is made).  ``load()`` returns the factory.

    ``settings_model``, when given, is what the attribute reads without importing the
    factory: the built-in local backends (LiteRT-LM, llama.cpp) keep theirs in a small
    module, read to validate ``[llm]``, so a bot on another backend loads neither.
    """

    __slots__ = ("_settings", "_target", "path")

    def __init__(self, path: str, *, settings_model: Any = None) -> None:
        module, _, name = path.partition(":")
        if not module or not name:
            raise ValueError(f"expected 'package.module:Name', got {path!r}")
        self.path = path
        self._settings = settings_model
        self._target: Any = None

    def load(self) -> Any:
        """The factory itself (imported the first time)."""
        if self._target is None:
            module, _, name = self.path.partition(":")
            self._target = getattr(importlib.import_module(module), name)
        return self._target

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.load()(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and the like probe these
            raise AttributeError(name)
        if name == "settings_model" and self._settings is not None:
            return self._settings
        return getattr(self.load(), name)

    def __repr__(self) -> str:
        return f"LazyFactory({self.path!r})"


@dataclass
class Registry:
    """What the loaded plugins registered."""

    pm: pluggy.PluginManager
    plugins: list[PluginInfo] = field(default_factory=list)
    llm_backends: dict[str, Callable[..., Any]] = field(default_factory=dict)
    transports: dict[str, Callable[..., Any]] = field(default_factory=dict)
    tools: list[Any] = field(default_factory=list)
    #: Named agents (:class:`~agentik.core.agents.AgentSpec`) by name.
    agents: dict[str, Any] = field(default_factory=dict)
    _owners: dict[tuple[str, str], str] = field(default_factory=dict)

    def create_backend(self, name: str, **settings: Any) -> Any:
        """Instantiate the backend registered as ``name`` with ``settings``."""
        factory = self.llm_backends.get(name)
        if factory is None:
            known = ", ".join(sorted(self.llm_backends)) or "none"
            raise PluginError(f"unknown LLM backend {name!r} (registered: {known})")
        try:
            return factory(**settings)
        except TypeError as exc:
            raise PluginError(f"backend {name!r}: {exc}") from exc

    def _collect(self) -> None:
        def registrar(kind: str, target: dict[str, Any], plugin: str) -> Callable[..., None]:
            def register(name: str, factory: Callable[..., Any]) -> None:
                if not isinstance(name, str) or not name:
                    raise PluginError(f"plugin {plugin!r} registered a {kind} without a name")
                owner = self._owners.get((kind, name))
                if owner is not None:
                    raise PluginError(
                        f"{kind} {name!r} is registered by both {owner!r} and {plugin!r}"
                    )
                self._owners[(kind, name)] = plugin
                target[name] = factory

            return register

        def register_tool(plugin: str) -> Callable[[Any], None]:
            def register(t: Any) -> None:
                for attr in ("name", "description", "parameters", "call"):
                    if not hasattr(t, attr):
                        raise PluginError(f"plugin {plugin!r} registered a tool without {attr!r}")
                owner = self._owners.get(("tool", t.name))
                if owner is not None:
                    raise PluginError(
                        f"tool {t.name!r} is registered by both {owner!r} and {plugin!r}"
                    )
                self._owners[("tool", t.name)] = plugin
                self.tools.append(t)

            return register

        hooks: list[tuple[str, Callable[[str], Callable[..., None]]]] = [
            ("register_llm_backends", lambda p: registrar("LLM backend", self.llm_backends, p)),
            ("register_transports", lambda p: registrar("transport", self.transports, p)),
            ("register_tools", register_tool),
            ("register_agents", lambda p: registrar("agent", self.agents, p)),
        ]
        for hook_name, make in hooks:
            caller = getattr(self.pm.hook, hook_name)
            # Call each implementation ourselves, in registration order
            # (built-ins first), so a clash or a crash names the plugin responsible.
            for impl in caller.get_hookimpls():
                try:
                    impl.function(make(impl.plugin_name))
                except PluginError:
                    raise
                except Exception as exc:
                    raise PluginError(
                        f"plugin {impl.plugin_name!r} failed in {hook_name}: {exc}"
                    ) from exc


def _selected(env: Mapping[str, str]) -> set[str] | None:
    raw = env.get("AGENTIK_PLUGINS")
    if raw is None:
        return None
    return {p.strip() for p in raw.split(",") if p.strip()}


def load_plugins(
    extra: Iterable[object] = (),
    *,
    env: Mapping[str, str] | None = None,
    entry_points: bool = True,
) -> Registry:
    """Build a plugin manager, load plugins, and collect their registrations.

    ``extra`` are plugin objects/modules registered in addition (tests and
    library users use this to add plugins without packaging them).
    """
    env = os.environ if env is None else env
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    if env.get("AGENTIK_TRACE_HOOKS", "") not in ("", "0"):
        trace_log = logging.getLogger("agentik.hooks")
        pm.trace.root.setwriter(lambda msg: trace_log.debug("%s", msg.rstrip()))
        pm.enable_tracing()
    registry = Registry(pm=pm)
    wanted = _selected(env)
    loaded_builtin = False
    if entry_points:
        # Each of .name and .version parses the distribution's METADATA file again:
        # read it once per distribution (the built-in one has nine entry points).
        about: dict[int, tuple[str | None, str | None]] = {}
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            if ep.dist is None:
                dist, version = None, None
            else:
                if id(ep.dist) not in about:
                    metadata = ep.dist.metadata
                    about[id(ep.dist)] = (metadata["Name"], metadata["Version"])
                dist, version = about[id(ep.dist)]
            builtin = dist == BUILTIN_DISTRIBUTION
            if not builtin and wanted is not None and ep.name not in wanted:
                continue
            if pm.get_plugin(ep.name) is not None:
                continue
            info = PluginInfo(ep.name, dist, version, builtin)
            try:
                plugin = ep.load()
            except Exception as exc:
                raise PluginError(f"cannot load plugin {ep.name!r} ({ep.value}): {exc}") from exc
            _register(pm, plugin, info)
            loaded_builtin |= builtin
            registry.plugins.append(info)
    if not loaded_builtin:
        # Running from a source tree without installed metadata: load the
        # built-ins directly so the core still works.
        for modname in _BUILTIN_MODULES:
            module: ModuleType = __import__(modname, fromlist=["_"])
            short = modname.rsplit(".", 1)[-1]
            if pm.get_plugin(short) is None:
                pm.register(module, name=short)
                registry.plugins.append(PluginInfo(short, None, None, True))
    for obj in extra:
        name = getattr(obj, "__name__", None) or type(obj).__name__
        _register(pm, obj, PluginInfo(name))
        registry.plugins.append(PluginInfo(name))
    _check_hook_names(pm, registry.plugins)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(" ".join(str(exc).split())) from exc
    registry._collect()
    return registry


def _describe(info: PluginInfo) -> str:
    where = f" ({info.distribution} {info.version})" if info.distribution else ""
    return f"plugin {info.name!r}{where}"


def _register(pm: pluggy.PluginManager, plugin: object, info: PluginInfo) -> None:
    """Register ``plugin``; a hook implementation that does not fit its spec is a PluginError."""
    try:
        pm.register(plugin, name=info.name)
    except pluggy.PluginValidationError as exc:
        # pluggy's message spans lines; the CLI shows errors as one line.
        raise PluginError(f"{_describe(info)}: {' '.join(str(exc).split())}") from exc


def _check_hook_names(pm: pluggy.PluginManager, plugins: list[PluginInfo]) -> None:
    """Fail on an implementation of a hook that does not exist (a misspelt name),
    naming the plugin, its distribution and the closest real hook."""
    known = [name for name, caller in vars(pm.hook).items() if caller.has_spec()]
    infos = {p.name: p for p in plugins}
    for name, caller in vars(pm.hook).items():
        if caller.has_spec():
            continue
        for impl in caller.get_hookimpls():
            if impl.optionalhook:
                continue
            info = infos.get(impl.plugin_name) or PluginInfo(impl.plugin_name)
            import difflib  # only a misspelt hook needs it (start-up: issue 31)

            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise PluginError(f"{_describe(info)}: unknown hook {name!r}{hint}")
