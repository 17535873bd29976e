"""The lifecycle aggregate: what a snapshot exports of a conversation."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ...lifecycle import (
    RetentionSettings,
    apply_retention,
    export_conversation,
    plan_retention,
    validate_snapshot,
)
from ...messages import NewMessage
from ...settings import validate_settings
from ..records import A2ATaskRecord, Checklist, RedactionError, RunRecord, TurnEnd
from ..snapshot import (
    DELETED_NOTICE,
    IMPORTED,
    IMPORTED_SCOPE,
    RETENTION_AUTHOR,
    SnapshotError,
    SnapshotParts,
)
from .kit import ContractBase, approval, chat, question, rec, user

__all__ = ["ExportContract", "ImportContract", "LifecycleContract", "PruneContract"]


class ExportContract(ContractBase):
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
            "form": None, "partial": None,
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


async def _snapshot(store: Any, cid: str) -> dict[str, Any]:
    doc = await export_conversation(store, cid)
    assert doc is not None
    return validate_snapshot(json.loads(json.dumps(doc)))


async def _one_turn(store: Any, cid: str = "c", channel: str | None = "irc:n:#c") -> list[Any]:
    await store.create_conversation(
        rec(cid, 1.0, "t", meta={"channel_key": channel} if channel else {}), channel_key=channel
    )
    return list(
        await store.append(
            cid,
            log=[
                user("hi", author="bob", run_id="r1", data={"author_id": "irc:bob"},
                     created_at=2.0),
                NewMessage(kind="assistant", content="yo", run_id="r1", created_at=3.0),
                user("open", author="bob", run_id="r2", created_at=4.0),
            ],
            memory=[chat("hi", message_id=-1), chat("yo", role="assistant", message_id=-2)],
            ended=TurnEnd("r1", "stop"),
        )
    )  # fmt: skip


def _task(cid: str, task_id: str, state: str) -> A2ATaskRecord:
    return A2ATaskRecord(
        owner="imported:alice", task_id=task_id, conversation_id=cid, state=state,
        updated_at=30.0, body=json.dumps({"id": task_id}), final=state == "TASK_STATE_COMPLETED",
    )  # fmt: skip


def _parts(cid: str) -> SnapshotParts:
    return SnapshotParts(
        attachments=[(b"\x89PNG", "image/png", 40.0)],
        checkpoints=[('{"n": 1}', 41.0, "first", False), ('{"n": 2}', 42.0, "later", True)],
        a2a_tasks=[_task(cid, "t1", "TASK_STATE_COMPLETED"),
                   _task(cid, "taken", "TASK_STATE_COMPLETED")],
    )  # fmt: skip


class ImportContract(ContractBase):
    """``import_rows``: a snapshot restored as untrusted history, the same on every engine."""

    async def test_an_import_renumbers_and_relinks(self, store: Any) -> None:
        await _one_turn(store)
        doc = await _snapshot(store, "c")
        result = await store.import_rows(doc, "copy", bind=None, now=50.0)
        assert (result.conversation_id, result.messages) == ("copy", 3)
        rows = await store.messages("copy")
        assert [m.content for m in rows] == ["hi", "yo", "open"]
        assert {m.id for m in rows}.isdisjoint({m.id for m in await store.messages("c")})
        got = [(e.pos, e.message.message_id) for e in await store.load_memory("copy")]
        assert got == [(1, rows[0].id), (2, rows[1].id)]
        assert (await store.get_conversation("copy")).title == "t"

    async def test_an_import_never_takes_an_existing_id(self, store: Any) -> None:
        await _one_turn(store)
        doc = await _snapshot(store, "c")
        with pytest.raises(SnapshotError, match="already exists"):
            await store.import_rows(doc, "c", bind=None, now=50.0)
        assert await store.count_messages("c") == 3

    async def test_imported_turns_are_never_resumed(self, store: Any) -> None:
        await _one_turn(store)
        doc = await _snapshot(store, "c")
        await store.delete_conversation("c")
        await store.import_rows(doc, "c", bind=None, now=50.0)
        assert await store.pending_turns() == []
        ends = {t["run_id"]: t["outcome"] for t in (await store.export_rows("c"))["turn_ends"]}
        assert ends == {"r1": "stop", "r2": IMPORTED}

    async def test_imported_authors_are_labels(self, store: Any) -> None:
        await _one_turn(store)
        doc = await _snapshot(store, "c")
        await store.import_rows(doc, "copy", bind=None, now=50.0)
        first = (await store.messages("copy"))[0]
        assert first.data == {"imported_author_id": "irc:bob"}

    async def test_imported_approvals_grant_nothing(self, store: Any) -> None:
        await _one_turn(store)
        done = await store.approval_add(approval("c", "d1", tool="rm"))
        await store.approval_resolve(done, "approved", "al", None, None, 5.0)
        await store.approval_add(approval("c", "p1", tool="rm", call_id="c2"))
        doc = await _snapshot(store, "c")
        await store.import_rows(doc, "copy", bind=None, now=50.0)
        got = await store.approvals(conversation_id="copy")
        assert [(a.scope, a.state, a.decision) for a in got] == [
            (IMPORTED_SCOPE + "c", "resolved", "approved"),
            (IMPORTED_SCOPE + "c", "resolved", "expired"),
        ]
        assert got[1].resolved_at == 50.0
        assert not await store.approval_used("copy", "rm")

    async def test_imported_pending_questions_expire(self, store: Any) -> None:
        await _one_turn(store)
        await store.question_add(question("c"))
        doc = await _snapshot(store, "c")
        await store.import_rows(doc, "copy", bind=None, now=50.0)
        [q] = await store.questions(conversation_id="copy")
        assert (q.state, q.outcome, q.choices) == ("resolved", "expired", ("red", "blue"))

    async def test_an_imported_pending_form_expires_with_its_answers_so_far(
        self, store: Any
    ) -> None:
        await _one_turn(store)
        form = ({"id": "a", "text": "a?"}, {"id": "b", "text": "b?"})
        qid = await store.question_add(question("c", form=form))
        await store.question_answer_part(qid, {"a": "yes ✓"})
        doc = await _snapshot(store, "c")
        await store.import_rows(doc, "copy", bind=None, now=50.0)
        [q] = await store.questions(conversation_id="copy")
        assert (q.state, q.outcome, q.form, q.partial) == ("resolved", "expired", form, {})
        assert json.loads(q.answer) == {"a": "yes ✓"}

    async def test_imported_open_runs_end_and_known_runs_stay(self, store: Any) -> None:
        await _one_turn(store)
        await store.run_add(RunRecord(run_id="open", conversation_id="c", started=1.0))
        doc = await _snapshot(store, "c")
        await store.delete_conversation("c")
        await store.import_rows(doc, "c", bind=None, now=50.0)
        [run] = await store.runs("c")
        assert (run.ended, run.stop_reason) == (50.0, IMPORTED)
        await store.import_rows(doc, "again", bind=None, now=60.0)  # the run is taken
        assert await store.runs("again") == []

    async def test_imported_links_to_a_missing_parent_are_dropped(self, store: Any) -> None:
        await store.create_conversation(rec("kid", meta={"parent_run_id": "t1"}))
        await store.run_add(
            RunRecord(run_id="k1", conversation_id="kid", parent_conversation_id="kid",
                      started=1.0, ended=2.0)
        )  # fmt: skip
        doc = await _snapshot(store, "kid")
        doc["runs"][0]["parent_conversation_id"] = "not-here"
        await store.delete_conversation("kid")
        await store.import_rows(doc, "kid", bind=None, now=50.0)
        [run] = await store.runs("kid")
        assert run.parent_conversation_id is None
        meta = (await store.get_conversation("kid")).meta
        assert meta == {"imported_links": {"parent_run_id": "t1"}}

    async def test_imported_bindings_never_take_a_channel(self, store: Any) -> None:
        await _one_turn(store)
        doc = await _snapshot(store, "c")
        result = await store.import_rows(doc, "copy", bind=None, now=50.0)
        assert (result.bound, result.skipped_bindings) == ([], ["irc:n:#c"])
        assert await store.get_binding("irc:n:#c") == "c"
        assert "channel_key" not in (await store.get_conversation("copy")).meta

    async def test_imported_bindings_are_restored_where_free(self, store: Any) -> None:
        await _one_turn(store)
        doc = await _snapshot(store, "c")
        await store.delete_conversation("c")
        result = await store.import_rows(doc, "c", bind=None, now=50.0)
        assert result.bound == ["irc:n:#c"]
        assert await store.get_binding("irc:n:#c") == "c"
        assert (await store.get_conversation("c")).meta["channel_key"] == "irc:n:#c"

    async def test_an_import_bound_to_a_channel_takes_it_over(self, store: Any) -> None:
        await _one_turn(store)
        doc = await _snapshot(store, "c")
        result = await store.import_rows(doc, "copy", bind="irc:n:#c", now=50.0)
        assert result.bound == ["irc:n:#c"]
        assert await store.get_binding("irc:n:#c") == "copy"
        assert (await store.get_conversation("copy")).meta["channel_key"] == "irc:n:#c"

    async def test_an_imported_checklist(self, store: Any) -> None:
        await _one_turn(store)
        items = ({"text": "a", "status": "done"}, {"text": "b", "status": "pending"})
        await store.todo_set("c", Checklist(items=items, run_id="r1", updated_at=3.0))
        doc = await _snapshot(store, "c")
        await store.import_rows(doc, "copy", bind=None, now=50.0)
        assert await store.todo_get("copy") == Checklist(items=items, run_id="r1", updated_at=3.0)

    async def test_an_imported_redaction_stays(self, store: Any) -> None:
        rows = await _one_turn(store)
        await store.redact_message("c", rows[0].id, content="[r]", by="a", reason="", at=1.0)
        doc = await _snapshot(store, "c")
        await store.import_rows(doc, "copy", bind=None, now=50.0)
        first = (await store.messages("copy"))[0]
        assert first.content == "[r]"
        with pytest.raises(RedactionError):
            await store.redact_message("copy", first.id, content="-", by="a", reason="", at=2.0)

    async def test_a_snapshot_that_cannot_be_restored_leaves_nothing(self, store: Any) -> None:
        await _one_turn(store)
        await store.approval_add(approval("c"))
        doc = await _snapshot(store, "c")
        del doc["approvals"][0]["tool"]
        with pytest.raises(SnapshotError, match=r"approvals\[0\]"):
            await store.import_rows(doc, "copy", bind=None, now=50.0)
        assert await store.get_conversation("copy") is None
        assert await store.messages("copy") == []

    async def test_an_import_writes_its_parts_with_its_rows(self, store: Any) -> None:
        """``parts``: attachments, checkpoints and A2A task records land with the
        conversation; a task record the database has keeps its first copy."""
        await _one_turn(store)
        doc = await _snapshot(store, "c")
        await store.a2a_task_put(_task("c", "taken", "TASK_STATE_WORKING"))
        parts = _parts("copy")
        result = await store.import_rows(doc, "copy", bind=None, now=50.0, parts=parts)
        assert result.skipped_tasks == 1
        [held] = await store.attachments("copy")
        assert (held.media_type, held.size, held.created_at) == ("image/png", 4, 40.0)
        assert await store.attachment_data(held.sha256) == b"\x89PNG"
        found = await store.checkpoints("copy")
        assert [(c.label, c.automatic, c.created_at) for c in found] == [
            ("later", True, 42.0), ("first", False, 41.0),
        ]  # fmt: skip
        assert await store.checkpoint_get("copy", found[1].id) == '{"n": 1}'
        kept = await store.a2a_task_get("imported:alice", "t1")
        assert (kept.conversation_id, kept.state, kept.final) == ("copy", "TASK_STATE_COMPLETED",
                                                                  True)  # fmt: skip
        first = await store.a2a_task_get("imported:alice", "taken")
        assert (first.conversation_id, first.state) == ("c", "TASK_STATE_WORKING")

    async def test_a_refused_import_writes_none_of_its_parts(self, store: Any) -> None:
        await _one_turn(store)
        await store.approval_add(approval("c"))
        doc = await _snapshot(store, "c")
        del doc["approvals"][0]["tool"]
        with pytest.raises(SnapshotError, match=r"approvals\[0\]"):
            await store.import_rows(doc, "copy", bind=None, now=50.0, parts=_parts("copy"))
        assert await store.get_conversation("copy") is None
        assert await store.checkpoints("copy") == []
        assert await store.attachments("copy") == []
        assert await store.a2a_task_get("imported:alice", "t1") is None

    async def test_export_import_export_keeps_the_history(self, store: Any) -> None:
        await _one_turn(store, channel=None)
        first = await _snapshot(store, "c")
        await store.import_rows(first, "copy", bind=None, now=50.0)
        second = await _snapshot(store, "copy")

        def history(doc: dict[str, Any]) -> list[Any]:
            return [(m["kind"], m["content"], m["created_at"]) for m in doc["messages"]]

        assert history(first) == history(second)
        assert [e["message"]["content"] for e in first["working_memory"]] == [
            e["message"]["content"] for e in second["working_memory"]
        ]


class PruneContract(ContractBase):
    """``prune_log``: retention's cut, the same on every engine."""

    async def _log(self, store: Any) -> list[Any]:
        await store.create_conversation(rec("c"))
        rows = []
        for i in range(3):
            rows += await store.append(
                "c",
                log=[user(f"q{i}", run_id=f"r{i}", created_at=10.0 + i),
                     NewMessage(kind="assistant", content=f"a{i}", run_id=f"r{i}",
                                created_at=10.5 + i)],
                memory=[chat(f"q{i}", message_id=-1),
                        chat(f"a{i}", role="assistant", message_id=-2)],
                ended=TurnEnd(f"r{i}", "stop"),
            )  # fmt: skip
        return rows

    async def test_prune_deletes_the_old_rows_and_notes_it_in_memory(self, store: Any) -> None:
        rows = await self._log(store)
        await store.prune_log("c", rows[3].id, summary=None, count=4)
        assert [m.content for m in await store.messages("c")] == ["q2", "a2"]
        memory = await store.load_memory("c")
        assert [e.message.content for e in memory] == [
            DELETED_NOTICE.format(n=4),
            "q2",
            "a2",
        ]
        assert (memory[0].message.role, memory[0].message.message_id) == ("system", rows[3].id)

    async def test_prune_puts_the_summary_where_the_rows_were(self, store: Any) -> None:
        rows = await self._log(store)
        await store.prune_log("c", rows[1].id, summary="they said hi", count=2)
        first, *rest = await store.messages("c")
        assert (first.id, first.kind, first.author, first.content, first.created_at) == (
            rows[1].id, "assistant", RETENTION_AUTHOR, "they said hi", 10.5,
        )  # fmt: skip
        assert first.data == {"retention": {"summarised": 2}}
        assert [m.content for m in rest] == ["q1", "a1", "q2", "a2"]
        memory = [e.message.content for e in await store.load_memory("c")]
        assert memory == ["they said hi", "q1", "a1", "q2", "a2"]

    async def test_prune_touches_no_other_conversation(self, store: Any) -> None:
        rows = await self._log(store)
        await store.create_conversation(rec("d"))
        await store.append("d", log=[user("mine")], memory=[chat("mine")])
        await store.prune_log("c", rows[-1].id, summary=None, count=6)
        assert await store.count_messages("c") == 0
        assert [m.content for m in await store.messages("d")] == ["mine"]
        assert [e.message.content for e in await store.load_memory("d")] == ["mine"]

    async def test_retention_sees_every_conversation_oldest_first(self, store: Any) -> None:
        await store.create_conversation(rec("b", 2.0, meta={"channel_key": "irc:n:#old"}))
        await store.create_conversation(rec("a", 2.0), channel_key="irc:n:#a")
        await store.create_conversation(rec("z", 1.0, meta={"channel_key": 7}))
        await store.set_binding("irc:n:#a2", "a")
        got = await store.retention_conversations()
        assert [(cid, sorted(keys), mk) for cid, keys, mk in got] == [
            ("z", [], None),
            ("a", ["irc:n:#a", "irc:n:#a2"], None),
            ("b", [], "irc:n:#old"),
        ]

    async def test_the_log_outline(self, store: Any) -> None:
        rows = await self._log(store)
        outline = await store.log_outline("c")
        assert outline == [(m.id, m.kind, m.created_at, m.author, m.run_id) for m in rows]
        assert await store.log_outline("ghost") == []

    async def test_whether_a_turn_ended(self, store: Any) -> None:
        await self._log(store)
        await store.append("c", log=[user("open", run_id="r9")])
        assert await store.turn_ended("c", "r0")
        assert not await store.turn_ended("c", "r9")
        assert not await store.turn_ended("other", "r0")

    async def test_retention_plans_and_prunes_through_the_contract(self, store: Any) -> None:
        rows = await self._log(store)
        await store.append("c", log=[user("new", run_id="r5", created_at=1e12)])
        settings = validate_settings(
            RetentionSettings,
            {"rules": [{"channels": ["*"], "keep_days": 1, "action": "delete"}]},
            where="retention",
        )
        rules = settings.rules
        [item] = await plan_retention(store, rules)
        assert (item.conversation_id, item.upto, item.messages) == ("c", rows[-1].id, 6)
        [done] = await apply_retention(store, settings)
        assert done.done and done.error is None
        assert [m.content for m in await store.messages("c")] == ["new"]

    async def test_pruning_everything_leaves_one_memory_entry(self, store: Any) -> None:
        rows = await self._log(store)
        await store.prune_log("c", rows[-1].id, summary=None, count=6)
        [entry] = await store.load_memory("c")
        assert entry.message.content == DELETED_NOTICE.format(n=6)


class LifecycleContract(ExportContract, ImportContract, PruneContract):
    """The lifecycle aggregate: export rows, import rows, prune."""
