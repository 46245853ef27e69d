"""Listener configuration and admission of new connections (quotas, connect rate, pending auth, overload); the
codes each protocol answers with are checked on the wire (tests/integration/test_limits.py, test_admission.py of
AMQP)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.gateway.fakeclock import FakeClock
from tests.waiting import until
from tidewire.gateway.config import Settings
from tidewire.gateway.core.store_health import StoreHealth
from tidewire.gateway.transport.admission import Admission, AdmissionRefusal
from tidewire.gateway.transport.listeners import Listener, make_listeners
from tidewire.gateway.transport.tls import tls_context


def test_listeners_take_node_defaults_and_their_own_overrides() -> None:
    settings = Settings(port=1883, ws_port=8083, max_connections=50, max_connection_rate=10,
                        listeners={"ws": {"max_connections": 5, "max_connection_rate": 0, "proxy_protocol": True}})
    made = {listener.name: (listener, port) for listener, port in make_listeners(settings, FakeClock(mono=0.0))}
    assert set(made) == {"mqtt", "ws"}
    mqtt, ws = made["mqtt"][0], made["ws"][0]
    assert (mqtt.max_connections, mqtt.rate is not None, mqtt.proxy_protocol) == (50, True, False)
    assert (ws.max_connections, ws.rate, ws.proxy_protocol) == (5, None, True)
    assert ws.websocket and not ws.tls and made["ws"][1] == 8083


def test_certificate_user_names_only_on_tls_listeners() -> None:
    settings = Settings(port=1883, tls_port=8883, wss_port=8084, use_identity_as_username=True)
    names = {listener.name: listener.cert_username for listener, _ in make_listeners(settings, FakeClock(mono=0.0))}
    assert names == {"mqtt": None, "mqtts": "cn", "wss": "cn"}


def _refusal(admission: Admission, listener: Listener, now: float, reconnecting: bool) -> AdmissionRefusal:
    refused = admission.refusal(listener, now, reconnecting)
    assert refused is not None
    return refused


def _admitted(admission: Admission, listener: Listener, now: float, reconnecting: bool) -> None:
    assert admission.refusal(listener, now, reconnecting) is None


def test_admission_refuses_each_limit_with_its_kind() -> None:
    settings = Settings(max_connections=1, max_connection_rate=1, connection_rate_burst=2, max_pending_connects=1)
    listener = make_listeners(settings, FakeClock(mono=0.0))[0][0]
    admission = Admission(settings)
    _admitted(admission, listener, 0.0, False)
    listener.connections = 1
    assert _refusal(admission, listener, 0.0, False).kind == "busy"
    _admitted(admission, listener, 0.0, True)  # a reconnecting client takes its own place: rate token 2 of 2
    listener.connections = 0
    assert _refusal(admission, listener, 0.0, False).kind == "rate"
    _admitted(admission, listener, 1.0, False)  # a token a second
    admission.pending = 1
    assert _refusal(admission, listener, 5.0, False).kind == "busy"
    admission.pending = 0
    admission.lag_ms = settings.overload_loop_lag_ms + 1
    overloaded = _refusal(admission, listener, 5.0, False)
    assert overloaded.kind == "busy" and "overloaded" in overloaded.detail
    admission.lag_ms = 0
    _admitted(admission, listener, 6.0, True)
    admission.store = health = StoreHealth(FakeClock())
    health.report("housekeeping", ConnectionError("refused by 10.0.0.5:6379"))
    unreachable = _refusal(admission, listener, 6.5, True)  # the node can open no session: even a reconnect
    assert unreachable.kind == "unavailable" and "10.0.0.5" not in unreachable.detail  # details: /readyz only
    health.report("housekeeping", None)
    _admitted(admission, listener, 6.6, True)
    admission.draining = True  # the node stops: even a reconnecting client goes elsewhere
    assert _refusal(admission, listener, 7.0, True).kind == "stopping"


_LAG_SLOT: Any = Admission.__dict__["lag_ms"]  # the slot's descriptor, under the property below


class Sampled(Admission):
    """Admission keeping every value the lag watcher stores."""

    def __init__(self, settings: Settings) -> None:
        self.samples: list[float] = []
        super().__init__(settings)
        self.samples.clear()  # not the initial 0

    @property
    def lag_ms(self) -> float:
        return float(_LAG_SLOT.__get__(self))

    @lag_ms.setter
    def lag_ms(self, value: float) -> None:
        _LAG_SLOT.__set__(self, value)
        self.samples.append(value)


async def test_loop_lag_is_measured() -> None:
    admission = Sampled(Settings())
    watch = asyncio.create_task(admission.watch_loop_lag(interval=0.01))
    try:
        await until(lambda: len(admission.samples) >= 3, what="3 lag samples")
        assert admission.lag_ms < 50
        seen = len(admission.samples)
        time.sleep(0.2)  # the behaviour under test: block the loop, as a CPU-bound burst would
        await until(lambda: len(admission.samples) > seen, what="a lag sample after the block")
        assert admission.samples[seen] > 80
    finally:
        watch.cancel()


def test_tls_needs_a_certificate_and_a_ca_for_client_certificates(tmp_path: object) -> None:
    with pytest.raises(ValueError):
        tls_context(Settings(tls_port=8883))
    with pytest.raises(ValueError):
        tls_context(Settings(tls_port=8883, certfile="c.pem", keyfile="k.pem", require_certificate=True))
