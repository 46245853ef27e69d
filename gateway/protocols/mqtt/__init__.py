"""MQTT 3.1.1 and 5.0: the sans-IO codec, CONNECT negotiation, the connection, outbound PUBLISH bytes."""
