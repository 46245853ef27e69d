"""A TCP proxy the test controls, to cut a link between real processes (a node and Redis, two nodes' cluster
ports) and heal it, without touching either side.

`TcpProxy(target_port)`: listens on `.port` and forwards every connection to `127.0.0.1:target_port`.
`cut()` closes every forwarded connection at once and, until `heal()`, closes each new one as soon as it is
accepted: both sides see the link fail fast (a reset or EOF), as after a network partition noticed by TCP, rather
than waiting out their timeouts. `stall()` is the silent partition: connections stay open (new ones are accepted)
but no byte crosses until `heal()`, so each side notices only by its own timeouts. `heal()` forwards again.
Threads: one acceptor, two pumps per connection.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

CHUNK = 65536  # bytes read per recv


class TcpProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._cut = False
        self._flowing = threading.Event()  # cleared while stalled
        self._flowing.set()
        self._closed = False
        self.refused = 0  # connections closed on accept while cut
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True, name=f"proxy:{self.port}").start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cut(self) -> None:
        """Drop every live connection; refuse new ones until `heal`."""
        with self._lock:
            self._cut = True
            doomed, self._open = self._open, set()
        for sock in doomed:
            _kill(sock)

    def stall(self) -> None:
        """Keep every connection open but forward nothing until `heal`."""
        self._flowing.clear()

    def heal(self) -> None:
        with self._lock:
            self._cut = False
        self._flowing.set()

    def close(self) -> None:
        self.cut()
        self._closed = True
        self._flowing.set()  # stalled pumps end on their closed sockets
        with contextlib.suppress(OSError):
            self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                cut = self._cut
            if cut:
                self.refused += 1
                _kill(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=2.0)
            except OSError:
                _kill(client)
                continue
            upstream.settimeout(None)
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._cut:  # cut while connecting upstream
                    _kill(client)
                    _kill(upstream)
                    continue
                self._open |= {client, upstream}
                self.accepted += 1
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(CHUNK):
                self._flowing.wait()
                dst.sendall(data)
        except OSError:
            pass
        with self._lock:
            self._open -= {src, dst}
        _kill(src)
        _kill(dst)


def _kill(sock: socket.socket) -> None:
    """Close with a reset (SO_LINGER 0): the peer learns at once, no FIN_WAIT lingering."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
