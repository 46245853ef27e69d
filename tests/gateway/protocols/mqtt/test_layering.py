"""The MQTT asyncio Protocol holds no MQTT rule: it moves bytes and arms timers, and the rules are the sans-IO
channel's. Checked on the source: a rule needs the codec's names (packet types, reason codes, properties) or the
node's state, so the Protocol's module may import neither, and the channel modules may import no event loop or
socket."""

from __future__ import annotations

import ast
from pathlib import Path

import tidewire.gateway.protocols.mqtt.codec as codec
from tidewire.gateway.protocols.mqtt import connection

MQTT = Path(connection.__file__).parent
SANS_IO = ("channel.py", "handshake.py", "lifecycle.py", "connect.py", "outbound.py")
# What the byte-moving side may import: the event loop, the channel it drives, the listener's wheel and TLS.
PROTOCOL_IMPORTS = {"asyncio", "collections.abc", "typing", "tidewire.gateway.core.clock",
                    "tidewire.gateway.protocols.mqtt.channel", "tidewire.gateway.protocols.mqtt.lifecycle",
                    "tidewire.gateway.transport.listeners", "tidewire.gateway.transport.deadlines",
                    "tidewire.gateway.transport.tls", "tidewire.gateway.node"}


def imported_modules(tree: ast.Module) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.module != "__future__":
            found.add(node.module)
    return found


def test_the_protocol_imports_no_codec_and_names_no_rule() -> None:
    tree = ast.parse(Path(connection.__file__).read_text())
    imports = imported_modules(tree)
    assert imports and imports <= PROTOCOL_IMPORTS, imports - PROTOCOL_IMPORTS
    codec_names = {name for name in dir(codec) if not name.startswith("_") and name[0].isupper()}
    assert len(codec_names) > 20, "the codec's public names were not found: the check would pass vacuously"
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not used & codec_names, used & codec_names
    node_reads = {n.attr for n in ast.walk(tree)
                  if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute) and n.value.attr == "node"}
    assert node_reads <= {"settings", "clock"}, node_reads  # the write buffer size and the clock, nothing else


def test_the_channel_touches_no_event_loop_or_socket() -> None:
    for name in SANS_IO:
        tree = ast.parse((MQTT / name).read_text())
        imports = imported_modules(tree)
        assert not imports & {"asyncio", "socket", "ssl", "selectors", "uvloop", "time"}, (name, imports)
