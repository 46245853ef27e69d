"""Versioned documents in the store, on every engine (`engine`: embedded, delaying, redis, redis cluster): the
compare-and-set that lets one writer of several win, the resend of a put whose reply was lost, names kept apart,
and survival across a reopen (for Redis a kill -9 of the server too)."""

from __future__ import annotations

import asyncio

from tests.store.conftest import Engine


async def test_documents_compare_and_set_and_survive_a_reopen(engine: Engine) -> None:
    s = engine.store
    assert await s.get_document("dynsec") == (0, b"")
    assert await s.put_document("dynsec", b"one", 1) == 0  # nothing at version 1 yet: refused
    assert await s.get_document("dynsec") == (0, b"")
    assert await s.put_document("dynsec", b"one", 0) == 1
    assert await s.get_document("dynsec") == (1, b"one")
    # A writer that read version 0 lost: nothing written.
    assert await s.put_document("dynsec", b"stale", 0) == 0
    assert await s.get_document("dynsec") == (1, b"one")
    body = bytes(range(256)) * 40  # any bytes, larger than a line
    assert await s.put_document("dynsec", body, 1) == 2
    # The resend of that put (its reply lost) is answered with the version it made, not a conflict...
    assert await s.put_document("dynsec", body, 1) == 2
    # ... but another value on the same expected version is a conflict.
    assert await s.put_document("dynsec", b"other", 1) == 0
    assert await s.put_document("other", b"x", 0) == 1  # names are apart
    assert await s.get_document("dynsec") == (2, body)
    await s.sync()
    s = await engine.reopen()
    assert await s.get_document("dynsec") == (2, body)
    assert await s.get_document("other") == (1, b"x")
    assert await s.put_document("dynsec", b"", 2) == 3  # an empty value is a value
    assert await s.get_document("dynsec") == (3, b"")


async def test_one_of_racing_writers_wins(engine: Engine) -> None:
    s = engine.store
    answers = await asyncio.gather(*(s.put_document("race", f"w{i}".encode(), 0) for i in range(8)))
    assert sorted(answers) == [0] * 7 + [1]
    winner = answers.index(1)
    assert await s.get_document("race") == (1, f"w{winner}".encode())
