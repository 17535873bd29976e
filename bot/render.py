"""The renderer: one channel's events turned into outgoing messages.

A :class:`Renderer` per open channel follows its conversation's events and
turns them into :class:`~agentik.transports.base.OutgoingMessage` values fitted
to the transport's :class:`~agentik.transports.base.ChannelCaps`: deltas as
they come, complete lines, or whole messages, split to the size limits; long
answers are capped at ``max_answer_lines`` and the rest kept for ``more``.
Events are dispatched by type (:meth:`Renderer.on_event`): text, tool calls
and their progress, approvals, questions, the checklist, child runs, errors
and the turn's end.

Manners in shared channels: with ``events = "auto"`` (the default) a shared
channel sees the answer, errors and interruptions only, while direct
conversations and threads also get one line per tool call.  An error is one
short line with a reference (``error: the model is unavailable right now
(ref 3f9a0c)``); its details (URLs, backend messages) go to the log, in an
ERROR line with the same reference, never to a channel.

It sends through a :class:`RenderHost` (the bridge), never importing it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from agentik.core.events import (
    ApprovalRequested,
    ApprovalResolved,
    ChildRunLinked,
    Compacted,
    Error,
    Event,
    Interrupted,
    QuestionAnswered,
    QuestionAsked,
    QuestionProgress,
    ReasoningDelta,
    ResponseStarted,
    TextDelta,
    TodoUpdated,
    ToolCallEnded,
    ToolCallStarted,
    ToolProgress,
    TurnEnded,
    TurnStarted,
)
from agentik.core.streamprofiles import BUILTIN_PROFILES, StreamProfile
from agentik.transports.base import Action, ChannelCaps, Form, FormField, OutgoingKind, Transport
from agentik.transports.text import split_lines, split_text

from .channel import OpenChannel
from .chat import article, error_line, is_fence, short_args, wait_text
from .outbox import Outbox, outbox_rows

if TYPE_CHECKING:
    from agentik.core import Agent

__all__ = ["AGENT_TOOL_PREFIX", "RenderHost", "Renderer"]

log = logging.getLogger(__name__)


class RenderHost(Protocol):
    """What a renderer uses of the bridge that runs it (the bridge implements it)."""

    agent: Agent
    #: Where outgoing pieces are persisted on an outbox transport.
    outbox: Outbox

    async def send(
        self,
        transport: Transport,
        key: str,
        text: str,
        kind: OutgoingKind,
        reply_to: object,
        run_id: str | None = None,
        *,
        piece: int | None = None,
        outbox_id: int | None = None,
        actions: tuple[Action, ...] = (),
        tag: str | None = None,
        updates: str | None = None,
        form: Form | None = None,
    ) -> int:
        """Send ``text`` to channel ``key``; how many pieces it took."""
        ...


#: A child run's events the channel shows as its own, whatever the profile:
#: its tool calls that wait for a person (they are answered here).
_CHILD_KINDS = frozenset({"approval_requested", "approval_resolved"})

#: Tools that run a sub-agent (``agent__<name>``): their call shows as the child
#: run's one line (``→ researcher: …``), not as a tool line.
AGENT_TOOL_PREFIX = "agent__"

#: Longest task text shown on a child run's line.
_CHILD_TASK_CHARS = 100


#: A renderer's maps and answer text until it writes to them (shared; never written).
_EMPTY: dict[Any, Any] = {}
_NO_TEXT: list[str] = []


@dataclass(slots=True)
class _ChildRun:
    """A child run seen in a channel: who, how deep, the root (channel) run, its text."""

    agent: str
    depth: int
    root: str | None
    buffer: str = ""


#: Turns that ended early get a short notice after what was said.
_STOP_NOTICES = {
    "length": "(answer cut: too long)",
    "tool_limit": "(stopped: tool call limit)",
    "token_budget": "(stopped: token budget used up)",
}


#: Ends already shown in the channel (an error line, ``(interrupted)``, a plugin's words).
_SHOWN_ENDS = frozenset({"error", "interrupted", "time_budget", "aborted"})

#: What a channel is told of a turn that ended without a visible answer.
_SILENT_END = "(no answer: the model ended its turn without writing one)"
_SILENT_ENDS = {"content_filter": "(no answer: the model's provider filtered it)"}


class Renderer:
    """Turns one channel's events into outgoing messages."""

    # One per open channel: no instance dict.
    __slots__ = (
        "buffer",
        "call_args",
        "ch",
        "children",
        "forms",
        "had_text",
        "host",
        "in_code",
        "lines_sent",
        "piece",
        "progress",
        "questions",
        "stream_hold",
        "stream_id",
        "stream_row",
        "stream_text",
        "todo_tag",
    )

    def __init__(self, host: RenderHost, ch: OpenChannel) -> None:
        self.host = host
        self.ch = ch
        self.buffer = ""
        self.lines_sent = 0
        self.had_text = False
        #: This answer's lines so far leave a code block open (a fence line).
        self.in_code = False
        #: Pieces of this run sent so far (the outbox key's last part).
        self.piece = 0
        #: Streamed answer (deltas) on an outbox transport: its row and text.
        self.stream_id: int | None = None
        self.stream_text: list[str] = _NO_TEXT
        #: Its row written deferred, while the transport holds the answer (see
        #: :meth:`_stream_row`), and how many characters it holds.
        self.stream_row: asyncio.Future[list[int]] | None = None
        self.stream_hold = 0
        # The maps below are the shared empty one until first written (:meth:`_own`):
        # a renderer lives as long as its open channel, most of them quiet.
        #: Questions shown (``ask_user``): id -> the text, to edit in the answer.
        self.questions: dict[int, str] = _EMPTY
        #: Forms shown (a multi-question ``ask_user``): id -> its fields.
        self.forms: dict[int, tuple[dict[str, Any], ...]] = _EMPTY
        #: The tag of the checklist message posted (``todo``) on an editing transport.
        self.todo_tag: str | None = None
        #: Tool calls that showed progress: call id -> when (monotonic) last shown.
        self.progress: dict[str, float] = _EMPTY
        #: Arguments of this turn's tool calls, by call id (a child run's task).
        self.call_args: dict[str, tuple[str, str]] = _EMPTY
        #: Child runs seen, by run id.
        self.children: dict[str, _ChildRun] = _EMPTY

    def _own(self, name: str) -> dict[Any, Any]:
        """This renderer's own map ``name`` to write to (made on the first write)."""
        found: dict[Any, Any] = getattr(self, name)
        if found is _EMPTY:
            found = {}
            setattr(self, name, found)
        return found

    @property
    def profile(self) -> StreamProfile:
        """The stream profile the channel is rendered from: its ``profile`` setting,
        else ``debug`` when ``events`` is ``debug``, else ``chat``."""
        named = self.ch.options.profile
        if named is not None:
            found = self.host.agent.stream_profiles.get(named)
            if found is not None:
                return found
        return BUILTIN_PROFILES["debug" if self.ch.options.events == "debug" else "chat"]

    @property
    def events(self) -> str:
        """The channel's ``events`` setting now (it may change while the channel is open)."""
        return self.ch.options.events

    @property
    def debug(self) -> bool:
        return self.ch.options.events == "debug" or self.ch.options.profile == "debug"

    @property
    def child_lines(self) -> bool:
        """Whether a child run gets its one line: unless the channel asked for
        ``answers`` only (``auto`` shows it, even in a shared channel)."""
        return self.events != "answers"

    @property
    def tool_lines(self) -> bool:
        """Whether tool calls get a line: not in a shared channel with ``answers``.

        ``auto`` decides per channel when the line is due: a direct
        conversation or a thread gets them, a shared channel does not.
        """
        if self.events == "auto":
            return self.ch.direct or self.ch.transport.in_thread(self.ch.key)
        return self.events != "answers"

    @property
    def caps(self) -> ChannelCaps:
        # Read each time: a transport may learn its limits after connecting.
        return self.ch.transport.caps

    def _reply_to(self, run_id: str | None) -> object:
        """Where the answer of ``run_id`` goes: the reply data of the message it answers."""
        return self.ch.run_reply_to.get(run_id or "", self.ch.reply_to)

    async def _approval(self, e: ApprovalRequested | ApprovalResolved) -> None:
        """An approval asked for (with buttons where the transport has them) or decided
        (the asking message is updated where the transport can edit)."""
        p = self.ch.options.command_prefix
        tag = f"approval:{e.conversation_id}:{e.approval_id}"
        if e.kind == "approval_requested":
            who = e.asker or "someone"
            again = "(asked again after a restart) " if e.resumed else ""
            text = (
                f"{again}approval {e.approval_id}: {who} asked me to run "
                f"{e.name}({short_args(e.arguments, 160)}). "
                f"{article(e.approvers)} may answer {p}approve {e.approval_id} [reason]"
                f" or {p}deny {e.approval_id} [reason] (expires in"
                f" {wait_text(e.expires_at - time.time())})"
            )
            actions = (
                Action(label="Approve", command=f"{p}approve {e.approval_id}", style="primary"),
                Action(label="Deny", command=f"{p}deny {e.approval_id}", style="danger"),
            )
            self.piece += await self.host.send(
                self.ch.transport, self.ch.key, text, "command", self._reply_to(e.run_id),
                e.run_id, piece=self.piece, actions=actions, tag=tag,
            )  # fmt: skip
            return
        what = {
            "approved": f"approved by {e.approver or 'someone'}",
            "denied": f"denied by {e.approver or 'someone'}",
            "expired": "expired",
            "cancelled": "cancelled",
        }[e.decision]
        reason = f": {e.reason}" if e.reason else ""
        text = f"approval {e.approval_id} ({e.name}): {what}{reason}"
        self.piece += await self.host.send(
            self.ch.transport, self.ch.key, text, "command", self._reply_to(e.run_id),
            e.run_id, piece=self.piece, updates=tag,
        )  # fmt: skip

    async def _tagged(
        self, text: str, run_id: str | None, *, tag: str | None = None, updates: str | None = None
    ) -> None:
        """A short message of the run that may later be edited (``tag``) or edits one
        (``updates``); never more than one piece."""
        caps = self.caps
        text = _fit(text, caps.max_bytes, caps.max_chars)
        self.piece += await self.host.send(
            self.ch.transport, self.ch.key, text, "command", self._reply_to(run_id), run_id,
            piece=self.piece, tag=tag, updates=updates,
        )  # fmt: skip

    async def _question(self, e: QuestionAsked | QuestionAnswered) -> None:
        """The model's question (``ask_user``), and how it ended."""
        tag = f"question:{e.conversation_id}:{e.question_id}"
        if e.kind == "question_asked" and e.form:
            await self._form(e, tag)
            return
        if e.kind == "question_answered" and e.question_id in self.forms:
            await self._form_ended(e, tag)
            return
        if e.kind == "question_asked":
            again = "(asked again after a restart) " if e.resumed else ""
            who = f"@{e.to}: " if e.to else ""
            choices = f" ({' / '.join(e.choices)})" if e.choices else ""
            self._own("questions")[e.question_id] = f"{who}{e.question}{choices}"
            await self._tagged(f"{again}{who}{e.question}{choices}", e.run_id, tag=tag)
            return
        asked = self.questions.pop(e.question_id, "")
        if e.outcome == "answered":
            if self.caps.can_edit and asked:
                # The question now shows its answer (nothing new to say on IRC:
                # the answer is in the channel, the bot's reply follows).
                by = e.answered_by or "someone"
                await self._tagged(f"{asked} — {by}: {e.answer}", e.run_id, updates=tag)
            return
        what = "nobody answered in time" if e.outcome == "expired" else "question cancelled"
        text = f"{asked} — ({what})" if asked else f"({what})"
        await self._tagged(text, e.run_id, updates=tag if self.caps.can_edit else None)

    # -- forms: several questions at once (a multi-question ``ask_user``) ---------------------
    async def _form(self, e: QuestionAsked, tag: str) -> None:
        """A form, as the channel shows one (:attr:`ChannelCaps.forms`): numbered
        lines all at once, the first prompt of several, or the transport's own."""
        p = self.ch.options.command_prefix
        fields = e.form
        self._own("forms")[e.question_id] = fields
        again = "(asked again after a restart) " if e.resumed else ""
        who = f"@{e.to}: " if e.to else ""
        self._own("questions")[e.question_id] = f"{who}{e.question}"
        style = self.caps.forms
        how = (
            f"{len(fields)} questions; answer each with {p}answer <n> <text>, or one line"
            " each in order"
            + (f" ({SKIP_WORD} skips an optional one)" if any(not f.get("required", True)
                                                          for f in fields) else "")
        )  # fmt: skip
        head = f"{again}{who}{e.question} — {how}"
        if style == "native":
            form = Form(
                question_id=e.question_id,
                fields=tuple(
                    FormField(id=f["id"], label=f["text"], choices=tuple(f.get("choices") or ()),
                              required=bool(f.get("required", True)))
                    for f in fields
                ),
                submit=f"{p}answer #{e.question_id}",
                answered=e.answered,
            )  # fmt: skip
            self.piece += await self.host.send(
                self.ch.transport, self.ch.key, head, "command", self._reply_to(e.run_id),
                e.run_id, piece=self.piece, tag=tag, form=form,
            )  # fmt: skip
            return
        if style == "prompts":
            await self._tagged(head, e.run_id, tag=tag)
            first = next((i for i, f in enumerate(fields) if f["id"] not in e.answered), None)
            if first is not None:
                await self._say(_form_line(first, fields[first]), e.run_id)
            return
        await self._tagged(head, e.run_id, tag=tag)
        lines = [_form_line(i, f) for i, f in enumerate(fields) if f["id"] not in e.answered]
        await self._say("\n".join(lines), e.run_id)

    async def _form_progress(self, e: QuestionProgress) -> None:
        """Part of a form was answered: the next question (prompts), or what is left."""
        await self._flush(e.run_id)
        fields = self.forms.get(e.question_id)
        if not fields or e.next is None or self.caps.forms == "native":
            return
        index = next((i for i, f in enumerate(fields) if f["id"] == e.next), None)
        if index is None:
            return
        left = len(fields) - len(e.answered)
        if self.caps.forms == "prompts":
            await self._say(_form_line(index, fields[index]), e.run_id)
        else:
            await self._say(f"({left} left) next: {_form_line(index, fields[index])}", e.run_id)

    async def _form_ended(self, e: QuestionAnswered, tag: str) -> None:
        fields = self.forms.pop(e.question_id, ())
        asked = self.questions.pop(e.question_id, "")
        if e.outcome == "answered":
            if self.caps.can_edit:
                # The form now shows its answers (its inputs go).
                try:
                    answers = json.loads(e.answer) if e.answer else {}
                except ValueError:
                    answers = {}
                if not isinstance(answers, dict):
                    answers = {}
                shown = "; ".join(f"{f['text']} {answers.get(f['id']) or '—'}" for f in fields)
                by = e.answered_by or "someone"
                await self._tagged(f"{asked} — {by}: {shown}", e.run_id, updates=tag)
            return
        what = "not every question was answered in time" if e.outcome == "expired" else (
            "questions cancelled"
        )  # fmt: skip
        text = f"{asked} — ({what})" if asked else f"({what})"
        await self._tagged(text, e.run_id, updates=tag if self.caps.can_edit else None)

    async def _say(self, text: str, run_id: str | None) -> None:
        self.piece += await self.host.send(
            self.ch.transport, self.ch.key, text, "command", self._reply_to(run_id), run_id,
            piece=self.piece,
        )  # fmt: skip

    async def _todo(self, e: TodoUpdated) -> None:
        """The model's checklist: posted once and edited where the transport can
        edit, else one short line per update that changed an item's status."""
        items = e.items
        done = sum(1 for it in items if it.get("status") == "done")
        head = f"todo {done}/{len(items)}"
        if self.caps.can_edit:
            lines = [f"{_TODO_MARK.get(it.get('status', ''), '○')} {it.get('text', '')}"
                     for it in items]  # fmt: skip
            text = "\n".join([head, *lines])
            tag = f"todo:{e.conversation_id}:{e.run_id}"
            if self.todo_tag == tag:
                await self.host.send(
                    self.ch.transport, self.ch.key, text, "command", self._reply_to(e.run_id),
                    e.run_id, updates=tag,
                )  # fmt: skip
            else:
                self.todo_tag = tag
                self.piece += await self.host.send(
                    self.ch.transport, self.ch.key, text, "command", self._reply_to(e.run_id),
                    e.run_id, piece=self.piece, tag=tag,
                )  # fmt: skip
            return
        if not e.changed:
            return  # nothing changed state: nothing to say
        changed = "; ".join(
            f"{_TODO_MARK.get(items[i].get('status', ''), '○')} {items[i].get('text', '')}"
            for i in e.changed
            if i < len(items)
        )
        await self._tagged(f"{head}: {changed}", e.run_id)

    async def _progress(self, e: ToolProgress) -> None:
        """A running tool call's progress: one updating line where the transport can
        edit, else a line at most every ``progress_interval`` seconds."""
        now = time.monotonic()
        last = self.progress.get(e.call_id)
        if last is not None and now - last < self.ch.options.progress_interval:
            return
        self._own("progress")[e.call_id] = now
        text = f"⚙ {e.name}: {_progress_text(e.progress, e.total, e.message)}"
        tag = f"progress:{e.conversation_id}:{e.call_id}"
        if last is not None and self.caps.can_edit:
            await self.host.send(
                self.ch.transport, self.ch.key, text, "command", self._reply_to(e.run_id),
                e.run_id, updates=tag,
            )  # fmt: skip
            return
        await self._tagged(text, e.run_id, tag=tag)

    async def _progress_done(self, e: ToolCallEnded) -> None:
        """A call that showed progress ended: its line says so where it can be edited."""
        self.progress.pop(e.call_id, None)
        if self.caps.can_edit:
            verb = "failed" if e.is_error else "done"
            await self.host.send(
                self.ch.transport, self.ch.key, f"⚙ {e.name}: {verb} ({e.duration:.1f}s)",
                "command", self._reply_to(e.run_id), e.run_id,
                updates=f"progress:{e.conversation_id}:{e.call_id}",
            )  # fmt: skip
        elif e.is_error and self.tool_lines:
            result = e.result.replace("\n", " ")[:160]
            await self._out(f"⚙ {e.name} failed: {result}", "notice", e.run_id)

    async def _out(self, text: str, kind: OutgoingKind, run_id: str | None) -> None:
        reply_to = self._reply_to(run_id)
        if kind in ("delta", "end"):
            if kind == "delta" and self.ch.transport.outbox and run_id:
                await self._stream_row(text, run_id)
            await self.host.send(
                self.ch.transport, self.ch.key, text, kind, reply_to, run_id,
                outbox_id=self.stream_id,
            )  # fmt: skip
            return
        self.piece += await self.host.send(
            self.ch.transport, self.ch.key, text, kind, reply_to, run_id, piece=self.piece
        )

    async def _stream_row(self, text: str, run_id: str) -> None:
        """One outbox row per streamed answer: written at its first delta, completed at its end.

        While the transport holds the answer (:meth:`Transport.holds_answer
        <agentik.transports.base.Transport.holds_answer>`: a Slack reply shorter
        than ``stream_buffer`` is posted whole at its end) nothing of it goes out,
        so its row needs no write of its own: it is handed to the store deferred,
        and commits with the store's next write — the turn's last commit (the
        answer and its row, together), or the row completed at the end.  Once the
        answer may go out, its row is written before (a restart finds it).
        """
        if self.stream_text is _NO_TEXT:
            self.stream_text = []
        self.stream_text.append(text)
        if self.stream_id is not None:
            return
        transport, key, reply = self.ch.transport, self.ch.key, self._reply_to(run_id)
        rows = outbox_rows(transport, key, run_id, self.piece, "stream", [""], reply,
                           complete=False)  # fmt: skip
        if len(self.stream_text) == 1:
            self.stream_hold = transport.holds_answer(key, reply)
            if self.stream_hold > 0:
                self.stream_row = asyncio.ensure_future(self.host.outbox.add(rows, defer=True))
                self.stream_row.add_done_callback(_row_written)
        if self.stream_row is not None and sum(map(len, self.stream_text)) < self.stream_hold:
            return  # held: nothing of it is sent with this delta
        try:
            # (Written at once: a held row, not committed yet, goes in with it.)
            [self.stream_id] = await self.host.outbox.add(rows)
        except Exception:
            log.exception("could not persist a streamed answer for %s", self.ch.key)
            self.stream_row = None
            return
        self.piece += 1

    async def _stream_done(self, run_id: str | None) -> None:
        if not run_id or (self.stream_id is None and self.stream_row is None):
            return
        held = self.stream_id is None
        piece = self.piece if held else self.piece - 1
        rows = outbox_rows(self.ch.transport, self.ch.key, run_id, piece, "stream",
                           ["".join(self.stream_text)], self._reply_to(run_id))  # fmt: skip
        first = self.stream_row
        if held and first is not None and first.done() and _written(first):
            # Held whole, and its row is committed (it went in with the turn's end):
            # the text goes in with the record of its delivery (deferred, one commit).
            # A crash before that finds the row incomplete and takes the text from the
            # audit log; a post made but not recorded is found again by its metadata.
            [self.stream_id] = first.result()
            self.piece += 1
            done = asyncio.ensure_future(self.host.outbox.add(rows, defer=True))
            done.add_done_callback(_row_written)
            return
        try:
            # (Held whole, not committed yet: the row's first write goes in with this one.)
            [found] = await self.host.outbox.add(rows)
        except Exception:
            log.exception("could not persist a streamed answer for %s", self.ch.key)
            return
        if held:
            self.stream_id = found
            self.piece += 1

    async def _line(self, line: str, run_id: str | None) -> None:
        cap = self.ch.options.max_answer_lines
        fence = is_fence(line)
        if cap and self.lines_sent >= cap:
            if not self.ch.more:
                self.ch.more_in_code = self.in_code
            self.ch.more.append(line)
        else:
            self.lines_sent += 1
            await self._out(line, "answer", run_id)
        if fence:
            self.in_code = not self.in_code

    async def _lines(self, text: str, run_id: str | None) -> None:
        for line in split_lines(text, max_bytes=self.caps.max_bytes, max_chars=self.caps.max_chars):
            if line:
                await self._line(line, run_id)

    def _task_line(self, link: ChildRunLinked) -> str:
        """``→ researcher: looking up the release notes…`` (the task, one line, trimmed)."""
        name, arguments = self.call_args.get(link.call_id or "", ("", "{}"))
        agent = link.agent or name.removeprefix(AGENT_TOOL_PREFIX) or "sub-agent"
        task = _task_text(arguments)
        if len(task) > _CHILD_TASK_CHARS:
            task = task[: _CHILD_TASK_CHARS - 1].rstrip()
        return f"→ {agent}: {task}…" if task else f"→ {agent}…"

    def _link(self, e: ChildRunLinked) -> _ChildRun:
        parent = self.children.get(e.run_id or "")
        name, _ = self.call_args.get(e.call_id or "", ("", "{}"))
        child = _ChildRun(
            agent=e.agent or name.removeprefix(AGENT_TOOL_PREFIX) or "sub-agent",
            depth=parent.depth + 1 if parent else 1,
            root=parent.root if parent else e.run_id,
        )
        self._own("children")[e.child_run_id] = child
        return child

    async def _child_event(self, e: Event) -> None:
        """An event of a child run, shown nested (only profiles with ``child_runs``
        bring them): prefixed lines, never part of the channel's answer."""
        child = self.children.get(e.run_id or "")
        if child is None:  # its link was not seen (joined late): one level down
            child = self._own("children")[e.run_id or ""] = _ChildRun(
                agent="sub-agent", depth=1, root=e.parent_run_id
            )
        prefix = "  " * (child.depth - 1) + f"↳ {child.agent}: "
        root = child.root

        async def say(text: str) -> None:
            for line in split_lines(
                prefix + text, max_bytes=self.caps.max_bytes, max_chars=self.caps.max_chars
            ):
                if line:
                    await self._out(line, "notice", root)

        if e.kind == "text_delta":
            child.buffer += e.text
            while "\n" in child.buffer:
                line, child.buffer = child.buffer.split("\n", 1)
                if line.strip():
                    await say(line)
            return
        # Anything else ends the child's partial line first: a step's text shows
        # before the tool call that follows it, and never runs into the next step's.
        rest, child.buffer = child.buffer, ""
        if rest.strip():
            await say(rest)
        if e.kind == "tool_call_started":
            self._own("call_args")[e.call_id] = (e.name, e.arguments)
            if not e.name.startswith(AGENT_TOOL_PREFIX):
                await say(f"⚙ {e.name}({short_args(e.arguments)})")
        elif e.kind == "tool_call_ended":
            result = e.result.replace("\n", " ")[:160]
            verb = "failed" if e.is_error else f"→ ({e.duration:.2f}s)"
            await say(f"⚙ {e.name} {verb}: {result}")
        elif e.kind == "child_run_linked":
            self._link(e)
            await say(self._task_line(e))
        elif e.kind == "reasoning_delta":
            await say(f"(thinking) {e.text}")
        elif e.kind == "error":
            await say(" ".join(e.message.split())[:300])
        elif e.kind == "turn_ended":
            u = e.usage
            await say(
                f"done: {e.stop_reason}, {u.prompt_tokens}+{u.completion_tokens} tokens,"
                f" {e.tool_calls} tool calls"
            )
        elif e.kind == "interrupted":
            await say("(interrupted)")

    async def on_event(self, event: Event) -> None:
        """Show ``event`` in the channel, if its profile carries it: each kind of
        event has its handler (:data:`_HANDLERS`, by type)."""
        if event.kind == "response_started" and (
            event.parent_run_id is None or self.profile.child_runs
        ):
            # Not shown, but it separates the answer's steps (text before a tool
            # call, text after it), whatever the profile carries — a child run's
            # too, when the profile brings child runs.
            admitted: Event | None = event
        elif event.parent_run_id is not None and event.kind in _CHILD_KINDS:
            # A child's tool call waiting for a person is asked (and answered) here.
            admitted = event
        else:
            admitted = self.profile.admit(event)
        if admitted is None:
            return  # what the channel's profile does not carry
        e = admitted
        if e.parent_run_id is not None and e.kind not in _CHILD_KINDS:
            # A child run's events never touch the channel's answer.
            await self._child_event(e)
            return
        handler = _HANDLERS.get(type(e))
        if handler is not None:
            await handler(self, e)

    async def _turn_started(self, e: TurnStarted) -> None:
        run = e.run_id
        if self.ch.linked and run and e.parent_run_id is None and run not in self.ch.run_reply_to:
            asked_in = (e.origin or {}).get("channel_key")
            if asked_in and asked_in != self.ch.key:
                # Asked in another channel of the link (maybe on another worker): said to
                # this channel, not to whoever asked here last, nor into their thread.
                self.ch.asked(run, None, None)
        self.buffer, self.lines_sent, self.had_text = "", 0, False
        self.in_code = False
        self.piece, self.stream_id, self.stream_text = 0, None, _NO_TEXT
        self.stream_row, self.stream_hold = None, 0
        self.call_args, self.children = _EMPTY, _EMPTY

    async def _response_started(self, e: ResponseStarted) -> None:
        # A new model step: keep its text apart from the previous step's.
        mode, run = self.caps.streaming, e.run_id
        if self.had_text:
            if mode == "deltas":
                await self._out("\n", "delta", run)
            elif mode == "lines":
                await self._lines(self.buffer, run)
                self.buffer = ""
            else:
                self.buffer += "\n"

    async def _text_delta(self, e: TextDelta) -> None:
        mode, run = self.caps.streaming, e.run_id
        self.had_text = True
        text = e.text
        if mode == "deltas":
            await self._out(text, "delta", run)
        elif mode == "lines":
            self.buffer += text
            while "\n" in self.buffer:
                line, self.buffer = self.buffer.split("\n", 1)
                await self._lines(line, run)
        else:
            self.buffer += text

    async def _approval_event(self, e: ApprovalRequested | ApprovalResolved) -> None:
        await self._flush(e.run_id)
        await self._approval(e)

    async def _question_event(self, e: QuestionAsked | QuestionAnswered) -> None:
        await self._flush(e.run_id)
        await self._question(e)

    async def _todo_event(self, e: TodoUpdated) -> None:
        await self._flush(e.run_id)
        await self._todo(e)

    async def _tool_progress(self, e: ToolProgress) -> None:
        if self.tool_lines:
            await self._progress(e)

    async def _reasoning_delta(self, e: ReasoningDelta) -> None:
        await self._out(f"(thinking) {e.text}", "notice", e.run_id)

    async def _tool_call_started(self, e: ToolCallStarted) -> None:
        self._own("call_args")[e.call_id] = (e.name, e.arguments)
        # ask_user and todo show themselves (the question, the checklist);
        # an agent's call shows as its child run's line.
        if (
            self.tool_lines
            and not e.name.startswith(AGENT_TOOL_PREFIX)
            and (self.debug or e.name not in _SELF_SHOWN)
        ):
            args = short_args(e.arguments)
            await self._out(f"⚙ {e.name}({args})", "notice", e.run_id)

    async def _child_run_linked(self, e: ChildRunLinked) -> None:
        self._link(e)
        if self.child_lines:
            # Whatever the answer streamed so far stays above the line.
            await self._flush(e.run_id)
            await self._out(self._task_line(e), "notice", e.run_id)

    async def _tool_call_ended(self, e: ToolCallEnded) -> None:
        if e.call_id in self.progress:
            await self._progress_done(e)
        elif (
            (e.is_error or self.debug)
            and self.tool_lines
            and (self.debug or e.name not in _SELF_SHOWN)
        ):
            result = e.result.replace("\n", " ")[:160]
            verb = "failed" if e.is_error else f"→ ({e.duration:.2f}s)"
            await self._out(f"⚙ {e.name} {verb}: {result}", "notice", e.run_id)

    async def _compacted(self, e: Compacted) -> None:
        if self.debug or e.fallback:
            # Dropped messages are news to the people in the channel: the
            # model no longer sees them.  A summary only shows when debugging.
            how = "dropped" if e.fallback else "summarised"
            await self._out(
                f"(context compacted: {e.messages} older messages {how})",
                "notice",
                e.run_id,
            )

    async def _error_event(self, e: Error) -> None:
        await self._flush(e.run_id)
        await self._out(self._error(e), "error", e.run_id)

    async def _interrupted(self, e: Interrupted) -> None:
        await self._flush(e.run_id)
        why = "time budget used up" if e.reason == "time_budget" else "interrupted"
        await self._out(f"({why})", "notice", e.run_id)

    async def _turn_ended(self, e: TurnEnded) -> None:
        mode, run = self.caps.streaming, e.run_id
        await self._flush(run)
        if mode in ("deltas", "lines") and self.had_text:
            await self._stream_done(run)
            await self._out("", "end", run)
        self.stream_id, self.stream_text = None, _NO_TEXT
        self.stream_row, self.stream_hold = None, 0
        stopped = _STOP_NOTICES.get(e.stop_reason)
        if stopped:
            await self._out(stopped, "notice", run)
        elif (
            not self.had_text
            and e.stop_reason not in _SHOWN_ENDS
            and self.profile.carries("text_delta")  # else no answer ever shows here
        ):
            # Nothing visible came of it (no text after its tool calls, or a
            # hook or the provider filtered it): the asker is told, not left waiting.
            await self._out(_SILENT_ENDS.get(e.stop_reason, _SILENT_END), "notice", run)
        if self.ch.more:
            p = self.ch.options.command_prefix
            await self._out(f"… {len(self.ch.more)} more lines: {p}more", "notice", run)
        if self.debug:
            u = e.usage
            await self._out(
                f"turn {run}: {e.stop_reason}, {e.duration:.2f}s, "
                f"{u.prompt_tokens}+{u.completion_tokens} tokens, "
                f"{e.tool_calls} tool calls",
                "notice",
                run,
            )

    def _error(self, e: Error) -> str:
        if e.error_type == "aborted":
            # A plugin's words (an ``after_response`` hook's Abort), shown as
            # they are, like a refused prompt; one line.
            return " ".join(e.message.split())[:300]
        return error_line(
            e.error_type, e.message, where=self.ch.key, prefix=self.ch.options.command_prefix,
            retryable=e.retryable, run_id=e.run_id,
        )  # fmt: skip

    async def _flush(self, run: str | None) -> None:
        text, self.buffer = self.buffer, ""
        if not text.strip():
            return
        if self.caps.streaming == "lines":
            await self._lines(text, run)
            return
        cap = self.ch.options.max_answer_lines
        if cap:
            lines = text.split("\n")
            if len(lines) > cap:
                self.ch.more.extend(lines[cap:])
                text = "\n".join(lines[:cap])
        for piece in split_text(text, max_bytes=self.caps.max_bytes, max_chars=self.caps.max_chars):
            await self._out(piece, "answer", run)


#: A line of a form's question that skips an optional one.
SKIP_WORD = "-"


def _form_line(index: int, f: dict[str, Any]) -> str:
    """``2. which region? (eu / us)``: a form's question, numbered from 1."""
    choices = f" ({' / '.join(f.get('choices') or ())})" if f.get("choices") else ""
    optional = " (optional)" if not f.get("required", True) else ""
    return f"{index + 1}. {f.get('text', '')}{choices}{optional}"


#: Each kind of event a channel shows, and its handler (the others show nothing).
_HANDLERS: dict[type, Callable[[Renderer, Any], Awaitable[None]]] = {
    TurnStarted: Renderer._turn_started,
    ResponseStarted: Renderer._response_started,
    TextDelta: Renderer._text_delta,
    ApprovalRequested: Renderer._approval_event,
    ApprovalResolved: Renderer._approval_event,
    QuestionAsked: Renderer._question_event,
    QuestionAnswered: Renderer._question_event,
    QuestionProgress: Renderer._form_progress,
    TodoUpdated: Renderer._todo_event,
    ToolProgress: Renderer._tool_progress,
    ReasoningDelta: Renderer._reasoning_delta,
    ToolCallStarted: Renderer._tool_call_started,
    ChildRunLinked: Renderer._child_run_linked,
    ToolCallEnded: Renderer._tool_call_ended,
    Compacted: Renderer._compacted,
    Error: Renderer._error_event,
    Interrupted: Renderer._interrupted,
    TurnEnded: Renderer._turn_ended,
}

#: Builtin tools whose events show them in the channel: no tool-call line.
_SELF_SHOWN = frozenset({"ask_user", "todo"})

#: How a checklist item shows its status.
_TODO_MARK = {"done": "✓", "in_progress": "▸", "pending": "○"}


def _progress_text(progress: float, total: float | None, message: str | None) -> str:
    if total:
        how = f"{progress / total:.0%}" if total > 0 else f"{progress:g}"
    else:
        how = f"{progress:g}"
    return f"{how} {message}".strip() if message else how


def _written(write: asyncio.Future[list[int]]) -> bool:
    """Whether a finished write succeeded."""
    return not write.cancelled() and write.exception() is None


def _row_written(write: asyncio.Future[list[int]]) -> None:
    """A held row's deferred write ended: a failure is logged (the row is written
    again, completed, at the answer's end)."""
    if not write.cancelled() and write.exception() is not None:
        log.error("could not persist a streamed answer: %s", write.exception())


def _fit(text: str, max_bytes: int | None, max_chars: int | None) -> str:
    """``text`` on one line, cut to fit one message of the channel."""
    text = " ".join(text.split())
    if max_chars is not None and len(text) > max_chars:
        text = text[: max_chars - 1] + "…"
    if max_bytes is not None and len(text.encode()) > max_bytes:
        raw = text.encode()[: max_bytes - 3]
        text = raw.decode("utf-8", "ignore") + "…"
    return text


def _task_text(arguments: str) -> str:
    """A child run's task from its tool call's arguments (``task``, else the first
    text argument), on one line."""
    try:
        args = json.loads(arguments)
    except ValueError:
        return ""
    if not isinstance(args, dict):
        return ""
    task = args.get("task")
    if not isinstance(task, str):
        task = next((v for v in args.values() if isinstance(v, str)), "")
    return " ".join(task.split())
