"""``contrib/agentik.service``: a unit systemd accepts, with the promised settings."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import in_ci

UNIT = Path(__file__).resolve().parent.parent / "contrib" / "agentik.service"
SHIPPED_EXEC = "/usr/local/bin/agentik"


def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze") or (
        "/usr/bin/systemd-analyze" if os.path.exists("/usr/bin/systemd-analyze") else None
    )
    if found is None:
        message = "systemd-analyze is not installed (Debian/Ubuntu: apt-get install systemd)"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    return found


def keys(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")) and "=" in line:
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def verify(unit: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [systemd_analyze(), "verify", "--man=no", str(unit)],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def rendered(tmp_path: Path, text: str) -> Path:
    """The unit with ExecStart pointing at this venv's agentik (verify checks it exists)."""
    agentik = Path(sys.executable).with_name("agentik")
    assert agentik.exists(), agentik
    unit = tmp_path / "agentik.service"
    unit.write_text(text.replace(SHIPPED_EXEC, str(agentik)), encoding="utf-8")
    return unit


def test_systemd_analyze_verify_accepts_the_unit_without_a_warning(tmp_path):
    result = verify(rendered(tmp_path, UNIT.read_text(encoding="utf-8")))
    assert result.returncode == 0, result.stdout + result.stderr
    # Unknown or misspelt keys are only warnings: none is allowed.
    assert result.stdout + result.stderr == ""


def test_verify_would_catch_a_misspelt_key_and_a_missing_program(tmp_path):
    """The check above can fail: a typo and a wrong ExecStart are both reported."""
    text = UNIT.read_text(encoding="utf-8")
    typo = verify(rendered(tmp_path, text.replace("ProtectHome=", "ProtectHom=")))
    assert "ProtectHom" in typo.stderr
    unit = tmp_path / "missing.service"
    unit.write_text(text.replace(SHIPPED_EXEC, str(tmp_path / "no-agentik")), encoding="utf-8")
    missing = verify(unit)
    assert missing.returncode != 0 and "no-agentik" in missing.stderr


def test_the_unit_runs_reloads_restarts_and_is_hardened():
    k = keys(UNIT.read_text(encoding="utf-8"))
    assert k["ExecStart"] == [f"{SHIPPED_EXEC} run -c /etc/agentik/config.toml"]
    assert k["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert k["Type"] == ["notify"] and k["NotifyAccess"] == ["main"]
    assert k["EnvironmentFile"] == ["-/etc/agentik/agentik.env"]
    assert k["Restart"] == ["on-failure"] and "RestartSec" in k
    assert k["RestartPreventExitStatus"] == ["2"]  # agentik's exit status for a config error
    assert k["StateDirectory"] == ["agentik"] and k["WorkingDirectory"] == ["/var/lib/agentik"]
    assert k["DynamicUser"] == ["yes"]
    for hardening in ("ProtectSystem=strict", "ProtectHome=yes", "NoNewPrivileges=yes",
                      "PrivateTmp=yes", "CapabilityBoundingSet=",
                      "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6"):  # fmt: skip
        key, _, value = hardening.partition("=")
        assert k[key] == [value], key
