"""The sans-IO core of the cluster RPC: its messages, its frames and the handshake proof. No IO here.

A frame is a u32 big-endian length and a msgpack array of messages (msgspec structs encoded as tagged arrays).
`FrameCodec.feed` turns bytes into batches of messages (or an error: over the size limit, undecodable);
`FrameCodec.encode` turns one batch into as few frames as the size limit allows.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from typing import Any

import msgspec

_LEN = struct.Struct(">I")


# --- messages ---------------------------------------------------------------------------------------------


class Hello(msgspec.Struct, tag="h", array_like=True):
    node: str
    nonce: bytes


class Challenge(msgspec.Struct, tag="k", array_like=True):
    node: str
    nonce: bytes
    proof: bytes


class Proof(msgspec.Struct, tag="p", array_like=True):
    proof: bytes


class Welcome(msgspec.Struct, tag="w", array_like=True):
    pass


class Call(msgspec.Struct, tag="c", array_like=True):
    id: int
    method: str
    payload: Any


class Reply(msgspec.Struct, tag="r", array_like=True):
    id: int
    error: str | None
    payload: Any


class Cast(msgspec.Struct, tag="s", array_like=True):
    method: str
    payload: Any


Message = Hello | Challenge | Proof | Welcome | Call | Reply | Cast


def proof(secret: bytes, nonce: bytes, node_id: str, role: str) -> bytes:
    """What a node of `role` ("client" or "server") answers to the other side's `nonce`."""
    return hmac.new(secret, nonce + node_id.encode() + role.encode(), hashlib.sha256).digest()


# --- sans-IO framing --------------------------------------------------------------------------------------


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    if n < 0x10000:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


class FrameCodec:
    """Bytes in, batches of messages out; batches of messages in, frames out. No IO."""

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()
        self._enc = msgspec.msgpack.Encoder()
        self._dec = msgspec.msgpack.Decoder(list[Message])

    def feed(self, data: bytes) -> tuple[list[list[Message]], str | None]:
        """The complete frames in the bytes so far, and an error (connection unusable) or None."""
        buf = self._buf
        buf += data
        frames: list[list[Message]] = []
        pos = 0
        error: str | None = None
        while len(buf) - pos >= 4:
            (size,) = _LEN.unpack_from(buf, pos)
            if size > self.max_frame:
                error = f"frame of {size} bytes over the limit of {self.max_frame}"
                break
            if len(buf) - pos - 4 < size:
                break
            body = bytes(buf[pos + 4:pos + 4 + size])
            pos += 4 + size
            try:
                frames.append(self._dec.decode(body))
            except msgspec.DecodeError:
                error = "undecodable frame"
                break
        del buf[:pos]
        return frames, error

    def encode(self, messages: list[Message]) -> tuple[list[bytes], list[int]]:
        """Frames (length-prefixed) carrying `messages` in order, and the indexes of messages that cannot be sent
        (alone over `max_frame`, or not encodable)."""
        try:
            body = self._enc.encode(messages)
        except (TypeError, msgspec.EncodeError):
            body = None
        if body is not None and len(body) <= self.max_frame:
            return [_LEN.pack(len(body)) + body], []
        frames: list[bytes] = []
        rejected: list[int] = []
        parts: list[bytes] = []
        size = 5  # the largest array header
        for i, msg in enumerate(messages):
            try:
                part = self._enc.encode(msg)
            except (TypeError, msgspec.EncodeError):
                rejected.append(i)
                continue
            if len(part) + 5 > self.max_frame:
                rejected.append(i)
                continue
            if parts and size + len(part) > self.max_frame:
                frames.append(self._frame(parts))
                parts, size = [], 5
            parts.append(part)
            size += len(part)
        if parts:
            frames.append(self._frame(parts))
        return frames, rejected

    @staticmethod
    def _frame(parts: list[bytes]) -> bytes:
        body = _array_header(len(parts)) + b"".join(parts)
        return _LEN.pack(len(body)) + body
