"""The runs aggregate: the run tree of agents started as tools."""

from __future__ import annotations

from typing import Any

from ..records import RunRecord, TurnEnd
from .kit import ContractBase, rec, user

__all__ = ["RunsContract"]


def run(run_id: str, cid: str | None, **kw: Any) -> RunRecord:
    return RunRecord(run_id=run_id, conversation_id=cid, **kw)


class RunsContract(ContractBase):
    """Runs: recorded as they end, listed with the child runs they started."""

    async def test_a_run_reads_back_as_written(self, store: Any) -> None:
        await store.create_conversation(rec("top"))
        await store.create_conversation(rec("kid"))
        r = run("k1", "kid", parent_run_id="t1", parent_conversation_id="top",
                parent_call_id="call", agent="researcher", depth=1, started=1.5, ended=3.0,
                stop_reason="stop", usage={"prompt_tokens": 3, "completion_tokens": 4})  # fmt: skip
        await store.run_add(r)
        assert await store.runs("kid") == [r]

    async def test_runs_include_the_children_a_conversation_started(self, store: Any) -> None:
        for cid in ("top", "kid", "other"):
            await store.create_conversation(rec(cid))
        top = run("t1", "top", started=1.0)
        kid = run("k1", "kid", parent_run_id="t1", parent_conversation_id="top", started=2.0)
        await store.run_add(run("o1", "other", started=0.5))
        await store.run_add(kid)
        await store.run_add(top)
        assert await store.runs("top") == [top, kid]
        assert await store.runs("kid") == [kid]

    async def test_a_run_recorded_again_is_replaced(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        await store.run_add(run("r1", "c", started=1.0))
        done = run("r1", "c", started=1.0, ended=2.0, stop_reason="length", usage={"t": 1})
        await store.run_add(done)
        assert await store.runs("c") == [done]

    async def test_runs_are_ordered_by_start_then_id(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        for rid, t in (("b", 2.0), ("c", 1.0), ("a", 2.0)):
            await store.run_add(run(rid, "c", started=t))
        assert [r.run_id for r in await store.runs("c")] == ["c", "a", "b"]

    async def test_a_child_refused_at_the_depth_limit_has_no_conversation(self, store: Any) -> None:
        await store.create_conversation(rec("top"))
        refused = run("k9", None, parent_run_id="t1", parent_conversation_id="top", depth=3,
                      started=1.0, ended=1.0, stop_reason="depth_limit")  # fmt: skip
        await store.run_add(refused)
        assert await store.runs("top") == [refused]

    async def test_runs_go_with_their_conversation(self, store: Any) -> None:
        await store.create_conversation(rec("top"))
        await store.create_conversation(rec("kid"))
        await store.run_add(run("k1", "kid", parent_conversation_id="top", started=1.0))
        await store.delete_conversation("top")
        assert await store.runs("kid") == []

    async def test_a_conversation_without_runs(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        assert await store.runs("c") == []
        assert await store.runs("ghost") == []

    async def test_a_turn_end_records_its_run_in_the_same_write(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        first = run("r1", "c", started=1.0, ended=2.0, stop_reason="stop")
        await store.append("c", log=[user("x", run_id="r1")], ended=TurnEnd("r1", "stop", first))
        later = run("r1", "c", started=1.0, ended=5.0, stop_reason="error")
        await store.append("c", ended=TurnEnd("r1", "error", later))
        # The turn ends once; its run record is the last one written.
        assert await store.runs("c") == [later]
        assert await store.pending_turns() == []
