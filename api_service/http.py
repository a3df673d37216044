"""ASGI middleware for /mcp and /api/v1: body size limit, then API key authentication."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from api_service import auth
from api_service.core.errors import (
    Forbidden,
    PayloadTooLarge,
    RateLimited,
    ServiceError,
    Unauthorized,
    classify,
)
from api_service.limits import Meter, PlanLimits

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PROTECTED_PREFIXES = ("/mcp", "/api/v1")


async def send_error(send: Send, error: ServiceError) -> None:
    body = json.dumps({"error": error.message, "code": error.code}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if error.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if isinstance(error, RateLimited):
        headers.extend((k.lower().encode(), v.encode()) for k, v in error.headers.items())
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class GuardMiddleware:
    """Every request to /mcp and /api/v1 passes here before a route or the MCP app sees it:
    oversize bodies are refused (413), the API key is resolved (401/403) and the request is
    counted by the meter. REST requests past the monthly quota get 429 here; MCP tool calls get
    the same text as a tool error (the MCP adapter reads `rate_limited` from the request
    state). REST responses carry the X-RateLimit headers."""

    def __init__(
        self,
        app: ASGIApp,
        pool_of: Callable[[], asyncpg.Pool],
        meter_of: Callable[[], Meter | None],
        max_body_bytes: int,
        default_plan: PlanLimits,
        throttle: auth.FailedAuthThrottle,
    ) -> None:
        self.app = app
        self._throttle = throttle
        self._pool_of = pool_of
        self._meter_of = meter_of
        self._max_body = max_body_bytes
        self._default_plan = default_plan

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(PROTECTED_PREFIXES):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self._max_body:
            await send_error(send, self._too_large())
            return
        authorization = headers.get(b"authorization", b"").decode("latin-1") or None
        client = (scope.get("client") or ("unknown", 0))[0]
        wait = self._throttle.retry_after(client)
        if wait > 0:
            seconds = str(max(1, round(wait)))
            await send_error(
                send,
                RateLimited(
                    f"Too many failed authentication attempts; retry in {seconds}s",
                    {"Retry-After": seconds},
                ),
            )
            return
        try:
            principal = await auth.resolve(self._pool_of(), authorization, self._default_plan)
        except Exception as exc:
            error = classify(exc)
            if isinstance(error, Unauthorized | Forbidden):
                self._throttle.failed(client)
            await send_error(send, error)
            return
        state = scope.setdefault("state", {})
        state["principal"] = principal
        extra_headers: list[tuple[bytes, bytes]] = []
        meter = self._meter_of()
        if meter is not None:
            admission = await meter.admit(principal.org_id, principal.plan.monthly_requests)
            headers_now = admission.headers(meter.now())
            is_rest = scope["path"].startswith("/api/v1")
            if is_rest:
                extra_headers = [(k.lower().encode(), v.encode()) for k, v in headers_now.items()]
            if not admission.allowed:
                if is_rest:
                    await send_error(send, RateLimited(admission.message(), headers_now))
                    return
                state["rate_limited"] = admission.message()
        started = False

        async def tracking_send(message: dict[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if extra_headers:
                    message = {**message, "headers": [*message.get("headers", []), *extra_headers]}
            await send(message)

        try:
            await self.app(scope, self._limited(receive), tracking_send)
        except _BodyTooLarge:
            if not started:
                await send_error(send, self._too_large())

    def _too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(f"Request body is larger than {self._max_body} bytes")

    def _limited(self, receive: Receive) -> Receive:
        """`receive` that stops a body without Content-Length at the size limit."""
        seen = 0

        async def limited() -> dict[str, Any]:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self._max_body:
                    raise _BodyTooLarge
            return message

        return limited


class _BodyTooLarge(Exception):
    pass
