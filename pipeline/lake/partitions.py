"""Partition pruning: the `dt=/hour=` directories of a lake table that can hold rows of a time range.

The jobs read a time window, not the lake: `partition_paths` builds the `dt=` names of the days in the range and
lists only those days' `hour=` directories, so its cost grows with the length of the window, never with the
lake's history (the 400th day costs what the first did). Only without a lower bound (`since` None: "from the
beginning") does it list the table's days. Hidden names (`.`, `_`: files being written, state) are never
returned. The paths are directories; a reader that needs the committed files of each lists them there.

Times are UTC milliseconds since the epoch; the range is half open, [since, until).
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

DAY_MS = 86_400_000
HOUR_MS = 3_600_000


def day_name(day: dt.date) -> str:
    return f"dt={day.isoformat()}"


def _day(ms: int) -> dt.date:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).date()


def _day_start_ms(day: dt.date) -> int:
    return int(dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp() * 1000)


def parse_day(name: str) -> dt.date | None:
    """The day of a `dt=YYYY-MM-DD` directory name; None for any other name."""
    if not name.startswith("dt="):
        return None
    try:
        return dt.date.fromisoformat(name[3:])
    except ValueError:
        return None


def _hour(name: str) -> int | None:
    if not name.startswith("hour="):
        return None
    try:
        h = int(name[5:])
    except ValueError:
        return None
    return h if 0 <= h < 24 else None


def table_days(table_dir: Path) -> list[dt.date]:
    """Every `dt=` day of a table, ascending (a listing of the table's top level)."""
    try:
        names = os.listdir(table_dir)
    except FileNotFoundError:
        return []
    return sorted(d for d in (parse_day(n) for n in names) if d is not None)


def partition_paths(lake: str | Path, table: str, since_ms: int | None, until_ms: int | None) -> list[Path]:
    """The `dt=/hour=` directories of `<lake>/<table>` whose hour overlaps [since_ms, until_ms), ascending.
    None bounds are open: `since_ms` None lists the table's days, `until_ms` None ends at its newest day."""
    table_dir = Path(lake) / table
    known: list[dt.date] = []
    if since_ms is None or until_ms is None:
        known = table_days(table_dir)
        if not known:
            return []
    first = _day(since_ms) if since_ms is not None else known[0]
    last = _day(until_ms - 1) if until_ms is not None else known[-1]
    if since_ms is None:
        days = [d for d in known if d <= last]
    else:
        days = [first + dt.timedelta(days=i) for i in range((last - first).days + 1)]
    out: list[Path] = []
    for day in days:
        day_dir = table_dir / day_name(day)
        try:
            names = os.listdir(day_dir)
        except (FileNotFoundError, NotADirectoryError):
            continue
        start = _day_start_ms(day)
        hours = sorted(h for h in (_hour(n) for n in names) if h is not None)
        for h in hours:
            lo = start + h * HOUR_MS
            if (since_ms is None or lo + HOUR_MS > since_ms) and (until_ms is None or lo < until_ms):
                out.append(day_dir / f"hour={h:02d}")
    return out


def day_paths(lake: str | Path, table: str, since_ms: int | None, until_ms: int | None) -> list[Path]:
    """The `dt=` directories (a table partitioned by day only, like the aggregates) overlapping the range."""
    table_dir = Path(lake) / table
    known = table_days(table_dir) if since_ms is None or until_ms is None else []
    if since_ms is not None and until_ms is not None:
        first, last = _day(since_ms), _day(until_ms - 1)
        days = [first + dt.timedelta(days=i) for i in range((last - first).days + 1)]
        return [p for p in (table_dir / day_name(d) for d in days) if p.is_dir()]
    return [table_dir / day_name(d) for d in known
            if (since_ms is None or _day_start_ms(d) + DAY_MS > since_ms)
            and (until_ms is None or _day_start_ms(d) < until_ms)]
