"""Closing the loop: a threshold rule evaluated per device over the lake, each alert published once as MQTT.

A rule is `<field> <op> <number> for <duration>`, e.g. `temperature > 80 for 1 minute`: `field` is a dotted path
of the messages' `json_numbers`, op one of > >= < <= == !=. A device alerts when the condition held on
consecutive readings of that field (ordered by received time, then log position) whose first and last readings
are at least `duration` apart (gaps and islands: a reading that breaks the condition ends the island). Each alert
is published through the gateway (paho-mqtt, QoS 1, MQTT 5) and recorded in
`<lake>/_tidewire/alerts-<rule hash>.json` only after its PUBACK, keyed by (device, island start): a rerun, or
an island that keeps growing, does not publish it again. A crash between a PUBACK and the state write republishes
that one alert on the next run (at least once). The publisher's own client id starts with `tidewire-alerts`, and
such publishers are never evaluated (an alert cannot trigger alerts).

Incremental: a run looks at a window (`--since/--until`, by default from where the last run for this rule
stopped, recorded in `<lake>/_tidewire/jobs/alerts-<rule hash>.json`, to now), reading its partitions and
those of the hour (or the rule's duration, if longer) before it, so an island begun shortly before the window is
seen with its true start. An island already holding at the first reading read is taken as one an earlier run
saw, and is left out (a device whose readings before the window are further apart than that lookback could
have such an island unseen: use an explicit, earlier --since).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import ssl
import string
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from tidewire.pipeline import window as windows
from tidewire.pipeline.lake.schema import STATE_DIR
from tidewire.pipeline.spark import read_messages
from tidewire.pipeline.window import RuleError, TimeWindow, parse_duration, positive_int, write_json_atomic

OPS: dict[str, Callable[[Column, float], Column]] = {
    ">=": lambda c, x: c >= x, "<=": lambda c, x: c <= x, "==": lambda c, x: c == x,
    "!=": lambda c, x: c != x, ">": lambda c, x: c > x, "<": lambda c, x: c < x,
}
MAX_RULE_CHARS = 1000
DEFAULT_TOPIC = "alerts/{client_id}"
TOPIC_FIELDS = frozenset({"client_id", "field"})
ALERT_CLIENT_PREFIX = "tidewire-alerts"
DEFAULT_MQTT_URL = "mqtt://127.0.0.1:1883"
MQTT_URL_ENV = "TIDEWIRE_MQTT_URL"
ALERTS = "alerts"
DEFAULT_LOOKBACK_MS = 3_600_000  # at least: the rule's duration if longer
DEFAULT_MAX_ALERTS = 1000  # alerts published per run; the rest wait for the next run
ACK_TIMEOUT = 10.0  # s for a CONNACK or a PUBACK
STATE_VERSION = 1

_RULE = re.compile(r"^\s*(?P<field>[^\s<>=!]+)\s*(?P<op>>=|<=|==|!=|>|<)\s*"
                   r"(?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s+for\s+(?P<duration>.+?)\s*$",
                   re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Rule:
    field: str
    op: str
    threshold: float
    duration: timedelta

    @property
    def canonical(self) -> str:
        return f"{self.field} {self.op} {self.threshold!r} for {self.duration.total_seconds():g}s"

    @property
    def digest(self) -> str:
        """Names the rule's state file: the same rule however it was spelled."""
        return hashlib.sha256(self.canonical.encode()).hexdigest()[:16]

    @property
    def duration_ms(self) -> int:
        return round(self.duration.total_seconds() * 1000)


def parse_rule(text: str) -> Rule:
    if len(text) > MAX_RULE_CHARS:
        raise RuleError(f"rule longer than {MAX_RULE_CHARS} characters")
    m = _RULE.match(text)
    if m is None:
        raise RuleError(f"bad rule {text!r}: expected '<field> <op> <number> for <duration>' with op one of "
                        f"{' '.join(sorted(OPS))}, e.g. 'temperature > 80 for 1 minute'")
    threshold = float(m.group("number"))
    if threshold != threshold or threshold in (float("inf"), float("-inf")):
        raise RuleError(f"bad threshold {m.group('number')!r}")
    return Rule(m.group("field"), m.group("op"), threshold, parse_duration(m.group("duration")))


def check_topic_template(template: str) -> str:
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as e:
        raise RuleError(f"bad topic template {template!r}: {e}") from None
    if names - TOPIC_FIELDS:
        raise RuleError(f"topic template {template!r} uses {sorted(names - TOPIC_FIELDS)}; only "
                        f"{{client_id}} and {{field}} exist")
    if not template or "+" in template or "#" in template or "\0" in template:
        raise RuleError(f"topic template {template!r} is not a topic name (empty, or with + # or NUL)")
    return template


def alert_topic(template: str, client_id: str, field_path: str) -> str:
    """The topic of one alert: wildcards and NUL in the substituted values become `_` so it stays a topic name."""
    def clean(s: str) -> str:
        return s.replace("+", "_").replace("#", "_").replace("\0", "_")

    return template.format(client_id=clean(client_id), field=clean(field_path))


# -- detection (Spark) ---------------------------------------------------------------------------------------

def lookback_ms(rule: Rule) -> int:
    """How far before a window the readings are read: an island that began up to this long before the window is
    seen whole."""
    return max(rule.duration_ms, DEFAULT_LOOKBACK_MS)


def detect(spark: SparkSession, lake: str, rule: Rule, w: TimeWindow | None = None) -> DataFrame:
    """Every island of the rule's condition per device that lasts >= the rule's duration:
    (client_id, field, start_ms, end_ms, count, min, max). With a window: the islands with a reading in it,
    read from `lookback_ms(rule)` before it; an island already holding at the first reading read (its start is
    not in what was read) belongs to an earlier run and is left out."""
    value = F.try_element_at(F.col("json_numbers"), F.lit(rule.field))
    read = None if w is None else w.widened(lookback_ms(rule))
    since, until = (None, None) if read is None else (read.since_ms, read.until_ms)
    readings = (read_messages(spark, lake, since, until)
                .select("client_id", F.unix_millis("received_at").alias("t"), "position", value.alias("value"))
                .where(F.col("value").isNotNull() & ~F.col("client_id").startswith(ALERT_CLIENT_PREFIX)))
    holds = OPS[rule.op](F.col("value"), rule.threshold)
    upto = Window.partitionBy("client_id").orderBy("t", "position").rowsBetween(Window.unboundedPreceding, 0)
    islands = (readings.withColumn("holds", holds)
               .withColumn("island", F.sum(F.when(F.col("holds"), 0).otherwise(1)).over(upto))
               .where(F.col("holds"))
               .groupBy("client_id", "island")
               .agg(F.min("t").alias("start_ms"), F.max("t").alias("end_ms"), F.count("*").alias("count"),
                    F.min("value").alias("min"), F.max("value").alias("max")))
    if w is not None and w.since_ms is not None:
        # island 0 begins at a device's first reading read: cut off, its true start lies before the lookback
        islands = islands.where((F.col("island") > 0) & (F.col("end_ms") >= w.since_ms))
    return (islands.where(F.col("end_ms") - F.col("start_ms") >= rule.duration_ms)
            .select("client_id", F.lit(rule.field).alias("field"), "start_ms", "end_ms", "count", "min", "max"))


@dataclass(frozen=True, slots=True)
class Alert:
    client_id: str
    field: str
    start_ms: int
    end_ms: int
    count: int
    min: float
    max: float

    @property
    def key(self) -> tuple[str, int]:
        return (self.client_id, self.start_ms)

    def payload(self, rule: Rule) -> bytes:
        def iso(ms: int) -> str:
            return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")

        return json.dumps({"alert": {
            "rule": rule.canonical, "client_id": self.client_id, "field": self.field, "op": rule.op,
            "threshold": rule.threshold, "duration_s": rule.duration.total_seconds(), "start": iso(self.start_ms),
            "end": iso(self.end_ms), "count": self.count, "min": self.min, "max": self.max}}).encode()


def new_alerts(spark: SparkSession, lake: str, rule: Rule, published: Iterable[tuple[str, int]],
               limit: int, w: TimeWindow | None = None) -> list[Alert]:
    """The oldest `limit` alerts not yet published."""
    found = detect(spark, lake, rule, w)
    done = list(published)
    if done:
        seen = spark.createDataFrame(done, "client_id string, start_ms long")
        found = found.join(seen, ["client_id", "start_ms"], "left_anti")
    rows = found.orderBy("start_ms", "client_id").limit(limit).collect()
    return [Alert(r["client_id"], r["field"], r["start_ms"], r["end_ms"], r["count"], r["min"], r["max"])
            for r in rows]


# -- the published set ---------------------------------------------------------------------------------------

def state_path(lake: str, rule: Rule) -> Path:
    """The published-alerts file: a local file, so a lake given as a URI needs an explicit `state`."""
    if "://" in lake:
        raise RuleError("the lake is not a local directory: give the alert state file (--state) explicitly")
    return Path(lake) / STATE_DIR / f"alerts-{rule.digest}.json"


def load_published(path: Path) -> set[tuple[str, int]]:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return set()
    except (OSError, ValueError) as e:
        # Starting over would republish every alert: refuse instead.
        raise RuleError(f"unreadable alert state {path}: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("published"), list):
        raise RuleError(f"unreadable alert state {path}: no 'published' list")
    return {(str(c), int(s)) for c, s in doc["published"]}


def save_published(path: Path, rule: Rule, published: set[tuple[str, int]]) -> None:
    write_json_atomic(path, {"version": STATE_VERSION, "rule": rule.canonical, "published": sorted(published)})


# -- publishing (paho-mqtt) ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class MqttTarget:
    host: str
    port: int
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False
    ca_file: str | None = None

    def redacted(self) -> str:
        """The address for log lines: never the password."""
        user = f"{self.username}:***@" if self.password is not None else (f"{self.username}@" if self.username else "")
        return f"{'mqtts' if self.tls else 'mqtt'}://{user}{self.host}:{self.port}"


def parse_mqtt_url(url: str) -> MqttTarget:
    """`mqtt://[user[:pass]@]host[:port]` or `mqtts://...[?ca=/path/ca.pem]`; errors never echo the URL (it
    may hold a password)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise RuleError("bad gateway URL: expected mqtt://user:pass@host:port") from None
    if parts.scheme not in ("mqtt", "mqtts", "tcp", "ssl") or not parts.hostname:
        raise RuleError("bad gateway URL: expected mqtt://user:pass@host:port (or mqtts://)")
    tls = parts.scheme in ("mqtts", "ssl")
    ca = parse_qs(parts.query).get("ca", [None])[0]
    return MqttTarget(parts.hostname, port or (8883 if tls else 1883),
                      None if parts.username is None else unquote(parts.username),
                      None if parts.password is None else unquote(parts.password), tls, ca)


class PublishError(RuntimeError):
    pass


class Publisher:
    """One MQTT 5 connection driven from the calling thread (no network thread): publish, then pump the socket
    until the PUBACK; nothing is sent until the previous alert was acknowledged."""

    def __init__(self, target: MqttTarget, client_id: str, timeout: float = ACK_TIMEOUT) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        self.target = target
        self.timeout = timeout
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        if target.username is not None:
            self.client.username_pw_set(target.username, target.password)
        if target.tls:
            self.client.tls_set_context(ssl.create_default_context(cafile=target.ca_file))
        self.connack: int | None = None
        self.disconnected: int | None = None
        self.acks: dict[int, int] = {}
        self.client.on_connect = self._on_connect
        self.client.on_publish = self._on_publish
        self.client.on_disconnect = self._on_disconnect

    def _on_connect(self, client: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        self.connack = int(rc.value)

    def _on_publish(self, client: Any, userdata: Any, mid: int, rc: Any, props: Any) -> None:
        self.acks[mid] = int(rc.value)

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        self.disconnected = int(rc.value)

    def _pump(self, done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.timeout
        while not done():
            if self.disconnected is not None:
                raise PublishError(f"{self.target.redacted()} closed the connection (0x{self.disconnected:02x}) "
                                   f"waiting for {what}")
            if time.monotonic() > deadline:
                raise PublishError(f"no {what} from {self.target.redacted()} within {self.timeout:g}s")
            self.client.loop(0.05)

    def connect(self) -> None:
        try:
            self.client.connect(self.target.host, self.target.port, keepalive=60)
        except (OSError, ValueError) as e:
            raise PublishError(f"cannot connect to {self.target.redacted()}: {type(e).__name__}: {e}") from None
        self._pump(lambda: self.connack is not None, "CONNACK")
        if self.connack:
            raise PublishError(f"{self.target.redacted()} refused the connection (CONNACK 0x{self.connack:02x})")

    def publish(self, topic: str, payload: bytes) -> None:
        info = self.client.publish(topic, payload, qos=1)
        if info.rc != 0:
            raise PublishError(f"cannot publish to {topic!r}: paho error {info.rc}")
        self._pump(lambda: info.mid in self.acks, "PUBACK")
        rc = self.acks.pop(info.mid)
        if rc >= 0x80:
            raise PublishError(f"{self.target.redacted()} refused the alert on {topic!r} (PUBACK 0x{rc:02x})")

    def close(self) -> None:
        """DISCONNECT (when still connected) and wait, bounded, for paho to close the socket."""
        if self.client.socket() is None:
            return
        self.client.disconnect()
        deadline = time.monotonic() + 1.0
        while self.client.socket() is not None and time.monotonic() < deadline:
            self.client.loop(0.05)


@dataclass(slots=True)
class AlertsRun:
    found: int = 0  # new alerts this run (at most max_alerts)
    published: list[Alert] = field(default_factory=list)
    already: int = 0  # alerts published by earlier runs
    error: str | None = None


def run(spark: SparkSession, lake: str, rule: Rule, *, target: MqttTarget | None = None,
        topic: str = DEFAULT_TOPIC, client_id: str | None = None, max_alerts: int = DEFAULT_MAX_ALERTS,
        state: Path | None = None, dry_run: bool = False, w: TimeWindow | None = None) -> AlertsRun:
    """Detect and publish the rule's new alerts; a publishing failure ends the run with `error` set (what was
    acknowledged before it stays recorded)."""
    check_topic_template(topic)
    path = state or state_path(lake, rule)
    published = load_published(path)
    result = AlertsRun(already=len(published))
    alerts = new_alerts(spark, lake, rule, published, max_alerts, w)
    result.found = len(alerts)
    if dry_run or not alerts:
        return result
    pub = Publisher(target or parse_mqtt_url(DEFAULT_MQTT_URL), client_id or f"{ALERT_CLIENT_PREFIX}-{rule.digest[:8]}")
    try:
        pub.connect()
        for alert in alerts:
            pub.publish(alert_topic(topic, alert.client_id, alert.field), alert.payload(rule))
            published.add(alert.key)
            save_published(path, rule, published)
            result.published.append(alert)
    except PublishError as e:
        result.error = str(e)
    finally:
        pub.close()
    return result


# -- command line --------------------------------------------------------------------------------------------

def _rule_arg(text: str) -> Rule:
    try:
        return parse_rule(text)
    except RuleError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _topic_arg(text: str) -> str:
    try:
        return check_topic_template(text)
    except RuleError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rule", required=True, type=_rule_arg,
                        help="'<field> <op> <number> for <duration>', e.g. 'temperature > 80 for 1 minute'")
    parser.add_argument("--mqtt", default=None,
                        help=f"the gateway: mqtt://user:pass@host:port (default ${MQTT_URL_ENV} or {DEFAULT_MQTT_URL})")
    parser.add_argument("--topic", type=_topic_arg, default=DEFAULT_TOPIC,
                        help=f"alert topic template with {{client_id}} and {{field}} (default {DEFAULT_TOPIC})")
    parser.add_argument("--client-id", default=None, help=f"the publisher's client id (starts {ALERT_CLIENT_PREFIX})")
    parser.add_argument("--max-alerts", type=positive_int, default=DEFAULT_MAX_ALERTS, help="alerts published per run")
    parser.add_argument("--state", type=Path, default=None,
                        help="the published-alerts file (default <lake>/_tidewire/alerts-<rule hash>.json)")
    parser.add_argument("--dry-run", action="store_true", help="detect and print, publish nothing")
    windows.add_arguments(parser)


def main_job(spark: SparkSession, lake: str, args: argparse.Namespace) -> int:
    try:
        target = parse_mqtt_url(args.mqtt or os.environ.get(MQTT_URL_ENV) or DEFAULT_MQTT_URL)
        job = f"{ALERTS}-{args.rule.digest}"
        w = windows.resolve(lake, job, args.since, args.until, int(time.time() * 1000))
        res = run(spark, lake, args.rule, target=target, topic=args.topic, client_id=args.client_id,
                  max_alerts=args.max_alerts, state=args.state, dry_run=args.dry_run, w=w)
    except RuleError as e:
        print(f"alerts: {e}", file=sys.stderr)
        return 2
    print(f"alerts: rule {args.rule.canonical!r}: {res.found} new, {len(res.published)} published to "
          f"{target.redacted()}, {res.already} published before")
    for a in res.published:
        print(f"  {a.client_id} {a.field}: {a.count} readings, min {a.min:g}, max {a.max:g}")
    if res.error is not None:
        print(f"alerts: {res.error}", file=sys.stderr)
        return 1
    # Only when every new alert of the window was published (not cut by --max-alerts): the next run goes on.
    if not args.dry_run and res.found < args.max_alerts and "://" not in lake:
        windows.save_until(windows.checkpoint_path(lake, job), w.until_ms)
    return 0
