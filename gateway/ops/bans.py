"""The node's ban list: which client ids, user names and peer addresses (or networks) are refused, checked on the
connect path with no await, refreshed from the store (bans are cluster-wide) and enforced on clients already
connected when a ban appears.

The list lives in the store (`Store.get_bans`/`put_ban`/`delete_ban`); each node keeps an in-memory view,
re-read every `ban_refresh_interval` s and at once after a change made through this node. A ban made on another
node applies here from the next refresh on, and then also closes the matching clients connected here (MQTT 5:
DISCONNECT 0x98 Administrative action; 0x8A Banned is a CONNACK code only). Lapsed bans stop applying at once
(checked against the node's clock at each check) and are deleted from the store by the next refresh.

`check` is O(1) in the number of bans for client ids and user names, and O(number of distinct prefix lengths)
for peer addresses (one dict per prefix length, keyed by the masked address); with no ban at all it returns at
its first line. Limits: `MAX_BANS` bans in a node's view (more stored ones are left out, logged),
`MAX_WHO` / `MAX_REASON` characters.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from tidewire.gateway.core.retry import Backoff, stop_if_cancelled
from tidewire.store.base import BAN_KINDS, Ban

if TYPE_CHECKING:
    from tidewire.gateway.node import Node

log = logging.getLogger("tidewire.bans")

MAX_BANS = 100_000  # bans a node keeps in memory
MAX_WHO = 1024  # characters of a banned client id, user name or address
MAX_REASON = 1024  # characters of a ban's reason
KICK_REASON = "banned"  # the reason string a kicked MQTT 5 client reads (never the operator's own text)

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Key = tuple[str, str]  # (kind, who)


def parse_network(who: str) -> Network | None:
    """A peerhost ban's network: an address (a /32 or /128) or a CIDR (host bits allowed, masked off); IPv4-mapped
    IPv6 addresses count as IPv4. None when `who` is neither."""
    try:
        net = ipaddress.ip_network(who.strip(), strict=False)
    except ValueError:
        return None
    if isinstance(net, ipaddress.IPv6Network) and net.prefixlen >= 96:
        mapped = net.network_address.ipv4_mapped
        if mapped is not None:
            return ipaddress.IPv4Network((mapped, net.prefixlen - 96))
    return net


def normalize_who(kind: str, who: str) -> str | None:
    """The form a ban of `kind` is stored under (peerhost: the canonical address or network), None if invalid."""
    if kind not in BAN_KINDS or not who or len(who) > MAX_WHO:
        return None
    if kind != "peerhost":
        return who
    net = parse_network(who)
    if net is None:
        return None
    return str(net.network_address) if net.prefixlen == net.max_prefixlen else str(net)


def new_ban(kind: str, who: str, reason: str = "", until: float | None = None, duration: float | None = None, *,
            now: float) -> Ban | str:
    """A valid ban made at `now` (epoch s), or the error (a short text) describing what is wrong with the request."""
    if kind not in BAN_KINDS:
        return f"'as' must be one of {', '.join(BAN_KINDS)}"
    if not who:
        return "'who' must not be empty"
    if len(who) > MAX_WHO:
        return f"'who' is longer than {MAX_WHO} characters"
    canonical = normalize_who(kind, who)
    if canonical is None:
        return "'who' is not an IP address or CIDR network"
    if len(reason) > MAX_REASON:
        return f"'reason' is longer than {MAX_REASON} characters"
    if until is not None and duration is not None:
        return "give 'until' or 'duration', not both"
    if duration is not None:
        if not duration > 0:
            return "'duration' must be > 0"
        until = now + duration
    if until is not None and not until > now:
        return "'until' is in the past"
    return Ban(kind, canonical, reason, now, until)


def peer_address(peer: str) -> Address | None:
    """The address of a connection's peer as connections keep it: `host:port` (IPv6 too: the last colon starts
    the port), `[v6]:port`, a bare IPv4 address, or gRPC's `ipv4:`/`ipv6:` forms. None if it is no IP address."""
    if peer.startswith(("ipv4:", "ipv6:")):
        peer = peer[5:]
    if peer.startswith("["):
        host = peer[1 : peer.find("]")]
    else:
        host = peer.rpartition(":")[0] or peer
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


class _View:
    """An immutable set of bans indexed for `check`."""

    __slots__ = ("bans", "clientids", "empty", "nets", "usernames")

    def __init__(self, bans: Iterable[Ban]) -> None:
        self.bans: dict[Key, Ban] = {}
        self.clientids: dict[str, Ban] = {}
        self.usernames: dict[str, Ban] = {}
        # per IP version: (prefix length, {address >> (bits - prefix length): ban}), longest prefixes first
        self.nets: dict[int, list[tuple[int, dict[int, Ban]]]] = {}
        tables: dict[tuple[int, int], dict[int, Ban]] = {}
        for ban in bans:
            self.bans[(ban.kind, ban.who)] = ban
            if ban.kind == "clientid":
                self.clientids[ban.who] = ban
            elif ban.kind == "username":
                self.usernames[ban.who] = ban
            else:
                net = parse_network(ban.who)
                if net is None:
                    continue  # stored by hand or by a newer build: nothing it could match
                shift = net.max_prefixlen - net.prefixlen
                tables.setdefault((net.version, net.prefixlen), {})[int(net.network_address) >> shift] = ban
        for (version, prefixlen), table in sorted(tables.items(), key=lambda kv: -kv[0][1]):
            self.nets.setdefault(version, []).append((prefixlen, table))
        self.empty = not self.bans

    def check(self, client_id: str | None, username: str | None, peer: str | None, now: float) -> Ban | None:
        if client_id is not None and self.clientids:
            ban = self.clientids.get(client_id)
            if ban is not None and (ban.until is None or ban.until > now):
                return ban
        if username is not None and self.usernames:
            ban = self.usernames.get(username)
            if ban is not None and (ban.until is None or ban.until > now):
                return ban
        if peer and self.nets:
            address = peer_address(peer)
            if address is not None:
                value, bits = int(address), address.max_prefixlen
                for prefixlen, table in self.nets.get(address.version, ()):
                    ban = table.get(value >> (bits - prefixlen))
                    if ban is not None and (ban.until is None or ban.until > now):
                        return ban
        return None


_EMPTY = _View(())


class BanList:
    """The node's view of the stored bans (`node.bans`). `banned_refused` counts connections refused because of a
    ban (CONNACK 0x8A / 3.1.1 code 5) and `kicked` connected clients closed because a ban appeared."""

    def __init__(self, node: Node) -> None:
        self._node = node
        self.interval = node.settings.ban_refresh_interval
        self._view = _EMPTY
        self.banned_refused = 0
        self.kicked = 0
        # Refreshes and local changes take turns: a refresh that read the store before a change must not install
        # a list without it.
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()

    # --- the connect path (no await, nothing allocated while there is no ban) -----------------------------
    def check(self, client_id: str | None, username: str | None, peer: str | None) -> Ban | None:
        """The ban that refuses a client with this id, user name (the authenticated one) and peer (`host:port`
        as connections keep it), or None. Any argument may be None: not checked."""
        view = self._view
        if view.empty:
            return None
        return view.check(client_id, username, peer, self._node.clock.time())

    def __len__(self) -> int:
        return len(self._view.bans)

    def current(self) -> list[Ban]:
        """The bans in force now, by kind and who."""
        now = self._node.clock.time()
        return sorted((b for b in self._view.bans.values() if not b.expired(now)), key=lambda b: (b.kind, b.who))

    # --- changes through this node -------------------------------------------------------------------------
    async def add(self, ban: Ban) -> int:
        """Store the ban (durably), apply it here at once and close the matching clients of this node; returns how
        many were closed. Other nodes apply it at their next refresh. Store errors (`OSError`) propagate."""
        async with self._lock:
            await self._node.store.put_ban(ban)
            await self._node.store.sync()
            bans = dict(self._view.bans)
            bans[(ban.kind, ban.who)] = ban
            self._install(bans.values())
        log.info("ban.added", extra={"kind": ban.kind, "who": ban.who, "until": ban.until})
        self._wake.set()
        return self.kick([ban])

    async def remove(self, kind: str, who: str) -> bool:
        """Lift a ban everywhere (durably); False if there was none. Store errors (`OSError`) propagate."""
        async with self._lock:
            found = await self._node.store.delete_ban(kind, who)
            await self._node.store.sync()
            if (kind, who) in self._view.bans:
                self._install(b for key, b in self._view.bans.items() if key != (kind, who))
                found = True
        if found:
            log.info("ban.removed", extra={"kind": kind, "who": who})
        self._wake.set()
        return found

    async def listing(self) -> list[Ban]:
        """The bans in force, read from the store now (the view is refreshed on the way)."""
        await self.refresh()
        return self.current()

    # --- refresh -------------------------------------------------------------------------------------------
    async def refresh(self) -> None:
        """Re-read the stored bans: install them, close clients a new ban matches, delete lapsed ones."""
        store = self._node.store
        async with self._lock:
            stored = await store.get_bans()
            now = self._node.clock.time()
            live = [b for b in stored if not b.expired(now)]
            if len(live) > MAX_BANS:
                log.error("ban.too_many", extra={"stored": len(live), "kept": MAX_BANS})
                live = sorted(live, key=lambda b: b.at, reverse=True)[:MAX_BANS]
            old = self._view.bans
            fresh = [b for b in live if old.get((b.kind, b.who)) != b]
            if fresh or len(live) != len(old):
                self._install(live)
        if fresh:
            self.kick(fresh)
        for ban in stored:
            if ban.expired(now):
                # Only if still lapsed in the store: a ban renewed meanwhile (on any node) stays.
                await store.delete_ban(ban.kind, ban.who, expired_before=now)

    async def run(self) -> None:
        """Refresh every `interval` s, and soon after each local change, until cancelled."""
        retry = Backoff("bans", self._node.clock)
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval)
            self._wake.clear()
            try:
                await self.refresh()
            except Exception as exc:  # the store is down: keep the current list, try again next interval
                stop_if_cancelled()
                retry.failed(exc)
                continue
            retry.succeeded()

    def _install(self, bans: Iterable[Ban]) -> None:
        view = _View(bans)
        self._view = _EMPTY if view.empty else view

    # --- enforcement on connected clients ------------------------------------------------------------------
    def kick(self, bans: list[Ban]) -> int:
        """Close this node's connected clients that `bans` match; returns how many."""
        connections = self._node.connections
        if not connections or not bans:
            return 0
        view = _View(bans)
        now = self._node.clock.time()
        if view.usernames or view.nets:
            targets = [c for c in connections.values()
                       if view.check(c.client_id, c.info.username, c.peer, now) is not None]
        else:  # client ids only: one lookup each, no scan of the connections
            targets = [c for b in bans if (c := connections.get(b.who)) is not None and not b.expired(now)]
        for conn in targets:
            conn.kick(KICK_REASON)
        self.kicked += len(targets)
        return len(targets)
