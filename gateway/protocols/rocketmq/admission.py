"""RocketMQ clients through the node's admission, as far as gRPC allows.

grpc owns its sockets: there is no accept to refuse and no PROXY header to read. What a RocketMQ client holds is
its client id (`x-mq-client-id`, sent with every call), so a "connection" here is a client id seen within
`idle_s`. A client id not seen before takes the listener's admission as an MQTT CONNECT or an AMQP Open does
(the node stopping or overloaded, `max_connections`, the connect rate of `listeners.rocketmq`) and is refused
with TOO_MANY_REQUESTS, which RocketMQ clients back off from and retry. A known client is never refused.
"""

from __future__ import annotations

from collections import OrderedDict

from tidewire.gateway.transport.admission import Admission, AdmissionRefusal
from tidewire.gateway.transport.listeners import Listener

# RocketMQ 5 clients heartbeat every 10 s: a client silent for six beats counts as gone.
CLIENT_IDLE_S = 60.0


class ClientAdmission:
    """The RocketMQ listener's live client ids and the admission of new ones (time passed in)."""

    __slots__ = ("_seen", "admission", "idle_s", "listener")

    def __init__(self, admission: Admission, listener: Listener, idle_s: float = CLIENT_IDLE_S) -> None:
        self.admission = admission
        self.listener = listener
        self.idle_s = idle_s
        self._seen: OrderedDict[str, float] = OrderedDict()  # client id -> last call, oldest first

    def admit(self, client_id: str, now: float) -> AdmissionRefusal | None:
        """None: serve the call (and count the client as live); else why it is refused."""
        seen = self._seen
        if client_id in seen:
            seen[client_id] = now
            seen.move_to_end(client_id)
            return None
        self._expire(now)
        refusal = self.admission.refusal(self.listener, now, reconnecting=False)
        if refusal is None:
            seen[client_id] = now
            self.listener.connections = len(seen)
        return refusal

    def forget(self, client_id: str) -> None:
        """The client said it terminates (NotifyClientTermination): its slot is free at once."""
        if self._seen.pop(client_id, None) is not None:
            self.listener.connections = len(self._seen)

    def _expire(self, now: float) -> None:
        seen = self._seen
        while seen:
            client_id, last = next(iter(seen.items()))
            if now - last < self.idle_s:
                break
            del seen[client_id]
        self.listener.connections = len(seen)
