"""Linked channels made in chat (issue 33): ``!link``, ``!unlink``, ``!links`` (admins,
verified: the registry checks ``needs_role`` against the speaker's own identity)."""

from __future__ import annotations

import shlex
from typing import Any

from pydantic import ValidationError

from ..links import Link, LinkSettings, audit, describe
from .base import CommandContext

__all__ = ["link", "links", "unlink"]

#: What ``!link`` says when it cannot make sense of its words.
_USAGE = (
    "usage: {p}link <name> <channel>... [key=value]... (answer=asked, relay=false,"
    ' opt_out_prefix="no relay" (a value with blanks in quotes), icons.<network>=:emoji:|'
    "https://..., key= resets; on a link made in chat: -<channel> takes one out)"
)

#: Typographic double quotes a phone or a word processor puts in place of ``"``.
_CURLY = str.maketrans({"\u201c": '"', "\u201d": '"', "\u201e": '"'})


class _Unquoted(ValueError):
    """A quote in ``!link``'s words is not closed (the message says which)."""


def _open_quote(text: str) -> tuple[str, str] | None:
    """The quote left open in ``text`` and the words after it, or ``None``."""
    quote, start = "", 0
    for i, c in enumerate(text):
        if not quote and c in "\"'":
            quote, start = c, i
        elif c == quote:
            quote = ""
    return (quote, text[start + 1 :]) if quote else None


def _words(text: str) -> list[str]:
    """``!link``'s arguments, split as a shell would: ``name="Ops room"`` is one word,
    ``name=Ops room``.  Blanks split; ``"..."`` and ``'...'`` group (a ``'`` inside
    ``"..."`` and the other way round); a backslash is itself (nothing is escaped);
    ``#`` starts no comment (IRC channels); typographic double quotes count as ``"``.
    :class:`_Unquoted` (a ValueError) names a quote left open."""
    text = text.translate(_CURLY)
    lexer = shlex.shlex(text, posix=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    lexer.escape = ""
    try:
        return list(lexer)
    except ValueError:
        found = _open_quote(text)
        quote, after = found if found is not None else ('"', "")
        other = "'" if quote == '"' else '"'
        after = " ".join(after.split())
        shown = f" before {after[:30]!r}" if after else " at the end"
        raise _Unquoted(
            f"the {quote}{shown} is not closed: close it, or put a value holding"
            f" a {quote} in {other}...{other}"
        ) from None


def _parse(words: list[str], options: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Fold ``key=value`` words into ``options`` (``icons.<network>=...`` one network's
    icon, ``key=`` back to its default); the channels named and the ``-<channel>``s.
    Values stay text (their quotes gone): the settings model reads ``yes``, ``3`` as it
    does in TOML."""
    add: list[str] = []
    drop: list[str] = []
    for word in words:
        key, eq, value = word.partition("=")
        if not eq:
            (drop if word.startswith("-") and len(word) > 1 else add).append(word.lstrip("-"))
            continue
        group, dot, item = key.partition(".")
        if dot and group == "icons":
            icons = dict(options.get("icons") or {})
            if value:
                icons[item] = value
            else:
                icons.pop(item, None)
            options["icons"] = icons
        elif value:
            options[key] = value
        else:
            options.pop(key, None)
    return add, drop


async def link(ctx: CommandContext) -> None:
    """``!link <name> <channel>... [key=value]...``: the channels named (and this one, in
    a shared channel) become one conversation; options as in ``[[links]]``, a value
    with blanks in quotes (``opt_out_prefix="no relay"``, :func:`_words`), a network's
    icon in Slack as ``icons.<network>=:emoji:`` (or an ``https`` URL).  On the name of a
    link made in chat it changes that link: options set (``key=`` resets one), channels
    named added, ``-<channel>`` taken out."""
    usage = _USAGE.format(p=ctx.prefix)
    typed = ctx.message.text.strip()[len(ctx.prefix) :].split(maxsplit=1)
    try:
        args = _words(typed[1]) if len(typed) > 1 else []
    except _Unquoted as exc:
        await ctx.say(f"{ctx.prefix}link: {exc}")
        return
    if not args:
        await ctx.say(usage)
        return
    name, rest = args[0], args[1:]
    old = ctx.host.links.links.get(name)
    if old is not None and old.source == "config":
        await ctx.say(f"link {name!r} is in the configuration: change it there")
        return
    options: dict[str, Any] = {}
    if old is not None:
        options = old.settings.model_dump(exclude={"name", "channels"}, exclude_defaults=True)
    add, drop = _parse(rest, options)
    if old is None:
        if drop:
            await ctx.say(f"there is no link named {name!r} to take {drop[0]} out of")
            return
        if not ctx.message.direct and ctx.key not in add:
            add.insert(0, ctx.key)
        channels = add
    else:
        if not rest:
            await ctx.say(f"link {name!r} exists; say what to change. {usage}")
            return
        channels = [k for k in (*old.channels, *add) if k not in drop]
        channels = list(dict.fromkeys(channels))
    try:
        settings = LinkSettings(name=name, channels=channels, **options)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "link"
        await ctx.say(f"{where}: {first['msg']}; {usage}")
        return
    created_by = old.created_by if old is not None else ctx.actor
    new = Link(settings=settings, source="chat", created_by=created_by)
    try:
        if old is None:
            await ctx.host.links.add(new)
        else:
            await ctx.host.links.amend(new)
    except (KeyError, ValueError) as exc:
        await ctx.say(str(exc).strip("'\""))
        return
    if old is None:
        audit("made", new, ctx.actor, ctx.key)
        await ctx.say(f"linked {name}: {' '.join(new.channels)} are one conversation now")
        return
    audit("changed", new, ctx.actor, ctx.key)
    await ctx.say(f"changed {name}: {describe(new)}")


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
