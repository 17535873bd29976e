"""The installed ``agentik`` command, run as a subprocess against real files."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from agentik.bot.cli import COMMANDS
from agentik.core import Agent, SQLiteStore
from agentik.core.testing.scripted import ScriptedModel
from helpers import AGENTIK, agentik, clean_env, manual_text

ROOT = Path(__file__).resolve().parent.parent
SECRET = "sk-very-secret-123"
OPENAI_ENV = {
    "OPENAI_API_KEY": SECRET,
    "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
    "OPENAI_MODEL": "m",
}


def write_config(tmp_path: Path, text: str, name: str = "bot.toml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def assert_one_line_error(result: subprocess.CompletedProcess[str], status: int) -> str:
    assert result.returncode == status, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("agentik: ")
    return lines[0]


def test_version(tmp_path):
    result = agentik("--version", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout.strip() == f"agentik {importlib.metadata.version('agentik')}"


def test_no_command_prints_help(tmp_path):
    result = agentik(cwd=tmp_path)
    assert result.returncode == 0
    for command in ("run", "chat", "check", "conversations", "plugins"):
        assert command in result.stdout


# -- configuration errors: exit 2, one line naming the key ----------------------------------

BAD_CONFIGS = {
    "unknown key": ('[llm]\nmodle = "x"\n', "llm.modle", "unknown key"),
    "wrong type": ('[llm]\ntimeout = "soon"\n', "llm.timeout", "soon"),
    "missing required": ("[transports.t]\nenabled = true\n", "transports.t.type", "missing"),
    "bad transport setting": (
        '[transports.t]\ntype = "stdio"\nbogus = 1\n',
        "transports.t.bogus",
        "unknown key",
    ),
    "unset variable": (
        '[agent]\nsystem_prompt = "${NOT_SET_ANYWHERE}"\n',
        "agent.system_prompt",
        "NOT_SET_ANYWHERE",
    ),
}


@pytest.mark.parametrize("command", ["check", "run", "chat"])
@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_config_exits_2_with_one_line_naming_the_key(tmp_path, command, case):
    text, key, what = BAD_CONFIGS[case]
    config = write_config(tmp_path, text + f'[storage]\npath = "{tmp_path / "bot.db"}"\n')
    result = agentik(command, "-c", config, cwd=tmp_path)
    line = assert_one_line_error(result, 2)
    assert config in line and key in line and what in line
    assert result.stdout == ""
    # Nothing was started: no database was created.
    assert not (tmp_path / "bot.db").exists()


@pytest.mark.parametrize("command", ["check", "run"])
def test_invalid_toml_exits_2(tmp_path, command):
    config = write_config(tmp_path, '[llm\nmodel = "x"\n')
    line = assert_one_line_error(agentik(command, "-c", config, cwd=tmp_path), 2)
    assert config in line and "not valid TOML" in line


@pytest.mark.parametrize("command", ["check", "chat"])
def test_missing_config_file_exits_2(tmp_path, command):
    missing = str(tmp_path / "nowhere.toml")
    line = assert_one_line_error(agentik(command, "-c", missing, cwd=tmp_path), 2)
    assert missing in line and "no such configuration file" in line


def test_a_missing_default_config_file_says_how_to_name_one(tmp_path):
    """After `make run` (config.example.toml) a plain `agentik conversations list`
    looks for config.toml: the error says how to point it at a file."""
    line = assert_one_line_error(agentik("conversations", "list", cwd=tmp_path), 2)
    assert "config.toml: no such configuration file" in line
    assert "-c FILE" in line and "AGENTIK_CONFIG" in line


def test_openai_backend_without_a_model_exits_2(tmp_path):
    config = write_config(tmp_path, "")
    result = agentik("check", "-c", config, cwd=tmp_path, env={"OPENAI_API_KEY": SECRET})
    line = assert_one_line_error(result, 2)
    assert "llm.model" in line and "OPENAI_MODEL" in line
    assert SECRET not in line


# -- check ------------------------------------------------------------------------------------


def test_check_shows_the_openai_backend_and_masks_the_key(tmp_path):
    config = write_config(tmp_path, '[storage]\npath = ":memory:"\n')
    result = agentik("check", "-c", config, cwd=tmp_path, env=OPENAI_ENV)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"{config} is valid" in out
    assert "backend 'openai'" in out
    assert "model 'm'" in out
    assert "http://127.0.0.1:9/v1" in out
    key_lines = [line for line in out.splitlines() if line.startswith("llm.api_key")]
    assert key_lines == ["llm.api_key: **********"]
    assert SECRET not in out and SECRET not in result.stderr


def test_check_of_the_example_config_with_the_key_in_the_environment(tmp_path):
    result = agentik("check", "-c", str(ROOT / "config.example.toml"), cwd=tmp_path, env=OPENAI_ENV)
    assert result.returncode == 0, result.stderr
    assert "backend 'openai'" in result.stdout and "model 'm'" in result.stdout
    assert "transport terminal: stdio" in result.stdout
    assert SECRET not in result.stdout + result.stderr


def test_check_without_the_local_extra_says_backend_none_and_how_to_install_it(tmp_path):
    # The real CLI in a process where llama-cpp-python cannot be imported.
    hide = (
        "import sys; sys.modules['llama_cpp'] = None; "
        "from agentik.bot.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    config = write_config(tmp_path, "")
    result = subprocess.run(
        [sys.executable, "-c", hide, "check", "-c", config],
        cwd=tmp_path,
        env=clean_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "backend 'none' (configured 'auto')" in result.stdout
    assert "note: the local model needs llama-cpp-python" in result.stdout
    assert "agentik[local]" in result.stdout
    assert "llm.api_key" not in result.stdout  # no key of a backend not in use
    assert "transports: none configured" in result.stdout


def test_check_reads_agentik_config_by_default(tmp_path):
    config = write_config(tmp_path, '[agent]\nname = "ada"\n', name="elsewhere.toml")
    result = agentik("check", cwd=tmp_path, env={"AGENTIK_CONFIG": config})
    assert result.returncode == 0, result.stderr
    assert "agent: ada" in result.stdout


@pytest.mark.parametrize(
    "flags", [["-v"], ["-vv"], ["--log-level", "debug"]], ids=["-v", "-vv", "debug"]
)
@pytest.mark.parametrize("fmt", ["text", "json"])
def test_verbose_check_never_logs_the_secret(tmp_path, flags, fmt):
    config = write_config(tmp_path, f'[storage]\npath = ":memory:"\n[logging]\nformat = "{fmt}"\n')
    result = agentik(*flags, "check", "-c", config, cwd=tmp_path, env=OPENAI_ENV)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert SECRET not in result.stderr and SECRET not in result.stdout


# -- plugins ----------------------------------------------------------------------------------


def test_plugins_lists_the_builtins_and_their_distribution(tmp_path):
    config = write_config(tmp_path, "")
    result = agentik("plugins", "-c", config, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    version = importlib.metadata.version("agentik")
    lines = result.stdout.splitlines()
    for name in ("openai", "stdio", "scripted"):
        (line,) = [line for line in lines if line.split()[:1] == [name]]
        assert f"agentik {version}" in line
    backends = next(line for line in lines if line.startswith("llm backends:"))
    assert "openai" in backends and "scripted" in backends
    transports = next(line for line in lines if line.startswith("transports:"))
    assert "stdio" in transports


def test_plugins_needs_no_configuration_file(tmp_path):
    result = agentik("plugins", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "stdio" in result.stdout and "openai" in result.stdout


def test_plugins_reads_config_toml_when_there_is_one(tmp_path):
    write_config(tmp_path, '[plugins]\nlod = ["x"]\n', name="config.toml")
    line = assert_one_line_error(agentik("plugins", cwd=tmp_path), 2)
    assert "config.toml" in line and "plugins.lod" in line


def test_plugins_with_an_explicit_missing_file_exits_2(tmp_path):
    missing = str(tmp_path / "nowhere.toml")
    line = assert_one_line_error(agentik("plugins", "-c", missing, cwd=tmp_path), 2)
    assert missing in line


# -- conversations ---------------------------------------------------------------------------

TITLE = "Arithmetic with friends"
EXCHANGE = [
    ("user", "alice", "hi there"),
    ("assistant", None, "Hello alice!"),
    ("user", "bob", "what is 2+2?"),
    ("assistant", None, "Four."),
]


async def _make_database(path: str) -> tuple[str, str]:
    model = ScriptedModel(["Hello alice!", "Four.", "Kept."])
    async with Agent(llm=model, store=SQLiteStore(path)) as agent:
        conv = await agent.conversation_for_channel("stdio:local", title=TITLE)
        await conv.send("hi there", author="alice")
        await conv.wait_idle()
        await conv.send("what is 2+2?", author="bob")
        await conv.wait_idle()
        other = await agent.create_conversation(title="Another chat")
        await other.send("keep me", author="carol")
        await other.wait_idle()
        return conv.id, other.id


@pytest.fixture
def stored(tmp_path):
    """A real SQLite database with two conversations, and a config pointing at it."""
    db = tmp_path / "history.db"
    conv_id, other_id = asyncio.run(_make_database(str(db)))
    config = write_config(tmp_path, f'[storage]\npath = "{db}"\n')
    return config, db, conv_id, other_id


def test_conversations_list_shows_ids_titles_and_sizes(tmp_path, stored):
    config, _, conv_id, other_id = stored
    result = agentik("conversations", "list", "-c", config, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if conv_id in line]
    assert line.startswith(conv_id) and line.endswith(f"{TITLE}  ← stdio:local")
    assert "4 msgs" in line
    (other,) = [line for line in result.stdout.splitlines() if other_id in line]
    assert other.endswith("Another chat") and "2 msgs" in other


def test_conversations_show_prints_messages_with_authors(tmp_path, stored):
    config, _, conv_id, _ = stored
    result = agentik("conversations", "show", conv_id, "-c", config, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = [re.sub(r"^\[\d\d:\d\d:\d\d\] ", "", line) for line in result.stdout.splitlines()]
    assert lines == [
        "alice: hi there",
        "assistant: Hello alice!",
        "bob: what is 2+2?",
        "assistant: Four.",
    ]


def test_chat_text_reaches_the_operators_terminal_as_text_not_commands(tmp_path):
    """A title, a nick and a message from a chat (or a model) holding terminal
    escapes and bidi overrides: ``list`` and ``show`` print them escaped."""
    db = tmp_path / "hostile.db"
    hostile = "look\x1b]0;pwned\x07 \x1b[2J\x9b31m \u202eevil\u202c"

    async def make() -> str:
        model = ScriptedModel(["ok " + hostile])
        async with Agent(llm=model, store=SQLiteStore(str(db))) as agent:
            conv = await agent.create_conversation(title="#chan" + hostile)
            await conv.send("hi " + hostile, author="nick\x1b[31m")
            await conv.wait_idle()
            return conv.id

    conv_id = asyncio.run(make())
    config = write_config(tmp_path, f'[storage]\npath = "{db}"\n')
    listed = agentik("conversations", "list", "-c", config, cwd=tmp_path)
    shown = agentik("conversations", "show", conv_id, "-c", config, cwd=tmp_path)
    for result in (listed, shown):
        assert result.returncode == 0, result.stderr
        assert not set(result.stdout) & set("\x1b\x07\x9b\u202e\u202c"), result.stdout
    assert "#chanlook\\x1b]0;pwned\\x07 \\x1b[2J\\x9b31m \\u202eevil\\u202c" in listed.stdout
    assert "nick\\x1b[31m: hi look\\x1b]0;pwned" in shown.stdout
    assert "assistant: ok look\\x1b" in shown.stdout
    # The JSON export keeps the text exactly (it is data, and it is imported back).
    exported = agentik("conversations", "export", conv_id, "-c", config, cwd=tmp_path)
    assert json.loads(exported.stdout)["conversation"]["title"] == "#chan" + hostile


def test_conversations_export_json_has_the_messages_in_order(tmp_path, stored):
    config, _, conv_id, _ = stored
    result = agentik(
        "conversations", "export", conv_id, "--format", "json", "-c", config, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["conversation"]["id"] == conv_id
    assert doc["conversation"]["title"] == TITLE
    assert doc["conversation"]["meta"]["channel_key"] == "stdio:local"
    messages = doc["messages"]
    assert [(m["kind"], m["author"], m["content"]) for m in messages] == EXCHANGE
    assert [m["id"] for m in messages] == sorted(m["id"] for m in messages)
    assert all(m["conversation_id"] == conv_id for m in messages)


def test_conversations_export_defaults_to_json(tmp_path, stored):
    config, _, conv_id, _ = stored
    result = agentik("conversations", "export", conv_id, "-c", config, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["messages"]) == 4


def test_conversations_export_markdown(tmp_path, stored):
    config, _, conv_id, _ = stored
    result = agentik(
        "conversations", "export", conv_id, "--format", "markdown", "-c", config, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert lines == [
        f"# {TITLE}",
        "**alice**: hi there",
        "**assistant**: Hello alice!",
        "**bob**: what is 2+2?",
        "**assistant**: Four.",
    ]


def test_conversations_rm_deletes_every_row_of_that_conversation_only(tmp_path, stored):
    config, db, conv_id, other_id = stored
    result = agentik("conversations", "rm", conv_id, "-c", config, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert conv_id in result.stdout

    listing = agentik("conversations", "list", "-c", config, cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    assert conv_id not in listing.stdout
    assert other_id in listing.stdout

    con = sqlite3.connect(db)
    try:
        for table in ("conversation", "channel_binding", "message", "working_memory"):
            column = "id" if table == "conversation" else "conversation_id"
            (left,) = con.execute(
                f"SELECT count(*) FROM {table} WHERE {column} = ?", (conv_id,)
            ).fetchone()
            assert left == 0, table
        (kept,) = con.execute(
            "SELECT count(*) FROM message WHERE conversation_id = ?", (other_id,)
        ).fetchone()
        assert kept == 2
    finally:
        con.close()

    again = agentik("conversations", "show", conv_id, "-c", config, cwd=tmp_path)
    assert conv_id in assert_one_line_error(again, 1)


@pytest.mark.parametrize(
    "action", [["show"], ["export"], ["export", "--format", "markdown"], ["rm"]]
)
def test_unknown_conversation_exits_1_with_one_line(tmp_path, stored, action):
    config = stored[0]
    result = agentik(
        "conversations", action[0], "no-such-id", *action[1:], "-c", config, cwd=tmp_path
    )
    line = assert_one_line_error(result, 1)
    assert "no-such-id" in line
    assert result.stdout == ""


def test_conversations_take_a_unique_prefix_or_a_channel_key_and_list_marks_the_binding(
    tmp_path, stored
):
    """As git takes short hashes: show, export and redact take a unique id prefix or
    the channel key a conversation is bound to; an ambiguous prefix names the
    candidates; ``list`` shows which channel is bound to which conversation."""
    from agentik.core import ConversationRecord

    config, db, conv_id, other_id = stored

    async def twins() -> None:
        async with SQLiteStore(str(db)) as store:
            for suffix in ("1", "2"):
                await store.create_conversation(ConversationRecord(id="abcd" + "0" * 27 + suffix))

    asyncio.run(twins())
    full = agentik("conversations", "show", conv_id, "-c", config, cwd=tmp_path).stdout
    assert "alice: hi there" in full
    for ref in (conv_id[:8], "stdio:local"):
        shown = agentik("conversations", "show", ref, "-c", config, cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout == full
        exported = agentik("conversations", "export", ref, "-c", config, cwd=tmp_path)
        assert json.loads(exported.stdout)["conversation"]["id"] == conv_id
    with sqlite3.connect(db) as conn:
        (first,) = conn.execute(
            "SELECT min(id) FROM message WHERE conversation_id = ?", (other_id,)
        ).fetchone()
    redacted = agentik(
        "conversations", "redact", other_id[:10], str(first), "-c", config, cwd=tmp_path
    )  # fmt: skip
    assert redacted.returncode == 0, redacted.stderr
    assert other_id in redacted.stdout

    ambiguous = agentik("conversations", "show", "abcd", "-c", config, cwd=tmp_path)
    line = assert_one_line_error(ambiguous, 1)
    assert "'abcd' is ambiguous" in line and "abcd" + "0" * 27 + "1" in line
    assert ambiguous.stdout == ""
    unbound = agentik("conversations", "show", "irc:libera:#none", "-c", config, cwd=tmp_path)
    assert "no conversation is bound to channel 'irc:libera:#none'" in assert_one_line_error(
        unbound, 1
    )
    # Deleting is never by prefix.
    kept = agentik("conversations", "rm", conv_id[:8], "-c", config, cwd=tmp_path)
    assert_one_line_error(kept, 1)

    listed = agentik("conversations", "list", "-c", config, cwd=tmp_path).stdout.splitlines()
    (line,) = [row for row in listed if row.startswith(conv_id)]
    assert line.endswith("← stdio:local")
    (other,) = [row for row in listed if row.startswith(other_id)]
    assert "←" not in other


@pytest.mark.parametrize("action", [["list"], ["show", "x"], ["rm", "x"]])
def test_missing_database_exits_2_and_creates_nothing(tmp_path, action):
    db = tmp_path / "absent.db"
    config = write_config(tmp_path, f'[storage]\npath = "{db}"\n')
    result = agentik("conversations", *action, "-c", config, cwd=tmp_path)
    line = assert_one_line_error(result, 2)
    assert "storage.path" in line and str(db) in line
    assert not db.exists()


# -- documentation ---------------------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_is_in_the_manual(command):
    manual = manual_text()
    pattern = r"\bagentik\s+" + r"\s+".join(map(re.escape, command.split())) + r"\b"
    assert re.search(pattern, manual), f"the manual (docs/) does not show `agentik {command}`"


# -- agentik memory ---------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["sqlite", "markdown"])
# Seventeen CLI processes one after another: the suite's 120 s hang guard was
# reached on a loaded machine (each one a cold Python start).
@pytest.mark.timeout(600)
def test_memory_commands_list_show_history_rm_restore(tmp_path, backend):
    conf = write_config(tmp_path, f'[storage]\npath = "bot.db"\n[memory]\nbackend = "{backend}"\n')
    if backend == "sqlite":

        async def create() -> None:
            async with SQLiteStore(str(tmp_path / "bot.db")):
                pass  # the bot's database, as a first run leaves it

        asyncio.run(create())

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return agentik("memory", *args, "-c", conf, cwd=tmp_path)

    added = run("add", "channel:irc:libera:#ops", "deploys happen on Tuesday")
    assert added.returncode == 0, added.stderr
    assert added.stdout.strip() == "saved note #1 in channel:irc:libera:#ops"
    assert run("add", "global", "be kind").returncode == 0
    bad = run("add", "team:x", "nope")
    assert bad.returncode == 2 and "invalid memory scope 'team:x'" in bad.stderr
    listed = run("list").stdout
    assert "deploys happen on Tuesday" in listed and "be kind" in listed
    only = run("list", "--scope", "global").stdout
    assert "be kind" in only and "Tuesday" not in only
    assert "#1" in run("search", "deploy", "tuesday").stdout
    shown = run("show", "1").stdout
    assert shown.splitlines()[0].startswith("#1 channel:irc:libera:#ops version 1")
    assert run("rm", "1").stdout.strip() == "deleted note #1"
    assert "Tuesday" not in run("list").stdout
    assert "[deleted]" in run("list", "--deleted").stdout
    history = run("history", "1").stdout
    assert "version 1 · save" in history and "version 2 · delete" in history
    restored = run("restore", "1", "1")
    assert restored.stdout.strip() == "note #1 is now version 3 (text of version 1)"
    assert "Tuesday" in run("list").stdout
    assert run("rm", "1", "--purge").stdout.strip() == "purged note #1"
    missing = run("show", "1")
    assert missing.returncode == 1 and missing.stderr.strip() == "agentik: no note #1"
    assert run("history", "1").returncode == 1


def test_memory_with_backend_none_exits_2(tmp_path):
    conf = write_config(tmp_path, '[memory]\nbackend = "none"\n')
    result = agentik("memory", "list", "-c", conf, cwd=tmp_path)
    assert_one_line_error(result, 2)
    assert "memory.backend" in result.stderr


def test_output_into_a_closed_pipe_is_no_traceback(tmp_path):
    """`agentik check | head -1` printed a BrokenPipeError traceback once head left."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written
    try:
        result = subprocess.run(
            [AGENTIK, "check", "-c", str(Path(__file__).parent.parent / "config.example.toml")],
            cwd=tmp_path,
            env=clean_env(),
            stdin=subprocess.DEVNULL,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write)
    assert "Traceback" not in result.stderr, result.stderr
    assert "BrokenPipeError" not in result.stderr
    assert result.returncode == 1
