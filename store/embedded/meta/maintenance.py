"""Maintenance of the metadata database (`store.embedded.meta.store`): importing a legacy `meta.kv`, and checking that
every index entry and counter agrees with the records (after a crash, and for `tidewire store check`)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from tidewire.store.embedded.kv import OFFSET, RETAINED, SESSION, WILL, KVFile
from tidewire.store.embedded.meta import keys as K
from tidewire.store.groups import GROUP_NAMESPACES
from tidewire.store.records import OFFSETS, UnsupportedRecord, decode_message_body, decode_session, decode_will

if TYPE_CHECKING:
    from tidewire.store.embedded.meta.store import MetaStore

log = logging.getLogger("tidewire.store")

MAX_PROBLEMS = 100  # listed by `check`; the count goes on
_UNCONDITIONAL = 1 << 62  # an epoch above any stored one: the import applies offsets as the legacy replay did


def import_kv(meta: MetaStore, kv_path: Path) -> int:
    """Apply every record of a `store.embedded.kv` file, in file order, as the legacy engine replayed them.
    Returns how many."""
    kv = KVFile(kv_path)
    n = 0

    def on_record(ns: int, key: str, value: bytes | None) -> None:
        nonlocal n
        n += 1
        try:
            _apply(meta, ns, key, value)
        except UnsupportedRecord as exc:
            log.error("store: import: skipping a KV record (namespace %d) of a newer format: %s", ns, exc)

    kv.open(on_record)
    kv.close()
    return n


def _apply(meta: MetaStore, ns: int, key: str, value: bytes | None) -> None:
    if ns == SESSION:
        if value is None:
            meta.delete_session(key)
        else:
            meta.put_sessions([decode_session(value)], fenced=False)
    elif ns == OFFSET:
        if value is not None:
            offset, sent_upto = OFFSETS.unpack(value)
            meta.set_offsets({key: (offset, sent_upto, _UNCONDITIONAL)})
    elif ns == RETAINED:
        meta.set_retained(key, None if value is None else decode_message_body(value))
    elif ns == WILL:
        if value is None:
            meta.delete_will(key)
        else:
            meta.put_will(decode_will(value))
    elif ns in GROUP_NAMESPACES:
        if value is None:
            meta.write(deletes=[(ns, key)])
        else:
            meta.write(sets=[(ns, key, value)])


def _batches(it: Iterator[tuple[bytes, bytes]], size: int) -> Iterator[list[tuple[bytes, bytes]]]:
    chunk: list[tuple[bytes, bytes]] = []
    for item in it:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def check(meta: MetaStore, batch: int = 1000) -> tuple[int, list[str]]:
    """Verify records, index entries and counters; (problems found, the first MAX_PROBLEMS described).

    Streams: every session's expected index entries are looked up in batches and each index namespace's entries
    are counted, so memory is one batch plus the filter counts, whatever the number of sessions."""
    problems: list[str] = []
    found = 0

    def problem(text: str) -> None:
        nonlocal found
        found += 1
        if len(problems) < MAX_PROBLEMS:
            problems.append(text)

    expected = {K.ONLINE: 0, K.EXPIRY: 0, K.MEMBER: 0}
    filters: dict[str, int] = {}
    sessions = high = 0
    for chunk in _batches(meta.scan(K.SESSION, fill_cache=False), batch):
        offsets = meta.get_many([K.OFFSETS + key[1:] for key, _ in chunk])
        want: list[bytes] = []
        for (key, value), off in zip(chunk, offsets, strict=True):
            cid = key[1:].decode(errors="replace")
            try:
                rec = K.decode_session_value(cid, value)
            except ValueError as exc:
                problem(f"session {cid!r}: undecodable record ({exc})")
                continue
            sessions += 1
            high = max(high, rec.offset, rec.sent_upto)
            if off is not None:
                high = max(high, *K.OFFSETS_VALUE.unpack(off))
            for index_key in K.index_keys(rec):
                expected[index_key[:1]] += 1
                want.append(index_key)
            for f in K.counted_filters(rec):
                filters[f] = filters.get(f, 0) + 1
        for index_key, got in zip(want, meta.get_many(want), strict=True):
            if got is None:
                problem(f"missing index entry {index_key!r}")
    for ns, n in expected.items():
        actual = sum(1 for _ in meta.scan(ns, fill_cache=False))
        if actual != n:
            problem(f"index {ns.decode()}: {actual} entries, {n} expected")
    for key, _ in meta.scan(K.OFFSETS, fill_cache=False):
        if meta.get_many([K.SESSION + key[1:]])[0] is None:
            problem(f"offsets without a session: {key[1:]!r}")
    stored_filters = meta.subscription_filters()
    if stored_filters != filters:
        diff = {f for f in stored_filters.keys() | filters.keys() if stored_filters.get(f) != filters.get(f)}
        problem(f"filter counts differ for {sorted(diff)[:10]}")
    counts = meta.counts()
    actual_counts = {"sessions": sessions, "retained": sum(1 for _ in meta.scan(K.RETAINED, fill_cache=False)),
                     "wills": sum(1 for _ in meta.scan(K.WILL, fill_cache=False))}
    for name, n in actual_counts.items():
        if counts[name] != n:
            problem(f"counter {name} is {counts[name]}, {n} stored")
    if counts["high_seq"] < high:
        problem(f"counter high_seq {counts['high_seq']} is below a stored offset {high}")
    return found, problems
