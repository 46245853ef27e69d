"""The node's rules: each enabled rule is a competing consumer of the group `rule/<name>` on every node, so its
results are delivered from a stored position, on the live stream (the group is told of each append) and after
any outage of the action.

- The group's filters are the rule's `FROM` filters and its matcher the `WHERE` condition: a message the rule
  does not select is passed over, never claimed.
- A claimed batch is projected (`SELECT`) and handed to the action. Success settles it. A failure gives each
  message back to the group, visible again after a backoff (`retry_base` doubled per attempt up to `retry_cap`).
  Past `max_retries` attempts, or at once for a permanent refusal (an HTTP 4xx other than 408/429), the result
  goes to the dead-letter topic instead, and is settled once that publish is durable.
- Rules are stored with their groups (`GroupRecord.attrs["rule"]`), so a rule made through one node's API runs on
  every node; each node re-reads them every `RULES_REFRESH_S`. Rules of the config file are declared at start.
- What a rule republishes carries `rule:<name>` as its publisher, and the rule passes its own results over: a rule
  whose output matches its own filter does not feed itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from tidewire.bridges.host import NodeHost
from tidewire.bridges.mqtt.settings import BridgeSettings
from tidewire.bridges.rules.actions import make_sink
from tidewire.bridges.rules.settings import BridgeAction, RuleSettings, SinkAction
from tidewire.bridges.rules.sql import RuleError, RuleQuery, compile_rule
from tidewire.extensions.plugins import SINK_GROUP, PluginCatalog, Sink, SinkRefused
from tidewire.gateway.core.group_reader import Delivery
from tidewire.gateway.core.ingress import publish_future
from tidewire.gateway.core.topics import matches
from tidewire.store.base import GroupRecord, Message

log = logging.getLogger("tidewire.rules")

GROUP_PREFIX = "rule/"
PUBLISHER_PREFIX = "rule:"
RULES_REFRESH_S = 2.0  # a rule made or changed through another node's API starts here within this
VISIBILITY_MS = 120_000  # a claimed result stays hidden this long if this node dies while delivering it


@dataclass
class RuleCounts:
    matched: int = 0  # results handed to the action (retries included)
    sent: int = 0  # delivered (2xx, or durable for a republish)
    failed: int = 0  # attempts that failed (each may be retried)
    dead_lettered: int = 0  # results sent to the dead-letter topic


class RuleRunner:
    """One rule on this node: its group's consumer."""

    def __init__(self, engine: RuleEngine, settings: RuleSettings, query: RuleQuery) -> None:
        self.engine = engine
        self.settings = settings
        self.query = query
        self.group = GROUP_PREFIX + settings.name
        self.publisher = PUBLISHER_PREFIX + settings.name
        self.counts = RuleCounts()
        self.last_error = ""
        self.sink: Sink = make_sink(settings, engine.host, self.publisher, engine.bridges, engine.catalog)
        self.visibility_ms = VISIBILITY_MS
        self._busy = 0  # results being delivered now
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        groups = self.engine.host.groups
        groups.matcher(self.group, self._selects)
        groups.consume(self.group, self)

    async def stop(self) -> None:
        self.engine.host.groups.cancel(self.group, self)
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.sink.close()

    def _selects(self, message: Message) -> bool:
        return message.publisher != self.publisher and self.query.matches(message)

    # --- Consumer ---------------------------------------------------------------------------------------------
    def credit(self) -> int:
        action = self.settings.action
        return max(0, action.batch_size * action.concurrency - self._busy)

    def deliver(self, deliveries: list[Delivery]) -> None:
        """Batches of up to `batch_size`, each delivered by a task of its own (`concurrency` at most at once)."""
        self._busy += len(deliveries)
        self.counts.matched += len(deliveries)
        loop = asyncio.get_running_loop()
        size = self.settings.action.batch_size
        for start in range(0, len(deliveries), size):
            task = loop.create_task(self._run(deliveries[start:start + size]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, deliveries: list[Delivery]) -> None:
        groups = self.engine.host.groups
        action = self.settings.action
        try:
            results = [self.query.project(d.message) for d in deliveries]
            permanent = False
            try:
                async with asyncio.timeout(action.timeout if isinstance(action, SinkAction) else None):
                    await self.sink.write(results, [d.message for d in deliveries])
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the sink's failure, never the node's: counted, then retried or dead-lettered
                permanent = isinstance(exc, SinkRefused)
                self.last_error = str(exc) or type(exc).__name__
            else:
                self.counts.sent += len(deliveries)
                await groups.ack(self.group, [(d.claim.seq, d.claim.token) for d in deliveries])
                return
            self.counts.failed += len(deliveries)
            retry: list[Delivery] = []
            dead: list[tuple[Delivery, dict[str, Any]]] = []
            for delivery, result in zip(deliveries, results, strict=True):
                if permanent or delivery.claim.deliveries > action.max_retries:
                    dead.append((delivery, result))
                else:
                    retry.append(delivery)
            if retry:
                attempts = min(d.claim.deliveries for d in retry)
                await groups.requeue(self.group, [(d.claim.seq, d.claim.token) for d in retry],
                                     delay_ms=int(self._backoff(attempts) * 1000))
            if dead:
                await self._dead_letter(dead, self.last_error)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a store outage: the claims lapse and come back
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.exception("rule.failed", extra={"rule": self.settings.name})
        finally:
            self._busy -= len(deliveries)
            groups.wake(self.group)

    def _backoff(self, attempts: int) -> float:
        action = self.settings.action
        return float(min(action.retry_cap, action.retry_base * 2 ** max(0, attempts - 1)))

    async def _dead_letter(self, dead: list[tuple[Delivery, dict[str, Any]]], error: str) -> None:
        """Each result to the dead-letter topic, with why; settled once those publishes are durable."""
        host = self.engine.host
        now_ms = int(host.clock.time() * 1000)
        letters: list[Message] = []
        for delivery, result in dead:
            message = delivery.message
            body = {"rule": self.settings.name, "error": error, "attempts": delivery.claim.deliveries,
                    "topic": message.topic, "clientid": message.publisher, "seq": message.seq,
                    "timestamp": message.timestamp_ms, "result": result}
            letters.append(Message(self.settings.dead_letter_topic, json.dumps(body, default=str).encode(), 1, False,
                                   b"", now_ms, 0, self.publisher))
        await asyncio.gather(*publish_future(host.publish, letters))
        self.counts.dead_lettered += len(dead)
        await host.groups.ack(self.group, [(d.claim.seq, d.claim.token) for d, _ in dead])

    def status(self) -> dict[str, Any]:
        return rule_status(self.settings, True, self.last_error, self.counts)


class RuleEngine:
    """Every rule of the cluster, run on this node (a `gateway.server.Backend`)."""

    def __init__(self, host: NodeHost, configured: list[RuleSettings], bridges: Sequence[BridgeSettings] = (),
                 catalog: PluginCatalog | None = None) -> None:
        self.host = host
        self.configured = configured
        self.bridges = {bridge.name: bridge for bridge in bridges}  # for rules whose action is a bridge
        self.catalog = catalog if catalog is not None else PluginCatalog()  # for rules whose action is a sink
        self.runners: dict[str, RuleRunner] = {}
        self.stored: dict[str, RuleSettings] = {}  # every rule as last read, enabled or not
        self.errors: dict[str, str] = {}  # why an enabled rule does not run here
        self._refresh: asyncio.Task[None] | None = None

    async def start(self) -> None:
        for settings in self.configured:
            await self._store(settings, source="config")
        await self.refresh()
        self._refresh = asyncio.get_running_loop().create_task(self._refresh_loop(), name="rules-refresh")

    async def stop(self) -> None:
        if self._refresh is not None:
            self._refresh.cancel()
        for runner in list(self.runners.values()):
            await runner.stop()
        self.runners.clear()

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(RULES_REFRESH_S)
            try:
                await self.refresh()
            except Exception as exc:  # the store is down: the rules keep running as they are
                log.warning("rules.refresh_failed", extra={"error": str(exc)})

    async def refresh(self) -> None:
        """Run what is stored and enabled, stop the rest (a rule changed elsewhere restarts here)."""
        stored: dict[str, RuleSettings] = {}
        for record in await self.host.store.list_groups():
            if record.name.startswith(GROUP_PREFIX) and "rule" in record.attrs:
                try:
                    stored[record.name[len(GROUP_PREFIX):]] = RuleSettings.model_validate(record.attrs["rule"])
                except ValueError as exc:
                    log.error("rule.invalid", extra={"group": record.name, "error": str(exc)})
        self.stored = stored
        for name in list(self.runners):
            wanted = stored.get(name)
            if wanted is None or not wanted.enabled or wanted != self.runners[name].settings:
                await self.runners.pop(name).stop()
        for name, settings in stored.items():
            if settings.enabled and name not in self.runners:
                try:
                    runner = RuleRunner(self, settings, check_rule(settings, self.bridges, self.catalog))
                except (OSError, ValueError) as exc:  # it cannot run here: its statement, bridge or sink
                    if self.errors.get(name) != str(exc):
                        log.error("rule.not_started", extra={"rule": name, "error": str(exc)})
                    self.errors[name] = str(exc)
                    continue
                self.errors.pop(name, None)
                await self.host.groups.get(GROUP_PREFIX + name)  # known to this node's groups
                self.runners[name] = runner
                runner.start()

    async def _store(self, settings: RuleSettings, source: str) -> None:
        query = check_rule(settings, self.bridges, self.catalog)
        groups = self.host.groups
        attrs = {"rule": settings.model_dump(mode="json"), "source": source}
        record, created = await groups.declare(GroupRecord(GROUP_PREFIX + settings.name, sorted(query.filters),
                                                           attrs=attrs))
        if not created and (record.attrs != attrs or record.filters != sorted(query.filters)):
            record.attrs = attrs
            await groups.set_filters(record, sorted(query.filters))

    # --- the admin API ----------------------------------------------------------------------------------
    async def put(self, settings: RuleSettings) -> None:
        """Create or replace a rule (ValueError: its statement does not compile)."""
        await self._store(settings, source="api")
        await self.refresh()

    async def delete(self, name: str) -> bool:
        if name not in self.stored and await self.host.store.get_group(GROUP_PREFIX + name) is None:
            return False
        await self.host.groups.delete(GROUP_PREFIX + name)
        await self.refresh()
        return True

    async def set_enabled(self, name: str, enabled: bool) -> bool:
        settings = self.stored.get(name)
        if settings is None:
            return False
        await self._store(settings.model_copy(update={"enabled": enabled}), source="api")
        await self.refresh()
        return True

    def statuses(self) -> list[dict[str, Any]]:
        out = []
        for name, settings in sorted(self.stored.items()):
            runner = self.runners.get(name)
            out.append(runner.status() if runner is not None
                       else rule_status(settings, False, self.errors.get(name, ""), RuleCounts()))
        return out


def rule_status(settings: RuleSettings, running: bool, last_error: str, counts: RuleCounts) -> dict[str, Any]:
    """A rule as the API, the dashboard and `tidewire ctl` show it (its action without a webhook's secret)."""
    return {"name": settings.name, "sql": settings.sql, "enabled": settings.enabled,
            "description": settings.description, "action": settings.action.model_dump(exclude={"secret"}),
            "running": running, "last_error": last_error, "counts": dict(counts.__dict__)}


def check_rule(settings: RuleSettings, bridges: Collection[str], catalog: PluginCatalog) -> RuleQuery:
    """The rule's compiled statement; ValueError when the rule cannot run: a statement that does not compile, a
    bridge or a sink plugin this node does not have (`bridges`: the configured bridges' names)."""
    query = compile_rule(settings.sql)
    if isinstance(query, RuleError):
        raise ValueError(f"rule {settings.name!r}: {query.reason} (at {query.position})")
    action = settings.action
    if isinstance(action, BridgeAction) and action.bridge not in bridges:
        raise ValueError(f"rule {settings.name!r}: no bridge {action.bridge!r} is configured")
    if isinstance(action, SinkAction) and action.sink not in catalog.installed(SINK_GROUP):
        installed = ", ".join(catalog.installed(SINK_GROUP)) or "none"
        raise ValueError(f"rule {settings.name!r}: no sink plugin named {action.sink!r} (installed: {installed})")
    return query


def try_rule(sql: str, message: Message) -> tuple[bool, dict[str, Any] | None] | RuleError:
    """What a statement makes of one message: (selected, the result), without running anything."""
    query = compile_rule(sql)
    if isinstance(query, RuleError):
        return query
    if not any(matches(f, message.topic) for f in query.filters) or not query.matches(message):
        return False, None
    return True, query.project(message)
