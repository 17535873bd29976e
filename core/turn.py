"""One turn: model → tool calls → model … until a final answer.

A :class:`TurnRunner` runs in its own task, owned by the conversation, and
works on the conversation's explicit parts
(:class:`~agentik.core.services.ConversationParts`): its working memory,
its event stream and the agent's services (model, system prompt, hooks,
compactor).  It writes every step to both logs (audit log and working memory) as it goes,
emits events, and on interruption, time-out or failure keeps what was
produced: the partial answer is recorded with status ``interrupted`` or
``error``, and every tool call left without a result gets an error result so
the working memory stays a valid LLM context.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import re
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .attachments import for_model
from .compaction import estimate_tokens
from .errors import ClosedError, ContextTooLong, LLMError, PluginError, StoreError, ToolError
from .events import (
    Error,
    Interrupted,
    PromptRendered,
    ReasoningDelta,
    ReasoningStarted,
    RequestUsage,
    ResponseStarted,
    RunStreamEnd,
    StatusState,
    TextDelta,
    ToolCallEnded,
    ToolCallStarted,
    ToolProgress,
    TurnEnded,
    TurnStarted,
    declared_event,
)
from .hooks import Abort
from .llm.base import (
    FinishItem,
    LLMBackend,
    LLMRequest,
    ReasoningChunk,
    TextChunk,
    ToolCallItem,
    ToolSpec,
    UsageItem,
)
from .memory import scopes_for
from .messages import (
    ChatMessage,
    Message,
    MessageKind,
    MessageStatus,
    NewMessage,
    ToolCall,
    Usage,
    user_chat_message,
)
from .observe import RequestStats
from .recall import recall_for, with_recall
from .runs import AGENT_TOOL_PREFIX
from .tools.base import AskUser, EndTurn, Tool, ToolContext, ToolResult, spec_of
from .turnsettings import DEFAULT_SETTINGS, TurnOrigin, TurnSettings

if TYPE_CHECKING:
    from .events import Event, StopReason
    from .protocols import LiveConversation
    from .services import ConversationParts

__all__ = ["Steered", "TurnRunner"]

log = logging.getLogger(__name__)

#: Longest error result of a tool that reaches the model (characters): a tool's
#: own error text (an MCP server's message) stays as written, up to this.
MAX_TOOL_ERROR_CHARS = 2_000
#: The end of a turn that the database refused for a while (locked, full,
#: read-only) is written again after this many seconds, doubling up to ``END_RETRY_MAX``.
END_RETRY_FIRST = 0.5
END_RETRY_MAX = 30.0


class _NotStored(BaseException):
    """The turn's message could not be stored: the turn ends unseen (see
    :meth:`TurnRunner._admitted`).  A ``BaseException``: no handler of the turn's
    failures takes it for one of them."""


class TurnAborted(Exception):
    """An ``after_response`` hook ended the turn."""


@dataclass(slots=True)
class _State:
    usage: Usage = field(default_factory=Usage)
    partial: list[str] = field(default_factory=list)
    final_text: str = ""
    tool_calls: int = 0
    #: The turn's tool calls are used up: the model is asked for an answer
    #: without tools, and a tool call then ends the turn (``tool_limit``).
    tools_exhausted: bool = False
    open_calls: dict[str, ToolCall] = field(default_factory=dict)
    stop_reason: str = "stop"
    #: An ``on_tool_error`` hook ended the turn (its reason): after this tool batch.
    aborted: str | None = None
    #: A tool's result ended the turn (:class:`EndTurn`): after this tool batch.
    end_turn: EndTurn | None = None
    #: The model asked for compaction (``compact_context``): after this tool batch.
    compact: bool = False


@dataclass(slots=True)
class Steered:
    """A message sent into a running turn (``busy = "steer"``): already on its way
    to the audit log (``committed``); it joins the working memory at the turn's
    next model request."""

    content: str
    author: str | None
    committed: asyncio.Future[list[Message]]
    #: Sent into the turn from the turn queue of several workers (a queued turn of
    #: its own): one the turn does not reach is run from the queue, not here.
    queued: bool = False
    #: Whether the turn took it in (it joined the working memory).
    taken: bool = False


class TurnRunner:
    """Runs one turn of a conversation (its ``parts``) for the user message ``message``."""

    def __init__(
        self,
        parts: ConversationParts[Any],
        *,
        run_id: str,
        message: Message,
        question: asyncio.Future[list[Message]] | None = None,
        settings: TurnSettings = DEFAULT_SETTINGS,
        tools: Sequence[Tool],
        in_memory: bool = False,
        resumed: bool = False,
        allow_tool: Callable[[str], bool] | None = None,
        on_status: Callable[[TurnRunner], None] | None = None,
    ) -> None:
        self.parts = parts
        #: The conversation (what hooks and tools are told about).
        self.conv: LiveConversation = parts.conversation
        self.memory = parts.memory
        self.events = parts.events
        self.services = parts.services
        self.run_id = run_id
        self.message = message
        #: The write of ``message`` when it is still under way (``message`` is then the
        #: row as it will be stored, id 0): the turn reads what it needs and sends its
        #: first model request meanwhile, but says nothing (no event), writes nothing
        #: and shows nothing of the answer before that write has committed
        #: (:meth:`_admitted`).  A write that fails ends the turn unseen: its sender
        #: was told (the model request made meanwhile is dropped).
        self._question = question
        #: Events emitted before the question was stored, emitted once it is.
        self._held: list[tuple[type[Event], dict[str, Any]]] = []
        #: What this turn runs with: the only source of its persona, tools, model,
        #: prompt and recall (``None`` fields: the agent's, as at the turn's start).
        self.settings = settings
        self.policy = policy = settings.policy or self.services.policy
        #: This run in the agent's run tree (limits inherited from its parent run).
        self.node = node = self.services.agent.runs.enter(run_id, parts.id)
        node.allow_tool = allow_tool
        node.settings = settings
        # The message's own record first (a resumed turn's settings carry none; a
        # steering message left for a turn of its own has its own speaker).
        node.origin = TurnOrigin.of(message) or settings.origin
        if node.parent is None:
            data = message.data if isinstance(message.data, dict) else {}
            node.author, node.author_id = message.author, data.get("author_id")
            node.channel = self.conv.channel_key
        uses = self.services.agent.runs.uses(node) if self.services.agent.agents else ()
        # The speaker's rights narrow the policy: a tool they may not use is not
        # offered, nor an agent this run's agent does not use.
        self.tools = {
            t.name: t
            for t in policy.visible(tools)
            if (allow_tool is None or allow_tool(t.name))
            # A tool that waits for a person (ask_user) is not offered where nobody can answer.
            and not (parts.conversation.temp and getattr(t, "waits_for_human", False))
            and (
                not t.name.startswith(AGENT_TOOL_PREFIX) or t.name[len(AGENT_TOOL_PREFIX) :] in uses
            )
        }
        #: Tools not offered to the model (agents, at the run tree's depth limit):
        #: a call still reaches them, and they refuse it.
        self.hidden: frozenset[str] = (
            frozenset(n for n in self.tools if n.startswith(AGENT_TOOL_PREFIX))
            if uses and self.services.agent.runs.at_depth_limit(node)
            else frozenset()
        )
        self.state = _State(tools_exhausted=policy.max_tool_calls <= 0)
        self.interrupt_requested = False
        #: True when ``send`` already put the user message in working memory.
        self.in_memory = in_memory
        #: Resumed after a restart: the message may already be in working memory.
        self.resumed = resumed
        self._writes: set[asyncio.Future[Any]] = set()
        self.failed_writes: list[BaseException] = []
        #: The turn's time budget (its deadline is paused while approvals wait).
        self._budget: asyncio.Timeout | None = None
        self._waiting_approvals = 0
        self._budget_left: float | None = None
        #: When the current model request's first item came (request observers).
        self._first_item: float | None = None
        #: Its row of the run tree went in with the turn's end.
        self._run_written = False
        #: The tool rights this turn was started with (a steering message must match).
        self.allow_tool = allow_tool
        #: What the turn does now (see :data:`~agentik.core.events.StatusState`).
        self.phase: StatusState = "running"
        #: Names of the tool calls of the batch running now.
        self.running_tools: list[str] = []
        #: The turn has ended (its last status is about to be reported).
        self.finished = False
        #: Model requests made so far.
        self.requests = 0
        self._on_status = on_status
        #: Whether a steering message would reach a model request of this turn:
        #: open while a tool batch runs (a request always follows one).  Not
        #: before the first request: messages sent in a burst each get a turn.
        self.steer_open = False
        self._steered: list[Steered] = []
        # Resumed after a restart: stored calls whose approval was pending,
        # run (asked again) before the first model request.
        self._reask: list[ToolCall] = []
        # Calls waiting for a person's approval now: a shutdown leaves them
        # open (no error result), so the next start asks again.
        self._awaiting_approval: set[str] = set()
        #: The automatic-recall block of this turn (:mod:`agentik.core.recall`).
        self._recalled: str | None = None

    # -- helpers -------------------------------------------------------------
    @property
    def llm(self) -> LLMBackend:
        """The model this turn's requests go to: its settings' profile, else the
        agent's main backend (read at each request: a reload is seen)."""
        return self.services.llm_for(self.settings.llm_profile)

    def _emit(self, cls: type[Event], **fields: Any) -> None:
        if self._question is not None:
            self._held.append((cls, fields))  # (shown once the question is stored)
            return
        self.events.emit(cls, self.run_id, **fields)

    def _started(self) -> None:
        """Say the turn started (``turn_started``, then its ``running`` status)."""
        m = self.message
        origin = self.node.origin
        # A child run's task has id 0 until its deferred write commits: no id yet.
        self._emit(TurnStarted, message_id=m.id or None, author=m.author,
                   origin=origin.to_dict() if origin is not None else None)  # fmt: skip
        self._changed()

    async def _admitted(self) -> None:
        """Wait until the turn's message is stored, when its write was still under way
        at the start (see ``question``); then the turn's start, and what it held, are
        emitted.  Raises :class:`_NotStored` when that write failed."""
        question = self._question
        if question is None:
            return
        try:
            rows = await asyncio.shield(question)
        except Exception as exc:
            raise _NotStored() from exc
        self._question = None
        self.message = rows[0]
        self._started()
        held, self._held = self._held, []
        for cls, fields in held:
            self.events.emit(cls, self.run_id, **fields)

    def plugin_emit(self, cls: type, **fields: Any) -> None:
        """The ``emit`` interception hooks get: publish an event of a plugin's own
        declared kind in this turn's stream (see :func:`~agentik.core.events.declare_event`)."""
        if not declared_event(cls):
            raise PluginError(
                f"{getattr(cls, '__qualname__', cls)!r} is not a declared event kind"
                " (subclass PluginEvent and decorate it with @declare_event)"
            )
        try:
            json.dumps(fields, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise PluginError(
                f"event {cls.__qualname__}: a field JSON cannot carry: {exc}"
            ) from None
        self._emit(cls, **fields)

    # -- status and steering -------------------------------------------------------
    @property
    def status_state(self) -> StatusState:
        """The turn's state: ``awaiting_human`` while a person is asked, else its phase."""
        return "awaiting_human" if self._waiting_approvals > 0 else self.phase

    def _set_phase(self, phase: StatusState) -> None:
        self.phase = phase
        self._changed()

    def _changed(self) -> None:
        if self._on_status is not None and self._question is None:
            self._on_status(self)

    @contextlib.contextmanager
    def waiting_for_human(self) -> Iterator[None]:
        """While inside, the turn waits for a person (state ``awaiting_human``) and
        its time budget is paused.  Nested and concurrent uses count."""
        self._pause_budget(True)
        try:
            yield
        finally:
            self._pause_budget(False)

    def steer(self, item: Steered) -> bool:
        """Take ``item`` into this turn at its next model request; ``False``: too late
        (no request is sure to follow), the caller queues it as a turn instead."""
        if not self.steer_open or self.interrupt_requested or self.finished:
            return False
        self._steered.append(item)
        return True

    def take_steered(self) -> list[Steered]:
        """The steering messages this turn did not reach (it ended before its next
        request: interrupted, failed); none are left here afterwards."""
        left, self._steered = self._steered, []
        return left

    async def _take_in_steered(self) -> None:
        """The boundary: messages sent into the turn join the working memory, in order."""
        self.steer_open = False
        while self._steered:
            await self._admitted()
            item = self._steered[0]
            try:
                rows = await asyncio.shield(item.committed)
            except Exception:
                self._steered.pop(0)  # not recorded: its sender got the error
                continue
            self._steered.pop(0)
            self._append(
                memory=[user_chat_message(rows[0])]
            )  # fmt: skip
            item.taken = True

    def _append(
        self,
        *,
        log: Sequence[NewMessage] = (),
        memory: Sequence[ChatMessage] = (),
        ended: str | None = None,
        defer: bool = False,
    ) -> asyncio.Future[list[Message]]:
        """Queue a write to both logs; the WM cache is updated at once.

        The write runs in its own task, so it lands even if this turn is
        cancelled while waiting for the commit; the caller awaits the commit,
        and the turn does not end before every write it started has settled.
        ``ended`` records the turn's end (its outcome) in the same transaction.
        """
        run = None
        if ended is not None and self.node.stored:
            # A run of a run tree: its row goes in with its end, one transaction.
            run = self.services.agent.run_record(self.node, stop_reason=ended)
            self._run_written = True
        fut = self.memory.append(
            log=log, memory=memory, run_id=self.run_id, ended=ended, run=run, defer=defer
        )
        self._writes.add(fut)
        fut.add_done_callback(self._write_done)
        return fut

    def _write_done(self, fut: asyncio.Future[Any]) -> None:
        self._writes.discard(fut)
        error = None if fut.cancelled() else fut.exception()
        if error is not None:
            self.failed_writes.append(error)

    async def _settle_writes(self) -> None:
        while self._writes:
            await asyncio.wait(set(self._writes))

    def _new(self, kind: MessageKind, **fields: Any) -> NewMessage:
        return NewMessage(
            kind=kind,
            run_id=self.run_id,
            channel=self.conv.channel_key,
            created_at=time.time(),
            **fields,
        )

    # -- the turn ---------------------------------------------------------------
    async def run(self) -> None:
        try:
            await self._run()
        except _NotStored:
            # Its message was never stored (its sender got the error): nothing of
            # this turn was shown or written.
            self._held.clear()
            self.finished = True
            if self.node.parent is None:
                self.services.agent.runs.leave(self.run_id)
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                if not self.interrupt_requested:
                    raise asyncio.CancelledError from None  # a shutdown: it goes on
                task.uncancel()  # (``!stop``: the turn is over, as asked)

    async def _run(self) -> None:
        started = time.monotonic()
        m = self.message
        if self._question is None:
            self._started()
        try:
            if self.resumed:
                await self._prepare_resume()
            else:
                await self.memory.load(exclude_run=self.run_id)
            if not self.in_memory:
                # Queued behind other turns: the message joins the working
                # memory now.  Not awaited: the writer keeps order, and the
                # turn settles all its writes before it ends.
                self._append(
                    memory=[
                        *self.memory.take_notes(),
                        user_chat_message(m),
                    ]
                )
            async with asyncio.timeout(self.policy.time_budget) as budget:
                self._budget = budget
                self.node.deadline = budget.when()
                await self._steps()
        except TimeoutError:
            await self._keep_partial("interrupted", "time budget exceeded", ended="time_budget")
            self.state.stop_reason = "time_budget"
            self._emit(Interrupted, partial_text=self.state.final_text, reason="time_budget")
        except asyncio.CancelledError:
            # Asked to stop (``!stop``), the turn has ended; stopped by a
            # shutdown it has not: it is resumed at the next start.
            if not self.interrupt_requested:
                # Their approval stays pending: the resumed turn asks again.
                for call_id in self._awaiting_approval:
                    self.state.open_calls.pop(call_id, None)
            await self._keep_partial(
                "interrupted",
                "turn interrupted",
                ended="interrupted" if self.interrupt_requested else None,
            )
            self._emit(
                Interrupted,
                partial_text=self.state.final_text,
                reason="interrupt" if self.interrupt_requested else "shutdown",
            )
            self.state.stop_reason = "interrupted"
            if not self.interrupt_requested:
                await asyncio.shield(self._run_stored())
                self._end(started)
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
        except TurnAborted as exc:
            self.state.partial.clear()  # the aborted response is not recorded
            await self._keep_partial(
                "error", "turn aborted", ended="aborted", error=_failure("aborted", str(exc))
            )
            self.state.stop_reason = "aborted"
            self._emit(Error, message=f"turn aborted: {exc}", error_type="aborted")
        except (LLMError, StoreError) as exc:
            log.warning("conversation %s run %s failed: %s", self.conv.id, self.run_id, exc)
            await self._keep_partial(
                "error", str(exc), ended="error", error=_failure(type(exc).__name__, str(exc))
            )
            self.state.stop_reason = "error"
            self._emit(
                Error,
                message=str(exc),
                error_type=type(exc).__name__,
                retryable=getattr(exc, "retryable", False),
            )
        except Exception as exc:
            log.exception("conversation %s run %s crashed", self.conv.id, self.run_id)
            await self._keep_partial(
                "error", "internal error", ended="error",
                error=_failure("internal", f"internal error: {type(exc).__name__}"),
            )  # fmt: skip
            self.state.stop_reason = "error"
            self._emit(
                Error, message=f"internal error: {type(exc).__name__}", error_type="internal"
            )
        await self._admitted()
        await self._approvals_done()
        await self._run_stored()  # before the end is announced: readers find it
        self._end(started)

    async def _run_stored(self) -> None:
        """Record the end of a run that is part of a stored run tree."""
        node = self.node
        if node.stored and not self._run_written:
            try:
                await self.services.agent.store_run_ended(node, self.state.stop_reason)
            except Exception:
                log.exception("run %s: could not record its end in the run tree", self.run_id)

    async def _approvals_done(self) -> None:
        """The turn ended: approvals and questions a restart left for it that it did
        not ask again expire."""
        try:
            await self.services.approvals.run_ended(self.parts, self.run_id)
        except Exception:
            log.exception("run %s: could not expire its leftover approvals", self.run_id)
        try:
            # A run this process started (not resumed after a restart) can only
            # have left questions it asked here.
            fresh = not self.resumed
            await self.services.questions.run_ended(self.parts, self.run_id, fresh=fresh)
        except Exception:
            log.exception("run %s: could not expire its leftover questions", self.run_id)

    def is_awaiting_human(self) -> bool:
        """Whether this turn waits for a person now (an approval or a question):
        the ``awaiting_human`` state."""
        return self._waiting_approvals > 0

    def _pause_budget(self, paused: bool) -> None:
        """Stop the turn's time budget while a person is asked (approvals), resume after."""
        self._waiting_approvals += 1 if paused else -1
        self._changed()  # awaiting_human while anyone waits
        budget = self._budget
        if budget is None:
            return
        loop = asyncio.get_running_loop()
        if paused:
            if self._waiting_approvals == 1:
                when = budget.when()
                self._budget_left = None if when is None else max(0.0, when - loop.time())
                budget.reschedule(None)
        elif self._waiting_approvals == 0 and self._budget_left is not None:
            budget.reschedule(loop.time() + self._budget_left)

    async def _prepare_resume(self) -> None:
        """Make the committed state of a cut-off turn a valid context to re-run from.

        The working memory is reloaded from the store.  If the message is not
        in it, the turn runs as if just queued.  If it is, what the cut-off
        turn committed after it stays: tool calls left without a result get
        an error result (audit log too), and a partial answer kept by a
        shutdown is followed by the message again, so the model answers it
        anew rather than continuing mid-sentence.
        """
        memory, m = self.memory, self.message
        memory.invalidate()
        await memory.load(exclude_run=self.run_id)
        await self._resume_steered()
        cache = memory.messages
        at = next((i for i, cm in enumerate(cache) if cm.message_id == m.id), None)
        covered = any(cm.role == "system" and (cm.message_id or 0) >= m.id for cm in cache)
        if at is None and not covered:
            return  # never reached working memory: the normal path adds it
        self.in_memory = True
        tail = cache[at + 1 :] if at is not None else []
        answered = {cm.tool_call_id for cm in tail if cm.role == "tool"}
        for cm in tail:
            for call in cm.tool_calls or ():
                if call.id not in answered:
                    self.state.open_calls[call.id] = call
        # A call that waited for a person's approval is asked again from the
        # stored call, not left to the model calling it again (it often did not).
        waiting = await self.services.approvals.awaiting(self.parts.id, self.run_id)
        self._reask = [c for c in self.state.open_calls.values() if c.id in waiting]
        for c in self._reask:
            del self.state.open_calls[c.id]
        if self.state.open_calls:
            await self._keep_partial("interrupted", "the process was restarted")
            await memory.load(exclude_run=self.run_id)
        elif self._reask:
            pass  # the calls run first; their results follow the stored call
        elif tail and tail[-1].role == "assistant":
            await self._append(memory=[user_chat_message(m)])
        log.info("conversation %s: resuming run %s after a restart", self.parts.id, self.run_id)

    async def _resume_steered(self) -> None:
        """Messages sent into this run before the cut-off that never reached the
        working memory join it at the resumed turn's first request."""
        cache = self.memory.messages
        known = {cm.message_id for cm in cache}
        covered = max((cm.message_id or 0 for cm in cache if cm.role == "system"), default=0)
        rows = await self.memory.store.messages(
            self.parts.id, after=max(self.message.id, covered), kinds=["user"], limit=1000
        )
        loop = asyncio.get_running_loop()
        for r in rows:
            steered = isinstance(r.data, dict) and r.data.get("steered")
            if r.run_id == self.run_id and steered and r.id not in known:
                done: asyncio.Future[list[Message]] = loop.create_future()
                done.set_result([r])
                self._steered.append(Steered(r.content, r.author, done))

    def _end(self, started: float) -> None:
        self.steer_open = False
        self.finished = True
        self.running_tools = []
        self._changed()
        node = self.node
        ended = self.events.emit(
            TurnEnded,
            self.run_id,
            stop_reason=self.state.stop_reason,
            # The run's own model usage and its child runs'.
            usage=node.usage,
            text=self.state.final_text,
            tool_calls=self.state.tool_calls,
            duration=time.monotonic() - started,
        )
        if node.ended is not None and not node.ended.done():
            node.ended.set_result(ended)
        self._emit(RunStreamEnd)
        if node.parent is None:
            self.services.agent.runs.leave(self.run_id)

    async def _keep_partial(
        self,
        status: MessageStatus,
        why: str,
        *,
        ended: str | None = None,
        error: dict[str, str] | None = None,
    ) -> None:
        """Record the partial answer and close every open tool call (and the turn's end).

        ``error`` (a failed turn: its type and short message) goes into the audit
        log with the answer, in ``data["error"]``: with the partial answer's row, or
        an empty answer of its own (``status="error"``) when nothing was said, so
        the history says why a question has no answer.  Never into the working
        memory: the model does not see our failures."""
        await self._admitted()
        # Whatever was queued may or may not be in the cache: reload next turn.
        self.memory.invalidate()
        log_rows: list[NewMessage] = []
        memory: list[ChatMessage] = []
        text = "".join(self.state.partial)
        self.state.partial.clear()
        self.state.final_text = text
        if text:
            data = {"error": error} if error is not None else None
            log_rows.append(self._new("assistant", content=text, status=status, data=data))
            memory.append(ChatMessage(role="assistant", content=text))
        elif error is not None:
            log_rows.append(
                self._new("assistant", content="", status=status, data={"error": error})
            )
        for call in self.state.open_calls.values():
            result = f"error: tool call not completed ({why})"
            log_rows.append(
                self._new(
                    "tool_result",
                    content=result,
                    tool_call_id=call.id,
                    tool_name=call.name,
                    is_error=True,
                    status=status,
                )
            )
            memory.append(
                ChatMessage(
                    role="tool", content=result, tool_call_id=call.id, name=call.name, is_error=True
                )
            )
        self.state.open_calls.clear()
        if ended is not None:
            # The turn's end must be recorded, or the next start answers its
            # message again: kept and written again while the database is
            # only locked, full or read-only (the conversation waits meanwhile).
            await asyncio.shield(self._record_end(log_rows, memory, ended))
        elif log_rows or memory:
            fut = self._append(log=log_rows, memory=memory)
            fut.add_done_callback(self._log_failed_partial)
        # Everything this turn wrote must be committed before the next turn
        # reloads the working memory.
        await asyncio.shield(self._settle_writes())

    async def _record_end(
        self, log_rows: list[NewMessage], memory: list[ChatMessage], ended: str
    ) -> None:
        delay = END_RETRY_FIRST
        while True:
            try:
                fut = self._append(log=log_rows, memory=memory, ended=ended)
            except ClosedError:  # stopped meanwhile: resumed at the next start
                return
            await asyncio.wait([fut])
            error = None if fut.cancelled() else fut.exception()
            if error is None:
                return
            if not (isinstance(error, StoreError) and error.retryable):
                self._log_failed_partial(fut)
                return
            log.error(
                "could not record the end of run %s (%s): trying again in %.1f s",
                self.run_id, error, delay,
            )  # fmt: skip
            await asyncio.sleep(delay)
            delay = min(delay * 2, END_RETRY_MAX)

    def _log_failed_partial(self, fut: asyncio.Future[Any]) -> None:
        if not fut.cancelled() and fut.exception() is not None:
            log.error(
                "could not record the partial answer of run %s: %s", self.run_id, fut.exception()
            )

    async def _steps(self) -> None:
        services = self.services
        await self._recall()
        if self._reask:
            calls, self._reask = self._reask, []
            self.state.open_calls.update((c.id, c) for c in calls)
            await self._run_tools(calls)
        while True:
            if self.node.over_budget():
                # Used up (this run's or an ancestor's budget, perhaps by a child
                # run): no further model request.
                await self._end_early("", [], "token_budget")
                return
            await self._take_in_steered()
            no_tools = self.state.tools_exhausted
            offered = (
                []
                if no_tools or not self.llm.supports_tools
                else [spec_of(t) for t in self.tools.values() if t.name not in self.hidden]
            )
            request, backend = await self._fitted_request(offered)
            hold = services.hooks.implemented("after_response")
            try:
                text, calls, finish = await self._stream(request, backend, hold=hold)
            except ContextTooLong as exc:
                # The model refused the request as too large before answering:
                # shrink the context and try once more (a second refusal ends the turn).
                if self.state.partial:
                    raise
                await services.compactor.after_refusal(
                    self.parts,
                    request,
                    exc,
                    run_id=self.run_id,
                    settle=self._settled,
                    llm=self.llm,
                )
                request, backend = await self._fitted_request(offered)
                text, calls, finish = await self._stream(request, backend, hold=hold)
            if hold:
                text = await self._after_response(text, calls)
            if calls and no_tools:
                # Asked for an answer without tools, the model called tools
                # again: end here rather than loop until the time budget.
                await self._end_early(text, calls, "tool_limit")
                return
            if calls and self.node.over_budget():
                await self._end_early(text, calls, "token_budget")
                return
            if not calls:
                self.state.partial.clear()
                self.state.final_text = text[: self.policy.max_answer_chars]
                # A provider's content filter is kept: the channel says why nothing came.
                reason = finish if finish in ("length", "content_filter") else "stop"
                node = self.node
                # A child run's answer is its parent's tool result, written next:
                # its last write is handed over and commits with it (one
                # transaction; see agentik.core.agents, "Durability").
                handover = node.parent is not None and node.ended is not None
                final = self._append(
                    log=[self._new("assistant", content=text)],
                    memory=[ChatMessage(role="assistant", content=self._answer_for_memory(text))],
                    ended=reason,
                    defer=handover,
                )
                if handover:
                    self._writes.discard(final)
                    node.final_write = final
                else:
                    try:
                        await final
                    except StoreError:
                        # Sent, not recorded: recorded with the turn's end (as an error).
                        self.state.partial.append(text)
                        raise
                await self._settled()
                self.state.stop_reason = reason
                return
            self.state.partial.clear()
            rows = [self._new("assistant", content=text)] if text else []
            rows += [
                self._new("tool_call", tool_call_id=c.id, tool_name=c.name, arguments=c.arguments)
                for c in calls
            ]
            self.state.open_calls.update((c.id, c) for c in calls)
            await self._append(
                log=rows,
                memory=[
                    ChatMessage(
                        role="assistant",
                        content=self._answer_for_memory(text),
                        tool_calls=tuple(self._call_for_memory(c) for c in calls),
                    )
                ],
            )
            await self._run_tools(calls)
            if self.state.compact:
                self.state.compact = False
                await self._settled()
                await services.compactor.compact(
                    self.parts, reason="tool", run_id=self.run_id, tools=offered
                )
            if self.state.aborted is not None:
                raise TurnAborted(self.state.aborted)
            if self.state.end_turn is not None:
                await self._ended_by_tool(self.state.end_turn)
                return

    async def _fitted_request(self, offered: list[ToolSpec]) -> tuple[LLMRequest, LLMBackend]:
        """The next request, its context made to fit the model, after the request hooks."""
        services = self.services
        # The conversation's model profile (read per request: a channel's
        # ``!set model`` applies from its next step); its window fits the context.
        llm = self.llm
        request = self._request(offered)
        if await services.compactor.before_request(
            self.parts, request, run_id=self.run_id, settle=self._settled, llm=llm
        ):
            request = self._request(offered)
        request, llm = await services.hooks.before_llm_request(
            self.conv, request, llm, self.run_id, self.plugin_emit
        )
        if any(m.parts for m in request.messages):
            # Attachments as this model takes them: images with their bytes, or
            # described (agentik.core.attachments), read from the store now.
            messages = await for_model(
                request.messages,
                image_in=bool(llm.supports_image_in),
                load=self.memory.store.attachment_data,
            )
            request = dataclasses.replace(request, messages=messages)
        return request, llm

    # -- size limits: the audit log keeps everything, the working memory is cut ----
    def _answer_for_memory(self, text: str) -> str:
        cap = self.policy.max_answer_chars
        if len(text) <= cap:
            return text
        return text[:cap] + f"\n[… answer cut: too long ({len(text)} characters)]"

    def _too_big(self, call: ToolCall) -> bool:
        return len(call.arguments) > self.policy.max_tool_argument_chars

    def _call_for_memory(self, call: ToolCall) -> ToolCall:
        """``call`` as the working memory keeps it: oversized arguments become a
        small JSON object with a marker (still valid JSON for endpoints that
        parse them)."""
        if not self._too_big(call):
            return call
        marker = {"_cut": f"arguments too large ({len(call.arguments)} characters); not run"}
        return dataclasses.replace(call, arguments=json.dumps(marker))

    def _limit_text(self, reason: str) -> str:
        if reason == "tool_limit":
            return f"the tool call limit ({self.policy.max_tool_calls} per turn) was reached"
        return "the token budget was used up"

    async def _end_early(self, text: str, calls: list[ToolCall], reason: StopReason) -> None:
        """End the turn at a limit (``reason``): the calls are logged, refused and not run."""
        await self._admitted()
        self.state.partial.clear()
        why = self._limit_text(reason)
        refusal = f"error: not run: {why}"
        rows = [self._new("assistant", content=text)] if text else []
        for c in calls:
            rows.append(
                self._new("tool_call", tool_call_id=c.id, tool_name=c.name, arguments=c.arguments)
            )
            rows.append(
                self._new(
                    "tool_result",
                    content=refusal,
                    tool_call_id=c.id,
                    tool_name=c.name,
                    is_error=True,
                )
            )
        # The working memory gets no dangling calls: just the answer so far, or
        # a note that the turn stopped, so the next turn starts from a valid context.
        note = f"(stopped: {why})"
        self.state.final_text = text[: self.policy.max_answer_chars]
        await self._append(
            log=rows,
            memory=[ChatMessage(role="assistant", content=self._answer_for_memory(text) or note)],
            ended=reason,
        )
        await self._settled()
        log.info("conversation %s run %s: %s; turn ended", self.conv.id, self.run_id, why)
        self.state.stop_reason = reason

    async def _settled(self) -> None:
        """Wait until every write of this turn is committed (compaction reads the store)."""
        await self._admitted()
        await self._settle_writes()
        if self.failed_writes:
            raise self.failed_writes[0]

    def _system(self) -> str | None:
        """The agent's system prompt, then the conversation's addition (if any)."""
        base = self.settings.system_prompt or self.services.system_prompt
        extra = self.settings.system_addition
        return "\n\n".join(p for p in (base, extra) if p) or None

    async def _recall(self) -> None:
        """Automatic recall for this turn's message (once, before the first request)."""
        memory = self.services.agent.memory
        policy = self.settings.recall or memory.recall_policy
        if not policy.enabled:
            return
        data = self.message.data if isinstance(self.message.data, dict) else {}
        scopes = scopes_for(
            channel=self.conv.channel_key,
            conversation_id=self.parts.id,
            author_id=data.get("author_id"),
            speakers=await self.conv.speakers(),
        )
        self._recalled = await recall_for(memory, policy, self.message.content, scopes)

    def _request(self, offered: list[ToolSpec]) -> LLMRequest:
        return LLMRequest(
            messages=with_recall(_close_dangling(self.memory.messages), self._recalled),
            system=self._system(),
            tools=offered,
            tool_choice="auto" if offered else "none",
            conversation_id=self.parts.id,
        )

    # -- interception hooks ---------------------------------------------------------
    async def _after_response(self, text: str, calls: list[ToolCall]) -> str:
        """Run the ``after_response`` hooks; emit the held-back text as they left it."""
        outcome = await self.services.hooks.after_response(
            self.conv, self.run_id, text, calls, self.plugin_emit
        )
        if isinstance(outcome, Abort):
            raise TurnAborted(outcome.reason)
        text = outcome
        # The held-back text goes out now, as the hooks left it.
        self.state.partial[:] = [text] if text else []
        shown = text[: self.policy.max_answer_chars]
        if shown:
            self._emit(ResponseStarted)
            self._emit(TextDelta, text=shown)
        return text

    async def _stream(
        self, request: LLMRequest, backend: LLMBackend, *, hold: bool = False
    ) -> tuple[str, list[ToolCall], str | None]:
        """:meth:`_stream_response`, timed for the agent's request observers (if any)."""
        if self.services.agent.prompt_events:
            self._render_prompt(request, backend)
        observers = self.services.agent.request_observers
        if not observers:
            return await self._stream_response(request, backend, hold=hold)
        before = self.state.usage
        self._first_item = None
        started = time.monotonic()
        outcome: Literal["ok", "error", "cancelled"] = "error"
        try:
            result = await self._stream_response(request, backend, hold=hold)
            outcome = "ok"
            return result
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            end = time.monotonic()
            first = self._first_item
            stats = RequestStats(
                backend=backend.name or type(backend).__name__,
                model=request.model or backend.model or "",
                duration=end - started,
                first_token=None if first is None else first - started,
                usage=Usage(
                    prompt_tokens=self.state.usage.prompt_tokens - before.prompt_tokens,
                    completion_tokens=self.state.usage.completion_tokens - before.completion_tokens,
                    total_tokens=self.state.usage.total_tokens - before.total_tokens,
                ),
                outcome=outcome,
                conversation_id=self.parts.id,
                run_id=self.run_id,
            )
            for observe in observers:
                try:
                    observe(stats)
                except Exception:
                    log.exception("a request observer failed")

    async def _stream_response(
        self, request: LLMRequest, backend: LLMBackend, *, hold: bool = False
    ) -> tuple[str, list[ToolCall], str | None]:
        """Stream one response; with ``hold`` the text is not emitted (hooks see it first).

        Past ``max_answer_chars`` the stream is closed (the backend stops the
        model) and the finish reason is ``length``: what was shown stops at the
        limit; the returned text is everything received.
        """
        partial = self.state.partial
        calls: list[ToolCall] = []
        finish: str | None = None
        reasoning = response = False
        cap = self.policy.max_answer_chars
        size = 0
        used = Usage()
        self.requests += 1
        gen = backend.stream(request)
        async with contextlib.aclosing(gen):  # type: ignore[type-var]
            first: asyncio.Future[Any] | None = None
            if self._question is not None:
                # The request goes out now; its answer is read once the message is stored.
                first = asyncio.ensure_future(anext(gen))
                try:
                    await self._admitted()
                except BaseException:
                    first.cancel()
                    await asyncio.wait([first])
                    if not first.cancelled():
                        first.exception()  # (read: the turn ends for its own reason)
                    raise
            self._set_phase("streaming")
            while True:
                try:
                    item = await first if first is not None else await anext(gen)
                except StopAsyncIteration:
                    break
                first = None
                if self._first_item is None and not isinstance(item, (UsageItem, FinishItem)):
                    self._first_item = time.monotonic()
                if isinstance(item, TextChunk):
                    partial.append(item.text)
                    piece = item.text
                    size += len(piece)
                    over = size > cap
                    if over:
                        piece = piece[: max(0, len(piece) - (size - cap))]
                    if not hold and piece:
                        if not response:
                            response = True
                            self._emit(ResponseStarted)
                        self._emit(TextDelta, text=piece)
                    if over:
                        log.info(
                            "run %s: answer longer than %d characters; stream stopped",
                            self.run_id,
                            cap,
                        )
                        self._emit_usage(used, backend)
                        return "".join(partial), [], "length"
                elif isinstance(item, ReasoningChunk):
                    if not reasoning:
                        reasoning = True
                        self._emit(ReasoningStarted)
                    self._emit(ReasoningDelta, text=item.text)
                elif isinstance(item, ToolCallItem):
                    calls.append(item.call)
                elif isinstance(item, UsageItem):
                    used = used + item.usage
                    self.state.usage = self.state.usage + item.usage
                    self.node.add_usage(item.usage)
                elif isinstance(item, FinishItem):
                    finish = item.reason
        self._emit_usage(used, backend)
        return "".join(partial), calls, finish

    def _emit_usage(self, used: Usage, backend: LLMBackend) -> None:
        """The ``usage`` event of one finished model request."""
        self._emit(
            RequestUsage,
            usage=used,
            model=getattr(backend, "model", "") or "",
            backend=getattr(backend, "name", "") or type(backend).__name__,
            request=self.requests,
        )

    # -- tools --------------------------------------------------------------------
    async def _run_tools(self, calls: list[ToolCall]) -> None:
        runnable: list[ToolCall] = []
        refused: list[ToolCall] = []
        too_big: list[ToolCall] = []
        for c in calls:
            if self.state.tool_calls >= self.policy.max_tool_calls:
                refused.append(c)
            else:
                self.state.tool_calls += 1
                (too_big if self._too_big(c) else runnable).append(c)
        if self.state.tool_calls >= self.policy.max_tool_calls:
            # The cap is used up: the model is asked for a final answer without
            # tools next (and a tool call then ends the turn).
            self.state.tools_exhausted = True
        # A model request follows every tool batch: messages sent now steer it.
        self.steer_open = True
        self.running_tools = [c.name for c in calls]
        self._set_phase("executing_tools")
        async with asyncio.TaskGroup() as tg:
            for c in runnable:
                tg.create_task(self._run_tool(c))
            for c in refused:
                msg = (
                    f"error: tool call limit reached ({self.policy.max_tool_calls} per turn);"
                    " answer with what you have"
                )
                tg.create_task(
                    self._finish_tool(c, ToolResult(text=msg, is_error=True), 0.0, started=False)
                )
            for c in too_big:
                msg = (
                    f"error: tool call refused: its arguments are too large ({len(c.arguments)}"
                    f" characters; the limit is {self.policy.max_tool_argument_chars})"
                )
                tg.create_task(
                    self._finish_tool(
                        self._call_for_memory(c),
                        ToolResult(text=msg, is_error=True),
                        0.0,
                        started=False,
                    )
                )

    async def _run_tool(self, call: ToolCall) -> None:
        hooks, conv, run_id = self.services.hooks, self.conv, self.run_id
        emit = self.plugin_emit
        call, block = await hooks.before_tool_call(conv, run_id, call, emit)
        refused = None if block is not None else await self._approval(call)
        self._emit(ToolCallStarted, call_id=call.id, name=call.name, arguments=call.arguments)
        t0 = time.monotonic()
        if block is not None:
            result = ToolResult(text=f"blocked: {block.reason}", is_error=True)
        elif refused is not None:
            result = ToolResult(text=refused, is_error=True)
        else:
            result = await self._invoke(call)
            attempt = 1
            while result.is_error and attempt <= self.policy.max_tool_retries:
                retry = await hooks.on_tool_error(conv, run_id, call, result, attempt, emit)
                if retry is None:
                    break
                if isinstance(retry, Abort):
                    # The error stands as the call's result; the turn ends after the batch.
                    if self.state.aborted is None:
                        self.state.aborted = retry.reason
                    break
                if retry.delay > 0:
                    await asyncio.sleep(retry.delay)
                attempt += 1
                result = await self._invoke(call)
            result = await hooks.after_tool_call(conv, run_id, call, result, emit)
        if not result.is_error:
            for effect in result.effects:
                if isinstance(effect, EndTurn) and self.state.end_turn is None:
                    self.state.end_turn = effect
        await self._finish_tool(call, result, time.monotonic() - t0)

    async def _approval(self, call: ToolCall) -> str | None:
        """Wait for a person's approval when a rule asks for it; ``None``: go ahead,
        else the error text the model gets instead of a result."""
        approvals = self.services.approvals
        if not approvals.rules or call.name not in self.tools:
            return None
        rule = approvals.rule_for(call.name, self.conv.channel_key)
        if rule is None or rule.approve == "never":
            return None
        if self.conv.temp:
            return (
                "error: not run: this tool needs approval,"
                " which a temporary conversation cannot ask for"
            )
        data = self.message.data if isinstance(self.message.data, dict) else {}
        # Kept when cancelled (a shutdown): the turn's end leaves the call open.
        self._awaiting_approval.add(call.id)
        refusal = await approvals.gate(
            self.parts,
            self.run_id,
            call,
            asker=self.message.author,
            asker_id=data.get("author_id"),
            interrupted=lambda: self.interrupt_requested,
            paused=self._pause_budget,
        )
        self._awaiting_approval.discard(call.id)
        return refusal

    async def _invoke(self, call: ToolCall) -> ToolResult:
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            return ToolResult(
                text=f"error: unknown tool {call.name!r} (available: {known})", is_error=True
            )
        try:
            args = json.loads(call.arguments or "{}")
        except json.JSONDecodeError as exc:
            return ToolResult(text=f"error: arguments are not valid JSON: {exc}", is_error=True)
        if not isinstance(args, dict):
            return ToolResult(text="error: arguments must be a JSON object", is_error=True)
        data = self.message.data if isinstance(self.message.data, dict) else {}
        human = getattr(tool, "waits_for_human", False)
        t0 = time.monotonic()

        def emit(cls: type[Event], **fields: Any) -> None:
            self._emit(cls, **fields)

        async def progress(done: float, total: float | None, message: str | None) -> None:
            self._emit(
                ToolProgress, call_id=call.id, name=call.name, progress=done, total=total,
                message=message, elapsed=time.monotonic() - t0,
            )  # fmt: skip

        context = ToolContext(
            conversation_id=self.parts.id,
            run_id=self.run_id,
            call_id=call.id,
            author=self.message.author,
            channel=self.conv.channel_key,
            author_id=data.get("author_id"),
            speakers=await self.conv.speakers(),
            human=None if self.conv.temp else _Human(self, call.id),
            emit=emit,
            progress=progress,
            compact=self._ask_compaction,
        )
        try:
            # A person's answer has its own deadline: the tool timeout is for machines.
            async with asyncio.timeout(None if human else self.policy.tool_timeout):
                raw = await tool.call(args, context)
        except TimeoutError:
            return ToolResult(
                text=f"error: tool timed out after {self.policy.tool_timeout:g}s", is_error=True
            )
        except asyncio.CancelledError:
            raise
        except ToolError as exc:
            # Raised on purpose: its message is the tool's word to the model.
            log.info("tool %s failed: %s", call.name, exc)
            return ToolResult(text=f"error: {exc}", is_error=True)
        except Exception as exc:
            # Anything else is a bug or an accident inside the tool: its text
            # (paths, library internals) is not for the model nor the channel.
            ref = secrets.token_hex(3)
            log.error(
                "tool %s failed (ref %s) in conversation %s run %s",
                call.name, ref, self.conv.id, self.run_id, exc_info=exc,
            )  # fmt: skip
            return ToolResult(
                text=f"error: tool {call.name} failed (internal error, ref {ref})",
                data={"exception": type(exc).__name__, "ref": ref},
                is_error=True,
            )
        if isinstance(raw, ToolResult):
            asks = [e for e in raw.effects if isinstance(e, AskUser)]
            if asks and not raw.is_error:
                return await self._ask_for(raw, asks, context)
            return raw
        if isinstance(raw, str):
            return ToolResult(text=raw)
        return ToolResult(text=json.dumps(raw, ensure_ascii=False, default=str), data=raw)

    async def _finish_tool(
        self, call: ToolCall, result: ToolResult, duration: float, *, started: bool = True
    ) -> None:
        if not started:
            self._emit(ToolCallStarted, call_id=call.id, name=call.name, arguments=call.arguments)
        text = result.text
        cap = self.policy.max_tool_result_chars
        if result.is_error:
            cap = min(cap, MAX_TOOL_ERROR_CHARS)
        if len(text) > cap:
            text = text[:cap] + f"\n[… result cut: too long ({len(result.text)} characters)]"
        self.state.open_calls.pop(call.id, None)
        with contextlib.suppress(ValueError):
            self.running_tools.remove(call.name)
        write = self._append(
            log=[
                self._new(
                    "tool_result",
                    content=result.text,
                    tool_call_id=call.id,
                    tool_name=call.name,
                    is_error=result.is_error,
                    data=result.data,
                    duration=duration,
                )
            ],
            memory=[
                ChatMessage(
                    role="tool",
                    content=text,
                    tool_call_id=call.id,
                    name=call.name,
                    is_error=result.is_error,
                )
            ],
        )
        self._emit(
            ToolCallEnded,
            call_id=call.id,
            name=call.name,
            result=text,
            is_error=result.is_error,
            duration=duration,
        )
        await write

    async def _ask_compaction(self) -> str | None:
        """``compact_context``: ``None`` (compaction follows this step) or why not."""
        services = self.services
        tokens = estimate_tokens(self.memory.messages, self._system())
        refusal = services.compactor.tool_refusal(self.parts.id, tokens)
        if refusal is None:
            self.state.compact = True
        return refusal

    async def _ask_for(
        self, result: ToolResult, asks: list[AskUser], context: ToolContext
    ) -> ToolResult:
        """A tool's :class:`AskUser` effects, asked in turn as ``ask_user`` asks: each
        answer (or that nobody answered) follows the tool's own text."""
        from .questions import AskUserTool

        policy = self.policy
        asker = AskUserTool(
            timeout=policy.ask_user_timeout,
            max_timeout=policy.ask_user_max_timeout,
            answer_from=policy.answer_from,
            max_questions=policy.ask_user_max_questions,
        )
        parts = [result.text]
        answers: list[Any] = []
        for ask in asks:
            try:
                got = await asker.call(
                    {"question": ask.question, "choices": list(ask.choices)}, context
                )
                parts.append(got.text)
                answers.append(got.data)
            except ToolError as exc:
                parts.append(f"could not ask {ask.question!r}: {exc}")
                answers.append(None)
        data = {"result": result.data, "answers": answers}
        effects = tuple(e for e in result.effects if not isinstance(e, AskUser))
        return ToolResult(text="\n\n".join(p for p in parts if p), data=data, effects=effects)

    async def _ended_by_tool(self, effect: EndTurn) -> None:
        """A tool's :class:`EndTurn`: the turn ends here, its answer (if any) recorded
        and shown as if the model had written it."""
        text = effect.answer[: self.policy.max_answer_chars]
        if text:
            self._emit(ResponseStarted)
            self._emit(TextDelta, text=text)
        self.state.final_text = text
        await self._append(
            log=[self._new("assistant", content=text)] if text else [],
            # The working memory gets an answer after the tool results either way, so
            # the next turn starts from a valid context.
            memory=[
                ChatMessage(role="assistant", content=text or "(the turn was ended by a tool)")
            ],
            ended="stop",
        )
        await self._settled()
        self.state.stop_reason = "stop"

    def _render_prompt(self, request: LLMRequest, backend: LLMBackend) -> None:
        """The ``prompt_rendered`` event of a request about to go (known secrets scrubbed)."""
        scrub = _scrubber(self.services.hooks)
        messages = []
        for m in request.messages:
            entry: dict[str, Any] = {"role": m.role, "content": scrub(m.content or "")}
            if m.name:
                entry["name"] = m.name
            if m.author:
                entry["author"] = m.author
            if m.tool_call_id:
                entry["tool_call_id"] = m.tool_call_id
            if m.tool_calls:
                entry["tool_calls"] = [
                    {"id": c.id, "name": c.name, "arguments": scrub(c.arguments)}
                    for c in m.tool_calls
                ]
            messages.append(entry)
        self._emit(
            PromptRendered,
            request=self.requests + 1,
            model=request.model or getattr(backend, "model", "") or "",
            backend=getattr(backend, "name", "") or type(backend).__name__,
            system=scrub(request.system) if request.system else request.system,
            messages=tuple(messages),
            tools=tuple(t.name for t in request.tools),
        )


def _scrubber(hooks: Any) -> Callable[[str], str]:
    """What scrubs a rendered prompt: the bot's scrubber (``[redaction]``, with its
    patterns) when it is registered, else one with the built-in patterns."""
    from .redaction import PatternScrubber

    pm = getattr(hooks, "pm", None)
    plugin = pm.get_plugin("agentik-scrubber") if pm is not None else None
    if not isinstance(plugin, PatternScrubber):
        plugin = _BUILTIN_SCRUBBER[0] if _BUILTIN_SCRUBBER else None
        if plugin is None:
            plugin = PatternScrubber()
            _BUILTIN_SCRUBBER.append(plugin)
    return plugin.scrub


_BUILTIN_SCRUBBER: list[Any] = []


class _Human:
    """What ``ask_user`` gets in its :class:`ToolContext`: ask this turn's conversation."""

    __slots__ = ("call_id", "turn")

    def __init__(self, turn: TurnRunner, call_id: str) -> None:
        self.turn = turn
        self.call_id = call_id

    async def ask(
        self,
        text: str,
        *,
        to: str | None,
        choices: tuple[str, ...],
        answer_from: Any,
        wait: float,
        form: tuple[dict[str, Any], ...] = (),
    ) -> Any:
        turn = self.turn
        return await turn.services.questions.ask(
            turn.parts, turn.run_id, self.call_id, text, to=to, choices=choices,
            answer_from=answer_from, wait=wait, form=form,
            interrupted=lambda: turn.interrupt_requested, paused=turn._pause_budget,
        )  # fmt: skip


def _close_dangling(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """``messages`` with an error result after every tool call that has none.

    A call can be left without a result in the stored context: a turn that
    waited for an approval across a shutdown or kill -9 and was not resumed
    (its approval expired).  Endpoints refuse a request with such a call
    ("must be followed by tool messages"), so the request gets a result
    saying the call never completed; the stored context is not changed.
    """
    out: list[ChatMessage] | None = None
    i, n = 0, len(messages)
    while i < n:
        m = messages[i]
        i += 1
        if m.role != "assistant" or not m.tool_calls:
            if out is not None:
                out.append(m)
            continue
        j = i
        while j < n and messages[j].role == "tool":
            j += 1
        answered = {r.tool_call_id for r in messages[i:j]}
        missing = [c for c in m.tool_calls if c.id not in answered]
        if missing and out is None:
            out = list(messages[: i - 1])
        if out is not None:
            out.append(m)
            out.extend(messages[i:j])
            out.extend(
                ChatMessage(
                    role="tool",
                    content="error: tool call not completed (the turn was cut off)",
                    tool_call_id=c.id,
                    name=c.name,
                    is_error=True,
                )
                for c in missing
            )
        i = j
    return list(messages) if out is None else out


_ADDRESS = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.IGNORECASE)
_SECRET = re.compile(r"\b(sk|xox[a-z]|ghp|Bearer)[-_ ]?[A-Za-z0-9_\-.]{6,}")


def _failure(kind: str, message: str) -> dict[str, str]:
    """A failed turn as the audit log keeps it: its type and a short message without
    addresses or keys (an endpoint's URL, a token a library put in its message: the
    whole error is in the bot's log, which only the operator reads)."""
    text = _SECRET.sub("(secret hidden)", _ADDRESS.sub("(address hidden)", message))
    text = " ".join(text.split())
    return {"type": kind, "message": text[:300] + ("…" if len(text) > 300 else "")}
