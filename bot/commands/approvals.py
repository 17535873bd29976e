"""Approvals (issue 19): ``!approve``, ``!deny`` and ``!approvals``."""

from __future__ import annotations

import time
from typing import Literal

from agentik.core.approvals import ApprovalError

from ..chat import mask_id, short_args, wait_text
from .base import CommandContext

__all__ = ["approvals", "decide"]


async def decide(ctx: CommandContext) -> None:
    """``!approve ID [reason]`` / ``!deny ID [reason]``: decide a waiting tool call."""
    message, transport, opts, say = ctx.message, ctx.transport, ctx.options, ctx.say
    decision: Literal["approve", "deny"] = "approve" if ctx.name == "approve" else "deny"
    key, p = message.channel_key, opts.command_prefix
    words = message.text.strip()[len(p) :].split(maxsplit=2)
    if len(words) < 2:
        await say(f"which one? {p}{decision} ID [reason] (see {p}approvals)")
        return
    approvals = ctx.agent.approvals
    role = ctx.host.role_for(transport.name, message, key)
    try:
        found = await approvals.find(words[1], scope=key)
        approver_id = ctx.author_id
        if approver_id is None and (approver_id := mask_id(transport, message, role)):
            # An unverified asker has no id to compare: compare the speaker.
            if (
                decision == "approve" and not found.asker_id and not found.self_approve
                and found.asker == message.author_name
            ):  # fmt: skip
                raise ApprovalError(
                    "self", f"approval {found.id}: you asked for this call; someone else"
                    " must approve it",
                )  # fmt: skip
        await approvals.decide(
            found,
            decision,
            approver=message.author_name or message.author_id,
            approver_id=approver_id,
            role=role,
            reason=words[2] if len(words) > 2 else None,
        )
    except ApprovalError as exc:
        await say(str(exc))
    # Done: the approval_resolved event says so in the channel.


async def approvals(ctx: CommandContext) -> None:
    """``!approvals``: the tool calls waiting for approval here."""
    key, opts, say = ctx.key, ctx.options, ctx.say
    pending = await ctx.agent.approvals.pending(key)
    if not pending:
        await say("no tool call is waiting for approval here")
        return
    now = time.time()
    items = [
        f"{a.id}: {a.tool}({short_args(a.arguments, 60)}) asked by {a.asker or 'someone'},"
        f" {a.approvers}s decide, expires in {wait_text(a.expires_at - now)}"
        for a in pending
    ]
    p = opts.command_prefix
    await say(f"waiting for approval ({p}approve ID / {p}deny ID): " + "; ".join(items))
