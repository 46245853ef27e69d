"""The time window of an incremental batch job (`reports`, `alerts`): `--since/--until`, and where the last run
stopped.

`--since` and `--until` take a duration back from now (`1d`, `6h`, `90m`) or a timestamp (ISO 8601, e.g.
`2024-05-01T10:00:00Z`; without a zone: UTC). `--until` defaults to now. Without `--since` a job continues where
its last run stopped: the `until` recorded in `<lake>/_tidewire/jobs/<job>.json` after each successful run (the
first run, with no record, reads from the beginning). The record is written atomically after the job's output,
so a crashed run is simply run again over the same window.

The time arguments of every job live here (durations, `RuleError` for what cannot be parsed), with the
counts' argparse type and the atomic write of the jobs' state files.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from tidewire.pipeline.lake.schema import STATE_DIR

JOBS_DIR = "jobs"
UNITS = {"ms": 0.001, "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1, "m": 60, "min": 60, "mins": 60,
         "minute": 60, "minutes": 60, "h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600,
         "d": 86400, "day": 86400, "days": 86400}
MAX_DURATION = timedelta(days=366)
_DURATION_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*")


class RuleError(ValueError):
    """A rule, duration, topic template or gateway URL that cannot be used; the message says why."""


def positive_int(text: str) -> int:
    """An argparse type for counts and limits (shared by the jobs' command lines)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value}")
    return value


def seconds(text: str) -> float:
    """An argparse type for a duration in seconds: a bare number (`90`, `0`) or `parse_duration`'s forms."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return parse_duration(text).total_seconds()
    except RuleError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parse_duration(text: str) -> timedelta:
    """`90s`, `1m`, `2 minutes`, `1h30m`, `500ms` -> timedelta; a unit is required."""
    pos, seconds, parts = 0, 0.0, 0
    while pos < len(text):
        m = _DURATION_PART.match(text, pos)
        if m is None or m.end() == pos:
            break
        unit = UNITS.get(m.group(2).lower())
        if unit is None:
            raise RuleError(f"unknown duration unit {m.group(2)!r} in {text!r} (use ms, s, m, h or d)")
        seconds += float(m.group(1)) * unit
        parts += 1
        pos = m.end()
    if parts == 0 or pos != len(text):
        raise RuleError(f"bad duration {text!r}: expected a number and a unit, like 90s, 1m or 2 minutes")
    if seconds > MAX_DURATION.total_seconds():
        raise RuleError(f"duration {text!r} is longer than {MAX_DURATION.days} days")
    return timedelta(seconds=seconds)




@dataclass(frozen=True, slots=True)
class TimeWindow:
    """[since_ms, until_ms) in UTC ms; since None: from the beginning of the lake."""

    since_ms: int | None
    until_ms: int

    def widened(self, lookback_ms: int) -> TimeWindow:
        """The same window starting `lookback_ms` earlier (rows a window's rows refer back to)."""
        return TimeWindow(None if self.since_ms is None else self.since_ms - lookback_ms, self.until_ms)

    def describe(self) -> str:
        def iso(ms: int) -> str:
            return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")

        return f"[{'beginning' if self.since_ms is None else iso(self.since_ms)}, {iso(self.until_ms)})"


def parse_time(text: str, now_ms: int) -> int:
    """A duration back from `now_ms` or an ISO 8601 timestamp -> UTC ms. Raises RuleError with the reason."""
    text = text.strip()
    try:
        stamp = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        stamp = None
    if stamp is not None:
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=dt.UTC)
        return int(stamp.timestamp() * 1000)
    try:
        back = parse_duration(text)
    except RuleError as e:
        raise RuleError(f"{e}; or a timestamp like 2024-05-01T10:00:00Z") from None
    return now_ms - round(back.total_seconds() * 1000)


def checkpoint_path(lake: str, job: str) -> Path:
    if "://" in lake:
        raise RuleError("the lake is not a local directory: give --since explicitly (a job's checkpoint is a "
                        "local file)")
    return Path(lake) / STATE_DIR / JOBS_DIR / f"{job}.json"


def last_until(path: Path) -> int | None:
    """Where the last successful run stopped; None: no run yet. An unreadable record is an error, not a start
    from the beginning (that would redo the whole lake)."""
    try:
        doc = json.loads(path.read_text())
        return int(doc["until_ms"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise RuleError(f"unreadable job checkpoint {path}: {e}") from None


def write_json_atomic(path: Path, obj: dict[str, Any]) -> None:
    """The jobs' state files (a window's end, the published alerts), atomically: a temporary file, fsync,
    rename, fsync of the directory. (Not the lake writer's: a Spark driver's artifact leaves the bridge out.)"""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as f:
        f.write(json.dumps(obj))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_until(path: Path, until_ms: int) -> None:
    write_json_atomic(path, {"until_ms": until_ms})


def resolve(lake: str, job: str, since: str | None, until: str | None, now_ms: int) -> TimeWindow:
    """The window of a run: explicit bounds, else from the last run's `until` (else the beginning) to now."""
    until_ms = parse_time(until, now_ms) if until is not None else now_ms
    if since is not None:
        since_ms: int | None = parse_time(since, now_ms)
    else:
        since_ms = last_until(checkpoint_path(lake, job))
    if since_ms is not None and since_ms >= until_ms:
        raise RuleError(f"empty window: since {since_ms} is not before until {until_ms}")
    return TimeWindow(since_ms, until_ms)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--since", default=None,
                        help="start of the window: a duration back from now (1d, 6h) or a timestamp (ISO 8601, "
                             "UTC); default: where the last run stopped (the beginning on the first run)")
    parser.add_argument("--until", default=None, help="end of the window (exclusive), same forms; default now")
