"""The CLI from a plain install: a fresh venv holding the checkout and only the
dependencies it declares (no extras, no site packages of the test run's Python).

`pip install -e .` then `agentik status` once failed with ``No module named 'httpx'``:
the suite installs ``.[dev]``, which hid it.  pip reuses its download cache, so the
venv costs a wheel build, not a download of everything.
"""

from __future__ import annotations

import asyncio
import functools
import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from agentik.bot.cli import COMMANDS
from helpers import clean_env

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(1200)


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Path:
    """The bin/ folder of a venv with `pip install <checkout>` (no extras)."""
    where = tmp_path_factory.mktemp("plain") / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(where)
    bin_dir = where / "bin"
    subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "install", "-q",
         "--disable-pip-version-check", str(ROOT)],
        env=_env(), check=True, capture_output=True, text=True, timeout=1100,
    )  # fmt: skip
    return bin_dir


#: No PYTHONPATH: the venv must import what it installed, nothing of this test run.
_env = functools.partial(clean_env, drop=("PYTHONPATH", "VIRTUAL_ENV", "PIP_TARGET"))


def _run(bin_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bin_dir / "agentik"), *args], cwd=cwd, env=_env(), stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_the_plain_venv_has_only_the_declared_dependencies(plain):
    """The rig itself: httpx (a dev-extra package) is not there, agentik is."""
    probe = subprocess.run(
        [str(plain / "python"), "-c", "import agentik.bot.cli, importlib.util as u;"
         " print(u.find_spec('httpx') is None, agentik.bot.cli.__file__)"],
        env=_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    absent, where = probe.stdout.split()
    assert absent == "True"
    assert str(plain.parent) in where


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_on_a_plain_install(plain, tmp_path, command):
    result = _run(plain, *command.split(), "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: agentik " + command)
    assert "Traceback" not in result.stderr


async def test_run_status_check_conversations_and_memory_on_a_plain_install(
    plain, tmp_path, openai_server
):
    config = tmp_path / "bot.toml"
    config.write_text(
        f"""
[llm]
base_url = "{openai_server.base_url}"
model = "fake-model"
[storage]
path = "bot.db"
[health]
listen = "unix:h.sock"
[transports.web]
type = "http"
port = 0
""",
        encoding="utf-8",
    )
    run = lambda *a: asyncio.to_thread(_run, plain, *a, cwd=tmp_path)  # noqa: E731

    # Notes can be seeded before the first start: `memory add` creates the database.
    added = await run("memory", "add", "global", "deploys happen on Tuesday", "-c", str(config))
    assert added.returncode == 0, added.stderr
    assert added.stdout.strip() == "saved note #1 in global"

    checked = await run("check", "-c", str(config))
    assert checked.returncode == 0, checked.stdout + checked.stderr

    proc = await asyncio.create_subprocess_exec(
        str(plain / "agentik"), "run", "-c", str(config), cwd=tmp_path, env=_env(),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        async with asyncio.timeout(120):  # until the bot answers `agentik status` as ready
            while True:
                status = await run("status", "--json", "-c", str(config))
                assert "Traceback" not in status.stderr, status.stderr
                if status.returncode == 0 and json.loads(status.stdout).get("ready"):
                    break
                if proc.returncode is not None:  # ended: say why (its stderr)
                    _, err = await proc.communicate()
                    pytest.fail(f"agentik run ended ({proc.returncode}): {err.decode()[-4000:]}")
                await asyncio.sleep(0.2)
        text = await run("status", "-c", str(config))
        assert text.returncode == 0, text.stderr
        assert ": ready, up " in text.stdout.splitlines()[0]
    finally:
        if proc.returncode is None:
            proc.terminate()
        _, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()

    listed = await run("conversations", "list", "-c", str(config))
    assert listed.returncode == 0, listed.stderr
    notes = await run("memory", "list", "-c", str(config))
    assert "deploys happen on Tuesday" in notes.stdout


if sys.platform == "win32":  # pragma: no cover - the venv layout above is POSIX's
    pytest.skip("POSIX venv layout", allow_module_level=True)
