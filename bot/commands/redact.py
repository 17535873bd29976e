"""Redaction (issue 22): ``!redact``."""

from __future__ import annotations

import time
from typing import Any

from agentik.core.access import may_redact
from agentik.core.errors import NotFound
from agentik.core.messages import Message, MessageKind
from agentik.core.redaction import RedactionError

from .base import CommandContext

__all__ = ["redact"]


async def redact(ctx: CommandContext) -> None:
    """``!redact`` / ``!redact last``: the speaker's own last message here;
    ``!redact list``: the recent messages' numbers (never their text);
    ``!redact N [reason]``: message N of this channel's conversation —
    the author's own (verified identity) or, for admins, anyone's."""
    args, message, transport = ctx.args, ctx.message, ctx.transport
    decision, say, p = ctx.decision, ctx.say, ctx.prefix
    key = message.channel_key
    conv_id = await ctx.agent.store.get_binding(key)
    if conv_id is None:
        await say("nothing to redact here")
        return
    me = ctx.author_id
    # An ask_user answer (a tool result carrying its answerer's
    # author_id) is its author's words too: listed and redactable by them.
    kinds: list[MessageKind] = ["user", "assistant", "tool_result"]
    recent = [
        m
        for m in await ctx.agent.store.messages(conv_id, limit=50, kinds=kinds)
        if not _is_redacted(m) and (m.kind != "tool_result" or _data(m).get("author_id"))
    ]
    what = args[0].lower() if args else "last"
    reason = " ".join(args[1:])
    if what == "list":
        if not recent:
            await say("no messages to redact here")
            return
        shown = [
            f"#{m.id} {m.author or _redact_label(m)} ({len(m.content)} chars, {_ago(m.created_at)})"
            for m in recent[-8:]
        ]
        await say(f"recent messages: {'; '.join(shown)} — {p}redact N [reason]")
        return
    if what == "last":
        mine = [m for m in recent if me is not None and _data(m).get("author_id") == me]
        if not mine:
            await say(
                "no message of yours to redact here"
                + ("" if me else " (your identity is not verified: ask an admin)")
            )
            return
        target = mine[-1]
    else:
        try:
            number = int(what.lstrip("#"))
        except ValueError:
            await say(f"usage: {p}redact [last] | {p}redact list | {p}redact N [reason]")
            return
        rows = await ctx.agent.store.messages(conv_id, after=number - 1, limit=1)
        if not rows or rows[0].id != number:
            await say(f"no message #{number} in this channel's conversation")
            return
        target = rows[0]
        if not may_redact(decision.admin, me, _data(target).get("author_id")):
            await say(f"only its author or an admin may redact message #{number}")
            return
    by = me or f"{transport.name}:{message.author_id}"
    try:
        done = await ctx.agent.redact(conv_id, target.id, by=by, reason=reason)
    except (NotFound, RedactionError) as exc:
        await say(f"cannot redact message #{target.id}: {exc}")
        return
    notes = (
        f"; {done.notes_removed} memory note(s) derived from it deleted"
        if done.notes_removed
        else ""
    )
    await say(f"message #{target.id} redacted{notes}")


def _data(m: Message) -> dict[str, Any]:
    return m.data if isinstance(m.data, dict) else {}


def _redact_label(m: Message) -> str:
    if m.kind == "tool_result":
        return f"answer of {_data(m).get('answered_by') or '?'}"
    return "bot" if m.kind == "assistant" else "?"


def _is_redacted(m: Message) -> bool:
    return "redacted" in _data(m)


def _ago(t: float) -> str:
    minutes = max(0, int((time.time() - t) // 60))
    if minutes < 60:
        return f"{minutes}m ago"
    if minutes < 48 * 60:
        return f"{minutes // 60}h ago"
    return f"{minutes // (24 * 60)}d ago"
