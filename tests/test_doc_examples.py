"""Every SQL example a newcomer reads has the outcome the docs give it, through psql and dpproxy.

The ```sql blocks of README.md, docs/query-shapes.md and docs/bi-tools.md hold statements an
analyst sends, each ended by ``;`` as psql wants it. A statement the docs show refused carries
a comment ``-- refused: SQLSTATE`` or ``-- refused: SQLSTATE (rule: name)`` (the form psql
prints with ``\\set VERBOSITY verbose``); every other statement must be answered. A block whose
first line starts with ``-- on the backend`` is SQL run on PostgreSQL itself (grants, dpproxy's
own rewriting), not through dpproxy, and is not run here.

They run on the demo's ``adult`` (the database ``load_demo`` prepares, as ``dpproxy demo`` does)
beside the ``people`` table docs/query-shapes.md and docs/bi-tools.md use (tests/bi_data.py),
one psql per statement, with the analyst's spent ε read before and after: a refusal costs
nothing.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from bi_data import PEOPLE_TABLE, create_people
from conftest import RunningProxy, TestDatabase, psql_path
from psycopg.conninfo import make_conninfo

from policies.loader import load_policy
from proxy.demo.load import load_demo, service_dsn

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ("README.md", "docs/query-shapes.md", "docs/bi-tools.md")
BACKEND_BLOCK = "-- on the backend"
_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^\n`]*)$")
_REFUSED = re.compile(r"--\s*refused:\s*(?P<sqlstate>[0-9A-Z]{5})(?:\s*\(rule:\s*(?P<rule>[a-z0-9-]+)\))?")
_ERROR = re.compile(r"^ERROR:\s+(?P<sqlstate>[0-9A-Z]{5}): (?P<message>.*)$", re.MULTILINE)


@dataclass(frozen=True)
class Example:
    """One statement of a doc's SQL block and what the doc says becomes of it."""

    where: str  # document:line of the statement's first line
    sql: str
    refused_with: str | None  # the SQLSTATE, or None: answered
    rule: str | None

    def __str__(self) -> str:
        return self.where


def fenced_blocks(text: str, language: str) -> list[tuple[int, list[str]]]:
    """The fenced blocks of ``language`` in a Markdown text (indented ones too, as in a list):
    the line number of each block's first line and its lines, dedented."""
    blocks: list[tuple[int, list[str]]] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        fence = _FENCE.match(lines[index])
        index += 1
        if fence is None:
            continue
        indent, body, start = fence["indent"], [], index + 1
        while index < len(lines) and not _FENCE.match(lines[index]):
            body.append(lines[index].removeprefix(indent))
            index += 1
        index += 1  # the closing fence
        if fence["info"].strip().split(" ")[:1] == [language]:
            blocks.append((start, body))
    return blocks


class Unterminated(ValueError):
    """SQL left at the end of a block without the ``;`` psql needs to run it."""


def statements(block: list[str], start: int, document: str) -> list[Example]:
    """The statements of one block, split after each line whose code ends with ``;``; raise
    Unterminated for SQL after the last one."""
    examples: list[Example] = []
    pending: list[str] = []
    first = start
    for number, line in enumerate(block, start):
        code = line.split("--", 1)[0].strip()
        if code and not any(part.split("--", 1)[0].strip() for part in pending):
            first = number
        pending.append(line)
        if code.endswith(";"):
            text = "\n".join(pending).strip()
            marked = _REFUSED.search(text)
            examples.append(Example(f"{document}:{first}", text, marked["sqlstate"] if marked else None,
                                    marked["rule"] if marked else None))
            pending = []
    leftover = "\n".join(line for line in pending if line.strip() and not line.lstrip().startswith("--"))
    if leftover:
        raise Unterminated(f"{document}:{first}: SQL without the ';' that ends it in psql: {leftover!r}")
    return examples


def doc_examples() -> tuple[list[Example], list[str]]:
    """Every statement the documents show as sent through dpproxy, and the blocks' unterminated SQL."""
    examples: list[Example] = []
    unterminated: list[str] = []
    for document in DOCUMENTS:
        for start, block in fenced_blocks((ROOT / document).read_text(encoding="utf-8"), "sql"):
            if block and block[0].startswith(BACKEND_BLOCK):
                continue
            try:
                examples.extend(statements(block, start, document))
            except Unterminated as problem:
                unterminated.append(str(problem))
    return examples, unterminated


EXAMPLES, UNTERMINATED = doc_examples()


def test_every_doc_statement_ends_with_the_semicolon_psql_needs():
    assert not UNTERMINATED, "\n".join(UNTERMINATED)


def test_the_examples_are_found_in_every_document():
    found = {example.where.split(":")[0] for example in EXAMPLES}
    assert {"docs/query-shapes.md", "docs/bi-tools.md"} <= found, found
    assert len(EXAMPLES) >= 25
    assert any(example.refused_with for example in EXAMPLES)


def test_a_statement_without_its_semicolon_is_reported_with_its_line():
    with pytest.raises(Unterminated, match=r"doc.md:7: SQL without the ';'"):
        statements(["SELECT 1;", "-- a label", "SELECT count(*)", "  FROM people"], 5, "doc.md")


def test_the_refusal_marker_gives_the_sqlstate_and_the_rule():
    example, = statements(["SELECT * FROM people;   -- refused: DP001 (rule: no-row-access)"], 1, "d.md")
    assert (example.refused_with, example.rule) == ("DP001", "no-row-access")
    example, = statements(["SELECT age, count(*) FROM people;  -- refused: 42803"], 1, "d.md")
    assert (example.refused_with, example.rule) == ("42803", None)


@pytest.fixture(scope="module")
def demo_proxy(pg_admin_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """``dpproxy demo``'s database and policy, plus the docs' ``people`` table in both."""
    directory = tmp_path_factory.mktemp("doc-examples")
    policy_file = directory / "policy.yaml"
    load_demo(pg_admin_dsn, policy_file, port=0, ledger=directory / "ledger.sqlite3")
    create_people(TestDatabase(make_conninfo(pg_admin_dsn, dbname="demo"), service_dsn(pg_admin_dsn, "demo")))
    policy_file.write_text(policy_file.read_text(encoding="utf-8") + PEOPLE_TABLE.format(), encoding="utf-8")
    proxy = RunningProxy(load_policy(policy_file))
    yield proxy
    proxy.stop()


def _spent(stdout: str) -> list[str]:
    return [line.split("|")[1] for line in stdout.splitlines() if line.startswith("analyst|")]


@pytest.mark.parametrize("example", EXAMPLES, ids=str)
def test_doc_example_has_its_documented_outcome_through_psql(demo_proxy: RunningProxy, example: Example):
    budget = "SHOW dpproxy.budget"
    result = subprocess.run(
        [psql_path(), "-X", "-At", f"host={demo_proxy.host} port={demo_proxy.port} dbname=demo user=analyst",
         "-c", r"\set VERBOSITY verbose", "-c", budget, "-c", example.sql, "-c", budget],
        capture_output=True, text=True, env={**os.environ, "PGPASSWORD": "analyst"}, timeout=120,
    )
    errors = list(_ERROR.finditer(result.stderr))
    spent = _spent(result.stdout)
    assert len(spent) == 2, result.stdout + result.stderr
    if example.refused_with is None:
        assert not errors and result.returncode == 0, f"{example}: refused, but the docs answer it:\n{result.stderr}"
        return
    assert len(errors) == 1, f"{example}: answered, but the docs refuse it:\n{result.stdout}{result.stderr}"
    error = errors[0]
    assert error["sqlstate"] == example.refused_with, f"{example}: {error.group()}"
    if example.rule is not None:
        assert error["message"].endswith(f"(rule: {example.rule})"), f"{example}: {error.group()}"
    if example.refused_with.startswith("DP"):
        assert "HINT:" in result.stderr, f"{example}: no hint:\n{result.stderr}"
    assert spent[0] == spent[1], f"{example}: refused after a charge ({spent[0]} -> {spent[1]})"


def python_examples(document: str) -> list[object]:
    """The fenced ```python blocks of ``document``, one test parameter each, named by its line."""
    text = (ROOT / document).read_text(encoding="utf-8")
    return [pytest.param("\n".join(body), id=f"{document}:{start}") for start, body in fenced_blocks(text, "python")]


@pytest.mark.parametrize("code", python_examples("docs/bi-tools.md"))
def test_bi_tools_python_example_runs_against_the_demo(demo_proxy: RunningProxy, code: str):
    """Each client example of docs/bi-tools.md (SQLAlchemy and pandas, polars, ibis) runs as
    written, as a script of its own, against the demo's address, its port made the test proxy's."""
    assert "6432" in code, "no demo address to point at the test proxy"
    result = subprocess.run([sys.executable, "-c", code.replace("6432", str(demo_proxy.port))],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
