"""`tidewire store check|compact|dump`: an operator's look into a stopped node's embedded data directory.

check    every log record's checksum and seq, every index file against its segment, and every session's index
         entries and counters in the metadata database; exit status 1 when something is wrong.
compact  rebuild the log's index files (the next open scans the segments) and compact the metadata database.
dump     a summary; with --queues, --sessions, --retained or --wills, those (--json for scripts).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from tidewire.store.base import SessionRecord
from tidewire.store.embedded.maintenance import check_log, queue_counts, rebuild_indexes, segments
from tidewire.store.embedded.meta.maintenance import check as check_meta
from tidewire.store.embedded.meta.options import DEFAULT_LIMITS, open_db
from tidewire.store.embedded.meta.store import MetaStore

store_app = typer.Typer(add_completion=False, help="Check, compact or dump an embedded data directory.")

DataDir = Annotated[Path, typer.Option("--data-dir", "-d", help="the node's data directory (the node stopped)")]
META = "meta.rocks"


def _open_meta(data_dir: Path) -> MetaStore:
    path = data_dir / META
    if not path.exists():
        raise typer.BadParameter(f"no metadata database at {path}", param_hint="--data-dir")
    try:
        return MetaStore(open_db(path, DEFAULT_LIMITS), path)
    except Exception as exc:  # RocksDB says "lock hold by current process" or "Resource temporarily unavailable"
        typer.echo(f"cannot open {path}: {exc} (is a node running on it?)", err=True)
        raise typer.Exit(2) from exc


def _echo_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True))


@store_app.command("check")
def check_command(data_dir: DataDir, json_out: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Verify checksums and indexes; exit status 1 if a problem is found."""
    report = check_log(data_dir / "log")
    meta = _open_meta(data_dir)
    try:
        meta_problems, meta_listed = check_meta(meta)
        counts = meta.counts()
    finally:
        meta.close()
    problems = report.problem_count + meta_problems
    if json_out:
        _echo_json({"segments": report.segments, "records": report.records, "bytes": report.bytes,
                    "first_seq": report.first_seq, "last_seq": report.last_seq,
                    "indexes_checked": report.indexes_checked, "indexes_missing": report.indexes_missing,
                    "problems": problems, "log_problems": report.problems, "meta_problems": meta_listed,
                    "notes": report.notes, "records_by_kind": counts})
    else:
        typer.echo(f"log: {report.segments} segments, {report.records} records ({report.first_seq}..{report.last_seq})"
                   f", {report.bytes} bytes; {report.indexes_checked} index files checked, "
                   f"{report.indexes_missing} missing (written at the next open)")
        typer.echo("records: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        for line in report.notes:
            typer.echo(f"note: {line}")
        for line in [*report.problems, *meta_listed]:
            typer.echo(f"PROBLEM: {line}")
        typer.echo(f"{problems} problem(s)")
    raise typer.Exit(1 if problems else 0)


@store_app.command("compact")
def compact_command(data_dir: DataDir) -> None:
    """Rebuild the log's index files at the next open and compact the metadata database."""
    meta = _open_meta(data_dir)  # first: it fails while a node holds the directory
    try:
        meta.compact()
    finally:
        meta.close()
    removed = rebuild_indexes(data_dir / "log")
    typer.echo(f"metadata compacted; {removed} index files removed: the next open rebuilds them from the segments")


@store_app.command("dump")
def dump_command(
    data_dir: DataDir,
    queues: Annotated[bool, typer.Option("--queues", help="every queue with its record count")] = False,
    sessions: Annotated[bool, typer.Option("--sessions", help="stored sessions")] = False,
    retained: Annotated[bool, typer.Option("--retained", help="retained messages (topic, size)")] = False,
    wills: Annotated[bool, typer.Option("--wills", help="stored wills")] = False,
    limit: Annotated[int, typer.Option(help="at most this many of each list (0: all)")] = 100,
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """A summary of the directory, or the listed kinds of records."""
    meta = _open_meta(data_dir)
    out: dict[str, Any] = {}
    try:
        found = segments(data_dir / "log")
        out["summary"] = {"segments": len(found), "log_bytes": sum(p.stat().st_size for _, p in found),
                          "first_segment_seq": found[0][0] if found else 0, **meta.counts()}
        cap = limit if limit > 0 else None
        if queues:
            out["queues"] = [{"queue": q, "records": n} for q, n in _first(queue_counts(data_dir / "log"), cap)]
        if sessions:
            out["sessions"] = [_session(r) for r in _first((r for b in meta.iter_sessions() for r in b), cap)]
        if retained:
            out["retained"] = [{"topic": m.topic, "bytes": len(m.payload), "qos": m.qos}
                               for m in _first(iter(meta.match_retained("#")), cap)]
        if wills:
            out["wills"] = [{"client_id": w.client_id, "topic": w.message.topic, "delay": w.delay_interval}
                            for w in _first(iter(meta.list_wills()), cap)]
    finally:
        meta.close()
    if json_out:
        _echo_json(out)
        return
    for kind, value in out.items():
        typer.echo(f"# {kind}")
        if isinstance(value, dict):
            for k, v in sorted(value.items()):
                typer.echo(f"{k}: {v}")
        else:
            for row in value:
                typer.echo("  ".join(f"{k}={v}" for k, v in row.items()))


def _first(items: Any, cap: int | None) -> list[Any]:
    out: list[Any] = []
    for item in items:
        if cap is not None and len(out) >= cap:
            break
        out.append(item)
    return out


def _session(r: SessionRecord) -> dict[str, Any]:
    return {"client_id": r.client_id, "level": r.protocol_level, "expiry": r.expiry_interval,
            "online": r.disconnected_at_ms == 0, "offset": r.offset, "subscriptions": sorted(r.subscriptions)}
