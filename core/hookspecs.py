"""Every agentik hook, in one place.  A hook's docstring is its contract.

Plugins implement hooks with :data:`hookimpl`::

    from agentik.core.hookspecs import hookimpl

    @hookimpl
    def register_llm_backends(register):
        register("echo", EchoBackend)

and are found through the entry-point group ``agentik`` (see
:mod:`agentik.core.plugins`).  The built-in ``openai`` backend registers
through these same hooks.

Registration hooks receive a ``register`` callback and return nothing; call
``register`` once per thing you add.  Names must be unique: registering a
name twice is a :class:`~agentik.core.errors.PluginError` naming both plugins.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

__all__ = ["PROJECT", "hookimpl", "hookspec"]

PROJECT = "agentik"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def register_llm_backends(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register LLM backends.

    Called once when a :class:`~agentik.core.plugins.Registry` is built.
    Call ``register(name, factory)`` for each backend: ``name`` is what a
    configuration selects (``[llm] backend = "name"``); ``factory(**settings)``
    returns an :class:`~agentik.core.llm.base.LLMBackend`, where ``settings``
    are the backend's configuration keys.  The return value is ignored.
    """


@hookspec
def register_tools(register: Callable[[Any], None]) -> None:
    """Register tools offered to the model in every conversation.

    Called once when a registry is built.  Call ``register(tool)`` with an
    object satisfying :class:`~agentik.core.tools.base.Tool` (name,
    description, JSON-Schema ``parameters``, async ``call``).  Channel tool
    policies may still hide it.  The return value is ignored.
    """


@hookspec
def register_transports(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register chat transports (IRC, Slack, terminal, HTTP, ...).

    Called once when a registry is built.  Call ``register(name, factory)``;
    a configuration's transport table with ``type = "name"`` is handed to
    ``factory(**settings)``, which returns the transport adapter.  The
    return value is ignored.
    """


@hookspec
def before_compact(conversation: Any, messages: list[Any], reason: str) -> None:
    """See the working-memory messages about to be summarised away.

    Called before compaction replaces the oldest part of ``conversation``'s
    working memory (``messages``: :class:`~agentik.core.messages.ChatMessage`
    values, oldest first) with a summary; ``reason`` is ``budget`` or
    ``forced``.  Persist facts you want to keep (the audit log keeps every
    message regardless).  May be ``async``; the return value is ignored; an
    exception is logged and compaction goes on.
    """
