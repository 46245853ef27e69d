"""Tidewire's test plugins, written as an operator would write them (only Tidewire's public plugin API is used).

Each misbehaves on purpose when asked to, so the tests see the node survive it:

* `make_authenticator` (tidewire.auth): `options["users"]` (name -> password) are accepted, a wrong password is
  refused as bad credentials, the user `mallory` as not authorized; the user `raiser` makes it raise, `hanger`
  makes it never answer; anyone else is ignored (the next source decides).
* `make_authorizer` (tidewire.authz): no publish under `blocked/`, no subscription under `secret/`; a topic under
  `authzraise/` makes it raise.
* `make_hook` (tidewire.publish_hooks): acts on topics under `options["prefix"]` (default: all), on what follows
  it: `rewrite/X` becomes topic `rewritten/X` with payload `R:` + payload, `sys/X` is rewritten to `$SYS/X` (which
  the ACL refuses), `deny/X` is denied, `raise/X` raises, `hang/X` never answers, `slow/X` answers after a random
  few milliseconds (the order of a client's publishes must survive that), `invalid/X` answers a string, `badtopic/X`
  rewrites to a topic with a wildcard.
* `make_sink` (tidewire.sinks): keeps what it is given (not wired into the node yet).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections.abc import Sequence
from typing import Any

from tidewire.extensions.authentication import IGNORE, AuthDecision, AuthRequest, Failure, Outcome
from tidewire.extensions.hooks import ClientInfo, SubscribeAccess
from tidewire.extensions.plugins import ALLOW, PublishDecision, SinkRefused, deny, rewrite
from tidewire.store.base import Message

FOREVER = 3600.0


class TestAuthenticator:
    name = "testauth"

    def __init__(self, users: dict[str, str]) -> None:
        self.users = users

    async def authenticate(self, request: AuthRequest) -> AuthDecision:
        user = request.username or ""
        if user == "raiser":
            raise RuntimeError("the test plugin raises for raiser")
        if user == "hanger":
            await asyncio.sleep(FOREVER)
        if user == "mallory":
            return AuthDecision(Outcome.DENY, failure=Failure.NOT_AUTHORIZED, reason="mallory is not welcome")
        if user in self.users:
            if (request.password or b"").decode(errors="replace") == self.users[user]:
                return AuthDecision(Outcome.ALLOW, username=user)
            return AuthDecision(Outcome.DENY, reason="wrong password")
        return IGNORE

    def reload(self) -> None:
        pass

    async def close(self) -> None:
        pass


class TestAuthorizer:
    def allow_publish(self, client: ClientInfo, topic: str) -> bool:
        if topic.startswith("authzraise/"):
            raise RuntimeError("the test authorizer raises")
        return not topic.startswith("blocked/")

    def subscribe_access(self, client: ClientInfo, topic_filter: str) -> SubscribeAccess:
        if topic_filter.startswith("authzraise/"):
            raise RuntimeError("the test authorizer raises")
        return SubscribeAccess.DENIED if topic_filter.startswith("secret/") else SubscribeAccess.GRANTED

    def allow_read(self, client: ClientInfo, topic: str) -> bool:
        return not topic.startswith("secret/")


class TestHook:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.rng = random.Random(7)

    async def on_publish(self, client: ClientInfo, message: Message) -> PublishDecision:
        if not message.topic.startswith(self.prefix):
            return ALLOW
        topic = message.topic[len(self.prefix):]
        verb, _, rest = topic.partition("/")
        if verb == "rewrite":
            return rewrite(topic=f"rewritten/{rest}", payload=b"R:" + message.payload)
        if verb == "sys":
            return rewrite(topic=f"$SYS/{rest}")
        if verb == "deny":
            return deny(f"{rest} is denied by the test hook")
        if verb == "raise":
            raise RuntimeError("the test hook raises")
        if verb == "hang":
            await asyncio.sleep(FOREVER)
        if verb == "slow":
            await asyncio.sleep(self.rng.random() * 0.01)
        if verb == "invalid":
            return "allow"  # type: ignore[return-value]  # on purpose: not a PublishDecision
        if verb == "badtopic":
            return rewrite(topic="bad/#")
        return ALLOW


class TestSink:
    """Appends each result as a JSON line to the file `path`; refuses (permanently) a result whose `refuse` field
    is true, and fails (to be retried) while the file `<path>.down` exists."""

    def __init__(self, path: str) -> None:
        self.path = path

    async def write(self, results: Sequence[dict[str, Any]], messages: Sequence[Message]) -> None:
        if os.path.exists(self.path + ".down"):
            raise ConnectionError("the sink is down")
        if any(result.get("refuse") for result in results):
            raise SinkRefused("refused by the test sink")
        with open(self.path, "a") as out:
            for result, message in zip(results, messages, strict=True):
                out.write(json.dumps({"result": result, "seq": message.seq}) + "\n")

    async def close(self) -> None:
        pass


def make_authenticator(options: dict[str, Any]) -> TestAuthenticator:
    users = options.get("users", {})
    if not isinstance(users, dict):
        raise ValueError("users: a table of name = password")
    return TestAuthenticator({str(k): str(v) for k, v in users.items()})


def make_authorizer(options: dict[str, Any]) -> TestAuthorizer:
    return TestAuthorizer()


def make_hook(options: dict[str, Any]) -> TestHook:
    return TestHook(str(options.get("prefix", "")))


def make_sink(options: dict[str, Any]) -> TestSink:
    return TestSink(str(options["path"]))
