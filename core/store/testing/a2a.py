"""A2A task records (issue 35): per owner, paged newest first, their text read from the
audit log, a final record kept, deleted with the conversation."""

from __future__ import annotations

import json
from typing import Any

from ...messages import NewMessage
from ..records import A2ATaskRecord
from .kit import ContractBase, rec, user

__all__ = ["A2ATasksContract"]


def task(tid: str, cid: str = "c", **kw: Any) -> A2ATaskRecord:
    fields: dict[str, Any] = {
        "owner": "alice", "task_id": tid, "conversation_id": cid, "state": "working",
        "updated_at": 10.0, "body": json.dumps({"id": tid}),
    }  # fmt: skip
    fields.update(kw)
    return A2ATaskRecord(**fields)


def said(text: str, run_id: str) -> NewMessage:
    return NewMessage(kind="assistant", content=text, run_id=run_id, created_at=1.0)


class A2ATasksContract(ContractBase):
    """``a2a_task_put`` / ``a2a_task_get`` / ``a2a_tasks`` / ``a2a_task_count`` /
    ``a2a_task_delete``."""

    async def test_a_task_is_read_back_with_its_runs_text_from_the_log(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        assert await store.a2a_task_put(task("t1", run_id="r1"))
        got = await store.a2a_task_get("alice", "t1")
        assert (got.run_id, got.state, got.final, got.body) == ("r1", "working", False,
                                                                 '{"id": "t1"}')  # fmt: skip
        assert got.question is None and got.answer is None  # nothing in the log yet
        await store.append("c", log=[user("before", run_id="r0"), said("no", "r0")])
        await store.append("c", log=[user("what is foo?", run_id="r1")])
        await store.append("c", log=[user("steer", run_id="r1"), said("foo ", "r1")])
        await store.append("c", log=[user("next", run_id="r2"), said("later", "r2")])
        await store.append("c", log=[said("is 42", "r1")])
        got = await store.a2a_task_get("alice", "t1")
        assert (got.question, got.answer) == ("what is foo?", "foo is 42")
        # Another owner sees nothing; a write without a run id keeps the stored one.
        assert await store.a2a_task_get("carol", "t1") is None
        assert await store.a2a_task_put(task("t1", state="completed", updated_at=11.0))
        got = await store.a2a_task_get("alice", "t1")
        assert (got.run_id, got.state, got.updated_at) == ("r1", "completed", 11.0)

    async def test_a_final_record_is_never_replaced(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        assert await store.a2a_task_put(task("t", run_id="r1"))
        assert await store.a2a_task_put(task("t", state="canceled", final=True, body="{}"))
        late = task("t", state="completed", final=True, body='{"late": 1}', updated_at=20.0)
        assert not await store.a2a_task_put(late)
        got = await store.a2a_task_get("alice", "t")
        assert (got.state, got.body, got.run_id, got.final) == ("canceled", "{}", "r1", True)

    async def test_tasks_are_listed_newest_first_filtered_and_paged(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        await store.create_conversation(rec("d"))
        for i, (cid, at, state) in enumerate(
            [("c", 5.0, "completed"), ("d", 7.0, "working"), ("c", 7.0, "completed"),
             ("c", 9.0, "failed")]
        ):  # fmt: skip
            await store.a2a_task_put(task(f"t{i}", cid, state=state, updated_at=at))
        await store.a2a_task_put(task("x", "c", owner="carol", updated_at=8.0))
        assert [t.task_id for t in await store.a2a_tasks("alice")] == ["t3", "t2", "t1", "t0"]
        assert await store.a2a_task_count("alice") == 4
        page = await store.a2a_tasks("alice", limit=2)
        assert [t.task_id for t in page] == ["t3", "t2"]
        after = (page[-1].updated_at, page[-1].task_id)
        assert [t.task_id for t in await store.a2a_tasks("alice", before=after)] == ["t1", "t0"]
        assert [t.task_id for t in await store.a2a_tasks("alice", conversation_id="c")] == [
            "t3", "t2", "t0",
        ]  # fmt: skip
        assert await store.a2a_task_count("alice", conversation_id="c", state="completed") == 2
        assert [t.task_id for t in await store.a2a_tasks("alice", since=7.0)] == [
            "t3", "t2", "t1",
        ]  # fmt: skip
        assert await store.a2a_task_count("alice", since=7.0, state="working") == 1
        assert [t.task_id for t in await store.a2a_tasks("carol")] == ["x"]

    async def test_deleting_a_task_or_its_conversation_forgets_it(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        await store.create_conversation(rec("d"))
        await store.a2a_task_put(task("t1", "c"))
        await store.a2a_task_put(task("t2", "d"))
        assert await store.a2a_task_delete("alice", "t1")
        assert not await store.a2a_task_delete("alice", "t1")
        assert await store.delete_conversation("d")
        assert await store.a2a_task_get("alice", "t2") is None
        assert await store.a2a_task_count("alice") == 0

    async def test_a_task_of_an_unknown_conversation_is_refused(self, store: Any) -> None:
        from ...errors import StoreError

        try:
            await store.a2a_task_put(task("t", "nowhere"))
        except StoreError:
            pass
        else:
            raise AssertionError("a task of an unknown conversation was written")
        assert await store.a2a_task_get("alice", "t") is None

    async def test_pruned_or_redacted_text_is_gone_from_the_task_too(self, store: Any) -> None:
        if not {"retention", "redaction"} <= store.capabilities:
            return
        await store.create_conversation(rec("c"))
        rows = await store.append("c", log=[user("secret question", run_id="r1"),
                                            said("secret answer", "r1")])  # fmt: skip
        await store.append("c", log=[user("later", run_id="r2"), said("ok", "r2")])
        await store.a2a_task_put(task("t1", run_id="r1"))
        await store.redact_message("c", rows[1].id, content="[redacted]", by="a", reason="",
                                   at=2.0)  # fmt: skip
        got = await store.a2a_task_get("alice", "t1")
        assert (got.question, got.answer) == ("secret question", "[redacted]")
        await store.prune_log("c", rows[1].id, summary=None, count=2)
        got = await store.a2a_task_get("alice", "t1")
        assert got is not None and got.question is None and got.answer is None

    async def test_a_conversations_tasks_of_every_owner_oldest_first(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        await store.create_conversation(rec("d"))
        await store.a2a_task_put(task("t2", updated_at=20.0, run_id="r2"))
        await store.a2a_task_put(task("t1", owner="bob", updated_at=10.0, final=True))
        await store.a2a_task_put(task("t3", owner="Bob", updated_at=20.0))
        await store.a2a_task_put(task("t9", "d"))
        await store.append("c", log=[user("q", run_id="r2"), said("a", "r2")])
        found = await store.a2a_conversation_tasks("c")
        assert [(r.owner, r.task_id) for r in found] == [
            ("bob", "t1"), ("Bob", "t3"), ("alice", "t2"),
        ]  # fmt: skip
        assert (found[0].final, found[2].run_id, found[2].body) == (True, "r2", '{"id": "t2"}')
        # The texts stay the audit log's: a snapshot carries the log itself.
        assert all(r.question is None and r.answer is None for r in found)
        assert await store.a2a_conversation_tasks("nobody") == []
