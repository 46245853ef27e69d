"""The tenants' pure rules (`gateway.core.tenants`): names, mounting topics and filters (shared ones, `$SYS`),
the reserved space, which tenant a client is in (listener, identity, user map, conflicts), AMQP vhosts and RocketMQ
namespaces, and the per-tenant limits with the time passed in."""

from __future__ import annotations

import pytest

from tidewire.extensions.hooks import ClientInfo
from tidewire.gateway.config import Settings
from tidewire.gateway.core.tenants import (
    MESSAGE_RATE,
    QUOTA,
    RATE,
    RETAINED_BYTES,
    Limits,
    Tenant,
    TenantConflict,
    Tenants,
    closed_to,
    mount_filter,
    mount_topic,
    reserved,
    resolve,
    tenant_of,
    tenants_from_settings,
    unmount,
    valid_tenant_name,
    vhost_mount,
    vhosts_allowed,
)
from tidewire.gateway.core.topics import matches
from tidewire.gateway.transport.ratelimit import TokenBucket

M = "$tenant/acme/"


def test_names_are_one_safe_level() -> None:
    assert all(valid_tenant_name(n) for n in ("acme", "a-b_c.d", "x" * 64))
    assert not any(valid_tenant_name(n) for n in ("", "a/b", "a+", "#", "$x", "p2p", "..", "x" * 65, "a b"))
    with pytest.raises(ValueError, match="invalid tenant names"):
        Settings(tenant_users={"u": "bad/name"})


def test_mounting_and_unmounting() -> None:
    assert mount_topic(M, "a/b") == "$tenant/acme/a/b"
    assert mount_topic(M, "$SYS/broker/uptime") == "$SYS/broker/uptime"  # the broker's, never mounted
    assert mount_filter(M, "#") == "$tenant/acme/#"
    assert mount_filter(M, "$share/g/a/+") == "$share/g/$tenant/acme/a/+"
    assert unmount(M, "$tenant/acme/a/b") == "a/b"
    assert unmount(M, "$tenant/other/a") == "$tenant/other/a"
    assert tenant_of("$tenant/acme/a") == "acme" and tenant_of("a/b") is None
    assert vhost_mount("/") == "" and vhost_mount("acme") == M


def test_a_mounted_wildcard_never_reaches_another_tenant_or_the_default() -> None:
    mine, theirs, default = mount_topic(M, "s/1"), mount_topic("$tenant/globex/", "s/1"), "s/1"
    assert matches(mount_filter(M, "#"), mine) and not matches(mount_filter(M, "#"), theirs)
    assert not matches("#", mine) and not matches("+/#", mine)  # spec 4.7.2: `$` topics and leading wildcards
    assert not matches(mount_filter(M, "#"), default)
    assert matches("$tenant/+/s/1", mine) and matches("$tenant/+/s/1", theirs)  # a superuser's view


def test_the_reserved_space_is_a_default_superusers_only() -> None:
    assert reserved("$tenant/acme/x") and reserved("$tenant") and reserved("$share/g/$tenant/#")
    assert not reserved("$tenantx/a") and not reserved("tenant/a")
    anyone, root = ClientInfo("c", "u"), ClientInfo("c", "root", superuser=True)
    in_acme = ClientInfo("c", "u", superuser=True, tenant="acme")
    assert closed_to(anyone, "$tenant/acme/x") and not closed_to(root, "$tenant/acme/x")
    assert closed_to(in_acme, "$tenant/globex/x")  # a tenant's superuser stays in its tenant
    assert not closed_to(anyone, "a/b")


def test_which_tenant() -> None:
    users = {"alice": "acme"}
    assert resolve(None, None, "alice", users) == "acme"
    assert resolve(None, "globex", "alice", users) == "globex"  # the source's record wins over the map
    assert resolve("acme", None, "bob", users) == "acme"
    assert resolve("acme", "acme", None, users) == "acme"
    assert resolve(None, None, "bob", users) is None and resolve(None, None, None, users) is None
    with pytest.raises(TenantConflict):
        resolve("acme", "globex", None, users)
    tenants = Tenants({}, Limits(), {}, {}, [], TokenBucket)
    with pytest.raises(TenantConflict):
        tenants.tenant_for("mqtt", "../x", None)  # a source's name must be a valid one too


def test_tenants_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tidewire.gateway.core.tenants.MAX_TENANTS", 2)
    tenants = Tenants({}, Limits(), {}, {}, [], TokenBucket)
    tenants.get("a"), tenants.get("b")
    assert tenants.get("a").name == "a"  # known ones still answer
    with pytest.raises(TenantConflict, match="more than 2 tenants"):
        tenants.tenant_for("mqtt", "c", None)


def test_vhosts_and_namespaces() -> None:
    assert vhosts_allowed("acme", False, frozenset({"/"}))("acme")
    assert not vhosts_allowed("acme", True, frozenset({"/"}))("/")
    root = vhosts_allowed(None, True, frozenset({"/"}))
    assert root("/") and root("globex") and not root("a/b")
    plain = vhosts_allowed(None, False, frozenset({"/"}))
    assert plain("/") and not plain("acme")
    tenants = Tenants({}, Limits(), {}, {"acme-key": "acme"}, ["root"], TokenBucket)
    assert tenants.namespace_tenant("rocketmq", "", "acme-key").name == "acme"  # type: ignore[union-attr]
    assert tenants.namespace_tenant("rocketmq", "globex", "root").name == "globex"  # type: ignore[union-attr]
    assert tenants.namespace_tenant("rocketmq", "", "plain") is None
    for namespace, key in (("globex", "acme-key"), ("acme", "plain"), ("acme", None), ("a/b", "root")):
        with pytest.raises(TenantConflict):
            tenants.namespace_tenant("rocketmq", namespace, key)


def test_connection_limits() -> None:
    tenant = Tenant("acme", Limits(max_connections=2, max_connection_rate=2), TokenBucket)
    assert tenant.admit_connection(0.0) is None
    tenant.connections = 2
    assert tenant.admit_connection(0.0) == QUOTA  # full: refused before the rate is charged
    tenant.connections = 1
    assert tenant.admit_connection(0.0) is None  # the bucket's second token
    assert tenant.admit_connection(0.1) == RATE
    assert tenant.admit_connection(0.6) is None  # refilled at 2/s
    assert tenant.refused == {QUOTA: 1, RATE: 1, MESSAGE_RATE: 0, RETAINED_BYTES: 0}


def test_message_rate() -> None:
    tenant = Tenant("acme", Limits(max_message_rate=10), TokenBucket)
    taken = sum(tenant.admit_message(0.0) is None for _ in range(15))
    assert taken == 10 and tenant.refused[MESSAGE_RATE] == 5 and tenant.messages_in == 10
    assert tenant.admit_message(0.1) is None  # one more token after 0.1 s at 10/s
    unlimited = Tenant("free", Limits(), TokenBucket)
    assert all(unlimited.admit_message(0.0, 1000) is None for _ in range(1000))


def test_retained_bytes() -> None:
    tenants = Tenants({"acme": Limits(max_retained_bytes=100, max_message_rate=3)}, Limits(), {}, {}, [], TokenBucket)
    tenant = tenants.get("acme")
    tenant.retained_measured = 60  # as measured in the store
    assert tenant.admit_message(0.0, 30) is None
    assert tenant.admit_message(0.0, 20) == RETAINED_BYTES  # 60 + 30 admitted + 20 > 100
    assert tenant.admit_message(0.0, 0) is None  # not retained (or a delete): never counted
    tenants.retained_landed("$tenant/acme/a", 30)  # set in the store: counted until the next measure
    tenants.retained_landed("$tenant/other/a", 500)  # another tenant's
    tenants.retained_landed("a", 500)  # the default tenant's
    assert (tenant.retained_admitted, tenant.retained_landed, tenant.retained_bytes) == (0, 30, 90)
    assert tenant.admit_message(0.0, 10) is None  # the bucket's last token; 100 bytes fit
    assert tenant.admit_message(0.0, 0) == MESSAGE_RATE
    tenant.retained_measured, tenant.retained_landed = 50, 0  # a measure: some were deleted or replaced
    assert tenant.admit_message(0.0, 30) == MESSAGE_RATE  # over the rate: its bytes are not kept admitted
    assert tenant.retained_bytes == 60
    assert tenant.refused == {QUOTA: 0, RATE: 0, MESSAGE_RATE: 2, RETAINED_BYTES: 1}


def test_from_settings() -> None:
    settings = Settings(tenants={"acme": {"max_connections": 3}, "*": {"max_message_rate": 5}},
                        tenant_listeners={"ws": "acme"}, tenant_users={"bob": "globex"}, tenant_superusers=["root"])
    tenants = tenants_from_settings(settings, TokenBucket)
    assert [t.name for t in tenants.all()] == ["acme"]  # configured ones from the start
    acme = tenants.tenant_for("ws", None, "anyone")
    assert acme is not None and acme.limits.max_connections == 3
    globex = tenants.tenant_for("mqtt", None, "bob")
    assert globex is not None and globex.limits.max_message_rate == 5  # an unlisted tenant: the defaults
    assert tenants.tenant_for("mqtt", None, "carol") is None
    assert tenants.find("nobody") is None and "root" in tenants.superusers
