"""The run tree and the settings of named agents: what turns, the services and the agent share.

Every run — a top-level turn or a child run of an agent called as a tool —
is a :class:`RunNode` in its agent's :class:`Runs` while it runs;
:class:`RunPolicy` (``[runs]``) and each :class:`AgentSpec`
(``[agents.<name>]``) bound them.  :mod:`agentik.core.agents` explains the
tree, its limits and its durability, and holds :class:`~agentik.core.agents.AgentTool`,
which starts child runs (it makes child conversations, so it sits above the
conversation); these names sit below the conversation, its turns and the
services, which use them.  Import them from :mod:`agentik.core.agents` (their
documented home, which re-exports them) or from here.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import Field, field_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass

from .events import TurnEnded
from .messages import Usage
from .settings import OVERLAY_SETTINGS, SETTINGS, Blank, PathSetting, overlay, settings_dataclass
from .tools.base import TurnLimits
from .turnsettings import TurnOrigin, TurnSettings

__all__ = [
    "AGENT_NAME",
    "AGENT_TOOL_PREFIX",
    "DEFAULT_INPUT_SCHEMA",
    "AgentPrompt",
    "AgentSpec",
    "AgentUses",
    "RunLimits",
    "RunNode",
    "RunPolicy",
    "Runs",
    "RunsOwner",
    "agent_tool_name",
    "new_run_id",
]

#: The tool of agent ``x`` is named ``agent__x``.
AGENT_TOOL_PREFIX = "agent__"

#: An agent's input when it declares none: one task, in words.
DEFAULT_INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"task": {"type": "string", "description": "What the agent should do."}},
    "required": ["task"],
}

#: An agent's name: what ``uses`` lists and ``agent__<name>`` carries.
AGENT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,47}")


def agent_tool_name(name: str) -> str:
    return f"{AGENT_TOOL_PREFIX}{name}"


def new_run_id() -> str:
    """A fresh run id (``run_`` and 20 hex digits)."""
    return f"run_{uuid.uuid4().hex[:20]}"


# Knobs (settings a named agent may set for its own runs; see agentik.core.settings):
# pydantic dataclasses without slots, spelled out so type checkers see the constructor.
@pydantic_dataclass(frozen=True, kw_only=True, config=SETTINGS)
class RunLimits:
    """The limits of a run that a named agent may set for its own runs
    (``[agents.<name>]``; :class:`RunPolicy` explains them)."""

    #: Child runs one run may have going at once; more wait for a free slot.
    max_concurrent_children: int = Field(default=4, ge=1)
    #: Tokens (prompt + completion) one turn may use, its child runs included (0: no limit).
    token_budget: int = Field(default=0, ge=0)


@pydantic_dataclass(frozen=True, kw_only=True, config=SETTINGS)
class AgentUses:
    """The named agents an agent may call, each as the tool ``agent__<name>``
    (``[agent] uses`` for the main agent, ``[agents.<name>] uses``)."""

    uses: tuple[str, ...] = ()


@pydantic_dataclass(frozen=True, kw_only=True, config=SETTINGS)
class AgentPrompt:
    """An agent's system prompt (``[agent] system_prompt``; a named agent's
    own, ``[agents.<name>] system_prompt``, replaces it for its runs)."""

    system_prompt: str = "You are a helpful assistant in a chat. Answer briefly and plainly."


@settings_dataclass
class RunPolicy(RunLimits):
    """``[runs]``: limits of a run tree (a top-level turn and the child runs it starts).

    ``max_depth``: how deep child runs may nest (a turn is depth 0, the agent
    it calls depth 1, …); at the limit, agent tools are not offered and a
    call is refused.  ``max_concurrent_children``: child runs one run has
    going at once (more wait).  ``token_budget``: tokens (prompt +
    completion) one top-level turn may use, its child runs included (0: no
    limit); ``tree_token_budget``: all runs of one tree together (0: no
    limit).  A run that finds a budget used up stops with ``stop_reason =
    "token_budget"``.
    """

    #: How deep agent calls may nest: a turn is depth 0, an agent it calls depth 1.
    max_depth: int = Field(2, ge=0, le=16)
    #: Tokens all runs of one tree may use together (0: no limit).
    tree_token_budget: int = Field(0, ge=0)


# settings_dataclass spelled out, so type checkers see the keyword constructor.
@pydantic_dataclass(frozen=True, kw_only=True, slots=True, config=OVERLAY_SETTINGS)
class AgentSpec(TurnLimits, RunLimits, AgentUses, AgentPrompt):
    """``[agents.<name>]``: a named agent that other agents call as the tool ``agent__<name>``.

    ``description`` is what the calling model reads about it.
    ``system_prompt`` replaces the main agent's system prompt for its runs;
    ``soul``: a file (relative to the configuration file) appended to it.
    ``model``: a model profile (``[llm.profiles.<name>]``; unset: the main
    model).  ``tools``: names or glob patterns of the tools it may use, over
    every tool the bot has (MCP tools as ``<server>__<tool>``; empty: none).
    ``memory``: ``caller`` — its memory tools (if ``tools`` allows them) act
    for the speaker and channel that started the tree; ``none`` — it gets no
    memory tools.  ``uses``: the agents it may call itself.
    ``input_schema``: the JSON-Schema of its tool's arguments (default
    ``{"task": string}``; with another schema the child gets the arguments
    as JSON).  ``result_schema``: a JSON Schema its answer must match (inline,
    or a ``.json`` file relative to the configuration file): the child is told
    to answer with JSON matching it, the parent's tool result is that JSON
    (validated; ``data["result"]`` the value), and an answer that does not
    match gets one repair request, then the call is a tool error.
    ``max_tool_calls``, ``time_budget``: its own turn limits
    (unset: the caller's); the time budget never reaches past the caller's.
    ``token_budget``: tokens its run may use (0: no own limit; the tree's
    budget still applies).  ``max_concurrent_children``: unset, the ``[runs]`` value.
    ``url``: the agent runs in another agentik, driven over its HTTP API
    (:class:`~agentik.core.client.RemoteAgentTool`; ``token_env`` names the
    environment variable of its token); the keys about how it runs here
    (``system_prompt``, ``model``, ``tools``, …) are then that bot's own.
    ``a2a_url``: the same for an agent reached over the agent-to-agent protocol
    (:class:`~agentik.core.client.a2a.A2AAgentTool`, the ``a2a`` extra).
    """

    #: What the calling model reads about this agent (its tool's description).
    description: str = ""
    #: A file (relative to the configuration file) appended to its system prompt.
    soul: PathSetting = None
    #: A model profile ([llm.profiles.<name>]); unset: the caller's model.
    model: Blank = None
    #: Names or glob patterns of the tools it may use (MCP tools are <server>__<tool>).
    tools: tuple[str, ...] = ()
    #: "caller": its memory tools act for the speaker and channel that asked;
    #: "none": it gets no memory tools.
    memory: Literal["caller", "none"] = "caller"
    #: JSON-Schema of its tool's arguments (unset: {"task": string}).
    input_schema: dict[str, Any] | None = None
    #: Another agentik's HTTP API (http://host:port): the agent runs there, as a turn
    #: of that bot; unset, it runs in this process.
    url: Blank = None
    #: The environment variable holding the remote API's token (with url; never the
    #: token itself; unset: no token).
    token_env: Blank = None
    #: The remote API's prefix (with url).
    url_prefix: str = "/agentik"
    #: An agent-to-agent protocol (A2A v1.0) agent's base URL (its card at
    #: <a2a_url>/.well-known/agent-card.json): the agent runs there, any A2A server
    #: (token from token_env); not with url.
    a2a_url: Blank = None
    #: JSON Schema its answer must match, inline or a .json file (relative to the
    #: configuration file); unset: it answers in text.
    result_schema: dict[str, Any] | str | None = None

    @field_validator("result_schema")
    @classmethod
    def _valid_schema(cls, value: dict[str, Any] | str | None) -> dict[str, Any] | str | None:
        if isinstance(value, dict):
            check_schema(value)
        elif isinstance(value, str) and not value.strip():
            return None
        return value

    @property
    def schema(self) -> dict[str, Any]:
        return self.input_schema if self.input_schema is not None else DEFAULT_INPUT_SCHEMA


def check_schema(schema: Any) -> None:
    """Raise ``ValueError`` (saying what is wrong) unless ``schema`` is a JSON Schema."""
    import jsonschema  # type: ignore[import-untyped]  # only a bot with a result schema

    if not isinstance(schema, dict):
        raise ValueError("a JSON Schema is a table (a JSON object)")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "the top"
        raise ValueError(f"not a valid JSON Schema (at {where}): {exc.message}") from None


#: What the keys :class:`AgentSpec` inherits mean for a named agent (the
#: configuration reference shows these); type and limits are their knobs'.
_AGENT_DOCS = {
    "system_prompt": "Its system prompt (unset: the bot's [agent] system_prompt).",
    "uses": "Agents it may call itself (within [runs] max_depth).",
    "max_tool_calls": "Tool calls one of its runs may make (unset: the caller's).",
    "time_budget": "Seconds one of its runs may take (unset: the caller's; never past the"
    " caller's deadline).",
    "token_budget": "Tokens one of its runs may use (0: no limit of its own; [runs] still"
    " applies).",
    "max_concurrent_children": "Its child runs that may run at once (unset: [runs]"
    " max_concurrent_children).",
}
# Unset (``None``): the caller's, or the bot's [agent] and [runs] values; ``uses``
# and ``token_budget`` keep their knobs' defaults (none; 0, no limit of its own).
overlay(
    AgentSpec,
    keys=("system_prompt", "max_tool_calls", "time_budget", "max_concurrent_children"),
    docs=_AGENT_DOCS,
)


@dataclass(eq=False)
class RunNode:
    """One run of the tree while it runs (see the module docstring)."""

    run_id: str
    conversation_id: str
    #: The agent of this run (``None``: the main agent).
    agent: str | None = None
    parent: RunNode | None = None
    depth: int = 0
    #: Tokens this run may use, its children's included (0: no limit).
    token_budget: int = 0
    #: Set on the root: the whole tree's budget (0: no limit).
    tree_token_budget: int = 0
    max_concurrent_children: int = 4
    #: The parent's tool call this run answers.
    call_id: str | None = None
    #: Usage of this run and its finished/running children.
    usage: Usage = field(default_factory=Usage)
    #: Child runs waiting for a free slot.
    waiting: int = 0
    #: Children started so far (running or done).
    children: list[RunNode] = field(default_factory=list)
    #: What the runner knows about the turn (set by the turn runner).
    allow_tool: Callable[[str], bool] | None = None
    author: str | None = None
    author_id: str | None = None
    channel: str | None = None
    #: The settings the run's turn runs with (set by the turn runner; a child's
    #: are built from its spec and these, never from a conversation's attributes).
    settings: TurnSettings | None = None
    #: Where the run came from (its settings' origin, else its message's; a child
    #: run: its parent's).
    origin: TurnOrigin | None = None
    #: Seconds on the loop clock when the run's time budget ends (``None``: unknown).
    deadline: float | None = None
    #: Set when the run's ``turn_ended`` is emitted.
    ended: asyncio.Future[TurnEnded] | None = None
    #: A child run's last write (its answer and end), handed to its parent to
    #: commit with the parent's tool result (set by the turn runner).
    final_write: asyncio.Future[Any] | None = None
    #: Part of a run tree with children: recorded in the store's ``run`` table when it ends.
    stored: bool = False
    #: When it started (``time.time()``).
    started: float = field(default_factory=time.time)
    _slots: asyncio.Semaphore | None = None

    @property
    def root(self) -> RunNode:
        node = self
        while node.parent is not None:
            node = node.parent
        return node

    @property
    def slots(self) -> asyncio.Semaphore:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_concurrent_children)
        return self._slots

    def add_usage(self, usage: Usage) -> None:
        """Count ``usage`` for this run and every ancestor."""
        node: RunNode | None = self
        while node is not None:
            node.usage = node.usage + usage
            node = node.parent

    def over_budget(self) -> bool:
        """Whether this run, an ancestor, or the tree used up a token budget."""
        node: RunNode | None = self
        while node is not None:
            if node.token_budget and _tokens(node.usage) >= node.token_budget:
                return True
            if node.parent is None and node.tree_token_budget:
                return _tokens(node.usage) >= node.tree_token_budget
            node = node.parent
        return False


def _tokens(usage: Usage) -> int:
    return usage.total_tokens or (usage.prompt_tokens + usage.completion_tokens)


class RunsOwner(Protocol):
    """What :class:`Runs` reads of its agent (an
    :class:`~agentik.core.services.AgentLike`; the services are above the run tree)."""

    @property
    def run_policy(self) -> RunPolicy: ...
    @property
    def uses(self) -> tuple[str, ...]: ...
    @property
    def agents(self) -> dict[str, AgentSpec]: ...


class Runs:
    """The runs of one agent while they run, by run id."""

    def __init__(self, agent: RunsOwner) -> None:
        self.agent = agent
        self._nodes: dict[str, RunNode] = {}

    def get(self, run_id: str | None) -> RunNode | None:
        return self._nodes.get(run_id or "")

    def __len__(self) -> int:
        return len(self._nodes)

    def enter(self, run_id: str, conversation_id: str) -> RunNode:
        """The node of a run about to start: a child's (made by its :class:`AgentTool`)
        or a new root for a top-level turn."""
        node = self._nodes.get(run_id)
        if node is None:
            policy = self.agent.run_policy
            node = RunNode(
                run_id,
                conversation_id,
                token_budget=policy.token_budget,
                tree_token_budget=policy.tree_token_budget,
                max_concurrent_children=policy.max_concurrent_children,
            )
            self._nodes[run_id] = node
        return node

    def add(self, node: RunNode) -> None:
        self._nodes[node.run_id] = node

    def leave(self, run_id: str) -> None:
        self._nodes.pop(run_id, None)

    def at_depth_limit(self, node: RunNode) -> bool:
        return node.depth >= self.agent.run_policy.max_depth

    def uses(self, node: RunNode) -> tuple[str, ...]:
        """The agents ``node``'s agent may call (at the depth limit they are not
        offered to the model, and a call is refused)."""
        if node.agent is None:
            return self.agent.uses
        spec = self.agent.agents.get(node.agent)
        return spec.uses if spec is not None else ()
