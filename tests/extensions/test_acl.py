"""Tests for extensions.acl (mosquitto acl_file semantics) and the default AllowAll authorizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidewire.extensions.acl import AclFile
from tidewire.extensions.hooks import AllowAll, Authorizer, ClientInfo, SubscribeAccess

ANON = ClientInfo("anon-1", None)
ROGER = ClientInfo("dev-7", "roger")
ALICE = ClientInfo("dev-8", "alice")  # has no user section


def test_allow_all_is_an_authorizer() -> None:
    auth: Authorizer = AllowAll()
    assert auth.allow_publish(ANON, "x") and auth.allow_read(ANON, "x")
    assert auth.subscribe_access(ANON, "#") == SubscribeAccess.GRANTED


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("topic read a\nbogus x\n", 2, "unknown keyword"),
        ("\n\n# c\ntopic\n", 4, "empty topic"),
        ("user\n", 1, "missing username"),
        ("topic rw a/b\n", 1, "invalid access type"),
        ("topic a b\n", 1, "invalid access type"),  # a spaced topic needs an explicit access word
        ("user x\npattern read a/#/b\n", 2, "invalid ACL topic"),
        ("topic write a+\n", 1, "invalid ACL topic"),
    ],
)
def test_parse_errors_name_the_line(text: str, line: int, fragment: str) -> None:
    with pytest.raises(ValueError, match=rf"line {line}: {fragment}"):
        AclFile.parse(text)


def test_load_reads_file_and_reports_path(tmp_path: Path) -> None:
    good = tmp_path / "acl"
    good.write_text("# comment\n\ntopic read public/#\n   # indented comment\n")
    acl = AclFile.load(good)
    assert acl.allow_subscribe(ANON, "public/x")
    bad = tmp_path / "bad"
    bad.write_text("topic read a\n\nfoo\n")
    with pytest.raises(ValueError, match=r"bad: line 3"):
        AclFile.load(bad)


def test_access_word_parsing_edge_cases() -> None:
    acl = AclFile.parse("topic read\ntopic readwrite with space/x\n")
    # A single word is the topic itself, with readwrite access.
    assert acl.allow_publish(ANON, "read") and acl.allow_read(ANON, "read")
    assert acl.allow_publish(ANON, "with space/x")


SECTIONS = """
# anonymous clients only
topic read public/#
topic write anon/in

user roger
topic readwrite roger/#
topic read  shared/#
topic deny roger/secret/#
"""


def test_anonymous_vs_user_sections() -> None:
    acl = AclFile.parse(SECTIONS)
    assert acl.allow_read(ANON, "public/a/b")
    assert not acl.allow_publish(ANON, "public/a")  # read only
    assert acl.allow_publish(ANON, "anon/in")
    assert not acl.allow_read(ANON, "anon/in")  # write only
    assert not acl.allow_publish(ANON, "roger/x")

    # The anonymous list does not apply to clients with a username (mosquitto 2.0).
    assert not acl.allow_read(ROGER, "public/a")
    assert not acl.allow_read(ALICE, "public/a")
    assert not acl.allow_publish(ALICE, "anon/in")

    assert acl.allow_publish(ROGER, "roger/x/y") and acl.allow_read(ROGER, "roger")
    assert acl.allow_read(ROGER, "shared/q") and not acl.allow_publish(ROGER, "shared/q")
    # deny wins over the broader grant, whatever the line order
    assert not acl.allow_publish(ROGER, "roger/secret/k")
    assert not acl.allow_read(ROGER, "roger/secret")
    # Same username, different client id: same section.
    assert acl.allow_publish(ClientInfo("other-id", "roger"), "roger/z")


def test_repeated_user_sections_merge() -> None:
    acl = AclFile.parse("user roger\ntopic a\nuser bob\ntopic b\nuser roger\ntopic c\n")
    assert acl.allow_publish(ROGER, "a") and acl.allow_publish(ROGER, "c")
    assert not acl.allow_publish(ROGER, "b")


def test_empty_file_denies_everything() -> None:
    acl = AclFile.parse("# nothing\n")
    assert not acl.allow_publish(ANON, "a") and not acl.allow_subscribe(ROGER, "a")


PATTERNS = """
pattern readwrite devices/%c/#
pattern read users/%u/inbox
pattern write $SYS/broker/connection/%c/state
pattern deny devices/%c/locked
pattern read broadcast/+
"""


def test_patterns_substitute_client_id_and_username() -> None:
    acl = AclFile.parse(PATTERNS)
    assert acl.allow_publish(ROGER, "devices/dev-7/t")
    assert not acl.allow_publish(ROGER, "devices/dev-8/t")
    assert acl.allow_publish(ALICE, "devices/dev-8/t")
    assert not acl.allow_publish(ROGER, "devices/dev-7/locked")
    assert acl.allow_read(ROGER, "users/roger/inbox")
    assert not acl.allow_read(ROGER, "users/alice/inbox")
    assert acl.allow_publish(ROGER, "$SYS/broker/connection/dev-7/state")
    assert acl.allow_read(ROGER, "broadcast/news")  # pattern without %c/%u applies to all
    # %u patterns never match anonymous clients, %c ones still do.
    assert not acl.allow_read(ANON, "users/%u/inbox")
    assert acl.allow_publish(ANON, "devices/anon-1/x")


def test_pattern_guard_against_wildcard_ids() -> None:
    acl = AclFile.parse(PATTERNS)
    assert not acl.allow_publish(ClientInfo("a+", "roger"), "devices/a+/x")
    assert not acl.allow_read(ClientInfo("ok", "ev#l"), "broadcast/news")


def test_substitution_is_single_pass() -> None:
    acl = AclFile.parse("pattern read x/%c/%u\n")
    tricky = ClientInfo("%u", "bob")
    assert acl.allow_read(tricky, "x/%u/bob")
    assert not acl.allow_read(tricky, "x/bob/bob")


def test_user_list_grant_beats_pattern_deny() -> None:
    # mosquitto checks the user's topic list first; a grant there returns before patterns are looked at.
    acl = AclFile.parse("pattern deny data/%u\nuser roger\ntopic data/roger\n")
    assert acl.allow_publish(ROGER, "data/roger")
    acl2 = AclFile.parse("pattern deny data/%u\npattern readwrite data/#\n")
    assert not acl2.allow_publish(ROGER, "data/roger")
    assert acl2.allow_publish(ROGER, "data/other")


def test_dollar_topics_need_dollar_rules() -> None:
    acl = AclFile.parse("topic readwrite #\ntopic read $SYS/broker/#\ntopic readwrite +/x\n")
    assert acl.allow_publish(ANON, "a/b")
    assert not acl.allow_publish(ANON, "$SYS/x")
    assert not acl.allow_read(ANON, "$SYS/x")
    assert acl.allow_read(ANON, "$SYS/broker/load")
    assert not acl.allow_read(ANON, "$other/x")
    assert acl.allow_subscribe(ANON, "#")
    assert not acl.allow_subscribe(ANON, "$SYS/#")
    assert acl.allow_subscribe(ANON, "$SYS/broker/+")


def test_subscribe_requires_covering_read_grant() -> None:
    acl = AclFile.parse("topic read sensors/#\ntopic read rooms/+\ntopic write cmd/#\n")
    assert acl.allow_subscribe(ANON, "sensors/+/temp")
    assert acl.allow_subscribe(ANON, "sensors/#")
    assert acl.allow_subscribe(ANON, "sensors")
    assert acl.allow_subscribe(ANON, "rooms/kitchen")
    assert acl.allow_subscribe(ANON, "rooms/+")
    assert not acl.allow_subscribe(ANON, "rooms/#")  # would match rooms/a/b
    assert not acl.allow_subscribe(ANON, "rooms/a/b")
    assert not acl.allow_subscribe(ANON, "cmd/x")  # write-only
    assert not acl.allow_subscribe(ANON, "+/temp")  # wildcard first level exceeds literal grants
    assert not acl.allow_subscribe(ANON, "#")


def test_subscribe_refused_when_a_deny_overlaps() -> None:
    acl = AclFile.parse("topic read #\ntopic deny secret/#\ntopic deny +/private\n")
    assert acl.allow_subscribe(ANON, "public/x/+")
    assert acl.allow_subscribe(ANON, "public/news")
    assert not acl.allow_subscribe(ANON, "public/+")  # could match public/private
    assert not acl.allow_subscribe(ANON, "#")  # overlaps secret/#
    assert not acl.allow_subscribe(ANON, "secret/a")
    assert not acl.allow_subscribe(ANON, "+/+")  # overlaps +/private
    assert not acl.allow_subscribe(ANON, "home/private")
    assert acl.allow_subscribe(ANON, "home/public")
    # Publish/read of a concrete topic only sees denies that match it.
    assert acl.allow_read(ANON, "public/x") and not acl.allow_read(ANON, "secret/x")


def test_subscribe_with_patterns() -> None:
    acl = AclFile.parse(PATTERNS)
    assert acl.allow_subscribe(ROGER, "devices/dev-7/+/temp")
    assert acl.allow_subscribe(ROGER, "devices/dev-7/temp")
    assert not acl.allow_subscribe(ROGER, "devices/dev-7/#")  # overlaps the deny pattern
    assert not acl.allow_subscribe(ROGER, "devices/+/temp")
    assert not acl.allow_subscribe(ROGER, "devices/dev-7/locked")
    assert not acl.allow_subscribe(ROGER, "devices/dev-7/+")  # overlaps the deny pattern
    assert acl.allow_subscribe(ROGER, "users/roger/inbox")
    assert not acl.allow_subscribe(ANON, "users/+/inbox")


def test_per_client_cache_is_bounded_and_correct() -> None:
    acl = AclFile.parse(PATTERNS, cache_size=2)
    clients = [ClientInfo(f"c{i}", f"u{i}") for i in range(5)]
    for _ in range(2):
        for c in clients:
            assert acl.allow_publish(c, f"devices/{c.client_id}/x")
            assert not acl.allow_publish(c, "devices/someone-else/x")
            assert acl.allow_read(c, f"users/{c.username}/inbox")
    assert len(acl._cache) == 2
    with pytest.raises(ValueError):
        AclFile.parse("", cache_size=0)


def test_big_file_lookup_uses_indexes() -> None:
    lines = [f"topic readwrite site{i}/+/data" for i in range(20000)]
    lines.append("topic deny site5/blocked/data")
    acl = AclFile.parse("\n".join(lines))
    assert acl.allow_publish(ANON, "site19999/a/data")
    assert not acl.allow_publish(ANON, "site5/blocked/data")
    assert not acl.allow_publish(ANON, "site20000/a/data")
    assert acl.allow_subscribe(ANON, "site7/+/data")


def test_subscribe_access_grants_filters_or_denies() -> None:
    acl = AclFile.parse("topic read shared/#\ntopic deny shared/secret/#\ntopic read public/+\n")
    assert acl.subscribe_access(ANON, "public/x") == SubscribeAccess.GRANTED
    # overlaps a deny: granted, but each delivery is checked
    assert acl.subscribe_access(ANON, "shared/#") == SubscribeAccess.FILTERED
    assert acl.allow_read(ANON, "shared/a") and not acl.allow_read(ANON, "shared/secret/a")
    assert acl.subscribe_access(ANON, "#") == SubscribeAccess.FILTERED
    assert acl.subscribe_access(ANON, "public/#") == SubscribeAccess.FILTERED
    assert acl.subscribe_access(ANON, "private/#") == SubscribeAccess.DENIED
    assert acl.subscribe_access(ANON, "shared/secret/x") == SubscribeAccess.DENIED
