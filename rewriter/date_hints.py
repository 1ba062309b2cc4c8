"""What to group by instead: advice for the date groupings BI tools send that no declared key answers.

A policy's time keys are ``DATE_TRUNC(unit, col)`` buckets of a declared range (weeks start on
Monday, as PostgreSQL's) and, one to one with the year's buckets, ``EXTRACT(YEAR FROM col)``.
BI tools also send groupings that are none of these, and stay refused:

* a date part "of year" (Metabase's *Month of year*, Tableau's discrete *QUARTER(date)*:
  ``EXTRACT(MONTH FROM col)``, ``date_part('quarter', col)``), which puts the same month of
  every year in one group;
* weeks that start on Sunday (Metabase's default, ``date_trunc('week', (col + INTERVAL '1 day'))
  + INTERVAL '-1 day'``; Tableau's, ``DATE_TRUNC('day', CAST(col AS DATE)) + (-EXTRACT(DOW FROM
  col) * INTERVAL '1 DAY')``), none of them a Monday week.

:func:`date_shape_advice` recognises them so that the refusal says what to do instead.
"""

from __future__ import annotations

from sqlglot import exp

__all__ = ["date_shape_advice"]

_WEEK_START = (
    "This groups by weeks that start on a day other than Monday (Metabase's and Tableau's default "
    "Sunday weeks); the week cells are PostgreSQL's DATE_TRUNC('week', col), which start on Monday. Group "
    "by DATE_TRUNC('week', col) (in Metabase: Admin settings → Localization → First day of the week: "
    "Monday), or by day or month."
)
# A date part to the unit whose DATE_TRUNC keeps it apart in every year (or week).
_OF_PERIOD = {"month": "month", "quarter": "quarter", "week": "week", "day": "day", "doy": "day",
              "dow": "day", "isodow": "day"}
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
    period = "week" if field in ("dow", "isodow") else "year"
    return (f"EXTRACT({field.upper()} FROM col) puts the same {field} of every {period} in one group, which is no "
            f"declared key: group by DATE_TRUNC('{unit}', col) instead, one cell per {unit} of the declared range "
            f"(in Tableau a continuous date, in Metabase 'by {unit}' rather than '{unit.capitalize()} of {period}').")


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
