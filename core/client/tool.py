"""A remote agent as the tool ``agent__<name>`` (``[agents.<name>] url = "…"``).

It is called exactly as a local agent (:class:`~agentik.core.agents.AgentTool`:
the same arguments, depth and ``uses`` checks, concurrency slots and result),
but its child run is a turn of another agentik, driven over its HTTP API
(:class:`~agentik.core.client.remote.RemoteAgent`):

* each call creates a conversation on the remote (titled ``<name>: <task>``),
  opens its event stream, sends the task, and emits ``child_run_linked`` in
  the caller's stream with the remote run's id and conversation id;
* the remote run's events (``turn_started`` … ``turn_ended``,
  ``run_stream_end``, and its own child runs' events) are relayed into the
  caller's conversation stream, renumbered as the caller's, with the caller's
  run as their ``parent_run_id``: one subscription sees the same run tree as
  with a local child (they are not put on the caller's agent-wide stream:
  the remote's own ``/agentik/events`` has them);
* **budgets cross the wire**: each model request's usage the remote reports
  (``usage`` events) counts for the caller's run and its ancestors, under the
  agent's own ``token_budget`` and the caller's tree budgets; when one is used
  up the remote run is stopped and the call ends with ``token_budget`` (so the
  caller stops too, before its next model request, as with a local child);
* **cancellation crosses the wire**: when the caller's turn is stopped (an
  interrupt, its time budget, the tool timeout) the remote run is interrupted
  (its partial answer kept there) before the call ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from ..agents import AgentTool
from ..errors import AgentikError
from ..events import ChildRunLinked, Event, TurnEnded
from ..runs import AgentSpec, RunNode
from ..tools.base import ToolContext, ToolResult
from .remote import RemoteAgent, RemoteConversation, RemoteSubscription

if TYPE_CHECKING:
    from ..conversation import Conversation
    from ..services import AgentLike, ConversationEvents

__all__ = ["RemoteAgentTool"]

log = logging.getLogger(__name__)

#: Seconds a stopped remote run gets to report its end (relayed into the caller's stream).
STOP_GRACE = 10.0


class RemoteAgentTool(AgentTool):
    """The tool ``agent__<name>`` of an agent that runs elsewhere (``spec.url``)."""

    def __init__(
        self,
        agent: AgentLike[Conversation],
        name: str,
        spec: AgentSpec,
        *,
        url: str,
        token: str | None = None,
        prefix: str = "/agentik",
    ) -> None:
        super().__init__(agent, name, spec)
        self.url = url
        self.prefix = prefix
        self._token = token

    def __repr__(self) -> str:
        return f"RemoteAgentTool({self.agent_name!r}, {self.url!r})"

    async def _run_child(self, parent: RunNode, task: str, context: ToolContext) -> ToolResult:
        parent_conv = await self.agent.get_conversation(parent.conversation_id)
        stream = parent_conv.parts.events
        remote = RemoteAgent(self.url, token=self._token, prefix=self.prefix)
        try:
            try:
                conv = await remote.create_conversation(title=f"{self.agent_name}: {task[:60]}")
                # A new conversation: from its first event (a reconnect replays them all).
                events = conv.events(after=0, profile="debug")
                run_id = await conv.send(task, author=parent.author)
            except AgentikError as exc:
                return ToolResult(
                    text=f"error: agent {self.agent_name} could not be reached: {exc}",
                    is_error=True,
                )
            node = RunNode(
                run_id,
                conv.id,
                agent=self.agent_name,
                parent=parent,
                depth=parent.depth + 1,
                token_budget=self.spec.token_budget,
                call_id=context.call_id,
                author=parent.author,
            )
            stream.emit(
                ChildRunLinked,
                parent.run_id,
                parent_run_id=parent.parent.run_id if parent.parent else None,
                call_id=context.call_id,
                child_run_id=run_id,
                agent=self.agent_name,
                child_conversation_id=conv.id,
            )
            follow = _Follow(node, parent, conv, events, stream)
            try:
                ended = await follow.run()
            except AgentikError as exc:  # the stream broke and did not come back, or
                # the remote sent what no agentik sends (an event over the cap)
                log.warning("agent %s: lost the remote run %s: %s", self.agent_name, run_id, exc)
                ended, lost = None, str(exc)
                with contextlib.suppress(AgentikError):  # still running there, perhaps
                    await conv.interrupt(run_id)
            except asyncio.CancelledError:
                # The caller was stopped: so is the remote run (its end still relayed).
                await asyncio.shield(follow.stop())
                raise
            finally:
                await events.aclose()
        finally:
            await asyncio.shield(remote.aclose())
        if ended is None:
            return ToolResult(
                text=f"error: agent {self.agent_name}: the remote run's events broke off ({lost})",
                data={"run_id": run_id, "agent": self.agent_name},
                is_error=True,
            )
        if follow.over_budget:
            ended = dataclasses.replace(ended, stop_reason="token_budget")
        return self._result(ended)


class _Follow:
    """Follows one remote run: relays its events, counts its usage, stops it."""

    def __init__(
        self,
        node: RunNode,
        parent: RunNode,
        conv: RemoteConversation,
        events: RemoteSubscription,
        stream: ConversationEvents,
    ) -> None:
        self.node = node
        self.parent = parent
        self.conv = conv
        self.events = events
        self.stream = stream
        self.ended: TurnEnded | None = None
        self.over_budget = False
        self._stopping = False

    async def run(self) -> TurnEnded | None:
        """Relay until the run's ``run_stream_end`` (or the stream ends); its end."""
        run_id = self.node.run_id
        async for event in self.events:
            if event.kind == "events_lost":
                log.warning("remote run %s: events were lost; its answer is read back", run_id)
                break
            self._relay(event)
            if event.kind == "usage":
                self.node.add_usage(event.usage)
                if not self._stopping and self.node.over_budget():
                    self.over_budget = True
                    self._stopping = True
                    try:
                        await self.conv.interrupt(run_id)
                    except AgentikError as exc:
                        log.warning("remote run %s: could not be stopped: %s", run_id, exc)
                        break
            elif event.kind == "turn_ended" and event.run_id == run_id:
                self.ended = event
            elif event.kind == "run_stream_end" and event.run_id == run_id:
                break
        return self.ended

    def _relay(self, event: Event) -> None:
        if event.run_id is None or event.kind == "status_changed":
            return  # the remote conversation's own state (ours is executing_tools)
        fields: dict[str, Any] = {"stream_seq": 0}
        if event.parent_run_id is None:
            fields["parent_run_id"] = self.parent.run_id
        self.stream.relay(dataclasses.replace(event, **fields))

    async def stop(self) -> None:
        """Interrupt the remote run and relay its end (bounded by :data:`STOP_GRACE`)."""
        if not self._stopping:
            self._stopping = True
            try:
                await self.conv.interrupt(self.node.run_id)
            except AgentikError as exc:
                log.warning("remote run %s: could not be stopped: %s", self.node.run_id, exc)
                return
        with contextlib.suppress(TimeoutError, AgentikError):
            async with asyncio.timeout(STOP_GRACE):
                await self.run()
