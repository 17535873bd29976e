"""Every benchmark `make bench` runs can at least be imported against the code it
measures: a renamed helper broke ``bench_recall.py`` (it imported a private name of
the memory module) while every test passed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_benchmark_make_bench_runs_imports():
    makefile = (ROOT / "Makefile").read_text()
    target = makefile.split("\nbench:", 1)[1].split("\n\n", 1)[0]
    named = re.findall(r"benchmarks/(bench_\w+)\.py", target)
    assert len(named) >= 10, target  # (the target's recipe was found)
    on_disk = {p.stem for p in (ROOT / "benchmarks").glob("bench_*.py")}
    assert set(named) <= on_disk, sorted(set(named) - on_disk)
    code = (
        "import importlib, sys, traceback\n"
        f"sys.path.insert(0, {str(ROOT / 'benchmarks')!r})\n"
        "bad = []\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except BaseException as exc:\n"
        "        bad.append(f'{name}: {type(exc).__name__}: {exc}')\n"
        "print('\\n'.join(bad))\n"
        "sys.exit(1 if bad else 0)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, *sorted(on_disk)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
