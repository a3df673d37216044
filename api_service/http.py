"""ASGI middleware for /mcp and /api/v1: API key authentication, the meter, REST scopes, then
the body size limit."""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg

from api_service import auth, timing
from api_service.core.errors import (
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


async def send_error(
    send: Send, error: ServiceError, extra_headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    body = json.dumps({"error": error.message, "code": error.code}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if error.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    headers.extend((k.lower().encode(), v.encode()) for k, v in error.headers.items())
    headers.extend(extra_headers)
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class GuardMiddleware:
    """Every request to /mcp and /api/v1 passes here before a route or the MCP app sees it, in
    this order: the API key is resolved (401/403) from the headers alone, the request is counted
    by the meter, a REST request without the scope its method needs is refused (403), and an
    oversize body (413). So a key learns nothing about a body it may not send, and every
    authenticated request counts, refused or not. REST requests past the monthly quota get 429
    here; MCP tool calls get the same text as a tool error, and a tool's scope is checked by
    the MCP adapter before its arguments (it reads `principal` and `rate_limited` from the
    request state). REST responses carry the X-RateLimit headers and Server-Timing
    (api_service.timing)."""

    def __init__(
        self,
        app: ASGIApp,
        pool_of: Callable[[], asyncpg.Pool],
        meter_of: Callable[[], Meter | None],
        max_body_bytes: int,
        default_plan: PlanLimits,
        throttle: auth.FailedAuthThrottle,
        key_cache: auth.KeyCache | None = None,
    ) -> None:
        self.app = app
        self._throttle = throttle
        self._key_cache = key_cache
        self._pool_of = pool_of
        self._meter_of = meter_of
        self._max_body = max_body_bytes
        self._default_plan = default_plan

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(PROTECTED_PREFIXES):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        record = timing.start()
        is_rest = scope["path"].startswith("/api/v1")
        headers = dict(scope["headers"])
        client = (scope.get("client") or ("unknown", 0))[0]
        try:
            principal = await self._authenticate(headers, client)
        except ServiceError as error:
            await send_error(send, error)
            return
        state = scope.setdefault("state", {})
        state["principal"] = principal
        rate_headers: list[tuple[bytes, bytes]] = []
        meter = self._meter_of()
        if meter is not None:
            admission = await meter.admit(principal.org_id, principal.plan.monthly_requests)
            headers_now = admission.headers(meter.now())
            if is_rest:
                rate_headers = [(k.lower().encode(), v.encode()) for k, v in headers_now.items()]
            if not admission.allowed:
                if is_rest:
                    await send_error(send, RateLimited(admission.message(), headers_now))
                    return
                state["rate_limited"] = admission.message()
        try:
            if is_rest:
                principal.require(auth.rest_scope(scope["method"]))
            receive = await self._limit_body(headers, scope["method"], receive)
        except ServiceError as error:
            await send_error(send, error, rate_headers)
            return

        response_started = False

        async def send_with_headers(message: dict[str, Any]) -> None:
            nonlocal response_started
            if message["type"] == "http.response.start":
                response_started = True
                # MCP responses may start streaming before the tool is done: REST only.
                if is_rest:
                    took = (b"server-timing", timing.header(record, time.perf_counter() - started))
                    extra = [*rate_headers, took]
                    message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        except Exception as exc:
            # Starlette answers an unexpected error outside every middleware, where its 500
            # would lose this request's headers: answer it here (classify logs it).
            if not is_rest or response_started:
                raise
            await send_error(send_with_headers, classify(exc))

    async def _authenticate(self, headers: dict[bytes, bytes], client: str) -> auth.Principal:
        """The caller's principal. Unknown keys count toward the client's throttle; while it is
        throttled only keys that have authenticated before are looked up, and every other one
        gets 401 with Retry-After (FailedAuthThrottle). Expired and revoked keys are real
        keys, not guesses, and do not count."""
        wait = self._throttle.retry_after(client)
        authorization = headers.get(b"authorization", b"").decode("latin-1") or None
        try:
            with timing.part("auth"):
                digest = auth.hash_key(auth.bearer_token(authorization))
                known = self._throttle.knows(digest)
                if not known and wait <= 0:
                    wait = await self._throttle.turn(client, digest)
                lookup = known or wait <= 0
                counted = (
                    self._throttle.looking_up(client, digest)
                    if lookup and not known
                    else contextlib.nullcontext()
                )
                with counted:
                    principal = await auth.resolve(
                        self._pool_of(),
                        digest,
                        self._default_plan,
                        cache=self._key_cache,
                        lookup=lookup,
                    )
        except Exception as exc:
            error = classify(exc)
            if not isinstance(error, Unauthorized):
                raise error from None
            if wait > 0:
                seconds = str(max(1, math.ceil(wait)))
                raise Unauthorized(
                    "Unauthorized: too many failed authentication attempts from this address; "
                    f"retry in {seconds}s",
                    {"Retry-After": seconds},
                ) from None
            self._throttle.failed(client)
            raise error from None
        self._throttle.vouch(digest)
        return principal

    async def _limit_body(
        self, headers: dict[bytes, bytes], method: str, receive: Receive
    ) -> Receive:
        """`receive`, or one replaying the body read here; PayloadTooLarge past the limit. A
        body without Content-Length (chunked) is read here, up to the limit."""
        length = headers.get(b"content-length")
        if length is None and method in ("POST", "PUT", "PATCH"):
            buffered = await self._read_body(receive)
            if buffered is None:
                raise self._too_large()
            return buffered
        if length is not None and length.isdigit() and int(length) > self._max_body:
            raise self._too_large()
        return receive

    def _too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(f"Request body is larger than {self._max_body} bytes")

    async def _read_body(self, receive: Receive) -> Receive | None:
        """Read the whole body, or None past the size limit; return a `receive` replaying it."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self._max_body:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        return replay
