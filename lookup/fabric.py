"""The cluster fabric of one node: RPC, membership, slot table, sharded lookup and cluster notify, wired.

Start order: bind the cluster port, join the membership (its address is the advertised host and port, by
default the bound port), then every new epoch
goes to the RPC (peer addresses) and to the lookup (new slot table, full resync). Stop leaves the membership
first, so the others re-balance at once instead of waiting for the TTL.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from typing import Any

from tidewire.lookup.membership import Membership
from tidewire.lookup.rpc import DEFAULT_MAX_FRAME, RpcError, RpcNode
from tidewire.lookup.sharded import ShardedLookup
from tidewire.notify.cluster import DEFAULT_MERGE_DELAY, ClusterNotifier
from tidewire.notify.leases import DEFAULT_LEASE

log = logging.getLogger("tidewire.cluster")

KickHandler = Callable[[str, int], Any]  # (client_id, epoch) -> None or an awaitable


class ClusterFabric:
    """What a gateway node needs from the cluster: `.lookup`, `.notifier`, dead-node and kick callbacks."""

    def __init__(self, node_id: str, redis_client: Any, *, host: str = "127.0.0.1", cluster_port: int = 0,
                 secret: bytes | str, heartbeat_interval: float = 0.5, member_ttl: float = 3.0, prefix: str = "tw",
                 advertise_host: str | None = None, advertise_port: int | None = None, call_timeout: float = 2.0,
                 max_frame: int = DEFAULT_MAX_FRAME, merge_delay: float = DEFAULT_MERGE_DELAY,
                 notify_lease: float = DEFAULT_LEASE) -> None:
        self.node_id = node_id
        self.rpc = RpcNode(node_id, host, cluster_port, secret, call_timeout=call_timeout, max_frame=max_frame)
        self.lookup = ShardedLookup(node_id, self.rpc)
        self.notifier = ClusterNotifier(node_id, self.rpc, self.lookup, merge_delay=merge_delay, lease=notify_lease)
        self.membership: Membership | None = None
        self._redis = redis_client
        self._host = advertise_host or host
        self._port = advertise_port  # None: the bound port
        self._interval = heartbeat_interval
        self._ttl = member_ttl
        self._prefix = prefix
        self._dead: list[Callable[[dict[str, str]], None]] = []
        self._expelled: list[Callable[[], None]] = []
        self._beat: list[Callable[[Exception | None], None]] = []
        self._kick: KickHandler | None = None
        self._advertised: dict[str, str] = {}  # service -> address, kept for a membership made later
        self.counters = {"kicks_targeted": 0, "kicks_broadcast": 0, "kicks_received": 0}
        self.lookup.on_future_epoch = self._catch_up
        self.rpc.handle("fx.kick", self._on_kick)

    @property
    def epoch(self) -> int:
        return self.membership.epoch if self.membership is not None else 0

    @property
    def members(self) -> dict[str, str]:
        """Node id -> cluster address, as of the current epoch."""
        return dict(self.membership.members) if self.membership is not None else {}

    def advertise(self, service: str, address: str) -> None:
        """Publish where clients reach this node's `service` (its RocketMQ endpoint), for `advertised`."""
        self._advertised[service] = address
        if self.membership is not None:
            self.membership.advertise(service, address)

    def advertised(self, service: str) -> dict[str, str]:
        """Live node id -> the address it advertises for `service` (nodes that advertise none are left out)."""
        if self.membership is None:
            return {}
        return {node: found[service] for node, found in self.membership.services.items() if service in found}

    @property
    def token(self) -> str:
        """This process's membership token (a new one each start): what it holds in the store is held under it."""
        return self.membership.token if self.membership is not None else ""

    def on_dead(self, callback: Callable[[dict[str, str]], None]) -> None:
        """`callback({node_id: token})` in the one survivor that declared them dead: it handles their wills,
        sessions and holds (`token`: the dead process's)."""
        self._dead.append(callback)

    def on_expelled(self, callback: Callable[[], None]) -> None:
        """`callback()` if the others declared this node dead (a long stall): it must drop its clients."""
        self._expelled.append(callback)

    def on_beat(self, callback: Callable[[Exception | None], None]) -> None:
        """`callback(error)` after each periodic heartbeat (None: it reached the store)."""
        self._beat.append(callback)

    def on_kick(self, callback: KickHandler) -> None:
        """`callback(client_id, epoch)` when another node took the client over."""
        self._kick = callback

    async def start(self) -> None:
        await self.rpc.start()
        host = self._host
        if host in ("", "0.0.0.0", "::"):
            host = socket.gethostname()  # a wildcard bind cannot be dialled: advertise our name
            log.info("cluster node %s advertises %s (set an advertise host to change it)", self.node_id, host)
        self.membership = Membership(self._redis, self.node_id, f"{host}:{self._port or self.rpc.port}",
                                     interval=self._interval, ttl=self._ttl, prefix=self._prefix,
                                     on_change=self._on_change, on_dead=self._on_dead, on_expelled=self._on_expelled,
                                     on_beat=self._on_beat)
        for service, address in self._advertised.items():
            self.membership.advertise(service, address)
        try:
            await self.membership.start()
        except BaseException:
            await self.rpc.close()
            raise

    async def rejoin(self) -> None:
        """Join again after the others declared this node dead (`on_expelled`); raises if the store is unreachable
        (then try again)."""
        if self.membership is not None:
            await self.membership.rejoin()

    async def stop(self) -> None:
        """Leave gracefully, then close the cluster port."""
        if self.membership is not None:
            await self.membership.leave()
        await self._close()

    async def abandon(self) -> None:
        """Stop as a crash would: no leave, the others declare us dead after the TTL (tests)."""
        if self.membership is not None:
            await self.membership.abandon()
        await self._close()

    async def _close(self) -> None:
        self.lookup.close()
        self.notifier.close()
        await self.rpc.close()

    async def kick(self, client_id: str, epoch: int) -> None:
        """Tell the node holding `client_id` (by the lookup, or every other member if unknown) to close it."""
        target = await self.lookup.client_location(client_id)
        members = self.members
        if target is not None and target != self.node_id and target in members:
            try:
                await self.rpc.call(target, "fx.kick", [client_id, epoch])
                self.counters["kicks_targeted"] += 1
                return
            except (RpcError, ConnectionError, TimeoutError):
                pass
        self.counters["kicks_broadcast"] += 1
        for member in members:
            if member != self.node_id:
                self.rpc.cast(member, "fx.kick", [client_id, epoch])

    async def call(self, node_id: str, method: str, payload: Any) -> Any:
        """Call `method` on another member (raises `RpcError` if it cannot answer in time)."""
        return await self.rpc.call(node_id, method, payload)

    def serve(self, method: str, handler: Callable[[str, Any], Any]) -> None:
        """Answer `method` for the other members: `handler(from_node, payload)`, a reply or an awaitable of one."""
        self.rpc.handle(method, handler)

    def stats(self) -> dict[str, int]:
        membership = self.membership.stats() if self.membership is not None else {}
        return {**self.rpc.stats(), **membership, **self.lookup.stats(), **self.notifier.stats(), **self.counters}

    def _on_change(self, epoch: int, members: dict[str, str]) -> None:
        self.rpc.set_peers(members)
        self.lookup.set_membership(epoch, members)

    def _on_dead(self, dead: dict[str, str]) -> None:
        for callback in self._dead:
            try:
                callback(dead)
            except Exception:
                log.exception("cluster dead-node callback failed")

    def _on_expelled(self) -> None:
        for callback in self._expelled:
            try:
                callback()
            except Exception:
                log.exception("cluster expelled callback failed")

    def _on_beat(self, error: Exception | None) -> None:
        for callback in self._beat:
            try:
                callback(error)
            except Exception:
                log.exception("cluster heartbeat callback failed")

    def _catch_up(self) -> None:
        if self.membership is not None:
            self.membership.refresh()

    def _on_kick(self, sender: str, payload: Any) -> Any:
        try:
            client_id, epoch = str(payload[0]), int(payload[1])
        except (TypeError, ValueError, IndexError, KeyError):
            return None
        self.counters["kicks_received"] += 1
        return self._kick(client_id, epoch) if self._kick is not None else None
