"""benchmarks/bench_soak.py soaks agentik's default bot: the shipped configuration with
only its endpoints, timers and context size changed, a real MCP server whose tool
answers with 20 KB, and a model that tells agentik's own background requests apart."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agentik.bot.config import load_config
from agentik.core.background import MINING_PROMPT, REFLECTION_PROMPT
from agentik.core.compaction import SUMMARY_PROMPT, estimate_tokens
from agentik.core.messages import ChatMessage
from agentik.core.tools.base import ToolContext
from agentik.core.tools.mcp import MCPServerConfig, MCPToolset

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_soak  # noqa: E402


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flat(item, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): value}


@pytest.mark.parametrize("quick", [True, False])
def test_the_soak_runs_the_shipped_configuration(tmp_path, monkeypatch, quick):
    """Only the endpoints, the transports, the context size, the idle timers and the
    MCP server differ from config.example.toml; memory, recall, mining, reflection,
    metrics, persistence and the transcript cache stay as shipped."""
    for name in [n for n in os.environ if n.startswith(("AGENTIK_", "OPENAI_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_MODEL", "fake-model")
    monkeypatch.setenv("OPENAI_API_KEY", "x")
    cfg = bench_soak.QUICK if quick else bench_soak.FULL
    channels = bench_soak.channel_names(cfg)
    assert len(channels) == cfg.conversations // 2 and cfg.mark < cfg.load < cfg.duration
    path = bench_soak.agentik_config(tmp_path / "bot", cfg, 16667, 18080, channels)
    shipped = _flat(load_config(str(ROOT / "config.example.toml")).model_dump())
    measured = _flat(load_config(str(path)).model_dump())

    changed = {k for k in shipped.keys() | measured.keys() if shipped.get(k) != measured.get(k)}
    irc, web = "transports.libera.", "transports.web."
    allowed = {
        "llm.backend", "storage.path", "transports.terminal.enabled",
        f"{irc}enabled", f"{irc}host", f"{irc}port", f"{irc}tls", f"{irc}channels",
        f"{irc}flood_burst", f"{irc}flood_rate", f"{irc}user_rate_limit", f"{irc}queue_limit",
        f"{irc}target_queue_limit", f"{web}enabled", f"{web}port",
        "compaction.context_tokens", "memory.reflect_after_idle", "memory.mining_debounce",
        "memory.release_vectors_after_idle", "mcp.servers",
    }  # fmt: skip
    assert changed <= allowed, sorted(changed - allowed)
    assert measured[f"{irc}channels"] == channels and measured[f"{web}enabled"] is True
    assert measured["memory.backend"] == "sqlite" and measured["memory.recall"] is True
    assert measured["memory.embeddings"] == "builtin" and measured["memory.reflection"] is True
    assert measured["memory.mining"] is True and measured[f"{web}metrics"] is True
    assert measured["storage.synchronous"] == "full" and measured["compaction.enabled"] is True
    assert measured["memory.reflect_after_idle"] == cfg.idle
    # Scaled as the channels' release is (both 15 minutes when shipped).
    assert measured["memory.release_vectors_after_idle"] == cfg.idle
    assert shipped["memory.release_vectors_after_idle"] == 900
    [server] = load_config(str(path)).mcp.servers
    assert server.name == "soak" and list(server.args) == [str(bench_soak.MCP_SERVER)]


def test_two_tool_outputs_fit_the_soaks_context_and_three_compact_it():
    """Every conversation of the soak compacts once: its third 20 KB tool output
    takes the context past the trigger, and the last turns kept whole still fit."""
    trigger = bench_soak.CONTEXT_TOKENS * 0.8  # [compaction] trigger, as shipped
    output = ChatMessage(role="tool", content="x" * bench_soak.TOOL_CHARS, tool_call_id="c")
    for cfg in (bench_soak.QUICK, bench_soak.FULL):
        tool_turns = len(range(0, cfg.turns, cfg.tool_every))
        assert tool_turns >= 3 and cfg.turns > 4  # more turns than keep_turns (4)
    assert estimate_tokens([output] * 2) < trigger - 2000  # room for the tools' schemas
    assert estimate_tokens([output] * 3) > trigger


def test_the_soaks_model_tells_agentiks_requests_apart():
    """The scripted model answers questions, calls the report tool and answers its
    output, and recognises the summariser's, the miner's and the reflection's
    instructions as agentik words them (a reworded prompt would go uncounted)."""
    counts: Counter[str] = Counter()

    def step(messages: list[dict[str, Any]]) -> dict[str, Any]:
        reply = bench_soak.script_reply({"messages": messages}, counts)
        merged: dict[str, Any] = {}
        for delta in reply.steps:  # the streamed deltas, put together as a client does
            if "content" in delta:
                merged["content"] = merged.get("content", "") + delta["content"]
            for piece in delta.get("tool_calls") or []:
                calls = merged.setdefault("tool_calls", [])
                if "id" in piece:
                    calls.append({"id": piece["id"], "function": dict(piece["function"])})
                else:
                    calls[piece["index"]]["function"]["arguments"] += piece["function"]["arguments"]
        return merged

    system = {"role": "system", "content": "You are agentik."}
    question = {"role": "user", "content": "alice: agentik: soak c3t1 for the team"}
    assert step([system, question]) == {"content": "ok c3t1"}
    asked = {"role": "user", "content": "alice: agentik: report c3t0 for the team"}
    call = step([system, asked])["tool_calls"][0]
    assert call["function"]["name"] == "soak__report"
    assert json.loads(call["function"]["arguments"]) == {"topic": "c3t0", "size": 20_000}
    result = {"role": "tool", "tool_call_id": call["id"], "content": "x" * 20_000}
    assert step([system, asked, {"role": "assistant", "tool_calls": [call]}, result]) == {
        "content": "reported c3t0 (20000 characters)"
    }
    transcript = {"role": "user", "content": "alice: report c3t0\nagentik: reported c3t0"}
    for prompt in (SUMMARY_PROMPT.format(words=300), MINING_PROMPT.format(max_facts=8),
                   REFLECTION_PROMPT):  # fmt: skip
        step([{"role": "system", "content": prompt}, transcript])
    assert counts == {"answers": 1, "tool_calls": 1, "tool_answers": 1, "summaries": 1,
                      "mining": 1, "reflections": 1}  # fmt: skip


async def test_the_soaks_mcp_server_answers_with_20_kb():
    """benchmarks/data/soak_mcp.py is a real MCP server over stdio whose report is
    as long as asked, and different for each topic."""
    toolset = MCPToolset(
        [MCPServerConfig(name="soak", command=sys.executable, args=(str(bench_soak.MCP_SERVER),))]
    )
    await toolset.start()
    ctx = ToolContext(conversation_id="c", run_id="r", call_id="k")
    try:
        [tool] = toolset.tools()
        assert tool.name == "soak__report"
        one = await tool.call({"topic": "c1t0", "size": 20_000}, ctx)
        two = await tool.call({"topic": "c2t0", "size": 20_000}, ctx)
    finally:
        await toolset.aclose()
    assert not one.is_error and not two.is_error
    assert [len(one.text), len(two.text)] == [20_000, 20_000] and one.text != two.text
