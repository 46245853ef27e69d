"""The Redis connection: command packing (hiredis's bytes are exactly redis-py's, whatever the arguments), the
`redis-sentinel://` URL and the replica settings, checked before anything connects."""

from __future__ import annotations

import pytest
from redis.asyncio.connection import Connection

from tidewire.errors import StartupError
from tidewire.gateway.config import Settings
from tidewire.gateway.server import build_store
from tidewire.store.redis.conn import RedisConn, SentinelURL, parse_sentinel_url, with_c_packing
from tidewire.store.redis.engine import RedisStore


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


# --- the redis-sentinel:// URL ------------------------------------------------------------------------------


def test_sentinel_url_with_every_part() -> None:
    got = parse_sentinel_url("redis-sentinel://app:s%40cret@10.0.0.1:26379,[::1]:26380,s3:26381/orders/2")
    assert got == SentinelURL([("10.0.0.1", 26379), ("::1", 26380), ("s3", 26381)], "orders", 2, "app", "s@cret")


def test_sentinel_url_db_defaults_to_0() -> None:
    got = parse_sentinel_url("redis-sentinel://127.0.0.1:26379/mymaster")
    assert (got.sentinels, got.master, got.db, got.username, got.password) == (
        [("127.0.0.1", 26379)], "mymaster", 0, None, None)


@pytest.mark.parametrize(("url", "says"), [
    ("redis-sentinel://127.0.0.1:26379", "master name is missing"),
    ("redis-sentinel://127.0.0.1:26379/", "master name is missing"),
    ("redis-sentinel://127.0.0.1:26379/m/x", "only a DB number"),
    ("redis-sentinel://127.0.0.1:26379/m/0/extra", "only a DB number"),
    ("redis-sentinel://127.0.0.1/m", "HOST:PORT"),
    ("redis-sentinel://127.0.0.1:0/m", "HOST:PORT"),
    ("redis-sentinel://:26379/m", "HOST:PORT"),
    ("redis-sentinel://a:1,,b:2/m", "HOST:PORT"),
    ("redis-sentinel://a:1/m?db=2", "no query"),
    ("redis://a:1/0", "not a sentinel URL"),
])
def test_sentinel_url_errors_name_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_sentinel_url(url)


def test_a_bad_sentinel_url_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="master name"):
        RedisConn("redis-sentinel://127.0.0.1:26379", connect_timeout=1, socket_timeout=1, max_connections=1,
                  pool_timeout=1)


def test_a_bad_sentinel_url_stops_the_node_with_a_clear_error() -> None:
    with pytest.raises(StartupError, match="redis-sentinel URL: the master name is missing"):
        build_store(Settings(store="redis-sentinel://127.0.0.1:26379"))


@pytest.mark.parametrize("kwargs", [{"replicas": 1, "replica_timeout": 0}, {"replicas": 1, "replica_timeout": 6.0},
                                    {"replicas": -1}, {"replicas": 1, "replica_backlog": 0}])
def test_replica_settings_are_checked(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="replica"):
        RedisStore("redis-sentinel://127.0.0.1:26379/m", **kwargs)  # type: ignore[arg-type]


def test_a_redis_cluster_store_does_not_wait_for_replicas() -> None:
    with pytest.raises(ValueError, match="Redis Cluster"):
        RedisStore("redis-cluster://127.0.0.1:7000", replicas=1)
