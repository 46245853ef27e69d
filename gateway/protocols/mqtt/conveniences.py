"""EMQX's conveniences on an MQTT channel's inbound path, sans-IO: topic rewrite, `$delayed/` publishes,
`$exclusive/` subscriptions and auto-subscribe, as the channel (`channel.py`, `handshake.py`) applies them.

The order (docs/topic-rewrite.md): topic alias → rewrite → the `$delayed/` and `$exclusive/` prefixes → the ACL
→ the store. So the ACL sees the rewritten topic without its prefix (a delayed message's real topic), and a
rewrite rule may produce a `$delayed/` topic. The rules themselves are in `gateway.core.rewrite`,
`gateway.core.delayed` and `gateway.core.exclusive`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tidewire.extensions.hooks import SubscribeAccess
from tidewire.gateway.core.delayed import BadDelay, Delay, parse_delayed, reserved
from tidewire.gateway.core.exclusive import EXCLUSIVE_PREFIX
from tidewire.gateway.core.subscriptions import Refusal
from tidewire.gateway.protocols.mqtt.codec import SubscriptionRequest

if TYPE_CHECKING:
    from tidewire.extensions.hooks import ClientInfo
    from tidewire.gateway.config import AutoSubscription
    from tidewire.gateway.node import Node

log = logging.getLogger("tidewire.conn")


def publish_topic(node: Node, info: ClientInfo, topic: str, now_ms: int) -> tuple[str, Delay | None] | None:
    """The topic a PUBLISH goes to after the rewrite rules and its delay, if any (`$delayed/`); None: refused as
    an invalid topic (a bad delay, or the internal topic of waiting delayed messages)."""
    rewriter = node.rewriter
    if rewriter.active:
        rewritten = rewriter.publish(topic, info.client_id, info.username)
        if rewritten is not None:
            if rewritten.invalid:
                log.warning("rewrite.invalid_result", extra={"client_id": info.client_id, "topic": topic})
            topic = rewritten.topic
    if topic[:1] != "$":
        return topic, None
    if reserved(topic):
        return None
    if not node.settings.delayed_publish:
        return topic, None
    settings = node.settings
    limit = settings.delayed_max_seconds
    if settings.retention_seconds:
        limit = min(limit, settings.retention_seconds)  # a delayed message waits in the log
    delay = parse_delayed(topic, now_ms, limit)
    if isinstance(delay, BadDelay):
        log.info("delayed.refused", extra={"client_id": info.client_id, "topic": topic, "detail": delay.reason})
        return None
    if delay is None:
        return topic, None
    return delay.topic, (delay if delay.due_ms > now_ms else None)


@dataclass(slots=True)
class Filters:
    """A SUBSCRIBE's filters after the rules: what to subscribe, and what is refused or waits for a lock."""

    requests: list[SubscriptionRequest]  # as the registry takes them ($exclusive/ stripped)
    positions: list[int]  # each request's index in the packet
    refused: dict[int, Refusal]  # index in the packet -> why, for those not in `requests`
    exclusive: list[int]  # indexes in `requests` of $exclusive/ filters: each needs its lock first


def subscribe_filters(node: Node, info: ClientInfo, requests: list[SubscriptionRequest]) -> Filters:
    """Rewrite each filter, take off `$exclusive/` (noted), refuse the internal topic, an `$exclusive/` filter the
    ACL denies (before its lock is taken) and, when exclusive subscriptions are off, `$exclusive/` filters (0x8F,
    as EMQX)."""
    out = Filters([], [], {}, [])
    rewriter = node.rewriter
    for index, request in enumerate(requests):
        topic_filter = request.topic_filter
        if rewriter.active:
            rewritten = rewriter.subscribe(topic_filter, info.client_id, info.username)
            if rewritten is not None:
                if rewritten.invalid:
                    log.warning("rewrite.invalid_result", extra={"client_id": info.client_id, "filter": topic_filter})
                topic_filter = rewritten.topic
        exclusive = topic_filter.startswith(EXCLUSIVE_PREFIX)
        if exclusive:
            if not node.settings.exclusive_subscriptions:
                out.refused[index] = Refusal.FILTER_INVALID
                continue
            topic_filter = topic_filter[len(EXCLUSIVE_PREFIX) :]
            if not topic_filter or topic_filter.startswith("$share/"):
                out.refused[index] = Refusal.FILTER_INVALID
                continue
        if reserved(topic_filter):
            out.refused[index] = Refusal.FILTER_INVALID
            continue
        if exclusive:
            if node.authorizer.subscribe_access(info, topic_filter) == SubscribeAccess.DENIED:
                out.refused[index] = Refusal.NOT_AUTHORIZED  # before the lock: a denied client never holds it
                continue
            out.exclusive.append(len(out.requests))
        out.positions.append(index)
        out.requests.append(SubscriptionRequest(topic_filter, request.qos, request.no_local,
                                                request.retain_as_published, request.retain_handling))
    return out


def unsubscribe_filters(node: Node, info: ClientInfo, filters: list[str]) -> tuple[list[str], list[str]]:
    """(the filters to unsubscribe, rewritten and without `$exclusive/`; the exclusive ones among them)."""
    out: list[str] = []
    exclusive: list[str] = []
    rewriter = node.rewriter
    for topic_filter in filters:
        if rewriter.active:
            rewritten = rewriter.subscribe(topic_filter, info.client_id, info.username)
            if rewritten is not None:
                topic_filter = rewritten.topic
        if topic_filter.startswith(EXCLUSIVE_PREFIX) and node.settings.exclusive_subscriptions:
            topic_filter = topic_filter[len(EXCLUSIVE_PREFIX) :]
            exclusive.append(topic_filter)
        out.append(topic_filter)
    return out, exclusive


def auto_requests(entries: list[AutoSubscription], client_id: str, username: str | None) -> list[SubscriptionRequest]:
    """`auto_subscribe` for one client: `%c` / `${clientid}` its client id, `%u` / `${username}` its user name (an
    entry naming the user name is left out for a client without one, as EMQX). Neither may widen a filter: a
    client id or user name holding a wildcard character gets no entry that names it."""
    requests: list[SubscriptionRequest] = []
    for entry in entries:
        topic = entry.topic
        names_client = "%c" in topic or "${clientid}" in topic
        names_user = "%u" in topic or "${username}" in topic
        if (names_client and _widens(client_id)) or (names_user and username is not None and _widens(username)):
            continue
        if names_user:
            if not username:
                continue
            topic = topic.replace("%u", username).replace("${username}", username)
        topic = topic.replace("%c", client_id).replace("${clientid}", client_id)
        requests.append(SubscriptionRequest(topic, entry.qos, entry.nl, entry.rap, entry.rh))
    return requests


def _widens(value: str) -> bool:
    return "+" in value or "#" in value or "\x00" in value
