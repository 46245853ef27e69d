"""Free TCP ports for the servers that benchmarks and tests start on this machine.

A port is taken below the kernel's ephemeral range (`ip_local_port_range`): client sockets get their local ports
from that range, so between the probe and the server's own bind a busy test could otherwise take the port with
an outgoing connection (seen as "address already in use" at a server's start). Ports are handed out in turn
from a start that depends on the process id, never twice in one process, and probed with SO_REUSEADDR as the
servers bind (a port held only by TIME_WAIT connections is free for them).
"""

from __future__ import annotations

import itertools
import os
import random
import socket
from pathlib import Path

LOWEST = 20_000
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


_HIGHEST = max(LOWEST + 1_000, _ephemeral_low()) - 1
_SPAN = _HIGHEST - LOWEST + 1
_turns = itertools.count(random.Random(os.getpid()).randrange(_SPAN))


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port no server listens on now, outside the ephemeral range, not handed out before by this process."""
    for _ in range(_SPAN):
        port = LOWEST + next(_turns) % _SPAN
        if _bindable(host, port):
            return port
    raise RuntimeError(f"no free port in {LOWEST}..{_HIGHEST}")


def free_port_pair(offset: int, host: str = "127.0.0.1") -> int:
    """A free port whose `port + offset` is free too, both below the ephemeral range (Redis Cluster's bus port is
    the port + 10000)."""
    if LOWEST + offset > _HIGHEST:
        raise RuntimeError(f"no port pair {offset} apart below {_HIGHEST}")
    for _ in range(_SPAN):
        port = free_port(host)
        if port + offset <= _HIGHEST and _bindable(host, port + offset):
            return port
    raise RuntimeError(f"no free port pair {offset} apart in {LOWEST}..{_HIGHEST}")
