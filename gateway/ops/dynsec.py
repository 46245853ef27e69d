"""Dynamic security on a node: the configuration kept in the store as one versioned document, changed by Mosquitto's
JSON commands (`$CONTROL/dynamic-security/v1`, the admin API), installed on every node at once and enforced on the
clients connected there.

A change is made with compare-and-set (`Store.put_document`): the commands run on the newest stored configuration and
are run again on a newer one if another node changed it meanwhile. The node that stored a change installs it, enforces
it, then tells every other node (the cluster call `dynsec.changed`), which re-reads the store; every node also
re-reads the version every `dynsec_refresh_interval` s, so a lost notice is healed.

Enforcing on this node's MQTT clients that the `dynsec` source accepted: a client deleted, disabled or bound to
another client id is disconnected (MQTT 5: DISCONNECT 0x98 Administrative action); every other one has each
subscription asked again, and those its roles no longer allow are removed (publishes and deliveries read the
configuration in force at each check: `extensions.dynsec.source`). A new password applies from the next connect.

Who may send commands: a client whose grants allow publishing to the control topic (its own grants or the ACL
file: the allow-all default never does), or a superuser; never an anonymous client. The first admin comes from
`dynsec_admin_username`/`dynsec_admin_password` when the store holds no configuration yet, or from the admin API.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from tidewire.extensions.dynsec import commands
from tidewire.extensions.dynsec.model import ADMIN_ACLS, CONTROL_TOPIC, RESPONSE_TOPIC, Acl, Client, Config, Link, Role
from tidewire.extensions.dynsec.source import DynsecAuthenticator
from tidewire.extensions.hooks import AllowAll, ClientInfo
from tidewire.gateway.core.retry import Backoff, stop_if_cancelled
from tidewire.store.base import Message

if TYPE_CHECKING:
    from tidewire.gateway.node import Node

log = logging.getLogger("tidewire.dynsec")

DOCUMENT = "dynsec"  # the store document's name
CHANGED = "dynsec.changed"  # the cluster call that has another node re-read the configuration
KICK_REASON = "dynamic security"  # what a disconnected MQTT 5 client reads
CAS_ATTEMPTS = 8  # commands run again on a newer configuration at most this often before "Internal error"
ADMIN_ROLE = "admin"


def bootstrap_config(username: str, password_hash: str) -> Config:
    """What `mosquitto_ctrl dynsec init` writes: one client in an `admin` role allowed the control topics."""
    config = Config()
    config.roles[ADMIN_ROLE] = Role(ADMIN_ROLE, acls=[Acl(t, topic, 0, True) for t, topic in ADMIN_ACLS])
    config.clients[username] = Client(username, password_hash, textname="Dynsec admin user",
                                      roles=[Link(ADMIN_ROLE)])
    return config


class DynamicSecurity:
    """`node.dynsec`: this node's side of dynamic security (see the module docstring)."""

    def __init__(self, node: Node, source: DynsecAuthenticator) -> None:
        settings = node.settings
        self.node = node
        self.source = source
        self.state = source.state
        self.limits = commands.Limits(settings.dynsec_max_clients, settings.dynsec_max_roles,
                                      settings.dynsec_max_groups, settings.dynsec_max_acls,
                                      settings.dynsec_max_commands)
        self.interval = settings.dynsec_refresh_interval
        self.max_request = settings.dynsec_max_request_bytes
        self.kicked = 0  # clients disconnected by a change
        self.revoked = 0  # subscriptions removed by a change
        self.refused = 0  # control requests refused (not an admin, too large)
        self._lock = asyncio.Lock()  # a refresh and a change take turns: neither installs an older configuration
        node.topology.answer(CHANGED, self._notified)

    # --- lifecycle ------------------------------------------------------------------------------------------------
    async def load(self) -> None:
        """At start, before the first client: the stored configuration, or the bootstrap admin's if there is none."""
        settings = self.node.settings
        await self.refresh()
        if self.state.version == 0 and settings.dynsec_admin_username and settings.dynsec_admin_password:
            config = bootstrap_config(settings.dynsec_admin_username,
                                      self.state.hash_password(settings.dynsec_admin_password))
            async with self._lock:
                version = await self.node.store.put_document(DOCUMENT, config.to_json(), 0)
            if version:  # else another node bootstrapped first: its configuration stands
                await self.node.store.sync()
                log.info("dynsec.bootstrapped", extra={"username": settings.dynsec_admin_username})
            await self.refresh()

    async def run(self) -> None:
        """Re-read the stored version every `interval` s, until cancelled."""
        retry = Backoff("dynsec", self.node.clock)
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.refresh()
            except Exception as exc:  # the store is down: the configuration in force stays
                stop_if_cancelled()
                retry.failed(exc)
                continue
            retry.succeeded()

    async def _notified(self, version: str) -> int:
        await self.refresh()
        return 204

    # --- reading --------------------------------------------------------------------------------------------------
    async def refresh(self) -> None:
        """Install the stored configuration if it is not the one in force, and enforce it here."""
        async with self._lock:
            version, data = await self.node.store.get_document(DOCUMENT)
            if version == self.state.version:
                return
            try:
                config = Config.from_json(data) if version else Config()
            except ValueError as exc:
                # The configuration in force stays, taken as that version: the next change overwrites the damage.
                log.error("dynsec.unreadable", extra={"version": version, "error": str(exc)})
                self.state.version = version
                return
            self.state.install(config, version)
        self.enforce(set())

    # --- changing -------------------------------------------------------------------------------------------------
    async def execute(self, payload: bytes) -> commands.Result:
        """Run a request's commands on the newest stored configuration and store the outcome (compare-and-set, run
        again on a newer one after a conflict); then enforce it here and tell the other nodes. Store errors
        (`OSError`) propagate."""
        for _ in range(CAS_ATTEMPTS):
            await self.refresh()
            async with self._lock:
                result = commands.run(self.state.grants.config, payload, self.state.hash_password, self.limits)
                version = 0  # nothing to store: reads, or commands that all failed
                if result.config is not None:
                    version = await self.node.store.put_document(DOCUMENT, result.config.to_json(),
                                                                 self.state.version)
                    if not version:
                        continue  # another node changed it first: run the commands again on its configuration
                    await self.node.store.sync()
                    self.state.install(result.config, version)
            self.enforce(result.kick)  # also with nothing stored: a disable of a client already disabled kicks
            if version:
                log.info("dynsec.changed", extra={"version": version,
                                                  "commands": ",".join(r["command"] for r in result.responses)})
                await self.node.topology.ask_others(CHANGED, str(version), None)
            return result
        log.error("dynsec.conflicts", extra={"attempts": CAS_ATTEMPTS})
        return commands.Result([{"command": "Unknown command", "error": "Internal error"}])

    def enforce(self, kick: set[str]) -> None:
        """Apply the configuration in force to this node's MQTT clients the `dynsec` source accepted."""
        authorizer = self.source.authorizer
        config = self.state.grants.config
        for conn in list(self.node.connections.values()):
            info = conn.info
            if info.acl is not authorizer or info.username is None:
                continue
            client = config.clients.get(info.username)
            if (client is None or client.disabled or info.username in kick
                    or (client.clientid is not None and client.clientid != conn.client_id)):
                self.kicked += 1
                conn.kick(KICK_REASON)
                continue
            session = conn.session
            if session is None:
                continue
            revoked = self.node.subscriptions.recheck(session, info)
            if revoked:
                self.revoked += len(revoked)
                log.info("dynsec.subscriptions_revoked", extra={"client_id": conn.client_id,
                                                                "filters": ",".join(revoked)})
                if session.persistent:
                    self.node.writes.save_session(session.snapshot())

    # --- the control topic ----------------------------------------------------------------------------------------
    def may_command(self, client: ClientInfo) -> bool:
        """May this client send commands? (See the module docstring.)"""
        if client.username is None:
            return False
        if client.superuser:
            return True
        authorizer = self.node.authorizer
        if isinstance(client.acl if client.acl is not None else authorizer.base, AllowAll):
            return False
        return authorizer.allow_publish(client, CONTROL_TOPIC)

    def submit(self, client: ClientInfo, payload: bytes) -> bool:
        """A PUBLISH to the control topic: False (refused, nothing run) unless the client may send commands; else
        the request runs in the background and its responses are published on the response topic."""
        if not self.may_command(client) or len(payload) > self.max_request:
            self.refused += 1
            log.info("dynsec.refused", extra={"client_id": client.client_id, "username": client.username,
                                              "bytes": len(payload)})
            return False
        self.node.spawn(self._answer(client.client_id, payload))
        return True

    async def _answer(self, client_id: str, payload: bytes) -> None:
        try:
            result = await self.execute(payload)
            body = result.payload()
        except Exception as exc:  # the store failed: the admin hears it, nothing was changed
            stop_if_cancelled()
            log.warning("dynsec.store_failed", extra={"client_id": client_id, "error": str(exc)})
            body = commands.Result([{"command": "Unknown command", "error": "Internal error"}]).payload()
        now_ms = int(self.node.clock.time() * 1000)
        # QoS 0, not retained, to every subscriber of the response topic: as Mosquitto's plugin answers.
        self.node.publish(Message(RESPONSE_TOPIC, body, 0, False, b"", now_ms))
