"""How the package imports: what ``import agentik.core`` costs, and the layering.

The OpenAI SDK takes about half a second to import (more than everything else
``agentik.core`` needs together), so it is imported when an ``OpenAIBackend``
is built, not with the package: a bot on a local model, ``agentik check`` or a
library user who never builds one does not pay for it.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import agentik.core
from helpers import clean_env


def _fresh(script: str) -> str:
    """What a fresh interpreter running ``script`` prints (it must succeed)."""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


def test_importing_core_does_not_import_the_openai_sdk():
    script = (
        "import sys, agentik.core\n"
        "assert agentik.core.OpenAIBackend.name == 'openai'\n"
        "print(sorted(m for m in sys.modules if m == 'openai' or m.startswith('openai.')))\n"
    )
    assert _fresh(script) == "[]"


def test_building_the_openai_backend_imports_the_sdk_then():
    script = (
        "import sys\n"
        "from agentik.core import OpenAIBackend\n"
        "before = 'openai' in sys.modules\n"
        "OpenAIBackend(model='m', base_url='http://127.0.0.1:9/v1')\n"
        "print(before, 'openai' in sys.modules)\n"
    )
    assert _fresh(script) == "False True"


# -- what a started default bot imports ----------------------------------------------------
#
# Packages a feature of the default configuration does not use yet are imported when first
# used (docs/operations.md, "What a started bot imports"): the web server of the http
# transport (configured but disabled in config.example.toml), jsonschema (passthrough
# calls), mcp_types (MCP sessions), prometheus_client (the first scrape of the metrics),
# the IRC, Slack and HTTP transports' modules (a [transports.*] table of their type made), the
# PostgreSQL store ([storage] backend = "postgres").
# (aiohttp is not on the list: the openai SDK imports it whenever it is installed.)

_ROOT = Path(__file__).resolve().parent.parent
_LAZY = (
    "uvicorn",
    "starlette",
    "httptools",
    "jsonschema",
    "mcp_types",
    "prometheus_client",
    # Registered by name (core.plugins.LazyFactory), imported when such a transport is made.
    "agentik.transports.irc.transport",
    "agentik.transports.slack.transport",
    "agentik.transports.http.transport",
    # ... and the chat libraries under them.
    "irc3",
    "slack_bolt",
    "slack_sdk",
    # The PostgreSQL store (twenty modules): [storage] reads its settings from a module
    # of their own (core/store/postgres_settings.py).
    "agentik.core.store.postgres",
    "asyncpg",
    # The IRC wire module (its case mappings: folded when an IRC name first is), and the
    # transport test kit's fake network and harness (the memory plugin is that package).
    "agentik.transports.irc.wire",
    "agentik.transports.testing.fake",
    "agentik.transports.testing.harness",
    # Suggestions for a misspelt key or hook ("did you mean ...?"): only a mistake needs
    # them (start-up, issue 31).
    "difflib",
    # What this configuration does not use of agentik's own (issue 31, fifteenth pass):
    # the local backends (their [llm] keys are read from small modules of their own), the
    # MCP client (no [[mcp.servers]]), the in-memory store (no temporary conversation),
    # the cluster's turn queue (no workers), `agentik db copy`'s tables.
    "agentik.core.llm.litert_backend",
    "agentik.core.llm.llamacpp_backend",
    "agentik.core.llm.llama_worker",
    "agentik.core.tools.mcp",
    "agentik.core.store.memory",
    "agentik.core.cluster.conversations",
    "agentik.core.cluster.events",
    "agentik.core.store.copy",
)

_START_BOT = """
import asyncio, json, sys, urllib.request
from agentik.bot.app import Bot
from agentik.bot.config import load_config
from agentik.transports.testing.memory import MemoryTransport

LAZY = %r

async def main(path, web):
    transports = None if web else {"mem": MemoryTransport(name="mem")}
    async with Bot(load_config(path), transports=transports) as bot:
        out = {"loaded": sorted(m for m in LAZY if m in sys.modules)}
        if web:
            url = bot.transports["web"].url
            # From a thread: the server runs in this loop.
            out["health"] = await asyncio.to_thread(
                lambda: urllib.request.urlopen(url + "/health", timeout=30).status
            )
            out["metrics"] = await asyncio.to_thread(
                lambda: urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
            )
            out["loaded"] = sorted(m for m in LAZY if m in sys.modules)
    print(json.dumps(out))

asyncio.run(main(sys.argv[1], sys.argv[2] == "web"))
"""


def _default_config(folder: Path, *, web: bool, memory: str | None = None) -> Path:
    """config.example.toml as shipped, but for the terminal transport (the test has no
    terminal), with ``web``, the http transport enabled on a free port, and with
    ``memory``, that ``[memory] backend``."""
    text = (_ROOT / "config.example.toml").read_text(encoding="utf-8")
    if memory is not None:
        head, section = text.split("\n[memory]\n", 1)
        assert 'backend = "sqlite"' in section.split("\n[", 1)[0]
        text = (
            head
            + "\n[memory]\n"
            + section.replace('backend = "sqlite"', f'backend = "{memory}"', 1)
        )
    terminal, rest = text.split("[transports.terminal]\n", 1)
    rest = rest.replace("enabled = true", "enabled = false", 1)
    text = terminal + "[transports.terminal]\n" + rest
    if web:
        head, web_section = text.split("[transports.web]\n", 1)
        web_section = web_section.replace("enabled = false", "enabled = true", 1)
        web_section = web_section.replace("port = 8080", "port = 0", 1)
        text = head + "[transports.web]\n" + web_section
    folder.mkdir()
    path = folder / "agentik.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _start_default_bot(
    tmp_path: Path, *, web: bool, memory: str | None = None, lazy: tuple[str, ...] = _LAZY
) -> dict[str, object]:
    config = _default_config(tmp_path / ("web" if web else "plain"), web=web, memory=memory)
    env = clean_env(OPENAI_BASE_URL="http://127.0.0.1:9/v1", OPENAI_API_KEY="x", OPENAI_MODEL="m")
    done = subprocess.run(
        [sys.executable, "-c", _START_BOT % (lazy,), str(config), "web" if web else "-"],
        cwd=config.parent, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_started_default_bot_has_not_imported_what_it_does_not_use_yet(tmp_path):
    started = _start_default_bot(tmp_path, web=False)
    assert started["loaded"] == [], started


#: The note memory's modules: the default bot loads them ([memory] backend = "sqlite").
_NOTE_MEMORY = (
    "agentik.core.memory.sqlite",
    "agentik.core.memory.markdown",
    "agentik.core.memory.embeddings",
    "agentik.core.background",
)


def test_a_bot_without_note_memory_loads_none_of_its_modules(tmp_path):
    without = _start_default_bot(tmp_path, web=False, memory="none", lazy=_LAZY + _NOTE_MEMORY)
    assert without["loaded"] == [], without
    (tmp_path / "default").mkdir()
    default = _start_default_bot(tmp_path / "default", web=False, lazy=_NOTE_MEMORY)
    assert "agentik.core.memory.sqlite" in default["loaded"], default  # what the list means


def test_the_same_bot_with_its_http_transport_enabled_serves_it_and_its_metrics(tmp_path):
    started = _start_default_bot(tmp_path, web=True)
    assert started["health"] == 200
    assert 'agentik_transport_state{state="connected",transport="web"} 1.0' in started["metrics"]
    assert "# TYPE agentik_turns_total counter" in started["metrics"]
    loaded = set(started["loaded"])  # type: ignore[arg-type]
    assert {"uvicorn", "starlette", "prometheus_client"} <= loaded, started
    assert "agentik.transports.http.transport" in loaded, started


_RUN = """
import json, sys
from agentik.bot.cli import main

LAZY = %r
code = main(["run", "-c", sys.argv[1]])
# What the process imported between its start and its stop (SIGTERM once /ready said 200).
print(json.dumps({"code": code, "loaded": sorted(m for m in LAZY if m in sys.modules)}))
"""


def test_agentik_run_until_ready_imports_none_of_what_the_default_config_does_not_use(
    tmp_path,
):
    """The CLI's own path (``agentik run``, not only ``Bot``): the shipped configuration
    with its terminal transport and a health listener, stopped once ``/ready`` answered
    200; neither Slack's nor IRC's libraries, nor the PostgreSQL store, nor the web
    server's optional parts it does not use were imported on the way."""
    import signal
    import socket
    import time
    import urllib.error
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    text = (_ROOT / "config.example.toml").read_text(encoding="utf-8")
    text = text.replace("\n[health]\n", f'\n[health]\nlisten = "127.0.0.1:{port}"\n', 1)
    config = tmp_path / "agentik.toml"
    config.write_text(text, encoding="utf-8")
    env = clean_env(OPENAI_BASE_URL="http://127.0.0.1:9/v1", OPENAI_API_KEY="x", OPENAI_MODEL="m")
    lazy = tuple(m for m in _LAZY if m not in ("uvicorn", "starlette", "httptools"))
    proc = subprocess.Popen(
        [sys.executable, "-c", _RUN % (lazy,), str(config)], cwd=tmp_path, env=env,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.communicate()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=10) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            assert time.monotonic() < deadline, "agentik run was not ready within 120 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen == {"code": 0, "loaded": []}, (seen, err[-2000:])


def _build_in_a_fresh_interpreter(script: str, folder: Path) -> dict[str, Any]:
    """Run ``script`` (``python -c``, the default configuration's path as its
    argument, on a fake OpenAI endpoint) in ``folder``; the JSON of its last line."""
    config = _default_config(folder, web=False)
    env = clean_env(OPENAI_BASE_URL="http://127.0.0.1:9/v1", OPENAI_API_KEY="x", OPENAI_MODEL="m")
    done = subprocess.run(
        [sys.executable, "-c", script, str(config)], cwd=config.parent, env=env,
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    seen: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return seen


_BUILD_TWICE = """
import gc, json, sys
from agentik.bot.app import Bot
from agentik.bot.config import load_config

config = load_config(sys.argv[1])
Bot(config)
first = gc.get_freeze_count()
enabled = gc.isenabled()
Bot(config)
again = gc.get_freeze_count()
gc.disable()
Bot(config)
print(json.dumps({"first": first, "again": again, "enabled": enabled,
                  "kept_disabled": not gc.isenabled()}))
"""


def test_building_a_bot_leaves_the_imports_objects_to_the_collectors_permanent_generation(
    tmp_path,
):
    """Start-up (docs/operations.md, "What a started bot imports"): the first build in a
    process freezes what the imports created, so no collection walks it again; later
    builds freeze nothing more, and the collector is left as the caller had it."""
    seen = _build_in_a_fresh_interpreter(_BUILD_TWICE, tmp_path / "freeze")
    # The modules of agentik and of the openai SDK: tens of thousands of objects.
    assert seen["first"] > 20_000, seen
    # A second build freezes nothing more (a frozen object that its last reference
    # lets go of still leaves the permanent generation: the count may only fall).
    assert seen["again"] <= seen["first"], seen
    assert seen["enabled"] and seen["kept_disabled"], seen


_FROZEN_GARBAGE = """
import gc, json, sys, types
from agentik.bot.app import Bot
from agentik.bot.config import load_config

Bot(load_config(sys.argv[1]))
# What the first build froze that nothing refers to: a collection with the frozen
# objects back in the collector's generations finds it, and DEBUG_SAVEALL keeps it.
gc.set_debug(gc.DEBUG_SAVEALL)
gc.unfreeze()
gc.collect()
copies = [o for o in gc.garbage if isinstance(o, dict) and len(o) > 100
          and {"sys", "builtins", "agentik.core"} <= o.keys()
          and isinstance(o["agentik.core"], types.ModuleType)]
print(json.dumps({"garbage": len(gc.garbage), "modules_copies": len(copies)}))
"""


def test_the_first_build_freezes_no_copy_of_the_module_table(tmp_path):
    """A settings field's ``default_factory=list`` made pydantic call
    ``inspect.signature(list)``, which leaves a reference cycle holding a copy of
    ``sys.modules``; with the collector paused and the result frozen, a started bot kept
    13 of them for its life (issue 31).  The settings use ``empty_list`` instead."""
    seen = _build_in_a_fresh_interpreter(_FROZEN_GARBAGE, tmp_path / "garbage")
    assert seen["garbage"] > 0, seen  # the check sees frozen garbage at all
    assert seen["modules_copies"] == 0, seen


def test_profiles_moved_to_streamprofiles_and_the_old_name_still_works():
    """``PROFILES`` is derived from the stream profiles, which build on the events."""
    import agentik.core
    from agentik.core import events, streamprofiles

    assert agentik.core.PROFILES is streamprofiles.PROFILES
    with pytest.warns(DeprecationWarning, match="import PROFILES from agentik.core.streamprofiles"):
        assert events.PROFILES is streamprofiles.PROFILES
    with pytest.raises(AttributeError, match="nonesuch"):
        _ = events.nonesuch


# -- layering and cycles, read from the source ------------------------------------------------
#
# The packages are layered: core (the agent) <- transports (chat protocols) <- bot (the
# program that wires them). A lower package never imports a higher one, not even inside
# a function or under TYPE_CHECKING. And no two modules import each other, counting
# imports inside functions: a function-local import that only dodges a cycle hides it.
# (TYPE_CHECKING imports are left out of the cycle check: annotations may name a
# higher module's types.) See docs/development.md, "Layering".

_SRC = Path(agentik.core.__file__).parent.parent  # src/agentik (a namespace package)
_LAYER = {"core": 0, "transports": 1, "bot": 2}


def _modules() -> dict[str, ast.Module]:
    found: dict[str, ast.Module] = {}
    for package in _LAYER:
        for path in sorted((_SRC / package).rglob("*.py")):
            parts = ["agentik", *path.relative_to(_SRC).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = ast.parse(path.read_text(encoding="utf-8"))
    return found


def _imports(modules: dict[str, ast.Module]) -> list[tuple[str, str, bool]]:
    """(importer, imported project module, under TYPE_CHECKING) for every import."""
    edges: list[tuple[str, str, bool]] = []
    for name, tree in modules.items():
        typing_only: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                typing_only.update(id(sub) for sub in ast.walk(node))
        is_package = (_SRC / Path(*name.split(".")[1:]) / "__init__.py").exists()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = name.split(".") if is_package else name.split(".")[:-1]
                    here = here[: len(here) - node.level + 1]
                    base = ".".join([*here, base] if base else here)
                targets = [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for target in targets:
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in modules and target != name:
                    edges.append((name, target, id(node) in typing_only))
    return edges


def test_no_package_imports_a_package_above_it():
    modules = _modules()
    breaches = [
        f"{a} -> {b}"
        for a, b, _ in _imports(modules)
        if _LAYER[b.split(".")[1]] > _LAYER[a.split(".")[1]]
    ]
    assert not breaches, breaches


def test_no_import_cycle_counting_function_local_imports():
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for a, b, typing_only in _imports(modules):
        # A package's __init__ importing its own submodules is how packages are built.
        if not typing_only and not b.startswith(a + "."):
            graph[a].add(b)
    cycles: list[list[str]] = []
    done: set[str] = set()
    for start in graph:
        # Depth-first search for a path back to ``start`` through modules not yet finished.
        stack: list[tuple[str, list[str]]] = [(start, [start])]
        seen: set[str] = set()
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    cycles.append(path)
                elif nxt not in seen and nxt not in done:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
        done.add(start)
    assert not cycles, [" -> ".join([*c, c[0]]) for c in cycles]


# Counting TYPE_CHECKING imports too: an annotation that names a higher module's class
# ties the modules together as much as a runtime import (neither can be read, checked or
# moved alone). Lower modules name a small Protocol of exactly the members they use
# instead (``core/hooktypes.py`` ConversationLike, ``core/protocols.py`` PartsLike and
# LiveConversation, ``core/services.py`` AgentLike, ``core/runs.py`` RunsOwner,
# ``bot/reload.py`` Reloadable), or are generic in the type the code above fills in
# (``AgentServices[C]``); mypy checks the real classes against them. The shared names
# moved down (``core/runs.py``: the run tree and the named agents' settings, under the
# conversation, its turns and the services). See docs/development.md, "Layering and imports".


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or not (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in graph:
        if node not in index:
            visit(node)
    return sorted(groups)


def test_no_import_cycle_counting_type_checking_imports():
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for a, b, _ in _imports(modules):
        if not b.startswith(a + "."):
            graph[a].add(b)
    assert _strongly_connected(graph) == []


def test_the_cycle_finder_finds_a_cycle_through_type_checking_imports():
    """The check above would pass on a finder that finds nothing: it finds this one."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _strongly_connected(graph) == [["a", "b", "c"]]


def test_the_run_tree_moved_below_the_conversation_and_the_documented_path_still_works():
    """The run tree and the named agents' settings live in ``core/runs.py`` (under the
    conversation, its turns and the services); ``agentik.core.agents``, their documented
    home, re-exports them: the same objects, and no warning."""
    import warnings

    from agentik.core import agents, runs

    moved = [
        "AGENT_TOOL_PREFIX",
        "DEFAULT_INPUT_SCHEMA",
        "AgentPrompt",
        "AgentSpec",
        "AgentUses",
        "RunLimits",
        "RunNode",
        "RunPolicy",
        "Runs",
        "agent_tool_name",
        "new_run_id",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in moved:
            assert getattr(agents, name) is getattr(runs, name)
            assert name in agents.__all__
        assert agents.AGENT_NAME is runs.AGENT_NAME
    assert "AgentTool" in agents.__all__


def test_hook_results_moved_below_the_hooks_and_the_documented_path_still_works():
    """The result types live in ``core/hooktypes.py`` (under both the hook specifications
    and the code that calls the hooks); plugins import them from ``agentik.core.hooks``,
    which stays their documented home: the same classes, and no warning."""
    import warnings

    from agentik.core import hooks, hooktypes

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in ("Abort", "Block", "Refuse", "Retry", "UseBackend"):
            assert getattr(hooks, name) is getattr(hooktypes, name)
            assert name in hooks.__all__
    assert hooks.Refuse("no") == hooktypes.Refuse("no")
