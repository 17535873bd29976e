"""The agent over the agent-to-agent protocol (A2A v1.0), on the HTTP transport's server.

``[transports.<name>.a2a] enabled = true`` adds two routes to the HTTP API's
Starlette app, served by the protocol's own SDK (``a2a-sdk``: its JSON-RPC
dispatcher, request handler and task store; we write no wire format):

* ``GET /.well-known/agent-card.json``: the agent card — the JSON-RPC interface
  at ``<prefix><path>``, streaming, the bearer scheme when tokens are configured,
  one skill for the agent and one per ``[agents.<name>]`` it may call;
* ``POST <prefix><path>``: ``SendMessage``, ``SendStreamingMessage`` (SSE),
  ``GetTask``, ``ListTasks``, ``CancelTask``, ``SubscribeToTask``.

The endpoint is behind the API's own admission: the bearer token (401
otherwise), the request body cap (``max_body_bytes``: 413), the connection caps
of the server, and each message goes through the host's gate (access rules,
budgets) exactly as a message posted to ``…/messages`` (:meth:`Api.accept_message`).

**Tasks and conversations.**  An A2A ``contextId`` is one of our conversation
ids: a message without one opens a new conversation of the caller's token
(``http:<instance>:<token>:<id>``, as ``POST …/conversations`` does); a message
with one continues that conversation, if the token may see it (an id that is
malformed, unknown or not the caller's is refused the same way:
``InvalidParams``).  Each message is one task: one turn of the conversation.
Its events become task updates: ``working`` when the turn starts, the answer
as the text artifact ``answer`` (streamed chunk by chunk), a ``working`` status
with the tool's name per tool call, and at the end ``completed`` (the turn
ended normally), ``canceled`` (interrupted) or ``failed`` (an error, a budget,
a refusal).  ``CancelTask`` interrupts the turn (its partial answer is kept,
marked interrupted, as with any interrupt).  The final status carries the
turn's token usage in its metadata (``agentik.usage``), so a calling agentik
counts it against its budgets.

A message still waiting behind another turn of its conversation when
``CancelTask`` comes is withdrawn (:meth:`Conversation.withdraw`): it never runs.
Workers sharing a PostgreSQL database: ``CancelTask`` at a worker that does not
run the task's turn records it canceled (the SDK) and asks the worker running it
to stop it through the cluster's ``stops`` topic (:meth:`TurnQueue.stop_elsewhere
<agentik.core.cluster.conversations.TurnQueue.stop_elsewhere>`, as the HTTP
interrupt); a turn still waiting in the shared turn queue, on any worker, is
withdrawn (:meth:`TurnQueue.withdraw
<agentik.core.cluster.conversations.TurnQueue.withdraw>`: a task's run is stored
as soon as its message is accepted, so the cancel finds it wherever it comes; its
end is recorded ``cancelled``, and the worker that claims it skips it); a worker
whose live task's state is refused because the stored task is final already takes
its turn back too.  A task's turn may run on another worker than the one its
request came to (the conversation's turns run where its lease is): the executor
follows its events through the store (:meth:`ClusterEvents.subscribe
<agentik.core.cluster.events.ClusterEvents.subscribe>`), as the SSE API does, so
it ends when the turn ends there (or is withdrawn).

Tasks are records in the bot's store (:mod:`.a2a_tasks`: their text is the audit
log's), so they outlive a restart and every worker on a shared database reads
them; a store engine without them keeps ``max_tasks`` per process in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from a2a.auth.user import User
from a2a.helpers.proto_helpers import new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.agent_execution.simple_request_context_builder import (
    SimpleRequestContextBuilder,
)
from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue_v2 import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import DefaultServerCallContextBuilder, create_jsonrpc_routes
from a2a.server.routes.agent_card_routes import create_agent_card_routes
from a2a.server.tasks import InMemoryTaskStore, TaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    CancelTaskRequest,
    HTTPAuthSecurityScheme,
    InvalidParamsError,
    Message,
    Role,
    SecurityRequirement,
    SecurityScheme,
    SendMessageRequest,
    StringList,
    Task,
    TaskNotFoundError,
    TaskState,
    TaskStatus,
)
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH, PROTOCOL_VERSION_1_0
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message as StarletteMessage

from agentik.core.errors import ClosedError, NotFound

from .a2a_tasks import StoreTaskStore, answer_id
from .api import ApiError, NewMessageBody, channel_of

if TYPE_CHECKING:
    from agentik.core.conversation import Conversation

    from .api import Api
    from .auth import Principal

__all__ = ["a2a_routes"]

log = logging.getLogger(__name__)

#: What an A2A context id (one of our conversation ids) may look like: the ids
#: this API makes are 32 hex digits; other transports' are printable words.
_CONTEXT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")

#: Stop reasons of a turn that ended normally.
_DONE = ("stop", "length")


class _TokenUser(User):
    """The A2A SDK's user: the caller's token (tasks are kept per token)."""

    def __init__(self, principal: Principal) -> None:
        self.principal = principal

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def user_name(self) -> str:
        return self.principal.name


class _CallContext(DefaultServerCallContextBuilder):
    """The SDK's call context of a request (its headers: the protocol version), with
    the principal our endpoint authenticated as the user."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        context.state["principal"] = request.scope["agentik.principal"]
        return context

    def build_user(self, request: Request) -> User:
        return _TokenUser(request.scope["agentik.principal"])


class _BoundedTaskStore(InMemoryTaskStore):
    """The SDK's in-memory task store, forgetting the oldest tasks past ``limit``."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self._limit = limit
        self._order: OrderedDict[tuple[str, str], ServerCallContext] = OrderedDict()

    async def save(self, task: Task, context: ServerCallContext) -> None:
        await super().save(task, context)
        key = (context.user.user_name, task.id)
        self._order[key] = context
        self._order.move_to_end(key)
        while len(self._order) > self._limit:
            (_, old), old_context = self._order.popitem(last=False)
            await super().delete(old, old_context)


class _Contexts(SimpleRequestContextBuilder):
    """Maps an A2A ``contextId`` to one of our conversations (see the module docstring)."""

    def __init__(self, api: Api) -> None:
        super().__init__()
        self.api = api

    async def build(
        self,
        context: ServerCallContext,
        params: SendMessageRequest | None = None,
        task_id: str | None = None,
        context_id: str | None = None,
        task: Task | None = None,
    ) -> RequestContext:
        if params is not None:
            principal: Principal = context.state["principal"]
            wanted = context_id or params.message.context_id
            if wanted:
                await self.api_conversation(principal, wanted)
            else:
                conv = await self._new_conversation(principal)
                params.message.context_id = conv.id
        return await super().build(context, params, task_id, context_id, task)

    async def api_conversation(self, principal: Principal, cid: str) -> Conversation:
        """The conversation ``cid`` if the caller may use it; ``InvalidParams`` otherwise
        (an unknown id and another token's look the same)."""
        unknown = InvalidParamsError(message=f"unknown contextId {cid[:128]!r}")
        if not _CONTEXT_ID.fullmatch(cid):
            raise unknown
        try:
            conv = await self.api.agent.get_conversation(cid)
        except NotFound:
            raise unknown from None
        if not principal.allows(channel_of(conv.channel_key, conv.meta)):
            raise unknown
        return conv

    async def _new_conversation(self, principal: Principal) -> Conversation:
        api = self.api
        prefix = api.own_prefix(principal)
        if not principal.allows(prefix):
            raise InvalidParamsError(
                message="this token may not create conversations: give the contextId of one"
                " it may use"
            )
        import uuid

        cid = uuid.uuid4().hex
        return await api.agent.create_conversation(conversation_id=cid, channel_key=prefix + cid)


class _Executor(AgentExecutor):
    """Runs an A2A task as one turn of its conversation and maps its events."""

    def __init__(self, api: Api, contexts: _Contexts, runs: dict[str, str]) -> None:
        self.api = api
        self.contexts = contexts
        #: Task id -> run id, for the task store (it records the run of each task).
        self.runs = runs
        #: Running tasks: task id -> (conversation, run id).
        self.running: dict[str, tuple[Conversation, str]] = {}
        #: Turns being taken back because another worker canceled their task.
        self._jobs: set[asyncio.Future[None]] = set()
        #: ``record_run(owner, task_id, run_id)``: store a task's run once accepted;
        #: ``False`` when the task was canceled meanwhile (the store-backed task store's).
        self.record_run: Callable[[str, str, str], Awaitable[bool]] | None = None

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id, cid = context.task_id, context.context_id
        assert task_id is not None and cid is not None and context.message is not None
        updater = TaskUpdater(event_queue, task_id, cid)
        if context.current_task is None:
            await event_queue.enqueue_event(
                Task(
                    id=task_id,
                    context_id=cid,
                    status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                    history=[context.message],
                )
            )
        text = context.get_user_input()
        if not text.strip():
            await updater.reject(_agent_text(updater, "the message has no text part"))
            return
        principal: Principal = context.call_context.state["principal"]
        conv = await self.contexts.api_conversation(principal, cid)
        # Subscribed before the message is posted: no event of the turn is missed.
        # Workers: the turn may run on another one (the conversation's turns run where
        # its lease is): its events are followed through the store, as the SSE API does.
        cluster = self.api.agent.cluster_events
        events: Any = (
            await cluster.subscribe(conv, after=None, profile="debug")
            if cluster is not None
            else conv.events(profile="debug")
        )
        try:
            accepting = asyncio.ensure_future(
                self.api.accept_message(principal, conv, NewMessageBody(content=text))
            )
            try:
                # Shielded: a cancel that comes while the message is being accepted
                # still learns its run, and takes it back.
                accepted = await asyncio.shield(accepting)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await self._take_back(conv, (await accepting)["run_id"])
                raise
            except ApiError as exc:
                await updater.reject(_agent_text(updater, f"{exc.code}: {exc.message}"))
                return
            run_id = accepted["run_id"]
            self.running[task_id] = (conv, run_id)
            self.runs[task_id] = run_id
            record_run = self.record_run
            if record_run is not None and not await record_run(principal.name, task_id, run_id):
                # Canceled (through another worker) before its run was known there:
                # the turn is taken back here, wherever it waits.
                self.running.pop(task_id, None)
                await self._take_back(conv, run_id)
                return
            try:
                await self._follow(events, run_id, updater)
            finally:
                self.running.pop(task_id, None)
        except ClosedError:
            with contextlib.suppress(RuntimeError):
                await updater.failed(_agent_text(updater, "the agent is shutting down"))
        finally:
            await events.aclose()

    async def _follow(self, events: Any, run_id: str, updater: TaskUpdater) -> None:
        """Map the run's events to task updates until its ``turn_ended``.  Text deltas
        already waiting are sent as one chunk (a slow reader gets fewer, larger
        chunks; a fast one every delta as it comes)."""
        answer = answer_id(updater.task_id)
        chunks = 0
        text: list[str] = []

        async def flush() -> None:
            nonlocal chunks
            if text:
                await updater.add_artifact(
                    [new_text_part("".join(text))],
                    artifact_id=answer,
                    name="answer",
                    append=chunks > 0,
                    last_chunk=False,
                )
                text.clear()
                chunks += 1

        async for first in events:
            batch = [first]
            while events.ready:
                batch.append(events.take())
            for event in batch:
                if event.kind == "events_lost":
                    await flush()
                    await updater.failed(_agent_text(updater, "the turn's events were lost"))
                    return
                if event.run_id != run_id or event.parent_run_id is not None:
                    continue
                kind = event.kind
                if kind == "text_delta":
                    text.append(event.text)
                    continue
                await flush()
                if kind == "turn_started":
                    await updater.start_work()
                elif kind == "tool_call_started":
                    await updater.update_status(
                        TaskState.TASK_STATE_WORKING,
                        metadata={"agentik": {"tool_call": event.name}},
                    )
                elif kind == "turn_ended":
                    if chunks == 0 and event.text:
                        await updater.add_artifact(
                            [new_text_part(event.text)], artifact_id=answer, name="answer"
                        )
                    await self._end(updater, run_id, event)
                    return
            await flush()

    async def _end(self, updater: TaskUpdater, run_id: str, event: Any) -> None:
        metadata = {
            "agentik": {
                "run_id": run_id,
                "stop_reason": event.stop_reason,
                "usage": event.usage.to_dict(),
            }
        }
        # The answer's own id: the stored task takes its text from the audit log.
        message = (
            Message(
                role=Role.ROLE_AGENT,
                task_id=updater.task_id,
                context_id=updater.context_id,
                message_id=answer_id(updater.task_id),
                parts=[new_text_part(event.text)],
            )
            if event.text
            else None
        )
        if event.stop_reason in _DONE:
            state = TaskState.TASK_STATE_COMPLETED
        elif event.stop_reason == "interrupted":
            state = TaskState.TASK_STATE_CANCELED
        else:
            state = TaskState.TASK_STATE_FAILED
        with contextlib.suppress(RuntimeError):  # canceled already
            await updater.update_status(state, message=message, metadata=metadata)

    async def _take_back(self, conv: Conversation, run_id: str) -> None:
        """Stop the turn ``run_id``: interrupt it if it runs, withdraw it if it waits —
        here, or (workers sharing a database) in the shared turn queue or on the
        worker running it."""
        if conv.running_run_id == run_id:
            if not conv.interrupting:
                await conv.interrupt()
            return
        # Still waiting behind another turn: it is taken back and never runs.
        if await conv.withdraw(run_id):
            return
        queue = self.api.agent.turn_queue
        if queue is not None:
            await queue.withdraw(conv.id, run_id)

    def ended_elsewhere(self, task_id: str) -> None:
        """The stored task ended through another worker (``tasks/cancel`` there) while
        its turn is here: take the turn back (it ends ``canceled``)."""
        running = self.running.get(task_id)
        if running is not None:
            job = asyncio.ensure_future(self._take_back(*running))
            self._jobs.add(job)
            job.add_done_callback(self._jobs.discard)

    async def stop_elsewhere(self, owner: str, task: Task) -> None:
        """After ``tasks/cancel``: the task's turn may run on another worker sharing
        the store, which is asked to stop it through the cluster's ``stops`` topic
        (as the HTTP interrupt does), or wait in the shared turn queue, where it is
        withdrawn (:meth:`TurnQueue.withdraw
        <agentik.core.cluster.conversations.TurnQueue.withdraw>`: it never runs)."""
        queue = self.api.agent.turn_queue
        store = self.api.agent.store
        if queue is None or "a2a_tasks" not in store.capabilities:
            return  # one process: the executor's own cancel took it back
        record = await store.a2a_task_get(owner, task.id)
        run_id = record.run_id if record is not None else None
        if run_id is None:
            return  # not accepted yet: the worker accepting it sees the final record
        local = self.api.agent.services.find(task.context_id)
        if local is not None and local.running_run_id == run_id:
            return  # it runs here: interrupted already
        if local is not None and await local.withdraw(run_id):
            return  # it waited here: taken back
        # Running on another worker (stopped there), or still in the shared queue
        # (its end recorded ``cancelled``: whoever claims it does not run it).
        await queue.withdraw(task.context_id, run_id)

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id, cid = context.task_id, context.context_id
        if task_id is None or cid is None:
            raise TaskNotFoundError
        running = self.running.get(task_id)
        if running is not None:
            await self._take_back(*running)
        await TaskUpdater(event_queue, task_id, cid).cancel()


class _Handler(DefaultRequestHandler):
    """The SDK's request handler; ``tasks/cancel`` also reaches a turn that another
    worker runs (the SDK, when this worker does not hold the task, only records it
    canceled)."""

    def __init__(self, executor: _Executor, **kwargs: Any) -> None:
        super().__init__(agent_executor=executor, **kwargs)
        self._executor = executor

    async def on_cancel_task(
        self, params: CancelTaskRequest, context: ServerCallContext
    ) -> Task | None:
        task = await super().on_cancel_task(params, context)
        if task is not None and task.status.state == TaskState.TASK_STATE_CANCELED:
            try:
                await self._executor.stop_elsewhere(context.user.user_name, task)
            except Exception:
                log.exception("A2A task %s: asking the other workers to stop it failed", task.id)
        return task


def _agent_text(updater: TaskUpdater, text: str) -> Message:
    return updater.new_agent_message([new_text_part(text)])


def _card(api: Api, base_url: str) -> AgentCard:
    settings = api.ctx.settings
    a2a = settings.a2a
    skills = [
        AgentSkill(
            id="chat",
            name=a2a.name,
            description=a2a.description or "Answers messages; it may use tools and other agents.",
            tags=["chat"],
        )
    ]
    uses = set(getattr(api.agent, "uses", ()) or ())
    for name, spec in getattr(api.agent, "agents", {}).items():
        if uses and name not in uses:
            continue
        skills.append(
            AgentSkill(
                id=f"agent-{name}",
                name=name,
                description=spec.description or f"The agent {name}.",
                tags=["agent"],
            )
        )
    card = AgentCard(
        name=a2a.name,
        description=a2a.description or "An agentik agent.",
        version="1.0",
        supported_interfaces=[
            AgentInterface(
                url=base_url + settings.prefix + a2a.path,
                protocol_binding="JSONRPC",
                protocol_version=PROTOCOL_VERSION_1_0,
            )
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=skills,
    )
    if api.ctx.tokens.enabled:
        card.security_schemes["bearer"].CopyFrom(
            SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(scheme="Bearer"))
        )
        card.security_requirements.append(SecurityRequirement(schemes={"bearer": StringList()}))
    return card


def _jsonrpc_error(status: int, code: int, message: str, **headers: str) -> Response:
    return JSONResponse(
        {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}},
        status_code=status,
        headers=headers or None,
    )


def a2a_routes(api: Api) -> tuple[list[Route], DefaultRequestHandler]:
    """The card and JSON-RPC routes of ``api``'s server, and the SDK's handler (to close)."""
    settings = api.ctx.settings
    a2a = settings.a2a
    contexts = _Contexts(api)
    store = api.agent.store
    task_store: TaskStore
    runs: dict[str, str] = {}
    executor = _Executor(api, contexts, runs)
    if "a2a_tasks" in store.capabilities:
        task_store = StoreTaskStore(store, executor.ended_elsewhere)
        task_store.runs = runs
        executor.record_run = task_store.record_run
    else:  # an engine that keeps no task records (a plugin's): this process keeps them
        task_store = _BoundedTaskStore(a2a.max_tasks)
    base = _card(api, a2a.public_url or "http://localhost")
    handler = _Handler(
        executor,
        task_store=task_store,
        agent_card=base,
        request_context_builder=contexts,
    )
    rpc_path = settings.prefix + a2a.path
    [rpc] = create_jsonrpc_routes(handler, rpc_path, context_builder=_CallContext())
    dispatch = rpc.endpoint

    async def endpoint(request: Request) -> Response:
        if api.ctx.closing:
            return _jsonrpc_error(503, -32603, "the server is shutting down")
        try:
            principal = api.principal(request)
        except ApiError as exc:
            return _jsonrpc_error(exc.status, -32600, exc.message, **(exc.headers or {}))
        limit = settings.max_body_bytes
        length = request.headers.get("content-length", "")
        too_large = _jsonrpc_error(413, -32600, f"the request body is larger than {limit} bytes")
        if length.isdigit() and int(length) > limit:
            return too_large
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                return too_large
        sent = False

        async def replay() -> StarletteMessage:
            nonlocal sent
            if sent:  # then wait for the client to go away, as a real receive does
                return await request.receive()
            sent = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        scope = dict(request.scope)
        scope["agentik.principal"] = principal
        return await dispatch(Request(scope, replay))

    async def card(request: Request) -> Response:
        if not a2a.public_card:
            try:
                api.principal(request)
            except ApiError as exc:
                return JSONResponse(
                    {"error": {"code": exc.code, "message": exc.message}},
                    status_code=exc.status,
                    headers=exc.headers,
                )
        base_url = a2a.public_url or str(request.base_url).rstrip("/")
        [route] = create_agent_card_routes(_card(api, base_url))
        return await route.endpoint(request)

    routes = [
        Route(AGENT_CARD_WELL_KNOWN_PATH, card, methods=["GET"]),
        Route(rpc_path, endpoint, methods=["POST"]),
    ]
    return routes, handler
