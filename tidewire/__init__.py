"""Tidewire, an edge-cloud MQTT gateway: the one import namespace of everything it installs.

The packages live in the checkout's top-level folders; each is linked here, so the checkout imports exactly as
the installed wheel does (one tree for the interpreter, mypy, pytest and Spark):

    tidewire.gateway     the node: neutral core, sessions, transport, the MQTT/AMQP/RocketMQ adapters, the CLI
    tidewire.store       the log, offsets, sessions, retained and will messages: the Store API and its engines
    tidewire.cache       the newest messages of hot queues, shared by a node's subscribers
    tidewire.lookup      where clients are and which nodes read which queues (in process, or sharded over nodes)
    tidewire.notify      after an append, tell the nodes with readers which queues have news
    tidewire.extensions  authentication and ACL sources an operator chooses by setting
    tidewire.admin       a node's HTTP port: REST API, Prometheus metrics, dashboard, health
    tidewire.bridges     links to other systems (MQTT brokers) that read from and publish into the log
    tidewire.pipeline    the lake bridge (the log as Parquet) and the PySpark jobs over the lake
    tidewire.errors      the one root exception, `TidewireError`, and its small hierarchy (a file of its own here)

Importing this package imports nothing of Tidewire but `tidewire.compiled` (standard library only; a Spark driver
loads the package from the jobs' zip).
"""

from tidewire.compiled import choose_implementation

choose_implementation()  # the compiled hot path, unless asked for the sources or the build is stale
