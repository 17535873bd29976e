"""Read-only workspace tools (issue 35): ``read_file``, ``list_dir``, ``glob`` and ``grep``
over real folders of real files, symbolic links, a FIFO and a socket; every escape
attempt is refused with a clear tool error, and a real model turn (the openai client
against the fake OpenAI server) uses them end to end."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from agentik.bot.builder import AgentBuilder
from agentik.bot.config import parse_config
from agentik.bot.parts import load_registry
from agentik.core.errors import ConfigError, ToolError
from agentik.core.testing.openai_server import Reply
from agentik.core.tools.base import ToolContext
from agentik.core.tools.workspace import Workspace, WorkspaceSettings, workspace_tools

CTX = ToolContext(conversation_id="c", run_id="r", call_id="k")
SECRET = "SECRET-OUTSIDE-THE-WORKSPACE"


@pytest.fixture
def tree(tmp_path) -> Path:
    """``repo/`` (the workspace) and ``outside/`` next to it, with every trap."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET + "\n", encoding="utf-8")
    repo = tmp_path / "repo"
    (repo / "src" / "pkg").mkdir(parents=True)
    (repo / "README.md").write_text("# Demo\nhello workspace\n", encoding="utf-8")
    (repo / "src" / "main.py").write_text("def main():\n    return 42\n", encoding="utf-8")
    (repo / "src" / "pkg" / "util.py").write_text("ANSWER = 42\n", encoding="utf-8")
    (repo / "big.txt").write_text("x" * 5000 + "\n", encoding="utf-8")
    (repo / "blob.bin").write_bytes(b"\x7fELF\x00\x01\x02binary")
    (repo / "latin1.txt").write_bytes(b"caf\xe9 42\n")
    (repo / "inside_link.md").symlink_to("README.md")  # inside → inside: fine
    (repo / "link_out").symlink_to(outside / "secret.txt")
    (repo / "dir_out").symlink_to(outside)
    (repo / "abs_link").symlink_to("/etc/passwd")
    (repo / "proc").symlink_to("/proc/self")
    (repo / "null").symlink_to("/dev/null")
    (repo / "loop1").symlink_to("loop2")
    (repo / "loop2").symlink_to("loop1")
    (repo / "self").symlink_to(".")  # a folder loop for walkers
    os.mkfifo(repo / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(repo / "sock"))
    sock.close()
    return repo


def tools_for(repo: Path, **settings: Any) -> dict[str, Any]:
    ws = Workspace(WorkspaceSettings(folders=[str(repo)], **{"max_file_bytes": 1000, **settings}))
    return {t.name: t for t in workspace_tools(ws)}


async def call(tools: dict[str, Any], name: str, **arguments: Any) -> str:
    # Bounded: a tool that blocked (on a FIFO) must fail the test, not hang it.
    return await asyncio.wait_for(tools[name].call(arguments, CTX), 60)


ESCAPES = [
    ("read_file", {"path": "repo/../outside/secret.txt"}, "goes up ('..')"),
    ("read_file", {"path": "../outside/secret.txt"}, "goes up ('..')"),
    ("read_file", {"path": "repo/src/../../outside/secret.txt"}, "goes up ('..')"),
    ("read_file", {"path": "/etc/passwd"}, "is absolute"),
    ("read_file", {"path": "/proc/self/environ"}, "is absolute"),
    ("read_file", {"path": "~/.ssh/id_rsa"}, "is absolute"),
    ("read_file", {"path": "repo/link_out"}, "leads outside the workspace"),
    ("read_file", {"path": "repo/dir_out/secret.txt"}, "leads outside the workspace"),
    ("read_file", {"path": "repo/abs_link"}, "leads outside the workspace"),
    ("read_file", {"path": "repo/proc/environ"}, "leads outside the workspace"),
    ("read_file", {"path": "repo/null"}, "leads outside the workspace"),
    ("read_file", {"path": "repo/loop1"}, "leads nowhere inside the workspace"),
    ("read_file", {"path": "repo/fifo"}, "refused: a FIFO"),
    ("read_file", {"path": "repo/sock"}, "refused: a socket"),
    ("read_file", {"path": "repo/big.txt"}, "over the limit of 1,000"),
    ("read_file", {"path": "repo/blob.bin"}, "a binary file"),
    ("read_file", {"path": "repo/latin1.txt"}, "a binary file"),
    ("read_file", {"path": "repo/READ\x00ME.md"}, "NUL character"),
    ("read_file", {"path": "repo/src"}, "a folder, not a file"),
    ("read_file", {"path": "elsewhere/x"}, "no workspace folder 'elsewhere'"),
    ("read_file", {"path": "repo/missing.txt"}, "no such file"),
    ("read_file", {"path": "repo/README.md", "offset": "2"}, "offset: the first line"),
    ("read_file", {"path": "repo/README.md", "nope": 1}, "unexpected arguments"),
    ("list_dir", {"path": "repo/dir_out"}, "leads outside the workspace"),
    ("list_dir", {"path": "repo/.."}, "goes up ('..')"),
    ("list_dir", {"path": "/"}, "is absolute"),
    ("list_dir", {"path": "repo/fifo"}, "refused: a FIFO"),
    ("glob", {"pattern": "../*"}, "goes up ('..')"),
    ("glob", {"pattern": "/etc/*"}, "is absolute"),
    ("grep", {"pattern": "SECRET", "path": "repo/dir_out"}, "leads outside the workspace"),
    ("grep", {"pattern": "SECRET", "path": "repo/link_out"}, "leads outside the workspace"),
    ("grep", {"pattern": "x", "path": "repo/fifo"}, "refused: a FIFO"),
    ("grep", {"pattern": "x", "path": "repo/big.txt"}, "over the limit"),
    ("grep", {"pattern": "x", "path": "repo/\x00"}, "NUL character"),
    ("grep", {"pattern": "(unclosed"}, "not a regular expression"),
]


@pytest.mark.parametrize(("tool", "arguments", "why"), ESCAPES)
async def test_every_escape_attempt_is_refused_with_a_clear_tool_error(tree, tool, arguments, why):
    tools = tools_for(tree)
    with pytest.raises(ToolError) as refused:
        await call(tools, tool, **arguments)
    assert why in str(refused.value)
    assert SECRET not in str(refused.value)


async def test_walks_never_leave_the_workspace_nor_loop_nor_block(tree):
    tools = tools_for(tree)
    # Over everything: the secret behind the links is never read, the FIFO never opened.
    found = await call(tools, "grep", pattern="SECRET|root:")
    assert found.startswith("no line matches")
    assert "1 file(s) over 1,000 bytes skipped" in found
    assert "2 binary file(s) skipped" in found
    paths = await call(tools, "glob", pattern="repo/**")
    assert "repo/dir_out (symbolic link)" in paths and "repo/self (symbolic link)" in paths
    assert "dir_out/secret" not in paths and "self/" not in paths
    assert "repo/src/pkg/util.py" in paths


async def test_normal_use_reads_lists_finds_and_searches(tree):
    tools = tools_for(tree)
    assert "repo/" in await call(tools, "list_dir")
    listing = await call(tools, "list_dir", path="repo")
    assert "src/" in listing and "README.md" in listing
    assert "link_out (symbolic link)" in listing and "fifo (special file)" in listing
    text = await call(tools, "read_file", path="repo/src/main.py")
    assert text == "repo/src/main.py (lines 1-2 of 2)\ndef main():\n    return 42\n"
    assert "    return 42" in await call(tools, "read_file", path="repo/src/main.py", offset=2)
    # A link that stays inside the workspace is read.
    assert "hello workspace" in await call(tools, "read_file", path="repo/inside_link.md")
    assert await call(tools, "glob", pattern="repo/**/*.py") == (
        "repo/src/main.py\nrepo/src/pkg/util.py"
    )
    hits = await call(tools, "grep", pattern=r"\b42\b", include="*.py")
    assert hits == "repo/src/main.py:2:     return 42\nrepo/src/pkg/util.py:1: ANSWER = 42"
    assert await call(tools, "grep", pattern="answer", path="repo/src/pkg/util.py",
                      ignore_case=True) == "repo/src/pkg/util.py:1: ANSWER = 42"  # fmt: skip


async def test_answers_are_capped(tree):
    (tree / "many").mkdir()
    for i in range(30):
        (tree / "many" / f"f{i:02}.txt").write_text("hit\n" * 3, encoding="utf-8")
    tools = tools_for(tree, max_results=5, max_read_chars=100, max_file_bytes=100_000)
    listing = await call(tools, "list_dir", path="repo/many")
    assert "(30 entries)" in listing and "[… 25 more entries not shown]" in listing
    assert (await call(tools, "glob", pattern="repo/many/*")).endswith("(limit 5)]")
    grep = await call(tools, "grep", pattern="hit", path="repo/many")
    assert len([line for line in grep.splitlines() if ": hit" in line]) == 5
    assert "[… stopped" in grep
    long = await call(tools, "read_file", path="repo/big.txt")
    assert "[… cut at 100 characters: read on with offset=1]" in long


def test_a_workspace_in_proc_sys_dev_or_at_the_root_is_refused(tmp_path):
    for folder in ("/proc", "/proc/self", "/sys", "/dev", "/"):
        with pytest.raises(ConfigError, match=r"workspace\.folders\[0\]: .* cannot be a workspace"):
            Workspace(WorkspaceSettings(folders=[folder]))
    with pytest.raises(ConfigError, match="no such folder"):
        Workspace(WorkspaceSettings(folders=[str(tmp_path / "nope")]))
    (tmp_path / "a" / "docs").mkdir(parents=True)
    (tmp_path / "b" / "docs").mkdir(parents=True)
    with pytest.raises(ConfigError, match="two folders are named 'docs'"):
        Workspace(WorkspaceSettings(folders=[str(tmp_path / "a/docs"), str(tmp_path / "b/docs")]))


# -- end to end: a model turn -------------------------------------------------------------------
def _agent(tmp_path: Path, server: Any, **extra: Any) -> Any:
    config = parse_config(
        {
            "llm": {"base_url": server.base_url, "model": "fake-model", "api_key": "sk-x",
                    "timeout": 60},
            "storage": {"path": str(tmp_path / "bot.db")},
            "workspace": {"folders": ["repo"]},
            **extra,
        },
        source=str(tmp_path / "bot.toml"),
        env={},
    )  # fmt: skip
    return AgentBuilder.from_config(config, load_registry(config)).build()


def _tool_results(body: dict[str, Any]) -> dict[str, str]:
    """The tool results a request carries, by tool call id (the calls of one step run
    at once: their results come in the order they finished)."""
    return {m["tool_call_id"]: m["content"] for m in body["messages"] if m["role"] == "tool"}


async def test_a_model_turn_reads_the_workspace_and_is_refused_an_escape(
    tree, tmp_path, openai_server
):
    openai_server.enqueue(
        Reply.tool_calls([
            ("c1", "read_file", json.dumps({"path": "repo/src/main.py"})),
            ("c2", "read_file", json.dumps({"path": "repo/../outside/secret.txt"})),
            ("c3", "grep", json.dumps({"pattern": "ANSWER"})),
        ]),
        Reply.text("main returns 42"),
    )  # fmt: skip
    async with _agent(tmp_path, openai_server) as agent:
        conv = await agent.conversation_for_channel("stdio:t")
        async with asyncio.timeout(120):
            events = conv.events(profile="debug")
            await conv.send("what does main return?", author="alice")
            async for event in events:
                if event.kind == "turn_ended":
                    break
    first, second = openai_server.requests[0], openai_server.requests[1]
    offered = sorted(t["function"]["name"] for t in first["tools"])
    assert {"read_file", "list_dir", "glob", "grep"} <= set(offered)
    results = _tool_results(second)
    read, escape, grep = results["c1"], results["c2"], results["c3"]
    assert "def main():\n    return 42" in read
    assert "goes up ('..')" in escape and SECRET not in escape
    assert grep.splitlines() == [
        "repo/src/pkg/util.py:1: ANSWER = 42",
        "[2 binary file(s) skipped]",
    ]


async def test_the_tool_policy_decides_which_workspace_tools_are_offered(
    tree, tmp_path, openai_server
):
    openai_server.enqueue(Reply.text("ok"))
    async with _agent(tmp_path, openai_server, tools={"allowed": ["read_file"]}) as agent:
        conv = await agent.conversation_for_channel("stdio:t")
        await conv.send("hi", author="alice")
        await openai_server.wait_requests(1)
    assert [t["function"]["name"] for t in openai_server.requests[0]["tools"]] == ["read_file"]


async def test_without_folders_no_workspace_tool_is_offered(tmp_path, openai_server):
    openai_server.enqueue(Reply.text("ok"))
    config = parse_config(
        {"llm": {"base_url": openai_server.base_url, "model": "fake-model", "api_key": "sk-x"},
         "storage": {"path": str(tmp_path / "bot.db")}},
        env={},
    )  # fmt: skip
    async with AgentBuilder.from_config(config, load_registry(config)).build() as agent:
        conv = await agent.conversation_for_channel("stdio:t")
        await conv.send("hi", author="alice")
        await openai_server.wait_requests(1)
    names = {t["function"]["name"] for t in openai_server.requests[0].get("tools") or []}
    assert not names & {"read_file", "list_dir", "glob", "grep"}
