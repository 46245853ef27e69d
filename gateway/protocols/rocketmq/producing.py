"""RocketMQ SendMessage: map each message (`mapping.inbound`), check it against the ACL (and the publish hooks, when
the node has any: a batch goes through them in its order), publish it through the neutral ingress and answer once
it is durable.

A client retries a send whose answer it did not get with the same message id; a bounded LRU of recent
(access key, message id) pairs maps a retry to the first attempt's answer (or makes it wait for the attempt
still in flight), so the message is stored once. A retry on another node (the first one died, or the client
moved) is caught by the store: the message carries the pair as its de-duplication key (`Message.dedupe`),
which the store holds with it for `rocketmq_dedupe_seconds` and answers a retry with the first one's seq (so
the same message id). The publish runs in its own task: a call that times out does not stop it, and its
retry gets its answer.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from tidewire.errors import PublishFailed
from tidewire.extensions.hooks import ClientInfo
from tidewire.gateway.core.held_keys import HeldKeys
from tidewire.gateway.core.ingress import INVALID_TOPIC, neutral_message, publish_future, refuse_publish
from tidewire.gateway.core.tenants import client_mount, mount_topic
from tidewire.store.base import PROTOCOL_ROCKETMQ, Message

from .kinds import inbound_kind
from .mapping import Code, Refusal, inbound, message_id, status
from .transactions import HALF_PREFIX, Transactions, half_topic, transaction_id
from .v2 import definition_pb2, service_pb2

if TYPE_CHECKING:
    from tidewire.gateway.core.publish_hooks import PublishHooks
    from tidewire.gateway.node import Node

DEDUP_CAPACITY = 65_536  # recent message ids remembered for retries (per node)
MAX_SEND_BATCH = 1024  # messages in one SendMessage
# The store scope of an access key's message ids: starts with NUL, which no MQTT client id (an MQTT session's
# scope) may contain, so the two never meet.
DEDUPE_SCOPE = "\x00rocketmq\x00"


class Producing:
    """The producer half of the service, on one node."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.settings = node.settings
        self._recent: OrderedDict[tuple[str, str], asyncio.Future[Any]] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self._held = HeldKeys(node.writes, node.clock, node.settings.rocketmq_dedupe_seconds)
        self.transactions = Transactions(node)

    async def send(self, caller: ClientInfo, request: Any) -> Any:
        if len(request.messages) > MAX_SEND_BATCH:
            return service_pb2.SendMessageResponse(status=status(Code.BAD_REQUEST,
                                                                 f"over {MAX_SEND_BATCH} messages in one send"))
        hooks = self.node.hooks
        if hooks is None:
            entries = await asyncio.gather(*(self._one(caller, pb) for pb in request.messages))
        else:  # through the hooks one message after the other, so the batch is appended in its order
            answers = [await self._hooked(caller, pb, hooks) for pb in request.messages]
            entries = await asyncio.gather(*(asyncio.shield(a) if isinstance(a, asyncio.Future) else _done(a)
                                             for a in answers))
        response = service_pb2.SendMessageResponse()
        for entry in entries:
            response.entries.append(entry)
        codes = {entry.status.code for entry in entries}
        if len(codes) == 1:
            response.status.CopyFrom(entries[0].status)
        else:
            response.status.CopyFrom(status(Code.MULTIPLE_RESULTS if codes else Code.BAD_REQUEST,
                                            "" if codes else "no message"))
        return response

    async def _one(self, caller: ClientInfo, pb: Any) -> Any:
        admitted = self._admit(caller, pb)
        if isinstance(admitted, tuple):
            key, message, answer = admitted
            self._launch(key, message, answer)
            return await asyncio.shield(answer)
        if isinstance(admitted, asyncio.Future):
            return await asyncio.shield(admitted)
        return admitted

    async def _hooked(self, caller: ClientInfo, pb: Any, hooks: PublishHooks) -> Any:
        """`_one` through the publish hooks: the answer's future once launched, or the refusal's entry."""
        admitted = self._admit(caller, pb)
        if not isinstance(admitted, tuple):
            return admitted
        key, message, answer = admitted
        why = await hooks.check(caller, message)
        if why is None:
            self._launch(key, message, answer)
            return answer
        if self._recent.get(key) is answer:
            del self._recent[key]  # not stored: a retry asks the hooks again
        refused = _entry(pb, Code.FORBIDDEN, why)
        answer.set_result(refused)  # a retry that arrived meanwhile gets the same answer
        return refused

    def _admit(self, caller: ClientInfo, pb: Any) -> Any:
        """A refusal's entry, the answer future of an earlier attempt, or (key, message, answer) to publish."""
        settings = self.settings
        mapped = inbound(pb, settings.rocketmq_second_topic_property, settings.rocketmq_max_body)
        if isinstance(mapped, Refusal):
            return _entry(pb, mapped.code, mapped.reason)
        now_ms = int(self.node.clock.time() * 1000)
        kind = inbound_kind(pb.system_properties, now_ms, settings.rocketmq_max_delay_seconds)
        if isinstance(kind, Refusal):
            return _entry(pb, kind.code, kind.reason)
        mapped.properties.user.extend(kind)
        why = refuse_publish(settings, self.node.authorizer, caller, mapped.topic)
        if why is not None:
            code = Code.ILLEGAL_TOPIC if why == INVALID_TOPIC else Code.FORBIDDEN
            return _entry(pb, code, why)
        if caller.tenant is not None:  # below here the topic is under its tenant's mount point
            mapped = mapped._replace(topic=mount_topic(client_mount(caller), mapped.topic))
        key = (caller.username or "", mapped.message_id)
        answer = self._recent.get(key)
        if answer is not None:
            self._recent.move_to_end(key)
            return answer
        answer = asyncio.get_running_loop().create_future()
        self._recent[key] = answer
        while len(self._recent) > DEDUP_CAPACITY:
            self._recent.popitem(last=False)
        message = neutral_message(mapped.topic, mapped.payload, properties=mapped.properties,
                                  publisher=caller.client_id, now_ms=now_ms,
                                  protocol=PROTOCOL_ROCKETMQ)
        if pb.system_properties.message_type == definition_pb2.TRANSACTION:
            message.topic = half_topic(message.topic)  # hidden until EndTransaction (`transactions`)
        if settings.rocketmq_dedupe_seconds:
            message.dedupe = (DEDUPE_SCOPE + key[0], key[1])
        return key, message, answer

    def _launch(self, key: tuple[str, str], message: Message, answer: asyncio.Future[Any]) -> None:
        task = asyncio.get_running_loop().create_task(self._publish(key, message, answer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _publish(self, key: tuple[str, str], message: Message, answer: asyncio.Future[Any]) -> None:
        try:
            await publish_future(self.node.publish, [message])[0]
        except PublishFailed as exc:
            if self._recent.get(key) is answer:
                del self._recent[key]  # not stored: a retry tries again
            answer.set_result(_entry(None, Code.INTERNAL_SERVER_ERROR, f"not stored: {exc}"))
            return
        except BaseException:
            if self._recent.get(key) is answer:
                del self._recent[key]
            if not answer.done():
                answer.set_result(_entry(None, Code.INTERNAL_SERVER_ERROR, "not stored"))
            raise
        # A retry of a send another node stored has that one's seq: the same message id as its first answer.
        entry = service_pb2.SendResultEntry(status=status(Code.OK), message_id=message_id(message.seq),
                                            offset=message.seq)
        if message.topic.startswith(HALF_PREFIX):
            entry.transaction_id = transaction_id(message.seq)
        answer.set_result(entry)
        if message.dedupe is not None and not message.duplicate:
            self._held.hold(*message.dedupe)

    async def stop(self) -> None:
        await self._held.stop()
        await self.transactions.stop()


async def _done(entry: Any) -> Any:
    return entry


def _entry(pb: Any, code: int, reason: str) -> Any:
    entry = service_pb2.SendResultEntry(status=status(code, reason))
    if pb is not None:
        entry.message_id = pb.system_properties.message_id
    return entry
