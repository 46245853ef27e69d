"""Admin API about messages, one job: publish a message as the operator (answered once it is durable, for QoS
1 and 2) and list, read and delete retained messages (`/api/v1/publish`, `/api/v1/retained`)."""

from __future__ import annotations

import asyncio
import base64
import binascii
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response
from starlette.exceptions import HTTPException

from tidewire.admin.app import API_PREFIX, require_token
from tidewire.admin.models import MAX_TOPIC_CHARS, Page, Paging, PublishRequest, PublishResult, Retained, paging
from tidewire.extensions.hooks import ClientInfo
from tidewire.gateway.core.ingress import INVALID_TOPIC, PublishFailed, neutral_message, publish_future, refuse_publish
from tidewire.gateway.core.topics import valid_topic_filter, valid_topic_name
from tidewire.gateway.node import Node
from tidewire.store.base import SHARED_PREFIX, Message
from tidewire.store.properties import Properties

PUBLISH_TIMEOUT_S = 10.0  # a QoS 1/2 publish not durable by then is answered 503 (it may still be stored)
MAX_LISTED_PAYLOAD = 64 * 1024  # bytes of a retained payload a list carries; bigger ones: GET the topic
_OPERATOR = ClientInfo("", None, superuser=True)  # the ACL is for clients; the operator is not one

Pages = Annotated[Paging, Depends(paging)]


def _bad(text: str) -> HTTPException:
    return HTTPException(400, text)


def _mqtt_string(value: str, what: str) -> str:
    """An MQTT UTF-8 string: encodable (no lone surrogates) and without U+0000."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad(f"{what} is not valid UTF-8") from None
    if "\x00" in value:
        raise _bad(f"{what} contains U+0000")
    return value


def decode_payload(text: str, encoding: str) -> bytes:
    if encoding == "base64":
        try:
            return base64.b64decode(text.encode("ascii"), validate=True)
        except (binascii.Error, ValueError, UnicodeEncodeError):
            raise _bad("payload is not valid base64") from None
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad("payload is not valid UTF-8 (use encoding=base64 for bytes)") from None


def build_message(node: Node, body: PublishRequest) -> Message:
    """The message `body` asks for, or a 400 saying what is wrong with it."""
    topic = _mqtt_string(body.topic, "topic")
    if topic.startswith("$"):
        raise _bad("topics starting with '$' are reserved")
    if refuse_publish(node.settings, node.authorizer, _OPERATOR, topic) == INVALID_TOPIC:
        raise _bad("invalid topic (empty, wildcards, or over max_topic_levels / max_topic_length)")
    payload = decode_payload(body.payload, body.encoding)
    if len(payload) > node.settings.max_packet_size:
        raise _bad(f"payload over max_packet_size ({node.settings.max_packet_size} bytes)")
    props = Properties()
    given = body.properties
    if given is not None:
        if given.content_type is not None:
            props.content_type = _mqtt_string(given.content_type, "content_type")
        props.expiry_interval = given.message_expiry_interval
        props.user = [(_mqtt_string(k, "a user property name"), _mqtt_string(v, "a user property value"))
                      for k, v in (given.user_properties or {}).items()]
    return neutral_message(topic, payload, qos=body.qos, retain=body.retain, properties=props,
                           now_ms=int(node.clock.time() * 1000))


def retained_answer(message: Message, *, with_payload: bool = True) -> Retained:
    size = len(message.payload)
    shown = with_payload and size <= MAX_LISTED_PAYLOAD
    return Retained(topic=message.topic, qos=message.qos, payload_size=size,
                    payload=base64.b64encode(message.payload).decode() if shown else None,
                    published_at=message.timestamp_ms / 1000,
                    expires_at=message.expires_at_ms / 1000 if message.expires_at_ms else None)


def router(node: Node) -> APIRouter:
    api = APIRouter(prefix=API_PREFIX, dependencies=[Depends(require_token)], tags=["messages"])

    @api.post("/publish", response_model=PublishResult)
    async def publish(body: PublishRequest) -> PublishResult:
        """Publish as the operator (no ACL; the publish hooks apply: 403 when one refuses). QoS 1 and 2 are answered
        once the message is durable."""
        if node.draining:
            raise HTTPException(503, "the node is draining")
        message = build_message(node, body)
        if node.hooks is not None:  # the operator's publishes go through the publish hooks too
            why = await node.hooks.check(_OPERATOR, message)
            if why is not None:
                raise HTTPException(403, f"refused: {why}")
        node.counters.api_published(1, len(message.payload))
        if body.qos == 0:
            node.publish(message)
            return PublishResult(topic=message.topic)
        future = publish_future(node.publish, [message])[0]
        done, _ = await asyncio.wait([future], timeout=PUBLISH_TIMEOUT_S)
        if not done:
            raise HTTPException(503, "not durable in time: the store is slow or unavailable (it may still be stored)")
        try:
            future.result()
        except PublishFailed:
            raise HTTPException(503, "not stored: the node is stopping") from None
        return PublishResult(topic=message.topic)

    async def live_retained(topic_filter: str) -> list[Message]:
        now_ms = int(node.clock.time() * 1000)
        messages = await node.store.match_retained(topic_filter)
        return [m for m in messages if not m.expires_at_ms or m.expires_at_ms > now_ms]

    async def one_retained(topic: str) -> Message:
        if not valid_topic_name(topic):
            raise _bad("invalid topic (empty or wildcards)")
        for message in await live_retained(topic):
            if message.topic == topic:
                return message
        raise HTTPException(404, "no retained message on this topic")

    @api.get("/retained", response_model=Page[Retained])
    async def list_retained(pages: Pages, topic: Annotated[str, Query(max_length=MAX_TOPIC_CHARS)] = "#",
                            ) -> Page[Retained]:
        """Retained messages whose topic matches the filter `topic`; payloads over 64 KiB are left out (null)."""
        if topic.startswith(SHARED_PREFIX) or not valid_topic_filter(topic):
            raise _bad("invalid topic filter")
        found = sorted(await live_retained(topic), key=lambda m: m.topic)
        chosen, meta = pages.cut(found)
        return Page[Retained](data=[retained_answer(m) for m in chosen], meta=meta)

    @api.get("/retained/{topic:path}", response_model=Retained)
    async def get_retained(topic: str) -> Retained:
        message = await one_retained(topic)
        answer = retained_answer(message, with_payload=False)
        answer.payload = base64.b64encode(message.payload).decode()
        return answer

    @api.delete("/retained/{topic:path}", status_code=204, response_class=Response)
    async def delete_retained(topic: str) -> Response:
        await one_retained(topic)
        await node.store.set_retained(topic, None)
        return Response(status_code=204)

    return api
