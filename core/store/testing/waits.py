"""The waits aggregate: approvals, questions and the todo checklist."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from ...errors import StoreError
from ..records import Checklist
from .kit import ContractBase, approval, question, rec

__all__ = ["WaitsContract"]


class WaitsContract(ContractBase):
    """What a turn waits on: approvals, questions; and the checklist it keeps."""

    # -- approvals ----------------------------------------------------------------------
    async def test_an_approval_reads_back_as_written(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        a = approval("c", channel_key="irc:n:#c", self_approve=True)
        serial = await store.approval_add(a)
        assert serial is not None and serial > 0
        assert await store.approval_get(serial) == dataclasses.replace(a, serial=serial)

    async def test_a_short_id_is_unique_among_the_pending_of_a_scope(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        assert await store.approval_add(approval("c", "x1")) is not None
        assert await store.approval_add(approval("c", "x1", call_id="c2")) is None
        assert await store.approval_add(approval("c", "x1", scope="other")) is not None
        assert len(await store.approvals(conversation_id="c")) == 2

    async def test_a_short_id_is_free_again_once_resolved(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        first = await store.approval_add(approval("c", "x1"))
        await store.approval_resolve(first, "denied", "alice", "irc:alice", "no", 20.0)
        again = await store.approval_add(approval("c", "x1", call_id="c2"))
        assert again is not None and again != first

    async def test_an_approval_resolves_once(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        serial = await store.approval_add(approval("c"))
        assert await store.approval_resolve(serial, "approved", "al", "irc:al", "ok", 20.0)
        assert not await store.approval_resolve(serial, "denied", "bo", None, None, 21.0)
        got = await store.approval_get(serial)
        assert (got.state, got.decision, got.approver, got.approver_id, got.reason) == (
            "resolved", "approved", "al", "irc:al", "ok",
        )  # fmt: skip
        assert got.resolved_at == 20.0

    async def test_resolving_an_unknown_approval_is_false(self, store: Any) -> None:
        assert not await store.approval_resolve(999, "expired", None, None, None, 1.0)
        assert await store.approval_get(999) is None

    async def test_a_resumed_call_takes_the_approval_over(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        serial = await store.approval_add(approval("c"))
        await store.approval_rebind(serial, "c-new")
        assert (await store.approval_get(serial)).call_id == "c-new"

    async def test_approvals_filter_by_every_field_given(self, store: Any) -> None:
        await store.create_conversation(rec("a"))
        await store.create_conversation(rec("b"))
        s1 = await store.approval_add(approval("a", "p1"))
        s2 = await store.approval_add(approval("a", "p2", scope="irc:n:#a"))
        s3 = await store.approval_add(approval("b", "p1"))
        await store.approval_resolve(s2, "approved", "x", None, None, 1.0)

        async def serials(**kw: Any) -> list[int]:
            return [a.serial for a in await store.approvals(**kw)]

        assert await serials() == [s1, s2, s3]
        assert await serials(conversation_id="a") == [s1, s2]
        assert await serials(scope="irc:n:#a") == [s2]
        assert await serials(state="pending") == [s1, s3]
        assert await serials(short_id="p1") == [s1, s3]
        assert await serials(conversation_id="a", state="resolved") == [s2]

    async def test_approvals_newest_first_and_limited(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        serials = [await store.approval_add(approval("c", f"i{n}")) for n in range(4)]
        assert [a.serial for a in await store.approvals(limit=2)] == serials[:2]
        newest = await store.approvals(newest_first=True, limit=3)
        assert [a.serial for a in newest] == serials[::-1][:3]

    async def test_first_use_counts_approved_calls_only(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        await store.create_conversation(rec("d"))
        denied = await store.approval_add(approval("c", "n1", tool="rm"))
        await store.approval_resolve(denied, "denied", "x", None, None, 1.0)
        assert not await store.approval_used("c", "rm")
        ok = await store.approval_add(approval("c", "n2", tool="rm"))
        assert not await store.approval_used("c", "rm")  # pending is no use yet
        await store.approval_resolve(ok, "approved", "x", None, None, 2.0)
        assert await store.approval_used("c", "rm")
        assert not await store.approval_used("d", "rm")
        assert not await store.approval_used("c", "ls")

    async def test_an_imported_approval_is_never_a_use(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        old = await store.approval_add(approval("c", "m1", tool="rm", scope="imported:c"))
        await store.approval_resolve(old, "approved", "x", None, None, 1.0)
        assert not await store.approval_used("c", "rm")

    async def test_approvals_go_with_their_conversation(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        serial = await store.approval_add(approval("c"))
        await store.delete_conversation("c")
        assert await store.approval_get(serial) is None
        assert await store.approvals() == []

    async def test_an_approval_needs_its_conversation(self, store: Any) -> None:
        with pytest.raises(StoreError):
            await store.approval_add(approval("ghost"))

    async def test_approval_serials_grow(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        serials = [await store.approval_add(approval("c", f"s{n}")) for n in range(3)]
        assert serials == sorted(serials) and len(set(serials)) == 3

    # -- questions ------------------------------------------------------------------------
    async def test_a_question_reads_back_as_written(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        q = question("c", channel_key="irc:n:#c", answer_from="anyone", text="pick ✓")
        qid = await store.question_add(q)
        assert qid > 0
        assert await store.question_get(qid) == dataclasses.replace(q, id=qid)

    async def test_a_form_reads_back_with_its_fields(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        form = (
            {"id": "region", "text": "which region?", "choices": ["eu", "us"], "required": True},
            {"id": "note", "text": "anything else? ✓", "choices": [], "required": False},
        )
        q = question("c", form=form, text="2 questions")
        qid = await store.question_add(q)
        assert await store.question_get(qid) == dataclasses.replace(q, id=qid)
        [listed] = await store.questions(conversation_id="c", state="pending")
        assert listed.form == form and listed.partial == {}

    async def test_a_forms_answers_add_up_while_it_is_pending(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        form = ({"id": "a", "text": "a?"}, {"id": "b", "text": "b?"}, {"id": "c", "text": "c?"})
        qid = await store.question_add(question("c", form=form))
        assert await store.question_answer_part(qid, {"a": "one ✓"}) == {"a": "one ✓"}
        got = await store.question_answer_part(qid, {"b": None, "a": "uno"})
        assert got == {"a": "uno", "b": None}
        assert (await store.question_get(qid)).partial == {"a": "uno", "b": None}
        assert await store.question_settle(qid, "answered", '{"a": "uno"}', "bob", 20.0)
        # Settled: the answer holds them all (one place, which redaction reaches);
        # no more parts.
        assert await store.question_answer_part(qid, {"c": "late"}) is None
        got = await store.question_get(qid)
        assert (got.answer, got.partial) == ('{"a": "uno"}', {})

    async def test_answers_given_at_once_all_stay(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        form = tuple({"id": f"f{n}", "text": f"{n}?"} for n in range(8))
        qid = await store.question_add(question("c", form=form))
        await asyncio.gather(
            *(store.question_answer_part(qid, {f"f{n}": str(n)}) for n in range(8))
        )
        assert (await store.question_get(qid)).partial == {f"f{n}": str(n) for n in range(8)}

    async def test_a_question_settles_once(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        qid = await store.question_add(question("c"))
        assert await store.question_settle(qid, "answered", "red", "bob", 20.0)
        assert not await store.question_settle(qid, "expired", None, None, 21.0)
        got = await store.question_get(qid)
        assert (got.state, got.outcome, got.answer, got.answered_by, got.answered_at) == (
            "resolved", "answered", "red", "bob", 20.0,
        )  # fmt: skip

    async def test_settling_an_unknown_question_is_false(self, store: Any) -> None:
        assert not await store.question_settle(999, "cancelled", None, None, 1.0)
        assert await store.question_get(999) is None

    async def test_a_resumed_call_takes_the_question_over(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        qid = await store.question_add(question("c"))
        await store.question_rebind(qid, "q-new")
        assert (await store.question_get(qid)).call_id == "q-new"

    async def test_questions_filter_by_conversation_and_state(self, store: Any) -> None:
        await store.create_conversation(rec("a"))
        await store.create_conversation(rec("b"))
        q1 = await store.question_add(question("a"))
        q2 = await store.question_add(question("a", call_id="q2"))
        q3 = await store.question_add(question("b"))
        await store.question_settle(q2, "expired", None, None, 5.0)
        assert [q.id for q in await store.questions()] == [q1, q2, q3]
        assert [q.id for q in await store.questions(conversation_id="a")] == [q1, q2]
        assert [q.id for q in await store.questions(state="pending")] == [q1, q3]
        assert [q.id for q in await store.questions(conversation_id="a", state="resolved")] == [q2]

    async def test_questions_go_with_their_conversation(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        qid = await store.question_add(question("c"))
        await store.delete_conversation("c")
        assert await store.question_get(qid) is None
        assert await store.questions() == []

    async def test_a_question_needs_its_conversation(self, store: Any) -> None:
        with pytest.raises(StoreError):
            await store.question_add(question("ghost"))

    async def test_a_question_without_choices_or_target(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        qid = await store.question_add(question("c", choices=(), asker_target=None))
        got = await store.question_get(qid)
        assert (got.choices, got.asker_target, got.answer_from) == ((), None, "asked")

    # -- the checklist --------------------------------------------------------------------
    async def test_todo_checklist_is_replaced_cleared_and_goes_with_its_conversation(
        self, store: Any
    ) -> None:
        await store.create_conversation(rec("a"))
        await store.create_conversation(rec("b"))
        assert await store.todo_get("a") is None
        first = Checklist(
            items=({"text": "plan", "status": "in_progress"},), run_id="r1", updated_at=1.0
        )
        await store.todo_set("a", first)
        await store.todo_set("b", first)
        assert await store.todo_get("a") == first
        later = Checklist(
            items=({"text": "plan", "status": "done"}, {"text": "ship ✓", "status": "pending"}),
            run_id="r2",
            updated_at=2.0,
        )
        await store.todo_set("a", later)  # replaces the whole list
        assert await store.todo_get("a") == later
        await store.todo_set("a", Checklist(items=(), run_id="r3", updated_at=3.0))  # emptied
        assert await store.todo_get("a") is None
        await store.todo_set("a", later)
        await store.todo_set("a", None)
        assert await store.todo_get("a") is None
        with pytest.raises(StoreError):
            await store.todo_set("nope", first)
        assert await store.delete_conversation("b") is True
        assert await store.todo_get("b") is None

    async def test_a_checklist_is_per_conversation(self, store: Any) -> None:
        await store.create_conversation(rec("a"))
        await store.create_conversation(rec("b"))
        mine = Checklist(items=({"text": "a", "status": "pending"},), run_id=None, updated_at=1.0)
        await store.todo_set("a", mine)
        assert await store.todo_get("b") is None
        assert await store.todo_get("a") == mine
