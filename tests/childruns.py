"""A stand-in sub-agent for tests of rendering and profiles: a tool named like an
agent tool (``agent__<name>``) that, when the model calls it, emits what a child
run emits into the parent conversation's stream — ``child_run_linked`` on the
parent run, then the child's own events with ``parent_run_id`` set — using only
the event classes, and returns the child's answer as the tool result."""

from __future__ import annotations

from typing import Any

from agentik.core import Agent, tool
from agentik.core.events import (
    ChildRunLinked,
    ResponseStarted,
    TextDelta,
    ToolCallEnded,
    ToolCallStarted,
    TurnEnded,
    TurnStarted,
)
from agentik.core.tools.base import ToolContext

#: What the child "says": it must never reach a channel in the chat profile.
CHILD_TEXT = "CHILD-ONLY draft: release 2.0 shipped on Monday"
CHILD_ANSWER = "release 2.0 shipped on Monday"


def child_agent_tool(agent: Agent, name: str = "researcher") -> Any:
    """The ``agent__<name>`` tool; takes ``{"task": str}``."""

    async def run_child(task: str, context: ToolContext) -> str:
        conv = await agent.get_conversation(context.conversation_id)
        emit = conv.parts.events.emit
        child, parent = f"{context.run_id}-child", context.run_id
        emit(ChildRunLinked, parent, child_run_id=child, call_id=context.call_id, agent=name)
        emit(TurnStarted, child, parent_run_id=parent, author=name)
        emit(ToolCallStarted, child, parent_run_id=parent, call_id="c1", name="fetch",
             arguments='{"url": "https://example.org/notes"}')  # fmt: skip
        emit(ToolCallEnded, child, parent_run_id=parent, call_id="c1", name="fetch",
             result="notes…", duration=0.01)  # fmt: skip
        emit(ResponseStarted, child, parent_run_id=parent)
        for piece in (CHILD_TEXT[:20], CHILD_TEXT[20:], "\nsecond line of the child"):
            emit(TextDelta, child, parent_run_id=parent, text=piece)
        emit(TurnEnded, child, parent_run_id=parent, text=CHILD_TEXT)
        return CHILD_ANSWER

    return tool(
        run_child,
        name=f"agent__{name}",
        description=f"Ask the {name} agent",
        parameters={
            "type": "object",
            "properties": {"task": {"type": "string"}},
            "required": ["task"],
        },
    )
