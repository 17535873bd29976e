"""The manual (docs/) and the README: short README, strict build, current config reference.

The manual is built with mkdocs (the ``docs`` extra, which ``make test`` installs); without
it the build checks skip, and under ``CI=true`` they fail.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from helpers import DOCS, in_ci, manual_text

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def _mkdocs(cwd: Path, site: Path) -> subprocess.CompletedProcess[str]:
    try:
        import material  # noqa: F401  (the theme mkdocs.yml names)
        import mkdocs  # noqa: F401
    except ImportError:
        if in_ci():
            pytest.fail("mkdocs and mkdocs-material are missing (pip install -e '.[docs]')")
        pytest.skip("mkdocs and mkdocs-material are missing (pip install -e '.[docs]')")
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def test_readme_is_short_and_starts_with_the_two_commands():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    first_block = re.search(r"```sh\n(.*?)```", text, re.S)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["make run", "make test"]


def test_readme_links_point_at_pages_that_exist():
    text = README.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text)
    assert any(t.startswith("docs/") for t in targets)
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_config_reference_is_current():
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_config_reference.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr


def test_config_reference_names_every_section_and_transport_type():
    reference = (DOCS / "reference" / "config.md").read_text(encoding="utf-8")
    for table in ("[agent]", "[llm]", "[storage]", "[tools]", "[memory]", "[compaction]"):
        assert f"`{table}`" in reference
    for table in ("[transports.<name>]", "[[mcp.servers]]", "[plugins]", "[logging]"):
        assert f"`{table}`" in reference
    for type_name in ("stdio", "irc", "slack", "http"):
        assert f'`type = "{type_name}"`' in reference
    assert "| `max_tool_argument_chars` | integer (&gt;= 1) | `64000` |" in reference


def test_moved_sections_are_in_the_manual():
    """What the README used to say is still said: the manual lost no section."""
    manual = manual_text()
    for phrase in (
        "After a crash: nothing left unanswered",
        "Delivery: the outbox.",
        "| IRC with `echo-message` |",
        "How the context is fitted",
        "| `max_tool_argument_chars` | 64000 |",
        "The transport conformance kit",
        "Writing a transport plugin",
        "`GET /agentik/conversations/{id}/events`",
        "**Reconnecting.**",
        "fold_system_prompt",
    ):
        assert phrase in manual, phrase


def test_strict_build_has_no_warning(tmp_path):
    result = _mkdocs(ROOT, tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    assert (tmp_path / "site" / "reference" / "config" / "index.html").exists()
    page = (tmp_path / "site" / "configuration" / "index.html").read_text(encoding="utf-8")
    assert "max_tool_argument_chars" in page  # config.example.toml, included whole


def test_strict_build_fails_on_a_broken_anchor(tmp_path):
    """The check above would catch a link to a heading that moved away."""
    copy = tmp_path / "repo"
    shutil.copytree(DOCS, copy / "docs")
    for name in ("mkdocs.yml", "config.example.toml", "slack-app-manifest.yaml"):
        shutil.copy(ROOT / name, copy / name)
    shutil.copytree(ROOT / "contrib", copy / "contrib")  # docs/deployment.md shows the unit
    index = copy / "docs" / "index.md"
    index.write_text(index.read_text() + "\n[gone](operations.md#no-such-section)\n")
    result = _mkdocs(copy, tmp_path / "site")
    assert result.returncode != 0
    assert "no-such-section" in result.stdout + result.stderr


def _key_names(model: type, seen: set[type] | None = None) -> set[str]:
    """The names of every key of ``model`` and of the tables nested in it."""
    seen = set() if seen is None else seen
    fields = getattr(model, "model_fields", None) or getattr(model, "__pydantic_fields__", None)
    if not fields or model in seen:
        return set()
    seen.add(model)
    names: set[str] = set()
    for name, field in fields.items():
        if getattr(field, "exclude", False):
            continue
        nested: set[str] = set()
        table = False
        stack = [field.annotation]
        while stack:
            ann = stack.pop()
            if isinstance(ann, type):
                # A table type seen before (two tables of one class) adds no new keys.
                table |= bool(
                    getattr(ann, "model_fields", None) or getattr(ann, "__pydantic_fields__", None)
                )
                nested |= _key_names(ann, seen)
            stack.extend(typing.get_args(ann))
        names |= nested if table else {name}  # a table shows as its keys, a key as itself
    return names


def test_config_reference_lists_every_key():
    """The generator walks the models; this walks them too, so it cannot skip a key."""
    from agentik.bot.config import Config
    from agentik.core.plugins import load_plugins

    reference = (DOCS / "reference" / "config.md").read_text(encoding="utf-8")
    names = _key_names(Config)
    registry = load_plugins((), env={"AGENTIK_PLUGINS": ""})
    for factory in [*registry.transports.values(), *registry.llm_backends.values()]:
        model = getattr(factory, "settings_model", None)
        if model is not None:
            names |= _key_names(model)
    assert len(names) > 100
    missing = sorted(n for n in names if f"| `{n}` |" not in reference)
    assert not missing, f"keys missing from docs/reference/config.md: {missing}"


def _without_table(text: str, header: str) -> str:
    """``text`` (a TOML file) without the table ``header`` and its keys."""
    out, skipping = [], False
    for line in text.splitlines(keepends=True):
        if line.startswith("["):
            skipping = line.strip() == header
        if not skipping:
            out.append(line)
    return "".join(out)


@pytest.mark.parametrize("transport", ["irc", "slack"])
def test_readme_recipes_work_on_a_copy_of_the_example_as_the_readme_says(tmp_path, transport):
    """A stranger copies config.example.toml and does what the README says with each
    recipe's table: the file loads, and the transport is on.  (The README said "add a
    table", and the example already has one of that name: TOML refuses the file.)"""
    from helpers import AGENTIK

    readme = README.read_text(encoding="utf-8")
    recipe = next(
        (m for m in re.finditer(r"```toml\n(.*?)```", readme, re.S)
         if f'type = "{transport}"' in m.group(1)),
        None,
    )  # fmt: skip
    assert recipe is not None
    header = recipe.group(1).splitlines()[0].strip()
    assert re.fullmatch(r"\[transports\.[\w-]+\]", header), header
    example = (ROOT / "config.example.toml").read_text(encoding="utf-8")
    said = readme[: recipe.start()].rsplit("```", 1)[-1]
    if f"\n{header}\n" in example:
        # The recipe's table is in the example: the README must say to replace it.
        assert "replace" in said and f"`{header}`" in said.replace("\n", " "), said
        example = _without_table(example, header)
    config = tmp_path / "bot.toml"
    config.write_text(example + "\n" + recipe.group(1), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AGENTIK_"))}
    env.update(IRC_SASL_PASSWORD="pw", SLACK_BOT_TOKEN="xoxb-1", SLACK_APP_TOKEN="xapp-1")
    result = subprocess.run(
        [AGENTIK, "check", "-c", str(config)],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,  # only guards against a hang
    )
    assert result.returncode == 0, result.stderr
    name = header[len("[transports.") : -1]
    assert f"transport {name}: {transport}\n" in result.stdout  # enabled: no "(disabled)"


def test_development_page_names_every_benchmark_and_what_make_bench_runs():
    """docs/development.md listed five of the nine benchmarks `make bench` runs, and
    bench_irc.py (run by nothing) nowhere."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    page = (DOCS / "development.md").read_text(encoding="utf-8")
    bench = re.search(r"^bench:.*?\n((?:\t.*\n)+)", makefile, re.M)
    assert bench is not None
    in_make = re.findall(r"benchmarks/bench_(\w+)\.py", bench.group(1))
    line = re.search(r"make bench +# benchmarks/bench_\{([\w,]+)\}\.py", page)
    assert line is not None, "docs/development.md: no `make bench` line"
    assert sorted(line.group(1).split(",")) == sorted(in_make)
    for path in sorted((ROOT / "benchmarks").glob("bench_*.py")):
        name = path.stem.removeprefix("bench_")
        assert name in in_make or f"benchmarks/{path.name}" in page, path.name


def test_configuration_page_names_every_section_and_channel_key():
    """docs/configuration.md's table of sections left out twelve of them ([mcp],
    [access], [health], ...) and five of the [channels."<pattern>"] keys."""
    from agentik.bot.chansettings import ChannelSettings
    from agentik.bot.config import Config
    from agentik.core.settings import setting_fields

    page = (DOCS / "configuration.md").read_text(encoding="utf-8")
    rows = [ln for ln in page.splitlines() if ln.startswith("| `[")]
    heads = " ".join(ln.split(" | ")[0] for ln in rows)
    missing = [s for s in Config.model_fields if s != "source" and f"`[{s}" not in heads
               and f"`[[{s}" not in heads]  # fmt: skip
    assert not missing, f"sections missing from the table: {missing}"
    channels = next(ln for ln in rows if ln.startswith('| `[channels."<pattern>"]`'))
    keys = [k for k in setting_fields(ChannelSettings) if f"`{k}`" not in channels]
    assert not keys, f"[channels] keys missing from the table: {keys}"


def test_operations_page_lists_every_chat_command():
    """The "Chat commands" table ("every transport has them") showed 11 of the 20."""
    from agentik.bot.bridge import COMMANDS

    page = (DOCS / "operations.md").read_text(encoding="utf-8")
    table = page.split("## Chat commands", 1)[1].split("\n## ", 1)[0]
    rows = " ".join(ln.split(" | ")[0] for ln in table.splitlines() if ln.startswith("| `"))
    missing = [c for c in COMMANDS if f"`{c}`" not in rows]
    assert not missing, f"chat commands missing from docs/operations.md: {missing}"


def test_no_page_installs_agentik_by_name_from_the_package_index():
    """docs/deployment.md said `sudo pipx install --global agentik`: the `agentik` on PyPI
    is an unrelated project, so that installed someone else's code as root. agentik is
    installed from a checkout (a path), never by name."""
    by_name = re.compile(
        r"(?:pipx|pip|uv tool) install (?:--?[\w-]+ )*"
        r"['\"]?agentik(?:\[[\w,]+\])?['\"]?(?=[\s`)]|$)"
    )
    pages = [README, ROOT / "contrib" / "agentik.service", *sorted(DOCS.rglob("*.md"))]
    found = [
        f"{page.relative_to(ROOT)}: {m.group(0)}"
        for page in pages
        for m in by_name.finditer(page.read_text(encoding="utf-8"))
    ]
    assert not found, found
