"""RocketMQ 5 (gRPC `apache.rocketmq.v2.MessagingService`) protocol handler: backends publish to devices and
consume device data with the official RocketMQ clients (`server.RocketMQServer`)."""
