"""Cluster membership in Redis: join, heartbeat with a TTL, leave, a membership epoch, and dead-node detection.

Keys (one hash tag, so every script is valid on Redis Cluster):

    {tw}:members        hash  node id -> cluster address "host:port"
    {tw}:members:exp    zset  node id scored by its expiry (ms, Redis clock)
    {tw}:members:tok    hash  node id -> token of the process holding it (random per process)
    {tw}:members:since  hash  node id -> when its entry last became live (ms)
    {tw}:members:epoch  string  bumped on every join, leave, removal or address change (services too)
    {tw}:members:gone   zset  tokens of processes declared dead (ms), kept `GONE_KEEP_MS`
    {tw}:members:svc    hash  node id -> the addresses its clients reach it at, per service (JSON: service ->
                              "host:port"), e.g. its RocketMQ endpoint, which the RocketMQ routes list

Each heartbeat is one script: refresh our expiry, remove members whose expiry passed, bump the epoch if the
member set changed, and return (epoch, members, removed ids). The script removes a dead node exactly once, so
the one caller that removed it is the survivor that handles its wills and sessions. Only a member that has been
live for a whole TTL may remove others: after Redis or this node stalled, every member first gets one TTL to
refresh. Times come from Redis (`TIME`), so node clocks do not matter.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tidewire.errors import ClusterError

log = logging.getLogger("tidewire.cluster.membership")

GONE_KEEP_MS = 3_600_000  # how long a removed process can still learn that it was declared dead

_BEAT = """
local id, addr, token, ttl, mode, svc = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5], ARGV[7]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local bump = 0
local removed = {}
local function remove(m)
  local tok = redis.call('HGET', KEYS[3], m)
  redis.call('HDEL', KEYS[1], m)
  redis.call('ZREM', KEYS[2], m)
  redis.call('HDEL', KEYS[3], m)
  redis.call('HDEL', KEYS[4], m)
  redis.call('HDEL', KEYS[7], m)
  if tok then redis.call('ZADD', KEYS[6], now, tok) end
  removed[#removed + 1] = m
  removed[#removed + 1] = tok or ''
  bump = 1
end
local own_exp = tonumber(redis.call('ZSCORE', KEYS[2], id))
local mine = own_exp ~= nil and redis.call('HGET', KEYS[3], id) == token
if own_exp ~= nil and not mine then
  if mode ~= 'join' or own_exp > now then return {'taken', own_exp - now} end
  remove(id)  -- a dead earlier process with our id: this joiner reports its death, once
elseif own_exp == nil and mode ~= 'join' and redis.call('ZSCORE', KEYS[6], token) then
  return {'expelled', 0}
end
local was_live = mine and own_exp > now
if redis.call('HGET', KEYS[1], id) ~= addr then
  redis.call('HSET', KEYS[1], id, addr)
  bump = 1
end
if redis.call('HGET', KEYS[7], id) ~= svc then
  redis.call('HSET', KEYS[7], id, svc)
  bump = 1
end
redis.call('ZADD', KEYS[2], now + ttl, id)
redis.call('HSET', KEYS[3], id, token)
if not was_live then redis.call('HSET', KEYS[4], id, now) end
if was_live and now - tonumber(redis.call('HGET', KEYS[4], id) or now) >= ttl then
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)) do
    if m ~= id then remove(m) end
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now - tonumber(ARGV[6]))
local epoch
if bump == 1 then epoch = redis.call('INCR', KEYS[5]) else epoch = tonumber(redis.call('GET', KEYS[5]) or '0') end
return {'ok', epoch, redis.call('HGETALL', KEYS[1]), removed, redis.call('HGETALL', KEYS[7])}
"""

_LEAVE = """
if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[7], ARGV[1])
return redis.call('INCR', KEYS[5])
"""

ChangeCallback = Callable[[int, dict[str, str]], None]
DeadCallback = Callable[[dict[str, str]], None]  # node id -> the token of its process declared dead
BeatCallback = Callable[[Exception | None], None]


class NodeIdTaken(ClusterError, RuntimeError):
    """Another live process holds this node id."""


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _services(text: str) -> dict[str, str]:
    """A member's advertised services; an entry that is not what `advertise` writes counts as none."""
    try:
        found = json.loads(text)
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


@dataclass
class _Result:
    status: str
    epoch: int = 0
    members: dict[str, str] = field(default_factory=dict)
    removed: dict[str, str] = field(default_factory=dict)  # node id -> token of the process declared dead
    wait_ms: int = 0
    services: dict[str, dict[str, str]] = field(default_factory=dict)  # node id -> service -> address


class Membership:
    """This node's registration. `on_change(epoch, members)` on every new epoch (and once on start);
    `on_dead({id: token})` in the one survivor that removed them (`token`: the dead process's, as `token` is
    this one's); `on_expelled()` if this process was declared dead (its heartbeats stop: the node must drop its
    clients and `rejoin`); `on_beat(error)` after each periodic heartbeat, None when it went through (how the node
    knows it can reach the store while idle)."""

    def __init__(self, redis: Any, node_id: str, address: str, *, interval: float = 0.5, ttl: float = 3.0,
                 prefix: str = "tw", on_change: ChangeCallback | None = None, on_dead: DeadCallback | None = None,
                 on_expelled: Callable[[], None] | None = None, on_beat: BeatCallback | None = None,
                 autobeat: bool = True) -> None:
        if not 0 < interval * 2 <= ttl:
            raise ValueError("the member TTL must be at least twice the heartbeat interval")
        self.node_id = node_id
        self.address = address
        self.interval = interval
        self.ttl = ttl
        self.on_change = on_change
        self.on_dead = on_dead
        self.on_expelled = on_expelled
        self.on_beat = on_beat
        self.autobeat = autobeat  # False: no background heartbeat, the caller calls beat() (tests)
        self.epoch = 0
        self.members: dict[str, str] = {}
        self.services: dict[str, dict[str, str]] = {}  # live node id -> service -> address, as of `epoch`
        self._advertised: dict[str, str] = {}  # this node's: service -> address
        self.expelled = False
        self._stopped = False
        self.beats = 0
        self.beat_errors = 0
        tag = "{" + prefix + "}:members"
        self._keys = [tag, tag + ":exp", tag + ":tok", tag + ":since", tag + ":epoch", tag + ":gone", tag + ":svc"]
        self.token = os.urandom(16).hex()  # this process's: what it holds in the store is held under it
        self._beat = redis.register_script(_BEAT)
        self._leave = redis.register_script(_LEAVE)
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._refresh: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Join. A live entry under our id may be a crashed earlier process: wait up to one TTL for it to
        expire; raise NodeIdTaken if it is still being refreshed."""
        deadline = time.monotonic() + self.ttl + self.interval
        while True:
            result = await self._run("join")
            if result.status == "ok":
                break
            if time.monotonic() >= deadline:
                raise NodeIdTaken(f"node id {self.node_id!r} is in use by another live node; choose another node id")
            await asyncio.sleep(min(self.interval, result.wait_ms / 1000 + 0.01))
        self._apply(result)
        if self.autobeat:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def beat(self) -> None:
        """One heartbeat now (also how a node catches up when a peer shows a newer epoch)."""
        async with self._lock:
            if self.expelled or self._stopped:
                return
            result = await self._run("beat")
            self.beats += 1
            if self._stopped:  # stopped while the script ran: nothing may reach the stopped node's parts
                return
            if result.status == "ok":
                self._apply(result)
                return
            self.expelled = True
            log.error("cluster node %s was declared dead by the others (or its id was taken); it left the cluster",
                      self.node_id)
            if self.on_expelled is not None:
                self.on_expelled()

    async def rejoin(self) -> None:
        """After an expulsion: join again as a new process (a new token, a new entry; the others learn of it by
        the epoch it bumps), and beat on. Raises as `start` does; then call again."""
        if not self.expelled or self._stopped:
            return
        self.token = os.urandom(16).hex()
        self.expelled = False
        self.members = {}  # the next answer is applied whatever its epoch
        try:
            await self.start()
        except BaseException:
            self.expelled = True
            raise

    def advertise(self, service: str, address: str) -> None:
        """Tell the others (`services`) where clients reach this node's `service`, from the next heartbeat on
        (one that changes it bumps the epoch)."""
        self._advertised[service] = address
        self.refresh()

    def refresh(self) -> None:
        """Beat soon, at most one extra beat in flight."""
        if self._task is None or self.expelled or self._stopped:
            return
        if self._refresh is not None and not self._refresh.done():
            return
        self._refresh = asyncio.get_running_loop().create_task(self._quiet_beat())

    async def leave(self) -> None:
        """Graceful stop: stop beating and remove ourselves (bumps the epoch for the others)."""
        await self.abandon()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.ttl):
                async with self._lock:  # a beat still running (its client swallowed the cancel) ends first
                    await self._leave(keys=self._keys, args=[self.node_id, self.token])

    async def abandon(self) -> None:
        """Stop beating without leaving, as a crash would (tests; the entry expires after the TTL)."""
        self._stopped = True  # redis-py has swallowed a cancel before: the loop must also see a flag
        for task in (self._task, self._refresh):
            if task is not None:
                task.cancel()
                # Redis clients have swallowed a cancel before: don't wait forever for the loop to notice.
                await asyncio.wait([task], timeout=self.interval + 1.0)
        self._task = self._refresh = None

    def stats(self) -> dict[str, int]:
        return {"epoch": self.epoch, "members": len(self.members), "beats": self.beats,
                "beat_errors": self.beat_errors}

    async def _loop(self) -> None:
        failing = False
        me = asyncio.current_task()
        # A cancel swallowed by the Redis client still shows in cancelling(): end the loop anyway.
        while not self.expelled and not self._stopped and not (me is not None and me.cancelling()):
            await asyncio.sleep(self.interval)
            error: Exception | None = None
            try:
                await self.beat()
                failing = False
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                error = exc
                self.beat_errors += 1
                if not failing:  # one line per outage, not one per beat
                    log.warning("cluster heartbeat of %s failed: %s", self.node_id, type(exc).__name__)
                failing = True
            if self.on_beat is not None and not self._stopped:
                self.on_beat(error)

    async def _quiet_beat(self) -> None:
        with contextlib.suppress(Exception):
            await self.beat()

    async def _run(self, mode: str) -> _Result:
        args = [self.node_id, self.address, self.token, int(self.ttl * 1000), mode, GONE_KEEP_MS,
                json.dumps(self._advertised, sort_keys=True)]
        raw = await self._beat(keys=self._keys, args=args)
        status = _str(raw[0])
        if status != "ok":
            return _Result(status, wait_ms=int(raw[1]))
        flat = [_str(x) for x in raw[2]]
        members = dict(zip(flat[::2], flat[1::2], strict=True))
        gone = [_str(x) for x in raw[3]]
        flat = [_str(x) for x in raw[4]]
        services = {node: _services(text) for node, text in zip(flat[::2], flat[1::2], strict=True)}
        return _Result(status, int(raw[1]), members, dict(zip(gone[::2], gone[1::2], strict=True)),
                       services=services)

    def _apply(self, result: _Result) -> None:
        changed = result.epoch > self.epoch or not self.members
        if result.epoch >= self.epoch:
            self.epoch = result.epoch
            self.members = result.members
            self.services = {node: found for node, found in result.services.items() if node in result.members}
        if changed and self.on_change is not None:
            try:
                self.on_change(self.epoch, dict(self.members))
            except Exception:
                log.exception("cluster membership listener failed")
        if result.removed:
            log.warning("cluster node(s) %s declared dead by %s", ", ".join(result.removed), self.node_id)
            if self.on_dead is not None:
                try:
                    self.on_dead(result.removed)
                except Exception:
                    log.exception("cluster dead-node handler failed")
