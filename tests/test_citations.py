"""Works are cited by author, title and year (docs/references.md), never by the number of a
document a user does not have (the word seed and a three-digit number): not in any command's
--help, the docs, the README, docstrings, comments or test names. ``seed`` for random seeds
(partition_seed, DPPROXY_FUZZ_SEED, setseed) is not such a citation and stays.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from proxy.cli.main import _parser

ROOT = Path(__file__).resolve().parent.parent
# As the grep, plus test names (seed_NNN); written so that it does not match itself.
DOCUMENT_NUMBER = re.compile(r"seeds?[ _]?[0-9]{3}|seed[ ]0", re.IGNORECASE)
TEXT_SUFFIXES = {".py", ".md", ".txt", ".toml", ".yaml", ".yml", ".sql", ".cfg"}
SKIPPED_DIRS = {"node_modules", "__pycache__", "build", "dist"}


def _commands(parser: argparse.ArgumentParser, name: str = "dpproxy") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every command's parser, nested ones (``budget show``) included."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command, sub in action.choices.items():
                yield from _commands(sub, f"{name} {command}")


def _text_files() -> Iterator[Path]:
    for directory, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS and not d.endswith(".egg-info")]
        for file in files:
            path = Path(directory, file)
            if path.suffix in TEXT_SUFFIXES:
                yield path


def test_no_help_text_cites_a_document_number():
    commands = dict(_commands(_parser()))
    assert {"dpproxy epsilon", "dpproxy risk", "dpproxy budget show", "dpproxy serve"} <= commands.keys()
    for name, parser in commands.items():
        text = parser.format_help()
        assert not DOCUMENT_NUMBER.search(text), f"{name} --help: {DOCUMENT_NUMBER.search(text)}"
    shown = subprocess.run([sys.executable, "-m", "proxy.cli", "epsilon", "--help"],
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert shown.returncode == 0 and "Limiting Privacy Breaches in Differential Privacy" in shown.stdout


def test_no_doc_docstring_comment_or_test_name_cites_a_document_number():
    cited = []
    checked = 0
    for path in _text_files():
        checked += 1
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if DOCUMENT_NUMBER.search(line):
                cited.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert checked > 100  # the walk found the repository
    assert not cited, "\n".join(cited)


def test_every_link_into_the_references_names_an_entry():
    references = (ROOT / "docs" / "references.md").read_text(encoding="utf-8")
    entries = set(re.findall(r'<a id="([^"]+)"></a>', references))
    assert {"oyl", "nrs07", "mironov12", "dmns06", "mt07", "mcsherry09", "dr14"} <= entries
    for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for anchor in re.findall(r"references\.md#([\w-]+)", path.read_text(encoding="utf-8")):
            assert anchor in entries, f"{path.name}: references.md#{anchor} is no entry"
