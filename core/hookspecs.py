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

**Interception hooks** run around every turn (see each hook for what its
return value does; ``None`` always means "no change").  Their rules:

* They may be ``async def``: the agent awaits what they return.
* Order: ``@hookimpl(tryfirst=True)`` runs first, ``trylast=True`` last,
  otherwise the most recently registered plugin first.  Rewriting hooks
  chain: each implementation sees what the previous one returned.  Deciding
  hooks (refuse, abort, block) stop at the first implementation that decides.
* An implementation that raises is logged (``agentik.hooks``) with its
  plugin's name and skipped; the turn goes on.
* Implementations take only the arguments they name.
* ``AGENTIK_TRACE_HOOKS=1`` logs every call and result at DEBUG.
* The hooks that run inside a turn (``before_llm_request``,
  ``after_response``, ``before_tool_call``, ``after_tool_call``,
  ``on_tool_error``) may also take ``emit``: ``emit(EventClass, **fields)``
  publishes an event of the plugin's own kind in the turn's stream (a
  :class:`~agentik.core.events.PluginEvent` subclass declared with
  :func:`~agentik.core.events.declare_event`; fields of JSON types).  An
  undeclared class or a field JSON cannot carry raises
  :class:`~agentik.core.errors.PluginError` in the hook (logged, skipped).
* A hook implementation whose name matches no hook here is an error at
  start-up, naming the plugin and the hook (spelling mistakes do not fail
  silently).

The result types (:class:`~agentik.core.hooks.Refuse`,
:class:`~agentik.core.hooks.Abort`, :class:`~agentik.core.hooks.Block`,
:class:`~agentik.core.hooks.Retry`, :class:`~agentik.core.hooks.UseBackend`)
are imported from :mod:`agentik.core.hooks` (they are defined in
:mod:`agentik.core.hooktypes`, below both modules).  The ``conversation``
the interception hooks receive is the
:class:`~agentik.core.conversation.Conversation` itself; the annotations
name :class:`~agentik.core.hooktypes.ConversationLike` (what the hook
machinery reads of it) so that this module does not import the
conversation, which is built on the hooks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import pluggy

if TYPE_CHECKING:
    from .hooktypes import Abort, Block, ConversationLike, Refuse, Retry, UseBackend
    from .llm.base import LLMBackend, LLMRequest
    from .messages import ChatMessage, ToolCall
    from .tools.base import Tool, ToolResult

__all__ = ["PROJECT", "Emit", "MaybeAwaitable", "hookimpl", "hookspec"]

_T = TypeVar("_T")
#: The ``emit`` a hook inside a turn may take: ``emit(EventClass, **fields)``.
Emit: TypeAlias = "Callable[..., None]"
#: What an interception hook returns: its result, or an awaitable of it
#: (``async def`` implementations).
MaybeAwaitable: TypeAlias = "_T | Awaitable[_T]"

PROJECT = "agentik"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def register_llm_backends(register: Callable[[str, Callable[..., LLMBackend]], None]) -> None:
    """Register LLM backends.

    Called once when a :class:`~agentik.core.plugins.Registry` is built.
    Call ``register(name, factory)`` for each backend: ``name`` is what a
    configuration selects (``[llm] backend = "name"``); ``factory(**settings)``
    returns an :class:`~agentik.core.llm.base.LLMBackend`, where ``settings``
    are the backend's configuration keys.  Give the factory (the class) a
    ``settings_model`` — a pydantic model of those keys — and they become
    first-class ``[llm]`` keys: validated, errors naming the key, shown by
    ``agentik check``, passed to the factory as its fields.  The return value
    is ignored.
    """


@hookspec
def register_tools(register: Callable[[Tool], None]) -> None:
    """Register tools offered to the model in every conversation.

    Called once when a registry is built.  Call ``register(tool)`` with an
    object satisfying :class:`~agentik.core.tools.base.Tool` (name,
    description, JSON-Schema ``parameters``, async ``call``).  Channel tool
    policies may still hide it.  The return value is ignored.
    """


@hookspec
def register_agents(register: Callable[[str, Any], None]) -> None:
    """Register named agents that other agents can call as tools.

    Called once when a registry is built.  Call ``register(name, spec)`` with
    an :class:`~agentik.core.agents.AgentSpec` for each agent: it becomes
    the tool ``agent__<name>`` of every agent that lists ``name`` in its
    ``uses`` (``[agent] uses``, ``[agents.<other>] uses``), running as a
    child run.  A ``[agents.<name>]`` table of the configuration with the
    same name replaces the plugin's agent.  The return value is ignored.
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
def register_commands(register: Callable[[Any], None]) -> None:
    """Register chat commands (``!deploy``), as the built-in ``!new`` and ``!help`` are.

    Called once when the bot's bridge is built (after the built-in commands).
    Call ``register(command)`` with an :class:`agentik.bot.commands.Command`
    (name, help line, async handler, optionally ``needs_role``) for each
    command.  The handler is awaited with an
    :class:`agentik.bot.commands.CommandContext` (the message, the channel,
    the speaker's access decision, ``say``, the agent).  ``!help`` lists the
    command; the access rules (``[[access.rules]] commands``) and
    ``needs_role`` decide who may run it.  A name already taken (a built-in's
    or another plugin's) is a :class:`~agentik.core.errors.PluginError`.
    The return value is ignored.
    """


@hookspec
def before_prompt(
    conversation: ConversationLike, text: str, author: str | None, author_id: str | None
) -> MaybeAwaitable[str | Refuse | None]:
    """A person's message is about to enter the agent.

    Return a ``str`` to replace the text (what is stored and sent to the
    model), :class:`~agentik.core.hooks.Refuse` ``(message)`` to refuse it —
    nothing is stored, no turn runs, and the transport shows ``message`` in
    the channel — or ``None`` to leave it.  Runs before the message is
    committed to the audit log.
    """


@hookspec
def before_llm_request(
    conversation: ConversationLike, request: LLMRequest, run_id: str, emit: Emit
) -> MaybeAwaitable[LLMRequest | UseBackend | None]:
    """A request to the model is about to be sent (once per model step of a turn).

    ``request`` is the :class:`~agentik.core.llm.base.LLMRequest` (messages,
    tools offered, model).  Return a new ``LLMRequest`` (e.g. with
    ``dataclasses.replace``) to change the messages, the tools offered or
    the model; or :class:`~agentik.core.hooks.UseBackend` ``(backend,
    request=None)`` to send this request to another backend; or ``None``.
    """


@hookspec
def after_response(
    conversation: ConversationLike, run_id: str, text: str, tool_calls: list[ToolCall], emit: Emit
) -> MaybeAwaitable[str | Abort | None]:
    """The model finished one response (``text`` and the ``tool_calls`` it asked for).

    Return a ``str`` to replace the text (the channel sees the replacement:
    while any plugin implements this hook, answer text is held back until the
    response is complete), :class:`~agentik.core.hooks.Abort` ``(reason)`` to
    end the turn without recording the response (the channel gets the
    reason as an error), or ``None``.
    """


@hookspec
def before_tool_call(
    conversation: ConversationLike, run_id: str, call: ToolCall, emit: Emit
) -> MaybeAwaitable[Block | dict[str, Any] | None]:
    """The model asked for a tool call (:class:`~agentik.core.messages.ToolCall`).

    Return :class:`~agentik.core.hooks.Block` ``(reason)`` to refuse it (the
    model gets an error result ``blocked: <reason>``), a ``dict`` to replace
    its arguments, or ``None``.
    """


@hookspec
def after_tool_call(
    conversation: ConversationLike, run_id: str, call: ToolCall, result: ToolResult, emit: Emit
) -> MaybeAwaitable[ToolResult | str | None]:
    """A tool call finished with ``result`` (:class:`~agentik.core.tools.base.ToolResult`).

    Return a ``ToolResult`` or a ``str`` to replace what the model (and the
    audit log) gets, or ``None``.
    """


@hookspec
def on_tool_error(
    conversation: ConversationLike,
    run_id: str,
    call: ToolCall,
    error: ToolResult,
    attempt: int,
    emit: Emit,
) -> MaybeAwaitable[Retry | Abort | None]:
    """A tool call failed (``error`` is the error ``ToolResult``; ``attempt`` counts from 1).

    Return :class:`~agentik.core.hooks.Retry` ``(delay=0)`` to run the call
    again — at most ``TurnPolicy.max_tool_retries`` times, then the error
    stands —, :class:`~agentik.core.hooks.Abort` ``(reason)`` to end the turn
    (the error is recorded as the call's result, the other calls of the batch
    finish, then the turn ends with ``stop_reason = "aborted"`` and the
    channel gets ``turn aborted: <reason>``), or ``None`` to give up (the
    model gets the error).
    """


@hookspec
def before_compact(
    conversation: ConversationLike, messages: list[ChatMessage], reason: str
) -> MaybeAwaitable[None]:
    """See the working-memory messages about to be summarised away.

    Called before compaction replaces the oldest part of ``conversation``'s
    working memory (``messages``: :class:`~agentik.core.messages.ChatMessage`
    values, oldest first) with a summary or, when they are dropped to fit
    the model's window, a notice; ``reason`` is ``budget``, ``forced``,
    ``window`` (trimming), ``refused`` (the model refused a request as too
    large) or ``tool`` (the model asked for it, ``compact_context``).  Persist
    facts you want to keep (the audit log keeps every message regardless).  The
    return value is ignored.
    """


@hookspec
def session_start(conversation: ConversationLike) -> MaybeAwaitable[None]:
    """A conversation was created (its ``channel_key`` is set when it belongs to a channel).

    The return value is ignored.
    """


@hookspec
def session_end(conversation: ConversationLike, reason: str) -> MaybeAwaitable[None]:
    """A conversation ended: ``reason`` is ``reset`` (its channel started a new
    one, ``!new``), ``deleted`` or ``closed`` (the agent shut down or the
    conversation was closed).  The return value is ignored."""


@hookspec
def transport_start(transport: Any) -> MaybeAwaitable[None]:
    """A transport adapter started: it is connected and delivers messages.

    ``transport`` is the :class:`~agentik.transports.base.Transport` (its
    ``name`` is the configuration's table name).  The return value is ignored.
    """


@hookspec
def transport_stop(transport: Any) -> MaybeAwaitable[None]:
    """A transport adapter stopped: the bot is shutting down and it has disconnected.

    Called after its ``aclose()``, before the agent closes.  The return value
    is ignored.
    """


@hookspec
def before_store(kind: str, text: str, conversation_id: str | None) -> str | None:
    """Text is about to be written to the database: return a ``str`` to replace it.

    Called for every user message (``kind`` ``user``, after ``before_prompt``),
    assistant answer (``assistant``), tool call arguments (``tool_call``),
    tool result (``tool_result``), conversation title (``title``) and
    long-term memory note (``note``; ``conversation_id`` is ``None``).
    What the hook returns is what is stored *and* what the model sees from
    then on, so scrubbing a pasted API
    key here keeps it out of the database and out of the next request.
    Return ``None`` to leave the text.  Implementations chain (each sees the
    previous one's text).  This hook must be **synchronous** (it runs on
    every write); an ``async def`` implementation is logged and ignored.  The
    built-in :class:`~agentik.core.redaction.PatternScrubber` implements it
    when ``[redaction] scrub = true``.
    """
