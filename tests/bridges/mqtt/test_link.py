"""The bridge's MQTT client over asyncio (`Link` on a `ClientCore`) against a real Mosquitto 2.0.11, with paho
clients on the other side: MQTT 3.1, 3.1.1 and 5.0, passwords, TLS and mutual TLS, QoS 0/1/2 both ways, the
acknowledgement of what we receive only once stored (seen in a persistent session), Mosquitto's bridge mode
(`try_private`), the in-flight cap, flow control, keepalive, the will, and a broker killed under the link; and
once into Tidewire's own server, which takes the bridge the same way."""

from __future__ import annotations

import asyncio
import signal
import socket
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.certs import TestPKI
from tests.integration.conftest import Gateway, TlsOptions, write_password_file
from tests.integration.paho import PahoClient, Received
from tests.waiting import until
from tidewire.bridges.mqtt.client import ClientCore, ClientOptions
from tidewire.bridges.mqtt.events import Acked, Incoming, KeepaliveTimeout
from tidewire.bridges.mqtt.link import (
    ConnectRefused,
    ConnectTimeout,
    Link,
    LinkClosed,
    LinkError,
    ServerDisconnected,
    client_tls_context,
)
from tidewire.gateway.protocols.mqtt.codec import PropertyId as P
from tidewire.gateway.protocols.mqtt.codec import Will, encode_properties

Mosquitto = Callable[..., Gateway]


class Recorder:
    """A `LinkHandler` that keeps what it is told; stores incoming publishes at once unless `store` is off."""

    def __init__(self, store: bool = False) -> None:
        self.incoming: list[Incoming] = []
        self.acked: list[Any] = []
        self.failed: dict[object, int] = {}
        self.closed: list[BaseException | None] = []
        self.writable = 0
        self.link: Link | None = None
        self.store = store

    def on_incoming(self, message: Incoming) -> None:
        self.incoming.append(message)
        if self.store and message.qos and self.link is not None:
            self.link.incoming_stored(message.packet_id)

    def on_acked(self, acked: Acked) -> None:
        self.acked.extend(acked.tokens)
        self.failed.update(acked.failed)

    def on_writable(self) -> None:
        self.writable += 1

    def on_closed(self, exc: BaseException | None) -> None:
        self.closed.append(exc)


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Mosquitto]:
    """`mosquitto(**Gateway keywords)` -> a started Mosquitto, killed at teardown."""
    made: list[Gateway] = []

    def make(**kwargs: Any) -> Gateway:
        gw = Gateway(tmp_path / f"mosquitto{len(made)}", target="mosquitto", **kwargs)
        made.append(gw)
        gw.start()
        return gw

    yield make
    for gw in made:
        if gw.proc is not None and gw.proc.poll() is None:
            gw.proc.send_signal(signal.SIGCONT)  # one a test stopped
        gw.close()


@pytest.fixture
def paho() -> Iterator[Callable[..., PahoClient]]:
    made: list[PahoClient] = []

    def make(port: int, client_id: str = "", version: int = 5, **kwargs: Any) -> PahoClient:
        client = PahoClient(port, client_id, version, **kwargs)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


async def open_link(gw: Gateway, handler: Recorder, port: int | None = None, core: ClientCore | None = None,
                    **options: Any) -> Link:
    link_kwargs = {k: options.pop(k) for k in ("tls", "server_hostname", "bind_address", "connect_timeout")
                   if k in options}
    core = core or ClientCore(ClientOptions(options.pop("client_id", "bridge-test"), **options))
    link = handler.link = Link(core, handler)
    await link.connect("127.0.0.1", port or gw.port, **link_kwargs)
    return link


async def subscriber(paho: Callable[..., PahoClient], gw: Gateway, topic: str, qos: int = 2) -> PahoClient:
    client = paho(gw.port)
    await asyncio.to_thread(client.connect)
    await asyncio.to_thread(client.subscribe, topic, qos)
    return client


async def publish_within_credit(link: Link, handler: Recorder, count: int) -> int:
    """Publish `count` messages (QoS 1 and 2 in turn, token n), each as soon as there is credit; wait for every
    acknowledgement; return the most that were ever in flight."""
    peak = 0
    sent = 0

    def publish_more() -> bool:
        nonlocal peak, sent
        while link.credit() > 0 and sent < count:
            link.publish("cap/x", str(sent).encode(), 1 + sent % 2, False, sent)
            sent += 1
        peak = max(peak, len(link.core.unacked()))
        return sent == count and len(handler.acked) == count

    await until(publish_more, timeout=5, what=lambda: f"{count} acknowledged, got {len(handler.acked)}")
    return peak


# --- publishing and subscribing -----------------------------------------------------------------------------------
@pytest.mark.parametrize("level", [3, 4, 5])
async def test_publish_qos_0_1_2_to_a_subscriber(mosquitto: Mosquitto, paho: Callable[..., PahoClient],
                                                 level: int) -> None:
    gw = mosquitto()
    sub = await subscriber(paho, gw, "out/#")
    handler = Recorder()
    link = await open_link(gw, handler, level=level)
    block = encode_properties({P.CONTENT_TYPE: "text/plain", P.USER_PROPERTY: [("origin", "tidewire")]})
    for qos in (0, 1, 2):
        link.publish(f"out/{qos}", f"m{qos}".encode(), qos, False, qos, block)
    await until(lambda: handler.acked in ([1, 2], [2, 1]), what=lambda: f"acks of 1 and 2, got {handler.acked}")
    got = await asyncio.to_thread(sub.expect, 3)
    assert [(m.topic, m.payload, m.qos) for m in got] == [("out/0", b"m0", 0), ("out/1", b"m1", 1),
                                                          ("out/2", b"m2", 2)]
    if level == 5:
        assert got[1].properties["ContentType"] == "text/plain"
        assert got[1].properties["UserProperty"] == [("origin", "tidewire")]
    else:
        assert "ContentType" not in got[1].properties
    assert link.core.unacked() == [] and handler.failed == {}
    link.close()
    await link.wait_closed()
    assert handler.closed == [None]


@pytest.mark.parametrize("level", [4, 5])
async def test_subscribe_and_receive_qos_0_1_2(mosquitto: Mosquitto, paho: Callable[..., PahoClient],
                                               level: int) -> None:
    gw = mosquitto()
    handler = Recorder(store=True)
    link = await open_link(gw, handler, level=level)
    assert await link.subscribe([("in/#", 2, False, False), ("in2", 1, False, False)]) == [2, 1]
    pub = paho(gw.port)
    await asyncio.to_thread(pub.connect)
    props = None
    if level == 5:
        from tests.integration.paho import v5_props  # paho's property object for MQTT 5 only

        props = v5_props(3, ContentType="text/plain", MessageExpiryInterval=120)  # 3: PUBLISH
    for qos in (0, 1, 2):
        await asyncio.to_thread(pub.publish, f"in/{qos}", f"m{qos}".encode(), qos, False, props)
    await until(lambda: len(handler.incoming) == 3, what=lambda: f"3 messages, got {handler.incoming}")
    assert [(m.topic, m.payload, m.qos, m.dup) for m in handler.incoming] == \
        [("in/0", b"m0", 0, False), ("in/1", b"m1", 1, False), ("in/2", b"m2", 2, False)]
    if level == 5:
        assert handler.incoming[1].properties == encode_properties({P.CONTENT_TYPE: "text/plain"})
        expiry = handler.incoming[1].expiry
        assert expiry is not None and 110 < expiry <= 120
    # The QoS 2 flow completes (PUBREL answered), and nothing is left owed.
    await until(lambda: "Received PUBCOMP from bridge-test" in gw.stderr, what="Mosquitto's QoS 2 flow completed")
    assert await link.unsubscribe(["in/#"]) == ([0] if level == 5 else [])
    await asyncio.to_thread(pub.publish, "in/x", b"after", 1)
    await asyncio.to_thread(pub.publish, "in2", b"still", 1)
    await until(lambda: len(handler.incoming) == 4)
    assert handler.incoming[3].payload == b"still"  # not the one on the filter we left
    link.close()


async def test_incoming_qos_1_is_not_acked_before_it_is_stored(mosquitto: Mosquitto) -> None:
    """A persistent session (cleansession false): Mosquitto keeps re-sending what we did not acknowledge."""
    gw = mosquitto()
    options = ClientOptions("bridge-persistent", level=4, clean_start=False)
    first = Recorder()
    link = await open_link(gw, first, core=ClientCore(options))
    await link.subscribe([("in/#", 1, False, False)])
    pub = ClientCore(ClientOptions("pub", level=4))
    publisher = await open_link(gw, Recorder(), core=pub)
    publisher.publish("in/1", b"m1", 1, False, "m1")
    await until(lambda: len(first.incoming) == 1)
    link.close()
    await link.wait_closed()
    assert "Received PUBACK from bridge-persistent" not in gw.stderr  # not stored: not acknowledged

    # The same core on a new connection: Mosquitto re-sends with DUP; the core knows it is still being stored.
    link = await open_link(gw, first, core=link.core)
    assert link.connected is not None and link.connected.session_present
    publisher.publish("in/1", b"m2", 1, False, "m2")
    await until(lambda: len(first.incoming) == 2)
    assert [(m.payload, m.dup) for m in first.incoming] == [(b"m1", False), (b"m2", False)]
    link.close()
    await link.wait_closed()

    # A new core (a restarted node) gets both again, m1 flagged DUP; now they are stored.
    second = Recorder(store=True)
    link = await open_link(gw, second, core=ClientCore(options))
    await until(lambda: len(second.incoming) == 2)
    assert [(m.payload, m.dup) for m in second.incoming] == [(b"m1", True), (b"m2", True)]
    await until(lambda: gw.stderr.count("Received PUBACK from bridge-persistent") == 2, what="two PUBACKs")
    link.close()
    await link.wait_closed()

    # Acknowledged: the next connection starts with the next message, not with a re-send.
    third = Recorder(store=True)
    link = await open_link(gw, third, core=ClientCore(options))
    publisher.publish("in/1", b"m3", 1, False, "m3")
    await until(lambda: len(third.incoming) == 1)
    assert third.incoming[0].payload == b"m3"
    link.close()
    publisher.close()


async def test_our_unacknowledged_publishes_go_again_on_a_new_connection(mosquitto: Mosquitto,
                                                                          paho: Callable[..., PahoClient]) -> None:
    """Mosquitto stopped before it acknowledges: the core's table is re-sent on the next connection."""
    gw = mosquitto()
    sub = await subscriber(paho, gw, "out/#")
    handler = Recorder()
    core = ClientCore(ClientOptions("bridge-resend", level=5, clean_start=False, session_expiry=600))
    link = await open_link(gw, handler, core=core)
    assert gw.proc is not None
    gw.proc.send_signal(signal.SIGSTOP)
    link.publish("out/a", b"one", 1, False, "one")
    link.publish("out/b", b"two", 2, False, "two")
    assert core.unacked() == ["one", "two"]
    link.close()  # Mosquitto will read both publishes, but its acknowledgements find the connection gone
    await link.wait_closed()
    gw.proc.send_signal(signal.SIGCONT)
    link = await open_link(gw, handler, core=core)
    assert link.connected is not None and link.connected.session_present
    await until(lambda: set(handler.acked) == {"one", "two"})
    got = [m.payload for m in await asyncio.to_thread(sub.expect, 2)]
    try:
        got.append((await asyncio.to_thread(sub.get, 0.3)).payload)  # QoS 1 may come twice: we re-sent it
    except AssertionError:
        pass
    # QoS 2 exactly once: our re-send had its packet id and DUP, and Mosquitto knew the id from the kept session.
    assert got.count(b"two") == 1 and 1 <= got.count(b"one") <= 2 and len(got) <= 3
    link.close()


# --- authentication and TLS ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("level", "refusal"), [(4, 5), (5, 0x87)])
async def test_user_name_and_password(mosquitto: Mosquitto, tmp_path: Path, level: int, refusal: int) -> None:
    passwords = write_password_file(tmp_path / "passwd", {"bridge": "s3cret"})
    gw = mosquitto(password_file=passwords)
    link = await open_link(gw, Recorder(), level=level, username="bridge", password=b"s3cret")
    link.close()
    with pytest.raises(ConnectRefused) as refused:
        await open_link(gw, Recorder(), level=level, username="bridge", password=b"wrong")
    assert refused.value.code == refusal
    with pytest.raises(ConnectRefused):
        await open_link(gw, Recorder(), level=level)


@pytest.fixture
def pki(tmp_path: Path) -> TestPKI:
    return TestPKI(tmp_path / "pki")


async def test_tls_verifies_the_server(mosquitto: Mosquitto, pki: TestPKI, tmp_path: Path) -> None:
    gw = mosquitto(tls=TlsOptions(pki.server.certfile, pki.server.keyfile))
    assert gw.tls_port is not None
    handler = Recorder()
    link = await open_link(gw, handler, port=gw.tls_port, tls=client_tls_context(cafile=str(pki.cafile)),
                           bind_address="127.0.0.1", level=5)
    assert link.transport is not None and link.transport.get_extra_info("ssl_object") is not None
    link.publish("tls/x", b"over tls", 1, False, 1)
    await until(lambda: handler.acked == [1])
    link.close()
    other = TestPKI(tmp_path / "other", name="other")
    with pytest.raises(LinkError, match="certificate verify failed"):
        await open_link(gw, Recorder(), port=gw.tls_port, tls=client_tls_context(cafile=str(other.cafile)))
    # The name checked is the one given: a wrong one fails unless `insecure` (host name check off, chain still on)
    with pytest.raises(LinkError, match="match"):
        await open_link(gw, Recorder(), port=gw.tls_port, server_hostname="wrong.example",
                        tls=client_tls_context(cafile=str(pki.cafile)))
    link = await open_link(gw, Recorder(), port=gw.tls_port, server_hostname="wrong.example",
                           tls=client_tls_context(cafile=str(pki.cafile), insecure=True, tls_version="tlsv1.3"))
    assert link.transport is not None and link.transport.get_extra_info("ssl_object").version() == "TLSv1.3"
    link.close()
    with pytest.raises(LinkError, match="certificate verify failed"):
        await open_link(gw, Recorder(), port=gw.tls_port, server_hostname="wrong.example",
                        tls=client_tls_context(cafile=str(other.cafile), insecure=True))


async def test_mutual_tls(mosquitto: Mosquitto, pki: TestPKI) -> None:
    gw = mosquitto(tls=TlsOptions(pki.server.certfile, pki.server.keyfile, cafile=pki.cafile,
                                  require_certificate=True, use_identity_as_username=True))
    assert gw.tls_port is not None
    with pytest.raises(LinkError):  # TLS 1.3: the handshake ends before Mosquitto checks us, then it closes
        await open_link(gw, Recorder(), port=gw.tls_port, tls=client_tls_context(cafile=str(pki.cafile)),
                        connect_timeout=3)
    client = pki.issue_client("bridge-node-1")
    ctx = client_tls_context(cafile=str(pki.cafile), certfile=str(client.certfile), keyfile=str(client.keyfile))
    handler = Recorder()
    link = await open_link(gw, handler, port=gw.tls_port, tls=ctx, level=4)
    link.publish("mtls/x", b"m", 2, False, 1)
    await until(lambda: handler.acked == [1])
    link.close()
    assert "u'bridge-node-1'" in gw.stderr  # Mosquitto took the certificate's name as our user name


def test_client_tls_context_options(pki: TestPKI) -> None:
    ctx = client_tls_context(capath=str(pki.dir), alpn="mqtt")
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    with pytest.raises(ValueError, match="tls_version"):
        client_tls_context(cafile=str(pki.cafile), tls_version="sslv3")
    with pytest.raises(ValueError, match="both"):
        client_tls_context(cafile=str(pki.cafile), certfile=str(pki.server.certfile))


# --- Mosquitto's bridge mode ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("level", [3, 4])
async def test_try_private_makes_us_a_bridge_to_mosquitto(mosquitto: Mosquitto, paho: Callable[..., PahoClient],
                                                          level: int) -> None:
    """Mosquitto takes the 0x80 bit: it logs a bridge, and gives a bridge's subscriptions No Local and Retain As
    Published (3.x has neither option): our own publishes do not come back, a live retained one keeps its flag."""
    gw = mosquitto()
    handler = Recorder(store=True)
    link = await open_link(gw, handler, level=level, try_private=True, client_id=f"bridge-private-{level}")
    assert link.transport is not None
    assert f"New bridge connected from 127.0.0.1:{link.transport.get_extra_info('sockname')[1]}" in gw.stderr
    await link.subscribe([("loop/#", 1, False, False)])
    link.publish("loop/own", b"ours", 1, False, "ours")
    await until(lambda: handler.acked == ["ours"])
    pub = paho(gw.port)
    await asyncio.to_thread(pub.connect)
    await asyncio.to_thread(pub.publish, "loop/theirs", b"retained", 1, True)
    await until(lambda: len(handler.incoming) == 1)
    [message] = handler.incoming  # not "ours", which went before it
    assert (message.topic, message.payload, message.retain) == ("loop/theirs", b"retained", True)
    link.close()
    # Without the bit the same happens as for any client: our publish comes back, the retain flag is cleared.
    plain = Recorder(store=True)
    link = await open_link(gw, plain, level=level, client_id=f"bridge-plain-{level}")
    await link.subscribe([("loop2/#", 1, False, False)])
    link.publish("loop2/own", b"ours", 1, False, "ours")
    await until(lambda: plain.acked == ["ours"])  # so it is delivered before theirs
    await asyncio.to_thread(pub.publish, "loop2/theirs", b"retained", 1, True)
    await until(lambda: len(plain.incoming) == 2)
    assert [(m.payload, m.retain) for m in plain.incoming] == [(b"ours", False), (b"retained", False)]
    link.close()


# --- flow control ---------------------------------------------------------------------------------------------------
async def test_the_inflight_cap(mosquitto: Mosquitto, paho: Callable[..., PahoClient]) -> None:
    """Ours (max_inflight) at 3.1.1; at 5 Mosquitto's Receive Maximum (its max_inflight_messages) is lower still."""
    gw = mosquitto(conf_lines=["max_inflight_messages 2"])
    sub = await subscriber(paho, gw, "cap/#")
    for level, window in ((4, 3), (5, 2)):
        handler = Recorder()
        link = await open_link(gw, handler, level=level, max_inflight=3, client_id=f"bridge-cap-{level}")
        assert link.credit() == window
        assert await publish_within_credit(link, handler, 20) == window
        assert sorted(handler.acked) == list(range(20))
        got = await asyncio.to_thread(sub.expect, 20)
        assert sorted(int(m.payload) for m in got) == list(range(20))
        link.close()


async def test_retain_is_stripped_where_mosquitto_has_none(mosquitto: Mosquitto,
                                                           paho: Callable[..., PahoClient]) -> None:
    """`retain_available false`: Mosquitto's CONNACK says so, and it would disconnect a client sending a retained
    PUBLISH (Retain not supported). The core drops the flag; the message still goes."""
    gw = mosquitto(conf_lines=["retain_available false"])
    sub = await subscriber(paho, gw, "r/#", qos=1)
    handler = Recorder()
    link = await open_link(gw, handler, level=5)
    assert link.core.server.retain_available is False
    link.publish("r/x", b"was retained", 1, True, "r")
    await until(lambda: handler.acked == ["r"])
    got = await asyncio.to_thread(sub.get)
    assert (got.payload, got.retain) == (b"was retained", False)
    assert handler.closed == []
    link.close()


async def test_a_full_transport_has_no_credit(mosquitto: Mosquitto) -> None:
    """Mosquitto stopped: what we write fills the socket's buffers until asyncio pauses the writer."""
    gw = mosquitto()
    handler = Recorder()
    link = await open_link(gw, handler, level=4, keepalive=0)
    assert gw.proc is not None
    gw.proc.send_signal(signal.SIGSTOP)
    payload = b"x" * (1 << 20)
    for _ in range(256):  # far more than loopback buffers hold
        if link.credit() == 0:
            break
        link.publish("full/x", payload, 0, False, None)
        await asyncio.sleep(0)  # let the transport report the pause (the behaviour under test)
    assert link.credit() == 0 and link.core.credit() > 0
    gw.proc.send_signal(signal.SIGCONT)
    await until(lambda: handler.writable == 1 and link.credit() > 0, timeout=8, what="the writer resumed")
    link.close()


# --- keepalive, will, endings -----------------------------------------------------------------------------------------
@pytest.mark.slow  # waits out a keepalive
async def test_keepalive_pings_and_a_silent_broker_times_out(mosquitto: Mosquitto) -> None:
    gw = mosquitto()
    handler = Recorder()
    link = await open_link(gw, handler, level=4, keepalive=1)
    opened = link.clock.monotonic()
    # Two PINGREQ/PINGRESP rounds (at +1 s and +2 s): only after the second is the next deadline past +2.5 s.
    await until(lambda: (link.core.next_deadline() or 0) > opened + 2.5, timeout=4, what="two pings answered")
    assert handler.closed == []
    assert gw.proc is not None
    gw.proc.send_signal(signal.SIGSTOP)  # it answers nothing now
    await until(lambda: handler.closed, timeout=3, what="on_closed")
    assert isinstance(handler.closed[0], KeepaliveTimeout)


async def test_the_will_goes_when_the_link_dies_not_when_it_closes(mosquitto: Mosquitto,
                                                                   paho: Callable[..., PahoClient]) -> None:
    gw = mosquitto()
    sub = await subscriber(paho, gw, "bridge/state", qos=1)
    link = await open_link(gw, Recorder(), level=4, will=Will("bridge/state", b"closed", 1, True))
    link.close()
    await link.wait_closed()
    link = await open_link(gw, Recorder(), level=5, will=Will("bridge/state", b"0", 1, True))
    link.abort()
    got: Received = await asyncio.to_thread(sub.get)
    assert (got.topic, got.payload, got.qos) == ("bridge/state", b"0", 1)
    sub.assert_nothing(0.2)  # a check that the cleanly closed link left no will


async def test_mosquitto_killed_closes_the_link_promptly(mosquitto: Mosquitto) -> None:
    gw = mosquitto()
    handler = Recorder()
    link = await open_link(gw, handler, level=5, keepalive=60)
    link.publish("k/x", b"m", 1, False, "pending")
    await until(lambda: handler.acked == ["pending"])
    gw.kill9()
    await until(lambda: handler.closed, timeout=1, what="on_closed within a second")
    assert isinstance(handler.closed[0], (LinkClosed, ConnectionError))
    assert link.credit() == 0 and link.closed
    with pytest.raises(LinkClosed):
        link.publish("k/x", b"m", 0, False, None)


async def test_a_server_disconnect_reaches_on_closed(mosquitto: Mosquitto) -> None:
    """Mosquitto 2.0.11 sends an MQTT 5 DISCONNECT only for a client's protocol error: one is written by hand here,
    under the link (a PUBLISH with QoS 3), so the real DISCONNECT comes back through the core."""
    gw = mosquitto()
    handler = Recorder()
    link = await open_link(gw, handler, level=5)
    assert link.transport is not None
    link.transport.write(b"\x36\x07\x00\x01a\x00\x01\x00\x00")
    await until(lambda: handler.closed, what="the link closed")
    assert isinstance(handler.closed[0], ServerDisconnected) and handler.closed[0].code == 0x81


async def test_connect_timeout_and_refused_connection() -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # the kernel completes connections; nobody answers
        port = silent.getsockname()[1]
        with pytest.raises(ConnectTimeout, match="no CONNACK"):
            await Link(ClientCore(ClientOptions("bridge-timeout")), Recorder()).connect("127.0.0.1", port,
                                                                                       connect_timeout=0.3)
    link = Link(ClientCore(ClientOptions("bridge-refused")), Recorder())
    with pytest.raises(LinkError, match="cannot connect"):
        await link.connect("127.0.0.1", port)
    with pytest.raises(LinkError, match="once"):
        await link.connect("127.0.0.1", port)


# --- Tidewire's own server side ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("level", [4, 5])
async def test_into_tidewire_as_a_bridge(tmp_path: Path, paho: Callable[..., PahoClient], level: int) -> None:
    """The other end of issue 21: Tidewire takes `try_private` (the bit at 3.1.1, the user property at 5) and
    gives a 3.x bridge's subscriptions No Local, as Mosquitto does."""
    with Gateway(tmp_path / "tidewire", target="tidewire") as gw:
        handler = Recorder(store=True)
        link = await open_link(gw, handler, level=level, try_private=True, client_id=f"bridge-into-{level}")
        await link.subscribe([("tw/#", 2, level == 5, level == 5)])
        link.publish("tw/own", b"ours", 2, False, "ours")
        await until(lambda: handler.acked == ["ours"])
        pub = paho(gw.port)
        await asyncio.to_thread(pub.connect)
        await asyncio.to_thread(pub.publish, "tw/theirs", b"theirs", 1)
        await until(lambda: len(handler.incoming) == 1)
        assert handler.incoming[0].payload == b"theirs"  # not ours, which went first
        link.close()
