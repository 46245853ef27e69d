"""AMQP exchanges: the pre-declared ones and those clients declare, kept where every node sees them.

A declared exchange is a `GroupRecord` named `amqp-exchange/<vhost>/<name>` with no filters and its settings in
`attrs` ({type, durable, auto_delete, internal}): the store is shared by every node of a cluster, so an exchange
declared through one node can be published to through any other (a record without filters reads nothing). A
non-durable one carries `attrs["node"]` and goes when that node restarts, as `ConsumerGroups.load` drops
non-durable groups. Nodes cache what they read for `CACHE_S`: a deletion elsewhere is seen that late.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tidewire.gateway.protocols.amqp.mapping import PREDECLARED
from tidewire.store.base import GroupRecord

if TYPE_CHECKING:
    from tidewire.gateway.node import Node

CACHE_S = 1.0
RECORD_PREFIX = "amqp-exchange/"


@dataclass(frozen=True, slots=True)
class Exchange:
    name: str
    kind: str  # topic, direct, fanout
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False

    @property
    def predeclared(self) -> bool:
        return self.name == "" or self.name in PREDECLARED


_DEFAULTS = {name: Exchange(name, kind) for name, kind in PREDECLARED.items()} | {"": Exchange("", "direct")}


def record_name(vhost: str, name: str) -> str:
    return f"{RECORD_PREFIX}{vhost}/{name}"


class Exchanges:
    """This node's view of the exchanges (one per server: every connection shares it)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self._cache: dict[tuple[str, str], tuple[Exchange, float]] = {}
        # every exchange type seen (by name), to give deliveries their routing key back (`mapping.origin`)
        self.kinds: dict[str, str] = {name: ex.kind for name, ex in _DEFAULTS.items()}

    async def get(self, vhost: str, name: str) -> Exchange | None:
        known = _DEFAULTS.get(name)
        if known is not None:
            return known
        cached = self._cache.get((vhost, name))
        if cached is not None and self.node.clock.monotonic() - cached[1] < CACHE_S:
            return cached[0]
        record = await self.node.store.get_group(record_name(vhost, name))
        if record is None:
            self._cache.pop((vhost, name), None)
            return None
        return self._remember(vhost, _from_record(name, record))

    def _remember(self, vhost: str, exchange: Exchange) -> Exchange:
        if len(self._cache) > 100_000:  # bounded: a client declaring exchanges without end costs a re-read
            self._cache.clear()
        self._cache[(vhost, exchange.name)] = (exchange, self.node.clock.monotonic())
        if len(self.kinds) < 100_000:
            self.kinds[exchange.name] = exchange.kind
        return exchange

    async def declare(self, vhost: str, exchange: Exchange) -> Exchange:
        """Create it unless it exists; returns what is stored (possibly another client's definition)."""
        existing = await self.get(vhost, exchange.name)
        if existing is not None:
            return existing
        attrs: dict[str, object] = {"type": exchange.kind, "durable": exchange.durable,
                                    "auto_delete": exchange.auto_delete, "internal": exchange.internal}
        if not exchange.durable:
            attrs["node"] = self.node.node_id
        await self.node.store.put_group(GroupRecord(record_name(vhost, exchange.name), [], exchange.durable,
                                                    self.node.store.last_seq(), int(self.node.clock.time() * 1000),
                                                    attrs))
        return self._remember(vhost, exchange)

    async def delete(self, vhost: str, name: str) -> None:
        self._cache.pop((vhost, name), None)
        await self.node.store.delete_group(record_name(vhost, name))


def _from_record(name: str, record: GroupRecord) -> Exchange:
    attrs = record.attrs
    kind = attrs.get("type")
    return Exchange(name, kind if isinstance(kind, str) else "direct", bool(attrs.get("durable", True)),
                    bool(attrs.get("auto_delete", False)), bool(attrs.get("internal", False)))
