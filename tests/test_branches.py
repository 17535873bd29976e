"""Regenerate the last answer and edit-and-resend the last question: a new branch in
the working memory (the model sees only it), both branches in the audit log."""

from __future__ import annotations

import pytest

from agentik.core import Agent, SQLiteStore
from agentik.core.errors import BranchError
from agentik.core.testing.scripted import Reply, ScriptedModel


def _said(request) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in request.messages]


async def test_regenerate_and_edit_branch_the_context_and_the_log_keeps_both(db_path):
    model = ScriptedModel()
    async with Agent(llm=model, store=SQLiteStore(db_path)) as agent:
        conv = await agent.create_conversation()
        model.enqueue("Lyon: rain.", "Paris: sun.", "Paris, again: sun.", "Oslo: snow.")
        await conv.send("Weather in Lyon?")
        await conv.wait_idle()
        await conv.send("And Paris?")
        await conv.wait_idle()
        asked = await conv.last_question()
        assert asked is not None and asked.content == "And Paris?"
        # Regenerate: the same question again, without the first answer to it.
        await conv.submit(asked.content, branch=True)
        await conv.wait_idle()
        assert _said(model.requests[-1]) == [
            ("user", "Weather in Lyon?"),
            ("assistant", "Lyon: rain."),
            ("user", "And Paris?"),
        ]
        # Edit and resend: another question in its place.
        await conv.submit("And Oslo?", branch=True)
        await conv.wait_idle()
        assert _said(model.requests[-1]) == [
            ("user", "Weather in Lyon?"),
            ("assistant", "Lyon: rain."),
            ("user", "And Oslo?"),
        ]
        assert [(m.role, m.content) for m in await conv.working_memory()] == [
            ("user", "Weather in Lyon?"),
            ("assistant", "Lyon: rain."),
            ("user", "And Oslo?"),
            ("assistant", "Oslo: snow."),
        ]
        rows = await conv.messages(limit=100)
        assert [(m.kind, m.content) for m in rows] == [
            ("user", "Weather in Lyon?"),
            ("assistant", "Lyon: rain."),
            ("user", "And Paris?"),
            ("assistant", "Paris: sun."),
            ("user", "And Paris?"),
            ("assistant", "Paris, again: sun."),
            ("user", "And Oslo?"),
            ("assistant", "Oslo: snow."),
        ]
        # Each new question names the one it replaced.
        assert rows[4].data["branch_of"] == rows[2].id
        assert rows[6].data["branch_of"] == rows[4].id
    # A restart reads the same branch back (the replaced questions are no orphans).
    async with Agent(llm=model, store=SQLiteStore(db_path)) as agent:
        conv = await agent.get_conversation(conv.id)
        model.enqueue("ok")
        await conv.send("Thanks")
        await conv.wait_idle()
        assert _said(model.requests[-1]) == [
            ("user", "Weather in Lyon?"),
            ("assistant", "Lyon: rain."),
            ("user", "And Oslo?"),
            ("assistant", "Oslo: snow."),
            ("user", "Thanks"),
        ]


async def test_no_branch_while_a_turn_runs_or_before_any_question(db_path):
    model = ScriptedModel()
    async with Agent(llm=model, store=SQLiteStore(db_path)) as agent:
        conv = await agent.create_conversation()
        with pytest.raises(BranchError, match="no question"):
            await conv.submit("hello", branch=True)
        assert await conv.messages() == [] and await conv.last_question() is None
        slow = Reply(chunks=["slow ", "answer"], hold_after=1)
        model.enqueue(slow)
        await conv.send("first")
        await slow.held.wait()
        with pytest.raises(BranchError, match="running or queued"):
            await conv.submit("other", branch=True)
        slow.release.set()
        await conv.wait_idle()
        assert [m.content for m in await conv.messages()] == ["first", "slow answer"]


async def test_a_branch_made_where_the_turn_runs_only_replaces_the_last_question(db_path):
    """``branch_at`` (what the worker that runs a queued regenerate does): the named
    question leaves the context with its answer only while it is the last question;
    once another question came after it, nothing of the context is taken out."""
    model = ScriptedModel()
    async with Agent(llm=model, store=SQLiteStore(db_path)) as agent:
        conv = await agent.create_conversation()
        model.enqueue("Lyon: rain.", "Paris: sun.")
        for text in ("Weather in Lyon?", "And Paris?"):
            await conv.send(text)
            await conv.wait_idle()
        first, _, second, _ = await conv.messages(limit=10)
        context = [(m.role, m.content) for m in await conv.working_memory()]
        assert not await conv.branch_at(first.id)  # another question came after it
        assert [(m.role, m.content) for m in await conv.working_memory()] == context
        assert await conv.branch_at(second.id)
        assert [(m.role, m.content) for m in await conv.working_memory()] == [
            ("user", "Weather in Lyon?"),
            ("assistant", "Lyon: rain."),
        ]
        assert len(await conv.messages(limit=10)) == 4  # the audit log keeps it
