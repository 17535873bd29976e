"""Agents as tools: named agents, child runs and the run tree.

A configuration (``[agents.<name>]``) or a plugin (the ``register_agents``
hook) declares named agents, each an :class:`AgentSpec`: a description, its
own system prompt, a model profile, an allow-list of the tools it may use,
the agents it may call itself (``uses``), an input schema and its run
limits.  The main agent calls the agents it ``uses`` (``[agent] uses``).

Each used agent is offered to the model as the tool ``agent__<name>``
(:class:`AgentTool`).  Calling it starts a **child run**: a new conversation
of its own (its own working memory; no channel binding), linked to the
parent conversation, the parent run and the parent's tool call.  The child's
final answer is the tool's result; a child that fails, is stopped or runs
out of a budget gives the parent an error result (the parent's turn goes on).

Every run — top-level turns and child runs alike — is a :class:`RunNode` in
the agent's :class:`Runs` while it runs.  Nodes carry the limits that are
inherited and bounded down the tree (:class:`RunPolicy`):

* ``max_depth``: how deep child runs nest (a top-level turn is depth 0);
* ``max_concurrent_children``: a run's child runs that run at once (more
  wait for a free slot);
* ``token_budget``: tokens (prompt + completion) one run may use, its
  children's included; ``tree_token_budget``: all runs of one tree together.
  A child's usage counts for every ancestor.  When a budget is used up the
  run that notices stops with ``stop_reason = "token_budget"`` (a child that
  exhausts the tree's budget stops, and so does its parent, before its next
  model request);
* the time budget: a child's deadline is never later than its parent's.

Durability: a child conversation is internal (nobody types into it) and
its run is part of its parent's turn: a crash mid-child loses nothing a user
sent, because the parent's turn (whose user message is committed) is taken
up again, never the child's (it runs the child again).  So:

* a child conversation is not committed before its first message: its row
  and its task message are written in one transaction
  (:meth:`Store.create_conversation_with`), unless a plugin implements
  ``session_start`` or ``before_prompt`` (they may write to it first: then
  it is created at once).  That write is deferred: the child's turn starts
  without waiting for it, and it commits with the child's next write (its
  first tool call) or — a child that answers at once — with the child's end
  and the parent's tool result, all in one transaction (at the latest after
  ``DEFER_MAX``).  Until that commit a reader of the store does not see the
  child conversation (the live object is found by id), and the child's
  ``turn_started`` has no ``message_id``;
* while its run runs, the child conversation is *internal* in the store
  (:meth:`Store.set_internal`): with SQLite's ``synchronous = "full"`` its
  commits skip their own fsync.  They are committed (a killed process loses
  nothing) and become power-loss durable with the next full commit — at the
  latest the parent's tool result, which follows the child's end.  A power
  loss before that loses the child's rows along with the parent's pending
  tool result, and the resumed parent turn runs the child again.  A batch
  that holds any other write commits in full, as before;
* a child's last write (its answer, its turn's end and its run row) is
  handed to the parent (:attr:`RunNode.final_write`): it is queued deferred
  (``Store.append(defer=True)``) and commits in the transaction of the
  parent's tool result that follows it.  So ``turn_ended`` of a child is
  emitted before its answer is committed (a reader may not find the answer
  for those few milliseconds); a crash in between loses both, as above.

Events: a child conversation's events carry the child's ``run_id`` and its
``parent_run_id``.  They are emitted in the child conversation's own stream
and *relayed* into the parent conversation's stream (renumbered with the
parent's ``conversation_id`` and ``seq``, so the parent's subscribers — SSE,
the bridge — see the whole tree in order), except ``status_changed`` (a
child conversation's state is its own; meanwhile the parent's status is
``executing_tools`` with the agent tool running); the agent-wide stream
carries each event once (the child's own).  The parent emits ``child_run_linked``
(``call_id``, ``child_run_id``, ``agent``, ``child_conversation_id``) when a
child starts, and every run ends its stream with ``run_stream_end``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field
from pydantic.dataclasses import dataclass as pydantic_dataclass

from .events import ChildRunLinked, TurnEnded
from .messages import Usage
from .settings import SETTINGS, Blank, PathSetting, overlay, settings_dataclass
from .tools.base import ToolContext, ToolResult, TurnLimits, TurnPolicy
from .turnsettings import DEFAULT_SETTINGS, TurnOrigin, TurnSettings

if TYPE_CHECKING:
    from .conversation import Conversation
    from .services import AgentLike

__all__ = [
    "AGENT_TOOL_PREFIX",
    "DEFAULT_INPUT_SCHEMA",
    "AgentPrompt",
    "AgentSpec",
    "AgentTool",
    "AgentUses",
    "RunLimits",
    "RunNode",
    "RunPolicy",
    "Runs",
    "agent_tool_name",
    "new_run_id",
]

log = logging.getLogger(__name__)

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
@pydantic_dataclass(frozen=True, kw_only=True, slots=True, config=SETTINGS)
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
    as JSON).  ``max_tool_calls``, ``time_budget``: its own turn limits
    (unset: the caller's); the time budget never reaches past the caller's.
    ``token_budget``: tokens its run may use (0: no own limit; the tree's
    budget still applies).  ``max_concurrent_children``: unset, the ``[runs]`` value.
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

    @property
    def schema(self) -> dict[str, Any]:
        return self.input_schema if self.input_schema is not None else DEFAULT_INPUT_SCHEMA


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


class Runs:
    """The runs of one agent while they run, by run id."""

    def __init__(self, agent: AgentLike) -> None:
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


class AgentTool:
    """The tool ``agent__<name>``: calling it runs agent ``name`` as a child run."""

    def __init__(self, agent: AgentLike, name: str, spec: AgentSpec) -> None:
        self.agent = agent
        self.agent_name = name
        self.spec = spec
        self.name = agent_tool_name(name)
        self.description = spec.description or f"Ask the {name} agent to do a task."
        self.parameters = spec.schema
        # The last child policy made, by the policy and time budget it came from:
        # child runs of one parent policy share it (and its warm ``allows`` cache)
        # instead of validating a new one each run.
        self._policy: tuple[TurnPolicy, float, TurnPolicy] | None = None

    def __repr__(self) -> str:
        return f"AgentTool({self.agent_name!r})"

    def _task(self, arguments: dict[str, Any]) -> str:
        if self.spec.input_schema is None:
            task = arguments.get("task")
            if isinstance(task, str) and task.strip():
                return task
            raise ValueError('give the task as {"task": "..."}')
        return json.dumps(arguments, ensure_ascii=False)

    async def call(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        agent, runs = self.agent, self.agent.runs
        parent = runs.get(context.run_id)
        if parent is None:
            return ToolResult(
                text=f"error: {self.name} can only be called in a turn", is_error=True
            )
        try:
            task = self._task(arguments)
        except ValueError as exc:
            return ToolResult(text=f"error: {exc}", is_error=True)
        max_depth = agent.run_policy.max_depth
        if runs.at_depth_limit(parent) or self.agent_name not in runs.uses(parent):
            why = (
                f"the run depth limit ({max_depth}) is reached"
                if parent.depth >= max_depth
                else f"this agent may not call {self.agent_name}"
            )
            await agent.store_run_refused(parent, self.agent_name, context.call_id, "depth_limit")
            return ToolResult(text=f"error: not run: {why}", is_error=True)
        parent.waiting += 1
        try:
            await parent.slots.acquire()
        finally:
            parent.waiting -= 1
        try:
            return await self._run_child(parent, task, context)
        finally:
            parent.slots.release()

    async def _run_child(self, parent: RunNode, task: str, context: ToolContext) -> ToolResult:
        agent, spec = self.agent, self.spec
        parent_conv = await agent.get_conversation(parent.conversation_id)
        run_id = new_run_id()
        policy = agent.run_policy
        node = RunNode(
            run_id,
            "",
            agent=self.agent_name,
            parent=parent,
            depth=parent.depth + 1,
            token_budget=spec.token_budget,
            max_concurrent_children=spec.max_concurrent_children or policy.max_concurrent_children,
            call_id=context.call_id,
            author=parent.author,
            author_id=parent.author_id if spec.memory == "caller" else None,
            channel=parent.channel,
        )
        node.ended = asyncio.get_running_loop().create_future()
        child = await agent.create_child_conversation(
            title=f"{self.agent_name}: {task[:60]}",
            temp=parent_conv.temp,
            meta={
                "agent": self.agent_name,
                "run_id": run_id,
                "parent_run_id": parent.run_id,
                "parent_conversation_id": parent.conversation_id,
                "parent_call_id": context.call_id,
                # Where the tree started (a child has no channel of its own):
                # who may see the parent may see the child.
                "parent_channel_key": parent_conv.channel_key
                or parent_conv.meta.get("parent_channel_key"),
            },
        )
        node.conversation_id = child.id
        settings = self._configure(child, parent, node)
        child.link(parent_run_id=parent.run_id, relay_to=parent_conv.parts.events)
        agent.runs.add(node)
        parent.children.append(node)
        try:
            agent.run_started(node)
            parent_conv.parts.events.emit(
                ChildRunLinked,
                parent.run_id,
                parent_run_id=parent.parent.run_id if parent.parent else None,
                call_id=context.call_id,
                child_run_id=run_id,
                agent=self.agent_name,
                child_conversation_id=child.id,
            )
            await child.send(
                task,
                author=parent.author,
                author_id=node.author_id,
                allow_tool=node.allow_tool or parent.allow_tool,
                run_id=run_id,
                settings=settings,
            )
            try:
                ended = await asyncio.shield(node.ended)
            except asyncio.CancelledError:
                # The parent was stopped: so is the child (its partial answer is kept).
                await asyncio.shield(self._stop(child))
                raise
        finally:
            agent.runs.leave(run_id)
            agent.child_run_done(child)
        if node.final_write is not None:
            node.final_write.add_done_callback(self._final_written)
        return self._result(ended)

    def _final_written(self, fut: asyncio.Future[Any]) -> None:
        error = None if fut.cancelled() else fut.exception()
        if error is not None:
            log.error("agent %s: could not record the end of its run: %s", self.agent_name, error)

    @staticmethod
    async def _stop(child: Conversation) -> None:
        if not await child.interrupt():
            await child.aclose()  # not started yet: it never will

    def _configure(self, child: Conversation, parent: RunNode, node: RunNode) -> TurnSettings:
        """The child's turn settings, from its spec and the parent TURN's settings
        (not its conversation's: another front end may use that meanwhile)."""
        spec, agent = self.spec, self.agent
        given = parent.settings or DEFAULT_SETTINGS
        base = given.policy or agent.policy
        # A child run is a tool call of its parent: the parent's tool timeout
        # and the parent's own deadline bound it too.
        time_budget = min(spec.time_budget or base.time_budget, base.tool_timeout)
        if node.parent is not None and node.parent.deadline is not None:
            left = node.parent.deadline - asyncio.get_running_loop().time()
            time_budget = max(0.001, min(time_budget, left))
        cached = self._policy
        policy: TurnPolicy
        if cached is not None and cached[0] is base and cached[1] == time_budget:
            policy = cached[2]
        else:
            allowed = [*spec.tools, *(agent_tool_name(u) for u in spec.uses)]
            policy = dataclasses.replace(  # type: ignore[type-var]
                base,
                max_tool_calls=base.max_tool_calls
                if spec.max_tool_calls is None
                else spec.max_tool_calls,
                time_budget=time_budget,
                allowed_tools=tuple(allowed),
            )
            self._policy = (base, time_budget, policy)
        settings = TurnSettings(
            policy=policy,
            llm_profile=spec.model if spec.model is not None else given.llm_profile,
            # Unset: the main agent's system prompt (read at each request).
            system_prompt=agent.agent_prompts.get(self.agent_name),
            # Who and where the tree started: the child acts for them.
            origin=parent.origin,
        )
        # The caller's channel (not bound): its tools act for the channel the tree started in.
        child.channel_key = node.channel if spec.memory == "caller" else None
        if spec.memory == "none":
            names = {t.name for t in agent.memory.tools()}
            outer = node.parent.allow_tool if node.parent is not None else None

            def allow(name: str) -> bool:
                return name not in names and (outer is None or outer(name))

            node.allow_tool = allow
        return settings

    def _result(self, ended: TurnEnded) -> ToolResult:
        data = {
            "run_id": ended.run_id,
            "agent": self.agent_name,
            "stop_reason": ended.stop_reason,
            "usage": ended.usage.to_dict(),
        }
        if ended.stop_reason in ("stop", "length"):
            return ToolResult(text=ended.text, data=data)
        what = {
            "error": "failed",
            "interrupted": "was interrupted",
            "time_budget": "ran out of time",
            "token_budget": "ran out of its token budget",
            "tool_limit": "used up its tool calls",
            "aborted": "was stopped by a plugin",
        }.get(ended.stop_reason, f"stopped ({ended.stop_reason})")
        text = f"error: agent {self.agent_name} {what}"
        if ended.text:
            text += f"; its partial answer: {ended.text}"
        return ToolResult(text=text, data=data, is_error=True)
