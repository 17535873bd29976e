"""The log aggregate: conversations, bindings, the audit log, working memory,
turn ends and redaction."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from ...errors import StoreError
from ...messages import ChatMessage, NewMessage, ToolCall
from ..records import RedactionError, RunRecord, TurnEnd
from .kit import ContractBase, chat, outbox, question, rec, user

__all__ = ["LogContract"]


class LogContract(ContractBase):
    """Conversations, channel bindings, the dual log, turn ends and redaction."""

    # -- conversations -------------------------------------------------------------------
    async def test_conversation_crud_and_listing(self, store: Any) -> None:
        await store.create_conversation(rec("a", 1.0, "first"))
        await store.create_conversation(rec("b", 2.0))
        assert (await store.get_conversation("a")).title == "first"
        assert await store.get_conversation("zzz") is None
        assert [r.id for r in await store.list_conversations()] == ["b", "a"]
        await store.update_conversation("a", title="renamed", updated_at=3.0)
        page = await store.list_conversations(limit=1)
        assert [(r.id, r.title) for r in page] == [("a", "renamed")]
        assert [r.id for r in await store.list_conversations(limit=1, offset=1)] == ["b"]

    async def test_a_conversation_reads_back_as_written(self, store: Any) -> None:
        r = rec("c", 5.5, "title ✓", meta={"channel_key": "irc:n:#c", "n": [1, 2]})
        await store.create_conversation(r)
        assert await store.get_conversation("c") == r

    async def test_a_second_conversation_with_the_same_id_fails(self, store: Any) -> None:
        await store.create_conversation(rec("c", title="one"))
        with pytest.raises(StoreError):
            await store.create_conversation(rec("c", title="two"))
        assert (await store.get_conversation("c")).title == "one"

    async def test_update_changes_only_what_is_given(self, store: Any) -> None:
        await store.create_conversation(rec("c", 1.0, "t", meta={"a": 1}))
        await store.update_conversation("c", meta={"b": 2})
        got = await store.get_conversation("c")
        assert (got.title, got.updated_at, got.meta) == ("t", 1.0, {"b": 2})
        await store.update_conversation("c")
        assert await store.get_conversation("c") == got

    async def test_updating_a_missing_conversation_creates_nothing(self, store: Any) -> None:
        await store.update_conversation("ghost", title="x", updated_at=2.0)
        assert await store.get_conversation("ghost") is None

    async def test_listing_breaks_update_time_ties_by_id(self, store: Any) -> None:
        for cid in ("b", "c", "a"):
            await store.create_conversation(rec(cid, 1.0))
        await store.create_conversation(rec("z", 0.5))
        assert [r.id for r in await store.list_conversations()] == ["a", "b", "c", "z"]

    async def test_a_keyset_page_continues_the_listing(self, store: Any) -> None:
        # Ties of update time (ordered by id) across page boundaries, ids that sort
        # bytewise ("B" before "a"), and a key naming no conversation.
        for cid, updated in (("a", 3.0), ("c", 2.0), ("B", 2.0), ("b", 2.0), ("é", 2.0),
                             ("d", 1.0), ("e", 1.0), ("f", 0.5)):  # fmt: skip
            await store.create_conversation(rec(cid, updated))
        listed = await store.list_conversations(limit=100)
        assert [r.id for r in listed] == ["a", "B", "b", "c", "é", "d", "e", "f"]
        for i, last in enumerate(listed):
            page = await store.list_conversations_after(last.updated_at, last.id, limit=3)
            assert page == listed[i + 1 : i + 4]
        gone = await store.list_conversations_after(2.0, "bb", limit=10)
        assert [r.id for r in gone] == ["c", "é", "d", "e", "f"]
        assert await store.list_conversations_after(9.0, "", limit=2) == listed[:2]
        assert await store.list_conversations_after(0.5, "f") == []

    async def test_listing_past_the_end_is_empty(self, store: Any) -> None:
        await store.create_conversation(rec("a"))
        assert await store.list_conversations(offset=5) == []
        assert await store.list_conversations() != []

    async def test_an_empty_store_lists_nothing(self, store: Any) -> None:
        assert await store.list_conversations() == []
        assert await store.pending_turns() == []

    async def test_delete_cascades_to_every_row(self, store: Any) -> None:
        await store.create_conversation(rec("gone"), channel_key="irc:net:#gone")
        await store.create_conversation(rec("kept"), channel_key="irc:net:#kept")
        for cid in ("gone", "kept"):
            await store.append(cid, log=[user("x")], memory=[chat("x")])
        assert await store.delete_conversation("gone") is True
        assert await store.delete_conversation("gone") is False
        assert await store.get_conversation("gone") is None
        assert await store.get_binding("irc:net:#gone") is None
        assert await store.messages("gone") == []
        assert await store.load_memory("gone") == []
        assert await store.get_binding("irc:net:#kept") == "kept"
        assert await store.count_messages("kept") == 1

    async def test_deleting_a_missing_conversation_is_false(self, store: Any) -> None:
        assert await store.delete_conversation("never") is False

    async def test_a_deleted_conversations_open_turns_are_not_pending(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        await store.append("c", log=[user("hi", run_id="r1")])
        await store.delete_conversation("c")
        assert await store.pending_turns() == []

    async def test_a_deleted_id_can_be_used_again(self, store: Any) -> None:
        await store.create_conversation(rec("c", title="old"))
        await store.append("c", log=[user("old")])
        await store.delete_conversation("c")
        await store.create_conversation(rec("c", title="new"))
        assert (await store.get_conversation("c")).title == "new"
        assert await store.messages("c") == []

    # -- bindings ---------------------------------------------------------------------
    async def test_bindings(self, store: Any) -> None:
        await store.create_conversation(rec("a"), channel_key="stdio:local")
        await store.create_conversation(rec("b"))
        assert await store.get_binding("stdio:local") == "a"
        await store.set_binding("stdio:local", "b")
        assert await store.get_binding("stdio:local") == "b"

    async def test_an_unbound_channel_has_no_conversation(self, store: Any) -> None:
        assert await store.get_binding("irc:net:#nobody") is None

    async def test_one_conversation_may_have_several_channels(self, store: Any) -> None:
        await store.create_conversation(rec("a"), channel_key="irc:n:#one")
        await store.set_binding("irc:n:#two", "a")
        assert await store.get_binding("irc:n:#one") == "a"
        assert await store.get_binding("irc:n:#two") == "a"

    async def test_binding_to_a_missing_conversation_fails(self, store: Any) -> None:
        with pytest.raises(StoreError):
            await store.set_binding("irc:n:#x", "ghost")
        assert await store.get_binding("irc:n:#x") is None

    async def test_creating_a_bound_conversation_takes_the_channel_over(self, store: Any) -> None:
        await store.create_conversation(rec("a"), channel_key="k")
        await store.create_conversation(rec("b"), channel_key="k")
        assert await store.get_binding("k") == "b"
        assert await store.get_conversation("a") is not None

    # -- the audit log ------------------------------------------------------------------
    async def test_append_returns_ids_and_pages_history(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        rows = await store.append("c", log=[user(f"m{i}", author="bob") for i in range(10)])
        ids = [r.id for r in rows]
        assert ids == sorted(ids) and len(set(ids)) == 10
        assert rows[0].author == "bob" and rows[0].conversation_id == "c"
        assert [m.content for m in await store.messages("c", limit=3)] == ["m7", "m8", "m9"]
        assert [m.content for m in await store.messages("c", after=ids[2], limit=2)] == [
            "m3",
            "m4",
        ]
        assert [m.content for m in await store.messages("c", before=ids[2], limit=5)] == [
            "m0",
            "m1",
        ]
        assert [m.content for m in await store.messages("c", offset=8, limit=5)] == ["m8", "m9"]
        assert await store.count_messages("c") == 10

    async def test_messages_filter_by_kind_and_keep_fields(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        await store.append(
            "c",
            log=[
                user("hi"),
                NewMessage(
                    kind="tool_call", tool_call_id="t1", tool_name="add", arguments='{"a":1}'
                ),
                NewMessage(
                    kind="tool_result",
                    tool_call_id="t1",
                    tool_name="add",
                    content="2",
                    data={"sum": 2},
                    is_error=False,
                    duration=0.25,
                ),
                NewMessage(kind="assistant", content="partial", status="interrupted", run_id="r1"),
            ],
        )
        results = await store.messages("c", kinds=["tool_result"])
        assert len(results) == 1 and results[0].data == {"sum": 2} and results[0].duration == 0.25
        assistant = (await store.messages("c", kinds=["assistant"]))[0]
        assert assistant.status == "interrupted" and assistant.run_id == "r1"

    async def test_a_row_reads_back_field_for_field(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        [row] = await store.append(
            "c",
            log=[
                NewMessage(
                    kind="tool_result", content="ünï ✓", author="bob", channel="#c", run_id="r",
                    tool_call_id="t", tool_name="x", arguments=None, is_error=True,
                    status="error", data={"k": ["v", 1, None]}, duration=1.5, created_at=42.0,
                )
            ],
        )  # fmt: skip
        assert await store.messages("c") == [row]
        assert (row.content, row.is_error, row.created_at, row.data) == (
            "ünï ✓",
            True,
            42.0,
            {"k": ["v", 1, None]},
        )

    async def test_a_row_without_a_time_gets_the_time_of_writing(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        before = time.time()
        [row] = await store.append("c", log=[NewMessage(kind="user", content="x")])
        assert before - 1 <= row.created_at <= time.time() + 1

    async def test_ids_grow_across_conversations(self, store: Any) -> None:
        await store.create_conversation(rec("a"))
        await store.create_conversation(rec("b"))
        [x] = await store.append("a", log=[user("x")])
        [y] = await store.append("b", log=[user("y")])
        [z] = await store.append("a", log=[user("z")])
        assert x.id < y.id < z.id

    async def test_an_empty_append_writes_nothing(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        assert await store.append("c") == []
        assert await store.count_messages("c") == 0 and await store.load_memory("c") == []

    async def test_append_moves_the_update_time_forward_only(self, store: Any) -> None:
        await store.create_conversation(rec("c", 5.0))
        await store.append("c", log=[user("x")], updated_at=9.0)
        assert (await store.get_conversation("c")).updated_at == 9.0
        await store.append("c", log=[user("y")], updated_at=7.0)
        assert (await store.get_conversation("c")).updated_at == 9.0

    async def test_an_unknown_conversation_has_no_rows(self, store: Any) -> None:
        assert await store.messages("ghost") == []
        assert await store.count_messages("ghost") == 0
        assert await store.load_memory("ghost") == []

    async def test_paging_between_two_ids(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        ids = [m.id for m in await store.append("c", log=[user(f"m{i}") for i in range(6)])]
        page = await store.messages("c", after=ids[0], before=ids[4], limit=10)
        assert [m.content for m in page] == ["m1", "m2", "m3"]
        page = await store.messages("c", after=ids[0], before=ids[4], limit=2)
        assert [m.content for m in page] == ["m1", "m2"]

    async def test_the_last_rows_before_an_id(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        ids = [m.id for m in await store.append("c", log=[user(f"m{i}") for i in range(6)])]
        page = await store.messages("c", before=ids[5], limit=2)
        assert [m.content for m in page] == ["m3", "m4"]

    async def test_filtering_by_several_kinds(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        await store.append(
            "c",
            log=[
                user("u"),
                NewMessage(kind="assistant", content="a"),
                NewMessage(kind="tool_call", tool_call_id="t", tool_name="x", arguments="{}"),
                NewMessage(kind="tool_result", tool_call_id="t", tool_name="x", content="r"),
            ],
        )
        got = await store.messages("c", kinds=["user", "tool_result"])
        assert [m.kind for m in got] == ["user", "tool_result"]
        assert await store.count_messages("c") == 4

    async def test_paging_after_the_last_id_is_empty(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        [row] = await store.append("c", log=[user("only")])
        assert await store.messages("c", after=row.id) == []

    async def test_offset_counts_from_the_oldest_row(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        await store.append("c", log=[user(f"m{i}") for i in range(5)])
        assert [m.content for m in await store.messages("c", offset=0, limit=2)] == ["m0", "m1"]
        assert [m.content for m in await store.messages("c", offset=3, limit=9)] == ["m3", "m4"]

    async def test_rows_of_one_conversation_only(self, store: Any) -> None:
        await store.create_conversation(rec("a"))
        await store.create_conversation(rec("b"))
        await store.append("a", log=[user("for a")])
        await store.append("b", log=[user("for b")])
        assert [m.content for m in await store.messages("a")] == ["for a"]
        assert await store.count_messages("b") == 1

    async def test_append_to_missing_conversation_fails_cleanly(self, store: Any) -> None:
        with pytest.raises(StoreError):
            await store.append("nope", log=[user("x")])

    async def test_create_conversation_with_its_first_rows(self, store: Any) -> None:
        stored = await store.create_conversation_with(
            rec("k", 5.0, "child"),
            log=[user("task", author="bob", run_id="run_1")],
            memory=[chat("task", message_id=-1)],
            updated_at=6.0,
        )
        assert [(m.content, m.conversation_id) for m in stored] == [("task", "k")]
        got = await store.get_conversation("k")
        assert (got.title, got.updated_at) == ("child", 6.0)
        assert [m.id for m in await store.messages("k")] == [stored[0].id]
        [entry] = await store.load_memory("k")
        assert entry.message.message_id == stored[0].id
        # A second conversation with that id fails and writes none of its rows.
        with pytest.raises(StoreError):
            await store.create_conversation_with(rec("k"), log=[user("again")])
        assert [m.content for m in await store.messages("k")] == ["task"]

    async def test_a_new_channels_binding_is_written_with_its_first_message(
        self, store: Any
    ) -> None:
        # A new Slack thread: its conversation, its binding and the message that
        # opened it, one write.
        stored = await store.create_conversation_with(
            rec("t"), log=[user("hello", run_id="run_1")], channel_key="slack:T:C:1.5"
        )
        assert await store.get_binding("slack:T:C:1.5") == "t"
        assert [m.id for m in await store.messages("t")] == [stored[0].id]
        # A failed one binds nothing (the id is taken: nothing of it is written).
        with pytest.raises(StoreError):
            await store.create_conversation_with(
                rec("t"), log=[user("again")], channel_key="slack:T:C:2.5"
            )
        assert await store.get_binding("slack:T:C:2.5") is None

    async def test_every_engine_takes_a_deferred_write(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        first = asyncio.ensure_future(store.append("c", log=[user("held")], defer=True))
        await asyncio.sleep(0)  # submitted first
        await store.append("c", log=[user("next")])
        assert [m.content for m in await first] == ["held"]
        assert [m.content for m in await store.messages("c")] == ["held", "next"]

    async def test_concurrent_appends_all_land_in_order(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        results = await asyncio.gather(*(store.append("c", log=[user(f"m{i}")]) for i in range(30)))
        ids = [r[0].id for r in results]
        assert ids == sorted(ids) and await store.count_messages("c") == 30

    # -- working memory -----------------------------------------------------------------
    async def test_working_memory_append_and_compact_leaves_audit_log(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        for i in range(6):
            await store.append("c", log=[user(f"u{i}")], memory=[chat(f"u{i}")])
        entries = await store.load_memory("c")
        assert [e.message.content for e in entries] == [f"u{i}" for i in range(6)]
        await store.compact("c", entries[3].pos, chat("summary", role="system"))
        after = [e.message.content for e in await store.load_memory("c")]
        assert after == ["summary", "u4", "u5"]
        # Appends after a compaction go after the kept tail.
        await store.append("c", memory=[chat("u6")])
        assert [e.message.content for e in await store.load_memory("c")][-1] == "u6"
        assert await store.count_messages("c") == 6

    async def test_memory_entries_link_to_the_rows_of_their_append(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        rows = await store.append(
            "c",
            log=[user("one"), user("two")],
            memory=[chat("two", message_id=-2), chat("one", message_id=-1), chat("free")],
        )
        got = [(e.message.content, e.message.message_id) for e in await store.load_memory("c")]
        assert got == [("two", rows[1].id), ("one", rows[0].id), ("free", None)]

    async def test_memory_positions_ascend(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        for i in range(4):
            await store.append("c", memory=[chat(f"m{i}"), chat(f"n{i}")])
        pos = [e.pos for e in await store.load_memory("c")]
        assert pos == sorted(pos) and len(set(pos)) == 8

    async def test_a_memory_entry_reads_back_whole(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        call = ToolCall(id="t1", name="add", arguments='{"a": 1}')
        entries = [
            ChatMessage(role="assistant", content="", tool_calls=(call,)),
            ChatMessage(role="tool", content="2", tool_call_id="t1", name="add", is_error=True),
            ChatMessage(role="user", content="hé", author="bob"),
        ]
        await store.append("c", memory=entries)
        assert [e.message for e in await store.load_memory("c")] == entries

    async def test_compacting_everything_leaves_the_summary(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        await store.append("c", memory=[chat("a"), chat("b")])
        last = (await store.load_memory("c"))[-1].pos
        await store.compact("c", last, chat("all of it", role="system", message_id=7))
        [only] = await store.load_memory("c")
        assert (only.pos, only.message.content, only.message.message_id) == (last, "all of it", 7)

    async def test_compaction_is_per_conversation(self, store: Any) -> None:
        await store.create_conversation(rec("a"))
        await store.create_conversation(rec("b"))
        await store.append("a", memory=[chat("a1"), chat("a2")])
        await store.append("b", memory=[chat("b1"), chat("b2")])
        await store.compact("a", (await store.load_memory("a"))[-1].pos, chat("s", role="system"))
        assert [e.message.content for e in await store.load_memory("b")] == ["b1", "b2"]

    async def test_rewinding_drops_the_tail_of_working_memory_and_keeps_the_log(
        self, store: Any
    ) -> None:
        await store.create_conversation(rec("c"))
        await store.create_conversation(rec("d"))
        await store.append("d", memory=[chat("d1")])
        await store.append(
            "c",
            log=[user("q1"), user("q2")],
            memory=[chat("q1", message_id=-1), chat("a1", role="assistant"),
                    chat("q2", message_id=-2), chat("a2", role="assistant")],
        )  # fmt: skip
        entries = await store.load_memory("c")
        assert await store.rewind("c", entries[2].pos) == 2
        assert [e.message.content for e in await store.load_memory("c")] == ["q1", "a1"]
        assert [m.content for m in await store.messages("c")] == ["q1", "q2"]
        # The next entries go after what is left; other conversations keep theirs.
        await store.append("c", memory=[chat("q2 again")])
        after = await store.load_memory("c")
        assert [e.message.content for e in after] == ["q1", "a1", "q2 again"]
        assert after[-1].pos > after[1].pos
        assert [e.message.content for e in await store.load_memory("d")] == ["d1"]
        assert await store.rewind("c", after[-1].pos + 100) == 0

    # -- turn ends --------------------------------------------------------------------
    async def test_a_user_message_without_an_end_is_pending(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        [row] = await store.append("c", log=[user("hi", run_id="r1")])
        assert await store.pending_turns() == [row]

    async def test_a_turns_origin_reads_back_with_its_message_and_pending_turn(
        self, store: Any
    ) -> None:
        # What agentik.core.turnsettings.TurnOrigin records in the user message's data.
        origin = {
            "transport": "libera", "channel_key": "irc:libera:#c", "speaker_id": "alice",
            "display_name": "Alice ✓", "verified": True,
        }  # fmt: skip
        data = {"author_id": "libera:alice", "origin": origin}
        await store.create_conversation(rec("c"))
        [row] = await store.append("c", log=[user("hi", run_id="r1", data=data)])
        assert row.data == data
        assert [m.data for m in await store.messages("c", kinds=["user"])] == [data]
        [pending] = await store.pending_turns()
        assert pending.data == data and pending.data["origin"]["verified"] is True

    async def test_a_turn_end_closes_the_turn(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        await store.append("c", log=[user("hi", run_id="r1")])
        await store.append(
            "c", log=[NewMessage(kind="assistant", content="yo", run_id="r1")],
            ended=TurnEnd("r1", "stop"),
        )  # fmt: skip
        assert await store.pending_turns() == []

    async def test_ambient_notes_are_not_turns(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        await store.append("c", log=[user("just chatting")])
        assert await store.pending_turns() == []

    async def test_only_user_messages_are_turns(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        await store.append("c", log=[NewMessage(kind="assistant", content="x", run_id="r1")])
        assert await store.pending_turns() == []

    async def test_a_child_runs_conversation_is_not_resumed(self, store: Any) -> None:
        await store.create_conversation(rec("child", meta={"parent_run_id": "top"}))
        await store.create_conversation(rec("top"))
        await store.append("child", log=[user("task", run_id="k1")])
        [row] = await store.append("top", log=[user("ask", run_id="t1")])
        assert await store.pending_turns() == [row]

    async def test_pending_turns_page_oldest_first(self, store: Any) -> None:
        await store.create_conversation(rec("a"))
        await store.create_conversation(rec("b"))
        rows = []
        for i in range(5):
            rows += await store.append("ab"[i % 2], log=[user(f"m{i}", run_id=f"r{i}")])
        assert await store.pending_turns(limit=2) == rows[:2]
        assert await store.pending_turns(after=rows[2].id) == rows[3:]

    async def test_a_turn_ends_once(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        await store.append("c", log=[user("hi", run_id="r1")], ended=TurnEnd("r1", "stop"))
        await store.append("c", ended=TurnEnd("r1", "error"))
        rows = await store.export_rows("c")
        assert [(t["run_id"], t["outcome"]) for t in rows["turn_ends"]] == [("r1", "stop")]

    async def test_a_turn_end_is_per_conversation(self, store: Any) -> None:
        await store.create_conversation(rec("a"))
        await store.create_conversation(rec("b"))
        await store.append("a", log=[user("x", run_id="same")], ended=TurnEnd("same", "stop"))
        [row] = await store.append("b", log=[user("y", run_id="same")])
        assert await store.pending_turns() == [row]

    async def test_a_turn_end_may_carry_its_run(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        run = RunRecord(run_id="r1", conversation_id="c", started=1.0, ended=2.0,
                        stop_reason="stop", usage={"total_tokens": 5})  # fmt: skip
        await store.append("c", log=[user("hi", run_id="r1")], ended=TurnEnd("r1", "stop", run))
        assert await store.runs("c") == [run]

    # -- redaction --------------------------------------------------------------------
    async def test_redaction_replaces_the_text_and_is_audited(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        [row] = await store.append("c", log=[user("my secret", author="bob")])
        done = await store.redact_message(
            "c", row.id, content="[gone]", by="alice", reason="oops", at=5.0
        )
        assert (done.conversation_id, done.message_id, done.by, done.at, done.reason) == (
            "c",
            row.id,
            "alice",
            5.0,
            "oops",
        )
        [after] = await store.messages("c")
        assert after.content == "[gone]" and after.author == "bob"
        assert after.data == {"redacted": {"by": "alice", "at": 5.0, "reason": "oops"}}
        assert await store.redactions("c") == [done]

    async def test_a_message_is_redacted_once(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        [row] = await store.append("c", log=[user("x")])
        await store.redact_message("c", row.id, content="-", by="a", reason="", at=1.0)
        with pytest.raises(RedactionError):
            await store.redact_message("c", row.id, content="-", by="a", reason="", at=2.0)
        assert len(await store.redactions()) == 1

    async def test_redacting_what_is_not_there_is_none(self, store: Any) -> None:
        await store.create_conversation(rec("a"))
        await store.create_conversation(rec("b"))
        [row] = await store.append("a", log=[user("x")])
        assert await store.redact_message("b", row.id, content="-", by="x", reason="", at=1) is None
        assert await store.redact_message("a", 10**9, content="-", by="x", reason="", at=1) is None
        assert [m.content for m in await store.messages("a")] == ["x"]
        assert await store.redactions() == []

    async def test_redaction_keeps_the_author_identity_only(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        [row] = await store.append("c", log=[user("x", data={"author_id": "irc:bob", "k": 1})])
        await store.redact_message("c", row.id, content="-", by="a", reason="r", at=1.0)
        [after] = await store.messages("c")
        assert after.data == {
            "redacted": {"by": "a", "at": 1.0, "reason": "r"},
            "author_id": "irc:bob",
        }

    async def test_redaction_reaches_the_linked_working_memory(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        await store.append(
            "c", log=[user("secret")], memory=[chat("secret", message_id=-1), chat("other")]
        )
        [row] = await store.messages("c")
        await store.redact_message("c", row.id, content="[r]", by="a", reason="", at=1.0)
        got = [e.message.content for e in await store.load_memory("c")]
        assert got == ["[r]", "other"]

    async def test_a_redacted_tool_call_keeps_its_place(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        call = ToolCall(id="t1", name="shell", arguments='{"cmd": "cat key"}')
        [row] = await store.append(
            "c",
            log=[NewMessage(kind="tool_call", tool_call_id="t1", tool_name="shell",
                            arguments=call.arguments)],
            memory=[ChatMessage(role="assistant", content="", tool_calls=(call,))],
        )  # fmt: skip
        await store.redact_message("c", row.id, content="[r]", by="a", reason="", at=1.0)
        [after] = await store.messages("c")
        assert after.arguments == "{}" and after.content == "[r]"
        [entry] = await store.load_memory("c")
        assert entry.message.tool_calls == (ToolCall(id="t1", name="shell", arguments="{}"),)

    async def test_redaction_renames_a_title_taken_from_the_message(self, store: Any) -> None:
        await store.create_conversation(rec("c", title="my secret plan"))
        await store.create_conversation(rec("d", title="unrelated"))
        [row] = await store.append("c", log=[user("my secret plan for today")])
        [other] = await store.append("d", log=[user("nothing alike")])
        await store.redact_message("c", row.id, content="-", by="a", reason="", at=1.0)
        await store.redact_message("d", other.id, content="-", by="a", reason="", at=1.0)
        assert (await store.get_conversation("c")).title == "(redacted)"
        assert (await store.get_conversation("d")).title == "unrelated"

    async def test_redacting_an_answer_reaches_its_question(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        qid = await store.question_add(question("c", call_id="q1"))
        await store.question_settle(qid, "answered", "my pin is 1234", "bob", 2.0)
        [row] = await store.append(
            "c",
            log=[NewMessage(kind="tool_result", tool_call_id="q1", tool_name="ask_user",
                            content="my pin is 1234", run_id="r1")],
        )  # fmt: skip
        await store.redact_message("c", row.id, content="[r]", by="a", reason="", at=3.0)
        assert (await store.question_get(qid)).answer == "[r]"

    async def test_redacting_an_answer_reaches_its_outbox_pieces(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        [row] = await store.append(
            "c", log=[NewMessage(kind="assistant", content="the secret", run_id="r9")]
        )
        await store.outbox_add([outbox(0, "the secret", run_id="r9"), outbox(1, "x", run_id="r8")])
        await store.redact_message("c", row.id, content="[r]", by="a", reason="", at=1.0)
        texts = sorted((e.run_id, e.text) for e in await store.outbox_undelivered())
        assert texts == [("r8", "x"), ("r9", "[r]")]

    async def test_redactions_list_oldest_first_per_conversation(self, store: Any) -> None:
        await store.create_conversation(rec("a"))
        await store.create_conversation(rec("b"))
        ra = await store.append("a", log=[user("1"), user("2")])
        [rb] = await store.append("b", log=[user("3")])
        for cid, row in (("a", ra[1]), ("b", rb), ("a", ra[0])):
            await store.redact_message(cid, row.id, content="-", by="x", reason="", at=1.0)
        assert [r.message_id for r in await store.redactions("a")] == [ra[1].id, ra[0].id]
        assert len(await store.redactions()) == 3
        assert len(await store.redactions(limit=2)) == 2

    async def test_redactions_go_with_their_conversation(self, store: Any) -> None:
        await store.create_conversation(rec("a"))
        await store.create_conversation(rec("b"))
        [ra] = await store.append("a", log=[user("1")])
        [rb] = await store.append("b", log=[user("2")])
        await store.redact_message("a", ra.id, content="-", by="x", reason="", at=1.0)
        await store.redact_message("b", rb.id, content="-", by="x", reason="", at=1.0)
        await store.delete_conversation("a")
        assert [r.conversation_id for r in await store.redactions()] == ["b"]
        assert await store.redactions("a") == []

    async def test_message_span(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        await store.create_conversation(rec("d"))
        assert await store.message_span("c") is None
        rows = await store.append("c", log=[user("a"), user("b"), user("c")])
        await store.append("d", log=[user("elsewhere")])
        assert await store.message_span("c") == (rows[0].id, rows[-1].id)
