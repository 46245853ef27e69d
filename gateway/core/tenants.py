"""Tenants, sans-IO: which tenant a client belongs to, its mount point, and its limits and counts on this node.

A tenant's topics live under its mount point `$tenant/<name>/`: a tenant client publishing `a/b` writes
`$tenant/x/a/b`, subscribing `a/#` reads `$tenant/x/a/#`, and sees its topics without the mount. Why that form:

- invisible to the others: MQTT never matches a topic starting with `$` against a filter whose first level is a
  wildcard (spec 4.7.2), so no `#` or `+/...` subscriber of the default tenant sees a tenant's messages, and a
  tenant client's own `#` is mounted to `$tenant/x/#`, which never reaches `$tenant/y/...`. What a default-tenant
  client could still name by hand (`$tenant/...` topics and filters, `$tenant/...` client ids) is refused unless it
  is a superuser (`reserved`).
- a superuser of the default tenant addresses every tenant in MQTT's own terms: `$tenant/x/#` (one tenant),
  `$tenant/+/alerts` (one topic in all of them), `$tenant/#` (everything of every tenant).
- the light queues: a message is indexed into its topic's queue and its first level's queue. Every tenant's
  messages share the first level `$tenant`, so `$tenant/#` is the superuser's feed of all tenants at no extra
  write (it is the queue they were indexed into anyway); a tenant's own `a/#` becomes the wildcard
  `$tenant/x/a/#` (registered like any wildcard). A name inside the first level (`$tenant.x/...`) would keep a
  first-level queue per tenant, but then no filter could name every tenant at once, and its second level would be
  the tenant client's own first level, where `<first>/p2p/<id>` would let it address any client's P2P queue; here
  the second level is the tenant's name, which may not be `p2p`.

Client ids are scoped per tenant, as VerneMQ scopes them by mountpoint: a tenant client's session, takeover and
will are keyed by `$tenant/x/<id>`, so `dev1` of x and `dev1` of y are two sessions and a takeover across tenants
cannot happen; the client still sees (and ACL patterns' `%c` still read) its own `dev1`. `$SYS` is not mounted.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from tidewire.errors import TidewireError

if TYPE_CHECKING:
    from tidewire.extensions.hooks import ClientInfo
    from tidewire.gateway.config import TenantLimits, TenantSettings
    from tidewire.store.base import Store

ROOT = "$tenant"
PREFIX = ROOT + "/"
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
RESERVED_NAMES = frozenset({"p2p"})  # `<first>/p2p/<clientId>` is a P2P topic: `$tenant/p2p/...` would be one
_SHARE = "$share/"
ANY_TENANT = "*"  # the `tenants` setting's entry for every tenant it does not list
MAX_TENANTS = 100_000  # tenants a node keeps counts of (names come from signed tokens and sources: still bounded)

# Why a tenant refused a client or a message (the metrics' `reason` label).
QUOTA = "quota"
RATE = "rate"
MESSAGE_RATE = "message_rate"
RETAINED_BYTES = "retained_bytes"
REFUSALS = (QUOTA, RATE, MESSAGE_RATE, RETAINED_BYTES)
_MEASURE_PAGE = 1024  # retained messages read per store call while a tenant's retained bytes are measured


def valid_tenant_name(name: str) -> bool:
    """A tenant name is one topic level of safe characters: never `/`, `+`, `#`, `$`, nor a P2P level."""
    return bool(_NAME.fullmatch(name)) and name not in RESERVED_NAMES and name not in (".", "..")


def mount_point(tenant: str) -> str:
    return f"{PREFIX}{tenant}/"


def split_shared(topic_filter: str) -> tuple[str, str]:
    """`$share/g/a/b` → (`$share/g/`, `a/b`); any other filter → ("", filter)."""
    if topic_filter.startswith(_SHARE):
        slash = topic_filter.find("/", len(_SHARE))
        if slash > 0:
            return topic_filter[:slash + 1], topic_filter[slash + 1:]
    return "", topic_filter


def reserved(topic_or_filter: str) -> bool:
    """Does it name the tenants' space (only a default-tenant superuser may)? Shared filters by their filter."""
    _, plain = split_shared(topic_or_filter)
    return plain == ROOT or plain.startswith(PREFIX)


def mount_topic(mount: str, topic: str) -> str:
    """The stored topic of a tenant client's topic (`$SYS` is the broker's, never mounted)."""
    return topic if topic.startswith("$SYS") else mount + topic


def mount_filter(mount: str, topic_filter: str) -> str:
    """The stored filter of a tenant client's filter; a shared one keeps its group, mounted inside it."""
    share, plain = split_shared(topic_filter)
    return topic_filter if plain.startswith("$SYS") else share + mount + plain


def unmount(mount: str, topic: str) -> str:
    """What a tenant client is shown of a stored topic."""
    return topic[len(mount):] if topic.startswith(mount) else topic


def client_mount(client: ClientInfo) -> str:
    """The mount point of the client's tenant ("": the default tenant)."""
    return "" if client.tenant is None else mount_point(client.tenant)


def vhost_mount(vhost: str) -> str:
    """The mount point of an AMQP virtual host: a tenant's vhost is named as the tenant, `/` is the default's."""
    return "" if vhost == "/" else mount_point(vhost)


def vhosts_allowed(tenant: str | None, superuser: bool, configured: frozenset[str]) -> Callable[[str], bool]:
    """Which AMQP vhosts a client may open: a tenant client its tenant's only; a default-tenant superuser the
    configured ones and every tenant's; any other client the configured ones (`/`)."""
    if tenant is not None:
        return frozenset({tenant}).__contains__
    if superuser:
        return lambda vhost: vhost in configured or valid_tenant_name(vhost)
    return configured.__contains__


def closed_to(client: ClientInfo, topic_or_filter: str) -> bool:
    """Is a topic or filter of the tenants' space, as a client wrote it, closed to this client? Open only to a
    default-tenant superuser (a tenant client's own `$tenant/...` is mounted inside its space: also refused)."""
    return reserved(topic_or_filter) and (client.tenant is not None or not client.superuser)


def tenant_of(topic: str) -> str | None:
    """The tenant whose space a stored topic is in; None: the default tenant's."""
    if not topic.startswith(PREFIX):
        return None
    end = topic.find("/", len(PREFIX))
    return topic[len(PREFIX):end] if end > 0 else None


class TenantConflict(TidewireError):
    """The listener fixes one tenant and the client's identity names another (or a source named no valid one)."""


def resolve(listener_tenant: str | None, identity_tenant: str | None, username: str | None,
            users: dict[str, str]) -> str | None:
    """A client's tenant: its listener's, else its identity's (a JWT claim, a source's `AuthDecision.tenant`),
    else `users[username]`; None: the default tenant. `TenantConflict` when the listener and the identity differ."""
    if listener_tenant is not None:
        if identity_tenant is not None and identity_tenant != listener_tenant:
            raise TenantConflict(f"identity of tenant {identity_tenant!r} on the listener of {listener_tenant!r}")
        return listener_tenant
    if identity_tenant is not None:
        return identity_tenant
    return users.get(username) if username is not None else None


class Bucket(Protocol):
    """A token bucket (`gateway.transport.ratelimit.TokenBucket`): `take` one token at `now`, or refuse."""

    def take(self, now: float, n: float = 1) -> bool: ...


BucketFactory = Callable[[float, float, float], Bucket]  # (rate per s, burst, now) → a full bucket


@dataclass(slots=True)
class Limits:
    """A tenant's limits on one node (0: no limit); `gateway.config.TenantLimits` is their settings form."""

    max_connections: int = 0
    max_connection_rate: float = 0.0
    max_message_rate: float = 0.0
    max_retained_bytes: int = 0


@dataclass(slots=True)
class Tenant:
    """One tenant on this node: its mount, its limits, its live counts. Time is passed in (`now`, monotonic s)."""

    name: str
    limits: Limits
    bucket: BucketFactory  # makes its rate limits' buckets
    mount: str = ""
    connections: int = 0
    messages_in: int = 0
    messages_out: int = 0
    refused: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REFUSALS, 0))
    _connects: Bucket | None = None
    _messages: Bucket | None = None
    # Its stored bytes: the payload bytes of its retained messages as last measured in the store
    # (`measure_retained`), plus those the store set since that measure began, plus those admitted and not yet set.
    # A replacement counts as growth until the next measure says otherwise (as `RetainedQuota` for the node's caps).
    retained_measured: int = 0
    retained_landed: int = 0
    retained_admitted: int = 0

    def __post_init__(self) -> None:
        self.mount = mount_point(self.name)

    @property
    def retained_bytes(self) -> int:
        return self.retained_measured + self.retained_landed + self.retained_admitted


    def admit_connection(self, now: float) -> str | None:
        """None: one more client may connect (counted by `connected`); else why not (`QUOTA`, `RATE`)."""
        limits = self.limits
        if limits.max_connections and self.connections >= limits.max_connections:
            self.refused[QUOTA] += 1
            return QUOTA
        if limits.max_connection_rate:
            if self._connects is None:
                self._connects = self.bucket(limits.max_connection_rate, max(limits.max_connection_rate, 1.0), now)
            if not self._connects.take(now):
                self.refused[RATE] += 1
                return RATE
        return None

    def admit_message(self, now: float, retained_size: int = 0) -> str | None:
        """None: a tenant client's PUBLISH (`retained_size`: the payload bytes of a retained one with a payload)
        may be taken now; else why not (`MESSAGE_RATE`, `RETAINED_BYTES`). Counts it either way."""
        capped = retained_size and self.limits.max_retained_bytes
        if capped:
            if self.retained_bytes + retained_size > self.limits.max_retained_bytes:
                self.refused[RETAINED_BYTES] += 1
                return RETAINED_BYTES
            self.retained_admitted += retained_size
        rate = self.limits.max_message_rate
        if rate:
            if self._messages is None:
                self._messages = self.bucket(rate, max(rate, 1.0), now)
            if not self._messages.take(now):
                if capped:
                    self.retained_admitted -= retained_size  # never taken
                self.refused[MESSAGE_RATE] += 1
                return MESSAGE_RATE
        self.messages_in += 1
        return None


class Tenants:
    """This node's tenants: configured ones from the start, others as their first client arrives (a JWT claim, a
    source's record); each keeps its counts for the metrics and the admin API while the node runs."""

    __slots__ = ("_by_name", "_configured", "bucket", "defaults", "listeners", "superusers", "users")

    def __init__(self, configured: dict[str, Limits], defaults: Limits, listeners: dict[str, str],
                 users: dict[str, str], superusers: list[str], bucket: BucketFactory) -> None:
        self._configured = configured
        self.bucket = bucket
        self.defaults = defaults
        self.listeners = listeners
        self.users = users
        self.superusers = frozenset(superusers)
        self._by_name: dict[str, Tenant] = {name: Tenant(name, limits, bucket) for name, limits in configured.items()}

    def get(self, name: str) -> Tenant:
        """The tenant, made on its first client; `TenantConflict` past `MAX_TENANTS` (each keeps its counts)."""
        tenant = self._by_name.get(name)
        if tenant is None:
            if len(self._by_name) >= MAX_TENANTS:
                raise TenantConflict(f"more than {MAX_TENANTS} tenants on this node")
            tenant = self._by_name[name] = Tenant(name, self._configured.get(name, self.defaults), self.bucket)
        return tenant

    def retained_landed(self, topic: str, payload_size: int) -> None:
        """The store set the retained entry of a tenant's topic (`RetainedQuota.landed`)."""
        name = tenant_of(topic)
        tenant = self._by_name.get(name) if name is not None else None
        if tenant is not None and tenant.limits.max_retained_bytes:
            tenant.retained_admitted = max(0, tenant.retained_admitted - payload_size)
            tenant.retained_landed += payload_size

    def find(self, name: str) -> Tenant | None:
        """The tenant if this node knows it (`get` makes it)."""
        return self._by_name.get(name)

    def all(self) -> list[Tenant]:
        return sorted(self._by_name.values(), key=lambda t: t.name)

    def namespace_tenant(self, listener: str, namespace: str, username: str | None) -> Tenant | None:
        """The tenant a RocketMQ call acts in, from its namespace (`x-mq-namespace`): a tenant's access key acts in
        its tenant's (the namespace empty or its name), a default-tenant superuser in any tenant it names, any
        other caller in the default one only (namespace empty). `TenantConflict` for any other namespace."""
        own = self.tenant_for(listener, None, username)
        if own is not None:
            if namespace not in ("", own.name):
                raise TenantConflict(f"namespace {namespace!r} of another tenant")
            return own
        if not namespace:
            return None
        if username is not None and username in self.superusers and valid_tenant_name(namespace):
            return self.get(namespace)
        raise TenantConflict(f"namespace {namespace!r} is not this caller's")

    def tenant_for(self, listener: str, identity_tenant: str | None, username: str | None) -> Tenant | None:
        """The client's tenant (`resolve`); `TenantConflict` as there; None: the default tenant."""
        name = resolve(self.listeners.get(listener), identity_tenant, username, self.users)
        if name is None:
            return None
        if not valid_tenant_name(name):  # a source's record or a token claim: trusted, yet never a topic level
            raise TenantConflict(f"invalid tenant name {name!r}")
        return self.get(name)


def _limits(settings: TenantLimits) -> Limits:
    return Limits(settings.max_connections, settings.max_connection_rate, settings.max_message_rate,
                  settings.max_retained_bytes)


async def measure_retained(store: Store, tenant: Tenant) -> None:
    """Read the payload bytes of the tenant's retained messages from the store, a page at a time (its mount's
    first level is every tenant's, so the index narrows the scan to the tenants' retained messages)."""
    landed_before = tenant.retained_landed  # in the store by now: what the measure reads
    nbytes = 0
    after: str | None = None
    while True:
        page = await store.match_retained(tenant.mount + "#", after, _MEASURE_PAGE)
        if not page:
            break
        nbytes += sum(len(m.payload) for m in page)
        after = page[-1].topic
    tenant.retained_measured = nbytes
    tenant.retained_landed = max(0, tenant.retained_landed - landed_before)


def tenants_from_settings(settings: TenantSettings, bucket: BucketFactory) -> Tenants:
    """The node's tenants as the `tenant*` settings describe them; `bucket` makes their rate limits' buckets."""
    configured = settings.tenants
    defaults = configured.get(ANY_TENANT)
    return Tenants({name: _limits(limits) for name, limits in configured.items() if name != ANY_TENANT},
                   _limits(defaults) if defaults is not None else Limits(),
                   {str(k): v for k, v in settings.tenant_listeners.items()},
                   dict(settings.tenant_users),
                   list(settings.tenant_superusers), bucket)
