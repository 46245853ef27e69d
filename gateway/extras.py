"""What the optional parts need: `pip install tidewire` serves MQTT on the embedded store, and each extra
(`tidewire[redis]`, `[amqp]`, ...) brings the libraries of one part. This module knows which libraries each extra
brings, so a part that is missing says which extra to install instead of failing on an import.

A listener that is on by default (AMQP, RocketMQ, the admin port) is left off with one log line when its extra is
missing; asked for explicitly (a flag, the environment, the config file), the node refuses to start.
"""

from __future__ import annotations

import importlib.util
import sys

from tidewire.errors import MissingExtra

# extra -> the import names it brings (as in pyproject.toml's [project.optional-dependencies])
EXTRAS: dict[str, tuple[str, ...]] = {
    "redis": ("redis", "msgspec"),
    "amqp": ("pamqp",),
    "rocketmq": ("grpc", "google.protobuf"),
    "admin": ("fastapi", "uvicorn", "prometheus_client", "httpx"),
    "jwt": ("jwt", "cryptography"),
    "http-auth": ("httpx",),
    "lake": ("pyarrow", "msgspec"),
    "pipeline": ("pyspark", "pyarrow", "paho"),
}


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # the parent of a dotted name (`google` of google.protobuf) is not there
        return False


def missing(extra: str) -> list[str]:
    """The import names of `extra` that cannot be imported here."""
    return [name for name in EXTRAS[extra] if not _importable(name)]


def installed(extra: str) -> bool:
    return not missing(extra)


def require(extra: str, what: str) -> None:
    """Raise MissingExtra naming `extra` when any of its libraries is missing."""
    if lacking := missing(extra):
        raise MissingExtra(extra, what, lacking)


def require_for_command(extra: str, what: str) -> None:
    """`require` for a command line: the message on stderr and exit status 2 instead of a traceback."""
    try:
        require(extra, what)
    except MissingExtra as exc:
        print(f"tidewire: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
