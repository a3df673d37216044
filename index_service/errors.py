"""The service's error vocabulary; servicer.py maps each kind to one gRPC status."""

from __future__ import annotations


class ServiceError(Exception):
    """Base of the errors the service reports to callers."""


class InvalidArgument(ServiceError):
    """The request is malformed: wrong dimensions, non-finite values, empty ids, k out of range."""


class Unavailable(ServiceError):
    """The org cannot be served now (its rebuild from PostgreSQL failed); retrying may help."""
