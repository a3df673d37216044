"""The one error vocabulary of the service; each interface maps it in one place."""

from __future__ import annotations

import logging

import asyncpg
import grpc

log = logging.getLogger(__name__)


class ServiceError(Exception):
    """An anticipated failure with a message safe to show the caller, and any response
    headers it needs (`Retry-After`, the rate-limit headers)."""

    status: int = 500
    code: str = "internal_error"

    def __init__(self, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}


class InvalidInput(ServiceError):
    status = 400
    code = "invalid_request"


class Unauthorized(ServiceError):
    status = 401
    code = "unauthorized"


class PaymentRequired(ServiceError):
    status = 402
    code = "limit_reached"


class Forbidden(ServiceError):
    status = 403
    code = "forbidden"


class NotFound(ServiceError):
    status = 404
    code = "not_found"


class PayloadTooLarge(ServiceError):
    status = 413
    code = "payload_too_large"


class RateLimited(ServiceError):
    status = 429
    code = "rate_limited"


class Unavailable(ServiceError):
    status = 503
    code = "unavailable"


CONVERSATION_NOT_FOUND = "Conversation not found"


def conversation_not_found() -> NotFound:
    """The answer for a missing id and for another organization's id alike (no existence leak)."""
    return NotFound(CONVERSATION_NOT_FOUND)


DATABASE_ERRORS: tuple[type[Exception], ...] = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
)
DEPENDENCY_ERRORS: tuple[type[Exception], ...] = (*DATABASE_ERRORS, grpc.aio.AioRpcError)
# Transactions PostgreSQL aborted for another's sake: the same request succeeds when retried.
CONFLICT_ERRORS: tuple[type[Exception], ...] = (
    asyncpg.DeadlockDetectedError,
    asyncpg.SerializationError,
)


def classify(exc: BaseException) -> ServiceError:
    """The ServiceError for any exception: dependency outages become 503, the rest 500."""
    if isinstance(exc, ServiceError):
        return exc
    if isinstance(exc, DATABASE_ERRORS):
        log.warning("database unavailable: %s", type(exc).__name__)
        return Unavailable("The database is unavailable; retry shortly")
    if isinstance(exc, CONFLICT_ERRORS):
        log.warning("write conflict: %s", type(exc).__name__)
        return Unavailable("The request met a concurrent change (an org being deleted, say); retry")
    if isinstance(exc, grpc.aio.AioRpcError) and exc.code() in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    ):
        log.warning("search backend unavailable: %s", exc.code().name)
        return Unavailable("Search is temporarily unavailable; retry shortly")
    log.error("unexpected error", exc_info=exc)
    return ServiceError("Internal error")
