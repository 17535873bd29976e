"""benchmarks/bench_overhead.py measures agentik as a library, as the docs' table says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_overhead_benchmark_measures_agentik_and_the_bare_sdk():
    """A quick run prints a row with figures for both agentik stores and the bare streaming
    SDK, checks their answers (a failing turn would look cheap: the bench stops), and grades
    the goal; stacks of the ``bench`` extra are either measured or say how to install them."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_overhead.py"), "--quick",
         "--rounds", "1", "--warmup", "0", "--turns", "2",
         "--only", "agentik-memory", "agentik-sqlite", "openai-stream"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in done.stdout.splitlines()
        if line.startswith("| ")
    }
    for label in ("agentik, MemoryStore", "agentik, SQLiteStore (durable)",
                  "openai SDK, streaming"):  # fmt: skip
        cpu, _spread, ratio, rss, peak, _version = rows[label]
        assert float(cpu) > 0 and float(ratio.rstrip("x")) > 0, rows[label]
        assert rss.endswith(" MB") and peak.endswith(" MB"), rows[label]
    assert "agentik durable ≤ bare streaming SDK + 1 ms per turn: " in done.stdout
