"""Admin API about clients, one job: the clients connected to this node (MQTT sessions online here and AMQP
connections): list, find; an online MQTT client's subscriptions (list, add, remove) and every subscription on
the node; stored sessions (inspect). Kicks and session deletes act on whichever node holds the client (forwarded
through `Topology.ask_others`, answered through `Topology.answer`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from fastapi import APIRouter, Depends, Query, Response
from starlette.exceptions import HTTPException

from tidewire.admin.app import API_PREFIX, Endpoints, endpoints, require_token
from tidewire.admin.models import (
    MAX_TOPIC_CHARS,
    Client,
    ClientDetail,
    Listing,
    NodeSubscription,
    Page,
    Paging,
    Session,
    Subscription,
    SubscriptionAdd,
    paging,
)
from tidewire.gateway.core.shared import parse_shared
from tidewire.gateway.core.topics import valid_topic_filter
from tidewire.gateway.node import Node
from tidewire.gateway.protocols.mqtt.codec import ReasonCode, SubscriptionRequest
from tidewire.gateway.protocols.mqtt.lifecycle import ChannelBase
from tidewire.gateway.protocols.mqtt.subscribing import suback_codes
from tidewire.store.base import P2P_PREFIX, SHARED_PREFIX, SessionRecord, SubscriptionRecord

if TYPE_CHECKING:
    from tidewire.gateway.protocols.amqp.connection import AmqpConnection

KICK_DETAIL = "kicked by an administrator"  # the reason string a kicked MQTT 5 client reads
MAX_QUERY_CHARS = 1024  # of a substring filter in a query

Found = Annotated[Endpoints, Depends(endpoints)]
Pages = Annotated[Paging, Depends(paging)]
Substring = Annotated[str | None, Query(max_length=MAX_QUERY_CHARS)]


def not_found(what: str) -> HTTPException:
    return HTTPException(404, what)


def _subscriptions(records: dict[str, SubscriptionRecord]) -> list[Subscription]:
    """A session's subscriptions as an operator knows them (not the P2P queue every session reads)."""
    return [Subscription(topic=r.filter, qos=r.qos, no_local=r.no_local, retain_as_published=r.retain_as_published,
                         retain_handling=r.retain_handling)
            for topic, r in sorted(records.items()) if not topic.startswith(P2P_PREFIX)]


def mqtt_client(node: Node, conn: ChannelBase) -> Client:
    session = conn.session
    subscriptions = sum(1 for t in session.subscriptions if not t.startswith(P2P_PREFIX)) if session else 0
    return Client(client_id=conn.client_id, username=conn.info.username, peer=conn.peer, listener=conn.listener.name,
                  protocol="mqtt", proto_ver=conn.level, bridge=conn.bridge, clean_start=conn.clean_start,
                  keepalive=conn.keepalive, connected_at=conn.connected_at or None, subscriptions=subscriptions,
                  inflight=len(session.inflight) if session is not None else 0, node=node.node_id)


def amqp_client(node: Node, conn: AmqpConnection) -> Client:
    return Client(client_id=conn.id, username=conn.info.username, peer=conn.peer, listener=conn.listener.name,
                  protocol="amqp", proto_ver=None, clean_start=None, keepalive=None, connected_at=None,
                  subscriptions=0, inflight=0, node=node.node_id)


def _amqp_connections(found: Endpoints) -> list[AmqpConnection]:
    return [c for live in found.amqp.connections.values() for c in live] if found.amqp is not None else []


def _online(node: Node, client_id: str) -> ChannelBase:
    """The client's MQTT connection on this node, with its session bound (404, or 409 while connecting)."""
    conn = node.connections.get(client_id)
    if not isinstance(conn, ChannelBase):
        raise not_found("no such client on this node")
    if conn.session is None:
        raise HTTPException(409, "the client is still connecting")
    return conn


def _check_filter(node: Node, key: str, no_local: bool) -> None:
    """The checks SUBSCRIBE makes before authorization, as a 400 with the reason (3.1.1 has one code for all)."""
    settings = node.settings
    shared = parse_shared(key) if key.startswith(SHARED_PREFIX) else None
    topic_filter = shared[1] if shared is not None else key
    if (key.startswith(SHARED_PREFIX) and shared is None) or key.startswith(P2P_PREFIX) or (
            not valid_topic_filter(topic_filter)):
        raise HTTPException(400, "invalid topic filter")
    if topic_filter.count("/") >= settings.max_topic_levels or len(key.encode()) > settings.max_topic_length:
        raise HTTPException(400, "topic filter over the node's max_topic_levels or max_topic_length")
    if no_local and shared is not None:
        raise HTTPException(400, "no_local on a shared subscription")


def session_answer(node: Node, record: SessionRecord, conn: ChannelBase | None) -> Session:
    live = conn.session if conn is not None else None
    offset, sent_upto = record.offset, record.sent_upto
    if live is not None:  # the stored record lags the live session: its positions as they are now
        offset, sent_upto = live.committed_offset(), max(record.sent_upto, live.cursor)
    online = live is not None or record.disconnected_at_ms == 0
    return Session(client_id=record.client_id, online=online, node=record.owner or (node.node_id if live else None),
                   persistent=live.persistent if live is not None else True, protocol_level=record.protocol_level,
                   expiry_interval=record.expiry_interval,
                   disconnected_at=None if online else record.disconnected_at_ms / 1000,
                   subscriptions=_subscriptions(record.subscriptions), offset=offset, sent_upto=sent_upto,
                   inflight=len(live.inflight) if live is not None else None)


def router(node: Node, found: Endpoints) -> APIRouter:
    api = APIRouter(prefix=API_PREFIX, dependencies=[Depends(require_token)], tags=["clients"])

    async def kick_here(client_id: str) -> int:
        """Disconnect the client if it is connected here: 204, else 404."""
        conn = node.connections.get(client_id)
        if isinstance(conn, ChannelBase):
            conn.kick(KICK_DETAIL)
            return 204
        for amqp in _amqp_connections(found):
            if amqp.id == client_id:
                from tidewire.gateway.protocols.amqp.codec import CONNECTION_FORCED, Fault

                amqp.shutdown(Fault(CONNECTION_FORCED, f"CONNECTION_FORCED - {KICK_DETAIL}"))
                return 204
        return 404

    async def delete_here(client_id: str) -> int:
        """End the session if this node may: 204; 404 if there is none; 409 if it is online on another node."""
        conn = node.connections.get(client_id)
        kicked = isinstance(conn, ChannelBase)
        if isinstance(conn, ChannelBase):
            conn.kick(KICK_DETAIL)
        await node.writes.session_settled(client_id)  # what closing it wrote (a parked record) comes first
        record = await node.store.get_session(client_id)
        if record is None:
            return 204 if kicked else 404  # kicked: a clean session, which ended with its connection
        if (record.disconnected_at_ms == 0 and record.owner != node.node_id
                and record.owner in node.topology.members):
            return 409
        await node.sessions.drop_stored(record, record.epoch)  # fenced: not if a client claimed it meanwhile
        return 204

    # Another node's operator reaches this node's clients through these.
    node.topology.answer("kick", kick_here)
    node.topology.answer("delete_session", delete_here)

    @api.get("/clients", response_model=Page[Client])
    async def list_clients(found: Found, pages: Pages, client_id: Substring = None, username: Substring = None,
                           peer: Substring = None, protocol: Substring = None) -> Page[Client]:
        """Clients on this node, by client id; `client_id`, `username` and `peer` match substrings, `protocol`
        exactly. Filtered and sorted on the connections themselves: only the page's answers are built (this runs
        in the loop that serves the clients)."""
        rows: list[tuple[str, ChannelBase | AmqpConnection]] = []
        if protocol in (None, "mqtt"):
            rows += node.connections.items()
        if protocol in (None, "amqp"):
            rows += [(conn.id, conn) for conn in _amqp_connections(found)]
        if client_id is not None:
            rows = [row for row in rows if client_id in row[0]]
        if username is not None:
            rows = [row for row in rows if username in (row[1].info.username or "")]
        if peer is not None:
            rows = [row for row in rows if peer in row[1].peer]
        rows.sort(key=lambda row: row[0])
        chosen, meta = pages.cut(rows)
        data = [mqtt_client(node, conn) if isinstance(conn, ChannelBase) else amqp_client(node, conn)
                for _, conn in chosen]
        return Page[Client](data=data, meta=meta)

    # Subscription routes first: a client id may hold '/' (`{client_id:path}` below would swallow the suffix).
    @api.get("/clients/{client_id:path}/subscriptions", response_model=Listing[Subscription])
    async def client_subscriptions(client_id: str) -> Listing[Subscription]:
        conn = _online(node, client_id)
        assert conn.session is not None
        return Listing[Subscription](data=_subscriptions(conn.session.subscriptions))

    @api.post("/clients/{client_id:path}/subscriptions", status_code=201, response_model=Subscription)
    async def subscribe(client_id: str, body: SubscriptionAdd) -> Subscription:
        """Subscribe an online MQTT client as if it had sent SUBSCRIBE (its ACL applies; retained messages
        follow per retain_handling). Answers once the subscription is in force on every node."""
        conn = _online(node, client_id)
        session = conn.session
        assert session is not None
        _check_filter(node, body.topic, body.no_local)
        limit = node.settings.max_subscriptions
        if limit and body.topic not in session.subscriptions and sum(
                1 for t in session.subscriptions if not t.startswith(P2P_PREFIX)) >= limit:
            raise HTTPException(409, "the client has max_subscriptions subscriptions")
        request = SubscriptionRequest(body.topic, body.qos, body.no_local, body.retain_as_published,
                                      body.retain_handling)
        granted, retained, registering = node.subscribe(session, conn, [request])
        qos = suback_codes(granted, session.level)[0]
        if qos >= 0x80:
            raise HTTPException(403, "not authorized" if qos in (ReasonCode.NOT_AUTHORIZED, 0x80)
                                else f"refused ({qos:#04x})")
        if session.persistent:
            node.writes.save_session(session.snapshot())
        await node.subscriptions.wildcards_registered(registering)
        if session.persistent and node.topology.shared:
            await node.writes.session_settled(client_id)  # as SUBACK: a takeover elsewhere reads it from the store
        if retained and conn.session is session:
            node.spawn(node.send_retained(session, retained))
        return Subscription(topic=body.topic, qos=qos, no_local=body.no_local,
                            retain_as_published=body.retain_as_published, retain_handling=body.retain_handling)

    @api.delete("/clients/{client_id:path}/subscriptions", status_code=204, response_class=Response)
    async def unsubscribe(client_id: str, topic: Annotated[str, Query(max_length=MAX_TOPIC_CHARS)]) -> Response:
        conn = _online(node, client_id)
        session = conn.session
        assert session is not None
        if topic.startswith(P2P_PREFIX) or topic not in session.subscriptions:
            raise not_found("no such subscription")
        node.unsubscribe(session, [topic])
        if session.persistent:
            node.writes.save_session(session.snapshot())
        return Response(status_code=204)

    @api.get("/clients/{client_id:path}", response_model=ClientDetail)
    async def get_client(client_id: str) -> ClientDetail:
        conn = node.connections.get(client_id)
        if conn is not None:
            subs = _subscriptions(conn.session.subscriptions) if conn.session is not None else []
            return ClientDetail(**mqtt_client(node, conn).model_dump(), subscriptions_list=subs)
        for amqp in _amqp_connections(found):
            if amqp.id == client_id:
                return ClientDetail(**amqp_client(node, amqp).model_dump(), subscriptions_list=[])
        raise not_found("no such client on this node")

    @api.delete("/clients/{client_id:path}", status_code=204, response_class=Response)
    async def kick(client_id: str) -> Response:
        """Disconnect the client, on whichever node holds it (MQTT 5: DISCONNECT 0x98 Administrative action; its
        will is published)."""
        status = await kick_here(client_id)
        if status == 404:
            status = await node.topology.ask_others(
                "kick", client_id, await node.lookup.client_location(client_id)) or 404
        if status == 404:
            raise not_found("no such client")
        return Response(status_code=204)

    @api.get("/subscriptions", response_model=Page[NodeSubscription])
    async def all_subscriptions(pages: Pages, topic: Substring = None,
                                client_id: Substring = None) -> Page[NodeSubscription]:
        """Every subscription of the MQTT clients online here; `topic` and `client_id` match substrings."""
        found: list[tuple[str, str, int]] = []
        for cid, conn in node.connections.items():
            if conn.session is None or (client_id is not None and client_id not in cid):
                continue
            for key, record in conn.session.subscriptions.items():
                if not key.startswith(P2P_PREFIX) and (topic is None or topic in key):
                    found.append((cid, key, record.qos))
        found.sort()
        chosen, meta = pages.cut(found)
        return Page[NodeSubscription](data=[NodeSubscription(client_id=c, topic=t, qos=q) for c, t, q in chosen],
                                      meta=meta)

    @api.get("/sessions/{client_id:path}", response_model=Session)
    async def get_session(client_id: str) -> Session:
        conn = node.connections.get(client_id)
        if conn is not None and conn.session is not None:
            return session_answer(node, conn.session.record, conn)
        record = await node.store.get_session(client_id)
        if record is None:
            raise not_found("no such session")
        return session_answer(node, record, None)

    @api.delete("/sessions/{client_id:path}", status_code=204, response_class=Response)
    async def delete_session(client_id: str) -> Response:
        """End the session for good, on whichever node holds it: the client is kicked first if online."""
        status = await delete_here(client_id)
        if status == 409:  # online on another node: that node ends it
            record = await node.store.get_session(client_id)
            status = await node.topology.ask_others("delete_session", client_id,
                                                    record.owner if record is not None else None) or 409
        if status == 404:
            raise not_found("no such session")
        if status == 409:
            raise HTTPException(409, "the session is online on another node that did not end it")
        return Response(status_code=204)

    return api
