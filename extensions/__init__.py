"""Ingress and pipeline extensions: authentication, ACL, bridges, AMQP and RocketMQ protocol handlers."""
