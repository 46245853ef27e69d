"""Property-based round trips: decode(encode(p)) == p for every packet type at levels 4 and 5."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tidewire.gateway.protocols.mqtt.codec import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Parser,
    Pingreq,
    Pingresp,
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
    decode_properties,
    encode,
    encode_properties,
)
from tidewire.gateway.protocols.mqtt.codec.errors import PacketType
from tidewire.gateway.protocols.mqtt.codec.properties import (
    ALLOWED,
    BIN,
    BYTE,
    PAIR,
    PROPERTY_TYPES,
    STR,
    U16,
    U32,
    VARINT,
    WILL,
)

MAX_VARINT = 268_435_455

# Valid MQTT strings: no surrogates, no U+0000.
texts = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=12)
topic_names = st.text(
    st.characters(exclude_categories=["Cs"], exclude_characters="\x00+#"), min_size=1, max_size=12
)
blobs = st.binary(max_size=16)
u16 = st.integers(0, 0xFFFF)
packet_ids = st.integers(1, 0xFFFF)

_VALUES: dict[int, st.SearchStrategy[Any]] = {
    BYTE: st.integers(0, 255),
    U16: u16,
    U32: st.integers(0, 2**32 - 1),
    STR: texts,
    BIN: blobs,
}


def _value(pid: int, multi_sub_id: bool) -> st.SearchStrategy[Any]:
    kind = PROPERTY_TYPES[pid]
    if kind == PAIR:
        return st.lists(st.tuples(texts, texts), min_size=1, max_size=3)
    if kind == VARINT:
        return st.lists(st.integers(1, MAX_VARINT), min_size=1, max_size=3 if multi_sub_id else 1)
    return _VALUES[kind]


def props_for(ptype: int) -> st.SearchStrategy[dict[int, Any]]:
    """Random valid properties for a packet type (every allowed property type shows up over a run)."""
    allowed = sorted(ALLOWED[ptype])

    @st.composite
    def build(draw: st.DrawFn) -> dict[int, Any]:
        chosen = draw(st.lists(st.sampled_from(allowed), unique=True, max_size=len(allowed)))
        return {pid: draw(_value(pid, ptype == PacketType.PUBLISH)) for pid in chosen}

    return build()


T = PacketType


def packets(level: int) -> st.SearchStrategy[Packet]:
    """Any valid non-CONNECT packet at the given level."""
    five = level == 5

    def props(ptype: int) -> st.SearchStrategy[dict[int, Any]]:
        return props_for(ptype) if five else st.just({})

    rc = st.integers(0, 255) if five else st.just(0)

    @st.composite
    def publish(draw: st.DrawFn) -> Publish:
        qos = draw(st.integers(0, 2))
        p = draw(props(T.PUBLISH))
        topic = draw(topic_names)
        if five and 0x23 in p and draw(st.booleans()):
            topic = ""
        dup = draw(st.booleans()) if qos or not five else False
        pid = draw(packet_ids) if qos else 0
        return Publish(topic, draw(blobs), qos, draw(st.booleans()), dup, pid, p)

    def subreq() -> st.SearchStrategy[SubscriptionRequest]:
        if five:
            return st.builds(
                SubscriptionRequest, texts, st.integers(0, 2), st.booleans(), st.booleans(), st.integers(0, 2)
            )
        return st.builds(SubscriptionRequest, texts, st.integers(0, 2))

    acks: list[st.SearchStrategy[Packet]] = [
        st.builds(cls, u16, rc, props(ptype))
        for cls, ptype in ((Puback, T.PUBACK), (Pubrec, T.PUBREC), (Pubrel, T.PUBREL), (Pubcomp, T.PUBCOMP))
    ]
    suback_codes = st.integers(0, 255) if five else st.sampled_from([0, 1, 2, 0x80])
    choices: list[st.SearchStrategy[Packet]] = [
        publish(),
        *acks,
        st.builds(Connack, st.booleans(), st.integers(0, 255), props(T.CONNACK)),
        st.builds(Subscribe, packet_ids, st.lists(subreq(), min_size=1, max_size=4), props(T.SUBSCRIBE)),
        st.builds(Suback, u16, st.lists(suback_codes, max_size=4), props(T.SUBACK)),
        st.builds(Unsubscribe, packet_ids, st.lists(texts, min_size=1, max_size=4), props(T.UNSUBSCRIBE)),
        st.builds(
            Unsuback,
            u16,
            st.lists(st.integers(0, 255), max_size=4) if five else st.just([]),
            props(T.UNSUBACK),
        ),
        st.just(Pingreq()),
        st.just(Pingresp()),
        st.builds(Disconnect, rc, props(T.DISCONNECT)),
    ]
    if five:
        choices.append(st.builds(Auth, rc, props(T.AUTH)))
    return st.one_of(choices)


def connects(level: int) -> st.SearchStrategy[Connect]:
    five = level == 5

    @st.composite
    def build(draw: st.DrawFn) -> Connect:
        will = None
        if draw(st.booleans()):
            will = Will(
                draw(topic_names),
                draw(blobs),
                draw(st.integers(0, 2)),
                draw(st.booleans()),
                draw(props_for(WILL)) if five else {},
            )
        username = draw(st.none() | texts)
        password = draw(st.none() | blobs)
        if not five and username is None:
            password = None
        name = "MQTT" if five else draw(st.sampled_from(["MQTT", "MQIsdp"]))
        return Connect(
            draw(texts),
            level,
            draw(st.booleans()),
            draw(u16),
            will,
            username,
            password,
            draw(props_for(T.CONNECT)) if five else {},
            name,
        )

    return build()


def levels_and_streams(max_packets: int = 6) -> st.SearchStrategy[tuple[int, list[Packet]]]:
    """(level, [CONNECT, packets...]) as a client/server conversation would put them on one stream."""
    return st.sampled_from([4, 5]).flatmap(
        lambda lvl: st.tuples(
            st.just(lvl),
            st.tuples(connects(lvl), st.lists(packets(lvl), max_size=max_packets)).map(
                lambda t: [t[0], *t[1]]
            ),
        )
    )


def feed_split(data: bytes, cuts: list[int]) -> list[Packet]:
    parser = Parser()
    out: list[Packet] = []
    prev = 0
    for cut in sorted({c % (len(data) + 1) for c in cuts}):
        out += parser.feed(data[prev:cut])
        prev = cut
    out += parser.feed(data[prev:])
    return out


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([4, 5]).flatmap(lambda lvl: st.tuples(st.just(lvl), packets(lvl))))
def test_packet_round_trip(case: tuple[int, Packet]) -> None:
    level, packet = case
    parser = Parser(protocol_level=level)
    assert parser.feed(encode(packet, level)) == [packet]


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([4, 5]).flatmap(connects))
def test_connect_round_trip(connect: Connect) -> None:
    parser = Parser()
    assert parser.feed(encode(connect, connect.protocol_level)) == [connect]
    assert parser.protocol_level == connect.protocol_level


@settings(max_examples=70, deadline=None)
@given(levels_and_streams(), st.lists(st.integers(0, 10_000), max_size=8))
def test_stream_split_anywhere(case: tuple[int, list[Packet]], cuts: list[int]) -> None:
    level, pkts = case
    data = b"".join(encode(p, level) for p in pkts)
    assert feed_split(data, cuts) == pkts
    # Byte at a time, the worst split.
    parser = Parser()
    out: list[Packet] = []
    for i in range(len(data)):
        out += parser.feed(data[i : i + 1])
    assert out == pkts


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([WILL, *[int(t) for t in T if t in ALLOWED]]).flatmap(props_for))
def test_properties_round_trip(props: dict[int, Any]) -> None:
    assert decode_properties(encode_properties(props)) == props
