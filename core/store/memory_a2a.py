"""The memory engine's A2A task records (:class:`~.repositories.A2ATaskRepository`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from ..errors import StoreError
from ..messages import Message
from .records import A2ATaskRecord

__all__ = ["MemoryA2ATasks", "texts_of_run"]


def texts_of_run(rows: list[Message], run_id: str | None) -> tuple[str | None, str | None]:
    """The question (the user row) and the answer (the assistant rows' text, in order;
    ``None`` when there is none) of run ``run_id`` among ``rows``."""
    if not run_id:
        return None, None
    question = None
    answer: list[str] | None = None
    for m in rows:
        if m.run_id != run_id:
            continue
        if m.kind == "user" and question is None:
            question = m.content
        elif m.kind == "assistant":
            answer = [*(answer or []), m.content]
    return question, None if answer is None else "".join(answer)


class MemoryA2ATasks:
    """Task records in a dictionary keyed by ``(owner, task_id)``."""

    _conversations: Mapping[str, object]
    _log: Mapping[str, list[Message]]

    def _a2a(self) -> dict[tuple[str, str], A2ATaskRecord]:
        tasks: dict[tuple[str, str], A2ATaskRecord] = self.__dict__.setdefault("_a2a_tasks", {})
        return tasks

    def _a2a_forget(self, conversation_id: str) -> None:
        tasks = self._a2a()
        for key in [k for k, r in tasks.items() if r.conversation_id == conversation_id]:
            del tasks[key]

    def _a2a_read(self, record: A2ATaskRecord) -> A2ATaskRecord:
        question, answer = texts_of_run(self._log.get(record.conversation_id, []), record.run_id)
        return replace(record, question=question, answer=answer)

    async def a2a_task_put(self, record: A2ATaskRecord) -> bool:
        if record.conversation_id not in self._conversations:
            raise StoreError(f"no conversation {record.conversation_id!r}")
        tasks = self._a2a()
        key = (record.owner, record.task_id)
        old = tasks.get(key)
        if old is not None and old.final:
            return False
        run_id = record.run_id if record.run_id is not None or old is None else old.run_id
        tasks[key] = replace(record, run_id=run_id, question=None, answer=None)
        return True

    async def a2a_task_get(self, owner: str, task_id: str) -> A2ATaskRecord | None:
        record = self._a2a().get((owner, task_id))
        return None if record is None else self._a2a_read(record)

    def _a2a_select(
        self, owner: str, conversation_id: str | None, state: str | None, since: float | None
    ) -> list[A2ATaskRecord]:
        return [
            r
            for r in self._a2a().values()
            if r.owner == owner
            and (conversation_id is None or r.conversation_id == conversation_id)
            and (state is None or r.state == state)
            and (since is None or r.updated_at >= since)
        ]

    async def a2a_tasks(
        self,
        owner: str,
        *,
        conversation_id: str | None = None,
        state: str | None = None,
        since: float | None = None,
        before: tuple[float, str] | None = None,
        limit: int = 50,
    ) -> list[A2ATaskRecord]:
        found = self._a2a_select(owner, conversation_id, state, since)
        found.sort(key=lambda r: (r.updated_at, r.task_id), reverse=True)
        if before is not None:
            found = [r for r in found if (r.updated_at, r.task_id) < before]
        return [self._a2a_read(r) for r in found[:limit]]

    async def a2a_task_count(
        self,
        owner: str,
        *,
        conversation_id: str | None = None,
        state: str | None = None,
        since: float | None = None,
    ) -> int:
        return len(self._a2a_select(owner, conversation_id, state, since))

    async def a2a_conversation_tasks(self, conversation_id: str) -> list[A2ATaskRecord]:
        found = [r for r in self._a2a().values() if r.conversation_id == conversation_id]
        return sorted(found, key=lambda r: (r.updated_at, r.owner, r.task_id))

    async def a2a_task_delete(self, owner: str, task_id: str) -> bool:
        return self._a2a().pop((owner, task_id), None) is not None
