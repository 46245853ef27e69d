"""The RocketMQ 5 gRPC protocol (`apache.rocketmq.v2`): the protobuf and gRPC modules protoc generated from
apache/rocketmq-apis, as rocketmq-python-client 5.1.2 ships them in `rocketmq.grpc_protocol` (Apache License 2.0,
headers kept), with their imports made relative.

They are kept here rather than imported from the client because importing any part of the `rocketmq` package runs
its `__init__`, which loads the client and its logging setup: that creates `~/logs/rocketmq_python/` and replaces
the process's logging configuration. The gateway writes nothing outside its data directory. The descriptors are
the same bytes as the client's, so both can be loaded in one process (tests): protobuf keeps one copy of each.
"""
