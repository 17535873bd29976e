"""Passthrough tools run directly (issue 20): ``!tool``."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any

from agentik.core.errors import ToolError
from agentik.core.messages import ToolCall
from agentik.core.tools.base import ToolContext
from agentik.core.tools.passthrough import PassthroughTool

from ..chansettings import SettingError, split_args
from .base import CommandContext

__all__ = ["tool"]

log = logging.getLogger(__name__)


async def tool(ctx: CommandContext) -> None:
    """``!tool [<name> [key=value …]]``: run a passthrough tool at once, no model.

    Only passthrough tools (``[[passthrough]]``) run this way, and only where
    the model could call them: the channel's tools and the speaker's rights
    allow both the tool and its target, no approval rule covers either, and
    no plugin's ``before_tool_call`` blocks it.  The result is said in the
    channel; it is not part of the conversation.
    """
    message, transport, opts = ctx.message, ctx.transport, ctx.options
    decision, say, p = ctx.decision, ctx.say, ctx.prefix
    key = message.channel_key
    ch = await ctx.host.channel(key, transport, opts)
    conv = ch.conversation
    policy = ch.settings.policy or ctx.agent.policy  # this channel's turns' tools

    def usable(t: PassthroughTool) -> bool:
        return all(policy.allows(n) and decision.may_use_tool(n) for n in (t.name, t.spec.tool))

    tools = {t.name: t for t in ctx.agent.tools if isinstance(t, PassthroughTool) and usable(t)}
    raw = message.text.strip()[len(p) :]
    head = raw.split(None, 2)
    try:
        if len(head) == 3 and head[2].startswith("{"):
            words = [head[1], head[2]]  # a JSON object, quotes and all
        else:
            words = split_args(raw)[1:]
    except SettingError as exc:
        await say(f"{p}tool: {exc}")
        return
    if not words:
        listed = "; ".join(f"{n} — {t.description}" if t.description else n
                           for n, t in sorted(tools.items()))  # fmt: skip
        await say(f"tools: {listed}" if listed else "no passthrough tools here")
        return
    name, rest = words[0], words[1:]
    tool = tools.get(name)
    if tool is None:
        await say(f"no passthrough tool {name[:64]!r} here; {p}tool lists them")
        return
    try:
        arguments = _tool_arguments(rest)
    except ValueError as exc:
        await say(f"{p}tool {name}: {exc}")
        return
    for n in (tool.name, tool.spec.tool):
        if ctx.agent.approvals.rule_for(n, key) is not None:
            await say(f"{name} needs a person's approval: ask me for it in a message instead")
            return
    call = ToolCall(id=f"cmd_{uuid.uuid4().hex[:12]}", name=name,
                    arguments=json.dumps(arguments, ensure_ascii=False))  # fmt: skip
    call, block = await ctx.agent.hooks.before_tool_call(conv, call.id, call)
    if block is not None:
        await say(f"{name}: blocked: {block.reason}")
        return
    try:
        arguments = json.loads(call.arguments)
    except ValueError:
        await say(f"{name}: a plugin gave arguments that are not JSON")
        return
    context = ToolContext(
        conversation_id=conv.id, run_id=call.id, call_id=call.id,
        author=message.author_name, channel=key, author_id=ctx.author_id,
    )  # fmt: skip
    try:
        async with asyncio.timeout(policy.tool_timeout):
            result = await tool.call(arguments, context)
    except ToolError as exc:
        await say(f"⚙ {name} failed: {exc}")
        return
    except TimeoutError:
        await say(f"⚙ {name} failed: no result within {policy.tool_timeout:g}s")
        return
    except Exception:
        ref = uuid.uuid4().hex[:8]
        log.exception("!tool %s failed (ref %s)", name, ref)
        await say(f"⚙ {name} failed (internal error, ref {ref})")
        return
    text = result if isinstance(result, str) else result.text
    failed = not isinstance(result, str) and result.is_error
    await say(f"⚙ {name} failed: {text}" if failed else text or "(no result)")


def _tool_arguments(words: list[str]) -> dict[str, Any]:
    """``!tool`` arguments: one JSON object, or ``key=value`` words (a value that
    reads as JSON — a number, true, a list — is that; anything else is text)."""
    if len(words) == 1 and words[0].lstrip().startswith("{"):
        try:
            value = json.loads(words[0])
        except ValueError:
            raise ValueError("the arguments are not a JSON object") from None
        if not isinstance(value, dict):
            raise ValueError("the arguments are not a JSON object")
        return value
    out: dict[str, Any] = {}
    for word in words:
        k, eq, v = word.partition("=")
        if not eq or not k:
            raise ValueError(f"write key=value, not {word[:40]!r}")
        try:
            out[k] = json.loads(v)
        except ValueError:
            out[k] = v
    return out
