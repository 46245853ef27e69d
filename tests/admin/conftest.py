"""Fixtures of the admin API tests: one real gateway process per test module with its admin port on
(`admin_gateway`), an httpx client holding its token (`api`), and connected paho clients (`mqtt`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.integration.conftest import Gateway, PahoClient

MqttFactory = Callable[..., PahoClient]


def http(gw: Gateway, token: str | None = None) -> httpx.Client:
    """An HTTP client of `gw`'s admin port; `token` None: the node's, "": none at all."""
    token = gw.api_token if token is None else token
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=f"http://127.0.0.1:{gw.admin_port}", headers=headers, timeout=10.0)


@pytest.fixture(scope="module")
def admin_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A node (embedded store) with the admin port and AMQP on, shared by the tests of a module."""
    with Gateway(tmp_path_factory.mktemp("admin"), admin=True, amqp=True,
                 env={"TIDEWIRE_CLUSTER_SECRET": "cluster-s3cret"}) as gw:
        yield gw


@pytest.fixture
def api(admin_gateway: Gateway) -> Iterator[httpx.Client]:
    with http(admin_gateway) as client:
        yield client


@pytest.fixture
def mqtt(admin_gateway: Gateway) -> Iterator[MqttFactory]:
    """`mqtt(client_id, version=5, clean=True, connect=True, **connect keywords)` -> a paho client of the node,
    connected unless `connect=False` (closed after the test)."""
    made: list[PahoClient] = []

    def make(client_id: str, version: int = 5, clean: bool = True, keepalive: int = 60, connect: bool = True,
             **kwargs: Any) -> PahoClient:
        client = PahoClient(admin_gateway.port, client_id, version, clean, keepalive)
        made.append(client)
        if connect:
            client.connect(**kwargs)
        return client

    yield make
    for client in made:
        client.close()
