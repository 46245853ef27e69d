"""AMQP 0.9.1 for backend services (pika, aio-pika, any RabbitMQ client) over the gateway's store.

Layers, bottom up: `codec` (frames ↔ bytes, pamqp), `core` and `events` (the sans-IO connection: handshake,
channels, content assembly, heartbeats), `mapping` (routing keys, exchanges and properties ↔ MQTT topics and
the neutral property model), `exchanges` and `queues` (definitions kept in the store as `GroupRecord`s),
`consuming` (consumers, deliveries, acks), `channel` (one channel's commands), `connection` (the asyncio
Protocol) and `server` (listeners, the `Backend` the gateway starts).
"""
