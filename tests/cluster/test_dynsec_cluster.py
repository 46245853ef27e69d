"""Dynamic security across a cluster (real processes, real Redis): a client and role made with `mosquitto_ctrl` on
one node are in force on the other at once (the node that stores a change tells the others before it answers); a
grant revoked there stops delivery to a client connected to the other node; disabling it there disconnects it; a
change written to the store behind the nodes' backs (a lost notice) is found by their periodic version check."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.cluster.conftest import ClusterFactory
from tests.integration.conftest import PahoFactory
from tests.integration.test_dynsec import ADMIN, ADMIN_PW, DYNSEC_ENV, ctrl

DOCUMENT_KEY = "{tw}:doc:dynsec"  # where the Redis engine keeps the configuration (store.redis.meta)

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("mosquitto_ctrl") is None, reason="no mosquitto_ctrl")]


def test_a_change_on_one_node_is_in_force_on_the_other(cluster: ClusterFactory, paho_factory: PahoFactory) -> None:
    c = cluster(2, env=DYNSEC_ENV)
    n1, n2 = c.nodes
    for args in (("createRole", "reader"), ("createClient", "dev1", "-p", "pw1"),
                 ("addRoleACL", "reader", "subscribeLiteral", "alerts", "allow"),
                 ("addRoleACL", "reader", "subscribePattern", "cmd/%c/#", "allow"),
                 ("addRoleACL", "reader", "publishClientSend", "data/%u/#", "allow"),
                 ("addClientRole", "dev1", "reader"),
                 ("addRoleACL", "admin", "publishClientSend", "#", "allow")):
        done = ctrl(n1.port, *args)
        assert done.returncode == 0 and "Error" not in done.stderr + done.stdout, (args, done)
    dev = paho_factory(n2.port, "d1", username="dev1", password="pw1")
    dev.connect()  # on the other node, with no wait: the change is in force there already
    assert dev.publish("data/dev1/t", "1", qos=1) == 0
    assert dev.publish("data/dev2/t", "1", qos=1) == 0x87
    assert dev.subscribe([("alerts", 1), ("cmd/d1/#", 1), ("cmd/d2/#", 1)]) == [1, 1, 0x87]
    admin = paho_factory(n1.port, "adm", username=ADMIN, password=ADMIN_PW)
    admin.connect()
    assert admin.publish("alerts", "a1", qos=1) == 0
    assert dev.get(timeout=5).payload == b"a1"
    # Revoked on n1: n2 removes the subscription before n1 answers the command.
    assert ctrl(n1.port, "removeRoleACL", "reader", "subscribeLiteral", "alerts").returncode == 0
    assert admin.publish("alerts", "a2", qos=1) == 0
    assert admin.publish("cmd/d1/go", "c1", qos=1) == 0  # still granted: it comes, and a2 would have come first
    got = dev.get(timeout=5)
    assert (got.topic, got.payload) == ("cmd/d1/go", b"c1")
    # A password changed on n1 affects only the next connect: the connected client stays.
    assert ctrl(n1.port, "setClientPassword", "dev1", "pw2").returncode == 0
    assert admin.publish("cmd/d1/go", "c2", qos=1) == 0
    assert dev.get(timeout=5).payload == b"c2"
    # Disabled on n1: disconnected on n2 (Administrative action).
    assert ctrl(n1.port, "disableClient", "dev1").returncode == 0
    assert dev.wait_disconnect(timeout=5) == 0x98
    assert ctrl(n1.port, "enableClient", "dev1").returncode == 0
    late = paho_factory(n2.port, "d1", username="dev1", password="pw2")
    late.connect()
    old = paho_factory(n2.port, "d1b", username="dev1", password="pw1")
    assert old.connect(check=False).reason_code == 0x86
    # A change no node was told of (as when the notice is lost): each node finds it at its next version check.
    r = c._client()
    try:
        version, body = r.hmget(DOCUMENT_KEY, "v", "d")
        doc = json.loads(body)
        next(x for x in doc["clients"] if x["username"] == "dev1")["disabled"] = True
        r.hset(DOCUMENT_KEY, mapping={"v": int(version) + 1, "d": json.dumps(doc)})
    finally:
        r.close()
    assert late.wait_disconnect(timeout=10) == 0x98  # within dynsec_refresh_interval (2 s)
