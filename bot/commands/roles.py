"""Roles given in chat (issue 19): ``!role``, ``!ignore``, ``!unignore``, ``!roles``
(admins; owners are set in the configuration only)."""

from __future__ import annotations

from .base import CommandContext

__all__ = ["grant", "roles"]


def _target(ctx: CommandContext) -> tuple[str, str]:
    """The identity key a command's first argument names and its role; ValueError."""
    args, message, transport = ctx.args, ctx.message, ctx.transport
    if not args:
        raise ValueError("name someone")
    target = ctx.access.resolve(
        args[0], transport.name, message.meta,
        lambda name: transport.account_of(message.channel_key, name),
    )  # fmt: skip
    return target, ctx.access.role_of_key(target)


async def _change_role(ctx: CommandContext, target: str, current: str, role: str | None) -> str:
    """Check and apply a change; the line to say."""
    access, decision = ctx.access, ctx.decision
    if current == "owner":
        return f"{target} is an owner (owners are set in the configuration)"
    if access.at_least(current, "admin") and decision.role != "owner":
        return f"{target} is {current}: only an owner changes that"
    if role == "owner":
        return "owners are set in the configuration only"
    if role is not None and role not in access.roles:
        return f"unknown role {role!r} (roles: {', '.join(access.roles)})"
    if ":mask:" in target and role not in (None, "ignored", "user"):
        return "a hostmask can only be ignored; roles go to accounts"
    old = await access.grant(target, role, by=ctx.actor, channel=ctx.key)
    now = access.role_of_key(target)
    was = old or current
    return f"{target}: {was} → {now}"


async def grant(ctx: CommandContext) -> None:
    """``!role <who> [<role>]`` (shows or sets a role), ``!ignore <who>``,
    ``!unignore <who>`` (only a chat grant of ``ignored`` is undone)."""
    name, args, p = ctx.name, ctx.args, ctx.prefix
    try:
        target, current = _target(ctx)
    except ValueError as exc:
        await ctx.say(f"{exc}; usage: {p}{name} <who>{' [<role>]' if name == 'role' else ''}")
        return
    role: str | None = "ignored"
    if name == "role":
        if len(args) < 2:
            await ctx.say(f"{target} is {current}")
            return
        role = args[1]
    elif name == "unignore":
        given = ctx.access.grants.get(target)
        if given is None or given.role != "ignored":
            note = " (by the configuration: change it there)" if current == "ignored" else ""
            await ctx.say(f"{target} is not ignored in chat{note}")
            return
        role = None
    await ctx.say(await _change_role(ctx, target, current, role))


async def roles(ctx: CommandContext) -> None:
    """``!roles``: the roles given in chat, and how many the configuration sets."""
    access = ctx.access
    grants = sorted(access.grants.values(), key=lambda g: g.identity)
    configured = len(access.config_roles())
    given = ", ".join(f"{g.identity} {g.role}" for g in grants) or "none"
    await ctx.say(f"roles given in chat: {given}; {configured} set in the configuration")
