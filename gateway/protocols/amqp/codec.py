"""AMQP 0.9.1 frames: a byte stream in → decoded frames (or a fault), frames out → bytes. pamqp marshals."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from pamqp import base, body, commands, decode, encode, frame, header, heartbeat

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE
FRAME_OVERHEAD = 8  # type (1), channel (2), size (4) before the payload; the end octet after it
MIN_FRAME_MAX = 4096  # spec: every peer accepts frames this large, also before Tune

# Reply codes (spec 1.2); a "hard" code closes the connection, the others only the channel.
REPLY_SUCCESS = 200
NO_ROUTE = 312
CONNECTION_FORCED = 320
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541
HARD_ERRORS = frozenset({CONNECTION_FORCED, 402, FRAME_ERROR, SYNTAX_ERROR, COMMAND_INVALID, CHANNEL_ERROR,
                         UNEXPECTED_FRAME, RESOURCE_ERROR, NOT_ALLOWED, NOT_IMPLEMENTED, INTERNAL_ERROR})
_NAMES = {NO_ROUTE: "NO_ROUTE", CONNECTION_FORCED: "CONNECTION_FORCED", ACCESS_REFUSED: "ACCESS_REFUSED",
          NOT_FOUND: "NOT_FOUND", RESOURCE_LOCKED: "RESOURCE_LOCKED", PRECONDITION_FAILED: "PRECONDITION_FAILED",
          FRAME_ERROR: "FRAME_ERROR", SYNTAX_ERROR: "SYNTAX_ERROR", COMMAND_INVALID: "COMMAND_INVALID",
          CHANNEL_ERROR: "CHANNEL_ERROR", UNEXPECTED_FRAME: "UNEXPECTED_FRAME", RESOURCE_ERROR: "RESOURCE_ERROR",
          NOT_ALLOWED: "NOT_ALLOWED", NOT_IMPLEMENTED: "NOT_IMPLEMENTED", INTERNAL_ERROR: "INTERNAL_ERROR"}

Method = base.Frame
Properties = commands.Basic.Properties
FrameValue = base.Frame | header.ContentHeader | body.ContentBody | heartbeat.Heartbeat


@dataclass(frozen=True, slots=True)
class Fault:
    """Why a channel or the connection is closed: the reply code, text and the method that caused it."""

    code: int
    text: str
    class_id: int = 0
    method_id: int = 0

    @property
    def hard(self) -> bool:
        return self.code in HARD_ERRORS

    def reply_text(self) -> str:
        """RabbitMQ's form, "NOT_FOUND - no queue 'q' in vhost '/'", cut to fit a shortstr."""
        text = f"{_NAMES.get(self.code, str(self.code))} - {self.text}"
        raw = text.encode()
        return text if len(raw) <= 255 else raw[:255].decode("utf-8", "ignore")


def fault(code: int, text: str, method: Method | None = None) -> Fault:
    if method is None:
        return Fault(code, text)
    return Fault(code, text, method.index >> 16, method.index & 0xFFFF)


class FrameReader:
    """Splits the byte stream into frames and decodes them; the first problem is a `Fault` (a connection error)."""

    __slots__ = ("_buffer", "frame_max")

    def __init__(self, frame_max: int) -> None:
        self.frame_max = frame_max  # the negotiated frame-max once tuned; frames up to it + FRAME_OVERHEAD pass
        self._buffer = bytearray()

    def feed(self, data: bytes) -> tuple[list[tuple[int, FrameValue]], Fault | None]:
        """Frames complete so far, in order, and a fault that ends the stream (nothing after it is read)."""
        buf = self._buffer
        buf += data
        frames: list[tuple[int, FrameValue]] = []
        pos = 0
        end = len(buf)
        try:
            while end - pos >= 7:
                kind, channel, size = struct.unpack_from(">BHI", buf, pos)
                if kind not in (FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT):
                    return frames, Fault(FRAME_ERROR, f"unknown frame type {kind}")
                # One frame overhead beyond frame-max is tolerated, as RabbitMQ's reader does (rabbit_reader.erl,
                # FRAME_SIZE_FUDGE = EMPTY_FRAME_SIZE): some clients (AMQPStorm) take frame-max as the payload size
                # and work against RabbitMQ. What we send stays within frame-max (`content_frames`).
                if size > self.frame_max:
                    return frames, Fault(FRAME_ERROR, f"frame size {size + FRAME_OVERHEAD} larger than negotiated "
                                                      f"maximum {self.frame_max}")
                stop = pos + 7 + size + 1
                if stop > end:
                    break
                if buf[stop - 1] != FRAME_END:
                    return frames, Fault(FRAME_ERROR, "frame end octet missing")
                value = _decode(kind, channel, bytes(buf[pos + 7:stop - 1]))
                if isinstance(value, Fault):
                    return frames, value
                frames.append((channel, value))
                pos = stop
        finally:
            del buf[:pos]
        return frames, None


def _decode(kind: int, channel: int, payload: bytes) -> FrameValue | Fault:
    if kind == FRAME_HEARTBEAT:
        if channel != 0 or payload:
            return Fault(FRAME_ERROR, "heartbeat frame on a channel or with a payload")
        return heartbeat.Heartbeat()
    if kind == FRAME_BODY:
        return body.ContentBody(payload)
    if kind == FRAME_METHOD:
        if len(payload) < 4:
            return Fault(FRAME_ERROR, "method frame too short")
        index = int.from_bytes(payload[:4], "big")
        if index not in commands.INDEX_MAPPING:
            return Fault(NOT_IMPLEMENTED, f"unknown method {index >> 16}.{index & 0xFFFF}", index >> 16,
                         index & 0xFFFF)
    try:
        # pamqp re-reads the frame header: hand it the whole frame, it raises on anything it cannot decode
        _, _, value = frame.unmarshal(struct.pack(">BHI", kind, channel, len(payload)) + payload + b"\xce")
    except Exception as exc:  # pamqp raises many kinds on bad input (struct, Unicode, Value, Index errors)
        what = "content header" if kind == FRAME_HEADER else "method"
        return Fault(SYNTAX_ERROR, f"malformed {what} frame ({type(exc).__name__})")
    if kind == FRAME_HEADER and isinstance(value, header.ContentHeader) and value.class_id != commands.Basic.frame_id:
        return Fault(FRAME_ERROR, f"content header for class {value.class_id}")
    assert not isinstance(value, header.ProtocolHeader)  # only a frame starting with b"AMQP" decodes as one
    return value


def parse_plain(response: object) -> tuple[str | None, bytes | None] | None:
    """SASL PLAIN (`authzid NUL authcid NUL password`) → (user name, password); (None, None) when both are
    empty (an anonymous login); None when malformed."""
    raw = response.encode() if isinstance(response, str) else bytes(response or b"") if isinstance(
        response, bytes | bytearray | None) else b""
    parts = raw.split(b"\x00")
    if len(parts) != 3:
        return None
    if not parts[1] and not parts[2]:
        return None, None
    return parts[1].decode("utf-8", "replace"), parts[2]


def method_frame(channel: int, method: Method) -> bytes:
    return frame.marshal(method, channel)


def content_frames(channel: int, method: Method, properties: Properties, payload: bytes, frame_max: int) -> bytes:
    """A method with content: the method frame, the content header, the body split in frames of `frame_max`."""
    out = [frame.marshal(method, channel),
           frame.marshal(header.ContentHeader(0, len(payload), properties), channel)]
    step = frame_max - FRAME_OVERHEAD
    for start in range(0, len(payload), step):
        chunk = payload[start:start + step]
        out.append(struct.pack(">BHI", FRAME_BODY, channel, len(chunk)) + chunk + b"\xce")
    return b"".join(out)


HEARTBEAT = heartbeat.Heartbeat.marshal()


def encode_table(table: dict[str, Any]) -> bytes | None:
    """A field table as its AMQP bytes (each value's type kept as pamqp reads it), or None if it has a value
    pamqp cannot write (it reads none such: a table a client sent always encodes)."""
    try:
        return encode.field_table(table)
    except (TypeError, ValueError):
        return None


def decode_table(data: bytes) -> dict[str, Any] | None:
    """A field table from `encode_table`'s bytes; None if they are not one."""
    try:
        _, table = decode.field_table(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return table
