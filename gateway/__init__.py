"""MQTT gateway node: codec, sessions, listeners and the node runtime."""
