"""The lake's layout and table schemas: the one contract between the bridge that writes it and the jobs that read it.

Layout under the lake directory (Hive-style partitions, so Spark's file source and pyarrow.dataset read
`dt` and `hour` as columns):

    messages/dt=YYYY-MM-DD/hour=HH/<partition>-<first position>-<last position>.parquet
    events/dt=YYYY-MM-DD/hour=HH/<node>-<time ms>-<n>.parquet
    sparkplug/dt=YYYY-MM-DD/hour=HH/<partition>-<first position>-<last position>.parquet  (with its messages)
    _tidewire/...   the bridge's checkpoints, pending manifests and locks (a leading `_`: readers skip it)

A file is written under a name with a leading `.`, synced, then renamed: readers never see a partial file.
Times are UTC. `dt`/`hour` come from `received_at` (messages, sparkplug) and `time` (events).
"""

from __future__ import annotations

import pyarrow as pa

FORMAT_VERSION = 1  # in each file's metadata as b"tidewire.lake.version"
MESSAGES = "messages"
EVENTS = "events"
SPARKPLUG = "sparkplug"
STATE_DIR = "_tidewire"

_TS = pa.timestamp("ms", tz="UTC")

USER_PROPERTIES = pa.list_(pa.struct([("key", pa.string()), ("value", pa.string())]))

MESSAGES_SCHEMA = pa.schema([
    ("position", pa.int64()),  # the log seq: unique across the log, ascending within a partition
    ("partition", pa.int32()),  # the log partition the bridge read it from
    ("received_at", _TS),  # when the gateway took the message in
    ("topic", pa.string()),
    ("first_level", pa.string()),  # the topic's first level ("" for "/a")
    ("client_id", pa.string()),  # the publisher: MQTT client id, AMQP/RocketMQ connection identity; "" internal
    ("protocol", pa.string()),  # "mqtt", "amqp", "rocketmq" or "bridge"
    ("qos", pa.int8()),
    ("retain", pa.bool_()),
    ("payload_size", pa.int32()),
    ("payload", pa.binary()),
    ("payload_json", pa.string()),  # the payload as text when it is valid JSON (UTF-8), else null
    ("json_numbers", pa.map_(pa.string(), pa.float64())),  # numeric JSON fields by dotted path; null if not JSON
    ("content_type", pa.string()),
    ("correlation_data", pa.binary()),
    ("response_topic", pa.string()),
    ("user_properties", USER_PROPERTIES),
    ("utf8_payload", pa.bool_()),
    ("expires_at", _TS),  # null: never
])

# Event names (`event` column, pipeline.lake.event_names), as the gateway records them:
# connected: detail = the proven user name or the address; disconnected: reason = why (normal, keepalive,
# session taken over, protocol error, ...); subscribed: topic = the filter, qos = granted (a refusal's reason
# code in reason); unsubscribed: topic = the filter; delivered: position, topic, qos, dup = a resend (a retry);
# acked: PUBACK / PUBCOMP for that delivery; dropped: position, topic, reason = expired, too_large,
# not_authorized (a refused publish: no position).
# protocol says who consumed: "mqtt" (client_id: the MQTT client id), "amqp" (client_id: the connection's id, as
# in the messages' client_id; consumer_group: the queue; consumer_tag: the Basic.Consume tag, null for a Basic.Get),
# "rocketmq" (client_id: the client's id; consumer_group: the consumer group; acked: topic = the RocketMQ topic).
# AMQP and RocketMQ record delivered (qos null; dup = a redelivery) and acked (a settled Basic.Ack, an AckMessage);
# an AMQP reject without requeue is dropped, reason rejected. consumer_group and consumer_tag are null for MQTT
# (and in files written before they existed: read with this schema, not the first file's).

EVENTS_SCHEMA = pa.schema([
    ("time", _TS),
    ("event", pa.string()),
    ("node", pa.string()),
    ("client_id", pa.string()),
    ("protocol", pa.string()),
    ("topic", pa.string()),
    ("position", pa.int64()),
    ("qos", pa.int8()),
    ("dup", pa.bool_()),
    ("reason", pa.string()),
    ("detail", pa.string()),
    ("consumer_group", pa.string()),
    ("consumer_tag", pa.string()),
])

# One row per metric of each Sparkplug B message (`spBv1.0/<group>/<type>/<edge node>[/<device>]`), written in the
# same flush as the messages they come from (`pipeline.lake.sparkplug_rows`; how values are typed:
# `pipeline.sparkplug.decode`). A message whose payload is not Sparkplug B has no rows here (counted:
# `sparkplug_malformed`); its `messages` row is as for any message.
SPARKPLUG_SCHEMA = pa.schema([
    ("position", pa.int64()),  # the message's log seq (its row in `messages`)
    ("partition", pa.int32()),
    ("received_at", _TS),
    ("group_id", pa.string()),
    ("edge_node", pa.string()),
    ("device", pa.string()),  # null: a node-level message
    ("message_type", pa.string()),  # NBIRTH, NDEATH, DBIRTH, DDEATH, NDATA, DDATA, NCMD, DCMD
    ("seq", pa.int64()),  # the payload's seq (null when absent)
    ("payload_timestamp", _TS),
    ("metric", pa.string()),  # the name; a DATA metric sent by alias: the name its birth gave it (null: unknown)
    ("alias", pa.int64()),
    ("datatype", pa.string()),  # the Sparkplug DataType name (Int32, Double, ...); a DATA metric: its birth's
    ("is_null", pa.bool_()),
    ("is_historical", pa.bool_()),
    ("is_transient", pa.bool_()),
    ("metric_timestamp", _TS),
    ("int_value", pa.int32()),
    ("long_value", pa.int64()),
    ("float_value", pa.float32()),
    ("double_value", pa.float64()),
    ("boolean_value", pa.bool_()),
    ("string_value", pa.string()),
    ("bytes_value", pa.binary()),
])
