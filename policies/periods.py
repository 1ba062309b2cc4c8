"""Budget periods: which UTC window a moment falls in.

A budget with a period resets at each period boundary. The ledger does not run a job at
midnight: it keys each user's spend by the period the charge falls in, so a new period
simply starts on a fresh row. Periods are in UTC; weeks start on Monday (ISO 8601).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Final

__all__ = ["PERIODS", "check_period", "next_period_start", "period_key", "period_start", "to_utc"]

#: The accepted values of ``Budget.period``; ``None`` means one budget for all time.
PERIODS: Final = (None, "day", "week", "month")


def check_period(period: str | None) -> None:
    """Raise ``ValueError`` unless ``period`` is one of ``PERIODS``."""
    if period not in PERIODS:
        raise ValueError(f"unknown budget period {period!r}; expected one of {PERIODS}")


def to_utc(now: datetime | None) -> datetime:
    """``now`` as an aware UTC datetime; ``None`` is the current time, naive means UTC."""
    if now is None:
        return datetime.now(timezone.utc)
    if now.tzinfo is None:
        return now.replace(tzinfo=timezone.utc)
    return now.astimezone(timezone.utc)


def period_start(period: str | None, now: datetime) -> datetime | None:
    """The UTC start of the period containing ``now``, or ``None`` without a period."""
    check_period(period)
    if period is None:
        return None
    day = to_utc(now).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        return day
    if period == "week":
        return day - timedelta(days=day.weekday())
    return day.replace(day=1)


def next_period_start(period: str | None, now: datetime) -> datetime | None:
    """The UTC start of the period after the one containing ``now`` (when the budget renews),
    or ``None`` without a period."""
    start = period_start(period, now)
    if start is None:
        return None
    if period == "day":
        return start + timedelta(days=1)
    if period == "week":
        return start + timedelta(days=7)
    return (start + timedelta(days=32)).replace(day=1)


def period_key(period: str | None, now: datetime) -> str:
    """The ledger row key of the period containing ``now``, e.g. ``'week:2024-04-29'``.

    The kind of period is part of the key, so switching a policy from daily to weekly
    never reads a daily row as the weekly spend.
    """
    start = period_start(period, now)
    if start is None:
        return "total"
    return f"{period}:{start.date().isoformat()}"
