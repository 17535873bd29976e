"""A real sub-agent for tests of rendering and profiles: ``[agents.researcher]``,
used by the main agent (so its model is offered ``agent__researcher``), running
on a scripted model of its own (the model profile ``researcher``).

When the parent calls it, the child run fetches a page with its ``fetch`` tool,
streams a draft (:data:`CHILD_TEXT`, two lines) while it fetches one more page,
then answers :data:`CHILD_ANSWER` — which becomes the parent's tool result.
Its events reach the parent conversation's subscribers with ``parent_run_id``
set, after the parent's ``child_run_linked``."""

from __future__ import annotations

from typing import Any

from agentik.core import tool
from agentik.core.agents import AgentSpec
from agentik.core.testing.scripted import Reply, ScriptedModel, call

#: What the child "says" while it works: it must never reach a channel in the chat profile.
CHILD_TEXT = "CHILD-ONLY draft: release 2.0 shipped on Monday"
CHILD_SECOND_LINE = "second line of the child"
#: The child's final answer: the parent's tool result.
CHILD_ANSWER = "release 2.0 shipped on Monday"

RESEARCHER = AgentSpec(
    description="Looks things up.",
    system_prompt="You are the researcher. Use fetch.",
    model="researcher",
    tools=("fetch",),
)


@tool(
    description="Fetch a web page",
    parameters={"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]},
)
async def fetch(url: str) -> str:
    return f"notes of {url}: 2.0 shipped on Monday"


def script_researcher(child: ScriptedModel) -> None:
    """Queue one child run on ``child``: fetch, a streamed two-line draft, the answer."""
    child.enqueue(
        Reply(tool_calls=[call("fetch", {"url": "https://example.org/notes"}, id="c1")]),
        Reply(
            chunks=[CHILD_TEXT[:20], CHILD_TEXT[20:], f"\n{CHILD_SECOND_LINE}"],
            tool_calls=[call("fetch", {"url": "https://example.org/notes/2.0"}, id="c2")],
        ),
        Reply(text=CHILD_ANSWER),
    )


def with_researcher(child: ScriptedModel, **agent_kwargs: Any) -> dict[str, Any]:
    """``Agent`` keyword arguments adding the researcher (scripted for one run on ``child``)."""
    script_researcher(child)
    return {
        **agent_kwargs,
        "agents": {"researcher": RESEARCHER},
        "uses": ("researcher",),
        "profiles": {"researcher": child},
        "tools": [fetch, *agent_kwargs.get("tools", ())],
    }
