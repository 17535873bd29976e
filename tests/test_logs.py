"""The bot's log output (``agentik.bot.logs``): no secret in any form, valid JSON lines."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from agentik.bot.logs import add_secrets, setup_logging

# Passwords may hold any character: JSON escapes a quote and a backslash, and
# ``%r`` (a dict of headers, an exception's repr) doubles the backslash.
SECRETS = ['pa"ss\\word-1', "tab\there-2", "plain-secret-3"]


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


def log_secrets(log: logging.Logger, secret: str) -> None:
    log.debug("connecting with %s", secret)
    log.debug("request options: %r", {"headers": {"Authorization": f"Bearer {secret}"}})
    log.warning("failed: %r", ValueError(f"bad key {secret}"))
    log.info("field", extra={"token": secret, "nested": {"k": [secret]}})


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_no_secret_in_any_escaped_form_and_json_lines_parse(fmt, capsys, restore_logging):
    setup_logging("debug", fmt, SECRETS[:2])
    add_secrets(SECRETS[2:])  # as a reloaded configuration does
    log = logging.getLogger("agentik.test.logs")
    for secret in SECRETS:
        log_secrets(log, secret)
    log.warning("odd input: %s", "line\nbreak \x00 \udcff \u2028 end")
    err = capsys.readouterr().err
    lines = err.splitlines() if fmt == "json" else [err]  # (splitlines: at U+2028 too)
    for secret in SECRETS:
        for form in {secret, repr(secret)[1:-1], json.dumps(secret)[1:-1],
                     json.dumps(repr(secret)[1:-1])[1:-1]}:  # fmt: skip
            assert form not in err, (form, err)
    assert err.count("***") >= 3 * len(SECRETS)
    if fmt == "json":
        records = [json.loads(line) for line in lines]
        assert len(records) == 4 * len(SECRETS) + 1
        assert records[-1]["msg"].startswith("odd input: line\nbreak")


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_chat_text_cannot_forge_a_log_line_or_reach_the_terminal(fmt, capsys, restore_logging):
    """A nick or a message (IRC, Slack, a model) logged as is: one line per record,
    no raw line break, escape sequence or C1 control; a traceback keeps its lines."""
    setup_logging("info", fmt, ["s3cret\nline"])
    log = logging.getLogger("agentik.test.logs")
    hostile = "hi\r\n2026-12-01T00:00:00.000Z INFO    agentik: forged \x1b]0;owned\x07\x9b2J\u2028x"
    log.info("message from %s", hostile)
    log.info("key s3cret\nline here")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed on %s", "a\nb")
    lines = capsys.readouterr().err.splitlines()
    assert not any(c in line for line in lines for c in "\x1b\x07\x9b\u2028\r")
    assert "s3cret" not in "\n".join(lines)
    if fmt == "json":
        records = [json.loads(line) for line in lines]
        assert [r["msg"].startswith(("message", "key", "failed")) for r in records] == [True] * 3
        assert records[0]["msg"] == "message from " + hostile  # the text itself, intact
    else:
        assert lines[0].endswith(
            "message from hi\\r\\n2026-12-01T00:00:00.000Z INFO    agentik: forged"
            " \\x1b]0;owned\\x07\\x9b2J\\u2028x"
        )
        assert lines[1].endswith("key *** here")
        assert (
            lines[2].endswith("failed on a\\nb")
            and lines[3] == "Traceback (most recent call last):"
        )
        assert lines[-1] == "ValueError: boom"


async def test_json_lines_of_uvicorn_carry_no_ansi_color_copy(capsys, restore_logging):
    """uvicorn logs its start-up with ``extra={"color_message": ...}`` (the message
    again, with ANSI colour codes): a JSON line keeps ``msg`` and drops that copy."""
    import uvicorn

    async def app(scope, receive, send):  # pragma: no cover - never asked
        raise AssertionError("no request is made")

    setup_logging("info", "json")
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, lifespan="off")
    )
    server.should_exit = True  # start (logging where it runs), then stop at once
    async with asyncio.timeout(60):
        await server.serve()
    records = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    running = [r for r in records if r["logger"].startswith("uvicorn")]
    assert any("Uvicorn running on" in r["msg"] for r in running), records
    assert all("color_message" not in r for r in records), records
    assert "\x1b" not in json.dumps(records)
