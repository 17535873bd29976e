"""An A2A agent as the tool ``agent__<name>`` (``[agents.<name>] a2a_url = "…"``).

Any agent that speaks the agent-to-agent protocol (A2A v1.0) — another
agentik with ``[transports.<name>.a2a]``, or another framework's — is called
exactly as a local agent (:class:`~agentik.core.agents.AgentTool`: the same
arguments, depth and ``uses`` checks, concurrency slots and result), through
the protocol's own SDK (``a2a-sdk``'s client: the card at
``<a2a_url>/.well-known/agent-card.json`` says where and how to send):

* each call sends the task as a new message (a new A2A context: one remote
  conversation per call, as a local child gets) over ``SendStreamingMessage``
  when the card says the agent streams, ``SendMessage`` otherwise;
* the remote task appears in the caller's run tree: ``child_run_linked`` (the
  task id as the child run's id, its context id as the child conversation),
  then the child run's ``turn_started``, its answer as ``text_delta`` events
  (from the streamed artifact chunks), ``turn_ended`` and ``run_stream_end``,
  with the caller's run as their ``parent_run_id``;
* **budgets**: the token usage a remote agentik reports with the task's final
  status (``metadata.agentik.usage``) counts for the caller's run and its
  ancestors (an agent that reports none costs nothing that can be counted);
* **cancellation crosses the wire**: when the caller's turn is stopped (an
  interrupt, its time budget, the tool timeout) the remote task is cancelled
  (``CancelTask``) before the call ends;
* a remote that cannot be reached, answers with a protocol error, or drops
  the stream mid-way gives a tool error saying so (the partial answer, if
  any, included), never a hung call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import TYPE_CHECKING, Any

import httpx
from a2a.client import A2AClientError, Client, ClientConfig, create_client
from a2a.types import (
    CancelTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    TaskState,
)
from a2a.utils.errors import A2AError
from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped]

from ..agents import AgentTool
from ..events import ChildRunLinked, RunStreamEnd, TextDelta, TurnEnded, TurnStarted
from ..messages import Usage
from ..runs import AgentSpec, RunNode
from ..tools.base import ToolContext, ToolResult

if TYPE_CHECKING:
    from ..conversation import Conversation
    from ..events import StopReason
    from ..services import AgentLike, ConversationEvents

__all__ = ["A2AAgentTool"]

log = logging.getLogger(__name__)

#: Seconds to connect to the remote, and to wait for a non-streamed answer's bytes.
CONNECT_TIMEOUT = 30.0
#: Seconds a cancelled call waits for the remote to confirm the cancellation.
STOP_GRACE = 10.0

_STOPPED: dict[int, StopReason] = {
    TaskState.TASK_STATE_COMPLETED: "stop",
    TaskState.TASK_STATE_CANCELED: "interrupted",
    TaskState.TASK_STATE_FAILED: "error",
    TaskState.TASK_STATE_REJECTED: "error",
    TaskState.TASK_STATE_INPUT_REQUIRED: "error",
    TaskState.TASK_STATE_AUTH_REQUIRED: "error",
}
_WHY = {
    TaskState.TASK_STATE_REJECTED: "it refused the task",
    TaskState.TASK_STATE_INPUT_REQUIRED: "it asks for more input (not supported)",
    TaskState.TASK_STATE_AUTH_REQUIRED: "it asks for authorization (not supported)",
}


class A2AAgentTool(AgentTool):
    """The tool ``agent__<name>`` of an A2A agent (``spec.a2a_url``)."""

    def __init__(
        self,
        agent: AgentLike[Conversation],
        name: str,
        spec: AgentSpec,
        *,
        url: str,
        token: str | None = None,
    ) -> None:
        super().__init__(agent, name, spec)
        self.url = url.rstrip("/")
        self._token = token

    def __repr__(self) -> str:
        return f"A2AAgentTool({self.agent_name!r}, {self.url!r})"

    def _http(self) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
        # No read timeout: a streamed task may think for a long time between events
        # (the caller's time budget and the tool timeout bound the call).
        timeout = httpx.Timeout(CONNECT_TIMEOUT, read=None)
        return httpx.AsyncClient(headers=headers, timeout=timeout)

    async def _run_child(self, parent: RunNode, task: str, context: ToolContext) -> ToolResult:
        parent_conv = await self.agent.get_conversation(parent.conversation_id)
        stream = parent_conv.parts.events
        http = self._http()
        try:
            try:
                client = await create_client(self.url, ClientConfig(httpx_client=http))
            except (A2AError, httpx.HTTPError, ValueError) as exc:
                return self._error(f"could not be reached: {_say(exc)}")
            follow = _Follow(self, parent, stream, context)
            request = SendMessageRequest(
                message=Message(
                    message_id=uuid.uuid4().hex, role=Role.ROLE_USER, parts=[Part(text=task)]
                )
            )
            # Read in a task of its own: a caller stopped before the remote task's id
            # arrived still learns it (to cancel it) from the same stream.
            reading = asyncio.create_task(follow.run(client.send_message(request)))
            try:
                await asyncio.shield(reading)
            except asyncio.CancelledError:
                # The caller was stopped: so is the remote task.
                await asyncio.shield(follow.cancel(client, reading))
                raise
            except (A2AError, httpx.HTTPError, ValueError) as exc:
                log.warning("agent %s: the A2A task broke off: %s", self.agent_name, _say(exc))
                await follow.cancel(client, reading)
                follow.finish("error", f"the remote task broke off: {_say(exc)}")
            if follow.ended is None:
                follow.finish("error", "the remote stream ended before the task did")
        finally:
            await asyncio.shield(http.aclose())
        assert follow.ended is not None
        ended = follow.ended
        if follow.over_budget:
            ended = TurnEnded(
                conversation_id=ended.conversation_id,
                run_id=ended.run_id,
                stop_reason="token_budget",
                usage=ended.usage,
                text=ended.text,
            )
        result = self._result(ended)
        if follow.problem and result.is_error:
            result = ToolResult(
                text=f"{result.text} ({follow.problem})", data=result.data, is_error=True
            )
        return result

    def _error(self, what: str) -> ToolResult:
        return ToolResult(text=f"error: agent {self.agent_name} {what}", is_error=True)


def _say(exc: BaseException) -> str:
    """An error of the SDK or httpx in one line (never a header: no token)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


class _Follow:
    """Follows one A2A task: relays it into the caller's run tree, counts its usage."""

    def __init__(
        self, tool: A2AAgentTool, parent: RunNode, stream: ConversationEvents, ctx: ToolContext
    ) -> None:
        self.tool = tool
        self.parent = parent
        self.stream = stream
        self.ctx = ctx
        self.task_id: str | None = None
        self.context_id = ""
        self.node: RunNode | None = None
        self.text: list[str] = []
        self.usage = Usage()
        self.ended: TurnEnded | None = None
        self.problem = ""
        self.over_budget = False
        #: Set once the remote task's id is known.
        self.linked = asyncio.Event()

    async def run(self, responses: Any) -> None:
        async for response in responses:
            self._take(response)
            if self.ended is not None:
                return

    def _take(self, response: StreamResponse) -> None:
        kind = response.WhichOneof("payload")
        if kind == "message":  # an immediate answer, no task
            msg = response.message
            self._link(msg.task_id or f"a2a-{uuid.uuid4().hex}", msg.context_id)
            self._delta("".join(p.text for p in msg.parts if p.HasField("text")))
            self.finish("stop")
        elif kind == "task":
            task = response.task
            self._link(task.id, task.context_id)
            if not self.text:
                for artifact in task.artifacts:
                    self._delta("".join(p.text for p in artifact.parts if p.HasField("text")))
            self._status(task.status, task.metadata)
        elif kind == "artifact_update":
            update = response.artifact_update
            self._link(update.task_id, update.context_id)
            self._delta("".join(p.text for p in update.artifact.parts if p.HasField("text")))
        elif kind == "status_update":
            update = response.status_update
            self._link(update.task_id, update.context_id)
            self._status(update.status, update.metadata)

    def _link(self, task_id: str, context_id: str) -> None:
        if self.node is not None:
            return
        parent, tool = self.parent, self.tool
        self.task_id, self.context_id = task_id, context_id
        self.linked.set()
        self.node = RunNode(
            task_id,
            context_id,
            agent=tool.agent_name,
            parent=parent,
            depth=parent.depth + 1,
            token_budget=tool.spec.token_budget,
            call_id=self.ctx.call_id,
            author=parent.author,
        )
        self.stream.emit(
            ChildRunLinked,
            parent.run_id,
            parent_run_id=parent.parent.run_id if parent.parent else None,
            call_id=self.ctx.call_id,
            child_run_id=task_id,
            agent=tool.agent_name,
            child_conversation_id=context_id,
        )
        self._relay(TurnStarted(conversation_id=context_id, run_id=task_id, author=parent.author))

    def _relay(self, event: Any) -> None:
        import dataclasses

        self.stream.relay(dataclasses.replace(event, parent_run_id=self.parent.run_id))

    def _delta(self, text: str) -> None:
        if text and self.task_id is not None:
            self.text.append(text)
            self._relay(TextDelta(conversation_id=self.context_id, run_id=self.task_id, text=text))

    def _status(self, status: Any, metadata: Any) -> None:
        stop = _STOPPED.get(status.state)
        if stop is None:
            return
        reported = MessageToDict(metadata).get("agentik", {}) if metadata else {}
        usage = reported.get("usage") if isinstance(reported, dict) else None
        if isinstance(usage, dict):
            with contextlib.suppress(TypeError, ValueError):
                self.usage = Usage.from_dict(usage)
                assert self.node is not None
                self.node.add_usage(self.usage)
                self.over_budget = self.node.over_budget()
        said = "".join(p.text for p in status.message.parts if p.HasField("text"))
        if said and not self.text:
            self._delta(said)
        why = _WHY.get(status.state)
        if stop == "error" and said and self.text and said != "".join(self.text):
            why = f"{why}: {said}" if why else said
        if reported.get("stop_reason") in ("token_budget", "time_budget", "tool_limit"):
            stop = reported["stop_reason"]
        self.finish(stop, why or "")

    def finish(self, stop: StopReason, problem: str = "") -> None:
        """End the child run in the caller's tree (once)."""
        if self.ended is not None:
            return
        self.problem = problem
        task_id = self.task_id or f"a2a-{uuid.uuid4().hex}"
        if self.task_id is None:
            self._link(task_id, "")
        self.ended = TurnEnded(
            conversation_id=self.context_id,
            run_id=task_id,
            stop_reason=stop,
            usage=self.usage,
            text="".join(self.text),
        )
        self._relay(self.ended)
        self._relay(RunStreamEnd(conversation_id=self.context_id, run_id=task_id))

    async def cancel(self, client: Client, reading: asyncio.Task[None]) -> None:
        """Cancel the remote task (its id waited for, the whole bounded by
        :data:`STOP_GRACE`) and stop ``reading`` its stream; its end is relayed."""
        try:
            async with asyncio.timeout(STOP_GRACE):
                if not reading.done():
                    linked = asyncio.ensure_future(self.linked.wait())
                    await asyncio.wait({linked, reading}, return_when=asyncio.FIRST_COMPLETED)
                    linked.cancel()
                if self.task_id is not None and self.ended is None:
                    await client.cancel_task(CancelTaskRequest(id=self.task_id))
                    # The stream carries the task's last status (canceled, with usage).
                    await asyncio.wait({reading})
        except (A2AError, A2AClientError, httpx.HTTPError, TimeoutError) as exc:
            log.warning(
                "agent %s: could not cancel A2A task %s: %s",
                self.tool.agent_name,
                self.task_id,
                _say(exc),
            )
        finally:
            reading.cancel()
            with contextlib.suppress(BaseException):
                await reading
        self.finish("interrupted")
