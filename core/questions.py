"""The bot asks: a question to the channel that the turn waits for (``ask_user``),
and the model's visible checklist (``todo``).

**ask_user.**  The model calls the builtin ``ask_user`` tool (``question``,
optional ``to``: a person as the channel shows them, optional ``choices``,
optional ``timeout`` in seconds).  The turn pauses (its time budget stops, as
for an approval), the question is stored (``question`` table, migration 10)
and a ``question_asked`` event goes out, which the bridge renders as
``@alice: which region? (eu / us)``.  The next message in that
conversation from the person asked answers it (with ``answer_from =
"anyone"``: from anyone; a question without ``to`` is for the person whose
message started the turn): the bridge or the HTTP API hands that message to
:meth:`Questions.answer` instead of starting a turn with it, the answer
becomes the tool result and ``question_answered`` goes out.  The answer is
the answerer's words: the tool result carries their verified identity as
``author_id``, so they may redact it (``!redact N``, the HTTP redact route)
as they may their own messages; redacting it tombstones the stored
question's ``answer`` and the replayed ``question_answered`` too.  Nobody answers
within the timeout: the tool result says so.

This is the same "waiting for a person" machinery as approvals
(:mod:`agentik.core.approvals`): a persisted pending row, then
:func:`~agentik.core.waiting.wait_for_person` (shared by both): a future
the turn awaits (shielded), the turn's paused budget, ``!stop`` cancelling,
a shutdown leaving it pending.  After a restart the turn is resumed from its
last committed step; the model calls ``ask_user`` again with the same
question, and that call takes over the pending question (same id, same
deadline) — the channel is asked again and the answer completes the resumed
turn.  Pending questions the resumed turn did not ask again expire when it
ends (:meth:`Questions.run_ended`).

**todo.**  The builtin ``todo`` tool replaces the conversation's checklist
(items with a status ``pending``, ``in_progress`` or ``done``) and emits
``todo_updated`` with what changed; the bridge shows the list once and edits
it where the transport can edit, and says one short line per change
elsewhere.  The checklist is stored per conversation (``todo`` table,
migration 13; :class:`Checklists`), so it survives a restart: the next call
edits the stored list and "changed" is measured against it.  It is part of
the conversation's status (``todo 2/5``) and of its export snapshot, and
goes with the conversation when that is deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .errors import ToolError
from .events import QuestionAnswered, QuestionAsked, QuestionProgress, TodoUpdated
from .store.records import AnswerFrom, Checklist, Question, QuestionOutcome
from .tools.base import ToolContext, ToolResult
from .waiting import wait_for_person

if TYPE_CHECKING:
    from .protocols import PartsLike
    from .store.base import Store
    from .tools.base import Tool, TurnPolicy

__all__ = [
    "AskUserTool",
    "Checklist",
    "Checklists",
    "FormError",
    "FormProgress",
    "PendingQuestion",
    "Question",
    "QuestionOutcome",
    "Questions",
    "TodoTool",
    "builtin_tools",
    "may_answer",
    "parse_form",
]

log = logging.getLogger(__name__)

#: Longest question and answer kept (characters); more choices are cut.
MAX_QUESTION_CHARS = 1_000
MAX_ANSWER_CHARS = 4_000
MAX_CHOICES = 10
#: A form (several questions at once): most fields, longest field text, field ids.
MAX_FORM_FIELDS = 10
MAX_FIELD_CHARS = 300
MAX_CHOICE_CHARS = 100
_FIELD_ID = re.compile(r"[A-Za-z0-9_-]{1,40}")
#: An answer to an optional field of a form that skips it (on a chat line).
SKIP = "-"


class FormError(ValueError):
    """An answer to a form that cannot be taken (an unknown field, a required field
    left empty); the message says which.  Nothing of that answer was kept."""


@dataclass(frozen=True, slots=True)
class FormProgress:
    """What an answer to a form did: the form as it is now (``question``, its
    ``partial`` answers), and whether it ended with it (``done``)."""

    question: Question
    done: bool

    @property
    def missing(self) -> tuple[str, ...]:
        """The ids of the fields not answered yet, in order."""
        return tuple(f["id"] for f in self.question.form if f["id"] not in self.question.partial)


def _clean(text: str, limit: int) -> str:
    return " ".join(text.split())[:limit]


def parse_form(raw: Any, *, max_fields: int = MAX_FORM_FIELDS) -> tuple[dict[str, Any], ...]:
    """The fields of a form from the model's ``questions`` argument (a list of
    ``{id, text, choices?, required?}``), checked and cut to the caps; raises
    :class:`~agentik.core.errors.ToolError` naming what is wrong."""
    if not isinstance(raw, list) or not raw:
        raise ToolError("`questions` must be a non-empty list of {id, text} objects")
    if len(raw) > max_fields:
        raise ToolError(f"at most {max_fields} questions at once")
    fields: list[dict[str, Any]] = []
    seen: set[str] = set()
    for n, item in enumerate(raw, 1):
        if not isinstance(item, dict):
            raise ToolError(f"question {n}: must be an object with `id` and `text`")
        fid = item.get("id", str(n))
        if isinstance(fid, int) and not isinstance(fid, bool):
            fid = str(fid)
        if not isinstance(fid, str) or not _FIELD_ID.fullmatch(fid):
            raise ToolError(f"question {n}: `id` must be 1 to 40 letters, digits, `_` or `-`")
        if fid in seen:
            raise ToolError(f"question {n}: `id` {fid!r} is used twice")
        seen.add(fid)
        text = item.get("text", item.get("question"))
        if not isinstance(text, str) or not text.strip():
            raise ToolError(f"question {n} ({fid}): `text` must be a non-empty string")
        raw_choices = item.get("choices") or []
        if not isinstance(raw_choices, list) or not all(isinstance(c, str) for c in raw_choices):
            raise ToolError(f"question {n} ({fid}): `choices` must be a list of strings")
        choices = [_clean(c, MAX_CHOICE_CHARS) for c in raw_choices if c.strip()][:MAX_CHOICES]
        required = item.get("required", True)
        if not isinstance(required, bool):
            raise ToolError(f"question {n} ({fid}): `required` must be true or false")
        fields.append(
            {"id": fid, "text": _clean(text, MAX_FIELD_CHARS), "choices": choices,
             "required": required}
        )  # fmt: skip
    return tuple(fields)


def form_answers(q: Question) -> dict[str, str | None]:
    """A form's answers, every field in order (``None``: not answered or skipped)."""
    return {f["id"]: q.partial.get(f["id"]) for f in q.form}


def _norm(name: str | None) -> str:
    return (name or "").strip().lstrip("@").casefold()


def may_answer(q: Question, author: str | None, author_id: str | None) -> bool:
    """Whether a message from ``author`` (the name the channel shows; ``author_id``
    the qualified identity) answers ``q``."""
    if q.answer_from == "anyone" or not q.asker_target:
        return True
    target = _norm(q.asker_target)
    if target and target == _norm(author):
        return True
    if author_id:
        # ``libera:alice!~a@host`` or ``slack:U1``: the nick or user id part.
        rest = author_id.split(":", 1)[-1]
        return target in (_norm(rest), _norm(rest.split("!", 1)[0]))
    return False


def _digest(
    text: str, to: str | None, choices: tuple[str, ...], form: tuple[dict[str, Any], ...] = ()
) -> str:
    # (A form's fields only when there is one: a single question's digest is as before.)
    canonical = json.dumps([text, _norm(to), list(choices), *([list(form)] if form else [])])
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(slots=True)
class PendingQuestion:
    """A question a turn of this process waits for."""

    question: Question
    parts: PartsLike
    future: asyncio.Future[Question]


class Questions:
    """The questions the agent's turns wait for (one per agent: :attr:`Agent.questions`)."""

    def __init__(self, *, store: Store | None = None) -> None:
        self.store: Store | None = store
        # conversation id -> the questions its turn waits for, oldest first.
        self._waiting: dict[str, list[PendingQuestion]] = {}
        # Questions made before this (a restart) may be taken over by a resumed turn.
        self._born = time.time()
        # Runs that asked (or took over) a question in this process, until they end.
        self._asked_runs: set[str] = set()
        #: Workers sharing a store (:mod:`agentik.core.cluster.events`): a message here
        #: may answer a question a turn of another worker waits for.
        self.shared = False
        #: Told ``q:<id>`` once an answer is recorded that no turn of this process
        #: waited for (the worker whose turn waits re-reads it).
        self.decided: Callable[[str], Awaitable[None]] | None = None

    def _store(self) -> Store:
        assert self.store is not None, "Questions.store is set by the agent"
        return self.store

    # -- asked by the tool, in the turn --------------------------------------------------------
    async def ask(
        self,
        parts: PartsLike,
        run_id: str,
        call_id: str,
        text: str,
        *,
        to: str | None,
        choices: tuple[str, ...],
        answer_from: AnswerFrom,
        wait: float,
        interrupted: Callable[[], bool],
        paused: Callable[[bool], None] | None = None,
        form: tuple[dict[str, Any], ...] = (),
    ) -> Question:
        """Ask and wait; the question as it ended (``outcome`` says how).

        ``interrupted()`` tells a ``!stop`` (the question is cancelled) from a
        shutdown (it stays pending); ``paused(True/False)`` brackets the wait.
        ``form``: several questions answered at once (:func:`parse_form`); the
        turn waits until every field is answered (or skipped, if optional).
        """
        q, resumed = await self._open(
            parts, run_id, call_id, text, to=to, choices=choices,
            answer_from=answer_from, wait=wait, form=form,
        )  # fmt: skip
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Question] = loop.create_future()
        entry = PendingQuestion(q, parts, fut)
        self._waiting.setdefault(parts.id, []).append(entry)
        parts.events.emit(
            QuestionAsked,
            run_id,
            question_id=q.id,
            call_id=call_id,
            question=q.text,
            to=q.asker_target,
            choices=q.choices,
            answer_from=q.answer_from,
            expires_at=q.deadline,
            timeout=round(max(0.0, q.deadline - q.created_at), 3),
            resumed=resumed,
            form=q.form,
            answered=tuple(f["id"] for f in q.form if f["id"] in q.partial),
        )
        log.info("conversation %s: question %d asked (run %s)", parts.id, q.id, run_id)

        async def cancelled() -> None:
            self._emit_answered(parts, run_id, await self._settle(q, "cancelled", None, None))

        try:
            # A shutdown (cancelled, not interrupted): it stays pending for the next start.
            done = await wait_for_person(
                fut,
                q.deadline,
                expire=lambda: self._settle(q, "expired", None, None),
                cancel=cancelled,
                interrupted=interrupted,
                paused=paused,
            )
        finally:
            self._drop(entry)
        self._emit_answered(parts, run_id, done)
        return done

    def _drop(self, entry: PendingQuestion) -> None:
        waiting = self._waiting.get(entry.parts.id)
        if waiting is None:
            return
        with contextlib.suppress(ValueError):
            waiting.remove(entry)
        if not waiting:
            del self._waiting[entry.parts.id]

    def _emit_answered(self, parts: PartsLike, run_id: str | None, q: Question) -> None:
        parts.events.emit(
            QuestionAnswered,
            run_id,
            question_id=q.id,
            call_id=q.call_id,
            outcome=q.outcome or "expired",
            answer=q.answer or "",
            answered_by=q.answered_by,
        )

    async def _open(
        self,
        parts: PartsLike,
        run_id: str,
        call_id: str,
        text: str,
        *,
        to: str | None,
        choices: tuple[str, ...],
        answer_from: AnswerFrom,
        wait: float,
        form: tuple[dict[str, Any], ...] = (),
    ) -> tuple[Question, bool]:
        """A question left pending by a restart for the same run (taken over, with a
        form's answers so far), or a new one."""
        store = self._store()
        self._asked_runs.add(run_id)
        digest = _digest(text, to, choices, form)
        busy = {e.question.id for e in self._waiting.get(parts.id, ())}
        for old in await store.questions(conversation_id=parts.id, state="pending"):
            if (
                old.run_id == run_id
                and old.created_at < self._born
                and old.digest == digest
                and old.id not in busy
                and old.deadline > time.time()
            ):
                await store.question_rebind(old.id, call_id)
                return replace(old, call_id=call_id), True
        now = time.time()
        q = Question(
            conversation_id=parts.id,
            channel_key=parts.channel_key,
            run_id=run_id,
            call_id=call_id,
            asker_target=to,
            answer_from=answer_from,
            text=text,
            choices=choices,
            digest=digest,
            created_at=now,
            deadline=now + wait,
            form=form,
        )
        return replace(q, id=await store.question_add(q)), False

    async def _settle(
        self,
        q: Question,
        outcome: QuestionOutcome,
        answer: str | None,
        answered_by: str | None,
        answered_by_id: str | None = None,
    ) -> Question:
        """Record how it ended unless it ended already; the stored outcome.

        A form that expires or is cancelled keeps the answers it got, as its
        ``answer`` (JSON), like an answered one."""
        store = self._store()
        now = time.time()
        if q.form and answer is None:
            found = await store.question_get(q.id)
            if found is not None and found.state == "pending" and found.partial:
                answer = json.dumps(form_answers(found), ensure_ascii=False)
        if await store.question_settle(q.id, outcome, answer, answered_by, now):
            done = replace(
                q, state="resolved", outcome=outcome, answer=answer,
                answered_by=answered_by, answered_at=now, answered_by_id=answered_by_id,
            )  # fmt: skip
        else:
            found = await store.question_get(q.id)
            done = found if found is not None else q
        woke = False
        for entry in self._waiting.get(q.conversation_id, ()):
            if entry.question.id == q.id and not entry.future.done():
                entry.future.set_result(done)
                woke = True
        if not woke and self.decided is not None and done.state != "pending":
            await self.decided(f"q:{q.id}")
        return done

    async def settle_from_store(self, question_id: int | None) -> None:
        """An answer may have been recorded by another process: the turn waiting here
        for question ``question_id`` (``None``: for any) gets it, read from the store."""
        entries = [
            e
            for waiting in list(self._waiting.values())
            for e in waiting
            if (question_id is None or e.question.id == question_id) and not e.future.done()
        ]
        for entry in entries:
            found = await self._store().question_get(entry.question.id)
            if found is not None and found.state != "pending" and not entry.future.done():
                entry.future.set_result(found)

    async def waits_elsewhere(self, conversation_id: str) -> bool:
        """Whether a turn of another worker may wait for an answer in this conversation
        (a pending question, before its deadline, that no turn of this process waits
        for); always ``False`` on one process."""
        return bool(await self._elsewhere(conversation_id))

    async def _elsewhere(self, conversation_id: str) -> list[Question]:
        if not self.shared or self.store is None:
            return []
        busy = {e.question.id for e in self._waiting.get(conversation_id, ())}
        now = time.time()
        rows = await self._store().questions(conversation_id=conversation_id, state="pending")
        return [q for q in rows if q.id not in busy and q.deadline > now]

    async def answerable_elsewhere(
        self, conversation_id: str, author: str | None, author_id: str | None
    ) -> Question | None:
        """The oldest question a turn of another worker waits for that this author's
        message answers, if any (see :meth:`waits_elsewhere`)."""
        for q in await self._elsewhere(conversation_id):
            if may_answer(q, author, author_id):
                return q
        return None

    # -- answering -------------------------------------------------------------------------------
    def pending(self, conversation_id: str) -> list[Question]:
        """The questions a turn of this conversation waits for now, oldest first."""
        return [e.question for e in self._waiting.get(conversation_id, ())]

    def waiting(self, conversation_id: str) -> bool:
        """Whether a turn of this conversation waits for an answer (``awaiting_human``)."""
        return bool(self._waiting.get(conversation_id))

    def answerable(
        self, conversation_id: str, author: str | None, author_id: str | None
    ) -> Question | None:
        """The oldest waiting question this author's message answers, if any."""
        for e in self._waiting.get(conversation_id, ()):
            if not e.future.done() and may_answer(e.question, author, author_id):
                return e.question
        return None

    async def answer(
        self,
        conversation_id: str,
        text: str,
        *,
        author: str | None,
        author_id: str | None,
        question: Question | None = None,
    ) -> Question | None:
        """Answer the oldest waiting question ``author`` may answer with ``text``
        (``question``: that one, found by :meth:`answerable_elsewhere`).

        ``None``: no such question (the message is an ordinary one).
        """
        q = question or self.answerable(conversation_id, author, author_id)
        if q is None:
            return None
        if q.form:
            # A line answers a form's first open field (``-`` skips an optional one).
            progress = await self.answer_line(q, text, author=author, author_id=author_id)
            return progress.question
        done = await self._settle(q, "answered", text.strip()[:MAX_ANSWER_CHARS], author, author_id)
        log.info("question %d answered by %s", q.id, author_id or author)
        return done

    def find(self, conversation_id: str, question_id: int) -> Question | None:
        """The question ``question_id`` a turn of this process waits for, if any."""
        for e in self._waiting.get(conversation_id, ()):
            if e.question.id == question_id and not e.future.done():
                return e.question
        return None

    async def find_anywhere(self, conversation_id: str, question_id: int) -> Question | None:
        """:meth:`find`, or (workers sharing a store) the pending question of a turn
        of another worker."""
        q = self.find(conversation_id, question_id)
        if q is not None:
            return q
        for other in await self._elsewhere(conversation_id):
            if other.id == question_id:
                return other
        return None

    async def answer_line(
        self,
        q: Question,
        text: str,
        *,
        author: str | None,
        author_id: str | None,
        field: str | int | None = None,
    ) -> FormProgress:
        """One chat line answers one field of form ``q``: ``field`` (its id, or its
        number from 1), else the first not answered yet.  ``-`` skips an optional
        field.  Raises :class:`FormError` (an unknown field, or ``-`` on a
        required one)."""
        fields = q.form
        if isinstance(field, int):
            if not 1 <= field <= len(fields):
                raise FormError(f"there is no question {field} (1 to {len(fields)})")
            fid = fields[field - 1]["id"]
        elif field is not None:
            if field not in {f["id"] for f in fields}:
                if field.isdigit():
                    return await self.answer_line(
                        q, text, author=author, author_id=author_id, field=int(field)
                    )
                raise FormError(f"there is no question {field!r}")
            fid = field
        else:
            current = await self._current(q)
            open_ids = [f["id"] for f in fields if f["id"] not in current.partial]
            if not open_ids:  # (answered meanwhile: the last part decides)
                open_ids = [fields[-1]["id"]]
            fid = open_ids[0]
        value: str | None = text.strip()
        if value == SKIP:
            value = None
        return await self.answer_form(
            q, {fid: value}, author=author, author_id=author_id, submit=False
        )

    async def _current(self, q: Question) -> Question:
        found = await self._store().question_get(q.id)
        return found if found is not None else q

    async def answer_form(
        self,
        q: Question,
        answers: dict[str, Any],
        *,
        author: str | None,
        author_id: str | None,
        submit: bool = True,
    ) -> FormProgress:
        """Answer fields of form ``q`` (field id -> answer text; ``None`` or empty:
        not answered).  ``submit``: the whole form is sent (a web form, a Slack
        submit, the HTTP API): its optional fields left empty are skipped and a
        required one left empty is an error.  The form ends when every field is
        answered or skipped; until then each part is kept (and survives a restart)
        and ``question_progress`` goes out.

        Raises :class:`FormError` naming an unknown field, a value that is not
        text, or the required fields still empty; then nothing is kept.
        """
        if not isinstance(answers, dict):
            raise FormError("the answers must be an object: question id -> answer")
        by_id = {f["id"]: f for f in q.form}
        unknown = [k for k in answers if k not in by_id]
        if unknown:
            raise FormError(f"no such question: {', '.join(map(str, unknown[:5]))}")
        given: dict[str, str | None] = {}
        for fid, value in answers.items():
            if value is not None and not isinstance(value, str):
                raise FormError(f"the answer to {fid!r} must be text")
            value = (value or "").strip()[:MAX_ANSWER_CHARS]
            if value:
                given[fid] = value
            elif not by_id[fid]["required"]:
                given[fid] = None  # skipped
            elif not submit:
                raise FormError(f"question {fid!r} needs an answer")
        if submit:
            current = await self._current(q)
            have = {**current.partial, **given}
            empty = [f["id"] for f in q.form if f["required"] and not have.get(f["id"])]
            if empty:
                raise FormError(f"these questions need an answer: {', '.join(empty)}")
            for f in q.form:
                if f["id"] not in have:
                    given[f["id"]] = None
        merged = await self._store().question_answer_part(q.id, given)
        if merged is None:  # it ended meanwhile (expired, stopped, answered)
            return FormProgress(await self._current(q), True)
        now = replace(q, partial=merged)
        entry = self._entry(q)
        if all(f["id"] in merged for f in q.form):
            answer = json.dumps(form_answers(now), ensure_ascii=False)
            done = await self._settle(now, "answered", answer, author, author_id)
            log.info("form %d answered (last part by %s)", q.id, author_id or author)
            return FormProgress(replace(done, partial=merged), True)
        if entry is not None:
            entry.question = now
            progress = FormProgress(now, False)
            entry.parts.events.emit(
                QuestionProgress,
                q.run_id,
                question_id=q.id,
                call_id=entry.question.call_id,
                answered=tuple(f["id"] for f in q.form if f["id"] in merged),
                next=progress.missing[0] if progress.missing else None,
                by=author,
            )
        return FormProgress(now, False)

    def _entry(self, q: Question) -> PendingQuestion | None:
        for e in self._waiting.get(q.conversation_id, ()):
            if e.question.id == q.id:
                return e
        return None

    # -- after a restart ---------------------------------------------------------------------------
    async def run_ended(self, parts: PartsLike, run_id: str, *, fresh: bool = False) -> None:
        """A turn ended: questions it left pending (it did not ask again) expire.

        ``fresh``: the run was started by this process and never resumed
        (its run id is new), so only questions it asked here can be pending:
        when it asked none, the store is not read.
        """
        asked = run_id in self._asked_runs
        self._asked_runs.discard(run_id)
        if self.store is None or (fresh and not asked):
            return
        try:
            rows = await self._store().questions(conversation_id=parts.id, state="pending")
        except NotImplementedError:
            return
        busy = {e.question.id for e in self._waiting.get(parts.id, ())}
        for q in rows:
            if q.run_id == run_id and q.id not in busy:
                done = await self._settle(q, "expired", None, None)
                if done.outcome == "expired":
                    self._emit_answered(parts, run_id, done)


# -- the builtin tools --------------------------------------------------------------------------


class AskUserTool:
    """``ask_user``: ask the people in the channel and wait for the answer.

    Offered only in conversations a person can answer (not in temporary
    ones).  ``timeout``: the default wait (seconds) when the model gives
    none; ``max_timeout`` caps the model's; ``answer_from``: ``asked``
    (only the person asked answers) or ``anyone``.
    """

    name = "ask_user"
    description = (
        "Ask the people in this conversation a question and wait for the answer. Use it"
        " when you need a decision or a fact only they have. Optional: `to` (the name of"
        " the person to ask, as shown in the conversation), `choices` (answers to offer),"
        " `timeout` (seconds to wait). The result is the answer, or says nobody answered."
        " To ask several things at once, give `questions` (a list of {id, text, choices,"
        " required}) instead: they are shown as one form and the result is a JSON object"
        " question id -> answer (null: an optional question left empty)."
    )
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {
            "question": {
                "type": "string",
                "description": "The question, one or two lines (with `questions`: a title).",
            },
            "questions": {
                "type": "array",
                "description": "Several questions answered at once, as one form (optional).",
                "maxItems": MAX_FORM_FIELDS,
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string", "description": "Key of its answer."},
                        "text": {"type": "string", "description": "The question."},
                        "choices": {"type": "array", "items": {"type": "string"}},
                        "required": {"type": "boolean", "description": "Default true."},
                    },
                    "required": ["id", "text"],
                },
            },
            "to": {"type": "string", "description": "Who to ask (a name in the conversation)."},
            "choices": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Answers to offer (optional).",
            },
            "timeout": {"type": "number", "description": "Seconds to wait (optional)."},
        },
    }
    #: Waits for a person: the turn's tool timeout does not apply (the deadline does).
    waits_for_human = True

    def __init__(
        self,
        *,
        timeout: float = 300.0,
        max_timeout: float = 3600.0,
        answer_from: AnswerFrom = "asked",
        max_questions: int = MAX_FORM_FIELDS,
    ) -> None:
        self.timeout = timeout
        self.max_timeout = max(max_timeout, timeout)
        self.answer_from: AnswerFrom = answer_from
        self.max_questions = min(max_questions, MAX_FORM_FIELDS)

    def __repr__(self) -> str:
        return "AskUserTool()"

    async def call(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        form: tuple[dict[str, Any], ...] = ()
        text = arguments.get("question")
        if arguments.get("questions") is not None:
            form = parse_form(arguments["questions"], max_fields=self.max_questions)
            if text is not None and not isinstance(text, str):
                raise ToolError("`question` (the form's title) must be a string")
            text = text if text and text.strip() else f"{len(form)} questions"
            if arguments.get("choices"):
                raise ToolError("with `questions`, give each question its own `choices`")
        if not isinstance(text, str) or not text.strip():
            raise ToolError("`question` (or `questions`) must be a non-empty string")
        text = " ".join(text.split())[:MAX_QUESTION_CHARS]
        to = arguments.get("to")
        if to is not None and not isinstance(to, str):
            raise ToolError("`to` must be a name (a string)")
        to = to.strip().lstrip("@") or None if to else None
        raw_choices = arguments.get("choices") or []
        if not isinstance(raw_choices, list) or not all(isinstance(c, str) for c in raw_choices):
            raise ToolError("`choices` must be a list of strings")
        choices = tuple(" ".join(c.split())[:100] for c in raw_choices if c.strip())[:MAX_CHOICES]
        timeout = arguments.get("timeout", self.timeout)
        if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
            raise ToolError("`timeout` must be a positive number of seconds")
        timeout = min(float(timeout), self.max_timeout)
        human = context.human
        if human is None:
            raise ToolError("nobody can be asked here (no channel to ask in)")
        if to is None and self.answer_from == "asked":
            to = context.author  # the person whose message started the turn
        q = await human.ask(
            text, to=to, choices=choices, answer_from=self.answer_from, wait=timeout,
            **({"form": form} if form else {}),
        )  # fmt: skip
        if form:
            return _form_result(q, timeout)
        if q.outcome == "answered":
            by = q.answered_by or "someone"
            return ToolResult(
                text=f"{by} answered: {q.answer}",
                data={
                    "question_id": q.id,
                    "answer": q.answer,
                    "answered_by": q.answered_by,
                    # The answer is the answerer's words: like a message's
                    # author, they may redact it (``!redact``, the HTTP API).
                    **({"author_id": q.answered_by_id} if q.answered_by_id else {}),
                },
            )
        if q.outcome == "cancelled":
            return ToolResult(text="nobody answered: the turn was stopped", is_error=True)
        return ToolResult(
            text=f"nobody answered within {timeout:g} seconds",
            data={"question_id": q.id, "answer": None},
            is_error=True,
        )


def _form_result(q: Question, timeout: float) -> ToolResult:
    """A form's tool result: the JSON object question id -> answer (``null``:
    skipped, or not answered in time)."""
    try:
        answers = json.loads(q.answer) if q.answer else {}
    except ValueError:  # (redacted: the tombstone is the answer)
        answers = {}
    if not isinstance(answers, dict):
        answers = {}
    answers = {f["id"]: answers.get(f["id"]) for f in q.form}
    data: dict[str, Any] = {"question_id": q.id, "answers": answers}
    if q.outcome == "answered":
        data["answered_by"] = q.answered_by
        if q.answered_by_id:
            data["author_id"] = q.answered_by_id
        return ToolResult(text=json.dumps(answers, ensure_ascii=False), data=data)
    given = {k: v for k, v in answers.items() if v is not None}
    why = (
        "the turn was stopped" if q.outcome == "cancelled"
        else f"not every question was answered within {timeout:g} seconds"
    )  # fmt: skip
    tail = f"; answered so far: {json.dumps(given, ensure_ascii=False)}" if given else ""
    return ToolResult(text=f"nobody answered: {why}{tail}", data=data, is_error=True)


TODO_STATUSES = ("pending", "in_progress", "done")
#: Most items in a checklist; longest item text (characters).
MAX_TODO_ITEMS = 30
MAX_TODO_TEXT = 200


def checklist_items(raw: Any, *, where: str = "items") -> tuple[dict[str, str], ...]:
    """Checked checklist items from ``raw`` (a list of ``{text, status}``), as
    stored: statuses from :data:`TODO_STATUSES`, whitespace collapsed, text cut
    to :data:`MAX_TODO_TEXT` characters.  Raises :class:`ValueError` naming
    the bad item."""
    if not isinstance(raw, list):
        raise ValueError(f"`{where}` must be a list of {{text, status}} objects")
    if len(raw) > MAX_TODO_ITEMS:
        raise ValueError(f"at most {MAX_TODO_ITEMS} items")
    items: list[dict[str, str]] = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get("text"), str):
            raise ValueError(f"item {i + 1}: needs `text` (a string) and `status`")
        status = item.get("status", "pending")
        if status not in TODO_STATUSES:
            raise ValueError(f"item {i + 1}: `status` must be one of {', '.join(TODO_STATUSES)}")
        text = " ".join(item["text"].split())[:MAX_TODO_TEXT]
        if not text:
            raise ValueError(f"item {i + 1}: `text` is empty")
        items.append({"text": text, "status": status})
    return tuple(items)


def changed_items(
    before: Sequence[dict[str, str]], after: Sequence[dict[str, str]]
) -> tuple[int, ...]:
    """The items of ``after`` (by index) that are new or changed status since ``before``."""
    old = {it["text"]: it["status"] for it in before}
    return tuple(i for i, it in enumerate(after) if old.get(it["text"]) != it["status"])


class Checklists:
    """Every conversation's checklist, in the store of the conversation
    (:meth:`Store.todo_get`/:meth:`Store.todo_set`); one per agent
    (:attr:`Agent.todos <agentik.core.agent.Agent.todos>`).

    ``store_for(conversation_id)`` names the store (the agent's, or its
    in-memory one for a temporary conversation); ``scrub(text,
    conversation_id)`` is what the ``before_store`` hooks make of an item's
    text.  Without a ``store_for`` (a :class:`TodoTool` used on its own), or
    with a store that keeps no checklists, the lists are kept in this process
    only, the :attr:`MAX_UNSTORED` most recently written ones.
    """

    MAX_UNSTORED = 256

    def __init__(
        self,
        store_for: Callable[[str], Store] | None = None,
        *,
        scrub: Callable[[str, str], str] | None = None,
    ) -> None:
        self.store_for = store_for
        self.scrub = scrub
        self._unstored: OrderedDict[str, Checklist] = OrderedDict()

    async def get(self, conversation_id: str) -> Checklist | None:
        """The conversation's checklist (``None``: it has none)."""
        if self.store_for is None:
            return self._unstored.get(conversation_id)
        try:
            return await self.store_for(conversation_id).todo_get(conversation_id)
        except NotImplementedError:
            return self._unstored.get(conversation_id)

    async def replace(
        self, conversation_id: str, items: tuple[dict[str, str], ...], run_id: str | None
    ) -> tuple[Checklist, tuple[int, ...]]:
        """Make ``items`` the conversation's checklist; it as stored, and which of
        its items changed since the stored one (new, or another status)."""
        if self.scrub is not None:
            scrub = self.scrub
            # A hook may lengthen or empty the text: it stays 1 to MAX_TODO_TEXT characters.
            items = tuple(
                {
                    "text": scrub(it["text"], conversation_id)[:MAX_TODO_TEXT] or "…",
                    "status": it["status"],
                }
                for it in items
            )
        before = await self.get(conversation_id)
        changed = changed_items(before.items if before else (), items)
        if before is not None and before.items == items:
            return before, changed  # the same list: nothing to write
        new = Checklist(items=items, run_id=run_id, updated_at=time.time())
        await self._put(conversation_id, new if items else None)
        return new, changed

    async def clear(self, conversation_id: str) -> None:
        """The conversation has no checklist any more."""
        await self._put(conversation_id, None)

    async def _put(self, conversation_id: str, checklist: Checklist | None) -> None:
        if self.store_for is not None:
            try:
                await self.store_for(conversation_id).todo_set(conversation_id, checklist)
                return
            except NotImplementedError:
                pass  # a store without checklists: kept in this process
        self._unstored.pop(conversation_id, None)
        if checklist is not None:
            self._unstored[conversation_id] = checklist
            while len(self._unstored) > self.MAX_UNSTORED:
                self._unstored.popitem(last=False)


class TodoTool:
    """``todo``: the model's visible checklist; each call replaces the whole list.

    The list is kept per conversation by ``checklists`` (the agent's
    :class:`Checklists`, in its store).
    """

    name = "todo"
    description = (
        "Keep a short checklist of the steps of a longer task, visible to the people in the"
        " conversation. Each call replaces the whole list: send every item with its status"
        " (pending, in_progress or done). Update it when an item starts or is done."
    )
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "text": {"type": "string"},
                        "status": {"type": "string", "enum": list(TODO_STATUSES)},
                    },
                    "required": ["text", "status"],
                },
            }
        },
        "required": ["items"],
    }
    MAX_ITEMS = MAX_TODO_ITEMS

    def __init__(self, checklists: Checklists | None = None) -> None:
        self.checklists = checklists if checklists is not None else Checklists()

    def __repr__(self) -> str:
        return "TodoTool()"

    async def call(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        try:
            items = checklist_items(arguments.get("items"))
        except ValueError as exc:
            raise ToolError(str(exc)) from None
        checklist, changed = await self.checklists.replace(
            context.conversation_id, items, context.run_id
        )
        if context.emit is not None:
            context.emit(
                TodoUpdated, call_id=context.call_id, items=checklist.items, changed=changed
            )
        return ToolResult(text=f"checklist updated ({checklist.done}/{len(items)} done)")


def builtin_tools(policy: TurnPolicy, *, checklists: Checklists | None = None) -> list[Tool]:
    """The builtin tools ``[tools]`` switches on (``ask_user``, ``todo``; its lists
    kept by ``checklists``)."""
    tools: list[Tool] = []
    if policy.ask_user:
        tools.append(
            AskUserTool(
                timeout=policy.ask_user_timeout,
                max_timeout=policy.ask_user_max_timeout,
                answer_from=policy.answer_from,
                max_questions=policy.ask_user_max_questions,
            )
        )
    if policy.todo:
        tools.append(TodoTool(checklists))
    return tools
