"""Suite-wide: the Redis Cluster tests (the Redis Cluster variants of engine-parametrized tests, and the tests of
Redis Cluster itself) are `slow`: a 3-master cluster and its restarts take seconds per test. `make test` covers
every engine's code with one redis-server; CI runs the Redis Cluster tests after it (`make test-slow`)."""

from __future__ import annotations

import pytest

_CLUSTER_VARIANTS = ("redis_cluster", "redis-cluster")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(variant in item.nodeid for variant in _CLUSTER_VARIANTS):
            item.add_marker(pytest.mark.slow)
