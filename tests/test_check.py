"""``agentik check``: the resolved setup, ``--probe`` against real local servers,
"did you mean", and commands that run without unrelated ``${VAR}``s.

The installed ``agentik`` runs as a subprocess; the servers it probes run in
the test: the fake OpenAI-compatible server, the fake Slack Web API, a real
IRC server (miniircd) and the real MCP test server.
"""

from __future__ import annotations

import asyncio
import functools
import subprocess
import sys
from pathlib import Path

import pytest

from agentik.core import SQLiteStore
from agentik.core.store.base import ConversationRecord
from agentik.core.testing.openai_server import FakeOpenAIServer
from helpers import agentik

from fakeslack import FakeSlack
from ircservers import free_port

pytest_plugins = ["ircservers"]

MCP_SERVER = str(Path(__file__).with_name("mcp_server.py"))
SLACK_TOKEN = "xoxb-test"  # FakeSlack's bot token
IRC_SECRET = "irc-pass-never-shown"


#: ``agentik`` without the Slack and IRC settings of this environment either.
run = functools.partial(agentik, drop=("SLACK_", "IRC_"), timeout=180)


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
    # HTTP mode has no use for an app token: it is not "missing".
    assert "  secrets: bot_token set, signing_secret missing\n" in result.stdout
    assert "xoxb-1" not in result.stdout
    socket_mode = write(
        tmp_path, '[transports.work]\ntype = "slack"\nbot_token = "xoxb-1"\napp_token = "xapp-1"\n'
    )
    result = run("check", "-c", socket_mode, cwd=tmp_path)
    assert "  secrets: bot_token set, app_token set\n" in result.stdout, result.stdout


def test_check_lists_no_optional_irc_secret_nor_the_api_key_of_another_backend(tmp_path):
    cfg = write(
        tmp_path,
        '[llm]\nbackend = "scripted"\n[transports.libera]\ntype = "irc"\nhost = "h"\n',
    )
    result = run("check", "-c", cfg, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "missing" not in result.stdout, result.stdout
    assert "llm.api_key" not in result.stdout


@pytest.mark.parametrize(
    ("tokens", "said"),
    [
        ('bot_token = "xapp-1-A0-secret"\napp_token = "xoxb-2-secret"',
         "bot_token: holds an app-level token (xapp-…); the bot token starts with xoxb-"),
        ('bot_token = "xoxb-2-secret"\napp_token = "xoxb-3-secret"',
         "app_token: holds a bot or user token (xox…); the app-level token starts with xapp-"),
        ('bot_token = "xoxp-4-secret"\napp_token = "xapp-1-A0-secret"',
         "bot_token: holds a user token (xoxp-…)"),
    ],
)  # fmt: skip
def test_check_refuses_slack_tokens_of_the_wrong_kind_naming_the_key(tmp_path, tokens, said):
    cfg = write(tmp_path, f'[transports.work]\ntype = "slack"\n{tokens}\n')
    result = run("check", "-c", cfg, cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"agentik: {cfg}: transports.work.{said}"), result.stderr
    if "xapp-…" in said or "xox…" in said:
        assert result.stderr.rstrip().endswith("bot_token and app_token swapped?"), result.stderr
    assert "secret" not in result.stderr


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


async def test_probe_of_tls_against_a_plain_text_port_says_set_tls_false(tmp_path, ngircd):
    """ngircd waits for a line that the TLS ClientHello never ends: the handshake
    hangs; the probe then gives the run-time hint instead of only "no answer"."""
    cfg = write(
        tmp_path,
        '[llm]\nbackend = "scripted"\n[transports.libera]\ntype = "irc"\nhost = "127.0.0.1"\n'
        f"port = {ngircd.port}\ntls = true\n",
    )
    result = await arun("check", "--probe", "--timeout", "5", "-c", cfg, cwd=tmp_path)
    assert result.returncode == 1
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("probe irc libera")]
    assert f"connect to 127.0.0.1:{ngircd.port} with TLS: no answer within 5s" in line
    assert line.endswith("the server answers in plain text on this port: set tls = false"
                         " (or use its TLS port, usually 6697)"), line  # fmt: skip


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


# -- named agents ------------------------------------------------------------------------------

AGENTS = f"""
[llm]
backend = "openai"
base_url = "http://127.0.0.1:9/v1"
model = "m"

[llm.profiles.cheap]
backend = "openai"
base_url = "http://127.0.0.1:9/v1"
model = "small"

[agent]
uses = ["researcher"]

[tools]
ask_user = true

[[mcp.servers]]
name = "web"
command = "{sys.executable}"
args = ["{MCP_SERVER}", "--transport", "stdio"]

[runs]
max_depth = 2
max_concurrent_children = 3

[agents.researcher]
description = "Looks things up."
model = "cheap"
tools = ["web__*", "memory_*", "ask_user"]
uses = ["critic"]
max_tool_calls = 5
time_budget = 60

[agents.critic]
description = "Finds holes."
memory = "none"
token_budget = 2000
max_concurrent_children = 1
input_schema = {{ type = "object", properties = {{ draft = {{ type = "string" }} }} }}
"""

MEMORY_TOOLS = "memory_save, memory_read, memory_list, memory_search, memory_delete"


def test_check_lists_the_agents_what_each_may_use_and_its_limits(tmp_path):
    result = run("check", "-c", write(tmp_path, AGENTS), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    start = lines.index("agents: 2; the main agent uses researcher")
    assert lines[start + 1 : start + 10] == [
        "  runs: max_depth 2, max_concurrent_children 3, token_budget none, tree_token_budget none",
        "agent researcher: Looks things up.",
        '  model cheap, memory caller, uses critic, input {"task": string}, answers in text',
        # Globs resolved over the tools the bot has; an MCP server's are known once it runs.
        f"  tools: web__* → tools of MCP server web; memory_* → {MEMORY_TOOLS};"
        " ask_user → ask_user",
        "  limits: max_tool_calls 5, time_budget 60s, token_budget none of its own,"
        " max_concurrent_children 3",
        "agent critic: Finds holes.",
        "  model the caller's, memory none, uses (none), input custom, answers in text",
        "  tools: (none)",
        "  limits: max_tool_calls the caller's, time_budget the caller's, token_budget 2000,"
        " max_concurrent_children 1",
    ]
    assert not [ln for ln in lines if "warning:" in ln or "note:" in ln]
    assert result.stderr == ""


WARNED = """
[agent]
uses = ["researcher"]

[tools]
ask_user = true

[[mcp.servers]]
name = "web"
command = "true"

[agents.researcher]
tools = ["web__*", "websearch", "ask_*"]
uses = ["critic"]

[agents.critic]
memory = "none"
tools = ["memory_read"]
uses = ["researcher", "deep"]

[agents.deep]

[agents.lonely]
"""


def test_check_warns_of_a_glob_matching_nothing_a_cycle_and_an_agent_that_never_runs(tmp_path):
    result = run("check", "-c", write(tmp_path, WARNED), cwd=tmp_path)
    # Warnings, not errors: the bot runs as configured.
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "  tools: web__* → tools of MCP server web; websearch → nothing; ask_* → ask_user" in out
    [warned] = [ln for ln in out.splitlines() if "'websearch'" in ln]
    assert warned.startswith("  warning: agents.researcher.tools: 'websearch' matches no tool")
    # It names the tools there are (installed plugins' first) and the MCP servers.
    assert warned.endswith(f"{MEMORY_TOOLS}, ask_user; MCP servers: web)")
    # An agent with memory = "none" gets no memory tools, whatever its globs say.
    assert "  tools: memory_read → nothing" in out
    assert "  warning: agents.critic.tools: 'memory_read' matches no tool" in out
    assert (
        "\nwarning: agents call each other in a cycle: researcher → critic → researcher"
        " (bounded by [runs] max_depth 2)\n"
    ) in out
    assert out.count("cycle") == 1
    # main → researcher (depth 1) → critic (2) → deep (3): past the default max_depth.
    assert (
        "  warning: deep runs at depth 3 at the earliest, past [runs] max_depth 2: it never runs"
    ) in out
    assert "  note: not reachable from [agent] uses: lonely never runs" in out
    assert "agent lonely: (no description)" in out


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (('uses = ["researcher"]', 'uses = ["researcher", "writer"]'),
         "agent.uses: no agent 'writer' (agents: researcher, critic)"),
        (('uses = ["critic"]', 'uses = ["critic", "ghost"]'),
         "agents.researcher.uses: no agent 'ghost' (agents: researcher, critic)"),
    ],
)  # fmt: skip
def test_check_refuses_a_uses_that_names_no_agent_as_run_does(tmp_path, change, error):
    cfg = write(tmp_path, AGENTS.replace(*change))
    result = run("check", "-c", cfg, cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"agentik: {cfg}: {error}\n"


# -- files the bot reads at start-up ---------------------------------------------------------


@pytest.mark.parametrize(
    ("toml", "error"),
    [
        ('[storage]\npath = "data/bot.db"\n', "storage.path: the folder {dir}/data does not exist"),
        ('[memory]\nbackend = "markdown"\npath = "notes.txt/notes"\n',
         "memory.path: cannot make the folder {dir}/notes.txt/notes: {dir}/notes.txt is not a"
         " folder"),
        ('[agent]\nsoul = "SOUL.md"\n', "agent.soul: cannot read '{dir}/SOUL.md': No such file"),
        ('[agent]\nskills = "skills"\n',
         "agent.skills: skills folder '{dir}/skills' does not exist"),
        ('[health]\nlisten = "127.0.0.1:0"\ntoken_file = "token.txt"\n',
         "health.token_file: cannot read {dir}/token.txt: No such file"),
        ('[health]\nlisten = "127.0.0.1:0"\ntoken_env = "AGENTIK_NO_SUCH_TOKEN"\n',
         "health.token_env: the environment variable AGENTIK_NO_SUCH_TOKEN is not set"),
        ('[transports.libera]\ntype = "irc"\nhost = "127.0.0.1"\nssl_ca_file = "{dir}/ca.pem"\n',
         "transports.libera.ssl_ca_file: "),
        ('[transports.libera]\ntype = "irc"\nhost = "127.0.0.1"\nsasl_mechanism = "external"\n'
         'client_cert = "{dir}/bot.pem"\n', "transports.libera.client_cert: "),
    ],
)  # fmt: skip
def test_check_refuses_a_file_the_bot_could_not_read_at_start_up(tmp_path, toml, error):
    """`check` said "valid" and exited 0 while `run` then stopped on the missing soul,
    skills folder or token (status 2) or its IRC network failed on a TLS file."""
    storage = "" if toml.startswith("[storage]") else '[storage]\npath = "bot.db"\n'
    body = '[llm]\nbackend = "scripted"\n' + storage + toml
    cfg = write(tmp_path, body.format(dir=tmp_path))
    (tmp_path / "notes.txt").write_text("a file where a folder should be\n")
    result = run("check", "-c", cfg, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith(f"agentik: {cfg}: {error.format(dir=tmp_path)}")
    # The same file with what it names in place is valid.
    (tmp_path / "notes.txt").unlink()
    for name in ("SOUL.md", "token.txt"):
        (tmp_path / name).write_text("a persona, or a token of 16+ characters\n")
    (tmp_path / "skills").mkdir()
    (tmp_path / "data").mkdir()
    if "ssl_ca_file" in toml or "client_cert" in toml:
        return  # a CA or a client certificate needs a real PEM: not made here
    env = {"AGENTIK_NO_SUCH_TOKEN": "a-token-of-16-characters"}
    fixed = run("check", "-c", cfg, cwd=tmp_path, env=env)
    assert fixed.returncode == 0, fixed.stderr
    assert "is valid" in fixed.stdout


@pytest.mark.parametrize(
    ("toml", "names"),
    [
        ('type = "irc"\nhost = "h"\nsasl_mechanism = "plain"\nsasl_username = "bot"\n',
         "sasl_password"),
        ('type = "slack"\nbot_token = "xoxb-1"\nmode = "socket"\n', "app_token"),
    ],
)  # fmt: skip
def test_a_check_of_a_whole_transport_table_names_the_table(tmp_path, toml, names):
    """A rule over several keys of a transport read "transports.libera.: …" (an empty key)."""
    cfg = write(tmp_path, '[llm]\nbackend = "scripted"\n[transports.libera]\n' + toml)
    result = run("check", "-c", cfg, cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"agentik: {cfg}: transports.libera: "), result.stderr
    assert names in result.stderr and "libera.:" not in result.stderr


def test_check_shows_the_http_address_the_bot_will_really_listen_on(tmp_path):
    """check showed the file's port under AGENTIK_PORT (which overrides it) and
    0.0.0.0 for an API without tokens (which listens on 127.0.0.1 only)."""
    cfg = write(
        tmp_path,
        '[llm]\nbackend = "scripted"\n[storage]\npath = "bot.db"\n'
        '[transports.web]\ntype = "http"\nhost = "0.0.0.0"\nport = 8080\n',
    )
    result = run("check", "-c", cfg, cwd=tmp_path, env={"AGENTIK_PORT": "9123"})
    assert result.returncode == 0, result.stderr
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("  host "))
    assert line.startswith(
        "  host 127.0.0.1 (not 0.0.0.0: without tokens the API is loopback only), port 9123,"
    )


def test_irc_tls_files_are_relative_to_the_configuration_file(tmp_path):
    """ssl_ca_file, client_cert and client_key were opened relative to the working
    directory (/var/lib/agentik under the systemd unit), unlike every other path in
    the file; a bot started elsewhere than the config's folder could not find them."""
    etc = tmp_path / "etc"
    etc.mkdir()
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "bot.key",
         "-out", "bot.pem", "-days", "2", "-subj", "/CN=agentik test"],
        check=True, capture_output=True, cwd=etc, timeout=120,
    )  # fmt: skip
    cfg = etc / "bot.toml"
    cfg.write_text(
        '[llm]\nbackend = "scripted"\n[storage]\npath = "bot.db"\n'
        '[transports.libera]\ntype = "irc"\nhost = "127.0.0.1"\nssl_ca_file = "bot.pem"\n'
        'sasl_mechanism = "external"\nclient_cert = "bot.pem"\nclient_key = "bot.key"\n'
    )
    elsewhere = tmp_path / "work"
    elsewhere.mkdir()
    result = run("check", "-c", str(cfg), cwd=elsewhere)
    assert result.returncode == 0, result.stderr
    (etc / "bot.key").unlink()
    result = run("check", "-c", str(cfg), cwd=elsewhere)
    assert result.returncode == 2
    assert f"transports.libera.client_cert: {etc / 'bot.pem'}, {etc / 'bot.key'}: " in result.stderr


@pytest.mark.parametrize(
    ("transports", "said"),
    [("", "transports: none configured: agentik run refuses to start"),
     ('[transports.t]\ntype = "stdio"\nenabled = false\n',
      "transports: none enabled: agentik run refuses to start")],
)  # fmt: skip
def test_check_says_when_run_would_refuse_for_want_of_a_transport(tmp_path, transports, said):
    """check passed such a file with no word of it; run then exited 2 ("no transport is
    enabled"). The file is still valid (agentik chat adds a terminal): a line says so."""
    cfg = write(tmp_path, '[llm]\nbackend = "scripted"\n[storage]\npath = "bot.db"\n' + transports)
    result = run("check", "-c", cfg, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert said in result.stdout
    refused = run("run", "-c", cfg, cwd=tmp_path)
    assert refused.returncode == 2 and "no transport is enabled" in refused.stderr


@pytest.mark.parametrize(
    ("toml", "env", "error"),
    [
        ('[llm]\nbackend = "olama"\n', {},
         "llm.backend: unknown LLM backend 'olama' (did you mean 'llamacpp'?) (registered: "),
        ('[llm]\nbackend = "scripted"\n[llm.profiles.fast]\nbackend = "opnai"\n', {},
         "llm.profiles.fast.backend: unknown LLM backend 'opnai' (did you mean 'openai'?)"),
        ("", {"AGENTIK_LLM_BACKEND": "opnai"},
         "llm.backend: unknown LLM backend 'opnai' (set by AGENTIK_LLM_BACKEND, which"
         " overrides the file)"),
    ],
)  # fmt: skip
def test_an_unknown_llm_backend_names_the_file_and_key(tmp_path, toml, env, error):
    """A typo'd backend read only "agentik: unknown LLM backend 'olama' (registered: …)":
    no file, no key, nothing about the environment variable that set it."""
    cfg = write(tmp_path, toml)
    for command in ("check", "run"):
        result = run(command, "-c", cfg, cwd=tmp_path, env=env)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith(f"agentik: {cfg}: {error}"), result.stderr


@pytest.mark.parametrize(
    ("toml", "env", "error"),
    [
        ('[plugins]\nload = ["no-such-plugin"]\n', {},
         "{cfg}: plugins.load: no installed plugin is named 'no-such-plugin' (installed plugins:"),
        ("", {"AGENTIK_PLUGINS": "no-such-plugin"},
         "AGENTIK_PLUGINS: no installed plugin is named 'no-such-plugin' (installed plugins:"),
    ],
)  # fmt: skip
def test_a_plugin_to_load_that_is_not_installed_is_an_error(tmp_path, toml, env, error):
    """[plugins] load named a plugin that is not installed (config.example.toml's own
    example, "agentik-webhook", is the distribution, not the plugin's name), and the bot
    started without it, silently: its hooks (a moderation plugin, say) did not run."""
    cfg = write(tmp_path, '[llm]\nbackend = "scripted"\n[transports.t]\ntype = "stdio"\n' + toml)
    for command in ("check", "run"):
        result = run(command, "-c", cfg, cwd=tmp_path, env=env)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("agentik: " + error.format(cfg=cfg)), result.stderr


REMOTE = """
[llm]
backend = "scripted"

[agent]
uses = ["helpdesk"]

[agents.helpdesk]
description = "Another bot."
url = "http://127.0.0.1:8081/"
token_env = "HELPDESK_TOKEN_FOR_CHECK"
token_budget = 500
"""


def test_check_shows_a_remote_agent_where_it_runs_and_an_unset_token(tmp_path):
    result = run("check", "-c", write(tmp_path, REMOTE), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    start = lines.index("agent helpdesk: Another bot.")
    assert lines[start + 1 : start + 3] == [
        "  remote: http://127.0.0.1:8081/agentik (token from $HELPDESK_TOKEN_FOR_CHECK),"
        " token_budget 500",
        "  warning: agents.helpdesk.token_env: environment variable HELPDESK_TOKEN_FOR_CHECK"
        " is not set",
    ]


def test_check_shows_an_a2a_agent_where_it_runs(tmp_path):
    config = REMOTE.replace('url = "http://127.0.0.1:8081/"', 'a2a_url = "http://127.0.0.1:8082/"')
    result = run("check", "-c", write(tmp_path, config), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    start = lines.index("agent helpdesk: Another bot.")
    assert lines[start + 1] == (
        "  A2A: http://127.0.0.1:8082 (token from $HELPDESK_TOKEN_FOR_CHECK), token_budget 500"
    )
