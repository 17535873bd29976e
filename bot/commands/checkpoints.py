"""The channel conversation's checkpoints: ``!checkpoint [label]`` takes one,
``!checkpoints`` lists them (:mod:`agentik.core.checkpoints`)."""

from __future__ import annotations

import time

from agentik.core.errors import AgentikError

from ..chat import error_line
from .base import CommandContext

__all__ = ["checkpoint", "checkpoints"]

#: At most this many checkpoints are listed in chat (the newest).
LISTED = 10


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(at))


async def checkpoint(ctx: CommandContext) -> None:
    """``!checkpoint [label]``: keep a snapshot of the conversation as it is now."""
    ch = await ctx.host.channel(ctx.key, ctx.transport, ctx.options)
    label = " ".join(ctx.args)
    try:
        record = await ch.conversation.checkpoint(label)
    except AgentikError as exc:
        line = error_line(type(exc).__name__, str(exc), where=ctx.key, prefix=ctx.prefix)
        await ctx.say(f"could not take a checkpoint: {line.removeprefix('error: ')}")
        return
    named = f" “{record.label}”" if record.label else ""
    await ctx.say(
        f"checkpoint #{record.id}{named} kept ({record.size:,} bytes);"
        f" {ctx.prefix}checkpoints lists them"
    )


async def checkpoints(ctx: CommandContext) -> None:
    """``!checkpoints [conversation]``: the conversation's checkpoints, newest first;
    with an id, those of an earlier conversation of this channel (the one ``!new``
    left, with its automatic checkpoint) — never another channel's."""
    if ctx.args:
        wanted = ctx.args[0]
        record = await ctx.agent.store.get_conversation(wanted)
        if record is None or record.meta.get("channel_key") != ctx.key:
            # The same answer for "no such" and "another channel's": nothing leaks.
            await ctx.say(f"this channel has no conversation {wanted[:64]!r}")
            return
        found = await ctx.agent.store.checkpoints(wanted)
    else:
        ch = await ctx.host.channel(ctx.key, ctx.transport, ctx.options)
        found = await ch.conversation.checkpoints()
    if not found:
        await ctx.say(f"no checkpoints yet; {ctx.prefix}checkpoint [label] takes one")
        return
    for c in found[:LISTED]:
        how = "automatic" if c.automatic else "taken"
        label = f" “{c.label}”" if c.label else ""
        await ctx.say(f"#{c.id} {_when(c.created_at)} {how}{label} ({c.size:,} bytes)")
    if len(found) > LISTED:
        await ctx.say(f"… and {len(found) - LISTED} older")
