"""The systemd unit docs/deployment.md gives, read as systemd reads it.

systemd takes no comment at the end of a line: ``TimeoutStopSec=40   # ...`` is a time it
cannot parse (ignored, so the 90 s default applied) and ``EnvironmentFile=/etc/dpproxy/env
# ...`` names a file that does not exist, so the service never started. Where
``systemd-analyze`` is installed it verifies the unit too.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _unit() -> str:
    """The ```ini block of docs/deployment.md."""
    text = (ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```ini\n(.*?)```", text, flags=re.S)
    return block


def _settings(unit: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#"))


def test_no_setting_of_the_unit_ends_in_a_comment():
    assert {key: value for key, value in _settings(_unit()).items() if "#" in value} == {}


def test_the_unit_can_be_enabled_and_runs_where_relative_policy_paths_can_be_written():
    unit = _unit()
    assert re.findall(r"^\[(\w+)\]$", unit, flags=re.M) == ["Unit", "Service", "Install"]
    settings = _settings(unit)
    assert settings["WantedBy"] == "multi-user.target"
    # The example policy's ledger and audit log are relative: under systemd's default working
    # directory, /, the dpproxy user could create neither.
    assert settings["WorkingDirectory"] == "/var/lib/" + settings["StateDirectory"]
    assert settings["ExecStart"].split()[1:] == ["serve", "-c", "/etc/dpproxy/policy.yaml"]


def test_systemd_analyze_verifies_the_unit(tmp_path: Path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:  # not a systemd machine: the two tests above are what can be checked
        return
    dpproxy = Path(sys.executable).parent / "dpproxy"
    unit = tmp_path / "dpproxy.service"
    unit.write_text(_unit().replace("/usr/local/bin/dpproxy", str(dpproxy)), encoding="utf-8")
    run = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "dpproxy.service" not in run.stderr, run.stderr
