"""Sparkplug B through a real gateway: an edge node (paho, payloads made with the reference protobuf module)
publishes births and data; its metrics land in the lake as typed rows (read back with pyarrow), a DATA metric
sent by alias only gets its name from the birth, a malformed payload is counted and kept as a plain message, and
a host application that connects after the edge node left reads the births from `$sparkplug/certificates/...`
as far as the ACL lets it, while nobody can forge a certificate."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow.dataset as ds
import pytest

from tests.integration.conftest import Gateway, PahoFactory
from tests.waiting import wait_until
from tidewire.pipeline.sparkplug import sparkplug_b_pb2 as pb

pytestmark = pytest.mark.tidewire_only

CERTS = "$sparkplug/certificates/spBv1.0"
NOT_AUTHORIZED = 0x87


# Anonymous clients: Sparkplug topics but the `secret` group's; writing `$sparkplug/` is granted (to show that the
# server refuses it anyway); reading certificates only of the group named like the client id.
ACL = """\
topic readwrite spBv1.0/#
topic deny spBv1.0/secret/#
topic write $sparkplug/#
pattern read $sparkplug/certificates/spBv1.0/%c/#
"""


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """One gateway for the module (a start costs a second of `make test`): the ACL above and a lake."""
    work = tmp_path_factory.mktemp("sparkplug")
    gateway = Gateway(work / "gw", acl_text=ACL, admin=True, env={"TIDEWIRE_LAKE_DIR": str(work / "lake"),
                                                      "TIDEWIRE_LAKE_FLUSH_SECONDS": "0.1",
                                                      "TIDEWIRE_SYS_EVENTS": "false"})
    gateway.start()
    yield gateway
    gateway.close()


def nbirth() -> bytes:
    p = pb.Payload(timestamp=1_700_000_000_000, seq=0)
    p.metrics.add(name="bdSeq", alias=0, datatype=pb.Int64, long_value=0)
    p.metrics.add(name="Node Control/Rebirth", alias=1, datatype=pb.Boolean, boolean_value=False)
    return p.SerializeToString()


def dbirth() -> bytes:
    p = pb.Payload(timestamp=1_700_000_000_001, seq=1)
    p.metrics.add(name="temperature", alias=10, datatype=pb.Float, float_value=20.5)
    p.metrics.add(name="status", alias=11, datatype=pb.String, string_value="ok")
    return p.SerializeToString()


def ddata(seq: int, temperature: float) -> bytes:
    p = pb.Payload(timestamp=1_700_000_000_000 + seq, seq=seq)
    p.metrics.add(alias=10, float_value=temperature)  # by alias only, as an edge node sends DATA
    return p.SerializeToString()


def publish_edge_node(paho_factory: PahoFactory, port: int, group: str) -> None:
    """Births at QoS 0 (as the spec has them), then DATA; the last DATA at QoS 1: its PUBACK comes after the
    births before it were stored (one publisher's messages are taken in order)."""
    edge = paho_factory(port, f"edge-{group}", version=5)
    edge.connect()
    edge.publish(f"spBv1.0/{group}/NBIRTH/edge1", nbirth(), qos=0)
    edge.publish(f"spBv1.0/{group}/DBIRTH/edge1/pump", dbirth(), qos=0)
    edge.publish(f"spBv1.0/{group}/DDATA/edge1/pump", ddata(2, 21.25), qos=0)
    edge.publish(f"spBv1.0/{group}/DDATA/edge1/pump", b"\x0a\xff not a sparkplug payload", qos=0)
    assert edge.publish(f"spBv1.0/{group}/DDATA/edge1/pump", ddata(3, 22.75), qos=1) == 0
    edge.disconnect()


def _rows(lake: Path, table: str) -> list[dict[str, Any]]:
    files = [str(p) for p in (lake / table).rglob("*.parquet") if not p.name.startswith(".")]
    if not files:
        return []
    return ds.dataset(files, format="parquet").to_table().to_pylist()


def test_metrics_reach_the_lake_typed_and_births_wait_for_a_late_host(gw: Gateway, paho_factory: PahoFactory) -> None:
    lake = gw.workdir.parent / "lake"
    publish_edge_node(paho_factory, gw.port, "plant")

    # A host application connecting after the edge node left gets both births, retained, as published.
    host = paho_factory(gw.port, "plant", version=5)
    host.connect()
    assert host.subscribe(f"{CERTS}/plant/#", qos=1) == [1]
    got = {m.topic: m for m in host.expect(2)}
    assert set(got) == {f"{CERTS}/plant/NBIRTH/edge1", f"{CERTS}/plant/DBIRTH/edge1/pump"}
    assert all(m.retain for m in got.values())
    assert got[f"{CERTS}/plant/DBIRTH/edge1/pump"].payload == dbirth()
    host.assert_nothing(0.2)  # no DATA, no death: only births are kept

    wait_until(lambda: len(_rows(lake, "sparkplug")) >= 6, timeout=15, what="the metrics in the lake")
    rows = sorted(_rows(lake, "sparkplug"), key=lambda r: (r["position"], r["metric"]))
    assert [(r["message_type"], r["device"], r["metric"], r["datatype"]) for r in rows] == [
        ("NBIRTH", None, "Node Control/Rebirth", "Boolean"), ("NBIRTH", None, "bdSeq", "Int64"),
        ("DBIRTH", "pump", "status", "String"), ("DBIRTH", "pump", "temperature", "Float"),
        ("DDATA", "pump", "temperature", "Float"), ("DDATA", "pump", "temperature", "Float")]
    assert [r["float_value"] for r in rows[3:]] == [20.5, 21.25, 22.75]
    assert [r["seq"] for r in rows[4:]] == [2, 3] and rows[2]["string_value"] == "ok"
    assert {(r["group_id"], r["edge_node"]) for r in rows} == {("plant", "edge1")}

    # The malformed payload: an ordinary message row, no metric rows, counted in the bridge's checkpoint.
    messages = [r for r in _rows(lake, "messages") if r["topic"].startswith("spBv1.0/")]
    assert len(messages) == 5
    malformed = next(r for r in messages if r["payload"].startswith(b"\x0a\xff"))
    assert malformed["position"] not in {r["position"] for r in rows}

    def counted() -> tuple[int, int]:  # the checkpoint commits a flush after its files appear
        checkpoint = json.loads(next((lake / "_tidewire").glob("checkpoint-p*.json")).read_text())
        return checkpoint.get("sparkplug_malformed", 0), checkpoint.get("sparkplug_rows", 0)

    wait_until(lambda: counted() == (1, 6), timeout=5, what=lambda: f"the counts committed: {counted()}")
    metrics = httpx.get(f"http://127.0.0.1:{gw.admin_port}/metrics", timeout=5.0).text
    assert "tidewire_lake_sparkplug_malformed_total 1.0" in metrics
    assert "tidewire_lake_sparkplug_rows_total 6.0" in metrics
    # The certificates are messages of the log too (retained), not Sparkplug topics: no metric rows of theirs.
    assert {r["topic"] for r in _rows(lake, "messages") if r["topic"].startswith(f"{CERTS}/plant/")} == {
        f"{CERTS}/plant/NBIRTH/edge1", f"{CERTS}/plant/DBIRTH/edge1/pump"}


def test_certificates_follow_the_acl_and_cannot_be_forged(gw: Gateway, paho_factory: PahoFactory) -> None:
    publish_edge_node(paho_factory, gw.port, "mill")
    denied_edge = paho_factory(gw.port, "edge-secret", version=5)
    denied_edge.connect()
    assert denied_edge.publish("spBv1.0/secret/NBIRTH/edge9", nbirth(), qos=1) == NOT_AUTHORIZED
    # `$sparkplug/certificates/` is the server's, whatever the ACL grants.
    forger = paho_factory(gw.port, "forger", version=5)
    forger.connect()
    assert forger.publish(f"{CERTS}/mill/NBIRTH/edge2", nbirth(), qos=1, retain=True) == NOT_AUTHORIZED

    # Client id `mill` may read mill's certificates (the `%c` pattern): both births, nothing forged.
    mill = paho_factory(gw.port, "mill", version=5)
    mill.connect()
    assert mill.subscribe(f"{CERTS}/mill/#", qos=1) == [1]
    assert sorted(m.topic for m in mill.expect(2)) == [f"{CERTS}/mill/DBIRTH/edge1/pump",
                                                       f"{CERTS}/mill/NBIRTH/edge1"]
    mill.assert_nothing(0.2)
    # Client id `secret` may read the secret group's certificates, of which there are none: its edge node was
    # refused on its own topic, so no birth of it was kept.
    secret = paho_factory(gw.port, "secret", version=5)
    secret.connect()
    assert secret.subscribe(f"{CERTS}/secret/#", qos=1) == [1]
    secret.assert_nothing(0.2)
    # ... and it may not read mill's: refused in SUBACK, nothing delivered.
    assert secret.subscribe(f"{CERTS}/mill/#", qos=1) == [NOT_AUTHORIZED]
    secret.assert_nothing(0.1)
