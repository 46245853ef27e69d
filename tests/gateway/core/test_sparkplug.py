"""gateway.core.sparkplug: the Sparkplug Aware server's derived messages (births only, on the spec's topics,
retained, the payload untouched) and the refusal of client publishes under `$sparkplug/certificates/`."""

from __future__ import annotations

from tidewire.extensions.hooks import AllowAll, ClientInfo
from tidewire.gateway.config import Settings
from tidewire.gateway.core.ingress import NOT_AUTHORIZED, refuse_publish
from tidewire.gateway.core.sparkplug import certificate
from tidewire.store.base import PROTOCOL_AMQP, Message


def test_births_get_a_retained_certificate_on_the_spec_topic() -> None:
    birth = Message("spBv1.0/plant/DBIRTH/edge1/pump", b"\x08\x01", qos=0, properties=b"\x03\x00\x01x",
                    timestamp_ms=5, publisher="edge-1", protocol=PROTOCOL_AMQP)
    cert = certificate(birth)
    assert cert is not None
    assert (cert.topic, cert.payload, cert.retain, cert.qos) == (
        "$sparkplug/certificates/spBv1.0/plant/DBIRTH/edge1/pump", b"\x08\x01", True, 0)
    assert (cert.properties, cert.timestamp_ms, cert.protocol, cert.publisher) == (b"\x03\x00\x01x", 5,
                                                                                  PROTOCOL_AMQP, "")
    node = certificate(Message("spBv1.0/plant/NBIRTH/edge1", b"\x08\x01", qos=1))
    assert node is not None and node.topic == "$sparkplug/certificates/spBv1.0/plant/NBIRTH/edge1"
    assert node.qos == 1


def test_everything_else_has_none() -> None:
    for topic in ("spBv1.0/plant/NDATA/edge1", "spBv1.0/plant/DDATA/edge1/pump", "spBv1.0/plant/NDEATH/edge1",
                  "spBv1.0/plant/DDEATH/edge1/pump", "spBv1.0/plant/NCMD/edge1", "spBv1.0/STATE/host",
                  "spBv1.0/plant/NBIRTH/edge1/extra/level", "spBv1.0/plant/DBIRTH/edge1", "sensors/NBIRTH/x",
                  "spBv1.0//NBIRTH/edge1", "spBv1.0/plant/DBIRTH/edge1/", "spAv1.0/plant/NBIRTH/edge1",
                  "$sparkplug/certificates/spBv1.0/plant/NBIRTH/edge1"):
        assert certificate(Message(topic, b"\x08\x01")) is None, topic
    assert certificate(Message("spBv1.0/plant/NBIRTH/edge1", b"")) is None  # would clear the entry


def test_clients_may_not_publish_certificates_when_aware() -> None:
    who = ClientInfo("c", "u")
    topic = "$sparkplug/certificates/spBv1.0/plant/NBIRTH/edge1"
    assert refuse_publish(Settings(), AllowAll(), who, topic) == NOT_AUTHORIZED
    assert refuse_publish(Settings(sparkplug_aware=False), AllowAll(), who, topic) is None
    assert refuse_publish(Settings(), AllowAll(), who, "$sparkplug/other") is None


def test_a_tenants_births_get_their_certificates_under_its_mount() -> None:
    """A tenant client's topics are stored under `$tenant/<name>/` (gateway.core.tenants): its births' certificates
    are kept under the same mount, where the tenant's own (mounted) `$sparkplug/certificates/#` filter reads them
    and no other tenant's does."""
    from tidewire.gateway.core.tenants import mount_filter, mount_point
    from tidewire.gateway.core.topics import matches as topic_matches

    mount = mount_point("acme")
    birth = certificate(Message(mount + "spBv1.0/g/NBIRTH/e", b"\x08\x01", 1, False))
    assert birth is not None and birth.retain
    assert birth.topic == mount + "$sparkplug/certificates/spBv1.0/g/NBIRTH/e"
    assert topic_matches(mount_filter(mount, "$sparkplug/certificates/#"), birth.topic)
    assert not topic_matches(mount_filter(mount_point("other"), "$sparkplug/certificates/#"), birth.topic)
    assert not topic_matches("$sparkplug/certificates/#", birth.topic)
    for topic in (mount + "spBv1.0/g/NDATA/e", mount + "a/spBv1.0/g/NBIRTH/e", "$tenant/acme"):
        assert certificate(Message(topic, b"\x08\x01", 1, False)) is None
