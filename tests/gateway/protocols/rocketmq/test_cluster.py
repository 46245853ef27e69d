"""RocketMQ consumer groups across nodes of a cluster (one shared Redis store): SimpleConsumers of one group on
two nodes compete (each message once), and what a dying node had handed out goes to the other node; clients
given one node's address are routed to every live node, and carry on when that node is killed."""

from __future__ import annotations

import time
from collections import Counter

import grpc
import pytest
from rocketmq import ConsumeResult, FilterExpression, Message, MessageListener, PushConsumer
from rocketmq.grpc_protocol import MessagingServiceStub, QueryRouteRequest
from rocketmq.v5.util.signature import Signature

from tests.cluster.conftest import ClusterFactory, ClusterNode, cluster  # noqa: F401 - `cluster` is a fixture
from tests.integration.conftest import PahoFactory
from tests.store import redis_server
from tests.waiting import wait_until

from .conftest import Clients, message, wait_port

pytestmark = pytest.mark.skipif(not redis_server.available(), reason="a cluster needs redis-server")


@pytest.mark.slow  # several seconds (a real node, a build or a long model run): make test-slow
def test_a_group_is_shared_across_nodes(cluster: ClusterFactory, clients: Clients,  # noqa: F811
                                        paho_factory: PahoFactory) -> None:
    c = cluster(2)
    n1, n2 = c.nodes
    for node in c.nodes:
        wait_port(node.rocketmq_port)
    first = clients.consumer(n1, "workers", "a")
    second = clients.consumer(n2, "workers", "a")
    device = paho_factory(n2.port, "device-1")
    device.connect()
    for i in range(40):
        device.publish(f"a/{i}", b"%d" % i, qos=1)
    seen: dict[str, list[bytes]] = {"n1": [], "n2": []}
    held: list[bytes] = []  # received through n1 (by either consumer: both are routed to both nodes), never acked
    deadline = time.monotonic() + 20
    while len(seen["n1"]) + len(seen["n2"]) < 40 and time.monotonic() < deadline:
        for name, consumer in (("n1", first), ("n2", second)):
            for m in consumer.receive(4, 60):
                seen[name].append(m.body)
                if str(m.endpoints) == f"127.0.0.1:{n1.rocketmq_port}" and len(held) < 3:
                    held.append(m.body)
                else:
                    consumer.ack(m)
    everything = seen["n1"] + seen["n2"]
    assert sorted(everything) == sorted(b"%d" % i for i in range(40)), c.logs()  # once each
    assert seen["n1"] and seen["n2"]
    assert len(held) == 3
    clients.shutdown(first)
    c.kill9(n1)  # its claims are released when the survivor declares it dead, not after their 60 s
    second.await_duration = 2
    back: list[bytes] = []
    deadline = time.monotonic() + 15
    while len(back) < 3 and time.monotonic() < deadline:
        try:
            batch = second.receive(4, 60)
        except Exception:  # n1's queue is in its route until the next refresh: that receive fails
            continue
        for m in batch:
            assert m.delivery_attempt == 2
            back.append(m.body)
            second.ack(m)
    assert sorted(back) == sorted(held), c.logs()


class _Pushed(MessageListener):
    """Records each delivery's body and the node (RocketMQ port) it came through."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.nodes: list[int] = []

    def consume(self, message: Message) -> int:
        self.bodies.append(message.body)
        self.nodes.append(int(str(message.endpoints).rpartition(":")[2]))
        return ConsumeResult.SUCCESS


def routed_ports(node: ClusterNode, topic: str) -> list[int]:
    """The RocketMQ ports of the queues `node` lists in its route of `topic`."""
    config = Clients().config(node)
    with grpc.insecure_channel(f"127.0.0.1:{node.rocketmq_port}") as channel:
        request = QueryRouteRequest()
        request.topic.name = topic
        answer = MessagingServiceStub(channel).QueryRoute(request, metadata=Signature.metadata(config, "probe"),
                                                          timeout=5)
    return sorted(queue.broker.endpoints.addresses[0].port for queue in answer.message_queues)


@pytest.mark.slow  # three nodes and a kill -9: seconds
def test_clients_given_one_node_use_every_node_and_survive_its_kill(cluster: ClusterFactory,  # noqa: F811
                                                                    clients: Clients) -> None:
    """A producer, a SimpleConsumer and a PushConsumer (another group) given n1's address only: routes list n1,
    n2 and n3, so sends and receives spread over all three; after n1 is killed -9 they carry on with n2 and n3,
    and every message sent is received by both groups (lost: 0; a message whose ack died with n1 may come
    twice)."""
    c = cluster(3)
    n1 = c.nodes[0]
    ports = {node.rocketmq_port: node.node_id for node in c.nodes}
    for node in c.nodes:
        wait_port(node.rocketmq_port)
    wait_until(lambda: all(routed_ports(node, "T") == sorted(ports) for node in c.nodes), timeout=10,
               what="every node routing to all three")
    consumer = clients.consumer(n1, "spread", "T", await_s=1)
    wait_until(lambda: all("event=rocketmq.subscription group=spread topic=T " in node.stderr for node in c.nodes),
               timeout=10, what="the consumer's settings on every node")
    pushed = _Pushed()
    # The Python client retries an ack to the endpoint that delivered the message, forever, in a consumption
    # thread: acks in flight to n1 when it dies hold one thread each until n1 is back (restarted below).
    pusher = PushConsumer(clients.config(n1), "pushers", pushed, {"T": FilterExpression()},
                          consumption_thread_count=64)
    pusher.startup()
    clients.made.append(pusher)
    wait_until(lambda: all("event=rocketmq.subscription group=pushers topic=T " in node.stderr for node in c.nodes),
               timeout=10, what="the push consumer's settings on every node")
    producer = clients.producer(n1, ["T"])

    def node_of(endpoints: object) -> str:
        return ports[int(str(endpoints).rpartition(":")[2])]

    sent: list[bytes] = []
    sent_to: Counter[str] = Counter()
    refused = 0

    def send(first: int, count: int) -> None:
        nonlocal refused
        for i in range(first, first + count):
            body = b"m%d" % i
            try:
                receipt = producer.send(message("T", body))
            except Exception:
                refused += 1
                continue
            sent.append(body)
            sent_to[node_of(receipt.message_queue.endpoints)] += 1

    got: list[bytes] = []
    got_from: Counter[str] = Counter()
    receive_errors = 0

    def receive_all(timeout: float) -> None:
        nonlocal receive_errors
        deadline = time.monotonic() + timeout
        while not set(sent) <= set(got) and time.monotonic() < deadline:
            try:
                batch = consumer.receive(4, 30)
            except Exception:  # the killed node's queue, until the route drops it
                receive_errors += 1
                continue
            for m in batch:
                got.append(m.body)
                got_from[node_of(m.endpoints)] += 1
                try:
                    consumer.ack(m)
                except Exception:
                    pass  # delivered again by a survivor: a duplicate, not a loss

    send(0, 60)
    receive_all(30)
    # Each receive goes to the next node, but one that has not heard of the messages yet answers empty while the
    # others hand them out: a few more rounds until every node has delivered some.
    deadline = time.monotonic() + 30
    while set(got_from) != set(ports.values()) and time.monotonic() < deadline:
        send(len(sent) + refused, 6)
        receive_all(10)
    assert set(sent_to) == set(ports.values()), (sent_to, c.logs())
    assert set(got_from) == set(ports.values()), (got_from, c.logs())
    # The push consumer long-polls every node (its subscription is on each): the first to hear of a message
    # hands it over, so how many each node delivered depends on timing; that they all take part is above.
    wait_until(lambda: set(sent) <= set(pushed.bodies), timeout=20, what="the push consumer getting the first ones")
    c.kill9(n1)
    before = dict(got_from)
    first = len(sent) + refused
    send(first, 60)
    receive_all(60)
    wait_until(lambda: set(sent) <= set(pushed.bodies), timeout=30, what="the push consumer getting all 120")
    lost = set(sent) - set(got)
    duplicated = len(got) - len(set(got))
    print(f"sent per node {dict(sent_to)}, received per node {dict(got_from)}, refused {refused}, "
          f"lost {len(lost)}, duplicated {duplicated}, receive errors {receive_errors}; push consumer: per node "
          f"{dict(Counter(ports[port] for port in pushed.nodes))}, lost {len(set(sent) - set(pushed.bodies))}, "
          f"duplicated {len(pushed.bodies) - len(set(pushed.bodies))}")
    assert refused == 0 and len(sent) == first + 60
    assert not lost, (sorted(lost), c.logs())
    assert got_from["n2"] > before.get("n2", 0) and got_from["n3"] > before.get("n3", 0)
    c.restart(n1)  # the client's ack retries to n1 end (handles since redelivered are refused), so it shuts down
