"""AMQP exchanges: the pre-declared ones and those clients declare, kept where every node sees them.

A declared exchange is a `GroupRecord` named `amqp-exchange/<vhost>/<name>` with no filters and its settings in
`attrs` ({type, durable, auto_delete, internal, alternate}, and `bindings`: the exchange-to-exchange bindings
whose source it is, [[destination, key, filter, arguments], ...] as `routing` reads them; a predeclared
exchange gets a record when it is first such a source): the store is shared by every node of a cluster, so an exchange
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
    alternate: str = ""  # the `alternate-exchange` argument
    bindings: tuple[tuple[str, ...], ...] = ()  # exchange-to-exchange bindings from it (`routing.stored_bindings`)

    @property
    def predeclared(self) -> bool:
        return self.name == "" or self.name in PREDECLARED

    @property
    def routes_at_publish(self) -> bool:
        """Does a publish to it need `routing` (what its topic filters alone do not route)?"""
        return self.kind == "headers" or bool(self.alternate) or bool(self.bindings)


DEFAULTS = {name: Exchange(name, kind) for name, kind in PREDECLARED.items()} | {"": Exchange("", "direct")}


def record_name(vhost: str, name: str) -> str:
    return f"{RECORD_PREFIX}{vhost}/{name}"


class Exchanges:
    """This node's view of the exchanges (one per server: every connection shares it)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self._cache: dict[tuple[str, str], tuple[Exchange, float]] = {}
        # every exchange type seen (by name), to give deliveries their routing key back (`mapping.origin`)
        self.kinds: dict[str, str] = {name: ex.kind for name, ex in DEFAULTS.items()}

    async def get(self, vhost: str, name: str) -> Exchange | None:
        if name == "":
            return DEFAULTS[name]
        cached = self._cache.get((vhost, name))
        if cached is not None and self.node.clock.monotonic() - cached[1] < CACHE_S:
            return cached[0]
        try:
            record = await self.node.store.get_group(record_name(vhost, name))
        except Exception:
            # The store cannot answer: what was known still routes (a predeclared exchange always exists), and
            # the publish waits for the store where it is appended, as it did before exchanges had bindings.
            known = cached[0] if cached is not None else DEFAULTS.get(name)
            if known is None:
                raise
            return known
        if record is None:
            known = DEFAULTS.get(name)  # a predeclared exchange without a record: no bindings from it
            if known is not None:
                return self._remember(vhost, known)
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
        if exchange.alternate:
            attrs["alternate"] = exchange.alternate
        if not exchange.durable:
            attrs["node"] = self.node.node_id
        await self.node.store.put_group(GroupRecord(record_name(vhost, exchange.name), [], exchange.durable,
                                                    self.node.store.last_seq(), int(self.node.clock.time() * 1000),
                                                    attrs))
        return self._remember(vhost, exchange)

    async def set_bindings(self, vhost: str, exchange: Exchange, bindings: list[list[str]]) -> Exchange:
        """Store the exchange-to-exchange bindings whose source `exchange` is (read, changed, written back: two
        nodes binding from one exchange at the same instant may lose one, as for a queue's bindings)."""
        store = self.node.store
        record = await store.get_group(record_name(vhost, exchange.name))
        if record is None:  # a predeclared exchange's first binding
            record = GroupRecord(record_name(vhost, exchange.name), [], True, store.last_seq(),
                                 int(self.node.clock.time() * 1000),
                                 {"type": exchange.kind, "durable": True, "auto_delete": False,
                                  "internal": exchange.internal})
        record.attrs["bindings"] = bindings
        await store.put_group(record)
        return self._remember(vhost, _from_record(exchange.name, record))

    async def sources_of(self, vhost: str, destination: str) -> list[Exchange]:
        """Every exchange of the vhost with a binding to `destination` (a scan: exchange deletion is rare)."""
        prefix = record_name(vhost, "")
        found = [_from_record(r.name[len(prefix):], r) for r in await self.node.store.list_groups()
                 if r.name.startswith(prefix)]
        return [ex for ex in found if any(b[0] == destination for b in ex.bindings)]

    async def delete(self, vhost: str, name: str) -> None:
        self._cache.pop((vhost, name), None)
        await self.node.store.delete_group(record_name(vhost, name))


def _from_record(name: str, record: GroupRecord) -> Exchange:
    attrs = record.attrs
    kind, alternate = attrs.get("type"), attrs.get("alternate")
    return Exchange(name, kind if isinstance(kind, str) else "direct", bool(attrs.get("durable", True)),
                    bool(attrs.get("auto_delete", False)), bool(attrs.get("internal", False)),
                    alternate if isinstance(alternate, str) else "",
                    tuple(tuple(b) for b in stored_bindings(attrs.get("bindings"))))


def stored_bindings(raw: object) -> list[list[str]]:
    """[[exchange, key, filter, arguments], ...] of a record's `bindings` (an exchange record's too, its first
    element the destination); entries of three, stored before arguments were kept, have none."""
    if not isinstance(raw, list):
        return []
    return [[*map(str, b), ""][:4] for b in raw if isinstance(b, list) and len(b) in (3, 4)]
