"""Memory notes (issue 22): ``!memory`` and ``!forget``."""

from __future__ import annotations

import contextlib

from agentik.core.access import may_forget
from agentik.core.errors import AgentikError
from agentik.core.memory import channel_scope, user_scope

from .base import CommandContext

__all__ = ["forget", "memory"]


async def _visible_scopes(ctx: CommandContext) -> tuple[list[str], str | None]:
    """The memory scopes a channel sees (global, the channel, its recent
    verified speakers and the asker), and the asker's own user scope."""
    message = ctx.message
    key = message.channel_key
    scopes = ["global", channel_scope(key)]
    mine = ctx.author_id
    own = user_scope(mine) if mine else None
    speakers: list[str] = []
    conv_id = await ctx.agent.store.get_binding(key)
    if conv_id is not None:
        with contextlib.suppress(AgentikError):
            speakers = list(await (await ctx.agent.get_conversation(conv_id)).speakers())
    for who in (mine, *speakers):
        if who and user_scope(who) not in scopes:
            scopes.append(user_scope(who))
    return scopes, own


async def memory(ctx: CommandContext) -> None:
    """``!memory``: the notes visible here, most recent first, paged with ``more``."""
    message, opts, say = ctx.message, ctx.options, ctx.say
    transport = ctx.transport
    key = message.channel_key
    scopes, own = await _visible_scopes(ctx)
    notes = await ctx.agent.memory.list(scopes, limit=200)
    if not notes:
        await say("no memory notes here")
        return

    def label(scope: str) -> str:
        if scope == "global":
            return "global"
        if scope == own:
            return "you"
        return "here" if scope.startswith("channel:") else scope.split(":", 1)[1]

    lines = []
    for n in notes:
        text = " ".join(n.text.split())
        text = text if len(text) <= 100 else text[:99] + "…"
        lines.append(f"#{n.id} [{label(n.scope)}] {text}")
    ch = await ctx.host.channel(key, transport, opts)
    cap = ch.options.max_answer_lines or len(lines)
    await say(f"{len(notes)} memory notes here (newest first; {opts.command_prefix}forget N "
              "deletes one):")  # fmt: skip
    for line in lines[:cap]:
        await say(line)
    ch.more.clear()
    ch.more_in_code = False
    ch.more.extend(lines[cap:])
    if ch.more:
        await say(f"… {len(ch.more)} more lines: {opts.command_prefix}more")


async def forget(ctx: CommandContext) -> None:
    """``!forget N``: delete note N if it is visible here; a global note or
    another person's needs an admin (the deletion is a new, audited version)."""
    args, decision, say, p = ctx.args, ctx.decision, ctx.say, ctx.prefix
    if len(args) != 1 or not args[0].lstrip("#").isdigit():
        await say(f"usage: {p}forget N (the note's id, from {p}memory)")
        return
    note_id = int(args[0].lstrip("#"))
    scopes, own = await _visible_scopes(ctx)
    note = await ctx.agent.memory.get(note_id)
    if note is None or note.scope not in scopes:
        await say(f"no memory note {note_id} here")
        return
    if not may_forget(decision.admin, note.scope, own):
        whose = "a global note" if note.scope == "global" else "someone else's note"
        await say(f"note {note_id} is {whose}: only admins may forget it")
        return
    if await ctx.agent.memory.delete(note_id, author=ctx.actor):
        await say(f"forgot note {note_id}")
    else:
        await say(f"no memory note {note_id} here")
