"""Fixtures of the notify tests: a private redis-server per module and a flushed client per test."""

from tests.lookup.redis_fixtures import redis, server  # noqa: F401 - fixtures, found by name
