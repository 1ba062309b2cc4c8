"""./run-tests, the README's test command, on a machine that lacks packages and where it may not
install them (not root, no sudo): it prints the one apt-get line and stops, running nothing.

The script runs from a copy of it alone in a temporary folder, so anything it ran (a venv, pip,
pytest) would have to happen there; PATH holds only a fake ``id`` (uid 1000), a fake ``apt-get``
that records being called, and ``dirname``: no sudo, no python3, no client.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_PREFIX = "sudo apt-get update && sudo apt-get install --no-install-recommends "


def _run_without_root(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    repo, bin_dir = tmp_path / "repo", tmp_path / "bin"
    repo.mkdir()
    bin_dir.mkdir()
    shutil.copy(ROOT / "run-tests", repo)
    (bin_dir / "id").write_text("#!/bin/sh\necho 1000\n")
    (bin_dir / "apt-get").write_text(f"#!/bin/sh\n: > '{tmp_path}/apt-get-ran'\n")
    for fake in ("id", "apt-get"):
        (bin_dir / fake).chmod(0o755)
    dirname = shutil.which("dirname")
    assert dirname is not None
    (bin_dir / "dirname").symlink_to(dirname)
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    return subprocess.run(["/bin/bash", str(repo / "run-tests"), *args], env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=60)


def _ran_nothing(tmp_path: Path) -> bool:
    return sorted(p.name for p in (tmp_path / "repo").iterdir()) == ["run-tests"] \
        and not (tmp_path / "apt-get-ran").exists()


def test_fast_subset_without_python_prints_only_python_packages_and_stops(tmp_path: Path):
    result = _run_without_root(tmp_path, "-m", "not clients")
    assert result.returncode == 1, result.stderr
    assert result.stdout == _PREFIX + "python3 python3-venv\n"
    assert "missing system packages" in result.stderr
    assert _ran_nothing(tmp_path)


def test_whole_suite_without_clients_prints_one_apt_line_with_every_missing_client_and_stops(tmp_path: Path):
    result = _run_without_root(tmp_path)
    assert result.returncode == 1, result.stderr
    (line,) = result.stdout.splitlines()
    assert line.startswith(_PREFIX)
    packages = line.removeprefix(_PREFIX).split()
    # Found by their programs, all absent from this PATH; the rest are files that may be installed here.
    assert {"python3", "python3-venv", "postgresql-client", "postgresql", "default-jdk-headless", "nodejs", "npm",
            "unixodbc", "docker-compose", "openssl", "valgrind"} <= set(packages)
    assert set(packages) <= {"python3", "python3-venv", "postgresql-client", "postgresql", "pgbouncer",
                             "default-jdk-headless", "libpostgresql-jdbc-java", "nodejs", "npm", "unixodbc",
                             "odbc-postgresql", "docker-compose", "openssl", "valgrind"}
    assert './run-tests -m "not clients"' in result.stderr
    assert _ran_nothing(tmp_path)
