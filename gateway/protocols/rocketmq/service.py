"""The `apache.rocketmq.v2.MessagingService` servicer: authenticates every call, answers routes, settings and
heartbeats, and hands sends to `producing` and consumer calls to `consuming`.

A route lists one queue (id 0, READ_WRITE; NORMAL, FIFO, DELAY and TRANSACTION messages) per live node, on the
RocketMQ endpoint that node advertises (`Topology.advertised`): every node serves every topic and consumer group
from the shared store, so producers and consumers spread over the cluster, and leave a node when it dies (its
queue drops out of the next route and assignment). Alone, the route is this node. Errors are RocketMQ status
codes in the response, never gRPC errors; what the gateway does not do (recall, pull and offset calls, lite
topics) answers UNSUPPORTED. FIFO and delay messages: `kinds`; transactions: `transactions`.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import replace
from typing import Any, TypeVar

from tidewire.extensions.hooks import ClientInfo
from tidewire.gateway.core.tenants import TenantConflict, client_mount
from tidewire.gateway.core.topology import Topology

from .admission import ClientAdmission
from .auth import Authenticator
from .consuming import MAX_LONG_POLL_S, Consuming, may_read
from .mapping import Code, Refusal, bad_name, set_ms, status
from .producing import Producing
from .transactions import ProducerStream
from .v2 import definition_pb2, service_pb2, service_pb2_grpc

log = logging.getLogger("tidewire.rocketmq")

PRODUCER_MAX_ATTEMPTS = 3
PRODUCER_BACKOFF_MS = (10, 1000)  # first and longest pause between send attempts (exponential, x2)
CONSUMER_MAX_ATTEMPTS = 16
# Push consumers' redelivery delays after a failed consumption (RocketMQ's defaults, in seconds).
CONSUMER_BACKOFF_S = (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800)
MAX_PARSED = 1024  # other nodes' endpoints kept parsed
RECEIVE_BATCH = 32  # what push consumers are told to ask for
DEFAULT_LONG_POLL_S = 20
UNSUPPORTED = "not supported by this gateway"
ACCEPTED_TYPES = (definition_pb2.NORMAL, definition_pb2.FIFO, definition_pb2.DELAY, definition_pb2.TRANSACTION)
SERVICE = "rocketmq"  # the name a node advertises its endpoint under (`Topology.advertise`)
NAMESPACE_HEADER = "x-mq-namespace"  # every call's namespace, as the RocketMQ 5 clients sign it

Handler = TypeVar("Handler", bound=Callable[..., Awaitable[Any]])


def _unary(response: Any) -> Callable[[Handler], Handler]:
    """Authenticate, then run; a failure is an INTERNAL_SERVER_ERROR status of `response`, never a gRPC error."""

    def wrap(method: Handler) -> Handler:
        @functools.wraps(method)
        async def run(self: MessagingService, request: Any, context: Any) -> Any:
            caller = self.caller(context)
            if not isinstance(caller, ClientInfo):
                return response(status=caller)
            try:
                return await method(self, caller, request, context)
            except Exception:
                log.exception("rocketmq.failed", extra={"rpc": method.__name__})
                return response(status=status(Code.INTERNAL_SERVER_ERROR, "internal error"))

        return run  # type: ignore[return-value]

    return wrap


def endpoints_of(address: str) -> Any:
    """`host:port` (IPv6 in brackets) as RocketMQ `Endpoints`."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        scheme = definition_pb2.IPv4 if ipaddress.ip_address(host).version == 4 else definition_pb2.IPv6
    except ValueError:
        scheme = definition_pb2.DOMAIN_NAME
    return definition_pb2.Endpoints(scheme=scheme, addresses=[definition_pb2.Address(host=host, port=int(port))])


class MessagingService(service_pb2_grpc.MessagingServiceServicer):
    def __init__(self, consuming: Consuming, producing: Producing, auth: Authenticator, clients: ClientAdmission,
                 endpoint: str, broker_name: str, advertise_requested: bool, topology: Topology) -> None:
        self.consuming = consuming
        self.producing = producing
        self.auth = auth
        self.clients = clients
        self.endpoints = endpoints_of(endpoint)
        self.broker_name = broker_name
        self.advertise_requested = advertise_requested  # listening on a wildcard address: echo what was dialled
        self.topology = topology
        self._parsed: dict[str, Any] = {}  # another node's advertised address -> its Endpoints (None: unusable)
        self.settings = consuming.settings

    def caller(self, context: Any) -> ClientInfo | Any:
        """Who calls, or the status that refuses the call: bad credentials, a ban, or the admission of a new
        client."""
        caller = self.auth.check(context.invocation_metadata() or (), context.peer() or "")
        if caller is None:
            log.info("rocketmq.unauthorized", extra={"peer": context.peer()})
            return status(Code.UNAUTHORIZED, "bad or missing credentials")
        if self.consuming.node.bans.check(caller.client_id, caller.username, context.peer() or "") is not None:
            self.consuming.node.bans.banned_refused += 1
            log.info("rocketmq.banned", extra={"peer": context.peer()})
            return status(Code.UNAUTHORIZED, "bad or missing credentials")
        refusal = self.clients.admit(caller.client_id, self.consuming.node.clock.monotonic())
        if refusal is not None:
            log.info("rocketmq.refused", extra={"client_id": caller.client_id, "peer": context.peer(),
                                                "reason": refusal.detail})
            return status(Code.TOO_MANY_REQUESTS, refusal.detail)
        return self._in_namespace(caller, context)

    def _in_namespace(self, caller: ClientInfo, context: Any) -> ClientInfo | Any:
        """The caller in the tenant its namespace names (`gateway.core.tenants`: a namespace is a tenant), or the
        FORBIDDEN status of a namespace it may not use."""
        tenants = self.consuming.node.tenants
        namespace = next((str(v) for k, v in context.invocation_metadata() or () if k.lower() == NAMESPACE_HEADER), "")
        try:
            tenant = tenants.namespace_tenant("rocketmq", namespace, caller.username)
        except TenantConflict as exc:
            log.info("rocketmq.namespace_refused", extra={"client_id": caller.client_id, "reason": str(exc)})
            return status(Code.FORBIDDEN, "namespace not allowed")
        superuser = caller.username is not None and caller.username in tenants.superusers
        if tenant is None and not superuser:
            return caller
        return replace(caller, tenant=tenant.name if tenant is not None else None, superuser=superuser)

    def _queues(self, topic: Any, requested: Any) -> list[Any]:
        """This node's queue and every other live node's, by node id."""
        brokers = {self.broker_name: requested if self.advertise_requested and requested.addresses
                   else self.endpoints}
        for node, address in self.topology.advertised(SERVICE).items():
            if node != self.broker_name and (endpoints := self._endpoints(address)) is not None:
                brokers[node] = endpoints
        resource = definition_pb2.Resource(name=topic.name, resource_namespace=topic.resource_namespace)
        return [definition_pb2.MessageQueue(
            topic=resource, id=0, permission=definition_pb2.READ_WRITE, accept_message_types=ACCEPTED_TYPES,
            broker=definition_pb2.Broker(name=node, id=0, endpoints=brokers[node])) for node in sorted(brokers)]

    def _endpoints(self, address: str) -> Any:
        if address not in self._parsed:
            if len(self._parsed) > MAX_PARSED:
                self._parsed.clear()
            try:
                self._parsed[address] = endpoints_of(address)
            except ValueError:  # what another node advertised is not host:port: leave it out of routes
                log.warning("rocketmq.bad_endpoint", extra={"endpoint": address})
                self._parsed[address] = None
        return self._parsed[address]

    # --- routes, sessions ------------------------------------------------------------------------------------
    @_unary(service_pb2.QueryRouteResponse)
    async def QueryRoute(self, caller: ClientInfo, request: Any, context: Any) -> Any:
        if bad_name(request.topic.name):
            return service_pb2.QueryRouteResponse(status=status(
                Code.ILLEGAL_TOPIC, "a topic is one MQTT topic level: no '/', '+', '#', 1 to 255 characters"))
        return service_pb2.QueryRouteResponse(status=status(Code.OK),
                                              message_queues=self._queues(request.topic, request.endpoints))

    @_unary(service_pb2.QueryAssignmentResponse)
    async def QueryAssignment(self, caller: ClientInfo, request: Any, context: Any) -> Any:
        if bad_name(request.topic.name) or bad_name(request.group.name):
            return service_pb2.QueryAssignmentResponse(status=status(Code.BAD_REQUEST, "bad topic or group"))
        if not may_read(self.consuming.node, caller, request.topic.name):
            return service_pb2.QueryAssignmentResponse(status=status(Code.FORBIDDEN, "may not read this topic"))
        queues = self._queues(request.topic, request.endpoints)
        return service_pb2.QueryAssignmentResponse(status=status(Code.OK), assignments=[
            definition_pb2.Assignment(message_queue=queue) for queue in queues])

    @_unary(service_pb2.HeartbeatResponse)
    async def Heartbeat(self, caller: ClientInfo, request: Any, context: Any) -> Any:
        return service_pb2.HeartbeatResponse(status=status(Code.OK))

    @_unary(service_pb2.NotifyClientTerminationResponse)
    async def NotifyClientTermination(self, caller: ClientInfo, request: Any, context: Any) -> Any:
        self.clients.forget(caller.client_id)
        self.consuming.client_gone(caller.client_id)
        return service_pb2.NotifyClientTerminationResponse(status=status(Code.OK))

    async def Telemetry(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        """Answer each settings command with the server's settings (and set up a consumer's subscriptions); a
        producer's stream also carries the server's transaction checks (`transactions`)."""
        caller = self.caller(context)
        if not isinstance(caller, ClientInfo):
            yield service_pb2.TelemetryCommand(status=caller)
            return
        stream = ProducerStream(caller)
        self.consuming.stream_opened(caller.client_id)
        reader = asyncio.get_running_loop().create_task(self._read_telemetry(stream, requests))
        try:
            while (command := await stream.out.get()) is not None:
                yield command
        finally:
            reader.cancel()
            self.producing.transactions.closed(stream)
            # the client left (or died): a push consumer's messages are no longer renewed for it
            self.consuming.stream_closed(caller.client_id)

    async def _read_telemetry(self, stream: ProducerStream, requests: AsyncIterator[Any]) -> None:
        try:
            async for command in requests:
                if command.HasField("settings"):
                    try:
                        stream.out.put_nowait(await self._settings(stream.caller, command.settings))
                        if command.settings.HasField("publishing"):
                            topics = frozenset(t.name for t in command.settings.publishing.topics)
                            await self.producing.transactions.publishing(stream, topics)
                    except Exception:
                        log.exception("rocketmq.failed", extra={"rpc": "Telemetry"})
                        stream.out.put_nowait(service_pb2.TelemetryCommand(
                            status=status(Code.INTERNAL_SERVER_ERROR, "internal error")))
        except Exception as exc:  # the stream broke (the client went): nothing to answer
            log.debug("rocketmq.telemetry_ended", extra={"error": repr(exc)})
        finally:
            stream.out.put_nowait(None)  # the client's side ended: so does the answer

    async def _settings(self, caller: ClientInfo, told: Any) -> Any:
        reply = definition_pb2.Settings(client_type=told.client_type, user_agent=told.user_agent)
        reply.metric.on = False
        if told.HasField("access_point"):
            reply.access_point.CopyFrom(told.access_point)
        if told.HasField("request_timeout"):
            reply.request_timeout.CopyFrom(told.request_timeout)
        code, reason = Code.OK, ""
        if told.HasField("subscription"):
            wanted = told.subscription
            reply.subscription.CopyFrom(wanted)
            reply.subscription.fifo = False
            reply.subscription.receive_batch_size = RECEIVE_BATCH
            poll_s = min(wanted.long_polling_timeout.seconds or DEFAULT_LONG_POLL_S, int(MAX_LONG_POLL_S))
            reply.subscription.long_polling_timeout.seconds = poll_s
            policy = reply.backoff_policy
            policy.max_attempts = CONSUMER_MAX_ATTEMPTS
            for seconds in CONSUMER_BACKOFF_S:
                policy.customized_backoff.next.add(seconds=seconds)
            for entry in wanted.subscriptions:
                if not may_read(self.consuming.node, caller, entry.topic.name) and not bad_name(entry.topic.name):
                    code, reason = Code.FORBIDDEN, f"may not read topic {entry.topic.name}"
                    continue
                done = await self.consuming.subscribe(wanted.group.name, entry.topic.name, entry.expression.type,
                                                      entry.expression.expression, client_mount(caller))
                if isinstance(done, Refusal):
                    code, reason = done.code, done.reason
        else:  # a producer
            reply.publishing.topics.extend(told.publishing.topics)
            reply.publishing.max_body_size = self.settings.rocketmq_max_body
            reply.publishing.validate_message_type = True
            policy = reply.backoff_policy
            policy.max_attempts = PRODUCER_MAX_ATTEMPTS
            set_ms(policy.exponential_backoff.initial, PRODUCER_BACKOFF_MS[0])
            set_ms(policy.exponential_backoff.max, PRODUCER_BACKOFF_MS[1])
            policy.exponential_backoff.multiplier = 2.0
        return service_pb2.TelemetryCommand(status=status(code, reason), settings=reply)

    # --- producers --------------------------------------------------------------------------------------------
    @_unary(service_pb2.SendMessageResponse)
    async def SendMessage(self, caller: ClientInfo, request: Any, context: Any) -> Any:
        return await self.producing.send(caller, request)

    @_unary(service_pb2.EndTransactionResponse)
    async def EndTransaction(self, caller: ClientInfo, request: Any, context: Any) -> Any:
        return await self.producing.transactions.end(caller, request)

    @_unary(service_pb2.RecallMessageResponse)
    async def RecallMessage(self, caller: ClientInfo, request: Any, context: Any) -> Any:
        return service_pb2.RecallMessageResponse(status=status(Code.UNSUPPORTED, "delay messages are " + UNSUPPORTED))

    # --- consumers --------------------------------------------------------------------------------------------
    async def ReceiveMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        caller = self.caller(context)
        if not isinstance(caller, ClientInfo):
            yield service_pb2.ReceiveMessageResponse(status=caller)
            return
        answered = False
        try:
            async with aclosing(self.consuming.receive(caller, request, context.time_remaining())) as responses:
                async for response in responses:
                    answered = True
                    yield response
        except Exception:
            log.exception("rocketmq.failed", extra={"rpc": "ReceiveMessage"})
            if not answered:
                yield service_pb2.ReceiveMessageResponse(status=status(Code.INTERNAL_SERVER_ERROR, "internal error"))

    @_unary(service_pb2.AckMessageResponse)
    async def AckMessage(self, caller: ClientInfo, request: Any, context: Any) -> Any:
        return await self.consuming.ack(caller, request)

    @_unary(service_pb2.ChangeInvisibleDurationResponse)
    async def ChangeInvisibleDuration(self, caller: ClientInfo, request: Any, context: Any) -> Any:
        return await self.consuming.change_invisible(caller, request)

    @_unary(service_pb2.ForwardMessageToDeadLetterQueueResponse)
    async def ForwardMessageToDeadLetterQueue(self, caller: ClientInfo, request: Any, context: Any) -> Any:
        return await self.consuming.dead_letter(caller, request)

    # --- what RocketMQ's proxy also serves and this gateway does not -------------------------------------------
    async def PullMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        yield service_pb2.PullMessageResponse(status=status(Code.UNSUPPORTED, "pull consumers are " + UNSUPPORTED))

    @_unary(service_pb2.UpdateOffsetResponse)
    async def UpdateOffset(self, caller: ClientInfo, request: Any, context: Any) -> Any:
        return service_pb2.UpdateOffsetResponse(status=status(Code.UNSUPPORTED, "offsets are " + UNSUPPORTED))

    @_unary(service_pb2.GetOffsetResponse)
    async def GetOffset(self, caller: ClientInfo, request: Any, context: Any) -> Any:
        return service_pb2.GetOffsetResponse(status=status(Code.UNSUPPORTED, "offsets are " + UNSUPPORTED))

    @_unary(service_pb2.QueryOffsetResponse)
    async def QueryOffset(self, caller: ClientInfo, request: Any, context: Any) -> Any:
        return service_pb2.QueryOffsetResponse(status=status(Code.UNSUPPORTED, "offsets are " + UNSUPPORTED))

    @_unary(service_pb2.SyncLiteSubscriptionResponse)
    async def SyncLiteSubscription(self, caller: ClientInfo, request: Any, context: Any) -> Any:
        return service_pb2.SyncLiteSubscriptionResponse(status=status(Code.UNSUPPORTED,
                                                                      "lite topics are " + UNSUPPORTED))
