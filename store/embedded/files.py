"""Durable file writes shared by the embedded engine's files: the log, its index files, the holds, RocksDB's dir."""

from __future__ import annotations

import os
from pathlib import Path


def write_all(fd: int, data: bytes | memoryview) -> None:
    """os.write until done: a regular-file write can in principle be short (e.g. near a quota)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a create, rename or unlink in it) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
