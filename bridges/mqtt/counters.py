"""What an MQTT bridge counts (its status, $SYS, /metrics)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class BridgeCounters:
    sent: int = 0  # publishes written to the remote (resends included)
    acked: int = 0  # settled after the remote's acknowledgement
    refused_by_remote: int = 0  # acknowledged with an MQTT 5 error code, or too large for it: settled, not retried
    redelivered: int = 0  # claims sent again after a restart, a takeover or a lapse: possible duplicates
    received: int = 0  # publishes from the remote
    stored: int = 0  # of those, durable here
    denied: int = 0  # refused by the ACL (or an invalid topic) for the bridge's local identity
    connects: int = 0
    failures: int = 0  # connection attempts or links that failed
