"""The IRC wire format: parsing, building, CTCP, formatting, line lengths."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentik.transports.irc.wire import (
    Line,
    ctcp,
    ctcp_parse,
    format_line,
    markdown_to_irc,
    parse_line,
    payload_budget,
    split_message,
    strip_formatting,
)

FAST = settings(max_examples=300, deadline=None)

B, IT, U, S, M = "\x02", "\x1d", "\x1f", "\x1e", "\x11"  # bold italic underline strike mono
_COLOUR = r"\x03(?:\d{1,2}(?:,\d{1,2})?)?|\x04(?:[0-9A-Fa-f]{6}(?:,[0-9A-Fa-f]{6})?)?"


def test_public_api_is_pinned():
    from agentik.transports.irc import wire

    assert sorted(wire.__all__) == sorted(
        """
        KNOWN_MAPPINGS MAX_LINE_BYTES MAX_TAGS_BYTES Line casefold clean_outgoing ctcp ctcp_parse
        format_line markdown_to_irc parse_line payload_budget split_message strip_formatting
        valid_target
        """.split()
    )


# -- parse_line -----------------------------------------------------------------------------


def test_parse_privmsg_with_tags():
    raw = (
        b"@time=2026-01-01T00:00:00.000Z;account=alice "
        b":alice!~a@host PRIVMSG #chan :hello there\r\n"
    )
    line = parse_line(raw)
    assert line == Line(
        tags={"time": "2026-01-01T00:00:00.000Z", "account": "alice"},
        source="alice!~a@host",
        command="PRIVMSG",
        params=("#chan", "hello there"),
    )
    assert line.nick == "alice"
    assert line.hostmask == ("alice", "~a", "host")


def test_parse_str_and_bytes_agree():
    raw = ":alice!~a@host PRIVMSG #chan :hello there"
    assert parse_line(raw) == parse_line(raw.encode())


@pytest.mark.parametrize(
    ("raw", "source", "command", "params"),
    [
        (":irc.example 001 bot :Welcome", "irc.example", "001", ("bot", "Welcome")),
        (
            ":irc.example 433 * bot :Nickname is already in use",
            "irc.example",
            "433",
            ("*", "bot", "Nickname is already in use"),
        ),
        (
            ":irc.example 005 bot CHANTYPES=# NICKLEN=30 :are supported by this server",
            "irc.example",
            "005",
            ("bot", "CHANTYPES=#", "NICKLEN=30", "are supported by this server"),
        ),
        ("PING :abc", None, "PING", ("abc",)),
        ("PING abc", None, "PING", ("abc",)),  # no trailing
        ("PING", None, "PING", ()),
        ("PING :", None, "PING", ("",)),  # an empty trailing is a parameter
        ("CAP * LS * :sasl message-tags", None, "CAP", ("*", "LS", "*", "sasl message-tags")),
        (
            ":srv CAP bot LS :multi-prefix sasl=PLAIN,EXTERNAL",
            "srv",
            "CAP",
            ("bot", "LS", "multi-prefix sasl=PLAIN,EXTERNAL"),
        ),
        (
            ":n!u@h JOIN #chan alice :Alice Liddell",
            "n!u@h",
            "JOIN",
            ("#chan", "alice", "Alice Liddell"),
        ),
        (":n!u@h MODE #chan +o bob", "n!u@h", "MODE", ("#chan", "+o", "bob")),
        ("  :srv   MODE   #c   +o    bob   ", "srv", "MODE", ("#c", "+o", "bob")),  # extra spaces
        (":srv privmsg #c :lower case", "srv", "PRIVMSG", ("#c", "lower case")),
        (":n!u@h PRIVMSG #c ::-) smile", "n!u@h", "PRIVMSG", ("#c", ":-) smile")),
        (":n!u@h PRIVMSG #c :  spaced  ", "n!u@h", "PRIVMSG", ("#c", "  spaced  ")),
        (
            "ERROR :Closing Link: bot (Ping timeout)",
            None,
            "ERROR",
            ("Closing Link: bot (Ping timeout)",),
        ),
    ],
)
def test_parse_examples(raw, source, command, params):
    line = parse_line(raw)
    assert line is not None
    assert (line.source, line.command, line.params) == (source, command, params)
    assert line.tags == {}


def test_parse_tag_escapes():
    line = parse_line(r"@a=b\:c\sd\\e\r\nf;flag;empty=;odd=x\y;tail=z\ :srv NOTICE bot :hi")
    assert line is not None
    assert line.tags == {
        "a": "b;c d\\e\r\nf",
        "flag": "",
        "empty": "",
        "odd": "xy",  # an unknown escape is the character itself
        "tail": "z",  # a trailing lone backslash is dropped
    }
    assert line.params == ("bot", "hi")


def test_parse_client_and_vendor_tags():
    line = parse_line("@+draft/reply=abc;example.com/foo=bar;msgid=x1 :a!b@c TAGMSG #chan")
    assert line is not None
    assert line.tags == {"+draft/reply": "abc", "example.com/foo": "bar", "msgid": "x1"}
    assert line.command == "TAGMSG"
    assert line.params == ("#chan",)


@pytest.mark.parametrize(
    ("source", "nick", "hostmask"),
    [
        ("alice!~a@host.example", "alice", ("alice", "~a", "host.example")),
        ("irc.example", "irc.example", ("irc.example", None, None)),
        ("alice@host", "alice", ("alice", None, "host")),
        ("alice!ident", "alice", ("alice", "ident", None)),
    ],
)
def test_hostmask(source, nick, hostmask):
    line = Line({}, source, "PRIVMSG", ("#c", "x"))
    assert line.nick == nick
    assert line.hostmask == hostmask


def test_no_source_has_no_nick():
    line = parse_line("PING :x")
    assert line is not None
    assert line.nick is None
    assert line.hostmask == (None, None, None)


@pytest.mark.parametrize(
    "raw",
    [
        "",
        b"",
        "   ",
        "\r\n",
        b" \t \r\n",
        ":srv",
        ":srv   ",
        "@a=b",
        "@a=b :srv",
        ":srv :x",
        "@",
        ":",
        "#$% x",
        b"\x00\x00",
    ],
)
def test_parse_none(raw):
    assert parse_line(raw) is None


def test_parse_drops_nul_keeps_ctcp():
    line = parse_line(b":a!b@c PRIVMSG #c :\x01ACTION wa\x00ves\x01\r\n")
    assert line is not None
    assert line.params == ("#c", "\x01ACTION waves\x01")


def test_parse_invalid_utf8_is_replaced():
    line = parse_line(b":a!b@c PRIVMSG #c :caf\xe9 \xff ok")
    assert line is not None
    assert line.params == ("#c", "caf\ufffd \ufffd ok")


def test_parse_lone_surrogate_in_str():
    line = parse_line(":a!b@c PRIVMSG #c :x\ud800y")
    assert line is not None
    assert "\ud800" not in line.params[1]
    line.params[1].encode()  # sendable


def test_parse_line_ends_at_first_cr_or_lf():
    line = parse_line("PRIVMSG #c :one\r\nQUIT :two")
    assert line is not None
    assert line.params == ("#c", "one")
    assert parse_line("PRIVMSG #c :a\rb") == parse_line("PRIVMSG #c :a")


def test_parse_overlong_line_is_truncated():
    raw = b"@t=" + b"v" * 100 + b" :a!b@c PRIVMSG #c :" + "é".encode() * 10_000
    line = parse_line(raw)
    assert line is not None
    assert line.command == "PRIVMSG"
    text = line.params[1]
    assert set(text) == {"é"}  # cut on a character boundary, no U+FFFD
    assert len(raw[: 8191 + 512]) - len(text.encode()) <= 1 + len(b"@t= :a!b@c PRIVMSG #c :") + 100


# -- format_line ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "expected"),
    [
        (("PRIVMSG", "#chan", "hello there"), {}, "PRIVMSG #chan :hello there"),
        (("PRIVMSG", "#chan", "hello"), {}, "PRIVMSG #chan hello"),
        (("PRIVMSG", "#chan", ":)"), {}, "PRIVMSG #chan ::)"),
        (("PRIVMSG", "#chan", ""), {}, "PRIVMSG #chan :"),
        (("NICK", "bot"), {}, "NICK bot"),
        (("QUIT",), {}, "QUIT"),
        (("USER", "bot", "0", "*", "Agentik bot"), {}, "USER bot 0 * :Agentik bot"),
        (("CAP", "REQ", "sasl message-tags"), {}, "CAP REQ :sasl message-tags"),
        (("PRIVMSG", "#c", "hi\r\nQUIT :bye"), {}, "PRIVMSG #c :hi  QUIT :bye"),
        (("PRIVMSG", "#c", "a\x00b"), {}, "PRIVMSG #c :a b"),
        (
            ("TAGMSG", "#c"),
            {"tags": {"+draft/reply": "a;b c\\d\r\n", "+typing": ""}},
            r"@+draft/reply=a\:b\sc\\d\r\n;+typing TAGMSG #c",
        ),
        (("PING", "x"), {"tags": {}}, "PING x"),
    ],
)
def test_format_line(args, kwargs, expected):
    assert format_line(*args, **kwargs) == expected


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (("PRIVMSG", "#a b", "x"), {}),  # space in a middle parameter
        (("PRIVMSG", "", "x"), {}),  # empty middle parameter
        (("PRIVMSG", ":x", "y"), {}),  # middle starting with ':'
        (("PRIVMSG", "#c\r\nQUIT", "y"), {}),  # becomes a space, so refused
        (("PRIV MSG", "#c"), {}),
        (("", "#c"), {}),
        (("PRIVMSG\r\n", "#c"), {}),
        (("TAGMSG", "#c"), {"tags": {"bad key": "x"}}),
        (("TAGMSG", "#c"), {"tags": {"": "x"}}),
    ],
)
def test_format_line_refuses(args, kwargs):
    with pytest.raises(ValueError):
        format_line(*args, **kwargs)


# -- CTCP -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\x01VERSION\x01", ("VERSION", "")),
        ("\x01ACTION waves\x01", ("ACTION", "waves")),
        ("\x01ACTION waves hello", ("ACTION", "waves hello")),  # no closing \x01
        ("\x01ping 12345\x01", ("PING", "12345")),
        ("\x01ACTION \x01", ("ACTION", "")),
        ("hello", None),
        ("", None),
        ("\x01", None),
        ("\x01\x01", None),
        ("\x01 x\x01", None),
        ("say \x01VERSION\x01", None),
    ],
)
def test_ctcp_parse(text, expected):
    assert ctcp_parse(text) == expected


def test_ctcp_build():
    assert ctcp("VERSION") == "\x01VERSION\x01"
    assert ctcp("version", "agentik 0.1") == "\x01VERSION agentik 0.1\x01"
    assert ctcp("PING", "1\x01\r\n2\x003") == "\x01PING 123\x01"
    assert ctcp_parse(ctcp("ACTION", "waves")) == ("ACTION", "waves")
    with pytest.raises(ValueError):
        ctcp("")
    with pytest.raises(ValueError):
        ctcp("TWO WORDS")


# -- formatting -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "plain"),
    [
        (f"{B}bold{B} {IT}it{IT} {U}u{U} {S}s{S} {M}m{M} \x16r\x16 x\x0f", "bold it u s m r x"),
        ("\x0304red\x03 \x034,12on blue\x03 \x0399", "red on blue "),
        ("\x03,5 comma", ",5 comma"),  # a comma without a foreground is text
        ("\x03123", "3"),  # two digits at most
        ("\x04ff0000hex\x04", "hex"),
        ("plain \x01ACTION\x01", "plain \x01ACTION\x01"),
    ],
)
def test_strip_formatting(text, plain):
    assert strip_formatting(text) == plain


# -- markdown_to_irc ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("md", "irc"),
    [
        ("**bold** and __bold__", f"{B}bold{B} and {B}bold{B}"),
        ("*italic* and _italic_", f"{IT}italic{IT} and {IT}italic{IT}"),
        ("snake_case_names and 2*3*4 and a * b * c", "snake_case_names and 2*3*4 and a * b * c"),
        ("use `x = a*b*c` here", f"use {M}x = a*b*c{M} here"),
        ("``code with ` tick``", f"{M}code with ` tick{M}"),
        (
            "see [the docs](https://example.com/a_b_c) now",
            "see the docs <https://example.com/a_b_c> now",
        ),
        ("[https://x.io](https://x.io)", "https://x.io"),
        (
            "https://example.com/_private_/x and _yes_",
            f"https://example.com/_private_/x and {IT}yes{IT}",
        ),
        ("# Title", f"{B}Title{B}"),
        ("### A **strong** title ###", f"{B}A strong title{B}"),
        ("#channel is not a heading", "#channel is not a heading"),
        ("- item one", "• item one"),
        ("* item *two*", f"• item {IT}two{IT}"),
        ("  - nested", "  • nested"),
        ("- [x] done", "• ☑ done"),
        ("> quoted **text**", f"> quoted {B}text{B}"),
        ("1. first", "1. first"),
        ("| a | *b* |\n|---|---|", "| a | *b* |\n|---|---|"),
        ("~~gone~~", f"{S}gone{S}"),
        (r"\*not italic\*", "*not italic*"),
        ("***both***", f"{B}{IT}both{B}{IT}"),
        ("**unclosed bold", "**unclosed bold"),
        ("a\r\nb\rc\x00d", "a\nb\ncd"),
        ("---", "---"),
    ],
)
def test_markdown_to_irc(md, irc):
    assert markdown_to_irc(md) == irc


def test_markdown_code_block():
    md = (
        "Here:\n```python\ndef f(x_y_z):\n\n    return x_y_z * 2  # **not bold**\n```\n"
        "Done **now**."
    )
    assert markdown_to_irc(md).split("\n") == [
        "Here:",
        f"{M}def f(x_y_z):{M}",
        f"{M} {M}",
        f"{M}    return x_y_z * 2  # **not bold**{M}",
        f"Done {B}now{B}.",
    ]


def test_markdown_unclosed_code_block_runs_to_the_end():
    assert markdown_to_irc("~~~\na *b*\n```\n") == f"{M}a *b*{M}\n{M}```{M}\n{M} {M}"


def test_markdown_then_split_keeps_code_blocks():
    lines = split_message(markdown_to_irc("```\na\n\nb\n```"), 400)
    assert lines == [f"{M}a{M}", f"{M} {M}", f"{M}b{M}"]


# -- payload_budget -------------------------------------------------------------------------


def test_payload_budget_known_and_unknown():
    known = payload_budget("#chan", nick="bot", user="~bot", host="example.org")
    relayed = f":bot!~bot@example.org PRIVMSG #chan :{'x' * known}\r\n"
    assert len(relayed) == 512
    unknown = payload_budget("#chan", nick="bot", user=None, host=None)
    assert unknown == 512 - len(":bot!@ PRIVMSG #chan :\r\n") - 10 - 63
    notice = payload_budget("#chan", nick="bot", user="u", host="h", command="NOTICE")
    assert notice == payload_budget("#chan", nick="bot", user="u", host="h") + 1
    assert payload_budget("#c", nick="n" * 600, user=None, host=None) == 1
    assert payload_budget("#é", nick="bot", user="u", host="h") + 1 == payload_budget(
        "#e", nick="bot", user="u", host="h"
    )


# -- split_message --------------------------------------------------------------------------


def test_split_short_and_newlines():
    assert split_message("hello", 400) == ["hello"]
    assert split_message("one\n\n  \ntwo\r\nthree\rfour\n", 400) == ["one", "two", "three", "four"]
    assert split_message("", 400) == []
    assert split_message("   \n\t\n", 400) == []


def test_split_at_words():
    assert split_message("the quick brown fox jumps", 10) == ["the quick", "brown fox", "jumps"]
    assert split_message("a  b   c", 3) == ["a", "b", "c"]


def test_split_hard_cuts_long_words():
    assert split_message("abcdefghij", 4) == ["abcd", "efgh", "ij"]
    # A word that fits a line of its own goes to the next line; one that does not fills this one.
    assert split_message("go https://ex.com/12", 18) == ["go", "https://ex.com/12"]
    assert split_message("go " + "x" * 30, 18) == ["go " + "x" * 15, "x" * 15]


def test_split_never_inside_a_character():
    pieces = split_message("é" * 5, 3)
    assert pieces == ["é", "é", "é", "é", "é"]
    assert split_message("a😀b😀", 5) == ["a😀", "b😀"]
    assert split_message("e\u0301e\u0301e\u0301", 4) == ["e\u0301", "e\u0301", "e\u0301"]


def test_split_surrogates():
    # A surrogate pair (as from some JSON decoders) is one character; a lone half is U+FFFD.
    assert split_message("\ud83d\ude00!", 400) == ["😀!"]
    assert split_message("a\ud800b", 400) == ["a\ufffdb"]


def test_split_too_small_for_a_character():
    assert split_message("😀😀", 3) == ["??"]
    assert split_message("ab", 1) == ["a", "b"]
    with pytest.raises(ValueError):
        split_message("x", 0)


def test_split_reopens_formatting():
    text = f"{B}bold words here{B} plain"
    assert split_message(text, 12) == [f"{B}bold words{B}", f"{B}here{B} plain"]
    code = f"{M}{'x' * 10}{M}"
    assert split_message(code, 6) == [f"{M}xxxx{M}", f"{M}xxxx{M}", f"{M}xx{M}"]
    both = f"{B}{IT}aa bb{IT}{B}"
    assert split_message(both, 6) == [f"{B}{IT}aa{IT}{B}", f"{B}{IT}bb{IT}{B}"]


def test_split_formatting_gives_way_when_it_does_not_fit():
    pieces = split_message(f"{B}abc{B}", 2)
    assert "".join(strip_formatting(p) for p in pieces) == "abc"
    assert all(len(p.encode()) <= 2 for p in pieces)


def test_split_strips_cr_lf_nul():
    assert split_message("a\x00b\rc", 400) == ["ab", "c"]


# -- properties -----------------------------------------------------------------------------

_IRCISH_BYTES = [
    b"@",
    b":",
    b" ",
    b"  ",
    b";",
    b"=",
    b"\\",
    b"\x00",
    b"\x01",
    b"\r",
    b"\n",
    b"\xff",
    b"\xe2\x82",
    b"PRIVMSG",
    b"001",
    b"#chan",
    b"nick!user@host",
    b"a=b",
    b"\\s",
]


@FAST
@given(
    st.one_of(
        st.binary(max_size=300),
        st.lists(st.one_of(st.sampled_from(_IRCISH_BYTES), st.binary(max_size=8)), max_size=40).map(
            b"".join
        ),
    )
)
def test_parse_line_never_raises(raw):
    for value in (raw, raw.decode("utf-8", "replace"), raw.decode("latin-1")):
        line = parse_line(value)
        assert line is None or isinstance(line, Line)
        if line is not None:
            assert line.command == line.command.upper()
            assert line.command.isascii() and line.command.isalnum()
            for text in (*line.params, *line.tags, line.source or ""):
                assert not set(text) & {"\x00", "\r", "\n"}


@settings(max_examples=30, deadline=None)
@given(
    st.sampled_from([b"", b"@" + b"t=v;" * 3000 + b" ", b":a!b@c "]),
    st.sampled_from([b"PRIVMSG #c :", b"X ", b"", b"\xff\x00\x01"]),
    st.integers(min_value=8000, max_value=20_000),
    st.sampled_from([b"x", b"\xc3\xa9", b"\xf0\x9f\x98\x80", b" ", b"\x00", b"\x01", b"\xff"]),
)
def test_parse_line_overlong(head, cmd, n, unit):
    line = parse_line(head + cmd + unit * n)
    if line is not None:
        # Each input byte gives at most one character (invalid ones become U+FFFD).
        assert sum(len(p) for p in line.params) <= 8191 + 512
        assert line.command == line.command.upper()


_COMMANDS = st.from_regex(r"[A-Za-z]{1,12}|[0-9]{3}", fullmatch=True)
_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
_MIDDLE = st.text(
    st.characters(exclude_categories=("Cs",), exclude_characters=" \r\n\x00"),
    min_size=1,
    max_size=20,
).filter(lambda s: not s.startswith(":"))
_TAG_KEYS = st.from_regex(r"\+?([a-z0-9.-]{1,10}/)?[A-Za-z0-9-]{1,10}", fullmatch=True)


@FAST
@given(
    _COMMANDS,
    st.lists(_MIDDLE, max_size=5),
    st.one_of(st.none(), _TEXT),
    st.dictionaries(_TAG_KEYS, _TEXT, max_size=4),
)
def test_format_line_round_trips(command, middles, last, tags):
    params = [*middles] if last is None else [*middles, last]
    line = format_line(command, *params, tags=tags)
    assert not set(line) & {"\r", "\n", "\x00"}
    parsed = parse_line(line)
    clean = [p.replace("\r", " ").replace("\n", " ").replace("\x00", " ") for p in params]
    assert parsed == Line(
        tags={k: v.replace("\x00", "") for k, v in tags.items()},
        source=None,
        command=command.upper(),
        params=tuple(clean),
    )


@FAST
@given(st.lists(_TEXT, min_size=1, max_size=4))
def test_format_line_never_emits_cr_lf_nul(params):
    try:
        line = format_line("PRIVMSG", *params)
    except ValueError:
        return  # an unsendable middle parameter
    assert not set(line) & {"\r", "\n", "\x00"}


_MESSAGE_CHARS = st.one_of(
    st.sampled_from(
        [
            *[
                " ",
                " ",
                "  ",
                "\n",
                "\r",
                "\r\n",
                "\x00",
                "\t",
                "\x01",
                B,
                IT,
                U,
                S,
                M,
                "\x16",
                "\x0f",
            ],
            *["\x03", "\x0304", "\x034,12", ",", "1", "é", "😀", "\u0301", "\u200d", "word"],
        ]
    ),
    st.characters(exclude_categories=("Cs",)),
)
_MESSAGES = st.lists(_MESSAGE_CHARS, max_size=300).map("".join)


def _content(text: str) -> str:
    """Visible text: formatting codes and whitespace removed."""
    return "".join("".join(strip_formatting(line).split()) for line in text.split("\n"))


@FAST
@given(_MESSAGES, st.integers(min_value=1, max_value=600))
def test_split_message_properties(text, max_bytes):
    lines = split_message(text, max_bytes)
    for line in lines:
        assert len(line.encode("utf-8")) <= max_bytes
        assert not set(line) & {"\r", "\n", "\x00"}
        assert line.strip(" \t")
    expected = text.replace("\r", "\n").replace("\x00", "")
    expected = "".join(c if len(c.encode()) <= max_bytes else "?" for c in expected)
    assert _content("\n".join(lines)) == _content(expected)


_STYLED_CHARS = st.sampled_from(
    [" ", " ", "a", "bb", "é", "😀", B, IT, U, S, M, "\x16", "\x0f", "\x0304", "\n", "word "]
)
_CODE_OR_CHAR = re.compile(f"{_COLOUR}|.", re.DOTALL)


def _styled(lines: list[str]) -> list[tuple[str, frozenset[str]]]:
    """Each visible character with the toggles (bold, italic...) it is shown in."""
    out = []
    for line in lines:
        state: frozenset[str] = frozenset()
        for token in _CODE_OR_CHAR.findall(line):
            if token in (B, IT, U, S, M, "\x16"):
                state ^= {token}
            elif token == "\x0f":
                state = frozenset()
            elif not token.isspace() and token[0] not in "\x03\x04":
                out.append((token, state))
    return out


@FAST
@given(st.lists(_STYLED_CHARS, max_size=200).map("".join), st.integers(16, 80))
def test_split_message_keeps_styles(text, max_bytes):
    # With room for every code (6 to reopen, 6 to close, one character), each
    # character keeps its formatting across the cuts.
    assert _styled(split_message(text, max_bytes)) == _styled(text.split("\n"))


@FAST
@given(
    st.lists(
        st.sampled_from([*"ab *_#`[]()>-|~\n\r\x00\\", "**", "```", "https://x", "    "]),
        max_size=80,
    ).map("".join)
)
def test_markdown_to_irc_never_emits_cr_nul(text):
    out = markdown_to_irc(text)
    assert "\r" not in out
    assert "\x00" not in out


@FAST
@given(_MESSAGES)
def test_markdown_to_irc_never_raises(text):
    out = markdown_to_irc(text)
    assert "\r" not in out
    assert "\x00" not in out


_NICKS = st.from_regex(r"[A-Za-z\[\]\\`_^{|}][A-Za-z0-9\[\]\\`_^{|}-]{0,29}", fullmatch=True)
_USERS = st.from_regex(r"~?[a-z0-9]{1,9}", fullmatch=True)
_HOSTS = st.from_regex(r"[a-z0-9.:-]{1,63}", fullmatch=True)
_TARGETS = st.one_of(st.from_regex(r"[#&][^\s,\x07\x00]{1,49}", fullmatch=True), _NICKS)


@FAST
@given(
    _NICKS,
    _USERS,
    _HOSTS,
    _TARGETS,
    st.booleans(),
    st.sampled_from(["PRIVMSG", "NOTICE"]),
    _MESSAGES,
)
def test_payload_budget_fits_relayed_line(nick, user, host, target, known, command, text):
    budget = payload_budget(
        target,
        nick=nick,
        user=user if known else None,
        host=host if known else None,
        command=command,
    )
    for piece in split_message(markdown_to_irc(text), budget) or ["x" * budget]:
        relayed = f":{nick}!{user}@{host} {format_line(command, target, piece)}\r\n"
        assert len(relayed.encode()) <= 512
    full = f":{nick}!{user}@{host} {command} {target} :{'x' * budget}\r\n"
    assert len(full.encode()) <= 512
    if known:
        assert len(full.encode()) == 512
