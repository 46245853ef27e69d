"""The configured publish hooks between the ingress and the append: each publish of every protocol goes through
them, in their order, after the ACL and before `Node.publish`; a rewritten topic is checked against the ACL again.

A node without hooks has no `PublishHooks` (`node.hooks is None`): the protocols then call `Node.publish` as they
always did, with no await and nothing allocated. With hooks, two ways in:

* `check(client, message)`, awaited by a handler that already runs one command at a time in order (AMQP's
  connection worker, RocketMQ's send, the admin API): the reason it is refused, or None after applying rewrites.
* `submit(publisher, client, message, sink, token)`, from a sans-IO handler that cannot await (an MQTT channel,
  a bridge's incoming side): the publish joins its publisher's lane, a queue drained by one task at a time, so a
  publisher's messages reach `Node.publish` in the order they came even when a hook answers late. A refused one
  goes back to `publisher.publish_refused`. A lane longer than `LANE_HOLD` stops its publisher being read
  (`hold_publishes(True)`) until it is down to half.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from tidewire.extensions.plugin_guard import INVALID, GuardedHook
from tidewire.extensions.plugins import Action, PublishDecision
from tidewire.gateway.core.ingress import DurableSink, invalid_topic, refuse_publish

if TYPE_CHECKING:
    from tidewire.extensions.hooks import Authorizer, ClientInfo
    from tidewire.gateway.config import Settings
    from tidewire.store.base import Message

log = logging.getLogger("tidewire.ingress")

LANE_HOLD = 1024  # publishes waiting in one publisher's lane before it is no longer read
HOOK_DENIED = "hook_denied"  # the drop reason of a publish a hook refused (`tidewire_dropped{reason}`)


class Publisher(Protocol):
    """Who publishes through `submit`: told of a refusal, and when to stop sending."""

    def publish_refused(self, message: Message, token: Any, reason: str) -> None:
        """A hook (or the ACL, on a topic a hook rewrote) refused `message`; `token` is what `submit` was given."""

    def hold_publishes(self, held: bool) -> None:
        """True: its lane is long, stop reading this publisher; False: read it again."""


class _Lane:
    __slots__ = ("held", "items")

    def __init__(self) -> None:
        self.items: deque[tuple[ClientInfo, Message, DurableSink | None, Any]] = deque()
        self.held = False


class PublishHooks:
    """The node's hooks and its publishers' lanes. `publish` is `Node.publish`, `drop` counts a refused message
    by reason, `spawn` runs a lane's drain as the node's background work (awaited when the node stops)."""

    def __init__(self, hooks: Sequence[GuardedHook], settings: Settings, authorizer: Authorizer,
                 publish: Callable[[Message, DurableSink | None, Any], None], drop: Callable[[str], None],
                 spawn: Callable[[Coroutine[Any, Any, None]], None]) -> None:
        self.hooks = tuple(hooks)
        self.settings = settings
        self.authorizer = authorizer
        self._publish = publish
        self._drop = drop
        self._spawn = spawn
        self._lanes: dict[Publisher, _Lane] = {}

    async def check(self, client: ClientInfo, message: Message) -> str | None:
        """Run the hooks on `message` (rewrites applied to it in place); why it is refused, or None."""
        topic = message.topic
        for hook in self.hooks:
            decision = await hook.on_publish(client, message)
            action = decision.action
            if action is Action.ALLOW:
                continue
            if action is Action.REWRITE and not self._rewrite(hook, message, decision):
                decision = hook.on_failure  # a rewrite the node cannot apply is the hook's failure
                action = decision.action
            if action is Action.DENY:
                log.info("publish.hook_denied", extra={"client_id": client.client_id, "topic": message.topic,
                                                       "hook": hook.name, "reason": decision.reason})
                self._drop(HOOK_DENIED)
                return f"denied by publish hook {hook.name}" + (f": {decision.reason}" if decision.reason else "")
        if message.topic != topic:  # rewritten (or changed in place): the ACL decides again
            why = refuse_publish(self.settings, self.authorizer, client, message.topic)
            if why is not None:
                log.info("acl.denied", extra={"client_id": client.client_id, "topic": message.topic,
                                              "access": "publish", "detail": "rewritten by a publish hook"})
                self._drop("not_authorized")
                return why
        return None

    def _rewrite(self, hook: GuardedHook, message: Message, decision: PublishDecision) -> bool:
        """Apply `decision` to `message`; False (nothing applied, counted as the hook's error) if it cannot be."""
        topic, payload, properties = decision.topic, decision.payload, decision.properties
        try:
            if topic is not None and (not isinstance(topic, str) or invalid_topic(self.settings, topic)):
                raise ValueError(f"{str(topic)[:80]!r} is not a valid topic name")
            if payload is not None and not isinstance(payload, bytes | bytearray):
                raise ValueError(f"a payload of type {type(payload).__name__}")
            block = properties.to_block() if properties is not None else None
        except Exception as exc:
            hook.guard.failed(INVALID, detail=f"rewrite: {exc}")
            return False
        if topic is not None:
            message.topic = topic
        if payload is not None:
            message.payload = bytes(payload)
        if properties is not None and block is not None:
            message.properties = block
            expiry = properties.expiry_interval
            message.expires_at_ms = message.timestamp_ms + expiry * 1000 if expiry else 0
        message.encoded = None
        return True

    def submit(self, publisher: Publisher, client: ClientInfo, message: Message, sink: DurableSink | None,
               token: Any) -> None:
        """Queue `message` behind `publisher`'s earlier publishes; `Node.publish(message, sink, token)` once the hooks
        let it through, else `publisher.publish_refused(message, token, reason)`."""
        lane = self._lanes.get(publisher)
        if lane is None:
            lane = self._lanes[publisher] = _Lane()
            lane.items.append((client, message, sink, token))
            self._spawn(self._drain(publisher, lane))
            return
        lane.items.append((client, message, sink, token))
        if not lane.held and len(lane.items) >= LANE_HOLD:
            lane.held = True
            publisher.hold_publishes(True)

    async def _drain(self, publisher: Publisher, lane: _Lane) -> None:
        items = lane.items
        try:
            while items:
                client, message, sink, token = items[0]
                try:
                    why = await self.check(client, message)
                except Exception:  # the node's own bug (hooks never raise): refuse rather than lose the lane
                    log.exception("publish.hooks_failed", extra={"client_id": client.client_id})
                    why = "internal error"
                items.popleft()
                if why is None:
                    self._publish(message, sink, token)
                else:
                    try:
                        publisher.publish_refused(message, token, why)
                    except Exception:
                        log.exception("publish.refusal_failed", extra={"client_id": client.client_id})
                if lane.held and len(items) <= LANE_HOLD // 2:
                    lane.held = False
                    publisher.hold_publishes(False)
        finally:
            if self._lanes.get(publisher) is lane:
                del self._lanes[publisher]
            if lane.held:
                publisher.hold_publishes(False)

    @property
    def waiting(self) -> int:
        """Publishes in lanes, not yet through the hooks."""
        return sum(len(lane.items) for lane in self._lanes.values())

    async def close(self) -> None:
        for hook in self.hooks:
            await hook.close()

