"""The hook implementations agentik finds through this distribution's entry point.

``pyproject.toml`` says::

    [project.entry-points.agentik]
    webhook = "agentik_webhook.plugin"

so ``agentik run`` loads this module and calls each ``@hookimpl`` below once.
A misspelt hook name here would stop the bot at start-up with an error
naming it, instead of being silently ignored.
"""

from __future__ import annotations

from typing import Any

from agentik.core.hookspecs import hookimpl
from agentik.core.plugins import LazyFactory

from .commands import webhook_command
from .tools import webhook_time


@hookimpl
def register_transports(register: Any) -> None:
    """``[transports.<name>] type = "webhook"``: registered by name, so its module is
    imported when such a table is made, not by every bot that has this plugin."""
    register("webhook", LazyFactory("agentik_webhook.transport:WebhookTransport"))


@hookimpl
def register_tools(register: Any) -> None:
    """Offered to the model in every conversation (a channel's ``allowed_tools`` may hide it)."""
    register(webhook_time)


@hookimpl
def register_commands(register: Any) -> None:
    """``!webhook`` in every chat channel (admins): registered as the built-in commands are."""
    register(webhook_command)
