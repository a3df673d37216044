"""The one place REST maps errors to statuses: `{"error": "<text>", "code": "<code>"}`."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from api_service.core.errors import (
    DEPENDENCY_ERRORS,
    InvalidInput,
    ServiceError,
    classify,
)
from api_service.rest.schemas import Error

log = logging.getLogger(__name__)

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": Error, "description": text}
    for status, text in {
        400: "Invalid body or query",
        401: "Missing or invalid API key",
        402: "Storage or plan limit reached",
        403: "Expired or revoked key, or missing scope",
        404: "Not found",
        413: "Request body too large",
        429: "Monthly request quota reached",
        503: "A dependency is unavailable; retry later",
    }.items()
}


def error_response(error: ServiceError) -> JSONResponse:
    return JSONResponse(
        {"error": error.message, "code": error.code},
        status_code=error.status,
        headers=error.headers or None,
    )


def describe_validation(errors: Any) -> str:
    """One readable line naming each bad parameter, e.g. `limit: Input should be <= 50`."""
    parts = []
    for err in errors:
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path")]
        where = ".".join(loc) or "body"
        if err.get("type") == "json_invalid":
            return "Request body is not valid JSON"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "Invalid request: " + "; ".join(parts)


def install(app: FastAPI) -> None:
    """Register the exception handlers on `app`."""

    async def on_service_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ServiceError)
        return error_response(exc)

    async def on_validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(InvalidInput(describe_validation(exc.errors())))

    async def on_http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed"}.get(
            exc.status_code, "http_error"
        )
        return JSONResponse(
            {"error": str(exc.detail), "code": code},
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    async def on_unexpected(_: Request, exc: Exception) -> JSONResponse:
        return error_response(classify(exc))

    app.add_exception_handler(ServiceError, on_service_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    # Outages of a dependency are expected: handled here, they are answered (503) and logged as
    # a warning; anything else reaches the catch-all, which logs it as an error.
    for outage in DEPENDENCY_ERRORS:
        app.add_exception_handler(outage, on_unexpected)
    app.add_exception_handler(Exception, on_unexpected)
