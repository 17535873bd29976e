"""agentik-webhook as a user meets it: installed next to agentik, run from a config file.

The end-to-end test runs the installed ``agentik`` command as a real
process with a webhook transport, POSTs a message to it, receives the answer
on a local callback server, and shows the plugin's tool was offered to the
model and called (the model is a local OpenAI-compatible server).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from agentik.core.errors import ConfigError
from agentik.core.testing.openai_server import FakeOpenAIServer, Reply
from agentik.transports.base import IncomingMessage, Transport

from webhook_peer import CallbackServer, post, require_installed

require_installed()

from agentik_webhook import WebhookTransport, sign, webhook_time  # noqa: E402

from agentik.core.testing.ports import worker_block  # noqa: E402

PACKAGE = Path(__file__).resolve().parent.parent
# The venv's own agentik (next to this interpreter), never the first one on PATH.
AGENTIK = str(Path(sys.executable).parent / "agentik")
SECRET = "webhook-test-secret-123"


#: This plugin's test servers' ports: a block per xdist worker below the kernel's
#: ephemeral range and apart from agentik's own tests' blocks (20000 up).
PORTS = worker_block(16000, 250)


def free_port() -> int:
    return PORTS.take()


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AGENTIK_"))}
    return {**env, **extra}


def write_config(tmp_path: Path, llm_url: str, port: int, callback_url: str) -> str:
    path = tmp_path / "bot.toml"
    path.write_text(
        f"""\
[llm]
base_url = "{llm_url}"
model = "fake-model"
max_retries = 0

[storage]
path = "{tmp_path / "bot.db"}"

[transports.hooks]
type = "webhook"
port = {port}
callback_url = "{callback_url}"
secret = "${{WEBHOOK_SECRET}}"
"""
    )
    return str(path)


async def wait_listening(port: int, proc: asyncio.subprocess.Process) -> None:
    deadline = time.monotonic() + 60
    while True:
        if proc.returncode is not None:
            err = (await proc.stderr.read()).decode()  # type: ignore[union-attr]
            raise AssertionError(f"agentik run exited with {proc.returncode}:\n{err}")
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            if time.monotonic() > deadline:
                raise AssertionError("agentik run never listened on its webhook port") from None
            await asyncio.sleep(0.05)
            continue
        writer.close()
        await writer.wait_closed()
        return


async def test_agentik_run_serves_the_webhook_and_the_model_uses_the_plugin_tool(tmp_path):
    async with FakeOpenAIServer(model="fake-model") as llm, CallbackServer(SECRET) as callback:
        llm.enqueue(
            Reply.tool_calls([("call_1", "webhook_time", '{"utc_offset_minutes": 60}')]),
            Reply.text("It is just past ten in Paris."),
        )
        port = free_port()
        config = write_config(tmp_path, llm.base_url, port, callback.url)
        env = clean_env(WEBHOOK_SECRET=SECRET)
        check = await asyncio.create_subprocess_exec(
            AGENTIK, "check", "-c", config, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        checked, problems = await asyncio.wait_for(check.communicate(), 60)
        assert check.returncode == 0, problems.decode()
        assert "transport hooks: webhook" in checked.decode()
        proc = await asyncio.create_subprocess_exec(
            AGENTIK, "run", "-c", config, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            await wait_listening(port, proc)
            url = f"http://127.0.0.1:{port}/webhook"
            # Unsigned requests are refused: the secret came from the environment.
            status, body = await post(url, {"user": "alice", "text": "hi"})
            assert status == 401 and "X-Agentik-Signature" in body["error"]
            question = {"user": "alice", "name": "Alice", "text": "What time is it in Paris?"}
            status, body = await post(url, question, secret=SECRET)
            assert status == 202, body
            answer = await callback.wait_for(lambda p: p["kind"] == "answer")
        finally:
            proc.send_signal(signal.SIGTERM)
            out, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, err.decode()
        assert b"Traceback" not in err and SECRET.encode() not in err + out
    assert answer["text"] == "It is just past ten in Paris."
    assert answer["direct"] and answer["user"] == "alice" and answer["seq"] >= 2
    notice = next(p for p in callback.received if p["kind"] == "notice")
    assert notice["text"] == "⚙ webhook_time(utc_offset_minutes=60)"
    assert notice["seq"] < answer["seq"]
    # The plugin's tool was offered to the model, called, and its result went back.
    offered = [t["function"]["name"] for t in llm.requests[0]["tools"]]
    assert "webhook_time" in offered
    assert llm.requests[0]["messages"][-1]["content"].endswith("What time is it in Paris?")
    result = llm.requests[1]["messages"][-1]
    assert result["role"] == "tool" and result["tool_call_id"] == "call_1"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+01:00", result["content"])


def test_agentik_plugins_lists_the_installed_distribution(tmp_path):
    result = subprocess.run(
        [AGENTIK, "plugins"], cwd=tmp_path, env=clean_env(), capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert re.search(r"^webhook\s+plugin\s+agentik-webhook 0\.1\.0$", result.stdout, re.M)
    assert re.search(r"^transports:.*\bwebhook\b", result.stdout, re.M)
    assert re.search(r"^tools:.*\bwebhook_time\b", result.stdout, re.M)
    # AGENTIK_PLUGINS picks the third-party plugins that load: none here.
    only_builtin = subprocess.run(
        [AGENTIK, "plugins"], cwd=tmp_path, env=clean_env(AGENTIK_PLUGINS=""),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "webhook" not in only_builtin.stdout


def test_loading_the_plugin_does_not_import_its_web_framework(tmp_path):
    """agentik loads every installed plugin at start-up: a bot with no webhook transport
    does not pay for the transport's module (registered by name), nor for aiohttp,
    imported when a webhook transport starts (the tests above)."""
    script = (
        "import sys\n"
        "from agentik.core.plugins import load_plugins\n"
        "registry = load_plugins()\n"
        "loaded = 'agentik_webhook.transport' in sys.modules\n"
        "factory = registry.transports['webhook'].load()\n"
        "print(loaded, factory.__name__, 'aiohttp' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=clean_env(), capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "WebhookTransport", "False"]


def test_the_distribution_builds_a_wheel_with_its_entry_point(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(PACKAGE)],
        check=True, env={**os.environ, "PIP_NO_INPUT": "1"}, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("agentik_webhook-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"agentik_webhook/transport.py", "agentik_webhook/plugin.py"} <= names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[agentik]\nwebhook = agentik_webhook.plugin" in text
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA")))
    assert b"Requires-Dist: agentik>=0.1" in metadata


# -- the transport on its own ------------------------------------------------------------


class Inbox:
    """A message sink that keeps what the transport hands over."""

    def __init__(self) -> None:
        self.messages: list[IncomingMessage] = []

    async def handle(self, message: IncomingMessage, transport: Transport) -> None:
        self.messages.append(message)


async def started(callback_url: str, **settings) -> tuple[WebhookTransport, Inbox]:
    t = WebhookTransport(
        name="hook",
        settings={"port": 0, "callback_url": callback_url, "retry_delay": 0.01, **settings},
    )
    inbox = Inbox()
    await t.start(inbox)
    return t, inbox


async def test_bad_requests_are_refused_with_the_reason(tmp_path):
    async with CallbackServer() as callback:
        t, inbox = await started(callback.url, secret=SECRET, max_body_bytes=2048)
        try:
            good = {"user": "alice", "text": "hello"}
            body = json.dumps(good).encode()
            old = sign(SECRET, body, timestamp=int(time.time()) - 3600)
            cases = [
                (good, {}, 401, "missing X-Agentik-Timestamp"),
                (body, {**sign("wrong", body)}, 401, "the signature does not match"),
                (body, old, 401, "away from now"),
            ]
            for message, headers, status, why in cases:
                got, answer = await post(t.url, message, **headers)
                assert (got, why in answer["error"]) == (status, True), answer
            signed = [
                (b"{not json", 400, "the body is not JSON"),
                ({"user": "alice"}, 400, "text: required"),
                ({"user": "alice", "text": "hi", "colour": "red"}, 400, "colour: unknown field"),
                ({"user": "alice", "text": "  "}, 400, "text: must be a non-empty string"),
                ({"user": "a", "text": "hi", "channel": "a:b"}, 400, "channel: must not"),
                ({"user": "a", "text": "hi", "thread": "1"}, 400, "thread: needs a channel"),
                ({"user": "a", "text": "x" * 4096}, 413, "over 2048 bytes"),
            ]
            for message, status, why in signed:
                got, answer = await post(t.url, message, secret=SECRET)
                assert (got, why in answer["error"]) == (status, True), answer
            assert inbox.messages == []
        finally:
            await t.aclose()


async def test_addressing_channel_keys_and_duplicate_ids(tmp_path):
    async with CallbackServer() as callback:
        t, inbox = await started(callback.url)
        try:
            for message in (
                {"user": "bob", "text": "chatter", "channel": "ops"},
                {"user": "bob", "text": "@agentik deploy?", "channel": "ops", "id": "m1"},
                {"user": "bob", "text": "@agentik deploy?", "channel": "ops", "id": "m1"},
                {"user": "carol", "text": "Agentik, status", "channel": "ops", "thread": "7"},
                {"user": "alice", "text": "psst", "name": "Alice A."},
            ):
                status, _ = await post(t.url, message)
                assert status in (200, 202)
            seen = [(m.channel_key, m.text, m.addressed, m.direct, m.author_name)
                    for m in inbox.messages]  # fmt: skip
            assert seen == [
                ("webhook:hook:#ops", "chatter", False, False, "bob"),
                ("webhook:hook:#ops", "deploy?", True, False, "bob"),
                ("webhook:hook:#ops:7", "status", True, False, "carol"),
                ("webhook:hook:@alice", "psst", True, True, "Alice A."),
            ]
        finally:
            await t.aclose()


async def test_failed_callbacks_are_retried_and_order_is_kept(tmp_path, caplog):
    from agentik.transports.base import OutgoingMessage

    caplog.set_level(logging.INFO, logger="agentik_webhook")
    async with CallbackServer() as callback:
        # A chat webhook URL carries its token: it must not reach the log.
        t, _ = await started(callback.url + "?token=very-secret-token", retries=2)
        try:
            callback.fail_next = [503, 503]  # the first message succeeds on its 3rd try
            where = {"channel": "ops", "thread": None, "user": None}
            for text in ("one", "two"):
                await t.send(OutgoingMessage(channel_key="webhook:hook:#ops", text=text,
                                             reply_to=where))  # fmt: skip
            await callback.wait_for(lambda p: p["text"] == "two")
            assert [(p["seq"], p["text"]) for p in callback.received] == [(1, "one"), (2, "two")]
            # A receiver that refuses a message (4xx) is not retried; the next one still goes.
            callback.fail_next = [400]
            for text in ("three", "four"):
                await t.send(OutgoingMessage(channel_key="webhook:hook:#ops", text=text,
                                             reply_to=where))  # fmt: skip
            await callback.wait_for(lambda p: p["text"] == "four")
            assert [p["text"] for p in callback.received] == ["one", "two", "four"]
            assert "could not deliver message 3 (answer) to the callback URL: HTTP 400" in (
                caplog.text
            )
            assert "answers go to http://127.0.0.1:" in caplog.text
            assert "very-secret-token" not in caplog.text
        finally:
            await t.aclose()


def test_settings_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"transports\.hook\.callback_url"):
        WebhookTransport(name="hook", settings={})
    with pytest.raises(ConfigError, match=r"transports\.hook\.callback_url: .*http"):
        WebhookTransport(name="hook", settings={"callback_url": "ftp://x"})
    with pytest.raises(ConfigError, match=r"transports\.hook\.prot: unknown key"):
        WebhookTransport(name="hook", settings={"callback_url": "http://x", "prot": 1})


async def test_the_tool_refuses_an_impossible_offset():
    assert re.fullmatch(r"\d{4}-.*\+00:00", await webhook_time.fn())
    with pytest.raises(Exception, match="within ±24 hours"):
        await webhook_time.fn(utc_offset_minutes=5000)
