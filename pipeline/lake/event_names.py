"""The names of the lake's events (its `event` column): the gateway records them, the lake writes them and the
Spark jobs read them.

A leaf module with no imports, so the gateway can name events without pyarrow and the jobs can read them on a
Spark driver that has no gateway. The fields each event fills are described beside `schema.EVENTS_SCHEMA`.
"""

CONNECTED = "connected"
DISCONNECTED = "disconnected"
SUBSCRIBED = "subscribed"
UNSUBSCRIBED = "unsubscribed"
DELIVERED = "delivered"
ACKED = "acked"
DROPPED = "dropped"

EVENT_NAMES = (CONNECTED, DISCONNECTED, SUBSCRIBED, UNSUBSCRIBED, DELIVERED, ACKED, DROPPED)
