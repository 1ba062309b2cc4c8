"""What to group by instead: advice for the date groupings BI tools send that no opted-in unit answers.

A policy's time keys are ``DATE_TRUNC(unit, col)`` buckets of a declared range (weeks start on
Monday, as PostgreSQL's) and the date keys that are functions of them (:mod:`rewriter.date_parts`:
``EXTRACT(MONTH FROM col)``, Sunday weeks, ``CAST(col AS DATE)`` …), each answered only when the
column answers a unit whose bucket decides it (one its policy lists, or one nested in a listed
unit: ``policies.time_buckets``). What stays refused, and why the refusal says:

* a date part whose unit the column does not opt in (:func:`part_advice`: which unit to opt in);
* a part finer than a day (``EXTRACT(HOUR FROM col)``), finer than any unit;
* weeks that start on a day other than Monday written otherwise than Metabase's and Tableau's
  Sunday weeks (and those when ``day`` is not opted in).

:func:`date_shape_advice` recognises the unrecognised ones so that the refusal says what to do instead.
"""

from __future__ import annotations

from sqlglot import exp

__all__ = ["date_shape_advice", "part_advice"]

_WEEK_START = (
    "This groups by weeks that start on a day other than Monday (Metabase's and Tableau's default "
    "Sunday weeks); the week cells are PostgreSQL's DATE_TRUNC('week', col), which start on Monday. Group "
    "by DATE_TRUNC('week', col) (in Metabase: Admin settings → Localization → First day of the week: "
    "Monday), or by day or month; a column whose policy opts 'day' in also answers Metabase's and "
    "Tableau's Sunday weeks."
)
# A date part to the unit whose DATE_TRUNC keeps it apart in every year (or week).
_OF_PERIOD = {"month": "month", "quarter": "quarter", "week": "week", "day": "day", "doy": "day",
              "dow": "day", "isodow": "day", "weekday": "day"}
_FINER = frozenset({"hour", "minute", "second", "milliseconds", "microseconds", "epoch"})


def date_shape_advice(node: exp.Expression) -> str | None:
    """Advice for ``node``, a refused GROUP BY item, if it is one of the date groupings above; else None."""
    parts = [_field(part) for part in node.walk() if isinstance(part, exp.Extract)]
    truncations = [part for part in node.walk() if isinstance(part, (exp.TimestampTrunc, exp.DateTrunc))]
    if truncations and ("dow" in parts or "isodow" in parts or any(_shifted_week(part) for part in truncations)):
        return _WEEK_START
    if truncations or len(parts) != 1 or parts[0] is None:
        return None
    field = parts[0]
    if field in _FINER and field != "epoch":
        return (f"The {field} of a time is finer than any unit a policy opts in (a day at the finest): "
                "group by DATE_TRUNC('day', col) or a coarser unit.")
    unit = _OF_PERIOD.get(field)
    if unit is None:
        return None
    return (f"EXTRACT({field.upper()} FROM col) itself (maybe cast to an integer, in TRUNC, plus an integer) is a "
            f"key of a column whose policy opts '{unit}' in, other expressions of it are not: group by it and compute "
            "the rest in the select list.")


def part_advice(part: str, column: str, units: tuple[str, ...]) -> str:
    """Advice for a date key (``rewriter.date_parts``) over ``column``, which answers ``units``
    (listed or nested), none of them one whose bucket decides ``part``."""
    if part == "sunday_week":
        return _WEEK_START
    opted = ", ".join(units)
    if part == "date":
        return (f"The date of {column} is its day's bucket: it is answered when the policy opts 'day' in "
                f"({column} answers {opted}); group by DATE_TRUNC('<unit>', {column}) with one of those instead.")
    # The unit whose bucket decides the part, or a finer one it is nested in (policies.time_buckets).
    needed = {"month": "'month' or 'day'", "quarter": "'quarter', 'month' or 'day'", "week": "'week' or 'day'",
              "year": "'year', 'quarter', 'month' or 'day'"}.get(part) or f"'{_OF_PERIOD[part]}'"
    return (f"The {part.upper()} part of {column} is answered when the policy opts {needed} in ({column} answers "
            f"{opted}): ask the policy's owner to opt it in, or group by DATE_TRUNC('<unit>', {column}) with one "
            "of those units.")


def _field(node: exp.Extract) -> str | None:
    field = node.this
    return field.name.lower() if isinstance(field, (exp.Var, exp.Literal)) else None


def _shifted_week(node: exp.Expression) -> bool:
    """``date_trunc('week', <an expression of the column>)``, e.g. the column plus a day."""
    unit = node.args.get("unit")
    argument = node.this
    while isinstance(argument, exp.Paren):
        argument = argument.this
    return (isinstance(unit, (exp.Var, exp.Literal)) and unit.name.upper() in ("WEEK", "WEEKS", "W")
            and isinstance(argument, (exp.Add, exp.Sub)))
