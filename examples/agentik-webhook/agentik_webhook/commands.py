"""An example chat command a plugin brings along: ``!webhook`` (admins).

A command is an :class:`agentik.bot.commands.Command`: a name (one lowercase
word, unique across agentik and every plugin), a help line (``!help`` lists
it), an async handler, and optionally the lowest role that may run it.  The
handler gets a :class:`~agentik.bot.commands.CommandContext`: the message,
the channel, the speaker's access decision, ``ctx.say`` to answer, and the
agent.  It never imports the bridge.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from agentik.bot.commands import Command, CommandContext
from agentik.core import ToolError

from .tools import webhook_time

__all__ = ["webhook_command"]


async def _webhook(ctx: CommandContext) -> None:
    """``!webhook [utc_offset_minutes]``: this plugin's version, the transport the
    command came through, and the time as the model's ``webhook_time`` tool
    would tell it."""
    try:
        offset = int(ctx.args[0]) if ctx.args else 0
    except ValueError:
        await ctx.say(f"usage: {ctx.prefix}webhook [utc_offset_minutes]")
        return
    try:
        ours = version("agentik-webhook")
    except PackageNotFoundError:  # run from a source tree
        ours = "(not installed)"
    try:
        text = await webhook_time.fn(utc_offset_minutes=offset)
    except ToolError as exc:
        await ctx.say(f"{ctx.prefix}webhook: {exc}")
        return
    await ctx.say(
        f"agentik-webhook {ours}: here through {ctx.transport.name} ({ctx.transport.type});"
        f" webhook_time says {text}"
    )


#: Registered by :func:`agentik_webhook.plugin.register_commands`.
webhook_command = Command(
    name="webhook",
    help="show the webhook plugin's version and its clock: webhook [utc_offset_minutes] (admins)",
    handler=_webhook,
    needs_role="admin",
)
