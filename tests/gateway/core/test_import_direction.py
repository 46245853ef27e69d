"""Imports point down: protocols -> core -> store. Checked on every `import` statement of every module (at module
level, in functions, under `if TYPE_CHECKING:`; relative imports resolved), read with `ast`:

- `tidewire.gateway.core` (the protocol-neutral core) imports none of `tidewire.gateway.protocols`,
  `.transport`, `.cli`, `.sessions` (MQTT's session layer: it encodes MQTT packets), `.ops`, `.server`,
  `.cluster`, nor `tidewire.admin` or `tidewire.pipeline`. What it needs of a session or a subscription request
  is a `typing.Protocol` of its own, and it answers with neutral results that each protocol maps to its codes.
  Nor does it name the node (`tidewire.gateway.node`, the composition root above it), not even for a type:
  each part of the core is handed the few parts it uses (store, cache, lookup, writes, clock, topology, ...).
- `tidewire.store`, `tidewire.cache`, `tidewire.lookup` and `tidewire.notify` import nothing of
  `tidewire.gateway`, `tidewire.admin`, `tidewire.extensions` or `tidewire.pipeline`; the store imports none of
  cache, lookup and notify either (they are built on it).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import tidewire

PACKAGE = Path(tidewire.__file__).resolve().parent  # the tree the tests import
UP_FROM_CORE = ("tidewire.gateway.protocols", "tidewire.gateway.transport", "tidewire.gateway.cli",
                "tidewire.gateway.sessions", "tidewire.gateway.ops", "tidewire.gateway.server",
                "tidewire.gateway.cluster", "tidewire.gateway.node", "tidewire.admin", "tidewire.pipeline")
UP_FROM_LOWER = ("tidewire.gateway", "tidewire.admin", "tidewire.extensions", "tidewire.pipeline")
RULES: dict[str, tuple[str, ...]] = {
    "tidewire.gateway.core": UP_FROM_CORE,
    "tidewire.store": (*UP_FROM_LOWER, "tidewire.cache", "tidewire.lookup", "tidewire.notify"),
    "tidewire.cache": UP_FROM_LOWER,
    "tidewire.lookup": UP_FROM_LOWER,
    "tidewire.notify": UP_FROM_LOWER,
}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    line: int
    name: str  # what it imports, absolute
    type_only: bool  # inside `if TYPE_CHECKING:`


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(source: str, module: str, is_package: bool = False) -> list[Import]:
    """Every import statement of `source` (the module `module`), with relative names made absolute."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, type_only: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend(Import(module, node.lineno, alias.name, type_only) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                prefix = ".".join(base)
                name = f"{prefix}.{node.module}" if node.module else prefix
            else:
                name = node.module or ""
            found.append(Import(module, node.lineno, name, type_only))
            # `from tidewire.gateway import sessions`: what is imported may be a module
            found.extend(Import(module, node.lineno, f"{name}.{alias.name}", type_only) for alias in node.names)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, type_only)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, type_only)

    visit(ast.parse(source), False)
    return found


def violations(imports: list[Import], package: str) -> list[str]:
    """One line per import statement against the rule for `package`."""
    banned = RULES[package]
    bad: dict[tuple[str, int], str] = {}
    for imp in imports:
        if (imp.module, imp.line) in bad:
            continue
        if _under(imp.name, banned):
            bad[imp.module, imp.line] = (f"{imp.module}:{imp.line} imports {imp.name}"
                                         + (" (type only)" if imp.type_only else ""))
    return list(bad.values())


def _modules(package: str) -> list[tuple[str, Path]]:
    folder = PACKAGE.joinpath(*package.split(".")[1:])
    found = []
    for path in sorted(folder.rglob("*.py")):
        parts = list(path.relative_to(folder).with_suffix("").parts)
        found.append((".".join([package, *parts]), path))
    return found


def test_imports_point_down() -> None:
    bad: list[str] = []
    parsed = 0
    seen = 0
    for package in RULES:
        modules = _modules(package)
        assert modules, f"no module found in {package}"
        for module, path in modules:
            is_package = path.name == "__init__.py"
            name = module.removesuffix(".__init__")
            imports = imports_of(path.read_text(encoding="utf-8"), name, is_package)
            parsed += 1
            seen += sum(1 for i in imports if i.name.startswith("tidewire."))
            bad += violations(imports, package)
    assert parsed > 50 and seen > 100, (parsed, seen)  # the walk found the tree and its imports
    assert not bad, "imports against the direction:\n" + "\n".join(bad)


def test_the_check_finds_what_it_must() -> None:
    source = '''
from __future__ import annotations
from typing import TYPE_CHECKING
import tidewire.gateway.protocols.mqtt.codec
from tidewire.gateway.core import topics
from tidewire.gateway import sessions
from ..sessions.session import Session
if TYPE_CHECKING:
    from tidewire.gateway.node import Node
    from tidewire.admin.app import build
def late() -> None:
    from tidewire.gateway.node import Node
'''
    got = violations(imports_of(source, "tidewire.gateway.core.example"), "tidewire.gateway.core")
    assert [line.split(" imports ")[1] for line in got] == [
        "tidewire.gateway.protocols.mqtt.codec", "tidewire.gateway.sessions", "tidewire.gateway.sessions.session",
        "tidewire.gateway.node (type only)", "tidewire.admin.app (type only)", "tidewire.gateway.node"]
    lower = violations(imports_of("from tidewire.gateway.core.topics import matches\nfrom . import base\n",
                                  "tidewire.store", is_package=True), "tidewire.store")
    assert lower == ["tidewire.store:1 imports tidewire.gateway.core.topics"]
