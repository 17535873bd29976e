"""End to end: the installed ``agentik`` command, piped stdin, a local LLM server."""

from __future__ import annotations

import asyncio
import functools
import signal
import sys

import pytest

import helpers
from agentik.core.background import MINING_PROMPT, REFLECTION_PROMPT
from agentik.core.testing.openai_server import Reply
from helpers import AGENTIK

#: ``agentik`` without asyncio's debug mode either (its slow-callback warnings would
#: land in the output the tests read).
clean_env = functools.partial(helpers.clean_env, drop=("PYTHONASYNCIODEBUG",))


def turn_requests(server) -> list[dict]:
    """The model requests of chat turns: without background memory work (the
    reflection a conversation gets when ``agentik chat`` ends, mining)."""
    background = (REFLECTION_PROMPT, MINING_PROMPT.split("{", 1)[0])
    return [
        r
        for r in server.requests
        if not any(
            m.get("role") == "system" and str(m.get("content", "")).startswith(background)
            for m in r["messages"][:1]
        )
    ]


def stdio_config(tmp_path, base_url: str | None, **llm: str) -> str:
    lines = ["[llm]"]
    if base_url:
        lines += [f'base_url = "{base_url}"', 'model = "fake-model"', "max_retries = 0"]
    lines += [f"{k} = {v}" for k, v in llm.items()]
    lines += [
        "[storage]",
        f'path = "{tmp_path / "bot.db"}"',
        "[transports.terminal]",
        'type = "stdio"',
        'user = "tester"',
    ]
    path = tmp_path / "bot.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


async def agentik_chat(config: str, stdin: bytes, *, env=None, limit=60.0):
    proc = await asyncio.create_subprocess_exec(
        AGENTIK, "chat", "-c", config,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env or clean_env(),
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(stdin), limit)
    return proc.returncode, out.decode(), err.decode()


async def test_answers_arrive_and_the_conversation_persists(openai_server, tmp_path):
    config = stdio_config(tmp_path, openai_server.base_url)
    code, out, err = await agentik_chat(config, b"hello\nhow are you?\n")
    assert code == 0, err
    assert out.splitlines() == ["echo: tester: hello", "echo: tester: how are you?"], err
    assert "Traceback" not in err
    # A second run continues the same conversation, with its history.
    code, out, err = await agentik_chat(config, b"and again\n")
    assert code == 0, err
    assert out.splitlines() == ["echo: tester: and again"], (err, turn_requests(openai_server))
    history = turn_requests(openai_server)[-1]["messages"]
    assert [m["content"] for m in history] == [
        "You are a helpful assistant in a chat. Answer briefly and plainly.",
        "tester: hello",
        "echo: tester: hello",
        "tester: how are you?",
        "echo: tester: how are you?",
        "tester: and again",
    ]
    # /new starts a fresh conversation; the old one stays in history.
    code, out, err = await agentik_chat(config, b"/new\nfresh start\n")
    assert code == 0, err
    assert out.splitlines()[0].startswith("started a new conversation")
    assert out.splitlines()[-1] == "echo: tester: fresh start"
    fresh = [m["content"] for m in turn_requests(openai_server)[-1]["messages"]]
    assert fresh[1:] == ["tester: fresh start"]


async def test_sigint_interrupts_a_slow_answer_and_the_bot_stays_usable(openai_server, tmp_path):
    config = stdio_config(tmp_path, openai_server.base_url)
    # The answer streams 10 of its 100 chunks, then holds until released (never):
    # SIGINT lands while it is known to be mid-stream, however slow the machine.
    slow = Reply.text("slow " * 100, chunks=100, hold_after=10)
    openai_server.enqueue(slow)
    proc = await asyncio.create_subprocess_exec(
        AGENTIK, "chat", "-c", config,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=clean_env(),
    )  # fmt: skip
    proc.stdin.write(b"tell me something slowly\n")
    await proc.stdin.drain()
    await slow.wait_held(timeout=60)
    proc.send_signal(signal.SIGINT)
    await openai_server.wait_disconnect(timeout=60)
    proc.stdin.write(b"are you still there?\n")
    proc.stdin.close()
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err
    lines = out.decode().splitlines()
    assert lines[-1] == "echo: tester: are you still there?"
    # Whatever part of the first answer had arrived is kept; never the whole of it.
    partial = "\n".join(lines[:-1])
    assert ("slow " * 100).startswith(partial) and len(partial) < len("slow " * 100)
    assert "(interrupted)" in err.decode()
    assert len(turn_requests(openai_server)) == 2


async def test_a_piped_line_before_new_is_answered_before_the_reset(openai_server, tmp_path):
    # `printf 'hello\n/new\n' | agentik chat`: hello is answered, then the reset.
    config = stdio_config(tmp_path, openai_server.base_url)
    code, out, err = await agentik_chat(config, b"hello\n/new\n")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "echo: tester: hello"
    assert lines[1].startswith("started a new conversation (the previous one is kept as ")
    assert len(lines) == 2 and len(turn_requests(openai_server)) == 1
    # The answered conversation is the old one; the next line starts afresh.
    code, out, err = await agentik_chat(config, b"/status\nagain\n")
    assert code == 0, err
    assert "(0 messages)" in out.splitlines()[0]
    assert out.splitlines()[-1] == "echo: tester: again"
    assert [m["content"] for m in turn_requests(openai_server)[-1]["messages"][1:]] == [
        "tester: again"
    ]


async def test_unreachable_model_gives_an_error_line_and_keeps_running(tmp_path):
    config = stdio_config(tmp_path, "http://127.0.0.1:9/v1")
    code, out, err = await agentik_chat(config, b"hello?\nstill there?\n")
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 2
    # One short line each, without the endpoint; the details are in the log
    # (stderr) under the line's reference.
    refs = []
    for line in lines:
        assert line.startswith("error: the model is unavailable right now (ref "), line
        assert "127.0.0.1" not in line and "http" not in line
        refs.append(line.rsplit("ref ", 1)[1].rstrip(")"))
    assert refs[0] != refs[1]
    for ref in refs:
        logged = [entry for entry in err.splitlines() if f"error ref {ref} " in entry]
        assert len(logged) == 1 and " ERROR " in logged[0]
        assert "could not reach the model at http://127.0.0.1:9" in logged[0]
    assert "Traceback" not in err


async def test_a_one_megabyte_line_is_refused_not_a_crash(openai_server, tmp_path):
    config = stdio_config(tmp_path, openai_server.base_url)
    code, out, err = await agentik_chat(config, b"x" * 1_000_000 + b"\nhello after\n")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == ("error: input line too long (1000001 bytes; the limit is 65536): ignored")
    assert lines[1] == "echo: tester: hello after"
    assert len(turn_requests(openai_server)) == 1


async def test_invalid_utf8_is_replaced_not_fatal(openai_server, tmp_path):
    config = stdio_config(tmp_path, openai_server.base_url)
    code, out, err = await agentik_chat(config, b"caf\xe9 \xff\xfe ok\n")
    assert code == 0, err
    assert out.splitlines() == ["echo: tester: caf\ufffd \ufffd\ufffd ok"]


async def test_without_any_model_the_bot_explains_how_to_get_one(tmp_path):
    # No endpoint configured and no local model (llama-cpp-python hidden from
    # this process): the bot still runs and says how to get a model.
    hide = (
        "import sys; sys.modules['llama_cpp'] = None; "
        "from agentik.bot.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    config = stdio_config(tmp_path, None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", hide, "chat", "-c", config,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=clean_env(),
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(b"hi\n"), 60)
    assert proc.returncode == 0, err
    assert b"No language model is available" in out and b"agentik[local]" in out
    assert b"OPENAI_BASE_URL" in out
    assert b"Traceback" not in err


@pytest.mark.parametrize("command", ["/help", "/status"])
async def test_commands_work_in_the_terminal(openai_server, tmp_path, command):
    config = stdio_config(tmp_path, openai_server.base_url)
    code, out, err = await agentik_chat(config, command.encode() + b"\n")
    assert code == 0, err
    assert ("/new" in out) if command == "/help" else ("model fake-model" in out)
    assert turn_requests(openai_server) == []
