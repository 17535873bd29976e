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
from typing import TYPE_CHECKING, Any

from .events import ChildRunLinked, TurnEnded
from .runs import AGENT_NAME as AGENT_NAME
from .runs import (
    AGENT_TOOL_PREFIX,
    DEFAULT_INPUT_SCHEMA,
    AgentPrompt,
    AgentSpec,
    AgentUses,
    RunLimits,
    RunNode,
    RunPolicy,
    Runs,
    agent_tool_name,
    new_run_id,
)
from .tools.base import ToolContext, ToolResult, TurnPolicy
from .turnsettings import DEFAULT_SETTINGS, TurnSettings

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

# The run tree and the named agents' settings live in core/runs.py (below the
# conversation, its turns and the services, which use them); this module, their
# documented home, re-exports them: the same objects.


class AgentTool:
    """The tool ``agent__<name>``: calling it runs agent ``name`` as a child run."""

    def __init__(self, agent: AgentLike[Conversation], name: str, spec: AgentSpec) -> None:
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

    def _node(self, parent: RunNode, context: ToolContext) -> RunNode:
        """A new child run of ``parent`` for the call of ``context``."""
        spec, policy = self.spec, self.agent.run_policy
        node = RunNode(
            new_run_id(),
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
        return node

    async def _run_child(self, parent: RunNode, task: str, context: ToolContext) -> ToolResult:
        agent = self.agent
        parent_conv = await agent.get_conversation(parent.conversation_id)
        node = self._node(parent, context)
        run_id = node.run_id
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
        child.link(parent_run_id=parent.run_id, relay_to=parent_conv.parts.events)
        schema = self._result_schema()
        nodes = [node]
        try:
            ended = await self._child_turn(child, parent_conv, parent, node, task, context)
            if schema is None or ended.stop_reason != "stop":
                return self._result(ended)
            value, problem = parse_result(ended.text, schema)
            if problem is not None:
                # One repair request, in the same child conversation (it sees its
                # answer): a second child run linked to the same call.
                log.info("agent %s: answer does not match its result schema", self.agent_name)
                repair = self._node(parent, context)
                nodes.append(repair)
                ended = await self._child_turn(
                    child, parent_conv, parent, repair, _repair_text(problem), context
                )
                if ended.stop_reason != "stop":
                    return self._result(ended)
                value, problem = parse_result(ended.text, schema)
            return self._structured(ended, value, problem, repaired=len(nodes) > 1)
        finally:
            for n in nodes:
                agent.runs.leave(n.run_id)
            agent.child_run_done(child)
            for n in nodes:
                if n.final_write is not None:
                    n.final_write.add_done_callback(self._final_written)

    async def _child_turn(
        self,
        child: Conversation,
        parent_conv: Conversation,
        parent: RunNode,
        node: RunNode,
        task: str,
        context: ToolContext,
    ) -> TurnEnded:
        """Run one turn of ``child`` as the child run ``node``; its ``turn_ended``."""
        agent = self.agent
        node.conversation_id = child.id
        settings = self._configure(child, parent, node)
        schema = self._result_schema()
        if schema is not None:
            settings = dataclasses.replace(settings, system_addition=_result_prompt(schema))
        agent.runs.add(node)
        parent.children.append(node)
        agent.run_started(node)
        parent_conv.parts.events.emit(
            ChildRunLinked,
            parent.run_id,
            parent_run_id=parent.parent.run_id if parent.parent else None,
            call_id=context.call_id,
            child_run_id=node.run_id,
            agent=self.agent_name,
            child_conversation_id=child.id,
        )
        await child.send(
            task,
            author=parent.author,
            author_id=node.author_id,
            allow_tool=node.allow_tool or parent.allow_tool,
            run_id=node.run_id,
            settings=settings,
        )
        assert node.ended is not None
        try:
            return await asyncio.shield(node.ended)
        except asyncio.CancelledError:
            # The parent was stopped: so is the child (its partial answer is kept).
            await asyncio.shield(self._stop(child))
            raise

    def _result_schema(self) -> dict[str, Any] | None:
        schema = self.spec.result_schema
        if isinstance(schema, str):
            # A file name the configuration did not resolve (library use): read it here.
            with open(schema, encoding="utf-8") as f:
                loaded = json.load(f)
            return loaded if isinstance(loaded, dict) else None
        return schema

    def _structured(
        self, ended: TurnEnded, value: Any, problem: str | None, *, repaired: bool
    ) -> ToolResult:
        """The parent's result of a child with a result schema: its validated JSON."""
        data = {
            "run_id": ended.run_id,
            "agent": self.agent_name,
            "stop_reason": ended.stop_reason,
            "usage": ended.usage.to_dict(),
            "repaired": repaired,
        }
        if problem is not None:
            tries = "after one repair request" if repaired else ""
            return ToolResult(
                text=f"error: agent {self.agent_name} gave no valid result {tries}: {problem}",
                data=data,
                is_error=True,
            )
        return ToolResult(
            text=json.dumps(value, ensure_ascii=False), data={**data, "result": value}
        )

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


#: Longest account of why an answer does not match its schema (characters).
MAX_PROBLEM_CHARS = 500


def _result_prompt(schema: dict[str, Any]) -> str:
    return (
        "Your final answer is read by a program, not a person: answer with only a JSON"
        " value (no prose, no code fence) that matches this JSON Schema:\n"
        + json.dumps(schema, ensure_ascii=False)
    )


def _repair_text(problem: str) -> str:
    return (
        f"Your answer does not match the required JSON Schema: {problem}\n"
        "Answer again with only the corrected JSON value."
    )


def parse_result(text: str, schema: dict[str, Any]) -> tuple[Any, str | None]:
    """The JSON value of a child's answer ``text`` and ``None``, or ``(None, why not)``:
    not JSON, or not matching ``schema`` (the most relevant validation error).  A
    Markdown code fence around the JSON is accepted (models add one)."""
    import jsonschema  # type: ignore[import-untyped]  # only agents with a result schema

    body = text.strip()
    if body.startswith("```"):
        body = body.split("\n", 1)[1] if "\n" in body else ""
        if body.rstrip().endswith("```"):
            body = body.rstrip()[:-3]
    try:
        value = json.loads(body)
    except json.JSONDecodeError as exc:
        return None, f"the answer is not JSON ({exc.msg} at line {exc.lineno})"
    validator = jsonschema.validators.validator_for(schema)(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is None:
        return value, None
    where = "/".join(str(p) for p in error.absolute_path) or "the top"
    return None, f"at {where}: {error.message}"[:MAX_PROBLEM_CHARS]
