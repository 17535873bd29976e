"""Calling plugin hooks from the agent: async-aware, isolated, ordered.

pluggy calls hook implementations synchronously; agentik's interception
hooks may be ``async def``.  :class:`Hooks` calls each implementation
itself, in pluggy's order (``tryfirst`` first, ``trylast`` last, otherwise
the most recently registered plugin first), passes only the arguments an
implementation declares, awaits awaitable results explicitly, and isolates
failures: an implementation that raises is logged with its plugin's name
and skipped; the turn goes on.

With ``AGENTIK_TRACE_HOOKS=1`` every call and result is logged at DEBUG on
the ``agentik.hooks`` logger.
"""

from __future__ import annotations

import inspect
import logging
import os
from typing import Any

import pluggy

from . import hookspecs

__all__ = ["Hooks"]

log = logging.getLogger("agentik.hooks")


class Hooks:
    """Calls the hooks of a :class:`pluggy.PluginManager` (``None``: no plugins)."""

    def __init__(
        self, pm: pluggy.PluginManager | None = None, *, trace: bool | None = None
    ) -> None:
        self.pm = pm
        self.trace = (
            os.environ.get("AGENTIK_TRACE_HOOKS", "") not in ("", "0") if trace is None else trace
        )

    @classmethod
    def of(cls, plugins: Any) -> Hooks:
        """A :class:`Hooks` for a plugin manager, or plugin objects/modules."""
        if isinstance(plugins, Hooks):
            return plugins
        if isinstance(plugins, pluggy.PluginManager):
            return cls(plugins)
        pm = pluggy.PluginManager(hookspecs.PROJECT)
        pm.add_hookspecs(hookspecs)
        for p in plugins or ():
            name = getattr(p, "__name__", None) or type(p).__name__
            if pm.get_plugin(name) is not None:
                name = f"{name}-{id(p):x}"
            pm.register(p, name=name)
        return cls(pm)

    def implemented(self, name: str) -> bool:
        """Whether any plugin implements hook ``name`` (callers skip work if not)."""
        if self.pm is None:
            return False
        caller = getattr(self.pm.hook, name, None)
        return bool(caller is not None and caller.get_hookimpls())

    async def call(self, name: str, **kwargs: Any) -> list[tuple[str, Any]]:
        """Call every implementation of ``name``; ``[(plugin name, result), ...]``.

        ``None`` results are left out.  Results come in call order.
        """
        if self.pm is None:
            return []
        caller = getattr(self.pm.hook, name, None)
        if caller is None:
            raise AttributeError(f"no hook named {name!r}")
        out: list[tuple[str, Any]] = []
        # pluggy's own order: it calls get_hookimpls() back to front.
        for impl in reversed(caller.get_hookimpls()):
            args = {k: kwargs[k] for k in impl.argnames if k in kwargs}
            try:
                result = impl.function(**args)
                if inspect.isawaitable(result):
                    result = await result
            except Exception:
                log.exception("plugin %r failed in hook %s", impl.plugin_name, name)
                continue
            if self.trace:
                log.debug("hook %s plugin=%s result=%r", name, impl.plugin_name, result)
            if result is not None:
                out.append((impl.plugin_name, result))
        return out
