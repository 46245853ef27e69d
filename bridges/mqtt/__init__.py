"""The MQTT bridge: a link to another MQTT 3.1.1/5.0 broker, configured as Mosquitto's `connection` blocks are."""
