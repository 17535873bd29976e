"""The channel conversation's checkpoints: ``!checkpoint [label]`` takes one (at most
``[checkpoints] keep_manual`` taken by hand per conversation), ``!checkpoints``
lists them, ``!checkpoints rm N`` deletes one (admins)
(:mod:`agentik.core.checkpoints`)."""

from __future__ import annotations

import time

from agentik.core.errors import AgentikError, CheckpointLimit

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
    except CheckpointLimit as exc:
        # Refused, not made room for: each kept one was taken on purpose.
        p = ctx.prefix
        if exc.limit <= 0:
            await ctx.say("checkpoints are not taken by hand here ([checkpoints] keep_manual = 0)")
            return
        await ctx.say(
            f"not taken: this conversation keeps at most {exc.limit} checkpoints taken by"
            f" hand and has them all; an admin can delete one with {p}checkpoints rm N"
            f" ({p}checkpoints lists them)"
        )
        return
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
    left, with its automatic checkpoint) — never another channel's.  ``!checkpoints rm
    N``: delete checkpoint N of this channel's conversation (admins)."""
    if ctx.args and ctx.args[0] == "rm":
        await _remove(ctx)
        return
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


async def _remove(ctx: CommandContext) -> None:
    """``!checkpoints rm N``: an admin deletes checkpoint N of the channel's
    conversation (one taken by hand makes room for another)."""
    p = ctx.prefix
    if len(ctx.args) != 2 or not ctx.args[1].lstrip("#").isdigit():
        await ctx.say(f"usage: {p}checkpoints rm N (the checkpoint's number, from {p}checkpoints)")
        return
    if not ctx.decision.admin:
        await ctx.say("only admins may delete checkpoints")
        return
    number = int(ctx.args[1].lstrip("#"))
    ch = await ctx.host.channel(ctx.key, ctx.transport, ctx.options)
    # (A number past the engines' 64-bit integers names no checkpoint.)
    if 0 < number < 2**62 and await ch.conversation.delete_checkpoint(number):
        await ctx.say(f"checkpoint #{number} deleted")
    else:
        await ctx.say(f"this conversation has no checkpoint #{number}")
