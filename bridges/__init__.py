"""Bridges: carry messages between Tidewire's log and other systems (MQTT brokers), each from a position of its own
in the store, so a peer that is down, a link that is cut or a node that dies loses nothing."""
