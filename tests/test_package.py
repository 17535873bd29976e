"""Packaging: the public API is pinned, and wheels carry the mapped packages."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import agentik.core

ROOT = Path(__file__).resolve().parent.parent


def test_public_api_is_pinned():
    assert sorted(agentik.core.__all__) == sorted(
        """
        PROFILES Agent AgentState AgentikError Capabilities ChatMessage ChildRunLinked
        ClosedError ConfigError ContextTooLong Conversation ConversationRecord ConversationState
        Error Event
        EventsLost FunctionTool Interrupted LLMBackend LLMConnectionError LLMError LLMRequest
        LLMResponseError LLMStatusError LLMTimeout MemoryStore Message MigrationError NotFound
        OpenAIBackend PluginError ReasoningDelta ReasoningStarted Registry ResponseStarted
        SQLiteStore Store StoreError Subscription TextDelta Tool ToolCall ToolCallEnded
        ToolCallStarted ToolContext ToolError ToolResult ToolSpec TurnEnded TurnOrigin TurnPolicy
        TurnSettings
        TurnStarted Usage event_from_dict event_from_json event_to_dict event_to_json hookimpl
        load_plugins tool
        """.split()
    )
    for name in agentik.core.__all__:
        assert getattr(agentik.core, name).__doc__ or name.isupper() or name == "Event"


def test_core_imports_no_transport_or_bot_code():
    pattern = re.compile(
        r"^\s*(from|import)\s+(agentik\.(transports|bot)|\.+(transports|bot))\b", re.M
    )
    for path in (ROOT / "core").rglob("*.py"):
        assert not pattern.search(path.read_text()), path


def test_wheel_maps_the_three_folders(tmp_path):
    out = tmp_path / "wheel"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        env={**os.environ, "PIP_NO_INPUT": "1"},
    )
    (wheel,) = out.glob("agentik-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in (
        "agentik/core/agent.py",
        "agentik/core/store/sqlite.py",
        "agentik/core/llm/openai_backend.py",
        "agentik/transports/__init__.py",
        "agentik/transports/http/transport.py",
        # The web chat page is package data, not a module.
        "agentik/transports/http/static/index.html",
        "agentik/transports/http/static/app.js",
        # KaTeX, loaded by the page when a message holds math, with its fonts.
        "agentik/transports/http/static/vendor/katex/katex.min.js",
        "agentik/transports/http/static/vendor/katex/katex.min.css",
        "agentik/transports/http/static/vendor/katex/fonts/KaTeX_Main-Regular.woff2",
        "agentik/bot/__init__.py",
        # PEP 561 markers: the packages are typed.
        "agentik/core/py.typed",
        "agentik/transports/py.typed",
        "agentik/bot/py.typed",
    ):
        assert module in names
    # Every module of the three folders is in the wheel: a new subpackage missing
    # from pyproject's list installs without it (and the bot fails on a plain install).
    for folder in ("core", "transports", "bot"):
        for path in (ROOT / folder).rglob("*.py"):
            name = f"agentik/{folder}/{path.relative_to(ROOT / folder).as_posix()}"
            assert name in names, f"{name} is not in the wheel: add its package to pyproject.toml"
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[agentik]" in text and "openai = agentik.core.llm.openai_backend" in text
    assert "agentik = agentik.bot.cli:main" in text
