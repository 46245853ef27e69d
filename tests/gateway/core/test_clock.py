"""One injectable clock: no module of the gateway or of its admin API reads the system's time itself. Each part
reads the `Clock` it was given (`gateway.core.clock`: the node's, `node.clock`), so a test moves time by hand
instead of sleeping (`tests/gateway/fakeclock.py`).

An AST walk over every module under gateway/ and admin/ finds each use of `time.time`, `time.monotonic`,
`time.time_ns` (and their `_ns` and `perf_counter` kin), called or passed on, however `time` or the function was
imported; `datetime.now()`, `utcnow()` and `date.today()`; and an event loop's own `loop.time()`. The exceptions
are listed here, each with its reason. `SYSTEM_CLOCK` itself is named only as a parameter's default: the server
and the node pass theirs on."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCANNED = ("gateway", "admin")

# Modules that may read the system's time, and why.
ALLOWED_MODULES = {
    "gateway/cli/": "CLI commands run outside a node: they time the operator's requests, not the node's work",
    "gateway/ops/logs.py": "log formatting: a line's timestamp is the logging record's own, not the node's",
    "gateway/core/clock.py": "the clock itself: SystemClock binds time.monotonic and time.time",
}
# Single reads allowed where they are, as (module, function, what is read), and why.
ALLOWED_READS = {
    ("gateway/transport/admission.py", "Admission.watch_loop_lag", "loop.time"):
        "the event loop's lag: how late its own timer fired, measured on its own clock",
}

TIME_FUNCTIONS = frozenset({"time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns"})
DATETIME_NOW = frozenset({"now", "utcnow", "today"})
LOOP_GETTERS = frozenset({"get_running_loop", "get_event_loop"})


@dataclass(frozen=True)
class Read:
    module: str
    line: int
    function: str  # the enclosing Class.function, "" at module level
    what: str  # "time.monotonic", "datetime.now", "loop.time", ...

    def __str__(self) -> str:
        return f"{self.module}:{self.line} ({self.function or 'module'}): {self.what}"


class _Finder(ast.NodeVisitor):
    """The reads of the system's time in one module."""

    def __init__(self, module: str) -> None:
        self.module = module
        self.scope: list[str] = []
        self.time_modules: set[str] = set()  # names bound to the module `time`
        self.time_functions: dict[str, str] = {}  # names bound to one of its functions -> that function
        self.reads: list[Read] = []

    def _found(self, node: ast.AST, what: str) -> None:
        self.reads.append(Read(self.module, getattr(node, "lineno", 0), ".".join(self.scope), what))

    def _scoped(self, node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_ClassDef = visit_FunctionDef = visit_AsyncFunctionDef = _scoped

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name == "time":
                self.time_modules.add(alias.asname or "time")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module == "time":
            for alias in node.names:
                if alias.name in TIME_FUNCTIONS:
                    self.time_functions[alias.asname or alias.name] = alias.name
                    self._found(node, f"from time import {alias.name}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        value = node.value
        if isinstance(value, ast.Name) and value.id in self.time_modules and node.attr in TIME_FUNCTIONS:
            self._found(node, f"time.{node.attr}")  # called, or passed on as a function: either reads it
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in self.time_functions and isinstance(node.ctx, ast.Load):
            self._found(node, f"time.{self.time_functions[node.id]}")

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute):
            owner = func.value
            owner_name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(
                owner, ast.Attribute) else ""
            if func.attr in DATETIME_NOW and owner_name in ("datetime", "date"):
                self._found(node, f"{owner_name}.{func.attr}")
            elif func.attr == "time" and not node.args and (owner_name == "loop" or (
                    isinstance(owner, ast.Call) and _called_name(owner) in LOOP_GETTERS)):
                self._found(node, "loop.time")
        self.generic_visit(node)


def _called_name(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def reads_in(source: str, module: str = "<source>") -> list[Read]:
    finder = _Finder(module)
    finder.visit(ast.parse(source))
    return finder.reads


def _modules() -> list[tuple[str, Path]]:
    found = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if not any(name.startswith(allowed) for allowed in ALLOWED_MODULES):
                found.append((name, path))
    return found


def test_the_finder_sees_every_way_of_reading_the_time() -> None:
    source = """
import time
import time as t
from time import monotonic as mono
import asyncio
from datetime import datetime

def f(loop):
    a = time.time()
    b = t.monotonic()
    c = mono()
    d = time.time_ns() + time.perf_counter()
    e = datetime.now()
    g = loop.time()
    h = asyncio.get_running_loop().time()
    later = time.monotonic  # passed on: read elsewhere
    fine = time.sleep(0) or time.strftime("%Y") or clock.time() or self.clock.monotonic() or node.time()
"""
    assert [r.what for r in reads_in(source)] == [
        "from time import monotonic", "time.time", "time.monotonic", "time.monotonic", "time.time_ns",
        "time.perf_counter", "datetime.now", "loop.time", "loop.time", "time.monotonic"]


def test_no_module_of_the_gateway_reads_the_system_time_but_the_listed_exceptions() -> None:
    modules = _modules()
    assert len(modules) > 50 and ("gateway/node.py", ROOT / "gateway" / "node.py") in modules
    assert any(name.startswith("admin/") for name, _ in modules)
    for allowed in ALLOWED_MODULES:
        assert (ROOT / allowed).exists(), f"listed as an exception but gone: {allowed}"
    reads = [read for name, path in modules for read in reads_in(path.read_text(encoding="utf-8"), name)]
    used = {(r.module, r.function, r.what) for r in reads} & ALLOWED_READS.keys()
    direct = [str(r) for r in reads if (r.module, r.function, r.what) not in ALLOWED_READS]
    assert not direct, "read the clock the part was given (node.clock, or a `clock` argument) instead:\n" + (
        "\n".join(direct))
    assert used == ALLOWED_READS.keys(), f"exceptions listed but no longer used: {ALLOWED_READS.keys() - used}"


def system_clock_uses(source: str) -> list[int]:
    """Lines naming SYSTEM_CLOCK other than as a parameter's default: a part handed the system's clock itself
    would not read its node's."""
    tree = ast.parse(source)
    defaults = {id(default) for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                for default in (*node.args.defaults, *node.args.kw_defaults) if default is not None}
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Name) and node.id == "SYSTEM_CLOCK" and id(node) not in defaults]


def test_the_system_clock_is_only_a_default() -> None:
    assert system_clock_uses("def f(clock=SYSTEM_CLOCK, *, c=SYSTEM_CLOCK): pass\nx = f(SYSTEM_CLOCK)\n") == [2]
    named = {f"{name}:{line}" for name, path in _modules() for line in system_clock_uses(path.read_text("utf-8"))}
    assert not named, f"pass the node's clock instead: {sorted(named)}"
