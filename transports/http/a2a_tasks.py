"""The A2A SDK's task store over our store's A2A task records (``A2ATaskRepository``).

``tasks/get``, ``tasks/list``, ``tasks/cancel`` and resubscription read tasks from
the bot's store, so they answer after a restart and on every worker sharing the
database (PostgreSQL).

What is stored and what is derived: the SDK's task is kept as JSON *without* what
people and the model said — the text of the user's message and of the answer (the
``answer`` artifact and the final status message, both with the id
``<task id>-answer``).  That text is the audit log's: a read fills it in from the
run's user row and assistant rows.  So the audit log stays the one truth: a
redaction shows in the task, retention's cut and a conversation's deletion remove
it there too, and streaming an answer writes no row per chunk (a chunk changes
nothing stored; only status changes are written).  Our own notices (why a task
was rejected or failed) are not conversation text and stay in the record.

On the worker running a task, a read gets the SDK's live copy (the answer so far);
elsewhere, what the store has (the answer once the turn has recorded it).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from a2a.helpers.proto_helpers import new_text_part
from a2a.server.context import ServerCallContext
from a2a.server.tasks import TaskStore
from a2a.types import (
    Artifact,
    InvalidParamsError,
    ListTasksRequest,
    ListTasksResponse,
    Role,
    Task,
    TaskState,
)
from a2a.utils.constants import DEFAULT_LIST_TASKS_PAGE_SIZE
from google.protobuf import json_format  # type: ignore[import-untyped]  # (no stubs)

from agentik.core.errors import StoreError
from agentik.core.store.records import A2ATaskRecord

if TYPE_CHECKING:
    from agentik.core.store.repositories import A2ATaskRepository

__all__ = ["StoreTaskStore", "answer_id"]

log = logging.getLogger(__name__)

_FINAL = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_REJECTED,
    }
)


def answer_id(task_id: str) -> str:
    """The id of a task's answer: its artifact's and its final message's."""
    return f"{task_id}-answer"


def _owner(context: ServerCallContext) -> str:
    return context.user.user_name


def _stripped(task: Task) -> Task:
    """``task`` without the conversation's text (see the module docstring)."""
    bare = Task()
    bare.CopyFrom(task)
    answer = answer_id(task.id)
    for m in bare.history:
        if m.role == Role.ROLE_USER or m.message_id == answer:
            del m.parts[:]
    if bare.status.HasField("message") and bare.status.message.message_id == answer:
        del bare.status.message.parts[:]
    # The answer's artifact is made again when read (so its first chunk writes nothing).
    kept = [a for a in bare.artifacts if a.artifact_id != answer]
    del bare.artifacts[:]
    bare.artifacts.extend(kept)
    return bare


def _filled(record: A2ATaskRecord) -> Task:
    """The task of ``record`` with its text from the audit log (what the log no
    longer holds is left out)."""
    task = json_format.Parse(record.body, Task())
    answer = answer_id(task.id)
    kept = []
    asked = False
    for m in task.history:
        if m.role == Role.ROLE_USER:
            if asked or record.question is None:
                continue
            m.parts.append(new_text_part(record.question))
            asked = True
        elif m.message_id == answer:
            if not record.answer:
                continue
            m.parts.append(new_text_part(record.answer))
        kept.append(m)
    del task.history[:]
    task.history.extend(kept)
    if task.status.HasField("message") and task.status.message.message_id == answer:
        if record.answer:
            task.status.message.parts.append(new_text_part(record.answer))
        else:
            task.status.ClearField("message")
    if record.answer:
        task.artifacts.insert(
            0, Artifact(artifact_id=answer, name="answer", parts=[new_text_part(record.answer)])
        )
    return task


def _page_token(record: A2ATaskRecord) -> str:
    raw = json.dumps([record.updated_at, record.task_id]).encode()
    return base64.urlsafe_b64encode(raw).decode()


def _position(token: str) -> tuple[float, str]:
    try:
        at, tid = json.loads(base64.urlsafe_b64decode(token.encode()))
        if isinstance(at, (int, float)) and isinstance(tid, str):
            return float(at), tid
    except (ValueError, TypeError, binascii.Error):
        pass
    raise InvalidParamsError(message="invalid pageToken")


class StoreTaskStore(TaskStore):
    """Tasks in the bot's store, per owner (the caller's token name).

    ``runs``: task id -> the run id of its turn, set by the executor once the
    message is accepted (written with the task's next status)."""

    def __init__(
        self,
        store: A2ATaskRepository,
        ended_elsewhere: Callable[[str], None] | None = None,
    ) -> None:
        self._store = store
        self.runs: dict[str, str] = {}
        #: Called with a task's id when a state of a task live here was refused: the
        #: stored record is final already (``tasks/cancel`` through another worker).
        self._ended_elsewhere = ended_elsewhere
        #: Tasks not final yet, written by this process: the SDK's live copy and the
        #: (state, body) last written (a write that changes neither is skipped).
        self._live: dict[tuple[str, str], tuple[Task, str, str]] = {}

    async def save(self, task: Task, context: ServerCallContext) -> None:
        owner = _owner(context)
        key = (owner, task.id)
        state = TaskState.Name(task.status.state)
        body = json.dumps(json_format.MessageToDict(_stripped(task)), separators=(",", ":"))
        final = task.status.state in _FINAL
        live = self._live.get(key)
        copy = Task()
        copy.CopyFrom(task)
        if not final:
            self._live[key] = (copy, state, body)
        if live is not None and (live[1], live[2]) == (state, body) and not final:
            return  # an answer's chunk: nothing stored changes
        at = (
            task.status.timestamp.ToNanoseconds() / 1e9
            if task.status.HasField("timestamp")
            else time.time()
        )
        record = A2ATaskRecord(
            owner=owner, task_id=task.id, conversation_id=task.context_id, state=state,
            updated_at=at, body=body, run_id=self.runs.get(task.id), final=final,
        )  # fmt: skip
        try:
            written = await self._store.a2a_task_put(record)
            if not written and not final and self._ended_elsewhere is not None:
                # Canceled through another worker while its turn runs (or waits) here.
                self._ended_elsewhere(task.id)
        except StoreError as exc:
            # (its conversation was deleted meanwhile, or the database failed): the
            # caller's stream goes on; only other readers miss this state.
            log.warning("A2A task %s: its %s state was not stored: %s", task.id, state, exc)
        finally:
            if final:
                self._live.pop(key, None)
                self.runs.pop(task.id, None)

    async def record_run(self, owner: str, task_id: str, run_id: str) -> bool:
        """Store the run of a task as soon as its message is accepted (before its turn
        starts, which may be long behind another turn): a ``tasks/cancel`` through
        any worker then finds the turn to take back.  ``False`` when the stored task
        is final already (canceled through another worker meanwhile)."""
        self.runs[task_id] = run_id
        live = self._live.get((owner, task_id))
        if live is None:
            return True  # not stored by this process (yet): its next state carries it
        task, state, body = live
        at = (
            task.status.timestamp.ToNanoseconds() / 1e9
            if task.status.HasField("timestamp")
            else time.time()
        )
        record = A2ATaskRecord(
            owner=owner, task_id=task_id, conversation_id=task.context_id, state=state,
            updated_at=at, body=body, run_id=run_id,
        )  # fmt: skip
        try:
            return bool(await self._store.a2a_task_put(record))
        except StoreError as exc:
            log.warning("A2A task %s: its run was not stored: %s", task_id, exc)
            return True

    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:
        key = (_owner(context), task_id)
        live = self._live.get(key)
        record = await self._store.a2a_task_get(*key)
        if live is not None and (record is None or not record.final):
            copy = Task()
            copy.CopyFrom(live[0])
            return copy
        if live is not None:
            # Ended through another worker (canceled) while its turn waited here, or
            # in the shared turn queue: the stored end is the task's.
            self._live.pop(key, None)
        return None if record is None else _filled(record)

    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        owner = _owner(context)
        state = TaskState.Name(params.status) if params.status else None
        since = (
            params.status_timestamp_after.ToNanoseconds() / 1e9
            if params.HasField("status_timestamp_after")
            else None
        )
        before = _position(params.page_token) if params.page_token else None
        size = params.page_size or DEFAULT_LIST_TASKS_PAGE_SIZE
        cid = params.context_id or None
        records = await self._store.a2a_tasks(
            owner, conversation_id=cid, state=state, since=since, before=before, limit=size + 1
        )
        total = await self._store.a2a_task_count(
            owner, conversation_id=cid, state=state, since=since
        )
        more = len(records) > size
        records = records[:size]
        return ListTasksResponse(
            tasks=[_filled(r) for r in records],
            next_page_token=_page_token(records[-1]) if more else "",
            total_size=total,
            page_size=size,
        )

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        self._live.pop((_owner(context), task_id), None)
        await self._store.a2a_task_delete(_owner(context), task_id)
