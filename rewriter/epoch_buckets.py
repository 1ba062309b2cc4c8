"""Epoch-second buckets: Grafana's ``$__timeGroup(col, '1d')`` as a GROUP BY key over a declared time range.

Grafana's PostgreSQL data source expands ``$__timeGroup(col, interval)`` (and
``$__timeGroupAlias``, which adds ``AS "time"``) to ``floor(extract(epoch from col)/N)*N``, N the
interval in seconds: each row's bucket is the multiple of N seconds since 1970-01-01 00:00 UTC
at or before it, returned as a number of seconds (``numeric`` since PostgreSQL 14). A date or
a ``timestamp`` is read as UTC (its nominal time), a ``timestamptz`` as the instant it is.

Over a column whose policy declares a time range and opts ``day`` in, a bucket width of whole
days is a partition of the range into fixed intervals known from the policy and the statement
alone (each bucket a union of days): so it is answered as a histogram, one cell per bucket the
range touches, read in UTC. Narrower widths (Grafana's ``1h``, ``5m``) are finer than any
unit the policy can opt in, and refused.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlglot import exp

__all__ = ["DAY_SECONDS", "EPOCH", "bucket_of", "bucket_start", "epoch_bucket", "epoch_seconds"]

DAY_SECONDS = 86400
EPOCH = datetime(1970, 1, 1)
_MAX_SECONDS = 10**12  # beyond any time a datetime can hold: refused as no bucket width


def epoch_bucket(node: exp.Expression) -> tuple[exp.Column, int] | None:
    """The column and width N of ``floor(extract(epoch from col)/N)*N`` (N an integer literal, the
    same both times; parentheses allowed), or None if ``node`` is not written so."""
    product = _bare(node)
    if not isinstance(product, exp.Mul):
        return None
    floor, width = _bare(product.this), _bare(product.expression)
    if not isinstance(floor, exp.Floor) or floor.args.get("decimals") is not None:
        return None
    quotient = _bare(floor.this)
    if not isinstance(quotient, exp.Div):
        return None
    extract, divisor = _bare(quotient.this), _bare(quotient.expression)
    if not (isinstance(extract, exp.Extract) and isinstance(extract.this, exp.Var)
            and extract.this.name.upper() == "EPOCH" and isinstance(extract.expression, exp.Column)):
        return None
    seconds = _seconds(width)
    if seconds is None or seconds != _seconds(divisor):
        return None
    return extract.expression, seconds


def _bare(node: exp.Expression | None) -> exp.Expression | None:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def _seconds(node: exp.Expression | None) -> int | None:
    if not (isinstance(node, exp.Literal) and not node.is_string and node.this.isdigit() and len(node.this) <= 13):
        return None
    value = int(node.this)
    return value if 0 < value <= _MAX_SECONDS else None


def epoch_seconds(moment: datetime) -> int:
    """Whole seconds from 1970-01-01 00:00 to ``moment`` (a wall-clock time read as UTC), floored."""
    delta = moment - EPOCH
    return delta.days * DAY_SECONDS + delta.seconds


def bucket_of(moment: datetime, seconds: int) -> int:
    """The index (``floor(epoch / seconds)``) of the bucket ``moment`` falls in."""
    return epoch_seconds(moment) // seconds


def bucket_start(index: int, seconds: int) -> datetime:
    """The UTC wall-clock time bucket ``index`` starts at."""
    return EPOCH + timedelta(seconds=index * seconds)
