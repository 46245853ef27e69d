"""Fixtures of the gateway tests that drive a real node process: the integration suite's (`gateway_factory`, a
started gateway per call; `paho_factory`, paho clients), closed at teardown."""

from tests.integration.conftest import gateway_factory, paho_factory

__all__ = ["gateway_factory", "paho_factory"]
