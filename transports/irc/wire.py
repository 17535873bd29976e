"""The IRC wire format: lines in and out, CTCP, formatting codes, line lengths.

Pure functions over strings (standard library only, no I/O), so everything
the IRC transport says and hears is testable without a server:

* :func:`parse_line` turns one received line into a :class:`Line`
  (RFC 1459 framing plus IRCv3 message tags).  It never raises: a server, a
  bouncer or a fuzzer may send anything, and a bad line is ``None``.
* :func:`format_line` builds one line to send.  CR, LF and NUL never reach
  the wire, so no parameter can smuggle in a second command.
* :func:`ctcp_parse` and :func:`ctcp` read and write the ``\\x01`` envelope
  (``ACTION``, ``VERSION``, ``PING``...).
* :func:`strip_formatting` removes mIRC formatting codes;
  :func:`markdown_to_irc` turns the Markdown an LLM writes into them.
* :func:`casefold` compares nicks, channels and accounts as the server
  does (ISUPPORT ``CASEMAPPING``); :func:`valid_target` says whether a nick
  or channel from the network can be written back as a command's target;
  :func:`clean_outgoing` strips the control characters that must never
  leave as message text (``\\x01`` would make a CTCP).
* :func:`payload_budget` says how many bytes of text fit in one ``PRIVMSG``
  once the server relays it with our ``:nick!user@host`` prefix, and
  :func:`split_message` cuts a long answer into lines of that size, at
  words, never inside a character, carrying bold/italic/monospace runs over
  the cuts.

Limits: a line is at most 512 bytes including its CRLF, plus up to 8191
bytes of message tags.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "KNOWN_MAPPINGS",
    "MAX_LINE_BYTES",
    "MAX_TAGS_BYTES",
    "Line",
    "casefold",
    "clean_outgoing",
    "ctcp",
    "ctcp_parse",
    "format_line",
    "markdown_to_irc",
    "parse_line",
    "payload_budget",
    "split_message",
    "strip_formatting",
    "valid_target",
]

#: Longest line without tags, CRLF included (RFC 1459).
MAX_LINE_BYTES = 512
#: Longest tag section, ``@`` and the space after it included (IRCv3).
MAX_TAGS_BYTES = 8191

_MAX_RAW = MAX_TAGS_BYTES + MAX_LINE_BYTES
#: Estimates used by :func:`payload_budget` before the server tells us who we are.
_USER_GUESS = 10  # USERLEN, the ident "~" included
_HOST_GUESS = 63  # HOSTLEN


# -- parsing --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Line:
    """One IRC protocol line, parsed.

    ``tags`` are the IRCv3 message tags with their values unescaped (a tag
    without a value maps to ``""``); ``source`` is the prefix without its
    ``:`` (``nick!user@host`` or a server name), ``None`` when absent;
    ``command`` is upper-cased (numerics stay three digits, ``"001"``);
    ``params`` are the middle parameters then the trailing one, without its
    ``:``.
    """

    tags: dict[str, str]
    source: str | None
    command: str
    params: tuple[str, ...]

    @property
    def nick(self) -> str | None:
        """The nick of the source (its part before ``!``); ``None`` without a source."""
        return self.hostmask[0]

    @property
    def hostmask(self) -> tuple[str | None, str | None, str | None]:
        """``(nick, user, host)`` of the source; the parts it lacks are ``None``.

        A server name comes back as ``("irc.example", None, None)``.
        """
        if self.source is None:
            return (None, None, None)
        nick, bang, rest = self.source.partition("!")
        if bang:
            user, at, host = rest.partition("@")
            return (nick, user, host if at else None)
        nick, at, host = self.source.partition("@")
        return (nick, None, host if at else None)


_TAG_UNESCAPES = {":": ";", "s": " ", "\\": "\\", "r": "\r", "n": "\n"}
_TAG_UNESCAPE_RE = re.compile(r"\\(.?)", re.DOTALL)


def _parse_tags(raw: str) -> dict[str, str]:
    tags: dict[str, str] = {}
    for item in raw.split(";"):
        key, _, value = item.partition("=")
        if key:
            # An unknown escape stands for the character itself; a lone
            # trailing backslash is dropped (IRCv3 message-tags).
            tags[key] = _TAG_UNESCAPE_RE.sub(lambda m: _TAG_UNESCAPES.get(m[1], m[1]), value)
    return tags


def _is_command(token: str) -> bool:
    return bool(token) and token.isascii() and token.isalnum()


def parse_line(raw: bytes | str) -> Line | None:
    """Parse one line received from a server; ``None`` when it is not a command.

    Never raises.  Bytes are decoded as UTF-8 with invalid sequences
    replaced; the line ends at its first CR or LF; NUL characters are
    dropped (``\\x01`` is kept, CTCP needs it); a line longer than
    8191 + 512 bytes is truncated.  Runs of spaces between parameters, a
    missing trailing parameter and tags without values are all accepted.
    Empty and blank lines, and lines without a command, give ``None``.
    """
    if isinstance(raw, str):
        data = raw.encode("utf-8", "surrogatepass")
    elif isinstance(raw, bytes | bytearray | memoryview):
        data = bytes(raw)
    else:
        return None
    for end in (data.find(b"\r"), data.find(b"\n")):
        if end >= 0:
            data = data[:end]
    if len(data) > _MAX_RAW:
        cut = _MAX_RAW
        while cut > _MAX_RAW - 3 and data[cut] & 0xC0 == 0x80:
            cut -= 1  # back to a character boundary
        data = data[:cut]
    text = data.decode("utf-8", "replace").replace("\x00", "")
    if not text.strip():
        return None

    rest = text.lstrip(" ")
    tags: dict[str, str] = {}
    if rest.startswith("@"):
        raw_tags, _, rest = rest[1:].partition(" ")
        tags = _parse_tags(raw_tags)
        rest = rest.lstrip(" ")
    source = None
    if rest.startswith(":"):
        source, _, rest = rest[1:].partition(" ")
        source = source or None
        rest = rest.lstrip(" ")
    command, _, rest = rest.partition(" ")
    if not _is_command(command):
        return None
    params: list[str] = []
    while rest := rest.lstrip(" "):
        if rest.startswith(":"):
            params.append(rest[1:])
            break
        param, _, rest = rest.partition(" ")
        params.append(param)
    return Line(tags, source, command.upper(), tuple(params))


# -- building -------------------------------------------------------------------------------

_TAG_KEY_RE = re.compile(r"\+?(?:[A-Za-z0-9.-]+/)?[A-Za-z0-9-]+")
_TAG_ESCAPES = str.maketrans(
    {"\\": "\\\\", ";": "\\:", " ": "\\s", "\r": "\\r", "\n": "\\n", "\x00": ""}
)
_UNSAFE = str.maketrans({"\r": " ", "\n": " ", "\x00": " "})


def _format_tag(key: str, value: str) -> str:
    if not _TAG_KEY_RE.fullmatch(key):
        raise ValueError(f"invalid message tag name {key!r}")
    value = value.translate(_TAG_ESCAPES)
    return f"{key}={value}" if value else key


def format_line(command: str, *params: str, tags: dict[str, str] | None = None) -> str:
    """Build one line to send, without its CRLF.

    CR, LF and NUL in any parameter become spaces.  Only the last parameter
    may be empty, contain spaces or start with ``:`` (it is then sent as the
    trailing ``:...``); a middle parameter that does raises
    :class:`ValueError`, as does a command that is not letters or digits.
    Tag values are escaped per IRCv3; a tag with an empty value is sent as
    its bare name.
    """
    if not _is_command(command):
        raise ValueError(f"invalid IRC command {command!r}")
    parts = []
    if tags:
        parts.append("@" + ";".join(_format_tag(k, v) for k, v in tags.items()))
    parts.append(command)
    last = len(params) - 1
    for i, param in enumerate(params):
        if not isinstance(param, str):
            raise TypeError(f"IRC parameters are str, not {type(param).__name__}")
        param = param.translate(_UNSAFE)
        if not param or " " in param or param.startswith(":"):
            if i != last:
                raise ValueError(
                    f"middle parameter {i} of {command} may not be empty, contain a space "
                    f"or start with ':': {param!r}"
                )
            param = ":" + param
        parts.append(param)
    return " ".join(parts)


# -- CTCP -----------------------------------------------------------------------------------

_CTCP_UNSAFE = str.maketrans(dict.fromkeys("\x01\r\n\x00"))


def ctcp_parse(text: str) -> tuple[str, str] | None:
    """``(COMMAND, argument)`` of a CTCP message, or ``None`` if ``text`` is not one.

    ``"\\x01ACTION waves\\x01"`` gives ``("ACTION", "waves")`` and
    ``"\\x01VERSION\\x01"`` gives ``("VERSION", "")``.  The command is
    upper-cased; a missing closing ``\\x01`` is tolerated.
    """
    if not text.startswith("\x01"):
        return None
    body = text[1:].split("\x01", 1)[0]
    command, _, arg = body.partition(" ")
    if not command:
        return None
    return command.upper(), arg


def ctcp(command: str, arg: str = "") -> str:
    """The CTCP message ``\\x01COMMAND arg\\x01`` (``\\x01COMMAND\\x01`` without ``arg``).

    ``\\x01``, CR, LF and NUL are removed from both; the command is
    upper-cased and must be a single non-empty word (else :class:`ValueError`).
    """
    command = command.translate(_CTCP_UNSAFE).strip().upper()
    if not command or any(ch.isspace() for ch in command):
        raise ValueError(f"invalid CTCP command {command!r}")
    arg = arg.translate(_CTCP_UNSAFE)
    return f"\x01{command} {arg}\x01" if arg else f"\x01{command}\x01"


# -- names ---------------------------------------------------------------------------------

_ASCII_UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_ASCII_LOWER = "abcdefghijklmnopqrstuvwxyz"
_FOLDS = {
    "ascii": str.maketrans(_ASCII_UPPER, _ASCII_LOWER),
    "strict-rfc1459": str.maketrans(_ASCII_UPPER + "[]\\", _ASCII_LOWER + "{}|"),
    "rfc1459": str.maketrans(_ASCII_UPPER + "[]\\~", _ASCII_LOWER + "{}|^"),
}


#: Mappings of Unicode nicks and accounts (Ergo announces ``rfc8265``): the PRECIS
#: ``UsernameCaseMapped`` profile.  ``rfc7613`` is the RFC 8265 replaced.
PRECIS_MAPPINGS = frozenset({"rfc8265", "rfc7613", "precis"})
#: Every mapping :func:`casefold` knows; any other folds as ``ascii`` (see there).
KNOWN_MAPPINGS = frozenset({*_FOLDS, *PRECIS_MAPPINGS})


def _precis_width(ch: str) -> str:
    """RFC 8265 width mapping: a fullwidth or halfwidth character to its decomposition."""
    d = unicodedata.decomposition(ch)
    if d.startswith(("<wide>", "<narrow>")):
        return "".join(chr(int(h, 16)) for h in d.split()[1:])
    return ch


def _precis_fold(name: str) -> str:
    """The PRECIS ``UsernameCaseMapped`` comparison form (RFC 8265 section 3.3).

    Width mapping, then the Unicode ``toLowerCase`` operation (``str.lower``:
    not case *folding*, which would make ``straße`` equal ``strasse``, two
    accounts to Ergo), then NFC; repeated until stable (at most four
    rounds), as Ergo does.  ASCII letters are the only ASCII characters that
    change: ``[`` and ``{`` stay distinct.
    """
    if name.isascii():
        return name.translate(_FOLDS["ascii"])
    for _ in range(4):
        folded = unicodedata.normalize("NFC", "".join(map(_precis_width, name)).lower())
        if folded == name:
            break
        name = folded
    return name


def casefold(name: str, casemapping: str | None = None) -> str:
    """``name`` in the one case the server compares names in (ISUPPORT ``CASEMAPPING``).

    ``ascii``: ``A-Z`` → ``a-z``; ``rfc1459`` (the default, also when the
    server announces none): ASCII and ``[]\\~`` → ``{}|^``; ``strict-rfc1459``:
    ASCII and ``[]\\`` → ``{}|``; ``rfc8265`` (also ``rfc7613``, ``precis``:
    Unicode nicks, as on Ergo): the PRECIS ``UsernameCaseMapped`` profile —
    fullwidth and halfwidth forms to their usual ones, Unicode lower case,
    NFC — with ``[]\\~`` distinct from ``{}|^``.  ``"ALICE[m]"`` and
    ``"alice{m}"`` are one nick on an ``rfc1459`` server and two anywhere else.

    An unknown mapping folds as ``ascii``: only ``A-Z``, which every known
    mapping folds too, so names are never merged that the server might keep
    apart (the transport logs a warning when a server announces one).
    """
    mapping = (casemapping or "rfc1459").lower()
    table = _FOLDS.get(mapping)
    if table is not None:
        return name.translate(table)
    if mapping in PRECIS_MAPPINGS:
        return _precis_fold(name)
    return name.translate(_FOLDS["ascii"])


#: Characters a channel name we write to may not contain: separators and controls.
_BAD_CHANNEL_RE = re.compile(r"[\s,\x00-\x1f\x7f]")
#: ... and a nick: those, wildcards and the ``nick!user@host`` delimiters.
_BAD_NICK_RE = re.compile(r"[\s,*?!@\x00-\x1f\x7f]")


def valid_target(target: str, *, chantypes: str = "#&") -> bool:
    """Whether ``target`` (a nick or a channel from the network) may be written back.

    Refuses what would break or redirect the line we send: an empty or
    overlong name, a leading ``:`` (it would start the trailing parameter)
    or ``$`` (a server mask), spaces, ``,`` (several targets) and control
    characters; in a nick (a first character not in ``chantypes``) also the
    wildcards ``*``/``?`` and ``!``/``@``.  Never raises.
    """
    if not target or target[0] in ":$" or len(target.encode("utf-8", "replace")) > 200:
        return False
    bad = _BAD_CHANNEL_RE if target[0] in chantypes else _BAD_NICK_RE
    return not bad.search(target)


#: C0 controls that are not mIRC formatting codes, plus DEL.  ``\x01`` is among
#: them (CTCP); tab and newline stay (the line splitter handles them).
_OUT_CONTROL_RE = re.compile(r"[\x00\x01\x05-\x08\x0b\x0c\x0e\x10\x12-\x15\x17-\x1c\x7f]")


def clean_outgoing(text: str) -> str:
    """Message text (from a model or a person) made safe to send as PRIVMSG/NOTICE text.

    Removes ``\\x01`` (so no CTCP — ``\\x01DCC SEND …\\x01``, ``\\x01PING\\x01`` —
    can be made from text; the transport's own CTCP replies are built by
    :func:`ctcp`), NUL, and every other C0 control character that is not a
    formatting code, tab, CR or LF (BEL, ESC, …), and DEL.  Formatting codes
    stay: they cannot start a CTCP once ``\\x01`` is gone.
    """
    return _OUT_CONTROL_RE.sub("", text)


# -- formatting -----------------------------------------------------------------------------

_BOLD, _ITALIC, _UNDERLINE, _STRIKE, _MONOSPACE, _REVERSE, _RESET = (
    "\x02",
    "\x1d",
    "\x1f",
    "\x1e",
    "\x11",
    "\x16",
    "\x0f",
)
_TOGGLES = _BOLD + _ITALIC + _UNDERLINE + _STRIKE + _MONOSPACE + _REVERSE
_TOGGLE_SET = frozenset(_TOGGLES)
_FOLDABLE = frozenset(_TOGGLES + _RESET)  # codes a continuation line can fold into its prefix
_FORMAT_PATTERN = (
    r"\x03(?:\d{1,2}(?:,\d{1,2})?)?"  # colour: \x03[fg[,bg]]
    r"|\x04(?:[0-9A-Fa-f]{6}(?:,[0-9A-Fa-f]{6})?)?"  # hex colour: \x04[RRGGBB[,RRGGBB]]
    r"|[\x02\x0f\x11\x16\x1d\x1e\x1f]"
)
_FORMAT_RE = re.compile(_FORMAT_PATTERN)


def strip_formatting(text: str) -> str:
    """``text`` without mIRC formatting codes.

    Removes bold ``\\x02``, italic ``\\x1d``, underline ``\\x1f``,
    strikethrough ``\\x1e``, monospace ``\\x11``, reverse ``\\x16``, reset
    ``\\x0f``, and colours ``\\x03[fg[,bg]]`` (and hex ``\\x04RRGGBB[,RRGGBB]``).
    """
    return _FORMAT_RE.sub("", text)


# -- Markdown -------------------------------------------------------------------------------

_FENCE_OPEN_RE = re.compile(r"( {0,3})(`{3,}|~{3,})(.*)")
_FENCE_CLOSE_RE = re.compile(r" {0,3}(`{3,}|~{3,})[ \t]*")
_HEADING_RE = re.compile(r" {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*")
_RULE_RE = re.compile(r" {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*")
_LIST_RE = re.compile(r"([ \t]*)[-*+][ \t]+(.*)")
_TABLE_RE = re.compile(r"[ \t]*\|")
_CHECKBOXES = {"[ ] ": "☐ ", "[x] ": "☑ ", "[X] ": "☑ "}

_CODE_RE = re.compile(r"(?<![`\\])(`+)(?!`)(.+?)(?<!`)\1(?!`)")
_ESCAPE_RE = re.compile(r"\\([!-/:-@\[-`{-~])")
_LINK_RE = re.compile(
    r"!?\[([^\]]*)\]\(\s*<?([^\s()<>]*(?:\([^\s()<>]*\)[^\s()<>]*)*)>?"
    r"(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)"
)
_AUTOLINK_RE = re.compile(r"<(?:https?|ftp|ircs?|mailto):[^\s<>\x00]+>")
_URL_RE = re.compile(r"(?:https?|ftp|ircs?)://[^\s<>*`\x00]*[^\s<>*`\x00.,;:!?'\")\]_]")
_BOLD_RE = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*|(?<!\w)__(?=\S)(.+?)(?<=\S)__(?!\w)")
_STRIKE_RE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
_ITALIC_RE = re.compile(
    r"(?<![\w*])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?![\w*])"
    r"|(?<!\w)_(?=[^\s_])(.+?)(?<=[^\s_])_(?!\w)"
)
_PLACEHOLDER_RE = re.compile(r"\x00(\d+)\x00")


def _inline(text: str) -> str:
    """Inline Markdown of one line to mIRC codes.

    Code spans, URLs and escaped characters are set aside behind NUL-delimited
    placeholders (the input has no NUL) so emphasis never reaches into them.
    """
    kept: list[str] = []

    def keep(value: str) -> str:
        kept.append(value)
        return f"\x00{len(kept) - 1}\x00"

    def code(m: re.Match[str]) -> str:
        body = m[2]
        if len(body) > 1 and body[0] == body[-1] == " " and body.strip(" "):
            body = body[1:-1]
        return keep(f"{_MONOSPACE}{body}{_MONOSPACE}")

    def link(m: re.Match[str]) -> str:
        label, url = m[1].strip(), m[2]
        if not url:
            return label
        if not label or label == url:
            return keep(url)
        return f"{label} {keep(f'<{url}>')}"

    def emphasis(code: str) -> Callable[[re.Match[str]], str]:
        return lambda m: f"{code}{m[1] if m[1] is not None else m[2]}{code}"

    text = _CODE_RE.sub(code, text)
    text = _ESCAPE_RE.sub(lambda m: keep(m[1]), text)
    text = _LINK_RE.sub(link, text)
    text = _AUTOLINK_RE.sub(lambda m: keep(m[0]), text)
    text = _URL_RE.sub(lambda m: keep(m[0]), text)
    text = _BOLD_RE.sub(emphasis(_BOLD), text)
    text = _STRIKE_RE.sub(lambda m: f"{_STRIKE}{m[1]}{_STRIKE}", text)
    text = _ITALIC_RE.sub(emphasis(_ITALIC), text)

    def restore(m: re.Match[str]) -> str:
        # A kept value only holds placeholders made before it, so this ends.
        index = int(m[1])
        return _PLACEHOLDER_RE.sub(restore, kept[index]) if index < len(kept) else ""

    return _PLACEHOLDER_RE.sub(restore, text).replace("\x00", "")


def _markdown_line(line: str) -> str:
    if _TABLE_RE.match(line) or _RULE_RE.fullmatch(line):
        return line
    if m := _HEADING_RE.fullmatch(line):
        title = _inline(m[1]).replace(_BOLD, "")
        return f"{_BOLD}{title}{_BOLD}" if title else ""
    if m := _LIST_RE.fullmatch(line):
        indent, item = m[1], m[2]
        for box, mark in _CHECKBOXES.items():
            if item.startswith(box):
                item = mark + item[len(box) :]
        return f"{indent}• {_inline(item)}"
    return _inline(line)


def markdown_to_irc(text: str) -> str:
    """The Markdown an LLM writes, as IRC text: one output line per line to send.

    ``**bold**``/``__bold__`` become bold; ``*italic*``/``_italic_`` become
    italic only between non-word characters (``snake_case_names`` and
    ``2*3*4`` stay); ``~~struck~~`` is struck through; ```` `code` ```` is
    monospace.  A fenced code block loses its fence lines and each code line
    is sent monospace and untouched (an empty one as a monospace space, so
    the block keeps its shape; tabs become four spaces).  ``[text](url)``
    becomes ``text <url>``; ``# Title`` becomes a bold line; ``- item`` and
    ``* item`` become ``• item``; quotes, numbered lists and tables are
    left as they are.  Newlines are kept; the result has no CR or NUL.
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    out: list[str] = []
    fence: tuple[str, int, int] | None = None  # (character, length, indent) of the open fence
    for line in text.split("\n"):
        if fence is not None:
            char, length, indent = fence
            if (m := _FENCE_CLOSE_RE.fullmatch(line)) and m[1][0] == char and len(m[1]) >= length:
                fence = None
                continue
            dedent = len(line) - len(line.lstrip(" "))
            code = line[min(indent, dedent) :].replace("\t", "    ")
            out.append(f"{_MONOSPACE}{code or ' '}{_MONOSPACE}")
            continue
        if (m := _FENCE_OPEN_RE.fullmatch(line)) and not (m[2][0] == "`" and "`" in m[3]):
            fence = (m[2][0], len(m[2]), len(m[1]))
            continue
        out.append(_markdown_line(line))
    return "\n".join(out)


# -- line lengths ---------------------------------------------------------------------------


def _nbytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def payload_budget(
    target: str,
    *,
    nick: str,
    user: str | None,
    host: str | None,
    linelen: int = MAX_LINE_BYTES,
    command: str = "PRIVMSG",
) -> int:
    """Bytes of text that fit in ``COMMAND target :text`` as the recipients get it.

    The server relays the line as ``:nick!user@host COMMAND target :text``
    plus CRLF, and that must stay within ``linelen``.  An unknown ``user``
    or ``host`` is assumed as long as servers allow (10 and 63 bytes).
    Never less than 1.
    """
    user_len = _nbytes(user) if user else _USER_GUESS
    host_len = _nbytes(host) if host else _HOST_GUESS
    prefix = 1 + _nbytes(nick) + 1 + user_len + 1 + host_len + 1  # ":nick!user@host "
    overhead = prefix + _nbytes(command) + 1 + _nbytes(target) + 2 + 2  # " :" and CRLF
    return max(1, linelen - overhead)


_TOKEN_RE = re.compile(_FORMAT_PATTERN + r"|.", re.DOTALL)
_SURROGATE_RE = re.compile(r"[\ud800-\udfff]")
_BLANK = " \t"


def _apply(state: frozenset[str], token: str) -> frozenset[str]:
    """The toggles open after ``token``, given those open before it."""
    if token in _TOGGLE_SET:
        return state ^ {token}
    if token == _RESET:
        return frozenset()
    return state


def _opening(state: frozenset[str]) -> str:
    return "".join(code for code in _TOGGLES if code in state)


def _is_format(token: str) -> bool:
    return token[0] in "\x02\x03\x04\x0f\x11\x16\x1d\x1e\x1f"


def _joined(before: str, after: str) -> bool:
    """Whether a cut between these tokens would split a visible character."""
    if len(before) != 1 or len(after) != 1:
        return False
    if "\u200d" in (before, after):  # zero-width joiner
        return True
    return unicodedata.category(after) in ("Mn", "Mc", "Me") or 0x1F3FB <= ord(after) <= 0x1F3FF


class _Splitter:
    """Cuts one line's tokens (characters and formatting codes) into pieces."""

    def __init__(self, line: str, max_bytes: int) -> None:
        self.tokens = _TOKEN_RE.findall(line)
        self.sizes = [len(token.encode()) for token in self.tokens]
        self.max_bytes = max_bytes
        n = len(self.tokens)
        # next_visible[i]: first token at or after i that is not formatting or blank.
        self.next_visible = [n] * (n + 1)
        for i in range(n - 1, -1, -1):
            token = self.tokens[i]
            visible = not _is_format(token) and token not in _BLANK
            self.next_visible[i] = i if visible else self.next_visible[i + 1]

    def pieces(self) -> list[str]:
        tokens, n = self.tokens, len(self.tokens)
        out: list[str] = []
        state: frozenset[str] = frozenset()  # toggles open in the text so far
        pos = 0
        while self.next_visible[pos] < n:
            # The first line keeps its indentation if it can.  Otherwise drop the
            # spaces at the cut and fold the codes before the text into the prefix
            # that reopens the runs; then drop whatever else precedes the text
            # (colours, tabs); then give up the runs; then send one bare character.
            cut = self._cut(pos, state) if not out else None
            if cut is None:
                while pos < n and (tokens[pos] == " " or tokens[pos] in _FOLDABLE):
                    state = _apply(state, tokens[pos])
                    pos += 1
                cut = self._cut(pos, state)
            if cut is None:
                first = self.next_visible[pos]
                for token in tokens[pos:first]:
                    state = _apply(state, token)
                pos = first
                cut = self._cut(pos, state)
            start = state
            if cut is None and state:
                start = frozenset()
                cut = self._cut(pos, start)
            end, after = (pos + 1, pos + 1) if cut is None else cut
            body = tokens[pos:end]
            open_now = start
            for token in body:
                open_now = _apply(open_now, token)
                state = _apply(state, token)
            closing = _opening(open_now)[::-1] if end < n else ""
            out.append(_opening(start) + "".join(body) + closing)
            pos = after
        return out

    def _cut(self, pos: int, start: frozenset[str]) -> tuple[int, int] | None:
        """``(end, next)``: the piece is ``tokens[pos:end]``, the next one starts at ``next``.

        The piece holds something visible and, with the codes reopening
        ``start`` before it and closing its open runs after it, fits.
        """
        tokens, sizes, n = self.tokens, self.sizes, len(self.tokens)
        budget = self.max_bytes - len(start)
        first = self.next_visible[pos]
        used, open_now = 0, start
        space = hard = clean = None
        space_open = start
        i = pos
        while i < n:
            if i > first and used + len(open_now) <= budget:  # cutting before token i fits
                hard = i
                if not _is_format(tokens[i - 1]) and not _joined(tokens[i - 1], tokens[i]):
                    clean = i
                if tokens[i] == " ":
                    space, space_open = i, open_now
            if used + sizes[i] > budget:
                break
            used += sizes[i]
            open_now = _apply(open_now, tokens[i])
            i += 1
        else:
            return n, n  # the rest fits
        if space is not None:
            # Break at the space unless the next word could not fit on a line of
            # its own anyway; then fill this line and cut the word.
            j = space
            while j < n and tokens[j] == " ":
                j += 1
            word = 0
            while j < n and tokens[j] != " " and word <= self.max_bytes:
                word += sizes[j]
                j += 1
            if word + 2 * len(space_open) <= self.max_bytes or hard == space:
                end = space
                while tokens[end - 1] == " ":
                    end -= 1
                return end, space + 1
        cut = clean if clean is not None else hard
        return None if cut is None else (cut, cut)


def _clean_text(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    if _SURROGATE_RE.search(text):
        # Pair up surrogate halves; a lone half cannot be sent and becomes U+FFFD.
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def split_message(text: str, max_bytes: int) -> list[str]:
    """Cut one message into IRC lines of at most ``max_bytes`` UTF-8 bytes each.

    Cuts at newlines first, then at spaces (the spaces at a cut are
    dropped), and hard-cuts a word too long for a line of its own, never
    inside a character.  Lines have no CR, LF or NUL; lines of nothing but
    spaces and tabs are dropped (IRC cannot send an empty message).  A bold, italic, underline,
    strikethrough, monospace or reverse run open at a cut is closed at the
    end of the line and reopened on the next when that fits; colours are
    not carried over.  A character wider than ``max_bytes`` (only possible
    below 4) is sent as ``?``.
    """
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be at least 1, not {max_bytes}")
    text = _clean_text(text)
    if max_bytes < 4:
        text = "".join(ch if len(ch.encode()) <= max_bytes else "?" for ch in text)
    out: list[str] = []
    for line in text.split("\n"):
        if not line.strip(_BLANK):
            continue
        if len(line.encode()) <= max_bytes:
            out.append(line)
        else:
            out.extend(_Splitter(line, max_bytes).pieces())
    return out
