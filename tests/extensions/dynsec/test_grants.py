"""Mosquitto's ACL evaluation for dynamic-security clients, sans-IO (`extensions.dynsec.grants`): priorities, allow
and deny, literal before pattern, groups after the client's own roles, defaults (never for `$CONTROL`), and `%c`/`%u`
with the wildcard-injection guard; and the authorizer built on it reading the configuration in force."""

from __future__ import annotations

from tidewire.extensions.dynsec.grants import Grants, covers
from tidewire.extensions.dynsec.model import (
    PUBLISH_RECEIVE,
    PUBLISH_SEND,
    SUBSCRIBE_LITERAL,
    SUBSCRIBE_PATTERN,
    Acl,
    Client,
    Config,
    Group,
    Link,
    Role,
)
from tidewire.extensions.dynsec.source import DynsecAuthorizer, DynsecState
from tidewire.extensions.hooks import ClientInfo, SubscribeAccess


def _config(*roles: Role, client_roles: list[Link], groups: list[Group] = (), client_groups: list[Link] = ()) -> Config:
    config = Config()
    for role in roles:
        config.roles[role.rolename] = role
    for group in groups:
        config.groups[group.groupname] = group
    config.clients["u"] = Client("u", roles=client_roles, groups=list(client_groups))
    return config


def test_covers_is_mosquittos_sub_acl_check() -> None:
    assert covers("#", "a/b/#") and covers("#", "$SYS/x")
    assert covers("a/+/c", "a/b/c") and covers("a/+/c", "a/+/c") and not covers("a/+/c", "a/#")
    assert covers("a/#", "a/+/c/#") and covers("a/#", "a")  # `a/#` matches its parent level too
    assert not covers("a/b", "a/b/c") and not covers("a/b/c", "a/b") and not covers("a/+", "a/#")


def test_priority_and_deny_decide_first_match() -> None:
    high = Role("high", acls=[Acl(PUBLISH_SEND, "a/secret", 9, False), Acl(PUBLISH_SEND, "a/#", 1, True)])
    low = Role("low", acls=[Acl(PUBLISH_SEND, "a/secret", 0, True)])
    grants = Grants(_config(high, low, client_roles=[Link("low", 1), Link("high", 5)]))
    assert grants.may_publish("u", "c", "a/x")
    assert not grants.may_publish("u", "c", "a/secret")  # the higher-priority role's deny wins
    flipped = Grants(_config(high, low, client_roles=[Link("low", 10), Link("high", 5)]))
    assert flipped.may_publish("u", "c", "a/secret")
    assert not grants.may_publish("u", "c", "b")  # default publishClientSend: deny


def test_subscribe_literal_before_pattern_and_groups_after_own_roles() -> None:
    role = Role("r", acls=[Acl(SUBSCRIBE_PATTERN, "a/#", 9, True), Acl(SUBSCRIBE_LITERAL, "a/no", 0, False)])
    group_role = Role("g", acls=[Acl(SUBSCRIBE_PATTERN, "b/+", 0, True)])
    grants = Grants(_config(role, group_role, client_roles=[Link("r")],
                            groups=[Group("grp", roles=[Link("g")])], client_groups=[Link("grp")]))
    assert grants.may_subscribe("u", "c", "a/+/x")
    assert not grants.may_subscribe("u", "c", "a/no")  # the literal decides before any pattern of its role
    assert grants.may_subscribe("u", "c", "b/1") and not grants.may_subscribe("u", "c", "b/#")
    assert not grants.may_subscribe("u", "c", "c")


def test_defaults_never_reach_control_topics() -> None:
    grants = Grants(_config(client_roles=[]))
    assert grants.may_receive("u", "c", "any/topic")  # default publishClientReceive: allow
    assert not grants.may_receive("u", "c", "$CONTROL/dynamic-security/v1/response")
    grants.config.defaults[PUBLISH_SEND] = True
    assert grants.may_publish("u", "c", "x") and not grants.may_publish("u", "c", "$CONTROL/dynamic-security/v1")


def test_client_id_and_user_name_patterns_with_injection_guard() -> None:
    role = Role("r", acls=[Acl(PUBLISH_SEND, "dev/%c/up", 0, True), Acl(SUBSCRIBE_PATTERN, "users/%u/#", 0, True),
                           Acl(SUBSCRIBE_LITERAL, "lit/%c", 0, True)])
    grants = Grants(_config(role, client_roles=[Link("r")]))
    assert grants.may_publish("u", "d1", "dev/d1/up") and not grants.may_publish("u", "d1", "dev/d2/up")
    assert grants.may_subscribe("u", "d1", "users/u/+") and not grants.may_subscribe("u", "d1", "users/v/+")
    assert grants.may_subscribe("u", "d1", "lit/d1")
    # A client id with a wildcard would widen the grant: the ACL naming it gives nothing.
    assert not grants.may_publish("u", "+", "dev/x/up") and not grants.may_subscribe("u", "#", "lit/#")
    assert not grants.may_subscribe("u", "a/b", "lit/a/b")  # a literal names one level's worth exactly


def test_authorizer_reads_the_configuration_in_force() -> None:
    state = DynsecState(iterations=2)
    role = Role("r", acls=[Acl(SUBSCRIBE_PATTERN, "t/#", 0, True), Acl(PUBLISH_SEND, "t/#", 0, True)])
    config = _config(role, client_roles=[Link("r")])
    state.install(config, 1)
    authorizer = DynsecAuthorizer(state)
    info = ClientInfo("c", "u", acl=authorizer)
    assert authorizer.allow_publish(info, "t/1")
    assert authorizer.subscribe_access(info, "t/#") == SubscribeAccess.GRANTED  # receive is allowed by default
    denying = config.clone()
    denying.roles["r"].acls.append(Acl(PUBLISH_RECEIVE, "t/private", 0, False))
    state.install(denying, 2)
    assert authorizer.subscribe_access(info, "t/#") == SubscribeAccess.FILTERED
    assert not authorizer.allow_read(info, "t/private") and authorizer.allow_read(info, "t/open")
    revoked = denying.clone()
    revoked.roles["r"].acls = []
    state.install(revoked, 3)
    assert authorizer.subscribe_access(info, "t/#") == SubscribeAccess.DENIED
    assert not authorizer.allow_publish(info, "t/1")
    state.install(Config(), 4)  # the client was deleted: nothing at all
    assert not authorizer.allow_read(info, "anything")


async def test_source_accepts_the_password_and_refuses_disabled_or_foreign_ids() -> None:
    from tidewire.extensions.authentication import AuthRequest, Outcome
    from tidewire.extensions.dynsec.source import DynsecAuthenticator

    state = DynsecState(iterations=2)
    config = Config()
    config.clients["u"] = Client("u", state.hash_password("pw"), tenant="acme")
    config.clients["bound"] = Client("bound", state.hash_password("pw"), clientid="only-me")
    config.clients["off"] = Client("off", state.hash_password("pw"), disabled=True)
    config.clients["nopw"] = Client("nopw")
    state.install(config, 1)
    source = DynsecAuthenticator(state)
    ok = await source.authenticate(AuthRequest("c", "u", b"pw"))
    assert ok.outcome is Outcome.ALLOW and ok.acl is source.authorizer and ok.tenant == "acme"
    assert (await source.authenticate(AuthRequest("c", "u", b"wrong"))).outcome is Outcome.DENY
    assert (await source.authenticate(AuthRequest("c", "u", b"pw\x00"))).outcome is Outcome.DENY
    assert (await source.authenticate(AuthRequest("c", "off", b"pw"))).outcome is Outcome.DENY
    assert (await source.authenticate(AuthRequest("other", "bound", b"pw"))).outcome is Outcome.DENY
    assert (await source.authenticate(AuthRequest("only-me", "bound", b"pw"))).outcome is Outcome.ALLOW
    for request in (AuthRequest("c", "ghost", b"pw"), AuthRequest("c", "nopw", b"pw"), AuthRequest("c", None, None),
                    AuthRequest("c", "u", None)):
        assert (await source.authenticate(request)).outcome is Outcome.IGNORE  # the next source decides


def test_control_guard_keeps_the_control_topics_for_clients_with_grants() -> None:
    from tidewire.extensions.dynsec.source import ControlTopicGuard

    guard = ControlTopicGuard()
    plain = ClientInfo("c", "file-user")  # accepted by the password file, no grants of its own, no ACL file
    own = ClientInfo("c", "u", acl=DynsecAuthorizer(DynsecState()))
    for topic_filter in ("$CONTROL/dynamic-security/v1/response", "$CONTROL/#", "$CONTROL/+/v1/response",
                         "$CONTROL/dynamic-security/#"):
        assert guard.subscribe_access(plain, topic_filter) == SubscribeAccess.DENIED, topic_filter
        assert guard.subscribe_access(own, topic_filter) == SubscribeAccess.GRANTED  # its roles decide
    assert not guard.allow_publish(plain, "$CONTROL/dynamic-security/v1/response")  # no forged answers
    assert not guard.allow_read(plain, "$CONTROL/dynamic-security/v1/response")
    for other in ("$CONTROL/other-feature/v1", "#", "a/$CONTROL/dynamic-security", "$SYS/#"):
        assert guard.subscribe_access(plain, other) == SubscribeAccess.GRANTED, other
    assert guard.allow_publish(plain, "sensors/1")
