"""Model text made safe for Slack: mrkdwn for ``text``, Markdown for ``markdown_text``.

Slack reads ``<…>`` in message text as control sequences: ``<!channel>``,
``<!here>``, ``<!everyone>``, ``<!subteam^S1>`` and ``<@U1>`` notify people,
and ``<https://a|label>`` shows any label for any link.  Model text is not
trusted (anyone who talks to the bot, or any page a tool reads, can steer
it), so everything it writes is escaped the way Slack documents
(``&`` → ``&amp;``, ``<`` → ``&lt;``, ``>`` → ``&gt;``, in code too), and
the only ``<…>`` sequences we emit are links we build ourselves from
validated ``http``/``https`` URLs (:func:`safe_url`) with escaped labels,
and, only when the operator allows them (``allow_mentions = ["users"]``),
user mentions ``<@U…>``.  ``<!…>`` from the model never goes out.

:func:`markdown_to_mrkdwn` is for ``chat.postMessage``/``chat.update``
``text``; :func:`markdown_safe` for the ``markdown_text`` of Slack's native
streaming and of a short answer posted whole, which takes standard Markdown
(there ``&``/``<``/``>`` in prose are entity-escaped too, links get validated
URLs, and inside code spans a ``<`` that would open a Slack control sequence
gets an invisible U+2060 WORD JOINER after it, so code still reads as written).
"""

from __future__ import annotations

import re
from urllib.parse import quote, urlsplit

__all__ = [
    "clean",
    "escape",
    "incoming",
    "markdown_safe",
    "markdown_to_mrkdwn",
    "safe_url",
    "stream_cut",
]

_SURROGATE = re.compile("[\ud800-\udfff]")
_CODE = re.compile(r"(```.*?```|`[^`\n]*`)", re.S)
_LINK = re.compile(r"\[([^\[\]\n]+)\]\(\s*(https?://[^)\s]+)\s*\)", re.I)
_AUTOLINK = re.compile(r"<(https?://[^\s<>|]+)>", re.I)
_USER = re.compile(r"<@([UW][A-Z0-9]{2,30})(?:\|[^<>\n]*)?>")
_PLACEHOLDER = re.compile("\x00(\\d+)\x00")
#: Characters a URL keeps as they are; anything else is percent-encoded.
_URL_SAFE = "/:?#[]@!$&'()*+,;=%~-._"
#: A ``<`` in code that Slack could read as the start of a control sequence.
_CODE_OPENER = re.compile(r"<(?=[!@#]|[A-Za-z][A-Za-z0-9+.-]*:)")


def clean(text: str) -> str:
    """``text`` without NULs, and with lone surrogates (not UTF-8) as U+FFFD."""
    return _SURROGATE.sub("\ufffd", text.replace("\x00", ""))


#: A control sequence in message text as Slack sends it: ``<target>`` or ``<target|label>``.
_SEQUENCE = re.compile(r"<([^<>|]*)(?:\|([^<>]*))?>")
_SPECIAL = {"here", "channel", "everyone"}


def _sequence_text(m: re.Match[str]) -> str:
    target, label = m.group(1), m.group(2)
    if target.startswith("@"):
        return m.group(0)  # a user mention: the model may address people by it
    if target.startswith("#"):
        return f"#{label}" if label else m.group(0)
    if target.startswith("!"):
        name = target[1:]
        if name in _SPECIAL:
            return f"@{name}"
        if label:  # <!subteam^S1|@team>, <!date^…|fallback>
            return label
        return m.group(0)
    if label is None or label == target:
        return target
    if target.endswith(("/" + label, ":" + label)):
        return label  # a link Slack made from a typed URL or address: what was typed
    return f"[{label}]({target})"


def incoming(text: str) -> str:
    """A message's ``text`` as Slack sends it, back to what its author typed.

    Slack sends ``&``, ``<`` and ``>`` a person typed as ``&amp;``, ``&lt;``
    and ``&gt;``, and formats links, channels and broadcasts as ``<…>``
    sequences.  Links become their URL (``[label](url)`` when the label is
    not the URL itself), ``<#C1|general>`` ``#general``, ``<!here>``
    ``@here``; user mentions ``<@U1>`` stay as they are.  The entities are
    decoded last, so a ``<`` someone typed never starts a sequence.
    """
    text = _SEQUENCE.sub(_sequence_text, clean(text))
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def _entities(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def escape(text: str) -> str:
    """Plain text for mrkdwn: ``&``, ``<``, ``>`` as Slack's three entities."""
    return _entities(clean(text))


def safe_url(url: str) -> str | None:
    """``url`` fit to be a Slack link target, or ``None``.

    Only ``http``/``https`` URLs with a plain host; characters outside the
    URL alphabet (``<``, ``>``, ``|``, spaces, quotes, non-ASCII …) are
    percent-encoded, so the result can never end or extend the ``<…>``
    sequence it goes in.
    """
    url = clean(url).strip()
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    host = parts.hostname or ""
    if parts.scheme.lower() not in ("http", "https") or not host:
        return None
    if not re.fullmatch(r"[A-Za-z0-9.\-\[\]:]+", parts.netloc.rsplit("@", 1)[-1]):
        return None
    return quote(url, safe=_URL_SAFE)


def _link_mrkdwn(url: str, label: str | None) -> str | None:
    target = safe_url(url)
    if target is None:
        return None
    target = target.replace("&", "&amp;")
    if label is None or not label.strip():
        return f"<{target}>"
    return f"<{target}|{escape(label)}>"


def _prose_mrkdwn(text: str, user_mentions: bool) -> str:
    kept: list[str] = []

    def keep(piece: str) -> str:
        kept.append(piece)
        return f"\x00{len(kept) - 1}\x00"

    def link(m: re.Match[str]) -> str:
        built = _link_mrkdwn(m.group(2), m.group(1))
        return keep(built) if built is not None else m.group(0)

    def autolink(m: re.Match[str]) -> str:
        built = _link_mrkdwn(m.group(1), None)
        return keep(built) if built is not None else m.group(0)

    text = _LINK.sub(link, text)
    text = _AUTOLINK.sub(autolink, text)
    if user_mentions:
        text = _USER.sub(lambda m: keep(f"<@{m.group(1)}>"), text)
    text = _entities(text)
    text = re.sub(r"(?<![*\w])\*(?!\s)([^*\n]+?)(?<!\s)\*(?![*\w])", r"_\1_", text)
    text = re.sub(r"\*\*(?!\s)(.+?)(?<!\s)\*\*", r"*\1*", text)
    text = re.sub(r"^#{1,6}\s+(.+)$", r"*\1*", text, flags=re.M)
    text = re.sub(r"__(?!\s)(.+?)(?<!\s)__", r"*\1*", text)
    text = re.sub(r"~~(.+?)~~", r"~\1~", text)
    return _PLACEHOLDER.sub(lambda m: kept[int(m.group(1))], text)


def markdown_to_mrkdwn(text: str, *, user_mentions: bool = False) -> str:
    """The Markdown an LLM writes, as safe Slack mrkdwn (see the module docstring).

    Code spans and blocks keep their content (escaped, as Slack wants even
    there); a fenced block loses its language tag, which mrkdwn would show.
    """
    out = []
    for i, part in enumerate(_CODE.split(clean(text))):
        if i % 2:  # code
            out.append(escape(re.sub(r"```[\w+-]*\n", "```\n", part, count=1)))
        else:
            out.append(_prose_mrkdwn(part, user_mentions))
    return "".join(out)


def _prose_markdown(text: str, user_mentions: bool) -> str:
    kept: list[str] = []

    def keep(piece: str) -> str:
        kept.append(piece)
        return f"\x00{len(kept) - 1}\x00"

    def link(m: re.Match[str]) -> str:
        target = safe_url(m.group(2))
        if target is None:
            return m.group(0)
        return keep(f"[{escape(m.group(1))}]({target.replace('&', '&amp;')})")

    def autolink(m: re.Match[str]) -> str:
        target = safe_url(m.group(1))
        if target is None:
            return m.group(0)
        shown = escape(target)
        return keep(f"[{shown}]({target.replace('&', '&amp;')})")

    text = _LINK.sub(link, text)
    text = _AUTOLINK.sub(autolink, text)
    if user_mentions:
        text = _USER.sub(lambda m: keep(f"<@{m.group(1)}>"), text)
    return _PLACEHOLDER.sub(lambda m: kept[int(m.group(1))], _entities(text))


def markdown_safe(text: str, *, user_mentions: bool = False) -> str:
    """Model Markdown for a ``markdown_text`` field: still Markdown, but safe.

    Prose is entity-escaped and links rebuilt from validated URLs; code keeps
    its text, with a WORD JOINER after any ``<`` that could start a Slack
    control sequence.
    """
    out = []
    for i, part in enumerate(_CODE.split(clean(text))):
        if i % 2:
            out.append(_CODE_OPENER.sub("<\u2060", part))
        else:
            out.append(_prose_markdown(part, user_mentions))
    return "".join(out)


def stream_cut(text: str, *, hold: int = 2000) -> int:
    """How much of streamed ``text`` can be made safe and sent now.

    A link (``[label](url)``, ``<url>``) may still be arriving: the text from
    its opening bracket waits until it is complete (or ``hold`` characters
    long, or a line ends), so it is converted whole.
    """
    start = max(0, len(text) - hold)
    for m in re.finditer(r"[\[<]", text[start:]):
        i = start + m.start()
        rest = text[i:]
        if "\n" in rest:
            continue
        if rest[0] == "[":
            if not re.match(r"\[[^\[\]\n]*(\](\([^)\s]*)?)?$", rest):
                continue  # closed, or not a link after all
        elif re.search(r"[\s>]", rest):
            continue
        return i
    return len(text)
