"""Shared fixtures for the embedded store tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from store.embedded import EmbeddedStore


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EmbeddedStore]:
    s = EmbeddedStore(tmp_path / "data", fsync="batch", segment_bytes=4096)
    await s.open()
    yield s
    await s.close()
