"""Full-text search over the audit log (issue 34)."""

from __future__ import annotations

from typing import Any

from ...messages import NewMessage
from .kit import ContractBase, rec

__all__ = ["SearchContract"]


async def _say(store: Any, cid: str, kind: str, text: str, at: float, **kw: Any) -> int:
    rows = await store.append(
        cid,
        log=[NewMessage(kind=kind, content=text, created_at=at, **kw)],  # type: ignore[arg-type]
    )
    return int(rows[0].id)


class SearchContract(ContractBase):
    """``search_messages`` finds the user and assistant messages holding every word of
    a query (whole or as a prefix, any case), newest first, page by page; never a
    tool's rows, redacted text or a deleted conversation's messages."""

    async def _seed(self, store: Any) -> None:
        await store.create_conversation(rec("lyon", 1.0, "Lyon"), channel_key="irc:n:#lyon")
        await store.create_conversation(rec("oslo", 2.0, "Oslo"))
        await _say(store, "lyon", "user", "Will it rain in Lyon tomorrow?", 10.0, author="bob")
        await _say(store, "lyon", "assistant", "Rain is likely: 12 mm in LYON.", 11.0, run_id="r1")
        await _say(store, "oslo", "user", "Snow in Oslo, and rainfall?", 12.0, author="al")
        await _say(
            store, "oslo", "tool_result", "raincoat Lyon", 13.0, tool_call_id="c1",
            tool_name="weather",
        )  # fmt: skip

    async def test_every_word_as_a_word_or_its_start_any_case_newest_first(
        self, store: Any
    ) -> None:
        await self._seed(store)
        found = await store.search_messages("rain")
        # "rainfall" starts with it; the tool's "raincoat" is not searched.
        assert [(h.conversation_id, h.kind) for h in found] == [
            ("oslo", "user"), ("lyon", "assistant"), ("lyon", "user"),
        ]  # fmt: skip
        first = found[-1]
        assert (first.author, first.created_at) == ("bob", 10.0)
        assert first.snippet == "Will it rain in Lyon tomorrow?"
        assert found[1].run_id == "r1"
        assert [h.conversation_id for h in await store.search_messages("lyon RAIN")] == [
            "lyon", "lyon",
        ]  # fmt: skip
        assert await store.search_messages("rain snow nothing") == []
        assert [h.conversation_id for h in await store.search_messages("snow, rain!")] == ["oslo"]
        # Not a word's middle; punctuation alone or nothing is no query.
        assert await store.search_messages("ain") == []
        assert await store.search_messages("  ?! ") == []
        assert await store.search_messages("") == []
        # Query syntax of any engine is taken as words.
        assert await store.search_messages('rain" OR "x') == []
        assert len(await store.search_messages("lyon* (rain)")) == 2

    async def test_a_page_at_a_time(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        for i in range(7):
            await _say(store, "c", "user", f"note number {i}", float(i + 1))
        pages = [await store.search_messages("note", limit=3, offset=o) for o in (0, 3, 6, 9)]
        assert [[h.snippet[-1] for h in p] for p in pages] == [
            ["6", "5", "4"], ["3", "2", "1"], ["0"], [],
        ]  # fmt: skip

    async def test_a_long_message_is_shown_around_the_word_found(self, store: Any) -> None:
        await store.create_conversation(rec("c"))
        text = "filler " * 100 + "the needle is here " + "more " * 100
        await _say(store, "c", "assistant", text, 1.0)
        (hit,) = await store.search_messages("needle")
        assert "the needle is here" in hit.snippet
        assert hit.snippet.startswith("…") and hit.snippet.endswith("…")
        assert len(hit.snippet) <= 162

    async def test_deleted_and_redacted_text_is_not_found(self, store: Any) -> None:
        await self._seed(store)
        await store.delete_conversation("oslo")
        assert [h.conversation_id for h in await store.search_messages("rain")] == [
            "lyon", "lyon",
        ]  # fmt: skip
        if "redaction" in store.capabilities:
            (asked,) = [h for h in await store.search_messages("tomorrow")]
            await store.redact_message(
                "lyon", asked.message_id, content="(redacted)", by="admin", reason="", at=20.0
            )
            assert await store.search_messages("tomorrow") == []
            assert [h.kind for h in await store.search_messages("redacted")] == ["user"]
        # New messages are found as soon as they are written.
        await _say(store, "lyon", "user", "tomorrow again", 30.0)
        assert [h.snippet for h in await store.search_messages("tomorrow")] == ["tomorrow again"]
