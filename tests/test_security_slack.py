"""Slack rendering of hostile text (issue 17, item 3): mention and link injection.

Everything goes through the real slack-bolt/slack-sdk stack against the local
fake Slack, which records the exact ``text``/``markdown_text`` each call sent.
What Slack would do with it: in ``text`` (mrkdwn) every ``<…>`` is a control
sequence (``<!channel>`` notifies the channel, ``<@U1>`` a user,
``<url|label>`` is a link showing ``label``); ``&lt;``/``&gt;``/``&amp;``
show as ``<``/``>``/``&``.
"""

from __future__ import annotations

import asyncio
import html
import itertools
import logging
import re
import threading
from typing import Any

import pytest

from agentik.core import SQLiteStore
from agentik.core.testing.scripted import Reply
from agentik.transports.slack.mrkdwn import markdown_safe, markdown_to_mrkdwn, safe_url

from fakeslack import FakeSlack, _chunks_text
from rigs import answered, bot_texts, slack_bot

ATTACK = (
    "Hi <!channel> and <!here> and <!everyone>, ping <@U0BOSS> and <!subteam^S0ADMINS|@admins>. "
    "Log in at <https://evil.example/login|https://bank.example>. "
    "See [docs](https://evil.example/<!channel>) too."
)
PINGS = ("<!channel>", "<!here>", "<!everyone>", "<@U0BOSS>", "<!subteam^S0ADMINS")

#: A ``<…>`` sequence we may send in mrkdwn: a link to a validated URL.
_OUR_LINK = re.compile(r"<https?://[^\s<>|]+(?:\|[^<>]*)?>")


def sent_texts(slack: FakeSlack) -> list[tuple[str, str]]:
    """(method, text) of everything the bot wrote: mrkdwn ``text`` and ``markdown_text``."""
    out = []
    for method, params in slack.calls:
        if method in ("chat.postMessage", "chat.update"):
            out.append((method, params.get("text") or ""))
            if "markdown_text" in params:  # an answer posted whole (shorter than a flush)
                out.append((method + " markdown_text", params["markdown_text"]))
        if method in ("chat.startStream", "chat.appendStream", "chat.stopStream"):
            out.append((method, _chunks_text(params)))
    return out


def assert_no_injection(text: str) -> None:
    """No control sequence in ``text`` but links we built from validated URLs."""
    rest = _OUR_LINK.sub("", text)
    assert "<" not in rest and ">" not in rest, text


def shown(mrkdwn: str) -> str:
    """What a person sees for mrkdwn text without control sequences."""
    return html.unescape(mrkdwn)


async def test_mentions_and_fake_links_are_shown_as_text_in_posts_and_edits(tmp_path):
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        async with slack_bot(slack, tmp_path, streaming="edit") as (bot, model, agent, bridge):
            # Streamed in small pieces, so the message is posted and then edited.
            model.enqueue(Reply(chunks=[ATTACK[i : i + 9] for i in range(0, len(ATTACK), 9)]))
            await slack.push_event(slack.message_event("D1", "say it", channel_type="im"))
            await answered(slack, bridge, "slack:T1:D1")
            texts = sent_texts(slack)
            assert {m for m, _ in texts} == {"chat.postMessage", "chat.update"}
            for _, text in texts:
                for ping in PINGS:
                    assert ping not in text
                assert "|https://bank.example>" not in text  # no fake label
                assert_no_injection(text)
            (final,) = bot_texts(slack, "D1")
            # The reader sees what the model wrote, as text ...
            assert "<!channel> and <!here> and <!everyone>" in shown(final)
            assert "<https://evil.example/login|https://bank.example>" in shown(final)
            # ... and the Markdown link is a real link, its URL made harmless.
            assert "<https://evil.example/%3C!channel%3E|docs>" in final


async def test_native_streaming_appends_only_safe_markdown(tmp_path):
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        # (edit_interval = 0: streamed at once, every piece appended as it comes)
        async with slack_bot(slack, tmp_path, stream_buffer=8, edit_interval=0) as (
            bot,
            model,
            agent,
            bridge,
        ):
            # Token-sized pieces cut the link and the mentions in two.
            model.enqueue(Reply(chunks=[ATTACK[i : i + 5] for i in range(0, len(ATTACK), 5)]))
            event = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> say it")
            await slack.push_event(event)
            await answered(slack, bridge, f"slack:T1:C1:{event['ts']}")
            texts = sent_texts(slack)
            assert "chat.appendStream" in {m for m, _ in texts}
            whole = "".join(t for _, t in texts)
            for _, text in texts:
                assert "<" not in text and ">" not in text, text
            # The whole answer, as Markdown: text shown as written, the link rebuilt.
            assert "Hi &lt;!channel&gt; and &lt;!here&gt;" in whole
            assert "[docs](https://evil.example/%3C!channel%3E)" in whole


async def test_a_short_answer_posted_whole_is_safe_markdown(tmp_path):
    # Complete before its first stream_buffer characters, an answer is one
    # chat.postMessage whose markdown_text is escaped as the stream's would be.
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        async with slack_bot(slack, tmp_path, stream_buffer=4000) as (bot, model, agent, bridge):
            model.enqueue(Reply(chunks=[ATTACK[i : i + 5] for i in range(0, len(ATTACK), 5)]))
            event = slack.app_mention_event("C1", f"<@{slack.bot_user_id}> say it")
            await slack.push_event(event)
            await answered(slack, bridge, f"slack:T1:C1:{event['ts']}")
            ((method, text),) = [(m, t) for m, t in sent_texts(slack) if t]
            assert method == "chat.postMessage markdown_text"
            assert "<" not in text and ">" not in text, text
            assert "Hi &lt;!channel&gt; and &lt;!here&gt;" in text
            assert "[docs](https://evil.example/%3C!channel%3E)" in text
            assert text == markdown_safe(ATTACK)


async def test_normal_links_still_render_as_links(tmp_path):
    answer = "Read [the guide](https://example.com/a?b=1&c=2) or <https://example.org/x>."
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        async with slack_bot(slack, tmp_path, streaming="edit") as (bot, model, agent, bridge):
            model.enqueue(Reply(text=answer, chunks=None))
            await slack.push_event(slack.message_event("D1", "links?", channel_type="im"))
            await answered(slack, bridge, "slack:T1:D1")
            assert bot_texts(slack, "D1") == [
                "Read <https://example.com/a?b=1&amp;c=2|the guide> or <https://example.org/x>."
            ]
    assert markdown_safe(answer) == (
        "Read [the guide](https://example.com/a?b=1&amp;c=2) or"
        " [https://example.org/x](https://example.org/x)."
    )


async def test_command_replies_echoing_user_text_are_escaped(tmp_path):
    async with FakeSlack() as slack:
        slack.add_user("U1", "alice")
        async with slack_bot(slack, tmp_path) as (bot, model, agent, bridge):
            # Typed literally (Slack sends it as entities; a real @channel is <!channel>).
            typed = slack.typed("!<!channel>")
            await slack.push_event(slack.message_event("D1", typed, channel_type="im"))
            reply = await slack.wait_for_call("chat.postMessage")
            assert "unknown command" in reply["text"]
            assert "<!channel>" not in reply["text"] and "&lt;!channel&gt;" in reply["text"]


async def test_user_mentions_only_when_allowed(tmp_path):
    answer = "Ask <@U0BOB> about it, not <!here>."
    for allow, expected in (
        ([], "Ask &lt;@U0BOB&gt; about it, not &lt;!here&gt;."),
        (["users"], "Ask <@U0BOB> about it, not &lt;!here&gt;."),
    ):
        async with FakeSlack() as slack:
            slack.add_user("U1", "alice")
            async with slack_bot(
                slack, tmp_path, streaming="edit", allow_mentions=allow,
                # A fresh database each time: answered() waits for a first answer.
                store=SQLiteStore(str(tmp_path / f"slack-{len(allow)}.db")),
                state_file=str(tmp_path / f"seen-{len(allow)}.sqlite3"),
            ) as (bot, model, agent, bridge):  # fmt: skip
                model.enqueue(Reply(text=answer, chunks=None))
                await slack.push_event(slack.message_event("D1", "who?", channel_type="im"))
                await answered(slack, bridge, "slack:T1:D1")
                assert bot_texts(slack, "D1") == [expected]


def test_code_is_escaped_too_and_keeps_its_text():
    text = "Use `a<b && c>d` or <!here>:\n```html\n<!-- <@U1> -->\n<a href=x>\n```"
    assert markdown_to_mrkdwn(text) == (
        "Use `a&lt;b &amp;&amp; c&gt;d` or &lt;!here&gt;:\n"
        "```\n&lt;!-- &lt;@U1&gt; --&gt;\n&lt;a href=x&gt;\n```"
    )
    # Markdown (native streaming): code reads as written; a "<" that could open a
    # Slack control sequence is followed by an invisible WORD JOINER.
    safe = markdown_safe(text)
    assert safe == (
        "Use `a<b && c>d` or &lt;!here&gt;:\n```html\n<\u2060!-- <\u2060@U1> -->\n<a href=x>\n```"
    )


def test_only_http_links_with_plain_hosts_are_built():
    assert safe_url("https://example.com/a b|c<d>") == "https://example.com/a%20b%7Cc%3Cd%3E"
    assert safe_url("https://example.com/ü") == "https://example.com/%C3%BC"
    for bad in ("javascript:alert(1)", "https://", "ftp://x.example", "https://a|b.example/"):
        assert safe_url(bad) is None, bad
    for text in ("[x](javascript:alert(1))", "[x](https://a|b.example/)"):
        assert "<" not in markdown_to_mrkdwn(text)


# --------------------------------------------------------------------- fuzzing

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_pieces = st.sampled_from(
    ["<!channel>", "<!here>", "<!everyone>", "<@U0BOSS>", "<@UBOT>", "<!subteam^S1|@x>",
     "<https://evil.example|click me>", "[a](https://e.example/<!here>)", "[b](javascript:x)",
     "`<!here>`", "```\n<@U1>\n```", "&amp;", "&lt;!channel&gt;", "<", ">", "|", "*", "_",
     "\x00", "\x01", "\u202e", "\ud800", "\udfff", "\n", " ", "é", "😀", "!stop", "!help"]
)  # fmt: skip
_texts = st.one_of(
    st.lists(st.one_of(_pieces, st.text(max_size=8)), max_size=12).map("".join),
    st.builds(lambda n: "x <!channel> " * n, st.integers(400, 1200)),  # huge
)
_fields = st.fixed_dictionaries(
    {},
    optional={
        "subtype": st.sampled_from(
            ["file_share", "thread_broadcast", "bot_message", "message_changed",
             "message_deleted", "channel_join", "me_message", "weird"]
        ),
        "bot_id": st.just("B9"),
        "thread_ts": st.sampled_from(["1700000000.000001", "", "not-a-ts"]),
        "channel_type": st.sampled_from(["im", "channel", "group", "mpim"]),
        "user": st.sampled_from(["U1", "UBOT", "", None]),
        "text": st.none(),
        "channel": st.sampled_from(["D1", "C1", "", None]),
    },
)  # fmt: skip


class _Errors(logging.Handler):
    def __init__(self, into: list[str]) -> None:
        super().__init__(logging.ERROR)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(f"{record.name}: {record.getMessage()}")


@pytest.fixture(scope="module")
def slack_loop(tmp_path_factory):
    """One fake Slack and one bot, on an event loop in a thread, for all examples."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def run(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=120)

    tmp = tmp_path_factory.mktemp("fuzz")

    async def setup() -> Any:
        slack = FakeSlack()
        await slack.start()
        slack.add_user("U1", "alice")
        bot_cm = slack_bot(slack, tmp, stream_buffer=16)
        _, _, _, bridge = await bot_cm.__aenter__()
        return slack, bot_cm, bridge

    slack, bot_cm, bridge = run(setup())
    errors: list[str] = []
    handler = _Errors(errors)
    logging.getLogger().addHandler(handler)
    try:
        yield run, slack, bridge, errors
    finally:
        logging.getLogger().removeHandler(handler)

        async def teardown() -> None:
            await bot_cm.__aexit__(None, None, None)
            await slack.stop()

        run(teardown())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(60)
        loop.close()


_places = itertools.count(100)


@settings(
    max_examples=40, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)  # fmt: skip
@given(
    text=_texts,
    fields=_fields,
    kind=st.sampled_from(["message", "app_mention", "assistant_thread_started"]),
    drop=st.sets(st.sampled_from(["channel_id", "thread_ts", "context", "user_id"])),
)
def test_fuzzed_events_never_crash_or_inject(
    slack_loop, text: str, fields: Any, kind: str, drop: set[str]
):
    run, slack, bridge, errors = slack_loop
    if kind == "assistant_thread_started":  # with parts of its thread missing
        event = slack.assistant_thread_started_event("D1", context={"channel_id": text})
        for key in drop:
            del event["assistant_thread"][key]
    else:
        event = slack.message_event("D1", text, channel_type="im")
        event["type"] = kind
        for key, value in fields.items():
            if value is None:
                event.pop(key, None)
            else:
                event[key] = value
    before = len(slack.calls)

    async def go() -> None:
        await slack.push_event(event)
        # A message after it, in a new place: once that is answered, the fuzzed
        # event has been handled (events reach the bridge in order).
        place = f"D{next(_places)}"
        await slack.push_event(slack.message_event(place, "sentinel", channel_type="im"))
        await answered(slack, bridge, f"slack:T1:{place}")
        for key in list(bridge.channels.open):
            await bridge.flush(key)

    run(go())
    assert errors == []
    for method, params in slack.calls[before:]:
        if method in ("chat.postMessage", "chat.update"):
            assert_no_injection(params.get("text") or "")
            assert "<" not in (params.get("markdown_text") or "").replace("<\u2060", "")
        if method in ("chat.startStream", "chat.appendStream", "chat.stopStream"):
            assert "<" not in _chunks_text(params).replace("<\u2060", "")
