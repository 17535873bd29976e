"""Per-channel settings (issue 19): ``!set`` and ``!unset``."""

from __future__ import annotations

import json
import logging

from ..chansettings import (
    SETTING_KEYS,
    Effective,
    SettingError,
    parse_setting,
    settings_scope,
    split_args,
)
from .base import CommandContext

__all__ = ["set_", "unset"]

log = logging.getLogger(__name__)


async def _settings_actor(ctx: CommandContext) -> str | None:
    """The qualified id of a speaker allowed to change settings here, else ``None`` (told)."""
    message, transport, say = ctx.message, ctx.transport, ctx.say
    actor = ctx.author_id
    if actor is None:
        await say(
            f"only a verified {ctx.host.settings_role} may change this channel's settings "
            "(your identity is not verified here)"
        )
        return None
    role = ctx.host.role_for(transport.name, message, message.channel_key)
    if not ctx.access.at_least(role, ctx.host.settings_role):
        await say(
            f"changing this channel's settings needs the {ctx.host.settings_role} role "
            f"(you are {role})"
        )
        return None
    return actor


async def set_(ctx: CommandContext) -> None:
    """``!set <key> <value>``: change a setting of this channel (the settings role)."""
    message, transport, say = ctx.message, ctx.transport, ctx.say
    prefix = ctx.prefix
    key = message.channel_key
    rest = message.text.strip()[len(prefix) :].split(maxsplit=1)
    args = (rest[1] if len(rest) > 1 else "").split(maxsplit=1)
    try:
        if len(args) == 2 and args[0].lower() == "persona" and args[1][0] not in "\"'":
            words = [args[0], args[1]]  # an unquoted persona: the rest of the line
        else:
            words = split_args(" ".join(args))
    except SettingError as exc:
        await say(f"{prefix}set: {exc}")
        return
    if not words:
        await say(
            f"usage: {prefix}set <key> <value>; keys: "
            + "; ".join(f"{k}: {d}" for k, d in SETTING_KEYS.items())
        )
        return
    actor = await _settings_actor(ctx)
    if actor is None:
        return
    name = words[0].lower()
    try:
        value = parse_setting(
            name,
            words[1:],
            profiles=ctx.host.settings.profiles,
            stream_profiles=ctx.agent.stream_profiles,
        )
    except SettingError as exc:
        await say(f"{prefix}set{' ' if name in SETTING_KEYS else ': '}{exc}")
        return
    await ctx.host.settings.set(settings_scope(transport, key), name, value, actor=actor)
    log.info("channel %s: %s set %s", key, actor, name)
    eff = await ctx.host.settings_changed(key, transport)
    await say(f"{name} is now {_shown(eff, name)} in this channel")


async def unset(ctx: CommandContext) -> None:
    """``!unset <key>``: return a setting of this channel to its configured value."""
    message, transport, say = ctx.message, ctx.transport, ctx.say
    prefix = ctx.prefix
    key = message.channel_key
    try:
        words = split_args(message.text.strip()[len(prefix) :].split(maxsplit=1)[1])
    except IndexError:
        words = []
    except SettingError as exc:
        await say(f"{prefix}unset: {exc}")
        return
    if len(words) != 1 or words[0].lower() not in SETTING_KEYS:
        got = f"unknown setting {words[0]!r}; " if words else ""
        await say(f"{prefix}unset: {got}usage: {prefix}unset <key>; keys: "
                  + ", ".join(SETTING_KEYS))  # fmt: skip
        return
    name = words[0].lower()
    actor = await _settings_actor(ctx)
    if actor is None:
        return
    scope = settings_scope(transport, key)
    if name not in await ctx.host.settings.chat(scope):
        await say(f"{name} is not set in chat here; nothing to unset")
        return
    await ctx.host.settings.set(scope, name, None, actor=actor)
    log.info("channel %s: %s unset %s", key, actor, name)
    eff = await ctx.host.settings_changed(key, transport)
    await say(f"{name} is now {_shown(eff, name)} ({eff.sources.get(name, 'default')})")


def _shown(eff: Effective, key: str) -> str:
    """A setting's value in a reply: persona text quoted, lists space-separated."""
    value = eff.value(key)
    if key == "persona":
        if not value:
            return "none"
        return json.dumps(value if len(value) <= 200 else value[:199] + "…", ensure_ascii=False)
    if isinstance(value, tuple):
        return " ".join(value) if value else "none (no tools)"
    if isinstance(value, bool):
        return "on" if value else "off"
    return "none" if value is None else str(value)
