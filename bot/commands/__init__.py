"""Chat commands (``!new``, ``!help``, a plugin's ``!deploy``): a registry the
bridge runs them from.

A command is a :class:`Command` (name, help line, handler, the role it
needs); its handler gets a :class:`CommandContext` and never imports the
bridge.  The built-in commands (:mod:`.builtin`, one module per concern:
:mod:`.session`, :mod:`.settings`, :mod:`.roles`, :mod:`.approvals`,
:mod:`.tools`, :mod:`.memory`, :mod:`.redact`) register through the
``register_commands`` hook, exactly as a plugin's do; :func:`load_commands`
collects them, built-ins first.  See docs/plugins.md, "Writing a chat command".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import builtin
from .base import Command, CommandContext, CommandHost, CommandRegistry, Handler

if TYPE_CHECKING:
    import pluggy

__all__ = [
    "Command",
    "CommandContext",
    "CommandHost",
    "CommandRegistry",
    "Handler",
    "builtin_commands",
    "load_commands",
]


def load_commands(pm: pluggy.PluginManager | None) -> CommandRegistry:
    """The built-in commands, then every plugin's ``register_commands`` (in the
    order the plugins were registered); a name taken twice is a PluginError."""
    registry = CommandRegistry()
    registry.collect([("agentik", builtin.register_commands)])
    if pm is not None:
        impls = pm.hook.register_commands.get_hookimpls()
        registry.collect((i.plugin_name, i.function) for i in impls)
    return registry


def builtin_commands() -> CommandRegistry:
    """The built-in commands alone."""
    return load_commands(None)
