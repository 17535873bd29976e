"""The built-in chat commands, registered as a plugin registers its own:
through ``register_commands``.  The order here is the order ``!help`` lists them.
"""

from __future__ import annotations

from collections.abc import Callable

from agentik.core.hookspecs import hookimpl

from . import (
    answer,
    approvals,
    checkpoints,
    links,
    memory,
    redact,
    roles,
    session,
    settings,
    tools,
)
from .base import Command

__all__ = ["BUILTIN", "register_commands"]

#: The built-in commands, in the order ``!help`` lists them.
BUILTIN: tuple[Command, ...] = (
    Command(
        name="new",
        help="start a fresh conversation in this channel (the old one stays in history)",
        handler=session.new,
    ),
    Command(name="stop", help="interrupt the answer being written", handler=session.stop),
    Command(name="more", help="show the next part of a long answer", handler=session.more),
    Command(
        name="status",
        help="show the model, the conversation and whether a turn is running",
        handler=session.status,
    ),
    Command(
        name="compact",
        help="summarise the older part of this conversation now, to free context",
        handler=session.compact,
    ),
    Command(
        name="budget",
        help="show what is left of your and this channel's budgets",
        handler=session.budget,
    ),
    # -- checkpoints (issue 35) --
    Command(
        name="checkpoint",
        help="keep a snapshot of this conversation as it is now: checkpoint [label]",
        handler=checkpoints.checkpoint,
    ),
    Command(
        name="checkpoints",
        help="list this conversation's checkpoints, newest first: checkpoints"
        " [conversation] (an earlier conversation of this channel, as new names it);"
        " checkpoints rm N deletes one (admins)",
        handler=checkpoints.checkpoints,
    ),
    Command(name="help", help="list these commands", handler=session.help_),
    Command(
        name="tool",
        help="run a passthrough tool directly, no model: tool <name> [key=value …]; tool"
        " alone lists them",
        handler=tools.tool,
    ),
    # Per-channel settings (issue 19): the settings role is checked by the command.
    Command(
        name="set",
        help="change a setting of this channel (admins): set <key> <value>; set alone"
        " lists the keys",
        handler=settings.set_,
        listed_for="admin",
    ),
    Command(
        name="unset",
        help="return a setting of this channel to its configured value (admins): unset <key>",
        handler=settings.unset,
        listed_for="admin",
    ),
    Command(
        name="role",
        help="show someone's role, or give one: role <who> [<role>] (admins)",
        handler=roles.grant,
        needs_role="admin",
    ),
    Command(
        name="ignore",
        help="make the bot ignore someone: ignore <who> (admins)",
        handler=roles.grant,
        needs_role="admin",
    ),
    Command(
        name="unignore",
        help="stop ignoring someone: unignore <who> (admins)",
        handler=roles.grant,
        needs_role="admin",
    ),
    Command(
        name="roles",
        help="list the roles given in chat (admins)",
        handler=roles.roles,
        needs_role="admin",
    ),
    # -- linked channels (issue 33) --
    Command(
        name="link",
        help=(
            "make channels one conversation: link <name> <channel>... [key=value]..."
            ' (key="a value" with blanks) (admins)'
        ),
        handler=links.link,
        needs_role="admin",
    ),
    Command(
        name="unlink",
        help="undo a link: unlink <name> (admins)",
        handler=links.unlink,
        needs_role="admin",
    ),
    Command(
        name="links",
        help="list the links (admins)",
        handler=links.links,
        needs_role="admin",
    ),
    # -- approvals (issue 19) --
    Command(
        name="approve",
        help="approve a tool call waiting for approval: approve ID [reason]",
        handler=approvals.decide,
    ),
    Command(
        name="deny",
        help="refuse a tool call waiting for approval: deny ID [reason]",
        handler=approvals.decide,
    ),
    Command(
        name="approvals",
        help="list the tool calls waiting for approval here",
        handler=approvals.approvals,
    ),
    # -- forms (issue 35) --
    Command(
        name="answer",
        help="answer question n of the form the bot asked: answer <n> <text> (- skips an"
        " optional one)",
        handler=answer.answer,
    ),
    # -- memory (issue 22) --
    Command(
        name="memory",
        help="list the memory notes visible here, most recent first (with their ids)",
        handler=memory.memory,
    ),
    Command(
        name="forget",
        help="delete memory note N: forget N (global and others' notes: admins)",
        handler=memory.forget,
    ),
    # -- redaction (issue 22) --
    Command(
        name="redact",
        help="remove a message's text from the bot's records: redact [last] (your last"
        " message), redact list, redact N [reason] (yours, or any as admin)",
        handler=redact.redact,
    ),
)


@hookimpl
def register_commands(register: Callable[[Command], None]) -> None:
    """The built-in commands, registered as a plugin registers its own."""
    for command in BUILTIN:
        register(command)
