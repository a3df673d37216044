"""The service's error vocabulary and its one mapping to gRPC status codes."""

from __future__ import annotations

import grpc


class EmbedError(Exception):
    """Base of the errors a caller is told about."""


class InvalidInput(EmbedError):
    """The request breaks a limit: no texts, too many texts, a text too long."""


class Overloaded(EmbedError):
    """Admission bound reached: the caller should back off and retry."""


class NotReady(EmbedError):
    """The model is not loaded yet, or the service is shutting down."""


class BatchFailed(EmbedError):
    """The model failed on the batch that held this request's texts."""


STATUS_CODES: dict[type[EmbedError], grpc.StatusCode] = {
    InvalidInput: grpc.StatusCode.INVALID_ARGUMENT,
    Overloaded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    NotReady: grpc.StatusCode.UNAVAILABLE,
    BatchFailed: grpc.StatusCode.INTERNAL,
}


def status_for(error: EmbedError) -> grpc.StatusCode:
    """The gRPC status of an error class (its nearest listed ancestor)."""
    for cls in type(error).__mro__:
        if cls in STATUS_CODES:
            return STATUS_CODES[cls]
    return grpc.StatusCode.INTERNAL
