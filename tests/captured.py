"""The statements nine real clients sent to PostgreSQL 15, as captured in tests/data.

``tests/data/client-catalog-statements.md`` is a copy of the shared reference
(``shared/reference/client-catalog-statements.md``): every distinct SQL text psql,
psycopg, asyncpg, SQLAlchemy, pgjdbc, psqlODBC, node-postgres, pgbench and pg8000 sent
while connecting, introspecting a table ``people`` (oid 16389) and running two
aggregates on it. ``load_captured`` reads it; ``adapt`` points a statement at the test
database's ``adult`` instead.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CAPTURE_FILE", "SHARED_CAPTURE_FILE", "Captured", "adapt", "load_captured", "sql_blocks"]

CAPTURE_FILE = Path(__file__).parent / "data" / "client-catalog-statements.md"
# The original, beside the repository in the project's workspace (not in a plain clone).
SHARED_CAPTURE_FILE = Path(__file__).resolve().parents[2] / "shared" / "reference" / CAPTURE_FILE.name


@dataclass(frozen=True)
class Captured:
    """One captured statement text and how its client sent it."""

    client: str  # "psql", "jdbc", "odbc", ...
    category: str  # "catalog", "session", "transaction", "aggregate", or two joined by "+"
    protocol: str  # "Q": simple Query; "P": extended protocol (Parse)
    sql: str
    index: int  # position in the file, for stable test ids

    @property
    def id(self) -> str:
        return f"{self.index:03d}-{self.client}-{self.category}-{self.protocol}"

    @property
    def is_aggregate(self) -> bool:
        return "aggregate" in self.category.split("+")


_SECTION = re.compile(r"^### (?P<client>[\w-]+): (?P<category>[\w+]+) \(\d+ distinct\)$")
_PROTOCOL = re.compile(r"^`(?P<protocol>[QP])` x\d+$")


def sql_blocks(path: Path) -> Iterator[tuple[list[str], str]]:
    """Each ```sql block of a Markdown file: the lines since the previous block, and its text."""
    lines = path.read_text(encoding="utf-8").splitlines()
    before: list[str] = []
    i = 0
    while i < len(lines):
        if lines[i] == "```sql":
            end = lines.index("```", i + 1)
            yield before, "\n".join(lines[i + 1 : end])
            before, i = [], end
        else:
            before.append(lines[i])
        i += 1


def load_captured(path: Path = CAPTURE_FILE) -> list[Captured]:
    """Every ```sql block of the capture file, with its client, category and protocol."""
    found: list[Captured] = []
    client = category = protocol = ""
    for before, sql in sql_blocks(path):
        for line in before:
            if match := _SECTION.match(line):
                client, category = match["client"], match["category"]
            elif match := _PROTOCOL.match(line):
                protocol = match["protocol"]
        found.append(Captured(client, category, protocol, sql, len(found)))
    return found


def adapt(sql: str, table_oid: int) -> str:
    """The statement as the client would send it for the test table ``adult``.

    ``people`` becomes ``adult``, its oid literal ``'16389'`` the oid of adult, and the
    numeric column ``income`` of people becomes adult's ``hours_per_week`` (adult's own
    ``income`` is text).
    """
    sql = re.sub(r"\bpeople\b", "adult", sql)
    sql = sql.replace("'16389'", f"'{table_oid}'")
    return re.sub(r"\bincome\b", "hours_per_week", sql)
