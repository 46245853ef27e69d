"""Dynamic security on an in-process node (`gateway.ops.dynsec`, embedded store, no socket): the bootstrap admin is
made once and never overwrites a stored configuration; a request stores its change with compare-and-set and, when
another writer got in between, runs again on the newer configuration so neither change is lost; a document that is
not one is logged and leaves the configuration in force, which the next change stores over it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tidewire.extensions.dynsec.model import Client, Config
from tidewire.gateway.config import Settings
from tidewire.gateway.node import Node
from tidewire.gateway.ops.dynsec import DOCUMENT, DynamicSecurity
from tidewire.gateway.security import Security
from tidewire.lookup.base import InProcessLookup
from tidewire.notify.base import LocalNotifier
from tidewire.store.embedded.engine import EmbeddedStore


class RacedStore(EmbeddedStore):
    """Another node's change lands just before this node's next compare-and-set (once)."""

    race: Config | None = None

    async def put_document(self, name: str, value: bytes, expected: int) -> int:
        if self.race is not None:
            other, self.race = self.race, None
            assert await super().put_document(name, other.to_json(), expected) == expected + 1
        return await super().put_document(name, value, expected)


async def _node(tmp_path: Path, password: str) -> tuple[Node, RacedStore]:
    settings = Settings(data_dir=tmp_path, port=0, sys_events=False, node_id="n1", dynsec_enabled=True,
                        dynsec_admin_username="admin", dynsec_admin_password=password, dynsec_password_iterations=2)
    security = Security.build(settings)
    assert security.dynsec is not None
    store = RacedStore(tmp_path, fsync="never")
    await store.open()
    lookup = InProcessLookup()
    node = Node(settings, store, lookup, LocalNotifier(lookup), security.authorizer, auth=security.chain)
    node.dynsec = DynamicSecurity(node, security.dynsec)
    await node.start()
    return node, store


@pytest.fixture
async def started(tmp_path: Path) -> AsyncIterator[tuple[Node, RacedStore]]:
    node, store = await _node(tmp_path, "first-pw")
    yield node, store
    await node.stop()
    await store.close()


def _request(*commands: dict[str, object]) -> bytes:
    return json.dumps({"commands": list(commands)}).encode()


async def test_a_raced_change_is_run_again_on_the_newer_configuration(started: tuple[Node, RacedStore]) -> None:
    node, store = started
    dynsec = node.dynsec
    assert dynsec is not None and dynsec.state.version == 1  # the bootstrap admin
    assert set(dynsec.state.grants.config.clients) == {"admin"}
    other = dynsec.state.grants.config.clone()
    other.clients["elsewhere"] = Client("elsewhere")
    store.race = other
    result = await dynsec.execute(_request({"command": "createClient", "username": "here", "password": "pw"}))
    assert result.responses == [{"command": "createClient"}]
    version, body = await store.get_document(DOCUMENT)
    assert version == 3 and set(Config.from_json(body).clients) == {"admin", "elsewhere", "here"}
    assert dynsec.state.version == 3 and "here" in dynsec.state.grants.config.clients
    # A request that fails changes nothing stored.
    failed = await dynsec.execute(_request({"command": "createClient", "username": "here"}))
    assert failed.responses == [{"command": "createClient", "error": "Client already exists"}]
    assert (await store.get_document(DOCUMENT))[0] == 3


async def test_bootstrap_never_overwrites_and_a_bad_document_is_not_installed(tmp_path: Path) -> None:
    node, store = await _node(tmp_path, "first-pw")
    assert node.dynsec is not None
    await node.dynsec.execute(_request({"command": "createRole", "rolename": "kept"}))
    await node.stop()
    await store.close()
    node, store = await _node(tmp_path, "second-pw")  # a restart with another bootstrap password
    try:
        dynsec = node.dynsec
        assert dynsec is not None and "kept" in dynsec.state.grants.config.roles
        admin_hash = dynsec.state.grants.config.clients["admin"].password
        assert admin_hash is not None and "first-pw" not in admin_hash
        assert await store.put_document(DOCUMENT, b"{not a document", dynsec.state.version) > 0
        await dynsec.refresh()
        assert "kept" in dynsec.state.grants.config.roles  # the configuration in force stays...
        await dynsec.execute(_request({"command": "createRole", "rolename": "fixed"}))
        version, body = await store.get_document(DOCUMENT)  # ... and the next change overwrites the damage
        assert version == 4 and {"kept", "fixed"} <= set(Config.from_json(body).roles)
    finally:
        await node.stop()
        await store.close()
