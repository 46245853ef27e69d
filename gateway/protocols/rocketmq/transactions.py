"""RocketMQ transactional messages: half messages, EndTransaction, and the server's check-back of a transaction a
producer left open, as a RocketMQ 5 broker does it.

A half message is stored at once, as RocketMQ stores it in `RMQ_SYS_TRANS_HALF_TOPIC`: on the MQTT topic
`$RMQ_SYS_TRANS_HALF_TOPIC/<its topic>`, which no consumer group and no MQTT wildcard subscription reads (MQTT
wildcards skip `$` topics). Its transaction id is its seq. EndTransaction COMMIT publishes the message on its
topic; ROLLBACK stores a marker on `$RMQ_SYS_TRANS_OP_HALF_TOPIC`. Either carries the de-duplication key
(`TX_SCOPE`, half seq), so a transaction ends once, whatever the retries, races and nodes (the store keeps the
first end and refuses the others atomically).

The check-back reads the half messages as the consumer group `rmqtx/checks` (state in the store, shared by every
node): a half is due `rocketmq_transaction_check_seconds` after it was sent, and again each interval while no
end came. A node takes due halves while it has producers' telemetry streams: an ended one is settled (and its
key released); an open one is sent, as a RecoverOrphanedTransactionCommand, to a producer of its topic on this
node, which answers with EndTransaction; after `rocketmq_transaction_check_max` checks it is dropped (rolled
back), as RocketMQ's transactionCheckMax does.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from tidewire.errors import PublishFailed
from tidewire.extensions.hooks import ClientInfo
from tidewire.gateway.core.group_reader import Delivery
from tidewire.gateway.core.ingress import neutral_message, publish_future, refuse_publish
from tidewire.store.base import PROTOCOL_ROCKETMQ, Claim, GroupRecord, Message
from tidewire.store.properties import Properties

from .mapping import Code, Outbound, bad_name, outbound, split_topic, status
from .v2 import definition_pb2, service_pb2

if TYPE_CHECKING:
    from tidewire.gateway.node import Node

log = logging.getLogger("tidewire.rocketmq")

HALF_PREFIX = "$RMQ_SYS_TRANS_HALF_TOPIC/"
OP_TOPIC = "$RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECKS_GROUP = "rmqtx/checks"
TX_SCOPE = "\x00rocketmq-tx\x00"  # the store scope of ended transactions' keys (NUL: no MQTT client id's)
MAX_CHECKING = 256  # half messages one node checks at a time


def half_topic(topic: str) -> str:
    return HALF_PREFIX + topic


def transaction_id(seq: int) -> str:
    return f"{seq:x}"


def _seq_of(tx_id: str) -> int | None:
    if not 0 < len(tx_id) <= 16:
        return None
    try:
        seq = int(tx_id, 16)
    except ValueError:
        return None
    return seq if seq > 0 else None


class ProducerStream:
    """One producer's telemetry stream on this node: the topics it publishes and its outgoing commands."""

    __slots__ = ("caller", "out", "topics")

    def __init__(self, caller: ClientInfo) -> None:
        self.caller = caller
        self.topics: frozenset[str] = frozenset()
        self.out: asyncio.Queue[Any] = asyncio.Queue()


class Transactions:
    """The transactions of one node: ends them, and checks back open ones with its producers."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.settings = node.settings
        self.visibility_ms = self.settings.rocketmq_transaction_check_seconds * 1000  # `Consumer`
        self._streams: list[ProducerStream] = []
        self._declared = False
        self._consuming = False
        self._checking = 0
        self._tasks: set[asyncio.Task[None]] = set()

    # --- producers' streams ----------------------------------------------------------------------------
    async def publishing(self, stream: ProducerStream, topics: frozenset[str]) -> None:
        """A producer's stream named the topics it publishes: it may be asked to check their transactions."""
        if not self._declared:
            await self.node.groups.declare(GroupRecord(CHECKS_GROUP, [HALF_PREFIX + "#"], durable=True,
                                                       attrs={"protocol": "rocketmq"}))
            self._declared = True
        self.node.groups.kinds(CHECKS_GROUP, None, self._due)
        stream.topics = topics
        if stream not in self._streams:
            self._streams.append(stream)
        if not self._consuming:
            self._consuming = self.node.groups.consume(CHECKS_GROUP, self)

    def closed(self, stream: ProducerStream) -> None:
        if stream in self._streams:
            self._streams.remove(stream)
        if not self._streams and self._consuming:
            self.node.groups.cancel(CHECKS_GROUP, self)
            self._consuming = False

    def _due(self, message: Message) -> int:
        return message.timestamp_ms + self.visibility_ms

    # --- the check-back: a `Consumer` of the checks group ------------------------------------------------
    def credit(self) -> int:
        return MAX_CHECKING - self._checking

    def deliver(self, deliveries: list[Delivery]) -> None:
        self._checking += len(deliveries)
        task = asyncio.get_running_loop().create_task(self._check(deliveries))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _check(self, deliveries: list[Delivery]) -> None:
        try:
            ended = set(await self.node.store.dedupe_ids(TX_SCOPE))
            done: list[tuple[int, int]] = []
            released: list[str] = []
            for delivery in deliveries:
                message, claim = delivery
                key = transaction_id(message.seq)
                checks = claim.deliveries - 1  # its first claim only hid it until it was due
                if key in ended:
                    done.append((claim.seq, claim.token))
                    released.append(key)
                elif checks > self.settings.rocketmq_transaction_check_max:
                    done.append((claim.seq, claim.token))
                    log.warning("rocketmq.transaction_dropped", extra={"transaction_id": key, "checks": checks - 1,
                                                                        "topic": message.topic[len(HALF_PREFIX):]})
                else:
                    self._ask(message)
            if done:
                await self.node.groups.ack(CHECKS_GROUP, done)
            if released:
                await self.node.store.release_dedupe(TX_SCOPE, released)
        except Exception as exc:  # the claims lapse: checked again after the interval
            log.warning("rocketmq.transaction_check_failed", extra={"error": repr(exc)})
        finally:
            self._checking -= len(deliveries)
            self.node.groups.wake(CHECKS_GROUP)

    def _ask(self, half: Message) -> None:
        """Send the check to a producer of the half's topic on this node (none here: asked at the next check)."""
        topic = half.topic[len(HALF_PREFIX):]
        rmq_topic = split_topic(topic)[0]
        stream = next((s for s in self._streams if rmq_topic in s.topics), None)
        if stream is None:
            return
        real = Message(topic, half.payload, half.qos, False, half.properties, half.timestamp_ms, seq=half.seq)
        to = Outbound("", CHECKS_GROUP, 0, self.settings.rocketmq_second_topic_property, self.settings.node_id)
        pb = outbound(real, Claim(half.seq, 1, 0), to)
        pb.system_properties.ClearField("receipt_handle")
        pb.system_properties.message_type = definition_pb2.TRANSACTION
        command = service_pb2.TelemetryCommand(status=status(Code.OK))
        command.recover_orphaned_transaction_command.message.CopyFrom(pb)
        command.recover_orphaned_transaction_command.transaction_id = transaction_id(half.seq)
        stream.out.put_nowait(command)
        log.info("rocketmq.transaction_check", extra={"transaction_id": transaction_id(half.seq), "topic": topic})

    # --- EndTransaction ----------------------------------------------------------------------------------
    async def end(self, caller: ClientInfo, request: Any) -> Any:
        response = service_pb2.EndTransactionResponse
        seq = _seq_of(request.transaction_id)
        if bad_name(request.topic.name) or seq is None:
            return response(status=status(Code.INVALID_TRANSACTION_ID, "unknown transaction"))
        found = await self.node.store.fetch([seq])
        half = found[0] if found else None
        if half is None or not half.topic.startswith(HALF_PREFIX) or \
                split_topic(half.topic[len(HALF_PREFIX):])[0] != request.topic.name:
            return response(status=status(Code.INVALID_TRANSACTION_ID, "unknown transaction"))
        topic = half.topic[len(HALF_PREFIX):]
        if refuse_publish(self.settings, self.node.authorizer, caller, topic) is not None:
            return response(status=status(Code.FORBIDDEN, "may not publish to this topic"))
        now_ms = int(self.node.clock.time() * 1000)
        if request.resolution == definition_pb2.COMMIT:
            end = neutral_message(topic, half.payload, properties=Properties.from_block(half.properties),
                                  publisher=half.publisher, now_ms=now_ms, protocol=PROTOCOL_ROCKETMQ)
        elif request.resolution == definition_pb2.ROLLBACK:
            end = neutral_message(OP_TOPIC, b"rollback", publisher=half.publisher, now_ms=now_ms,
                                  protocol=PROTOCOL_ROCKETMQ)
        else:  # the producer does not know yet (a checker's "unknown"): asked again at the next check
            return response(status=status(Code.OK))
        end.dedupe = (TX_SCOPE, transaction_id(seq))
        try:
            await publish_future(self.node.publish, [end])[0]
        except PublishFailed as exc:
            return response(status=status(Code.INTERNAL_SERVER_ERROR, f"not stored: {exc}"))
        log.info("rocketmq.transaction_end", extra={
            "transaction_id": transaction_id(seq), "topic": topic, "again": end.duplicate,
            "resolution": definition_pb2.TransactionResolution.Name(request.resolution)})
        return response(status=status(Code.OK))

    async def stop(self) -> None:
        if self._consuming:
            self.node.groups.cancel(CHECKS_GROUP, self)
            self._consuming = False
        for task in list(self._tasks):
            task.cancel()
