"""Tests for extensions.http_auth against a real local HTTP server (ThreadingHTTPServer in a thread)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from loadtest.ports import free_port
from tests.waiting import until
from tidewire.extensions.authentication import AuthDecision, AuthRequest, Failure, Outcome
from tidewire.extensions.hooks import ClientInfo, SubscribeAccess
from tidewire.extensions.http_auth import HttpAuthenticator
from tidewire.gateway.config import Settings

PASSWORD = "s3cr3t-Pa55word-xyzzy"
Answer = Callable[[dict[str, Any]], tuple[int, bytes]]


def allow(**extra: Any) -> Answer:
    return json_answer({"result": "allow", **extra})


def json_answer(obj: Any, status: int = 200) -> Answer:
    payload = json.dumps(obj).encode()
    return lambda _body: (status, payload)


def status_answer(status: int, payload: bytes = b"") -> Answer:
    return lambda _body: (status, payload)


class HookServer:
    """The auth service: records each request, answers with `answer` after `delay` seconds."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.client_ports: list[int] = []
        self.answer: Answer = allow()
        self.delay = 0.0
        self.release = threading.Event()  # set at teardown so sleeping handlers return at once
        self._lock = threading.Lock()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, so the client's pool is exercised
            disable_nagle_algorithm = True  # headers and body are written separately

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                with hook._lock:
                    hook.requests.append(body)
                    hook.headers.append({k.lower(): v for k, v in self.headers.items()})
                    hook.client_ports.append(self.client_address[1])
                if hook.delay:
                    hook.release.wait(hook.delay)
                status, payload = hook.answer(body)
                self.send_response(status)
                if status != 204:
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(payload)))
                self.end_headers()
                if status != 204:
                    self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = False  # server_close joins handler threads: nothing leaks

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that timed out closed its end; the late write fails, as expected

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/auth"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05})
        self.thread.start()

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
        assert not self.thread.is_alive()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def hook() -> Iterator[HookServer]:
    server = HookServer()
    yield server
    server.stop()


@pytest.fixture
async def make(hook: HookServer) -> AsyncIterator[Callable[..., HttpAuthenticator]]:
    made: list[HttpAuthenticator] = []

    def factory(url: str | None = None, **kwargs: Any) -> HttpAuthenticator:
        auth = HttpAuthenticator(url or hook.url, **kwargs)
        made.append(auth)
        return auth

    yield factory
    for auth in made:
        await auth.close()  # closes pooled connections before the server joins its handler threads


def request(client_id: str = "dev1", username: str | None = "alice", password: bytes | None = PASSWORD.encode(),
            **kwargs: Any) -> AuthRequest:
    return AuthRequest(client_id, username, password, **kwargs)


def closed_port() -> int:
    return free_port()


async def test_request_body_headers_and_pool(hook: HookServer, make: Callable[..., HttpAuthenticator]) -> None:
    auth = make(headers={"Authorization": "Bearer hook-token"})
    req = request(peer="[2001:db8::1]:51234", protocol="mqtt", listener="mqtts",
                  cert_subject="CN=dev1,O=Acme", cert_common_name="dev1")
    assert (await auth.authenticate(req)).outcome is Outcome.ALLOW
    assert hook.requests == [{
        "clientid": "dev1", "username": "alice", "password": PASSWORD, "peerhost": "2001:db8::1",
        "peerport": 51234, "protocol": "mqtt", "listener": "mqtts", "cert_subject": "CN=dev1,O=Acme",
        "cert_common_name": "dev1",
    }]
    assert hook.headers[0]["authorization"] == "Bearer hook-token"
    assert hook.headers[0]["content-type"] == "application/json"
    await auth.authenticate(request(client_id="dev2", peer="10.0.0.7:1883", username=None, password=None))
    second = hook.requests[1]
    assert (second["username"], second["password"], second["peerhost"], second["peerport"]) == (
        None, None, "10.0.0.7", 1883)
    assert "password_encoding" not in second
    assert hook.client_ports[0] == hook.client_ports[1]  # the second call reused the pooled connection


async def test_non_utf8_password_is_base64(hook: HookServer, make: Callable[..., HttpAuthenticator]) -> None:
    raw = b"\xff\xfe" + PASSWORD.encode()
    await make().authenticate(request(password=raw))
    assert hook.requests[0]["password"] == base64.b64encode(raw).decode()
    assert hook.requests[0]["password_encoding"] == "base64"


@pytest.mark.parametrize(("answer", "outcome", "failure"), [
    (allow(), Outcome.ALLOW, None),
    (json_answer({"result": "deny"}), Outcome.DENY, Failure.NOT_AUTHORIZED),
    (json_answer({"result": "ignore"}), Outcome.IGNORE, None),
    (status_answer(204), Outcome.ALLOW, None),
    (status_answer(401), Outcome.DENY, Failure.BAD_CREDENTIALS),
    (status_answer(403), Outcome.DENY, Failure.NOT_AUTHORIZED),
])
async def test_answers(hook: HookServer, make: Callable[..., HttpAuthenticator], answer: Answer,
                       outcome: Outcome, failure: Failure | None) -> None:
    hook.answer = answer
    decision = await make().authenticate(request())
    assert decision.outcome is outcome
    if failure is not None:
        assert decision.failure is failure
    if outcome is Outcome.ALLOW:
        assert (decision.username, decision.superuser, decision.acl, decision.expires_at) == (None, False, None, None)


async def test_superuser_identity_and_expiry(hook: HookServer, make: Callable[..., HttpAuthenticator]) -> None:
    exp = int(time.time()) + 3600
    hook.answer = allow(is_superuser=True, username="alice@tenant", expire_at=exp)
    decision = await make().authenticate(request())
    assert decision == AuthDecision(Outcome.ALLOW, username="alice@tenant", superuser=True, expires_at=float(exp))


async def test_tenant(hook: HookServer, make: Callable[..., HttpAuthenticator]) -> None:
    hook.answer = allow(tenant="acme")
    decision = await make().authenticate(request())
    assert (decision.outcome, decision.tenant) == (Outcome.ALLOW, "acme")


async def test_allow_already_expired_is_deny(hook: HookServer, make: Callable[..., HttpAuthenticator]) -> None:
    hook.answer = allow(expire_at=int(time.time()) - 10)
    decision = await make().authenticate(request())
    assert (decision.outcome, decision.failure) == (Outcome.DENY, Failure.BAD_CREDENTIALS)


async def test_acl_rule_list(hook: HookServer, make: Callable[..., HttpAuthenticator]) -> None:
    hook.answer = allow(acl=[
        {"permission": "allow", "action": "publish", "topic": "up/${clientid}/#"},
        {"permission": "allow", "action": "subscribe", "topic": "down/${username}/+"},
        {"permission": "allow", "action": "all", "topics": ["shared/#"]},
    ])
    acl = (await make().authenticate(request())).acl
    assert acl is not None
    me = ClientInfo("dev1", "alice")
    assert acl.allow_publish(me, "up/dev1/temp")
    assert not acl.allow_publish(me, "up/dev2/temp")
    assert not acl.allow_publish(me, "down/alice/cmd")  # subscribe-only
    assert acl.subscribe_access(me, "down/alice/+") is SubscribeAccess.GRANTED
    assert acl.subscribe_access(me, "down/bob/+") is SubscribeAccess.DENIED
    assert acl.subscribe_access(me, "up/dev1/#") is SubscribeAccess.DENIED  # publish-only
    assert acl.subscribe_access(me, "#") is SubscribeAccess.FILTERED
    assert acl.allow_read(me, "down/alice/cmd") and acl.allow_read(me, "shared/x")
    assert not acl.allow_read(me, "other")
    assert acl.allow_publish(me, "shared/a/b")


async def test_acl_deny_wins_and_is_total(hook: HookServer, make: Callable[..., HttpAuthenticator]) -> None:
    hook.answer = allow(acl=[
        {"permission": "allow", "action": "all", "topic": "#"},
        {"permission": "deny", "action": "publish", "topic": "secret/#", "qos": [2]},
    ])
    acl = (await make().authenticate(request())).acl
    assert acl is not None
    me = ClientInfo("dev1", "alice")
    assert acl.allow_publish(me, "public/x")
    assert not acl.allow_publish(me, "secret/x")
    assert not acl.allow_read(me, "secret/x")  # a deny refuses every action on its topics
    # The "#" grant overlaps it, so the subscription is filtered and every delivery refused by allow_read.
    assert acl.subscribe_access(me, "secret/#") is SubscribeAccess.FILTERED
    assert acl.subscribe_access(me, "#") is SubscribeAccess.FILTERED


async def test_acl_pub_sub_form(hook: HookServer, make: Callable[..., HttpAuthenticator]) -> None:
    hook.answer = allow(acl={"pub": ["t/%c"], "sub": ["cmd/#"], "all": ["both"]})
    acl = (await make().authenticate(request())).acl
    assert acl is not None
    me = ClientInfo("dev1", "alice")
    assert acl.allow_publish(me, "t/dev1") and not acl.allow_publish(me, "t/dev2")
    assert not acl.allow_publish(me, "cmd/x") and acl.allow_read(me, "cmd/x")
    assert acl.allow_publish(me, "both") and acl.allow_read(me, "both")
    assert acl.subscribe_access(me, "t/dev1") is SubscribeAccess.DENIED


@pytest.mark.parametrize("answer", [
    status_answer(200, b"not json"),
    status_answer(200, b"[1, 2]"),
    json_answer({"result": "maybe"}),
    json_answer({}),
    json_answer({"result": "allow", "is_superuser": "true"}),
    json_answer({"result": "allow", "username": ""}),
    json_answer({"result": "allow", "expire_at": "soon"}),
    json_answer({"result": "allow", "tenant": 7}),
    json_answer({"result": "allow", "acl": "all"}),
    json_answer({"result": "allow", "acl": [{"permission": "allow", "action": "fly", "topic": "t"}]}),
    json_answer({"result": "allow", "acl": [{"permission": "allow", "action": "publish", "topic": "a/#/b"}]}),
    json_answer({"result": "allow", "acl": [{"permission": "allow", "action": "publish", "topic": "t", "qos": 1}]}),
    json_answer({"result": "allow", "acl": {"pub": ["t"], "admin": ["#"]}}),
    status_answer(200, b'{"result": "allow", "pad": "' + b"x" * 70_000 + b'"}'),
    status_answer(500, b"{}"),
    status_answer(404, b"{}"),
    status_answer(302, b""),
])
async def test_malformed_or_failed_answer_is_service_error(
    hook: HookServer, make: Callable[..., HttpAuthenticator], answer: Answer
) -> None:
    hook.answer = answer
    decision = await make().authenticate(request())
    assert (decision.outcome, decision.failure) == (Outcome.DENY, Failure.UNAVAILABLE)
    assert len(hook.requests) == 1


@pytest.mark.parametrize(("on_error", "outcome"), [("deny", Outcome.DENY), ("ignore", Outcome.IGNORE)])
async def test_timeout(hook: HookServer, make: Callable[..., HttpAuthenticator], on_error: str,
                       outcome: Outcome) -> None:
    hook.delay = 2.0
    started = time.monotonic()
    decision = await make(timeout=0.2, on_error=on_error).authenticate(request())
    assert time.monotonic() - started < 1.5
    assert decision.outcome is outcome
    if outcome is Outcome.DENY:
        assert decision.failure is Failure.UNAVAILABLE


async def test_server_down_is_deny(make: Callable[..., HttpAuthenticator]) -> None:
    decision = await make(f"http://127.0.0.1:{closed_port()}/auth", timeout=1.0).authenticate(request())
    assert (decision.outcome, decision.failure) == (Outcome.DENY, Failure.UNAVAILABLE)


async def test_cache_hit_then_expiry(hook: HookServer, make: Callable[..., HttpAuthenticator]) -> None:
    clock = FakeClock()
    auth = make(cache_ttl=30, clock=clock)
    hook.answer = json_answer({"result": "deny"})
    assert (await auth.authenticate(request(peer="127.0.0.1:39999"))).outcome is Outcome.DENY
    hook.answer = allow()
    clock.now += 29
    assert (await auth.authenticate(request(peer="127.0.0.1:40000"))).outcome is Outcome.DENY  # port not in key
    assert len(hook.requests) == 1
    clock.now += 2
    assert (await auth.authenticate(request())).outcome is Outcome.ALLOW
    assert len(hook.requests) == 2


async def test_cache_key_covers_credentials(hook: HookServer, make: Callable[..., HttpAuthenticator]) -> None:
    auth = make(cache_ttl=60)
    assert (await auth.authenticate(request())).outcome is Outcome.ALLOW
    hook.answer = status_answer(401)
    for other in (request(password=b"wrong"), request(username="bob"), request(client_id="dev9"),
                  request(listener="ws"), request(cert_subject="CN=x"), request(peer="10.9.9.9:1")):
        assert (await auth.authenticate(other)).outcome is Outcome.DENY
    assert len(hook.requests) == 7


async def test_cache_is_bounded(hook: HookServer, make: Callable[..., HttpAuthenticator]) -> None:
    auth = make(cache_ttl=60, cache_size=2)
    for client_id in ("a", "b", "c", "a"):
        await auth.authenticate(request(client_id=client_id))
    assert len(hook.requests) == 4  # "a" was evicted by "c"


async def test_cache_off(hook: HookServer, make: Callable[..., HttpAuthenticator]) -> None:
    auth = make(cache_ttl=0)
    await auth.authenticate(request())
    await auth.authenticate(request())
    assert len(hook.requests) == 2


async def test_errors_not_cached(hook: HookServer, make: Callable[..., HttpAuthenticator]) -> None:
    auth = make(cache_ttl=60)
    hook.answer = status_answer(500)
    assert (await auth.authenticate(request())).failure is Failure.UNAVAILABLE
    hook.answer = allow()
    assert (await auth.authenticate(request())).outcome is Outcome.ALLOW
    assert len(hook.requests) == 2


async def test_single_flight(hook: HookServer, make: Callable[..., HttpAuthenticator]) -> None:
    auth = make(cache_ttl=0)
    hook.delay = 0.2
    decisions = await asyncio.gather(*(auth.authenticate(request()) for _ in range(10)))
    assert [d.outcome for d in decisions] == [Outcome.ALLOW] * 10
    assert len(hook.requests) == 1
    await auth.authenticate(request())  # the flight is over: a new call asks again (cache off)
    assert len(hook.requests) == 2


async def test_cancelled_caller_does_not_cancel_the_shared_call(
    hook: HookServer, make: Callable[..., HttpAuthenticator]
) -> None:
    auth = make(cache_ttl=0)
    hook.delay = 0.2
    first = asyncio.create_task(auth.authenticate(request()))
    await until(lambda: hook.requests, what="the first caller's call at the service")
    second = asyncio.create_task(auth.authenticate(request()))
    await asyncio.sleep(0)  # one turn: the second caller joins the call in flight
    first.cancel()
    assert (await second).outcome is Outcome.ALLOW
    assert first.cancelled()
    assert len(hook.requests) == 1


async def test_close_answers_in_flight_and_later_calls(
    hook: HookServer, make: Callable[..., HttpAuthenticator]
) -> None:
    auth = make(on_error="deny")
    hook.delay = 2.0
    waiting = asyncio.create_task(auth.authenticate(request()))
    await until(lambda: hook.requests, what="the call at the service")
    await auth.close()
    assert (await waiting).failure is Failure.UNAVAILABLE
    after = await auth.authenticate(request())
    assert (after.outcome, after.failure) == (Outcome.DENY, Failure.UNAVAILABLE)
    assert len(hook.requests) == 1
    auth.reload()  # no-op


async def test_password_never_logged_and_failures_rate_limited(
    hook: HookServer, make: Callable[..., HttpAuthenticator], caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    port = closed_port()
    down = make(f"http://user:{PASSWORD}@127.0.0.1:{port}/auth?token={PASSWORD}", timeout=1.0,
                clock=clock, error_log_interval=10)
    tidewire = logging.getLogger("tidewire")
    propagate = tidewire.propagate
    tidewire.propagate = True  # gateway.ops.logs.setup_logging (another test) may have turned it off
    try:
        with caplog.at_level(logging.DEBUG):
            reasons = [(await down.authenticate(request(client_id=f"c{i}"))).reason for i in range(20)]
            clock.now += 11
            reasons.append((await down.authenticate(request(client_id="late"))).reason)
            hook.answer = json_answer({"result": "allow", "acl": [{"topic": PASSWORD}]})
            reasons.append((await make(clock=clock).authenticate(request())).reason)
    finally:
        tidewire.propagate = propagate
    failures = [r for r in caplog.records if r.getMessage() == "auth.http_unavailable"]
    assert [getattr(r, "suppressed", None) for r in failures] == [0, 19, 0]
    assert [getattr(r, "error", None) for r in failures][:2] == ["connect failed", "connect failed"]
    assert getattr(failures[0], "service", None) == f"http://127.0.0.1:{port}/auth"
    assert caplog.records  # httpx debug lines were captured too
    for record in caplog.records:
        text = record.getMessage() + repr(vars(record)) + caplog.text
        assert PASSWORD not in text
    assert all(r and PASSWORD not in r for r in reasons)


def test_from_settings() -> None:
    assert HttpAuthenticator.from_settings(Settings()) is None
    auth = HttpAuthenticator.from_settings(Settings(
        http_auth_url="http://127.0.0.1:9/auth", http_auth_timeout=1.5, http_auth_cache_ttl=0,
        http_auth_on_error="ignore", http_auth_headers={"X-Key": "k"}, http_auth_max_connections=4))
    assert auth is not None
    assert (auth.name, auth._timeout, auth._cache_ttl, auth._on_error) == ("http", 1.5, 0, "ignore")
    assert auth._client.headers["x-key"] == "k"
    asyncio.run(auth.close())
    with pytest.raises(ValueError):
        HttpAuthenticator("ftp://example.com/auth")
    with pytest.raises(ValueError):
        HttpAuthenticator("http://example.com/auth", on_error="allow")  # type: ignore[arg-type]
