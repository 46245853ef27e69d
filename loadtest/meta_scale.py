"""The metadata database (`store.embedded.meta.store.MetaStore`, RocksDB) at scale: millions of sessions and retained
messages written through its API, then a fresh process that opens it and reads.

    python -m loadtest.meta_scale build|probe|gil|all [--sessions 10M] [--retained 1M] [--dir /tmp/meta_scale]
        [--gets 100k] [--json PATH]

- `build`: `--sessions` persistent sessions (2 subscriptions each: `devices/<n>/cmd` and one of 1000 wildcard
  filters `fleet/<k>/+`; 1% online, half with a finite expiry; ~120-byte records) by `put_sessions` 1000 at a
  time with one `sync_work` per 10 batches (a group commit's worth), then `--retained` retained messages
  (`devices/<n>/status`, 100-byte payloads) by `set_retained`. Time, the slowest batch (a write stall would show
  there), disk size, RSS of the writer.
- `probe` (a fresh process): open time and RSS after open, RSS after `--gets` random `get_session`s, the start-up
  indexes (online, due, filter counts) timed, then per-call latencies (µs, median and p99) of put_session,
  get_session, claim_session, set_offsets and match_retained (exact topic, `devices/<n>/+`, `devices/<n>/#`,
  and `devices/+/status` cut at 100), and RocksDB's own memory figures.
- `gil`: whether `sync_work` (fsync of the WAL) releases the GIL: iterations/s of a pure-Python loop alone and
  while another thread calls `sync_work` back to back after small writes; and the threads RocksDB runs.
Data sets live under `--dir`, never in the repository.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tidewire.store.base import NEVER_EXPIRES, Message, SessionRecord, SubscriptionRecord
from tidewire.store.embedded.meta.store import MetaLimits, MetaStore

BATCH = 1000
SYNC_EVERY = 10  # batches per sync_work
BASE_MS = 1_700_000_000_000
PAYLOAD = b"v" * 100


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def du_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


def client_id(i: int) -> str:
    return f"client-{i:08d}"


def record(i: int) -> SessionRecord:
    subs = {f"devices/{i}/cmd": SubscriptionRecord(f"devices/{i}/cmd", 1, since_seq=i),
            f"fleet/{i % 1000}/+": SubscriptionRecord(f"fleet/{i % 1000}/+", 1, since_seq=i)}
    return SessionRecord(client_id(i), 4, 3600 if i % 2 else NEVER_EXPIRES, subs, i, i,
                         disconnected_at_ms=0 if i % 100 == 0 else BASE_MS + i)


def count(text: str) -> int:
    text = text.strip().lower()
    mult = {"k": 1000, "m": 1_000_000}.get(text[-1:], 1)
    return int(float(text.rstrip("km")) * mult)


def build(path: Path, sessions: int, retained: int) -> dict[str, Any]:
    shutil.rmtree(path, ignore_errors=True)
    meta = MetaStore.open(path)
    out: dict[str, Any] = {}
    worst = 0.0
    t0 = time.perf_counter()
    for n, start in enumerate(range(0, sessions, BATCH)):
        recs = [record(i) for i in range(start, min(sessions, start + BATCH))]
        t = time.perf_counter()
        meta.put_sessions(recs)
        if n % SYNC_EVERY == SYNC_EVERY - 1:
            meta.sync_work()
        worst = max(worst, time.perf_counter() - t)
        if n % 1000 == 999:
            print(f"  {start + BATCH:>10,} sessions  {time.perf_counter() - t0:7.1f} s  RSS {rss_mb():.0f} MB",
                  flush=True)
    meta.sync_work()
    out["sessions_s"] = time.perf_counter() - t0
    out["sessions_worst_batch_ms"] = worst * 1000
    worst = 0.0
    t0 = time.perf_counter()
    for i in range(retained):
        t = time.perf_counter()
        topic = f"devices/{i}/status"
        meta.set_retained(topic, Message(topic, PAYLOAD, qos=1, retain=True, timestamp_ms=BASE_MS))
        if i % 10_000 == 9_999:
            meta.sync_work()
        worst = max(worst, time.perf_counter() - t)
    meta.sync_work()
    out["retained_s"] = time.perf_counter() - t0
    out["retained_worst_call_ms"] = worst * 1000
    out["writer_rss_mb"] = rss_mb()
    out["stats"] = meta.stats()
    t = time.perf_counter()
    meta.close()
    out["close_s"] = time.perf_counter() - t
    out["disk_mb"] = du_mb(path)
    return out


def timed(fn: Callable[[int], object], n: int) -> dict[str, float]:
    samples = []
    for i in range(n):
        t = time.perf_counter_ns()
        fn(i)
        samples.append((time.perf_counter_ns() - t) / 1000)
    samples.sort()
    return {"p50_us": statistics.median(samples), "p99_us": samples[int(len(samples) * 0.99)]}


def probe(path: Path, gets: int) -> dict[str, Any]:
    out: dict[str, Any] = {"rss_before_open_mb": rss_mb()}
    t = time.perf_counter()
    meta = MetaStore.open(path)
    out["open_s"] = time.perf_counter() - t
    out["rss_after_open_mb"] = rss_mb()
    counts = meta.counts()
    n_sessions, n_retained = counts["sessions"], counts["retained"]
    rng = random.Random(1)
    t = time.perf_counter()
    for _ in range(gets):
        meta.get_session(client_id(rng.randrange(n_sessions)))
    out["random_gets_s"] = time.perf_counter() - t
    out["rss_after_gets_mb"] = rss_mb()
    for name, fn in (("online_sessions", meta.online_sessions),
                     ("due_sessions_1000", lambda: meta.due_sessions(BASE_MS + 3_600_000 + 10**9, 1000)),
                     ("subscription_filters", meta.subscription_filters)):
        t = time.perf_counter()
        result = fn()
        out[f"{name}_ms"] = (time.perf_counter() - t) * 1000
        out[f"{name}_n"] = len(result)
    ids = [rng.randrange(n_sessions) for _ in range(20_000)]
    recs = [record(i) for i in ids]
    lat = {
        "get_session": timed(lambda k: meta.get_session(client_id(ids[k])), 20_000),
        "put_session_update": timed(lambda k: meta.put_session(recs[k]), 20_000),
        "put_session_new": timed(lambda k: meta.put_session(record(n_sessions + 10_000_000 + k)), 20_000),
        "claim_session": timed(lambda k: meta.claim_session(client_id(ids[k]), "n1"), 20_000),
        "set_offsets_1": timed(lambda k: meta.set_offsets({client_id(ids[k]): (k, k, 1 << 40)}), 20_000),
    }
    if n_retained:
        topics = [rng.randrange(n_retained) for _ in range(20_000)]
        lat["match_retained_exact"] = timed(lambda k: meta.match_retained(f"devices/{topics[k]}/status"), 20_000)
        lat["match_retained_level_plus"] = timed(lambda k: meta.match_retained(f"devices/{topics[k]}/+"), 20_000)
        lat["match_retained_level_hash"] = timed(lambda k: meta.match_retained(f"devices/{topics[k]}/#"), 20_000)
        lat["match_retained_wide_limit_100"] = timed(lambda k: meta.match_retained("devices/+/status", 100), 2_000)
    out["latency"] = lat
    out["rss_end_mb"] = rss_mb()
    out["stats"] = meta.stats()
    t = time.perf_counter()
    batches = sum(1 for _ in meta.iter_sessions(10_000))
    out["iter_all_sessions_s"] = time.perf_counter() - t
    out["iter_batches"] = batches
    out["rss_after_iter_mb"] = rss_mb()
    meta.close()
    return out


def spin(seconds: float) -> float:
    n = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(1000):
            n += 1
    return n / seconds


def gil(path: Path) -> dict[str, Any]:
    shutil.rmtree(path, ignore_errors=True)
    meta = MetaStore.open(path)
    out: dict[str, Any] = {"threads": sorted({Path(f"/proc/self/task/{t}/comm").read_text().strip()
                                              for t in os.listdir("/proc/self/task")})}
    out["spin_alone_per_s"] = spin(2.0)
    stop = threading.Event()
    syncs: list[float] = []

    def syncer() -> None:
        while not stop.is_set():
            t = time.perf_counter()
            meta.sync_work()
            syncs.append(time.perf_counter() - t)

    # the main thread writes (so every sync has WAL bytes to sync) and spins
    th = threading.Thread(target=syncer)
    th.start()
    n = 0
    end = time.perf_counter() + 2.0
    while time.perf_counter() < end:
        meta.put_session(record(n))
        for _ in range(1000):
            pass
        n += 1
    stop.set()
    th.join()
    out["writes_while_syncing_per_s"] = n / 2.0
    n = 0
    end = time.perf_counter() + 2.0
    while time.perf_counter() < end:
        meta.put_session(record(n))
        for _ in range(1000):
            pass
        n += 1
    out["writes_alone_per_s"] = n / 2.0
    out["syncs"] = len(syncs)
    out["sync_median_ms"] = statistics.median(syncs) * 1000 if syncs else 0.0
    # Had sync_work held the GIL, the writer would have lost about this share of its throughput.
    out["share_of_time_syncing"] = sum(syncs) / 2.0
    meta.close()
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("case", choices=("build", "probe", "gil", "all"))
    ap.add_argument("--sessions", default="10M")
    ap.add_argument("--retained", default="1M")
    ap.add_argument("--gets", default="100k")
    ap.add_argument("--dir", default="/tmp/meta_scale")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"meta-{args.sessions}-{args.retained}.rocks"
    results: dict[str, Any] = {"limits": MetaLimits().__repr__()}
    if args.case in ("build", "all"):
        results["build"] = build(path, count(args.sessions), count(args.retained))
        print(json.dumps(results["build"], indent=1), flush=True)
    if args.case in ("probe", "all"):
        if args.case == "all":  # a fresh process: RSS of a reader only
            cmd = [sys.executable, "-m", "loadtest.meta_scale", "probe", "--sessions", args.sessions,
                   "--retained", args.retained, "--gets", args.gets, "--dir", args.dir, "--json", str(root / "p.json")]
            subprocess.run(cmd, check=True)
            results["probe"] = json.loads((root / "p.json").read_text())["probe"]
        else:
            results["probe"] = probe(path, count(args.gets))
            print(json.dumps(results["probe"], indent=1), flush=True)
    if args.case in ("gil", "all"):
        results["gil"] = gil(root / "gil.rocks")
        print(json.dumps(results["gil"], indent=1), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
