"""Data sets for `loadtest.store_scale`: realistic messages and sessions, written through the `Store` API into data
directories that are cached between runs, plus the child-process steps that build and open them.

Messages look like the gateway's: topics `dev/<i>/temp`, ~60-byte JSON payloads, QoS 1, and the queues
`gateway.core.subscriptions.SubscriptionRegistry.queues_for` gives them with a small wildcard set: the full topic, the
first level (`dev/#`) and, for one topic in `WILDCARD_EVERY`, the wildcard `dev/<i>/+`. Sessions are MQTT 5,
disconnected, expiry one day, with two exact-topic subscriptions (`cmd/<client>` and `fleet/<i>/config`).

The store is made by `gateway.server.build_store` from `gateway.config.Settings`, as the gateway makes it, so a
data directory built here is the layout the gateway opens (before and after the store's index changes). A data
set is cached as `<root>/<kind>-<count>[-t<topics>]/data`, valid while its `build.json` names the same store
fingerprint (a hash of the embedded engine's sources: a new layout is rebuilt, not migrated) and, for sessions,
while they are younger than `SESSION_CACHE_MAX_AGE_S` (older ones would expire when the gateway starts).

Every build and open runs in a child process (`python -m loadtest.store_data build-log|build-sessions|open`,
JSON on stdout), so the benchmark process stays small and each open starts with a cold heap.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tidewire.store.base import Message, SessionRecord, Store, SubscriptionRecord

REPO = Path(__file__).resolve().parent.parent
WILDCARD_EVERY = 100  # one topic in this many is also indexed into its `dev/<i>/+` wildcard queue
APPEND_BATCH = 10_000  # messages per Store.append (a batch never spans two segments)
SESSION_BATCH = 10_000  # put_session calls awaited together, then one Store.sync
SESSION_EXPIRY_S = 86_400
SESSION_CACHE_MAX_AGE_S = 12 * 3600  # half the expiry: the gateway must find every cached session alive
TOPIC_TABLE_MAX = 65_536  # up to this many topics the (topic, queues) pairs are precomputed
BUILD_TIMEOUT_S = 6 * 3600
OPEN_TIMEOUT_S = 3600
FINGERPRINT_EXCLUDE = ("redis_",)  # engine sources that do not shape the embedded layout


def parse_count(text: str) -> int:
    """`20k`, `5M`, `1.5M`, `1000` -> int."""
    t = text.strip().lower().replace("_", "")
    mult = 1
    if t and t[-1] in "kmg":
        mult = {"k": 1_000, "m": 1_000_000, "g": 1_000_000_000}[t[-1]]
        t = t[:-1]
    value = float(t) * mult
    if value <= 0 or value != int(value):
        raise ValueError(f"not a positive count: {text!r}")
    return int(value)


def count_label(n: int) -> str:
    for mult, suffix in ((1_000_000, "M"), (1_000, "k")):
        if n >= mult and n % mult == 0:
            return f"{n // mult}{suffix}"
    return str(n)


def topic_queues(i: int) -> tuple[str, tuple[str, ...]]:
    """Topic number i and the queues the gateway indexes it into (see the module docstring)."""
    topic = f"dev/{i}/temp"
    if i % WILDCARD_EVERY == 0:
        return topic, (topic, "dev/#", f"dev/{i}/+")
    return topic, (topic, "dev/#")


class MessageMaker:
    """Messages numbered from 0: message k goes to topic k % topics (the pairs of up to TOPIC_TABLE_MAX topics
    made once)."""

    def __init__(self, topics: int) -> None:
        self.topics = topics
        self._table = [topic_queues(i) for i in range(topics)] if topics <= TOPIC_TABLE_MAX else None

    def batch(self, first: int, count: int, now_ms: int) -> list[Message]:
        topics, table = self.topics, self._table
        out: list[Message] = []
        for k in range(first, first + count):
            i = k % topics
            topic, queues = table[i] if table is not None else topic_queues(i)
            payload = b'{"id":%d,"seq":%d,"temp":%d.%d,"hum":%d,"ts":%d}' % (
                i, k, 15 + k % 20, k % 10, 30 + k % 50, now_ms)
            out.append(Message(topic, payload, qos=1, timestamp_ms=now_ms, publisher=f"sensor-{i}",
                               queues=queues))
        return out


def session_record(i: int, now_ms: int) -> SessionRecord:
    cid = f"sess-{i:08d}"
    subs = {
        f"cmd/{cid}": SubscriptionRecord(f"cmd/{cid}", 1),
        f"fleet/{i % 1000}/config": SubscriptionRecord(f"fleet/{i % 1000}/config", 1),
    }
    return SessionRecord(cid, protocol_level=5, expiry_interval=SESSION_EXPIRY_S, subscriptions=subs,
                         disconnected_at_ms=now_ms)


def store_fingerprint() -> str:
    """Hash of the embedded engine's sources: a cached directory built by other code is rebuilt."""
    h = hashlib.sha256()
    for path in sorted((REPO / "store").glob("*.py")):
        if not path.name.startswith(FINGERPRINT_EXCLUDE):
            h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "store", "gateway"],
                               capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        # An exported tree (`git archive`) has no repository: its commit may be written beside it.
        marker = REPO / ".git-commit"
        return marker.read_text().strip() if marker.exists() else "unknown"
    return out + ("+dirty" if dirty else "")


def dir_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue
    return total


def proc_kb(field: str, pid: int | str = "self") -> int:
    """A `/proc/<pid>/status` field in KiB (VmRSS, VmHWM)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


# --- the cache -------------------------------------------------------------------------------------------
def data_set_dir(root: Path, kind: str, count: int, topics: int = 0) -> Path:
    return root / (f"{kind}-{count}" + (f"-t{topics}" if topics else ""))


def cached_build(dataset: Path, reuse_stale: bool = False) -> dict[str, Any] | None:
    """The build record of a cached data set still valid for this code (any code with `reuse_stale`), or None."""
    try:
        info: dict[str, Any] = json.loads((dataset / "build.json").read_text())
    except (OSError, ValueError):
        return None
    if info.get("fingerprint") != store_fingerprint() and not reuse_stale:
        return None
    if info.get("kind") == "sessions" and time.time() - info.get("built_at", 0) > SESSION_CACHE_MAX_AGE_S:
        return None
    return info


def ensure(dataset: Path, kind: str, count: int, topics: int = 0, *, rebuild: bool = False,
           reuse_stale: bool = False, min_free_factor: float = 1.5) -> dict[str, Any]:
    """The data set's build record, building it in a child process unless a valid one is cached."""
    info = None if rebuild else cached_build(dataset, reuse_stale)
    if info is not None:
        info["cached"] = True
        return info
    shutil.rmtree(dataset, ignore_errors=True)
    dataset.mkdir(parents=True)
    need = int(count * (bytes_per_message() if kind != "sessions" else bytes_per_session()) * min_free_factor)
    free = shutil.disk_usage(dataset).free
    if free < need:
        raise RuntimeError(f"{dataset}: {free / 1e9:.1f} GB free, {kind} {count_label(count)} needs ~"
                           f"{need / 1e9:.1f} GB (with margin)")
    cmd = [sys.executable, "-m", "loadtest.store_data", "build-sessions" if kind == "sessions" else "build-log",
           str(dataset / "data"), "--count", str(count)]
    if kind != "sessions":
        cmd += ["--topics", str(topics)]
    info = run_child(cmd, BUILD_TIMEOUT_S)
    info.update(kind=kind, count=count, topics=topics, built_at=time.time(), fingerprint=store_fingerprint(),
                commit=git_commit(), bytes=dir_bytes(dataset / "data"), cached=False)
    os.sync()  # dirty pages could not be dropped for a cold-cache run
    (dataset / "build.json").write_text(json.dumps(info, indent=1))
    return info


def bytes_per_message() -> int:
    return 200  # a little above a `MessageMaker` record plus its frame (~165 bytes)


def bytes_per_session() -> int:
    return 600


def run_child(cmd: Sequence[str], timeout: float, pin: Sequence[str] = ()) -> dict[str, Any]:
    """Run a `python -m loadtest.store_data` step and parse its JSON line."""
    proc = subprocess.run([*pin, *cmd], capture_output=True, text=True, timeout=timeout, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"{' '.join(cmd)} printed no result:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


# --- child-process steps -----------------------------------------------------------------------------------
def make_store(data_dir: Path, **overrides: Any) -> Store:
    """The store the gateway would open on `data_dir` (retention off: a cached data set must survive)."""
    from tidewire.gateway.config import Settings
    from tidewire.gateway.server import build_store

    return build_store(Settings(data_dir=data_dir, retention_seconds=0, retention_bytes=0, **overrides))


async def build_log(data_dir: Path, count: int, topics: int) -> dict[str, Any]:
    store = make_store(data_dir, fsync="never", store_recent_messages=0)
    await store.open()
    t0 = time.perf_counter()
    maker = MessageMaker(topics)
    for first in range(0, count, APPEND_BATCH):
        now_ms = int(time.time() * 1000)
        await store.append(maker.batch(first, min(APPEND_BATCH, count - first), now_ms))
    append_s = time.perf_counter() - t0
    rss = proc_kb("VmRSS")
    t1 = time.perf_counter()
    await store.close()
    return {"append_s": append_s, "close_s": time.perf_counter() - t1, "builder_rss_kb": rss,
            "builder_hwm_kb": proc_kb("VmHWM"), "last_seq": store.last_seq()}


async def build_sessions(data_dir: Path, count: int) -> dict[str, Any]:
    store = make_store(data_dir)
    await store.open()
    now_ms = int(time.time() * 1000)
    t0 = time.perf_counter()
    for first in range(0, count, SESSION_BATCH):
        batch = [session_record(i, now_ms) for i in range(first, min(count, first + SESSION_BATCH))]
        results = await asyncio.gather(*(store.put_session(r) for r in batch))
        if not all(results):
            raise RuntimeError("put_session was fenced off on a fresh store")
        await store.sync()
    put_s = time.perf_counter() - t0
    rss = proc_kb("VmRSS")
    t1 = time.perf_counter()
    await store.close()
    return {"put_s": put_s, "close_s": time.perf_counter() - t1, "builder_rss_kb": rss,
            "builder_hwm_kb": proc_kb("VmHWM")}


async def open_once(data_dir: Path, queue: str, session: str) -> dict[str, Any]:
    """Time `Store.open` and check that what was stored is there: the queue's first and newest messages, the
    session's record."""
    store = make_store(data_dir)
    rss0 = proc_kb("VmRSS")
    t0, cpu0 = time.perf_counter(), time.process_time()
    await store.open()
    open_s, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    rss = proc_kb("VmRSS")
    out: dict[str, Any] = {"open_s": open_s, "open_cpu_s": cpu_s, "rss_kb": rss, "rss_before_kb": rss0,
                           "hwm_kb": proc_kb("VmHWM"), "last_seq": store.last_seq()}
    if queue:
        # The topic's oldest messages, and the newest of its first-level queue (every message is in it).
        first = await store.read(queue, 0, 10)
        level = queue.split("/", 1)[0] + "/#"
        tail = await store.read(level, max(0, store.last_seq() - 1000), 1000)
        checked = first.messages + tail.messages[-10:]
        out["first_read"] = len(first.messages)
        out["read_ok"] = bool(first.messages) and bool(tail.messages) and all(
            m.topic.startswith(queue.split("/", 1)[0] + "/") and m.qos == 1 and m.payload.startswith(b'{"id":')
            for m in checked)
        out["newest_seq"] = tail.messages[-1].seq if tail.messages else 0
    if session:
        record = await store.get_session(session)
        out["session_ok"] = record is not None and len(record.subscriptions) == 2
    stats = getattr(store, "stats", None)
    if callable(stats):
        out["stats"] = stats()
    await store.close()
    return out


def _run(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(coro)
    return uvloop.run(coro)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m loadtest.store_data", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    b = sub.add_parser("build-log")
    b.add_argument("data_dir", type=Path)
    b.add_argument("--count", type=parse_count, required=True)
    b.add_argument("--topics", type=parse_count, default=1000)
    s = sub.add_parser("build-sessions")
    s.add_argument("data_dir", type=Path)
    s.add_argument("--count", type=parse_count, required=True)
    o = sub.add_parser("open")
    o.add_argument("data_dir", type=Path)
    o.add_argument("--queue", default="")
    o.add_argument("--session", default="")
    args = ap.parse_args(argv)
    if args.step == "build-log":
        result = _run(build_log(args.data_dir, args.count, args.topics))
    elif args.step == "build-sessions":
        result = _run(build_sessions(args.data_dir, args.count))
    else:
        result = _run(open_once(args.data_dir, args.queue, args.session))
    print(json.dumps(result, default=str), flush=True)


if __name__ == "__main__":
    main()
