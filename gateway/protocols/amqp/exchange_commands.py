"""One channel's exchange commands (Exchange.Declare, Delete, Bind, Unbind) and the checks every binding goes
through, a queue's too (`binding_to`): its topic filter, or a headers exchange's pattern, and the ACL.

Exchanges and their exchange-to-exchange bindings are stored (`exchanges`); `routing` is told of each change
made here, so this node routes by it at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pamqp import commands

from tidewire.extensions.hooks import SubscribeAccess
from tidewire.gateway.core.tenants import closed_to
from tidewire.gateway.core.topics import valid_topic_filter
from tidewire.gateway.protocols.amqp.codec import (
    ACCESS_REFUSED,
    COMMAND_INVALID,
    NOT_FOUND,
    PRECONDITION_FAILED,
    Fault,
    Method,
    Properties,
    fault,
)
from tidewire.gateway.protocols.amqp.exchanges import Exchange
from tidewire.gateway.protocols.amqp.headers import binding_problem
from tidewire.gateway.protocols.amqp.mapping import (
    EXCHANGE_TYPES,
    MAX_EXCHANGE_NAME,
    NAME,
    binding_filter,
    exchange_filter,
)
from tidewire.gateway.protocols.amqp.routing import encode_arguments

if TYPE_CHECKING:
    from tidewire.gateway.protocols.amqp.connection import AmqpConnection

Exch = commands.Exchange


class ExchangeCommands:
    def __init__(self, conn: AmqpConnection, vhost: str, reply: Callable[[Method], None]) -> None:
        self.conn = conn
        self.node = conn.node
        self.vhost = vhost
        self.reply = reply

    async def declare(self, method: Any, _p: Properties | None, _b: bytes) -> Fault | None:
        name, kind, vhost = method.exchange, method.exchange_type, self.vhost
        exchanges = self.conn.server.exchanges
        if method.passive:
            if await exchanges.get(vhost, name) is None:
                return fault(NOT_FOUND, f"no exchange '{name}' in vhost '{vhost}'", method)
        else:
            if name == "":
                return fault(ACCESS_REFUSED, "operation not permitted on the default exchange", method)
            if kind not in EXCHANGE_TYPES:
                return fault(COMMAND_INVALID, f"unknown exchange type '{kind[:40]}'", method)
            if len(name) > MAX_EXCHANGE_NAME or not NAME.fullmatch(name):
                return fault(PRECONDITION_FAILED, "invalid exchange name", method)
            arguments = method.arguments if isinstance(method.arguments, dict) else {}
            alternate = arguments.get("alternate-exchange", "")
            if not isinstance(alternate, str):
                return fault(PRECONDITION_FAILED, f"invalid arg 'alternate-exchange' for exchange '{name}' in vhost "
                                                  f"'{vhost}': {{unacceptable_type,{type(alternate).__name__}}}",
                             method)
            existing = await exchanges.get(vhost, name)
            if existing is None:
                if name.startswith("amq."):
                    return fault(ACCESS_REFUSED, f"exchange name '{name}' contains reserved prefix 'amq.*'", method)
                if alternate and not self._may_read(exchange_filter(name)):
                    # its unroutable messages reach whoever reads the alternate: the declarer must read them
                    return fault(ACCESS_REFUSED, f"access to topic filter '{exchange_filter(name)[:80]}' refused "
                                                 f"for user '{self.conn.info.username}'", method)
                existing = await exchanges.declare(vhost, Exchange(name, kind, bool(method.durable),
                                                                   bool(method.auto_delete), bool(method.internal),
                                                                   alternate))
                self.conn.server.routing.changed()
            for arg, mine, theirs in (("type", kind, existing.kind), ("durable", method.durable, existing.durable),
                                      ("alternate-exchange", alternate, existing.alternate)):
                if mine != theirs:
                    return fault(PRECONDITION_FAILED, f"inequivalent arg '{arg}' for exchange '{name}' in vhost "
                                                      f"'{vhost}': received '{mine}' but current is '{theirs}'", method)
        if not method.nowait:
            self.reply(Exch.DeclareOk())
        return None

    async def delete(self, method: Any, _p: Properties | None, _b: bytes) -> Fault | None:
        name, vhost = method.exchange, self.vhost
        server = self.conn.server
        exchange = await server.exchanges.get(vhost, name)
        if exchange is not None and exchange.predeclared:
            return fault(ACCESS_REFUSED, f"deletion of exchange '{name}' is not allowed", method)
        if exchange is not None:
            if method.if_unused and (exchange.bindings or await server.queues.bound_to(vhost, name)):
                return fault(PRECONDITION_FAILED, f"exchange '{name}' in vhost '{vhost}' in use", method)
            await self._delete_exchange(exchange)
        if not method.nowait:
            self.reply(Exch.DeleteOk())
        return None

    async def _delete_exchange(self, exchange: Exchange) -> None:
        """The exchange goes, with every binding from it and to it (as RabbitMQ's)."""
        server, vhost, name = self.conn.server, self.vhost, exchange.name
        await server.queues.drop_bindings(vhost, name)
        for source in await server.exchanges.sources_of(vhost, name):
            await server.exchanges.set_bindings(vhost, source, [list(b) for b in source.bindings if b[0] != name])
        await server.exchanges.delete(vhost, name)
        server.routing.changed()

    async def unused_auto_delete(self, exchange: Exchange) -> None:
        """After an unbind: an auto-delete exchange whose last binding from it is gone goes."""
        server = self.conn.server
        if not exchange.auto_delete or exchange.predeclared:
            return
        current = await server.exchanges.get(self.vhost, exchange.name)
        if current is not None and not current.bindings and not await server.queues.bound_to(self.vhost,
                                                                                              exchange.name):
            await self._delete_exchange(current)

    def _may_read(self, topic_filter: str) -> bool:
        return self.node.authorizer.subscribe_access(self.conn.info, topic_filter) is SubscribeAccess.GRANTED

    def binding_to(self, source: Exchange, key: str, arguments: Any,
                    method: Method) -> tuple[str, str] | Fault:
        """(topic filter, stored arguments) of a binding from `source`, or why it is refused. From a headers
        exchange the filter is "" (`routing` matches the headers) and what the ACL checks is all it routes."""
        arguments = arguments if isinstance(arguments, dict) else {}
        settings = self.node.settings
        if source.kind == "headers":
            problem = binding_problem(arguments)
            if problem is not None:
                return fault(PRECONDITION_FAILED, problem, method)
            topic_filter, checked = "", exchange_filter(source.name)
        else:
            mapped = binding_filter(source.name, source.kind, key)
            if mapped is None or not valid_topic_filter(mapped) or (
                    mapped.count("/") >= settings.max_topic_levels) or (
                    len(mapped.encode()) > settings.max_topic_length):
                return fault(PRECONDITION_FAILED, f"binding key '{key[:80]}' has no MQTT topic filter equivalent",
                             method)
            topic_filter = checked = mapped
        if closed_to(self.conn.info, checked) or not self._may_read(checked):
            return fault(ACCESS_REFUSED, f"access to topic filter '{checked[:80]}' refused for user "
                                         f"'{self.conn.info.username}'", method)
        return topic_filter, encode_arguments(arguments)

    async def _exchange_pair(self, method: Any) -> tuple[Exchange, Exchange] | Fault:
        if method.destination == "" or method.source == "":
            return fault(ACCESS_REFUSED, "operation not permitted on the default exchange", method)
        found: list[Exchange] = []
        for name in (method.destination, method.source):
            exchange = await self.conn.server.exchanges.get(self.vhost, name)
            if exchange is None:
                return fault(NOT_FOUND, f"no exchange '{name}' in vhost '{self.vhost}'", method)
            found.append(exchange)
        return found[0], found[1]

    async def bind(self, method: Any, _p: Properties | None, _b: bytes) -> Fault | None:
        pair = await self._exchange_pair(method)
        if isinstance(pair, Fault):
            return pair
        destination, source = pair
        made = self.binding_to(source, method.routing_key, method.arguments, method)
        if isinstance(made, Fault):
            return made
        entry = (destination.name, method.routing_key, *made)
        if entry not in source.bindings:
            server = self.conn.server
            await server.exchanges.set_bindings(self.vhost, source, [*map(list, source.bindings), list(entry)])
            server.routing.changed()
        if not method.nowait:
            self.reply(Exch.BindOk())
        return None

    async def unbind(self, method: Any, _p: Properties | None, _b: bytes) -> Fault | None:
        pair = await self._exchange_pair(method)
        if isinstance(pair, Fault):
            return pair
        destination, source = pair
        arguments = encode_arguments(method.arguments if isinstance(method.arguments, dict) else {})
        kept = [list(b) for b in source.bindings
                if not (b[0] == destination.name and b[1] == method.routing_key and b[3] == arguments)]
        if len(kept) != len(source.bindings):
            server = self.conn.server
            await self.conn.server.exchanges.set_bindings(self.vhost, source, kept)
            server.routing.changed()
            await self.unused_auto_delete(source)
        if not method.nowait:
            self.reply(Exch.UnbindOk())
        return None
