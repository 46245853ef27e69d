"""The Redis connection's command packing: hiredis's bytes are exactly redis-py's, whatever the arguments."""

from __future__ import annotations

import pytest
from redis.asyncio.connection import Connection

from tidewire.store.redis.conn import with_c_packing


@pytest.mark.parametrize("args", [
    ("EVALSHA", "a" * 40, 2, "k1", "k2", 3, -1, 1.5, b"\x00\xffbody", "naïve"),
    ("CONFIG GET", "appendfsync"),  # a command name carrying a literal argument
    (b"CLIENT SETINFO", "LIB-NAME", "redis-py"),
    ("SET", "k", bytearray(b"v"), memoryview(b"w")),
])
def test_packed_bytes_are_redis_pys(args: tuple[object, ...]) -> None:
    ours = with_c_packing(Connection)()
    theirs = Connection()
    assert b"".join(ours.pack_command(*args)) == b"".join(theirs.pack_command(*args))
