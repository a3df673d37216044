"""The running-service fixtures of tests/api, shared here."""

from tests.api.conftest import key, service

__all__ = ["key", "service"]
