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
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pluggy

from . import hookspecs

__all__ = ["Abort", "Block", "Hooks", "Refuse", "Retry", "UseBackend"]

log = logging.getLogger("agentik.hooks")


@dataclass(frozen=True, slots=True)
class Refuse:
    """``before_prompt``: refuse the message; ``message`` is shown in the channel."""

    message: str


@dataclass(frozen=True, slots=True)
class Abort:
    """``after_response``: end the turn without recording the response."""

    reason: str


@dataclass(frozen=True, slots=True)
class Block:
    """``before_tool_call``: do not run the call; the model gets ``blocked: <reason>``."""

    reason: str


@dataclass(frozen=True, slots=True)
class Retry:
    """``on_tool_error``: run the failed call again after ``delay`` seconds."""

    delay: float = 0.0


@dataclass(frozen=True, slots=True)
class UseBackend:
    """``before_llm_request``: send this request to ``backend`` (optionally a new ``request``)."""

    backend: Any
    request: Any = None


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

    async def each(self, name: str, kwargs: dict[str, Any]) -> AsyncIterator[tuple[str, Any]]:
        """Call the implementations one by one, yielding ``(plugin, result)``
        for each that returned something.

        ``kwargs`` is read anew for every implementation, so a caller that
        updates it between results chains rewrites; a caller that stops
        iterating stops calling.
        """
        if self.pm is None:
            return
        caller = getattr(self.pm.hook, name, None)
        if caller is None:
            raise AttributeError(f"no hook named {name!r}")
        for impl in reversed(caller.get_hookimpls()):
            args = {k: kwargs[k] for k in impl.argnames if k in kwargs}
            if self.trace:
                log.debug("hook %s plugin=%s call(%s)", name, impl.plugin_name, ", ".join(args))
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
                yield impl.plugin_name, result

    async def call(self, name: str, **kwargs: Any) -> list[tuple[str, Any]]:
        """Call every implementation of ``name``; ``[(plugin name, result), ...]``.

        ``None`` results are left out.  Results come in call order.
        """
        # pluggy's own order: it calls get_hookimpls() back to front.
        return [pair async for pair in self.each(name, kwargs)]
