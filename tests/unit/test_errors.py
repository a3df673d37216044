"""How unexpected exceptions become the API's errors."""

from __future__ import annotations

import asyncpg
import pytest

from api_service.core.errors import ServiceError, Unavailable, classify


@pytest.mark.parametrize(
    "exc",
    [
        asyncpg.DeadlockDetectedError("deadlock detected"),  # an org deleted under a write
        asyncpg.SerializationError("could not serialize access"),
        asyncpg.CannotConnectNowError("the database system is starting up"),
        ConnectionRefusedError(),
    ],
)
def test_what_a_retry_would_fix_is_a_503(exc: Exception) -> None:
    assert isinstance(classify(exc), Unavailable)


def test_anything_else_is_a_500_that_says_nothing_of_its_cause() -> None:
    error = classify(asyncpg.UniqueViolationError("duplicate key value: secret detail"))
    assert type(error) is ServiceError
    assert error.status == 500 and "secret" not in str(error)
