"""The protocols a node speaks, each over the neutral core: MQTT 3.1.1/5.0 (`mqtt`), AMQP 0.9.1
(`amqp`) and RocketMQ 5 (`rocketmq`)."""
