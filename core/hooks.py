"""Calling plugin hooks from the agent: async-aware, isolated, ordered.

pluggy calls hook implementations synchronously; agentik's interception
hooks may be ``async def``.  :class:`Hooks` calls each implementation
itself, in pluggy's order (``tryfirst`` first, ``trylast`` last, otherwise
the most recently registered plugin first), passes only the arguments an
implementation declares, awaits awaitable results explicitly, and isolates
failures: an implementation that raises is logged with its plugin's name
and skipped; the turn goes on.

The interception hooks each have a typed method here (:meth:`Hooks.before_prompt`,
:meth:`Hooks.before_llm_request`, :meth:`Hooks.after_response`,
:meth:`Hooks.before_tool_call`, :meth:`Hooks.after_tool_call`,
:meth:`Hooks.on_tool_error`, :meth:`Hooks.before_compact`, and the
``session_start``/``session_end`` notifications): it chains the rewriting
results, stops at the first deciding one (refuse, abort, block, retry),
logs and ignores results of the wrong type, and returns the outcome as a
typed value.  Each returns at once, with its input unchanged, when no plugin
implements the hook.

With ``AGENTIK_TRACE_HOOKS=1`` every call and result is logged at DEBUG on
the ``agentik.hooks`` logger.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import pluggy

from . import hookspecs
from .errors import PluginError
from .hookspecs import Emit
from .hooktypes import Abort, Block, ConversationLike, Refuse, Retry, UseBackend
from .llm.base import LLMBackend, LLMRequest
from .messages import ChatMessage, ToolCall
from .tools.base import ToolResult

__all__ = ["Abort", "Block", "Hooks", "Refuse", "Retry", "UseBackend"]

log = logging.getLogger("agentik.hooks")


#: The results that end a chain of hook implementations (see ``_chain`` below).
_Stop = TypeVar("_Stop", Refuse, Abort, Block, Retry)


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

    async def _chain(
        self,
        name: str,
        args: dict[str, Any],
        rewrite: Callable[[Any, dict[str, Any]], dict[str, Any] | None],
        stop: type[_Stop] | None = None,
    ) -> tuple[str, _Stop] | None:
        """Run ``name``'s implementations in order, each seeing what the previous ones left.

        A result of type ``stop`` decides: the chain ends and it is returned
        with its plugin's name.  Any other result goes to ``rewrite(result,
        args)``, which returns the arguments it replaces (``None``: a result
        of the wrong type, logged and ignored).
        """
        async for plugin, result in self.each(name, args):
            if stop is not None and isinstance(result, stop):
                return plugin, result
            changes = rewrite(result, args)
            if changes is None:
                log.warning("plugin %r: %s returned %r; ignored", plugin, name, result)
            else:
                args.update(changes)
        return None

    def before_store(self, kind: str, text: str, conversation_id: str | None = None) -> str:
        """``text`` as the ``before_store`` implementations rewrote it (synchronous).

        Each implementation sees the previous one's text; one that raises, or
        returns an awaitable or a non-string, is logged and skipped.
        """
        if not text or not self.implemented("before_store"):
            return text
        assert self.pm is not None
        args: dict[str, Any] = {"kind": kind, "text": text, "conversation_id": conversation_id}
        for impl in reversed(self.pm.hook.before_store.get_hookimpls()):
            try:
                result = impl.function(**{k: args[k] for k in impl.argnames if k in args})
            except Exception:
                log.exception("plugin %r failed in hook before_store", impl.plugin_name)
                continue
            if inspect.isawaitable(result):
                if inspect.iscoroutine(result):
                    result.close()
                log.warning(
                    "plugin %r: before_store must be synchronous; ignored", impl.plugin_name
                )
            elif isinstance(result, str):
                args["text"] = result
            elif result is not None:
                log.warning(
                    "plugin %r: before_store returned %r; ignored", impl.plugin_name, result
                )
        return str(args["text"])

    # -- the interception hooks, typed (see agentik.core.hookspecs for each contract) --------
    async def before_prompt(
        self, conversation: ConversationLike, text: str, author: str | None, author_id: str | None
    ) -> str | Refuse:
        """The message text as the plugins rewrote it, or the first :class:`Refuse`."""
        if not self.implemented("before_prompt"):
            return text
        args = {
            "conversation": conversation,
            "text": text,
            "author": author,
            "author_id": author_id,
        }
        refused = await self._chain("before_prompt", args, _new_text, Refuse)
        if refused is not None:
            plugin, refusal = refused
            log.info("conversation %s: plugin %r refused a message", conversation.id, plugin)
            return refusal
        return str(args["text"])

    async def before_llm_request(
        self,
        conversation: ConversationLike,
        request: LLMRequest,
        backend: LLMBackend,
        run_id: str,
        emit: Emit | None = None,
    ) -> tuple[LLMRequest, LLMBackend]:
        """The request to send and the backend to send it to."""
        if not self.implemented("before_llm_request"):
            return request, backend
        args: dict[str, Any] = {
            "conversation": conversation,
            "request": request,
            "run_id": run_id,
            "emit": emit or _no_turn,
        }
        args["backend"] = backend  # not a hook argument: where UseBackend sends the request
        await self._chain("before_llm_request", args, _new_request)
        return args["request"], args["backend"]

    async def after_response(
        self,
        conversation: ConversationLike,
        run_id: str,
        text: str,
        tool_calls: Sequence[ToolCall],
        emit: Emit | None = None,
    ) -> str | Abort:
        """The response text as the plugins rewrote it, or the first :class:`Abort`."""
        if not self.implemented("after_response"):
            return text
        args: dict[str, Any] = {
            "conversation": conversation,
            "run_id": run_id,
            "text": text,
            "tool_calls": list(tool_calls),
            "emit": emit or _no_turn,
        }
        aborted = await self._chain("after_response", args, _new_text, Abort)
        if aborted is not None:
            plugin, abort = aborted
            log.info("run %s aborted by plugin %r: %s", run_id, plugin, abort.reason)
            return abort
        return str(args["text"])

    async def before_tool_call(
        self, conversation: ConversationLike, run_id: str, call: ToolCall, emit: Emit | None = None
    ) -> tuple[ToolCall, Block | None]:
        """The call to run (its arguments as plugins replaced them) and the first :class:`Block`."""
        if not self.implemented("before_tool_call"):
            return call, None
        args: dict[str, Any] = {
            "conversation": conversation,
            "run_id": run_id,
            "call": call,
            "emit": emit or _no_turn,
        }
        blocked = await self._chain("before_tool_call", args, _new_arguments, Block)
        if blocked is not None:
            plugin, block = blocked
            log.info("plugin %r blocked tool call %s: %s", plugin, call.name, block.reason)
            return args["call"], block
        return args["call"], None

    async def after_tool_call(
        self,
        conversation: ConversationLike,
        run_id: str,
        call: ToolCall,
        result: ToolResult,
        emit: Emit | None = None,
    ) -> ToolResult:
        """The tool result as the plugins replaced it."""
        if not self.implemented("after_tool_call"):
            return result
        args: dict[str, Any] = {
            "conversation": conversation,
            "run_id": run_id,
            "call": call,
            "result": result,
            "emit": emit or _no_turn,
        }
        await self._chain("after_tool_call", args, _new_result)
        replaced: ToolResult = args["result"]
        return replaced

    async def on_tool_error(
        self,
        conversation: ConversationLike,
        run_id: str,
        call: ToolCall,
        error: ToolResult,
        attempt: int,
        emit: Emit | None = None,
    ) -> Retry | Abort | None:
        """The first :class:`Retry` or :class:`Abort` a plugin decided, or ``None``
        (the error stands)."""
        if not self.implemented("on_tool_error"):
            return None
        args: dict[str, Any] = {
            "conversation": conversation,
            "run_id": run_id,
            "call": call,
            "error": error,
            "attempt": attempt,
            "emit": emit or _no_turn,
        }
        # The first Retry or Abort decides; anything else leaves the error standing.
        async for plugin, result in self.each("on_tool_error", args):
            if isinstance(result, Retry):
                log.info("plugin %r retries tool %s (attempt %d)", plugin, call.name, attempt + 1)
                return result
            if isinstance(result, Abort):
                log.info("run %s aborted by plugin %r: %s", run_id, plugin, result.reason)
                return result
            log.warning("plugin %r: on_tool_error returned %r; ignored", plugin, result)
        return None

    async def before_compact(
        self, conversation: ConversationLike, messages: Sequence[ChatMessage], reason: str
    ) -> None:
        """Show the plugins the working-memory ``messages`` about to be replaced."""
        if self.implemented("before_compact"):
            await self.call(
                "before_compact", conversation=conversation, messages=list(messages), reason=reason
            )

    async def session_start(self, conversation: ConversationLike) -> None:
        """Tell the plugins a conversation was created."""
        if self.implemented("session_start"):
            await self.call("session_start", conversation=conversation)

    async def session_end(self, conversation: ConversationLike, reason: str) -> None:
        """Tell the plugins a conversation ended (``reset``, ``deleted`` or ``closed``)."""
        if self.implemented("session_end"):
            await self.call("session_end", conversation=conversation, reason=reason)


def _no_turn(cls: Any, **fields: Any) -> None:
    """The ``emit`` of a hook called outside a turn: there is no stream to emit in."""
    raise PluginError(f"cannot emit {getattr(cls, '__name__', cls)!r} here: no turn is running")


# What each rewriting result replaces (see ``_chain``); ``None``: the wrong type.
def _new_text(result: object, args: dict[str, Any]) -> dict[str, Any] | None:
    return {"text": result} if isinstance(result, str) else None


def _new_request(result: object, args: dict[str, Any]) -> dict[str, Any] | None:
    if isinstance(result, UseBackend):
        if result.request is None:
            return {"backend": result.backend}
        return {"backend": result.backend, "request": result.request}
    return {"request": result} if isinstance(result, LLMRequest) else None


def _new_arguments(result: object, args: dict[str, Any]) -> dict[str, Any] | None:
    if not isinstance(result, dict):
        return None
    arguments = json.dumps(result, ensure_ascii=False)
    return {"call": dataclasses.replace(args["call"], arguments=arguments)}


def _new_result(result: object, args: dict[str, Any]) -> dict[str, Any] | None:
    if isinstance(result, str):
        return {"result": ToolResult(text=result)}
    return {"result": result} if isinstance(result, ToolResult) else None
