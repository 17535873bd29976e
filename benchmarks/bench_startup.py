#!/usr/bin/env python3
"""Start-up of the default configuration (issue 31), against the bare ``openai`` SDK.

Run with ``.venv/bin/python benchmarks/bench_startup.py`` (``make bench``); ``--quick``
is a smaller run.  Every measurement is a fresh interpreter, repeated; the medians are
compared and the ranges printed.  The model is the fake OpenAI server (its own process).

1. import + build: the CPU time (user + system, of that process) of importing agentik
   and building a :class:`~agentik.bot.app.Bot` from ``config.example.toml`` (plugins
   loaded, the agent and its LLM client built, nothing started), against importing
   the ``openai`` package and building an ``AsyncOpenAI`` client.  Goal: at most the
   bare SDK's + 0.2 s.  The RSS at that point is printed beside it.
2. ``agentik run -c config.example.toml`` (with ``[health] listen`` set so that
   ``/ready`` can be asked): the wall time from starting the process to ``/ready``
   answering 200, against the wall time of a process that imports the SDK, builds its
   client and exits.  Goal: at most 1.5 s.  The RSS and the CPU time of the started
   bot, and which of the heavy optional packages it has imported by then (none should:
   each is imported when first used), are printed too.

Both sides run from compiled bytecode, as an installed package does (pip compiles it):
the processes write and read their ``.pyc`` files under a temporary
``PYTHONPYCACHEPREFIX`` (never next to the sources), filled by a first round that is not
counted.  Without it (``PYTHONDONTWRITEBYTECODE`` and a source checkout) agentik's
modules would be compiled at every start, the SDK's not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from _common import (
    Row,
    fake_openai_server,
    finish,
    free_port,
    mb,
    proc_status,
    say,
    say_environment,
    version,
    writer_cpu,
)

ROOT = Path(__file__).resolve().parent.parent
EXTRA_CPU = 0.2  # seconds over the bare SDK's import + build
READY = 1.5  # seconds from `agentik run` to /ready 200

#: Imported only when used: a started default bot has none of these.  (Not aiohttp: the
#: openai SDK imports it whenever it is installed, the bare SDK too.)
OPTIONAL = ("uvicorn", "starlette", "httptools", "jsonschema", "mcp_types", "prometheus_client")

_REPORT = f"""
import json, os, resource, sys
usage = resource.getrusage(resource.RUSAGE_SELF)
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(json.dumps({{
    "cpu": usage.ru_utime + usage.ru_stime,
    "rss": int(status["VmRSS"].split()[0]) * 1024,
    "modules": len(sys.modules),
    "optional": sorted(m for m in {OPTIONAL!r} if m in sys.modules),
}}))
"""

BARE = (
    "import openai\n"
    "client = openai.AsyncOpenAI(base_url=os.environ['OPENAI_BASE_URL'], api_key='x')\n"
)

AGENTIK = (
    "from agentik.bot.app import Bot\n"
    "from agentik.bot.config import load_config\n"
    "bot = Bot(load_config(sys.argv[1]))\n"
)


def _config(folder: Path, port: int) -> Path:
    """config.example.toml as shipped, with a health listener so /ready can be asked."""
    text = (ROOT / "config.example.toml").read_text(encoding="utf-8")
    marker = "\n[health]\n"
    assert marker in text, "config.example.toml has no [health] section"
    text = text.replace(marker, f'{marker}listen = "127.0.0.1:{port}"\n', 1)
    path = folder / "agentik.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _run_script(body: str, env: dict[str, str], *args: str) -> dict[str, object]:
    """Run ``body`` in a fresh interpreter (its CPU counted from the start) and return
    what it reports: CPU seconds, RSS, module count, optional packages imported."""
    script = "import os, sys\n" + body + _REPORT
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"script failed: {done.stderr[-2000:]}")
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _proc_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and of its SQLite writer process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks + writer_cpu(pid)  # utime, stime


def _proc_rss(pid: int) -> int:
    """RSS of ``pid`` and of its SQLite writer process."""
    return proc_status(pid)["VmRSS"]


def _run_until_ready(env: dict[str, str], folder: Path) -> tuple[float, float, int]:
    """``agentik run``: seconds to /ready 200, and its CPU seconds and RSS then."""
    port = free_port()
    config = _config(folder, port)
    url = f"http://127.0.0.1:{port}/ready"
    log = folder / "run.log"  # a file, not a pipe: a full pipe would stall the bot
    start = time.perf_counter()
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentik.bot.cli", "run", "-c", str(config)],
            cwd=folder,
            env=env,
            stdin=subprocess.PIPE,  # the terminal transport reads it; kept open
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        while True:
            if proc.poll() is not None:
                tail = log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"agentik run exited with {proc.returncode}: {tail}")
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.perf_counter() - start > 60:
                raise RuntimeError("agentik run was not ready within 60 s")
            time.sleep(0.01)
        elapsed = time.perf_counter() - start
        return elapsed, _proc_cpu(proc.pid), _proc_rss(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wall(body: str, env: dict[str, str], *args: str) -> float:
    start = time.perf_counter()
    _run_script(body, env, *args)
    return time.perf_counter() - start


def _span(values: list[float]) -> str:
    """The median and the range of ``values`` (seconds)."""
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def _mb_span(values: list[float]) -> str:
    return f"{mb(statistics.median(values))} ({mb(min(values))}-{mb(max(values))})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a much smaller run (smoke test)")
    parser.add_argument("--strict", action="store_true", help="exit 1 if a goal is missed")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    rounds = 2 if args.quick else 7
    say_environment([("agentik", version("agentik")), ("openai", version("openai"))])
    bare_cpu: list[float] = []
    bare_rss: list[float] = []
    bare_wall: list[float] = []
    ours_cpu: list[float] = []
    ours_rss: list[float] = []
    ready: list[float] = []
    ready_cpu: list[float] = []
    ready_rss: list[float] = []
    optional: set[str] = set()
    with tempfile.TemporaryDirectory() as tmp, fake_openai_server() as url:
        folder = Path(tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTIK_", "OPENAI_"))}
        env.update(OPENAI_BASE_URL=url, OPENAI_API_KEY="x", OPENAI_MODEL="fake-model")
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(folder / "pycache")
        build_config = _config(folder, free_port())
        say("== a first round fills the bytecode cache (not counted)")
        _run_script(BARE, env)
        _run_script(AGENTIK, env, str(build_config))
        _run_until_ready(env, folder)
        say(f"== {rounds} rounds, alternating: bare SDK, agentik build, agentik run")
        for _ in range(rounds):
            bare = _run_script(BARE, env)
            bare_cpu.append(float(bare["cpu"]))  # type: ignore[arg-type]
            bare_rss.append(float(bare["rss"]))  # type: ignore[arg-type]
            ours = _run_script(AGENTIK, env, str(build_config))
            ours_cpu.append(float(ours["cpu"]))  # type: ignore[arg-type]
            ours_rss.append(float(ours["rss"]))  # type: ignore[arg-type]
            optional.update(ours["optional"])  # type: ignore[arg-type]
            bare_wall.append(_wall(BARE, env))
            seconds, cpu, rss = _run_until_ready(env, folder)
            ready.append(seconds)
            ready_cpu.append(cpu)
            ready_rss.append(rss)
    say(f"bare SDK import + client     CPU {_span(bare_cpu)} s, RSS {_mb_span(bare_rss)}")
    say(f"agentik import + build       CPU {_span(ours_cpu)} s, RSS {_mb_span(ours_rss)}")
    say(f"bare SDK process, wall       {_span(bare_wall)} s")
    say(f"agentik run to /ready 200    {_span(ready)} s, CPU {_span(ready_cpu)} s, "
        f"RSS {_mb_span(ready_rss)}")  # fmt: skip
    say(f"optional packages imported by the build: {', '.join(sorted(optional)) or 'none'}")
    cpu_b, cpu_o = statistics.median(bare_cpu), statistics.median(ours_cpu)
    wall_b, wall_r = statistics.median(bare_wall), statistics.median(ready)
    rss_b = statistics.median(bare_rss)
    rows = [
        Row("import + build CPU", f"{cpu_o:.3f} s", f"{cpu_b:.3f} s", cpu_o / cpu_b,
            f"<= bare + {EXTRA_CPU} s", cpu_o <= cpu_b + EXTRA_CPU),
        Row("RSS after build", mb(statistics.median(ours_rss)), mb(rss_b),
            statistics.median(ours_rss) / rss_b, "info", None),
        Row("agentik run to /ready 200", f"{wall_r:.3f} s", f"{wall_b:.3f} s", wall_r / wall_b,
            f"<= {READY} s", wall_r <= READY),
        Row("RSS at /ready", mb(statistics.median(ready_rss)), mb(rss_b),
            statistics.median(ready_rss) / rss_b, "info", None),
        Row("optional packages imported by the build", str(len(optional)), "0", None,
            "none", not optional),
    ]  # fmt: skip
    return finish(rows, strict=args.strict, started=started)


if __name__ == "__main__":
    sys.exit(main())
