"""What an analyst sees of a statement on one table but the noised values, and neighbouring
tables to compare it on: the attack tests' check that one row changes none of it."""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Sequence

import psycopg

from tests.value_spelling import Spelled, keep_number_texts, shape, spelled_apart, spelling

NUMBER = re.compile(r"-?\d+(\.\d+)?(e[+-]?\d+)?", re.IGNORECASE)
_BINARY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"


def binary_copy_tuples(data: bytes) -> list[list[bytes | None] | str]:
    """Binary COPY data (all of it, or one CopyData message): "header" and "trailer" where the
    file header and the trailer stand, and each tuple's cells (their bytes, None for NULL)."""
    out: list[list[bytes | None] | str] = []
    pos = 0
    if data.startswith(_BINARY_SIGNATURE):
        (extension,) = struct.unpack_from("!i", data, len(_BINARY_SIGNATURE) + 4)
        out.append("header")
        pos = len(_BINARY_SIGNATURE) + 8 + extension
    while pos < len(data):
        (count,), pos = struct.unpack_from("!h", data, pos), pos + 2
        if count == -1:
            out.append("trailer")
            continue
        cells: list[bytes | None] = []
        for _ in range(count):
            (size,), pos = struct.unpack_from("!i", data, pos), pos + 4
            cells.append(None if size == -1 else data[pos:pos + size])
            pos += max(size, 0)
        out.append(cells)
    return out


def binary_copy_cells(data: bytes) -> tuple[tuple[bool, ...] | str, ...]:
    """Binary COPY data reduced as the attack tests reduce text lines: each tuple's cells NULL
    or not, and where the file header and the trailer stand (:func:`binary_copy_tuples`)."""
    return tuple(item if isinstance(item, str) else tuple(cell is None for cell in item)
                 for item in binary_copy_tuples(data))


def masked_detail(detail: str | None, table: str) -> str:
    """An error's DETAIL compared whole but for ``table``'s name, except the line that is
    dpproxy's charge notice (an error after the charge carries it there): its numbers are the
    budget left and the noise's scale, masked as in a notice."""
    return "\n".join(NUMBER.sub("#", line) if line.startswith("dpproxy: ε charged") else line
                      for line in (detail or "").replace(table, "T").split("\n"))


# The figures of a notice that follow the noise or the budget, not the statement and the policy:
# what is left of the budget (each table's run charges in turn), and the error bound of noisy sum /
# noisy count and of noisy moments, which divide by the noisy count (mechanisms/sum_count.py,
# mechanisms/variance.py). Every other figure (ε and δ charged, a Laplace scale, sample and
# aggregate's worst-case bound, the candidates of an exponential mechanism, the groups) is compared.
_NOISED_FIGURES = (
    # ε and δ spelled as the client_encoding can: "?" in LATIN1, the bytes of UTF-8 in SQL_ASCII
    (re.compile(r"(remaining \S+ )[^,;\s]+(, \S+ )[^;\s\x1f]+"), r"\1#\2#"),
    (re.compile(r"(noisy sum / noisy count, scale )[^\s;]+"), r"\1#"),
    (re.compile(r"(\(95% within [^\d)/\s]*)[-\d.e+]+"), r"\1#"),  # "±" too spelled as the encoding can
)


def masked_notice(text: str, table: str) -> str:
    """A notice's text with ``table``'s name masked. In dpproxy's own notice (its cost and noise)
    only the figures that follow the noise or the budget (:data:`_NOISED_FIGURES`) are masked, so
    a figure the rows decided would differ; in any other (a backend's, passed through with a
    catalog statement: ``duration: 0.036 ms`` under ``log_duration``) every number is."""
    text = text.replace(table, "T")
    if "dpproxy: " not in text:
        return NUMBER.sub("#", text)
    for pattern, masked in _NOISED_FIGURES:
        text = pattern.sub(masked, text)
    return text


class Outcome(tuple[object, ...]):
    """A :func:`masked_outcome`, which also holds the spellings of its rows' numbers
    (``spelled``, :func:`tests.value_spelling.spelling`). Two are equal where their tuples are
    and each column's numbers, on both, follow one spelling rule
    (:func:`tests.value_spelling.spelled_apart`): a trailing zero or a scale that the rows
    decided makes them differ, the noise's digits do not."""

    spelled: tuple[tuple[Spelled, ...], ...] = ()

    def __new__(cls, items: tuple[object, ...], spelled: tuple[tuple[Spelled, ...], ...] = ()) -> Outcome:
        outcome = super().__new__(cls, items)
        outcome.spelled = spelled
        return outcome

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, tuple) or not tuple.__eq__(self, other):
            return False
        return not isinstance(other, Outcome) or not spelled_apart(self.spelled, other.spelled)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = tuple.__hash__


def masked_outcome(conn: psycopg.Connection, sql: str, table: str, params: tuple[object, ...] | None = None,
                   keys: int = 0) -> tuple[object, ...]:
    """``sql`` (``{t}`` standing for ``table``) run on ``conn``: an error's ("error", SQLSTATE,
    message, hint, DETAIL), or ("answer", the columns, the number of rows, their widths, the first
    ``keys`` values of each row as text, the tag, each column's type modifier and size, the
    shapes of the arrays of numbers, the notices (message, DETAIL and HINT) with the figures
    that follow the noise or the budget masked), as an :class:`Outcome` that holds the other
    values' spellings."""
    notices: list[str] = []

    def handler(diag: psycopg.errors.Diagnostic) -> None:
        notices.append("\x1f".join(text or "" for text in (diag.message_primary, diag.message_detail,
                                                             diag.message_hint)))

    conn.add_notice_handler(handler)
    try:
        with conn.cursor() as cursor:
            keep_number_texts(cursor.adapters)
            cursor.execute(sql.replace("{t}", table), params)
            columns = tuple((c.name, c.type_code) for c in cursor.description or ())
            result = cursor.pgresult
            modifiers = tuple((result.fmod(i), result.fsize(i)) for i in range(len(columns))) if result else ()
            rows = cursor.fetchall() if cursor.description else []
            return Outcome(("answer", columns, len(rows), frozenset(len(row) for row in rows),
                            tuple(tuple(map(str, row[:keys])) for row in rows), cursor.statusmessage, modifiers,
                            tuple(tuple(map(shape, row[keys:])) for row in rows),
                            tuple(masked_notice(n, table) for n in notices)),
                           tuple(tuple(map(spelling, row[keys:])) for row in rows))
    except psycopg.Error as exc:
        return ("error", exc.sqlstate, (exc.diag.message_primary or "").replace(table, "T"),
                (exc.diag.message_hint or "").replace(table, "T"), masked_detail(exc.diag.message_detail, table))
    finally:
        conn.remove_notice_handler(handler)


def same_on_neighbours(conn: psycopg.Connection, sql: str, tables: Sequence[str],
                       spent: Callable[[psycopg.Connection], float], keys: int = 0,
                       params: tuple[object, ...] | None = None) -> tuple[object, ...]:
    """``sql``'s :func:`masked_outcome` on each of ``tables`` (the base table first), asserting it
    is the same on all and that an error charged nothing (``spent``: the user's spent ε)."""
    base: tuple[object, ...] = ()
    for name in tables:
        before = spent(conn)
        outcome = masked_outcome(conn, sql, name, params, keys=keys)
        if name == tables[0]:
            base = outcome
        assert outcome == base, (name, sql, base)
        assert outcome[0] == "answer" or spent(conn) == before, (name, sql, outcome)
    return base


def create_neighbours(admin_dsn: str, base: str, neighbours: dict[str, str], ddl: str, rows: str) -> None:
    """Table ``base`` with ``rows``, and each of ``neighbours`` with the same rows plus its own one."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        for name in (base, *neighbours):
            conn.execute(f"DROP TABLE IF EXISTS {name}")
            conn.execute(f"CREATE TABLE {name} {ddl}")
            conn.execute(f"INSERT INTO {name} {rows}")
            conn.execute(f"GRANT SELECT ON {name} TO dpproxy_service")
        for name, row in neighbours.items():
            conn.execute(f"INSERT INTO {name} VALUES {row}")
