"""Incremental sans-IO MQTT parser: feed it bytes from the wire, get packet objects back.

PUBLISH and PUBACK (nearly all traffic) are decoded inline in the feed loop; other packet types go through
a per-type decoder table. The only exception raised is ProtocolError.
"""

from __future__ import annotations

from collections.abc import Callable

from .errors import PacketType, ProtocolError, ReasonCode, malformed, protocol_error
from .packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    SubscriptionRequest,
    Unsuback,
    Unsubscribe,
    Will,
)
from .primitives import read_bin, read_str, read_topic_name, read_u8, read_u16
from .properties import ALLOWED, WILL, read_properties

_T = PacketType
_PUBLISH_ALLOWED = ALLOWED[_T.PUBLISH]
_TOPIC_ALIAS = 0x23
_SUB_ID = 0x0B


def _check_end(pos: int, end: int) -> None:
    if pos != end:
        raise malformed("unexpected bytes at the end of the packet")


def _check_flags(flags: int, expected: int, name: str | int) -> None:
    """`name`: the packet's name, or its type number (named only when the flags are wrong: an enum lookup per
    packet costs more than the check)."""
    if flags != expected:
        packet = _T(name).name if isinstance(name, int) else name
        raise malformed(f"invalid fixed header flags 0x{flags:X} for {packet}")


_Decoder = Callable[["Parser", int, bytes, int, int, int], Packet]


class Parser:
    """Bytes in, packets out. One instance per connection (server side or client side).

    `protocol_level` is 0 until a CONNECT is parsed. A client-side user (which never receives CONNECT)
    sets it to 4 or 5 up front, either via the keyword argument or by assigning the attribute.
    """

    __slots__ = ("_buf", "_need", "max_packet_size", "protocol_level")

    def __init__(self, max_packet_size: int = 268435460, *, protocol_level: int = 0) -> None:
        self.max_packet_size = max_packet_size
        self.protocol_level = protocol_level
        self._buf: bytearray | None = None  # a partial packet; made when one is first left over (most never are)
        # Bytes the buffered partial packet needs before it is worth parsing again.
        self._need = 0

    def feed(self, data: bytes) -> list[Packet]:
        buf = self._buf
        if buf:
            buf += data
            if len(buf) < self._need:
                return []
            # Each byte is copied here at most once per completed packet: no quadratic behaviour.
            data = bytes(buf)
            self._buf = None
        elif not isinstance(data, bytes):
            data = bytes(data)
        try:
            return self._parse(data)
        except ProtocolError:
            raise
        except (IndexError, ValueError, OverflowError) as exc:  # defensive net; readers bound-check
            raise malformed(f"malformed packet: {exc}") from None

    def _parse(self, data: bytes) -> list[Packet]:
        out: list[Packet] = []
        n = len(data)
        pos = 0
        level = self.protocol_level
        maxsize = self.max_packet_size
        decoders = _DECODERS
        while pos < n:
            b0 = data[pos]
            # Fixed header: type/flags byte + remaining length varint (1-4 bytes).
            p = pos + 2
            if p > n:
                self._stash(data, pos, 2)
                return out
            rl = data[p - 1]
            if rl & 0x80:
                rl &= 0x7F
                shift = 7
                while True:
                    if p >= n:
                        self._stash(data, pos, n - pos + 1)
                        return out
                    b = data[p]
                    p += 1
                    rl |= (b & 0x7F) << shift
                    if b < 0x80:
                        break
                    shift += 7
                    if shift == 28:
                        raise malformed("remaining length longer than 4 bytes")
            end = p + rl
            if end - pos > maxsize:
                raise ProtocolError(
                    ReasonCode.PACKET_TOO_LARGE, f"packet of {end - pos} bytes exceeds maximum {maxsize}"
                )
            ptype = b0 >> 4
            if not level and ptype != 1:
                raise protocol_error("first packet must be CONNECT")
            if end > n:
                self._stash(data, pos, end - pos)
                return out

            if ptype == 3:
                # PUBLISH fast path.
                qos = (b0 >> 1) & 3
                if qos == 3:
                    raise malformed("PUBLISH with QoS 3")
                dup = b0 & 8
                if dup and not qos and level == 5:
                    raise malformed("PUBLISH QoS 0 with DUP set")
                if p + 2 > end:
                    raise malformed("PUBLISH too short")
                q = p + 2 + ((data[p] << 8) | data[p + 1])
                if q > end:
                    raise malformed("PUBLISH topic runs past the packet end")
                try:
                    topic = data[p + 2 : q].decode("utf-8")
                except UnicodeDecodeError:
                    raise malformed("invalid UTF-8 in PUBLISH topic") from None
                if "+" in topic or "#" in topic:
                    raise ProtocolError(ReasonCode.TOPIC_NAME_INVALID, "wildcard in PUBLISH topic")
                if "\x00" in topic:
                    raise malformed("U+0000 in PUBLISH topic")
                pid = 0
                if qos:
                    if q + 2 > end:
                        raise malformed("PUBLISH too short for a packet id")
                    pid = (data[q] << 8) | data[q + 1]
                    if not pid:
                        raise malformed("PUBLISH packet id 0")
                    q += 2
                if level == 5:
                    if q < end and data[q] == 0:
                        props: Properties = {}
                        q += 1
                    else:
                        props, q = read_properties(data, q, end, _PUBLISH_ALLOWED)
                    if not topic and _TOPIC_ALIAS not in props:
                        raise ProtocolError(ReasonCode.TOPIC_NAME_INVALID, "empty topic without alias")
                else:
                    props = {}
                    if not topic:
                        raise ProtocolError(ReasonCode.TOPIC_NAME_INVALID, "empty PUBLISH topic")
                out.append(Publish(topic, data[q:end], qos, bool(b0 & 1), bool(dup), pid, props))
            elif ptype == 4 and rl == 2:
                # PUBACK fast path (the 2-byte form; valid at both levels).
                if b0 != 0x40:
                    raise malformed("invalid fixed header flags for PUBACK")
                out.append(Puback((data[p] << 8) | data[p + 1]))
            else:
                dec = decoders.get(ptype)
                if dec is None:
                    raise malformed(f"invalid packet type {ptype}")
                out.append(dec(self, b0, data, p, end, level))
                if ptype == 1:
                    level = self.protocol_level
            pos = end
        return out

    def _stash(self, data: bytes, pos: int, need: int) -> None:
        self._buf = bytearray(memoryview(data)[pos:])
        self._need = need

    # -- per-type decoders: (first byte, data, body start, body end, level) -> packet --------------

    def _connect(self, b0: int, data: bytes, pos: int, end: int, level: int) -> Packet:
        if level:
            raise protocol_error("second CONNECT")
        _check_flags(b0 & 15, 0, "CONNECT")
        name, pos = read_str(data, pos, end)
        raw, pos = read_u8(data, pos, end)
        version = raw & 0x7F  # the top bit: another broker's bridge (try_private); `negotiate` decides if it is let in
        if name == "MQTT" and version in (4, 5):
            level = version
        elif name == "MQIsdp" and version == 3:
            level = 4
        else:
            raise ProtocolError(
                ReasonCode.UNSUPPORTED_PROTOCOL_VERSION, f"unsupported protocol {name!r} level {raw}"
            )
        flags, pos = read_u8(data, pos, end)
        if flags & 0x01:
            raise malformed("CONNECT reserved flag set")
        will_flag = flags & 0x04
        will_qos = (flags >> 3) & 3
        will_retain = bool(flags & 0x20)
        if will_qos == 3:
            raise malformed("will QoS 3")
        if not will_flag and (will_qos or will_retain):
            raise malformed("will QoS/retain set without will flag")
        has_user = flags & 0x80
        has_pass = flags & 0x40
        if has_pass and not has_user and level == 4:
            raise malformed("password without user name")
        keepalive, pos = read_u16(data, pos, end)
        props: Properties = {}
        if level == 5:
            props, pos = read_properties(data, pos, end, ALLOWED[_T.CONNECT])
        client_id, pos = read_str(data, pos, end)
        will = None
        if will_flag:
            wprops: Properties = {}
            if level == 5:
                wprops, pos = read_properties(data, pos, end, ALLOWED[WILL])
            wtopic, pos = read_topic_name(data, pos, end)
            if not wtopic:
                raise ProtocolError(ReasonCode.TOPIC_NAME_INVALID, "empty will topic")
            wpayload, pos = read_bin(data, pos, end)
            will = Will(wtopic, wpayload, will_qos, will_retain, wprops)
        username = password = None
        if has_user:
            username, pos = read_str(data, pos, end)
        if has_pass:
            password, pos = read_bin(data, pos, end)
        _check_end(pos, end)
        self.protocol_level = level
        return Connect(client_id, level, bool(flags & 0x02), keepalive, will, username, password, props, name,
                       raw > 0x7F)

    def _connack(self, b0: int, data: bytes, pos: int, end: int, level: int) -> Packet:
        _check_flags(b0 & 15, 0, "CONNACK")
        ack_flags, pos = read_u8(data, pos, end)
        if ack_flags & 0xFE:
            raise malformed("CONNACK reserved flags set")
        code, pos = read_u8(data, pos, end)
        props: Properties = {}
        if level == 5 and pos < end:
            props, pos = read_properties(data, pos, end, ALLOWED[_T.CONNACK])
        _check_end(pos, end)
        return Connack(bool(ack_flags), code, props)

    def _ack(self, b0: int, data: bytes, pos: int, end: int, level: int) -> Packet:
        ptype = b0 >> 4
        _check_flags(b0 & 15, 2 if ptype == _T.PUBREL else 0, ptype)
        pid, pos = read_u16(data, pos, end)
        code = 0
        props: Properties = {}
        if level == 5 and pos < end:
            code = data[pos]
            pos += 1
            if pos < end:
                props, pos = read_properties(data, pos, end, ALLOWED[ptype])
        _check_end(pos, end)
        cls = (Puback, Pubrec, Pubrel, Pubcomp)[ptype - 4]
        return cls(pid, code, props)

    def _subscribe(self, b0: int, data: bytes, pos: int, end: int, level: int) -> Packet:
        _check_flags(b0 & 15, 2, "SUBSCRIBE")
        pid, pos = read_u16(data, pos, end)
        if not pid:
            raise malformed("SUBSCRIBE packet id 0")
        props: Properties = {}
        if level == 5:
            props, pos = read_properties(data, pos, end, ALLOWED[_T.SUBSCRIBE])
            if len(props.get(_SUB_ID, ())) > 1:
                raise protocol_error("SUBSCRIBE with more than one subscription identifier")
        subs = []
        while pos < end:
            topic_filter, pos = read_str(data, pos, end)
            opts, pos = read_u8(data, pos, end)
            qos = opts & 3
            if qos == 3:
                raise malformed("subscription QoS 3")
            if level == 5:
                rh = (opts >> 4) & 3
                if opts & 0xC0 or rh == 3:
                    raise malformed("invalid subscription options")
                subs.append(SubscriptionRequest(topic_filter, qos, bool(opts & 4), bool(opts & 8), rh))
            else:
                if opts & 0xFC:
                    raise malformed("subscription options reserved bits set")
                subs.append(SubscriptionRequest(topic_filter, qos))
        if not subs:
            raise protocol_error("SUBSCRIBE without topic filters")
        return Subscribe(pid, subs, props)

    def _suback(self, b0: int, data: bytes, pos: int, end: int, level: int) -> Packet:
        _check_flags(b0 & 15, 0, "SUBACK")
        pid, pos = read_u16(data, pos, end)
        props: Properties = {}
        if level == 5:
            props, pos = read_properties(data, pos, end, ALLOWED[_T.SUBACK])
        return Suback(pid, list(data[pos:end]), props)

    def _unsubscribe(self, b0: int, data: bytes, pos: int, end: int, level: int) -> Packet:
        _check_flags(b0 & 15, 2, "UNSUBSCRIBE")
        pid, pos = read_u16(data, pos, end)
        if not pid:
            raise malformed("UNSUBSCRIBE packet id 0")
        props: Properties = {}
        if level == 5:
            props, pos = read_properties(data, pos, end, ALLOWED[_T.UNSUBSCRIBE])
        filters = []
        while pos < end:
            topic_filter, pos = read_str(data, pos, end)
            filters.append(topic_filter)
        if not filters:
            raise protocol_error("UNSUBSCRIBE without topic filters")
        return Unsubscribe(pid, filters, props)

    def _unsuback(self, b0: int, data: bytes, pos: int, end: int, level: int) -> Packet:
        _check_flags(b0 & 15, 0, "UNSUBACK")
        pid, pos = read_u16(data, pos, end)
        if level != 5:
            _check_end(pos, end)
            return Unsuback(pid)
        props, pos = read_properties(data, pos, end, ALLOWED[_T.UNSUBACK])
        return Unsuback(pid, list(data[pos:end]), props)

    def _ping(self, b0: int, data: bytes, pos: int, end: int, level: int) -> Packet:
        _check_flags(b0 & 15, 0, "PING")
        _check_end(pos, end)
        return Pingreq() if b0 >> 4 == _T.PINGREQ else Pingresp()

    def _reason_only(self, b0: int, data: bytes, pos: int, end: int, level: int) -> Packet:
        ptype = b0 >> 4
        _check_flags(b0 & 15, 0, ptype)
        if level != 5 and ptype == _T.AUTH:
            raise malformed("AUTH is not an MQTT 3.1.1 packet")
        code = 0
        props: Properties = {}
        if level == 5 and pos < end:
            code = data[pos]
            pos += 1
            if pos < end:
                props, pos = read_properties(data, pos, end, ALLOWED[ptype])
        _check_end(pos, end)
        return Disconnect(code, props) if ptype == _T.DISCONNECT else Auth(code, props)


# Shared by every parser: a per-instance table of bound methods would cost ~1 KB per connection.
_DECODERS: dict[int, _Decoder] = {
    _T.CONNECT: Parser._connect,
    _T.CONNACK: Parser._connack,
    _T.PUBACK: Parser._ack,
    _T.PUBREC: Parser._ack,
    _T.PUBREL: Parser._ack,
    _T.PUBCOMP: Parser._ack,
    _T.SUBSCRIBE: Parser._subscribe,
    _T.SUBACK: Parser._suback,
    _T.UNSUBSCRIBE: Parser._unsubscribe,
    _T.UNSUBACK: Parser._unsuback,
    _T.PINGREQ: Parser._ping,
    _T.PINGRESP: Parser._ping,
    _T.DISCONNECT: Parser._reason_only,
    _T.AUTH: Parser._reason_only,
}
