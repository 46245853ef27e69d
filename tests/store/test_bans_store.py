"""Bans in the store, on every engine (`engine`: embedded, delaying, redis, redis cluster): put, replace, list,
delete (and the compare-and-delete of a lapsed ban), and survival across a reopen (a restart; for Redis a kill -9
of the server too)."""

from __future__ import annotations

from tests.store.conftest import Engine
from tidewire.store.base import Ban, decode_ban, encode_ban


def _by_key(bans: list[Ban]) -> dict[tuple[str, str], Ban]:
    return {(b.kind, b.who): b for b in bans}


async def test_bans_round_trip_and_survive_a_reopen(engine: Engine) -> None:
    s = engine.store
    assert await s.get_bans() == []
    a = Ban("clientid", "dev-1", "abuse", 1_700_000_000.5, None)
    b = Ban("username", "mallory", "", 1_700_000_001.0, 1_900_000_000.25)
    c = Ban("peerhost", "10.0.0.0/8", "scanner", 1_700_000_002.0, None)
    odd = Ban("clientid", "a\u00e9/#:x y", "r\u00e9ason", 1.0, 2.0)  # any text a client id can hold
    for ban in (a, b, c, odd):
        await s.put_ban(ban)
    assert _by_key(await s.get_bans()) == {(x.kind, x.who): x for x in (a, b, c, odd)}
    # The same (kind, who) replaces; the same `who` under another kind is another ban.
    a2 = Ban("clientid", "dev-1", "again", 1_700_000_010.0, 1_800_000_000.0)
    await s.put_ban(a2)
    same_who = Ban("username", "dev-1")
    await s.put_ban(same_who)
    got = _by_key(await s.get_bans())
    assert len(got) == 5 and got[("clientid", "dev-1")] == a2 and got[("username", "dev-1")] == same_who
    assert await s.delete_ban("username", "dev-1") is True
    assert await s.delete_ban("username", "dev-1") is False
    assert await s.delete_ban("peerhost", "nobody") is False
    await s.sync()
    s = await engine.reopen()
    assert _by_key(await s.get_bans()) == {(x.kind, x.who): x for x in (a2, b, c, odd)}
    assert await s.delete_ban("clientid", "dev-1") is True
    s = await engine.reopen()
    assert ("clientid", "dev-1") not in _by_key(await s.get_bans())


async def test_delete_of_a_lapsed_ban_spares_a_renewed_or_lasting_one(engine: Engine) -> None:
    s = engine.store
    await s.put_ban(Ban("clientid", "lapsed", "", 1.0, 100.0))
    await s.put_ban(Ban("clientid", "forever", "", 1.0, None))
    await s.put_ban(Ban("username", "later", "", 1.0, 300.0))
    assert await s.delete_ban("clientid", "forever", expired_before=200.0) is False
    assert await s.delete_ban("username", "later", expired_before=200.0) is False
    assert await s.delete_ban("clientid", "absent", expired_before=200.0) is False
    # Renewed (by another node) after a reader saw it lapsed: the reader's delete leaves it.
    await s.put_ban(Ban("clientid", "lapsed", "", 150.0, 400.0))
    assert await s.delete_ban("clientid", "lapsed", expired_before=200.0) is False
    await s.put_ban(Ban("clientid", "lapsed", "", 150.0, 200.0))
    assert await s.delete_ban("clientid", "lapsed", expired_before=200.0) is True
    assert sorted(b.who for b in await s.get_bans()) == ["forever", "later"]


def test_ban_codec_refuses_what_is_not_a_ban() -> None:
    ban = Ban("peerhost", "::1", "x", 5.0, 6.0)
    assert decode_ban(encode_ban(ban)) == ban
    for bad in (b"", b"{", b"[]", b'{"kind": "clientid"}', b'{"kind": "other", "who": "x"}',
                b'{"kind": "clientid", "who": "x", "until": "soon"}'):
        assert decode_ban(bad) is None
    assert not ban.expired(5.9) and ban.expired(6.0) and not Ban("clientid", "x").expired(1e12)
