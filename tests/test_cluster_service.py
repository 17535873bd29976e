"""``contrib/agentik@.service``: N workers as instances of one template unit."""

from __future__ import annotations

from test_service import SHIPPED_EXEC, UNIT, keys, rendered, verify

TEMPLATE = UNIT.with_name("agentik@.service")


def test_systemd_analyze_verify_accepts_an_instance_of_the_template(tmp_path):
    text = TEMPLATE.read_text(encoding="utf-8")
    instance = tmp_path / "agentik@1.service"
    rendered(tmp_path, text).rename(instance)
    result = verify(instance)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout + result.stderr == ""


def test_the_template_is_the_unit_with_an_instance_of_its_own():
    single, template = (keys(p.read_text(encoding="utf-8")) for p in (UNIT, TEMPLATE))
    assert template["ExecStart"] == [f"{SHIPPED_EXEC} run -c /etc/agentik/config.toml"]
    assert template["EnvironmentFile"] == [
        "-/etc/agentik/agentik.env",
        "-/etc/agentik/agentik-%i.env",
    ]
    assert template["Environment"].count("AGENTIK_WORKER=%H-%i") == 1
    assert template["StateDirectory"] == ["agentik/%i"]
    assert template["WorkingDirectory"] == ["/var/lib/agentik/%i"]
    # Everything else (readiness, stop, restarts, hardening) is the single unit's.
    differ = {"Description", "EnvironmentFile", "Environment", "StateDirectory",
              "WorkingDirectory"}  # fmt: skip
    assert {k: v for k, v in template.items() if k not in differ} == {
        k: v for k, v in single.items() if k not in differ
    }
