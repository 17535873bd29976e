"""The lifecycle aggregate: what a snapshot exports of a conversation."""

from __future__ import annotations

from typing import Any

from ...messages import NewMessage
from ..records import RunRecord, TurnEnd
from .kit import ContractBase, approval, question, rec, user

__all__ = ["LifecycleContract"]


class LifecycleContract(ContractBase):
    """``export_rows``: the same conversation exports the same rows from every engine."""

    async def test_exported_bindings(self, store: Any) -> None:
        await store.create_conversation(rec("c", 7.0), channel_key="irc:n:#b")
        await store.set_binding("irc:n:#a", "c")
        await store.create_conversation(rec("d"), channel_key="irc:n:#d")
        rows = await store.export_rows("c")
        assert [b["channel_key"] for b in rows["bindings"]] == ["irc:n:#a", "irc:n:#b"]
        assert rows["bindings"][1]["created_at"] == 7.0

    async def test_exported_turn_ends(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        await store.append("c", log=[user("a", run_id="r1")], ended=TurnEnd("r1", "stop"))
        await store.append("c", log=[user("b", run_id="r2")], ended=TurnEnd("r2", "length"))
        await store.append("c", log=[user("open", run_id="r3")])
        rows = await store.export_rows("c")
        assert [(t["run_id"], t["outcome"]) for t in rows["turn_ends"]] == [
            ("r1", "stop"),
            ("r2", "length"),
        ]
        assert all(isinstance(t["created_at"], float) for t in rows["turn_ends"])

    async def test_exported_approvals_hold_every_field(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        await store.create_conversation(rec("d"))
        serial = await store.approval_add(approval("c", channel_key="irc:n:#c"))
        await store.approval_add(approval("d"))
        await store.approval_resolve(serial, "approved", "al", "irc:al", "fine", 30.0)
        [row] = (await store.export_rows("c"))["approvals"]
        assert row == {
            "serial": serial, "id": "a1", "scope": "c", "conversation_id": "c",
            "channel_key": "irc:n:#c", "run_id": "r1", "call_id": "c1", "tool": "shell",
            "arguments": '{"cmd": "ls"}', "digest": "d1", "asker": "bob", "asker_id": "irc:bob",
            "approvers": "admin", "self_approve": 0, "created_at": 10.0, "expires_at": 70.0,
            "state": "resolved", "decision": "approved", "approver": "al",
            "approver_id": "irc:al", "reason": "fine", "resolved_at": 30.0,
        }  # fmt: skip

    async def test_exported_questions_hold_every_field(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        qid = await store.question_add(question("c", channel_key="irc:n:#c"))
        await store.question_settle(qid, "answered", "red", "bob", 20.0)
        [row] = (await store.export_rows("c"))["questions"]
        assert row == {
            "id": qid, "conversation_id": "c", "channel_key": "irc:n:#c", "run_id": "r1",
            "call_id": "q1", "asker_target": "bob", "answer_from": "asked",
            "text": "which one?", "choices": '["red", "blue"]', "digest": "dq",
            "created_at": 10.0, "deadline": 70.0, "state": "resolved", "outcome": "answered",
            "answer": "red", "answered_by": "bob", "answered_at": 20.0,
        }  # fmt: skip

    async def test_exported_runs_are_the_conversations_own(self, store: Any) -> None:
        await store.create_conversation(rec("top"))
        await store.create_conversation(rec("kid"))
        await store.run_add(RunRecord(run_id="t1", conversation_id="top", started=1.0))
        await store.run_add(
            RunRecord(run_id="k1", conversation_id="kid", parent_run_id="t1",
                      parent_conversation_id="top", depth=1, started=2.0, ended=3.0,
                      stop_reason="stop", usage={"total_tokens": 9})
        )  # fmt: skip
        rows = await store.export_rows("kid")
        assert rows["runs"] == [
            {
                "run_id": "k1", "conversation_id": "kid", "parent_run_id": "t1",
                "parent_conversation_id": "top", "parent_call_id": None, "agent": None,
                "depth": 1, "started": 2.0, "ended": 3.0, "stop_reason": "stop",
                "usage": '{"total_tokens": 9}',
            }
        ]  # fmt: skip
        assert [r["run_id"] for r in (await store.export_rows("top"))["runs"]] == ["t1"]

    async def test_an_empty_conversation_exports_empty_rows(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        rows = await store.export_rows("c")
        assert rows == {
            "bindings": [], "turn_ends": [], "approvals": [], "questions": [], "runs": [],
        }  # fmt: skip

    async def test_export_rows_are_json_values(self, store: Any) -> None:
        import json

        await store.create_conversation(rec("c"), channel_key="k")
        await store.append(
            "c",
            log=[user("x", run_id="r1"), NewMessage(kind="assistant", content="y", run_id="r1")],
            ended=TurnEnd("r1", "stop", RunRecord(run_id="r1", conversation_id="c", started=1.0)),
        )
        await store.approval_add(approval("c"))
        await store.question_add(question("c"))
        rows = await store.export_rows("c")
        assert json.loads(json.dumps(rows)) == rows
        assert {k: len(v) for k, v in rows.items()} == {
            "bindings": 1, "turn_ends": 1, "approvals": 1, "questions": 1, "runs": 1,
        }  # fmt: skip
