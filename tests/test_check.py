"""``agentik check``: the resolved setup, ``--probe`` against real local servers,
"did you mean", and commands that run without unrelated ``${VAR}``s.

The installed ``agentik`` runs as a subprocess; the servers it probes run in
the test: the fake OpenAI-compatible server, the fake Slack Web API, a real
IRC server (miniircd) and the real MCP test server.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentik.core import SQLiteStore
from agentik.core.store.base import ConversationRecord
from agentik.core.testing.openai_server import FakeOpenAIServer
from helpers import AGENTIK

from fakeslack import FakeSlack
from ircservers import free_port

pytest_plugins = ["ircservers"]

MCP_SERVER = str(Path(__file__).with_name("mcp_server.py"))
SLACK_TOKEN = "xoxb-test"  # FakeSlack's bot token
IRC_SECRET = "irc-pass-never-shown"


def run(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OPENAI_", "AGENTIK_", "SLACK_", "IRC_"))
    }
    return subprocess.run(
        [AGENTIK, *args],
        cwd=cwd,
        env={**base, **(env or {})},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,  # only guards against a hang
    )


async def arun(*args: str, cwd: Path, env: dict[str, str] | None = None):
    """:func:`run` off the event loop (the servers it talks to live on it)."""
    return await asyncio.to_thread(run, *args, cwd=cwd, env=env)


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "bot.toml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def closed_port() -> int:
    return free_port()  # nothing listens on it


def setup_toml(*, llm_url: str, model: str, irc_port: int, slack_api: str, mcp: str) -> str:
    return f"""
[llm]
backend = "openai"
base_url = "{llm_url}"
model = "{model}"
api_key = "sk-local"

[transports.libera]
type = "irc"
host = "127.0.0.1"
port = {irc_port}
tls = false
nick = "probebot"
channels = ["#ops", "#dev"]
password = "${{IRC_PASSWORD}}"

[transports.work]
type = "slack"
bot_token = "${{SLACK_BOT_TOKEN}}"
app_token = "xapp-test"
api_url = "{slack_api}"

{mcp}

[[approvals]]
tools = ["test__*"]
approve = "first-use"

[budgets.user]
tokens_per_day = 50000

[access]
admins = ["libera:account:alice"]

[[access.rules]]
channels = ["irc:libera:#dev"]
tools = []

[channels."irc:libera:#ops"]
answer = "direct"
"""


GOOD_MCP = f"""
[[mcp.servers]]
name = "test"
command = "{sys.executable}"
args = ["{MCP_SERVER}", "--transport", "stdio"]
"""


# -- the setup ---------------------------------------------------------------------------------


def test_check_shows_the_resolved_setup_and_never_a_secret(tmp_path):
    cfg = write(
        tmp_path,
        setup_toml(
            llm_url="http://127.0.0.1:9/v1", model="m", irc_port=6667,
            slack_api="http://127.0.0.1:9/api/", mcp=GOOD_MCP,
        ),
    )  # fmt: skip
    env = {"IRC_PASSWORD": IRC_SECRET, "SLACK_BOT_TOKEN": "xoxb-secret-value"}
    result = run("check", "-c", cfg, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "transport libera: irc" in out
    assert "host 127.0.0.1, port 6667, tls False" in out
    assert "channels #ops, #dev" in out
    assert "password set" in out
    assert "transport work: slack" in out and "bot_token set, app_token set" in out
    assert f"mcp test: command {sys.executable} {MCP_SERVER} --transport stdio" in out
    assert "memory: backend 'sqlite'" in out
    assert "approvals: 1 rule(s)" in out and "test__*: first-use, by admin" in out
    assert "budgets: limits for user" in out
    assert "  admins: libera:account:alice" in out
    assert "  rule: channels irc:libera:#dev; roles *; tools (none)" in out
    assert "\"irc:libera:#ops\": answer='direct'" in out
    for secret in (IRC_SECRET, "xoxb-secret-value", "xapp-test", "sk-local"):
        assert secret not in out + result.stderr


def test_check_names_every_unset_variable_in_one_line_and_exits_2(tmp_path):
    cfg = write(
        tmp_path,
        setup_toml(
            llm_url="http://127.0.0.1:9/v1", model="m", irc_port=6667,
            slack_api="http://127.0.0.1:9/api/", mcp="",
        ),
    )  # fmt: skip
    result = run("check", "-c", cfg, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"agentik: {cfg}: transports.libera.password: environment variable IRC_PASSWORD is not"
        " set; every unset one: IRC_PASSWORD (transports.libera.password), SLACK_BOT_TOKEN"
        " (transports.work.bot_token) (write ${VAR:-default} to make one optional)"
    ]


def test_check_says_which_secrets_are_missing(tmp_path):
    cfg = write(
        tmp_path,
        '[transports.work]\ntype = "slack"\nmode = "http"\nbot_token = "xoxb-1"\n'
        'signing_secret = "${SIGNING:-}"\n',
    )
    result = run("check", "-c", cfg, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "secrets: bot_token set, app_token missing, signing_secret missing" in result.stdout
    assert "xoxb-1" not in result.stdout


# -- --probe -----------------------------------------------------------------------------------


async def test_probe_succeeds_against_local_servers(tmp_path, miniircd):
    async with FakeOpenAIServer(model="fake-model") as llm, FakeSlack() as slack:
        cfg = write(
            tmp_path,
            setup_toml(
                llm_url=llm.base_url, model="fake-model", irc_port=miniircd.port,
                slack_api=slack.api_url, mcp=GOOD_MCP,
            ),
        )  # fmt: skip
        env = {"IRC_PASSWORD": IRC_SECRET, "SLACK_BOT_TOKEN": SLACK_TOKEN}
        result = await arun("check", "--probe", "--timeout", "60", "-c", cfg, cwd=tmp_path, env=env)
        assert [c for c, _ in slack.calls if c == "auth.test"] == ["auth.test"]
    assert result.returncode == 0, result.stdout + result.stderr
    probes = [line for line in result.stdout.splitlines() if line.startswith("probe ")]
    assert len(probes) == 4, probes
    assert all(": ok: " in line for line in probes), probes
    out = result.stdout
    assert f"probe model: ok: {llm.base_url} serves model 'fake-model'" in out
    assert "probe mcp test: ok: started, " in out
    n_tools = int(out.split("probe mcp test: ok: started, ")[1].split(" ")[0])
    assert n_tools >= 3
    assert f"probe irc libera: ok: 127.0.0.1:{miniircd.port} accepts connections" in out
    assert "probe slack work: ok: bot_token valid: team 'Fake Team', bot user UBOT" in out
    assert IRC_SECRET not in out + result.stderr and SLACK_TOKEN not in out + result.stderr


async def test_probe_names_each_failure(tmp_path):
    missing_cmd = "agentik-no-such-mcp-server"
    mcp = f"""
[[mcp.servers]]
name = "absent"
command = "{missing_cmd}"

[[mcp.servers]]
name = "quits"
command = "{sys.executable}"
args = ["-c", "import sys; sys.exit(3)"]
"""
    llm_port, irc_port = closed_port(), closed_port()
    async with FakeSlack() as slack:
        cfg = write(
            tmp_path,
            setup_toml(
                llm_url=f"http://127.0.0.1:{llm_port}/v1", model="m", irc_port=irc_port,
                slack_api=slack.api_url, mcp=mcp,
            ),
        )  # fmt: skip
        env = {"IRC_PASSWORD": IRC_SECRET, "SLACK_BOT_TOKEN": "xoxb-wrong-token"}
        result = await arun("check", "--probe", "--timeout", "20", "-c", cfg, cwd=tmp_path,
                            env=env)  # fmt: skip
    assert result.returncode == 1
    lines = {
        line.split(":", 1)[0]: line
        for line in result.stdout.splitlines()
        if line.startswith("probe ")
    }
    assert set(lines) == {
        "probe model", "probe mcp absent", "probe mcp quits", "probe irc libera",
        "probe slack work",
    }  # fmt: skip
    assert all(": FAILED: " in line for line in lines.values()), lines
    assert (
        f"GET http://127.0.0.1:{llm_port}/v1/models: endpoint unreachable" in lines["probe model"]
    )
    assert f"command '{missing_cmd}' not found" in lines["probe mcp absent"]
    assert "on PATH" in lines["probe mcp absent"]
    assert "server did not start" in lines["probe mcp quits"]
    assert f"connect to 127.0.0.1:{irc_port}: Connection refused" in lines["probe irc libera"]
    assert "refused the bot_token: invalid_auth" in lines["probe slack work"]
    assert "5 of 5 probe(s) failed" in result.stderr
    assert "xoxb-wrong-token" not in result.stdout + result.stderr
    assert IRC_SECRET not in result.stdout + result.stderr


async def test_probe_of_a_model_the_endpoint_does_not_know(tmp_path):
    async with FakeOpenAIServer(model="fake-model") as llm:
        cfg = write(
            tmp_path,
            f'[llm]\nbackend = "openai"\nbase_url = "{llm.base_url}"\nmodel = "gpt-nope"\n',
        )
        result = await arun("check", "--probe", "-c", cfg, cwd=tmp_path)
    assert result.returncode == 1
    assert (
        f"probe model: FAILED: model 'gpt-nope' is not known to {llm.base_url}"
        " (it serves: fake-model)"
    ) in result.stdout


def test_a_local_model_file_that_is_not_there_is_named(tmp_path):
    cfg = write(tmp_path, '[llm]\nbackend = "llamacpp"\nmodel_path = "models/missing.gguf"\n')
    result = run("check", "--probe", "-c", cfg, cwd=tmp_path)
    assert result.returncode == 2
    assert "llm.model_path" in result.stderr
    assert str(tmp_path / "models" / "missing.gguf") in result.stderr


# -- did you mean ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("toml", "key", "suggestion"),
    [
        ('channel = {}\n', "channel", "channels"),
        ('[transports.libera]\ntype = "irc"\nchannel = ["#a"]\n', "transports.libera.channel",
         "channels"),
        ('[agent]\nsytem_prompt = "hi"\n', "agent.sytem_prompt", "system_prompt"),
        ('[[mcp.servers]]\nname = "x"\ncomand = "y"\n', "mcp.servers.0.comand", "command"),
        ('[llm]\nbackend = "openai"\nbase_url = "http://h/v1"\nmodle = "m"\n', "llm.modle",
         "model"),
    ],
)  # fmt: skip
def test_unknown_keys_get_a_did_you_mean(tmp_path, toml, key, suggestion):
    result = run("check", "-c", write(tmp_path, toml), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert f"{key}: unknown key (did you mean '{suggestion}'?)" in result.stderr


def test_an_unknown_key_like_nothing_known_gets_no_guess(tmp_path):
    result = run("check", "-c", write(tmp_path, "[agent]\nzzzqqq = 1\n"), cwd=tmp_path)
    assert result.returncode == 2
    assert "agent.zzzqqq: unknown key" in result.stderr
    assert "did you mean" not in result.stderr


# -- commands that need no transport secrets ---------------------------------------------------


SLACK_ONLY = """
[storage]
path = "bot.db"

[transports.work]
type = "slack"
bot_token = "${SLACK_BOT_TOKEN}"
app_token = "${SLACK_APP_TOKEN}"
"""


async def test_conversations_list_runs_without_an_unrelated_slack_token(tmp_path):
    async with SQLiteStore(str(tmp_path / "bot.db")) as store:
        await store.create_conversation(
            ConversationRecord(id="c-1", title="hello there", created_at=1.0, updated_at=1.0)
        )
    cfg = write(tmp_path, SLACK_ONLY)
    for command in (
        ["conversations", "list"],
        ["memory", "list"],
        ["db", "check"],
        ["access", "roles"],
    ):
        result = await arun(*command, "-c", cfg, cwd=tmp_path)
        assert result.returncode == 0, (command, result.stderr)
        assert "SLACK_BOT_TOKEN" not in result.stderr
    result = await arun("conversations", "list", "-c", cfg, cwd=tmp_path)
    assert "c-1" in result.stdout and "hello there" in result.stdout
    # Running the bot does need it, and says which one.
    result = await arun("run", "-c", cfg, cwd=tmp_path)
    assert result.returncode == 2
    assert "transports.work.bot_token: environment variable SLACK_BOT_TOKEN is not set" in (
        result.stderr
    )


def test_a_variable_the_command_uses_is_still_required(tmp_path):
    cfg = write(tmp_path, '[storage]\npath = "${AGENTIK_TEST_DB}"\n')
    result = run("conversations", "list", "-c", cfg, cwd=tmp_path)
    assert result.returncode == 2
    assert "storage.path: environment variable AGENTIK_TEST_DB is not set" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bot.toml"]
