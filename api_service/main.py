"""The api_service process: FastAPI (REST under /api/v1) with the MCP app at /mcp, one lifespan."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import asyncpg
import uvicorn
from fastapi import Depends, FastAPI, Response
from fastapi.responses import JSONResponse
from mcp.server.transport_security import TransportSecuritySettings
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api_service.auth import FailedAuthThrottle, KeyCache
from api_service.clients import EmbedClient, GrpcSemanticIndex, IndexRouter
from api_service.core.memory import MemoryService
from api_service.http import GuardMiddleware
from api_service.indexer import BACKLOG_COUNTED, Backlog, Indexer, outbox_backlog
from api_service.limits import Meter
from api_service.mcp_server import build_mcp
from api_service.rest import conversations, messages, search, usage
from api_service.rest import errors as rest_errors
from api_service.rest.deps import known_query
from api_service.settings import ApiSettings, env_help
from api_service.store.db import create_pool
from api_service.store.embedded import start_embedded
from api_service.store.migrate import migrate_url

log = logging.getLogger(__name__)
API_PREFIX = "/api/v1"
T = TypeVar("T")
OUTBOX_READ_SECONDS = 1.0  # what /metrics waits for the outbox's figures


@dataclass
class Runtime:
    """What the lifespan opens and closes; filled when the app starts."""

    pool: asyncpg.Pool | None = None
    memory: MemoryService | None = None
    embedder: EmbedClient | None = None
    index: IndexRouter | None = None
    indexer: Indexer | None = None
    meter: Meter | None = None
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def require_pool(self) -> asyncpg.Pool:
        if self.pool is None:
            raise RuntimeError("the service is not started")
        return self.pool

    def require_memory(self) -> MemoryService:
        if self.memory is None:
            raise RuntimeError("the service is not started")
        return self.memory


async def database_url(settings: ApiSettings, stack: contextlib.ExitStack) -> str:
    """DATABASE_URL when set, else an embedded PostgreSQL under the data dir."""
    if settings.database_url:
        return settings.database_url
    url, server = start_embedded(settings.embedded_pg_dir)
    stack.callback(server.cleanup)
    return url


def create_app(settings: ApiSettings) -> FastAPI:
    """The whole HTTP front; dependencies are opened by its lifespan."""
    runtime = Runtime()
    key_cache = KeyCache(settings.key_cache_entries) if settings.key_cache_entries > 0 else None
    mcp = build_mcp(runtime.require_memory)
    mcp_app = mcp.streamable_http_app(
        streamable_http_path="/mcp",
        stateless_http=True,
        json_response=True,
        max_request_body_size=settings.limits.body_bytes,
        # The SDK would otherwise answer 421 to any Host but localhost: behind a Service, an
        # ingress or another container, every MCP call. Every request carries an API key, which
        # a page that rebinds a name to this address does not have; which browser origins may
        # call is the CORS setting's business.
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        with contextlib.ExitStack() as stack:
            url = await database_url(settings, stack)
            applied = await migrate_url(url)
            if applied:
                log.info("applied migrations: %s", ", ".join(applied))
            pool = await create_pool(url, settings.db_pool_min, settings.db_pool_max)
            embedder = EmbedClient(settings.embed_address, settings.grpc_timeout_seconds)
            index = IndexRouter(settings.index_shards, settings.grpc_timeout_seconds)
            indexer = Indexer(
                pool,
                embedder,
                index,
                settings.indexer_batch_size,
                settings.embed_index_timeout_seconds,
                settings.embed_index_concurrency,
            )
            if settings.indexer_enabled:
                indexer.start()
            runtime.pool, runtime.embedder, runtime.index = pool, embedder, index
            runtime.indexer = indexer if settings.indexer_enabled else None
            runtime.memory = MemoryService(
                pool,
                settings.limits,
                GrpcSemanticIndex(embedder, index),
                runtime.indexer,
                settings.append_index_wait_seconds,
            )
            app.state.memory = runtime.memory
            if settings.metering_enabled:
                runtime.meter = Meter(pool, flush_seconds=settings.meter_flush_seconds)
                runtime.meter.start()
            app.state.meter = runtime.meter
            listening = None if key_cache is None else asyncio.create_task(key_cache.listen(url))
            try:
                async with mcp.session_manager.run():
                    yield
            finally:
                if listening is not None:
                    listening.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await listening
                if runtime.meter is not None:
                    await runtime.meter.stop()
                await indexer.stop()
                await embedder.close()
                await index.close()
                await pool.close()

    app = FastAPI(
        title="Conversation Memory API",
        version="1.0.0",
        description="Verbatim conversation storage per organization with semantic search.",
        lifespan=lifespan,
    )
    rest_errors.install(app)
    _describe_as_served(app)
    for router in (conversations.router, messages.router, search.router, usage.router):
        app.include_router(router, prefix=API_PREFIX, dependencies=[Depends(known_query)])
    _add_operations(app, runtime)
    app.add_middleware(
        GuardMiddleware,
        pool_of=runtime.require_pool,
        meter_of=lambda: runtime.meter,
        max_body_bytes=settings.limits.body_bytes,
        default_plan=settings.default_plan,
        throttle=FailedAuthThrottle(settings.auth_failures_per_minute, window_seconds=60.0),
        key_cache=key_cache,
    )
    _add_metrics(app, runtime)  # added last: outermost, so refusals are counted too
    if settings.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_headers=["Authorization", "Content-Type"],
            allow_methods=["*"],
        )
    # A route, not a mount at "/": a mount there would answer every unknown path and wrong
    # method under /api/v1 itself, with a plain-text 404.
    app.router.routes.append(Route("/mcp", mcp_app, include_in_schema=False))
    return app


def _describe_as_served(app: FastAPI) -> None:
    """Make the OpenAPI document say what the service does: a request that fails validation
    gets 400 (rest/errors.py), never FastAPI's 422, and every operation takes an API key as
    a bearer token (GuardMiddleware)."""
    generate = app.openapi

    def document() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = generate()
        for operations in schema["paths"].values():
            for operation in operations.values():
                operation["responses"].pop("422", None)
        for name in ("HTTPValidationError", "ValidationError"):
            schema["components"]["schemas"].pop(name, None)
        schema["components"]["securitySchemes"] = {
            "apiKey": {
                "type": "http",
                "scheme": "bearer",
                "description": "An API key (`cmk_...`) from `memctl key create`.",
            }
        }
        schema["security"] = [{"apiKey": []}]
        return schema

    app.openapi = document  # type: ignore[method-assign]


class Shared(Generic[T]):
    """One run of `work` at a time, its result given to every caller that asks while it runs.
    /readyz and /metrics take no key: a flood of them then holds one database connection and
    one call to each service, where a run each would take the pool from keyed requests."""

    def __init__(self, work: Callable[[], Awaitable[T]]) -> None:
        self._work = work
        self._running: asyncio.Future[T] | None = None

    async def __call__(self) -> T:
        if self._running is None or self._running.done():
            self._running = asyncio.ensure_future(self._work())
            self._running.add_done_callback(_seen)
        return await asyncio.shield(self._running)  # a caller that leaves stops no one else


def _seen(done: asyncio.Future[Any]) -> None:
    """Take a finished run's exception, which its callers may all have left without."""
    if not done.cancelled():
        done.exception()


def _add_operations(app: FastAPI, runtime: Runtime) -> None:
    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> JSONResponse:
        ok, checks = await readiness()
        return JSONResponse(
            {"status": "ready" if ok else "not ready", "checks": checks},
            status_code=200 if ok else 503,
        )

    async def check() -> tuple[bool, dict[str, Any]]:
        checks: dict[str, Any] = {}
        try:
            await runtime.require_pool().fetchval("SELECT 1")
            checks["postgres"] = True
        except Exception:
            checks["postgres"] = False
        try:
            checks["embed"] = runtime.embedder is not None and await runtime.embedder.ready()
        except Exception:
            checks["embed"] = False
        shards = await runtime.index.ready() if runtime.index else {}
        checks["index"] = shards
        ok = checks["postgres"] and checks["embed"] and bool(shards) and all(shards.values())
        return ok, checks

    readiness = Shared(check)


def _route_label(scope: Scope) -> str:
    """A request's metrics label: its route's template
    (`/api/v1/conversations/{conversation_id}`), never its path, whose ids would make a series
    per conversation. The router sets the route on the shared scope; FastAPI may leave there an
    included router's own route, whose template lacks the prefix it was included under."""
    template: str | None = getattr(scope.get("route"), "path", None)
    if template is None:
        return "/mcp" if scope["path"].startswith("/mcp") else "other"
    if scope["path"].startswith(API_PREFIX + "/") and not template.startswith(API_PREFIX + "/"):
        return API_PREFIX + template
    return template


def _add_metrics(app: FastAPI, runtime: Runtime) -> None:
    registry = runtime.registry
    requests = Counter(
        "memory_http_requests", "HTTP requests", ["method", "route", "status"], registry=registry
    )
    latency = Histogram(
        "memory_http_request_seconds",
        "HTTP request latency",
        ["method", "route"],
        registry=registry,
    )

    async def measure(scope: Scope, receive: Receive, send: Send, app: ASGIApp) -> None:
        status = 500  # if the app fails before it answers

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        start = time.perf_counter()
        try:
            await app(scope, receive, send_and_note)
        finally:
            path = _route_label(scope)
            latency.labels(scope["method"], path).observe(time.perf_counter() - start)
            requests.labels(scope["method"], path, str(status)).inc()

    # Plain ASGI, not @app.middleware("http"): that wrapper streams every response through a
    # task group and costs about a millisecond a request.
    app.add_middleware(_HttpOnly, handle=measure)

    # Read from the outbox at each scrape: the same figures on every replica.
    outbox_jobs = Gauge(
        "memory_index_outbox_jobs",
        f"Index jobs not done yet, every org (counted up to {BACKLOG_COUNTED:,})",
        registry=registry,
    )
    outbox_failing = Gauge(
        "memory_index_outbox_failing_jobs",
        "Index jobs that failed at least once and wait for a retry (the log and "
        f"index_outbox.last_error say why; counted up to {BACKLOG_COUNTED:,})",
        registry=registry,
    )
    outbox_oldest = Gauge(
        "memory_index_outbox_oldest_job_seconds",
        "Age of the oldest index job not done yet; 0 when none waits",
        registry=registry,
    )

    async def read_backlog() -> Backlog:
        # Bounded: a pool whose connections are all taken, or a database that does not
        # answer, must not hold up the request metrics, which matter most then.
        async with asyncio.timeout(OUTBOX_READ_SECONDS):
            return await outbox_backlog(runtime.require_pool())

    backlog_now = Shared(read_backlog)

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        try:
            backlog = await backlog_now()
        except Exception:  # any failure: no figure rather than a stale one
            for gauge in (outbox_jobs, outbox_failing, outbox_oldest):
                gauge.set(float("nan"))
        else:
            outbox_jobs.set(backlog.jobs)
            outbox_failing.set(backlog.failing)
            outbox_oldest.set(backlog.oldest_seconds)
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


class _HttpOnly:
    """ASGI middleware that hands HTTP requests to `handle` and passes anything else through."""

    def __init__(
        self, app: ASGIApp, handle: Callable[[Scope, Receive, Send, ASGIApp], Awaitable[None]]
    ) -> None:
        self._app = app
        self._handle = handle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._handle(scope, receive, send, self._app)
        else:
            await self._app(scope, receive, send)


def main() -> None:
    """Run api_service with settings from the environment (MEMORY_*, DATABASE_URL)."""
    parser = argparse.ArgumentParser(
        prog="python -m api_service",
        description="Serve the conversation memory API: REST under /api/v1 and MCP at /mcp. "
        "Settings come from the environment (below).",
        epilog=env_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--host", help="bind address (default MEMORY_HOST or 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default MEMORY_PORT or 8080)")
    args = parser.parse_args()
    settings = ApiSettings()
    if args.host:
        settings.host = args.host
    if args.port:
        settings.port = args.port
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        access_log=False,
    )
