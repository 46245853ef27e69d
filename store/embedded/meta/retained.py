"""Retained-message lookup over the ordered keyspace of `store.embedded.meta.store`: a filter walks only the key
ranges it can reach, as the in-memory trie walked only its branches.

Keys are `R<topic>`. In bytewise order the topics under `a/` are exactly the keys in [`Ra/`, `Ra0`) ('0' is the
byte after '/'), so a literal level is one seek, `#` is one range scan, and `+` steps through the distinct
values of its level: each subtree `<level>/` is visited once and then skipped with one seek.

The walk meets keys in ascending order, so a page resumes after the last topic of the previous one: every seek
is raised to that floor, and a page costs its own keys plus a few seeks per filter level, never a scan of what
came before (a wildcard subscribe over a million retained messages streams them page by page).
"""

from __future__ import annotations

from rocksdict import Rdict, RdictIter, ReadOptions

from tidewire.store.embedded.meta.keys import RETAINED, prefix_end

_SLASH = b"/"
_AFTER_SLASH = b"0"


class _Walk:
    __slots__ = ("db", "floor", "it", "levels", "limit", "max_bytes", "nbytes", "out", "ro")

    def __init__(self, db: Rdict, levels: list[bytes], limit: int, floor: bytes = b"", max_bytes: int = 0) -> None:
        self.db = db
        # The iterator borrows its upper bound from the ReadOptions (rocksdict passes a pointer into the bytes the
        # options object holds): the options must outlive the iterator.
        self.ro = ReadOptions()
        self.ro.set_iterate_upper_bound(prefix_end(RETAINED))
        self.it: RdictIter = db.iter(self.ro)
        self.levels = levels
        self.limit = limit  # 0: no limit
        self.floor = floor  # the smallest key wanted (b"": from the start)
        self.max_bytes = max_bytes  # 0: no limit; else the walk ends once its values reach this many bytes
        self.nbytes = 0
        self.out: list[bytes] = []

    def full(self) -> bool:
        return 0 < self.limit <= len(self.out) or 0 < self.max_bytes <= self.nbytes

    def add(self, value: bytes) -> None:
        self.out.append(value)
        self.nbytes += len(value)

    def seek(self, key: bytes) -> None:
        self.it.seek(key if key > self.floor else self.floor)

    def exact(self, key: bytes) -> None:
        if key < self.floor:
            return
        value = self.db.get(key)
        if value is not None:
            self.add(value)

    def run(self) -> None:
        # Depth first over an explicit stack, not recursion (a filter may have thousands of levels): a task is
        # (prefix, level index, where a "+" level resumes stepping, or None for a fresh walk). A "+" that finds a
        # subtree pushes its own resumption, then the subtree: the first `limit` matches end the walk early.
        tasks: list[tuple[bytes, int, bytes | None]] = [(RETAINED, 0, None)]
        while tasks and not self.full():
            prefix, i, resume = tasks.pop()
            if resume is not None:
                self.step_levels(prefix, i, resume, tasks)
            else:
                self.walk(prefix, i, tasks)

    def walk(self, prefix: bytes, i: int, tasks: list[tuple[bytes, int, bytes | None]]) -> None:
        """Collect the keys under `prefix` (the key of a topic's first i levels plus "/", or the bare namespace at
        i == 0) that match levels[i:]."""
        levels, n = self.levels, len(self.levels)
        while levels[i] not in (b"#", b"+"):
            if i + 1 == n:
                self.exact(prefix + levels[i])
                return
            if i + 2 == n and levels[i + 1] == b"#":
                self.exact(prefix + levels[i])  # "a/#" also matches "a"
            prefix = prefix + levels[i] + _SLASH
            i += 1
        if levels[i] == b"#":
            self.scan_all(prefix, skip_dollar=i == 0)
        else:
            self.step_levels(prefix, i, prefix, tasks)

    def scan_all(self, prefix: bytes, skip_dollar: bool) -> None:
        it, n = self.it, len(prefix)
        self.seek(prefix)
        while it.valid():
            key = it.key()
            if not key.startswith(prefix):
                return
            if skip_dollar and key[n : n + 1] == b"$":
                # MQTT 4.7.2: a filter starting with a wildcard does not match topics starting with $
                self.seek(prefix + b"%")  # '%' follows '$': every "$..." first level is skipped at once
                continue
            self.add(it.value())
            if self.full():
                return
            it.next()

    def step_levels(self, prefix: bytes, i: int, start: bytes, tasks: list[tuple[bytes, int, bytes | None]]) -> None:
        """Step through the distinct values of level i under `prefix`, from key `start` on."""
        it, n = self.it, len(prefix)
        last = i + 1 == len(self.levels)
        # "a/+/#" also matches "a/x": a topic ending at this level matches when the filter ends here or with "#"
        ends_here = last or (i + 2 == len(self.levels) and self.levels[i + 1] == b"#")
        self.seek(start)
        while it.valid() and not self.full():
            key = it.key()
            if not key.startswith(prefix):
                return
            if i == 0 and key[n : n + 1] == b"$":
                self.seek(prefix + b"%")
                continue
            slash = key.find(_SLASH, n)
            if slash < 0:
                if ends_here:
                    self.add(it.value())
                it.next()
                continue
            after = key[:slash] + _AFTER_SLASH  # past this level value's subtree
            if last:
                self.seek(after)
                continue
            tasks.append((prefix, i, after))
            tasks.append((key[: slash + 1], i + 1, None))
            return


def match_retained_values(db: Rdict, topic_filter: str, limit: int = 0, after: str | None = None,
                          max_bytes: int = 0) -> list[bytes]:
    """Stored values of the retained messages whose topic matches `topic_filter`, in topic order (bytewise),
    those after topic `after` only (None: from the first), up to `limit` values (0: all) or until they reach
    `max_bytes` (0: no limit)."""
    levels = topic_filter.encode().split(_SLASH)
    floor = b"" if after is None else RETAINED + after.encode() + b"\x00"
    walk = _Walk(db, levels, limit, floor, max_bytes)
    try:
        walk.run()
    finally:
        del walk.it
    return walk.out

