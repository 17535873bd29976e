"""agentik.core — the transport-agnostic agent.

Public API (everything a transport, a plugin or a library user needs)::

    from agentik.core import Agent, SQLiteStore, OpenAIBackend, tool

    async with Agent(llm=OpenAIBackend(model="..."), store=SQLiteStore("bot.db")) as agent:
        conv = await agent.conversation_for_channel("stdio:local")
        async for event in conv.events(profile="chat"):
            ...

No chat-protocol code lives here; ``agentik.transports`` and ``agentik.bot``
build on this package, never the other way round.
"""

import gc as _gc
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from .dataclasscode import dataclass_code_cached as _dataclass_code_cached

# The collector would walk the objects of these imports again and again while they
# load, finding nothing to collect (agentik.bot.gcpause tells more); restored as it was.
# Their dataclasses' methods are compiled once, not at every start (.dataclasscode).
_collecting = _gc.isenabled()
_gc.disable()
_code_cached = _dataclass_code_cached()
_code_cached.__enter__()
try:
    from .agent import Agent, AgentState
    from .conversation import Capabilities, Conversation, ConversationState
    from .errors import (
        AgentikError,
        ClosedError,
        ConfigError,
        ContextTooLong,
        LLMConnectionError,
        LLMError,
        LLMResponseError,
        LLMStatusError,
        LLMTimeout,
        MigrationError,
        NotFound,
        PluginError,
        StoreError,
        ToolError,
    )
    from .eventbus import Subscription
    from .events import (
        ChildRunLinked,
        Error,
        Event,
        EventsLost,
        Interrupted,
        ReasoningDelta,
        ReasoningStarted,
        ResponseStarted,
        TextDelta,
        ToolCallEnded,
        ToolCallStarted,
        TurnEnded,
        TurnStarted,
        event_from_dict,
        event_from_json,
        event_to_dict,
        event_to_json,
    )
    from .hookspecs import hookimpl
    from .llm.base import LLMBackend, LLMRequest, ToolSpec
    from .llm.openai_backend import OpenAIBackend
    from .messages import ChatMessage, Message, ToolCall, Usage
    from .plugins import Registry, load_plugins
    from .store.base import ConversationRecord, Store
    from .store.sqlite import SQLiteStore
    from .streamprofiles import PROFILES
    from .tools.base import FunctionTool, Tool, ToolContext, ToolResult, TurnPolicy, tool
    from .turnsettings import TurnOrigin, TurnSettings
finally:
    _code_cached.__exit__(None, None, None)
    if _collecting:
        _gc.enable()

if _TYPE_CHECKING:
    from .store.memory import MemoryStore


def __getattr__(name: str) -> _Any:
    """``MemoryStore``, imported on first use: a bot on SQLite never loads the in-memory
    store's modules (0.4 MB)."""
    if name == "MemoryStore":
        with _dataclass_code_cached():
            from .store.memory import MemoryStore

        return MemoryStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "PROFILES",
    "Agent",
    "AgentState",
    "AgentikError",
    "Capabilities",
    "ChatMessage",
    "ChildRunLinked",
    "ClosedError",
    "ConfigError",
    "ContextTooLong",
    "Conversation",
    "ConversationRecord",
    "ConversationState",
    "Error",
    "Event",
    "EventsLost",
    "FunctionTool",
    "Interrupted",
    "LLMBackend",
    "LLMConnectionError",
    "LLMError",
    "LLMRequest",
    "LLMResponseError",
    "LLMStatusError",
    "LLMTimeout",
    "MemoryStore",
    "Message",
    "MigrationError",
    "NotFound",
    "OpenAIBackend",
    "PluginError",
    "ReasoningDelta",
    "ReasoningStarted",
    "Registry",
    "ResponseStarted",
    "SQLiteStore",
    "Store",
    "StoreError",
    "Subscription",
    "TextDelta",
    "Tool",
    "ToolCall",
    "ToolCallEnded",
    "ToolCallStarted",
    "ToolContext",
    "ToolError",
    "ToolResult",
    "ToolSpec",
    "TurnEnded",
    "TurnOrigin",
    "TurnPolicy",
    "TurnSettings",
    "TurnStarted",
    "Usage",
    "event_from_dict",
    "event_from_json",
    "event_to_dict",
    "event_to_json",
    "hookimpl",
    "load_plugins",
    "tool",
]
