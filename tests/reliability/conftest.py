"""The running service and a key from tests/api, shared by the reliability tests."""

from tests.api.conftest import key, service

__all__ = ["key", "service"]
