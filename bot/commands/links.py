"""Linked channels made in chat (issue 33): ``!link``, ``!unlink``, ``!links`` (admins,
verified: the registry checks ``needs_role`` against the speaker's own identity)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from ..links import Link, LinkSettings, audit
from .base import CommandContext

__all__ = ["link", "links", "unlink"]

_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def _value(raw: str) -> Any:
    low = raw.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    return int(raw) if raw.isdigit() else raw


async def link(ctx: CommandContext) -> None:
    """``!link <name> <channel>... [key=value]...``: the channels named (and this one, in
    a shared channel) become one conversation; options as in ``[[links]]``."""
    usage = f"usage: {ctx.prefix}link <name> <channel>... [answer=asked] [relay=false]"
    if not ctx.args:
        await ctx.say(usage)
        return
    name, rest = ctx.args[0], ctx.args[1:]
    channels = [a for a in rest if "=" not in a]
    options = dict(a.split("=", 1) for a in rest if "=" in a)
    if not ctx.message.direct and ctx.key not in channels:
        channels.insert(0, ctx.key)
    try:
        settings = LinkSettings(
            name=name, channels=channels, **{k: _value(v) for k, v in options.items()}
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "link"
        await ctx.say(f"{where}: {first['msg']}; {usage}")
        return
    new = Link(settings=settings, source="chat", created_by=ctx.actor)
    try:
        await ctx.host.links.add(new)
    except ValueError as exc:
        await ctx.say(str(exc))
        return
    audit("made", new, ctx.actor, ctx.key)
    await ctx.say(f"linked {name}: {' '.join(new.channels)} are one conversation now")


async def unlink(ctx: CommandContext) -> None:
    """``!unlink <name>``: undo a link made in chat (its first channel keeps the
    conversation, the others start new ones)."""
    if len(ctx.args) != 1:
        await ctx.say(f"usage: {ctx.prefix}unlink <name>")
        return
    try:
        gone = await ctx.host.links.remove(ctx.args[0])
    except KeyError:
        await ctx.say(f"no link named {ctx.args[0]!r}")
        return
    except ValueError as exc:
        await ctx.say(str(exc))
        return
    audit("undone", gone, ctx.actor, ctx.key)
    await ctx.say(f"unlinked {gone.name}: {' '.join(gone.channels)} are apart again")


async def links(ctx: CommandContext) -> None:
    """``!links``: every link in force, one line each."""
    lines = ctx.host.links.describe()
    await ctx.say("; ".join(lines) if lines else "no linked channels")
