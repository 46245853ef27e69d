"""`$delayed/` topics (`gateway.core.delayed`): EMQX's interval and Unix-time forms, refusals, and the stored
form's round trip."""

from __future__ import annotations

from tidewire.gateway.core.delayed import BadDelay, Delay, due_of, held_form, parse_delayed, released_form, reserved
from tidewire.store.base import Message

NOW = 1_700_000_000_000


def test_intervals_unix_times_and_refusals() -> None:
    assert parse_delayed("a/b", NOW, 100) is None
    assert parse_delayed("$delayed/15/x/y", NOW, 100) == Delay("x/y", NOW + 15_000)
    assert parse_delayed("$delayed/0/x", NOW, 100) == Delay("x", NOW)
    assert parse_delayed("$delayed/3600/$SYS/t", NOW, 4000) == Delay("$SYS/t", NOW + 3_600_000)
    at = NOW // 1000 + 50
    assert parse_delayed(f"$delayed/{at}/x", NOW, 100) == Delay("x", at * 1000)  # 4294967 and up: a Unix time
    for bad in ("$delayed/x/y", "$delayed/-1/y", "$delayed/1.5/y", "$delayed/10", "$delayed/10/", "$delayed/101/y",
                f"$delayed/{NOW // 1000 - 5}/y", "$delayed/١٢/y"):
        assert isinstance(parse_delayed(bad, NOW, 100), BadDelay), bad


def test_held_form_hides_topic_and_retain_until_released() -> None:
    message = held_form(Message("x/y", b"p", 1, True, b"", NOW, 0, "dev"), NOW + 5000)
    assert reserved(message.topic) and not message.retain
    assert due_of(message) == NOW + 5000
    out = released_form(message, NOW + 5001)
    assert out is not None
    assert (out.topic, out.payload, out.qos, out.retain, out.publisher, out.timestamp_ms) == (
        "x/y", b"p", 1, True, "dev", NOW + 5001)
    assert released_form(Message("x/y", b""), NOW) is None and due_of(Message("x", b"")) == 0
