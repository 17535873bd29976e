"""benchmarks/bench_irc.py measures agentik in its default configuration."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from agentik.bot.config import load_config

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_irc  # noqa: E402


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flat(item, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): value}


@pytest.mark.parametrize("memory", ["sqlite", "none"])
def test_the_irc_benchmark_runs_the_shipped_configuration(tmp_path, monkeypatch, memory):
    """The issue's goals are for the default bot: the benchmark's configuration is
    config.example.toml with only the endpoint, the database, the terminal off and one
    IRC network on (its flood limits relaxed) changed; memory, recall, metrics and
    governance stay as shipped."""
    for name in [n for n in os.environ if n.startswith(("AGENTIK_", "OPENAI_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_MODEL", "fake-model")
    monkeypatch.setenv("OPENAI_API_KEY", "x")
    channels = ["#b0", "#b1"]
    path = bench_irc.agentik_config(tmp_path / "bench", 16667, channels, memory)
    shipped = _flat(load_config(str(ROOT / "config.example.toml")).model_dump())
    measured = _flat(load_config(str(path)).model_dump())

    changed = {k for k in shipped.keys() | measured.keys() if shipped.get(k) != measured.get(k)}
    irc = "transports.libera."
    allowed = {
        "llm.backend", "storage.path", "transports.terminal.enabled",
        f"{irc}enabled", f"{irc}host", f"{irc}port", f"{irc}tls", f"{irc}channels",
        f"{irc}flood_burst", f"{irc}flood_rate", f"{irc}user_rate_limit", f"{irc}queue_limit",
        f"{irc}target_queue_limit",
    }  # fmt: skip
    if memory == "none":
        allowed.add("memory.backend")
    assert changed <= allowed, sorted(changed - allowed)
    assert measured["llm.backend"] == "openai"
    assert measured[f"{irc}channels"] == channels and measured[f"{irc}enabled"] is True
    assert measured["memory.backend"] == memory
    assert measured["memory.recall"] is True and measured["memory.embeddings"] == "builtin"
    assert measured["storage.synchronous"] == "full"
