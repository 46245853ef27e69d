"""The hot path that the build compiles with mypyc when a C compiler is present, and which of the two runs.

The modules below are plain typed Python. `setup.py` compiles them into C extensions beside their sources
(`tidewire/compiled__mypyc*.so` holds the code, one small shim per module) and writes `compiled.stamp`, the
digest of the sources it compiled. `tidewire/__init__.py` calls `choose_implementation()` before anything else
of Tidewire is imported; the sources run instead of the extensions when
- `TIDEWIRE_PURE_PYTHON=1` (tests of the fallback; profiling with py-spy, which cannot see inside compiled code),
- or the stamp is missing or no longer matches the sources: an edited checkout never runs a stale build.
Child processes inherit the choice through the environment.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType

# Each earns its place by what compiling it buys, measured (loadtest.compile_bench in process; loadtest.conn_bench
# --targets tidewire,tidewire-py end to end, builds with and without it): the codec parses 2.7x and encodes 1.5x
# faster, topic matching runs 2.2x faster, and with dispatch and the queue cache QoS 1 fan-in gains ~13%. Left out
# because they made a real connect slower, not faster (+5 to +12 µs of broker CPU per connect, over three builds):
# the MQTT channel and handshake, sessions and the deadline wheel, whose objects the interpreted node and registry
# handle at every connect (each crossing boxes and checks what plain Python would pass as is).
MODULES: tuple[str, ...] = (
    "tidewire.gateway.protocols.mqtt.codec.errors",
    "tidewire.gateway.protocols.mqtt.codec.primitives",
    "tidewire.gateway.protocols.mqtt.codec.properties",
    "tidewire.gateway.protocols.mqtt.codec.packets",
    "tidewire.gateway.protocols.mqtt.codec.parser",
    "tidewire.gateway.protocols.mqtt.codec.encoder",
    "tidewire.gateway.core.topics",
    "tidewire.gateway.core.dispatch",
    "tidewire.cache.queue_cache",
)
GROUP = "tidewire.compiled"  # the shared library: tidewire/compiled__mypyc.*.so
PURE_ENV = "TIDEWIRE_PURE_PYTHON"
STAMP = "compiled.stamp"  # beside this file: the digest of the sources the extensions were built from


def module_path(name: str) -> str:
    """The source file of `name`, relative to the checkout (through tidewire/'s links)."""
    return name.replace(".", "/") + ".py"


def is_compiled(module: ModuleType) -> bool:
    return not (module.__file__ or "").endswith(".py")


def sources_digest(root: str) -> str:
    """sha256 of the compiled modules' sources under `root` (the directory holding `tidewire/`)."""
    digest = hashlib.sha256()
    for name in MODULES:
        with open(os.path.join(root, module_path(name)), "rb") as source:
            digest.update(source.read())
    return digest.hexdigest()


def _build_is_current(root: str) -> bool:
    try:
        with open(os.path.join(root, "tidewire", STAMP), encoding="ascii") as stamp:
            built = stamp.read().strip()
    except OSError:
        return False  # never compiled here (or compiled without a stamp): the sources are what is known to be right
    if built == sources_digest(root):
        return True
    print("tidewire: the compiled hot path is older than its sources; running the sources (rebuild: make dev)",
          file=sys.stderr)
    return False


class _SourceFirst(importlib.abc.MetaPathFinder):
    """Finds the `.py` of a compiled module, so the source runs instead of the extension beside it."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = frozenset(names)

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None,
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names or not path:
            return None
        leaf = fullname.rpartition(".")[2]
        for entry in path:
            source = os.path.join(entry, leaf + ".py")
            if os.path.exists(source):
                return importlib.util.spec_from_file_location(fullname, source)
        return None


def choose_implementation() -> None:
    """Import the hot path from its sources when asked (`TIDEWIRE_PURE_PYTHON=1`) or when the build is stale.

    All or nothing: the compiled modules import each other natively, past the import system, so one module
    alone cannot be switched back to its source."""
    if any(isinstance(f, _SourceFirst) for f in sys.meta_path):
        return
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.environ.get(PURE_ENV, "") in ("", "0") and _build_is_current(root):
        return
    sys.meta_path.insert(0, _SourceFirst(MODULES))
