"""A separately installed plugin with a broken hook implementation stops the bot at start-up.

Each plugin here is a real distribution, built and installed with pip into
its own folder, visible only to the ``agentik`` process it is given to (so
the rest of the test environment stays clean).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import agentik


def install_plugin(tmp_path: Path, module_source: str) -> Path:
    """Build and install the distribution ``agentik-typo`` (entry point ``typo``); its site dir."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "pyproject.toml").write_text(
        textwrap.dedent(
            """\
            [build-system]
            requires = ["setuptools>=77"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "agentik-typo"
            version = "1.2.3"

            [project.entry-points.agentik]
            typo = "typo_plugin"

            [tool.setuptools]
            py-modules = ["typo_plugin"]
            """
        )
    )
    (src / "typo_plugin.py").write_text(textwrap.dedent(module_source))
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--target", str(site), str(src)],
        check=True, env={**os.environ, "PIP_NO_INPUT": "1"}, timeout=300,
    )  # fmt: skip
    return site


def agentik_with(site: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``agentik`` with ``site`` first on its ``PYTHONPATH``, run next to it."""
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return agentik(*args, cwd=site.parent, env={"PYTHONPATH": path, **env}, timeout=60)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "bot.toml"
    path.write_text(
        f'[storage]\npath = "{tmp_path / "bot.db"}"\n\n[transports.t]\ntype = "stdio"\n'
    )
    return path


def assert_start_up_error(result: subprocess.CompletedProcess[str], *parts: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    for part in parts:
        assert part in line, line


MISSPELT = """
    from agentik.core.hookspecs import hookimpl

    @hookimpl
    def register_transport(register):  # the hook is register_transports
        register("pigeon", object)
"""


def test_a_misspelt_hook_stops_run_and_check_naming_hook_plugin_and_distribution(tmp_path, config):
    site = install_plugin(tmp_path, MISSPELT)
    expected = (
        "plugin 'typo' (agentik-typo 1.2.3)",
        "unknown hook 'register_transport'",
        "did you mean 'register_transports'?",
    )
    assert_start_up_error(agentik_with(site, "check", "-c", str(config)), *expected)
    run = agentik_with(site, "run", "-c", str(config))
    assert_start_up_error(run, *expected)
    assert not (tmp_path / "bot.db").exists(), "nothing may start before the plugins are checked"
    # Leaving the plugin out (AGENTIK_PLUGINS names the ones to load) gets the bot going.
    assert agentik_with(site, "check", "-c", str(config), AGENTIK_PLUGINS="").returncode == 0


WRONG_ARGUMENT = """
    from agentik.core.hookspecs import hookimpl

    @hookimpl
    def register_tools(add):  # the hookspec's argument is "register"
        pass
"""


def test_a_hook_with_a_wrong_argument_name_stops_start_up_naming_it(tmp_path, config):
    site = install_plugin(tmp_path, WRONG_ARGUMENT)
    result = agentik_with(site, "check", "-c", str(config))
    assert_start_up_error(result, "plugin 'typo' (agentik-typo 1.2.3)", "register_tools", "{'add'}")
