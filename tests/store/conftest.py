"""Shared fixtures of the store tests: the embedded store, and `engine` (every engine) for the contract suite."""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from store.base import Store
from store.delaying import DelayingStore
from store.embedded import EmbeddedStore


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EmbeddedStore]:
    s = EmbeddedStore(tmp_path / "data", fsync="batch", segment_bytes=4096)
    await s.open()
    yield s
    await s.close()


# --- engines for the store contract suite (tests/store/test_contract.py) ----------------------------------


class Engine:
    """An opened store of one engine, with what the contract suite needs to know about it.

    `reopen()` closes the store and opens a fresh one over the same data, as after a restart; only engines
    that persist (`persistent`) support it. A Redis engine joins by adding a branch to `engine` below.
    """

    def __init__(self, name: str, factory: Callable[[], Store], persistent: bool) -> None:
        self.name = name
        self.persistent = persistent
        self._factory = factory
        self.store: Store = factory()

    async def reopen(self) -> Store:
        if not self.persistent:
            pytest.skip(f"{self.name} does not persist across a reopen")
        await self.store.close()
        self.store = self._factory()
        await self.store.open()
        return self.store


# Small enough that the contract suite stays quick (every call waits up to this), large enough to reorder.
CONTRACT_DELAY_MS = 2.0


@pytest.fixture(params=["embedded", "delaying"])
async def engine(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Engine]:
    data = tmp_path / "contract"

    def embedded() -> EmbeddedStore:
        # Small segments: reads after a reopen come from several files, not the in-memory tail.
        return EmbeddedStore(data, fsync="batch", segment_bytes=4096)

    if request.param == "embedded":
        eng = Engine("embedded", embedded, persistent=True)
    else:
        # A seed per test: a failure reproduces, while each test sees a different interleaving.
        seed = zlib.crc32(request.node.nodeid.encode())
        eng = Engine("delaying", lambda: DelayingStore(embedded(), CONTRACT_DELAY_MS, seed), persistent=True)
    await eng.store.open()
    try:
        yield eng
    finally:
        await eng.store.close()
