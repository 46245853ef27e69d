"""One AMQP channel's commands: queues and their bindings, Basic.Publish with publisher confirms (routed at
publish by `routing` where topic filters cannot route), and the consuming commands (handed to
`consuming.Deliveries`); the exchange commands are `exchange_commands`'.

A channel is the `DurableSink` of its publishes: `node.publish(message, channel, seq)` and the node calls
`durable` once the batch is synced, so a confirm (Basic.Ack, multiple when it can) means the message is
stored. Mandatory publishes that nothing would receive come back as Basic.Return 312 NO_ROUTE (then the
confirm, as RabbitMQ orders them) and are not stored. Every handler returns None or the `Fault` that closes
the channel (or the connection, for hard codes).
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from pamqp import commands

from tidewire.gateway.core.ingress import NOT_AUTHORIZED, neutral_message, refuse_publish
from tidewire.gateway.core.tenants import mount_topic, vhost_mount
from tidewire.gateway.protocols.amqp.arguments import parse_arguments
from tidewire.gateway.protocols.amqp.codec import (
    ACCESS_REFUSED,
    NO_ROUTE,
    NOT_ALLOWED,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    Fault,
    Method,
    Properties,
    fault,
)
from tidewire.gateway.protocols.amqp.consuming import Deliveries
from tidewire.gateway.protocols.amqp.exchange_commands import ExchangeCommands
from tidewire.gateway.protocols.amqp.exchanges import Exchange
from tidewire.gateway.protocols.amqp.mapping import (
    MAX_QUEUE_NAME,
    NAME,
    properties_in,
    publish_topic,
    queue_topic,
)
from tidewire.gateway.protocols.amqp.queues import QueueSpec, group_name
from tidewire.gateway.protocols.amqp.routing import encode_arguments, route
from tidewire.store.base import PROTOCOL_AMQP, GroupRecord, Message

if TYPE_CHECKING:
    from tidewire.gateway.protocols.amqp.connection import AmqpConnection

Basic, Exch, Queue, Confirm = commands.Basic, commands.Exchange, commands.Queue, commands.Confirm
Handler = Callable[[Any, Properties | None, bytes], Awaitable[Fault | None]]

# The store scope of a vhost's and user's message-ids: starts with NUL, which no MQTT client id (an MQTT session's
# scope) may contain, and names the protocol, so no other scope meets it.
DEDUPE_SCOPE = "\x00amqp\x00"


class Channel:
    def __init__(self, conn: AmqpConnection, number: int) -> None:
        self.conn = conn
        self.number = number
        self.node = conn.node
        self.vhost = conn.core.vhost
        self.mount = vhost_mount(self.vhost)  # a tenant's vhost: its topics below the channel are under its mount
        self.deliveries = Deliveries(conn, number)
        self.exchanges = ExchangeCommands(conn, self.vhost, self._reply)
        self.confirm = False
        self.next_publish = 1
        self.unconfirmed: dict[int, None] = {}  # publish seqs awaiting their confirm, in order
        # Confirmed publishes carrying a de-duplication key (`amqp_dedupe_seconds`), until the store took them.
        self._keyed: dict[int, Message] = {}
        self.last_queue = ""  # the queue an empty queue name stands for (spec: last declared on the channel)
        self.closed = False
        self._handlers: dict[type, Handler] = {
            Basic.Publish: self._publish, Basic.Ack: self._ack, Basic.Nack: self._nack, Basic.Reject: self._reject,
            Basic.Consume: self._consume, Basic.Cancel: self._cancel, Basic.Get: self._get, Basic.Qos: self._qos,
            Basic.Recover: self._recover, Basic.RecoverAsync: self._recover, Confirm.Select: self._confirm_select,
            Exch.Declare: self.exchanges.declare, Exch.Delete: self.exchanges.delete,
            Exch.Bind: self.exchanges.bind, Exch.Unbind: self.exchanges.unbind,
            Queue.Declare: self._queue_declare, Queue.Bind: self._queue_bind, Queue.Unbind: self._queue_unbind,
            Queue.Purge: self._queue_purge, Queue.Delete: self._queue_delete,
        }

    async def handle(self, method: Method, properties: Properties | None, body: bytes) -> Fault | None:
        handler = self._handlers.get(type(method))
        if handler is None:
            what = {commands.Tx.frame_id: "transactions"}.get(method.index >> 16, method.name)
            return fault(NOT_IMPLEMENTED, f"{what} not supported", method)
        return await handler(method, properties, body)

    def _reply(self, method: Method) -> None:
        self.conn.core.send_method(self.number, method)

    async def close(self) -> None:
        """The channel is gone (either side closed it, or the connection): stop consuming, requeue unacked."""
        if self.closed:
            return
        self.closed = True
        self.unconfirmed.clear()
        self.conn.unblock(self)
        await self.deliveries.close()

    # --- DurableSink ---------------------------------------------------------------------------------------
    def durable(self, tokens: list[Any]) -> None:
        if self._keyed:
            for t in tokens:
                m = self._keyed.pop(t, None)
                if m is not None and m.dedupe is not None and not m.duplicate:  # a retry's key is its first's
                    self.conn.server.held_keys.hold(*m.dedupe)
        self._settle_confirms([t for t in tokens if t is not None], Basic.Ack)

    def failed(self, tokens: list[Any], reason: str) -> None:
        for t in tokens:
            self._keyed.pop(t, None)
        self._settle_confirms([t for t in tokens if t is not None], Basic.Nack)

    def pause_publishes(self) -> None:
        self.conn.block(self)

    def resume_publishes(self) -> None:
        self.conn.unblock(self)

    def _settle_confirms(self, seqs: list[int], kind: Callable[[int, bool], Method]) -> None:
        if not seqs or self.closed or not self.conn.core.channel_open(self.number):
            return
        for seq in seqs:
            self.unconfirmed.pop(seq, None)
        top = max(seqs)
        first = next(iter(self.unconfirmed), None)
        if len(seqs) > 1 and (first is None or first > top):
            self._reply(kind(top, True))  # exact: nothing at or below `top` is still unconfirmed
        else:
            for seq in seqs:
                self._reply(kind(seq, False))

    # --- publishing ----------------------------------------------------------------------------------------
    async def _publish(self, method: Any, properties: Properties | None, body: bytes) -> Fault | None:
        conn = self.conn
        exchange = await conn.server.exchanges.get(self.vhost, method.exchange)
        if exchange is None:
            return fault(NOT_FOUND, f"no exchange '{method.exchange}' in vhost '{self.vhost}'", method)
        if exchange.internal:
            return fault(ACCESS_REFUSED, f"cannot publish to internal exchange '{exchange.name}'", method)
        topic = publish_topic(exchange.name, exchange.kind, method.routing_key)
        refused = refuse_publish(self.node.settings, self.node.authorizer, conn.info, topic)
        if refused == NOT_AUTHORIZED:
            return fault(ACCESS_REFUSED, f"publish to topic '{topic[:80]}' refused for user "
                                         f"'{conn.info.username}'", method)
        if refused is not None:
            return fault(PRECONDITION_FAILED, f"routing key '{method.routing_key[:80]}' is not a valid topic "
                                              f"on exchange '{exchange.name}'", method)
        topic = mount_topic(self.mount, topic) if self.mount else topic
        mapped = properties_in(properties, conn.info.username)
        if isinstance(mapped, str):
            return fault(PRECONDITION_FAILED, mapped, method)
        neutral, qos = mapped
        message = neutral_message(topic, body, qos=qos, properties=neutral, publisher=conn.id,
                                  now_ms=int(self.node.clock.time() * 1000), protocol=PROTOCOL_AMQP)
        hooks = self.node.hooks
        if hooks is not None:  # this connection's worker runs one command at a time: publishes stay in order
            why = await hooks.check(conn.info, message)
            if why is not None:
                return fault(ACCESS_REFUSED, f"publish to topic '{message.topic[:80]}' refused for user "
                                             f"'{conn.info.username}': {why[:120]}", method)
            topic = message.topic
        seq = None
        if self.confirm:
            seq = self.next_publish
            self.next_publish += 1
            self.unconfirmed[seq] = None
            held = conn.server.held_keys
            if held.seconds and properties is not None and properties.message_id:
                # A publisher that retries an unconfirmed message after a reconnect (on any node) sends it with
                # the same message-id: stored once while the key is held.
                message.dedupe = (f"{DEDUPE_SCOPE}{self.vhost}\x00{conn.info.username or ''}",
                                  str(properties.message_id))
                self._keyed[seq] = message
        if exchange.routes_at_publish:
            message.routes = await self._route(exchange, method.routing_key, properties, topic)
        if method.mandatory and not message.routes and not await self.node.groups.routed(topic) and (
                not await conn.server.queues.routed_in_store(topic)):
            self.conn.core.send_content(self.number, Basic.Return(NO_ROUTE, "NO_ROUTE", exchange.name,
                                                                  method.routing_key),
                                        properties or Properties(), body)
            if seq is not None:
                self._settle_confirms([seq], Basic.Ack)
            return None
        backlog = conn.server.queues.backlog
        limited = backlog.limited(topic)
        if limited:  # checked against the queues' limits, and in them, before the next command
            await backlog.publish(message, self, seq, limited)
            return None
        self.node.publish(message, self, seq)
        return None

    async def _route(self, exchange: Exchange, key: str, properties: Properties | None,
                     topic: str) -> tuple[str, ...]:
        """The queues (their `$queue/` topics) `routing` sends the message to besides its topic's."""
        graph = await self.conn.server.routing.graph(self.vhost)
        own = bool(exchange.alternate) and await self.node.groups.routed(topic)
        headers = properties.headers if properties is not None and isinstance(properties.headers, dict) else {}
        return tuple(sorted(mount_topic(self.mount, queue_topic(q)) if self.mount else queue_topic(q)
                            for q in route(graph, exchange.name, key, headers, own)))

    async def _confirm_select(self, method: Any, _p: Properties | None, _b: bytes) -> Fault | None:
        self.confirm = True
        if not method.nowait:
            self._reply(Confirm.SelectOk())
        return None

    # --- queues --------------------------------------------------------------------------------------------
    async def _queue(self, name: str, method: Method) -> GroupRecord | Fault:
        name = name or self.last_queue
        if not name:
            return fault(NOT_FOUND, "no previously declared queue", method)
        return await self.conn.server.queues.find(self.vhost, name, self.conn.id, method)

    async def _learn_exchanges(self, record: GroupRecord) -> None:
        """Read the types of the exchanges the queue is bound to: a delivery's routing key is derived from its
        topic by its exchange's type (`mapping.origin`), and the binding may have been made on another node."""
        exchanges = self.conn.server.exchanges
        bindings = record.attrs.get("bindings")
        for exchange in {b[0] for b in bindings if isinstance(b, list) and b} if isinstance(bindings, list) else ():
            if isinstance(exchange, str) and exchange not in exchanges.kinds:
                await exchanges.get(self.vhost, exchange)
        # What exchange bindings and alternates route comes from exchanges the queue is not bound to: the routing
        # graph has the type of every exchange of the vhost.
        for name, vertex in (await self.conn.server.routing.graph(self.vhost)).items():
            if name not in exchanges.kinds and len(exchanges.kinds) < 100_000:
                exchanges.kinds[name] = vertex.kind

    async def _queue_declare(self, method: Any, _p: Properties | None, _b: bytes) -> Fault | None:
        queues, vhost, conn = self.conn.server.queues, self.vhost, self.conn
        name = method.queue
        args = parse_arguments(method.arguments)
        if isinstance(args, str):
            return fault(PRECONDITION_FAILED, args, method)
        created = False
        if method.passive:
            found = await self._queue(name, method)
            if isinstance(found, Fault):
                return found
            record = found
        else:
            if not name:
                name = "amq.gen-" + secrets.token_urlsafe(16)
            elif len(name.encode()) > MAX_QUEUE_NAME or not NAME.fullmatch(name):
                return fault(PRECONDITION_FAILED, "invalid queue name", method)
            elif name.startswith("amq.") and await self.node.store.get_group(group_name(vhost, name)) is None:
                return fault(ACCESS_REFUSED, f"queue name '{name}' contains reserved prefix 'amq.*'", method)
            spec = QueueSpec(name, bool(method.durable), bool(method.exclusive), bool(method.auto_delete), args)
            declared = await queues.declare(vhost, spec, conn.id, method)
            if isinstance(declared, Fault):
                return declared
            record, created = declared
            if spec.exclusive:
                conn.exclusive.add(record.name)
        self.last_queue = queue = str(record.attrs.get("queue", name))
        if not method.nowait:
            count = 0 if created else await queues.message_count(record)
            self._reply(Queue.DeclareOk(queue, count, await queues.consumer_count(record)))
        return None

    async def _binding(self, method: Any) -> tuple[GroupRecord, Exchange] | Fault:
        found = await self._queue(method.queue, method)
        if isinstance(found, Fault):
            return found
        if method.exchange == "":
            return fault(ACCESS_REFUSED, "operation not permitted on the default exchange", method)
        exchange = await self.conn.server.exchanges.get(self.vhost, method.exchange)
        if exchange is None:
            return fault(NOT_FOUND, f"no exchange '{method.exchange}' in vhost '{self.vhost}'", method)
        return found, exchange

    async def _queue_bind(self, method: Any, _p: Properties | None, _b: bytes) -> Fault | None:
        found = await self._binding(method)
        if isinstance(found, Fault):
            return found
        record, exchange = found
        made = self.exchanges.binding_to(exchange, method.routing_key, method.arguments, method)
        if isinstance(made, Fault):
            return made
        server = self.conn.server
        await server.queues.bind(record, exchange.name, method.routing_key, *made)
        server.routing.changed()
        if not method.nowait:
            self._reply(Queue.BindOk())
        return None

    async def _queue_unbind(self, method: Any, _p: Properties | None, _b: bytes) -> Fault | None:
        found = await self._binding(method)
        if isinstance(found, Fault):
            return found
        record, exchange = found
        server = self.conn.server
        arguments = encode_arguments(method.arguments if isinstance(method.arguments, dict) else {})
        await server.queues.unbind(record, exchange.name, method.routing_key, arguments)
        server.routing.changed()
        await self.exchanges.unused_auto_delete(exchange)  # its last binding may be gone
        self._reply(Queue.UnbindOk())
        return None

    async def _queue_purge(self, method: Any, _p: Properties | None, _b: bytes) -> Fault | None:
        found = await self._queue(method.queue, method)
        if isinstance(found, Fault):
            return found
        count = await self.conn.server.queues.purge(found)
        if not method.nowait:
            self._reply(Queue.PurgeOk(count))
        return None

    async def _queue_delete(self, method: Any, _p: Properties | None, _b: bytes) -> Fault | None:
        queues = self.conn.server.queues
        name = method.queue or self.last_queue
        found = await self._queue(name, method)
        count = 0
        if isinstance(found, Fault):
            if found.code != NOT_FOUND:
                return found
        else:
            if method.if_unused and await queues.consumer_count(found):
                return fault(PRECONDITION_FAILED, f"queue '{name}' in vhost '{self.vhost}' in use", method)
            if method.if_empty and await queues.message_count(found):
                return fault(PRECONDITION_FAILED, f"queue '{name}' in vhost '{self.vhost}' is not empty", method)
            count = await queues.delete(found)
            self.conn.exclusive.discard(found.name)
            self.conn.server.routing.changed()
        if not method.nowait:
            self._reply(Queue.DeleteOk(count))
        return None

    # --- consuming -----------------------------------------------------------------------------------------
    async def _qos(self, method: Any, _p: Properties | None, _b: bytes) -> Fault | None:
        if method.prefetch_size:
            return fault(NOT_IMPLEMENTED, f"prefetch_size!=0 ({method.prefetch_size})", method)
        self.deliveries.qos(method.prefetch_count, bool(method.global_))
        self._reply(Basic.QosOk())
        return None

    async def _consume(self, method: Any, _p: Properties | None, _b: bytes) -> Fault | None:
        found = await self._queue(method.queue, method)
        if isinstance(found, Fault):
            return found
        queues = self.conn.server.queues
        tag = method.consumer_tag or "amq.ctag-" + secrets.token_urlsafe(16)
        if tag in self.deliveries.consumers:
            return fault(NOT_ALLOWED, f"attempt to reuse consumer tag '{tag[:80]}'", method)
        member = f"{self.conn.id}/{self.number}/{tag}"  # (unique in the cluster: a connection id names its node)
        if not await queues.join(found.name, member, bool(method.exclusive)):
            queue = found.attrs.get("queue", method.queue)
            return fault(ACCESS_REFUSED, f"queue '{queue}' in vhost '{self.vhost}' in exclusive use", method)
        await self._learn_exchanges(found)
        if not method.nowait:
            self._reply(Basic.ConsumeOk(tag))
        queues.touch(found.name)
        await queues.backlog.trim(found)  # the head it starts from is within the queue's limits
        self.deliveries.consume(found.name, str(found.attrs.get("queue", method.queue)), tag, bool(method.no_ack),
                                member)
        return None

    async def _cancel(self, method: Any, _p: Properties | None, _b: bytes) -> Fault | None:
        await self.deliveries.cancel(method.consumer_tag)
        if not method.nowait:
            self._reply(Basic.CancelOk(method.consumer_tag))
        return None

    async def _get(self, method: Any, _p: Properties | None, _b: bytes) -> Fault | None:
        found = await self._queue(method.queue, method)
        if isinstance(found, Fault):
            return found
        queues = self.conn.server.queues
        queues.touch(found.name)
        await self._learn_exchanges(found)
        await queues.backlog.trim(found)
        await self.deliveries.get(found.name, str(found.attrs.get("queue", method.queue)), bool(method.no_ack),
                                  lambda: queues.ready_count(found))
        return None

    async def _ack(self, method: Any, _p: Properties | None, _b: bytes) -> Fault | None:
        return await self.deliveries.settle(method.delivery_tag, bool(method.multiple), None, method)

    async def _nack(self, method: Any, _p: Properties | None, _b: bytes) -> Fault | None:
        return await self.deliveries.settle(method.delivery_tag, bool(method.multiple), bool(method.requeue), method)

    async def _reject(self, method: Any, _p: Properties | None, _b: bytes) -> Fault | None:
        return await self.deliveries.settle(method.delivery_tag, False, bool(method.requeue), method)

    async def _recover(self, method: Any, _p: Properties | None, _b: bytes) -> Fault | None:
        if not method.requeue:
            return fault(NOT_IMPLEMENTED, "requeue=false", method)
        await self.deliveries.recover()
        if isinstance(method, Basic.Recover):
            self._reply(Basic.RecoverOk())
        return None
