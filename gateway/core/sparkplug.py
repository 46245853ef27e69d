"""Sparkplug Aware MQTT Server (Sparkplug 3.0, an optional server profile): the last NBIRTH of each edge node and
DBIRTH of each device kept as retained messages on the spec's derived topics, so a host application that
connects later reads every birth it missed:

    spBv1.0/<group>/NBIRTH/<edge node>           -> $sparkplug/certificates/spBv1.0/<group>/NBIRTH/<edge node>
    spBv1.0/<group>/DBIRTH/<edge node>/<device>  -> $sparkplug/certificates/spBv1.0/<group>/DBIRTH/<edge node>/<device>

Sans-IO: `certificate` makes the derived message of a publish (None for every other topic, after one prefix
check), and `Node.publish` queues it right behind the birth, so it is appended, retained (in the store: every
node serves it) and delivered to live subscribers like any message. The birth itself was authorized on its own
topic before it got here; a reader of the derived topic is checked by the ACL like for any topic, and clients
may not publish under `$sparkplug/` themselves (`gateway.core.ingress.refuse_publish`). Deaths leave the last
birth in place (the spec asks the server to keep births, not to clear them).

The core imports nothing of the lake: the two birth topic forms are checked here; `pipeline.sparkplug.topics`
parses the whole namespace for the lake.
"""

from __future__ import annotations

from tidewire.store.base import Message

PREFIX = "spBv1.0/"  # the Sparkplug B namespace
CERTIFICATES = "$sparkplug/certificates/"  # the server's own namespace: never a client's to publish in
TENANT_PREFIX = "$tenant/"  # `gateway.core.tenants.PREFIX`: the tenants' mount points


def is_birth(topic: str) -> bool:
    """`spBv1.0/<group>/NBIRTH/<edge node>` or `spBv1.0/<group>/DBIRTH/<edge node>/<device>`, no level empty."""
    levels = topic.split("/")
    kind = levels[2] if len(levels) > 2 else ""
    return (((kind == "NBIRTH" and len(levels) == 4) or (kind == "DBIRTH" and len(levels) == 5))
            and levels[0] == "spBv1.0" and all(levels))


def tenant_mount(topic: str) -> str:
    """The mount point a tenant's Sparkplug topic is under (`$tenant/<name>/spBv1.0/...`: `$tenant/<name>/`), or
    "" for any other topic: a tenant's births get their certificates under the same mount, where its clients
    (whose filters are mounted) read them."""
    if not topic.startswith(TENANT_PREFIX):
        return ""
    end = topic.find("/", len(TENANT_PREFIX)) + 1
    return topic[:end] if end and topic.startswith(PREFIX, end) else ""


def certificate(message: Message) -> Message | None:
    """The retained copy of a Sparkplug B birth on its `$sparkplug/certificates/...` topic (a tenant's under its
    mount point); None for any other message (and for an empty birth, which would clear the entry)."""
    topic = message.topic
    mount = tenant_mount(topic) if topic[:1] == "$" else ""
    if not topic.startswith(PREFIX, len(mount)) or not message.payload:
        return None
    if not is_birth(topic[len(mount):]):
        return None
    return Message(topic=mount + CERTIFICATES + topic[len(mount):], payload=message.payload, qos=message.qos,
                   retain=True, properties=message.properties, timestamp_ms=message.timestamp_ms,
                   expires_at_ms=message.expires_at_ms, protocol=message.protocol)
