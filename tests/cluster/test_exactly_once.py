"""QoS 2 exactly once across a move (a takeover on another node, `kill -9` of the client's node, a Redis restart).

Inbound: a publisher whose PUBLISHes were PUBREC'd resends them (DUP, same packet ids) after the move; the
subscriber must get each message once (counted: lost, duplicated), and the PUBRELs of those ids their PUBCOMP 0.
Outbound: a subscriber that got QoS 2 PUBLISHes and did not answer must get each again after the move with DUP
and under the same packet id (counted: not resent, resent under a new id, which its client would deliver twice).
RocketMQ: a send retried with the same message id on another node (after a kill -9 of the first too) is stored
once and answered with the first message id (counted: lost, duplicated); so is an AMQP confirmed publish retried
with the same message-id (with `amqp_dedupe_seconds`)."""

from __future__ import annotations

import asyncio
from collections import Counter

import aio_pika
import pytest
from rocketmq.grpc_protocol import Code

from tests.cluster.conftest import Cluster, ClusterFactory, ClusterNode
from tests.cluster.test_cluster import EXPIRY, Inbox, connect, move
from tests.gateway.protocols.rocketmq.test_produce import _request, _stub_send
from tests.integration.conftest import PahoFactory
from tests.integration.rawmqtt import ConnectionClosed, RawClient
from tests.waiting import wait_until
from tidewire.gateway.protocols.mqtt.codec import (
    PropertyId,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    SubscriptionRequest,
)

pytestmark = pytest.mark.timeout(120)

N = 20  # QoS 2 publishes PUBREC'd before the move
TOPIC = "eo/in"


def persistent_raw(node: ClusterNode, client_id: str, timeout: float = 15.0) -> RawClient:
    """A 5.0 raw client with a persistent session on `node` (retried while the node's store comes back)."""
    def attempt() -> RawClient | None:
        raw = RawClient(node.port, level=5)
        try:
            if raw.connect(client_id, clean_start=False, check=False,
                           properties={PropertyId.SESSION_EXPIRY_INTERVAL: EXPIRY}).reason_code == 0:
                return raw
        except (AssertionError, ConnectionClosed, OSError):
            pass
        raw.close()
        return None

    made: list[RawClient] = []
    wait_until(lambda: bool(made.append(r) if (r := attempt()) is not None else False) or bool(made), timeout,
               what=f"{client_id} connected to {node.node_id}", interval=0.2)
    return made[0]


def count(inbox: Inbox) -> tuple[list[int], list[int]]:
    """(lost, duplicated) message numbers among the N published."""
    got = Counter(i for _, i in inbox.settle(1.0))
    return [i for i in range(1, N + 1) if got[i] == 0], sorted(i for i, n in got.items() if n > 1)


@pytest.mark.parametrize("how", ["takeover", "kill9", "redis_restart"])
def test_qos2_publishes_resent_after_a_move_reach_the_subscriber_once(
        cluster: ClusterFactory, paho_factory: PahoFactory, how: str) -> None:
    c: Cluster = cluster(n=2)
    n1, n2 = c.nodes
    home = n1 if how == "redis_restart" else n2  # where the publisher resends
    sub_client = connect(n2, paho_factory, f"eo-sub-{how}", 5, persistent=True)
    assert sub_client.subscribe(TOPIC, 2) == [2]
    inbox = Inbox(sub_client, TOPIC)
    cid = f"eo-pub-{how}"
    pub = persistent_raw(n1, cid)
    for pid in range(1, N + 1):
        pub.publish(TOPIC, str(pid).encode(), qos=2, packet_id=pid)
    assert sorted(pub.expect(Pubrec).packet_id for _ in range(N)) == list(range(1, N + 1))
    inbox.wait_for([(TOPIC, i) for i in range(1, N + 1)], 10.0, c)

    if how == "takeover":
        pass  # the new connection on n2 takes the session over while n1 still holds it
    elif how == "kill9":
        c.kill9(n1)
    else:
        c.single_redis.restart()  # AOF appendfsync always
        pub.close()
    # As if the PUBRECs were lost: the client resends every PUBLISH with DUP and the same ids, then releases them.
    again = persistent_raw(home, cid)
    for pid in range(1, N + 1):
        again.publish(TOPIC, str(pid).encode(), qos=2, packet_id=pid, dup=True)
    recs = [again.expect(Pubrec, timeout=10.0) for _ in range(N)]
    assert sorted(r.packet_id for r in recs) == list(range(1, N + 1))
    assert all(r.reason_code < 0x80 for r in recs), recs
    for pid in range(1, N + 1):
        again.send(Pubrel(packet_id=pid))
    comps = [again.expect(Pubcomp, timeout=10.0) for _ in range(N)]
    assert sorted((p.packet_id, p.reason_code) for p in comps) == [(pid, 0) for pid in range(1, N + 1)], \
        "a PUBREL of an id PUBREC'd before the move was not known"

    if not sub_client.client.is_connected():  # a node may drop clients while its store is away
        inbox.pull()
        move(sub_client, n2)
    lost, duplicated = count(inbox)
    assert (lost, duplicated) == ([], []), f"lost {lost}, duplicated {duplicated}\n{c.logs()}"

    # Released: the same ids carry new messages now, each stored once.
    for pid in range(1, 4):
        again.publish(TOPIC, str(N + pid).encode(), qos=2, packet_id=pid)
        assert again.expect(Pubrec).packet_id == pid
        again.send(Pubrel(packet_id=pid))
        assert again.expect(Pubcomp).packet_id == pid
    inbox.wait_for([(TOPIC, N + i) for i in range(1, 4)], 10.0, c)


def received(raw: RawClient, n: int) -> dict[bytes, Publish]:
    """The next `n` PUBLISH packets by payload (anything else the server sends first is skipped)."""
    got: dict[bytes, Publish] = {}
    while len(got) < n:
        packet = raw.recv(10.0)
        if isinstance(packet, Publish):
            assert packet.payload not in got, f"{packet.payload!r} sent twice on one connection"
            got[packet.payload] = packet
    return got


@pytest.mark.parametrize("how", ["takeover", "kill9", "redis_restart"])
def test_qos2_deliveries_unanswered_before_a_move_are_resent_under_their_packet_ids(
        cluster: ClusterFactory, paho_factory: PahoFactory, how: str) -> None:
    c: Cluster = cluster(n=2)
    n1, n2 = c.nodes
    home = n1 if how == "redis_restart" else n2  # where the subscriber resumes
    cid = f"eo-out-{how}"
    sub = persistent_raw(n1, cid)
    sub.send(Subscribe(packet_id=1, subscriptions=[SubscriptionRequest("eo/out", 2)]))
    assert sub.expect(Suback).reason_codes == [2]
    pub = connect(n2, paho_factory, f"eo-outpub-{how}")
    # Completed first: the ids of the messages below are not the ones a new session would start from.
    for i in range(-5, 0):
        assert pub.publish("eo/out", str(i).encode(), qos=2) < 0x80
    for p in received(sub, 5).values():
        sub.send(Pubrec(packet_id=p.packet_id))
        sub.send(Pubcomp(packet_id=sub.expect(Pubrel).packet_id))
    for i in range(1, N + 1):
        assert pub.publish("eo/out", str(i).encode(), qos=2) < 0x80
    first = received(sub, N)  # not answered: the receiver has them, the sender waits for PUBREC
    assert all(p.qos == 2 for p in first.values())

    if how == "takeover":
        pass
    elif how == "kill9":
        c.kill9(n1)
    else:
        sub.close()
        c.single_redis.restart()
    again = persistent_raw(home, cid)
    resent = received(again, N)
    lost = sorted(int(k) for k in first.keys() - resent.keys())
    renamed = sorted(int(k) for k in first.keys() & resent.keys() if resent[k].packet_id != first[k].packet_id)
    completed = sorted(int(k) for k in resent.keys() - first.keys())  # PUBCOMP'd before the move
    # A QoS 2 receiver recognises a resend by its packet id: one under a new id is a second delivery.
    assert (lost, renamed, completed) == ([], [], []), \
        f"not resent {lost}, resent under a new packet id {renamed}, completed and sent again {completed}\n{c.logs()}"
    assert all(p.dup for p in resent.values()), "resent without DUP"
    for p in resent.values():
        again.send(Pubrec(packet_id=p.packet_id))
    for _ in range(N):
        assert again.expect(Pubrel, timeout=10.0).packet_id in {p.packet_id for p in resent.values()}
    for p in resent.values():
        again.send(Pubcomp(packet_id=p.packet_id))
    again.nothing(1.0)  # completed: nothing sent a third time


@pytest.mark.parametrize("how", ["retried_elsewhere", "kill9"])
def test_rocketmq_send_retried_on_another_node_is_stored_once(
        cluster: ClusterFactory, paho_factory: PahoFactory, how: str) -> None:
    c: Cluster = cluster(n=2)
    n1, n2 = c.nodes
    inbox = Inbox(connect(n2, paho_factory, f"eo-rmq-sub-{how}", subscribe=["T/#"]), "T/#")
    requests = [_request(f"0A0B0C0D0E0F0000000000{i:04X}", str(i).encode()) for i in range(N)]
    first = [_stub_send(n1, r) for r in requests]
    assert {a.status.code for a in first} == {Code.OK}
    inbox.wait_for([("T/dedup", i) for i in range(N)], 10.0, c)
    if how == "kill9":
        c.kill9(n1)
    again = [_stub_send(n2, r) for r in requests]  # as if the answers were lost: the same ids, on n2
    assert {a.status.code for a in again} == {Code.OK}
    assert [a.entries[0].message_id for a in again] == [a.entries[0].message_id for a in first], \
        "a retry was answered with another message id"
    got = Counter(i for _, i in inbox.settle(1.0))
    lost = [i for i in range(N) if got[i] == 0]
    duplicated = sorted(i for i, n in got.items() if n > 1)
    assert (lost, duplicated) == ([], []), f"lost {lost}, duplicated {duplicated}\n{c.logs()}"


async def _publish_with_ids(port: int, ids: range) -> None:
    """Confirmed publishes to amq.topic `eo.amqp`, message-id `m<i>`, body `<i>`."""
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/", timeout=10)
    async with conn:
        channel = await conn.channel(publisher_confirms=True)
        exchange = await channel.get_exchange("amq.topic")
        for i in ids:
            await exchange.publish(aio_pika.Message(str(i).encode(), delivery_mode=2, message_id=f"m{i}"),
                                   routing_key="eo.amqp")


@pytest.mark.parametrize("how", ["retried_elsewhere", "kill9"])
def test_amqp_confirmed_publish_retried_on_another_node_is_stored_once(
        cluster: ClusterFactory, paho_factory: PahoFactory, how: str) -> None:
    c: Cluster = cluster(n=2, env={"TIDEWIRE_AMQP_DEDUPE_SECONDS": "60"})
    n1, n2 = c.nodes
    inbox = Inbox(connect(n2, paho_factory, f"eo-amqp-sub-{how}", subscribe=["eo/amqp"]), "eo/amqp")
    assert n1.amqp_port is not None and n2.amqp_port is not None
    asyncio.run(_publish_with_ids(n1.amqp_port, range(N)))
    inbox.wait_for([("eo/amqp", i) for i in range(N)], 10.0, c)
    if how == "kill9":
        c.kill9(n1)
    asyncio.run(_publish_with_ids(n2.amqp_port, range(N)))  # as if the confirms were lost: again, on n2
    got = Counter(i for _, i in inbox.settle(1.0))
    lost = [i for i in range(N) if got[i] == 0]
    duplicated = sorted(i for i, n in got.items() if n > 1)
    assert (lost, duplicated) == ([], []), f"lost {lost}, duplicated {duplicated}\n{c.logs()}"
