"""RocketMQ consumers over the node's consumer groups: a consumer group's subscription of topic T is the
gateway group `rmq/<group>/<T>` reading `T/#` (the first-level queue, so a device publish on `T/b/c` reaches a
RocketMQ consumer of topic T), with the subscription's tag or SQL filter as the group's matcher.

ReceiveMessage is one `node.groups.receive` poll; AckMessage settles, ChangeInvisibleDuration moves a claim
(new receipt handle), ForwardMessageToDeadLetterQueue publishes a copy to `%DLQ%<group>` and settles. What a push
consumer receives (`auto_renew`) stays hidden while it works on it (`renewal`). Claims, cursors and receipt
handles are in the store: they survive restarts and are shared by every node. Every consumer group keeps FIFO
messages' order (one in flight per message group) and holds delay messages until their time (`kinds`).

With the lake on (`node.events`), each message a ReceiveMessage sends is recorded as `delivered` (dup: a
redelivery) and each entry an AckMessage settles as `acked`, under the client's id and the consumer group.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

from tidewire.errors import PublishFailed
from tidewire.extensions.hooks import ClientInfo, SubscribeAccess
from tidewire.gateway.core.ingress import neutral_message, publish_future
from tidewire.gateway.core.tenants import client_mount, closed_to, mount_topic, unmount
from tidewire.pipeline.lake.event_names import ACKED, DELIVERED
from tidewire.store.base import PROTOCOL_ROCKETMQ, GroupRecord
from tidewire.store.properties import Properties

from .filters import FilterError, compile_filter
from .kinds import due_of, lane_of
from .mapping import (
    Code,
    Outbound,
    Refusal,
    bad_name,
    duration_ms,
    join_topic,
    message_id,
    outbound,
    parse_receipt_handle,
    receipt_handle,
    split_topic,
    status,
    timestamp_now,
)
from .renewal import Renewals
from .v2 import service_pb2

if TYPE_CHECKING:
    from tidewire.gateway.node import Node

log = logging.getLogger("tidewire.rocketmq")

GROUP_PREFIX = "rmq/"
DLQ_PREFIX = "%DLQ%"
MAX_BATCH = 64  # messages per ReceiveMessage (larger requests are served 64 at a time)
MIN_INVISIBLE_MS = 1000
MAX_INVISIBLE_MS = 12 * 3600 * 1000
DEFAULT_INVISIBLE_MS = 60_000  # a simple consumer that names none (push consumers: rocketmq_push_invisible_seconds)
MAX_LONG_POLL_S = 30.0
POLL_MARGIN_S = 0.5  # answer this long before the call's deadline
DLQ_HOLD_MS = 60_000  # a message being dead-lettered stays hidden this long if the gateway dies meanwhile
MAX_GROUPS = 10_000  # RocketMQ subscriptions this node sets up (each is a stored consumer group)
MAX_ACK_ENTRIES = 1024  # receipt handles in one AckMessage
STOP_WAIT_S = 2.0  # at stop, how long requeues of undelivered messages may still take


def group_name(group: str, topic: str, mount: str = "") -> str:
    """The store's consumer group of a RocketMQ group's subscription to a topic (a tenant's: under its mount)."""
    return f"{GROUP_PREFIX}{mount}{group}/{topic}"


def may_read(node: Node, caller: ClientInfo, topic: str) -> bool:
    """The ACL lets `caller` read all of topic T (a partial grant is refused: RocketMQ has no per-message ACL); the
    tenants' `$tenant` space is a default-tenant superuser's only (`gateway.core.tenants`)."""
    topic_filter = topic + "/#"
    return not closed_to(caller, topic_filter) and (
        node.authorizer.subscribe_access(caller, topic_filter) is SubscribeAccess.GRANTED)


class Consuming:
    """The consumer half of the service, on one node."""

    def __init__(self, node: Node, store_host: str) -> None:
        self.node = node
        self.settings = node.settings
        self.store_host = store_host
        self._known: dict[str, tuple[int, str]] = {}  # group name -> the filter its matcher was made from
        self._declaring = asyncio.Lock()
        self._requeues: set[asyncio.Task[Any]] = set()
        self._streams: dict[str, int] = {}  # client id -> its telemetry streams open here
        self.renewals = Renewals(node.groups.requeue, node.clock, self.settings.rocketmq_push_invisible_seconds * 1000,
                                 self.settings.rocketmq_renew_max_seconds * 1000)

    # --- subscriptions ---------------------------------------------------------------------------------------
    async def subscribe(self, group: str, topic: str, filter_type: int, expression: str,
                        mount: str = "") -> str | Refusal:
        """Make sure the group of this subscription exists with this filter; returns its name. `mount`: the
        caller's tenant's mount point (its namespace's)."""
        if bad_name(group):
            return Refusal(Code.ILLEGAL_CONSUMER_GROUP, "a consumer group name is 1 to 255 characters, no '/'")
        if bad_name(topic):
            return Refusal(Code.ILLEGAL_TOPIC, "a topic is one MQTT topic level: no '/', '+', '#'")
        name = group_name(group, topic, mount)
        wanted = (filter_type, expression)
        if self._known.get(name) == wanted:
            return name
        matcher = compile_filter(filter_type, expression)
        if isinstance(matcher, FilterError):
            return Refusal(Code.ILLEGAL_FILTER_EXPRESSION, matcher.reason)
        async with self._declaring:
            if self._known.get(name) == wanted:
                return name
            if name not in self._known and len(self._known) >= MAX_GROUPS:
                return Refusal(Code.TOO_MANY_REQUESTS, f"over {MAX_GROUPS} RocketMQ subscriptions on this node")
            _, created = await self.node.groups.declare(GroupRecord(
                name, [mount + topic + "/#"], durable=True,
                attrs={"protocol": "rocketmq", "group": group, "topic": topic,
                       "filter_type": filter_type, "expression": expression}))
            self.node.groups.matcher(name, matcher)
            self.node.groups.kinds(name, lane_of, due_of)
            self._known[name] = wanted
        log.info("rocketmq.subscription", extra={"group": group, "topic": topic, "new": created,
                                                 "filter": expression or "*"})
        return name

    # --- ReceiveMessage ---------------------------------------------------------------------------------------
    async def receive(self, caller: ClientInfo, request: Any, time_left: float | None) -> AsyncGenerator[Any, None]:
        """The responses of one ReceiveMessage: a status, then the messages, then the delivery timestamp."""
        topic = request.message_queue.topic.name
        group = request.group.name
        if bad_name(topic):
            yield service_pb2.ReceiveMessageResponse(status=status(Code.ILLEGAL_TOPIC, "bad topic name"))
            return
        if not may_read(self.node, caller, topic):
            yield service_pb2.ReceiveMessageResponse(status=status(Code.FORBIDDEN, "may not read this topic"))
            return
        expression = request.filter_expression
        mount = client_mount(caller)
        name = await self.subscribe(group, topic, expression.type, expression.expression, mount)
        if isinstance(name, Refusal):
            yield service_pb2.ReceiveMessageResponse(status=status(name.code, name.reason))
            return
        if request.auto_renew:  # a push consumer: hidden while it works on it, however long (renewal)
            invisible_ms = self.renewals.invisible_ms
        elif request.HasField("invisible_duration"):
            invisible_ms = duration_ms(request.invisible_duration)
            if not MIN_INVISIBLE_MS <= invisible_ms <= MAX_INVISIBLE_MS:
                yield service_pb2.ReceiveMessageResponse(status=status(
                    Code.ILLEGAL_INVISIBLE_TIME, f"invisible duration must be {MIN_INVISIBLE_MS // 1000} s to 12 h"))
                return
        else:
            invisible_ms = DEFAULT_INVISIBLE_MS
        wait_s = min(duration_ms(request.long_polling_timeout) / 1000, MAX_LONG_POLL_S)
        if time_left is not None:
            wait_s = min(wait_s, time_left - POLL_MARGIN_S)
        batch = max(1, min(request.batch_size, MAX_BATCH))
        deliveries = await self.node.groups.receive(name, batch, invisible_ms, max(0.0, wait_s))
        if not deliveries:
            yield service_pb2.ReceiveMessageResponse(status=status(Code.MESSAGE_NOT_FOUND, "no new message"))
            return
        to = Outbound(request.group.resource_namespace, name, invisible_ms,
                      self.settings.rocketmq_second_topic_property, self.store_host, mount)
        sent = 0
        events = self.node.events
        try:
            yield service_pb2.ReceiveMessageResponse(status=status(Code.OK))
            for delivery in deliveries:
                yield service_pb2.ReceiveMessageResponse(message=outbound(delivery.message, delivery.claim, to))
                sent += 1
                if request.auto_renew:
                    self.renewals.hold(name, caller.client_id, [delivery.claim])
                if events is not None:
                    claim = delivery.claim
                    events.add(DELIVERED, int(self.node.clock.time() * 1000), caller.client_id, "rocketmq",
                               delivery.message.topic, claim.seq, None, claim.deliveries > 1, consumer_group=group)
            yield service_pb2.ReceiveMessageResponse(delivery_timestamp=timestamp_now(
                int(self.node.clock.time() * 1000)))
        finally:
            if sent < len(deliveries):  # the call ended under us: what it did not get is visible again at once
                lost = [(d.claim.seq, d.claim.token) for d in deliveries[sent:]]
                task = asyncio.get_running_loop().create_task(self.node.groups.requeue(name, lost, 0))
                self._requeues.add(task)
                task.add_done_callback(self._requeued)

    def _requeued(self, task: asyncio.Task[Any]) -> None:
        self._requeues.discard(task)
        if not task.cancelled() and task.exception() is not None:  # they come back when their claims lapse
            log.warning("rocketmq.requeue_failed", extra={"error": repr(task.exception())})

    # --- settling ---------------------------------------------------------------------------------------------
    def _checked(self, caller: ClientInfo, group: str, topic: str) -> str | Refusal:
        if bad_name(group) or bad_name(topic):
            return Refusal(Code.BAD_REQUEST, "unknown consumer group or topic")
        if not may_read(self.node, caller, topic):
            return Refusal(Code.FORBIDDEN, "may not read this topic")
        return group_name(group, topic, client_mount(caller))

    async def ack(self, caller: ClientInfo, request: Any) -> Any:
        name = self._checked(caller, request.group.name, request.topic.name)
        if isinstance(name, Refusal):
            return service_pb2.AckMessageResponse(status=status(name.code, name.reason))
        if len(request.entries) > MAX_ACK_ENTRIES:
            return service_pb2.AckMessageResponse(status=status(Code.BAD_REQUEST,
                                                                f"over {MAX_ACK_ENTRIES} entries in one ack"))
        parsed = [parse_receipt_handle(name, entry.receipt_handle) for entry in request.entries]
        valid = await self.renewals.settle(name, [handle for handle in parsed if handle is not None])
        settled = set(await self.node.groups.ack(name, valid)) if valid else set()
        response = service_pb2.AckMessageResponse()
        codes = set()
        for entry, handle in zip(request.entries, parsed, strict=True):
            ok = handle is not None and handle[0] in settled
            code = Code.OK if ok else Code.INVALID_RECEIPT_HANDLE
            codes.add(code)
            response.entries.add(message_id=entry.message_id, receipt_handle=entry.receipt_handle,
                                 status=status(code, "" if ok else "receipt handle expired or unknown"))
        response.status.CopyFrom(_overall(codes))
        events = self.node.events
        if events is not None and settled:
            now_ms = int(self.node.clock.time() * 1000)
            for seq in sorted(settled):
                events.add(ACKED, now_ms, caller.client_id, "rocketmq", request.topic.name, seq,
                           consumer_group=request.group.name)
        return response

    async def change_invisible(self, caller: ClientInfo, request: Any) -> Any:
        name = self._checked(caller, request.group.name, request.topic.name)
        if isinstance(name, Refusal):
            return service_pb2.ChangeInvisibleDurationResponse(status=status(name.code, name.reason))
        delay_ms = duration_ms(request.invisible_duration)
        if not 0 <= delay_ms <= MAX_INVISIBLE_MS:
            return service_pb2.ChangeInvisibleDurationResponse(status=status(
                Code.ILLEGAL_INVISIBLE_TIME, "invisible duration must be 0 to 12 h"))
        handle = parse_receipt_handle(name, request.receipt_handle)
        claims = await self.node.groups.requeue(name, await self.renewals.settle(name, [handle]),
                                                delay_ms) if handle is not None else []
        if not claims:
            return service_pb2.ChangeInvisibleDurationResponse(status=status(
                Code.INVALID_RECEIPT_HANDLE, "receipt handle expired or unknown"))
        claim = claims[0]
        return service_pb2.ChangeInvisibleDurationResponse(
            status=status(Code.OK), receipt_handle=receipt_handle(name, claim.seq, claim.token))

    async def dead_letter(self, caller: ClientInfo, request: Any) -> Any:
        """Publish a copy to `%DLQ%<group>` (durable), then settle. The claim is first extended, which also
        proves the handle current, so a stale handle forwards nothing."""
        response = service_pb2.ForwardMessageToDeadLetterQueueResponse
        group = request.group.name
        name = self._checked(caller, group, request.topic.name)
        if isinstance(name, Refusal):
            return response(status=status(name.code, name.reason))
        handle = parse_receipt_handle(name, request.receipt_handle)
        claims = await self.node.groups.requeue(name, await self.renewals.settle(name, [handle]),
                                                DLQ_HOLD_MS) if handle is not None else []
        if not claims:
            return response(status=status(Code.INVALID_RECEIPT_HANDLE, "receipt handle expired or unknown"))
        held = (claims[0].seq, claims[0].token)
        found = await self.node.store.fetch([held[0]])
        if found:
            original = found[0]
            mount = client_mount(caller)
            seen = unmount(mount, original.topic)  # as the caller's namespace names it
            properties = Properties.from_block(original.properties)
            properties.user += [("ORIGIN_MESSAGE_ID", message_id(original.seq)),
                                ("RETRY_TOPIC", split_topic(seen)[0])]
            dlq = join_topic(DLQ_PREFIX + group, split_topic(seen)[1])
            copy = neutral_message(mount_topic(mount, dlq) if mount else dlq, original.payload,
                                   properties=properties, now_ms=int(self.node.clock.time() * 1000),
                                   protocol=PROTOCOL_ROCKETMQ)
            try:
                await publish_future(self.node.publish, [copy])[0]
            except PublishFailed:
                return response(status=status(Code.INTERNAL_SERVER_ERROR, "the dead-letter copy was not stored"))
        await self.node.groups.ack(name, [held])
        return response(status=status(Code.OK))

    def client_gone(self, client_id: str) -> None:
        """The client left this node: what it was working on goes to other consumers shortly."""
        self._streams.pop(client_id, None)
        self.renewals.client_gone(client_id)

    def stream_opened(self, client_id: str) -> None:
        self._streams[client_id] = self._streams.get(client_id, 0) + 1

    def stream_closed(self, client_id: str) -> None:
        """A telemetry stream ended: with the client's last one on this node, the client is gone (a client
        rebuilding its stream may open the new one first)."""
        left = self._streams.get(client_id, 1) - 1
        if left > 0:
            self._streams[client_id] = left
        else:
            self.client_gone(client_id)

    async def stop(self) -> None:
        await self.renewals.stop()
        if self._requeues:
            await asyncio.wait(self._requeues, timeout=STOP_WAIT_S)


def _overall(codes: set[int]) -> Any:
    if len(codes) == 1:
        code = next(iter(codes))
        return status(code, "" if code == Code.OK else "receipt handle expired or unknown")
    return status(Code.MULTIPLE_RESULTS if codes else Code.OK)
