"""The Sparkplug B topic namespace: `spBv1.0/<group>/<message type>/<edge node>[/<device>]`, parsed without
allocating for the topics that are not in it (a prefix check first).

Standard library only: the gateway's publish path (`gateway.core.sparkplug`) and the lake (`pipeline.sparkplug
.decode`) both use it.
"""

from __future__ import annotations

from typing import NamedTuple

NAMESPACE = "spBv1.0"
PREFIX = NAMESPACE + "/"
NBIRTH, NDEATH, DBIRTH, DDEATH = "NBIRTH", "NDEATH", "DBIRTH", "DDEATH"
NDATA, DDATA, NCMD, DCMD = "NDATA", "DDATA", "NCMD", "DCMD"
NODE_TYPES = frozenset((NBIRTH, NDEATH, NDATA, NCMD))  # topics without a device level
DEVICE_TYPES = frozenset((DBIRTH, DDEATH, DDATA, DCMD))  # topics with one
BIRTHS = frozenset((NBIRTH, DBIRTH))


class SparkplugTopic(NamedTuple):
    group: str
    message_type: str
    edge_node: str
    device: str | None  # None: a node-level message


def parse_topic(topic: str) -> SparkplugTopic | None:
    """The parts of a Sparkplug B topic; None for any other topic (STATE, another namespace, a wrong level count,
    an unknown message type or an empty id)."""
    if not topic.startswith(PREFIX):
        return None
    parts = topic.split("/")
    if len(parts) == 4:
        _, group, message_type, edge = parts
        if message_type not in NODE_TYPES:
            return None
        device = None
    elif len(parts) == 5:
        _, group, message_type, edge, device = parts
        if message_type not in DEVICE_TYPES or not device:
            return None
    else:
        return None
    if not group or not edge:
        return None
    return SparkplugTopic(group, message_type, edge, device)
