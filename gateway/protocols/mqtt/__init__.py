"""MQTT 3.1.1 and 5.0: the sans-IO codec (`codec/`), CONNECT negotiation (`connect.py`), the channel that holds
every rule of a connection with no socket, loop or system clock (`lifecycle.py`, `handshake.py`, `channel.py`),
the asyncio protocol that only moves its bytes and arms its timers (`connection.py`), and outbound PUBLISH bytes
shared across subscribers (`outbound.py`)."""
