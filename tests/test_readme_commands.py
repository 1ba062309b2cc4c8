"""Every ``dpproxy`` command the README and the docs give a newcomer to type is one the command
line accepts: its sub-command and options exist, and its arguments are where they go.

The shell blocks (```sh) of README.md and docs/*.md are read line by line; each part of a line
(between ``&&``, ``;``, ``|``) that runs ``dpproxy`` is parsed by dpproxy's own argument parser,
as ``dpproxy`` would parse it, without running it. What the commands then do is the other tests'
(tests/test_draft_policy.py runs the draft, check-config and serve steps on a real database).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from proxy.cli.main import _parser

ROOT = Path(__file__).resolve().parent.parent
_FENCE = re.compile(r"^\s*```(?P<info>\S*)")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def _commands() -> list[tuple[str, list[str]]]:
    """(``file:line``, the arguments after ``dpproxy``) of each dpproxy command in a shell block."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        shell, held = False, ""
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            fence = _FENCE.match(line)
            if fence:
                shell = not shell and fence["info"] in ("sh", "bash", "shell")
                continue
            if not shell:
                continue
            if line.rstrip().endswith("\\"):  # continued on the next line
                held += line.rstrip()[:-1] + " "
                continue
            line, held = held + line, ""
            for part in re.split(r"&&|;|\|", line):
                words = shlex.split(part.strip().rstrip("& "), comments=True)
                while words and _ASSIGNMENT.match(words[0]):
                    words = words[1:]
                if words and words[0] == "dpproxy":
                    found.append((f"{path.relative_to(ROOT)}:{number}", words[1:]))
    return found


COMMANDS = _commands()


def test_the_docs_give_the_commands_of_the_path_from_a_fresh_clone_to_serving():
    given = {words[0] for _, words in COMMANDS if words}
    assert {"demo", "draft-policy", "check-config", "serve"} <= given


@pytest.mark.parametrize(("where", "words"), COMMANDS, ids=[where for where, _ in COMMANDS])
def test_each_dpproxy_command_of_the_docs_is_one_the_command_line_accepts(where: str, words: list[str]):
    try:
        _parser().parse_args(words)
    except SystemExit as exc:
        pytest.fail(f"{where}: dpproxy {shlex.join(words)} is refused by the command line (exit {exc.code})")
