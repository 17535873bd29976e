"""Forms (issue 35): ``!answer`` answers a question of a multi-question ``ask_user``.

``!answer <n> <text>`` answers question ``n`` (from 1) of the form the turn
waits for (``-`` skips an optional one); a line without the command answers
the first question still open.  ``!answer #<id> {json}`` sends a whole form at
once (field id -> text): what a transport's native form (Slack's Submit
button) sends for the person who pressed it.  Who may answer is the rule of
the question (``answer_from``), on the speaker's verified identity.
"""

from __future__ import annotations

import json

from agentik.core.errors import PromptRefused
from agentik.core.questions import FormError

from .base import CommandContext

__all__ = ["answer"]


async def answer(ctx: CommandContext) -> None:
    """``!answer <n> <text>`` / ``!answer #<form> {json}``."""
    p = ctx.prefix
    usage = f"{p}answer <n> <text> (question n of the form waiting here)"
    if not ctx.decision.answer:
        return  # a speaker the bot does not answer cannot answer its questions either
    ch = ctx.host.open_channel(ctx.key)
    body = ctx.message.text.strip()[len(p) :].split(maxsplit=1)
    rest = body[1].strip() if len(body) > 1 else ""
    if ch is None or not rest:
        await ctx.say(usage if ch is not None else "no question waits for an answer here")
        return
    who = ctx.message.author_name or ctx.message.author_id
    conv = ch.conversation
    try:
        if rest.startswith("#"):
            ref, _, raw = rest[1:].partition(" ")
            if not ref.isdigit():
                await ctx.say(usage)
                return
            try:
                answers = json.loads(raw)
            except ValueError:
                await ctx.say(f"{p}answer #{ref} takes the answers as a JSON object")
                return
            if not isinstance(answers, dict):
                await ctx.say(f"{p}answer #{ref} takes the answers as a JSON object")
                return
            done = await conv.answer_form(
                answers, question_id=int(ref), author=who, author_id=ctx.author_id
            )
        else:
            number, _, text = rest.partition(" ")
            if not number.isdigit() or not text.strip():
                await ctx.say(usage)
                return
            done = await conv.answer_form(
                {"": text}, author=who, author_id=ctx.author_id, field=int(number)
            )
    except (FormError, PromptRefused) as exc:
        await ctx.say(str(exc))  # nothing of this answer was kept
        return
    if done is None:
        await ctx.say("no form waits for your answer here")
    # Done: question_progress (what is left) or the turn goes on.
