"""The RocketMQ 5 listener: a grpc.aio server on `host:rocketmq_port` in the node's event loop, serving
`apache.rocketmq.v2.MessagingService`: plaintext gRPC/HTTP2, as the RocketMQ clients dial by default, or with
`rocketmq_tls` TLS only, with the TLS listeners' certificate (a SIGHUP's new one serves the next handshakes)."""

from __future__ import annotations

import logging
import socket
import ssl
from typing import TYPE_CHECKING

import grpc

from tidewire.gateway.transport.listeners import Listener, make_listener

from .admission import ClientAdmission
from .auth import Authenticator, load_credentials
from .consuming import Consuming
from .producing import Producing
from .service import SERVICE, MessagingService
from .v2 import service_pb2_grpc

if TYPE_CHECKING:
    from tidewire.gateway.config import Settings
    from tidewire.gateway.node import Node
    from tidewire.gateway.transport.tls import CertificateFiles

log = logging.getLogger("tidewire.rocketmq")

REQUEST_SLACK = 1024 * 1024  # bytes a request may carry beyond one body (properties, several small messages)
MAX_CONCURRENT_RPCS = 65_536  # calls in progress (each client holds a telemetry stream and its long polls)
MAX_STREAMS_PER_CONNECTION = 1024
STOP_GRACE = 1.0  # s calls in progress get to finish at stop; long polls are cut
_WILDCARDS = ("", "0.0.0.0", "::")


class RocketMQServer:
    """A `gateway.server.Backend`."""

    def __init__(self, node: Node, certificates: CertificateFiles | None = None) -> None:
        self.node = node
        self.certificates = certificates  # None: plaintext
        self.port = 0
        self.listener: Listener | None = None  # its clients' count and limits, once started
        self._server: grpc.aio.Server | None = None
        self._consuming: Consuming | None = None
        self._producing: Producing | None = None
        self._auth: Authenticator | None = None

    async def start(self) -> None:
        settings = self.node.settings
        secrets = None
        if settings.rocketmq_credentials_file is not None:
            try:
                secrets = load_credentials(settings.rocketmq_credentials_file)
            except (OSError, ValueError, UnicodeDecodeError) as exc:
                raise OSError(f"rocketmq_credentials_file: {exc}") from exc
        auth = self._auth = Authenticator(secrets, self.node.auth.allow_anonymous)
        server = grpc.aio.server(options=[
            ("grpc.so_reuseport", 0),  # a port in use must fail here, not be shared with another process
            ("grpc.max_receive_message_length", settings.rocketmq_max_body + REQUEST_SLACK),
            ("grpc.max_send_message_length", -1),
            ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
        ], maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS)
        host = settings.host
        bind = f"[{host}]:{settings.rocketmq_port}" if ":" in host else f"{host}:{settings.rocketmq_port}"
        try:
            port = (server.add_insecure_port(bind) if self.certificates is None
                    else server.add_secure_port(bind, self._credentials(self.certificates)))
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {bind}: {exc}") from exc
        if not port:
            raise OSError(f"cannot listen on {bind}")
        self.port = port
        endpoint = settings.rocketmq_endpoint or (
            f"[{host}]:{port}" if ":" in host else f"{'127.0.0.1' if host in _WILDCARDS else host}:{port}")
        self._consuming = Consuming(self.node, endpoint)
        self._producing = Producing(self.node)
        self.listener = make_listener(settings, "rocketmq", self.node.clock)
        clients = ClientAdmission(self.node.admission, self.listener)
        service = MessagingService(self._consuming, self._producing, auth, clients, endpoint, settings.node_id,
                                   advertise_requested=settings.rocketmq_endpoint is None and host in _WILDCARDS,
                                   topology=self.node.topology)
        service_pb2_grpc.add_MessagingServiceServicer_to_server(service, server)
        await server.start()
        self._server = server
        self.node.topology.advertise(SERVICE, settings.rocketmq_endpoint or _advertised(settings, port))
        log.info("listening", extra={"listener": "rocketmq", "host": host, "port": port, "endpoint": endpoint,
                                     "credentials": "file" if secrets is not None else "none",
                                     "tls": self.certificates is not None})

    def reload(self) -> list[str]:
        """SIGHUP: the access keys and the TLS certificate, each kept as it was if its files fail to load."""
        errors = []
        path = self.node.settings.rocketmq_credentials_file
        if path is not None and self._auth is not None:
            try:
                self._auth.secrets = load_credentials(path)
            except (OSError, ValueError, UnicodeDecodeError) as exc:
                errors.append(f"rocketmq_credentials_file: {exc}")
        if self.certificates is not None:
            try:
                self.certificates.reload()
            except (OSError, ssl.SSLError) as exc:
                errors.append(f"rocketmq tls: {exc}")
        return errors

    @staticmethod
    def _credentials(certificates: CertificateFiles) -> grpc.ServerCredentials:
        """TLS whose certificate is read from `certificates` again before a handshake after each reload."""

        def configuration() -> grpc.ServerCertificateConfiguration:
            key, chain, ca = certificates.pem
            return grpc.ssl_server_certificate_configuration([(key, chain)], root_certificates=ca)

        served = [certificates.generation]

        def fetch() -> grpc.ServerCertificateConfiguration | None:  # gRPC's thread, before each handshake
            if certificates.generation == served[0]:
                return None
            served[0] = certificates.generation
            return configuration()

        return grpc.dynamic_ssl_server_credentials(configuration(), fetch,
                                                   certificates.settings.require_certificate)

    async def stop(self) -> None:
        if self._server is None:
            return
        await self._server.stop(STOP_GRACE)
        self._server = None
        if self._consuming is not None:
            await self._consuming.stop()
        if self._producing is not None:
            await self._producing.stop()


def _advertised(settings: Settings, port: int) -> str:
    """The endpoint the other nodes list for this one in their routes: a wildcard bind cannot be dialled, so the
    cluster host, else this machine's name (as the cluster port is advertised)."""
    host = settings.host
    if host in _WILDCARDS:
        host = settings.cluster_host or socket.gethostname()
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
