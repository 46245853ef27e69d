"""Opening and closing the client sessions of a node: takeover of a connection here, the store claim that fences
off every earlier owner, restoring or starting the session; and, when its connection ends, parking a persistent
session in the store or forgetting a clean one."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from tidewire.gateway.sessions.backlog import cap_backlog
from tidewire.gateway.sessions.session import Session
from tidewire.store.base import SessionRecord, expiry_deadline

if TYPE_CHECKING:
    from tidewire.gateway.node import Node
    from tidewire.gateway.protocols.mqtt.lifecycle import ChannelBase

log = logging.getLogger("tidewire.node")


class SessionOpener:
    """`node.sessions`: one open or close of a client id at a time on this node (a lock per client id while one
    is under way)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self._locks: dict[str, asyncio.Lock] = {}

    def _lock(self, client_id: str) -> asyncio.Lock:
        lock = self._locks.get(client_id)
        if lock is None:
            lock = self._locks[client_id] = asyncio.Lock()
        return lock

    async def open(self, conn: ChannelBase, client_id: str, level: int, clean_start: bool,
                   expiry: int, window: int) -> tuple[Session, bool]:
        """Take over or restore the client's session (or start one); returns it and `session_present`."""
        node = self.node
        lock = self._lock(client_id)
        async with lock:
            session: Session | None = None
            old = node.connections.get(client_id)
            if old is not None:
                log.info("client.takeover", extra={"client_id": client_id})
                session = old.take_over()
                if session is not None:  # its P2P queue is read on from where it started, not from now
                    session.own_p2p()
            node.wills.cancel(client_id)
            node.writes.drop_will(client_id)
            await node.writes.will_settled(client_id)
            # Claim the session in the store: its epoch fences off any node that held it before (their late
            # writes of its record and offsets are ignored); that node is told to close the connection.
            await node.writes.session_settled(client_id)  # read what this node last wrote, not older
            record, epoch = await node.store.claim_session(client_id, node.node_id)
            await node.topology.kick_elsewhere(client_id, epoch)
            if session is not None:
                record = None
            elif record is not None and self.expired(record, int(node.clock.time() * 1000)):
                await self.drop_stored(record, epoch)
                record = None
            if clean_start:
                if session is not None:
                    node.subscriptions.forget(session.record)
                    session = None
                if record is not None:
                    await self.drop_stored(record, epoch)
                    record = None
            present = session is not None or record is not None
            if session is None:
                if record is None:
                    last = node.store.last_seq()
                    record = SessionRecord(client_id, offset=last, sent_upto=last)
                else:
                    dropped = await cap_backlog(node.store, record, node.settings.max_queued_messages)
                    if dropped:
                        node.counters.drop("queue_full", dropped)
                        log.info("session.queue_full", extra={"client_id": client_id, "dropped": dropped})
                record.owner, record.epoch = node.node_id, epoch
                session = Session(node, record, persistent=expiry > 0, window=window,
                                  pull_batch=node.settings.pull_batch,
                                  retry_interval=node.settings.retry_interval)
            record = session.record
            record.owner, record.epoch = node.node_id, epoch
            record.protocol_level = session.level = level
            record.expiry_interval = expiry
            record.disconnected_at_ms = 0
            session.persistent = expiry > 0
            session.window = window
            node.connections[client_id] = conn
            node.lookup.set_client_location(client_id, node.node_id)
            node.subscriptions.attach(session, conn.info)
            if session.persistent and present:
                # Its QoS 2 publishes PUBREC'd and not released yet (on any node): a resend of one is not stored
                # again and its PUBREL is answered (the keys are `Message.dedupe`, scope: the client id).
                await node.writes.keys_settled(client_id)
                record.inbound_qos2 = sorted(int(i) for i in await node.store.dedupe_ids(client_id) if i.isdigit())
            if session.persistent:
                node.writes.save_session(session.snapshot())
                await node.writes.session_settled(client_id)
        if not lock.locked() and self._locks.get(client_id) is lock:
            del self._locks[client_id]
        return session, present

    def open_clean(self, conn: ChannelBase, client_id: str, level: int, window: int) -> Session | None:
        """A clean session (nothing kept after it ends) started at once, without a store call, when nothing of the
        client's exists or is under way: one node, no connection, no open or write in flight (so no stored will),
        and a store that knows at once it holds no session of the client. Else None: `open` does it."""
        node = self.node
        if (node.topology.shared or client_id in node.connections or client_id in self._locks
                or not node.writes.idle(client_id) or not node.store.session_absent(client_id)):
            return None
        session = Session(node, None, persistent=False, window=window, pull_batch=node.settings.pull_batch,
                          retry_interval=node.settings.retry_interval, stored=False, client_id=client_id,
                          level=level, start=node.store.last_seq())
        node.connections[client_id] = conn
        node.lookup.set_client_location(client_id, node.node_id)
        node.subscriptions.attach(session, conn.info, own_queue=False)
        return session

    def close(self, conn: ChannelBase, session: Session, *, transfer: bool = False) -> None:
        """The connection is gone. Unless the session moves to a new connection, park it in the store."""
        node = self.node
        if node.connections.get(session.client_id) is conn:
            del node.connections[session.client_id]
            node.lookup.remove_client_location(session.client_id, node.node_id)
        node.subscriptions.detach(session)
        session.detach()
        node.released(conn, session)
        if transfer:
            return
        if session.persistent:
            record = session.snapshot()
            record.disconnected_at_ms = int(node.clock.time() * 1000)
            node.subscriptions.park(record)
            node.writes.save_session(record)
        else:
            node.exclusive.session_ended(session.client_id)  # its `$exclusive/` locks go with it
            if session.subscriptions:  # else there is nothing to forget (and a record-less session stays so)
                node.subscriptions.forget(session.record)
            if session.stored:  # else there is nothing to delete
                node.writes.drop_session(session.client_id)

    @staticmethod
    def expired(record: SessionRecord, now_ms: int) -> bool:
        deadline = expiry_deadline(record)
        return deadline is not None and deadline <= now_ms

    async def drop_stored(self, record: SessionRecord, epoch: int = -1) -> None:
        if self.node.settings.exclusive_subscriptions:  # any `$exclusive/` lock it held (on any node) goes
            self.node.exclusive.session_ended(record.client_id, record.subscriptions)
        self.node.subscriptions.forget(record)
        self.node.writes.drop_session(record.client_id, epoch)
        await self.node.writes.session_settled(record.client_id)
