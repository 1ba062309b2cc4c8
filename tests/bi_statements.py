"""The statements a BI tool sent through dpproxy, as recorded in tests/data, and their outcomes.

``tests/data/superset-statements.md`` lists every distinct statement Apache Superset 6.1
sent while tests/test_superset.py ran, ``tests/data/pgadmin-statements.md`` every one pgAdmin
4 sent while tests/test_client_pgadmin.py ran (both recorded by tests/capture_relay.py),
grouped by what the tool was doing, each with the outcome dpproxy must give it: ``ok``
(answered), or the SQLSTATE of the refusal. tests/test_bi_statements.py replays them without
either tool (``replay``).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from psycopg import pq

from bi_data import PEOPLE_ROWS
from capture_relay import Recorded
from captured import sql_blocks

__all__ = ["PEOPLE_OID", "PGADMIN_HEADER", "PGADMIN_RECORD_FILE", "RECORD_FILE", "Expected", "load_recorded",
           "normalise", "replay", "write_recorded"]

RECORD_FILE = Path(__file__).parent / "data" / "superset-statements.md"
PGADMIN_RECORD_FILE = Path(__file__).parent / "data" / "pgadmin-statements.md"

_HEADER = """\
# Statements Apache Superset 6.1 sent through dpproxy (recorded)

Every distinct statement Superset (psycopg2, simple protocol) sent to dpproxy while
tests/test_superset.py ran, recorded by tests/capture_relay.py with
`DPPROXY_RECORD_SUPERSET=1 pytest tests/test_superset.py`, under the step where Superset
first sent it (connect, introspect, dataset creation, each chart). Each statement's line gives the protocol (`Q`: simple Query, `P`: Parse), how many
times it was sent, and the outcome dpproxy must give it: `ok` (answered) or the SQLSTATE of
the refusal. tests/test_bi_statements.py replays every one against the same table and policy
(tests/bi_data.py).
"""

PGADMIN_HEADER = """\
# Statements pgAdmin 4 (9.18) sent through dpproxy (recorded)

Every distinct statement pgAdmin 4 (psycopg 3) sent to dpproxy while
tests/test_client_pgadmin.py ran, recorded by tests/capture_relay.py with
`DPPROXY_RECORD_PGADMIN=1 pytest tests/test_client_pgadmin.py`, under the step where pgAdmin
first sent it (connect, the browser tree, a table's properties, statistics and dependencies,
the Dashboard, the Query Tool, *View/Edit Data*). Each statement's line gives the protocol
(`Q`: simple Query, `P`: Parse), how many times it was sent, and the outcome dpproxy must give
it: `ok` (answered) or the SQLSTATE of the refusal. tests/test_bi_statements.py replays every
one against the same table and policy (tests/bi_data.py); a `P` statement's parameters (not
recorded) are bound as NULLs.
"""

PEOPLE_OID = "<people-oid>"
"""Stands in the file for the oid of ``people`` at recording time (it changes every run)."""

_PHASE = re.compile(r"^## (?P<phase>[\w-]+)$")
_ENTRY = re.compile(r"^`(?P<protocol>[QP])` x(?P<count>\d+) → (?P<outcome>ok|[0-9A-Z]{5})$")


@dataclass(frozen=True)
class Expected:
    """One recorded statement and the outcome it must get."""

    phase: str
    protocol: str
    sql: str
    outcome: str  # "ok" or a SQLSTATE
    index: int

    @property
    def id(self) -> str:
        return f"{self.index:03d}-{self.phase}-{self.outcome}"


def normalise(sql: str, people_oid: int | None = None) -> str:
    """The statement with runs of white space folded (what counts as "the same statement") and,
    given ``people_oid``, that oid as a literal written as ``PEOPLE_OID``."""
    if people_oid is not None:
        sql = re.sub(rf"\b{people_oid}\b", PEOPLE_OID, sql)
    return " ".join(sql.split())


def write_recorded(recorded: list[Recorded], path: Path, people_oid: int, must_answer: frozenset[str],
                   header: str = _HEADER) -> None:
    """Write the distinct statements of a recording, in the order first sent, grouped by phase,
    under ``header``; the outcome of every statement of a phase in ``must_answer`` is written
    ``ok``, whatever it was (what dpproxy must do, not what this run's dpproxy did)."""
    recorded = [Recorded(r.phase, r.protocol, r.sql, "ok" if r.phase in must_answer else r.outcome)
                for r in recorded]
    counts = Counter((r.protocol, normalise(r.sql, people_oid), r.outcome) for r in recorded)
    seen: dict[tuple[str, str, str], Recorded] = {}
    for item in recorded:
        seen.setdefault((item.protocol, normalise(item.sql, people_oid), item.outcome), item)
    lines = [header]
    phase = None
    for key, item in sorted(seen.items(), key=lambda entry: _phase_order(recorded, entry[1].phase)):
        if item.phase != phase:
            phase = item.phase
            lines.append(f"## {phase}\n")
        lines.append(f"`{item.protocol}` x{counts[key]} → {item.outcome}")
        lines.append("```sql")
        lines.append(re.sub(rf"\b{people_oid}\b", PEOPLE_OID, item.sql.strip()))
        lines.append("```\n")
    path.write_text("\n".join(lines), encoding="utf-8")


def _phase_order(recorded: list[Recorded], phase: str) -> int:
    return next(i for i, r in enumerate(recorded) if r.phase == phase)


def load_recorded(path: Path = RECORD_FILE) -> list[Expected]:
    """Every ```sql block of a recording, with its phase, protocol and required outcome."""
    found: list[Expected] = []
    phase = protocol = outcome = ""
    for before, sql in sql_blocks(path):
        for line in before:
            if match := _PHASE.match(line):
                phase = match["phase"]
            elif match := _ENTRY.match(line):
                protocol, outcome = match["protocol"], match["outcome"]
        found.append(Expected(phase, protocol, sql, outcome, len(found)))
    return found


_READS_PEOPLE = re.compile(r"\bFROM\s+(public\.|\"public\"\.)?\"?people\b", re.IGNORECASE)
_OK = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK, pq.ExecStatus.EMPTY_QUERY)
_PARAMETER = re.compile(r"\$(\d+)")
_DECLARE = re.compile(r"\s*DECLARE\b", re.IGNORECASE)
_FETCH = re.compile(r"\s*FETCH\b", re.IGNORECASE)


def replay(pgconn: pq.abc.PGconn, expected: Expected, people_oid: int) -> None:
    """Send a recorded statement on ``pgconn`` as its tool did (a ``P`` one with NULL parameters)
    and assert its recorded outcome: answered, and then without people's exact row count unless
    it reads people (a DP answer); or refused with the recorded SQLSTATE and a hint. A failed
    transaction is rolled back after; so is the block of a cursor once it is fetched from, and a
    DECLARE outside a block gets one (pgAdmin's BEGIN before it is recorded once, earlier)."""
    sql = expected.sql.replace(PEOPLE_OID, str(people_oid))
    if _DECLARE.match(sql) and pgconn.transaction_status == pq.TransactionStatus.IDLE:
        # pgAdmin's server cursor runs in the block its BEGIN opened (recorded once, earlier).
        pgconn.exec_(b"BEGIN")
    if expected.protocol == "Q":
        result = pgconn.exec_(sql.encode())
    else:
        count = max((int(n) for n in _PARAMETER.findall(sql)), default=0)
        result = pgconn.exec_params(sql.encode(), [None] * count)
    message = (result.error_message or b"").decode(errors="replace")
    try:
        if expected.outcome == "ok":
            assert result.status in _OK, f"{message}\n--- statement ---\n{sql}"
            if not _READS_PEOPLE.search(sql):
                cells = {result.get_value(r, c) for r in range(result.ntuples) for c in range(result.nfields)}
                assert str(PEOPLE_ROWS).encode() not in cells, f"people's exact row count in\n{sql}"
        else:
            assert result.status == pq.ExecStatus.FATAL_ERROR, f"answered, expected {expected.outcome}:\n{sql}"
            assert result.error_field(pq.DiagnosticField.SQLSTATE) == expected.outcome.encode(), message
            assert result.error_field(pq.DiagnosticField.MESSAGE_HINT), message
    finally:
        if pgconn.transaction_status == pq.TransactionStatus.INERROR or (
                _FETCH.match(sql) and pgconn.transaction_status == pq.TransactionStatus.INTRANS):
            pgconn.exec_(b"ROLLBACK")
