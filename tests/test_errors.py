"""One root: every exception class Tidewire defines for its callers descends from `tidewire.errors.TidewireError`
(redis-py's shape), found by importing every module of the package, so a new one cannot miss it. Left out: private
classes (a leading `_`), the modules the Spark jobs' artifact ships (`pipeline.artifact.closure`: they run on a
cluster alone, without the rest of the package and its root) and those listed below with the reason."""

from __future__ import annotations

import importlib
import inspect
import os
from pathlib import Path

import tidewire
from tidewire.errors import TidewireError
from tidewire.pipeline.artifact import closure, package_root

PACKAGE = Path(tidewire.__file__).parent
# Control flow inside the MQTT handshake, never raised to a caller.
INTERNAL = {"tidewire.gateway.protocols.mqtt.connect.Refusal"}


def _modules() -> list[str]:
    names = []
    for folder, _, files in os.walk(PACKAGE, followlinks=True):  # the package's folders are links
        for file in files:
            if file.endswith(".py") and file != "__main__.py":
                rel = Path(folder, file).relative_to(PACKAGE.parent).with_suffix("")
                names.append(".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts))
    shipped = set(closure(package_root()))
    return sorted(n for n in names if n not in shipped)


def test_every_exception_descends_from_the_root() -> None:
    classes = []
    for module in _modules():
        for name, cls in inspect.getmembers(importlib.import_module(module), inspect.isclass):
            if cls.__module__ == module and issubclass(cls, BaseException) and not name.startswith("_"):
                classes.append(cls)
    names = {f"{c.__module__}.{c.__qualname__}" for c in classes}
    assert {"tidewire.store.records.CorruptRecord", "tidewire.lookup.rpc.RpcError"} <= names  # the scan sees them
    outside = sorted(f"{c.__module__}.{c.__qualname__}" for c in classes if not issubclass(c, TidewireError))
    assert [name for name in outside if name not in INTERNAL] == []
