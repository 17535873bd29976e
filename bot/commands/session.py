"""The channel's conversation: ``!new``, ``!stop``, ``!more``, ``!status``,
``!compact``, ``!budget`` and ``!help``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentik.core.access import may_stop
from agentik.core.errors import AgentikError

from ..channel import OpenChannel
from ..chansettings import describe
from ..chat import error_line, is_fence
from .base import CommandContext

if TYPE_CHECKING:
    from agentik.core.cluster.conversations import TurnQueue

__all__ = ["budget", "compact", "help_", "more", "new", "status", "stop"]


def _someone_elses(ctx: CommandContext, ch: OpenChannel | None) -> bool:
    """The answer being written in ``ch`` was asked for by someone else, and the
    speaker may not stop it (``stop-others``: admins, or a rule naming it)."""
    running = ch.conversation.running_run_id if ch is not None else None
    asker = ch.run_asker.get(running) if ch is not None and running else None
    if running and asker is None:
        # A linked channel's answer may have been asked in another channel of the link.
        asker = ctx.host.links.asker(ctx.key, running)
    return not may_stop(ctx.decision, ctx.speaker, asker)


async def stop(ctx: CommandContext) -> None:
    """``!stop``; an answer someone else asked for needs ``stop-others``."""
    if _someone_elses(ctx, ctx.host.open_channel(ctx.key)):
        await ctx.say("only the asker (or an admin) may stop this answer")
        return
    if await ctx.host.interrupt(ctx.key):
        return
    elsewhere = await _running_elsewhere(ctx)
    if elsewhere is None:
        await ctx.say("nothing to stop")
        return
    queue, conversation_id, run_id, asker = elsewhere
    if not may_stop(ctx.decision, ctx.speaker, asker):
        await ctx.say("only the asker (or an admin) may stop this answer")
        return
    await queue.stop_elsewhere(conversation_id, run_id)


async def _running_elsewhere(
    ctx: CommandContext,
) -> tuple[TurnQueue, str, str, str | None] | None:
    """The turn of the channel's conversation another worker runs (several workers:
    Slack's HTTP mode behind a load balancer brings a ``!stop`` to any of them), as
    the stored events say: the turn queue, the conversation, the run and its asker
    (the verified identity that sent the message it answers); ``None``: none runs."""
    agent = ctx.host.agent
    queue = agent.turn_queue
    if queue is None:
        return None
    conversation_id = await agent.store.get_binding(ctx.key)
    if conversation_id is None:
        return None
    run_id = await queue.running_elsewhere(conversation_id)
    if run_id is None:
        return None
    asker: str | None = None
    for m in reversed(await agent.store.messages(conversation_id, kinds=["user"], limit=50)):
        data = m.data if isinstance(m.data, dict) else {}
        if m.run_id == run_id and data.get("author_id"):
            asker = str(data["author_id"])
            break
    return queue, conversation_id, run_id, asker


async def new(ctx: CommandContext) -> None:
    """``!new``: start the channel over; nothing queued is lost.

    The answer being written is stopped, with the same rights as ``!stop``:
    when someone else asked for it (or it waits on an approval they asked
    for), only a speaker with ``stop-others`` (admins) may start over — the
    others are told to wait for it or ask its asker.  Messages queued
    behind it (not started yet) move to the new conversation, in order,
    with their authors, and are answered there to whoever asked.
    """
    if _someone_elses(ctx, ctx.host.open_channel(ctx.key)):
        await ctx.say(
            "someone else's answer is being written: only its asker (or an admin)"
            f" may start over now; try {ctx.prefix}new when it is done"
        )
        return
    old, count = await ctx.host.start_over(ctx.key, ctx.transport)
    kept = f" (the previous one is kept as {old.conversation.id})" if old else ""
    carried = f"; {count} queued message{'s' if count != 1 else ''} moved to it" if count else ""
    await ctx.say(f"started a new conversation{kept}{carried}")


async def more(ctx: CommandContext) -> None:
    """``!more``: the next page of a capped answer (or of ``!memory``)."""
    key, transport = ctx.key, ctx.transport
    ch = ctx.host.open_channel(key)
    if ch is None or not ch.more:
        await ctx.say("nothing more")
        return
    cap = ch.options.max_answer_lines or len(ch.more)
    page = ch.more[:cap]
    del ch.more[:cap]
    lines_transport = transport.caps.streaming == "lines"
    if ch.more_in_code and lines_transport:
        # The page continues a code block: a line transport formats line by
        # line, so it is told (the fence line itself shows nothing).
        page.insert(0, "```")
    for line in page:
        await ctx.host.send(transport, key, line, "answer", ch.reply_to)
        if is_fence(line):
            ch.more_in_code = not ch.more_in_code
    if lines_transport:
        # Each page is an answer of its own: the transport's formatting state
        # (an open code block) and a batch it collects (draft/multiline) end here.
        ch.more_in_code = ch.more_in_code and bool(ch.more)
        await ctx.host.send(transport, key, "", "end", ch.reply_to)
    if ch.more:
        await ctx.say(f"… {len(ch.more)} more lines: {ctx.prefix}more")


async def compact(ctx: CommandContext) -> None:
    """``!compact``: summarise the older part of the conversation now."""
    ch = await ctx.host.channel(ctx.key, ctx.transport, ctx.options)
    try:
        event = await ch.conversation.compact_now()
    except AgentikError as exc:
        line = error_line(
            type(exc).__name__, str(exc), where=ctx.key, prefix=ctx.prefix,
            retryable=getattr(exc, "retryable", False),
        )  # fmt: skip
        await ctx.say(f"could not compact: {line.removeprefix('error: ')}")
        return
    if event is None:
        await ctx.say("nothing to compact yet: the conversation is short")
        return
    how = "dropped (summarising failed)" if event.fallback else "summarised"
    await ctx.say(
        f"compacted: {event.messages} older messages {how}; context about "
        f"{event.tokens_before} → {event.tokens_after} tokens"
    )


async def status(ctx: CommandContext) -> None:
    """``!status``: the model, the conversation and what it does now, then the
    channel's settings; in a shared room the first line only (``!status
    settings`` shows the settings)."""
    ch = await ctx.host.channel(ctx.key, ctx.transport, ctx.options)
    conv = ch.conversation
    count = await conv.count_messages()
    # idle | running | streaming | executing tools (names) | awaiting human, the
    # run, its requests and tokens so far, the queue, the checklist (todo 2/5).
    state = conv.status(todo=await conv.todo()).line()
    # The model of this channel's turns (its settings'; another front end's may differ).
    chosen = ch.settings.llm_profile
    llm = ctx.agent.llm_for(chosen)
    profile = f" (profile {chosen})" if chosen else ""
    settings = describe(await ctx.host.effective(ctx.key, ctx.transport))
    head = f"model {llm.model or llm.name}{profile} · conversation {conv.id} ({count} messages)"
    wanted = [a.lower() for a in ctx.args]
    if wanted[:1] in (["settings"], ["all"]):
        await ctx.say(settings)
    elif ctx.shared:
        await ctx.say(f"{head} · {state}")
    else:
        await ctx.say(f"{head} · {state}\n{settings}")


async def budget(ctx: CommandContext) -> None:
    """``!budget``: what is left of the speaker's and the channel's budgets."""
    budgets = ctx.host.budgets
    if budgets is None or not budgets.enabled:
        await ctx.say("no budgets are set: usage is unlimited")
        return
    await ctx.say(await budgets.report(ctx.host.subject(ctx.message, ctx.transport)))


async def help_(ctx: CommandContext) -> None:
    """``!help``: in a shared room one short line (the commands this speaker may
    use); ``!help <command>`` says what one does; in private, every command
    with what it does.  Generated from the registry: plugins' commands too."""
    p, commands = ctx.prefix, ctx.host.commands
    if ctx.args:
        name = ctx.args[0].removeprefix(p).lower()
        found = commands.get(name)
        await ctx.say(
            f"{p}{name} — {found.help}" if found else f"no command {p}{name[:32]}; try {p}help"
        )
        return
    if not ctx.shared:
        await ctx.say("commands: " + "; ".join(f"{p}{c.name} — {c.help}" for c in commands))
        return
    decision, access = ctx.decision, ctx.access
    names = [
        f"{p}{c.name}"
        for c in commands
        if decision.may_command(c.name)
        and (
            (listed := c.listed_for or c.needs_role) is None
            or (decision.admin if listed == "admin" else access.at_least(decision.role, listed))
        )
    ]
    await ctx.say(
        f"commands: {' '.join(names)} — {p}help <command> says what one does;"
        f" {p}help in a private message lists them all"
    )
