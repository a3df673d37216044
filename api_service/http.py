"""ASGI middleware for /mcp and /api/v1: body size limit, then API key authentication."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from api_service import auth
from api_service.core.errors import PayloadTooLarge, ServiceError, classify

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
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class GuardMiddleware:
    """Refuses oversize bodies (413) and resolves the API key of every request to /mcp and
    /api/v1 (401/403) before the request reaches a route or the MCP app. The principal is put
    in the request state for both interfaces."""

    def __init__(
        self, app: ASGIApp, pool_of: Callable[[], asyncpg.Pool], max_body_bytes: int
    ) -> None:
        self.app = app
        self._pool_of = pool_of
        self._max_body = max_body_bytes

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
        try:
            principal = await auth.resolve(self._pool_of(), authorization)
        except Exception as exc:
            await send_error(send, classify(exc))
            return
        scope.setdefault("state", {})["principal"] = principal
        started = False

        async def tracking_send(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
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
