"""A module of this repository as of a git revision, imported beside the working tree's.

For the before/after benchmarks (median_speed, row_stream): both versions of one module run
in one process, alternating, so that a busy shared machine slows both alike.
"""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent

__all__ = ["ROOT", "module_at"]


def module_at(path: str, rev: str | None) -> ModuleType:
    """A fresh copy of the module at ``path`` (relative to the repository) as of git revision
    ``rev`` (None: the working tree); its relative imports are of the working tree's package."""
    if rev is None:
        source = (ROOT / path).read_text()
    else:
        git = ["git", "show", f"{rev}:{path}"]
        source = subprocess.run(git, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    package = ".".join(Path(path).with_suffix("").parts[:-1])
    name = f"{package}._{Path(path).stem}_{rev or 'tree'}"
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    module.__package__ = package
    exec(compile(source, f"{rev or 'working tree'}:{path}", "exec"), module.__dict__)
    return module
