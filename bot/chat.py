"""Who speaks and how short lines read: helpers the bridge, the renderer and
the chat commands (:mod:`agentik.bot.commands`) share.

A speaker is named by an identity key qualified by transport instance
(:func:`author_id`, ``libera:alice``), or, unverified, by :func:`speaker_key`.
A failure is told to a channel as one short line with a reference
(:func:`error_line`); its details go to the log only.
"""

from __future__ import annotations

import json
import logging
import secrets

from agentik.transports.base import IncomingMessage, Transport

__all__ = [
    "article",
    "author_id",
    "error_line",
    "is_fence",
    "mask_id",
    "short_args",
    "speaker_key",
    "wait_text",
]

# Error lines keep the bridge's logger: operators' log filters name it.
log = logging.getLogger("agentik.bot.bridge")


def author_id(transport: Transport, message: IncomingMessage) -> str | None:
    """The speaker's identity qualified by transport instance: ``libera:alice``.

    ``None`` for a speaker the transport could not verify: an unverified name
    keys no user-scoped data (their memory tools say so).
    """
    if not message.verified or not message.author_id:
        return None
    return f"{transport.name}:{message.author_id}"


def mask_id(transport: Transport, message: IncomingMessage, role: str) -> str | None:
    """An unverified IRC speaker given a role by a configured ``mask:`` pattern (the
    one way to name admins on a network without services) decides as
    ``<instance>:mask:<nick!user@host>``: the operator vouched for that mask.  Any
    other unverified speaker stays ``None`` (refused)."""
    mask = (message.meta or {}).get("hostmask")
    if not mask or role in ("user", "ignored"):
        return None
    return f"{transport.name}:mask:{mask}"


def speaker_key(transport: Transport, message: IncomingMessage) -> str:
    """Who spoke, as a key: the qualified identity, or for an unverified speaker
    ``<instance>:~<hostmask or name>`` (never equal to a verified one)."""
    found = author_id(transport, message)
    if found is not None:
        return found
    shown = (message.meta or {}).get("hostmask") or message.author_name or message.author_id
    return f"{transport.name}:~{shown}"


def wait_text(seconds: float) -> str:
    """``10 min``, ``45 s``: how long until something expires."""
    seconds = max(0.0, seconds)
    if seconds >= 90:
        return f"{round(seconds / 60)} min"
    return f"{round(seconds)} s"


def article(role: str) -> str:
    """``an admin``, ``a user``, ``a deployer`` — who may decide, in a sentence."""
    if role == "user":
        return "anyone here"
    return f"{'an' if role[:1].lower() in 'aeiou' else 'a'} {role}"


def short_args(arguments: str, limit: int = 80) -> str:
    try:
        parsed = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        text = arguments
    else:
        if isinstance(parsed, dict):
            text = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in parsed.items())
        else:
            text = json.dumps(parsed, ensure_ascii=False)
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def is_fence(line: str) -> bool:
    """A Markdown code fence line (```` ``` ```` or ```` ```python ````)."""
    return line.strip().startswith("```")


#: What a channel is told of a failure, by error type (the details go to the log).
_PUBLIC_ERRORS: dict[str, str] = {
    "LLMConnectionError": "the model is unavailable right now",
    "LLMTimeout": "the model did not answer in time",
    "ContextTooLong": (
        "this conversation no longer fits the model's context; try {p}compact or {p}new"
    ),
    "LLMResponseError": "the model's answer could not be used",
    "LLMError": "the model failed",
    "StoreError": "the conversation could not be saved",
    "MigrationError": "the conversation could not be saved",
    "ClosedError": "the bot is shutting down",
    "internal": "internal error",
}


def error_line(
    error_type: str,
    detail: str,
    *,
    where: str,
    prefix: str = "!",
    retryable: bool = False,
    run_id: str | None = None,
) -> str:
    """The one short line a channel gets for a failure; logs ``detail`` with its reference.

    The line never carries the failure's own text (an endpoint's URL, a
    backend's message, a path): it says what kind of thing failed and gives
    a reference, which the ERROR log line with the full ``detail`` repeats,
    so an operator can find it.
    """
    ref = secrets.token_hex(3)
    log.error(
        "error ref %s in %s%s: %s: %s",
        ref,
        where,
        f" (run {run_id})" if run_id else "",
        error_type or "error",
        detail,
    )
    if error_type == "LLMStatusError":
        # 429 and 5xx: try again later; other statuses: the request was refused.
        what = "the model is " + ("unavailable right now" if retryable else "refusing the request")
    else:
        what = _PUBLIC_ERRORS.get(error_type, "something went wrong").format(p=prefix)
    return f"error: {what} (ref {ref})"
